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
//! buckets; ModernBERT (rotary, pre-norm, GeGLU, a local layer between two
//! global ones, inputs past its window); Qwen3 in bf16 (a causal decoder,
//! grouped-query heads wider than hidden/heads, per-head RMSNorm, SwiGLU,
//! last-token pooling, an instruction prompt); NomicBERT (rotary, SwiGLU,
//! token types) and GTE in f16 (rotary, biased attention, gated GELU), each
//! also with the Hub's `config.json` (`n_embd`…; `new`); a SPLADE sparse
//! encoder (BERT's masked-language-model head, max of log(1 + relu)).

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

/// The folders of tests/data/families whose reference is of `kind`
/// (`embedding`, or `classifier`).
fn folders(kind: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let Ok(b) = std::fs::read(p.join("reference.json")) else {
                return false;
            };
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            v["kind"].as_str().unwrap_or("embedding") == kind
        })
        .collect();
    dirs.sort();
    dirs
}

fn families() -> Vec<PathBuf> {
    let dirs = folders("embedding");
    assert!(dirs.len() >= 15, "{} embedding folders", dirs.len());
    dirs
}

#[derive(serde::Deserialize)]
struct ClassifierReference {
    family: String,
    labels: Vec<String>,
    pairs: Vec<Vec<String>>,
    ids: Vec<Vec<u32>>,
    logits: Vec<Vec<f64>>,
}

/// Cross-encoders and classifiers (BERT with a pair's token types,
/// XLM-RoBERTa, DistilBERT): the logits of single texts and of pairs
/// against transformers' in float64 on the same weights, within 1e-4 (the
/// issue's bound; they agree far closer).
#[test]
fn classifiers_match_transformers_in_fp64() {
    let dirs = folders("classifier");
    assert!(dirs.len() >= 3, "{} classifier folders", dirs.len());
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let r: ClassifierReference =
            serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        let model = Embedder::load(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            model.weights().config().family.model_type(),
            r.family,
            "{name}"
        );
        assert_eq!(model.labels(), Some(r.labels.as_slice()), "{name}");
        assert_eq!(model.dim(), r.labels.len(), "{name}");
        assert!(!model.weights().gpu_twin(), "{name}");
        let ids: Vec<Vec<u32>> = r
            .pairs
            .iter()
            .map(|p| match p.as_slice() {
                [a] => model.tokenize(a, true).unwrap(),
                [a, b] => model.tokenize_pair(a, b, true).unwrap(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ids, r.ids, "{name}: the tokenizer's ids");
        let got = encode(&model, ids, 2);
        let worst = got
            .iter()
            .zip(&r.logits)
            .flat_map(|(g, w)| g.iter().zip(w).map(|(&a, &b)| (a as f64 - b).abs()))
            .fold(0.0f64, f64::max);
        println!("{name}: largest logit error {worst:.1e}");
        assert!(worst <= 1e-4, "{name}: a logit {worst} from the reference");
    }
    // A text holding the separator would move where a pair's second text
    // starts: refused, not scored with the wrong token types.
    let bert = dirs.iter().find(|d| d.ends_with("bert-reranker")).unwrap();
    let model = Embedder::load(bert).unwrap();
    let e = model.tokenize_pair("a [SEP] b", "c", true).unwrap_err();
    assert!(e.to_string().contains("separator"), "{e}");
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

/// Token vectors (TEI's `/embed_all`): one per token, after the last layer
/// and any final norm; their mean is the reference's embedding where the
/// model mean-pools with no module after, and the first is it where it
/// takes `[CLS]` (Normalize after it: the same direction). A SPLADE model
/// has none to give.
#[test]
fn token_vectors_pool_to_the_references() {
    for (name, first) in [
        ("bert-f16", false),
        ("modernbert-mean", false),
        ("nomic-bert-mean", false),
        ("gte-cls", true),
        ("bert-cls-dense", true),
    ] {
        let dir = families().into_iter().find(|d| d.ends_with(name)).unwrap();
        let r = reference(&dir);
        let model = Embedder::load(&dir).unwrap();
        let k = Encoder::token_vectors(model.weights().clone(), r.ids.clone()).unwrap();
        let k = run_sequential(OneShot::new(k)).unwrap().unwrap();
        let tokens = k.into_token_vectors();
        assert_eq!(tokens.len(), r.ids.len(), "{name}");
        for ((t, ids), want) in tokens.iter().zip(&r.ids).zip(&r.vectors) {
            assert_eq!(t.len(), ids.len(), "{name}");
            let h = model.weights().hidden();
            assert!(t.iter().all(|v| v.len() == h), "{name}");
            if name == "bert-cls-dense" {
                // Its Dense module is after the pooling: widths differ.
                assert_eq!(want.len(), 24);
                continue;
            }
            let pooled: Vec<f32> = if first {
                t[0].clone()
            } else {
                (0..h)
                    .map(|j| t.iter().map(|v| v[j]).sum::<f32>() / t.len() as f32)
                    .collect()
            };
            let cos = cosine(&pooled, want);
            assert!(cos >= 1.0 - 1e-9, "{name}: cosine {cos}");
        }
    }
    let dir = families()
        .into_iter()
        .find(|d| d.ends_with("bert-splade"))
        .unwrap();
    let model = Embedder::load(&dir).unwrap();
    let e = Encoder::token_vectors(model.weights().clone(), vec![vec![2, 5, 3]]).unwrap_err();
    assert!(e.to_string().contains("SPLADE"), "{e}");
}

/// A copy of family folder `name` in a fresh temporary folder, to break.
fn copy_of(name: &str) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/families")
        .join(name);
    let to = std::env::temp_dir().join(format!("coexec-family-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&to);
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let q = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy(&p, &q);
            } else {
                std::fs::copy(&p, &q).unwrap();
            }
        }
    }
    copy(&from, &to);
    to
}

