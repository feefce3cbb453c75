//! The engine driven by a discrete-event simulation in virtual time: worker
//! `w` of class `c` takes `a_c + n / b_c` seconds for `n` items.

use std::sync::Arc;

use coexec_kernels::{Chunk, Empty, KernelError};
use proptest::prelude::*;

use super::guard::finish_time;
use super::*;
use crate::device::{DeviceKind, End};
use crate::policy::{ClassSpeed, LATENCY_CHUNKS, PlanContext, by_name};

fn classes(spec: &[(usize, bool)]) -> Arc<[ClassInfo]> {
    spec.iter()
        .enumerate()
        .map(|(i, &(workers, accel))| ClassInfo {
            index: i,
            name: if accel {
                format!("acc{i}")
            } else {
                "cpu".into()
            },
            profile_key: format!("k{i}"),
            kind: if accel {
                DeviceKind::Cuda { id: i }
            } else {
                DeviceKind::Cpu
            },
            workers,
            end: if accel { End::Tail } else { End::Head },
            model: String::new(),
            fill_threads: 0,
        })
        .collect()
}

struct Sim {
    /// (workers, a, b, accelerator?) per class.
    spec: Vec<(usize, f64, f64, bool)>,
    /// Whether the stored profile knows each class.
    known: bool,
    /// Whether, where the profile knows the classes, each accelerator's
    /// run alone on this job is in it too (a kernel past its first warm
    /// run: `hybrid` ran it there).
    alone_measured: bool,
    /// The one class the job may run on (`None`: any).
    only: Option<usize>,
    /// Fail every chunk whose attempt is 0 and whose first item is divisible by this.
    fail_every: Option<usize>,
    /// The stored speed of each class as a multiple of its true one (a
    /// profile from a different moment of a noisy machine); `None`: exact.
    misjudged: Option<Vec<f64>>,
    /// Chunks on this class fail: every one (a lost device), or only the
    /// first one it runs after a quarter of the ideal time (one passing
    /// error on a large chunk).
    broken: Option<(usize, Broken)>,
    /// GPU threads that fill each class's device (0: not a GPU). A chunk
    /// of fewer items than that takes as long as one of that many.
    fill: Vec<usize>,
}

#[derive(Clone, Copy, PartialEq)]
enum Broken {
    Always,
    Once,
}

struct Outcome {
    makespan: f64,
    report: RunReport,
    counts: Vec<u32>,
}

impl Sim {
    fn new(spec: Vec<(usize, f64, f64, bool)>) -> Self {
        Self {
            spec,
            known: false,
            alone_measured: true,
            only: None,
            fail_every: None,
            misjudged: None,
            broken: None,
            fill: Vec::new(),
        }
    }
    fn fill(mut self, class: usize, threads: usize) -> Self {
        self.fill.resize(self.spec.len(), 0);
        self.fill[class] = threads;
        self
    }
    fn fill_of(&self, c: usize) -> usize {
        self.fill.get(c).copied().unwrap_or(0)
    }
    fn known(mut self, known: bool) -> Self {
        self.known = known;
        self
    }
    fn never_alone(mut self) -> Self {
        self.alone_measured = false;
        self
    }
    /// The profile's run history: with the models known, a warm
    /// co-executed run, and each accelerator's run alone on `items` as this
    /// simulation runs it, unless [`Sim::never_alone`].
    fn history(&self, items: usize, grain: usize) -> crate::profiler::RunHistory {
        let mut h = crate::profiler::RunHistory::default();
        if !self.known || self.only.is_some() {
            return h;
        }
        // A warm co-executed run was learned from.
        let all: Vec<String> = (0..self.spec.len()).map(|c| format!("k{c}")).collect();
        h.residuals.insert(all.join("+"), 0.0);
        if !self.alone_measured {
            return h;
        }
        for c in (0..self.spec.len()).filter(|&c| self.spec[c].3) {
            let alone = Sim {
                only: Some(c),
                misjudged: self.misjudged.clone(),
                fill: self.fill.clone(),
                ..Sim::new(self.spec.clone()).known(true)
            };
            if let Ok(out) = alone.run("hybrid", items, grain) {
                let secs = out.makespan;
                h.alone.insert(
                    format!("k{c}"),
                    crate::profiler::RunTime {
                        items,
                        secs,
                        runs: 1,
                    },
                );
            }
        }
        h
    }
    fn failing(mut self, every: Option<usize>) -> Self {
        self.fail_every = every;
        self
    }
    fn misjudged(mut self, scale: Vec<f64>) -> Self {
        self.misjudged = Some(scale);
        self
    }
    fn broken(mut self, class: usize, how: Broken) -> Self {
        self.broken = Some((class, how));
        self
    }

    fn run(&self, policy: &str, items: usize, grain: usize) -> Result<Outcome, ActorError> {
        let (mut job, worker_class) = self.job(policy, items, grain)?;
        self.drive(&mut job, &worker_class, items)
    }

