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
        // Checked: a speed the spec allows can still stretch a long cost past
        // what a Duration holds, and a panic here is outside any guard.
        let target = Duration::try_from_secs_f64(cost.as_secs_f64() / self.speed)
            .ok()
            .and_then(|d| d.checked_add(self.latency))
            .ok_or_else(|| {
                KernelError::invalid(
                    "simulated time",
                    format!("{cost:?} at speed {} is too long to wait", self.speed),
                )
            })?;
        let spent = t0.elapsed();
        if target > spent {
            std::thread::sleep(target - spent);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coexec_kernels::Synthetic;

    #[test]
    fn a_stretch_past_what_a_duration_holds_is_an_error_not_a_panic() {
        let mut k = Synthetic::new(100, 1000);
        let mut sim = SimExec {
            speed: 1e-300,
            latency: Duration::ZERO,
        };
        let r = coexec_kernels::with_chunk(&mut k, 0..100, |k, c| sim.run(k, c));
        assert!(matches!(r, Err(KernelError::Invalid { .. })), "{r:?}");
    }
}
