//! The encoder's forward pass on one CPU thread, without padding: a tile's
//! sequences are laid back to back as one `[tokens, H]` matrix, so every
//! dense layer is one GEMM over real tokens only, and attention runs per
//! sequence and head over that sequence's own tokens (no mask, no padded
//! keys; a causal or local layer's softmax over the keys its query sees).
//!
//! ```text
//!  ids ─▶ word (+ position + type), norm ─▶ ×layers [ (norm) QKV GEMM ─▶ (q/k norm, rotary)
//!        ─▶ per sequence, head: softmax(Q·Kᵀ/√d [+ relative bias])·V ─▶ out GEMM + x (norm)
//!        ─▶ (norm) up GEMM, activation (gated) ─▶ down GEMM + x (norm) ] ─▶ (final norm)
//!        ─▶ pool (or SPLADE's head) ─▶ one vector per sequence
//! ```
//!
//! The norms in brackets are a post-norm family's after each residual or
//! a pre-norm family's before each part (see `EncoderConfig`).
//!
//! Dense layers are `gemm`'s GEMMs, attention's small per-head products
//! `matrixmultiply`'s `sgemm` (both pick AVX2/FMA at run time), read in
//! place from the QKV rows; the operations are `coexec_kernels::ops`.

use std::ops::Range;

use coexec_kernels::ops::{self, View};

use super::config::{Activation, NormKind, RelativeBias};
use super::weights::{Dense, EncoderWeights, Layer, MlmHead, Norm};

/// Tokens per tile: the activations of a tile (`T·(H + 3H + H + H + I)`
/// floats, 5.4 MB at 384 tokens of MiniLM) stay near the caches, and the
/// GEMMs have rows enough to run near their peak.
pub(crate) const TILE_TOKENS: usize = 384;

/// Tokens a block of SPLADE's logits holds.
const MLM_ROWS: usize = 16;

/// A tile's activations, grown to the largest tile seen.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    /// A pre-norm layer's normalised input (`x` stays the residual).
    normed: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    tmp: Vec<f32>,
    inter: Vec<f32>,
    scores: Vec<f32>,
    /// Per relative distance `j - i + l - 1` of a sequence of `l` tokens,
    /// its bucket's row in the relative bias (MPNet's).
    buckets: Vec<usize>,
    /// Rotary angles' cosines and sines per base, for the longest
    /// sequence seen.
    rope: Vec<RopeTable>,
    /// SPLADE's head: a block's transformed rows and their logits.
    mlm: Vec<f32>,
}

/// One token row's place in the batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Token {
    /// Its id.
    pub(crate) id: u32,
    /// Its position in its sequence.
    pub(crate) pos: usize,
    /// Whether it is a classifier pair's second text's (token type 1).
    pub(crate) second: bool,
}

/// The scratch a layer's dense parts use ([`EncoderWeights::out_and_mlp`]).
#[derive(Debug)]
struct Parts<'a> {
    normed: &'a mut Vec<f32>,
    tmp: &'a mut Vec<f32>,
    inter: &'a mut Vec<f32>,
}