    /// The job as admitted, and the class of each worker.
    fn job(
        &self,
        policy: &str,
        items: usize,
        grain: usize,
    ) -> Result<(JobCore, Arc<[usize]>), ActorError> {
        let cls = classes(&self.spec.iter().map(|s| (s.0, s.3)).collect::<Vec<_>>());
        let cls: Arc<[ClassInfo]> = cls
            .iter()
            .cloned()
            .map(|mut k| {
                k.fill_threads = self.fill_of(k.index);
                k
            })
            .collect();
        let worker_class: Arc<[usize]> = self
            .spec
            .iter()
            .enumerate()
            .flat_map(|(c, s)| std::iter::repeat_n(c, s.0))
            .collect();
        let models: Vec<SpeedModel> = self
            .spec
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if self.known {
                    let scale = self.misjudged.as_ref().map_or(1.0, |m| m[c]);
                    SpeedModel::with_params(s.1, s.2 * scale)
                } else {
                    SpeedModel::default()
                }
            })
            .collect();
        let speeds: Vec<ClassSpeed> = self
            .spec
            .iter()
            .zip(&models)
            .enumerate()
            .map(|(c, (s, m))| ClassSpeed {
                workers: s.0,
                a: m.a(),
                b: m.is_known().then(|| m.b()),
                eligible: self.only.is_none_or(|o| o == c),
                min_items: grain,
                start: 0.0,
                latency_chunks: LATENCY_CHUNKS,
            })
            .collect();
        let th = Thresholds::default();
        let history = self.history(items, grain);
        let ctx = PlanContext {
            items,
            grain,
            classes: &cls,
            speeds: &speeds,
            thresholds: th,
            history: &history,
        };
        let p = by_name(policy)?;
        let adm = p.admit(&ctx);
        let kernel: Arc<dyn coexec_kernels::Kernel> = Arc::new(Grained(Empty::new(items), grain));
        let admitted = Admitted {
            policy: policy.to_string(),
            plan: adm,
            thresholds: th,
            models,
            stored_split: vec![f64::NAN; cls.len()],
            learns_split: true,
            eligible: (0..cls.len())
                .map(|c| self.only.is_none_or(|o| o == c))
                .collect(),
            in_service: self.spec.iter().map(|s| s.0).collect(),
            remeasured: Vec::new(),
            trace: true,
        };
        let job = JobCore::new(kernel, admitted, cls.clone(), worker_class.clone());
        Ok((job, worker_class))
    }

    /// Runs `job` to its end in virtual time.
    fn drive(
        &self,
        job: &mut JobCore,
        worker_class: &[usize],
        items: usize,
    ) -> Result<Outcome, ActorError> {
        let nw = worker_class.len();
        let mut counts = vec![0u32; items];
        let mut running: Vec<Option<(f64, f64, Claimed)>> = vec![None; nw];
        let mut now = 0.0;
        let mut guard = 0;
        let mut transient = None;
        while !job.is_over() {
            guard += 1;
            assert!(guard < 10_000_000, "simulation does not end");
            for w in 0..nw {
                if running[w].is_none() {
                    let c = worker_class[w];
                    if let Some(ch) = job.claim(w, c, now) {
                        let (_, a, b, _) = self.spec[c];
                        let n = ch.info.range.len().max(self.fill_of(c));
                        let t = now + a + n as f64 / b;
                        running[w] = Some((now, t, ch));
                    }
                }
            }
            // Next completion.
            let Some(w) = (0..nw).filter(|&w| running[w].is_some()).min_by(|&x, &y| {
                running[x]
                    .as_ref()
                    .unwrap()
                    .1
                    .total_cmp(&running[y].as_ref().unwrap().1)
            }) else {
                panic!("no worker running and the job is not over: deadlock at t={now}");
            };
            let (start, end, ch) = running[w].take().unwrap();
            now = end;
            let c = worker_class[w];
            let fail = self
                .fail_every
                .is_some_and(|k| ch.info.attempt == 0 && ch.info.range.start % k == 0)
                || match self.broken {
                    Some((bc, Broken::Always)) => bc == c,
                    Some((bc, Broken::Once)) if bc == c && start >= self.ideal(items) / 4.0 => {
                        *transient.get_or_insert(ch.info.range.start) == ch.info.range.start
                            && ch.info.attempt == 0
                    }
                    _ => false,
                };
            if fail {
                job.fail(w, &ch.info, KernelError::Failed("test".into()));
            } else {
                // The kernel is `Empty`: running it would do nothing (and
                // only the worker loop mints chunks).
                for i in ch.info.range.clone() {
                    counts[i] += 1;
                }
                job.complete(w, c, &ch.info, start, end);
            }
        }
        let report = job.report()?;
        assert!((report.makespan_s - now).abs() < 1e-9);
        Ok(Outcome {
            makespan: now,
            report,
            counts,
        })
    }

    fn alone(&self, c: usize, items: usize) -> f64 {
        let (w, a, b, _) = self.spec[c];
        a + items as f64 / (w as f64 * b)
    }

    fn ideal(&self, items: usize) -> f64 {
        1.0 / (0..self.spec.len())
            .map(|c| 1.0 / self.alone(c, items))
            .sum::<f64>()
    }
}

