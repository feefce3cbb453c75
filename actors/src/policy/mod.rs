//! Scheduling policies: a family of declarative plans run by one engine.
//!
//! A policy looks at the job and the classes' speed models when the job is
//! admitted and answers with an [`Admission`]: how the item space is cut into
//! regions, whether to probe, how large chunks are, and who may take from
//! whose region. The broker's engine (`broker::job`) carries it out, so every
//! policy gets exactly-once claims, retries and reports for free, and they can
//! be compared in one run. One file per policy, registered in [`POLICIES`].

mod accel_only;
mod cpu_only;
mod dynamic;
mod eft;
mod guided;
mod hybrid;
mod plan;
mod static_dynamic;
mod static_split;

use std::sync::Arc;

pub use plan::{plan_shares, ClassSpeed, LATENCY_CHUNKS};

use crate::device::ClassInfo;
use crate::profiler::RunHistory;
use crate::ActorError;

/// The seed's thresholds and the engine's chunking constants (see
/// `docs/method.md`): start from the defaults and set what differs.
///
/// ```
/// let t = coexec_actors::policy::Thresholds::default().mu(0.2).static_fraction(0.7);
/// assert_eq!((t.mu, t.static_fraction), (0.2, 0.7));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Thresholds {
    /// μ: a probe whose imbalance exceeds this replaces the stored split.
    pub mu: f64,
    /// ν: a split that moved by more than this (relative) is stored.
    pub nu: f64,
    /// Fraction of a cold run each class probes (the seed: 5%).
    pub cold_probe: f64,
    /// Fraction of a warm run probed, split by the stored plan (the seed: 10%).
    pub warm_probe: f64,
    /// Fraction of a run handed out statically (the seed: 80%).
    pub static_fraction: f64,
    /// Static chunks per worker: more hedge against a slowed worker, fewer
    /// cost less.
    pub static_chunks_per_worker: usize,
    /// Warm start: a run whose kernel's last co-executed run kept to its
    /// models within μ skips the probe (see `docs/method.md`).
    #[serde(default = "yes")]
    pub warm_start: bool,
    /// The single-class rule: `hybrid` co-executes only where its forecast
    /// is clearly below the best single class's, and goes to that class
    /// alone otherwise (see `docs/method.md`).
    #[serde(default = "yes")]
    pub single_class: bool,
}

fn yes() -> bool {
    true
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            mu: 0.10,
            nu: 0.05,
            cold_probe: 0.05,
            warm_probe: 0.10,
            static_fraction: 0.80,
            static_chunks_per_worker: 4,
            warm_start: true,
            single_class: true,
        }
    }
}

impl Thresholds {
    /// Sets μ.
    pub fn mu(mut self, mu: f64) -> Self {
        self.mu = mu;
        self
    }

    /// Sets ν.
    pub fn nu(mut self, nu: f64) -> Self {
        self.nu = nu;
        self
    }

    /// Sets the fraction of a cold run each class probes.
    pub fn cold_probe(mut self, fraction: f64) -> Self {
        self.cold_probe = fraction;
        self
    }

    /// Sets the fraction of a warm run probed.
    pub fn warm_probe(mut self, fraction: f64) -> Self {
        self.warm_probe = fraction;
        self
    }

    /// Sets the fraction of a run handed out statically.
    pub fn static_fraction(mut self, fraction: f64) -> Self {
        self.static_fraction = fraction;
        self
    }

    /// Sets the static chunks per worker.
    pub fn static_chunks_per_worker(mut self, chunks: usize) -> Self {
        self.static_chunks_per_worker = chunks;
        self
    }

    /// Turns the warm start on or off.
    pub fn warm_start(mut self, on: bool) -> Self {
        self.warm_start = on;
        self
    }

    /// Turns the single-class rule on or off.
    pub fn single_class(mut self, on: bool) -> Self {
        self.single_class = on;
        self
    }
}

/// What a policy sees when a job is admitted.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PlanContext<'a> {
    /// Items in the job.
    pub items: usize,
    /// The kernel's grain.
    pub grain: usize,
    /// The runtime's classes.
    pub classes: &'a [ClassInfo],
    /// Per class: workers in service, model, eligibility for this kernel.
    pub speeds: &'a [ClassSpeed],
    /// The seed's thresholds.
    pub thresholds: Thresholds,
    /// What the kernel's earlier runs taught beyond its models.
    pub history: &'a RunHistory,
}

