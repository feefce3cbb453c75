//! What a policy decides for a job at admission: the shares, the probe, the
//! static part and its chunking, stealing, and the forecast it made.

use super::*;

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
    /// Per class, what the plan divided its speed by: its pace in
    /// co-executed runs of this size
    /// ([`RunHistory::pace`](crate::profiler::RunHistory::pace)); the guard
    /// divides it alike. Empty, or a value that is not a positive number:
    /// 1.
    pub pace: Vec<f64>,
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
            pace: Vec::new(),
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
            pace: Vec::new(),
        }
    }
}