struct Grained(Empty, usize);

impl coexec_kernels::Kernel for Grained {
    fn name(&self) -> &str {
        "grained"
    }
    fn items(&self) -> usize {
        self.0.items()
    }
    fn grain(&self) -> usize {
        self.1
    }
    fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
        self.0.run_cpu(c)
    }
}

#[test]
fn hybrid_balances_a_cold_start() {
    for speed in [0.5, 2.0, 10.0] {
        let sim = Sim::new(vec![(1, 0.0, 1e6, false), (1, 50e-6, speed * 1e6, true)]);
        let items = 1_000_000;
        let out = sim.run("hybrid", items, 1).unwrap();
        let e = sim.ideal(items) / out.makespan;
        assert!(
            e >= 0.95,
            "X={speed}: efficiency {e:.3}, {}",
            out.report.summary()
        );
        assert!(out.counts.iter().all(|&c| c == 1));
        let probe = out.report.probe.unwrap();
        assert!(probe.replanned);
    }
}

#[test]
fn warm_start_probe_is_balanced() {
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (2, 20e-6, 3e6, true)]).known(true);
    let out = sim.run("hybrid", 2_000_000, 1).unwrap();
    let probe = out.report.probe.clone().unwrap();
    assert!(probe.imbalance <= Thresholds::default().mu, "{probe:?}");
    assert!(!probe.replanned);
    let e = sim.ideal(2_000_000) / out.makespan;
    assert!(e >= 0.97, "efficiency {e:.3}: {}", out.report.summary());
}

/// Known models, but the accelerator never ran this kernel alone: the
/// first warm job runs on it alone (the CPU standing by), so that what
/// co-executing must beat is measured; once it has, the job co-executes.
#[test]
fn an_accelerator_never_run_alone_runs_alone_once() {
    let spec = vec![(2, 0.0, 1e6, false), (2, 20e-6, 3e6, true)];
    let first = Sim::new(spec.clone()).known(true).never_alone();
    let out = first.run("hybrid", 2_000_000, 1).unwrap();
    let ran: Vec<usize> = out.report.classes.iter().map(|c| c.items).collect();
    assert_eq!(ran, [0, 2_000_000], "{}", out.report.summary());
    let then = Sim::new(spec).known(true);
    let out = then.run("hybrid", 2_000_000, 1).unwrap();
    assert!(
        out.report.classes.iter().all(|c| c.items > 0),
        "{}",
        out.report.summary()
    );
}

#[test]
fn warm_start_from_a_misjudged_profile_still_balances() {
    // The stored CPU speed is off by a little less than μ, so the warm probe
    // does not replan: the static phase starts from a split that is wrong,
    // and the end must not hang on a large static chunk of the slow class.
    for speed in [0.5, 2.0, 10.0] {
        for scale in [0.92, 1.08] {
            let sim = Sim::new(vec![(1, 0.0, 1e6, false), (1, 50e-6, speed * 1e6, true)])
                .known(true)
                .misjudged(vec![scale, 1.0]);
            let out = sim.run("hybrid", 1_000_000, 1).unwrap();
            let e = sim.ideal(1_000_000) / out.makespan;
            assert!(
                e >= 0.98,
                "X={speed}, CPU stored at {scale}x: efficiency {e:.3}, {}",
                out.report.summary()
            );
        }
    }
}

#[test]
fn a_far_faster_accelerator_does_it_alone() {
    // The paper's N-body: the accelerator is 2500x faster than a CPU worker.
    let sim = Sim::new(vec![(1, 0.0, 1e4, false), (1, 20e-6, 2.5e7, true)]).known(true);
    let out = sim.run("hybrid", 1_000_000, 1).unwrap();
    assert!(
        out.makespan <= 1.01 * sim.alone(1, 1_000_000),
        "{}",
        out.report.summary()
    );
}

#[test]
fn static_never_crosses_its_split() {
    let sim = Sim::new(vec![(1, 0.0, 1e6, false), (1, 0.0, 1e6, true)]).known(true);
    let out = sim.run("static", 1000, 1).unwrap();
    assert_eq!(out.report.classes[0].items, 500);
    assert_eq!(out.report.classes[0].chunks, 1);
}

/// Where the static part is a whole region its chunks round up: 1001
/// items on four workers are four chunks, not four of 250 and one of a
/// single item paying a fixed cost of its own. (A model with no fixed cost:
/// a latency floor larger than a worker's part rounds up already.)
#[test]
fn a_whole_static_region_leaves_no_sliver() {
    let sim = Sim::new(vec![(4, 0.0, 1e6, false)]).known(true);
    let out = sim.run("static", 1001, 1).unwrap();
    let cpu = &out.report.classes[0];
    assert_eq!((cpu.items, cpu.chunks), (1001, 4));
}

#[test]
fn every_policy_finishes_everything_once() {
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (2, 10e-6, 4e6, true)])
        .known(true)
        .failing(Some(7));
    for p in crate::policy::POLICIES {
        let out = sim.run(p.name(), 10_007, 4).unwrap();
        assert!(out.counts.iter().all(|&c| c == 1), "{}", p.name());
        assert!(out.report.retries > 0, "{}", p.name());
    }
}

