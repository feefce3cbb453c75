//! What a finished run reports.

use serde::Serialize;

use crate::policy::Probe;

/// δ: the spread of finish times over the latest, `(max − min) / max`, as
/// the seed defines it; 0 with fewer than two.
///
/// ```
/// assert_eq!(coexec_actors::imbalance(&[1.0, 0.75]), 0.25);
/// assert_eq!(coexec_actors::imbalance(&[2.0]), 0.0);
/// ```
pub fn imbalance(finish: &[f64]) -> f64 {
    let max = finish.iter().cloned().fold(0.0, f64::max);
    let min = finish.iter().cloned().fold(f64::INFINITY, f64::min);
    if finish.len() > 1 && max > 0.0 {
        (max - min) / max
    } else {
        0.0
    }
}

/// `v` scaled to sum to 1; all zeros when it sums to 0.
pub(crate) fn normalized(v: &[f64]) -> Vec<f64> {
    let total: f64 = v.iter().sum();
    v.iter()
        .map(|x| if total > 0.0 { x / total } else { 0.0 })
        .collect()
}

/// Which part of the method handed out a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Phase {
    /// Measuring the classes.
    Probe,
    /// Large chunks of the planned split.
    Static,
    /// Shrinking chunks from the queue, or stolen.
    Dynamic,
    /// A chunk that failed once and runs again.
    Retry,
}

impl Phase {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Probe => "probe",
            Phase::Static => "static",
            Phase::Dynamic => "dynamic",
            Phase::Retry => "retry",
        }
    }
}

/// One chunk of a traced run.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ChunkRecord {
    /// Worker index.
    pub worker: usize,
    /// First item.
    pub lo: usize,
    /// One past the last item.
    pub hi: usize,
    /// Start, seconds since the job started.
    pub start: f64,
    /// End, seconds since the job started.
    pub end: f64,
    /// Phase.
    pub phase: Phase,
}

impl ChunkRecord {
    /// The record of items `items` run by `worker` from `start` to `end`
    /// (seconds since the job started), for tools that assemble reports of
    /// their own; the runtime makes these when tracing is on.
    pub fn new(
        worker: usize,
        items: std::ops::Range<usize>,
        start: f64,
        end: f64,
        phase: Phase,
    ) -> Self {
        Self {
            worker,
            lo: items.start,
            hi: items.end,
            start,
            end,
            phase,
        }
    }
}

/// One device class's part of a run.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ClassReport {
    /// Class name.
    pub name: String,
    /// Workers in service at the end.
    pub workers: usize,
    /// Items it computed.
    pub items: usize,
    /// Chunks it computed.
    pub chunks: usize,
    /// Worker-seconds spent in chunks.
    pub busy_s: f64,
    /// When its last chunk ended, seconds since the job started.
    pub finish_s: f64,
    /// Fraction of the job's items it computed.
    pub share: f64,
    /// Its model after the run: fixed seconds per chunk.
    pub model_a_s: f64,
    /// Its model after the run: items per second per worker.
    pub model_b_items_per_s: f64,
    /// When its workers started their first chunks, on average, seconds
    /// since the job started (`None`: it ran none).
    pub start_s: Option<f64>,
    /// Its chunks' time over what its model at admission predicted for
    /// them (`None`: it ran none, or had no model).
    pub model_ratio: Option<f64>,
}

/// What the probe found.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ProbeReport {
    /// Cold (no stored model) or warm.
    pub kind: Probe,
    /// The probe's imbalance δ′ (the seed's step 2).
    pub imbalance: f64,
    /// Whether the split was re-planned from the probe.
    pub replanned: bool,
    /// Shares planned before the probe.
    pub shares_before: Vec<f64>,
    /// Shares the probe's throughputs suggest.
    pub measured_shares: Vec<f64>,
    /// Shares used after the probe.
    pub shares_after: Vec<f64>,
}

/// The report of one run.
///
/// Read its fields; `RunReport::default()` is an empty report, for tools
/// that assemble reports of their own (a trace of another process's runs).
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct RunReport {
    /// Kernel name.
    pub kernel: String,
    /// Policy name.
    pub policy: String,
    /// Items in the job.
    pub items: usize,
    /// When the job was admitted, seconds since the runtime started.
    pub started_s: f64,
    /// Seconds from admission to the last chunk's end.
    pub makespan_s: f64,
    /// T* as this run's speed models predict it: every class the plan gave
    /// items busy to the end with no overhead (`items / Σ workers·b`).
    /// `ideal_s / makespan_s` estimates the efficiency E without running
    /// each class alone.
    pub ideal_s: f64,
    /// δ: spread of the classes' finish times over the latest, among classes
    /// that computed anything.
    pub imbalance: f64,
    /// Shares of the items per class that the run planned (after any re-plan).
    pub split: Vec<f64>,
    /// The split the static phase's measured speeds would have balanced.
    pub learned_split: Vec<f64>,
    /// The probe, if the policy probed.
    pub probe: Option<ProbeReport>,
    /// Chunks that failed and ran again.
    pub retries: usize,
    /// Δ between the stored split and this run's static phase (the seed's
    /// step 4); `None` when the run was kept off a class that could run the
    /// kernel, whose speed it then did not measure (a stream's batch placed
    /// on one class): such a run never replaces the stored split.
    pub split_delta: Option<f64>,
    /// Whether Δ exceeded ν and this run's split was stored for the next.
    pub split_stored: bool,
    /// What the policy forecast for the run, where it made a forecast.
    pub forecast: Option<crate::policy::Forecast>,
    /// How far the run strayed from its models: the spread, over the
    /// classes that ran, of each one's time over what its models at
    /// admission predicted for its chunks (δ′ of the whole run; `None`
    /// where a class had no model).
    pub prediction_imbalance: Option<f64>,
    /// Per device class.
    pub classes: Vec<ClassReport>,
    /// Every chunk, when tracing is on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkRecord>,
    /// Whether it ran on the submitting thread, without waking a worker (a
    /// job the CPU class's model predicts shorter than handing it over,
    /// on an idle class: [`JobOptions::inline`](crate::JobOptions::inline)).
    pub inline: bool,
}

impl RunReport {
    /// One line: kernel, items, makespan, δ and per-class shares.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self
            .classes
            .iter()
            .filter(|c| c.items > 0)
            .map(|c| {
                format!(
                    "{} {:.1}% ({} chunks, done {:.4}s)",
                    c.name,
                    100.0 * c.share,
                    c.chunks,
                    c.finish_s
                )
            })
            .collect();
        format!(
            "{} [{}] {} items in {:.4}s, imbalance {:.3}: {}",
            self.kernel,
            self.policy,
            self.items,
            self.makespan_s,
            self.imbalance,
            parts.join(", ")
        )
    }
}
