//! A BERT encoder's shape and pooling, read from a model folder's JSON
//! files: `config.json` (Hugging Face's) and, when present,
//! `1_Pooling/config.json` and `sentence_bert_config.json`
//! (sentence-transformers').

use std::path::Path;

use serde_json::{Map, Value};

use coexec_kernels::KernelError;

/// A model folder's JSON files are a few KiB: past this, not read.
const MAX_JSON_BYTES: u64 = 16 << 20;

/// How a sequence's token vectors become one embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooling {
    /// The mean over the sequence's tokens (all-MiniLM-L6-v2's).
    Mean,
    /// The first token's (`[CLS]`) vector.
    Cls,
}

/// What the encoder is: widths, depth, heads, vocabulary, pooling and the
/// longest input, each read from the model folder's files.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BertConfig {
    /// Token vocabulary (`vocab_size`).
    pub vocab: usize,
    /// Hidden width (`hidden_size`).
    pub hidden: usize,
    /// Encoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Attention heads (`num_attention_heads`), dividing `hidden`.
    pub heads: usize,
    /// Feed-forward width (`intermediate_size`).
    pub intermediate: usize,
    /// Position embeddings (`max_position_embeddings`).
    pub max_positions: usize,
    /// Token types (`type_vocab_size`).
    pub type_vocab: usize,
    /// LayerNorm's epsilon (`layer_norm_eps`).
    pub eps: f32,
    /// Pooling (`1_Pooling/config.json`; mean when the file is absent).
    pub pooling: Pooling,
    /// The longest input in tokens, `[CLS]` and `[SEP]` included:
    /// `sentence_bert_config.json`'s `max_seq_length`, else
    /// `max_positions`.
    pub max_tokens: usize,
}

/// The largest width, depth or vocabulary taken: far past any encoder of
/// this family, and a bound on what a hostile config can make the loader
/// allocate.
const MAX_DIM: usize = 1 << 20;

fn config_err(path: &Path, field: &'static str, why: impl Into<String>) -> KernelError {
    KernelError::Config {
        path: path.to_path_buf(),
        field,
        why: why.into(),
    }
}

/// The JSON object in `path`; `None` when the file does not exist. A
/// symbolic link to nothing is an error, not an absent file: it says the
/// file was meant to be there (a model copied without its target), and
/// taking it as absent would serve another pooling or length.
fn read_object(path: &Path) -> Result<Option<Map<String, Value>>, KernelError> {
    let bytes = match coexec_kernels::read_file(path, MAX_JSON_BYTES) {
        Ok(b) => b,
        Err(KernelError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return match std::fs::read_link(path) {
                Ok(target) => Err(KernelError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "a symbolic link to {}, which does not exist",
                            target.display()
                        ),
                    ),
                }),
                Err(_) => Ok(None),
            };
        }
        Err(e) => return Err(e),
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(_) => Err(KernelError::Input {
            path: path.to_path_buf(),
            line: 1,
            why: "not a JSON object".into(),
        }),
        Err(e) => Err(KernelError::Input {
            path: path.to_path_buf(),
            line: e.line(),
            why: format!("not JSON: {e}"),
        }),
    }
}

/// A positive whole number at most [`MAX_DIM`].
fn dim(obj: &Map<String, Value>, path: &Path, field: &'static str) -> Result<usize, KernelError> {
    match obj.get(field) {
        None => Err(config_err(path, field, "missing")),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 && n as usize <= MAX_DIM => Ok(n as usize),
            _ => Err(config_err(
                path,
                field,
                format!("{v}; expected a whole number from 1 to {MAX_DIM}"),
            )),
        },
    }
}

