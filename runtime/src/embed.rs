//! Sentence embeddings: a BERT-family encoder (all-MiniLM-L6-v2 and any
//! model folder of its layout) as a stream [`Model`], its inputs
//! tokenised by the `tokenizers` crate (feature `embed`).
//!
//! Tokenising runs on the caller's task, before a text is queued
//! ([`Embedder::tokenize`]): coexec's workers see token ids only, so the
//! tokenizer's cost is never on a batch's critical path. The HTTP service
//! tokenises a request on its handler (a large one on tokio's blocking
//! pool). Texts are truncated as sentence-transformers does (at the
//! model's `max_seq_length`, `[CLS]` and `[SEP]` included) and never
//! padded: the encoder lays a batch's sequences back to back
//! ([`coexec_kernels::embed`]), and counts a batch's work in tokens.
//!
//! ```no_run
//! use std::sync::Arc;
//! use coexec::embed::Embedder;
//! use coexec::stream::{Stream, StreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Embedder::load("all-MiniLM-L6-v2")?;
//! let ids = model.tokenize("A man is eating food.", true)?;
//! let rt = Arc::new(coexec::Runtime::builder().devices("cpu")?.start().await?);
//! let stream = Stream::start(rt, model, StreamConfig::new())?;
//! let mut v = stream.infer(ids).await?;
//! coexec::embed::normalize(&mut v);
//! assert_eq!(v.len(), 384);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use coexec_kernels::KernelError;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

/// A tokenizer.json is a few MiB (all-MiniLM-L6-v2's: 0.7 MiB): past this,
/// not read.
const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

use crate::stream::Model;

pub use coexec_kernels::embed::{ATTENTION_COST, BertConfig, BertWeights, Encoder, Pooling};

/// Why a text was not tokenised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizeError {
    /// Longer than the model takes, with truncation off.
    #[error("the input has more than {max} tokens (the model's limit), and `truncate` is false")]
    TooLong {
        /// The model's limit in tokens.
        max: usize,
    },
    /// The tokenizer failed on it.
    #[error("the tokenizer failed: {0}")]
    Tokenizer(String),
}

/// A sentence-embedding model to serve: the encoder's weights, its
/// tokenizer, and what `/info` says of it. An input is the token ids of
/// one text ([`Embedder::tokenize`]), an output its pooled vector, not
/// normalised ([`normalize`] it for cosine similarity).
#[derive(Debug, Clone)]
pub struct Embedder {
    weights: Arc<BertWeights>,
    tokenizer: Arc<Tokenizer>,
    /// The same without truncation, for [`Embedder::tokens`].
    whole: Arc<Tokenizer>,
    id: String,
    sha256: String,
    dir: PathBuf,
}

