//! The `Kernel` trait: one data-parallel operation over items `0..n`.

use std::time::Duration;

use crate::cuda::CudaKernel;
use crate::{Chunk, KernelError};

/// One data-parallel operation over items `0..items()`.
///
/// Items are independent: any range can run on any device, and the outputs of
/// disjoint ranges do not overlap. A kernel owns its inputs and outputs; the
/// runtime takes it by value, runs every item exactly once, and gives it back.
///
/// Kernels that reduce (kmeans' per-cluster sums) keep one partial result per
/// block of [`Kernel::grain`] items and combine the blocks in block order once
/// the run is over, so the result does not depend on the split.
///
/// ```
/// use coexec_kernels::{Chunk, DisjointBuf, Kernel, KernelError};
///
/// /// out[i] = 2 * i
/// struct Double {
///     out: DisjointBuf<u64>,
/// }
///
/// impl Kernel for Double {
///     fn name(&self) -> &str {
///         "double"
///     }
///     fn items(&self) -> usize {
///         self.out.items()
///     }
///     fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
///         // The outputs of exactly this chunk's items, which the runtime
///         // gave to this call alone: no `unsafe` needed.
///         let out = self.out.chunk_mut(chunk);
///         for (v, i) in out.iter_mut().zip(chunk.range()) {
///             *v = 2 * i as u64;
///         }
///         Ok(())
///     }
/// }
///
/// let mut k = Double { out: DisjointBuf::new(8, 1) };
/// coexec_kernels::with_chunk(&mut k, 0..8, |k, c| k.run_cpu(c)).unwrap();
/// assert_eq!(k.out.as_slice()[3], 6);
/// ```
pub trait Kernel: Send + Sync + 'static {
    /// Stable name, used for profiles, reports and metrics (`"matmul"`).
    fn name(&self) -> &str;

    /// Number of items.
    fn items(&self) -> usize;

    /// The key speed models are stored under: the name plus whatever changes
    /// the cost of one item (`"nbody/n8192"`), so that a profile learned on one
    /// variant is not trusted for another.
    fn profile_key(&self) -> String {
        self.name().to_string()
    }

    /// Chunk boundaries fall on multiples of this (the last chunk may be
    /// shorter). Reducing kernels set it to their block size.
    fn grain(&self) -> usize {
        1
    }

    /// Computes the items of `chunk` on the calling CPU thread, writing only
    /// their outputs (through [`DisjointBuf::chunk_mut`](crate::DisjointBuf::chunk_mut),
    /// which the chunk unlocks).
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError>;

    /// For the simulated accelerator (`sim`): writes the outputs of `chunk`
    /// without paying the CPU's cost and returns what one CPU worker would have
    /// spent on it. `None` when the kernel has no such shortcut; `sim` then
    /// runs [`Kernel::run_cpu`] and stretches the chunk to its modeled time.
    fn run_modeled(&self, _chunk: &Chunk) -> Option<Result<Duration, KernelError>> {
        None
    }

    /// The GPU twin, when the kernel has one.
    fn cuda(&self) -> Option<&dyn CudaKernel> {
        None
    }
}
