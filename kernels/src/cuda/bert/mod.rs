//! The BERT-layout encoder on a GPU stream: the weights uploaded once per
//! device (one buffer, a [`BertImage`]); per call, the sequences in pieces
//! of at most [`PIECE_TOKENS`] tokens, each a whole forward pass. The
//! model library (`coexec-models`) composes its encoder's GPU twin from
//! [`encode`], [`prepare`] and [`stage`]; everything unsafe is here.
//!
//! ```text
//!  tables (ids, positions, starts, padded rows) ─▶ embed_ln ─▶ ×layers [
//!    QKV cuBLAS GEMM ─▶ split_heads (+bias, padded [B, heads, P, d] per group)
//!    ─▶ per group: strided-batched Q·Kᵀ, softmax_rows, strided-batched ·V
//!    ─▶ merge_heads ─▶ out GEMM ─▶ bias_residual_ln ─▶ up GEMM ─▶ bias_gelu
//!    ─▶ down GEMM ─▶ bias_residual_ln ] ─▶ pool ─▶ host
//! ```
//!
//! Dense layers run over real tokens only; attention pads each group of
//! similar lengths to its longest (`plan.rs`). The element-wise
//! steps are `src/cu/bert.cu`. cuBLAS runs in its default FP32 math (no
//! TF32), so results stay within the CPU pass's bound of the fp64
//! reference.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::HostPin;
use super::nvrtc::BERT;
use super::stream::{DevPtr, Out, StreamWorker, grid_1d};
use super::twin::check_signature;
use crate::KernelError;
use crate::ops::{check_sequences, runs};
pub use plan::PIECE_TOKENS;
use plan::Plan;

mod image;
pub(crate) mod plan;

pub use image::{BertImage, BertShape, DenseRef, LayerRef, NormRef};

/// The stream's slots: the tables, the hidden state `[T, H]`, the QKV
/// projections `[T, 3H]`, the padded Q, K and V, the scores, the context
/// `[T, H]`, a sublayer's output `[T, H]`, the feed-forward activations
/// `[T, I]`, the pooled vectors `[S, H]`.
const META: usize = 0;
const X: usize = 1;
const QKV: usize = 2;
const HEADS: usize = 3;
const SCORES: usize = 4;
const CTX: usize = 5;
const TMP: usize = 6;
const INTER: usize = 7;
const POOL: usize = 8;

/// Threads of a row kernel's block (`embed_ln`, `bias_residual_ln`,
/// `pool`): a multiple of 32.
const ROW_BLOCK: u32 = 128;

/// The functions of `bert.cu`.
struct Fns {
    embed_ln: CudaFunction,
    bias_residual_ln: CudaFunction,
    bias_gelu: CudaFunction,
    split_heads: CudaFunction,
    softmax_rows: CudaFunction,
    merge_heads: CudaFunction,
    pool: CudaFunction,
}

impl Fns {
    fn get(w: &StreamWorker) -> Result<Self, KernelError> {
        // Each function with the parameter sizes `forward` passes it
        // (8: a device address; 4: a u32 or f32), checked against the
        // compiled kernel where the driver can tell (CUDA 12.4 on).
        let f = |name, want: &[usize]| {
            let f = w.function(&BERT, name)?;
            if let Ok(sizes) = w.param_sizes(&f) {
                check_signature(want, &sizes).map_err(|why| {
                    KernelError::Cuda(format!("bert.cu `{name}` against its launch: {why}"))
                })?;
            }
            Ok::<_, KernelError>(f)
        };
        Ok(Self {
            embed_ln: f("embed_ln", &[8, 8, 8, 8, 8, 8, 4, 4, 4, 8])?,
            bias_residual_ln: f("bias_residual_ln", &[8, 8, 8, 8, 8, 4, 4, 4])?,
            bias_gelu: f("bias_gelu", &[8, 8, 4, 4])?,
            split_heads: f("split_heads", &[8, 8, 8, 8, 8, 4, 4, 4, 8, 8, 8])?,
            softmax_rows: f("softmax_rows", &[8, 8, 4, 4, 4])?,
            merge_heads: f("merge_heads", &[8, 8, 8, 8, 4, 4, 4, 8])?,
            pool: f("pool", &[8, 8, 4, 4, 4, 8])?,
        })
    }
}

fn u32_of(n: usize, what: &str) -> Result<u32, KernelError> {
    u32::try_from(n)
        .map_err(|_| KernelError::invalid("encoder piece", format!("{what} {n} exceeds u32")))
}

/// One block per row of `h` floats, with the row in shared memory.
fn rows_cfg(rows: usize, h: usize) -> Result<LaunchConfig, KernelError> {
    Ok(LaunchConfig {
        grid_dim: (u32_of(rows, "rows")?, 1, 1),
        block_dim: (ROW_BLOCK, 1, 1),
        shared_mem_bytes: u32_of(h * 4, "row bytes")?,
    })
}

