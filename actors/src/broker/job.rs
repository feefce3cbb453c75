//! One job's scheduling state and the engine that carries out its policy.
//!
//! Everything here runs under the job's lock, on the worker thread that
//! claims or completes a chunk: no message is sent on the hot path.
//!
//! This file holds the state and the claim / complete / fail cycle; by
//! concern, the rest: `admit` (the state a plan starts from), `plan` (what
//! the policy decided), `progress` (the item space and how far the job is
//! through it), `state` (per class and per worker), `sizing` (probe ramp,
//! static and dynamic chunk sizes), `guard` (the earliest-finish guard),
//! `retry` (failed ranges and who takes them), `overdue` (taking back a
//! chunk far past its prediction), `probe` (δ′ and the re-plan), `report`
//! (what the submitter and the profiler hear).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use coexec_kernels::{ClaimSpace, Kernel, KernelError};

use super::space::Space;
use crate::ActorError;
use crate::device::{ClassInfo, End};
use crate::perfmodel::{Sample, SpeedModel};
use crate::policy::{Admission, Chunking, ClassSpeed, Probe, Steal, Thresholds, plan_shares};
use crate::report::{
    ChunkRecord, ClassReport, Phase, ProbeReport, RunReport, imbalance, normalized,
};

/// Attempts a chunk gets before its job fails.
pub(crate) const MAX_ATTEMPTS: u32 = 4;

/// A cold probe's first chunk per worker: the items over this many times
/// the workers, then doubling.
const COLD_FIRST: usize = 4096;

/// A chunk handed to a worker.
#[derive(Debug, Clone)]
pub(crate) struct ChunkInfo {
    pub(crate) range: Range<usize>,
    pub(crate) phase: Phase,
    pub(crate) attempt: u32,
    /// Where earlier attempts failed.
    pub(crate) failures: Failures,
    /// Seconds of one CPU worker's throughput for the chunk, when the CPU
    /// class is measured: what a `sim` device models its time from before
    /// it has run the kernel itself.
    pub(crate) cpu_secs: Option<f64>,
}

/// A chunk and the kernel to run it with. The worker drops the kernel handle
/// before reporting, so the caller gets its kernel back unshared.
#[derive(Clone)]
pub(crate) struct Claimed {
    pub(crate) info: ChunkInfo,
    pub(crate) kernel: Arc<dyn Kernel>,
    /// The job's claim space, to mint the chunk in.
    pub(crate) claims: Arc<ClaimSpace>,
}

/// What the worker should do after completing or failing a chunk.
#[derive(Debug, Default)]
pub(crate) struct After {
    /// The job is over (done or failed): hand it to the broker.
    pub(crate) finished: bool,
    /// Something changed that may let idle workers claim: wake them.
    pub(crate) wake: bool,
}

/// A job's scheduling state, by concern: how it ends ([`Lifecycle`]),
/// what the policy planned ([`Plan`]), per class and per worker what it
/// keeps, where its items stand ([`Progress`]), its failed ranges
/// ([`Retries`]), its probe ([`Probing`]), its chunk record ([`Trace`]),
/// and the take-back watch.
pub(crate) struct JobCore {
    life: Lifecycle,
    plan: Plan,
    classes: Arc<[ClassInfo]>,
    st: Vec<ClassState>,
    worker_class: Arc<[usize]>,
    /// Per worker of the runtime, its part in this job.
    worker: Vec<WorkerState>,
    progress: Progress,
    retries: Retries,
    probe: Probing,
    trace: Trace,
    /// Chunks far past their prediction, taken back (`overdue.rs`).
    watch: overdue::Watch,
    /// Reused by the guard: (start, speed) of the other workers.
    scratch: Vec<(f64, f64)>,
}