#[test]
fn a_chunk_that_always_fails_fails_the_job() {
    let sim = Sim::new(vec![(2, 0.0, 1e6, false)]);
    let _ = sim;
    let cls = classes(&[(1, false)]);
    let ctx_speeds = [ClassSpeed {
        workers: 1,
        a: 0.0,
        b: None,
        eligible: true,
        min_items: 1,
        start: 0.0,
        latency_chunks: LATENCY_CHUNKS,
    }];
    let th = Thresholds::default();
    let ctx = PlanContext {
        items: 10,
        grain: 1,
        classes: &cls,
        speeds: &ctx_speeds,
        thresholds: th,
        history: &Default::default(),
    };
    let adm = by_name("dynamic").unwrap().admit(&ctx);
    let admitted = Admitted {
        policy: "dynamic".into(),
        plan: adm,
        thresholds: th,
        models: vec![SpeedModel::default()],
        stored_split: vec![f64::NAN],
        learns_split: true,
        eligible: vec![true],
        in_service: vec![1],
        remeasured: Vec::new(),
        trace: false,
    };
    let mut job = JobCore::new(
        Arc::new(Empty::new(10)),
        admitted,
        cls,
        Arc::from(vec![0usize]),
    );
    let mut n = 0;
    while let Some(ch) = job.claim(0, 0, 0.0) {
        n += 1;
        job.fail(0, &ch.info, KernelError::Failed("boom".into()));
        assert!(n < 100);
    }
    assert!(job.is_over());
    let e = job.report().unwrap_err().to_string();
    assert!(e.contains("failed 4 times") && e.contains("boom"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random speeds, latencies, grains, sizes, policies and injected
    /// failures: every item exactly once, and the job always ends.
    #[test]
    fn exactly_once_under_random_speeds(
        cpu_w in 1usize..4, acc_w in 0usize..3,
        b_cpu in 1e3f64..1e7, ratio in 0.01f64..3000.0, lat in 0.0f64..1e-3,
        items in 1usize..20_000, grain in 1usize..64,
        known in any::<bool>(), policy in 0usize..8, fail in proptest::option::of(2usize..50),
    ) {
        let mut spec = vec![(cpu_w, 0.0, b_cpu, false)];
        if acc_w > 0 {
            spec.push((acc_w, lat, b_cpu * ratio, true));
        }
        let sim = Sim::new(spec).known(known).failing(fail.map(|f| f * grain));
        let p = crate::policy::POLICIES[policy].name();
        let out = match sim.run(p, items, grain) {
            Err(ActorError::NoDevice { .. }) if p == "accel-only" && acc_w == 0 => return Ok(()),
            r => r.unwrap(),
        };
        prop_assert!(out.counts.iter().all(|&c| c == 1), "{}", p);
        prop_assert_eq!(out.report.classes.iter().map(|c| c.items).sum::<usize>(), items);
        let traced: usize = out.report.chunks.iter().map(|c| c.hi - c.lo).sum();
        prop_assert_eq!(traced, items);
    }
}

#[test]
fn an_accelerator_with_a_launch_cost_gets_few_large_chunks() {
    // A 2 ms fixed cost per chunk on a 55 ms job: four static chunks would
    // spend a seventh of the accelerator's time on it. Warm, the planner
    // and the static phase count it; the probe is judged against the
    // model's prediction, so a known fixed cost is not a wrong model.
    let sim = Sim::new(vec![(1, 0.0, 1e6, false), (1, 2e-3, 1e7, true)]).known(true);
    let out = sim.run("hybrid", 600_000, 1).unwrap();
    let e = sim.ideal(600_000) / out.makespan;
    assert!(e >= 0.92, "efficiency {e:.3}: {}", out.report.summary());
    assert!(
        out.report.classes[1].chunks <= 4,
        "{}",
        out.report.summary()
    );
    assert!(!out.report.probe.unwrap().replanned);
    // Fifteen cores and two streams 20x as fast, 100 µs per chunk.
    let sim = Sim::new(vec![(15, 0.0, 1e6, false), (2, 100e-6, 2e7, true)]).known(true);
    let out = sim.run("hybrid", 1_000_000, 1).unwrap();
    let e = sim.ideal(1_000_000) / out.makespan;
    assert!(e >= 0.95, "efficiency {e:.3}: {}", out.report.summary());
}

#[test]
fn finish_time_fills_the_others_from_their_starts() {
    // One worker free now at 10/s, one free in 1 s at 10/s: 30 items by 2 s.
    let mut s = vec![(1.0, 10.0), (0.0, 10.0)];
    assert!((finish_time(&mut s, 30.0).unwrap() - 2.0).abs() < 1e-12);
    // Done before the second starts.
    assert!((finish_time(&mut s, 5.0).unwrap() - 0.5).abs() < 1e-12);
    assert_eq!(finish_time(&mut [], 5.0), None);
}

#[test]
fn a_cold_start_against_a_far_faster_accelerator_stays_short() {
    // The CPU's first probe chunk is the only thing the accelerator may wait
    // for: it is small (items / 4096 per worker), so the cold run is
    // balanced too, not only the warm one.
    let sim = Sim::new(vec![(1, 0.0, 1e4, false), (1, 0.0, 2.5e7, true)]);
    let items = 5_000_000;
    let out = sim.run("hybrid", items, 1).unwrap();
    let e = sim.ideal(items) / out.makespan;
    assert!(e >= 0.95, "efficiency {e:.3}: {}", out.report.summary());
    assert!(out.report.classes[0].items < items / 500);
}

#[test]
fn chunks_failed_twice_by_a_lost_device_go_to_another_class() {
    // Two accelerator workers whose every chunk fails, one CPU: a failed
    // chunk goes to the CPU after two failures there, not back and forth
    // between the two streams until its attempts are spent.
    let sim = Sim::new(vec![(1, 0.0, 1e6, false), (2, 20e-6, 3e6, true)])
        .known(true)
        .broken(1, Broken::Always);
    let out = sim.run("hybrid", 100_000, 1).unwrap();
    assert!(out.counts.iter().all(|&c| c == 1));
    assert!(out.report.retries > 0);
    // Every retried chunk that completed did so on the CPU (worker 0).
    assert!(
        out.report
            .chunks
            .iter()
            .filter(|r| r.phase == Phase::Retry)
            .all(|r| r.worker == 0)
    );
}

#[test]
fn a_run_on_one_class_falls_back_to_the_classes_standing_by() {
    // An accelerator 1000x the CPU: hybrid runs it alone. Its every chunk
    // fails; the CPU, standing by, takes them and the job ends, each item
    // once.
    let sim = Sim::new(vec![(1, 0.0, 1e4, false), (2, 20e-6, 1e7, true)])
        .known(true)
        .broken(1, Broken::Always);
    let out = sim.run("hybrid", 20_000, 1).unwrap();
    assert!(out.counts.iter().all(|&c| c == 1));
    assert_eq!(out.report.split[0], 0.0, "{:?}", out.report.split);
    assert!(out.report.retries > 0);
    assert_eq!(
        out.report.classes[0].items,
        20_000,
        "{}",
        out.report.summary()
    );
    // The same job under `accel-only`, which keeps the CPU out by design,
    // fails.
    assert!(sim.run("accel-only", 20_000, 1).is_err());
}

#[test]
fn one_passing_device_error_does_not_send_a_large_chunk_to_a_slow_class() {
    // A 2500x accelerator with two streams fails one large chunk once: the
    // retry goes to its other stream, or to the CPU only in a piece the
    // CPU can finish in time.
    let sim = Sim::new(vec![(1, 0.0, 1e4, false), (2, 20e-6, 2.5e7, true)])
        .known(true)
        .broken(1, Broken::Once);
    let items = 5_000_000;
    let out = sim.run("hybrid", items, 1).unwrap();
    assert!(out.report.retries == 1, "{}", out.report.summary());
    assert!(out.counts.iter().all(|&c| c == 1));
    let e = sim.ideal(items) / out.makespan;
    assert!(e >= 0.9, "efficiency {e:.3}: {}", out.report.summary());
}

#[test]
fn a_cold_probe_tells_a_launch_cost_from_a_slow_device() {
    // Four cores and an accelerator 100x one core with 100 µs per chunk: its
    // first probe chunk is nearly all launch cost; the replan waits for a
    // second, larger one and fits both.
    let sim = Sim::new(vec![(4, 0.0, 1e6, false), (1, 100e-6, 1e8, true)]);
    let items = 1_000_000;
    let out = sim.run("hybrid", items, 1).unwrap();
    let e = sim.ideal(items) / out.makespan;
    assert!(e >= 0.85, "efficiency {e:.3}: {}", out.report.summary());
}

#[test]
fn a_retry_that_only_its_last_failer_could_take_is_still_taken() {
    // Two cores and one stream. A core fails a chunk; the stream, trying it
    // next, runs out of memory: the halves are barred from the stream (it
    // failed them last) but not from the cores, which take them.
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (1, 0.0, 4e6, true)]).known(true);
    let (mut job, wc) = sim.job("hybrid", 1000, 1).unwrap();
    let cpu = job.claim(0, 0, 0.0).unwrap();
    job.fail(0, &cpu.info, KernelError::Failed("core".into()));
    let gpu = job.claim(2, 1, 0.0).unwrap();
    assert_eq!(gpu.info.phase, Phase::Retry);
    job.fail(
        2,
        &gpu.info,
        KernelError::OutOfMemory {
            items: gpu.info.range.len(),
            need: 0,
            free: 0,
        },
    );
    let out = sim.drive(&mut job, &wc, 1000).unwrap();
    assert!(out.counts.iter().all(|&c| c == 1));
}

