//! What an encoder is, read from a model folder: Hugging Face's
//! `config.json`, one serde type per family, turned into one
//! [`EncoderConfig`] the forward pass reads; and sentence-transformers'
//! `max_seq_length` (`sentence_bert_config.json`).
//!
//! The families served share the BERT layout: learned absolute positions,
//! post-norm layers of biased attention and a two-layer MLP. They differ in
//! their tensors' names, the positions' offset (RoBERTa's and MPNet's
//! start after the padding id), token types (BERT's; none in DistilBERT
//! and MPNet, one in RoBERTa's), the MLP's activation, and MPNet's
//! relative-position bias on attention's scores.

use std::path::Path;

use serde::Deserialize;

use coexec_kernels::KernelError;

use crate::folder::{Dim, config_err, parse, read_json, read_optional};
use crate::modules::{Modules, Pooling};

/// An encoder family: which `config.json` (`model_type`) and tensor names
/// the weights follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// `bert` (all-MiniLM-L6-v2, BGE, E5 v1, GTE v1).
    Bert,
    /// `roberta` (all-distilroberta-v1).
    Roberta,
    /// `xlm-roberta` (multilingual-e5, bge-m3, paraphrase-multilingual).
    XlmRoberta,
    /// `camembert`.
    Camembert,
    /// `distilbert` (msmarco-distilbert, multi-qa-distilbert).
    DistilBert,
    /// `mpnet` (all-mpnet-base-v2, multi-qa-mpnet).
    MpNet,
}

impl Family {
    /// Its `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::Roberta => "roberta",
            Family::XlmRoberta => "xlm-roberta",
            Family::Camembert => "camembert",
            Family::DistilBert => "distilbert",
            Family::MpNet => "mpnet",
        }
    }

    /// The prefix of its tensors in a checkpoint saved with a task head
    /// (`bert.` in `BertForSequenceClassification`'s), absent in the bare
    /// model's.
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert.",
            Family::Roberta | Family::XlmRoberta => "roberta.",
            Family::Camembert => "roberta.",
            Family::DistilBert => "distilbert.",
            Family::MpNet => "mpnet.",
        }
    }
}

/// The MLP's activation (`hidden_act`, DistilBERT's `activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Activation {
    /// `gelu`: the exact form, `x·Φ(x)` with the error function.
    GeluErf,
    /// `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`: the tanh
    /// approximation (other vectors than the exact form: never swapped).
    GeluTanh,
    /// `relu`.
    Relu,
}

/// MPNet's relative-position bias: a learned value per head and bucket of
/// the distance between query and key, added to every layer's scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelativeBias {
    /// Buckets (`relative_attention_num_buckets`), half for each sign.
    pub buckets: usize,
    /// The distance from which buckets stop growing (128 in MPNet).
    pub max_distance: usize,
}

/// What the encoder is: its family, widths, depth, heads, vocabulary,
/// positions, pooling and the longest input, each read from the model
/// folder's files.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EncoderConfig {
    /// Its family (`model_type`).
    pub family: Family,
    /// Token vocabulary (`vocab_size`).
    pub vocab: usize,
    /// Hidden width (`hidden_size`; DistilBERT's `dim`).
    pub hidden: usize,
    /// Encoder layers (`num_hidden_layers`; `n_layers`).
    pub layers: usize,
    /// Attention heads (`num_attention_heads`; `n_heads`), dividing
    /// `hidden`.
    pub heads: usize,
    /// Feed-forward width (`intermediate_size`; `hidden_dim`).
    pub intermediate: usize,
    /// Positions a sequence may use: `max_position_embeddings` less the
    /// rows before the first position (`position_offset`).
    pub max_positions: usize,
    /// The row of position 0 in the position embeddings: 0, RoBERTa's
    /// `pad_token_id + 1`, or MPNet's 2.
    pub position_offset: usize,
    /// Token types (`type_vocab_size`); 0 where the family has none.
    /// Every input is one segment: type 0's vector is added to each token.
    pub type_vocab: usize,
    /// LayerNorm's epsilon (`layer_norm_eps`).
    pub eps: f32,
    /// The MLP's activation.
    pub activation: Activation,
    /// MPNet's relative-position bias.
    pub relative_bias: Option<RelativeBias>,
    /// Pooling (sentence-transformers' `1_Pooling/config.json`; mean where
    /// the folder has no modules).
    pub pooling: Pooling,
    /// The longest input in tokens, special tokens included:
    /// `sentence_bert_config.json`'s `max_seq_length`, else
    /// `max_positions`.
    pub max_tokens: usize,
    /// A sequence classifier's labels in the order of its outputs
    /// (`id2label`), where `architectures` names a
    /// `…ForSequenceClassification`; `None` for an encoder of embeddings.
    pub labels: Option<Vec<String>>,
}