impl PlanContext<'_> {
    /// Whether every eligible class has a speed model.
    pub fn all_known(&self) -> bool {
        self.speeds
            .iter()
            .filter(|s| s.eligible && s.workers > 0)
            .all(|s| s.b.is_some())
    }

    /// Shares from the models (see [`plan_shares`]).
    pub fn model_shares(&self) -> Vec<f64> {
        self.plan(self.speeds).0
    }

    /// [`plan_shares`] of this job's items over `speeds`, each worker
    /// paying its fixed cost for a probe and its static chunks.
    pub fn plan(&self, speeds: &[ClassSpeed]) -> (Vec<f64>, f64) {
        plan_shares(
            self.items,
            speeds,
            1.0 + self.thresholds.static_chunks_per_worker as f64,
        )
    }

    /// The forecast of a run given `shares` over `speeds`: the plan's
    /// makespan for the classes given items, with their configuration's
    /// residual; `None` unless every class given items has a model.
    pub fn forecast(&self, speeds: &[ClassSpeed], shares: &[f64]) -> Option<Forecast> {
        let used: Vec<usize> = (0..shares.len()).filter(|&c| shares[c] > 0.0).collect();
        if used.is_empty() || used.iter().any(|&c| speeds[c].b.is_none()) {
            return None;
        }
        let only: Vec<ClassSpeed> = speeds
            .iter()
            .enumerate()
            .map(|(c, s)| ClassSpeed {
                eligible: s.eligible && used.contains(&c),
                ..*s
            })
            .collect();
        let (_, plan_s) = self.plan(&only);
        let config = self.config(&used);
        Some(Forecast {
            predicted_s: plan_s * (1.0 + self.history.residual(&config)),
            classes: used.len(),
            config,
            plan_s,
            single: None,
            coexec_s: None,
        })
    }

    /// The configuration key of the classes `used`: their profile keys
    /// joined by `+`.
    pub fn config(&self, used: &[usize]) -> String {
        used.iter()
            .map(|&c| self.classes[c].profile_key.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Speeds with eligibility narrowed by `keep`.
    pub fn only(&self, keep: impl Fn(&ClassInfo) -> bool) -> Vec<ClassSpeed> {
        self.speeds
            .iter()
            .zip(self.classes)
            .map(|(s, c)| ClassSpeed {
                eligible: s.eligible && keep(c),
                ..*s
            })
            .collect()
    }
}

/// How the first chunks of a run measure the classes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
#[serde(rename_all = "lowercase")]
pub enum Probe {
    /// No probe.
    None,
    /// No stored model for some class: each class probes on its own with
    /// small chunks that double, and the split is planned once every class
    /// has finished a chunk (the seed's 5% each, bounded in time).
    Cold,
    /// Models exist: the first `warm_probe` of the items, split by the
    /// stored plan, checks them; if the probe's imbalance exceeds μ the split
    /// is re-planned from the probe alone.
    Warm,
}

/// How large a claim is once a class is past its static share.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Chunking {
    /// Each worker takes what it can do in half the predicted remaining time,
    /// floored where its fixed cost would exceed 5% of the chunk.
    TimeGuided,
    /// Every chunk the same size.
    Fixed(usize),
    /// Guided self-scheduling weighted by worker speed: remaining × share / 2.
    Guided,
    /// Fixed-size chunks, each taken only by a worker that would finish it
    /// first among all workers (earliest finish time).
    Eft(usize),
}

/// Who may take items from a region that is not its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Steal {
    /// Nobody: a class stops when its region is empty.
    Never,
    /// Anyone, from the far end of the region with most time left. Under
    /// [`Admission::guard`] a steal passes the earliest-finish guard like
    /// any dynamic chunk: only a worker predicted to finish it before the
    /// others would have finished everything left without it takes it.
    Always,
}

