//! Scheduling policies: a family of declarative plans run by one engine.
//!
//! A policy looks at the job and the classes' speed models when the job is
//! admitted and answers with an [`Admission`]: how the item space is cut into
//! regions, whether to probe, how large chunks are, and who may take from
//! whose region. The broker's engine (`broker::job`) carries it out, so every
//! policy gets exactly-once claims, retries and reports for free, and they can
//! be compared in one run. One file per policy, registered in [`POLICIES`].

mod accel_only;
mod admission;
mod cpu_only;
mod dynamic;
mod eft;
mod guided;
mod hybrid;
mod plan;
mod static_dynamic;
mod static_split;
mod thresholds;

use std::sync::Arc;

pub use admission::{Admission, Chunking, Forecast, Probe, Steal};
pub use plan::{CPU_LATENCY_CHUNKS, ClassSpeed, LATENCY_CHUNKS, plan_shares};
pub use thresholds::Thresholds;

use crate::ActorError;
use crate::device::ClassInfo;
use crate::profiler::RunHistory;

/// What a policy sees when a job is admitted.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PlanContext<'a> {
    /// Items in the job.
    pub items: usize,
    /// The kernel's grain.
    pub grain: usize,
    /// The runtime's classes.
    pub classes: &'a [ClassInfo],
    /// Per class: workers in service, model, eligibility for this kernel.
    pub speeds: &'a [ClassSpeed],
    /// The seed's thresholds.
    pub thresholds: Thresholds,
    /// What the kernel's earlier runs taught beyond its models.
    pub history: &'a RunHistory,
}

