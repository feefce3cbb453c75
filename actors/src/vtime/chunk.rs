//! A chunk in flight on a modelled worker: its latency phase, then its
//! work, advanced at the sharing of the moment.

use crate::broker::job::Claimed;

/// A chunk in flight on a worker.
pub(super) struct Running {
    pub(super) claimed: Claimed,
    /// When its own time started (after a stream's setup).
    pub(super) start: f64,
    /// GPU: the latency phase ends here, then the work phase runs.
    pub(super) latency_until: f64,
    /// Seconds of work left at full speed (a GPU's in its work phase).
    pub(super) work_left: f64,
    /// Whether a CPU worker runs it.
    pub(super) cpu: bool,
}

impl Running {
    pub(super) fn gpu_work(&self, now: f64) -> bool {
        !self.cpu && now >= self.latency_until && self.work_left > 0.0
    }

    /// When it next changes phase or ends, at the current sharing.
    pub(super) fn next_event(&self, now: f64, sharing: f64, cpu_sharing: f64) -> f64 {
        if self.cpu {
            now + self.work_left * cpu_sharing
        } else if now < self.latency_until {
            self.latency_until
        } else {
            now + self.work_left * sharing
        }
    }

    pub(super) fn advance(&mut self, from: f64, to: f64, sharing: f64, cpu_sharing: f64) {
        let rate = if self.cpu {
            1.0 / cpu_sharing
        } else if self.gpu_work(from) {
            1.0 / sharing
        } else {
            return;
        };
        self.work_left = (self.work_left - (to - from) * rate).max(0.0);
        // What rounding leaves of a chunk that ends now.
        if self.work_left < 1e-12 {
            self.work_left = 0.0;
        }
    }

    pub(super) fn done(&self, now: f64) -> bool {
        (self.cpu || now >= self.latency_until) && self.work_left <= 0.0
    }
}
