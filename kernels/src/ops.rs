//! The CPU operations the models compose: element-wise activations,
//! row softmax and LayerNorm, small strided products for attention, and
//! the dense `y += x·Wᵀ` GEMM. Every one is safe to call: lengths and
//! strides are checked here, and the unsafe code they need (a GEMM through
//! raw pointers, AVX2/FMA dispatch) stays in this module.
//!
//! `exp` and `erf` are branch-free polynomials so that softmax and GELU
//! vectorise (`exp` within 3e-7 relative, `erf` 5e-7 absolute: the tests).
//!
//! ```
//! use coexec_kernels::ops;
//! let mut s = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0];
//! ops::softmax_rows(&mut s, 3);
//! assert!((s[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
//! assert!((s[3] - 1.0 / 3.0).abs() < 1e-6);
//! ```

pub use crate::tensors::gemm_add_xwt;

/// Runs `$body` (a plain loop over its arguments) compiled for AVX2 and
/// FMA where the CPU has them (8 lanes, not SSE2's 4: the crate is built
/// for the x86-64 baseline), else as built.
macro_rules! widest {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$m])*
        pub fn $name($($arg: $ty),*) {
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
    fn gelu_erf(v: &mut [f32]) {
        for x in v {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// GELU, the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`):
/// `x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))/2`.
pub fn gelu_tanh(v: &mut [f32]) {
    const K: f32 = 0.797_884_6; // √(2/π)
    for x in v {
        let u = K * (*x + 0.044_715 * *x * *x * *x);
        *x = 0.5 * *x * (1.0 + u.tanh());
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
pub fn exp(x: f32) -> f32 {
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
pub fn erf(x: f32) -> f32 {
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

/// Each `h`-wide row `r` of `x` becomes `LayerNorm(r + y_r)·gamma + beta`
/// (`y` absent: of `r`), with mean and variance summed in `f64`.
///
/// # Panics
///
/// If `gamma` and `beta` are not both `h` long, `x` is not whole rows, or
/// `y` is shorter than `x`.
pub fn add_layer_norm(x: &mut [f32], y: Option<&[f32]>, gamma: &[f32], beta: &[f32], eps: f32) {
    let h = gamma.len();
    assert!(h > 0 && beta.len() == h && x.len().is_multiple_of(h));
    assert!(y.is_none_or(|y| y.len() >= x.len()));
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
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// Each `h`-wide row of `x` becomes `RMSNorm(r)·gamma`:
/// `r / √(mean(r²) + eps)`, the mean summed in `f64` (Qwen3's and
/// Llama's norm: no centring, no shift).
///
/// # Panics
///
/// If `gamma` is empty or `x` is not whole rows.
pub fn rms_norm(x: &mut [f32], gamma: &[f32], eps: f32) {
    let h = gamma.len();
    assert!(h > 0 && x.len().is_multiple_of(h));
    for row in x.chunks_exact_mut(h) {
        let ms = sum_f64(row, |v| v * v) / h as f64;
        let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
        for (v, g) in row.iter_mut().zip(gamma) {
            *v = *v * inv * g;
        }
    }
}

widest! {
    /// SiLU (swish): `x·σ(x)`, SwiGLU's gate activation.
    fn silu(v: &mut [f32]) {
        for x in v {
            *x /= 1.0 + exp(-*x);
        }
    }
}

/// Rotary position embedding of one head's vector `x` (`d` wide, `d`
/// even) at the position whose angles' cosines and sines are `cos` and
/// `sin` (`d/2` each), in the split-halves layout (Hugging Face's
/// `rotate_half`): element `k` pairs with `k + d/2`.
///
/// # Panics
///
/// If `x` is not `2·cos.len()` long or `sin` is not as long as `cos`.
pub fn rotate_half(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    assert!(x.len() == 2 * half && sin.len() == half);
    let (a, b) = x.split_at_mut(half);
    for (((a, b), c), s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
        let (x0, x1) = (*a, *b);
        *a = x0 * c - x1 * s;
        *b = x1 * c + x0 * s;
    }
}

/// The rotary angles' cosines and sines for positions `0..len` of a head
/// `d` wide (`len × d/2` each, row `p` position `p`'s), with base `theta`:
/// the angle of pair `k` at position `p` is `p·θ^(-2k/d)`. The inverse
/// frequencies and the angles are f32 products, as Hugging Face computes
/// them (an angle of position 500 then differs from the exact one by some
/// 1e-5 radians, the same in both); the cosine and sine of each f32 angle
/// are taken in f64 and rounded.
///
/// # Panics
///
/// If `d` is odd or zero.
pub fn rotary_table(len: usize, d: usize, theta: f64, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    assert!(d > 0 && d.is_multiple_of(2));
    let half = d / 2;
    let inv: Vec<f32> = (0..half)
        .map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / d as f32))
        .collect();
    cos.clear();
    sin.clear();
    for p in 0..len {
        for &f in &inv {
            let angle = (p as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
}

/// A matrix read in place from a slice: element `(i, j)` at
/// `i·row_stride + j·col_stride` (a transpose is the strides swapped).
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The slice the matrix starts at (its first element is `(0, 0)`).
    pub data: &'a [f32],
    /// Elements between rows.
    pub row_stride: usize,
    /// Elements between columns.
    pub col_stride: usize,
}

impl View<'_> {
    /// Whether every element of a `rows × cols` matrix lies in `data`.
    fn holds(&self, rows: usize, cols: usize) -> bool {
        if rows == 0 || cols == 0 {
            return true;
        }
        (rows - 1)
            .checked_mul(self.row_stride)
            .zip((cols - 1).checked_mul(self.col_stride))
            .and_then(|(a, b)| a.checked_add(b))
            .is_some_and(|last| last < self.data.len())
            && isize::try_from(self.row_stride.max(self.col_stride)).is_ok()
    }
}

/// `c = alpha·a·b` (no accumulation) for `a` `m×k` and `b` `k×n`, `c` an
/// `m×n` block of rows `c_row_stride` apart (columns adjacent):
/// `matrixmultiply`'s `sgemm`, which picks AVX2/FMA at run time. Attention's
/// per-head products, read in place from the QKV rows.
///
/// # Panics
///
/// If a matrix's elements do not all lie in its slice, or `c`'s rows are
/// narrower than `n`.
pub fn matmul_strided(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: View<'_>,
    b: View<'_>,
    c: &mut [f32],
    c_row_stride: usize,
) {
    assert!(
        a.holds(m, k) && b.holds(k, n),
        "a product's operand past its slice"
    );
    let cv = View {
        data: c,
        row_stride: c_row_stride,
        col_stride: 1,
    };
    assert!(
        n <= c_row_stride.max(1) && cv.holds(m, n),
        "a product's output past its slice"
    );
    if m == 0 || n == 0 {
        return;
    }
    // Strides fit in isize (checked by `holds`).
    let s = |v: usize| v as isize;
    // SAFETY: every element `a`, `b` and `c` address lies in its slice
    // (checked above); `c` is a `&mut`, so it overlaps neither operand.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            s(a.row_stride),
            s(a.col_stride),
            b.data.as_ptr(),
            s(b.row_stride),
            s(b.col_stride),
            0.0,
            c.as_mut_ptr(),
            s(c_row_stride),
            1,
        )
    }
}

/// Refuses token sequences an encoder cannot take: empty, longer than
/// `max_positions`, or holding an id at or past `vocab`, naming the
/// sequence. The CPU pass and the GPU twin both read through the ids
/// unchecked after this.
pub fn check_sequences<S: AsRef<[u32]>>(
    seqs: &[S],
    vocab: usize,
    max_positions: usize,
) -> Result<(), crate::KernelError> {
    for (i, s) in seqs.iter().map(AsRef::as_ref).enumerate() {
        if s.is_empty() || s.len() > max_positions {
            return Err(crate::KernelError::invalid(
                "encoder input",
                format!(
                    "sequence {i} has {} tokens; the model takes 1 to {max_positions}",
                    s.len()
                ),
            ));
        }
        if let Some(&id) = s.iter().find(|&&id| id as usize >= vocab) {
            return Err(crate::KernelError::invalid(
                "encoder input",
                format!("sequence {i} holds token id {id}, past the vocabulary of {vocab}"),
            ));
        }
    }
    Ok(())
}

/// `seqs` cut, in order, into runs of at most `max_tokens` tokens (a
/// longer sequence alone): a CPU pass's tiles and a GPU twin's pieces.
pub fn runs<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_3e7_relative_over_its_range() {
        let mut worst = 0.0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let want = (x as f64).exp();
            worst = worst.max(((exp(x) as f64) - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn erf_is_within_5e7_absolute() {
        // The reference: 2/√π·∫₀ˣ e^(-t²) dt by Simpson's rule in f64,
        // stepped along x (far closer than the bound tested).
        let mut worst = 0.0f64;
        let (step, mut integral, mut x) = (1e-4f64, 0.0f64, 0.0f64);
        let f = |t: f64| (-t * t).exp();
        while x < 6.0 {
            integral += step / 6.0 * (f(x) + 4.0 * f(x + step / 2.0) + f(x + step));
            x += step;
            let want = integral * 2.0 / std::f64::consts::PI.sqrt();
            for sign in [1.0, -1.0] {
                let got = erf((sign * x) as f32) as f64;
                // erf(x as f32) against erf(x): the f32 rounding of x moves
                // erf by at most its slope (≤ 1.13) times half an ulp.
                let slack = 1.2 * (x as f32 as f64 - x).abs();
                worst = worst.max((got - sign * want).abs() - slack);
            }
        }
        assert!(worst < 5e-7, "worst absolute error {worst:e}");
    }

    #[test]
    fn a_strided_product_reads_a_transpose_in_place() {
        // a = [[1, 2], [3, 4]]; b = aᵀ read from a's own storage.
        let a = [1.0, 2.0, 3.0, 4.0];
        let mut c = [0.0; 4];
        let v = |rs, cs| View {
            data: &a,
            row_stride: rs,
            col_stride: cs,
        };
        matmul_strided((2, 2, 2), 1.0, v(2, 1), v(1, 2), &mut c, 2);
        assert_eq!(c, [5.0, 11.0, 11.0, 25.0]);
    }

    #[test]
    #[should_panic(expected = "past its slice")]
    fn a_product_past_its_slice_panics_before_reading() {
        let a = [1.0; 3];
        let mut c = [0.0; 4];
        let v = View {
            data: &a,
            row_stride: 2,
            col_stride: 1,
        };
        matmul_strided((2, 2, 2), 1.0, v, v, &mut c, 2);
    }

    #[test]
    fn layer_norm_of_a_row_has_zero_mean_and_unit_variance() {
        let mut x = [1.0, 2.0, 3.0, 4.0];
        add_layer_norm(&mut x, None, &[1.0; 4], &[0.0; 4], 0.0);
        let mean: f32 = x.iter().sum::<f32>() / 4.0;
        let var: f32 = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{x:?}");
    }

    #[test]
    fn rms_norm_gives_unit_root_mean_square_times_gamma() {
        let mut x = [3.0, -4.0, 0.0, 5.0, 2.0, 2.0, 2.0, 2.0];
        rms_norm(&mut x, &[1.0, 1.0, 1.0, 2.0], 0.0);
        let rms = |r: &[f32]| (r.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        let scale = 1.0 / (50.0f32 / 4.0).sqrt();
        assert!((x[0] - 3.0 * scale).abs() < 1e-6 && (x[3] - 10.0 * scale).abs() < 1e-6);
        // The second row is constant: RMSNorm does not centre it.
        assert_eq!(&x[4..7], &[1.0; 3]);
        assert!((rms(&x[4..]) - (1.75f32).sqrt()).abs() < 1e-6, "{x:?}");
    }

    #[test]
    fn silu_is_x_times_its_sigmoid() {
        let xs = [-20.0f32, -1.0, 0.0, 0.5, 3.0, 20.0];
        let mut v = xs;
        silu(&mut v);
        for (x, y) in xs.iter().zip(v) {
            let want = *x as f64 / (1.0 + (-*x as f64).exp());
            assert!(
                (y as f64 - want).abs() < 1e-6 * (1.0 + want.abs()),
                "{x}: {y}"
            );
        }
    }

    #[test]
    fn rotary_turns_each_pair_by_its_angle() {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rotary_table(3, 4, 10_000.0, &mut cos, &mut sin);
        assert_eq!((cos.len(), sin.len()), (6, 6));
        // Position 0 turns nothing; position 2's first pair turns by 2
        // radians, its second by 2/100.
        assert_eq!((&cos[..2], &sin[..2]), (&[1.0, 1.0][..], &[0.0, 0.0][..]));
        assert!((cos[4] - 2.0f32.cos()).abs() < 1e-7 && (sin[5] - 0.02f32.sin()).abs() < 1e-7);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        rotate_half(&mut x, &cos[4..], &sin[4..]);
        let (c, s) = (2.0f32.cos(), 2.0f32.sin());
        assert!((x[0] - (c - 3.0 * s)).abs() < 1e-6 && (x[2] - (3.0 * c + s)).abs() < 1e-6);
        let norm: f32 = x.iter().map(|v| v * v).sum();
        assert!(
            (norm - 30.0).abs() < 1e-4,
            "a rotation keeps the length: {x:?}"
        );
    }

    #[test]
    fn runs_keep_order_and_put_a_long_sequence_alone() {
        let (a, b, c) = ([0u32; 3], [0u32; 5], [0u32; 2]);
        let seqs: Vec<&[u32]> = vec![&a, &b, &c, &a];
        let r: Vec<_> = runs(&seqs, 4).collect();
        assert_eq!(r, vec![0..1, 1..2, 2..3, 3..4]);
        let r: Vec<_> = runs(&seqs, 8).collect();
        assert_eq!(r, vec![0..2, 2..4]);
    }
}
