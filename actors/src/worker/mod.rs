//! Workers: one OS thread per CPU core, simulated unit or CUDA stream, each
//! pulling chunks from the registry until the runtime closes.

mod cpu;
mod gpu;
mod sim;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coexec_kernels::{Chunk, Kernel, KernelError};

pub(crate) use cpu::CpuExec;
pub(crate) use gpu::GpuExec;
pub(crate) use sim::SimExec;

use crate::broker::job::Claimed;
use crate::broker::registry::{Job, JobOrder, Registry};
use crate::metrics as m;

/// Consecutive device errors after which a worker is taken out of service.
const DEVICE_STRIKES: u32 = 3;

/// How a worker runs a chunk on its device.
pub(crate) trait Executor: Send {
    fn run(&mut self, kernel: &dyn Kernel, chunk: &Chunk) -> Result<(), KernelError>;

    /// Setup before a chunk of run `run` of `kernel` (compiling GPU code
    /// once, uploading a run's shared inputs once per run), kept out of the
    /// chunk's time; whether it did anything.
    fn prepare(&mut self, kernel: &dyn Kernel, run: u64) -> Result<bool, KernelError> {
        let _ = (kernel, run);
        Ok(false)
    }

    /// Before looking for a chunk: waits for anything the device still runs
    /// for a chunk taken back from it, so that it holds no chunk while busy
    /// with one it gave up.
    fn idle(&mut self) {}

    /// The next chunk is of the kernel with this profile key (vetted at
    /// admission: no call into user code), and one CPU worker would take
    /// `cpu_secs` for it, where the CPU class is measured.
    fn begin(&mut self, key: &str, cpu_secs: Option<f64>) {
        let _ = (key, cpu_secs);
    }
}

/// A chunk whose items the claim space refused: they overlap a live claim
/// (never handed out so; failed like any error should it happen).
pub(crate) fn overlap(range: &std::ops::Range<usize>) -> KernelError {
    KernelError::Failed(format!("items {range:?} overlap a live claim of the job"))
}

/// Runs `f`, turning a panic into [`KernelError::Panicked`].
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
    KernelError::catch(f)
}

/// The worker loop: claim, run, report, until the registry closes.
///
/// The hot path takes the job's lock once per chunk: completing a chunk and
/// claiming the next from the same job happen together while that job is
/// still first in line and nothing else changed (no ring, no new job).
pub(crate) fn work(reg: Arc<Registry>, w: usize, mut exec: Box<dyn Executor>) {
    let c = reg.worker_class[w];
    let class = reg.classes[c].name.clone();
    let fair = reg.order == JobOrder::Fair;
    let mut strikes = 0u32;
    let mut jobs: Vec<Arc<Job>> = Vec::new();
    let mut generation = u64::MAX;
    let mut labels = m::WorkerLabels::new(&class, w);
    // A chunk claimed together with the previous completion.
    let mut next: Option<(Arc<Job>, Claimed, f64)> = None;
    while !reg.is_closed() {
        let seen = reg.bell(c);
        let (job, claimed, t0) = match next.take() {
            Some(n) => n,
            None => {
                exec.idle();
                let g = reg.generation();
                if g != generation {
                    reg.snapshot(&mut jobs);
                    generation = g;
                }
                reg.sort(&mut jobs);
                let found = jobs.iter().find_map(|job| {
                    let now = job.start.elapsed().as_secs_f64();
                    let claimed = job.core().claim(w, c, now)?;
                    Some((job.clone(), claimed, now))
                });
                match found {
                    Some(f) => f,
                    None => {
                        // Nothing to claim now: sleep until a job arrives or
                        // changes. While jobs are live, look again soon: a
                        // refusal by the earliest-finish guard can turn into a
                        // claim as others slow down.
                        let t = std::time::Instant::now();
                        let timeout = if reg.busy(c) {
                            Duration::from_millis(1)
                        } else {
                            Duration::from_millis(200)
                        };
                        reg.wait(c, seen, timeout);
                        labels.idle(t.elapsed().as_secs_f64());
                        continue;
                    }
                }
            }
        };
        let Claimed {
            info,
            kernel,
            claims,
        } = claimed;
        // The job's item space hands each range to one worker (`JobCore::
        // claim`), and a failed range returns to the job only after its
        // chunk is dropped below; the claim space checks it all the same
        // and refuses an overlap, which fails the chunk like any error.
        let chunk = Chunk::claim(&claims, info.range.clone());
        drop(claims);
        exec.begin(&job.profile_key, info.cpu_secs);
        let (t0, res) = match &chunk {
            None => (t0, Err(overlap(&info.range))),
            Some(chunk) => match exec.prepare(&*kernel, job.id) {
                Ok(false) => (t0, exec.run(&*kernel, chunk)),
                Ok(true) => {
                    // Setup (compiling, a run's uploads) is not the chunk's
                    // time: its take-back clock starts now.
                    let t = job.start.elapsed().as_secs_f64();
                    job.core().watch_restart(w, t);
                    (t, exec.run(&*kernel, chunk))
                }
                Err(e) => (t0, Err(e)),
            },
        };
        let t1 = job.start.elapsed().as_secs_f64();
        // The claim ends before the job hears of it: the range may be handed
        // out again (a retry) and the kernel back to its owner.
        let (range, len) = (info.range.clone(), info.range.len());
        drop(chunk);
        drop(kernel);
        if fair {
            job.service_ns
                .fetch_add(((t1 - t0) * 1e9) as u64, Ordering::Relaxed);
        }
        let mut core = job.core();
        let after = match res {
            Ok(()) => {
                strikes = 0;
                reg.add_done(w, len);
                labels.chunk_done(core.name(), info.phase, len, t1 - t0);
                tracing::debug!(worker = w, class = %class, lo = range.start, hi = range.end, phase = info.phase.as_str(), secs = t1 - t0, "chunk");
                core.complete(w, c, &info, t0, t1)
            }
            Err(e) => {
                tracing::warn!(worker = w, class = %class, items = ?range, error = %e, "chunk failed; it goes back to the broker");
                labels.chunk_failed(matches!(e, KernelError::TakenBack { .. }));
                if matches!(e, KernelError::Cuda(_) | KernelError::CudaUnavailable(_)) {
                    strikes += 1;
                }
                core.fail(w, &info, e)
            }
        };
        let unchanged = !after.finished
            && !after.wake
            && strikes == 0
            && reg.bell(c) == seen
            && reg.generation() == generation
            && jobs.first().is_some_and(|j| Arc::ptr_eq(j, &job));
        if unchanged && !fair && reg.order == JobOrder::Fifo {
            next = core.claim(w, c, t1).map(|cl| (job.clone(), cl, t1));
        }
        if next.is_none() {
            // Out of chunks here: report the batched metrics while still
            // holding the job, so they are out before it can be reported over.
            labels.flush();
        }
        drop(core);
        if after.finished {
            reg.finish(&job);
        } else if after.wake {
            reg.ring_for(&job);
        }
        if strikes >= DEVICE_STRIKES {
            let why = format!("{DEVICE_STRIKES} device errors in a row");
            tracing::error!(worker = w, class = %class, "taking the worker out of service: {why}");
            reg.worker_lost(w, c, why);
            return;
        }
    }
}
