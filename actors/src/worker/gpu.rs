use coexec_kernels::cuda::StreamWorker;
use coexec_kernels::{Chunk, Kernel, KernelError};

use super::{guarded, Executor};

/// One CUDA stream, driven by this thread; it sleeps while the GPU works.
pub(crate) struct GpuExec {
    pub(crate) stream: StreamWorker,
}

impl Executor for GpuExec {
    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError> {
        let Some(k) = kernel.cuda() else {
            return Err(KernelError::Unsupported {
                kernel: kernel.name().to_string(),
                device: "CUDA",
            });
        };
        guarded(|| self.stream.run(k, chunk))
    }
}