/// A grid-stride launch over `n` elements.
fn elementwise(n: usize) -> LaunchConfig {
    grid_1d(n.min(1 << 24), 256)
}

/// Enqueues the forward pass of `plan`'s piece; the pooled vectors are in
/// slot [`POOL`] (`S × H` floats) once the stream has run it.
///
/// # Safety
///
/// `base` is the device copy of `img` (held until the stream is
/// synchronised), and `plan` was made of sequences `check_sequences` passed for
/// `img`.
unsafe fn forward(
    w: &mut StreamWorker,
    f: &Fns,
    img: &BertImage,
    base: DevPtr,
    plan: &Plan,
) -> Result<(), KernelError> {
    let c = &img.shape;
    if !plan.products_fit() {
        return Err(KernelError::invalid(
            "encoder piece",
            "attention products past their buffers",
        ));
    }
    let (h, d, inter_w) = (c.hidden, c.head_dim(), c.intermediate);
    if plan.tokens * inter_w >= 1 << 31 {
        return Err(KernelError::invalid(
            "encoder piece",
            format!(
                "{} tokens × {inter_w} past the kernels' 32-bit indices",
                plan.tokens
            ),
        ));
    }
    let (t, r, s) = (plan.tokens, plan.rows, plan.seqs);
    let at = |floats: usize| base + 4 * floats as u64;
    let meta = w.upload::<u32>(META, &[&plan.meta])?;
    let tab = plan.tables();
    let table = |i: usize| meta + 4 * i as u64;
    let x = w.scratch::<f32>(X, t * h)?;
    let qkv = w.scratch::<f32>(QKV, t * 3 * h)?;
    let heads = w.scratch::<f32>(HEADS, 3 * r * h)?;
    let (q, k, v) = (
        heads,
        heads + 4 * (r * h) as u64,
        heads + 8 * (r * h) as u64,
    );
    let scores = w.scratch::<f32>(SCORES, plan.scores)?;
    let ctx = w.scratch::<f32>(CTX, t * h)?;
    let tmp = w.scratch::<f32>(TMP, t * h)?;
    let inter = w.scratch::<f32>(INTER, t * inter_w)?;
    let pooled = w.scratch::<f32>(POOL, s * h)?;
    let (t32, r32, s32) = (
        u32_of(t, "tokens")?,
        u32_of(r, "rows")?,
        u32_of(s, "sequences")?,
    );
    let (h32, d32, i32_, heads32) = (h as u32, d as u32, inter_w as u32, c.heads as u32);
    let eps = c.eps;
    let (ids, pos, starts) = (table(tab.ids), table(tab.pos), table(tab.starts));
    let (src, dst, stride) = (table(tab.src), table(tab.dst), table(tab.stride));
    // SAFETY (every launch and product below): the slots were sized above
    // for this piece (x, ctx, tmp `T·H`, qkv `T·3H`, heads `3·R·H`, scores
    // `plan.scores`, inter `T·I`, pooled `S·H`), the tables are `plan.meta`
    // (ids below the vocabulary and positions below `max_positions`, as
    // `check_sequences` found; padded rows address inside the Q/K/V blocks
    // and tokens below T, as `Plan` builds them, tested in
    // `embed::plan::tests`), the weights are at their `img` offsets in
    // `base`. Each kernel's parameter list is the one in `bert.cu` that the
    // argument list follows; no product's output overlaps its inputs (the
    // context overwrites Q, which it does not read).
    unsafe {
        w.launch(
            &f.embed_ln,
            rows_cfg(t, h)?,
            &[
                &ids,
                &pos,
                &at(img.word),
                &at(img.pos_type),
                &at(img.emb_norm.0),
                &at(img.emb_norm.1),
                &t32,
                &h32,
                &eps,
                &x,
            ],
        )?;
        for l in &img.layers {
            w.dense(x, at(l.qkv.0), qkv, t, h, 3 * h)?;
            w.launch(
                &f.split_heads,
                elementwise(r * h),
                &[
                    &qkv,
                    &at(l.qkv.1),
                    &src,
                    &dst,
                    &stride,
                    &r32,
                    &h32,
                    &d32,
                    &q,
                    &k,
                    &v,
                ],
            )?;
            for g in &plan.groups {
                let off = 4 * (g.row0 * h) as u64;
                let sc = scores + 4 * g.score0 as u64;
                w.gemm(&plan.scores_gemm(g), k + off, q + off, sc)?;
                let rows = g.count * c.heads * g.pad;
                let (n32, p32) = (g.count as u32, g.pad as u32);
                let first = table(tab.starts + g.first);
                w.launch(
                    &f.softmax_rows,
                    grid_1d(rows * 32, 256),
                    &[&sc, &first, &n32, &heads32, &p32],
                )?;
                w.gemm(&plan.context_gemm(g), v + off, sc, q + off)?;
            }
            w.launch(
                &f.merge_heads,
                elementwise(r * h),
                &[&q, &src, &dst, &stride, &r32, &h32, &d32, &ctx],
            )?;
            w.dense(ctx, at(l.attn_out.0), tmp, t, h, h)?;
            let norm = |n: (usize, usize)| (at(n.0), at(n.1));
            let (g1, b1) = norm(l.attn_norm);
            w.launch(
                &f.bias_residual_ln,
                rows_cfg(t, h)?,
                &[&tmp, &at(l.attn_out.1), &x, &g1, &b1, &t32, &h32, &eps],
            )?;
            w.dense(x, at(l.up.0), inter, t, h, inter_w)?;
            w.launch(
                &f.bias_gelu,
                elementwise(t * inter_w),
                &[&inter, &at(l.up.1), &t32, &i32_],
            )?;
            w.dense(inter, at(l.down.0), tmp, t, inter_w, h)?;
            let (g2, b2) = norm(l.out_norm);
            w.launch(
                &f.bias_residual_ln,
                rows_cfg(t, h)?,
                &[&tmp, &at(l.down.1), &x, &g2, &b2, &t32, &h32, &eps],
            )?;
        }
        let mean = u32::from(c.mean_pool);
        w.launch(
            &f.pool,
            LaunchConfig {
                grid_dim: (s32, 1, 1),
                block_dim: (ROW_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            &[&x, &starts, &s32, &h32, &mean, &pooled],
        )?;
    }
    Ok(())
}

/// The pooled vectors (before any normalisation) of `seqs` into `out`
/// (`seqs.len() × H`), piece by piece on `w`'s stream, the sequences laid
/// out in the order given (sorted shortest first, groups pad least).
pub fn encode(
    w: &mut StreamWorker,
    img: &BertImage,
    seqs: &[&[u32]],
    out: &mut [f32],
) -> Result<(), KernelError> {
    let c = &img.shape;
    let h = c.hidden;
    check_sequences(seqs, c.vocab, c.max_positions)?;
    if out.len() != seqs.len() * h {
        return Err(KernelError::invalid(
            "encoder output",
            format!(
                "{} floats for {} sequences of width {h}",
                out.len(),
                seqs.len()
            ),
        ));
    }
    let f = Fns::get(w)?;
    let buf = w.run_input(img.id, &img.data)?;
    let base = w.addr(&buf);
    let pin = HostPin::default();
    for p in runs(seqs, PIECE_TOKENS) {
        let plan = Plan::new(&seqs[p.clone()], c.heads, c.head_dim())
            .ok_or_else(|| KernelError::invalid("encoder piece", "too large for 32-bit offsets"))?;
        // SAFETY: `base` is `img`'s device copy, held in `buf` (and by the
        // stream's held list) until `finish_into` synchronises; `plan` is of
        // sequences `check_sequences` passed for `img`.
        unsafe { forward(w, &f, img, base, &plan)? };
        let dst = &mut out[p.start * h..p.end * h];
        w.finish_into(&mut [Out::new(POOL, 0, dst, &pin)])?;
    }
    drop(buf);
    Ok(())
}

/// Readies `w` for `img`: compiles the kernels, reserves the token-sized
/// buffers at a full piece (so that a later, larger piece does not grow
/// them inside a timed chunk), and runs `first` (a batch's first
/// sequences, whose results are discarded) once, which opens cuBLAS for the
/// stream here rather than in a first chunk whose time would teach the
/// profiler a GPU many times slower than it is.
pub fn prepare(w: &mut StreamWorker, img: &BertImage, first: &[&[u32]]) -> Result<(), KernelError> {
    Fns::get(w)?;
    let c = &img.shape;
    let (t, h) = (PIECE_TOKENS, c.hidden);
    for (slot, floats) in [
        (X, t * h),
        (QKV, t * 3 * h),
        (CTX, t * h),
        (TMP, t * h),
        (INTER, t * c.intermediate),
    ] {
        w.reserve_device(slot, floats * 4)?;
    }
    w.reserve_slot(POOL, t * h * 4)?;
    let piece = runs(first, PIECE_TOKENS).next().unwrap_or(0..0);
    let first = &first[piece];
    let mut out = vec![0.0; first.len() * h];
    encode(w, img, first, &mut out)
}

/// Uploads `img` to `w`'s device if it is not there yet (the run cache
/// keeps one copy per device).
pub fn stage(w: &mut StreamWorker, img: &BertImage) -> Result<(), KernelError> {
    w.run_input(img.id, &img.data).map(drop)
}

/// GPU threads an item (a token-equivalent) occupies: about 16 outputs of
/// the widest dense layer per cuBLAS thread, as for the MLP, so 96 for
/// MiniLM, and the smallest GPU chunk on an H100 is about 1400
/// token-equivalents (a smaller batch runs whole there).
pub fn threads_per_item(shape: &BertShape) -> usize {
    ((3 * shape.hidden).max(shape.intermediate) / 16).max(1)
}
