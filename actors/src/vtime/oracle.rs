//! The bench's oracle in virtual time: the best fixed split of each
//! modelled machine beside hybrid, so that "hybrid within 5% of the best
//! fixed split" can be read before a GPU runs it. Every figure here is
//! modelled.
#![cfg(test)]

use super::*;

/// The median job time of a fixed split giving the CPU `share`, over
/// `rounds` jobs of `runs` runs of `items` items.
pub(super) fn split_time(
    m: &Machine,
    w: &Workload,
    items: usize,
    share: f64,
    rounds: usize,
    seed: u64,
) -> f64 {
    let policy: Arc<dyn Policy> = Arc::new(Split(share));
    let opts = JobOptions::new().policy(policy);
    let mut s = Series::new(&w.name, seed);
    let mut t: Vec<f64> = (0..rounds)
        .map(|_| m.job(&mut s, &opts, items, w.runs).0)
        .collect();
    median(&mut t)
}

/// The best fixed split as `coexec bench --oracle` searches it, on a finer
/// grid: CPU shares 2.5% to 97.5% in steps of 2.5%, then ±1.25% around the
/// best; its job time and share.
fn oracle(m: &Machine, w: &Workload, items: usize, rounds: usize, seed: u64) -> (f64, f64) {
    let least = |v: &[(f64, f64)]| {
        v.iter()
            .cloned()
            .fold((f64::INFINITY, 0.0), |a, b| if b.0 < a.0 { b } else { a })
    };
    let mut tried: Vec<(f64, f64)> = (1..40)
        .map(|k| {
            let x = 0.025 * k as f64;
            (split_time(m, w, items, x, rounds, seed), x)
        })
        .collect();
    let best = least(&tried);
    for x in [best.1 - 0.0125, best.1 + 0.0125] {
        tried.push((split_time(m, w, items, x, rounds, seed), x));
    }
    least(&tried)
}

/// The modelled machines of [`table`]: each workload's lease and calm
/// machines, and the H200's shared bus.
fn machines() -> Vec<(String, &'static str, Workload, Machine)> {
    let cal = h100();
    let mut machines = Vec::new();
    for w in &cal.workloads {
        machines.push((w.name.clone(), "lease", w.clone(), Machine::fitted(w)));
        machines.push((w.name.clone(), "calm", w.clone(), tests::calm(w)));
    }
    let (w, m) = contention::h200();
    machines.push(("pathfinder".into(), "H200 bus", w, m));
    machines
}

/// Jobs per configuration in the oracle's sweeps: for the docs' tables
/// ([`tests::docs_tables`]) as many as their figures took, else fewer.
fn rounds(w: &Workload) -> usize {
    if tests::docs_tables() {
        (60 / w.runs).clamp(5, 31)
    } else {
        (20 / w.runs).clamp(3, 9)
    }
}

/// The best fixed split for one run of `items` as the bench chooses it.
#[derive(Clone, Copy)]
struct BestSplit {
    /// Its CPU share.
    share: f64,
    /// The sweep's least median per run (seed 12's noise): the least of 41
    /// noisy medians, biased low; the bench runs the chosen split again for
    /// the time it reports ([`confirmed`]).
    searched: f64,
}

/// The best fixed split for one run of `items`, chosen as the bench
/// chooses it (the least median of the sweep, on seed 12's noise).
fn best_split(m: &Machine, w: &Workload, items: usize) -> BestSplit {
    let (split, share) = oracle(m, w, items, rounds(w), 12);
    BestSplit {
        share,
        searched: split / w.runs as f64,
    }
}

/// The chosen split run again, as the bench runs it for T_oracle: the
/// median per run of as many jobs as hybrid's point, on `seed`'s noise.
fn confirmed(m: &Machine, w: &Workload, items: usize, share: f64, seed: u64) -> f64 {
    split_time(m, w, items, share, rounds(w), seed) / w.runs as f64
}

/// T_oracle as the bench counts it: the best fixed split's time (`split`,
/// with its CPU share), or the best class alone's (`alone`) where that is
/// less; with how it was got.
fn t_oracle((split, share): (f64, f64), alone: f64) -> (f64, String) {
    if split < alone {
        (split, format!("{:.1}%", 100.0 * share))
    } else {
        (alone, "a class alone".to_string())
    }
}

/// Hybrid's seeds in the three-seed tables.
const SEEDS: [u64; 3] = [11, 13, 15];

/// Hybrid on `w` at `run_s` a run under `th`, once per seed of [`SEEDS`].
fn three_seeds(m: &Machine, w: &Workload, run_s: f64, th: Thresholds) -> Vec<SweepPoint> {
    SEEDS
        .map(|seed| sweep_point(m, w, run_s, rounds(w), seed, th))
        .into()
}

/// The means over `p` (hybrid on [`SEEDS`], in that order, as
/// [`three_seeds`] gives them) of hybrid over the best class alone, of
/// T_oracle over hybrid's T with the split `best` run again on each seed,
/// and of the same with the sweep's least median instead.
fn means(m: &Machine, w: &Workload, p: &[SweepPoint], best: BestSplit) -> (f64, f64, f64) {
    let BestSplit { share, searched } = best;
    let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let alone = |p: &SweepPoint| p.alone[CPU].min(p.alone[GPU]);
    (
        mean(p.iter().map(SweepPoint::vs_best).collect()),
        mean(
            p.iter()
                .zip(SEEDS)
                .map(|(p, seed)| {
                    let split = confirmed(m, w, p.items, share, seed);
                    t_oracle((split, share), alone(p)).0 / p.hybrid
                })
                .collect(),
        ),
        mean(
            p.iter()
                .map(|p| t_oracle((searched, share), alone(p)).0 / p.hybrid)
                .collect(),
        ),
    )
}

