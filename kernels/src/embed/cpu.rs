//! The encoder's forward pass on one CPU thread, without padding: a tile's
//! sequences are laid back to back as one `[tokens, H]` matrix, so every
//! dense layer is one GEMM over real tokens only, and attention runs per
//! sequence and head over that sequence's own tokens (no mask, no padded
//! keys).
//!
//! ```text
//!  ids ─▶ word + position + type, LayerNorm ─▶ ×layers [ QKV GEMM ─▶ per sequence, head:
//!        softmax(Q·Kᵀ/√d)·V ─▶ out GEMM + x, LayerNorm ─▶ up GEMM, GELU ─▶ down GEMM + x,
//!        LayerNorm ] ─▶ pool (mean or [CLS]) ─▶ one vector per sequence
//! ```
//!
//! Dense layers are `gemm`'s GEMMs, attention's small per-head products
//! `matrixmultiply`'s `sgemm` (both pick AVX2/FMA at run time); `exp` and `erf` are branch-free polynomials so that softmax and
//! GELU vectorise (`exp` within 3e-7 relative, `erf` 5e-7 absolute: the
//! tests).

use super::config::Pooling;
use super::weights::{BertWeights, Dense, Norm};

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
        crate::tensors::gemm_add_xwt(x, rows, &self.w, self.inp, self.out, y);
    }
}

impl Norm {
    /// Each row `r` of `x` becomes `LayerNorm(r + y_r)` (`y` absent: of
    /// `r`), with mean and variance summed in `f64`.
    fn add_norm(&self, x: &mut [f32], y: Option<&[f32]>, eps: f32) {
        let h = self.gamma.len();
        for (r, row) in x.chunks_exact_mut(h).enumerate() {
            if let Some(y) = y {
                for (a, b) in row.iter_mut().zip(&y[r * h..(r + 1) * h]) {
                    *a += b;
                }
            }
            let mean = sum_f64(row, |v| v) / h as f64;
            let var = sum_f64(row, |v| (v - mean) * (v - mean)) / h as f64;
            let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
            let mean = mean as f32;
            for ((v, g), b) in row.iter_mut().zip(&*self.gamma).zip(&*self.beta) {
                *v = (*v - mean) * inv * g + b;
            }
        }
    }
}

/// `Σ f(v)` over `row` in `f64`, in [`LANES`] independent partial sums (one
/// dependent chain of adds per row cost as much as the norm's arithmetic).
#[inline(always)]
fn sum_f64(row: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let mut blocks = row.chunks_exact(LANES);
    for b in &mut blocks {
        for (a, &v) in lanes.iter_mut().zip(b) {
            *a += f(v as f64);
        }
    }
    let rest: f64 = blocks.remainder().iter().map(|&v| f(v as f64)).sum();
    lanes.iter().sum::<f64>() + rest
}

/// `eˣ` for `x` in `[-87, 88]` (clamped there), within 2 ulp: Cephes'
/// `expf` polynomial after `x = n·ln 2 + r`, `2ⁿ` built in the exponent
/// bits. No branch and no libm call, so a loop of it vectorises.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5·2²³: adding it rounds to a whole number, held in the low
    // mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = n * -0.693_359_4 + x;
    let r = n * 2.121_944_4e-4 + r;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let k = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    e * f32::from_bits(((k + 127) << 23) as u32)
}

/// `erf(x)` within 5e-7 absolute (6e-8 for the fit, the rest f32's
/// rounding): a rational function of odd and even
/// polynomials on `[-4, 4]` (the minimax fit Eigen and XLA use), `±1`
/// past it.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024_1e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 + -1.609_603_3e-2;
    let mut q = -1.456_607_2e-5f32;
    q = q * x2 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329e-3;
    q = q * x2 + -1.426_474e-2;
    x * p / q
}

/// Runs `$body` (a plain loop over its arguments) compiled for AVX2 and
/// FMA where the CPU has them (8 lanes, not SSE2's 4: the crate is built
/// for the x86-64 baseline), else as built.
macro_rules! widest {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide($($arg: $ty),*) $body
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the features `wide` is compiled
                    // for (checked just above); its body is safe code.
                    return unsafe { wide($($arg),*) };
                }
            }
            $body
        }
    };
}

widest! {
    /// GELU, the erf form: `x·(1 + erf(x/√2))/2`.
    fn gelu(v: &mut [f32]) {
        for x in v {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// Lanes of the softmax's reductions: independent accumulators, so the
/// maximum and the sum run as vector operations rather than one dependent
/// chain per row (a chain of 256 adds was a quarter of a 256-token
/// sequence's time).
const LANES: usize = 8;

widest! {
    /// Each row of `s` (`n` wide) becomes its softmax.
    fn softmax_rows(s: &mut [f32], n: usize) {
        for row in s.chunks_exact_mut(n) {
            let mut lanes = [f32::NEG_INFINITY; LANES];
            let mut blocks = row.chunks_exact(LANES);
            for b in &mut blocks {
                for (m, &v) in lanes.iter_mut().zip(b) {
                    *m = m.max(v);
                }
            }
            let max = blocks
                .remainder()
                .iter()
                .chain(&lanes)
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            for v in row.iter_mut() {
                *v = exp(*v - max);
            }
            let mut sums = [0.0f32; LANES];
            let mut blocks = row.chunks_exact(LANES);
            for b in &mut blocks {
                for (a, &v) in sums.iter_mut().zip(b) {
                    *a += v;
                }
            }
            let sum: f32 = sums.iter().chain(blocks.remainder()).sum();
            let inv = 1.0 / sum;
            for v in row.iter_mut() {
                *v *= inv;
            }
        }
    }
}

/// `c = alpha·a·b` (no accumulation) for `a` `m×k` and `b` `k×n` given as
/// pointers with strides (row, column), `c` `m×n` at row stride `rsc`.
///
/// # Safety
///
/// Every element the strides address lies in its allocation, and `c`'s do
/// not overlap `a`'s or `b`'s.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_strided(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: (*const f32, isize, isize),
    b: (*const f32, isize, isize),
    c: *mut f32,
    rsc: isize,
) {
    // SAFETY: the caller's contract.
    unsafe { matrixmultiply::sgemm(m, k, n, alpha, a.0, a.1, a.2, b.0, b.1, b.2, 0.0, c, rsc, 1) }
}

/// `seqs` cut, in order, into runs of at most `max_tokens` tokens (a
/// longer sequence alone): the CPU pass's tiles and the GPU twin's pieces.
pub(crate) fn runs<'a>(
    seqs: &'a [&'a [u32]],
    max_tokens: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> + 'a {
    let mut first = 0;
    std::iter::from_fn(move || {
        if first == seqs.len() {
            return None;
        }
        let mut end = first + 1;
        let mut tokens = seqs[first].len();
        while end < seqs.len() && tokens + seqs[end].len() <= max_tokens {
            tokens += seqs[end].len();
            end += 1;
        }
        let r = first..end;
        first = end;
        Some(r)
    })
}

