//! The embedding encoder's forward pass on one CPU thread, by sequence
//! length: batches of about 2048 tokens of sequences all `L` tokens long,
//! for L = 8 … 256 (`Encoder::run_cpu` over the whole batch, no
//! scheduler). criterion's throughput (elements/s) reads as
//! token-equivalents per second (`BertConfig::work`): flat across L if
//! the work model `L·(1 + L/(2H + I))` predicts the cost, where tokens/s
//! alone would fall with L as attention grows.
//!
//! Needs the model folder (`scripts/fetch_model.sh`; `COEXEC_EMBED_MODEL`
//! names another); without it the bench says so and measures nothing.
//!
//! ```text
//! cargo bench -p coexec --features embed --bench embed_forward
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coexec::kernels::{Kernel, with_chunk};
use coexec_models::encoder::{Encoder, EncoderWeights};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn forward(c: &mut Criterion) {
    let dir = std::env::var_os("COEXEC_EMBED_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/coexec/models/all-MiniLM-L6-v2"))
        })
        .filter(|d| d.join("model.safetensors").is_file());
    let Some(dir) = dir else {
        eprintln!("embed_forward: no model (scripts/fetch_model.sh fetches it); nothing measured");
        return;
    };
    let w = Arc::new(EncoderWeights::load(&dir).expect("the model"));
    let mut g = c.benchmark_group("embed_forward");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for len in [8usize, 16, 32, 64, 128, 256] {
        let n = (2048 / len).max(1);
        // [CLS] ids… [SEP]: any ids in the vocabulary cost the same.
        let seqs: Vec<Vec<u32>> = (0..n)
            .map(|s| {
                (0..len)
                    .map(|i| 1000 + ((s * 31 + i * 7) % 20000) as u32)
                    .collect()
            })
            .collect();
        let mut k = Encoder::new(w.clone(), seqs).expect("a batch");
        let items = k.items();
        g.throughput(Throughput::Elements(items as u64));
        g.bench_function(BenchmarkId::new("len", len), |b| {
            b.iter(|| with_chunk(&mut k, 0..items, |k, c| k.run_cpu(c)).expect("forward"))
        });
    }
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
