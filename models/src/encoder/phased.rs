//! One batch's forward pass as a phased [`Workload`]: every step a job whose
//! items all CPU workers share, so that a single long sentence runs on every
//! core rather than on the one worker its tile would go to.
//!
//! ```text
//!  rows  [ embed, norm ─▶ QKV(0) ]                 items: token rows (blocks of ROW_BLOCK)
//!  heads [ softmax(Q·Kᵀ/√d)·V of layer 0 ]         items: query heads, context head-major
//!  rows  [ out GEMM, norm, MLP, norm ─▶ QKV(1) ]   items: token rows
//!   ⋮     (two steps per layer)
//!  rows  [ … MLP, norm ─▶ final norm ]             then the host pools each sequence
//! ```
//!
//! A row step reads every row's input and writes its own rows' output (and
//! the next layer's queries, keys and values, rotated at each row's
//! position in its sequence); a head step reads every row's queries, keys
//! and values and writes its heads' context, `[t][d]` per head, one
//! contiguous region each. Steps read one buffer and write another, so a
//! chunk computes the same whatever ran before it in its step; each step
//! counts the blocks it computed and its [`Workload::absorb`] refuses a
//! step in which one was skipped or computed twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use coexec_kernels::{Chunk, DisjointBuf, Kernel, KernelError, Workload, check_chunk};

use super::cpu::Token;
use super::{Encoder, EncoderWeights, Pooling, SCRATCH};

/// Token rows per block of the row steps (their grain), unless
/// [`EncoderPhases::rows_per_block`] says otherwise. Each block's GEMMs
/// stream (and pack) the layer's weights once, so a block wants rows enough
/// to hide that: one 256-token all-MiniLM-L6-v2 sentence on two workers
/// took 0.70 of one core's one-kernel time in blocks of 32 rows, 0.60 in
/// 64 and 0.57 in 128 (one block per worker).
pub const ROW_BLOCK: usize = 64;

/// What every step of one batch reads: its rows' tokens and its sequences.
#[derive(Debug)]
struct Batch {
    /// Every row's token, the sorted sequences back to back.
    tokens: Vec<Token>,
    /// Per sorted sequence: its first row and its length.
    spans: Vec<(usize, usize)>,
    /// The longest sequence's length.
    longest: usize,
}

/// An [`Encoder`]'s batch as a phased [`Workload`] (from
/// [`Encoder::phased`]): about two steps per layer, each a job over token
/// rows or attention heads that every CPU worker shares. Its output is the
/// [`Encoder`], read as after a one-kernel run ([`Encoder::into_vectors`],
/// [`Encoder::into_token_vectors`]).
///
/// ```no_run
/// use std::sync::Arc;
/// use coexec_models::encoder::{EncoderWeights, Encoder};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Arc::new(EncoderWeights::load("all-MiniLM-L6-v2")?);
/// let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().start().await?;
/// let job = Encoder::new(w, vec![vec![101, 7592, 2088, 102]])?.phased()?;
/// let (k, _reports) = rt.drive(job, Default::default()).await?;
/// assert_eq!(k.into_vectors()[0].len(), 384);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EncoderPhases {
    enc: Encoder,
    batch: Arc<Batch>,
    /// The next step to hand out.
    next: Next,
    /// Every row's hidden state after the last absorbed row step.
    x: Vec<f32>,
    /// Every row's queries, keys and values for the next head step.
    qkv: Vec<f32>,
    /// Every row's attention context, head-major, for the next row step.
    ctx: Vec<f32>,
    /// Whether a step is out (handed out, not yet absorbed).
    out: bool,
    /// The row steps' grain.
    block: usize,
}

/// Where a phased pass stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// The rows step of layer `layer`'s rest (`None`: the embeddings).
    Rows(Option<usize>),
    /// The heads step of layer `layer`.
    Heads(usize),
    /// Every step absorbed and the sequences pooled.
    Done,
}

/// One step of an [`EncoderPhases`] pass: a kernel over token rows (in
/// blocks of [`EncoderPhases::rows_per_block`]) or over query heads.
#[derive(Debug)]
pub struct EncoderStep {
    weights: Arc<EncoderWeights>,
    batch: Arc<Batch>,
    part: Part,
    /// The grain of a row step.
    block: usize,
    /// Per block of the grain: the chunks that computed it.
    done: Box<[AtomicU32]>,
}