#[test]
fn a_chunk_refused_for_device_memory_runs_on_the_other_class() {
    // Two cores and one stream. The stream refuses its first chunk: an
    // input of the whole run does not fit in its free memory. The chunk
    // runs on a core, once, and the job completes.
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (1, 0.0, 4e6, true)]).known(true);
    let (mut job, wc) = sim.job("hybrid", 1000, 1).unwrap();
    let gpu = job.claim(2, 1, 0.0).unwrap();
    let refused = gpu.info.range.clone();
    job.fail(
        2,
        &gpu.info,
        KernelError::DeviceMemory {
            what: "an input of the whole run",
            need: 90 << 30,
            free: 70 << 30,
            total: 80 << 30,
        },
    );
    let out = sim.drive(&mut job, &wc, 1000).unwrap();
    assert!(out.counts.iter().all(|&c| c == 1));
    for i in refused {
        let by = out.report.chunks.iter().find(|r| r.lo <= i && i < r.hi);
        assert!(by.is_some_and(|r| r.worker < 2), "item {i}: {by:?}");
    }
}

#[test]
fn a_gpu_is_given_chunks_that_fill_it() {
    // 4 CPU workers at 1e5 items/s each; a GPU of 2 streams, 50 µs per
    // chunk and 2e7 items/s, whose chunks take as long as 100k items
    // until they hold that many (the run on an H100: slivers measured
    // launch latency and taught the model a GPU 2000x too slow).
    let sim = || Sim::new(vec![(4, 0.0, 1e5, false), (2, 5e-5, 2e7, true)]).fill(1, 100_000);
    let items = 4_000_000;
    for known in [false, true] {
        let out = sim().known(known).run("hybrid", items, 1).unwrap();
        assert!(out.counts.iter().all(|&c| c == 1));
        let gpu: Vec<_> = out.report.chunks.iter().filter(|r| r.worker >= 4).collect();
        let small = gpu.iter().filter(|r| r.hi - r.lo < 100_000).count();
        assert!(
            small <= 2,
            "known {known}: {small} of {} GPU chunks below its fill",
            gpu.len()
        );
        let e = sim().ideal(items) / out.makespan;
        assert!(e > 0.85, "known {known}: E = {e:.3}");
    }
}

