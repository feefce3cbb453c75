use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coexec_kernels::{Chunk, Kernel, KernelError};

use super::{Executor, guarded};

/// The simulated accelerator: a chunk takes `latency + cost / speed`, where
/// `cost` is what one CPU worker spends on it (the core time of computing
/// it here, see [`CoreTime`]). Kernels with a modeled
/// shortcut (`Kernel::run_modeled`) write their outputs without paying the
/// cost; others run their CPU implementation here and are stretched to at
/// least the modeled time, so results stay real and this device is never
/// faster than one core on them. The waiting is a sleep: modelling an
/// accelerator's time is this device's purpose.
///
/// Like a real device, it delivers its outputs at the end: once a kernel's
/// cost is known (from its last chunk here), a lower bound of the modelled
/// wait comes first and the outputs are written after it (see
/// [`Seen::lower_bound`]). While it waits it
/// watches its take-back flag: a chunk the job takes back (it ran far past
/// its prediction) ends with [`KernelError::TakenBack`] having written
/// nothing, and runs elsewhere. Before it has run a kernel itself, the cost
/// per item comes from the CPU class's model; with neither, the chunk
/// writes first and cannot be taken back.
pub(crate) struct SimExec {
    pub(crate) speed: f64,
    pub(crate) latency: Duration,
    /// The registry's take-back flags and this worker's index.
    pub(crate) take_back: Option<(Arc<[AtomicBool]>, usize)>,
    /// Per kernel (profile key): its last chunk here.
    pub(crate) seen: HashMap<String, Seen>,
    /// The profile key of the kernel the next chunk is of.
    pub(crate) key: String,
    /// One CPU worker's predicted seconds for the next chunk, if known.
    pub(crate) cpu_secs: Option<f64>,
}

impl SimExec {
    /// A sim of `speed` times one core, paying `latency` per chunk.
    pub(crate) fn new(
        speed: f64,
        latency: Duration,
        take_back: Option<(Arc<[AtomicBool]>, usize)>,
    ) -> Self {
        Self {
            speed,
            latency,
            take_back,
            seen: HashMap::new(),
            key: String::new(),
            cpu_secs: None,
        }
    }

    /// `latency + cost / speed`, checked: a speed the spec allows can still
    /// stretch a long cost past what a Duration holds, and a panic here is
    /// outside any guard.
    fn modelled(&self, cost: f64) -> Result<Duration, KernelError> {
        Duration::try_from_secs_f64(cost / self.speed)
            .ok()
            .and_then(|d| d.checked_add(self.latency))
            .ok_or_else(|| {
                KernelError::invalid(
                    "simulated time",
                    format!("{cost:?} s at speed {} is too long to wait", self.speed),
                )
            })
    }

    /// Sleeps until `t0 + until`; with `watch`, gives up when the take-back
    /// flag is set.
    fn wait(&self, t0: Instant, until: Duration, watch: bool) -> Result<(), KernelError> {
        loop {
            let spent = t0.elapsed();
            if spent >= until {
                return Ok(());
            }
            if let (true, Some((flags, w))) = (watch, &self.take_back)
                && flags[*w].load(Ordering::Acquire)
            {
                return Err(KernelError::TakenBack {
                    secs: spent.as_secs_f64(),
                });
            }
            std::thread::sleep((until - spent).min(TAKE_BACK_POLL));
        }
    }
}

/// A kernel's last chunk on this sim: its items, its CPU cost in seconds
/// (or its modeled cost), whether that came from a modeled shortcut, and
/// how much longer than its core time computing it took in wall time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seen {
    items: f64,
    cost: f64,
    modeled: bool,
    stretch: f64,
}

/// The most wall time per core time a chunk's compute is assumed to take:
/// beyond it the sim waits less before writing, and is simply late.
const MAX_STRETCH: f64 = 8.0;

impl Seen {
    /// A lower bound of the cost of a chunk of `n` items, for any cost
    /// `a + b·n` with `a, b ≥ 0` (a fixed part per chunk, as a GEMM's packing
    /// of its weights, and a part per item): a larger chunk costs at least
    /// as much as this one, and a smaller one at least its share, since its
    /// fixed part is spread over fewer items. Scaling the last cost per item
    /// to `n` instead overshoots a chunk larger than the last by its fixed
    /// part times the ratio of sizes, and the sim then runs slower than
    /// its model says (a 32-row batch after a 1-row one waited ~10× too
    /// long on the digits MLP, whose fixed part is ~600 µs of 1.5 ms).
    fn lower_bound(&self, n: f64) -> f64 {
        self.cost * (n / self.items).min(1.0)
    }
}

/// The time the calling thread has spent on a core: what computing a chunk
/// here costs, whatever else shares the core. Wall time would charge the
/// sim for the threads that preempt it (the CPU workers, a server's
/// handlers), and it would then run slower than its speed says exactly
/// when the machine is busy. A kernel that hands a chunk's work to other
/// threads is charged only this thread's part; coexec's kernels compute a
/// chunk on the worker's thread. Wall time where the platform has no
/// thread clock.
struct CoreTime {
    #[cfg(unix)]
    at: Duration,
    #[cfg(not(unix))]
    at: Instant,
}

