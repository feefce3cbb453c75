//! The broker actor: admits jobs into the registry it owns, and closes them
//! when workers report them over. Workers never message it per chunk.

pub(crate) mod admission;
pub(crate) mod job;
pub(crate) mod registry;
pub(crate) mod space;
pub(crate) mod vetted;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix::{
    Actor, ActorFutureExt, Addr, Context, Handler, Message, ResponseActFuture, StreamHandler,
    WrapFuture,
};
use coexec_kernels::Kernel;

use self::job::JobCore;
use self::registry::{Event, Job, Registry, Reply};
use crate::SpeedModel;
use crate::metrics as m;
use crate::policy::{Policy, Thresholds};
use crate::profiler::{Lookup, Profiler, Stored};

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
}

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
            .finish()
    }
}

pub(crate) struct Broker {
    pub(crate) reg: Arc<Registry>,
    pub(crate) profiler: Addr<Profiler>,
    pub(crate) thresholds: Thresholds,
    pub(crate) policy: Arc<dyn Policy>,
    pub(crate) trace: bool,
    pub(crate) next_id: u64,
    /// Jobs admitted per profile key, for [`admission::REMEASURE_EVERY`].
    pub(crate) admitted: std::collections::HashMap<String, u64>,
}

impl Actor for Broker {
    type Context = Context<Self>;
}

/// Admit a job; the answer goes to `reply` when it is over.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Submit {
    pub(crate) kernel: Arc<dyn Kernel>,
    pub(crate) opts: JobOptions,
    pub(crate) reply: Reply,
}

impl Broker {
    fn class_keys(&self) -> Vec<String> {
        self.reg
            .classes
            .iter()
            .map(|c| c.profile_key.clone())
            .collect()
    }

    fn admit(&mut self, m: Submit, stored: Stored) {
        if m.reply.is_closed() {
            // Its caller stopped waiting before it was admitted: nothing to
            // run, nobody to answer; the kernel goes with `m`.
            drop(m);
            self.reg.forgive();
            return;
        }
        let kernel = m.kernel;
        let profile_key = kernel.profile_key();
        let seen = self.admitted.entry(profile_key.clone()).or_default();
        *seen += 1;
        let admitted = admission::admit(admission::Request {
            kernel: &*kernel,
            opts: &m.opts,
            default_policy: &*self.policy,
            classes: &self.reg.classes,
            in_service: (0..self.reg.classes.len())
                .map(|c| self.reg.in_service(c))
                .collect(),
            stored,
            thresholds: self.thresholds,
            seen: *seen,
            trace: self.trace,
        });
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
        self.next_id += 1;
        let claimable = core.claimable();
        let wake = core.wake_order();
        let job = Arc::new(Job {
            id: self.next_id,
            priority: m.opts.priority,
            weight: m.opts.weight.max(1e-9),
            start: Instant::now(),
            profile_key,
            learn: m.opts.learn,
            core: Mutex::new(core),
            reply: Mutex::new(Some(m.reply)),
            service_ns: Default::default(),
            closed: Default::default(),
            claimable,
            wake,
        });
        self.reg.admit(job);
    }
}

impl Handler<Submit> for Broker {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, m: Submit, _: &mut Context<Self>) -> Self::Result {
        let lookup = Lookup {
            key: m.kernel.profile_key(),
            classes: self.class_keys(),
        };
        let n = self.reg.classes.len();
        Box::pin(
            self.profiler
                .send(lookup)
                .into_actor(self)
                .map(move |stored, act, _| {
                    let stored = stored.unwrap_or_else(|_| Stored {
                        models: vec![SpeedModel::default(); n],
                        split: vec![f64::NAN; n],
                        history: Default::default(),
                    });
                    act.admit(m, stored);
                }),
        )
    }
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
