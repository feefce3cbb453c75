//! Benches and sweeps on the modelled machine: each class alone and every
//! policy co-executed, medians over seeds, and the bound on E a scheduler
//! could reach knowing each run's slowdown.

use super::*;

/// What carries from one run to the next: the profiler's store, the
/// broker's count of admissions, the noise.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) store: ProfileStore,
    pub(crate) seen: u64,
    pub(crate) rng: Rng,
    pub(crate) thresholds: Thresholds,
    pub(crate) default_policy: Arc<dyn Policy>,
    pub(crate) trace: bool,
}

impl Series {
    /// A fresh profile for kernel `name`, noise from `seed`.
    pub(crate) fn new(name: &str, seed: u64) -> Self {
        Self {
            name: name.to_string(),
            store: ProfileStore::in_memory(Fingerprint::this_machine(vec!["virtual GPU".into()])),
            seen: 0,
            rng: Rng::new(seed),
            thresholds: Thresholds::default(),
            default_policy: by_name("hybrid").expect("hybrid exists"),
            trace: false,
        }
    }
}

/// What `coexec bench` reports for one workload, modelled.
#[derive(Debug, Clone)]
pub(crate) struct BenchResult {
    /// Each class alone: median T, and whether it was predicted rather
    /// than run (the bench does not run a class 20x slower than the best).
    pub(crate) alone: Vec<(f64, bool)>,
    /// Per policy, its median T.
    pub(crate) policies: BTreeMap<String, f64>,
}

impl BenchResult {
    /// T* = 1 / Σ 1/T_i.
    pub(crate) fn ideal(&self) -> f64 {
        1.0 / self.alone.iter().map(|a| 1.0 / a.0).sum::<f64>()
    }

    /// E of `policy`: T* over its T.
    pub(crate) fn e(&self, policy: &str) -> f64 {
        self.ideal() / self.policies[policy]
    }
}

pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// `coexec bench`'s protocol on one profile: a co-executed warm-up, each
/// class alone once (unless predicted 20x slower than the fastest), then
/// `rounds` rounds of every class alone and every policy, interleaved;
/// medians of the job times.
pub(crate) fn bench(
    m: &Machine,
    w: &Workload,
    policies: &[&str],
    rounds: usize,
    seed: u64,
    thresholds: Thresholds,
) -> BenchResult {
    const SLOW_FACTOR: f64 = 20.0;
    let (items, runs) = (w.items, w.runs);
    let mut s = Series::new(&w.name, seed);
    s.thresholds = thresholds;
    let hybrid = by_name("hybrid").expect("hybrid exists");
    let (_, warm) = m.job(
        &mut s,
        &JobOptions::new().policy(hybrid.clone()),
        items,
        runs,
    );
    let predicted: Vec<f64> = (0..m.classes().len())
        .map(|c| {
            warm.iter()
                .map(|r| {
                    let k = &r.classes[c];
                    r.items as f64 / (k.model_b_items_per_s * k.workers.max(1) as f64)
                })
                .sum()
        })
        .collect();
    let fastest = predicted
        .iter()
        .cloned()
        .filter(|x| x.is_finite())
        .fold(f64::INFINITY, f64::min);
    let measured: Vec<usize> = (0..m.classes().len())
        .filter(|&c| !(predicted[c].is_finite() && predicted[c] > SLOW_FACTOR * fastest))
        .collect();
    let mut configs: Vec<JobOptions> = measured
        .iter()
        .map(|&c| JobOptions::new().policy(hybrid.clone()).classes([c]))
        .collect();
    for p in policies {
        configs.push(JobOptions::new().policy(by_name(p).expect("a known policy")));
    }
    for opts in &configs[..measured.len()] {
        m.job(&mut s, opts, items, runs);
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (k, opts) in configs.iter().enumerate() {
            times[k].push(m.job(&mut s, opts, items, runs).0);
        }
    }
    let alone = (0..m.classes().len())
        .map(|c| match measured.iter().position(|&x| x == c) {
            Some(k) => (median(&mut times[k]), false),
            None => (predicted[c], true),
        })
        .collect();
    let policies = policies
        .iter()
        .zip(&mut times[measured.len()..])
        .map(|(p, t)| (p.to_string(), median(t)))
        .collect();
    BenchResult { alone, policies }
}

