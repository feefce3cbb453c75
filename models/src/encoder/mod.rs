//! A sentence encoder — BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT,
//! MPNet, ModernBERT and the Qwen3 decoder ([`Family`]; the parts each
//! composes are [`EncoderConfig`]'s) — over a batch of tokenised sequences,
//! on every CPU worker (and, for the BERT layout, every GPU stream) at once.
//!
//! A model folder holds `config.json` (Hugging Face's: the family, widths,
//! depth, heads, vocabulary; [`EncoderConfig`]), `model.safetensors` (or
//! shards; f32, f16 or bf16), and sentence-transformers' module files
//! (`modules.json`: the pooling, any `Dense` layers and `Normalize`;
//! `sentence_bert_config.json`'s `max_seq_length`). Tokenising is the
//! caller's ([`crate::Embedder`], with the `tokenizers` crate): an
//! [`Encoder`] takes token ids.
//!
//! **Work is counted in tokens, not sequences.** A sequence of `L` tokens
//! costs `L` dense-layer tokens plus attention's term, the pairs its layers
//! score ([`EncoderConfig::work`]: `L·(1 + 3L/(2H + I))` token-equivalents
//! in BERT's layout, the 3 measured; half the pairs in a causal decoder, a
//! window's in a local layer), so the
//! kernel's items are token-equivalents: a batch's sequences, sorted
//! shortest first, are laid end to end on the item axis, and a chunk
//! `lo..hi` computes the sequences whose *middle* item lies in it. Each
//! sequence's middle lies in exactly one chunk, so each is computed once,
//! and a chunk's work stays near its items (by starts instead, an even
//! split of two sequences gave both to the first half); the speed
//! models (`t(n) = a + n/b`) and the split then weigh a batch by its
//! tokens. Sorted, the CPUs (eating from the head) take the short
//! sequences and an accelerator (from the tail) the long ones.
//!
//! ```text
//!  items  [ s0 ][ s1 ][  s2  ][   s3   ][      s4      ]   (shortest first)
//!  middle     ^     ^      ^        ^            ^
//!  chunk  |------- cpu -------|---------- gpu ----------|
//!         computes s0 s1 s2        computes s3 s4
//! ```
//!
//! The CPU pass (`cpu.rs`) lays a tile's sequences back to back with no
//! padding: dense layers are GEMMs over real tokens, attention runs over
//! each sequence's own tokens. Outputs are the model's embeddings (the
//! pooling and the modules after it applied) before any normalisation the
//! caller asks for.
//!
//! A batch too small to keep every CPU worker busy as one kernel (a single
//! long sentence is one tile, so one worker) runs as [`Encoder::phased`]
//! instead: the same pass as a [`coexec_kernels::Workload`] of about two
//! jobs per layer, over token rows and over attention heads, each shared by
//! every CPU worker ([`EncoderPhases`]; not for SPLADE).
//!
//! ```no_run
//! use std::sync::Arc;
//! use coexec_models::encoder::{EncoderWeights, Encoder};
//! use coexec::kernels::{run_sequential, OneShot};
//!
//! let w = Arc::new(EncoderWeights::load("all-MiniLM-L6-v2")?);
//! // [CLS] hello world [SEP], as the model's tokenizer gives it.
//! let k = Encoder::new(w, vec![vec![101, 7592, 2088, 102]])?;
//! let k = run_sequential(OneShot::new(k))?.expect("absorbed");
//! assert_eq!(k.into_vectors()[0].len(), 384);
//! # Ok::<(), coexec::kernels::KernelError>(())
//! ```

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use coexec_kernels::{Chunk, Kernel, KernelError, check_chunk};

mod config;
mod cpu;
#[cfg(feature = "cuda")]
mod gpu;
mod phased;
#[cfg(test)]
mod tests;
mod weights;

pub use crate::modules::{DenseActivation, Pooling};
pub use config::{
    ATTENTION_COST, Activation, EncoderConfig, Family, NormKind, RelativeBias, Rotary,
};
pub use phased::{EncoderPhases, EncoderStep, ROW_BLOCK};
pub use weights::EncoderWeights;