/// [`ops::rotary_table`]'s cosines and sines of one base and head width.
#[derive(Debug)]
struct RopeTable {
    theta: f64,
    d: usize,
    len: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The table of base `theta` for heads `d` wide and positions `0..len`,
/// computed where it is not yet (or is shorter).
fn rope_table(tables: &mut Vec<RopeTable>, theta: f64, d: usize, len: usize) -> &RopeTable {
    let at = match tables.iter().position(|t| t.theta == theta && t.d == d) {
        Some(k) => k,
        None => {
            tables.push(RopeTable {
                theta,
                d,
                len: 0,
                cos: Vec::new(),
                sin: Vec::new(),
            });
            tables.len() - 1
        }
    };
    let t = &mut tables[at];
    if t.len < len {
        ops::rotary_table(len, d, theta, &mut t.cos, &mut t.sin);
        t.len = len;
    }
    &tables[at]
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
    /// Each row `r` of `x` becomes `norm(r + y_r)` (`y` absent: of `r`),
    /// the norm of kind `kind`.
    fn add_norm(&self, x: &mut [f32], y: Option<&[f32]>, eps: f32, kind: NormKind) {
        match kind {
            NormKind::Layer => ops::add_layer_norm(x, y, &self.gamma, &self.beta, eps),
            NormKind::Rms => {
                if let Some(y) = y {
                    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
                }
                ops::rms_norm(x, &self.gamma, eps);
            }
        }
    }

    /// A pre-norm part's input: `x` normalised into `buf` (`x` stays the
    /// residual).
    fn normed<'b>(&self, x: &[f32], buf: &'b mut Vec<f32>, eps: f32, kind: NormKind) -> &'b [f32] {
        let out = grow(buf, x.len());
        out.copy_from_slice(x);
        self.add_norm(out, None, eps, kind);
        out
    }
}

/// `act` over `v` in place.
fn activate(act: Activation, v: &mut [f32]) {
    match act {
        Activation::GeluErf => ops::gelu_erf(v),
        Activation::GeluTanh => ops::gelu_tanh(v),
        Activation::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
        Activation::Silu => ops::silu(v),
    }
}

impl EncoderWeights {
    /// The pooled vectors (before any normalisation) of `seqs` into `out`
    /// (`seqs.len() × pooled_width()`: H, or the vocabulary for SPLADE),
    /// tile by tile. Every sequence holds 1 to
    /// `max_positions` ids below `vocab` (the [`Encoder`](super::Encoder)
    /// checks that when it is built).
    ///
    /// With `per_token`, `out` takes every token's vector instead (`tokens
    /// × H`, the sequences back to back), before pooling.
    pub(crate) fn encode_cpu(
        &self,
        seqs: &[&[u32]],
        per_token: bool,
        out: &mut [f32],
        s: &mut Scratch,
    ) {
        let mut at = 0;
        for r in ops::runs(seqs, TILE_TOKENS) {
            let seqs = &seqs[r];
            let n = if per_token {
                seqs.iter().map(|q| q.len()).sum::<usize>() * self.cfg.hidden
            } else {
                seqs.len() * self.pooled_width()
            };
            self.encode_tile(seqs, per_token, &mut out[at..at + n], s);
            at += n;
        }
    }

    /// One tile: `seqs` back to back, `t` tokens in all.
    fn encode_tile(&self, seqs: &[&[u32]], per_token: bool, out: &mut [f32], s: &mut Scratch) {
        let c = &self.cfg;
        let (h, t) = (c.hidden, seqs.iter().map(|q| q.len()).sum::<usize>());
        let (q_w, kv_w) = (c.heads * c.head_width, c.kv_heads * c.head_width);
        self.embed(self.tokens(seqs), grow(&mut s.x, t * h));
        let longest = seqs.iter().map(|q| q.len()).max().unwrap_or(0);
        let positions = || seqs.iter().flat_map(|q| 0..q.len());
        for (li, layer) in self.layers.iter().enumerate() {
            let qkv = grow(&mut s.qkv, t * (q_w + 2 * kv_w));
            let x = &s.x[..t * h];
            let at = (positions(), longest);
            self.queries_keys_values(li, x, at, qkv, &mut s.normed, &mut s.rope);
            let ctx = grow(&mut s.ctx, t * q_w);
            let scores = grow(&mut s.scores, longest * longest);
            self.attention(seqs, c.windows[li], &s.qkv[..], ctx, scores, &mut s.buckets);
            let x = &mut s.x[..t * h];
            let p = Parts {
                normed: &mut s.normed,
                tmp: &mut s.tmp,
                inter: &mut s.inter,
            };
            self.out_and_mlp(layer, &s.ctx[..t * q_w], x, p);
        }
        let x = &mut s.x[..t * h];
        self.final_norm(x);
        if per_token {
            out.copy_from_slice(x);
            return;
        }
        let mut at = 0;
        for (seq, o) in seqs.iter().zip(out.chunks_exact_mut(self.pooled_width())) {
            let rows = &x[at * h..(at + seq.len()) * h];
            match &self.mlm {
                Some(head) => self.splade(head, rows, o, &mut s.mlm),
                None => c.pooling.pool(rows, o),
            }
            at += seq.len();
        }
    }

