//! An encoder's weights, read once from `model.safetensors` (or the shards
//! `model.safetensors.index.json` lists) by their family's names, and
//! shared by every batch.
//!
//! f16 and bf16 tensors are widened to f32 as they are read, once, at
//! load: the CPU pass computes in f32 whatever the file holds (the values
//! are the file's exactly; the arithmetic is f32's).

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

use coexec_kernels::KernelError;
#[cfg(feature = "cuda")]
use coexec_kernels::cuda::bert::{BertImage, BertShape, LayerRef};
use coexec_kernels::tensors::{read, read_f32, tensor_err};

use super::config::{EncoderConfig, Family};
use crate::folder::{config_err, read_json};
use crate::modules::{self, DenseActivation, Modules, Pooling};

/// A dense layer `y = x·Wᵀ + b`, `W` row-major `[out, in]` (PyTorch's).
#[derive(Debug)]
pub(crate) struct Dense {
    pub(crate) w: Box<[f32]>,
    pub(crate) b: Box<[f32]>,
    pub(crate) inp: usize,
    pub(crate) out: usize,
}

/// A norm's scale and shift (the shift zeros where the family's LayerNorm
/// has no bias, empty in an RMSNorm).
#[derive(Debug)]
pub(crate) struct Norm {
    pub(crate) gamma: Box<[f32]>,
    pub(crate) beta: Box<[f32]>,
}

/// One encoder layer. Q, K and V are one dense layer (their rows stacked:
/// all heads' queries, then the keys, then the values), so a tile's
/// projections are one GEMM; a gated MLP's two up projections are one too
/// (the activated half first).
#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) qkv: Dense,
    /// Qwen3's RMSNorm of each head's queries and of its keys.
    pub(crate) qk_norm: Option<(Norm, Norm)>,
    pub(crate) attn_out: Dense,
    /// Post-norm: after attention's residual; pre-norm: before attention
    /// (none in ModernBERT's first layer).
    pub(crate) attn_norm: Option<Norm>,
    pub(crate) up: Dense,
    pub(crate) down: Dense,
    /// Post-norm: after the MLP's residual; pre-norm: before the MLP.
    pub(crate) out_norm: Norm,
}

/// A masked-language-model head (BERT's `cls.predictions`), SPLADE's:
/// `LayerNorm(act(x·Tᵀ + t))`, then logits over the vocabulary against the
/// word embeddings (tied, as BERT's are, unless the file has a decoder of
/// its own) plus a bias.
#[derive(Debug)]
pub(crate) struct MlmHead {
    pub(crate) transform: Dense,
    pub(crate) norm: Norm,
    /// `[vocab, H]` where the file has its own; `None`: the word table.
    pub(crate) decoder: Option<Box<[f32]>>,
    pub(crate) bias: Box<[f32]>,
}

/// The weights of an encoder and its sentence-transformers modules, loaded
/// once and shared (behind an `Arc`) by every batch's
/// [`Encoder`](super::Encoder).
#[derive(Debug)]
pub struct EncoderWeights {
    pub(crate) cfg: EncoderConfig,
    pub(crate) modules: Modules,
    /// `[vocab, H]`.
    pub(crate) word: Box<[f32]>,
    /// `[max_positions, H]`: position `p`'s row of the position embeddings
    /// (the family's offset applied), with token type 0's vector added
    /// where the family has token types (every input is one segment);
    /// empty where positions are rotary.
    pub(crate) pos_type: Box<[f32]>,
    /// The embeddings' norm (none in a decoder).
    pub(crate) emb_norm: Option<Norm>,
    pub(crate) layers: Vec<Layer>,
    /// A pre-norm stack's norm after its last layer.
    pub(crate) final_norm: Option<Norm>,
    /// SPLADE's head.
    pub(crate) mlm: Option<MlmHead>,
    /// MPNet's relative-position bias, `[buckets, heads]`.
    pub(crate) rel_bias: Option<Box<[f32]>>,
    /// A classifier's token type 1 less type 0 (`[H]`), added to the rows
    /// of a pair's second text, and the separator token after which that
    /// text starts ([`EncoderWeights::set_pair_separator`]).
    pub(crate) second_type: Option<(Box<[f32]>, u32)>,
    /// Type 1 less type 0, before its separator is known.
    type_delta: Option<Box<[f32]>>,
    /// The dtype the file holds (`float32`, `float16`, `bfloat16`).
    dtype: &'static str,
    sha256: String,
    source: PathBuf,
    /// The weights as one flat buffer for a GPU, built on first use (or
    /// why they cannot be).
    #[cfg(feature = "cuda")]
    image: std::sync::OnceLock<Result<BertImage, String>>,
}