/// The job's kernel while it runs, and how it ended.
struct Lifecycle {
    kernel: Option<Arc<dyn Kernel>>,
    /// The claim space the job's chunks are minted in; dropped with the
    /// kernel, so the kernel's buffers are free for its next run.
    claims: Option<Arc<ClaimSpace>>,
    /// The kernel's name, kept once its handle is dropped.
    name: String,
    failed: Option<ActorError>,
    finished: bool,
}

impl Lifecycle {
    /// The job is over: it drops its kernel and its claim space.
    fn finish(&mut self) {
        self.finished = true;
        self.kernel = None;
        self.claims = None;
    }

    /// The job fails with `why`, and is over.
    fn fail(&mut self, why: ActorError) {
        self.failed = Some(why);
        self.finish();
    }

    /// Whether a worker may still claim from the job.
    fn live(&self) -> bool {
        !self.finished && self.failed.is_none()
    }

    /// Handles on the kernel and the claim space, while the job holds them.
    fn handles(&self) -> Option<(Arc<dyn Kernel>, Arc<ClaimSpace>)> {
        Some((self.kernel.clone()?, self.claims.clone()?))
    }
}

impl JobCore {
    /// Drops the job's handle on its kernel (the job is over), so that a
    /// submitter answered next is the kernel's only owner.
    pub(crate) fn release_kernel(&mut self) {
        debug_assert!(self.life.finished, "kernel released from a live job");
        self.life.kernel = None;
        self.life.claims = None;
    }

    /// Per class, whether its workers can ever claim from this job: it may
    /// run the kernel, the plan gives it a share, and it has workers.
    /// Eligibility is fixed at admission, so this is too.
    pub(crate) fn claimable(&self) -> Box<[bool]> {
        self.st.iter().map(ClassState::active).collect()
    }

    /// The classes rung for this job: those that can claim from it, the
    /// one whose worker carries the largest planned share first, then those
    /// that stand by for its retries ([`Admission::standby`]; rung when a
    /// chunk goes back, not polled). A ring wakes more threads than there
    /// may be idle cores (a CPU class has a worker per core), and the last
    /// woken can wait a scheduler's time slice for one: the fastest worker
    /// should not be that one. With no plan yet, accelerators first.
    pub(crate) fn wake_order(&self) -> Box<[usize]> {
        let active = |c: usize| self.st[c].active();
        let per_worker = |c: usize| match self.plan.planned.get(c) {
            Some(&share) if share.is_finite() && active(c) => share / self.st[c].workers as f64,
            _ => 0.0,
        };
        let mut order: Vec<usize> = (0..self.st.len())
            .filter(|&c| active(c) || self.st[c].standby)
            .collect();
        order.sort_by(|&x, &y| {
            active(y)
                .cmp(&active(x))
                .then(per_worker(y).total_cmp(&per_worker(x)))
                .then(self.classes[y].is_accel().cmp(&self.classes[x].is_accel()))
        });
        order.into()
    }

    /// Whether no worker needs to look at this job again.
    pub(crate) fn is_over(&self) -> bool {
        self.life.finished
    }

    /// The next chunk for worker `w` of class `c` at `now` (seconds since the
    /// job started), or `None` if it should take nothing from this job now.
    pub(crate) fn claim(&mut self, w: usize, c: usize, now: f64) -> Option<Claimed> {
        let standing_by = !self.st[c].eligible && self.st[c].standby;
        if !self.life.live() || !(self.st[c].eligible || standing_by) || self.st[c].workers == 0 {
            return None;
        }
        let (kernel, claims) = self.life.handles()?;
        self.take_back_overdue(now);
        if let Some(r) = self.take_retry(w, c, now) {
            self.progress.in_flight += 1;
            self.start_chunk(w, c, r.range.len(), now);
            self.worker[w].declined = false;
            let info = ChunkInfo {
                cpu_secs: self.cpu_secs(r.range.len()),
                range: r.range,
                phase: Phase::Retry,
                attempt: r.attempts,
                failures: r.failures,
            };
            return Some(Claimed {
                info,
                kernel,
                claims,
            });
        }
        if standing_by {
            return None;
        }
        let (range, phase) = self.take_fresh(w, c, now)?;
        self.progress.in_flight += 1;
        self.start_chunk(w, c, range.len(), now);
        Some(Claimed {
            info: ChunkInfo {
                cpu_secs: self.cpu_secs(range.len()),
                range,
                phase,
                attempt: 0,
                failures: Failures::default(),
            },
            kernel,
            claims,
        })
    }

