//! Rodinia's kmeans on a real input, co-executed: an iterative job whose
//! runs the profiler learns from.
//!
//! `cargo run --release --example 03_kmeans -- ../shared/data/rodinia-kmeans/kdd_cup.xz`

use coexec::kernels::workloads::{KmeansConfig, KmeansData, KmeansJob};

#[tokio::main]
async fn main() -> Result<(), coexec::Error> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "../shared/data/rodinia-kmeans/100".into());
    let data = KmeansData::read(&path)?;
    let rt = coexec::Runtime::builder().start().await?;
    let (out, runs) = rt
        .drive(
            KmeansJob::new(data, KmeansConfig::default())?,
            Default::default(),
        )
        .await?;
    let t: f64 = runs.iter().map(|r| r.makespan_s).sum();
    println!("{} iterations in {t:.3}s of device time", out.iterations);
    for k in 0..out.clusters {
        println!("centre {k}: {:?}", &out.centre(k)[..4.min(out.features)]);
    }
    rt.shutdown().await;
    Ok(())
}
