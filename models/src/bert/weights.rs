//! A BERT encoder's weights, read once from `model.safetensors` and shared
//! by every batch.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use coexec_kernels::KernelError;
#[cfg(feature = "cuda")]
use coexec_kernels::cuda::bert::{BertImage, BertShape, LayerRef};
use coexec_kernels::tensors::{read, read_f32, tensor_err};

use super::config::BertConfig;

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
    /// The weights as one flat buffer for a GPU, built on first use (or
    /// why they cannot be).
    #[cfg(feature = "cuda")]
    image: std::sync::OnceLock<Result<BertImage, String>>,
}

/// The weights as one buffer in the GPU twin's layout (`coexec_kernels`
/// checks every tensor's length against the shape as it lays it out).
#[cfg(feature = "cuda")]
fn image_of(w: &BertWeights) -> Result<BertImage, KernelError> {
    let c = &w.cfg;
    let shape = BertShape::new(
        c.hidden,
        c.heads,
        c.intermediate,
        c.vocab,
        c.max_positions,
        c.eps,
        c.pooling == super::Pooling::Mean,
    )?;
    fn norm(n: &Norm) -> (&[f32], &[f32]) {
        (&n.gamma, &n.beta)
    }
    fn dense(d: &Dense) -> (&[f32], &[f32]) {
        (&d.w, &d.b)
    }
    let mut img = BertImage::new(shape, &w.word, &w.pos_type, norm(&w.emb_norm))?;
    for l in &w.layers {
        img.layer(LayerRef {
            qkv: dense(&l.qkv),
            attn_out: dense(&l.attn_out),
            attn_norm: norm(&l.attn_norm),
            up: dense(&l.up),
            down: dense(&l.down),
            out_norm: norm(&l.out_norm),
        })?;
    }
    Ok(img)
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
