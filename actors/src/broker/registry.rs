//! The jobs workers claim from. The broker owns it; workers read it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::bell::Bell;
use super::job::JobCore;
use crate::device::ClassInfo;
use crate::metrics as m;
use crate::profiler::{Observe, Profiles};
use crate::{ActorError, RunReport};

/// Which job a free worker serves first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JobOrder {
    /// Oldest first; a later job gets the workers the earlier ones cannot use.
    #[default]
    Fifo,
    /// Highest priority first; waiting raises a job's priority by one per
    /// second, so none starves.
    Priority,
    /// Least service received per unit of weight first (weighted fair share).
    Fair,
}

/// The reply a submitter waits for.
pub(crate) type Reply = oneshot::Sender<Result<RunReport, ActorError>>;

/// One admitted job.
pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) priority: i32,
    pub(crate) weight: f64,
    pub(crate) start: Instant,
    pub(crate) profile_key: String,
    /// Whether the profiler learns from its report (`JobOptions::learn`).
    pub(crate) learn: bool,
    pub(crate) core: Mutex<JobCore>,
    pub(crate) reply: Mutex<Option<Reply>>,
    /// Worker-nanoseconds spent on it, for fair share.
    pub(crate) service_ns: AtomicU64,
    /// Set once the job has been handed back to the broker.
    pub(crate) closed: AtomicBool,
    /// Per class, whether its workers can ever claim from this job (fixed at
    /// admission, `JobCore::claimable`): only they are rung for it.
    pub(crate) claimable: Box<[bool]>,
    /// The classes rung for it, in order (`JobCore::wake_order`): those that
    /// can claim, then those that stand by for its retries (rung, but not
    /// kept polling).
    pub(crate) wake: Box<[usize]>,
    /// Whether it runs on its submitter's thread (`Admitter::run_inline`).
    pub(crate) inline: bool,
}

impl Job {
    pub(crate) fn core(&self) -> MutexGuard<'_, JobCore> {
        // A panic never happens under this lock (kernels run outside it);
        // should one, the state is still consistent enough to finish.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether its submitter stopped waiting (dropped the future of `run`)
    /// before it was answered.
    fn abandoned(&self) -> bool {
        self.reply
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|tx| tx.is_closed())
    }

    fn rank(&self, order: JobOrder, now: Instant) -> f64 {
        match order {
            JobOrder::Fifo => self.id as f64,
            JobOrder::Priority => {
                -(self.priority as f64 + now.duration_since(self.start).as_secs_f64())
            }
            JobOrder::Fair => self.service_ns.load(Ordering::Relaxed) as f64 / self.weight,
        }
    }
}

/// A counter alone on its cache line, so workers do not contend for it.
#[derive(Default)]
#[repr(align(64))]
struct Padded(AtomicU64);

/// Events from workers to the broker actor.
pub(crate) enum Event {
    /// A worker was taken out of service.
    WorkerLost {
        worker: usize,
        class: usize,
        why: String,
    },
}

/// Every live job, and the bells idle workers wait on: one per class, so a
/// job wakes only the classes that can claim from it (a stream's batch
/// placed on the CPU class does not wake an accelerator's workers twice).
pub(crate) struct Registry {
    jobs: RwLock<Vec<Arc<Job>>>,
    generation: AtomicU64,
    bells: Box<[Bell]>,
    closed: AtomicBool,
    /// The profile store runs are learned into, once the engine has one.
    pub(crate) profiles: std::sync::OnceLock<Arc<Profiles>>,
    /// Submitters still waiting for a reply; `idle` rings when none are.
    owed: AtomicUsize,
    idle: tokio::sync::Notify,
    pub(crate) order: JobOrder,
    /// When the runtime started.
    pub(crate) epoch: Instant,
    pub(crate) classes: Arc<[ClassInfo]>,
    pub(crate) worker_class: Arc<[usize]>,
    /// Per worker: set when the job it runs a chunk of takes that chunk
    /// back (see `JobCore::take_back_overdue`); executors that can abandon
    /// an attempt without a write in flight (the sim's modelled wait, a
    /// CUDA stream's wait for its chunk) look.
    pub(crate) take_back: Arc<[AtomicBool]>,
    in_service: Vec<AtomicUsize>,
    /// Items computed per worker, each on its own cache line.
    done: Vec<Padded>,
    events: flume::Sender<Event>,
}

