//! The rayon baseline (`coexec_kernels::baseline`) against the sequential driver,
//! and (ignored, release) the timings of the default-size jobs.

use std::time::Instant;

use coexec_kernels::baseline::run_rayon;
use coexec_kernels::workloads::{
    KmeansConfig, KmeansData, KmeansJob, MatmulJob, MatmulProblem, NbodyJob, NbodyProblem, OneShot,
    PathfinderJob, PathfinderProblem, run_sequential,
};
use coexec_kernels::{KernelError, Synthetic};

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
}

#[test]
fn rayon_matches_sequential_bit_for_bit() -> Result<(), KernelError> {
    let pool = pool(3);
    let p = MatmulProblem::new(50, 16)?;
    let (a, b) = (
        run_sequential(MatmulJob::new(p)?)?,
        run_rayon(&pool, MatmulJob::new(p)?)?,
    );
    assert!(
        a.c.iter()
            .zip(&b.c)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );

    let p = PathfinderProblem::new(20_000, 50)?.with_pyramid(7)?;
    let (a, b) = (
        run_sequential(PathfinderJob::new(p)?)?,
        run_rayon(&pool, PathfinderJob::new(p)?)?,
    );
    assert_eq!(a.row, b.row);

    let p = NbodyProblem::new(300, 2)?;
    let (a, b) = (
        run_sequential(NbodyJob::new(p)?)?,
        run_rayon(&pool, NbodyJob::new(p)?)?,
    );
    assert_eq!(a.bodies, b.bodies);

    let values: Vec<f32> = (0..40_000u32)
        .map(|i| ((i * 7919) % 1000) as f32 / 10.0)
        .collect();
    let d = std::sync::Arc::new(KmeansData::from_values(10_000, 4, values)?);
    let cfg = KmeansConfig::new(6, 0.001)?.with_block(256)?;
    let a = run_sequential(KmeansJob::new(d.clone(), cfg)?)?;
    let b = run_rayon(&pool, KmeansJob::new(d, cfg)?)?;
    assert_eq!((a.iterations, &a.membership), (b.iterations, &b.membership));
    assert_eq!(a.centres, b.centres);

    let mut k = run_rayon(&pool, OneShot::new(Synthetic::new(10_000, 3)))?.expect("absorbed");
    k.verify()
        .map_err(|e| KernelError::invalid("synthetic", e))?;
    Ok(())
}

/// CPU seconds this process has used (Linux `/proc/self/stat`, 100 Hz ticks;
/// 0 elsewhere), to read timings taken on a loaded machine.
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
    eprintln!(
        "{what}: {:.3} s wall, {:.2} s CPU",
        t.elapsed().as_secs_f64(),
        cpu_seconds() - c
    );
    Ok(out)
}

/// Times of candidate default sizes, sequential and rayon with 2 threads
/// (`cargo test --release -p coexec-kernels --features workloads --test rayon_baseline -- --ignored --nocapture`).
#[test]
#[ignore = "timing: run in release with --ignored --nocapture"]
fn default_size_timings() -> Result<(), KernelError> {
    let pool = pool(2);
    let mm = MatmulProblem::new(10_000, MatmulProblem::DEFAULT_DIM)?;
    let job = time("matmul 10000×100² setup", || MatmulJob::new(mm))?;
    time("matmul 10000×100² sequential", || run_sequential(job))?;
    let job = MatmulJob::new(mm)?;
    time("matmul 10000×100² rayon(2)", || run_rayon(&pool, job))?;
    eprintln!("  ({:.1} GFLOP per job)", mm.flops() / 1e9);

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

/// kmeans on `kdd_cup` sequential and with rayon at 2 threads.
#[test]
#[ignore = "timing: needs the Rodinia data; run in release with --ignored --nocapture"]
fn kmeans_kdd_cup_timings() -> Result<(), KernelError> {
    let dir = std::env::var_os("COEXEC_KMEANS_DATA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/data/rodinia-kmeans"
            )
            .into()
        });
    for file in ["kdd_cup.xz", "819200.txt.xz", "204800.txt.xz"] {
        let d = std::sync::Arc::new(time(&format!("{file} load"), || {
            KmeansData::read(dir.join(file))
        })?);
        let seq = time(&format!("{file} kmeans sequential"), || {
            run_sequential(KmeansJob::new(d.clone(), KmeansConfig::default())?)
        })?;
        let pool = pool(2);
        let par = time(&format!("{file} kmeans rayon(2)"), || {
            run_rayon(&pool, KmeansJob::new(d.clone(), KmeansConfig::default())?)
        })?;
        assert_eq!(seq.centres, par.centres);
        eprintln!("  {} iterations; centres:", seq.iterations);
        for k in 0..seq.clusters {
            eprintln!("  {k}: {:?}", seq.centre(k));
        }
    }
    Ok(())
}
