//! The rayon baseline (`coexec_kernels::baseline`) against the sequential
//! driver, bit for bit. Its timings are a bench (`benches/rayon_baseline.rs`).

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
