use super::{Admission, Chunking, PlanContext, Policy, equal_chunk};

/// Self-scheduling in equal chunks: the first free worker takes the next one.
pub(super) struct Dynamic;

impl Policy for Dynamic {
    fn name(&self) -> &'static str {
        "dynamic"
    }
    fn describe(&self) -> &'static str {
        "equal chunks (about 16 per worker) to the first free worker"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        Admission::pool(ctx.speeds, Chunking::Fixed(equal_chunk(ctx, 16)))
    }
}
