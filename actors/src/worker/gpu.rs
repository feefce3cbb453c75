use std::collections::HashSet;

use coexec_kernels::cuda::StreamWorker;
use coexec_kernels::{Chunk, Kernel, KernelError};

use super::{Executor, guarded};

/// One CUDA stream, driven by this thread; it sleeps while the GPU works.
pub(crate) struct GpuExec {
    pub(crate) stream: StreamWorker,
    /// Kernels whose code is compiled for this stream's device.
    pub(crate) ready: HashSet<String>,
    /// The run whose inputs this stream staged last.
    run: Option<u64>,
}

impl GpuExec {
    pub(crate) fn new(stream: StreamWorker) -> Self {
        Self {
            stream,
            ready: HashSet::new(),
            run: None,
        }
    }
}

fn twin(kernel: &dyn Kernel) -> Result<&dyn coexec_kernels::cuda::CudaKernel, KernelError> {
    kernel.cuda().ok_or_else(|| KernelError::Unsupported {
        kernel: kernel.name().to_string(),
        device: "CUDA",
    })
}

impl Executor for GpuExec {
    fn prepare(&mut self, kernel: &dyn Kernel, run: u64) -> Result<bool, KernelError> {
        let compile = !self.ready.contains(kernel.name());
        if !compile && self.run == Some(run) {
            return Ok(false);
        }
        let k = twin(kernel)?;
        if compile {
            guarded(|| self.stream.prepare(k))?;
            self.ready.insert(kernel.name().to_string());
        }
        // A new run: its shared inputs cross the bus now, not inside the
        // first chunk's time.
        self.run = None;
        guarded(|| self.stream.begin_run(k))?;
        self.run = Some(run);
        Ok(true)
    }

    fn idle(&mut self) {
        self.stream.wait_idle();
    }

    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError> {
        let k = twin(kernel)?;
        guarded(|| self.stream.run(k, chunk))
    }
}