impl CoreTime {
    fn now() -> Self {
        Self {
            #[cfg(unix)]
            at: thread_core_time(),
            #[cfg(not(unix))]
            at: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        #[cfg(unix)]
        return thread_core_time().saturating_sub(self.at);
        #[cfg(not(unix))]
        return self.at.elapsed();
    }
}

#[cfg(unix)]
fn thread_core_time() -> Duration {
    use rustix::time::{ClockId, clock_gettime};
    // The thread clock starts at zero and never goes back.
    Duration::try_from(clock_gettime(ClockId::ThreadCPUTime)).unwrap_or_default()
}

/// How often a modelled wait looks at its take-back flag.
const TAKE_BACK_POLL: Duration = Duration::from_millis(2);

impl Executor for SimExec {
    fn begin(&mut self, key: &str, cpu_secs: Option<f64>) {
        if self.key != key {
            self.key.clear();
            self.key.push_str(key);
        }
        self.cpu_secs = cpu_secs;
    }

    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError> {
        let t0 = Instant::now();
        let n = chunk.len() as f64;
        // The wait before the outputs: a lower bound of what this chunk will
        // cost, less what computing it here will take (nothing for a modeled
        // shortcut), a little short so as not to overshoot. From its own
        // last chunk of this kernel, else from the CPU class's prediction.
        let known = match self.seen.get(&self.key) {
            Some(seen) => Some((seen.lower_bound(n), seen.modeled, seen.stretch)),
            None => self
                .cpu_secs
                .filter(|s| s.is_finite() && *s > 0.0 && n > 0.0)
                .map(|s| (s, false, 1.0)),
        };
        if let Some((cost, modeled, stretch)) = known {
            // Computing here takes `stretch` times its core time in wall
            // time when other threads share the core: that much of the
            // modelled time is left for it, so that a busy machine does not
            // push the chunk past its model.
            let compute = if modeled { 0.0 } else { cost * stretch };
            let total = self.modelled(cost)?.as_secs_f64();
            let before = ((total - compute) * 0.95).max(0.0);
            self.wait(t0, Duration::from_secs_f64(before), true)?;
        }
        let (cost, modeled, stretch) = match guarded(|| kernel.run_modeled(chunk).transpose())? {
            Some(d) => (d.as_secs_f64(), true, 1.0),
            None => {
                let (core, wall) = (CoreTime::now(), Instant::now());
                guarded(|| kernel.run_cpu(chunk))?;
                let (core, wall) = (core.elapsed().as_secs_f64(), wall.elapsed().as_secs_f64());
                let stretch = if core > 0.0 { wall / core } else { 1.0 };
                (core, false, stretch.clamp(1.0, MAX_STRETCH))
            }
        };
        if n > 0.0 {
            let seen = Seen {
                items: n,
                cost,
                modeled,
                stretch,
            };
            match self.seen.get_mut(&self.key) {
                Some(s) => *s = seen,
                None => {
                    self.seen.insert(self.key.clone(), seen);
                }
            }
        }
        // Written: the attempt is committed, the rest of the wait is served.
        self.wait(t0, self.modelled(cost)?, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coexec_kernels::Synthetic;

    #[test]
    fn the_wait_before_writing_never_exceeds_an_affine_cost() {
        // cost = a + b·n: after one chunk of `m`, the bound for `n` must not
        // exceed the true cost, for fixed-heavy and per-item-heavy kernels.
        for (a, b) in [(600e-6, 28e-6), (0.0, 1e-3), (1e-3, 0.0), (2e-3, 5e-6)] {
            let cost = |n: f64| a + b * n;
            for m in [1.0, 7.0, 32.0, 512.0] {
                let seen = Seen {
                    items: m,
                    cost: cost(m),
                    modeled: false,
                    stretch: 1.0,
                };
                for n in [1.0, 3.0, 32.0, 100.0, 4096.0] {
                    let lb = seen.lower_bound(n);
                    assert!(lb <= cost(n) * (1.0 + 1e-12), "a={a} b={b} m={m} n={n}");
                    // And it is exact for the same size.
                    if n == m {
                        assert!((lb - cost(n)).abs() < 1e-15);
                    }
                }
            }
        }
    }

    #[test]
    fn the_cost_is_core_time_not_wall_time() {
        // A thread that waits spends wall time and almost no core time; a
        // thread that computes spends both. Another thread sharing the core
        // is what a wait stands for here.
        let t = CoreTime::now();
        std::thread::sleep(Duration::from_millis(60));
        let waited = t.elapsed();
        let t = CoreTime::now();
        let w = Instant::now();
        let mut x = 0u64;
        while w.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let computed = t.elapsed();
        if cfg!(unix) {
            assert!(waited < Duration::from_millis(20), "{waited:?}");
        }
        assert!(computed > Duration::from_millis(5), "{computed:?}");
    }

    #[test]
    fn a_stretch_past_what_a_duration_holds_is_an_error_not_a_panic() {
        let mut k = Synthetic::new(100, 1000);
        let mut sim = SimExec::new(1e-300, Duration::ZERO, None);
        let r = coexec_kernels::with_chunk(&mut k, 0..100, |k, c| sim.run(k, c));
        assert!(matches!(r, Err(KernelError::Invalid { .. })), "{r:?}");
    }
}
