use super::{Admission, PlanContext, Policy, hybrid_among};

/// Every item on one accelerator class (the fastest known one, else the
/// first); the CPUs idle.
pub(super) struct AccelOnly;

impl Policy for AccelOnly {
    fn name(&self) -> &'static str {
        "accel-only"
    }
    fn describe(&self) -> &'static str {
        "every item on one accelerator class (the fastest known), CPUs idle"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        let pick = ctx
            .classes
            .iter()
            .zip(ctx.speeds)
            .filter(|(c, s)| c.is_accel() && s.eligible && s.workers > 0)
            .max_by(|(_, x), (_, y)| {
                let v = |s: &super::ClassSpeed| s.workers as f64 * s.b.unwrap_or(0.0);
                v(x).total_cmp(&v(y)).then(std::cmp::Ordering::Greater)
            })
            .map(|(c, _)| c.index);
        // The other classes are left out by design: never re-measured here.
        Admission {
            remeasure: false,
            ..hybrid_among(ctx, |c| Some(c.index) == pick)
        }
    }
}
