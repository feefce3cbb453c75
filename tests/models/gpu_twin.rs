//! The encoder's GPU twin against its CPU pass, through the runtime: the
//! same batches on `cuda:0` (two streams, uneven chunks from the split) and
//! on the CPUs, each vector within cosine 0.99999 of the CPU's (the fp64
//! reference's bound for the CPU pass). One batch of lengths 1 to the
//! model's limit (attention groups of every shape, padded rows, a piece
//! boundary) and one of many short sequences.
//!
//! Needs a CUDA GPU and all-MiniLM-L6-v2 (`COEXEC_EMBED_MODEL`, else
//! `scripts/fetch_model.sh`'s cache): `cargo test --release -p coexec-models
//! --test gpu_twin -- --include-ignored`.

use std::path::PathBuf;
use std::sync::Arc;

use coexec::JobOptions;
use coexec_models::encoder::{Encoder, EncoderWeights};

fn model_dir() -> PathBuf {
    std::env::var_os("COEXEC_EMBED_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/coexec/models/all-MiniLM-L6-v2"))
        })
        .filter(|d| d.join("model.safetensors").is_file())
        .expect("the model: set COEXEC_EMBED_MODEL or run scripts/fetch_model.sh")
}

/// Batches of random ids (`[CLS] … [SEP]`) from a fixed generator.
fn batches(vocab: usize, longest: usize) -> Vec<(&'static str, Vec<Vec<u32>>)> {
    let mut z = 0x9e37_79b9u64;
    let mut next = |n: usize| {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (z >> 33) as usize % n
    };
    let mut seq = |len: usize| -> Vec<u32> {
        let mut s: Vec<u32> = (0..len).map(|_| 1000 + next(vocab - 1000) as u32).collect();
        (s[0], s[len - 1]) = (101, 102);
        s
    };
    let mut wide: Vec<Vec<u32>> = [1, 2, 3, 7, 31, 32, 33, 40, 41, 64, 100, 129, 200]
        .into_iter()
        .chain([longest - 1, longest, longest])
        .map(&mut seq)
        .collect();
    // 100 more of the longest: the GPU's share then passes one piece.
    wide.extend((0..100).map(|_| seq(longest)));
    let short = (0..300).map(|i| seq(2 + i % 14)).collect();
    vec![("lengths 1 to the limit", wide), ("300 short", short)]
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU and the model: run with --include-ignored where both are present"]
async fn the_gpu_twin_matches_the_cpu_pass() -> Result<(), Box<dyn std::error::Error>> {
    let weights = Arc::new(EncoderWeights::load(model_dir())?);
    let c = weights.config().clone();
    let cpu = coexec::Runtime::builder()
        .devices("cpu:2")?
        .in_memory_profiles()
        .start()
        .await?;
    let gpu = coexec::Runtime::builder()
        .devices("cuda:0x2")?
        .in_memory_profiles()
        .start()
        .await?;
    for (what, seqs) in batches(c.vocab, c.max_tokens) {
        let on_cpu = cpu
            .run(Encoder::new(weights.clone(), seqs.clone())?)
            .await?;
        let opts = JobOptions::new().policy(coexec::policy::by_name("dynamic")?);
        let on_gpu = gpu
            .run_with(Encoder::new(weights.clone(), seqs.clone())?, opts)
            .await?;
        let gpu_items: usize = on_gpu.report.classes.iter().map(|k| k.items).sum();
        assert!(gpu_items > 0, "{what}: nothing ran on the GPU");
        let (a, b) = (on_cpu.kernel.into_vectors(), on_gpu.kernel.into_vectors());
        assert!(
            b.iter().flatten().all(|v| v.is_finite()),
            "{what}: a value not finite"
        );
        let (worst, at) = a
            .iter()
            .zip(&b)
            .enumerate()
            .map(|(i, (x, y))| (cosine(x, y), i))
            .fold((1.0f64, 0), |m, x| if x.0 < m.0 { x } else { m });
        println!(
            "{what}: {} sequences: min cosine gpu vs cpu {worst:.9} (sequence {at}, {} tokens)",
            seqs.len(),
            seqs[at].len()
        );
        assert!(worst >= 0.99999, "{what}: sequence {at} at cosine {worst}");
    }
    cpu.shutdown().await;
    gpu.shutdown().await;
    Ok(())
}
