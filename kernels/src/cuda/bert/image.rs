//! An encoder's weights in the GPU twin's layout: its shape, and every
//! tensor back to back in one buffer whose offsets are checked as it is
//! laid out.

use crate::KernelError;

/// An encoder's widths, as its config gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BertShape {
    /// Hidden width `H` (a multiple of `heads`).
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward width `I`.
    pub intermediate: usize,
    /// Token ids below this.
    pub vocab: usize,
    /// The most tokens in a sequence.
    pub max_positions: usize,
    /// LayerNorm's epsilon.
    pub eps: f32,
    /// Mean pooling (`false`: the first token's vector, `[CLS]`).
    pub mean_pool: bool,
}

impl BertShape {
    /// A shape; refuses widths that do not divide into heads or do not fit
    /// the kernels' 32-bit arguments.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        hidden: usize,
        heads: usize,
        intermediate: usize,
        vocab: usize,
        max_positions: usize,
        eps: f32,
        mean_pool: bool,
    ) -> Result<Self, KernelError> {
        let fits = |n: usize| n > 0 && u32::try_from(n).is_ok();
        let widths = [hidden, heads, intermediate, vocab, max_positions];
        if !widths.into_iter().all(fits) || !hidden.is_multiple_of(heads) {
            return Err(KernelError::invalid(
                "encoder shape",
                format!(
                    "hidden {hidden}, heads {heads}, intermediate {intermediate}, vocabulary {vocab}, positions {max_positions}"
                ),
            ));
        }
        Ok(Self {
            hidden,
            heads,
            intermediate,
            vocab,
            max_positions,
            eps,
            mean_pool,
        })
    }

    pub(super) fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// A dense layer's tensors: the weight `[out, in]` row-major, and the bias.
pub type DenseRef<'a> = (&'a [f32], &'a [f32]);
/// A LayerNorm's `(gamma, beta)`.
pub type NormRef<'a> = (&'a [f32], &'a [f32]);

/// One encoder layer's tensors, as [`BertImage::layer`] takes them.
#[derive(Debug, Clone, Copy)]
pub struct LayerRef<'a> {
    /// Q, K and V's projection, `[3H, H]`.
    pub qkv: DenseRef<'a>,
    /// Attention's output projection, `[H, H]`.
    pub attn_out: DenseRef<'a>,
    /// The norm after attention.
    pub attn_norm: NormRef<'a>,
    /// The feed-forward's first layer, `[I, H]`.
    pub up: DenseRef<'a>,
    /// Its second, `[H, I]`.
    pub down: DenseRef<'a>,
    /// The norm after the feed-forward.
    pub out_norm: NormRef<'a>,
}

/// Where one layer's tensors lie in a [`BertImage`] (floats).
#[derive(Debug, Clone, Copy)]
pub(super) struct LayerAt {
    pub(super) qkv: (usize, usize),
    pub(super) attn_out: (usize, usize),
    pub(super) attn_norm: (usize, usize),
    pub(super) up: (usize, usize),
    pub(super) down: (usize, usize),
    pub(super) out_norm: (usize, usize),
}

/// Every tensor of an encoder back to back in one buffer, so a device takes
/// the whole model in one upload (and one entry of its run cache): a dense
/// layer as `(weight, bias)` offsets, a norm as `(gamma, beta)`. Built with
/// [`BertImage::new`] and [`BertImage::layer`], which check every tensor's
/// length against the shape: the offsets the kernels read through lie in
/// the buffer by construction.
#[derive(Debug)]
pub struct BertImage {
    pub(super) shape: BertShape,
    pub(super) data: Vec<f32>,
    pub(super) word: usize,
    pub(super) pos_type: usize,
    pub(super) emb_norm: (usize, usize),
    pub(super) layers: Vec<LayerAt>,
    /// Names the image in a device's run cache (never reused).
    pub(super) id: u64,
}

impl BertImage {
    /// The embeddings: `word` `[vocab, H]`, `pos_type` `[max_positions, H]`
    /// (token type 0's vector added to every position), their norm.
    pub fn new(
        shape: BertShape,
        word: &[f32],
        pos_type: &[f32],
        norm: NormRef<'_>,
    ) -> Result<Self, KernelError> {
        let h = shape.hidden;
        let mut img = Self {
            shape,
            data: Vec::new(),
            word: 0,
            pos_type: 0,
            emb_norm: (0, 0),
            layers: Vec::new(),
            id: crate::claim::next_id(),
        };
        img.word = img.put("word embeddings", word, shape.vocab * h)?;
        img.pos_type = img.put("position embeddings", pos_type, shape.max_positions * h)?;
        img.emb_norm = img.norm("embedding norm", norm)?;
        Ok(img)
    }

    /// Appends the next layer.
    pub fn layer(&mut self, l: LayerRef<'_>) -> Result<(), KernelError> {
        let (h, i) = (self.shape.hidden, self.shape.intermediate);
        let at = LayerAt {
            qkv: self.dense("qkv", l.qkv, 3 * h, h)?,
            attn_out: self.dense("attention output", l.attn_out, h, h)?,
            attn_norm: self.norm("attention norm", l.attn_norm)?,
            up: self.dense("intermediate", l.up, i, h)?,
            down: self.dense("output", l.down, h, i)?,
            out_norm: self.norm("output norm", l.out_norm)?,
        };
        self.layers.push(at);
        Ok(())
    }

    /// The shape.
    pub fn shape(&self) -> &BertShape {
        &self.shape
    }

    /// Bytes on a device.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    fn put(&mut self, what: &str, t: &[f32], want: usize) -> Result<usize, KernelError> {
        if t.len() != want {
            return Err(KernelError::invalid(
                "encoder image",
                format!("{what}: {} floats where the shape takes {want}", t.len()),
            ));
        }
        let at = self.data.len();
        self.data
            .try_reserve(t.len())
            .map_err(|_| KernelError::invalid("encoder image", format!("no memory for {what}")))?;
        self.data.extend_from_slice(t);
        Ok(at)
    }

    fn dense(
        &mut self,
        what: &str,
        (w, b): DenseRef<'_>,
        out: usize,
        inp: usize,
    ) -> Result<(usize, usize), KernelError> {
        Ok((self.put(what, w, out * inp)?, self.put(what, b, out)?))
    }

    fn norm(&mut self, what: &str, (g, b): NormRef<'_>) -> Result<(usize, usize), KernelError> {
        let h = self.shape.hidden;
        Ok((self.put(what, g, h)?, self.put(what, b, h)?))
    }
}