#[derive(Debug)]
enum Part {
    Rows {
        /// The layer whose rest this step runs (`None`: the embeddings).
        layer: Option<usize>,
        /// The layer whose queries, keys and values follow (`None`: the
        /// final norm).
        next: Option<usize>,
        x_in: Vec<f32>,
        ctx: Vec<f32>,
        x_out: DisjointBuf<f32>,
        /// Absent after the last layer.
        qkv: Option<DisjointBuf<f32>>,
    },
    Heads {
        layer: usize,
        qkv: Vec<f32>,
        ctx: DisjointBuf<f32>,
    },
}

impl Encoder {
    /// This batch as a phased [`Workload`] ([`EncoderPhases`]): the same
    /// pass with every step spread over all CPU workers (no GPU twin), for
    /// batches too small to keep every worker busy as one kernel (a single
    /// sentence). Its vectors match the one-kernel run's to float
    /// rounding (1.1e-7 of a vector's largest value at most, over the test
    /// models); a [`Encoder::token_vectors`] batch gives its token vectors.
    /// Refused for a SPLADE model (its head would run on the host alone),
    /// the batch dropped: check `weights().config().pooling` first to run
    /// it as one kernel instead.
    pub fn phased(self) -> Result<EncoderPhases, KernelError> {
        let w = &self.weights;
        if w.config().pooling == Pooling::Splade {
            return Err(KernelError::invalid(
                "phased encoder",
                "not available for a SPLADE model",
            ));
        }
        let seqs: Vec<&[u32]> = (0..self.spans.len()).map(|j| self.seq(j)).collect();
        let tokens: Vec<Token> = w.tokens(&seqs).collect();
        let spans = self.spans.clone();
        let longest = spans.iter().map(|s| s.1).max().unwrap_or(0);
        let rows = tokens.len();
        let x = coexec_kernels::try_zeroed("phased encoder rows", rows * w.hidden())?;
        let batch = Arc::new(Batch {
            tokens,
            spans,
            longest,
        });
        Ok(EncoderPhases {
            enc: self,
            batch,
            next: Next::Rows(None),
            x,
            qkv: Vec::new(),
            ctx: Vec::new(),
            out: false,
            block: ROW_BLOCK,
        })
    }
}

impl EncoderPhases {
    /// Sets the row steps' block ([`ROW_BLOCK`] unless set; at least 1): no
    /// chunk of a row step is smaller, but the last. The batch's tokens over the CPU
    /// workers (rounded up) gives each worker one block, the fewest weight
    /// passes; smaller blocks balance better when workers are unequal.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use coexec_models::encoder::{EncoderWeights, Encoder};
    /// # let w = Arc::new(EncoderWeights::load("all-MiniLM-L6-v2")?);
    /// let ids = vec![vec![101; 256]];
    /// // 256 tokens on two workers: two blocks of 128 rows.
    /// let job = Encoder::new(w, ids)?.phased()?.rows_per_block(256usize.div_ceil(2));
    /// # Ok::<(), coexec::kernels::KernelError>(())
    /// ```
    pub fn rows_per_block(mut self, rows: usize) -> Self {
        self.block = rows.max(1);
        self
    }

    fn layers(&self) -> usize {
        self.enc.weights.config().layers
    }

    /// Each sequence's pooled vector (or, for a token-vector batch, every
    /// row) into the encoder's output.
    fn pool(&mut self) {
        let w = &self.enc.weights;
        let h = w.hidden();
        let out = self.enc.out.get_mut().unwrap_or_else(|e| e.into_inner());
        if self.enc.per_token {
            out.copy_from_slice(&self.x);
            return;
        }
        let pooling = w.config().pooling;
        for (&(at, l), o) in self.batch.spans.iter().zip(out.chunks_exact_mut(h)) {
            pooling.pool(&self.x[at * h..(at + l) * h], o);
        }
    }
}

impl Workload for EncoderPhases {
    type Step = EncoderStep;
    type Output = Encoder;

