//! What the broker decides when it admits a job, as a plain function of what
//! it knows: the kernel, the options, the classes in service and what the
//! profiler stored. The actor only gathers these; the virtual-time harness
//! calls the same function.

use coexec_kernels::Kernel;

use super::JobOptions;
use super::job::Admitted;
use crate::device::{ClassInfo, DeviceKind};
use crate::policy::{Admission, Chunking, ClassSpeed, PlanContext, Policy, Thresholds};
use crate::profiler::Stored;

/// Every this many jobs of a kernel, a class the plan gives nothing gets a
/// small region anyway: a model that says it is hopeless (one bad
/// measurement, a profile from a bad day) would otherwise never be measured
/// again, run after run.
pub(crate) const REMEASURE_EVERY: u64 = 8;

/// What the broker knows when it admits a job.
pub(crate) struct Request<'a> {
    pub(crate) kernel: &'a dyn Kernel,
    pub(crate) opts: &'a JobOptions,
    /// The runtime's policy, for a job whose options name none.
    pub(crate) default_policy: &'a dyn Policy,
    pub(crate) classes: &'a [ClassInfo],
    /// Per class, its workers in service.
    pub(crate) in_service: Vec<usize>,
    pub(crate) stored: Stored,
    pub(crate) thresholds: Thresholds,
    /// Jobs of this kernel admitted so far, this one included.
    pub(crate) seen: u64,
    /// Record every chunk.
    pub(crate) trace: bool,
}

/// The job as the broker admits it: eligibility, the policy's plan (with a
/// fixed chunk or a re-measured class where that applies), and what the job
/// needs of the stored models.
pub(crate) fn admit(req: Request<'_>) -> Admitted {
    let Request {
        kernel,
        opts,
        default_policy,
        classes,
        in_service,
        stored,
        thresholds,
        seen,
        trace,
    } = req;
    let policy = opts.policy.as_deref().unwrap_or(default_policy);
    let grain = kernel.grain().max(1);
    let able = able(kernel, classes);
    let eligible = eligible(&able, opts, classes);
    let learns_split = able.iter().zip(&eligible).all(|(a, e)| a == e);
    let Stored {
        models,
        split,
        history,
    } = stored;
    let speeds: Vec<ClassSpeed> = models
        .iter()
        .zip(&eligible)
        .zip(&in_service)
        .zip(classes.iter())
        .map(|(((md, &el), &w), info)| ClassSpeed {
            workers: w,
            a: md.a(),
            b: md.is_known().then(|| md.b()),
            eligible: el,
            // Not the GPU's fill size: a GPU given less than it fills is
            // still worth its share; the job sizes its chunks.
            min_items: grain,
            start: md.start(),
            latency_chunks: thresholds.latency_chunks(info),
        })
        .collect();
    let ctx = PlanContext {
        items: kernel.items(),
        grain,
        classes,
        speeds: &speeds,
        thresholds,
        history: &history,
    };
    // Chunks of a size asked for replace the policy's plan: it is not made.
    let adm = match opts.chunk {
        Some(n) => Admission::pool(&speeds, Chunking::Fixed(n.max(1))),
        None => policy.admit(&ctx),
    };
    let mut adm = adm;
    let mut remeasured = vec![false; classes.len()];
    if adm.remeasure && seen.is_multiple_of(REMEASURE_EVERY) {
        let given = remeasure(&mut adm, &speeds, ctx.items, grain);
        if !given.is_empty() {
            // The run is no longer the one forecast: nothing to learn from
            // it but the models' samples.
            adm.forecast = None;
        }
        for c in given {
            remeasured[c] = true;
        }
    }
    Admitted {
        policy: policy.name().to_string(),
        plan: adm,
        thresholds,
        models,
        stored_split: split,
        learns_split,
        eligible,
        in_service,
        remeasured,
        trace: trace || opts.trace,
    }
}

/// Per class, whether it can run `kernel` (a CUDA class only with a twin).
pub(crate) fn able(kernel: &dyn Kernel, classes: &[ClassInfo]) -> Vec<bool> {
    classes
        .iter()
        .map(|c| match c.kind {
            DeviceKind::Cpu | DeviceKind::Sim { .. } => true,
            DeviceKind::Cuda { .. } => kernel.cuda().is_some(),
        })
        .collect()
}

/// Per class, whether it can and may (`opts`' classes) run the kernel.
pub(crate) fn eligible(able: &[bool], opts: &JobOptions, classes: &[ClassInfo]) -> Vec<bool> {
    classes
        .iter()
        .zip(able)
        .map(|(c, &able)| {
            able && opts
                .classes
                .as_ref()
                .is_none_or(|only| only.contains(&c.index))
        })
        .collect()
}

/// Gives every eligible class in service that `adm` leaves out a region of
/// about a thousandth of the items (at least a grain): a bounded cost, since
/// a class k times slower than the rest together stretches the job by about
/// k/1000, and enough items for one measured chunk. Not a class whose start
/// and fixed cost per chunk alone would take more than a quarter of the
/// run's forecast: there the model is right that it does not pay, and a
/// measurement would cost that much whatever its size. The classes it gave
/// a region.
fn remeasure(adm: &mut Admission, speeds: &[ClassSpeed], items: usize, grain: usize) -> Vec<usize> {
    if adm.pool || items == 0 {
        return Vec::new();
    }
    let small = ((items / 1000).max(grain).min(items) as f64) / items as f64;
    let budget = adm
        .forecast
        .as_ref()
        .map_or(f64::INFINITY, |f| 0.25 * f.plan_s);
    let left_out: Vec<usize> = (0..speeds.len())
        .filter(|&c| speeds[c].eligible && speeds[c].workers > 0 && adm.shares[c] <= 0.0)
        .filter(|&c| speeds[c].b.is_none() || speeds[c].start + speeds[c].a <= budget)
        .collect();
    let given: f64 = adm.shares.iter().sum();
    if left_out.is_empty() || given <= 0.0 {
        return Vec::new();
    }
    let taken = (small * left_out.len() as f64).min(0.5);
    for s in &mut adm.shares {
        *s *= (1.0 - taken) / given;
    }
    let each = taken / left_out.len() as f64;
    for &c in &left_out {
        tracing::debug!(class = c, "re-measuring a class the plan left out");
        adm.shares[c] = each;
    }
    left_out
}
