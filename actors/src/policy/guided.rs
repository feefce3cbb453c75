use super::{Admission, Chunking, PlanContext, Policy};

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
        Admission::pool(ctx.speeds, Chunking::Guided)
    }
}
