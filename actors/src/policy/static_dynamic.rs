use super::{Admission, Chunking, PlanContext, Policy, Probe, Steal, equal_chunk};

/// The seed's middle baseline: 90% split once by the known speeds, the rest
/// handed out in equal chunks to whoever is free.
pub(super) struct StaticDynamic;

impl Policy for StaticDynamic {
    fn name(&self) -> &'static str {
        "static+dynamic"
    }
    fn describe(&self) -> &'static str {
        "90% split once by the stored speeds, the rest in equal chunks to whoever is free (the seed's second baseline)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        Admission {
            shares: ctx.model_shares(),
            pool: false,
            probe: Probe::None,
            static_fraction: 0.9,
            static_chunks_per_worker: 1,
            chunking: Chunking::Fixed((equal_chunk(ctx, 1) / 10).max(ctx.grain)),
            steal: Steal::Always,
            guard: false,
            forecast: None,
            remeasure: true,
            standby: false,
            keep_static: false,
            pace: Vec::new(),
        }
    }
}
