//! The broker: admits jobs into the registry (on the submitter's thread,
//! [`Admitter`]), and the actor that hears the registry's events. Workers
//! close the jobs they finish; nobody messages the broker per job or chunk.

pub(crate) mod admission;
mod bell;
pub(crate) mod job;
pub(crate) mod registry;
pub(crate) mod space;
pub(crate) mod vetted;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::{Actor, Context, StreamHandler};
use coexec_kernels::{Chunk, Kernel, KernelError};

use self::job::{Claimed, JobCore};
use self::registry::{Event, Job, Registry, Reply};
use crate::ActorError;
use crate::Phase;
use crate::device::DeviceKind;
use crate::metrics as m;
use crate::policy::{Policy, Thresholds};
use crate::profiler::{Profiles, Stored};

/// Per-job settings, built from [`JobOptions::new`] (the defaults) with one
/// setter per setting.
///
/// ```
/// use coexec_actors::JobOptions;
///
/// let opts = JobOptions::new()
///     .policy(coexec_actors::policy::by_name("static").unwrap())
///     .priority(3)
///     .classes([0]);
/// assert!(opts.restricts_placement());
/// assert!(!JobOptions::new().priority(3).restricts_placement());
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct JobOptions {
    /// The policy; `None`: the runtime's default.
    pub(crate) policy: Option<Arc<dyn Policy>>,
    /// Priority under [`JobOrder::Priority`](crate::JobOrder::Priority): higher first.
    pub(crate) priority: i32,
    /// Weight under [`JobOrder::Fair`](crate::JobOrder::Fair).
    pub(crate) weight: f64,
    /// Record every chunk in the report.
    pub(crate) trace: bool,
    /// Only these device classes (by index) may run the job; `None`: all.
    pub(crate) classes: Option<Vec<usize>>,
    /// Hand out chunks of exactly this many items to whoever is free,
    /// overriding the policy's chunking (measuring overhead, or kernels with
    /// a known best chunk).
    pub(crate) chunk: Option<usize>,
    /// Whether the profiler learns from the run (its speed models, split and
    /// history); `false` for runs that do not stand for the kernel's speed.
    pub(crate) learn: bool,
    /// Whether a job small enough may run on the submitting thread.
    pub(crate) inline: bool,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            policy: None,
            priority: 0,
            weight: 1.0,
            trace: false,
            classes: None,
            chunk: None,
            learn: true,
            inline: true,
        }
    }
}

impl JobOptions {
    /// The defaults: the runtime's policy, priority 0, weight 1, no trace,
    /// every class, the policy's chunking, learned from.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the job under `policy` instead of the runtime's
    /// ([`by_name`](crate::policy::by_name) finds a built-in one).
    pub fn policy(mut self, policy: Arc<dyn Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Priority under [`JobOrder::Priority`](crate::JobOrder::Priority):
    /// higher first.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Weight under [`JobOrder::Fair`](crate::JobOrder::Fair) (floored at a
    /// tiny positive number).
    pub fn weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }

    /// Records every chunk in the report.
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// Only these device classes (their [`ClassInfo::index`](crate::ClassInfo),
    /// as `Runtime::classes` lists them) may run the job.
    pub fn classes(mut self, only: impl IntoIterator<Item = usize>) -> Self {
        self.classes = Some(only.into_iter().collect());
        self
    }

    /// Chunks of exactly `items` items to whoever is free, overriding the
    /// policy's chunking (0 is taken as 1).
    pub fn chunk(mut self, items: usize) -> Self {
        self.chunk = Some(items);
        self
    }

    /// The device classes the job is kept to ([`JobOptions::classes`]);
    /// `None`: every class.
    pub fn only_classes(&self) -> Option<&[usize]> {
        self.classes.as_deref()
    }

    /// Whether a policy or device classes are set: the job chooses where
    /// it runs (a stream then leaves its batches' placement to them).
    pub fn restricts_placement(&self) -> bool {
        self.policy.is_some() || self.classes.is_some()
    }

    /// Whether the profiler learns from the run (default `true`). A run
    /// that does not stand for the kernel's speed, such as a warm-up that
    /// pays a device's first-use costs, should not teach its models.
    pub fn learn(mut self, on: bool) -> Self {
        self.learn = on;
        self
    }

    /// Whether a small job may run on the submitting thread (default
    /// `true`): one the CPU class's model predicts shorter than handing it
    /// to a worker would take (the class's measured start, a thread's
    /// wake), and no longer than [`INLINE_MAX`], while the class is idle and
    /// is the only one that may run it (and fewer jobs run inline at once
    /// than it has workers). It then costs no thread wake at
    /// all; its chunks are claimed, timed and learned from as a worker's
    /// are ([`RunReport::inline`](crate::RunReport) says so). Turn it off
    /// where the submitting thread must never compute (an executor thread
    /// with tighter bounds than [`INLINE_MAX`]).
    pub fn inline(mut self, on: bool) -> Self {
        self.inline = on;
        self
    }
}

/// The longest job the CPU class's model predicts that runs on the
/// submitting thread ([`JobOptions::inline`]): well inside the time a tokio
/// task may hold its thread between two awaits.
pub const INLINE_MAX: std::time::Duration = std::time::Duration::from_micros(100);

