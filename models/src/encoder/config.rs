//! What an encoder is, read from a model folder: Hugging Face's
//! `config.json`, one serde type per family, turned into one
//! [`EncoderConfig`] the forward pass reads; and sentence-transformers'
//! `max_seq_length` (`sentence_bert_config.json`).
//!
//! The families served are one stack of layers, each attention then an
//! MLP, composed per family from these parts:
//!
//! | family | positions | norm | layer | attention | MLP |
//! |---|---|---|---|---|---|
//! | BERT, RoBERTa, XLM-R, CamemBERT | learned table (+ token types) | LayerNorm | post-norm | all keys, biased | GELU |
//! | DistilBERT | learned table | LayerNorm | post-norm | all keys, biased | GELU |
//! | MPNet | learned table + relative bias | LayerNorm | post-norm | all keys, biased | GELU |
//! | ModernBERT | rotary (two bases) | LayerNorm, no bias | pre-norm, final norm | global / local window, alternating | GeGLU |
//! | Qwen3 | rotary | RMSNorm (+ per-head on Q, K) | pre-norm, final norm | causal, grouped-query | SwiGLU |
//! | NomicBERT | rotary (+ token types) | LayerNorm | post-norm | all keys, no bias | SwiGLU |
//! | GTE | rotary (+ token types) | LayerNorm | post-norm | all keys, biased | gated GELU |
//!
//! They differ besides in their tensors' names, the positions' offset
//! (RoBERTa's and MPNet's start after the padding id) and token types
//! (BERT's; none in DistilBERT and MPNet, one in RoBERTa's).

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
    /// `modernbert` (ModernBERT, gte-modernbert, modernbert-embed).
    ModernBert,
    /// `qwen3` (Qwen3-Embedding): a decoder, pooled by its last token.
    Qwen3,
    /// `nomic_bert` (nomic-embed-text v1, v1.5): rotary, SwiGLU, post-norm.
    NomicBert,
    /// `gte`, the Hub's `new` (gte-multilingual-base; the NTK-scaled
    /// gte-*-en-v1.5 are refused by `rope_scaling`): rotary, gated GELU,
    /// post-norm.
    Gte,
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
            Family::ModernBert => "modernbert",
            Family::Qwen3 => "qwen3",
            Family::NomicBert => "nomic_bert",
            Family::Gte => "gte",
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
            Family::ModernBert | Family::Qwen3 => "model.",
            Family::NomicBert => "nomic_bert.",
            // The Hub's checkpoints (`new`) are prefixed `new.`: the reader
            // tries both.
            Family::Gte => "gte.",
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
    /// `silu` (`swish`): `x·σ(x)`, SwiGLU's.
    Silu,
}

/// How a layer normalises its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NormKind {
    /// LayerNorm: centred, scaled, shifted (a shift of 0 where the family
    /// has no bias).
    Layer,
    /// RMSNorm: scaled by the root mean square, not centred or shifted.
    Rms,
}

/// Rotary positions (RoPE) in place of a position table: each head's
/// queries and keys turned by angles of their position, base `theta`
/// (`local_theta` in a layer of local attention).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotary {
    /// The base of the global layers' angles (`rope_theta`).
    pub theta: f64,
    /// The base of the local layers' angles (ModernBERT's
    /// `local_rope_theta`).
    pub local_theta: f64,
}

