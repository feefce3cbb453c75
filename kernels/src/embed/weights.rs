//! A BERT encoder's weights, read once from `model.safetensors` and shared
//! by every batch.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use super::config::BertConfig;
use crate::KernelError;
use crate::tensors::{read, read_f32, tensor_err};

/// A dense layer `y = x·Wᵀ + b`, `W` row-major `[out, in]` (PyTorch's).
#[derive(Debug)]
pub(crate) struct Dense {
    pub(crate) w: Box<[f32]>,
    pub(crate) b: Box<[f32]>,
    pub(crate) inp: usize,
    pub(crate) out: usize,
}

/// LayerNorm's scale and shift.
#[derive(Debug)]
pub(crate) struct Norm {
    pub(crate) gamma: Box<[f32]>,
    pub(crate) beta: Box<[f32]>,
}

/// One encoder layer. Q, K and V are one dense layer of `3·H` outputs
/// (their rows stacked), so a tile's projections are one GEMM.
#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) qkv: Dense,
    pub(crate) attn_out: Dense,
    pub(crate) attn_norm: Norm,
    pub(crate) up: Dense,
    pub(crate) down: Dense,
    pub(crate) out_norm: Norm,
}

/// The weights of a BERT-family encoder, loaded once and shared (behind an
/// `Arc`) by every batch's [`Encoder`](super::Encoder).
#[derive(Debug)]
pub struct BertWeights {
    pub(crate) cfg: BertConfig,
    /// `[vocab, H]`.
    pub(crate) word: Box<[f32]>,
    /// `[max_positions, H]`, with token type 0's vector added to every
    /// row (every input is one segment).
    pub(crate) pos_type: Box<[f32]>,
    pub(crate) emb_norm: Norm,
    pub(crate) layers: Vec<Layer>,
    source: PathBuf,
    /// Names these weights in a device's run cache (never reused).
    #[cfg(feature = "cuda")]
    pub(crate) id: u64,
    /// The weights as one flat buffer for a GPU, built on first use.
    #[cfg(feature = "cuda")]
    image: std::sync::OnceLock<Image>,
}

/// Where one layer's tensors lie in an [`Image`] (floats).
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerAt {
    pub(crate) qkv: (usize, usize),
    pub(crate) attn_out: (usize, usize),
    pub(crate) attn_norm: (usize, usize),
    pub(crate) up: (usize, usize),
    pub(crate) down: (usize, usize),
    pub(crate) out_norm: (usize, usize),
}

/// Every tensor back to back in one buffer, so a device takes the whole
/// model in one upload (and one entry of its run cache): a dense layer as
/// `(weight, bias)` offsets, a norm as `(gamma, beta)`.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub(crate) struct Image {
    pub(crate) data: Box<[f32]>,
    pub(crate) word: usize,
    pub(crate) pos_type: usize,
    pub(crate) emb_norm: (usize, usize),
    pub(crate) layers: Vec<LayerAt>,
}

#[cfg(feature = "cuda")]
impl Image {
    fn of(w: &BertWeights) -> Self {
        let mut data = Vec::new();
        let mut put = |t: &[f32]| {
            let at = data.len();
            data.extend_from_slice(t);
            at
        };
        let word = put(&w.word);
        let pos_type = put(&w.pos_type);
        let emb_norm = (put(&w.emb_norm.gamma), put(&w.emb_norm.beta));
        let layers = w
            .layers
            .iter()
            .map(|l| LayerAt {
                qkv: (put(&l.qkv.w), put(&l.qkv.b)),
                attn_out: (put(&l.attn_out.w), put(&l.attn_out.b)),
                attn_norm: (put(&l.attn_norm.gamma), put(&l.attn_norm.beta)),
                up: (put(&l.up.w), put(&l.up.b)),
                down: (put(&l.down.w), put(&l.down.b)),
                out_norm: (put(&l.out_norm.gamma), put(&l.out_norm.beta)),
            })
            .collect();
        Self {
            data: data.into_boxed_slice(),
            word,
            pos_type,
            emb_norm,
            layers,
        }
    }
}

