use super::{Admission, Chunking, PlanContext, Policy, Probe, Steal};

/// Guided self-scheduling weighted by speed: each claim takes the worker's
/// share of half of what is left.
pub(super) struct Guided;

impl Policy for Guided {
    fn name(&self) -> &'static str {
        "guided"
    }
    fn describe(&self) -> &'static str {
        "guided self-scheduling: chunk = remaining x worker's speed share / 2"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        Admission {
            shares: ctx
                .speeds
                .iter()
                .map(|s| if s.eligible { 1.0 } else { 0.0 })
                .collect(),
            pool: true,
            probe: Probe::None,
            static_fraction: 0.0,
            static_chunks_per_worker: 1,
            chunking: Chunking::Guided,
            steal: Steal::Always,
            guard: false,
        }
    }
}