fn load_err(dir: &Path) -> String {
    match Embedder::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Edits the JSON file `path` in place.
fn edit(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// What a folder cannot be, each refused at load in one line that names
/// the file and the field, module or tensor.
#[test]
fn bad_folders_are_refused_by_file_and_field() {
    // A family the encoder cannot compute: by name, with what it needs.
    let dir = copy_of("bert-f16");
    edit(&dir.join("config.json"), |c| {
        c["model_type"] = "jina_bert".into()
    });
    let e = load_err(&dir);
    assert!(
        e.contains("config.json") && e.contains("jina_bert") && e.contains("ALiBi"),
        "{e}"
    );
    edit(&dir.join("config.json"), |c| {
        c["model_type"] = "gpt2".into()
    });
    let e = load_err(&dir);
    assert!(e.contains("\"gpt2\" is not a family"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    // The rotary families' settings the encoder does not compute, by field.
    for (name, key, value, want) in [
        (
            "qwen3-lasttoken",
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            "rope_scaling",
        ),
        (
            "qwen3-lasttoken",
            "rope_parameters",
            serde_json::json!({"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
            "rope_type \"linear\"",
        ),
        (
            "qwen3-lasttoken",
            "use_sliding_window",
            serde_json::json!(true),
            "use_sliding_window",
        ),
        (
            "qwen3-lasttoken",
            "num_key_value_heads",
            serde_json::json!(3),
            "does not divide the 4 heads",
        ),
        (
            "modernbert-mean",
            "layer_types",
            serde_json::json!(["full_attention", "chunked_attention", "full_attention"]),
            "\"chunked_attention\"",
        ),
        (
            "nomic-bert-hub",
            "rotary_emb_interleaved",
            serde_json::json!(true),
            "rotary_emb_interleaved",
        ),
        (
            "gte-hub",
            "rope_scaling",
            serde_json::json!({"type": "ntk", "factor": 2.0}),
            "rope_scaling",
        ),
        (
            "gte-hub",
            "logn_attention_scale",
            serde_json::json!(true),
            "logn_attention_scale",
        ),
        (
            "modernbert-mean",
            "architectures",
            serde_json::json!(["ModernBertForSequenceClassification"]),
            "classifier's head is not read yet",
        ),
    ] {
        let dir = copy_of(name);
        edit(&dir.join("config.json"), |c| {
            c[key] = value;
            c["id2label"] = serde_json::json!({"0": "a"});
        });
        let e = load_err(&dir);
        assert!(
            e.contains("config.json") && e.contains(want),
            "{name} {key}: {e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // SPLADE as TEI serves it: max of relu, over the whole vocabulary.
    for (key, value, want) in [
        (
            "pooling_strategy",
            serde_json::json!("sum"),
            "pooling_strategy",
        ),
        (
            "activation_function",
            serde_json::json!("log1p_relu"),
            "activation_function",
        ),
        (
            "embedding_dimension",
            serde_json::json!(300),
            "embedding_dimension",
        ),
    ] {
        let dir = copy_of("bert-splade");
        let path = dir.join("1_SpladePooling/config.json");
        edit(&path, |c| c[key] = value);
        let e = load_err(&dir);
        assert!(
            e.contains("1_SpladePooling") && e.contains(want),
            "{key}: {e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // A tensor that does not fit the config, in each family's own names,
    // named with its file (the shard that holds it where there are shards).
    for (name, key, value, tensor, file) in [
        (
            "distilbert-max",
            "hidden_dim",
            65,
            "transformer.layer.0.ffn.lin1.weight",
            "model.safetensors",
        ),
        (
            "mpnet-mean",
            "num_attention_heads",
            2,
            "encoder.relative_attention_bias.weight",
            "model.safetensors",
        ),
        (
            "roberta-lasttoken",
            "intermediate_size",
            65,
            "encoder.layer.0.intermediate.dense.weight",
            "model.safetensors",
        ),
        (
            "xlm-roberta-sharded",
            "intermediate_size",
            65,
            "encoder.layer.0.intermediate.dense.weight",
            "model-0000",
        ),
        (
            "modernbert-mean",
            "intermediate_size",
            65,
            "layers.0.mlp.Wi.weight",
            "model.safetensors",
        ),
        (
            "qwen3-lasttoken",
            "head_dim",
            8,
            "layers.0.self_attn.q_proj.weight",
            "model.safetensors",
        ),
    ] {
        let dir = copy_of(name);
        edit(&dir.join("config.json"), |c| c[key] = value.into());
        let e = load_err(&dir);
        assert!(
            e.contains(tensor) && e.contains(file) && e.contains("shape"),
            "{name}: {e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    // A module the service does not compute is refused, never skipped.
    let dir = copy_of("xlm-roberta-sharded");
    edit(&dir.join("modules.json"), |m| {
        m[2]["type"] = "sentence_transformers.models.LayerNorm".into();
    });
    let e = load_err(&dir);
    assert!(
        e.contains("modules.json") && e.contains("LayerNorm") && e.contains("not a module"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A Dense module whose input is not the pooled width.
    let dir = copy_of("bert-cls-dense");
    edit(&dir.join("2_Dense/config.json"), |c| {
        c["in_features"] = 31.into()
    });
    let e = load_err(&dir);
    assert!(e.contains("2_Dense") && e.contains("linear.weight"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    // Weights only as pytorch_model.bin: a one-line hint.
    let dir = copy_of("bert-f16");
    std::fs::rename(dir.join("model.safetensors"), dir.join("pytorch_model.bin")).unwrap();
    let e = load_err(&dir);
    assert!(
        e.contains("pytorch_model.bin") && e.contains("safetensors"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    // A default prompt the model does not define.
    let dir = copy_of("bert-cls-dense");
    edit(&dir.join("config_sentence_transformers.json"), |c| {
        c["default_prompt_name"] = "search".into();
    });
    let e = load_err(&dir);
    assert!(
        e.contains("default_prompt_name") && e.contains("search"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A pooling mode that is not served, in either format.
    let dir = copy_of("distilbert-max");
    edit(&dir.join("1_Pooling/config.json"), |c| {
        c["pooling_mode"] = "weightedmean".into()
    });
    let e = load_err(&dir);
    assert!(
        e.contains("pooling_mode_weightedmean_tokens") && e.contains("not served"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The GPU twin takes the families whose operations it has (the BERT
/// layout, exact GELU, mean or [CLS] pooling); the rest say so.
#[test]
fn the_gpu_twin_covers_the_bert_layout_only() {
    for dir in families() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let model = Embedder::load(&dir).unwrap();
        let twin = model.weights().gpu_twin();
        let want = ![
            "mpnet",
            "roberta-lasttoken",
            "camembert",
            "distilbert-max",
            "modernbert",
            "qwen3",
            "nomic-bert",
            "gte",
            "bert-splade",
        ]
        .iter()
        .any(|p| name.starts_with(p));
        assert_eq!(twin, want, "{name}");
        let k = Encoder::new(Arc::clone(model.weights()), vec![vec![0, 5, 2]]).unwrap();
        assert_eq!(k.cuda().is_some(), twin && cfg!(feature = "cuda"), "{name}");
    }
}