#[test]
fn a_job_of_zero_items_is_over_at_admission_and_holds_no_kernel() {
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (1, 20e-6, 3e6, true)]);
    for p in crate::policy::POLICIES {
        for grain in [1, 7] {
            let (mut job, _) = sim.job(p.name(), 0, grain).unwrap();
            assert!(job.is_over(), "{}", p.name());
            // The submitter is answered at once: the job must not keep a
            // handle on the kernel (the bug: `Arc::try_unwrap` then failed).
            assert!(job.life.kernel.is_none(), "{} keeps the kernel", p.name());
            assert!(job.life.claims.is_none());
            assert!(job.claim(0, 0, 0.0).is_none());
            let report = job.report().unwrap();
            assert_eq!(report.items, 0);
        }
    }
}

#[test]
fn a_gpu_chunk_far_past_its_prediction_is_taken_back_but_not_for_its_setup() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let sim = Sim::new(vec![(1, 0.0, 1e5, false), (1, 0.0, 1e6, true)]).known(true);
    let (job, _) = sim.job("hybrid", 1_000_000, 1).unwrap();
    let flags: Arc<[AtomicBool]> = (0..2).map(|_| AtomicBool::new(false)).collect();
    let mut job = job.with_take_back(flags.clone());
    let gpu = job.claim(1, 1, 0.0).expect("the GPU worker gets a chunk");
    let predicted = gpu.info.range.len() as f64 / 1e6;
    let overdue = overdue::OVERDUE_FACTOR * predicted + overdue::OVERDUE_SLACK_S;
    // Compiling its code took longer than the chunk may: flagged...
    job.take_back_overdue(overdue + 0.5);
    assert!(flags[1].load(Ordering::Acquire), "a CUDA stream is watched");
    // ...but the setup is not the chunk's time: its clock starts again.
    let t = overdue + 0.6;
    job.watch_restart(1, t);
    assert!(
        !flags[1].load(Ordering::Acquire),
        "the restart clears the flag"
    );
    job.take_back_overdue(t + overdue * 0.9);
    assert!(!flags[1].load(Ordering::Acquire), "not overdue yet");
    job.take_back_overdue(t + overdue * 1.1);
    assert!(
        flags[1].load(Ordering::Acquire),
        "overdue since its restart"
    );
    assert!(
        !flags[0].load(Ordering::Acquire),
        "a CPU worker is never flagged"
    );
}

/// A GPU's least work is its fill until three chunks below half a fill
/// were measured; then what they cost, in items at the model's speed.
#[test]
fn a_gpu_s_least_work_is_its_fill_until_small_chunks_measure_it() {
    let fill = 1000;
    let mut m = SpeedModel::default();
    // Chunks of a fill and more: 1 ms, then a million items a second.
    for n in [1000.0, 2000.0, 4000.0, 8000.0] {
        m.observe(n, 1e-3 + n / 1e6);
    }
    assert_eq!(super::guard::least_work(&m, fill, 1), (fill, false));
    // Chunks of 10 to 30 items that each took as long as about 100.
    for n in [10.0, 20.0] {
        m.observe(n, 1e-3 + 100.0 / 1e6);
    }
    assert_eq!(super::guard::least_work(&m, fill, 1), (fill, false));
    m.observe(30.0, 1e-3 + 100.0 / 1e6);
    let (least, measured) = super::guard::least_work(&m, fill, 1);
    assert!(measured && least < fill / 4, "least work {least}");
    // A class whose chunks fill it at a grain has no least work to learn.
    assert_eq!(super::guard::least_work(&m, 1, 1), (1, false));
}