impl PlanContext<'_> {
    /// Whether every eligible class has a speed model.
    pub fn all_known(&self) -> bool {
        self.speeds
            .iter()
            .filter(|s| s.eligible && s.workers > 0)
            .all(|s| s.b.is_some())
    }

    /// Shares from the models (see [`plan_shares`]).
    pub fn model_shares(&self) -> Vec<f64> {
        self.plan(self.speeds).0
    }

    /// [`plan_shares`] of this job's items over `speeds`, each worker
    /// paying its fixed cost for a probe and its static chunks (a single
    /// GPU's streams with no dynamic tail, once: one chunk each).
    pub fn plan(&self, speeds: &[ClassSpeed]) -> (Vec<f64>, f64) {
        let chunks = if self.no_tail(speeds) {
            1.0
        } else {
            1.0 + self.static_chunks_per_worker(speeds) as f64
        };
        plan_shares(self.items, speeds, chunks)
    }

    /// The one class `speeds` leaves eligible, where it is a single GPU's
    /// streams ([`ClassInfo::one_device_alone`]).
    fn one_device_alone<'s>(&self, speeds: &'s [ClassSpeed]) -> Option<&'s ClassSpeed> {
        ClassInfo::one_device_alone(self.classes, |c| {
            speeds.get(c).is_some_and(|s| s.eligible && s.workers > 0)
        })
        .map(|c| &speeds[c])
    }

    /// Static chunks per worker among the classes `speeds` leaves eligible:
    /// one for a single GPU's streams, else the thresholds'.
    pub fn static_chunks_per_worker(&self, speeds: &[ClassSpeed]) -> usize {
        if self.one_device_alone(speeds).is_some() {
            1
        } else {
            self.thresholds.static_chunks_per_worker
        }
    }

    /// The part of each class's region its static chunks take: the
    /// thresholds', but all of it for a single GPU's streams whose dynamic
    /// tail would be chunks shorter than its latency floor
    /// (`latency_chunks·a·b` items, [`LATENCY_CHUNKS`]): there each stream
    /// takes one chunk, and its fixed cost is paid once a run, not again
    /// for the tail by every stream at once.
    pub fn static_fraction(&self, speeds: &[ClassSpeed]) -> f64 {
        if self.no_tail(speeds) {
            1.0
        } else {
            self.thresholds.static_fraction
        }
    }

    /// Whether `speeds` leaves a single GPU's streams, with a model, whose
    /// dynamic tail would be chunks under its latency floor.
    fn no_tail(&self, speeds: &[ClassSpeed]) -> bool {
        let Some(s) = self.one_device_alone(speeds) else {
            return false;
        };
        let tail = self.items as f64 * (1.0 - self.thresholds.static_fraction) / s.workers as f64;
        s.latency_floor().is_some_and(|floor| tail < floor)
    }

    /// Divides each class's speed in `speeds` by its pace in co-executed
    /// runs of this size ([`RunHistory::pace`](crate::profiler::RunHistory::pace)):
    /// a class that has ended such runs after the others is planned
    /// fewer items. The paces, per class (1 where none is learned).
    fn pace(&self, speeds: &mut [ClassSpeed]) -> Vec<f64> {
        speeds
            .iter_mut()
            .zip(self.classes)
            .map(|(s, c)| {
                let pace = self.history.pace_for(&c.profile_key, self.items);
                s.b = s.b.map(|b| b / pace);
                pace
            })
            .collect()
    }

    /// The forecast of a run given `shares` over `speeds`: the plan's
    /// makespan for the classes given items, with their configuration's
    /// residual; `None` unless every class given items has a model.
    pub fn forecast(&self, speeds: &[ClassSpeed], shares: &[f64]) -> Option<Forecast> {
        let used: Vec<usize> = (0..shares.len()).filter(|&c| shares[c] > 0.0).collect();
        if used.is_empty() || used.iter().any(|&c| speeds[c].b.is_none()) {
            return None;
        }
        let only: Vec<ClassSpeed> = speeds
            .iter()
            .enumerate()
            .map(|(c, s)| ClassSpeed {
                eligible: s.eligible && used.contains(&c),
                ..*s
            })
            .collect();
        let (_, plan_s) = self.plan(&only);
        let config = self.config(&used);
        Some(Forecast {
            predicted_s: plan_s * (1.0 + self.history.residual(&config)),
            classes: used.len(),
            config,
            plan_s,
            single: None,
            coexec_s: None,
        })
    }

    /// The configuration key of the classes `used`: their profile keys
    /// joined by `+`.
    pub fn config(&self, used: &[usize]) -> String {
        used.iter()
            .map(|&c| self.classes[c].profile_key.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Speeds with eligibility narrowed by `keep`.
    pub fn only(&self, keep: impl Fn(&ClassInfo) -> bool) -> Vec<ClassSpeed> {
        self.speeds
            .iter()
            .zip(self.classes)
            .map(|(s, c)| ClassSpeed {
                eligible: s.eligible && keep(c),
                ..*s
            })
            .collect()
    }
}

/// A scheduling policy.
pub trait Policy: Send + Sync {
    /// Name, as given to `--policy`.
    fn name(&self) -> &'static str;
    /// One line for `coexec policies`.
    fn describe(&self) -> &'static str;
    /// The plan for a job.
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission;
}

/// Every policy, in the order `coexec policies` lists them.
pub static POLICIES: &[&dyn Policy] = &[
    &hybrid::Hybrid,
    &cpu_only::CpuOnly,
    &accel_only::AccelOnly,
    &static_split::Static,
    &dynamic::Dynamic,
    &static_dynamic::StaticDynamic,
    &guided::Guided,
    &eft::Eft,
];

/// The policy called `name`.
///
/// ```
/// let p = coexec_actors::policy::by_name("hybrid").unwrap();
/// assert_eq!(p.name(), "hybrid");
/// assert!(coexec_actors::policy::by_name("fastest").is_err());
/// ```
pub fn by_name(name: &str) -> Result<Arc<dyn Policy>, ActorError> {
    POLICIES
        .iter()
        .find(|p| p.name() == name)
        .map(|p| Arc::new(PolicyRef(*p)) as Arc<dyn Policy>)
        .ok_or_else(|| ActorError::UnknownPolicy(name.to_string()))
}

struct PolicyRef(&'static dyn Policy);

impl Policy for PolicyRef {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn describe(&self) -> &'static str {
        self.0.describe()
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        self.0.admit(ctx)
    }
}

/// Equal fixed chunks for `ctx`: about `per_worker` chunks per worker.
fn equal_chunk(ctx: &PlanContext<'_>, per_worker: usize) -> usize {
    let workers: usize = ctx
        .speeds
        .iter()
        .filter(|s| s.eligible)
        .map(|s| s.workers)
        .sum();
    (ctx.items / (workers.max(1) * per_worker))
        .max(ctx.grain)
        .max(1)
}

/// The seed's hybrid among the classes `keep` admits: used by `hybrid`
/// itself and, narrowed to one kind of device, by `cpu-only` and
/// `accel-only`.
fn hybrid_among(ctx: &PlanContext<'_>, keep: impl Fn(&ClassInfo) -> bool) -> Admission {
    let mut speeds = ctx.only(keep);
    let active = speeds
        .iter()
        .filter(|s| s.eligible && s.workers > 0)
        .count();
    let pace = if active > 1 {
        ctx.pace(&mut speeds)
    } else {
        Vec::new()
    };
    let narrowed = PlanContext {
        speeds: &speeds,
        ..ctx.clone()
    };
    let probe = if active < 2 {
        Probe::None
    } else if narrowed.all_known() {
        Probe::Warm
    } else {
        Probe::Cold
    };
    let shares = if narrowed.all_known() {
        narrowed.model_shares()
    } else {
        // Unknown speeds: regions by worker count until the probe re-plans.
        let w: f64 = speeds
            .iter()
            .filter(|s| s.eligible)
            .map(|s| s.workers as f64)
            .sum();
        speeds
            .iter()
            .map(|s| {
                if s.eligible {
                    s.workers as f64 / w
                } else {
                    0.0
                }
            })
            .collect()
    };
    // The forecast is the paced plan's (its configuration's residual
    // learns its error).
    let forecast = narrowed.forecast(&speeds, &shares);
    Admission {
        shares,
        pool: false,
        probe,
        static_fraction: ctx.static_fraction(&speeds),
        static_chunks_per_worker: ctx.static_chunks_per_worker(&speeds),
        chunking: Chunking::TimeGuided,
        steal: Steal::Always,
        guard: true,
        forecast,
        remeasure: true,
        standby: false,
        keep_static: false,
        pace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DeviceKind, End};

    /// A CPU of four cores, a GPU of two streams and a simulated unit, each
    /// with a model.
    fn three_classes() -> (Vec<ClassInfo>, Vec<ClassSpeed>) {
        let class =
            |index: usize, kind: DeviceKind, workers: usize, fill_threads: usize| ClassInfo {
                index,
                name: format!("c{index}"),
                profile_key: format!("c{index}"),
                kind,
                workers,
                end: if index == 0 { End::Head } else { End::Tail },
                model: String::new(),
                fill_threads,
            };
        let sim = DeviceKind::Sim {
            speed: 10.0,
            latency: std::time::Duration::ZERO,
        };
        let classes = vec![
            class(0, DeviceKind::Cpu, 4, 0),
            class(1, DeviceKind::Cuda { id: 0 }, 2, 135_168),
            class(2, sim, 1, 0),
        ];
        let speeds = classes
            .iter()
            .map(|c| ClassSpeed {
                workers: c.workers,
                a: 1e-4,
                b: Some(1e8),
                eligible: true,
                min_items: 1,
                start: 0.0,
                latency_chunks: LATENCY_CHUNKS,
            })
            .collect();
        (classes, speeds)
    }

    #[test]
    fn a_gpu_s_streams_alone_take_one_static_chunk_each() {
        let (classes, speeds) = three_classes();
        let history = RunHistory::default();
        let ctx = PlanContext {
            items: 1_000_000,
            grain: 1,
            classes: &classes,
            speeds: &speeds,
            thresholds: Thresholds::default(),
            history: &history,
        };
        let per = |keep: &dyn Fn(&ClassInfo) -> bool| {
            let a = hybrid_among(&ctx, keep);
            assert_eq!(
                a.static_chunks_per_worker,
                ctx.static_chunks_per_worker(&ctx.only(keep)),
                "the plan counts the chunks the run takes"
            );
            a.static_chunks_per_worker
        };
        let default = Thresholds::default().static_chunks_per_worker;
        assert!(default > 1);
        assert_eq!(per(&|c| c.index == 1), 1, "the GPU alone");
        assert_eq!(per(&|c| c.index == 0), default, "the CPU alone");
        assert_eq!(per(&|c| c.index == 2), default, "a simulated unit alone");
        assert_eq!(per(&|c| c.index < 2), default, "CPU and GPU");
    }

    /// A GPU's streams alone take the whole job in their static chunks
    /// where its dynamic tail would be chunks under the latency floor
    /// (here 19 × 1e-4 s × 1e8 items/s = 190 000 items a stream), and the
    /// plan then counts one fixed cost a stream; a longer job, a GPU with
    /// no model, and every other class keep the thresholds' fraction.
    #[test]
    fn a_gpu_alone_drops_a_tail_under_its_floor_and_the_plan_counts_it() {
        let (classes, mut speeds) = three_classes();
        let history = RunHistory::default();
        let f = Thresholds::default().static_fraction;
        let judge = |items: usize, speeds: &'_ [ClassSpeed]| -> (f64, Vec<f64>) {
            let ctx = PlanContext {
                items,
                grain: 1,
                classes: &classes,
                speeds,
                thresholds: Thresholds::default(),
                history: &history,
            };
            let gpu = ctx.only(|c| c.index == 1);
            let (_, t) = ctx.plan(&gpu);
            let one = plan_shares(items, &gpu, 1.0).1;
            let fractions = [0, 1, 2]
                .map(|k| ctx.static_fraction(&ctx.only(|c| c.index == k)))
                .into();
            let both = ctx.static_fraction(&ctx.only(|c| c.index < 2));
            assert_eq!(both, f, "CPU and GPU keep the tail");
            (if t == one { 1.0 } else { 2.0 }, fractions)
        };
        // 1 000 000 items: a tail of 100 000 a stream.
        assert_eq!(judge(1_000_000, &speeds), (1.0, vec![f, 1.0, f]));
        // 10 000 000 items: a tail of 1 000 000 a stream.
        assert_eq!(judge(10_000_000, &speeds), (2.0, vec![f, f, f]));
        speeds[1].b = None;
        assert_eq!(judge(1_000_000, &speeds).1, vec![f, f, f], "no model");
    }

    /// A class whose co-executed runs of this size ended after the others
    /// is planned as slower by its pace, and only where classes co-execute:
    /// the CPU alone keeps its speed.
    #[test]
    fn a_late_class_is_planned_fewer_items_by_its_pace() {
        let (classes, speeds) = three_classes();
        let items = 1_000_000;
        let plan = |history: &RunHistory, keep: &dyn Fn(&ClassInfo) -> bool| {
            let ctx = PlanContext {
                items,
                grain: 1,
                classes: &classes,
                speeds: &speeds,
                thresholds: Thresholds::default(),
                history,
            };
            let a = hybrid_among(&ctx, keep);
            (a.shares, a.forecast.map(|f| f.plan_s).unwrap_or_default())
        };
        let both = |c: &ClassInfo| c.index < 2;
        let mut h = RunHistory::default();
        let (before, _) = plan(&h, &both);
        let (_, alone) = plan(&h, &|c| c.index == 0);
        let pace = |factor| crate::profiler::Pace { items, factor };
        h.pace.insert("c0".into(), pace(1.25));
        h.pace.insert("c1".into(), pace(0.8));
        let (after, _) = plan(&h, &both);
        assert!(after[0] < 0.9 * before[0], "{before:?} → {after:?}");
        assert!((after[0] + after[1] - 1.0).abs() < 1e-9);
        assert_eq!(plan(&h, &|c| c.index == 0).1, alone, "a class alone");
    }

    #[test]
    fn names_are_unique_and_described() {
        let mut names: Vec<_> = POLICIES.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), 8);
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 8);
        assert!(
            POLICIES
                .iter()
                .all(|p| !p.describe().is_empty() && !p.describe().contains('\n'))
        );
    }
}
