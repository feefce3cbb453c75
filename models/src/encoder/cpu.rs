//! The encoder's forward pass on one CPU thread, without padding: a tile's
//! sequences are laid back to back as one `[tokens, H]` matrix, so every
//! dense layer is one GEMM over real tokens only, and attention runs per
//! sequence and head over that sequence's own tokens (no mask, no padded
//! keys).
//!
//! ```text
//!  ids ─▶ word + position + type, LayerNorm ─▶ ×layers [ QKV GEMM ─▶ per sequence, head:
//!        softmax(Q·Kᵀ/√d [+ relative bias])·V ─▶ out GEMM + x, LayerNorm ─▶ up GEMM,
//!        activation ─▶ down GEMM + x, LayerNorm ] ─▶ pool ─▶ one vector per sequence
//! ```
//!
//! Dense layers are `gemm`'s GEMMs, attention's small per-head products
//! `matrixmultiply`'s `sgemm` (both pick AVX2/FMA at run time), read in
//! place from the QKV rows; the operations are `coexec_kernels::ops`.

use coexec_kernels::ops::{self, View};

use super::config::{Activation, RelativeBias};
use super::weights::{Dense, EncoderWeights, Norm};

/// Tokens per tile: the activations of a tile (`T·(H + 3H + H + H + I)`
/// floats, 5.4 MB at 384 tokens of MiniLM) stay near the caches, and the
/// GEMMs have rows enough to run near their peak.
pub(crate) const TILE_TOKENS: usize = 384;

/// A tile's activations, grown to the largest tile seen.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    tmp: Vec<f32>,
    inter: Vec<f32>,
    scores: Vec<f32>,
    /// Per relative distance `j - i + l - 1` of a sequence of `l` tokens,
    /// its bucket's row in the relative bias (MPNet's).
    buckets: Vec<usize>,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

impl Dense {
    /// `y = x·Wᵀ + b` for `rows` rows, as one `gemm` GEMM: 17% less time
    /// than `matrixmultiply`'s for the encoder (`embed_forward`, 32-token
    /// sequences: 508 ms against 611 per 2048 tokens on one core, side by
    /// side).
    fn forward(&self, x: &[f32], rows: usize, y: &mut [f32]) {
        for row in y[..rows * self.out].chunks_exact_mut(self.out) {
            row.copy_from_slice(&self.b);
        }
        ops::gemm_add_xwt(x, rows, &self.w, self.inp, self.out, y);
    }
}

impl Norm {
    /// Each row `r` of `x` becomes `LayerNorm(r + y_r)` (`y` absent: of
    /// `r`).
    fn add_norm(&self, x: &mut [f32], y: Option<&[f32]>, eps: f32) {
        ops::add_layer_norm(x, y, &self.gamma, &self.beta, eps);
    }
}

impl EncoderWeights {
    /// The pooled vectors (before any normalisation) of `seqs` into `out`
    /// (`seqs.len() × H`), tile by tile. Every sequence holds 1 to
    /// `max_positions` ids below `vocab` (the [`Encoder`](super::Encoder)
    /// checks that when it is built).
    pub(crate) fn encode_cpu(&self, seqs: &[&[u32]], out: &mut [f32], s: &mut Scratch) {
        let h = self.cfg.hidden;
        for r in ops::runs(seqs, TILE_TOKENS) {
            self.encode_tile(&seqs[r.clone()], &mut out[r.start * h..r.end * h], s);
        }
    }