    fn next_step(&mut self) -> Result<Option<EncoderStep>, KernelError> {
        if self.out {
            return Err(KernelError::invalid(
                "phased encoder",
                "a step was asked for before the last came back",
            ));
        }
        let (w, batch) = (&self.enc.weights, &self.batch);
        let c = w.config();
        let t = batch.tokens.len();
        let width = (c.heads + 2 * c.kv_heads) * c.head_width;
        let part = match self.next {
            Next::Done => return Ok(None),
            Next::Rows(layer) => {
                let next = match layer {
                    None => 0,
                    Some(li) => li + 1,
                };
                let next = (next < c.layers).then_some(next);
                let x_out = coexec_kernels::try_zeroed("phased encoder rows", t * c.hidden)?;
                let qkv = match next {
                    Some(_) => {
                        let v = std::mem::take(&mut self.qkv);
                        let v = if v.len() == t * width {
                            v
                        } else {
                            coexec_kernels::try_zeroed("phased encoder qkv", t * width)?
                        };
                        Some(DisjointBuf::from_vec(v, width))
                    }
                    None => None,
                };
                Part::Rows {
                    layer,
                    next,
                    x_in: std::mem::take(&mut self.x),
                    ctx: std::mem::take(&mut self.ctx),
                    x_out: DisjointBuf::from_vec(x_out, c.hidden),
                    qkv,
                }
            }
            Next::Heads(layer) => {
                let n = c.heads * t * c.head_width;
                let v = std::mem::take(&mut self.ctx);
                let v = if v.len() == n {
                    v
                } else {
                    coexec_kernels::try_zeroed("phased encoder context", n)?
                };
                Part::Heads {
                    layer,
                    qkv: std::mem::take(&mut self.qkv),
                    ctx: DisjointBuf::from_vec(v, t * c.head_width),
                }
            }
        };
        let blocks = match &part {
            Part::Rows { .. } => t.div_ceil(self.block),
            Part::Heads { .. } => c.heads,
        };
        self.out = true;
        Ok(Some(EncoderStep {
            weights: w.clone(),
            batch: batch.clone(),
            part,
            block: self.block,
            done: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
        }))
    }

    fn absorb(&mut self, step: EncoderStep) -> Result<(), KernelError> {
        self.out = false;
        let counts = step.done.iter().map(|d| d.load(Ordering::Relaxed));
        if let Some((b, n)) = counts.enumerate().find(|&(_, n)| n != 1) {
            return Err(KernelError::invalid(
                "phased encoder",
                format!("{} {b} was computed {n} times", step.what()),
            ));
        }
        match step.part {
            Part::Rows {
                layer,
                next,
                x_out,
                qkv,
                ctx,
                ..
            } => {
                self.x = x_out.into_vec();
                // Kept for the next head step's context.
                self.ctx = ctx;
                match (next, qkv) {
                    (Some(nl), Some(qkv)) => {
                        self.qkv = qkv.into_vec();
                        self.next = Next::Heads(nl);
                    }
                    _ => {
                        debug_assert!(layer.is_none_or(|li| li + 1 == self.layers()));
                        self.pool();
                        self.next = Next::Done;
                    }
                }
            }
            Part::Heads { layer, qkv, ctx } => {
                self.ctx = ctx.into_vec();
                // Kept for the next row step's queries, keys and values.
                self.qkv = qkv;
                self.next = Next::Rows(Some(layer));
            }
        }
        Ok(())
    }

    fn finish(self) -> Encoder {
        self.enc
    }
}

impl EncoderStep {
    /// What the step's items are, for messages.
    fn what(&self) -> &'static str {
        match self.part {
            Part::Rows { .. } => "row block",
            Part::Heads { .. } => "head",
        }
    }
}

impl Kernel for EncoderStep {
    fn name(&self) -> &str {
        self.weights.config().family.model_type()
    }

    fn items(&self) -> usize {
        match &self.part {
            Part::Rows { .. } => self.batch.tokens.len(),
            Part::Heads { .. } => self.weights.config().heads,
        }
    }

    fn profile_key(&self) -> String {
        let c = self.weights.config();
        format!(
            "{}/{}x{}x{}x{}/phased-{}",
            c.family.model_type(),
            c.layers,
            c.hidden,
            c.heads,
            c.intermediate,
            match self.part {
                Part::Rows { .. } => "rows",
                Part::Heads { .. } => "heads",
            }
        )
    }

    fn grain(&self) -> usize {
        match self.part {
            Part::Rows { .. } => self.block,
            Part::Heads { .. } => 1,
        }
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), self.grain())?;
        if chunk.is_empty() {
            return Ok(());
        }
        let (w, b) = (&*self.weights, &*self.batch);
        SCRATCH.with(|s| {
            let s = &mut s.borrow_mut();
            match &self.part {
                Part::Rows {
                    layer,
                    next,
                    x_in,
                    ctx,
                    x_out,
                    qkv,
                } => {
                    let x = x_out.chunk_mut(chunk);
                    let qkv = qkv.as_ref().map_or(&mut [][..], |q| q.chunk_mut(chunk));
                    let (parts, input) = ((*layer, *next), (&x_in[..], &ctx[..]));
                    w.phased_rows(parts, chunk.range(), &b.tokens, b.longest, input, x, qkv, s);
                }
                Part::Heads { layer, qkv, ctx } => {
                    let out = ctx.chunk_mut(chunk);
                    w.phased_heads(*layer, chunk.range(), &b.spans, qkv, out, s);
                }
            }
        });
        let g = self.grain();
        for d in &self.done[chunk.lo() / g..chunk.hi().div_ceil(g)] {
            d.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