/// Reads tensors under one name prefix (`bert.` in checkpoints saved with
/// a task head, none in a bare `BertModel`'s).
struct Reader<'a, 'b> {
    st: &'b SafeTensors<'a>,
    path: &'b Path,
    prefix: &'static str,
}

impl Reader<'_, '_> {
    fn tensor(&self, name: &str, want: &[usize]) -> Result<Box<[f32]>, KernelError> {
        let want: Vec<Option<usize>> = want.iter().map(|&d| Some(d)).collect();
        let name = format!("{}{name}", self.prefix);
        Ok(read_f32(self.st, self.path, &name, &want)?.data)
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
}

impl BertWeights {
    /// Reads the model folder `dir`: its config ([`BertConfig::load`]) and
    /// `model.safetensors`. Errors name the file and the field or tensor.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        let cfg = BertConfig::load(dir)?;
        let path = dir.join("model.safetensors");
        let bytes = read(&path)?;
        Self::from_bytes(cfg, &bytes, &path)
    }

    /// The weights in safetensors `bytes` of an encoder shaped as `cfg`;
    /// `origin` names them in errors. Tensors are Hugging Face's
    /// `BertModel` names, with or without a `bert.` prefix; others (a
    /// pooler, a task head) are ignored.
    pub fn from_bytes(cfg: BertConfig, bytes: &[u8], origin: &Path) -> Result<Self, KernelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| tensor_err(origin, "", e))?;
        let word_name = "embeddings.word_embeddings.weight";
        let prefix =
            if st.tensor(word_name).is_err() && st.tensor(&format!("bert.{word_name}")).is_ok() {
                "bert."
            } else {
                ""
            };
        let r = Reader {
            st: &st,
            path: origin,
            prefix,
        };
        let (h, i) = (cfg.hidden, cfg.intermediate);
        let word = r.tensor(word_name, &[cfg.vocab, h])?;
        let mut pos_type = r.tensor(
            "embeddings.position_embeddings.weight",
            &[cfg.max_positions, h],
        )?;
        let types = r.tensor(
            "embeddings.token_type_embeddings.weight",
            &[cfg.type_vocab, h],
        )?;
        for row in pos_type.chunks_exact_mut(h) {
            for (p, t) in row.iter_mut().zip(&types[..h]) {
                *p += t;
            }
        }
        let emb_norm = r.norm("embeddings.LayerNorm", h)?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let at = |s: &str| format!("encoder.layer.{l}.{s}");
            let (q, k, v) = (
                r.dense(&at("attention.self.query"), h, h)?,
                r.dense(&at("attention.self.key"), h, h)?,
                r.dense(&at("attention.self.value"), h, h)?,
            );
            let qkv = Dense {
                w: [q.w, k.w, v.w].concat().into_boxed_slice(),
                b: [q.b, k.b, v.b].concat().into_boxed_slice(),
                inp: h,
                out: 3 * h,
            };
            layers.push(Layer {
                qkv,
                attn_out: r.dense(&at("attention.output.dense"), h, h)?,
                attn_norm: r.norm(&at("attention.output.LayerNorm"), h)?,
                up: r.dense(&at("intermediate.dense"), i, h)?,
                down: r.dense(&at("output.dense"), h, i)?,
                out_norm: r.norm(&at("output.LayerNorm"), h)?,
            });
        }
        Ok(Self {
            cfg,
            word,
            pos_type,
            emb_norm,
            layers,
            source: origin.to_path_buf(),
            #[cfg(feature = "cuda")]
            id: crate::claim::next_id(),
            #[cfg(feature = "cuda")]
            image: std::sync::OnceLock::new(),
        })
    }

    /// The weights as one buffer for a GPU's upload, built on the first
    /// call (a second copy of the weights in host memory, made only where
    /// a GPU runs the encoder).
    #[cfg(feature = "cuda")]
    pub(crate) fn image(&self) -> &Image {
        self.image.get_or_init(|| Image::of(self))
    }

    /// The encoder's shape.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The weights file.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Width of an embedding.
    pub fn dim(&self) -> usize {
        self.cfg.hidden
    }
}
