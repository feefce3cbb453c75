//! all-mpnet-base-v2 against sentence-transformers in float64: the real
//! weights (`scripts/fetch_mpnet.sh`, sha256-checked; `COEXEC_MPNET_MODEL`
//! names another folder), and tests/data/mpnet-reference.json, 32 texts of
//! tests/data/embed_sentences.jsonl spread over its lengths (those past the
//! 384-token limit among them) as `scripts/st_reference.py --take 32`
//! computed them. Without the model the test says "skipped", or fails
//! where `COEXEC_CI` is set (.ci/run fetches it).

use std::path::{Path, PathBuf};

use coexec_kernels::{OneShot, run_sequential};
use coexec_models::Embedder;
use coexec_models::encoder::{Encoder, Family};

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("COEXEC_MPNET_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cache/coexec/models/all-mpnet-base-v2"))
        })?;
    dir.join("model.safetensors").is_file().then_some(dir)
}

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    vectors: Vec<Vec<f64>>,
}

#[test]
fn all_mpnet_base_v2_matches_sentence_transformers_in_fp64() {
    let Some(dir) = model_dir() else {
        let ci = std::env::var("COEXEC_CI").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(
            !ci,
            "all-mpnet-base-v2 is not here, and COEXEC_CI is set: .ci/run fetches it \
             (scripts/fetch_mpnet.sh), so this is a failure, not a skip"
        );
        eprintln!("all_mpnet_base_v2: skipped, the model is not here (scripts/fetch_mpnet.sh)");
        return;
    };
    let model = Embedder::load(&dir).unwrap();
    assert_eq!(model.weights().config().family, Family::MpNet);
    assert_eq!(model.dim(), 768);
    assert_eq!(model.max_input_length(), 384);
    assert_eq!(
        model.sha256(),
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/mpnet-reference.json");
    let r: Reference = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let ids: Vec<Vec<u32>> = r
        .sentences
        .iter()
        .map(|t| model.tokenize(t, true).unwrap())
        .collect();
    assert_eq!(ids, r.ids, "the tokenizer's ids");
    assert!(
        ids.iter().any(|s| s.len() == 384),
        "no text reaches the limit"
    );
    let k = Encoder::new(model.weights().clone(), ids).unwrap();
    let v = run_sequential(OneShot::new(k))
        .unwrap()
        .unwrap()
        .into_vectors();
    let mut worst = 1.0f64;
    for (a, b) in v.iter().zip(&r.vectors) {
        let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
        let na = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
        let nb = b.iter().map(|y| y * y).sum::<f64>().sqrt();
        worst = worst.min(dot / (na * nb));
        // The model ends with Normalize: unit vectors.
        assert!((na - 1.0).abs() < 1e-6, "norm {na}");
    }
    println!(
        "all-mpnet-base-v2: 1 - min cosine over {} texts = {:.1e}",
        v.len(),
        1.0 - worst
    );
    assert!(worst >= 1.0 - 1e-9, "minimum cosine {worst}");
}