impl Registry {
    pub(crate) fn new(
        classes: Arc<[ClassInfo]>,
        worker_class: Arc<[usize]>,
        order: JobOrder,
        events: flume::Sender<Event>,
    ) -> Self {
        let in_service = classes
            .iter()
            .map(|c| AtomicUsize::new(c.workers))
            .collect();
        let done = worker_class.iter().map(|_| Padded::default()).collect();
        let take_back = worker_class
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Self {
            jobs: RwLock::new(Vec::new()),
            generation: AtomicU64::new(0),
            bells: classes.iter().map(|_| Bell::default()).collect(),
            closed: AtomicBool::new(false),
            profiles: std::sync::OnceLock::new(),
            owed: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
            order,
            epoch: Instant::now(),
            classes,
            worker_class,
            take_back,
            in_service,
            done,
            events,
        }
    }

    /// Workers of class `c` still in service.
    pub(crate) fn in_service(&self, c: usize) -> usize {
        self.in_service[c].load(Ordering::Acquire)
    }

    /// Counts items computed by worker `w` (for progress displays).
    pub(crate) fn add_done(&self, w: usize, items: usize) {
        self.done[w].0.fetch_add(items as u64, Ordering::Relaxed);
    }

    /// Items computed per class since the runtime started.
    pub(crate) fn progress(&self) -> Vec<u64> {
        let mut per_class = vec![0; self.classes.len()];
        for (d, &c) in self.done.iter().zip(self.worker_class.iter()) {
            per_class[c] += d.0.load(Ordering::Relaxed);
        }
        per_class
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Adds an admitted job and wakes the workers.
    pub(crate) fn admit(&self, job: Arc<Job>) {
        if job.core().is_over() {
            self.finish(&job);
            return;
        }
        let mut jobs = self.jobs.write().unwrap_or_else(|e| e.into_inner());
        jobs.push(job.clone());
        // Counted under the jobs' write lock, like the push.
        for bell in self.bells_for(&job) {
            bell.live.fetch_add(1, Ordering::AcqRel);
        }
        m::jobs_in_flight(jobs.len());
        drop(jobs);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.ring_for(&job);
        // Abandoned before the push: the submitter's scan
        // (`cancel_abandoned`) may have run before the push, but its closing
        // of the reply happened before that scan, so it shows here.
        if job.abandoned() {
            self.cancel(&job);
        }
        // Closed meanwhile: `close` marks the registry closed before it
        // scans the jobs, so a job pushed after its scan sees the mark here
        // and is not left to workers that have gone.
        if self.is_closed() {
            job.core().cancel(ActorError::Shutdown);
            self.finish(&job);
        }
    }

    /// Cancels every live job whose submitter stopped waiting: no more of its
    /// chunks are handed out, chunks in flight finish and are discarded, and
    /// the job lets go of its kernel (workers drop theirs after their chunk).
    pub(crate) fn cancel_abandoned(&self) {
        let mut jobs = Vec::new();
        self.snapshot(&mut jobs);
        for job in jobs {
            if job.abandoned() {
                self.cancel(&job);
            }
        }
    }

    /// Ends an abandoned `job` now.
    fn cancel(&self, job: &Arc<Job>) {
        job.core().cancel(ActorError::Cancelled);
        self.finish(job);
    }

    /// The live jobs in the order workers should serve them.
    pub(crate) fn snapshot(&self, into: &mut Vec<Arc<Job>>) {
        into.clear();
        into.extend(
            self.jobs
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned(),
        );
    }

    /// Sorts `jobs` by this registry's order.
    pub(crate) fn sort(&self, jobs: &mut [Arc<Job>]) {
        if self.order != JobOrder::Fifo && jobs.len() > 1 {
            let now = Instant::now();
            jobs.sort_by(|a, b| a.rank(self.order, now).total_cmp(&b.rank(self.order, now)));
        }
    }

    /// Closes a job that is over, once: removes it, hands its samples to the
    /// profiler, and answers its submitter, on the calling thread (the worker
    /// that finished it) with no hop through the broker.
    pub(crate) fn finish(&self, job: &Arc<Job>) {
        if job.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut jobs = self.jobs.write().unwrap_or_else(|e| e.into_inner());
        let before = jobs.len();
        jobs.retain(|j| j.id != job.id);
        let listed = jobs.len() < before;
        if listed {
            for bell in self.bells_for(job) {
                bell.live.fetch_sub(1, Ordering::AcqRel);
            }
            m::jobs_in_flight(jobs.len());
        }
        drop(jobs);
        if listed {
            // Workers look again (a job standing by for this one's retries
            // may claim now). A job no worker saw (run inline, or over at
            // admission) wakes nobody.
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.ring_for(job);
        }
        let (result, samples) = {
            let mut core = job.core();
            core.release_kernel();
            (core.report(), core.samples())
        };
        match result {
            Err(ActorError::Cancelled) => {
                tracing::debug!(job = job.id, "job cancelled: its caller stopped waiting");
                self.reply(job, Err(ActorError::Cancelled));
            }
            Err(e) => {
                tracing::warn!(job = job.id, "job failed: {e}");
                m::job_finished(&job.profile_key, "", Err(()));
                self.reply(job, Err(e));
            }
            Ok(mut report) => {
                report.started_s = job.start.duration_since(self.epoch).as_secs_f64();
                m::job_finished(&report.kernel, &report.policy, Ok(&report));
                tracing::info!(
                    kernel = %report.kernel, items = report.items, makespan_s = report.makespan_s,
                    efficiency_est = report.ideal_s / report.makespan_s, imbalance = report.imbalance,
                    policy = %report.policy, "run finished"
                );
                // Learned first, then the answer: the submitter's next run
                // looks its models up after this. A run not learned from
                // leaves the profile as it was.
                report.inline = job.inline;
                if let Some(p) = self.profiles.get().filter(|_| job.learn) {
                    let mut run = Observe::of(
                        job.profile_key.clone(),
                        self.classes.iter().map(|c| c.profile_key.clone()).collect(),
                        &report,
                        samples,
                    );
                    if job.inline {
                        // No hand-off was paid: the class's start stays
                        // the one measured when a worker was woken.
                        run.forget_starts();
                    }
                    p.learn(&run);
                }
                self.reply(job, Ok(report));
            }
        }
    }

    /// A submitter now waits for a reply (counted from submission, before
    /// the broker has even admitted the job).
    pub(crate) fn owe(&self) {
        self.owed.fetch_add(1, Ordering::AcqRel);
    }

    /// A submitter whose request was dropped unanswered (the actor system
    /// went away with it in a mailbox) no longer waits.
    pub(crate) fn forgive(&self) {
        if self.owed.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Answers `job`'s submitter, once: whoever comes first (the broker with
    /// the report, or a cancelling shutdown) answers; later calls do nothing.
    pub(crate) fn reply(&self, job: &Job, result: Result<RunReport, ActorError>) {
        let Some(tx) = job.reply.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let _ = tx.send(result);
        if self.owed.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until every submitted job has been answered.
    pub(crate) async fn drained(&self) {
        loop {
            let n = self.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.owed.load(Ordering::Acquire) == 0 {
                return;
            }
            n.await;
        }
    }

    /// Worker `w` of class `c` is out of service.
    pub(crate) fn worker_lost(&self, w: usize, c: usize, why: String) {
        self.in_service[c].fetch_sub(1, Ordering::AcqRel);
        let mut jobs = Vec::new();
        self.snapshot(&mut jobs);
        for job in jobs {
            let after = job.core().worker_lost(c, &why);
            if after.finished {
                self.finish(&job);
            }
        }
        let _ = self.events.send(Event::WorkerLost {
            worker: w,
            class: c,
            why,
        });
        self.ring();
    }

    /// Whether a live job is one class `c` can claim from.
    pub(crate) fn busy(&self, c: usize) -> bool {
        self.bells[c].live.load(Ordering::Acquire) > 0
    }

    /// The bells of the classes that can claim from `job`.
    fn bells_for<'a>(&'a self, job: &'a Job) -> impl Iterator<Item = &'a Bell> {
        self.bells
            .iter()
            .zip(&job.claimable[..])
            .filter_map(|(bell, &can)| can.then_some(bell))
    }

    /// Stops the workers; with `cancel`, fails every live job.
    pub(crate) fn close(&self, cancel: bool) {
        // First: a job admitted from now on fails itself (`admit`).
        self.closed.store(true, Ordering::SeqCst);
        if cancel {
            let mut jobs = Vec::new();
            self.snapshot(&mut jobs);
            for job in jobs {
                job.core().cancel(ActorError::Shutdown);
                self.reply(&job, Err(ActorError::Shutdown));
                self.finish(&job);
            }
        }
        self.ring();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Class `c`'s bell count, to wait on without missing a ring.
    pub(crate) fn bell(&self, c: usize) -> u64 {
        self.bells[c].count()
    }

    /// Wakes every idle worker.
    pub(crate) fn ring(&self) {
        self.bells.iter().for_each(Bell::ring);
    }

    /// Wakes the idle workers of the classes that can claim from `job`, and
    /// of those that stand by for its retries, in the job's wake order.
    pub(crate) fn ring_for(&self, job: &Job) {
        job.wake.iter().for_each(|&c| self.bells[c].ring());
    }

    /// Waits for a ring of class `c`'s bell after `seen` (or the close), at
    /// most `timeout` ([`Bell::wait`]).
    pub(crate) fn wait(&self, c: usize, seen: u64, timeout: Duration) {
        self.bells[c].wait(seen, timeout, || self.is_closed());
    }
}

#[cfg(test)]
mod tests {
    use coexec_kernels::Empty;

    use super::*;
    use crate::broker::job::Admitted;
    use crate::device::{DeviceKind, End};
    use crate::perfmodel::SpeedModel;
    use crate::policy::{Admission, Chunking, ClassSpeed, Thresholds};

    /// A `cpu` class and a `sim` class, one worker each.
    fn registry() -> Registry {
        let class = |index: usize, kind: DeviceKind| ClassInfo {
            index,
            name: if index == 0 { "cpu" } else { "sim" }.into(),
            profile_key: format!("k{index}"),
            kind,
            workers: 1,
            end: if index == 0 { End::Head } else { End::Tail },
            model: String::new(),
            fill_threads: 0,
        };
        let classes: Arc<[ClassInfo]> = vec![
            class(0, DeviceKind::Cpu),
            class(
                1,
                DeviceKind::Sim {
                    speed: 1.0,
                    latency: Duration::ZERO,
                },
            ),
        ]
        .into();
        Registry::new(
            classes,
            vec![0, 1].into(),
            JobOrder::Fifo,
            flume::unbounded().0,
        )
    }

    /// A job of 100 items that only the classes in `eligible` may run.
    fn job(reg: &Registry, id: u64, eligible: &[bool]) -> Arc<Job> {
        let speeds: Vec<ClassSpeed> = eligible
            .iter()
            .map(|&eligible| ClassSpeed {
                workers: 1,
                a: 0.0,
                b: Some(1e6),
                eligible,
                min_items: 1,
                start: 0.0,
                latency_chunks: crate::policy::LATENCY_CHUNKS,
            })
            .collect();
        let admitted = Admitted {
            policy: "test".into(),
            plan: Admission::pool(&speeds, Chunking::Fixed(10)),
            thresholds: Thresholds::default(),
            models: vec![SpeedModel::with_params(0.0, 1e6); eligible.len()],
            stored_split: vec![f64::NAN; eligible.len()],
            learns_split: false,
            eligible: eligible.to_vec(),
            in_service: vec![1; eligible.len()],
            remeasured: Vec::new(),
            trace: false,
        };
        let core = JobCore::new(
            Arc::new(Empty::new(100)),
            admitted,
            reg.classes.clone(),
            reg.worker_class.clone(),
        );
        let wake = core.wake_order();
        let claimable = core.claimable();
        Arc::new(Job {
            id,
            priority: 0,
            weight: 1.0,
            start: Instant::now(),
            profile_key: "test".into(),
            learn: true,
            core: Mutex::new(core),
            reply: Mutex::new(None),
            service_ns: Default::default(),
            closed: Default::default(),
            claimable,
            wake,
            inline: false,
        })
    }

    #[test]
    fn a_job_rings_and_keeps_busy_only_the_classes_that_can_claim_from_it() {
        let reg = registry();
        let cpu_only = job(&reg, 1, &[true, false]);
        let (cpu, sim) = (reg.bell(0), reg.bell(1));
        reg.admit(cpu_only.clone());
        assert!(reg.bell(0) > cpu, "the CPU class can claim: it is rung");
        assert_eq!(reg.bell(1), sim, "the sim class cannot: it sleeps on");
        assert!(reg.busy(0));
        assert!(!reg.busy(1), "no job for the sim: it need not poll");
        // A sim waiting on its bell is not woken by the CPU job's end.
        let seen = reg.bell(1);
        reg.cancel(&cpu_only);
        assert_eq!(reg.bell(1), seen);
        assert!(!reg.busy(0) && !reg.busy(1));

        let both = job(&reg, 2, &[true, true]);
        reg.admit(both.clone());
        assert!(reg.bell(1) > seen);
        assert!(reg.busy(0) && reg.busy(1));
        reg.cancel(&both);
        reg.finish(&both); // closes once: counted out once
        assert!(!reg.busy(0) && !reg.busy(1));

        // Closing wakes everyone.
        let (cpu, sim) = (reg.bell(0), reg.bell(1));
        reg.close(false);
        assert!(reg.bell(0) > cpu && reg.bell(1) > sim);
    }
}
