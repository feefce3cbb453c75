//! A job's state at admission: regions, targets and models per class.

use super::*;

impl JobCore {
    /// A job over `kernel`, planned by `adm`. `models[c]` is the stored model
    /// of class `c` for this kernel; `eligible[c]` whether it can run it;
    /// `in_service[c]` its workers; `worker_class[w]` the class of worker `w`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kernel: Arc<dyn Kernel>,
        policy: &str,
        adm: Admission,
        th: Thresholds,
        classes: Arc<[ClassInfo]>,
        models: Vec<SpeedModel>,
        stored_split: Vec<f64>,
        eligible: Vec<bool>,
        in_service: Vec<usize>,
        worker_class: Arc<[usize]>,
        trace: bool,
    ) -> Self {
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
        let mut st: Vec<ClassState> = (0..k)
            .map(|c| ClassState {
                eligible: eligible[c] && adm.shares[c] > 0.0,
                workers: in_service[c],
                model: models[c].clone(),
                ..Default::default()
            })
            .collect();
        let total_workers: usize = st.iter().filter(|s| s.eligible).map(|s| s.workers).sum();
        let min_chunk: Vec<usize> = classes.iter().map(|c| c.min_chunk(&*kernel)).collect();
        for (c, s) in st.iter_mut().enumerate() {
            let region = if adm.pool { items } else { space.left(c) };
            let w = s.workers.max(1);
            match adm.probe {
                Probe::Warm => {
                    s.probe_target = (region as f64 * th.warm_probe) as usize;
                    let chunk = s.probe_target.div_ceil(w).max(min_chunk[c]).min(region);
                    s.probe_predicted = s.model.predict(chunk.max(1) as f64);
                }
                Probe::Cold => {
                    // A GPU's probe fills it at least once: smaller chunks
                    // measure its launch latency, not its speed.
                    s.probe_target = ((items as f64 * th.cold_probe) as usize)
                        .max(min_chunk[c])
                        .min(region);
                    // Start small and double: bounded in time even on a very
                    // slow device.
                    s.probe_ramp = (items / (COLD_FIRST * total_workers.max(1)))
                        .max(grain)
                        .min(s.probe_target / w)
                        .max(min_chunk[c])
                        .max(1);
                }
                Probe::None => {}
            }
            s.static_target = (region as f64 * adm.static_fraction) as usize;
        }
        let probing = adm.probe != Probe::None;
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
            kernel: (!finished).then(|| kernel.clone()),
            claims: (!finished).then(ClaimSpace::new),
            name: kernel.name().to_string(),
            policy: policy.to_string(),
            items,
            grain,
            adm,
            th,
            classes,
            st,
            home,
            order,
            space,
            probing,
            probe_report: None,
            planned,
            retries: VecDeque::new(),
            retried: 0,
            in_flight: 0,
            done: 0,
            busy_until: vec![0.0; worker_class.len()],
            running: vec![false; worker_class.len()],
            worker_class,
            finished,
            failed,
            trace: trace.then(Vec::new),
            stored_split,
            scratch: Vec::new(),
            min_chunk,
            watch: overdue::Watch::default(),
        }
    }
}