/// Families named here are refused by name with what they need that the
/// encoder does not compute.
const NOT_SERVED: &[(&str, &str)] = &[
    (
        "nomic_bert",
        "rotary positions and a SwiGLU MLP without biases",
    ),
    (
        "modernbert",
        "rotary positions, pre-norm, GeGLU and alternating local attention",
    ),
    ("new", "GTE v1.5's rotary positions and gated MLP"),
    ("jina_bert", "ALiBi attention biases and a gated MLP"),
    (
        "deberta-v2",
        "disentangled attention over relative positions",
    ),
    (
        "qwen2",
        "a decoder: causal attention, rotary positions, RMSNorm, SwiGLU",
    ),
    (
        "qwen3",
        "a decoder: causal attention, rotary positions, RMSNorm, SwiGLU",
    ),
    (
        "mistral",
        "a decoder: causal attention, rotary positions, RMSNorm, SwiGLU",
    ),
    ("gemma3_text", "a decoder: rotary positions, RMSNorm, GeGLU"),
];

/// `config.json`'s family and head, before the rest is read.
#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    id2label: Option<std::collections::BTreeMap<String, String>>,
}

/// A sequence classifier's labels by output, from `id2label` (keys `"0"`
/// to `"n-1"`, each once).
fn labels(
    path: &Path,
    id2label: Option<std::collections::BTreeMap<String, String>>,
) -> Result<Vec<String>, KernelError> {
    let Some(map) = id2label else {
        return Err(config_err(
            path,
            "id2label",
            "missing: a classifier names its labels",
        ));
    };
    let mut out = vec![None; map.len()];
    for (k, v) in map {
        match k.parse::<usize>() {
            Ok(i) if i < out.len() && out[i].is_none() => out[i] = Some(v),
            _ => {
                return Err(config_err(
                    path,
                    "id2label",
                    format!("key {k:?}: expected each of 0 to {} once", out.len() - 1),
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(config_err(path, "id2label", "empty"));
    }
    Ok(out.into_iter().flatten().collect())
}

/// BERT's, RoBERTa's, XLM-RoBERTa's and CamemBERT's `config.json` (the
/// fields the encoder reads; the rest are not its).
#[derive(Deserialize)]
struct BertJson {
    vocab_size: Dim,
    hidden_size: Dim,
    num_hidden_layers: Dim,
    num_attention_heads: Dim,
    intermediate_size: Dim,
    max_position_embeddings: Dim,
    type_vocab_size: Option<Dim>,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    position_embedding_type: Option<String>,
    pad_token_id: Option<usize>,
}

/// DistilBERT's `config.json`.
#[derive(Deserialize)]
struct DistilBertJson {
    vocab_size: Dim,
    dim: Dim,
    n_layers: Dim,
    n_heads: Dim,
    hidden_dim: Dim,
    max_position_embeddings: Dim,
    activation: Option<String>,
}

/// MPNet's `config.json`.
#[derive(Deserialize)]
struct MpNetJson {
    vocab_size: Dim,
    hidden_size: Dim,
    num_hidden_layers: Dim,
    num_attention_heads: Dim,
    intermediate_size: Dim,
    max_position_embeddings: Dim,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    relative_attention_num_buckets: Option<Dim>,
}

fn activation(
    path: &Path,
    field: &'static str,
    act: Option<&str>,
) -> Result<Activation, KernelError> {
    match act.unwrap_or("gelu") {
        "gelu" => Ok(Activation::GeluErf),
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
        "relu" => Ok(Activation::Relu),
        other => Err(config_err(
            path,
            field,
            format!("\"{other}\"; the encoder computes gelu, gelu_new (tanh) and relu"),
        )),
    }
}

fn eps(path: &Path, v: Option<f64>, default: f32) -> Result<f32, KernelError> {
    match v {
        None => Ok(default),
        Some(e) if e > 0.0 && e < 1.0 => Ok(e as f32),
        Some(e) => Err(config_err(
            path,
            "layer_norm_eps",
            format!("{e}; expected a number in (0, 1)"),
        )),
    }
}

/// The rows before position 0 (`pad_token_id + 1`), which must leave at
/// least one position.
fn offset(path: &Path, pad: Option<usize>, positions: usize) -> Result<usize, KernelError> {
    let off = pad.unwrap_or(1).saturating_add(1);
    if off >= positions {
        return Err(config_err(
            path,
            "pad_token_id",
            format!(
                "{}: positions start after it, and max_position_embeddings is {positions}",
                off - 1
            ),
        ));
    }
    Ok(off)
}

impl EncoderConfig {
    /// Reads `dir/config.json` (a family of [`Family`]'s) and the
    /// sentence-transformers module files beside it (a classifier's pooling
    /// is its first token's). Errors name the file and the field or line; a
    /// family the encoder cannot compute is refused by name, with what it
    /// lacks.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        let mut c = Self::load_with(dir, Pooling::Cls)?;
        if c.labels.is_none() {
            c.pooling = Modules::load(dir)?.pooling;
        }
        Ok(c)
    }

    /// [`EncoderConfig::load`]'s `config.json` and limit, pooled by
    /// `pooling`.
    pub(crate) fn load_with(dir: &Path, pooling: Pooling) -> Result<Self, KernelError> {
        let path = dir.join("config.json");
        let bytes = read_optional(&path)?.ok_or_else(|| KernelError::Io {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file (a model folder holds config.json, model.safetensors and tokenizer.json)",
            ),
        })?;
        let ModelType {
            model_type,
            architectures,
            id2label,
        } = parse(&path, &bytes)?;
        let labels = match architectures.first() {
            Some(a) if a.ends_with("ForSequenceClassification") => Some(labels(&path, id2label)?),
            _ => None,
        };
        let Some(model_type) = model_type else {
            return Err(config_err(&path, "model_type", "missing"));
        };
        let family = match model_type.as_str() {
            "bert" => Family::Bert,
            "roberta" => Family::Roberta,
            "xlm-roberta" => Family::XlmRoberta,
            "camembert" => Family::Camembert,
            "distilbert" => Family::DistilBert,
            "mpnet" => Family::MpNet,
            other => {
                let why = match NOT_SERVED.iter().find(|(t, _)| *t == other) {
                    Some((_, lacks)) => format!(
                        "\"{other}\" is not served yet: it needs {lacks}, which the encoder does not compute"
                    ),
                    None => format!(
                        "\"{other}\" is not a family the encoder serves (bert, roberta, \
                         xlm-roberta, camembert, distilbert, mpnet)"
                    ),
                };
                return Err(config_err(&path, "model_type", why));
            }
        };
        let mut c = match family {
            Family::Bert | Family::Roberta | Family::XlmRoberta | Family::Camembert => {
                let j: BertJson = parse(&path, &bytes)?;
                if let Some(p) = j.position_embedding_type.as_deref()
                    && p != "absolute"
                {
                    return Err(config_err(
                        &path,
                        "position_embedding_type",
                        format!("\"{p}\"; the encoder computes \"absolute\""),
                    ));
                }
                let positions = j.max_position_embeddings.0;
                let (position_offset, default_eps) = if family == Family::Bert {
                    (0, 1e-12)
                } else {
                    (offset(&path, j.pad_token_id, positions)?, 1e-5)
                };
                Self {
                    family,
                    vocab: j.vocab_size.0,
                    hidden: j.hidden_size.0,
                    layers: j.num_hidden_layers.0,
                    heads: j.num_attention_heads.0,
                    intermediate: j.intermediate_size.0,
                    max_positions: positions - position_offset,
                    position_offset,
                    type_vocab: j.type_vocab_size.map_or(2, |d| d.0),
                    eps: eps(&path, j.layer_norm_eps, default_eps)?,
                    activation: activation(&path, "hidden_act", j.hidden_act.as_deref())?,
                    relative_bias: None,
                    pooling,
                    max_tokens: 0,
                    labels: None,
                }
            }
            Family::DistilBert => {
                let j: DistilBertJson = parse(&path, &bytes)?;
                Self {
                    family,
                    vocab: j.vocab_size.0,
                    hidden: j.dim.0,
                    layers: j.n_layers.0,
                    heads: j.n_heads.0,
                    intermediate: j.hidden_dim.0,
                    max_positions: j.max_position_embeddings.0,
                    position_offset: 0,
                    type_vocab: 0,
                    // Hugging Face's DistilBERT fixes it.
                    eps: 1e-12,
                    activation: activation(&path, "activation", j.activation.as_deref())?,
                    relative_bias: None,
                    pooling,
                    max_tokens: 0,
                    labels: None,
                }
            }
            Family::MpNet => {
                let j: MpNetJson = parse(&path, &bytes)?;
                let positions = j.max_position_embeddings.0;
                // Hugging Face's MPNet counts positions from 2 (its padding
                // id is fixed at 1, whatever `pad_token_id` says) and buckets
                // distances into 32 whatever the table's rows.
                let position_offset = offset(&path, Some(1), positions)?;
                let rows = j.relative_attention_num_buckets.map_or(32, |d| d.0);
                if rows != 32 {
                    return Err(config_err(
                        &path,
                        "relative_attention_num_buckets",
                        format!("{rows}; MPNet's attention buckets distances into 32"),
                    ));
                }
                Self {
                    family,
                    vocab: j.vocab_size.0,
                    hidden: j.hidden_size.0,
                    layers: j.num_hidden_layers.0,
                    heads: j.num_attention_heads.0,
                    intermediate: j.intermediate_size.0,
                    max_positions: positions - position_offset,
                    position_offset,
                    type_vocab: 0,
                    eps: eps(&path, j.layer_norm_eps, 1e-5)?,
                    activation: activation(&path, "hidden_act", j.hidden_act.as_deref())?,
                    relative_bias: Some(RelativeBias {
                        buckets: rows,
                        max_distance: 128,
                    }),
                    pooling,
                    max_tokens: 0,
                    labels: None,
                }
            }
        };
        c.labels = labels;
        if !c.hidden.is_multiple_of(c.heads) {
            let field = if family == Family::DistilBert {
                "n_heads"
            } else {
                "num_attention_heads"
            };
            return Err(config_err(
                &path,
                field,
                format!("{} does not divide the hidden width {}", c.heads, c.hidden),
            ));
        }
        c.max_tokens = max_tokens(dir, c.max_positions)?;
        Ok(c)
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
    /// flop's cost: `len · (1 + 3·len / (2·H + I))`. Every family served
    /// has this layout; MPNet's relative bias adds one addition per score
    /// (under 1% of attention's work). For all-MiniLM-L6-v2 the divisor is
    /// 2304/3 = 768: attention adds 33% at 256 tokens, 3% at 24; for
    /// all-mpnet-base-v2 (H 768, I 3072) it is 1536: 17% at 256 tokens.
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

/// sentence-transformers' `sentence_bert_config.json`.
#[derive(Deserialize)]
struct SentenceBertJson {
    max_seq_length: Option<Dim>,
}

/// `tokenizer_config.json`'s limit (where sentence-transformers 6 keeps
/// `max_seq_length`).
#[derive(Deserialize)]
struct TokenizerConfigJson {
    model_max_length: Option<f64>,
}

/// The longest input, as sentence-transformers takes it:
/// `sentence_bert_config.json`'s `max_seq_length` (at most the model's
/// positions), else the smaller of the positions and
/// `tokenizer_config.json`'s `model_max_length` (a float there: `1e30`
/// says "none").
fn max_tokens(dir: &Path, max_positions: usize) -> Result<usize, KernelError> {
    let path = dir.join("sentence_bert_config.json");
    if let Some(SentenceBertJson {
        max_seq_length: Some(Dim(n)),
    }) = read_json::<SentenceBertJson>(&path)?
    {
        if n > max_positions {
            return Err(config_err(
                &path,
                "max_seq_length",
                format!("{n}, past the model's {max_positions} positions"),
            ));
        }
        return Ok(n);
    }
    let path = dir.join("tokenizer_config.json");
    match read_json::<TokenizerConfigJson>(&path)? {
        Some(TokenizerConfigJson {
            model_max_length: Some(n),
        }) if n >= 1.0 && n < max_positions as f64 => Ok(n as usize),
        _ => Ok(max_positions),
    }
}
