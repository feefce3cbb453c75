//! Every encoder family against sentence-transformers: the tiny random
//! models of tests/data/families (scripts/make_tiny_families.py wrote them
//! and their references: sentence-transformers in float64 on the same
//! weights, f16 and bf16 weights upcast), loaded by `Embedder` as a user
//! loads a folder, their texts tokenised here and encoded on the CPU pass.
//!
//! Each folder is another family or format: BERT with [CLS] pooling, a
//! `2_Dense` (tanh), `Normalize` and prompts; BERT in f16 and in bf16;
//! RoBERTa with the tanh GELU and last-token pooling; XLM-RoBERTa in three
//! shards; CamemBERT with mean/√len pooling; DistilBERT with max pooling;
//! MPNet with sequences long enough to reach its farthest relative-position
//! buckets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use coexec_kernels::{Kernel, OneShot, run_sequential, with_chunk};
use coexec_models::Embedder;
use coexec_models::encoder::Encoder;

#[derive(serde::Deserialize)]
struct Reference {
    family: String,
    dtype: String,
    max_seq_length: usize,
    sentences: Vec<String>,
    prompt: Option<Prompt>,
    ids: Vec<Vec<u32>>,
    vectors: Vec<Vec<f64>>,
}

#[derive(serde::Deserialize)]
struct Prompt {
    name: String,
    text: String,
}

fn families() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("reference.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 8,
        "{} folders in {}",
        dirs.len(),
        root.display()
    );
    dirs
}

fn reference(dir: &Path) -> Reference {
    let bytes = std::fs::read(dir.join("reference.json")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The encoder's vectors for `ids`, in chunks of `parts` even pieces of
/// its items.
fn encode(model: &Embedder, ids: Vec<Vec<u32>>, parts: usize) -> Vec<Vec<f32>> {
    let mut k = Encoder::new(model.weights().clone(), ids).unwrap();
    if parts == 1 {
        return run_sequential(OneShot::new(k))
            .unwrap()
            .unwrap()
            .into_vectors();
    }
    let n = k.items();
    for p in 0..parts {
        let (lo, hi) = (n * p / parts, n * (p + 1) / parts);
        with_chunk(&mut k, lo..hi, |k, c| k.run_cpu(c)).unwrap();
    }
    k.into_vectors()
}

#[test]
fn every_family_matches_sentence_transformers_in_fp64() {
    let mut report = Vec::new();
    for dir in families() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let r = reference(&dir);
        let model = Embedder::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = model.weights().config();
        assert_eq!(c.family.model_type(), r.family, "{name}");
        assert_eq!(model.weights().stored_dtype(), r.dtype, "{name}");
        assert_eq!(model.max_input_length(), r.max_seq_length, "{name}");
        assert_eq!(model.dim(), r.vectors[0].len(), "{name}");
        // The texts as a request gives them: the prompt's text first.
        let prefix = match &r.prompt {
            Some(p) => {
                assert_eq!(model.prompt(&p.name), Some(p.text.as_str()), "{name}");
                p.text.as_str()
            }
            None => "",
        };
        let ids: Vec<Vec<u32>> = r
            .sentences
            .iter()
            .map(|t| model.tokenize(&format!("{prefix}{t}"), true).unwrap())
            .collect();
        assert_eq!(ids, r.ids, "{name}: the tokenizer's ids");
        assert!(
            ids.iter().any(|s| s.len() == r.max_seq_length),
            "{name}: no input reaches the limit"
        );
        for parts in [1, 3] {
            let v = encode(&model, ids.clone(), parts);
            let worst = v
                .iter()
                .zip(&r.vectors)
                .map(|(a, b)| cosine(a, b))
                .fold(1.0f64, f64::min);
            assert!(
                worst >= 1.0 - 1e-9,
                "{name} ({parts} chunks): minimum cosine {worst}"
            );
            report.push(format!("{name}: 1 - min cosine = {:.1e}", 1.0 - worst));
        }
    }
    println!("{}", report.join("\n"));
}

/// The GPU twin takes the families whose operations it has (the BERT
/// layout, exact GELU, mean or [CLS] pooling); the rest say so.
#[test]
fn the_gpu_twin_covers_the_bert_layout_only() {
    for dir in families() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let model = Embedder::load(&dir).unwrap();
        let twin = model.weights().gpu_twin();
        let want = !["mpnet", "roberta-lasttoken", "camembert", "distilbert-max"]
            .iter()
            .any(|p| name.starts_with(p));
        assert_eq!(twin, want, "{name}");
        let k = Encoder::new(Arc::clone(model.weights()), vec![vec![0, 5, 2]]).unwrap();
        assert_eq!(k.cuda().is_some(), twin && cfg!(feature = "cuda"), "{name}");
    }
}
