//! The `Kernel` trait: one data-parallel operation over items `0..n`.

use std::ops::Range;
use std::time::Duration;

use crate::cuda::CudaKernel;
use crate::KernelError;

/// A contiguous item range `[lo, hi)` handed to one worker.
///
/// The runtime creates a chunk only for items it has claimed for that worker
/// alone, so a kernel may write the outputs of `range()` without synchronising
/// with other chunks of the same job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    range: Range<usize>,
}

impl Chunk {
    /// A chunk over `range`.
    pub fn new(range: Range<usize>) -> Self {
        debug_assert!(range.start <= range.end);
        Self { range }
    }

    /// The item range.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// First item.
    pub fn lo(&self) -> usize {
        self.range.start
    }

    /// One past the last item.
    pub fn hi(&self) -> usize {
        self.range.end
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.range.end - self.range.start
    }

    /// Whether the chunk holds no item.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

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
///         // SAFETY: the runtime gives this chunk's items to this call alone,
///         // and we take one slice of the buffer.
///         let out = unsafe { self.out.slice_mut(chunk.range()) };
///         for (v, i) in out.iter_mut().zip(chunk.range()) {
///             *v = 2 * i as u64;
///         }
///         Ok(())
///     }
/// }
///
/// let k = Double { out: DisjointBuf::new(8, 1) };
/// k.run_cpu(&Chunk::new(0..8)).unwrap();
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
    /// their outputs.
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