/// Over hybrid's seeds 11, 13 and 15 (one seed's point at 1 ms moves by up
/// to 2% between builds that run it alike), hybrid keeps within 5% of
/// T_oracle, the best fixed split as the bench finds it (chosen on seed
/// 12, run again on each seed), or of the best class alone where that is
/// less, on every modelled machine, at 1, 10 and 100 ms a run: the goal a
/// GPU's bench must show (`coexec bench --oracle`). With
/// `COEXEC_VTIME_TABLES=1` (the jobs per point the figures took) it prints
/// the tables of `docs/results/vtime-oracle-and-fit.md`: per workload,
/// machine and length, seed 11's each class alone, hybrid and T_oracle
/// (with the split's CPU share), then the three seeds' means of hybrid
/// over the best class alone, T_oracle over hybrid's T, and the same with
/// the sweep's least median. Modelled.
/// `COEXEC_VTIME_TABLES=1 cargo test -p coexec-actors --release --lib vtime::oracle::hybrid_keeps -- --nocapture`.
#[test]
fn hybrid_keeps_within_5_percent_of_the_oracle_over_three_seeds() {
    println!(
        "| workload | machine | run (best alone) | T cpu | T gpu | hybrid | T_oracle (best split's CPU share) | hybrid / best alone | T_oracle / T hybrid |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let (machines, mut three) = (machines(), Vec::new());
    for (name, label, w, m) in &machines {
        for run_s in [1e-3, 1e-2, 1e-1] {
            let p = three_seeds(m, w, run_s, Thresholds::default());
            let best = best_split(m, w, p[0].items);
            let alone = p[0].alone[CPU].min(p[0].alone[GPU]);
            let split = confirmed(m, w, p[0].items, best.share, SEEDS[0]);
            let (t_oracle, how) = t_oracle((split, best.share), alone);
            println!(
                "| {name} | {label} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms ({how}) | {:.3} | {:.3} |",
                p[0].run_s * 1e3,
                p[0].alone[CPU] * 1e3,
                p[0].alone[GPU] * 1e3,
                p[0].hybrid * 1e3,
                t_oracle * 1e3,
                p[0].vs_best(),
                t_oracle / p[0].hybrid,
            );
            let (vs_best, vs_oracle, vs_sweep) = means(m, w, &p, best);
            three.push((name, label, p[0].run_s, vs_best, vs_oracle, vs_sweep));
            assert!(
                vs_oracle >= 0.95,
                "{name} {label} at {run_s} s: T_oracle / T hybrid {vs_oracle:.3}, seeds {SEEDS:?} (modelled)"
            );
        }
    }
    println!(
        "\n| workload | machine | run (best alone) | hybrid / best alone | T_oracle / T hybrid | the sweep's least / T hybrid |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    for (name, label, run_s, vs_best, vs_oracle, vs_sweep) in three {
        println!(
            "| {name} | {label} | {:.3} ms | {vs_best:.3} | {vs_oracle:.3} | {vs_sweep:.3} |",
            run_s * 1e3,
        );
    }
}

/// kmeans on the lease's machine, whose GPU draws a slowdown each
/// co-executed run: hybrid beside the rules that send runs to one class
/// turned off (`hold_off(false)`; `single_class(false)`, every run
/// co-executes), each as hybrid over the best class alone and T_oracle
/// over its T, means of seeds 11, 13, 15. With its rules hybrid is within
/// 1% of the best class alone at 1, 10 and 100 ms; at 1 ms, where
/// co-executing loses, it is ahead of hybrid without the single-class
/// rule. Modelled.
/// `cargo test -p coexec-actors --release --lib vtime::oracle::kmeans_on_the_lease -- --nocapture`.
#[test]
fn kmeans_on_the_lease_s_machine_keeps_to_the_best_class_with_its_rules() {
    let cal = h100();
    let w = cal
        .workloads
        .iter()
        .find(|w| w.name == "kmeans")
        .expect("kmeans is calibrated");
    let m = Machine::fitted(w);
    println!("| run | rules | hybrid / best alone | T_oracle / T |");
    println!("| ---: | --- | ---: | ---: |");
    for run_s in [1e-3, 1e-2, 1e-1] {
        let variants = [
            ("default", Thresholds::default()),
            ("hold_off(false)", Thresholds::default().hold_off(false)),
            (
                "single_class(false)",
                Thresholds::default().single_class(false),
            ),
        ];
        let mut split = None;
        let mut vs = Vec::new();
        for (name, th) in variants {
            let p = three_seeds(&m, w, run_s, th);
            let split = *split.get_or_insert_with(|| best_split(&m, w, p[0].items));
            let (vs_best, vs_oracle, _) = means(&m, w, &p, split);
            println!(
                "| {:.0} ms | {name} | {vs_best:.3} | {vs_oracle:.3} |",
                run_s * 1e3
            );
            vs.push(vs_best);
        }
        assert!(
            vs[0] <= 1.01,
            "{run_s} s: hybrid {:.3}x the best class alone",
            vs[0]
        );
        if run_s == 1e-3 {
            assert!(
                vs[0] < vs[2],
                "1 ms: hybrid {:.3}x the best class alone, {:.3}x without the single-class rule",
                vs[0],
                vs[2]
            );
        }
    }
}