#[test]
fn the_worker_with_the_largest_planned_share_is_woken_first() {
    // Four cores and an accelerator ten times one core: the accelerator's
    // one worker carries 10/14 of the plan, each core 1/14.
    let fast = Sim::new(vec![(4, 0.0, 1e6, false), (1, 0.0, 1e7, true)]).known(true);
    let (job, _) = fast.job("static", 100_000, 1).unwrap();
    assert_eq!(&*job.wake_order(), &[1, 0]);
    // An accelerator at half a core: each core carries more than it.
    let slow = Sim::new(vec![(4, 0.0, 1e6, false), (1, 0.0, 5e5, true)]).known(true);
    let (job, _) = slow.job("static", 100_000, 1).unwrap();
    assert_eq!(&*job.wake_order(), &[0, 1]);
    // Nothing known: accelerators first.
    let cold = Sim::new(vec![(4, 0.0, 1e6, false), (1, 0.0, 5e5, true)]);
    let (job, _) = cold.job("hybrid", 100_000, 1).unwrap();
    assert_eq!(&*job.wake_order(), &[1, 0]);
    // A job on one class wakes it, then those standing by for its retries.
    let mut only = Sim::new(vec![(4, 0.0, 1e6, false), (1, 0.0, 1e7, true)]).known(true);
    only.only = Some(1);
    let (job, _) = only.job("hybrid", 100_000, 1).unwrap();
    assert_eq!(job.wake_order()[0], 1);
    assert!(job.wake_order().len() <= 2);
}

/// A GPU's streams alone take one static chunk each, however slow its
/// model says it is: they are alike and share the device, so that cutting
/// the static part into guided chunks buys no balance, only fixed costs.
/// Where the dynamic tail would be chunks under the latency floor
/// (`LATENCY_CHUNKS·a·b` items, by the model), the static chunks take the
/// whole job: a tail of a chunk a stream, both paying the fixed cost at
/// once, cost 7% of a 1 ms run on the H200 bus's model
/// (`vtime::contention`).
#[test]
fn a_gpu_alone_takes_one_static_chunk_a_stream_and_a_tail_only_above_its_floor() {
    let spec = vec![(4, 0.0, 1e6, false), (2, 1e-4, 1e8, true)];
    let f = Thresholds::default().static_fraction;
    // The floor: 19 × 1e-4 s × 1e8 items/s = 190 000 items (47 500 where
    // the model says a quarter of the speed); the tail, a fifth of the job
    // over two streams.
    for (items, scale, tail) in [
        (1_000_000, 1.0, false),
        (1_000_000, 0.25, true),
        (10_000_000, 1.0, true),
    ] {
        let sim = Sim {
            only: Some(1),
            ..Sim::new(spec.clone())
                .fill(1, 1000)
                .known(true)
                .misjudged(vec![1.0, scale])
        };
        let out = sim.run("hybrid", items, 1).unwrap();
        let gpu: Vec<(usize, Phase)> = out
            .report
            .chunks
            .iter()
            .filter(|r| r.worker >= 4)
            .map(|r| (r.hi - r.lo, r.phase))
            .collect();
        let label = format!("{items} items, model at {scale}x: the GPU's chunks {gpu:?}");
        let stat: Vec<usize> = gpu
            .iter()
            .filter(|c| c.1 == Phase::Static)
            .map(|c| c.0)
            .collect();
        let part = if tail { f } else { 1.0 };
        let want = part * items as f64 / 2.0;
        assert_eq!(stat.len(), 2, "{label}");
        assert!(
            stat.iter().all(|&n| (n as f64 - want).abs() <= 1.0),
            "{label}: static chunks of {want} wanted"
        );
        assert_eq!(gpu.len() > 2, tail, "{label}");
    }
}

/// A CPU whose stored model is off by a constant factor (every worker as
/// fast as the others, each slower or faster than the model says) ends its
/// tail as it would on the right model: a sibling past its predicted end is
/// predicted again by what this run's chunks took, so it is not counted
/// busy for long when it is about to be free.
#[test]
fn a_cpu_misjudged_by_a_constant_factor_ends_its_tail_together() {
    let spec = vec![(15, 1e-4, 1e7, false)];
    let items = 75_000;
    let exact = Sim::new(spec.clone()).known(true);
    let want = exact.run("hybrid", items, 1).unwrap().makespan;
    for scale in [0.8, 1.1, 1.25] {
        let sim = Sim::new(spec.clone()).known(true).misjudged(vec![scale]);
        let got = sim.run("hybrid", items, 1).unwrap().makespan;
        assert!(
            got <= want * 1.01,
            "model at {scale}x: {:.3} ms, on the right model {:.3} ms",
            got * 1e3,
            want * 1e3
        );
    }
}