impl Embedder {
    /// Loads the model folder `dir`: `config.json`, `model.safetensors`
    /// and `tokenizer.json` (and sentence-transformers' pooling and
    /// `max_seq_length` when present). Errors name the file and the field
    /// or tensor at fault.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        let weights_path = dir.join("model.safetensors");
        let cfg = BertConfig::load(dir)?;
        let bytes = coexec_kernels::read_file(&weights_path, coexec_kernels::memory_limit())?;
        let sha256 = format!("{:x}", Sha256::digest(&bytes));
        let weights = BertWeights::from_bytes(cfg, &bytes, &weights_path)?;
        drop(bytes);
        let tok_path = dir.join("tokenizer.json");
        let tok_bytes = coexec_kernels::read_file(&tok_path, MAX_TOKENIZER_BYTES)?;
        let mut tokenizer = Tokenizer::from_bytes(tok_bytes).map_err(|e| KernelError::Input {
            path: tok_path.clone(),
            line: 0,
            why: format!("not a tokenizer: {e}"),
        })?;
        // The file's own truncation and padding (128, fixed, in
        // all-MiniLM-L6-v2's) are not sentence-transformers': truncate at
        // the model's limit, pad never.
        let max = weights.config().max_tokens;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max,
                ..TruncationParams::default()
            }))
            .map_err(|e| KernelError::Config {
                path: tok_path.clone(),
                field: "truncation",
                why: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        let mut whole = tokenizer.clone();
        whole
            .with_truncation(None)
            .map_err(|e| KernelError::Config {
                path: tok_path.clone(),
                field: "truncation",
                why: e.to_string(),
            })?;
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > weights.config().vocab {
            return Err(KernelError::Config {
                path: tok_path,
                field: "model.vocab",
                why: format!(
                    "{vocab} tokens, more than config.json's vocab_size {}",
                    weights.config().vocab
                ),
            });
        }
        let id = dir
            .canonicalize()
            .unwrap_or_else(|_| dir.to_path_buf())
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            weights: Arc::new(weights),
            tokenizer: Arc::new(tokenizer),
            whole: Arc::new(whole),
            id,
            sha256,
            dir: dir.to_path_buf(),
        })
    }

    /// The token ids of `text` (`[CLS] … [SEP]`), cut to the model's limit
    /// when `truncate`, refused past it otherwise.
    pub fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        if !truncate && !enc.get_overflowing().is_empty() {
            return Err(TokenizeError::TooLong {
                max: self.max_input_length(),
            });
        }
        Ok(enc.get_ids().to_vec())
    }

    /// Every token of `text`, never truncated (as TEI's `/tokenize` gives
    /// them: a text is counted or cut into pieces by them), with
    /// `[CLS] … [SEP]` where `add_special_tokens`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let model = coexec::embed::Embedder::load("all-MiniLM-L6-v2")?;
    /// let t = model.tokens("Hello there", true)?;
    /// assert_eq!(t.len(), 4); // [CLS] hello there [SEP]
    /// assert_eq!((t[2].text.as_str(), t[2].start, t[2].stop), ("there", Some(6), Some(11)));
    /// assert!(t[0].special && t[0].start.is_none());
    /// # Ok(()) }
    /// ```
    pub fn tokens(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<Token>, TokenizeError> {
        let enc = self
            .whole
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let tokens = enc
            .get_ids()
            .iter()
            .zip(enc.get_offsets())
            .zip(enc.get_special_tokens_mask())
            .zip(enc.get_tokens())
            .map(|(((&id, &(start, stop)), &special), token)| {
                if special == 1 {
                    Token {
                        id,
                        text: token.clone(),
                        special: true,
                        start: None,
                        stop: None,
                    }
                } else {
                    Token {
                        id,
                        // Offsets are in bytes; a piece of one character
                        // split across tokens (a byte-level vocabulary) is
                        // shown lossily, never a panic.
                        text: String::from_utf8_lossy(
                            text.as_bytes().get(start..stop).unwrap_or_default(),
                        )
                        .into_owned(),
                        special: false,
                        start: Some(start),
                        stop: Some(stop),
                    }
                }
            })
            .collect();
        Ok(tokens)
    }

    /// The text of token ids `ids`, without the special tokens where
    /// `skip_special_tokens` (ids the vocabulary lacks are left out, as
    /// the tokenizer does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.whole
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))
    }

    /// The longest input in tokens (`[CLS]` and `[SEP]` included).
    pub fn max_input_length(&self) -> usize {
        self.weights.config().max_tokens
    }

    /// Width of an embedding.
    pub fn dim(&self) -> usize {
        self.weights.dim()
    }

    /// The model's name: its folder's.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sets the name `/info` gives (`sentence-transformers/all-MiniLM-L6-v2`).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The SHA-256 of `model.safetensors`, hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The model folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<BertWeights> {
        &self.weights
    }
}

/// One token of a text ([`Embedder::tokens`]), as TEI's `/tokenize` shows
/// it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Token {
    /// Its id in the vocabulary.
    pub id: u32,
    /// The text it stands for: the text's bytes `start..stop`, or the
    /// special token itself (`[CLS]`).
    pub text: String,
    /// Whether the tokenizer added it (`[CLS]`, `[SEP]`).
    pub special: bool,
    /// Where it starts in the text, in bytes; `None` for a special token.
    pub start: Option<usize>,
    /// Where it ends in the text, in bytes (exclusive).
    pub stop: Option<usize>,
}

/// Scales `v` to unit length (left as it is when all zero).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if n > 0.0 {
        let inv = (1.0 / n) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

impl Model for Embedder {
    type Input = Vec<u32>;
    type Output = Vec<f32>;
    type Kernel = Encoder;

    fn build(&self, inputs: Vec<Vec<u32>>) -> Result<Encoder, KernelError> {
        let k = Encoder::new(self.weights.clone(), inputs)?;
        metrics::histogram!("coexec_embed_batch_tokens").record(k.tokens() as f64);
        Ok(k)
    }

    fn outputs(&self, k: Encoder) -> Result<Vec<Vec<f32>>, KernelError> {
        Ok(k.into_vectors())
    }

    /// 1 to the model's positions, each id within its vocabulary.
    fn check_input(&self, ids: &Vec<u32>) -> Result<(), String> {
        let c = self.weights.config();
        if ids.is_empty() || ids.len() > c.max_positions {
            return Err(format!(
                "{} tokens; the model takes 1 to {}",
                ids.len(),
                c.max_positions
            ));
        }
        match ids.iter().find(|&&id| id as usize >= c.vocab) {
            Some(id) => Err(format!(
                "token id {id} is past the vocabulary of {}",
                c.vocab
            )),
            None => Ok(()),
        }
    }

    /// A sequence's tokens.
    fn cost(&self, ids: &Vec<u32>) -> usize {
        ids.len()
    }
}
