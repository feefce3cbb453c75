//! `coexec bench`: each device class alone, then co-executed under each
//! policy; the method's table and JSON.

use std::path::PathBuf;
use std::time::Duration;

use coexec::{JobOptions, RunReport, Runtime};

mod oracle;
mod overhead;
mod table;

use overhead::{machine, overhead};
use table::print_table;

use crate::report::{
    AloneResult, Baseline, BenchReport, ClassResult, LearningRun, OracleResult, PolicyResult,
    WorkloadBench,
};
use crate::stats::{MIN_CI_SAMPLES, median_ci95, rel_half_width};
use crate::workload::{BENCHMARKS, NAMES, Prepared, WorkloadArgs};
use crate::{Common, Failure, build, class_speeds, gpu_telemetry};

/// A class slower alone than this many times the fastest is predicted, not
/// run, once a run alone cut at [`slow_cap`] confirms it.
const SLOW_FACTOR: f64 = 20.0;

/// How long the run alone that checks a slow prediction may take: the
/// prediction may rest on a stalled probe or a fixed cost fitted as a
/// speed (a sim with 5 ms of latency was predicted at 10 s for a job of
/// 6 ms), and a class that finishes within this is measured after all.
fn slow_cap(fastest_s: f64) -> Duration {
    Duration::from_secs_f64((SLOW_FACTOR * fastest_s).clamp(1.0, 60.0))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// Device time of a job: the sum of its runs' makespans (host steps between
/// runs are the same whatever the schedule, and not counted).
fn job_time(reports: &[RunReport]) -> f64 {
    reports.iter().map(|r| r.makespan_s).sum()
}

/// How many times the bench runs each configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    /// Runs of every configuration (alone classes, policies) at least.
    pub(crate) repeat: usize,
    /// Seconds after which no further round starts once `repeat` rounds,
    /// and at least enough for an interval ([`MIN_CI_SAMPLES`]), are done;
    /// until then rounds go on while any configuration's median is not
    /// known to ±2% (95%). Zero: exactly `repeat` rounds.
    pub(crate) budget_s: f64,
    /// Cold/warm pairs for the learning comparison.
    pub(crate) pairs: usize,
    /// Whether to sweep fixed splits for the measured limit (`--oracle`).
    pub(crate) oracle: bool,
}

