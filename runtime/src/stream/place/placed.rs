//! A placed batch's policy: its shares, run as static chunks.

use std::sync::Arc;

use coexec_actors::policy::{Admission, Chunking, PlanContext, Policy, Probe, Steal};

use super::Decision;

/// The policy a placed batch runs under: the placer's shares, static, with
/// the guarded stealing of the method's dynamic phase, without the probe.
///
/// Every chunk pays its device's fixed cost again (the digits MLP's GEMMs
/// pack their weights per call: ~450 µs of a 32-row batch's 1.5 ms on one
/// core), and a batch is short, so it runs in as few chunks as balance
/// allows: each class's share is static (one chunk per worker where the
/// fixed cost makes the guard keep it whole), split across classes or not.
/// The placer's models are per batch, fresh, and predict one chunk per class;
/// a split that kept the method's 20% dynamic tail ran 4.2 chunks per batch
/// (measured: 2.4 on the CPU and 1.75 on the sim, 92-row batches of the
/// digits MLP at 2000 requests/s on `cpu:1,sim:1@0.5`), each paying its
/// fixed cost again, and its p50 was 12.3–12.5 ms against 5.4–5.9 with one
/// chunk per class. What absorbs a model's error is then a faster class's
/// guarded steal from a slower one's share, the next batch's placement
/// (every batch's report refreshes the models) and, for a chunk far past
/// its prediction on a device that can stop, the runtime's take-back.
/// (With the method's 80% static part, a 32-row batch on one class would be
/// cut into 25 + 7 rows, and on a kernel with no fixed cost the guard would
/// halve it into six chunks.)
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) shares: Vec<f64>,
}

impl Policy for Placed {
    fn name(&self) -> &'static str {
        "stream"
    }
    fn describe(&self) -> &'static str {
        "a stream's batch, placed on learned models (no probe)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        let mut shares = self.shares.clone();
        shares.resize(ctx.speeds.len(), 0.0);
        let split = shares.iter().filter(|s| **s > 0.0).count() > 1;
        Admission::split(shares)
            .probe(Probe::None)
            .static_part(1.0, 1)
            .chunking(Chunking::TimeGuided)
            .steal(Steal::Always)
            .guard(split)
            .keep_static(true)
    }
}

impl Decision {
    /// The batch's policy.
    pub(crate) fn policy(&self) -> Arc<dyn Policy> {
        Arc::new(Placed {
            shares: self.shares.clone(),
        })
    }
}
