//! Streaming inference: the committed digits model behind a batching stream.
//! Every test row is sent as its own request, all at once from concurrent
//! tasks; the stream batches them, each batch runs as one job on the CPU and a
//! simulated accelerator, and each request gets its own probabilities back.
//!
//! `cargo run --release --example 05_digits_stream`

use std::sync::Arc;
use std::time::{Duration, Instant};

use coexec::kernels::workloads::{LabeledRows, MlpWeights};
use coexec::stream::{MlpModel, Stream, StreamConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let weights = Arc::new(MlpWeights::load(dir.join("digits_mlp.safetensors"))?);
    let test = LabeledRows::load(dir.join("digits_test.safetensors"))?;
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1,sim:1@0.5")?
            .in_memory_profiles()
            .start()
            .await?,
    );
    let cfg = StreamConfig::new()
        .max_batch(32)
        .max_wait(Duration::from_millis(2))
        .queue(512);
    let stream = Stream::start(rt.clone(), MlpModel::new(weights), cfg)?;

    let start = Instant::now();
    let tasks: Vec<_> = test
        .x
        .chunks_exact(test.features)
        .map(|row| {
            let (s, row) = (stream.clone(), row.to_vec());
            tokio::spawn(async move {
                let t = Instant::now();
                s.infer(row).await.map(|c| (c.label, t.elapsed()))
            })
        })
        .collect();
    let (mut correct, mut latencies) = (0, Vec::new());
    for (t, &label) in tasks.into_iter().zip(&test.labels) {
        let (predicted, latency) = t.await??;
        correct += usize::from(predicted == label as usize);
        latencies.push(latency);
    }
    let wall = start.elapsed();
    stream.shutdown().await;
    // The stream has let go of the runtime; shutting it down waits for its
    // threads and saves its profile.
    Arc::try_unwrap(rt)
        .map_err(|_| "the runtime is still shared")?
        .shutdown()
        .await;
    latencies.sort_unstable();
    println!(
        "{correct}/{} correct ({:.4}); {} requests in {:.1} ms; latency p50 {:.1} ms, max {:.1} ms",
        test.rows(),
        correct as f64 / test.rows() as f64,
        test.rows(),
        wall.as_secs_f64() * 1e3,
        latencies[latencies.len() / 2].as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3,
    );
    Ok(())
}