/// A stream's first chunk begins when its class starts (its upload of the
/// run's inputs), not when it was claimed, and when the worker says its
/// setup is done, from then: the engine predicts its end from there.
#[test]
fn a_stream_s_first_chunk_is_predicted_to_end_after_its_class_s_start() {
    let sim = Sim::new(vec![(2, 0.0, 1e6, false), (1, 1e-3, 1e7, true)]).known(true);
    let (mut job, _) = sim.job("hybrid", 1_000_000, 1).unwrap();
    job.st[1].speed.model = job.st[1].speed.model.clone().with_start(0.5);
    let first = job.claim(2, 1, 0.0).expect("the stream gets a chunk");
    let n = first.info.range.len();
    let chunk = 1e-3 + n as f64 / 1e7;
    assert_eq!(job.worker[2].in_flight, (0.5, n));
    assert!(
        (job.worker[2].busy_until - (0.5 + chunk)).abs() < 1e-9,
        "predicted end {} s, want {} s",
        job.worker[2].busy_until,
        0.5 + chunk
    );
    // The upload took 0.7 s this time: the chunk begins then.
    job.watch_restart(2, 0.7);
    assert_eq!(job.worker[2].in_flight, (0.7, n));
    assert!((job.worker[2].busy_until - (0.7 + chunk)).abs() < 1e-9);
    // Its next chunk begins when claimed.
    job.complete(2, 1, &first.info, 0.7, 0.8);
    let next = job.claim(2, 1, 0.8).expect("a second chunk");
    let want = 0.8 + job.predict(1, next.info.range.len());
    assert!((job.worker[2].busy_until - want).abs() < 1e-9);
}

/// A CPU whose chunks pay a fixed cost still leaves the rest to a far
/// faster accelerator where the guard says so: its floor of a fixed cost's
/// worth of items applies only to a chunk it takes.
#[test]
fn a_cpu_with_a_fixed_cost_leaves_the_rest_to_a_far_faster_accelerator() {
    // Two cores that pay 1 ms a chunk (a fixed cost's worth: 1000 items)
    // and an accelerator that does the whole job in 20 µs.
    let sim = Sim::new(vec![(2, 1e-3, 1e6, false), (1, 0.0, 1e8, true)]).known(true);
    let (mut job, _) = sim.job("hybrid", 2000, 1).unwrap();
    let gpu = job.claim(2, 1, 0.0).expect("the accelerator gets a chunk");
    let left = 2000 - gpu.info.range.len();
    assert!(left > 0, "the accelerator's first chunk leaves a rest");
    assert_eq!(
        job.limit(0, 0, left, 0.0),
        None,
        "a core would end {left} items after 1 ms; the accelerator, in microseconds"
    );
}

#[test]
fn a_class_given_a_region_to_be_measured_again_takes_it_past_the_guard() {
    // A CPU at 10^6 items/s and a sim whose stored model says 0.01 items/s
    // (one bad measurement): the plan left the sim out, and the broker gave
    // it a thousandth of the job to measure it again. With the CPU's chunk
    // in flight, the guard judged by that model always declines; the
    // region is taken anyway.
    let cls = classes(&[(1, false), (1, true)]);
    let th = Thresholds::default();
    let plan = Admission::split(vec![0.999, 0.001])
        .static_part(0.5, 1)
        .chunking(Chunking::TimeGuided)
        .steal(Steal::Always)
        .guard(true);
    let job = |remeasured: Vec<bool>| {
        JobCore::new(
            Arc::new(Empty::new(100_000)),
            Admitted {
                policy: "hybrid".into(),
                plan: plan.clone(),
                thresholds: th,
                models: vec![
                    SpeedModel::with_params(0.0, 1e6),
                    SpeedModel::with_params(0.0, 0.01),
                ],
                stored_split: vec![f64::NAN; 2],
                learns_split: true,
                eligible: vec![true; 2],
                in_service: vec![1; 2],
                remeasured,
                trace: false,
            },
            cls.clone(),
            Arc::from(vec![0usize, 1]),
        )
    };
    let mut old = job(vec![false; 2]);
    assert!(old.claim(0, 0, 0.0).is_some());
    assert!(
        old.claim(1, 1, 0.0).is_none(),
        "not re-measured: the guard declines"
    );

    let mut job = job(vec![false, true]);
    let cpu = job.claim(0, 0, 0.0).expect("the CPU's static chunk");
    let sim = job.claim(1, 1, 0.0).expect("re-measured past the guard");
    let n = sim.info.range.len();
    assert!((1..=100).contains(&n), "{n} items");
    assert!(job.remeasuring(1));
    // Once a chunk has ended, its measurement is the model the guard uses.
    job.complete(1, 1, &sim.info, 0.0, n as f64 / 100.0);
    assert!(!job.remeasuring(1));
    job.complete(0, 0, &cpu.info, 0.0, cpu.info.range.len() as f64 / 1e6);
}
