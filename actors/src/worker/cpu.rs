use coexec_kernels::{Chunk, Kernel, KernelError};

use super::{Executor, guarded};

/// A CPU core: runs the kernel's CPU implementation on this thread.
pub(crate) struct CpuExec;

impl Executor for CpuExec {
    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError> {
        guarded(|| kernel.run_cpu(chunk))
    }
}
