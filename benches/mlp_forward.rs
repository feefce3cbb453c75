//! The digits model's forward pass on one CPU thread: time per row for
//! batches of 1, 4, 7, 8, 32, 128 and 512 rows (below 8 rows a layer is one
//! matrix-vector product per row, from 8 a packed GEMM) (`Mlp::run_cpu` over the whole batch,
//! no scheduler). criterion's throughput line (elements/s) reads as rows per
//! second; µs per row is its inverse.
//!
//! ```text
//! cargo bench -p coexec --features workloads --bench mlp_forward
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coexec::kernels::workloads::{LabeledRows, Mlp, MlpWeights};
use coexec::kernels::{Kernel, with_chunk};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn forward(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let w = Arc::new(MlpWeights::load(dir.join("digits_mlp.safetensors")).expect("the model"));
    let t = LabeledRows::load(dir.join("digits_test.safetensors")).expect("the test split");
    let widths: Vec<String> = w.widths().iter().map(usize::to_string).collect();
    let mut g = c.benchmark_group(format!("mlp_forward/{}", widths.join("x")));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for rows in [1usize, 4, 7, 8, 32, 128, 512] {
        // The test rows, repeated to fill the batch.
        let x: Vec<f32> =
            t.x.iter()
                .copied()
                .cycle()
                .take(rows * t.features)
                .collect();
        let mut k = Mlp::new(w.clone(), x).expect("a whole number of rows");
        g.throughput(Throughput::Elements(rows as u64));
        g.bench_function(BenchmarkId::new("rows", rows), |b| {
            // A claim of the whole batch, as the runtime would give one worker.
            b.iter(|| with_chunk(&mut k, 0..rows, |k, c| k.run_cpu(c)).expect("forward"))
        });
    }
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