/// The weights as one buffer in the GPU twin's layout (`coexec_kernels`
/// checks every tensor's length against the shape as it lays it out).
#[cfg(feature = "cuda")]
fn image_of(w: &EncoderWeights) -> Result<BertImage, KernelError> {
    let c = &w.cfg;
    let shape = BertShape::new(
        c.hidden,
        c.heads,
        c.intermediate,
        c.vocab,
        c.max_positions,
        c.eps,
        c.pooling == Pooling::Mean,
    )?;
    fn norm(n: &Norm) -> (&[f32], &[f32]) {
        (&n.gamma, &n.beta)
    }
    fn dense(d: &Dense) -> (&[f32], &[f32]) {
        (&d.w, &d.b)
    }
    let missing = || KernelError::invalid("encoder image", "not of BERT's layout");
    let emb_norm = w.emb_norm.as_ref().ok_or_else(missing)?;
    let mut img = BertImage::new(shape, &w.word, &w.pos_type, norm(emb_norm))?;
    for l in &w.layers {
        img.layer(LayerRef {
            qkv: dense(&l.qkv),
            attn_out: dense(&l.attn_out),
            attn_norm: norm(l.attn_norm.as_ref().ok_or_else(missing)?),
            up: dense(&l.up),
            down: dense(&l.down),
            out_norm: norm(&l.out_norm),
        })?;
    }
    Ok(img)
}

/// `model.safetensors.index.json`: which file holds each tensor.
#[derive(serde::Deserialize)]
struct ShardIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The weight files of a folder, read: `model.safetensors`, or the shards
/// its index names (in name order).
struct Files {
    files: Vec<(PathBuf, Vec<u8>)>,
}

impl Files {
    fn load(dir: &Path) -> Result<Self, KernelError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.exists() || !index.exists() {
            if !single.exists() && dir.join("pytorch_model.bin").exists() {
                return Err(tensor_err(
                    &dir.join("pytorch_model.bin"),
                    "",
                    "only safetensors are read: convert it (transformers' save_pretrained \
                     writes model.safetensors)",
                ));
            }
            let bytes = read(&single)?;
            return Ok(Self {
                files: vec![(single, bytes)],
            });
        }
        let Some(ShardIndex { weight_map }) = read_json::<ShardIndex>(&index)? else {
            unreachable!("the index exists");
        };
        let mut names: Vec<&String> = weight_map.values().collect();
        names.sort_unstable();
        names.dedup();
        let mut files = Vec::with_capacity(names.len());
        for n in names {
            if n.contains('/') || n.contains('\\') || n.starts_with('.') {
                return Err(config_err(
                    &index,
                    "weight_map",
                    format!("{n:?} is not a file beside the index"),
                ));
            }
            let p = dir.join(n);
            let b = read(&p)?;
            files.push((p, b));
        }
        Ok(Self { files })
    }

    /// SHA-256 of the files' bytes, in order, hex.
    fn sha256(&self) -> String {
        let mut h = Sha256::new();
        for (_, b) in &self.files {
            h.update(b);
        }
        format!("{:x}", h.finalize())
    }
}

