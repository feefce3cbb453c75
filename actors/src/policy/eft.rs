use super::{Admission, Chunking, PlanContext, Policy, equal_chunk};

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
        Admission::pool(ctx.speeds, Chunking::Eft(equal_chunk(ctx, 8)))
    }
}