pub(crate) async fn bench(
    mut names: Vec<String>,
    common: &Common,
    args: &WorkloadArgs,
    policies: &str,
    rounds: Rounds,
    json: Option<PathBuf>,
    plot: Option<PathBuf>,
) -> Result<(), Failure> {
    let Rounds {
        repeat,
        pairs,
        budget_s,
        ..
    } = rounds;
    if !(0.0..=86_400.0).contains(&budget_s) {
        return Err(Failure::Usage(format!(
            "--budget {budget_s}: expected 0..=86400 seconds"
        )));
    }
    if repeat == 0 || repeat > 1000 {
        return Err(Failure::Usage(format!(
            "--repeat {repeat}: expected 1..=1000"
        )));
    }
    if pairs > 1000 {
        return Err(Failure::Usage(format!(
            "--pairs {pairs}: expected 0..=1000"
        )));
    }
    if names.is_empty() {
        names = BENCHMARKS.iter().map(|s| s.to_string()).collect();
        // The default set runs wherever the repository is cloned: without
        // Rodinia's input beside it, kmeans runs on a generated input of
        // kdd_cup's shape (its table header names the input).
    }
    for n in &names {
        if n != "overhead" && !NAMES.contains(&n.as_str()) {
            return Err(Failure::Usage(format!(
                "unknown workload `{n}`; expected overhead or one of {}",
                NAMES.join(", ")
            )));
        }
    }
    let policy_list: Vec<String> = policies
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if policy_list.is_empty() {
        return Err(Failure::Usage(format!(
            "--policies `{policies}` names no policy (see `coexec policies`)"
        )));
    }
    for p in &policy_list {
        coexec::policy::by_name(p).map_err(|e| Failure::Usage(e.to_string()))?;
    }
    let rt = std::sync::Arc::new(build(common, None, true)?);
    let _telemetry = gpu_telemetry(common);
    // A policy narrowed to a kind of device this machine lacks has nothing
    // to run on (accel-only without a GPU, in CI): say so and go on.
    let has = |accel: bool| rt.classes().iter().any(|c| c.is_accel() == accel);
    let policy_list: Vec<String> = policy_list
        .into_iter()
        .filter(|p| {
            let missing = match p.as_str() {
                "accel-only" => !has(true),
                "cpu-only" => !has(false),
                _ => false,
            };
            if missing {
                errln!("policy `{p}`: not run, no device class of its kind here");
            }
            !missing
        })
        .collect();
    let classes: Vec<String> = rt.classes().iter().map(|c| c.name.clone()).collect();
    if rt.gpus().is_empty()
        && !rt
            .classes()
            .iter()
            .any(|c| matches!(c.kind, coexec::DeviceKind::Cuda { .. }))
        && let Err(e) = coexec::machine::gpus()
    {
        let what = rt
            .classes()
            .iter()
            .map(|c| {
                let s = if c.workers == 1 { "" } else { "s" };
                format!("{} ({} worker{s})", c.name, c.workers)
            })
            .collect::<Vec<_>>()
            .join(", ");
        errln!("no CUDA device ({e}): benchmarking {what}");
    }
    let devices = rt
        .classes()
        .iter()
        .map(|c| format!("{}x{}", c.name, c.workers))
        .collect::<Vec<_>>()
        .join(",");
    let mut report = BenchReport {
        machine: machine(&rt),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        devices,
        repeat,
        pairs,
        workloads: Vec::new(),
        overhead: None,
    };
    for name in &names {
        if name == "overhead" {
            report.overhead = Some(overhead(common, repeat).await?);
            continue;
        }
        let t = std::time::Instant::now();
        let w = Prepared::new(name, args, true, &class_speeds(&rt))?;
        let prepare_s = t.elapsed().as_secs_f64();
        // Bars per class; the bench runs the job many times, so they grow.
        let bars = crate::progress::start(rt.clone(), w.items() as u64, common.quiet);
        let pins = coexec_kernels::cuda::host_pin_stats();
        let wb = bench_one(&rt, name, &w, args, &classes, &policy_list, rounds, common).await;
        bars.finish();
        let mut wb = wb?;
        wb.inputs_s += prepare_s;
        let now = coexec_kernels::cuda::host_pin_stats();
        wb.host_pinning = crate::report::HostPinning {
            choice: format!("{:?}", crate::host_pinning()?).to_lowercase(),
            locked: now.locked - pins.locked,
            locked_bytes: now.locked_bytes - pins.locked_bytes,
            lock_s: now.lock_secs - pins.lock_secs,
            unlock_s: now.unlock_secs - pins.unlock_secs,
            refused: now.refused - pins.refused,
            last_refusal: now.last_refusal,
        };
        print_table(&wb);
        report.workloads.push(wb);
    }
    if let Some(o) = &report.overhead {
        outln!(
            "\noverhead (empty kernel, chunk = 1 item, {} workers): {:.3} µs per chunk, {:.0} chunks/s{}",
            o.workers,
            o.us_per_chunk,
            o.chunks_per_second,
            o.with_metrics_us_per_chunk
                .zip(o.with_metrics_ratio)
                .map(|(m, r)| format!(
                    "; with Prometheus recorder {m:.3} µs per chunk ({:+.1}% by the pairs' median ratio, {} pairs)",
                    100.0 * (r - 1.0),
                    o.repeat
                ))
                .unwrap_or_default()
        );
    }
    if let Some(path) = plot {
        if report.workloads.is_empty() {
            errln!("nothing to plot: no workload was benchmarked");
        } else {
            crate::plot::plot_bench(&path, &report).map_err(Failure::Run)?;
        }
    }
    if let Some(path) = json {
        let text =
            serde_json::to_string_pretty(&report).map_err(|e| Failure::Run(e.to_string()))?;
        std::fs::write(&path, text)
            .map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    }
    // The files are written first: lingering only keeps the exporter up.
    crate::linger(common).await;
    if let Ok(rt) = std::sync::Arc::try_unwrap(rt) {
        rt.shutdown().await;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn bench_one(
    rt: &Runtime,
    name: &str,
    w: &Prepared,
    args: &WorkloadArgs,
    classes: &[String],
    policies: &[String],
    rounds: Rounds,
    common: &Common,
) -> Result<WorkloadBench, Failure> {
    let Rounds {
        repeat,
        pairs,
        budget_s,
        ..
    } = rounds;
    let hybrid = coexec::policy::by_name("hybrid").map_err(|e| Failure::Run(e.to_string()))?;
    // One co-executed warm-up teaches the profiler every class's speed; a
    // class predicted to take more than SLOW_FACTOR times the fastest alone
    // is not run alone (the paper's N-body CPU would take hours): its time
    // is the model's prediction, and says so.
    let warm_ran = w.run(rt, JobOptions::new().policy(hybrid.clone())).await?;
    let inputs_s = warm_ran.inputs_s;
    let warm = warm_ran.reports;
    // From the models as the warm-up left them (an early run's model may
    // hold one chunk's stall, a taken-back one's lower bound included).
    let last = warm.last();
    let predicted: Vec<f64> = (0..classes.len())
        .map(|c| {
            let b = last.map_or(0.0, |r| {
                let k = &r.classes[c];
                k.model_b_items_per_s * k.workers.max(1) as f64
            });
            if b > 0.0 {
                warm.iter().map(|r| r.items as f64).sum::<f64>() / b
            } else {
                f64::NAN
            }
        })
        .collect();
    let fastest = predicted
        .iter()
        .cloned()
        .filter(|x| x.is_finite())
        .fold(f64::INFINITY, f64::min);
    // The configurations: each class alone (unless predicted), then each
    // policy co-executed. Every round runs each once, so that a machine
    // whose speed drifts (a shared VM, turbo, another tenant) shifts them
    // all alike instead of whichever ran in the slow minute.
    let hybrid_alone = |c: usize| JobOptions::new().policy(hybrid.clone()).classes([c]);
    let mut measured: Vec<usize> = Vec::with_capacity(classes.len());
    for (c, &p) in predicted.iter().enumerate() {
        let slow = p.is_finite() && p > SLOW_FACTOR * fastest;
        // Checked by a run alone, cut (the job cancelled) at the cap.
        if !slow
            || tokio::time::timeout(slow_cap(fastest), w.run(rt, hybrid_alone(c)))
                .await
                .is_ok_and(|r| r.is_ok())
        {
            measured.push(c);
        }
    }
    let mut configs: Vec<JobOptions> = measured.iter().map(|&c| hybrid_alone(c)).collect();
    for p in policies {
        let policy = coexec::policy::by_name(p).map_err(|e| Failure::Run(e.to_string()))?;
        configs.push(JobOptions::new().policy(policy));
    }
    for opts in &configs[..measured.len()] {
        w.run(rt, opts.clone()).await?; // warm-up: page faults, the class's model
    }
    let mut runs: Vec<Vec<(f64, Vec<RunReport>)>> = vec![Vec::new(); configs.len()];
    // Rounds in the same interleaved order until every configuration's
    // median is known to ±PRECISION (95%) or the budget is spent; with a
    // budget, at least until every median has an interval (a figure
    // without one cannot be told from noise).
    let least = if budget_s > 0.0 {
        repeat.max(MIN_CI_SAMPLES)
    } else {
        repeat
    };
    let started = std::time::Instant::now();
    for round in 1.. {
        for (k, opts) in configs.iter().enumerate() {
            let reports = w.run(rt, opts.clone()).await?.reports;
            runs[k].push((job_time(&reports), reports));
        }
        let precise = runs.iter().all(|r| {
            let times: Vec<f64> = r.iter().map(|x| x.0).collect();
            rel_half_width(median(&times), median_ci95(&times)) <= PRECISION
        });
        if round >= least
            && (precise || started.elapsed().as_secs_f64() >= budget_s || round >= MAX_ROUNDS)
        {
            break;
        }
    }
    let alone: Vec<AloneResult> = classes
        .iter()
        .enumerate()
        .map(|(c, cname)| match measured.iter().position(|&m| m == c) {
            Some(k) => {
                let times: Vec<f64> = runs[k].iter().map(|r| r.0).collect();
                AloneResult {
                    class: cname.clone(),
                    median_s: median(&times),
                    ci_s: median_ci95(&times),
                    runs_s: times,
                    predicted: false,
                }
            }
            None => AloneResult {
                class: cname.clone(),
                median_s: predicted[c],
                runs_s: Vec::new(),
                ci_s: None,
                predicted: true,
            },
        })
        .collect();
    let ideal = 1.0 / alone.iter().map(|a| 1.0 / a.median_s).sum::<f64>();
    let best = alone
        .iter()
        .min_by(|a, b| a.median_s.total_cmp(&b.median_s))
        .cloned();
    let (best_class, best_s) = best.map(|b| (b.class, b.median_s)).unwrap_or_default();
    // A row of the table from its jobs' times and reports.
    let row = |p: &str, runs: &[(f64, Vec<RunReport>)]| -> PolicyResult {
        let times: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let med = median(&times);
        // The run closest to the median stands for the policy.
        let (t, reports) = runs
            .iter()
            .min_by(|a, b| (a.0 - med).abs().total_cmp(&(b.0 - med).abs()))
            .cloned()
            .unwrap_or_default();
        let mut r = policy_result(p, t, &reports, times, ideal, best_s);
        // Intervals: T's own, and E's and the speed-up's from T's and the
        // alone classes' ends (a predicted class counts as exact).
        r.makespan_s = med;
        r.efficiency = ideal / med;
        r.speedup_vs_best = best_s / med;
        r.ci_s = median_ci95(&r.runs_s);
        let ends = |hi: bool| -> Option<Vec<f64>> {
            alone
                .iter()
                .map(|a| match (a.predicted, a.ci_s) {
                    (true, _) => Some(a.median_s),
                    (false, Some((l, h))) => Some(if hi { h } else { l }),
                    (false, None) => None,
                })
                .collect()
        };
        if let (Some((tl, th)), Some(lo), Some(hi)) = (r.ci_s, ends(false), ends(true)) {
            let ideal_of = |v: &[f64]| 1.0 / v.iter().map(|t| 1.0 / t).sum::<f64>();
            let best_of = |v: &[f64]| v.iter().cloned().fold(f64::INFINITY, f64::min);
            r.efficiency_ci = Some((ideal_of(&lo) / th, ideal_of(&hi) / tl));
            r.speedup_ci = Some((best_of(&lo) / th, best_of(&hi) / tl));
        }
        r
    };
    let mut results: Vec<PolicyResult> = policies
        .iter()
        .zip(&runs[measured.len()..])
        .map(|(p, runs)| row(p, runs))
        .collect();
    // The measured limit: the best fixed split, a row of its own, and each
    // row's time against it.
    let oracle = match (rounds.oracle, classes.len()) {
        (false, _) => None,
        (true, 2) => {
            let alone_s = [alone[0].median_s, alone[1].median_s];
            let found = oracle::search(rt, w, alone_s).await?;
            let (limit, share, tried) = match found {
                Some(found) => {
                    let r = row("oracle", &found.runs);
                    let limit = r.makespan_s.min(best_s);
                    results.push(r);
                    (limit, found.share, found.tried)
                }
                None => {
                    errln!(
                        "--oracle: no split could beat the best class alone; T_oracle is its time"
                    );
                    let first_best = alone_s[0] <= alone_s[1];
                    (best_s, if first_best { 1.0 } else { 0.0 }, Vec::new())
                }
            };
            for r in &mut results {
                r.vs_oracle = Some(limit / r.makespan_s);
            }
            Some(OracleResult {
                makespan_s: limit,
                share: vec![share, 1.0 - share],
                tried,
            })
        }
        (true, n) => {
            errln!("--oracle: {n} device classes; the sweep splits between two, so it is left out");
            None
        }
    };
    // Learning: a cold profile, then the same job again from what it stored;
    // `pairs` such pairs, each on a fresh profile, compared by their medians
    // and by the median of each pair's ratio (the two runs of a pair are
    // side by side, so the machine's drift cancels).
    let mut learning = Vec::new();
    if classes.len() > 1 {
        for pair in 0..pairs {
            // No exporter of its own: `--metrics`'s, started with the first
            // runtime, serves the process's one recorder, this runtime's
            // metrics included (a second one failed on a fixed port, and on
            // port 0 served the same series twice).
            let fresh = build(
                &Common {
                    profile_dir: None,
                    metrics: None,
                    ..common.clone()
                },
                None,
                true,
            )?;
            for second in [false, true] {
                let reports = w.run(&fresh, JobOptions::default()).await?.reports;
                let first = reports.first();
                let probe = first.and_then(|r| r.probe.clone());
                let t = job_time(&reports);
                learning.push(LearningRun {
                    run: 2 * pair + 1 + usize::from(second),
                    probe: probe
                        .as_ref()
                        .map(|p| format!("{:?}", p.kind).to_lowercase())
                        .unwrap_or_else(|| "none".into()),
                    probe_imbalance: probe.as_ref().map(|p| p.imbalance).unwrap_or(0.0),
                    replanned: probe.as_ref().is_some_and(|p| p.replanned),
                    makespan_s: t,
                    efficiency: ideal / t,
                    split: first
                        .map(|r| r.classes.iter().map(|c| c.share).collect())
                        .unwrap_or_default(),
                });
            }
            fresh.shutdown().await;
        }
    }
    // coexec on the CPU class alone against the rayon baseline on as many threads.
    let baseline = match rt.classes().iter().find(|c| !c.is_accel()) {
        Some(cpu) if name != "synthetic" && name != "empty" => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(cpu.workers)
                .build()
                .map_err(|e| Failure::Run(e.to_string()))?;
            let opts = JobOptions::new().classes([cpu.index]);
            let (mut ray, mut co) = (Vec::new(), Vec::new());
            w.run_rayon(&pool)?;
            for _ in 0..repeat {
                // Side by side, alternating; both timed from built inputs
                // to the job's output, host steps included.
                ray.push(w.run_rayon(&pool)?);
                co.push(w.run(rt, opts.clone()).await?.wall_s);
            }
            let (r, c) = (median(&ray), median(&co));
            Some(Baseline {
                threads: cpu.workers,
                rayon_s: r,
                coexec_cpu_s: c,
                ratio: r / c,
            })
        }
        _ => None,
    };
    Ok(WorkloadBench {
        oracle,
        name: name.to_string(),
        items: w.items(),
        params: w.params(args),
        alone,
        ideal_s: ideal,
        best_class,
        best_alone_s: best_s,
        policies: results,
        learning,
        baseline,
        inputs_s,
        host_pinning: Default::default(),
    })
}

fn policy_result(
    p: &str,
    t: f64,
    reports: &[RunReport],
    runs: Vec<f64>,
    ideal: f64,
    best: f64,
) -> PolicyResult {
    // Per class over all runs of the job: items, and the latest finish.
    let mut classes: Vec<ClassResult> = Vec::new();
    let total: usize = reports.iter().map(|r| r.items).sum();
    for r in reports {
        for (i, c) in r.classes.iter().enumerate() {
            if classes.len() <= i {
                classes.push(ClassResult {
                    name: c.name.clone(),
                    items: 0,
                    finish_s: 0.0,
                    share: 0.0,
                });
            }
            classes[i].items += c.items;
            classes[i].finish_s += c.finish_s;
        }
    }
    for c in &mut classes {
        c.share = c.items as f64 / total.max(1) as f64;
    }
    let fin: Vec<f64> = classes
        .iter()
        .filter(|c| c.items > 0)
        .map(|c| c.finish_s)
        .collect();
    PolicyResult {
        policy: p.to_string(),
        makespan_s: t,
        runs_s: runs,
        ci_s: None,
        efficiency_ci: None,
        speedup_ci: None,
        ideal_s: ideal,
        efficiency: ideal / t,
        speedup_vs_best: best / t,
        imbalance: imbalance(&fin),
        classes,
        vs_oracle: None,
    }
}

/// δ: (max − min) / max of the classes' finish times (0 for one class).
fn imbalance(finish: &[f64]) -> f64 {
    let max = finish.iter().copied().fold(0.0, f64::max);
    let min = finish.iter().copied().fold(f64::INFINITY, f64::min);
    if finish.len() > 1 && max > 0.0 {
        (max - min) / max
    } else {
        0.0
    }
}

/// The precision `bench` repeats for: the median's 95% interval within ±2%.
const PRECISION: f64 = 0.02;
/// Rounds at most, whatever the budget.
const MAX_ROUNDS: usize = 200;
