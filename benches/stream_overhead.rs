//! The stream path's own cost per batch: from the batch closing to its outputs
//! handed to the callers' futures, minus the job's time (`Runtime::run_with`
//! from call to return). That is [`BatchTiming::overhead`]: dropping abandoned
//! and expired requests, `Model::build`, `Model::outputs`, and one send per
//! caller.
//!
//! Batches of 32 requests are sent at once (so each closes by size), one batch
//! at a time, on `cpu:2` and on `cpu:1,sim:1@0.5` (where the placer splits
//! or picks a class per batch); two models: `echo` (a kernel that copies its inputs:
//! the stream's bare cost) and the digits MLP (building the batch copies 32
//! rows, outputs copy 32 probability rows). Prints p50/p99 per model.
//!
//! ```text
//! cargo bench -p coexec --features workloads --bench stream_overhead
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coexec::Runtime;
use coexec::kernels::workloads::{LabeledRows, MlpWeights};
use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
use coexec::stream::{BatchTiming, MlpModel, Model, Stream, StreamConfig};

const BATCH: usize = 32;

struct Echo {
    x: Vec<u64>,
    out: DisjointBuf<u64>,
}

impl Kernel for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn items(&self) -> usize {
        self.x.len()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        let out = self.out.chunk_mut(chunk);
        out.copy_from_slice(&self.x[chunk.range()]);
        Ok(())
    }
}

struct EchoModel;

impl Model for EchoModel {
    type Input = u64;
    type Output = u64;
    type Kernel = Echo;
    fn build(&self, x: Vec<u64>) -> Result<Echo, KernelError> {
        let out = DisjointBuf::new(x.len(), 1);
        Ok(Echo { x, out })
    }
    fn outputs(&self, k: Echo) -> Result<Vec<u64>, KernelError> {
        Ok(k.out.into_vec())
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1e6
}

async fn measure<M: Model>(
    rt: Arc<Runtime>,
    name: &str,
    model: M,
    batches: usize,
    input: impl Fn(usize) -> M::Input,
) {
    let timings: Arc<Mutex<Vec<BatchTiming>>> = Arc::default();
    let t = timings.clone();
    let cfg = StreamConfig::new()
        .max_batch(BATCH)
        .max_wait(Duration::from_millis(50))
        .queue(BATCH)
        .in_flight(1)
        .on_batch(move |b| t.lock().expect("no panic holding it").push(*b));
    let stream = Stream::start(rt, model, cfg).expect("the stream starts");
    for b in 0..batches + batches / 10 {
        if b == batches / 10 {
            timings.lock().expect("no panic holding it").clear(); // warm-up done
        }
        let pending: Vec<_> = (0..BATCH)
            .map(|i| stream.try_infer(input(i)).expect("room for one batch"))
            .collect();
        for p in pending {
            p.await.expect("an output");
        }
    }
    stream.shutdown().await;
    let t = timings.lock().expect("no panic holding it").clone();
    assert!(t.iter().all(|b| b.size == BATCH), "batches close by size");
    let mut over: Vec<_> = t.iter().map(BatchTiming::overhead).collect();
    let mut prep: Vec<_> = t.iter().map(|b| b.prepare).collect();
    let mut deliver: Vec<_> = t.iter().map(|b| b.deliver).collect();
    let mut run: Vec<_> = t.iter().map(|b| b.run).collect();
    println!(
        "{name:<6} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
        t.len(),
        pct(&mut over, 0.5),
        pct(&mut over, 0.99),
        pct(&mut prep, 0.5),
        pct(&mut deliver, 0.5),
        pct(&mut run, 0.5),
        pct(&mut run, 0.99),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let w = Arc::new(MlpWeights::load(dir.join("digits_mlp.safetensors")).expect("the model"));
    let rows = LabeledRows::load(dir.join("digits_test.safetensors")).expect("the test split");
    // One class (the placer picks it), and two (the placer splits or picks).
    for devices in ["cpu:2", "cpu:1,sim:1@0.5"] {
        let rt = Arc::new(
            Runtime::builder()
                .devices(devices)
                .expect("a valid device spec")
                .in_memory_profiles()
                .build()
                .expect("the runtime starts"),
        );
        println!(
            "stream overhead per batch of {BATCH}, {devices}, µs (overhead = prepare + deliver)"
        );
        println!(
            "{:<6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "model", "batches", "ovh p50", "ovh p99", "prep p50", "dlv p50", "run p50", "run p99"
        );
        tokio.block_on(async {
            measure(rt.clone(), "echo", EchoModel, 2000, |i| i as u64).await;
            measure(rt.clone(), "mlp", MlpModel::new(w.clone()), 300, |i| {
                rows.x[i * rows.features..(i + 1) * rows.features].to_vec()
            })
            .await;
        });
    }
}
