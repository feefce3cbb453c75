//! The synthetic kernel's GPU twin: each item's value, and the audit that
//! counts how often each item ran.

use std::sync::atomic::Ordering;

use super::CudaKernel;
use super::nvrtc::SYNTHETIC;
use super::stream::{Out, StreamWorker, grid_1d};
use crate::workload::check_chunk;
use crate::{Chunk, Kernel, KernelError, Synthetic};

/// Items per launch at most: grids index items with 32-bit integers.
pub(super) const MAX_LAUNCH: usize = 1 << 30;

pub(super) fn too_large(chunk: &Chunk) -> KernelError {
    KernelError::invalid("chunk", format!("{} items exceed one launch", chunk.len()))
}

impl CudaKernel for Synthetic {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        w.function(&SYNTHETIC, "synthetic").map(drop)
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let n = chunk.len();
        if n > MAX_LAUNCH {
            return Err(too_large(chunk));
        }
        let f = w.function(&SYNTHETIC, "synthetic")?;
        let out = w.scratch::<u64>(0, n)?;
        let (lo, n32, work) = (chunk.lo() as u64, n as u32, self.work());
        // SAFETY: `synthetic(u64* out, u64 lo, u32 n, u32 work)`; `out` holds
        // `n` u64 and the kernel writes `out[0..n)` only.
        unsafe { w.launch(&f, grid_1d(n, 256), &[&out, &lo, &n32, &work])? };
        let dst = self.out().chunk_mut(chunk);
        w.finish_into(&mut [Out::new(0, 0, dst, self.out().pin())])?;
        for a in &self.audit()[chunk.range()] {
            a.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
