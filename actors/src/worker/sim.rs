use std::time::{Duration, Instant};

use coexec_kernels::{Chunk, Kernel, KernelError};

use super::{guarded, Executor};

/// The simulated accelerator: a chunk takes `latency + cost / speed`, where
/// `cost` is what one CPU worker spends on it. Kernels with a modeled
/// shortcut (`Kernel::run_modeled`) write their outputs without paying the
/// cost; others run their CPU implementation here and are stretched to at
/// least the modeled time, so results stay real and this device is never
/// faster than one core on them. The waiting is a sleep: modelling an
/// accelerator's time is this device's purpose.
pub(crate) struct SimExec {
    pub(crate) speed: f64,
    pub(crate) latency: Duration,
}

impl Executor for SimExec {
    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError> {
        let t0 = Instant::now();
        let cost = match guarded(|| kernel.run_modeled(chunk).transpose())? {
            Some(d) => d,
            None => {
                guarded(|| kernel.run_cpu(chunk))?;
                t0.elapsed()
            }
        };
        let target = self.latency + cost.div_f64(self.speed);
        let spent = t0.elapsed();
        if target > spent {
            std::thread::sleep(target - spent);
        }
        Ok(())
    }
}