impl std::fmt::Debug for JobOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobOptions")
            .field("policy", &self.policy.as_ref().map(|p| p.name()))
            .field("priority", &self.priority)
            .field("weight", &self.weight)
            .field("trace", &self.trace)
            .field("classes", &self.classes)
            .field("chunk", &self.chunk)
            .field("learn", &self.learn)
            .field("inline", &self.inline)
            .finish()
    }
}

/// Admission, as a plain struct on the submitter's thread: the kernel's
/// stored models looked up, the policy's plan made, and the job handed to
/// the registry, where a worker may claim it at once. No message is sent
/// and no thread woken on the way but the workers that will run it.
pub(crate) struct Admitter {
    pub(crate) reg: Arc<Registry>,
    pub(crate) profiles: Arc<Profiles>,
    pub(crate) thresholds: Thresholds,
    pub(crate) policy: Arc<dyn Policy>,
    pub(crate) trace: bool,
    /// The profile keys of the classes, in order.
    class_keys: Vec<String>,
    /// Ids handed out and jobs admitted per profile key (for
    /// [`admission::REMEASURE_EVERY`]).
    counts: Mutex<Counts>,
    /// The metrics of chunks run inline: the labels of the worker whose
    /// place they take, and its index.
    labels: Mutex<Option<(usize, m::WorkerLabels)>>,
    /// Jobs running inline now: at most as many as the class has workers
    /// (idle ones: it has no live job), so inline runs never crowd the
    /// cores more than the workers would.
    inline_running: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Counts {
    next_id: u64,
    admitted: std::collections::HashMap<String, u64>,
}

impl Admitter {
    pub(crate) fn new(
        reg: Arc<Registry>,
        profiles: Arc<Profiles>,
        thresholds: Thresholds,
        policy: Arc<dyn Policy>,
        trace: bool,
    ) -> Self {
        let class_keys = reg.classes.iter().map(|c| c.profile_key.clone()).collect();
        Self {
            reg,
            profiles,
            thresholds,
            policy,
            trace,
            class_keys,
            counts: Mutex::default(),
            labels: Mutex::new(None),
            inline_running: Default::default(),
        }
    }

    /// Admits `kernel` (vetted: its metadata is cached, no user code runs
    /// here but the policy's plan); the answer goes to `reply` when the job
    /// is over. A panic in the policy fails this job alone.
    pub(crate) fn admit(&self, kernel: Arc<dyn Kernel>, mut opts: JobOptions, reply: Reply) {
        let profile_key = kernel.profile_key();
        let stored = self.profiles.lookup(&profile_key, &self.class_keys);
        let (id, seen) = {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            counts.next_id += 1;
            let id = counts.next_id;
            let seen = counts.admitted.entry(profile_key.clone()).or_default();
            *seen += 1;
            (id, *seen)
        };
        let items = kernel.items();
        let inline = self.inline_class(&*kernel, &opts, &stored, items);
        if inline.is_some() {
            // One thread runs it: one chunk, and no plan to make.
            opts.chunk = Some(items.max(1));
        }
        let planned = KernelError::catch(|| {
            Ok(admission::admit(admission::Request {
                kernel: &*kernel,
                opts: &opts,
                default_policy: &*self.policy,
                classes: &self.reg.classes,
                in_service: (0..self.reg.classes.len())
                    .map(|c| self.reg.in_service(c))
                    .collect(),
                stored,
                thresholds: self.thresholds,
                seen,
                trace: self.trace,
            }))
        });
        let admitted = match planned {
            Ok(a) => a,
            Err(e) => {
                if inline.is_some() {
                    self.inline_running.fetch_sub(1, Ordering::AcqRel);
                }
                let why = ActorError::PolicyFailed {
                    policy: opts
                        .policy
                        .as_deref()
                        .unwrap_or(&*self.policy)
                        .name()
                        .into(),
                    kernel: kernel.name().to_string(),
                    why: e.to_string(),
                };
                drop(kernel);
                let _ = reply.send(Err(why));
                self.reg.forgive();
                return;
            }
        };
        // The kernel moves into the job: once the registry has it, a worker
        // may finish and answer it at once, and the caller then needs to be
        // its only owner.
        let core = JobCore::new(
            kernel,
            admitted,
            self.reg.classes.clone(),
            self.reg.worker_class.clone(),
        )
        .with_take_back(self.reg.take_back.clone());
        let claimable = core.claimable();
        let wake = core.wake_order();
        let job = Arc::new(Job {
            id,
            priority: opts.priority,
            weight: opts.weight.max(1e-9),
            start: Instant::now(),
            profile_key,
            learn: opts.learn,
            core: Mutex::new(core),
            reply: Mutex::new(Some(reply)),
            service_ns: Default::default(),
            closed: Default::default(),
            claimable,
            wake,
            inline: inline.is_some(),
        });
        match inline {
            Some(c) => self.run_inline(job, c),
            None => self.reg.admit(job),
        }
    }

