use super::{hybrid_among, Admission, PlanContext, Policy};

/// The seed's queue-based hybrid: probe, static split by measured speed, then
/// a double-ended queue that CPUs eat from the head and accelerators from the
/// tail, in shrinking chunks, until they meet.
pub(super) struct Hybrid;

impl Policy for Hybrid {
    fn name(&self) -> &'static str {
        "hybrid"
    }
    fn describe(&self) -> &'static str {
        "the seed's method: probe, static split by measured speed, then a guarded deque eaten from both ends (default)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        hybrid_among(ctx, |_| true)
    }
}