thread_local! {
    /// Each worker thread's activations, kept between chunks (of the
    /// one-kernel pass and the phased steps alike).
    static SCRATCH: RefCell<cpu::Scratch> = RefCell::new(cpu::Scratch::default());
}

/// The forward pass over a batch of tokenised sequences: item space in
/// token-equivalents (see the module docs), one pooled vector out per
/// sequence.
#[derive(Debug)]
pub struct Encoder {
    weights: Arc<EncoderWeights>,
    /// The sequences' ids back to back, shortest sequence first.
    ids: Vec<u32>,
    /// Per sorted sequence: its ids' start in `ids`, and its length.
    spans: Vec<(usize, usize)>,
    /// Per sorted sequence: its index in the batch as given.
    order: Vec<usize>,
    /// Per sorted sequence: its middle item (rising with the sequence).
    mids: Vec<usize>,
    /// Items in all.
    units: usize,
    /// Pooled vectors in sorted order (`sequences × pooled_width()`), each written
    /// by the chunk its middle lies in; or, for
    /// [`Encoder::token_vectors`], every token's vector (`tokens × H`).
    out: Mutex<Vec<f32>>,
    /// Whether the output is every token's vector rather than the pooled.
    per_token: bool,
}

impl Encoder {
    /// A batch of `seqs`, each the ids of one input as the model's
    /// tokenizer gives them (`[CLS] … [SEP]`). Refuses an empty sequence,
    /// one longer than the model's positions, and an id past its
    /// vocabulary, naming the sequence.
    pub fn new(weights: Arc<EncoderWeights>, seqs: Vec<Vec<u32>>) -> Result<Self, KernelError> {
        Self::with_output(weights, seqs, false)
    }

    /// A batch whose output is every token's vector after the last layer
    /// (and a pre-norm stack's final norm), before any pooling: TEI's
    /// `/embed_all`. Read with [`Encoder::into_token_vectors`]. It runs on
    /// the CPU workers (the GPU twin pools). Refused for a SPLADE model,
    /// whose output is its head's, not its token vectors (as TEI refuses
    /// it).
    pub fn token_vectors(
        weights: Arc<EncoderWeights>,
        seqs: Vec<Vec<u32>>,
    ) -> Result<Self, KernelError> {
        if weights.config().pooling == Pooling::Splade {
            return Err(KernelError::invalid(
                "token vectors",
                "not available for a SPLADE model",
            ));
        }
        Self::with_output(weights, seqs, true)
    }

    fn with_output(
        weights: Arc<EncoderWeights>,
        seqs: Vec<Vec<u32>>,
        per_token: bool,
    ) -> Result<Self, KernelError> {
        let c = weights.config();
        coexec_kernels::ops::check_sequences(&seqs, c.vocab, c.max_positions)?;
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| seqs[i].len());
        let tokens = seqs.iter().map(Vec::len).sum();
        let mut ids = Vec::with_capacity(tokens);
        let mut spans = Vec::with_capacity(seqs.len());
        let mut mids = Vec::with_capacity(seqs.len());
        let mut units = 0;
        for &i in &order {
            spans.push((ids.len(), seqs[i].len()));
            ids.extend_from_slice(&seqs[i]);
            let w = c.work(seqs[i].len());
            mids.push(units + w / 2);
            units += w;
        }
        let rows = if per_token { tokens } else { seqs.len() };
        let width = if per_token {
            c.hidden
        } else {
            weights.pooled_width()
        };
        let out = coexec_kernels::try_zeroed("encoder output", rows * width)?;
        Ok(Self {
            weights,
            ids,
            spans,
            order,
            mids,
            units,
            out: Mutex::new(out),
            per_token,
        })
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<EncoderWeights> {
        &self.weights
    }

    /// Sequences in the batch.
    pub fn sequences(&self) -> usize {
        self.spans.len()
    }

    /// Tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// The sorted sequences (`first..last`) whose middle lies in items
    /// `lo..hi`.
    pub(crate) fn centred_in(&self, lo: usize, hi: usize) -> std::ops::Range<usize> {
        self.mids.partition_point(|&m| m < lo)..self.mids.partition_point(|&m| m < hi)
    }