impl BertWeights {
    /// The pooled vectors (before any normalisation) of `seqs` into `out`
    /// (`seqs.len() × H`), tile by tile. Every sequence holds 1 to
    /// `max_positions` ids below `vocab` (the [`Encoder`](super::Encoder)
    /// checks that when it is built).
    pub(crate) fn encode_cpu(&self, seqs: &[&[u32]], out: &mut [f32], s: &mut Scratch) {
        let h = self.cfg.hidden;
        for r in runs(seqs, TILE_TOKENS) {
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
        self.emb_norm.add_norm(x, None, c.eps);
        for layer in &self.layers {
            let qkv = grow(&mut s.qkv, t * 3 * h);
            layer.qkv.forward(&s.x[..t * h], t, qkv);
            let ctx = grow(&mut s.ctx, t * h);
            let longest = seqs.iter().map(|q| q.len()).max().unwrap_or(0);
            let scores = grow(&mut s.scores, longest * longest);
            self.attention(seqs, qkv, ctx, scores);
            let tmp = grow(&mut s.tmp, t * h);
            layer.attn_out.forward(ctx, t, tmp);
            let x = &mut s.x[..t * h];
            layer.attn_norm.add_norm(x, Some(tmp), c.eps);
            let inter = grow(&mut s.inter, t * c.intermediate);
            layer.up.forward(x, t, inter);
            gelu(inter);
            layer.down.forward(inter, t, tmp);
            layer.out_norm.add_norm(x, Some(tmp), c.eps);
        }
        let x = &s.x[..t * h];
        let mut at = 0;
        for (seq, o) in seqs.iter().zip(out.chunks_exact_mut(h)) {
            let rows = &x[at * h..(at + seq.len()) * h];
            match c.pooling {
                Pooling::Cls => o.copy_from_slice(&rows[..h]),
                Pooling::Mean => {
                    o.fill(0.0);
                    for row in rows.chunks_exact(h) {
                        for (a, b) in o.iter_mut().zip(row) {
                            *a += b;
                        }
                    }
                    let inv = 1.0 / seq.len() as f32;
                    o.iter_mut().for_each(|v| *v *= inv);
                }
            }
            at += seq.len();
        }
    }

    /// `ctx` (`t × H`): per sequence and head, `softmax(Q·Kᵀ/√d)·V` over
    /// the sequence's own tokens, from `qkv` (`t × 3H`: Q, K, V side by
    /// side in each row).
    fn attention(&self, seqs: &[&[u32]], qkv: &[f32], ctx: &mut [f32], scores: &mut [f32]) {
        let (h, d) = (self.cfg.hidden, self.cfg.head_dim());
        let scale = 1.0 / (d as f32).sqrt();
        let (rs, hs) = (3 * h as isize, h as isize);
        let mut at = 0;
        for seq in seqs {
            let l = seq.len();
            assert!(qkv.len() >= (at + l) * 3 * h && ctx.len() >= (at + l) * h);
            assert!(scores.len() >= l * l);
            for head in 0..self.cfg.heads {
                let q = qkv[at * 3 * h + head * d..].as_ptr();
                let k = qkv[at * 3 * h + h + head * d..].as_ptr();
                let v = qkv[at * 3 * h + 2 * h + head * d..].as_ptr();
                // SAFETY: Q, K and V of this sequence's `l` rows and this
                // head's `d` columns lie in `qkv` (row stride 3H; length
                // checked above); `scores` holds `l × l` (checked above)
                // and is a `&mut` apart from `qkv`. Kᵀ is K read with
                // strides swapped.
                unsafe {
                    gemm_strided(
                        (l, d, l),
                        scale,
                        (q, rs, 1),
                        (k, 1, rs),
                        scores.as_mut_ptr(),
                        l as isize,
                    );
                }
                softmax_rows(&mut scores[..l * l], l);
                let c = ctx[at * h + head * d..].as_mut_ptr();
                // SAFETY: `scores` holds `l × l`; V's rows and this head's
                // columns lie in `qkv`; this head's `l × d` block of
                // `ctx` (row stride H) lies in `ctx` (checked above), a
                // `&mut` apart from both.
                unsafe {
                    gemm_strided(
                        (l, l, d),
                        1.0,
                        (scores.as_ptr(), l as isize, 1),
                        (v, rs, 1),
                        c,
                        hs,
                    );
                }
            }
            at += l;
        }
    }
}
