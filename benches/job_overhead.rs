//! A job's fixed cost, beside what the machine's threads cost: the time from
//! `run` to its answer for an empty job and for small jobs of busy work, next
//! to a round trip to a sleeping `std::thread`, a `rayon::join` on a pool of
//! as many threads, and the same small jobs on that pool.
//!
//! Each case is sampled `SAMPLES` times, the cases interleaved sample by
//! sample (so drift on a shared machine falls on all of them alike), in two
//! paces: back to back (threads still awake from the last sample) and
//! spaced by `GAP` (every thread has gone to sleep: the wake is paid). It
//! prints p50, p99 and max per case, and for the small jobs the median of
//! the paired ratios coexec / rayon with its 95% interval (order
//! statistics of the pairs: no distribution assumed).
//!
//! ```text
//! cargo bench -p coexec --features workloads --bench job_overhead            # cpu:2
//! COEXEC_BENCH_WORKERS=4 COEXEC_BENCH_SAMPLES=4000 cargo bench -p coexec --features workloads --bench job_overhead
//! ```

use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use coexec::kernels::workloads::{Empty, Synthetic, busy_ns_per_round};
use coexec::{JobOptions, Runtime};
use coexec_kernels::baseline::run_step_rayon;

/// The pause between samples of the spaced pace: longer than any pool's
/// spin before it sleeps (rayon's and coexec's are tens of microseconds).
const GAP: Duration = Duration::from_millis(2);

/// Items of a small job: enough that both pools cut it into chunks per
/// thread.
const SMALL_ITEMS: usize = 64;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A thread that answers each message it is sent: the cost of waking a
/// sleeping thread and being woken back.
struct Echo {
    to: mpsc::Sender<u64>,
    from: mpsc::Receiver<u64>,
}

impl Echo {
    fn start() -> Self {
        let (to, rx) = mpsc::channel::<u64>();
        let (tx, from) = mpsc::channel();
        std::thread::spawn(move || {
            for v in rx {
                if tx.send(v + 1).is_err() {
                    break;
                }
            }
        });
        Self { to, from }
    }

    fn round_trip(&self, v: u64) -> u64 {
        self.to.send(v).expect("the echo thread lives");
        self.from.recv().expect("the echo thread answers")
    }
}

/// One case's samples, in seconds.
#[derive(Default)]
struct Samples {
    name: String,
    s: Vec<f64>,
}

impl Samples {
    fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            s: Vec::new(),
        }
    }

    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.s.push(t.elapsed().as_secs_f64());
        out
    }

    fn quantile(&self, q: f64) -> f64 {
        quantile(&self.s, q)
    }
}

