//! The scheduler on a machine whose classes share a host memory bus (the
//! H200's pathfinder, [`h200_pathfinder`]), where co-executing loses to
//! the GPU alone at most lengths while the speed models, learned from
//! co-executed runs, hold the contended speeds. Every figure here is
//! modelled.
#![cfg(test)]

use super::*;

/// The H200 pathfinder machine: each class alone fitted to the lease's
/// times, then the bus.
pub(super) fn h200() -> (Workload, Machine) {
    let (w, bus) = h200_pathfinder();
    let mut m = Machine::fitted(&w);
    m.bus = Some(bus);
    (w, m)
}

/// Per-run lengths of the best class alone: 1 ms to 1 s, two a decade.
fn run_lengths() -> Vec<f64> {
    (0..7).map(|i| 1e-3 * 10f64.powf(i as f64 / 2.0)).collect()
}

/// One job length: the items of a run of about `run_s` on the GPU alone,
/// the GPU alone's mean run (a warm series of `runs` runs), and hybrid's
/// runs from cold, each of its makespans.
struct Point {
    items: usize,
    gpu_alone: f64,
    hybrid: Vec<f64>,
    coexecuted: Vec<bool>,
}

impl Point {
    /// Hybrid's mean run from the second on, over the GPU alone's.
    fn after_first(&self) -> f64 {
        let rest = &self.hybrid[1..];
        rest.iter().sum::<f64>() / rest.len() as f64 / self.gpu_alone
    }
}

/// Class `c` alone on `items`, warm (three runs learn first): its mean run
/// over `runs` runs, and the first of their reports.
fn alone(
    w: &Workload,
    m: &Machine,
    c: usize,
    items: usize,
    runs: usize,
    seed: u64,
) -> (f64, RunReport) {
    let mut s = Series::new(&w.name, seed);
    let opts = JobOptions::new().classes([c]);
    m.job(&mut s, &opts, items, 3); // learn
    let (t, mut reports) = m.job(&mut s, &opts, items, runs);
    (t / runs as f64, reports.swap_remove(0))
}

fn point(w: &Workload, m: &Machine, run_s: f64, runs: usize, seed: u64, th: Thresholds) -> Point {
    let per_run = w.measured.t_gpu_s / w.runs as f64;
    let items = ((w.items as f64 * run_s / per_run).round() as usize).max(1);
    let (gpu_alone, _) = alone(w, m, GPU, items, runs, seed);
    let mut s = Series::new(&w.name, seed + 1);
    s.thresholds = th;
    let (_, reports) = m.job(&mut s, &JobOptions::new(), items, runs);
    Point {
        items,
        gpu_alone,
        hybrid: reports.iter().map(|r| r.makespan_s).collect(),
        coexecuted: reports.iter().map(coexecuted).collect(),
    }
}

/// The bus slows the classes only while both draw from it: each class
/// alone takes the same time with it as without, and a fixed split that
/// keeps both busy takes longer with it.
#[test]
fn the_bus_slows_only_what_runs_beside_the_other_class() {
    let (w, m) = h200();
    let mut free = m.clone();
    free.bus = None;
    let job = |m: &Machine, opts: &JobOptions| {
        let mut s = Series::new(&w.name, 3);
        m.job(&mut s, opts, w.items, w.runs).0
    };
    for c in [CPU, GPU] {
        let opts = JobOptions::new().classes([c]);
        assert_eq!(job(&m, &opts), job(&free, &opts), "class {c} alone");
    }
    let split: Arc<dyn Policy> = Arc::new(Split(0.3));
    let opts = JobOptions::new().policy(split);
    let (with, without) = (job(&m, &opts), job(&free, &opts));
    assert!(
        with > 1.1 * without,
        "a 30/70 split: {with:.4} s with the bus, {without:.4} s without (modelled)"
    );
}

/// On the shared bus, hybrid keeps up with the GPU alone from its second
/// run on at every length from 1 ms to 1 s (mean of runs 2 to 200 within
/// 1/0.99 of the GPU alone's mean run, over three seeds: one seed's mean
/// moves by ±0.004 from seed to seed): the first warm run co-executes and
/// keeps to its models, the next measures the GPU alone, the co-executed
/// run after it is judged against that and loses, and the runs after it
/// keep to the GPU. Without the rule (models
/// learned while co-executing hold the contended speeds) it stays behind.
/// All modelled.
#[test]
fn hybrid_keeps_up_with_the_gpu_alone_on_a_shared_bus() {
    let (w, m) = h200();
    for run_s in run_lengths() {
        let p: Vec<Point> = (7..10)
            .map(|seed| point(&w, &m, run_s, 200, seed, Thresholds::default()))
            .collect();
        let mean = p.iter().map(Point::after_first).sum::<f64>() / p.len() as f64;
        assert!(
            mean <= 1.0 / 0.99,
            "GPU alone {:.3} ms: hybrid's runs 2.. take {mean:.4}x its time (modelled)",
            p[0].gpu_alone * 1e3,
        );
    }
    let q = point(&w, &m, 0.1, 100, 7, Thresholds::default().hold_off(false));
    assert!(
        q.after_first() > 1.1,
        "without the rule: {:.4}x (modelled)",
        q.after_first()
    );
}

