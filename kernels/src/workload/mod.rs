//! The workload contract: an iterative job ([`Workload`]) of kernel runs,
//! the one-run job ([`OneShot`]), the scheduler's test kernels
//! ([`Synthetic`], [`Empty`]), and the checks every kernel's constructor
//! makes (sizes that fit in memory, chunks inside the items).

mod memory;
mod synthetic;

pub use synthetic::{Empty, Synthetic, busy_ns_per_round};

use crate::{Chunk, Kernel, KernelError};

/// splitmix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix. The `k`-th
/// value of a stream with seed `s` is `splitmix64(s + k·γ)`; callers pass the
/// counter already combined.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// An iterative job: a sequence of kernel runs with a host step between them.
///
/// The executor asks for the next run's kernel, computes every item of it
/// exactly once (in any chunks that fall on multiples of [`Kernel::grain`], on
/// any devices), gives it back with [`Workload::absorb`], and repeats until
/// [`Workload::next_step`] answers `None`; [`Workload::finish`] then yields the
/// result. At most one step is out at a time.
pub trait Workload: Send {
    /// The kernel of one run.
    type Step: Kernel;
    /// What the whole job yields.
    type Output: Send;
    /// The next run's kernel, or `None` when the job is done.
    fn next_step(&mut self) -> Result<Option<Self::Step>, KernelError>;
    /// Takes a finished run back (every item computed) and does the host step.
    fn absorb(&mut self, step: Self::Step) -> Result<(), KernelError>;
    /// The job's result.
    fn finish(self) -> Self::Output;
}

/// Runs `w` on the calling thread: each step is one [`Kernel::run_cpu`] call
/// over all its items.
pub fn run_sequential<W: Workload>(mut w: W) -> Result<W::Output, KernelError> {
    while let Some(mut step) = w.next_step()? {
        let n = step.items();
        if n > 0 {
            crate::with_chunk(&mut step, 0..n, |k, c| k.run_cpu(c))?;
        }
        w.absorb(step)?;
    }
    Ok(w.finish())
}

/// A single kernel run as a one-step workload ([`Synthetic`], [`Empty`], or any
/// other [`Kernel`]). Its output is the kernel, given back after its run, or
/// `None` when the step was taken and never given back.
///
/// ```
/// use coexec_kernels::{run_sequential, OneShot};
/// use coexec_kernels::Synthetic;
///
/// let mut k = run_sequential(OneShot::new(Synthetic::new(100, 2)))?.expect("absorbed");
/// k.verify().map_err(|e| coexec_kernels::KernelError::invalid("synthetic", e))?;
/// # Ok::<(), coexec_kernels::KernelError>(())
/// ```
#[derive(Debug)]
pub struct OneShot<K> {
    pending: Option<K>,
    done: Option<K>,
}

impl<K: Kernel> OneShot<K> {
    /// A job that runs `kernel` once.
    pub fn new(kernel: K) -> Self {
        Self {
            pending: Some(kernel),
            done: None,
        }
    }
}

impl<K: Kernel> Workload for OneShot<K> {
    type Step = K;
    type Output = Option<K>;

    fn next_step(&mut self) -> Result<Option<K>, KernelError> {
        Ok(self.pending.take())
    }

    fn absorb(&mut self, step: K) -> Result<(), KernelError> {
        if self.done.is_some() {
            return Err(KernelError::invalid(
                "workload",
                "one-shot job absorbed twice",
            ));
        }
        self.done = Some(step);
        Ok(())
    }

    fn finish(self) -> Option<K> {
        self.done.or(self.pending)
    }
}

/// Checks that `chunk` lies in `0..items` and starts on a multiple of `grain`
/// and ends on one or at `items` (what the runtime promises every kernel).
#[cfg_attr(not(any(feature = "cuda", feature = "workloads")), allow(dead_code))]
pub fn check_chunk(chunk: &Chunk, items: usize, grain: usize) -> Result<(), KernelError> {
    let (lo, hi) = (chunk.lo(), chunk.hi());
    if lo > hi || hi > items {
        return Err(KernelError::invalid(
            "chunk",
            format!("{lo}..{hi} is outside 0..{items}"),
        ));
    }
    if grain > 1 && (lo % grain != 0 || (hi % grain != 0 && hi != items)) {
        return Err(KernelError::invalid(
            "chunk",
            format!("{lo}..{hi} is not aligned to the grain {grain}"),
        ));
    }
    Ok(())
}

/// Refuses sizes whose buffers would not fit in memory: `parts` multiplied
/// elements of `elem_bytes` bytes each, at most [`memory_limit`] in all.
///
/// ```
/// use coexec_kernels::check_bytes;
///
/// assert_eq!(check_bytes("x", &[10, 3], 4).unwrap(), 30);
/// assert!(check_bytes("x", &[1 << 40, 1 << 20], 4).is_err());
/// ```
pub fn check_bytes(
    what: &'static str,
    parts: &[usize],
    elem_bytes: usize,
) -> Result<usize, KernelError> {
    let mut n: usize = 1;
    for &p in parts {
        if p == 0 {
            return Err(KernelError::invalid(what, "sizes must be positive"));
        }
        n = n
            .checked_mul(p)
            .ok_or_else(|| KernelError::invalid(what, format!("{parts:?} overflows")))?;
    }
    let limit = memory::limit();
    match n.checked_mul(elem_bytes) {
        Some(b) if b as u64 <= limit.bytes => Ok(n),
        _ => Err(KernelError::invalid(
            what,
            format!(
                "{parts:?} × {elem_bytes} bytes exceeds the memory limit of {:.1} GiB ({})",
                limit.bytes as f64 / (1u64 << 30) as f64,
                limit.what
            ),
        )),
    }
}