/// Reads tensors by name across a folder's files, under one name prefix
/// (`bert.` in checkpoints saved with a task head, none in a bare model's).
struct Reader<'a> {
    files: Vec<(&'a Path, SafeTensors<'a>)>,
    prefix: &'static str,
}

impl<'a> Reader<'a> {
    fn new(files: &'a Files, family: Family, first: &str) -> Result<Self, KernelError> {
        let files = files
            .files
            .iter()
            .map(|(p, b)| {
                SafeTensors::deserialize(b)
                    .map(|st| (p.as_path(), st))
                    .map_err(|e| tensor_err(p, "", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let has = |n: &str| files.iter().any(|(_, st)| st.tensor(n).is_ok());
        // The Hub's GTE checkpoints are prefixed `new.`.
        let candidates: &[&'static str] = match family {
            Family::Gte => &["gte.", "new."],
            _ => &[family.prefix()],
        };
        let prefix = match candidates.iter().find(|p| has(&format!("{p}{first}"))) {
            Some(p) if !has(first) => p,
            _ => "",
        };
        Ok(Self { files, prefix })
    }

    /// The file that holds `name` (the first file, for its error, where
    /// none does).
    fn file_of(&self, name: &str) -> &(&'a Path, SafeTensors<'a>) {
        self.files
            .iter()
            .find(|(_, st)| st.tensor(name).is_ok())
            .unwrap_or(&self.files[0])
    }

    /// The dtype of tensor `name` as `/info` names it.
    fn dtype(&self, name: &str) -> &'static str {
        let name = format!("{}{name}", self.prefix);
        match self.file_of(&name).1.tensor(&name).map(|t| t.dtype()) {
            Ok(safetensors::Dtype::F16) => "float16",
            Ok(safetensors::Dtype::BF16) => "bfloat16",
            _ => "float32",
        }
    }

    fn tensor(&self, name: &str, want: &[usize]) -> Result<Box<[f32]>, KernelError> {
        self.unprefixed(&format!("{}{name}", self.prefix), want)
    }

    /// Tensor `name` as the files name it, outside the encoder's prefix (a
    /// task head's).
    fn unprefixed(&self, name: &str, want: &[usize]) -> Result<Box<[f32]>, KernelError> {
        let want: Vec<Option<usize>> = want.iter().map(|&d| Some(d)).collect();
        let (path, st) = self.file_of(name);
        Ok(read_f32(st, path, name, &want)?.data)
    }

    /// Whether the files hold `name`, outside the prefix.
    fn has_unprefixed(&self, name: &str) -> bool {
        self.file_of(name).1.tensor(name).is_ok()
    }

    fn dense(&self, name: &str, out: usize, inp: usize) -> Result<Dense, KernelError> {
        Ok(Dense {
            w: self.tensor(&format!("{name}.weight"), &[out, inp])?,
            b: self.tensor(&format!("{name}.bias"), &[out])?,
            inp,
            out,
        })
    }

    fn norm(&self, name: &str, h: usize) -> Result<Norm, KernelError> {
        Ok(Norm {
            gamma: self.tensor(&format!("{name}.weight"), &[h])?,
            beta: self.tensor(&format!("{name}.bias"), &[h])?,
        })
    }

    /// Whether the files hold `name` (under the prefix).
    fn has(&self, name: &str) -> bool {
        self.has_unprefixed(&format!("{}{name}", self.prefix))
    }

    /// A dense layer whose bias the family makes optional
    /// (`attention_bias`, `mlp_bias`): read where the file has it, zeros
    /// where it has none.
    fn dense_maybe_biased(&self, name: &str, out: usize, inp: usize) -> Result<Dense, KernelError> {
        let b = format!("{name}.bias");
        Ok(Dense {
            w: self.tensor(&format!("{name}.weight"), &[out, inp])?,
            b: if self.has(&b) {
                self.tensor(&b, &[out])?
            } else {
                vec![0.0; out].into_boxed_slice()
            },
            inp,
            out,
        })
    }

    /// A norm whose shift is optional (ModernBERT's `norm_bias`); an
    /// RMSNorm's (`rms`) has none.
    fn norm_maybe_shifted(&self, name: &str, h: usize, rms: bool) -> Result<Norm, KernelError> {
        let b = format!("{name}.bias");
        Ok(Norm {
            gamma: self.tensor(&format!("{name}.weight"), &[h])?,
            beta: if rms {
                Box::default()
            } else if self.has(&b) {
                self.tensor(&b, &[h])?
            } else {
                vec![0.0; h].into_boxed_slice()
            },
        })
    }

    /// Dense layers `names` of `outs` outputs each, stacked as one.
    fn stacked(&self, names: &[String], outs: &[usize], inp: usize) -> Result<Dense, KernelError> {
        let parts = names
            .iter()
            .zip(outs)
            .map(|(n, &o)| self.dense_maybe_biased(n, o, inp))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Dense {
            w: parts.iter().flat_map(|d| d.w.iter().copied()).collect(),
            b: parts.iter().flat_map(|d| d.b.iter().copied()).collect(),
            inp,
            out: outs.iter().sum(),
        })
    }

    /// Q, K and V (`names`) as one dense layer of `3·h` outputs.
    fn qkv(&self, names: [String; 3], h: usize) -> Result<Dense, KernelError> {
        let [q, k, v] = names;
        let (q, k, v) = (
            self.dense(&q, h, h)?,
            self.dense(&k, h, h)?,
            self.dense(&v, h, h)?,
        );
        Ok(Dense {
            w: [q.w, k.w, v.w].concat().into_boxed_slice(),
            b: [q.b, k.b, v.b].concat().into_boxed_slice(),
            inp: h,
            out: 3 * h,
        })
    }

    /// A gated MLP's up projection stored `[linear; activated]` (GTE's
    /// Hub checkpoints' `up_gate_proj`), as the pass takes it: the
    /// activated half first.
    fn swapped_halves(&self, name: &str, i: usize, h: usize) -> Result<Dense, KernelError> {
        let mut d = self.dense_maybe_biased(name, 2 * i, h)?;
        let (w, b) = (d.w.clone(), d.b.clone());
        d.w[..i * h].copy_from_slice(&w[i * h..]);
        d.w[i * h..].copy_from_slice(&w[..i * h]);
        d.b[..i].copy_from_slice(&b[i..]);
        d.b[i..].copy_from_slice(&b[..i]);
        Ok(d)
    }

    /// Layer `l` by its family's names.
    fn layer(&self, c: &EncoderConfig, l: usize) -> Result<Layer, KernelError> {
        let (family, h, i) = (c.family, c.hidden, c.intermediate);
        let (q, kv) = (c.heads * c.head_width, c.kv_heads * c.head_width);
        match family {
            // NomicBERT's and GTE's tensors as the Hub's checkpoints name
            // them (and Transformers 5 saves them).
            Family::NomicBert => {
                let at = |s: &str| format!("encoder.layers.{l}.{s}");
                Ok(Layer {
                    qkv: self.dense_maybe_biased(&at("attn.Wqkv"), 3 * q, h)?,
                    qk_norm: None,
                    attn_out: self.dense_maybe_biased(&at("attn.out_proj"), h, q)?,
                    attn_norm: Some(self.norm(&at("norm1"), h)?),
                    // fc12 is the gate (activated), fc11 the linear half.
                    up: self.stacked(&[at("mlp.fc12"), at("mlp.fc11")], &[i, i], h)?,
                    down: self.dense_maybe_biased(&at("mlp.fc2"), h, i)?,
                    out_norm: self.norm(&at("norm2"), h)?,
                })
            }
            Family::Gte => {
                let at = |s: &str| format!("encoder.layer.{l}.{s}");
                Ok(Layer {
                    qkv: self.dense_maybe_biased(&at("attention.qkv_proj"), 3 * q, h)?,
                    qk_norm: None,
                    attn_out: self.dense_maybe_biased(&at("attention.o_proj"), h, q)?,
                    attn_norm: Some(self.norm(&at("attn_ln"), h)?),
                    up: self.swapped_halves(&at("mlp.up_gate_proj"), i, h)?,
                    down: self.dense_maybe_biased(&at("mlp.down_proj"), h, i)?,
                    out_norm: self.norm(&at("mlp_ln"), h)?,
                })
            }
            Family::ModernBert => {
                let at = |s: &str| format!("layers.{l}.{s}");
                Ok(Layer {
                    qkv: self.dense_maybe_biased(&at("attn.Wqkv"), 3 * h, h)?,
                    qk_norm: None,
                    attn_out: self.dense_maybe_biased(&at("attn.Wo"), h, h)?,
                    attn_norm: match l {
                        0 => None,
                        _ => Some(self.norm_maybe_shifted(&at("attn_norm"), h, false)?),
                    },
                    up: self.dense_maybe_biased(&at("mlp.Wi"), 2 * i, h)?,
                    down: self.dense_maybe_biased(&at("mlp.Wo"), h, i)?,
                    out_norm: self.norm_maybe_shifted(&at("mlp_norm"), h, false)?,
                })
            }
            Family::Qwen3 => {
                let at = |s: &str| format!("layers.{l}.{s}");
                let d = c.head_width;
                Ok(Layer {
                    qkv: self.stacked(
                        &[
                            at("self_attn.q_proj"),
                            at("self_attn.k_proj"),
                            at("self_attn.v_proj"),
                        ],
                        &[q, kv, kv],
                        h,
                    )?,
                    qk_norm: Some((
                        self.norm_maybe_shifted(&at("self_attn.q_norm"), d, true)?,
                        self.norm_maybe_shifted(&at("self_attn.k_norm"), d, true)?,
                    )),
                    attn_out: self.dense_maybe_biased(&at("self_attn.o_proj"), h, q)?,
                    attn_norm: Some(self.norm_maybe_shifted(&at("input_layernorm"), h, true)?),
                    up: self.stacked(&[at("mlp.gate_proj"), at("mlp.up_proj")], &[i, i], h)?,
                    down: self.dense_maybe_biased(&at("mlp.down_proj"), h, i)?,
                    out_norm: self.norm_maybe_shifted(&at("post_attention_layernorm"), h, true)?,
                })
            }
            Family::DistilBert => {
                let at = |s: &str| format!("transformer.layer.{l}.{s}");
                Ok(Layer {
                    qkv: self.qkv(
                        [
                            at("attention.q_lin"),
                            at("attention.k_lin"),
                            at("attention.v_lin"),
                        ],
                        h,
                    )?,
                    attn_out: self.dense(&at("attention.out_lin"), h, h)?,
                    qk_norm: None,
                    attn_norm: Some(self.norm(&at("sa_layer_norm"), h)?),
                    up: self.dense(&at("ffn.lin1"), i, h)?,
                    down: self.dense(&at("ffn.lin2"), h, i)?,
                    out_norm: self.norm(&at("output_layer_norm"), h)?,
                })
            }
            Family::MpNet => {
                let at = |s: &str| format!("encoder.layer.{l}.{s}");
                Ok(Layer {
                    qkv: self.qkv(
                        [
                            at("attention.attn.q"),
                            at("attention.attn.k"),
                            at("attention.attn.v"),
                        ],
                        h,
                    )?,
                    attn_out: self.dense(&at("attention.attn.o"), h, h)?,
                    qk_norm: None,
                    attn_norm: Some(self.norm(&at("attention.LayerNorm"), h)?),
                    up: self.dense(&at("intermediate.dense"), i, h)?,
                    down: self.dense(&at("output.dense"), h, i)?,
                    out_norm: self.norm(&at("output.LayerNorm"), h)?,
                })
            }
            Family::Bert | Family::Roberta | Family::XlmRoberta | Family::Camembert => {
                let at = |s: &str| format!("encoder.layer.{l}.{s}");
                Ok(Layer {
                    qkv: self.qkv(
                        [
                            at("attention.self.query"),
                            at("attention.self.key"),
                            at("attention.self.value"),
                        ],
                        h,
                    )?,
                    attn_out: self.dense(&at("attention.output.dense"), h, h)?,
                    qk_norm: None,
                    attn_norm: Some(self.norm(&at("attention.output.LayerNorm"), h)?),
                    up: self.dense(&at("intermediate.dense"), i, h)?,
                    down: self.dense(&at("output.dense"), h, i)?,
                    out_norm: self.norm(&at("output.LayerNorm"), h)?,
                })
            }
        }
    }
}

impl Reader<'_> {
    /// A `…ForSequenceClassification` head by its family's names (not
    /// under the encoder's prefix, but BERT's pooler): a dense layer with
    /// its activation on the first token's vector, then the output layer of
    /// `n` logits.
    fn head(&self, family: Family, h: usize, n: usize) -> Result<Vec<modules::Dense>, KernelError> {
        let raw = |name: &str, shape: &[usize]| self.unprefixed(name, shape);
        let layer = |w: &str, b: &str, (inp, out), act| -> Result<modules::Dense, KernelError> {
            Ok(modules::Dense::new(
                raw(w, &[out, inp])?,
                raw(b, &[out])?,
                (inp, out),
                act,
            ))
        };
        let (first, act, second) = match family {
            Family::Bert => {
                let p = self.prefix;
                (
                    format!("{p}pooler.dense"),
                    DenseActivation::Tanh,
                    "classifier".to_string(),
                )
            }
            Family::DistilBert => (
                "pre_classifier".into(),
                DenseActivation::Relu,
                "classifier".into(),
            ),
            Family::Roberta | Family::XlmRoberta | Family::Camembert | Family::MpNet => (
                "classifier.dense".into(),
                DenseActivation::Tanh,
                "classifier.out_proj".into(),
            ),
            Family::ModernBert | Family::Qwen3 | Family::NomicBert | Family::Gte => {
                return Err(KernelError::invalid(
                    "classifier head",
                    format!("a {} classifier's head is not read", family.model_type()),
                ));
            }
        };
        Ok(vec![
            layer(
                &format!("{first}.weight"),
                &format!("{first}.bias"),
                (h, h),
                act,
            )?,
            layer(
                &format!("{second}.weight"),
                &format!("{second}.bias"),
                (h, n),
                DenseActivation::Identity,
            )?,
        ])
    }
}

impl Reader<'_> {
    /// BertForMaskedLM's head (not under the encoder's prefix), SPLADE's:
    /// its bias as `cls.predictions.bias` or under the decoder, and the
    /// decoder itself only where it is not tied to the word table.
    fn mlm_head(&self, h: usize, vocab: usize) -> Result<MlmHead, KernelError> {
        let at = "cls.predictions.transform";
        let decoder = "cls.predictions.decoder.weight";
        let bias = if self.has_unprefixed("cls.predictions.bias") {
            "cls.predictions.bias"
        } else {
            "cls.predictions.decoder.bias"
        };
        Ok(MlmHead {
            transform: Dense {
                w: self.unprefixed(&format!("{at}.dense.weight"), &[h, h])?,
                b: self.unprefixed(&format!("{at}.dense.bias"), &[h])?,
                inp: h,
                out: h,
            },
            norm: Norm {
                gamma: self.unprefixed(&format!("{at}.LayerNorm.weight"), &[h])?,
                beta: self.unprefixed(&format!("{at}.LayerNorm.bias"), &[h])?,
            },
            decoder: if self.has_unprefixed(decoder) {
                Some(self.unprefixed(decoder, &[vocab, h])?)
            } else {
                None
            },
            bias: self.unprefixed(bias, &[vocab])?,
        })
    }
}