    /// The tokens of `seqs` back to back: each one's id, its position in
    /// its sequence, and whether it is a classifier pair's second text's
    /// (after its sequence's first separator: token type 1).
    pub(crate) fn tokens<'a>(&'a self, seqs: &'a [&'a [u32]]) -> impl Iterator<Item = Token> + 'a {
        let sep = self.second_type.as_ref().map(|(_, sep)| *sep);
        seqs.iter().flat_map(move |seq| {
            let first = sep.and_then(|sep| seq.iter().position(|&id| id == sep));
            seq.iter().enumerate().map(move |(pos, &id)| Token {
                id,
                pos,
                second: first.is_some_and(|k| pos > k),
            })
        })
    }

    /// The embeddings of `tokens` into the rows of `x` (`H` wide, one per
    /// token): word (+ position + type) (+ the second text's type delta),
    /// then the embedding norm.
    fn embed(&self, tokens: impl Iterator<Item = Token>, x: &mut [f32]) {
        let h = self.cfg.hidden;
        for (row, tok) in x.chunks_exact_mut(h).zip(tokens) {
            row.copy_from_slice(&self.word[tok.id as usize * h..][..h]);
            if !self.pos_type.is_empty() {
                let pt = &self.pos_type[tok.pos * h..][..h];
                row.iter_mut().zip(pt).for_each(|(v, b)| *v += b);
            }
            if let (true, Some((delta, _))) = (tok.second, &self.second_type) {
                row.iter_mut().zip(delta.iter()).for_each(|(v, d)| *v += d);
            }
        }
        if let Some(n) = &self.emb_norm {
            n.add_norm(x, None, self.cfg.eps, self.cfg.norm);
        }
    }

    /// Layer `li`'s queries, keys and values of `x`'s rows (`H` wide) into
    /// `qkv` (a pre-norm layer's input normalised first), then the queries'
    /// and keys' norm and rotary positions (row `r` at `positions`' `r`-th
    /// position; `longest` bounds them).
    fn queries_keys_values(
        &self,
        li: usize,
        x: &[f32],
        (positions, longest): (impl Iterator<Item = usize>, usize),
        qkv: &mut [f32],
        normed: &mut Vec<f32>,
        rope: &mut Vec<RopeTable>,
    ) {
        let c = &self.cfg;
        let layer = &self.layers[li];
        let rows = x.len() / c.hidden;
        let input = match (&layer.attn_norm, c.pre_norm) {
            (Some(n), true) => n.normed(x, normed, c.eps, c.norm),
            _ => x,
        };
        layer.qkv.forward(input, rows, qkv);
        self.position_queries_keys(layer, c.windows[li], positions, longest, qkv, rope);
    }

    /// The rest of `layer` over `x`'s rows, in place, from their attention
    /// context `ctx` (`heads·d` wide, row-major): out GEMM and residual
    /// (norm), then the MLP (plain or gated) and residual (norm).
    fn out_and_mlp(&self, layer: &Layer, ctx: &[f32], x: &mut [f32], p: Parts<'_>) {
        let c = &self.cfg;
        let (h, i) = (c.hidden, c.intermediate);
        let t = x.len() / h;
        let tmp = grow(p.tmp, t * h);
        layer.attn_out.forward(ctx, t, tmp);
        if c.pre_norm {
            x.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
        } else if let Some(n) = &layer.attn_norm {
            n.add_norm(x, Some(tmp), c.eps, c.norm);
        }
        let input = if c.pre_norm {
            layer.out_norm.normed(x, p.normed, c.eps, c.norm)
        } else {
            &*x
        };
        let inter = grow(p.inter, t * layer.up.out);
        layer.up.forward(input, t, inter);
        if c.gated {
            // Row r's `[a | g]` (2·I) becomes act(a)·g (I) at row r of
            // an I-wide matrix: its place ends before row r's start
            // for r ≥ 1, and is `a`'s own for row 0.
            for r in 0..t {
                activate(c.activation, &mut inter[2 * r * i..(2 * r + 1) * i]);
                for k in 0..i {
                    inter[r * i + k] = inter[2 * r * i + k] * inter[(2 * r + 1) * i + k];
                }
            }
        } else {
            activate(c.activation, inter);
        }
        layer.down.forward(&inter[..t * i], t, tmp);
        if c.pre_norm {
            x.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
        } else {
            layer.out_norm.add_norm(x, Some(tmp), c.eps, c.norm);
        }
    }

    /// A pre-norm stack's final norm over `x`'s rows, in place (none:
    /// unchanged).
    fn final_norm(&self, x: &mut [f32]) {
        if let Some(n) = &self.final_norm {
            n.add_norm(x, None, self.cfg.eps, self.cfg.norm);
        }
    }

    /// A phased pass's row step ([`super::phased`]) over the batch's rows
    /// `rows` (`tokens`: every row's token; `longest`: the longest
    /// sequence): with `layer`, the rest of that layer of the rows of `x_in`
    /// (every row's input, `H` wide) from `ctx` (every row's attention
    /// context, head-major: `[heads][t][d]`), else the rows' embeddings;
    /// then, with `next`, layer `next`'s queries, keys and values of the new
    /// rows into `qkv`, else the final norm. `x_out` takes the rows' new
    /// values.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn phased_rows(
        &self,
        (layer, next): (Option<usize>, Option<usize>),
        rows: Range<usize>,
        tokens: &[Token],
        longest: usize,
        (x_in, ctx): (&[f32], &[f32]),
        x_out: &mut [f32],
        qkv: &mut [f32],
        s: &mut Scratch,
    ) {
        let c = &self.cfg;
        let (h, d) = (c.hidden, c.head_width);
        let t = tokens.len();
        let tokens = &tokens[rows.clone()];
        match layer {
            Some(li) => {
                x_out.copy_from_slice(&x_in[rows.start * h..rows.end * h]);
                // The rows' context, row-major, from its head-major home.
                let q_w = c.heads * d;
                let gathered = grow(&mut s.ctx, rows.len() * q_w);
                for (r, row) in rows.clone().zip(gathered.chunks_exact_mut(q_w)) {
                    for (head, part) in row.chunks_exact_mut(d).enumerate() {
                        part.copy_from_slice(&ctx[(head * t + r) * d..][..d]);
                    }
                }
                let p = Parts {
                    normed: &mut s.normed,
                    tmp: &mut s.tmp,
                    inter: &mut s.inter,
                };
                self.out_and_mlp(&self.layers[li], gathered, x_out, p);
            }
            None => self.embed(tokens.iter().copied(), x_out),
        }
        match next {
            Some(nl) => {
                let positions = tokens.iter().map(|tok| tok.pos);
                let (normed, rope) = (&mut s.normed, &mut s.rope);
                self.queries_keys_values(nl, x_out, (positions, longest), qkv, normed, rope);
            }
            None => self.final_norm(x_out),
        }
    }

    /// A phased pass's head step: layer `li`'s attention context of query
    /// heads `heads` over the sequences `spans` (each its first row and
    /// length), from `qkv` (every row's queries, keys and values) into
    /// `out` (those heads' `[t][d]` each, one after the other).
    pub(crate) fn phased_heads(
        &self,
        li: usize,
        heads: Range<usize>,
        spans: &[(usize, usize)],
        qkv: &[f32],
        out: &mut [f32],
        s: &mut Scratch,
    ) {
        let c = &self.cfg;
        let d = c.head_width;
        let width = (c.heads + 2 * c.kv_heads) * d;
        let t = qkv.len() / width;
        for &(at, l) in spans {
            self.fill_buckets(l, &mut s.buckets);
            let scores = grow(&mut s.scores, l * l);
            for head in heads.clone() {
                let o = &mut out[((head - heads.start) * t + at) * d..];
                let q = &qkv[at * width..];
                self.attend(c.windows[li], l, head, q, scores, &s.buckets, o, d);
            }
        }
    }

    /// SPLADE's vector of one sequence's token vectors `rows` into `out`
    /// (`vocab` wide): per word, the largest `log(1 + relu(logit))` of the
    /// MLM head's logits over the tokens. The logits are computed
    /// [`MLM_ROWS`] tokens at a time (a block's `rows × vocab` stays near
    /// the caches; the whole tile's would be 47 MB at BERT's vocabulary).
    fn splade(&self, head: &MlmHead, rows: &[f32], out: &mut [f32], buf: &mut Vec<f32>) {
        let (h, v) = (self.cfg.hidden, self.cfg.vocab);
        let decoder = head.decoder.as_deref().unwrap_or(&self.word);
        // Every value is at least 0: the running maximum starts there.
        out.fill(0.0);
        for block in rows.chunks(MLM_ROWS * h) {
            let n = block.len() / h;
            let (t, logits) = grow(buf, n * (h + v)).split_at_mut(n * h);
            head.transform.forward(block, n, t);
            activate(self.cfg.activation, t);
            ops::add_layer_norm(t, None, &head.norm.gamma, &head.norm.beta, self.cfg.eps);
            for row in logits.chunks_exact_mut(v) {
                row.copy_from_slice(&head.bias);
            }
            ops::gemm_add_xwt(t, n, decoder, h, v, logits);
            for row in logits.chunks_exact(v) {
                for (o, &l) in out.iter_mut().zip(row) {
                    *o = o.max(l.max(0.0).ln_1p());
                }
            }
        }
    }

    /// Qwen3's per-head RMSNorm of queries and keys, then rotary positions
    /// (a local layer's base where `window` is set), on `qkv` in place: row
    /// `r` at `positions`' `r`-th, each below `longest`.
    fn position_queries_keys(
        &self,
        layer: &Layer,
        window: Option<usize>,
        positions: impl Iterator<Item = usize>,
        longest: usize,
        qkv: &mut [f32],
        rope: &mut Vec<RopeTable>,
    ) {
        let c = &self.cfg;
        let d = c.head_width;
        let (q_w, kv_w) = (c.heads * d, c.kv_heads * d);
        let width = q_w + 2 * kv_w;
        if let Some((qn, kn)) = &layer.qk_norm {
            for row in qkv.chunks_exact_mut(width) {
                ops::rms_norm(&mut row[..q_w], &qn.gamma, c.eps);
                ops::rms_norm(&mut row[q_w..q_w + kv_w], &kn.gamma, c.eps);
            }
        }
        let Some(rot) = c.rotary else { return };
        let theta = if window.is_some() {
            rot.local_theta
        } else {
            rot.theta
        };
        let table = rope_table(rope, theta, d, longest);
        let half = d / 2;
        for (row, p) in qkv.chunks_exact_mut(width).zip(positions) {
            let (cos, sin) = (
                &table.cos[p * half..][..half],
                &table.sin[p * half..][..half],
            );
            for head in row[..q_w + kv_w].chunks_exact_mut(d) {
                ops::rotate_half(head, cos, sin);
            }
        }
    }

    /// `ctx` (`t × heads·d`): per sequence and head, `softmax(Q·Kᵀ/√d)·V`
    /// over the keys the query sees (all of its sequence's; up to its own
    /// in a causal stack; within `window` of it in a local layer), from
    /// `qkv` (`t` rows of all heads' queries, then the key-value heads'
    /// keys, then their values), MPNet's relative bias added to the
    /// scores. Query head `k` reads key-value head `k / (heads /
    /// kv_heads)`.
    fn attention(
        &self,
        seqs: &[&[u32]],
        window: Option<usize>,
        qkv: &[f32],
        ctx: &mut [f32],
        scores: &mut [f32],
        buckets: &mut Vec<usize>,
    ) {
        let c = &self.cfg;
        let (d, heads) = (c.head_width, c.heads);
        let q_w = heads * d;
        let width = q_w + 2 * c.kv_heads * d;
        let mut at = 0;
        for seq in seqs {
            let l = seq.len();
            self.fill_buckets(l, buckets);
            for head in 0..heads {
                let out = &mut ctx[at * q_w + head * d..];
                let qkv = &qkv[at * width..];
                self.attend(window, l, head, qkv, scores, buckets, out, q_w);
            }
            at += l;
        }
    }

    /// MPNet's relative-bias buckets of a sequence of `l` tokens into
    /// `buckets` (see [`EncoderWeights::attend`]); nothing for the other
    /// families.
    fn fill_buckets(&self, l: usize, buckets: &mut Vec<usize>) {
        if let Some(rb) = self.cfg.relative_bias {
            buckets.clear();
            buckets.extend((0..2 * l - 1).map(|k| bucket(rb, k as i64 - (l as i64 - 1))));
        }
    }

    /// One sequence's context of query head `head`: `softmax(Q·Kᵀ/√d)·V`
    /// over the keys each query sees, from `qkv` (from the sequence's first
    /// row, `l` rows) into `out` (`l` rows of `d`, `out_stride` apart).
    /// `buckets` are [`EncoderWeights::fill_buckets`]' for `l`; `scores`
    /// holds at least `l²`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        window: Option<usize>,
        l: usize,
        head: usize,
        qkv: &[f32],
        scores: &mut [f32],
        buckets: &[usize],
        out: &mut [f32],
        out_stride: usize,
    ) {
        let c = &self.cfg;
        let (d, heads) = (c.head_width, c.heads);
        let (q_w, kv_w) = (heads * d, c.kv_heads * d);
        let width = q_w + 2 * kv_w;
        let group = heads / c.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        // This sequence's `l` rows, `width` apart; `d` columns from the
        // head's offset in its part of each row.
        let part = |offset: usize| View {
            data: &qkv[offset..],
            row_stride: width,
            col_stride: 1,
        };
        let kvh = head / group;
        let (q, k, v) = (
            part(head * d),
            part(q_w + kvh * d),
            part(q_w + kv_w + kvh * d),
        );
        // Kᵀ is K read with its strides swapped.
        let kt = View {
            row_stride: 1,
            col_stride: width,
            ..k
        };
        ops::matmul_strided((l, d, l), scale, q, kt, &mut scores[..l * l], l);
        if let Some(bias) = &self.rel_bias {
            for (i, row) in scores[..l * l].chunks_exact_mut(l).enumerate() {
                // Distance j - i is at `j - i + l - 1` in `buckets`.
                let from = &buckets[l - 1 - i..][..l];
                for (s, &b) in row.iter_mut().zip(from) {
                    *s += bias[b * heads + head];
                }
            }
        }
        if !c.causal && window.is_none() {
            ops::softmax_rows(&mut scores[..l * l], l);
        } else {
            for (i, row) in scores[..l * l].chunks_exact_mut(l).enumerate() {
                let (lo, hi) = match window {
                    _ if c.causal => (0, i),
                    Some(r) => (i.saturating_sub(r), (i + r).min(l - 1)),
                    None => (0, l - 1),
                };
                ops::softmax_rows(&mut row[lo..=hi], hi - lo + 1);
                row[..lo].fill(0.0);
                row[hi + 1..].fill(0.0);
            }
        }
        let s = View {
            data: &scores[..l * l],
            row_stride: l,
            col_stride: 1,
        };
        ops::matmul_strided((l, l, d), 1.0, s, v, out, out_stride);
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
