//! The encoder on a small random BERT written to a temporary folder: its
//! CPU pass against a plain f64 one written here, chunk splits, and the
//! loader's errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use coexec_kernels::{Kernel, with_chunk};

/// SplitMix64: the tests' random numbers.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const H: usize = 16;
const HEADS: usize = 4;
const I: usize = 24;
const LAYERS: usize = 2;
const VOCAB: usize = 50;
const POS: usize = 40;

fn config_json() -> serde_json::Value {
    serde_json::json!({
        "model_type": "bert", "hidden_act": "gelu", "hidden_size": H,
        "num_attention_heads": HEADS, "intermediate_size": I,
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": POS, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12
    })
}

/// Every tensor of the small model, name → (shape, values).
fn tensors(seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = SplitMix64::new(seed);
    let mut t = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, base: f32| {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|_| base + scale * (rng.next_f64() as f32 * 2.0 - 1.0))
            .collect();
        t.push((name, shape, v));
    };
    add(
        "embeddings.word_embeddings.weight".into(),
        vec![VOCAB, H],
        1.0,
        0.0,
    );
    add(
        "embeddings.position_embeddings.weight".into(),
        vec![POS, H],
        0.5,
        0.0,
    );
    add(
        "embeddings.token_type_embeddings.weight".into(),
        vec![2, H],
        0.5,
        0.0,
    );
    add("embeddings.LayerNorm.weight".into(), vec![H], 0.2, 1.0);
    add("embeddings.LayerNorm.bias".into(), vec![H], 0.1, 0.0);
    for l in 0..LAYERS {
        let p = |s: &str| format!("encoder.layer.{l}.{s}");
        for (name, out, inp) in [
            ("attention.self.query", H, H),
            ("attention.self.key", H, H),
            ("attention.self.value", H, H),
            ("attention.output.dense", H, H),
            ("intermediate.dense", I, H),
            ("output.dense", H, I),
        ] {
            let s = 1.0 / (inp as f32).sqrt();
            add(p(&format!("{name}.weight")), vec![out, inp], s, 0.0);
            add(p(&format!("{name}.bias")), vec![out], 0.1, 0.0);
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            add(p(&format!("{name}.weight")), vec![H], 0.2, 1.0);
            add(p(&format!("{name}.bias")), vec![H], 0.1, 0.0);
        }
    }
    t
}