impl BertConfig {
    /// Reads `dir/config.json` (a BERT encoder: `model_type` `bert`, GELU,
    /// absolute positions) and the sentence-transformers files beside it.
    /// Errors name the file and the field.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        let path = dir.join("config.json");
        let c = read_object(&path)?.ok_or_else(|| KernelError::Io {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file (a model folder holds config.json, model.safetensors and tokenizer.json)",
            ),
        })?;
        let text = |field: &str| c.get(field).and_then(Value::as_str);
        match text("model_type") {
            Some("bert") => {}
            Some(other) => {
                return Err(config_err(
                    &path,
                    "model_type",
                    format!("\"{other}\"; this encoder serves \"bert\""),
                ));
            }
            None => return Err(config_err(&path, "model_type", "missing")),
        }
        // `gelu` is the erf form in Hugging Face's BERT; the tanh
        // approximation (`gelu_new`) would give other vectors.
        if let Some(act) = c.get("hidden_act")
            && act.as_str() != Some("gelu")
        {
            return Err(config_err(
                &path,
                "hidden_act",
                format!("{act}; this encoder computes \"gelu\" (the erf form)"),
            ));
        }
        if let Some(p) = c.get("position_embedding_type")
            && p.as_str() != Some("absolute")
        {
            return Err(config_err(
                &path,
                "position_embedding_type",
                format!("{p}; this encoder computes \"absolute\""),
            ));
        }
        let hidden = dim(&c, &path, "hidden_size")?;
        let heads = dim(&c, &path, "num_attention_heads")?;
        if !hidden.is_multiple_of(heads) {
            return Err(config_err(
                &path,
                "num_attention_heads",
                format!("{heads} does not divide hidden_size {hidden}"),
            ));
        }
        let eps = match c.get("layer_norm_eps") {
            None => 1e-12,
            Some(v) => match v.as_f64() {
                Some(e) if e > 0.0 && e < 1.0 => e as f32,
                _ => {
                    return Err(config_err(
                        &path,
                        "layer_norm_eps",
                        format!("{v}; expected a number in (0, 1)"),
                    ));
                }
            },
        };
        let max_positions = dim(&c, &path, "max_position_embeddings")?;
        let type_vocab = match c.get("type_vocab_size") {
            None => 2,
            Some(_) => dim(&c, &path, "type_vocab_size")?,
        };
        let pooling = read_pooling(&dir.join("1_Pooling").join("config.json"))?;
        let st_path = dir.join("sentence_bert_config.json");
        let max_tokens = match read_object(&st_path)? {
            Some(st) if st.contains_key("max_seq_length") => {
                let n = dim(&st, &st_path, "max_seq_length")?;
                if n > max_positions {
                    return Err(config_err(
                        &st_path,
                        "max_seq_length",
                        format!("{n}, past the model's {max_positions} positions"),
                    ));
                }
                n
            }
            _ => max_positions,
        };
        Ok(Self {
            vocab: dim(&c, &path, "vocab_size")?,
            hidden,
            layers: dim(&c, &path, "num_hidden_layers")?,
            heads,
            intermediate: dim(&c, &path, "intermediate_size")?,
            max_positions,
            type_vocab,
            eps,
            pooling,
            max_tokens,
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Floating-point operations of one token's pass through the dense
    /// layers (multiply and add counted apart): `layers · (8·H² + 4·H·I)`.
    pub fn flops_per_token(&self) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        self.layers as f64 * (8.0 * h * h + 4.0 * h * i)
    }

    /// The work of a sequence of `len` tokens in token-equivalents: `len`
    /// for the dense layers, plus attention's `4·len²·H` flops per layer
    /// (scores and weighted sum) at [`ATTENTION_COST`] times a dense
    /// flop's cost: `len · (1 + 3·len / (2·H + I))`. For all-MiniLM-L6-v2
    /// the divisor is 2304/3 = 768: attention adds 33% at 256 tokens, 3%
    /// at 24.
    pub fn work(&self, len: usize) -> usize {
        let k = 2 * self.hidden + self.intermediate;
        len + (ATTENTION_COST * len * len).div_ceil(k)
    }
}

/// What an attention flop costs against a dense-layer flop on the CPU
/// pass: attention runs as many small GEMMs (one per sequence and head,
/// 32 wide for MiniLM) and a softmax, not one large GEMM. Fitted on `cargo
/// bench --bench embed_forward` (one thread, sequences of 8 to 256 tokens):
/// the time per token grows about 29% from 8 to 256 tokens; by flops alone
/// attention would add 11%.
pub const ATTENTION_COST: usize = 3;

/// The pooling `path` names (mean when the file does not exist).
fn read_pooling(path: &Path) -> Result<Pooling, KernelError> {
    let Some(p) = read_object(path)? else {
        return Ok(Pooling::Mean);
    };
    let on = |field: &str| p.get(field).and_then(Value::as_bool).unwrap_or(false);
    let modes: Vec<&str> = [
        "pooling_mode_mean_tokens",
        "pooling_mode_cls_token",
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
        "pooling_mode_lasttoken",
    ]
    .into_iter()
    .filter(|f| on(f))
    .collect();
    match modes.as_slice() {
        ["pooling_mode_mean_tokens"] => Ok(Pooling::Mean),
        ["pooling_mode_cls_token"] => Ok(Pooling::Cls),
        [] => Err(config_err(
            path,
            "pooling_mode_mean_tokens",
            "no pooling mode is true",
        )),
        [one] => Err(config_err(
            path,
            one,
            "not served: this encoder pools by mean or by [CLS]",
        )),
        [first, ..] => Err(config_err(
            path,
            first,
            format!("{modes:?} are all true; this encoder takes one pooling mode"),
        )),
    }
}
