use super::{equal_chunk, Admission, Chunking, PlanContext, Policy, Probe, Steal};

/// Earliest finish time, HEFT-like: fixed chunks, each taken only by a worker
/// that would finish it before any other worker could.
pub(super) struct Eft;

impl Policy for Eft {
    fn name(&self) -> &'static str {
        "eft"
    }
    fn describe(&self) -> &'static str {
        "earliest finish time (HEFT-like): a free worker takes a chunk only if no other would finish it sooner"
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
            chunking: Chunking::Eft(equal_chunk(ctx, 8)),
            steal: Steal::Always,
            guard: false,
        }
    }
}
