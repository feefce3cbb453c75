use super::{equal_chunk, Admission, Chunking, PlanContext, Policy, Probe, Steal};

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
            chunking: Chunking::Fixed(equal_chunk(ctx, 16)),
            steal: Steal::Always,
            guard: false,
        }
    }
}