impl EncoderWeights {
    /// Reads the model folder `dir`: its config ([`EncoderConfig::load`]),
    /// its sentence-transformers modules, and `model.safetensors` (or its
    /// shards). Errors name the file and the field or tensor.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        // A classifier's head is in its own weights: its folder's
        // sentence-transformers modules, if any, are not read.
        let mut cfg = EncoderConfig::load_with(dir, Pooling::Cls)?;
        let modules = match cfg.labels {
            Some(_) => None,
            None => {
                let m = Modules::load(dir)?;
                if m.pooling == Pooling::Splade {
                    if cfg.family != Family::Bert {
                        return Err(config_err(
                            &dir.join("modules.json"),
                            "type",
                            format!(
                                "SpladePooling on a {} model: SPLADE's head is read for bert only",
                                cfg.family.model_type()
                            ),
                        ));
                    }
                    if let Some((w, path)) =
                        m.splade_width.as_ref().filter(|(w, _)| *w != cfg.vocab)
                    {
                        return Err(config_err(
                            path,
                            "embedding_dimension",
                            format!("{w}, but the vocabulary has {} words", cfg.vocab),
                        ));
                    }
                }
                m.check_widths(dir, cfg.hidden)?;
                cfg.pooling = m.pooling;
                Some(m)
            }
        };
        let files = Files::load(dir)?;
        Self::from_files(cfg, modules, &files)
    }

    fn from_files(
        cfg: EncoderConfig,
        modules: Option<Modules>,
        files: &Files,
    ) -> Result<Self, KernelError> {
        let word_name = match cfg.family {
            Family::ModernBert => "embeddings.tok_embeddings.weight",
            Family::Qwen3 => "embed_tokens.weight",
            _ => "embeddings.word_embeddings.weight",
        };
        let r = Reader::new(files, cfg.family, word_name)?;
        let h = cfg.hidden;
        let mut type_delta = None;
        let mut word = r.tensor(word_name, &[cfg.vocab, h])?;
        let (pos_type, emb_norm, rel_bias) = if cfg.rotary.is_some() {
            let norm = match cfg.family {
                Family::ModernBert => Some(r.norm_maybe_shifted("embeddings.norm", h, false)?),
                Family::Qwen3 => None,
                Family::NomicBert => Some(r.norm("emb_ln", h)?),
                _ => Some(r.norm("embeddings.LayerNorm", h)?),
            };
            // Every input is one segment: type 0's vector is folded into
            // each word's, once.
            if cfg.type_vocab > 0 {
                let types = r.tensor(
                    "embeddings.token_type_embeddings.weight",
                    &[cfg.type_vocab, h],
                )?;
                for row in word.chunks_exact_mut(h) {
                    row.iter_mut().zip(&types[..h]).for_each(|(w, t)| *w += t);
                }
            }
            (Box::default(), norm, None)
        } else {
            let table = r.tensor(
                "embeddings.position_embeddings.weight",
                &[cfg.position_offset + cfg.max_positions, h],
            )?;
            let mut pos_type = table[cfg.position_offset * h..].to_vec().into_boxed_slice();
            if cfg.type_vocab > 0 {
                let types = r.tensor(
                    "embeddings.token_type_embeddings.weight",
                    &[cfg.type_vocab, h],
                )?;
                for row in pos_type.chunks_exact_mut(h) {
                    for (p, t) in row.iter_mut().zip(&types[..h]) {
                        *p += t;
                    }
                }
                if cfg.labels.is_some() && cfg.type_vocab > 1 {
                    let d: Box<[f32]> = types[h..2 * h]
                        .iter()
                        .zip(&types[..h])
                        .map(|(a, b)| a - b)
                        .collect();
                    type_delta = Some(d);
                }
            }
            let rel_bias = match cfg.relative_bias {
                Some(rb) => Some(r.tensor(
                    "encoder.relative_attention_bias.weight",
                    &[rb.buckets, cfg.heads],
                )?),
                None => None,
            };
            (pos_type, Some(r.norm("embeddings.LayerNorm", h)?), rel_bias)
        };
        let layers = (0..cfg.layers)
            .map(|l| r.layer(&cfg, l))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = match cfg.family {
            Family::ModernBert => Some(r.norm_maybe_shifted("final_norm", h, false)?),
            Family::Qwen3 => Some(r.norm_maybe_shifted("norm", h, true)?),
            _ => None,
        };
        let mlm = match cfg.pooling {
            Pooling::Splade => Some(r.mlm_head(h, cfg.vocab)?),
            _ => None,
        };
        let modules = match (modules, &cfg.labels) {
            (Some(m), _) => m,
            (None, Some(labels)) => Modules::classifier(r.head(cfg.family, h, labels.len())?),
            (None, None) => unreachable!("an encoder of embeddings has its modules"),
        };
        Ok(Self {
            dtype: r.dtype(word_name),
            cfg,
            modules,
            second_type: None,
            type_delta,
            word,
            pos_type,
            emb_norm,
            layers,
            final_norm,
            mlm,
            rel_bias,
            sha256: files.sha256(),
            source: files.files[0].0.clone(),
            #[cfg(feature = "cuda")]
            image: std::sync::OnceLock::new(),
        })
    }

    /// The weights as one buffer for a GPU's upload, built on the first
    /// call (a second copy of the weights in host memory, made only where
    /// a GPU runs the encoder).
    #[cfg(feature = "cuda")]
    pub(crate) fn image(&self) -> Result<&BertImage, KernelError> {
        self.image
            .get_or_init(|| image_of(self).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|why| KernelError::invalid("encoder image", why.clone()))
    }

    /// Whether the GPU twin computes this encoder: the BERT layout with
    /// the exact GELU, pooled by mean or `[CLS]` (MPNet's relative bias,
    /// the tanh GELU, the other poolings, classifiers' token types and the
    /// rotary families, ModernBERT and Qwen3, run on the CPU workers
    /// only).
    pub fn gpu_twin(&self) -> bool {
        let c = &self.cfg;
        c.relative_bias.is_none()
            && c.rotary.is_none()
            && !c.pre_norm
            && !c.gated
            && c.activation == super::Activation::GeluErf
            && matches!(c.pooling, Pooling::Mean | Pooling::Cls)
            && c.labels.is_none()
    }

    /// Sets the token a pair's first text ends with (BERT's `[SEP]`):
    /// the rows after its first occurrence in a sequence are the second
    /// text's, of token type 1. Without it (or for a model without token
    /// types) every row is type 0.
    pub(crate) fn set_pair_separator(&mut self, sep: u32) {
        if let Some(d) = self.type_delta.take() {
            self.second_type = Some((d, sep));
        }
    }

    /// Whether the model gives a pair's second text its own token type.
    pub(crate) fn has_pair_types(&self) -> bool {
        self.type_delta.is_some() || self.second_type.is_some()
    }

    /// The encoder's shape.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// The first weights file.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The dtype of the file's weights (`float32`, `float16`, `bfloat16`);
    /// the CPU computes in f32 whatever it is.
    pub fn stored_dtype(&self) -> &'static str {
        self.dtype
    }

    /// The SHA-256 of the weight files' bytes, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Width of the encoder's token vectors (and of the pooled vector
    /// before any Dense module).
    pub fn hidden(&self) -> usize {
        self.cfg.hidden
    }

    /// Width of the pooled vector: the vocabulary's for SPLADE, else the
    /// hidden width.
    pub fn pooled_width(&self) -> usize {
        match self.cfg.pooling {
            Pooling::Splade => self.cfg.vocab,
            _ => self.cfg.hidden,
        }
    }

    /// Width of an embedding: the last Dense module's output, else the
    /// pooled width.
    pub fn dim(&self) -> usize {
        self.modules.out_dim(self.pooled_width())
    }
}