fn quantile(s: &[f64], q: f64) -> f64 {
    let mut v = s.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The median of `r` and its 95% distribution-free interval: the order
/// statistics `n/2 ∓ 0.98·√n`.
fn median_interval(r: &[f64]) -> (f64, f64, f64) {
    let mut v = r.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let half = 0.98 * (n as f64).sqrt();
    let lo = ((n as f64 / 2.0 - half).floor().max(0.0)) as usize;
    let hi = ((n as f64 / 2.0 + half).ceil() as usize).min(n - 1);
    (quantile(&v, 0.5), v[lo], v[hi])
}

fn us(s: f64) -> String {
    format!("{:.1}", s * 1e6)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workers = env("COEXEC_BENCH_WORKERS", 2);
    let samples = env("COEXEC_BENCH_SAMPLES", 2000);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rt = Runtime::builder()
        .devices(&format!("cpu:{workers}"))?
        .in_memory_profiles()
        .build()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .build()?;
    let echo = Echo::start();
    // Small jobs of about 10 µs, 100 µs and 1 ms of one core's busy work.
    let ns_round = busy_ns_per_round();
    let small: Vec<(String, u32)> = [10e3, 100e3, 1e6]
        .iter()
        .map(|&ns| {
            let work = (ns / (SMALL_ITEMS as f64 * ns_round)).round().max(1.0) as u32;
            let label = if ns < 1e6 {
                format!("{:.0} µs", ns / 1e3)
            } else {
                format!("{:.0} ms", ns / 1e6)
            };
            (label, work)
        })
        .collect();
    let opts = JobOptions::new();
    // Runs that ran on the submitting thread (`RunReport::inline`).
    let inline = std::cell::Cell::new(0usize);
    let coexec_job = |k: Synthetic| {
        let done = tokio.block_on(rt.run_with(k, opts.clone())).expect("runs");
        inline.set(inline.get() + done.report.inline as usize);
        black_box(done.report.items)
    };
    let empty_job = || {
        let done = tokio.block_on(rt.run(Empty::new(1))).expect("runs");
        inline.set(inline.get() + done.report.inline as usize);
    };
    let rayon_job = |mut k: Synthetic| {
        run_step_rayon(&pool, &mut k).expect("runs");
        black_box(k.work())
    };
    // Warm-up: the profiler learns the small kernels, the pools start.
    for _ in 0..200 {
        empty_job();
        for (_, work) in &small {
            coexec_job(Synthetic::new(SMALL_ITEMS, *work));
            rayon_job(Synthetic::new(SMALL_ITEMS, *work));
        }
    }
    println!(
        "job_overhead: cpu:{workers}, {samples} samples per case, {:.2} ns per busy round",
        ns_round
    );
    for (pace, gap) in [("back to back", None), ("spaced by 2 ms", Some(GAP))] {
        inline.set(0);
        let mut thread = Samples::named("std::thread round trip");
        let mut join = Samples::named("rayon::join (pool.install)");
        let mut empty = Samples::named("coexec empty job (1 item)");
        let mut pairs: Vec<(Samples, Samples)> = small
            .iter()
            .map(|(l, _)| {
                (
                    Samples::named(format!("coexec {l} job")),
                    Samples::named(format!("rayon {l} job")),
                )
            })
            .collect();
        for i in 0..samples {
            let pause = || {
                if let Some(g) = gap {
                    std::thread::sleep(g);
                }
            };
            pause();
            thread.time(|| echo.round_trip(i as u64));
            pause();
            join.time(|| pool.install(|| rayon::join(|| black_box(1), || black_box(2))));
            pause();
            empty.time(empty_job);
            for ((c, r), (_, work)) in pairs.iter_mut().zip(&small) {
                // Built outside the timing: each side times its run alone.
                let (kc, kr) = (
                    Synthetic::new(SMALL_ITEMS, *work),
                    Synthetic::new(SMALL_ITEMS, *work),
                );
                // Alternate which goes first.
                if i % 2 == 0 {
                    pause();
                    c.time(|| coexec_job(kc));
                    pause();
                    r.time(|| rayon_job(kr));
                } else {
                    pause();
                    r.time(|| rayon_job(kr));
                    pause();
                    c.time(|| coexec_job(kc));
                }
            }
        }
        println!(
            "\n{pace} ({} of {} coexec jobs ran inline)",
            inline.get(),
            samples * (1 + small.len())
        );
        println!("| case | p50 µs | p99 µs | max µs |\n|---|---:|---:|---:|");
        let all = [&thread, &join, &empty]
            .into_iter()
            .chain(pairs.iter().flat_map(|(c, r)| [c, r]));
        for s in all {
            println!(
                "| {} | {} | {} | {} |",
                s.name,
                us(s.quantile(0.5)),
                us(s.quantile(0.99)),
                us(s.quantile(1.0))
            );
        }
        for ((c, r), (l, _)) in pairs.iter().zip(&small) {
            let ratios: Vec<f64> = c.s.iter().zip(&r.s).map(|(a, b)| a / b).collect();
            let (m, lo, hi) = median_interval(&ratios);
            println!("coexec / rayon, {l} jobs: {m:.2} [{lo:.2}, {hi:.2}]");
        }
    }
    tokio.block_on(rt.shutdown());
    Ok(())
}