    fn take_fresh(&mut self, w: usize, c: usize, now: f64) -> Option<(Range<usize>, Phase)> {
        let end = self.classes[c].end;
        let r = self.progress.home[c];
        if self.progress.space.left(r) > 0 {
            let (n, phase) = self.own_size(c);
            let n = n.max(self.st[c].fill.min_chunk);
            let n = match phase {
                // A class given a small region only to be measured again
                // takes it whatever its old model says: that model (one bad
                // measurement, a profile from a bad day) loses every guard
                // while another class has a chunk in flight, so on a busy
                // machine the class would never be measured.
                _ if self.remeasuring(c) => n,
                Phase::Dynamic => self.limit(w, c, n, now)?,
                // Under the guard a static chunk is never larger than a
                // dynamic one would be here (with `keep_static`, once others
                // have eaten into this class's region): a class planned too
                // large must not commit to a quarter of its old share at the
                // end. Not a device's streams alone: they are alike, and
                // cutting their one static chunk each into guided ones buys
                // no balance, only fixed costs, the more chunks the slower
                // the model that sizes them (one that co-executed runs
                // slowed, on a shared memory bus).
                Phase::Static
                    if self.plan.adm.guard
                        && !self.one_device_alone(c)
                        && (!self.plan.adm.keep_static || self.eaten(c)) =>
                {
                    let n = n.min(self.dynamic_size(c));
                    self.limit(w, c, n, now)?
                }
                _ => n,
            };
            let got = self.progress.space.take(r, end, n)?;
            self.st[c].region.claimed += got.len();
            return Some((got, phase));
        }
        if self.plan.adm.steal == Steal::Never {
            return None;
        }
        // Steal from the far end of the region with the most predicted time left.
        let victim = (0..self.classes.len())
            .filter(|&v| v != r && self.progress.space.left(v) > 0)
            .max_by(|&x, &y| self.time_left(x).total_cmp(&self.time_left(y)))?;
        let n = self.dynamic_size(c);
        let n = self.limit(w, c, n, now)?;
        let far = match self.classes[victim].end {
            End::Head => End::Tail,
            End::Tail => End::Head,
        };
        let got = self.progress.space.take(victim, far, n)?;
        Some((got, Phase::Dynamic))
    }

    /// Whether class `c` is the only one the job runs on and its workers
    /// are one device's streams.
    fn one_device_alone(&self, c: usize) -> bool {
        ClassInfo::one_device_alone(&self.classes, |k: usize| self.st[k].active()) == Some(c)
    }

    /// Whether class `c` is here only to be measured again and none of its
    /// chunks has ended yet.
    fn remeasuring(&self, c: usize) -> bool {
        self.st[c].remeasured && self.st[c].tally.chunks == 0
    }

    /// Whether others have taken items from class `c`'s region since the
    /// last (re)plan.
    fn eaten(&self, c: usize) -> bool {
        self.st[c].region.eaten(self.progress.own_left(c))
    }

