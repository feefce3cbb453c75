use super::{Admission, PlanContext, Policy, hybrid_among};

/// Every item on the CPU class; other classes idle.
pub(super) struct CpuOnly;

impl Policy for CpuOnly {
    fn name(&self) -> &'static str {
        "cpu-only"
    }
    fn describe(&self) -> &'static str {
        "every item on the CPU cores, accelerators idle (the one-device baseline)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        // The accelerators are left out by design: never re-measured here.
        Admission {
            remeasure: false,
            ..hybrid_among(ctx, |c| !c.is_accel())
        }
    }
}