/// The most one workload buffer may take: the tightest of the memory this
/// machine had available (`MemAvailable` in `/proc/meminfo`), the process's
/// address-space limit (`ulimit -v`) less what it maps, and its cgroup's
/// memory limit (`memory.max`, or v1's `memory.limit_in_bytes`) less the
/// cgroup's usage, measured once per process when first asked; 64 GiB where
/// none can be read. Asking for more would not fail at allocation (Linux
/// overcommits) but abort, or bring the OOM killer, once the buffer is
/// touched.
pub fn memory_limit() -> u64 {
    memory::limit().bytes
}

/// A zero-filled vector of `n` elements, or an error instead of an abort when
/// the allocation fails. Large ones keep spare capacity, so that a GPU
/// stream may page-lock them (the buffers' `pinnable_capacity`).
pub fn try_zeroed<T: Copy + Default>(what: &'static str, n: usize) -> Result<Vec<T>, KernelError> {
    let mut v = Vec::new();
    v.try_reserve_exact(crate::buf::pinnable_capacity::<T>(n))
        .map_err(|e| KernelError::invalid(what, format!("cannot allocate {n} elements: {e}")))?;
    v.resize(n, T::default());
    Ok(v)
}

#[cfg(all(test, feature = "workloads"))]
pub(crate) mod testutil {
    //! Chunk splits for the determinism tests.

    use super::*;
    use proptest::prelude::*;

    /// A strategy for a partition of `0..items` into chunks aligned to `grain`,
    /// as cut points (in units of grain blocks) plus a run order.
    pub(crate) fn splits(max_cuts: usize) -> impl Strategy<Value = (Vec<u16>, u64)> {
        (
            proptest::collection::vec(any::<u16>(), 0..max_cuts),
            any::<u64>(),
        )
    }

    /// Turns `(cuts, order_seed)` into chunks of `0..items` aligned to `grain`,
    /// in a shuffled order.
    pub(crate) fn chunks(
        items: usize,
        grain: usize,
        cuts: &[u16],
        order_seed: u64,
    ) -> Vec<std::ops::Range<usize>> {
        let blocks = items.div_ceil(grain.max(1));
        let mut points: Vec<usize> = cuts
            .iter()
            .map(|&c| {
                if blocks == 0 {
                    0
                } else {
                    c as usize % (blocks + 1) * grain
                }
            })
            .map(|p| p.min(items))
            .collect();
        points.push(0);
        points.push(items);
        points.sort_unstable();
        points.dedup();
        let mut out: Vec<_> = points.windows(2).map(|w| w[0]..w[1]).collect();
        // Fisher–Yates with splitmix64.
        let mut s = order_seed;
        for i in (1..out.len()).rev() {
            s = s.wrapping_add(1);
            let j = (splitmix64(s) % (i as u64 + 1)) as usize;
            out.swap(i, j);
        }
        out
    }

    /// Runs every chunk of `k` on two threads, the chunks dealt alternately.
    /// `chunks` must partition the items (as [`chunks`] makes them).
    pub(crate) fn run_split<K: Kernel>(
        k: &mut K,
        chunks: &[std::ops::Range<usize>],
    ) -> Result<(), KernelError> {
        let space = crate::ClaimSpace::new();
        let (k, space) = (&*k, &space);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|t| {
                    s.spawn(move || {
                        for r in chunks.iter().skip(t).step_by(2) {
                            let c = Chunk::claim(space, r.clone()).ok_or_else(|| {
                                KernelError::Failed(format!("chunks overlap at {r:?}"))
                            })?;
                            k.run_cpu(&c)?;
                        }
                        Ok::<(), KernelError>(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| KernelError::invalid("test", "worker panicked"))??;
            }
            Ok(())
        })
    }

    /// Drives `w` with every step cut by `(cuts, seed)` and run on two threads.
    pub(crate) fn run_workload_split<W: Workload>(
        mut w: W,
        cuts: &[u16],
        seed: u64,
    ) -> Result<W::Output, KernelError> {
        let mut round = 0u64;
        while let Some(mut step) = w.next_step()? {
            let chunks = chunks(step.items(), step.grain(), cuts, seed.wrapping_add(round));
            run_split(&mut step, &chunks)?;
            w.absorb(step)?;
            round += 1;
        }
        Ok(w.finish())
    }

    #[test]
    fn chunks_partition_the_range() {
        let c = chunks(10_000, 1024, &[3, 1, 9, 3, 200], 7);
        let mut v: Vec<_> = c.iter().map(|c| (c.start, c.end)).collect();
        v.sort_unstable();
        assert_eq!(v.first().map(|x| x.0), Some(0));
        assert_eq!(v.last().map(|x| x.1), Some(10_000));
        for w in v.windows(2) {
            assert_eq!(w[0].1, w[1].0);
        }
        for (lo, _) in v {
            assert_eq!(lo % 1024, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_runs_synthetic_and_empty() {
        let mut k = run_sequential(OneShot::new(Synthetic::new(50, 1)))
            .unwrap()
            .unwrap();
        k.verify().unwrap();
        let e = run_sequential(OneShot::new(Empty::new(10)))
            .unwrap()
            .unwrap();
        assert_eq!(e.items(), 10);
    }

    #[test]
    fn check_bytes_refuses_zero_and_overflow() {
        assert!(check_bytes("x", &[0, 3], 4).is_err());
        assert!(check_bytes("x", &[usize::MAX, 3], 4).is_err());
        assert!(check_bytes("x", &[1 << 20, 1 << 20], 4).is_err());
        assert_eq!(check_bytes("x", &[10, 3], 4).unwrap(), 30);
    }
}