    /// The ids of sorted sequence `j`.
    pub(crate) fn seq(&self, j: usize) -> &[u32] {
        let (at, len) = self.spans[j];
        &self.ids[at..at + len]
    }

    /// Every sequence's ids, shortest first.
    #[cfg(feature = "cuda")]
    pub(crate) fn sorted(&self) -> Vec<&[u32]> {
        (0..self.spans.len()).map(|j| self.seq(j)).collect()
    }

    /// Writes the pooled vectors of sorted sequences `seqs` (a chunk's,
    /// `seqs.len() × pooled_width()` in `pooled`) into the output.
    pub(crate) fn store(&self, seqs: std::ops::Range<usize>, pooled: &[f32]) {
        let h = self.weights.pooled_width();
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out[seqs.start * h..seqs.end * h].copy_from_slice(pooled);
    }

    /// Writes every token's vector of sorted sequences `seqs` (a chunk's,
    /// back to back in `rows`) into the output.
    fn store_tokens(&self, seqs: std::ops::Range<usize>, rows: &[f32]) {
        let h = self.weights.hidden();
        let at = self.spans[seqs.start].0;
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out[at * h..at * h + rows.len()].copy_from_slice(rows);
    }

    /// Each sequence's token vectors in the batch's order (one `H`-wide
    /// vector per token), once the run of an [`Encoder::token_vectors`]
    /// batch is over; empty for a batch of pooled vectors.
    pub fn into_token_vectors(self) -> Vec<Vec<Vec<f32>>> {
        if !self.per_token {
            return Vec::new();
        }
        let h = self.weights.hidden();
        let out = self.out.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut v = vec![Vec::new(); self.order.len()];
        for (j, &i) in self.order.iter().enumerate() {
            let (at, len) = self.spans[j];
            v[i] = out[at * h..(at + len) * h]
                .chunks_exact(h)
                .map(<[f32]>::to_vec)
                .collect();
        }
        v
    }

    /// Each sequence's embedding in the batch's order, once the run is
    /// over: its pooled vector through the modules after the pooling
    /// (`Dense`, `Normalize`), not normalised otherwise (empty for an
    /// [`Encoder::token_vectors`] batch).
    pub fn into_vectors(self) -> Vec<Vec<f32>> {
        if self.per_token {
            return Vec::new();
        }
        let h = self.weights.pooled_width();
        let out = self.out.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut v = vec![Vec::new(); self.order.len()];
        for (j, &i) in self.order.iter().enumerate() {
            v[i] = self.weights.modules.apply(out[j * h..(j + 1) * h].to_vec());
        }
        v
    }
}

impl Kernel for Encoder {
    fn name(&self) -> &str {
        self.weights.config().family.model_type()
    }

    fn items(&self) -> usize {
        self.units
    }

    fn profile_key(&self) -> String {
        let c = self.weights.config();
        // SPLADE's head changes what a token-equivalent costs.
        let head = if c.pooling == Pooling::Splade {
            "+splade"
        } else {
            ""
        };
        format!(
            "{}/{}x{}x{}x{}{head}",
            c.family.model_type(),
            c.layers,
            c.hidden,
            c.heads,
            c.intermediate
        )
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let seqs = self.centred_in(chunk.lo(), chunk.hi());
        if seqs.is_empty() {
            return Ok(());
        }
        let ids: Vec<&[u32]> = seqs.clone().map(|j| self.seq(j)).collect();
        let rows = if self.per_token {
            ids.iter().map(|q| q.len()).sum::<usize>() * self.weights.hidden()
        } else {
            ids.len() * self.weights.pooled_width()
        };
        let mut out = vec![0.0; rows];
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            self.weights
                .encode_cpu(&ids, self.per_token, &mut out, &mut s);
        });
        if self.per_token {
            self.store_tokens(seqs, &out);
        } else {
            self.store(seqs, &out);
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self) -> Option<&dyn coexec_kernels::cuda::CudaKernel> {
        (self.weights.gpu_twin() && !self.per_token).then_some(self as _)
    }
}