/// One job length of a sweep: the job's size and, modelled, each class
/// alone, `hybrid`, T*, E and hybrid over the best class alone.
#[derive(Debug, Clone)]
pub(crate) struct SweepPoint {
    /// The best class's time for one run alone (the length asked for).
    pub(crate) run_s: f64,
    pub(crate) items: usize,
    pub(crate) alone: [f64; 2],
    pub(crate) hybrid: f64,
}

impl SweepPoint {
    pub(crate) fn ideal(&self) -> f64 {
        1.0 / (1.0 / self.alone[0] + 1.0 / self.alone[1])
    }
    pub(crate) fn e(&self) -> f64 {
        self.ideal() / self.hybrid
    }
    pub(crate) fn vs_best(&self) -> f64 {
        self.hybrid / self.alone[0].min(self.alone[1])
    }
}

/// `w`'s job at runs of about `run_s` seconds on its best class alone (its
/// items scaled; the run count kept): a warm-up, then `rounds` rounds of
/// each class alone and `hybrid`, interleaved on one profile; medians.
pub(crate) fn sweep_point(
    m: &Machine,
    w: &Workload,
    run_s: f64,
    rounds: usize,
    seed: u64,
    thresholds: Thresholds,
) -> SweepPoint {
    let best_run = w.measured.t_cpu_s.min(w.measured.t_gpu_s) / w.runs as f64;
    let items = ((w.items as f64 * run_s / best_run).round() as usize).max(1);
    let mut s = Series::new(&w.name, seed);
    s.thresholds = thresholds;
    let hybrid = by_name("hybrid").expect("hybrid exists");
    let configs = [
        JobOptions::new().policy(hybrid.clone()).classes([CPU]),
        JobOptions::new().policy(hybrid.clone()).classes([GPU]),
        JobOptions::new().policy(hybrid),
    ];
    for opts in &configs {
        m.job(&mut s, opts, items, w.runs);
    }
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for _ in 0..rounds {
        for (k, opts) in configs.iter().enumerate() {
            t[k].push(m.job(&mut s, opts, items, w.runs).0);
        }
    }
    let runs = w.runs as f64;
    SweepPoint {
        run_s,
        items,
        alone: [median(&mut t[0]) / runs, median(&mut t[1]) / runs],
        hybrid: median(&mut t[2]) / runs,
    }
}

impl Machine {
    /// An upper bound on E for `items` items per run on this machine: the
    /// best a scheduler could do knowing each run's co-execution slowdown in
    /// advance — per run, the least of either class alone and the split that
    /// ends both together (one chunk per GPU stream, its setup and fixed
    /// cost once; the CPU's chunks free of fixed cost) — averaged over the
    /// slowdowns the lease showed, against T* of the same noise-free model.
    pub(crate) fn e_bound(&self, items: usize) -> f64 {
        let n = items as f64;
        let cpu_rate = self.cpu.workers as f64 * self.cpu.b_per_worker;
        let t_cpu = |k: f64| self.cpu.start_s + k / cpu_rate;
        let floor = self.gpu.min_work_items as f64;
        let t_gpu = |k: f64, s: f64| {
            (self.gpu.stage_s + self.gpu.a_s + k.max(floor) / self.gpu.device_items_per_s) * s
        };
        let alone = [t_cpu(n), t_gpu(n, 1.0)];
        let best_alone = alone[0].min(alone[1]);
        let slowdowns = if self.gpu.coexec_slowdown.is_empty() {
            vec![1.0]
        } else {
            self.gpu.coexec_slowdown.clone()
        };
        let mean: f64 = slowdowns
            .iter()
            .map(|&s| {
                // The GPU's share k where both end together (t_gpu(k) rises
                // with k, t_cpu(n - k) falls).
                let (mut lo, mut hi) = (0.0, n);
                for _ in 0..100 {
                    let k = 0.5 * (lo + hi);
                    if t_gpu(k, s) < t_cpu(n - k) {
                        lo = k;
                    } else {
                        hi = k;
                    }
                }
                best_alone.min(t_gpu(hi, s).max(t_cpu(n - hi)))
            })
            .sum::<f64>()
            / slowdowns.len() as f64;
        let ideal = 1.0 / (1.0 / alone[0] + 1.0 / alone[1]);
        ideal / mean
    }
}

/// The job lengths of a sweep: 13 from 0.1 ms to 1 s, three per decade.
pub(crate) fn lengths() -> Vec<f64> {
    (0..13).map(|i| 1e-4 * 10f64.powf(i as f64 / 3.0)).collect()
}