/// Per length, one seed (7), 200 runs from cold: with the hold-off,
/// hybrid's runs 2.. keep within 2% of the GPU alone and at most 5 of them
/// co-execute (the first warm one, then trials); without it, every run
/// co-executes and loses 15% or more. The table (for
/// `docs/results/vtime-h200-pathfinder-bus.md`): the GPU alone's run,
/// hybrid's first run and its mean from the second on, with and without
/// the hold-off, and how many runs co-executed. Modelled.
/// `cargo test -p coexec-actors --release --lib vtime::contention::the_hold_off -- --nocapture`.
#[test]
fn the_hold_off_keeps_hybrid_to_the_gpu_alone_at_every_length() {
    let (w, m) = h200();
    println!(
        "| run (GPU alone) | items | hybrid's time / the GPU alone's: run 1 | runs 2.. (mean) | co-executed of 2.. | without the hold-off: runs 2.. | co-executed |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for run_s in run_lengths() {
        let runs = 200;
        let p = point(&w, &m, run_s, runs, 7, Thresholds::default());
        let q = point(
            &w,
            &m,
            run_s,
            runs,
            7,
            Thresholds::default().hold_off(false),
        );
        let co = |x: &Point| x.coexecuted[1..].iter().filter(|&&c| c).count();
        println!(
            "| {:.3} ms | {} | {:.3} | {:.4} | {} | {:.4} | {} |",
            p.gpu_alone * 1e3,
            p.items,
            p.hybrid[0] / p.gpu_alone,
            p.after_first(),
            co(&p),
            q.after_first(),
            co(&q),
        );
        let at = format!("GPU alone {:.3} ms (modelled)", p.gpu_alone * 1e3);
        assert!(
            p.after_first() <= 1.02 && co(&p) <= 5,
            "{at}: with the hold-off, runs 2.. take {:.4}x the GPU alone, {} co-executed",
            p.after_first(),
            co(&p)
        );
        assert!(
            q.after_first() >= 1.15 && co(&q) == runs - 1,
            "{at}: without it, runs 2.. take {:.4}x, {} of {} co-executed",
            q.after_first(),
            co(&q),
            runs - 1
        );
    }
}

/// The bus's calibration: hybrid's warm job without the hold-off takes
/// longer the more the bus slows either class, and at the pair
/// [`h200_pathfinder`] takes (CPU 1.16, GPU 3.5) within 5% of the lease's
/// hybrid, 0.0403 s. Printed per pair of slowdowns: the modelled GPU alone,
/// the best fixed split (CPU 5% to 60%) and hybrid, with its CPU share.
/// Modelled.
/// `cargo test -p coexec-actors --release --lib vtime::contention::the_bus_calibration -- --nocapture`.
#[test]
fn the_bus_calibration_gives_hybrid_the_lease_s_time() {
    let (w, mut m) = h200();
    let chosen = m.bus.as_ref().map(|b| (b.cpu_slow, b.gpu_slow));
    let cpu_slows = [1.0, 1.16, 1.3];
    let gpu_slows = [1.9, 3.0, 3.5, 5.0];
    let mut grid = [[0.0; 4]; 3];
    for (i, cpu_slow) in cpu_slows.into_iter().enumerate() {
        for (j, gpu_slow) in gpu_slows.into_iter().enumerate() {
            m.bus = Some(Bus { cpu_slow, gpu_slow });
            let mut s = Series::new(&w.name, 3);
            let (gpu, _) = m.job(&mut s, &JobOptions::new().classes([GPU]), w.items, w.runs);
            let (best, share) = (1..=12)
                .map(|k| {
                    let policy: Arc<dyn Policy> = Arc::new(Split(0.05 * k as f64));
                    let mut s = Series::new(&w.name, 3);
                    let t = m
                        .job(&mut s, &JobOptions::new().policy(policy), w.items, w.runs)
                        .0;
                    (t, 0.05 * k as f64)
                })
                .fold((f64::INFINITY, 0.0), |a, b| if b.0 < a.0 { b } else { a });
            let mut s = Series::new(&w.name, 3);
            s.thresholds = Thresholds::default().hold_off(false);
            m.job(&mut s, &JobOptions::new(), w.items, w.runs);
            let (hybrid, reports) = m.job(&mut s, &JobOptions::new(), w.items, w.runs);
            let cpu: usize = reports.iter().map(|r| r.classes[CPU].items).sum();
            let all: usize = reports.iter().map(|r| r.items).sum();
            println!(
                "cpu {cpu_slow} gpu {gpu_slow}: GPU alone {gpu:.4} s, best split {best:.4} s (CPU {:.0}%), hybrid {hybrid:.4} s (CPU {:.1}%)",
                100.0 * share,
                100.0 * cpu as f64 / all as f64
            );
            grid[i][j] = hybrid;
            if chosen == Some((cpu_slow, gpu_slow)) {
                let lease = w.measured.policies_s["hybrid"];
                assert!(
                    (hybrid / lease - 1.0).abs() <= 0.05,
                    "cpu {cpu_slow} gpu {gpu_slow}: hybrid {hybrid:.4} s, the lease's {lease:.4} s"
                );
            }
        }
    }
    for i in 0..3 {
        for j in 0..4 {
            assert!(
                (j == 0 || grid[i][j - 1] < grid[i][j]) && (i == 0 || grid[i - 1][j] < grid[i][j]),
                "hybrid does not grow with the slowdowns: {grid:?}"
            );
        }
    }
    assert!(
        chosen.is_some_and(|c| cpu_slows.contains(&c.0) && gpu_slows.contains(&c.1)),
        "the chosen bus {chosen:?} is on the grid"
    );
}

