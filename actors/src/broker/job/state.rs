//! Per class, what a job keeps: its region and targets, its samples, its
//! report figures; its part of a probe under way; and per worker, its part
//! in the job.

use std::collections::VecDeque;

use crate::perfmodel::{Sample, SpeedModel};

#[derive(Debug, Clone, Default)]
pub(super) struct ClassState {
    pub(super) eligible: bool,
    pub(super) workers: usize,
    pub(super) model: SpeedModel,
    pub(super) run_samples: VecDeque<Sample>,
    // Region accounting since the last (re)plan.
    pub(super) claimed: usize,
    /// Its region's items at the last (re)plan.
    pub(super) region: usize,
    /// Items of its region the probe takes (0 with no probe, and after a
    /// re-plan): its static phase starts there. Read after the probe too, so
    /// it is not in [`ProbeState`].
    pub(super) probe_target: usize,
    pub(super) static_target: usize,
    // Static-phase throughput, for learning the split (the seed's step 4).
    pub(super) static_items: usize,
    pub(super) static_secs: f64,
    // Report.
    pub(super) items: usize,
    pub(super) chunks: usize,
    pub(super) busy: f64,
    pub(super) finish: f64,
    /// What the model at admission predicted for the chunks it completed.
    pub(super) predicted: f64,
    /// The model as admitted, before this run's chunks refine [`ClassState::model`]:
    /// what the run is measured against.
    pub(super) admitted: SpeedModel,
    /// It may run the kernel and has workers, but the plan gives it
    /// nothing: it stands by for retries (see `Admission::standby`).
    pub(super) standby: bool,
    /// The smallest chunk it is given while its own region lasts (enough
    /// to fill a GPU; see `ClassInfo::min_chunk`).
    pub(super) min_chunk: usize,
    /// The least work a chunk costs, in items (a chunk of fewer takes as
    /// long as one of this many), and whether its recent chunks measured it
    /// (`guard::least_work`). Unmeasured, a GPU's is its fill.
    pub(super) least: (usize, bool),
    /// Whether this run tried a chunk below an unmeasured fill.
    pub(super) tried_small: bool,
    /// Given a region only to be measured again (the plan left it out):
    /// until one of its chunks ends, its own region's chunks are not
    /// judged by the model they are there to replace.
    pub(super) remeasured: bool,
    /// What the plan divided its speed by (`Admission::pace`; 1 where it
    /// did not): the guard divides it alike.
    pub(super) pace: f64,
}

impl ClassState {
    pub(super) fn b(&self) -> Option<f64> {
        self.model.is_known().then(|| self.model.b())
    }
}

/// One worker's part in a job.
#[derive(Debug, Clone)]
pub(super) struct WorkerState {
    /// When its chunk of this job in flight is predicted to end (seconds
    /// since the job started); when its last one ended, between chunks.
    pub(super) busy_until: f64,
    /// Whether it has a chunk of this job in flight.
    pub(super) running: bool,
    /// While it runs a chunk: when the chunk began (seconds since the job
    /// started; an accelerator's first, when its setup ends) and its items.
    pub(super) in_flight: (f64, usize),
    /// When it started its first chunk of this job (NaN: none yet).
    pub(super) first_start: f64,
    /// Whether its last look at this job was a refusal by the guard
    /// (cleared when it claims).
    pub(super) declined: bool,
}

impl Default for WorkerState {
    fn default() -> Self {
        Self {
            busy_until: 0.0,
            running: false,
            in_flight: (0.0, 0),
            first_start: f64::NAN,
            declined: false,
        }
    }
}

/// One class's part of the probe under way; dropped when the probe ends
/// (`probe.rs`).
#[derive(Debug, Clone, Default)]
pub(super) struct ProbeState {
    /// Next cold probe chunk per worker: starts small and doubles.
    pub(super) ramp: usize,
    /// Items and chunks of probe completed.
    pub(super) done: usize,
    pub(super) chunks: usize,
    /// When its latest probe chunk ended (seconds since the job started).
    pub(super) finish: f64,
    /// What the stored model predicted for this class's warm probe chunk,
    /// and the longest probe chunk it took (its own time: a compile before
    /// the first chunk is not in it).
    pub(super) predicted: f64,
    pub(super) secs: f64,
}

impl ProbeState {
    /// A probe chunk of `n` items ran from `end - secs` to `end`.
    pub(super) fn record(&mut self, n: usize, end: f64, secs: f64) {
        self.done += n;
        self.chunks += 1;
        self.finish = self.finish.max(end);
        self.secs = self.secs.max(secs);
    }
}
