//! A job's state at admission: what the broker decided ([`Admitted`]),
//! and the regions, targets and models per class it starts from.

use super::*;

/// What the broker decided when it admitted a job: the policy's plan and
/// what the job needs to know of each class to carry it out.
pub(crate) struct Admitted {
    /// Name of the policy that planned the job.
    pub(crate) policy: String,
    /// The plan: split, probe, chunking, guard and stealing.
    pub(crate) plan: Admission,
    pub(crate) thresholds: Thresholds,
    /// Per class, the stored speed model for this kernel.
    pub(crate) models: Vec<SpeedModel>,
    /// The split stored for this kernel (NaN where none is).
    pub(crate) stored_split: Vec<f64>,
    /// Whether the job may run on every class that can run its kernel, so
    /// that its static phase can learn a split (one kept off a class by
    /// [`JobOptions::classes`](crate::JobOptions::classes) says nothing of
    /// that class's speed).
    pub(crate) learns_split: bool,
    /// Per class, whether it can (and may) run the kernel.
    pub(crate) eligible: Vec<bool>,
    /// Per class, its workers in service.
    pub(crate) in_service: Vec<usize>,
    /// Per class, whether the plan left it out and the broker gave it a
    /// small region only to measure it again.
    pub(crate) remeasured: Vec<bool>,
    /// Whether to keep a record of every chunk.
    pub(crate) trace: bool,
}

impl JobCore {
    /// A job over `kernel`, carried out as `admitted` says, on the device
    /// classes `classes`; `worker_class[w]` is the class of worker `w`.
    pub(crate) fn new(
        kernel: Arc<dyn Kernel>,
        admitted: Admitted,
        classes: Arc<[ClassInfo]>,
        worker_class: Arc<[usize]>,
    ) -> Self {
        let Admitted {
            policy,
            plan: adm,
            thresholds: th,
            models,
            stored_split,
            learns_split,
            eligible,
            in_service,
            remeasured,
            trace,
        } = admitted;
        let items = kernel.items();
        let grain = kernel.grain().max(1);
        let k = classes.len();
        // Head-eaters first, so a CPU region touches the accelerator regions.
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&c| (classes[c].end == End::Tail, c));
        let (home, space) = if adm.pool {
            let mut shares = vec![0.0; k];
            shares[order[0]] = 1.0;
            (vec![order[0]; k], Space::new(items, grain, &shares, &order))
        } else {
            (
                (0..k).collect(),
                Space::new(items, grain, &adm.shares, &order),
            )
        };
        let min_chunk: Vec<usize> = classes.iter().map(|c| c.min_chunk(&*kernel)).collect();
        let mut st: Vec<ClassState> = models
            .into_iter()
            .enumerate()
            .map(|(c, model)| ClassState {
                eligible: eligible[c] && adm.shares[c] > 0.0,
                workers: in_service[c],
                standby: adm.standby && eligible[c] && adm.shares[c] <= 0.0 && in_service[c] > 0,
                remeasured: remeasured.get(c).copied().unwrap_or(false),
                pace: adm
                    .pace
                    .get(c)
                    .copied()
                    .filter(|p| p.is_finite() && *p > 0.0)
                    .unwrap_or(1.0),
                fill: state::Fill {
                    min_chunk: min_chunk[c],
                    least: guard::least_work(&model, min_chunk[c], grain),
                    tried_small: false,
                },
                speed: Speed::new(model),
                ..Default::default()
            })
            .collect();
        let total_workers: usize = st.iter().filter(|s| s.eligible).map(|s| s.workers).sum();
        let mut probe = vec![ProbeState::default(); k];
        for ((c, s), p) in st.iter_mut().enumerate().zip(&mut probe) {
            let region = if adm.pool { items } else { space.left(c) };
            let w = s.workers.max(1);
            let reg = &mut s.region;
            match adm.probe {
                Probe::Warm => {
                    reg.probe_target = (region as f64 * th.warm_probe) as usize;
                    let chunk = reg.probe_target.div_ceil(w).max(min_chunk[c]).min(region);
                    p.predicted = s.speed.model.predict(chunk.max(1) as f64);
                }
                Probe::Cold => {
                    // A GPU's probe fills it at least once: smaller chunks
                    // measure its launch latency, not its speed.
                    reg.probe_target = ((items as f64 * th.cold_probe) as usize)
                        .max(min_chunk[c])
                        .min(region);
                    // Start small and double: bounded in time even on a very
                    // slow device.
                    p.ramp = (items / (COLD_FIRST * total_workers.max(1)))
                        .max(grain)
                        .min(reg.probe_target / w)
                        .max(min_chunk[c])
                        .max(1);
                }
                Probe::None => {}
            }
            reg.static_target = (region as f64 * adm.static_fraction) as usize;
            reg.size = if adm.pool { 0 } else { region };
        }
        let under_way = (adm.probe != Probe::None).then_some(probe);
        let planned = adm.shares.clone();
        let failed = (items > 0 && total_workers == 0).then(|| ActorError::NoDevice {
            kernel: kernel.name().to_string(),
            why: format!("policy `{policy}` leaves no device class that can run it"),
        });
        // A job over by admission (no items, or no device) holds no handle:
        // its submitter is answered at once and must get the kernel back
        // unshared.
        let finished = items == 0 || failed.is_some();
        Self {
            life: Lifecycle {
                kernel: (!finished).then(|| kernel.clone()),
                claims: (!finished).then(ClaimSpace::new),
                name: kernel.name().to_string(),
                failed,
                finished,
            },
            plan: Plan {
                policy,
                adm,
                th,
                planned,
                stored_split,
                learns_split,
            },
            classes,
            st,
            worker: vec![WorkerState::default(); worker_class.len()],
            worker_class,
            progress: Progress {
                items,
                grain,
                space,
                home,
                order,
                done: 0,
                in_flight: 0,
            },
            retries: Retries::default(),
            probe: Probing {
                under_way,
                report: None,
            },
            trace: Trace::new(trace),
            watch: overdue::Watch::default(),
            scratch: Vec::new(),
        }
    }
}