    /// Worker `w` of class `c` finished `chunk` in `start..end` (seconds since
    /// the job started).
    pub(crate) fn complete(
        &mut self,
        w: usize,
        c: usize,
        chunk: &ChunkInfo,
        start: f64,
        end: f64,
    ) -> After {
        let n = chunk.range.len();
        let secs = (end - start).max(1e-9);
        self.progress.in_flight -= 1;
        self.progress.done += n;
        self.worker[w].busy_until = end;
        self.worker[w].running = false;
        if self.worker[w].first_start.is_nan() {
            self.worker[w].first_start = start;
        }
        let s = &mut self.st[c];
        let predicted = s.speed.admitted.predict(n as f64);
        s.tally.record(n, chunk.phase, secs, end, predicted);
        s.speed.observe(n, secs);
        if chunk.phase == Phase::Probe {
            // A probe chunk still in flight when the probe ended is not
            // counted in it.
            self.probe.record(c, n, end, secs);
        }
        self.trace.record(w, chunk, start, end);
        let mut after = After::default();
        if self.probe_complete() {
            self.end_probe();
            after.wake = true;
        }
        if self.progress.is_done() {
            self.life.finish();
            after.finished = true;
        }
        after
    }

    /// Worker `w` of class `c` failed `chunk`: it goes back for another worker.
    pub(crate) fn fail(&mut self, w: usize, chunk: &ChunkInfo, err: KernelError) -> After {
        self.progress.in_flight -= 1;
        self.worker[w].busy_until = 0.0;
        self.worker[w].running = false;
        self.retries.retried += 1;
        // A chunk taken back did not fail: it does not use up an attempt.
        let attempts = match &err {
            KernelError::TakenBack { secs } => {
                self.taken_back(self.worker_class[w], chunk.range.len(), *secs);
                chunk.attempt
            }
            _ => chunk.attempt + 1,
        };
        let mut after = After {
            wake: true,
            ..After::default()
        };
        if attempts >= MAX_ATTEMPTS {
            self.life.failed = Some(ActorError::ChunkFailed {
                kernel: self.life.name.clone(),
                lo: chunk.range.start,
                hi: chunk.range.end,
                attempts,
                source: err,
            });
        } else {
            let oom = matches!(err, KernelError::OutOfMemory { .. });
            let grain = self.progress.grain;
            self.retries
                .requeue(chunk, attempts, w, self.worker_class[w], oom, grain);
        }
        if self.life.failed.is_some() {
            self.life.finish();
            after.finished = true;
        }
        after
    }

    /// Class `c` lost a worker; fails the job if nobody is left to run it.
    pub(crate) fn worker_lost(&mut self, c: usize, why: &str) -> After {
        self.st[c].workers = self.st[c].workers.saturating_sub(1);
        let mut after = After {
            wake: true,
            ..After::default()
        };
        if self.life.finished {
            return after;
        }
        if self.plan.adm.steal == Steal::Never
            && self.st[c].workers == 0
            && self.progress.own_left(c) > 0
        {
            // Nobody else would take its region: let everyone in.
            self.plan.adm.steal = Steal::Always;
        }
        if self.total_workers() == 0 && self.st.iter().any(|s| s.standby) {
            // The classes standing by take over, from the lost ones' regions.
            for s in &mut self.st {
                s.eligible |= s.standby;
                s.standby = false;
            }
            self.plan.adm.steal = Steal::Always;
        }
        if self.total_workers() == 0 {
            self.life.fail(ActorError::NoDevice {
                kernel: self.life.name.clone(),
                why: format!("every device that could run it is out of service (last: {why})"),
            });
            after.finished = true;
        }
        after
    }

    /// Ends the job at once (shutdown, or its caller stopped waiting): no
    /// more claims; chunks in flight complete into a job that is over.
    pub(crate) fn cancel(&mut self, why: ActorError) {
        if !self.life.finished {
            self.life.fail(why);
        }
    }

    /// Kernel name.
    pub(crate) fn name(&self) -> &str {
        &self.life.name
    }
}

mod admit;
mod guard;
mod overdue;
mod plan;
mod probe;
mod progress;
mod report;
mod retry;
mod sizing;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use admit::Admitted;
use plan::Plan;
use probe::Probing;
use progress::Progress;
use report::Trace;
use retry::{Failures, Retries};
use state::{ClassState, ProbeState, Speed, WorkerState};