/// A policy's plan for one job. A policy outside this crate starts from
/// [`Admission::split`] or [`Admission::pool`] and sets what differs.
///
/// ```
/// use coexec_actors::policy::{Admission, Chunking, Probe, Steal};
///
/// let a = Admission::split(vec![0.25, 0.75])
///     .probe(Probe::Warm)
///     .static_part(0.8, 4)
///     .chunking(Chunking::TimeGuided)
///     .steal(Steal::Always);
/// assert!(!a.pool && !a.guard);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Admission {
    /// Fraction of the items for each class's region (0 for a class that
    /// gets none). With `pool` set, only eligibility (> 0) matters.
    pub shares: Vec<f64>,
    /// One region that every eligible class eats from its own end.
    pub pool: bool,
    /// The probe.
    pub probe: Probe,
    /// Fraction of each region handed out in large static chunks.
    pub static_fraction: f64,
    /// Static chunks per worker.
    pub static_chunks_per_worker: usize,
    /// Chunk sizes after the static part.
    pub chunking: Chunking,
    /// Stealing between regions.
    pub steal: Steal,
    /// The earliest-finish guard: a worker takes a dynamic chunk (or a
    /// steal) only if it would finish it before the others finish what is
    /// left without it, and no more than its balanced part of the rest.
    pub guard: bool,
    /// What the policy predicted for the run, for the profiler to learn
    /// from (`None`: nothing).
    pub forecast: Option<Forecast>,
    /// Whether a class this plan leaves out may be given a small region now
    /// and then to measure it again (the broker's every-8th-job rule): not
    /// where the policy leaves it out by design (`cpu-only`), nor where
    /// `hybrid` chose one class because co-executing does not pay.
    pub remeasure: bool,
    /// Whether the classes this plan gives nothing stand by: they take no
    /// fresh items, but a chunk that fails or is taken back goes to them
    /// too, and if every worker the plan chose is lost they finish the job.
    pub standby: bool,
    /// Under the guard, whether a static chunk keeps its planned size until
    /// others have taken items from its class's region: for a plan made on
    /// models already right (a service's placer splitting a small batch,
    /// where every extra chunk pays the kernel's fixed cost again).
    /// Otherwise a static chunk is never larger than a dynamic one would be,
    /// so that a class planned too large does not commit to a long chunk at
    /// the end.
    pub keep_static: bool,
}

/// What a policy predicted for a run: the profiler learns each
/// configuration's residual from it, and the report shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Forecast {
    /// The classes the plan gives items: their profile keys joined by `+`.
    pub config: String,
    /// How many classes that is.
    pub classes: usize,
    /// The plan's makespan in seconds: each class's start, fixed costs and
    /// throughput (see [`plan_shares`]).
    pub plan_s: f64,
    /// The forecast: the plan's makespan with its configuration's residual.
    pub predicted_s: f64,
    /// The best single class (its index) and its forecast, where `hybrid`
    /// weighed co-executing against it.
    pub single: Option<(usize, f64)>,
    /// The co-executed forecast, where it was weighed.
    pub coexec_s: Option<f64>,
}

impl Admission {
    /// One region per class, of these fractions of the items, each handed
    /// out to its class alone in one chunk per worker: no probe, no
    /// stealing, no guard (the `static` policy's plan).
    pub fn split(shares: Vec<f64>) -> Self {
        Self {
            shares,
            pool: false,
            probe: Probe::None,
            static_fraction: 1.0,
            static_chunks_per_worker: 1,
            chunking: Chunking::TimeGuided,
            steal: Steal::Never,
            guard: false,
            forecast: None,
            remeasure: true,
            standby: false,
            keep_static: false,
        }
    }

    /// Sets the probe.
    pub fn probe(mut self, probe: Probe) -> Self {
        self.probe = probe;
        self
    }

    /// Hands out `fraction` of each region in large static chunks,
    /// `chunks_per_worker` of them per worker.
    pub fn static_part(mut self, fraction: f64, chunks_per_worker: usize) -> Self {
        self.static_fraction = fraction;
        self.static_chunks_per_worker = chunks_per_worker;
        self
    }

    /// Sets the chunk sizes after the static part.
    pub fn chunking(mut self, chunking: Chunking) -> Self {
        self.chunking = chunking;
        self
    }

    /// Sets who may steal from another class's region.
    pub fn steal(mut self, steal: Steal) -> Self {
        self.steal = steal;
        self
    }

    /// Lets the engine take a claim back when the rest is better left to
    /// faster classes (the earliest-finish guard).
    pub fn guard(mut self, on: bool) -> Self {
        self.guard = on;
        self
    }

    /// Sets [`Admission::keep_static`].
    pub fn keep_static(mut self, on: bool) -> Self {
        self.keep_static = on;
        self
    }

