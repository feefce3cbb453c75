//! What the policy decided for a job, and what the job learns against it.

use super::*;

/// The policy's plan for a job, and the split it was admitted against.
pub(super) struct Plan {
    /// Name of the policy that planned the job.
    pub(super) policy: String,
    /// The plan: split, probe, chunking, guard and stealing. Its stealing
    /// opens up when a class is lost (`JobCore::worker_lost`).
    pub(super) adm: Admission,
    pub(super) th: Thresholds,
    /// Per class, its share of the items as planned at admission, then as
    /// the probe's re-plan gave it.
    pub(super) planned: Vec<f64>,
    /// The split stored for this kernel when the job was admitted.
    pub(super) stored_split: Vec<f64>,
    /// Whether this job's static phase may replace it (see [`Admitted`]).
    pub(super) learns_split: bool,
}

impl Plan {
    /// The static part of what a re-plan leaves, as a fraction of it: the
    /// plan's static fraction of the items the warm probe did not take.
    pub(super) fn static_fraction_after_probe(&self) -> f64 {
        let rest = 1.0 - self.th.warm_probe;
        if rest > 0.0 {
            (self.adm.static_fraction / rest).min(1.0)
        } else {
            0.0
        }
    }

    /// The seed's ν rule, as the profiler will apply it to a run that
    /// learned `learned`: how far it is from the stored split (`None` where
    /// the job may not replace it), and whether it replaces it.
    pub(super) fn split_verdict(&self, learned: &[f64]) -> (Option<f64>, bool) {
        let delta = self
            .learns_split
            .then(|| crate::profiler::split_delta(&self.stored_split, learned));
        let stored = delta.is_some_and(|d| d > self.th.nu && learned.iter().sum::<f64>() > 0.0);
        (delta, stored)
    }
}