    /// One tile: `seqs` back to back, `t` tokens in all.
    fn encode_tile(&self, seqs: &[&[u32]], out: &mut [f32], s: &mut Scratch) {
        let c = &self.cfg;
        let (h, t) = (c.hidden, seqs.iter().map(|q| q.len()).sum::<usize>());
        let x = grow(&mut s.x, t * h);
        let mut rows = x.chunks_exact_mut(h);
        for seq in seqs {
            for (p, &id) in seq.iter().enumerate() {
                let row = rows.next().expect("t rows");
                let w = &self.word[id as usize * h..][..h];
                let pt = &self.pos_type[p * h..][..h];
                for ((v, a), b) in row.iter_mut().zip(w).zip(pt) {
                    *v = a + b;
                }
            }
        }
        // A classifier's pair: the rows after the first separator are the
        // second text's, of token type 1.
        if let Some((delta, sep)) = &self.second_type {
            let mut at = 0;
            for seq in seqs {
                if let Some(k) = seq.iter().position(|id| id == sep) {
                    for row in x[(at + k + 1) * h..(at + seq.len()) * h].chunks_exact_mut(h) {
                        for (v, d) in row.iter_mut().zip(delta.iter()) {
                            *v += d;
                        }
                    }
                }
                at += seq.len();
            }
        }
        self.emb_norm.add_norm(x, None, c.eps);
        for layer in &self.layers {
            let qkv = grow(&mut s.qkv, t * 3 * h);
            layer.qkv.forward(&s.x[..t * h], t, qkv);
            let ctx = grow(&mut s.ctx, t * h);
            let longest = seqs.iter().map(|q| q.len()).max().unwrap_or(0);
            let scores = grow(&mut s.scores, longest * longest);
            self.attention(seqs, qkv, ctx, scores, &mut s.buckets);
            let tmp = grow(&mut s.tmp, t * h);
            layer.attn_out.forward(ctx, t, tmp);
            let x = &mut s.x[..t * h];
            layer.attn_norm.add_norm(x, Some(tmp), c.eps);
            let inter = grow(&mut s.inter, t * c.intermediate);
            layer.up.forward(x, t, inter);
            match c.activation {
                Activation::GeluErf => ops::gelu_erf(inter),
                Activation::GeluTanh => ops::gelu_tanh(inter),
                Activation::Relu => inter.iter_mut().for_each(|v| *v = v.max(0.0)),
            }
            layer.down.forward(inter, t, tmp);
            layer.out_norm.add_norm(x, Some(tmp), c.eps);
        }
        let x = &s.x[..t * h];
        let mut at = 0;
        for (seq, o) in seqs.iter().zip(out.chunks_exact_mut(h)) {
            c.pooling.pool(&x[at * h..(at + seq.len()) * h], o);
            at += seq.len();
        }
    }

    /// `ctx` (`t × H`): per sequence and head, `softmax(Q·Kᵀ/√d)·V` over
    /// the sequence's own tokens, from `qkv` (`t × 3H`: Q, K, V side by
    /// side in each row), MPNet's relative bias added to the scores.
    fn attention(
        &self,
        seqs: &[&[u32]],
        qkv: &[f32],
        ctx: &mut [f32],
        scores: &mut [f32],
        buckets: &mut Vec<usize>,
    ) {
        let (h, d, heads) = (self.cfg.hidden, self.cfg.head_dim(), self.cfg.heads);
        let scale = 1.0 / (d as f32).sqrt();
        let mut at = 0;
        for seq in seqs {
            let l = seq.len();
            if let Some(rb) = self.cfg.relative_bias {
                buckets.clear();
                buckets.extend((0..2 * l - 1).map(|k| bucket(rb, k as i64 - (l as i64 - 1))));
            }
            for head in 0..heads {
                // Q, K and V of this sequence and head: `l` rows 3H apart,
                // `d` columns from the head's offset in each third.
                let part = |third: usize| View {
                    data: &qkv[at * 3 * h + third * h + head * d..],
                    row_stride: 3 * h,
                    col_stride: 1,
                };
                // Kᵀ is K read with its strides swapped.
                let kt = View {
                    row_stride: 1,
                    col_stride: 3 * h,
                    ..part(1)
                };
                ops::matmul_strided((l, d, l), scale, part(0), kt, &mut scores[..l * l], l);
                if let Some(bias) = &self.rel_bias {
                    for (i, row) in scores[..l * l].chunks_exact_mut(l).enumerate() {
                        // Distance j - i is at `j - i + l - 1` in `buckets`.
                        let from = &buckets[l - 1 - i..][..l];
                        for (s, &b) in row.iter_mut().zip(from) {
                            *s += bias[b * heads + head];
                        }
                    }
                }
                ops::softmax_rows(&mut scores[..l * l], l);
                let s = View {
                    data: &scores[..l * l],
                    row_stride: l,
                    col_stride: 1,
                };
                let c = &mut ctx[at * h + head * d..];
                ops::matmul_strided((l, l, d), 1.0, s, part(2), c, h);
            }
            at += l;
        }
    }
}

/// The relative-bias bucket of a key `rel = j - i` tokens after its query
/// (MPNet's, after T5's): half the buckets for each sign; within a half,
/// distances below a quarter of the buckets have one bucket each, longer
/// ones share buckets spaced logarithmically up to `max_distance`. The
/// logarithm is taken in f32, as the reference computes it, so that a
/// distance on a boundary (16, 32 and 64 of MPNet's) falls as it does
/// there.
pub(crate) fn bucket(rb: RelativeBias, rel: i64) -> usize {
    let half = rb.buckets / 2;
    let n = -rel;
    let base = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs() as usize;
    let exact = half / 2;
    if n < exact {
        return base + n;
    }
    let span = (rb.max_distance as f64 / exact as f64).ln() as f32;
    let ratio = (n as f32 / exact as f32).ln() / span;
    let large = exact + (ratio * (half - exact) as f32) as usize;
    base + large.min(half - 1)
}
