//! CUDA device class (placeholder until the cudarc backend lands).

use crate::{Chunk, KernelError};

const OFF: &str = "coexec was built without the `cuda` feature";

/// A GPU as `coexec devices` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// Ordinal among the visible devices.
    pub id: usize,
    /// Marketing name.
    pub name: String,
    /// Global memory in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// The visible GPUs; always an error in this build.
pub fn devices() -> Result<Vec<GpuInfo>, KernelError> {
    Err(KernelError::CudaUnavailable(OFF.into()))
}

/// One CUDA stream and its buffers, driven by one worker thread.
#[derive(Debug)]
pub struct StreamWorker {
    _never: std::convert::Infallible,
}

impl StreamWorker {
    /// Always [`KernelError::CudaUnavailable`] in this build.
    pub fn new(_device: usize, _stream: usize) -> Result<Self, KernelError> {
        Err(KernelError::CudaUnavailable(OFF.into()))
    }

    /// Runs `chunk` of `kernel` on this stream (unreachable: no value exists).
    pub fn run(&mut self, _kernel: &dyn CudaKernel, _chunk: &Chunk) -> Result<(), KernelError> {
        match self._never {}
    }
}

/// The GPU twin of a kernel.
pub trait CudaKernel: Send + Sync {
    /// Runs the items of `chunk` on `worker`'s stream and returns once their
    /// results are in the kernel's host outputs.
    fn run_cuda(&self, worker: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError>;
}
