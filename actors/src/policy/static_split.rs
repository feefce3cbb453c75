use super::{Admission, Chunking, PlanContext, Policy, Probe, Steal};

/// The seed's first baseline: split once by the known speeds, one chunk per
/// worker, no queue.
pub(super) struct Static;

impl Policy for Static {
    fn name(&self) -> &'static str {
        "static"
    }
    fn describe(&self) -> &'static str {
        "split once by the stored speeds, one chunk per worker, no queue (the seed's first baseline)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        Admission {
            shares: ctx.model_shares(),
            pool: false,
            probe: Probe::None,
            static_fraction: 1.0,
            static_chunks_per_worker: 1,
            chunking: Chunking::Fixed(ctx.items.max(1)),
            steal: Steal::Never,
            guard: false,
            forecast: None,
            remeasure: true,
            standby: false,
            keep_static: false,
            pace: Vec::new(),
        }
    }
}