    /// The class a job may run inline on ([`JobOptions::inline`]): the one
    /// class that may run it, a CPU class with workers in service and no
    /// live job, whose model predicts the whole job on one thread at most
    /// [`INLINE_MAX`] and at most the parallel run plus the hand-off (the
    /// class's measured start) would take. Counts the job in
    /// `inline_running` when it says yes (`run_inline` counts it out).
    fn inline_class(
        &self,
        kernel: &dyn Kernel,
        opts: &JobOptions,
        stored: &Stored,
        items: usize,
    ) -> Option<usize> {
        if !opts.inline || opts.chunk.is_some() || opts.trace || self.trace {
            // Chunks of a size asked for, or a trace of the workers' chunks:
            // for the workers.
            return None;
        }
        let classes = &self.reg.classes;
        let eligible = admission::eligible(&admission::able(kernel, classes), opts, classes);
        let mut serving = (0..classes.len()).filter(|&c| eligible[c] && self.reg.in_service(c) > 0);
        let c = serving.next()?;
        if serving.next().is_some()
            || !matches!(classes[c].kind, DeviceKind::Cpu)
            || self.reg.busy(c)
        {
            return None;
        }
        let model = stored.models.get(c)?;
        let alone = model.predict(items as f64);
        let handed = model.start() + alone / self.reg.in_service(c) as f64;
        if !(alone.is_finite() && alone <= INLINE_MAX.as_secs_f64() && alone <= handed) {
            return None;
        }
        if self.inline_running.fetch_add(1, Ordering::AcqRel) >= self.reg.in_service(c) {
            self.inline_running.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(c)
    }

    /// Runs `job` on this thread as the first worker of class `c` would
    /// (the job is in no registry, so no worker sees it), and closes it.
    /// Should a chunk be left that this thread may not take (a failed
    /// chunk kept for another worker), the job goes to the workers.
    fn run_inline(&self, job: Arc<Job>, c: usize) {
        let Some(w) = self.reg.worker_class.iter().position(|&k| k == c) else {
            self.inline_running.fetch_sub(1, Ordering::AcqRel);
            self.reg.admit(job);
            return;
        };
        // What the chunks did, recorded once the job is over (no lock held
        // while a kernel runs).
        let mut ran: Vec<(Phase, usize, f64)> = Vec::new();
        let mut failed = 0;
        loop {
            let t0 = job.start.elapsed().as_secs_f64();
            let claimed = job.core().claim(w, c, t0);
            let Some(Claimed {
                info,
                kernel,
                claims,
            }) = claimed
            else {
                break;
            };
            let chunk = Chunk::claim(&claims, info.range.clone());
            drop(claims);
            let res = match &chunk {
                Some(chunk) => crate::worker::guarded(|| kernel.run_cpu(chunk)),
                None => Err(crate::worker::overlap(&info.range)),
            };
            let t1 = job.start.elapsed().as_secs_f64();
            drop(chunk);
            drop(kernel);
            let mut core = job.core();
            let after = match res {
                Ok(()) => {
                    self.reg.add_done(w, info.range.len());
                    ran.push((info.phase, info.range.len(), t1 - t0));
                    core.complete(w, c, &info, t0, t1)
                }
                Err(e) => {
                    tracing::warn!(class = c, items = ?info.range, error = %e, "inline chunk failed; it runs again");
                    failed += 1;
                    core.fail(w, &info, e)
                }
            };
            drop(core);
            if after.finished {
                break;
            }
        }
        let (name, over) = {
            let core = job.core();
            (core.name().to_string(), core.is_over())
        };
        self.record_inline(c, w, &name, &ran, failed);
        self.inline_running.fetch_sub(1, Ordering::AcqRel);
        if over {
            self.reg.finish(&job);
        } else {
            self.reg.admit(job);
        }
    }

    /// Records inline chunks in the metrics, as the worker `w` whose place
    /// they took (idle meanwhile: the class had no live job), so every
    /// series is one a worker has.
    fn record_inline(
        &self,
        c: usize,
        w: usize,
        kernel: &str,
        ran: &[(Phase, usize, f64)],
        failed: usize,
    ) {
        let mut held = self.labels.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|(k, _)| *k != w) {
            *held = None;
        }
        let (_, labels) =
            held.get_or_insert_with(|| (w, m::WorkerLabels::new(&self.reg.classes[c].name, w)));
        for &(phase, items, secs) in ran {
            labels.chunk_done(kernel, phase, items, secs);
        }
        for _ in 0..failed {
            labels.chunk_failed(false);
        }
        labels.flush();
    }
}

/// The broker actor: the registry's events (a worker out of service).
pub(crate) struct Broker {
    pub(crate) reg: Arc<Registry>,
}

impl Actor for Broker {
    type Context = Context<Self>;
}

impl StreamHandler<Event> for Broker {
    fn handle(&mut self, ev: Event, _: &mut Context<Self>) {
        match ev {
            Event::WorkerLost { worker, class, why } => {
                let name = &self.reg.classes[class].name;
                tracing::error!(worker, class = %name, "worker out of service: {why}");
                m::device_failed(name);
            }
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The registry went away: nothing more will come. Stay up for submits,
        // which will find a closed registry.
    }
}
