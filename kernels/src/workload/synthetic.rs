//! Kernels for testing and measuring the scheduler itself.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::splitmix64;
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

/// Each item costs `work` rounds of real integer busy work on a CPU worker and
/// outputs a value that depends on its index alone, so a test can check that
/// every item was computed, and computed exactly once.
///
/// The simulated accelerator writes the same outputs without the busy work
/// ([`Kernel::run_modeled`]) and is charged the calibrated CPU cost instead.
#[derive(Debug)]
pub struct Synthetic {
    work: u32,
    out: DisjointBuf<u64>,
    audit: Box<[AtomicU32]>,
}

impl Synthetic {
    /// `items` items of `work` rounds each. Aborts if its 12 bytes per item
    /// cannot be allocated, as `Vec` does; see [`Synthetic::try_new`].
    pub fn new(items: usize, work: u32) -> Self {
        Self {
            work,
            out: DisjointBuf::new(items, 1),
            audit: (0..items).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// [`Synthetic::new`], or an error where its buffers cannot be
    /// allocated.
    pub fn try_new(items: usize, work: u32) -> Result<Self, KernelError> {
        let out = super::try_zeroed::<u64>("synthetic", items)?;
        let mut audit = Vec::new();
        audit.try_reserve_exact(items).map_err(|e| {
            KernelError::invalid("synthetic", format!("cannot allocate {items} items: {e}"))
        })?;
        audit.extend((0..items).map(|_| AtomicU32::new(0)));
        Ok(Self {
            work,
            out: DisjointBuf::from_vec(out, 1),
            audit: audit.into_boxed_slice(),
        })
    }

    /// The value item `i` must hold once computed.
    pub fn expected(i: usize) -> u64 {
        splitmix64(i as u64 ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// Rounds of busy work per item.
    pub fn work(&self) -> u32 {
        self.work
    }

    /// Checks that every item holds its value and was written exactly once.
    /// Takes `&mut self`: no run can be writing the outputs meanwhile.
    pub fn verify(&mut self) -> Result<(), String> {
        let out = self.out.as_slice();
        for (i, (v, n)) in out.iter().zip(self.audit.iter()).enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n != 1 {
                return Err(format!("item {i} was computed {n} times"));
            }
            if *v != Self::expected(i) {
                return Err(format!(
                    "item {i} holds {v:#x}, expected {:#x}",
                    Self::expected(i)
                ));
            }
        }
        Ok(())
    }

    /// How many times each item was written.
    pub fn write_counts(&self) -> Vec<u32> {
        self.audit
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// The output buffer (for the CUDA twin, which copies its results in).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn out(&self) -> &DisjointBuf<u64> {
        &self.out
    }

    /// How many times each item was written (the CUDA twin counts on the host).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn audit(&self) -> &[AtomicU32] {
        &self.audit
    }

    fn write(&self, chunk: &Chunk) {
        let out = self.out.chunk_mut(chunk);
        for (v, i) in out.iter_mut().zip(chunk.range()) {
            *v = Self::expected(i);
            self.audit[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Kernel for Synthetic {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "synthetic"
    }

    fn items(&self) -> usize {
        self.out.items()
    }

    fn profile_key(&self) -> String {
        format!("synthetic/w{}", self.work)
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        let mut acc = 0u64;
        for i in chunk.range() {
            acc ^= busy(i as u64, self.work);
        }
        std::hint::black_box(acc);
        self.write(chunk);
        Ok(())
    }

    fn run_modeled(&self, chunk: &Chunk) -> Option<Result<Duration, KernelError>> {
        self.write(chunk);
        let ns = busy_ns_per_round() * self.work as f64 * chunk.len() as f64;
        Some(Ok(Duration::from_secs_f64(ns * 1e-9)))
    }
}

/// The empty kernel: items do nothing. It measures the scheduler's own cost
/// per chunk.
#[derive(Debug, Clone)]
pub struct Empty {
    items: usize,
}

impl Empty {
    /// `items` items that do nothing.
    pub fn new(items: usize) -> Self {
        Self { items }
    }
}

impl Kernel for Empty {
    fn name(&self) -> &str {
        "empty"
    }

    fn items(&self) -> usize {
        self.items
    }

    fn run_cpu(&self, _chunk: &Chunk) -> Result<(), KernelError> {
        Ok(())
    }

    fn run_modeled(&self, _chunk: &Chunk) -> Option<Result<Duration, KernelError>> {
        Some(Ok(Duration::ZERO))
    }
}

/// `rounds` dependent multiply-xorshift steps: a serial chain the compiler
/// cannot shorten or vectorise.
#[inline]
fn busy(seed: u64, rounds: u32) -> u64 {
    let mut x = seed | 1;
    for _ in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
    }
    x
}

/// Nanoseconds one busy round takes on one core of this machine, measured
/// once per process (median of several short timings).
pub fn busy_ns_per_round() -> f64 {
    static NS: OnceLock<f64> = OnceLock::new();
    *NS.get_or_init(|| {
        let rounds = 200_000u32;
        let mut samples: Vec<f64> = (0..7)
            .map(|k| {
                let t = Instant::now();
                std::hint::black_box(busy(k, rounds));
                t.elapsed().as_nanos() as f64 / rounds as f64
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2].max(1e-3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_detects_missing_and_double_items() {
        let mut k = Synthetic::new(100, 3);
        crate::with_chunk(&mut k, 0..50, |k, c| k.run_cpu(c)).unwrap();
        assert!(
            k.verify()
                .unwrap_err()
                .contains("item 50 was computed 0 times")
        );
        crate::with_chunk(&mut k, 50..100, |k, c| k.run_modeled(c))
            .unwrap()
            .unwrap();
        k.verify().unwrap();
        crate::with_chunk(&mut k, 10..11, |k, c| k.run_cpu(c)).unwrap();
        assert!(
            k.verify()
                .unwrap_err()
                .contains("item 10 was computed 2 times")
        );
    }

    #[test]
    fn calibration_is_positive_and_finite() {
        let ns = busy_ns_per_round();
        assert!(ns.is_finite() && ns > 0.0);
    }
}