/// A model folder of the small model, under a fresh temporary directory.
fn folder(name: &str, prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("coexec-embed-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config_json().to_string()).unwrap();
    let t = tensors(7);
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = t
        .into_iter()
        .map(|(n, s, v)| {
            let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (format!("{prefix}{n}"), s, b)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(n, s, b)| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

/// The encoder in f64, written plainly from the tensors (padding-free,
/// one sequence at a time): the reference for the CPU pass.
fn reference(dir: &Path, ids: &[u32]) -> Vec<f64> {
    let t: std::collections::HashMap<String, Vec<f64>> = tensors(7)
        .into_iter()
        .map(|(n, _, v)| (n, v.into_iter().map(f64::from).collect()))
        .collect();
    let _ = dir;
    let g = |n: &str| &t[n];
    let l = ids.len();
    let norm = |x: &mut Vec<Vec<f64>>, w: &[f64], b: &[f64]| {
        for r in x.iter_mut() {
            let m = r.iter().sum::<f64>() / H as f64;
            let v = r.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / H as f64;
            for (k, a) in r.iter_mut().enumerate() {
                *a = (*a - m) / (v + 1e-12).sqrt() * w[k] + b[k];
            }
        }
    };
    let dense = |x: &Vec<Vec<f64>>, w: &[f64], b: &[f64], out: usize, inp: usize| {
        x.iter()
            .map(|r| {
                (0..out)
                    .map(|o| b[o] + (0..inp).map(|k| r[k] * w[o * inp + k]).sum::<f64>())
                    .collect::<Vec<f64>>()
            })
            .collect::<Vec<_>>()
    };
    let mut x: Vec<Vec<f64>> = ids
        .iter()
        .enumerate()
        .map(|(p, &id)| {
            (0..H)
                .map(|k| {
                    g("embeddings.word_embeddings.weight")[id as usize * H + k]
                        + g("embeddings.position_embeddings.weight")[p * H + k]
                        + g("embeddings.token_type_embeddings.weight")[k]
                })
                .collect()
        })
        .collect();
    norm(
        &mut x,
        g("embeddings.LayerNorm.weight"),
        g("embeddings.LayerNorm.bias"),
    );
    let d = H / HEADS;
    for layer in 0..LAYERS {
        let p = |s: &str| format!("encoder.layer.{layer}.{s}");
        let lin = |x: &Vec<Vec<f64>>, name: &str, out, inp| {
            dense(
                x,
                g(&p(&format!("{name}.weight"))),
                g(&p(&format!("{name}.bias"))),
                out,
                inp,
            )
        };
        let (q, k, v) = (
            lin(&x, "attention.self.query", H, H),
            lin(&x, "attention.self.key", H, H),
            lin(&x, "attention.self.value", H, H),
        );
        let mut ctx = vec![vec![0.0; H]; l];
        for h in 0..HEADS {
            for i in 0..l {
                let s: Vec<f64> = (0..l)
                    .map(|j| {
                        (0..d)
                            .map(|c| q[i][h * d + c] * k[j][h * d + c])
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|a| (a - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    ctx[i][h * d + c] = (0..l).map(|j| e[j] / z * v[j][h * d + c]).sum();
                }
            }
        }
        let a = lin(&ctx, "attention.output.dense", H, H);
        for (r, y) in x.iter_mut().zip(&a) {
            r.iter_mut().zip(y).for_each(|(r, y)| *r += y);
        }
        norm(
            &mut x,
            g(&p("attention.output.LayerNorm.weight")),
            g(&p("attention.output.LayerNorm.bias")),
        );
        let mut up = lin(&x, "intermediate.dense", I, H);
        for r in up.iter_mut() {
            for a in r.iter_mut() {
                *a = 0.5 * *a * (1.0 + erf64(*a / std::f64::consts::SQRT_2));
            }
        }
        let down = lin(&up, "output.dense", H, I);
        for (r, y) in x.iter_mut().zip(&down) {
            r.iter_mut().zip(y).for_each(|(r, y)| *r += y);
        }
        norm(
            &mut x,
            g(&p("output.LayerNorm.weight")),
            g(&p("output.LayerNorm.bias")),
        );
    }
    (0..H)
        .map(|k| x.iter().map(|r| r[k]).sum::<f64>() / l as f64)
        .collect()
}

/// erf in f64 by its Maclaurin series (|x| < 3) or continued fraction:
/// to 1e-15, for the reference only.
fn erf64(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = k as f64 / 2.0 / (a + f);
        }
        1.0 - (-a * a).exp() / (a + f) / std::f64::consts::PI.sqrt()
    };
    r.copysign(x)
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / na / nb
}

fn batch() -> Vec<Vec<u32>> {
    let mut rng = SplitMix64::new(3);
    [1usize, 9, 2, 33, 17, 5, 40, 3, 12]
        .iter()
        .map(|&l| (0..l).map(|_| rng.below(VOCAB as u64) as u32).collect())
        .collect()
}

#[test]
fn the_cpu_pass_matches_a_plain_f64_encoder() {
    let dir = folder("ref", "");
    let w = Arc::new(EncoderWeights::load(&dir).unwrap());
    let seqs = batch();
    let mut k = Encoder::new(w, seqs.clone()).unwrap();
    let n = k.items();
    with_chunk(&mut k, 0..n, |k, c| k.run_cpu(c)).unwrap();
    let out = k.into_vectors();
    for (s, v) in seqs.iter().zip(&out) {
        let r = reference(&dir, s);
        let max = v
            .iter()
            .zip(&r)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(
            cosine(v, &r) > 0.999_999,
            "len {}: cosine {}",
            s.len(),
            cosine(v, &r)
        );
        assert!(max < 1e-4, "len {}: max abs error {max}", s.len());
    }
}

#[test]
fn any_split_computes_each_sequence_once_and_the_same() {
    let dir = folder("split", "bert.");
    let w = Arc::new(EncoderWeights::load(&dir).unwrap());
    let seqs = batch();
    let whole = {
        let mut k = Encoder::new(w.clone(), seqs.clone()).unwrap();
        let n = k.items();
        with_chunk(&mut k, 0..n, |k, c| k.run_cpu(c)).unwrap();
        k.into_vectors()
    };
    let mut rng = SplitMix64::new(11);
    for _ in 0..20 {
        let mut k = Encoder::new(w.clone(), seqs.clone()).unwrap();
        let n = k.items();
        let mut lo = 0;
        while lo < n {
            let hi = (lo + 1 + rng.below(n as u64 / 3) as usize).min(n);
            with_chunk(&mut k, lo..hi, |k, c| k.run_cpu(c)).unwrap();
            lo = hi;
        }
        let v = k.into_vectors();
        // Tiles differ with the split, and so does the GEMMs' order of
        // sums: equal to float tolerance, every sequence written.
        for (a, b) in v.iter().zip(&whole) {
            assert_eq!(a.len(), H);
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(d < 1e-5, "{d}");
        }
    }
}

#[test]
fn work_grows_with_the_square_of_the_length() {
    let dir = folder("work", "");
    let w = EncoderWeights::load(&dir).unwrap();
    let c = w.config();
    // 2H + I = 56 here, an attention flop 3 dense ones.
    assert_eq!(c.work(1), 2);
    assert_eq!(c.work(28), 28 + 42);
    let k = Encoder::new(Arc::new(w), vec![vec![1; 28], vec![1; 1]]).unwrap();
    assert_eq!(k.items(), 72);
    assert_eq!(k.tokens(), 29);
}

/// The cost model of the rotary families: a causal decoder scores
/// `L(L+1)/2` pairs a layer, a local layer at most `2r + 1` keys a query;
/// the dense flops count a gated MLP's `3·H·I` and grouped-query K and V.
#[test]
fn work_counts_the_pairs_each_family_scores() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families");
    let q = EncoderConfig::load(root.join("qwen3-lasttoken")).unwrap();
    assert_eq!((q.heads, q.kv_heads, q.head_dim()), (4, 2, 16));
    assert!(q.causal && q.pre_norm && q.gated && q.norm == NormKind::Rms);
    // Dense flops a token: 2 layers · 2·(32·(64 + 2·32) + 64·32 + 3·32·64)
    // = 49152; attention 3 · 4·64 a pair.
    assert_eq!(q.flops_per_token(), 49_152.0);
    let pairs = |l: usize| 2 * l * (l + 1) / 2;
    for l in [1, 10, 128] {
        assert_eq!(q.work(l), l + (3 * 256 * pairs(l)).div_ceil(49_152), "{l}");
    }
    let m = EncoderConfig::load(root.join("modernbert-mean")).unwrap();
    assert_eq!(m.windows, vec![None, Some(8), None]);
    let r = m.rotary.unwrap();
    assert_eq!((r.theta, r.local_theta), (160_000.0, 10_000.0));
    // A local layer's query sees at most 17 keys: past 17 tokens the local
    // layer's pairs grow linearly, the global layers' with the square.
    let dense = m.flops_per_token() as usize;
    assert_eq!(dense, 3 * 2 * (32 * 96 + 32 * 32 + 3 * 32 * 64));
    let local = |l: usize| {
        (0..l)
            .map(|i| (i + 8).min(l - 1) - i.saturating_sub(8) + 1)
            .sum::<usize>()
    };
    for l in [5, 17, 100] {
        let pairs = 2 * l * l + local(l);
        assert_eq!(m.work(l), l + (3 * 4 * 32 * pairs).div_ceil(dense), "{l}");
    }
    assert_eq!(local(100), 100 * 17 - 2 * (8 * 9 / 2));
}

#[test]
fn bad_inputs_and_folders_are_refused_by_name() {
    let dir = folder("bad", "");
    let w = Arc::new(EncoderWeights::load(&dir).unwrap());
    let e = Encoder::new(w.clone(), vec![vec![1], vec![]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("sequence 1 has 0 tokens"), "{e}");
    let e = Encoder::new(w.clone(), vec![vec![VOCAB as u32]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 50"), "{e}");
    let e = Encoder::new(w, vec![vec![1; POS + 1]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("41 tokens"), "{e}");

    let mut c = config_json();
    c["model_type"] = "gpt2".into();
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(e.contains("config.json: field `model_type`"), "{e}");
    let mut c = config_json();
    c.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(e.contains("missing field `hidden_size`"), "{e}");
    let mut c = config_json();
    c["num_attention_heads"] = 5.into();
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(e.contains("does not divide"), "{e}");
    std::fs::write(dir.join("config.json"), "{\n\"model_type\": ").unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(e.contains("config.json:2:"), "{e}");

    std::fs::write(dir.join("config.json"), config_json().to_string()).unwrap();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"pooling_mode_weightedmean_tokens": true}"#,
    )
    .unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("field `pooling_mode_weightedmean_tokens`"),
        "{e}"
    );
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"pooling_mode_cls_token": true}"#,
    )
    .unwrap();
    assert_eq!(
        EncoderWeights::load(&dir).unwrap().config().pooling,
        Pooling::Cls
    );

    // A tensor of the wrong shape names the file and the tensor.
    let mut c = config_json();
    c["intermediate_size"] = 25.into();
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let e = EncoderWeights::load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors: tensor `encoder.layer.0.intermediate.dense.weight`"),
        "{e}"
    );
    let e = EncoderWeights::load(dir.join("absent"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json"), "{e}");
}

/// A symbolic link to nothing for sentence-transformers' optional files is
/// an error naming the file, not an absent file (which would serve mean
/// pooling and the model's whole length). Before, both loaded.
#[cfg(unix)]
#[test]
fn a_dangling_link_for_an_optional_file_is_refused_by_name() {
    let dir = folder("dangling", "");
    for file in ["1_Pooling/config.json", "sentence_bert_config.json"] {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(dir.join("gone.json"), &path).unwrap();
        let e = match EncoderWeights::load(&dir) {
            Ok(_) => panic!("{file}: a dangling link was taken as absent"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(file), "{e}");
        assert!(
            e.contains("symbolic link") && e.contains("gone.json"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
    }
    // Absent, both are defaults.
    assert_eq!(
        EncoderWeights::load(&dir).unwrap().config().pooling,
        Pooling::Mean
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// MPNet's relative-position buckets, for distances −300 to 300, as
/// `transformers` computes them (tests/data/families/mpnet-buckets.json,
/// written by scripts/make_tiny_families.py): the boundaries at 16, 32 and
/// 64 fall where its f32 logarithm puts them.
#[test]
fn mpnet_buckets_are_transformers_own() {
    #[derive(serde::Deserialize)]
    struct Table {
        from: i64,
        buckets: Vec<usize>,
    }
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families/mpnet-buckets.json");
    let t: Table = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(t.buckets.len(), 601);
    let rb = RelativeBias {
        buckets: 32,
        max_distance: 128,
    };
    for (k, &want) in t.buckets.iter().enumerate() {
        let rel = t.from + k as i64;
        assert_eq!(cpu::bucket(rb, rel), want, "relative position {rel}");
    }
}

/// ModernBERT's local base under the Hub's fields: absent 10 000, `null`
/// the global base (Transformers 4 sets a local layer's base only from a
/// number), a number itself.
#[test]
fn modernbert_s_local_base_follows_the_hub_s_fields() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/families");
    let text = std::fs::read_to_string(root.join("modernbert-mean/config.json")).unwrap();
    let mut j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let o = j.as_object_mut().unwrap();
    o.remove("rope_parameters");
    o.remove("layer_types");
    o.insert("global_rope_theta".into(), 160_000.0.into());
    let dir = std::env::temp_dir().join(format!("coexec-modernbert-theta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (local, want) in [
        (None, 10_000.0),
        (Some(serde_json::Value::Null), 160_000.0),
        (Some(5_000.0.into()), 5_000.0),
    ] {
        let mut j = j.clone();
        if let Some(v) = local.clone() {
            j.as_object_mut()
                .unwrap()
                .insert("local_rope_theta".into(), v);
        }
        std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
        let c = EncoderConfig::load_with(&dir, Pooling::Mean).unwrap();
        let r = c.rotary.unwrap();
        assert_eq!((r.theta, r.local_theta), (160_000.0, want), "{local:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