impl Rotary {
    /// One base for every layer (no local layers).
    fn global(theta: f64) -> Self {
        Self {
            theta,
            local_theta: theta,
        }
    }
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
    /// Width of one attention head (`head_dim`; else `hidden / heads`).
    pub head_width: usize,
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
    /// Key-value heads (`num_key_value_heads`): fewer than `heads` in a
    /// grouped-query decoder, each shared by `heads / kv_heads` queries.
    pub kv_heads: usize,
    /// The norm's kind.
    pub norm: NormKind,
    /// Pre-norm layers (each part's input normalised, a final norm after
    /// the last layer) rather than BERT's post-norm.
    pub pre_norm: bool,
    /// A gated MLP (GeGLU, SwiGLU): the up projection gives `2·I` values,
    /// the activation of the first `I` times the other `I`.
    pub gated: bool,
    /// Rotary positions, where the family has no position table.
    pub rotary: Option<Rotary>,
    /// Causal attention: a token sees the keys up to its own (a decoder).
    pub causal: bool,
    /// Per layer: the distance from its query past which keys are not
    /// seen (ModernBERT's local layers: half of `local_attention`), or
    /// `None` for all of them.
    pub windows: Vec<Option<usize>>,
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

/// Families named here are refused by name, with why.
const NOT_SERVED: &[(&str, &str)] = &[
    (
        "jina_bert",
        "it needs ALiBi attention biases, which the encoder does not compute",
    ),
    (
        "deberta-v2",
        "it needs disentangled attention over relative positions, which the \
         encoder does not compute",
    ),
    (
        "qwen2",
        "its decoder differs from Qwen3's (biased Q, K, V; no per-head norm) \
         and is not composed yet",
    ),
    (
        "mistral",
        "its decoder (sliding-window causal attention) is not composed yet",
    ),
    (
        "gemma3_text",
        "its decoder (scaled embeddings, four norms a layer) is not composed yet",
    ),
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
        "silu" | "swish" => Ok(Activation::Silu),
        other => Err(config_err(
            path,
            field,
            format!("\"{other}\"; the encoder computes gelu, gelu_new (tanh), relu and silu"),
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

/// Whether `c` is a classifier of a family whose head is not read.
fn labels_of_new_family(c: &EncoderConfig) -> bool {
    c.labels.is_some() && c.rotary.is_some()
}

/// Refuses a config whose rotary angles are scaled (`field` set): the
/// encoder computes the default ones.
fn unscaled(path: &Path, field: &'static str, scaled: bool) -> Result<(), KernelError> {
    if scaled {
        return Err(config_err(
            path,
            field,
            "scaled rotary angles are not computed; the encoder computes the default ones",
        ));
    }
    Ok(())
}

/// One rotary setting (`rope_parameters`, or one layer type's there).
#[derive(Deserialize)]
struct RopeJson {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
}

/// A rotary base: `theta` of `rope` (Transformers 5's `rope_parameters`),
/// else of the older field, else `default`; scaled kinds refused.
fn rope_theta(
    path: &Path,
    field: &'static str,
    rope: Option<&RopeJson>,
    old: Option<f64>,
    default: f64,
) -> Result<f64, KernelError> {
    if let Some(t) = rope.and_then(|r| r.rope_type.as_deref())
        && t != "default"
    {
        return Err(config_err(
            path,
            field,
            format!("rope_type \"{t}\"; the encoder computes \"default\" (unscaled) rotary angles"),
        ));
    }
    let theta = rope.and_then(|r| r.rope_theta).or(old).unwrap_or(default);
    if !(theta.is_finite() && theta > 1.0) {
        return Err(config_err(
            path,
            field,
            format!("rope_theta {theta}; expected a number above 1"),
        ));
    }
    Ok(theta)
}

/// ModernBERT's `rope_parameters`, one per layer type.
#[derive(Deserialize)]
struct ModernRopeJson {
    full_attention: Option<RopeJson>,
    sliding_attention: Option<RopeJson>,
}

/// ModernBERT's `config.json`: both the Hub's fields
/// (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`)
/// and Transformers 5's (`layer_types`, `rope_parameters`).
#[derive(Deserialize)]
struct ModernBertJson {
    vocab_size: Dim,
    hidden_size: Dim,
    num_hidden_layers: Dim,
    num_attention_heads: Dim,
    intermediate_size: Dim,
    max_position_embeddings: Dim,
    norm_eps: Option<f64>,
    hidden_activation: Option<String>,
    global_attn_every_n_layers: Option<Dim>,
    local_attention: Option<Dim>,
    global_rope_theta: Option<f64>,
    /// Absent: 10 000; `null`: the global base (as Transformers 4's
    /// ModernBERT takes it, which sets a local layer's base only where
    /// this is a number).
    #[serde(default, deserialize_with = "present")]
    local_rope_theta: Option<Option<f64>>,
    layer_types: Option<Vec<String>>,
    rope_parameters: Option<ModernRopeJson>,
    rope_scaling: Option<serde::de::IgnoredAny>,
}

/// A field that may be absent (`None`) or `null` (`Some(None)`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

fn modernbert(
    path: &Path,
    j: ModernBertJson,
    pooling: Pooling,
) -> Result<EncoderConfig, KernelError> {
    unscaled(path, "rope_scaling", j.rope_scaling.is_some())?;
    let layers = j.num_hidden_layers.0;
    let radius = j.local_attention.map_or(128, |d| d.0) / 2;
    let windows = match j.layer_types {
        Some(types) => {
            if types.len() != layers {
                return Err(config_err(
                    path,
                    "layer_types",
                    format!("{} types for {layers} layers", types.len()),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(None),
                    "sliding_attention" => Ok(Some(radius)),
                    other => Err(config_err(
                        path,
                        "layer_types",
                        format!("\"{other}\"; expected full_attention or sliding_attention"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        None => {
            let every = j.global_attn_every_n_layers.map_or(3, |d| d.0).max(1);
            (0..layers)
                .map(|l| (!l.is_multiple_of(every)).then_some(radius))
                .collect()
        }
    };
    let rp = j.rope_parameters.as_ref();
    let theta = rope_theta(
        path,
        "rope_parameters",
        rp.and_then(|r| r.full_attention.as_ref()),
        j.global_rope_theta,
        160_000.0,
    )?;
    let local_theta = rope_theta(
        path,
        "rope_parameters",
        rp.and_then(|r| r.sliding_attention.as_ref()),
        j.local_rope_theta.map(|t| t.unwrap_or(theta)),
        10_000.0,
    )?;
    Ok(EncoderConfig {
        family: Family::ModernBert,
        vocab: j.vocab_size.0,
        hidden: j.hidden_size.0,
        layers,
        heads: j.num_attention_heads.0,
        intermediate: j.intermediate_size.0,
        max_positions: j.max_position_embeddings.0,
        eps: eps(path, j.norm_eps, 1e-5)?,
        activation: activation(path, "hidden_activation", j.hidden_activation.as_deref())?,
        pre_norm: true,
        gated: true,
        rotary: Some(Rotary { theta, local_theta }),
        windows,
        pooling,
        ..EncoderConfig::post_norm()
    })
}

/// Refuses `field` where the file sets it to other than `ok`.
fn only<T: PartialEq + std::fmt::Debug>(
    path: &Path,
    field: &'static str,
    value: Option<T>,
    ok: T,
    why: &str,
) -> Result<(), KernelError> {
    match value {
        Some(v) if v != ok => Err(config_err(path, field, format!("{v:?}; {why}"))),
        _ => Ok(()),
    }
}

/// NomicBERT's `config.json`: Transformers' names, or the Hub's
/// checkpoints' GPT-2 names (`n_embd`, `n_layer`, …, `rotary_emb_base`).
#[derive(Deserialize)]
struct NomicJson {
    vocab_size: Dim,
    #[serde(alias = "n_embd")]
    hidden_size: Dim,
    #[serde(alias = "n_layer")]
    num_hidden_layers: Dim,
    #[serde(alias = "n_head")]
    num_attention_heads: Dim,
    #[serde(alias = "n_inner")]
    intermediate_size: Dim,
    #[serde(alias = "n_positions")]
    max_position_embeddings: Dim,
    head_dim: Option<Dim>,
    type_vocab_size: Option<Dim>,
    #[serde(alias = "layer_norm_epsilon")]
    layer_norm_eps: Option<f64>,
    #[serde(alias = "activation_function")]
    hidden_act: Option<String>,
    rope_parameters: Option<RopeJson>,
    rotary_emb_base: Option<f64>,
    rope_scaling: Option<serde::de::IgnoredAny>,
    rotary_scaling_factor: Option<f64>,
    rotary_emb_fraction: Option<f64>,
    rotary_emb_interleaved: Option<bool>,
    prenorm: Option<bool>,
}

fn nomic_bert(path: &Path, j: NomicJson, pooling: Pooling) -> Result<EncoderConfig, KernelError> {
    unscaled(
        path,
        "rotary_scaling_factor",
        j.rope_scaling.is_some() || j.rotary_scaling_factor.is_some(),
    )?;
    only(
        path,
        "rotary_emb_fraction",
        j.rotary_emb_fraction,
        1.0,
        "the encoder turns every pair",
    )?;
    only(
        path,
        "rotary_emb_interleaved",
        j.rotary_emb_interleaved,
        false,
        "the encoder pairs split halves",
    )?;
    only(
        path,
        "prenorm",
        j.prenorm,
        false,
        "NomicBERT's layers are post-norm",
    )?;
    // The Hub's "swiglu" names the gated form of SiLU.
    let act = match j.hidden_act.as_deref() {
        None | Some("swiglu") => "silu",
        Some(a) => a,
    };
    Ok(EncoderConfig {
        family: Family::NomicBert,
        vocab: j.vocab_size.0,
        hidden: j.hidden_size.0,
        layers: j.num_hidden_layers.0,
        heads: j.num_attention_heads.0,
        head_width: j.head_dim.map_or(0, |d| d.0),
        intermediate: j.intermediate_size.0,
        max_positions: j.max_position_embeddings.0,
        type_vocab: j.type_vocab_size.map_or(2, |d| d.0),
        eps: eps(path, j.layer_norm_eps, 1e-12)?,
        activation: activation(path, "hidden_act", Some(act))?,
        gated: true,
        rotary: Some(Rotary::global(rope_theta(
            path,
            "rope_parameters",
            j.rope_parameters.as_ref(),
            j.rotary_emb_base,
            1000.0,
        )?)),
        pooling,
        ..EncoderConfig::post_norm()
    })
}

/// GTE's `config.json` (Transformers' `gte`, or the Hub's `new`).
#[derive(Deserialize)]
struct GteJson {
    vocab_size: Dim,
    hidden_size: Dim,
    num_hidden_layers: Dim,
    num_attention_heads: Dim,
    intermediate_size: Dim,
    max_position_embeddings: Dim,
    /// 0 in gte-*-en-v1.5: no token types.
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeJson>,
    rope_scaling: Option<serde::de::IgnoredAny>,
    position_embedding_type: Option<String>,
    layer_norm_type: Option<String>,
    logn_attention_scale: Option<bool>,
}

fn gte(path: &Path, j: GteJson, pooling: Pooling) -> Result<EncoderConfig, KernelError> {
    unscaled(path, "rope_scaling", j.rope_scaling.is_some())?;
    let rope = "rope".to_string();
    only(
        path,
        "position_embedding_type",
        j.position_embedding_type,
        rope,
        "GTE's positions are rotary",
    )?;
    let ln = "layer_norm".to_string();
    only(
        path,
        "layer_norm_type",
        j.layer_norm_type,
        ln,
        "the encoder computes LayerNorm",
    )?;
    only(
        path,
        "logn_attention_scale",
        j.logn_attention_scale,
        false,
        "the encoder scales scores by 1/sqrt(d) only",
    )?;
    Ok(EncoderConfig {
        family: Family::Gte,
        vocab: j.vocab_size.0,
        hidden: j.hidden_size.0,
        layers: j.num_hidden_layers.0,
        heads: j.num_attention_heads.0,
        intermediate: j.intermediate_size.0,
        max_positions: j.max_position_embeddings.0,
        type_vocab: j.type_vocab_size.unwrap_or(1),
        eps: eps(path, j.layer_norm_eps, 1e-12)?,
        activation: activation(path, "hidden_act", j.hidden_act.as_deref())?,
        gated: true,
        rotary: Some(Rotary::global(rope_theta(
            path,
            "rope_parameters",
            j.rope_parameters.as_ref(),
            j.rope_theta,
            160_000.0,
        )?)),
        pooling,
        ..EncoderConfig::post_norm()
    })
}

/// Qwen3's `config.json`.
#[derive(Deserialize)]
struct Qwen3Json {
    vocab_size: Dim,
    hidden_size: Dim,
    num_hidden_layers: Dim,
    num_attention_heads: Dim,
    num_key_value_heads: Option<Dim>,
    head_dim: Option<Dim>,
    intermediate_size: Dim,
    max_position_embeddings: Dim,
    rms_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeJson>,
    rope_scaling: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    attention_bias: bool,
}

fn qwen3(path: &Path, j: Qwen3Json, pooling: Pooling) -> Result<EncoderConfig, KernelError> {
    unscaled(path, "rope_scaling", j.rope_scaling.is_some())?;
    if j.use_sliding_window {
        return Err(config_err(
            path,
            "use_sliding_window",
            "true; the encoder's causal attention sees every earlier token",
        ));
    }
    if j.attention_bias {
        return Err(config_err(
            path,
            "attention_bias",
            "true; Qwen3's projections are read without biases",
        ));
    }
    let heads = j.num_attention_heads.0;
    Ok(EncoderConfig {
        family: Family::Qwen3,
        vocab: j.vocab_size.0,
        hidden: j.hidden_size.0,
        layers: j.num_hidden_layers.0,
        heads,
        kv_heads: j.num_key_value_heads.map_or(heads, |d| d.0),
        head_width: j.head_dim.map_or(0, |d| d.0),
        intermediate: j.intermediate_size.0,
        max_positions: j.max_position_embeddings.0,
        eps: eps(path, j.rms_norm_eps, 1e-6)?,
        activation: activation(path, "hidden_act", j.hidden_act.as_deref().or(Some("silu")))?,
        norm: NormKind::Rms,
        pre_norm: true,
        gated: true,
        rotary: Some(Rotary::global(rope_theta(
            path,
            "rope_parameters",
            j.rope_parameters.as_ref(),
            j.rope_theta,
            1_000_000.0,
        )?)),
        causal: true,
        pooling,
        ..EncoderConfig::post_norm()
    })
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
            "modernbert" => Family::ModernBert,
            "qwen3" => Family::Qwen3,
            "nomic_bert" => Family::NomicBert,
            "gte" | "new" => Family::Gte,
            other => {
                let why = match NOT_SERVED.iter().find(|(t, _)| *t == other) {
                    Some((_, why)) => format!("\"{other}\" is not served yet: {why}"),
                    None => format!(
                        "\"{other}\" is not a family the encoder serves (bert, roberta, \
                         xlm-roberta, camembert, distilbert, mpnet, modernbert, qwen3, nomic_bert, gte)"
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
                    ..Self::post_norm()
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
                    ..Self::post_norm()
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
                    ..Self::post_norm()
                }
            }
            Family::ModernBert => modernbert(&path, parse(&path, &bytes)?, pooling)?,
            Family::Qwen3 => qwen3(&path, parse(&path, &bytes)?, pooling)?,
            Family::NomicBert => nomic_bert(&path, parse(&path, &bytes)?, pooling)?,
            Family::Gte => gte(&path, parse(&path, &bytes)?, pooling)?,
        };
        c.labels = labels;
        let heads_field = if family == Family::DistilBert {
            "n_heads"
        } else {
            "num_attention_heads"
        };
        if c.heads == 0 || c.layers == 0 || c.hidden == 0 {
            return Err(config_err(
                &path,
                heads_field,
                "an encoder has at least one layer, one head and a width",
            ));
        }
        if c.head_width == 0 {
            if !c.hidden.is_multiple_of(c.heads) {
                return Err(config_err(
                    &path,
                    heads_field,
                    format!("{} does not divide the hidden width {}", c.heads, c.hidden),
                ));
            }
            c.head_width = c.hidden / c.heads;
        }
        if c.kv_heads == 0 {
            c.kv_heads = c.heads;
        }
        if !c.heads.is_multiple_of(c.kv_heads) {
            return Err(config_err(
                &path,
                "num_key_value_heads",
                format!("{} does not divide the {} heads", c.kv_heads, c.heads),
            ));
        }
        if c.rotary.is_some() && !c.head_width.is_multiple_of(2) {
            return Err(config_err(
                &path,
                "head_dim",
                format!(
                    "{}: rotary positions turn pairs, so a head's width is even",
                    c.head_width
                ),
            ));
        }
        if c.windows.is_empty() {
            c.windows = vec![None; c.layers];
        }
        if labels_of_new_family(&c) {
            return Err(config_err(
                &path,
                "architectures",
                format!(
                    "a {} classifier's head is not read yet; its embedding model is served",
                    c.family.model_type()
                ),
            ));
        }
        c.max_tokens = max_tokens(dir, c.max_positions)?;
        Ok(c)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_width
    }

    /// The fields every family of BERT's layout shares: post-norm
    /// LayerNorm layers of all-keys attention, every head its own keys, a
    /// plain MLP, positions from a table. The widths marked 0 are set
    /// once the family's fields are read.
    fn post_norm() -> Self {
        Self {
            family: Family::Bert,
            vocab: 0,
            hidden: 0,
            layers: 0,
            heads: 0,
            intermediate: 0,
            head_width: 0,
            max_positions: 0,
            position_offset: 0,
            type_vocab: 0,
            eps: 1e-12,
            activation: Activation::GeluErf,
            relative_bias: None,
            kv_heads: 0,
            norm: NormKind::Layer,
            pre_norm: false,
            gated: false,
            rotary: None,
            causal: false,
            windows: Vec::new(),
            pooling: Pooling::Mean,
            max_tokens: 0,
            labels: None,
        }
    }

    /// Floating-point operations of one token's pass through the dense
    /// layers (multiply and add counted apart): per layer `2·H` times the
    /// projections' outputs (Q, K and V, attention's output, the MLP's up
    /// and down: `8·H² + 4·H·I` in BERT's layout; a gated MLP's up is
    /// `2·I` wide), and SPLADE's head (`2·H·(H + vocab)`).
    pub fn flops_per_token(&self) -> f64 {
        self.dense_flops() as f64
    }

    fn dense_flops(&self) -> u128 {
        let (h, i, d) = (
            self.hidden as u128,
            self.intermediate as u128,
            self.head_width as u128,
        );
        let (q, kv) = (self.heads as u128 * d, self.kv_heads as u128 * d);
        let mlp = if self.gated { 3 * h * i } else { 2 * h * i };
        // SPLADE's head: a transform and the logits over the vocabulary.
        let head = match self.pooling {
            Pooling::Splade => 2 * (h * h + h * self.vocab as u128),
            _ => 0,
        };
        self.layers as u128 * 2 * (h * (q + 2 * kv) + q * h + mlp) + head
    }

    /// Query-key pairs one layer scores in a sequence of `len` tokens:
    /// `len²`, fewer when queries see only earlier keys (causal) or those
    /// within `window` of them.
    fn pairs(&self, len: usize, window: Option<usize>) -> u128 {
        let n = len as u128;
        match (self.causal, window) {
            (true, _) => n * (n + 1) / 2,
            (false, None) => n * n,
            (false, Some(r)) => (0..len)
                .map(|q| (q.saturating_add(r).min(len - 1) - q.saturating_sub(r) + 1) as u128)
                .sum(),
        }
    }

    /// The work of a sequence of `len` tokens in token-equivalents: `len`
    /// for the dense layers, plus attention's flops (`4·d` a scored pair
    /// and head: the score and the weighted sum) at [`ATTENTION_COST`]
    /// times a dense flop's cost, over the dense layers' flops a token. In
    /// BERT's layout that is `len · (1 + 3·len / (2·H + I))`: for
    /// all-MiniLM-L6-v2 the divisor is 2304/3 = 768, attention adding 33%
    /// at 256 tokens and 3% at 24; for all-mpnet-base-v2 (H 768, I 3072)
    /// 1536, 17% at 256 tokens (MPNet's relative bias adds one addition a
    /// score, under 1% of attention's work). A causal decoder scores half
    /// the pairs; ModernBERT's local layers at most `2·64 + 1` keys a
    /// query.
    pub fn work(&self, len: usize) -> usize {
        let per_pair = 4 * self.heads as u128 * self.head_width as u128;
        let pairs: u128 = self.windows.iter().map(|&w| self.pairs(len, w)).sum();
        let attention =
            (ATTENTION_COST as u128 * per_pair * pairs).div_ceil(self.dense_flops().max(1));
        len.saturating_add(usize::try_from(attention).unwrap_or(usize::MAX))
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