    /// One pool that every eligible class eats from its own end, in chunks
    /// sized by `chunking`: no probe, no static part, no guard.
    pub fn pool(speeds: &[ClassSpeed], chunking: Chunking) -> Self {
        Self {
            shares: speeds
                .iter()
                .map(|s| if s.eligible { 1.0 } else { 0.0 })
                .collect(),
            pool: true,
            probe: Probe::None,
            static_fraction: 0.0,
            static_chunks_per_worker: 1,
            chunking,
            steal: Steal::Always,
            guard: false,
            forecast: None,
            remeasure: true,
            standby: false,
            keep_static: false,
        }
    }
}

/// A scheduling policy.
pub trait Policy: Send + Sync {
    /// Name, as given to `--policy`.
    fn name(&self) -> &'static str;
    /// One line for `coexec policies`.
    fn describe(&self) -> &'static str;
    /// The plan for a job.
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission;
}

/// Every policy, in the order `coexec policies` lists them.
pub static POLICIES: &[&dyn Policy] = &[
    &hybrid::Hybrid,
    &cpu_only::CpuOnly,
    &accel_only::AccelOnly,
    &static_split::Static,
    &dynamic::Dynamic,
    &static_dynamic::StaticDynamic,
    &guided::Guided,
    &eft::Eft,
];

/// The policy called `name`.
///
/// ```
/// let p = coexec_actors::policy::by_name("hybrid").unwrap();
/// assert_eq!(p.name(), "hybrid");
/// assert!(coexec_actors::policy::by_name("fastest").is_err());
/// ```
pub fn by_name(name: &str) -> Result<Arc<dyn Policy>, ActorError> {
    POLICIES
        .iter()
        .find(|p| p.name() == name)
        .map(|p| Arc::new(PolicyRef(*p)) as Arc<dyn Policy>)
        .ok_or_else(|| ActorError::UnknownPolicy(name.to_string()))
}

struct PolicyRef(&'static dyn Policy);

impl Policy for PolicyRef {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn describe(&self) -> &'static str {
        self.0.describe()
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        self.0.admit(ctx)
    }
}

/// Equal fixed chunks for `ctx`: about `per_worker` chunks per worker.
fn equal_chunk(ctx: &PlanContext<'_>, per_worker: usize) -> usize {
    let workers: usize = ctx
        .speeds
        .iter()
        .filter(|s| s.eligible)
        .map(|s| s.workers)
        .sum();
    (ctx.items / (workers.max(1) * per_worker))
        .max(ctx.grain)
        .max(1)
}

/// The seed's hybrid among the classes `keep` admits: used by `hybrid`
/// itself and, narrowed to one kind of device, by `cpu-only` and
/// `accel-only`.
fn hybrid_among(ctx: &PlanContext<'_>, keep: impl Fn(&ClassInfo) -> bool) -> Admission {
    let speeds = ctx.only(keep);
    let narrowed = PlanContext {
        speeds: &speeds,
        ..ctx.clone()
    };
    let active = speeds
        .iter()
        .filter(|s| s.eligible && s.workers > 0)
        .count();
    let probe = if active < 2 {
        Probe::None
    } else if narrowed.all_known() {
        Probe::Warm
    } else {
        Probe::Cold
    };
    let shares = if narrowed.all_known() {
        narrowed.model_shares()
    } else {
        // Unknown speeds: regions by worker count until the probe re-plans.
        let w: f64 = speeds
            .iter()
            .filter(|s| s.eligible)
            .map(|s| s.workers as f64)
            .sum();
        speeds
            .iter()
            .map(|s| {
                if s.eligible {
                    s.workers as f64 / w
                } else {
                    0.0
                }
            })
            .collect()
    };
    let forecast = narrowed.forecast(&speeds, &shares);
    Admission {
        shares,
        pool: false,
        probe,
        static_fraction: ctx.thresholds.static_fraction,
        static_chunks_per_worker: ctx.thresholds.static_chunks_per_worker,
        chunking: Chunking::TimeGuided,
        steal: Steal::Always,
        guard: true,
        forecast,
        remeasure: true,
        standby: false,
        keep_static: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_described() {
        let mut names: Vec<_> = POLICIES.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), 8);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 8);
        assert!(POLICIES
            .iter()
            .all(|p| !p.describe().is_empty() && !p.describe().contains('\n')));
    }
}
