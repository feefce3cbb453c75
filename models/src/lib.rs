//! coexec's model library: sentence encoders read from a model folder
//! (Hugging Face's `config.json`, `model.safetensors`, `tokenizer.json` and
//! sentence-transformers' module files), tokenised in Rust, and run as a
//! coexec [`Model`](coexec::stream::Model) on every CPU core and GPU stream
//! at once.
//!
//! ```text
//!  text ──Embedder::tokenize──▶ ids ──Stream (coexec)──▶ encoder::Encoder (a Kernel over token-equivalents)
//!                                                        ├─ CPU pass: this crate, on coexec_kernels::ops
//!                                                        └─ GPU twin: coexec_kernels::cuda::bert (BERT layout)
//! ```
//!
//! - [`Embedder`]: a model folder as a stream model (ids in, a pooled
//!   vector out), with its tokenizer, truncation and identity (sha256).
//! - [`encoder`]: the encoder itself, for every family of the BERT layout
//!   (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet): config,
//!   weights (f32, f16, bf16; sharded), sentence-transformers' modules
//!   (pooling, Dense, Normalize), the unpadded CPU pass, and the kernel the
//!   runtime schedules.
//!
//! The crate holds no `unsafe`: the operations it composes, and the GPU
//! device code, are `coexec-kernels`'.
//!
//! ```no_run
//! use std::sync::Arc;
//! use coexec::stream::{Stream, StreamConfig};
//! use coexec_models::Embedder;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Embedder::load("all-MiniLM-L6-v2")?;
//! let ids = model.tokenize("A man is eating food.", true)?;
//! let rt = Arc::new(coexec::Runtime::builder().devices("cpu")?.start().await?);
//! let stream = Stream::start(rt, model, StreamConfig::new())?;
//! let mut v = stream.infer(ids).await?;
//! coexec_models::normalize(&mut v);
//! assert_eq!(v.len(), 384);
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod embedder;
pub mod encoder;
mod folder;
mod modules;

pub use embedder::{
    Embedder, PHASED_MIN_TOKENS, Token, TokenizeError, TruncationDirection, normalize,
};
