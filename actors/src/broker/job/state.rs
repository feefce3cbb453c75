//! Per class, what a job keeps: its region and targets, its samples, its
//! report figures; and its part of a probe under way.

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
}

impl ClassState {
    pub(super) fn b(&self) -> Option<f64> {
        self.model.is_known().then(|| self.model.b())
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
