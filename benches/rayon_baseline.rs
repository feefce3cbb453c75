//! The rayon baseline's timings (`coexec_kernels::baseline`): the
//! candidate default-size jobs sequential and on a rayon pool of 2 threads,
//! and kmeans on Rodinia's real inputs. It prints wall and CPU seconds (the
//! process's, to read timings taken on a loaded machine); that the baseline
//! computes what the sequential driver does is a test
//! (`kernels/tests/kernels/rayon_baseline.rs`).
//!
//! ```text
//! cargo bench -p coexec-kernels --features workloads --bench rayon_baseline             # default sizes
//! cargo bench -p coexec-kernels --features workloads --bench rayon_baseline -- kmeans   # Rodinia's kmeans inputs
//! ```
//!
//! The kmeans inputs are `../shared/data/rodinia-kmeans` (or
//! `COEXEC_KMEANS_DATA`); without them it fails naming the file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use coexec_kernels::KernelError;
use coexec_kernels::baseline::run_rayon;
use coexec_kernels::workloads::{
    KmeansConfig, KmeansData, KmeansJob, MatmulJob, MatmulProblem, NbodyJob, NbodyProblem,
    PathfinderJob, PathfinderProblem, run_sequential,
};

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
}

/// CPU seconds this process has used (Linux `/proc/self/stat`, 100 Hz ticks;
/// 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |x| x.1);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 of the file (utime, stime) are 11 and 12 after the name.
    f.get(11)
        .zip(f.get(12))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

fn time<T>(what: &str, f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
    let (t, c) = (Instant::now(), cpu_seconds());
    let out = f()?;
    println!(
        "{what}: {:.3} s wall, {:.2} s CPU",
        t.elapsed().as_secs_f64(),
        cpu_seconds() - c
    );
    Ok(out)
}

/// Times of candidate default sizes, sequential and rayon with 2 threads.
fn default_sizes() -> Result<(), KernelError> {
    let pool = pool(2);
    let mm = MatmulProblem::new(10_000, MatmulProblem::DEFAULT_DIM)?;
    let job = time("matmul 10000×100² setup", || MatmulJob::new(mm))?;
    time("matmul 10000×100² sequential", || run_sequential(job))?;
    let job = MatmulJob::new(mm)?;
    time("matmul 10000×100² rayon(2)", || run_rayon(&pool, job))?;
    println!("  ({:.1} GFLOP per job)", mm.flops() / 1e9);

    let pf = PathfinderProblem::new(1_000_000, 1000)?;
    let job = time("pathfinder 1e6×1000 setup (glibc rand)", || {
        PathfinderJob::new(pf)
    })?;
    time("pathfinder 1e6×1000 sequential", || run_sequential(job))?;
    let job = PathfinderJob::new(pf)?;
    time("pathfinder 1e6×1000 rayon(2)", || run_rayon(&pool, job))?;

    let nb = NbodyProblem::new(16_384, 10)?;
    let job = NbodyJob::new(nb)?;
    time("nbody 16384×10 sequential", || run_sequential(job))?;
    let job = NbodyJob::new(nb)?;
    time("nbody 16384×10 rayon(2)", || run_rayon(&pool, job))?;
    Ok(())
}

/// kmeans on Rodinia's `kdd_cup`, `819200` and `204800` inputs, sequential
/// and with rayon at 2 threads, and the centres they agree on.
fn kmeans() -> Result<(), KernelError> {
    let dir = std::env::var_os("COEXEC_KMEANS_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/data/rodinia-kmeans"
            )
            .into()
        });
    let pool = pool(2);
    for file in ["kdd_cup.xz", "819200.txt.xz", "204800.txt.xz"] {
        let d = Arc::new(time(&format!("{file} load"), || {
            KmeansData::read(dir.join(file))
        })?);
        let seq = time(&format!("{file} kmeans sequential"), || {
            run_sequential(KmeansJob::new(d.clone(), KmeansConfig::default())?)
        })?;
        let par = time(&format!("{file} kmeans rayon(2)"), || {
            run_rayon(&pool, KmeansJob::new(d.clone(), KmeansConfig::default())?)
        })?;
        if seq.centres != par.centres {
            return Err(KernelError::invalid(
                "rayon baseline",
                format!("{file}: rayon's centres differ from the sequential driver's"),
            ));
        }
        println!("  {} iterations; centres:", seq.iterations);
        for k in 0..seq.clusters {
            println!("  {k}: {:?}", seq.centre(k));
        }
    }
    Ok(())
}

fn main() -> Result<(), KernelError> {
    // `cargo bench` passes `--bench`; a word picks the table.
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    match which.first().map(String::as_str) {
        None | Some("default") => default_sizes(),
        Some("kmeans") => kmeans(),
        Some(other) => {
            eprintln!("rayon_baseline: {other:?}; expected `default` or `kmeans`");
            std::process::exit(2);
        }
    }
}