/// Near 1 ms of the GPU alone, at `items`: hybrid's runs 2 to 100 (from
/// cold, noise from `seed`) and how many co-executed; each class alone
/// (warm, the mean of 100 runs) and a GPU-alone run's chunks.
struct Near {
    hybrid: f64,
    coexecuted: usize,
    gpu: f64,
    cpu: f64,
    gpu_chunks: usize,
}

impl Near {
    fn at(w: &Workload, m: &Machine, items: usize, seed: u64) -> Self {
        let mut s = Series::new(&w.name, seed);
        let (_, reports) = m.job(&mut s, &JobOptions::new(), items, 100);
        let rest = &reports[1..];
        let (gpu, first) = alone(w, m, GPU, items, 100, seed + 1);
        let (cpu, _) = alone(w, m, CPU, items, 100, seed + 1);
        Self {
            hybrid: rest.iter().map(|r| r.makespan_s).sum::<f64>() / rest.len() as f64,
            coexecuted: rest.iter().filter(|r| coexecuted(r)).count(),
            gpu,
            cpu,
            gpu_chunks: first.classes[GPU].chunks,
        }
    }

    /// Hybrid's mean run over the better class alone's.
    fn vs_best(&self) -> f64 {
        self.hybrid / self.gpu.min(self.cpu)
    }
}

/// Item counts from 0.8 to 1.55 million: the GPU alone between about 0.6
/// and 1 ms.
fn near_items() -> impl Iterator<Item = usize> {
    (0..16).map(|k| 800_000 + k * 50_000)
}

/// Near a millisecond, where the GPU alone is cut into few chunks or
/// many by what its model knows of a chunk's fixed cost, hybrid keeps up
/// with it from its second run on (all modelled): at every item count,
/// its mean run over three seeds within 1/0.99 of the better class
/// alone's. (One seed's mean of 99 runs is off by up to 0.5% either way.)
/// A device's streams alone take one static chunk each (and no tail of
/// chunks under their latency floor), and its model learns the fixed cost
/// from chunks of spread sizes (a run alone's equal chunks keep the one it
/// had); without either, a
/// GPU alone was cut into up to 11 chunks, took up to 1.37 times as long,
/// and hybrid co-executed against that and lost (1.164 times the GPU alone
/// at one million items).
#[test]
fn hybrid_keeps_up_with_the_gpu_alone_near_a_millisecond() {
    let (w, m) = h200();
    for items in near_items() {
        let p: Vec<Near> = [8, 18, 28].map(|seed| Near::at(&w, &m, items, seed)).into();
        let hybrid: f64 = p.iter().map(|p| p.hybrid).sum();
        let best: f64 = p.iter().map(|p| p.gpu.min(p.cpu)).sum();
        assert!(
            hybrid / best <= 1.0 / 0.99,
            "{items} items: hybrid's runs 2.. take {:.4}x the better class alone (GPU chunks {:?}; modelled)",
            hybrid / best,
            p.iter().map(|p| p.gpu_chunks).collect::<Vec<_>>()
        );
    }
}

/// [`hybrid_keeps_up_with_the_gpu_alone_near_a_millisecond`] for one seed
/// (7), item by item: the GPU alone takes one chunk per stream, and
/// hybrid's runs 2.. keep within 2% of the better class alone, at most 5
/// of them co-executed. Its table is the one of
/// `docs/results/vtime-h200-pathfinder-bus.md`; all modelled.
/// `cargo test -p coexec-actors --release --lib vtime::contention::near_a_millisecond -- --nocapture`.
#[test]
fn near_a_millisecond_the_gpu_alone_is_one_chunk_a_stream() {
    let (w, m) = h200();
    println!(
        "| items | GPU alone | its chunks | CPU alone | hybrid's runs 2.. / the better | co-executed of 2.. |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for items in near_items() {
        let p = Near::at(&w, &m, items, 7);
        println!(
            "| {items} | {:.3} ms | {} | {:.3} ms | {:.3} | {} |",
            p.gpu * 1e3,
            p.gpu_chunks,
            p.cpu * 1e3,
            p.vs_best(),
            p.coexecuted
        );
        assert_eq!(
            p.gpu_chunks, m.gpu.streams,
            "{items} items: the GPU alone's chunks"
        );
        assert!(
            p.vs_best() <= 1.02 && p.coexecuted <= 5,
            "{items} items: hybrid's runs 2.. {:.4}x the better class alone, {} co-executed (modelled)",
            p.vs_best(),
            p.coexecuted
        );
    }
}
