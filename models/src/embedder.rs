//! [`Embedder`]: a sentence encoder ([`crate::encoder`]) as a stream
//! [`Model`], its inputs tokenised by the `tokenizers` crate, with the
//! model's prompts.
//!
//! Tokenising runs on the caller's task, before a text is queued
//! ([`Embedder::tokenize`]): coexec's workers see token ids only, so the
//! tokenizer's cost is never on a batch's critical path. The HTTP service
//! tokenises a request on its handler (a large one on tokio's blocking
//! pool). Texts are truncated as sentence-transformers does (at the
//! model's `max_seq_length`, `[CLS]` and `[SEP]` included; their last
//! tokens cut, or their first where asked, [`TruncationDirection`]) and
//! never padded: the encoder lays a batch's sequences back to back
//! ([`crate::encoder`]), and counts a batch's work in tokens.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use coexec_kernels::KernelError;
use tokenizers::{Tokenizer, TruncationParams};

/// A tokenizer.json is a few MiB (all-MiniLM-L6-v2's: 0.7 MiB): past this,
/// not read.
const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

use coexec::stream::{Model, Phased};

use crate::encoder::{Encoder, EncoderWeights};

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

/// Which end of a text past the model's limit is cut (TEI's
/// `truncation_direction`). The special tokens (`[CLS]`, `[SEP]`) stay
/// either way: the tokenizer cuts the text's tokens, then frames them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TruncationDirection {
    /// Keep the first tokens (sentence-transformers' way, the default).
    #[default]
    Right,
    /// Keep the last tokens.
    Left,
}

/// A sentence-embedding model to serve: the encoder's weights, its
/// tokenizer, and what `/info` says of it. An input is the token ids of
/// one text ([`Embedder::tokenize`]), an output its pooled vector, not
/// normalised ([`normalize`] it for cosine similarity).
#[derive(Debug, Clone)]
pub struct Embedder {
    weights: Arc<EncoderWeights>,
    tokenizer: Arc<Tokenizer>,
    /// The same, cutting on the left ([`TruncationDirection::Left`]).
    left: Arc<Tokenizer>,
    /// The same without truncation, for [`Embedder::tokens`].
    whole: Arc<Tokenizer>,
    id: String,
    dir: PathBuf,
}

impl Embedder {
    /// Loads the model folder `dir`: `config.json`, `model.safetensors`
    /// (or its shards) and `tokenizer.json`, and sentence-transformers'
    /// modules, `max_seq_length` and prompts where present
    /// ([`EncoderWeights::load`]). Errors name the file and the field or
    /// tensor at fault.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, KernelError> {
        let dir = dir.as_ref();
        let mut weights = EncoderWeights::load(dir)?;
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
        let truncated = |params: Option<TruncationParams>| {
            let mut t = tokenizer.clone();
            t.with_truncation(params).map_err(|e| KernelError::Config {
                path: tok_path.clone(),
                field: "truncation",
                why: e.to_string(),
            })?;
            Ok::<_, KernelError>(t)
        };
        let left = truncated(Some(TruncationParams {
            max_length: max,
            direction: tokenizers::TruncationDirection::Left,
            ..TruncationParams::default()
        }))?;
        let whole = truncated(None)?;
        check_tokenizer(&tokenizer, &weights, dir)?;
        if weights.has_pair_types() {
            // The separator that ends a pair's first text: the token before
            // the first of type 1 in the tokenizer's own pair template.
            let enc = tokenizer
                .encode(("a", "b"), true)
                .map_err(|e| KernelError::Input {
                    path: tok_path.clone(),
                    line: 0,
                    why: format!("the tokenizer fails on a pair of texts: {e}"),
                })?;
            if let Some(k) = enc.get_type_ids().iter().position(|&t| t == 1)
                && k > 0
            {
                weights.set_pair_separator(enc.get_ids()[k - 1]);
            }
        }
        let weights = Arc::new(weights);
        check_probe(&tokenizer, &weights, dir)?;
        let id = dir
            .canonicalize()
            .unwrap_or_else(|_| dir.to_path_buf())
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            weights,
            tokenizer: Arc::new(tokenizer),
            left: Arc::new(left),
            whole: Arc::new(whole),
            id,
            dir: dir.to_path_buf(),
        })
    }

    /// The token ids of `text` (`[CLS] … [SEP]`), cut to the model's limit
    /// when `truncate` (its last tokens cut), refused past it otherwise:
    /// [`Embedder::tokenize_from`] on the right.
    pub fn tokenize(&self, text: &str, truncate: bool) -> Result<Vec<u32>, TokenizeError> {
        self.tokenize_from(text, truncate, TruncationDirection::Right)
    }

    /// The token ids of `text` (`[CLS] … [SEP]`), cut to the model's limit
    /// at the end `direction` names when `truncate` (the special tokens
    /// kept: on the left, `[CLS]`, the text's last tokens, `[SEP]`),
    /// refused past it otherwise.
    ///
    /// A long text is tokenised by its first bytes (cut on the left, its
    /// last), cut at a space, when they already hold more tokens than the
    /// model takes: the tokens kept are the same as the whole text's
    /// (every tokenizer here splits words at spaces before it cuts them
    /// into tokens), and a text of a hundred MB costs what its first (or
    /// last) KBs cost, not gigabytes of offsets.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use coexec_models::{Embedder, TruncationDirection};
    /// let model = Embedder::load("all-MiniLM-L6-v2")?;
    /// let long = format!("{} the end", "word ".repeat(1000));
    /// let ids = model.tokenize_from(&long, true, TruncationDirection::Left)?;
    /// assert_eq!(ids.len(), model.max_input_length());
    /// assert_eq!(model.decode(&ids[ids.len() - 3..], true)?, "the end");
    /// # Ok(()) }
    /// ```
    pub fn tokenize_from(
        &self,
        text: &str,
        truncate: bool,
        direction: TruncationDirection,
    ) -> Result<Vec<u32>, TokenizeError> {
        let tokenizer = self.cutting(direction);
        let encode = |t: &str| {
            tokenizer
                .encode(t, true)
                .map_err(|e| TokenizeError::Tokenizer(e.to_string()))
        };
        let part = match direction {
            TruncationDirection::Right => prefix_at_space,
            TruncationDirection::Left => suffix_at_space,
        };
        // A token is rarely past 16 bytes; a part 32 bytes a token long
        // almost always overflows, and one four times as long is tried
        // where it does not.
        let mut len = self.max_input_length().saturating_mul(32).max(4096);
        let enc = loop {
            let Some(part) = part(text, len) else {
                break encode(text)?;
            };
            let enc = encode(part)?;
            if !enc.get_overflowing().is_empty() {
                break enc;
            }
            len = len.saturating_mul(4);
        };
        if !truncate && !enc.get_overflowing().is_empty() {
            return Err(TokenizeError::TooLong {
                max: self.max_input_length(),
            });
        }
        self.check_types(&enc)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The token ids of a pair of texts (a query and a passage, for a
    /// cross-encoder), by the tokenizer's pair template (`[CLS] a [SEP] b
    /// [SEP]`), the longer text cut first to the model's limit when
    /// `truncate` (its last tokens), refused past it otherwise:
    /// [`Embedder::tokenize_pair_from`] on the right.
    pub fn tokenize_pair(
        &self,
        first: &str,
        second: &str,
        truncate: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.tokenize_pair_from(first, second, truncate, TruncationDirection::Right)
    }

    /// [`Embedder::tokenize_pair`], the longer text cut first at the end
    /// `direction` names (the special tokens kept).
    pub fn tokenize_pair_from(
        &self,
        first: &str,
        second: &str,
        truncate: bool,
        direction: TruncationDirection,
    ) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .cutting(direction)
            .encode((first, second), true)
            .map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        if !truncate && !enc.get_overflowing().is_empty() {
            return Err(TokenizeError::TooLong {
                max: self.max_input_length(),
            });
        }
        self.check_types(&enc)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The tokenizer that cuts at `direction`'s end.
    fn cutting(&self, direction: TruncationDirection) -> &Tokenizer {
        match direction {
            TruncationDirection::Right => &self.tokenizer,
            TruncationDirection::Left => &self.left,
        }
    }

    /// A classifier with token types takes the rows after the first
    /// separator as a pair's second text (the ids carry no types): refuses
    /// an encoding whose types the tokenizer put elsewhere, as where a
    /// text holds the separator itself (`"a [SEP] b"`).
    fn check_types(&self, enc: &tokenizers::Encoding) -> Result<(), TokenizeError> {
        let Some((_, sep)) = &self.weights.second_type else {
            return Ok(());
        };
        let first = enc.get_ids().iter().position(|id| id == sep);
        let second = |k: usize| first.is_some_and(|s| k > s);
        if enc
            .get_type_ids()
            .iter()
            .enumerate()
            .any(|(k, &t)| (t == 1) != second(k))
        {
            return Err(TokenizeError::Tokenizer(
                "a text holds the model's separator token, which would move where the second \
                 text starts"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A sequence classifier's labels, in the order of its outputs
    /// (`config.json`'s `id2label`); `None` for a model of embeddings.
    pub fn labels(&self) -> Option<&[String]> {
        self.weights.config().labels.as_deref()
    }

    /// Every token of `text`, never truncated (as TEI's `/tokenize` gives
    /// them: a text is counted or cut into pieces by them), with
    /// `[CLS] … [SEP]` where `add_special_tokens`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let model = coexec_models::Embedder::load("all-MiniLM-L6-v2")?;
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

    /// The SHA-256 of the weight files (`model.safetensors`, or its
    /// shards in order), hex.
    pub fn sha256(&self) -> &str {
        self.weights.sha256()
    }

    /// The text of prompt `name` (`config_sentence_transformers.json`'s
    /// `prompts`), put before a text as it is tokenised; `None` where the
    /// model has no such prompt.
    pub fn prompt(&self, name: &str) -> Option<&str> {
        self.weights.modules.prompts.get(name).map(String::as_str)
    }

    /// The names of the model's prompts.
    pub fn prompt_names(&self) -> impl Iterator<Item = &str> {
        self.weights.modules.prompts.keys().map(String::as_str)
    }

    /// The prompt a text gets when its request names none
    /// (`default_prompt_name`, as sentence-transformers applies it).
    pub fn default_prompt(&self) -> Option<&str> {
        let name = self.weights.modules.default_prompt.as_deref()?;
        self.prompt(name)
    }

    /// The model folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<EncoderWeights> {
        &self.weights
    }
}

/// The sentence [`Embedder::load`] runs the model on before serving it.
const PROBE: &str = "coexec checks that the model's answers are finite.";

/// Refuses a tokenizer that can give an id past the embedding matrix (its
/// largest id, of its vocabulary and its added tokens, not their count:
/// an added token may take any id), or whose special-token frame leaves
/// no room for a text's token in the model's limit (`[CLS]` and `[SEP]`
/// take 2 of BERT's: a limit of 2 would cut every text to nothing, and
/// `truncate: false` could not refuse what it cut).
fn check_tokenizer(t: &Tokenizer, w: &EncoderWeights, dir: &Path) -> Result<(), KernelError> {
    use tokenizers::PostProcessor;
    let c = w.config();
    if let Some((token, id)) = t.get_vocab(true).into_iter().max_by_key(|&(_, id)| id)
        && id as usize >= c.vocab
    {
        return Err(KernelError::Config {
            path: dir.join("tokenizer.json"),
            field: "model.vocab",
            why: format!(
                "token {token:?} has id {id}, past the embedding matrix's {} rows \
                 (config.json's vocab_size)",
                c.vocab
            ),
        });
    }
    let frame = t.get_post_processor().map_or(0, |p| p.added_tokens(false));
    if c.max_tokens <= frame {
        // The limit is sentence-transformers' where it is below the
        // model's positions, else the positions' own.
        let (file, field) = if c.max_tokens < c.max_positions {
            ("sentence_bert_config.json", "max_seq_length")
        } else {
            ("config.json", "max_position_embeddings")
        };
        return Err(KernelError::Config {
            path: dir.join(file),
            field,
            why: format!(
                "{} tokens, no room for a text: the tokenizer's post-processor adds {frame} \
                 special tokens to each, so the model needs at least {}",
                c.max_tokens,
                frame + 1
            ),
        });
    }
    Ok(())
}

/// Runs the encoder's CPU pass on [`PROBE`] and refuses weights whose
/// answer is not finite (a weight that overflows, as query and key
/// weights scaled by 1e19 do): a model that would answer NaN to every
/// text is refused at load, not served.
fn check_probe(t: &Tokenizer, w: &Arc<EncoderWeights>, dir: &Path) -> Result<(), KernelError> {
    let tok_path = dir.join("tokenizer.json");
    let enc = t.encode(PROBE, true).map_err(|e| KernelError::Input {
        path: tok_path.clone(),
        line: 0,
        why: format!("the tokenizer fails on the sentence {PROBE:?}: {e}"),
    })?;
    let ids = enc.get_ids().to_vec();
    if ids.is_empty() {
        return Err(KernelError::Input {
            path: tok_path,
            line: 0,
            why: format!("the tokenizer gives no tokens for the sentence {PROBE:?}"),
        });
    }
    // The post-processor's own ids ([CLS], [SEP]) are in no vocabulary:
    // a text's encoding shows them.
    if let Some(id) = ids.iter().find(|&&id| id as usize >= w.config().vocab) {
        return Err(KernelError::Config {
            path: tok_path,
            field: "post_processor",
            why: format!(
                "adds token id {id}, past the embedding matrix's {} rows (config.json's vocab_size)",
                w.config().vocab
            ),
        });
    }
    let k = Encoder::new(w.clone(), vec![ids])?;
    let k = coexec_kernels::run_sequential(coexec_kernels::OneShot::new(k))?.ok_or_else(|| {
        KernelError::invalid("encoder probe", "the probe's kernel was not given back")
    })?;
    if k.into_vectors().iter().flatten().any(|x| !x.is_finite()) {
        return Err(KernelError::Input {
            path: w.source().to_path_buf(),
            line: 0,
            why: format!(
                "the outputs are not finite (NaN or infinite) for the sentence {PROBE:?}: \
                 the weights overflow, and every answer would be NaN"
            ),
        });
    }
    Ok(())
}

/// The text's first bytes, at most `len` of them, cut before a space (so
/// no word is cut in two); `None` when the text is no longer than `len`
/// or its first `len` bytes hold no space past the first.
fn prefix_at_space(text: &str, len: usize) -> Option<&str> {
    if text.len() <= len {
        return None;
    }
    let mut end = len;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let at = text[..end]
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace())
        .map(|(i, _)| i)?;
    (at > 0).then(|| &text[..at])
}

/// The text's last bytes, at most `len` of them, from the start of a run
/// of spaces (so no word is cut in two, and the first word keeps the space
/// before it, which a byte-level vocabulary reads as part of it); `None`
/// when the text is no longer than `len` or its last `len` bytes hold no
/// such start after a word.
fn suffix_at_space(text: &str, len: usize) -> Option<&str> {
    if text.len() <= len {
        return None;
    }
    let mut start = text.len() - len;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    // A run of spaces is split as a whole (`"   b"` is not `"  b"`): the
    // part starts where a run does, after a character that is not one.
    let mut prev = text[..start].chars().next_back();
    let at = text[start..].char_indices().find_map(|(i, c)| {
        let starts_run = c.is_whitespace() && prev.is_some_and(|p| !p.is_whitespace());
        prev = Some(c);
        starts_run.then_some(start + i)
    })?;
    Some(&text[at..])
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

/// The fewest tokens a batch of fewer sequences than the CPU workers needs
/// to run in phases ([`Model::phased`]): 2·layers + 1 jobs of a few tens of
/// microseconds each against the half (on 2 workers) of a pass that costs
/// about 0.3 ms a token on one core for all-MiniLM-L6-v2.
pub const PHASED_MIN_TOKENS: usize = 16;

impl Model for Embedder {
    type Input = Vec<u32>;
    type Output = Vec<f32>;
    type Kernel = Encoder;

    fn build(&self, inputs: Vec<Vec<u32>>) -> Result<Encoder, KernelError> {
        let k = Encoder::new(self.weights.clone(), inputs)?;
        metrics::histogram!("coexec_embed_batch_tokens").record(k.tokens() as f64);
        // Text Embeddings Inference's name for the same, so that its
        // dashboards read coexec's service.
        metrics::histogram!("te_batch_next_tokens").record(k.tokens() as f64);
        Ok(k)
    }

    fn outputs(&self, k: Encoder) -> Result<Vec<Vec<f32>>, KernelError> {
        Ok(k.into_vectors())
    }

    /// A batch of fewer sequences than the CPU workers, of at least
    /// [`PHASED_MIN_TOKENS`] tokens, in [`Encoder::phased`]'s steps with
    /// one row block per worker (at least 16 rows: the GEMMs keep rows
    /// enough to run near their peak); a SPLADE model's batch as one job.
    fn phased(&self, k: Encoder, workers: usize) -> Result<Phased<Encoder>, Encoder> {
        if workers < 2
            || k.tokens() < PHASED_MIN_TOKENS
            || self.weights.config().pooling == crate::encoder::Pooling::Splade
        {
            return Err(k);
        }
        let rows = k.tokens().div_ceil(workers).max(16);
        match k.phased() {
            Ok(p) => Ok(Phased::new(p.rows_per_block(rows))),
            // Refused only for SPLADE, kept out above; should another
            // refusal come, the batch fails with it.
            Err(e) => Ok(Phased::failed(e)),
        }
    }

    /// 1 to the model's positions, each id within its vocabulary.
    fn check_input(&self, ids: &Vec<u32>) -> Result<(), String> {
        let c = self.weights.config();
        if ids.is_empty() {
            // A text of spaces, with a tokenizer that adds no [CLS].
            return Err(format!(
                "no tokens (the text holds none the tokenizer keeps); the model takes 1 to {}",
                c.max_positions
            ));
        }
        if ids.len() > c.max_positions {
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

    /// Every value finite: a vector of NaN or infinities is refused, for
    /// its own request only.
    fn check_output(&self, v: &Vec<f32>) -> Result<(), String> {
        match v.iter().position(|x| !x.is_finite()) {
            Some(j) => Err(format!(
                "the model's vector for this input is not finite (value {j} is {}): \
                 its arithmetic overflowed",
                v[j]
            )),
            None => Ok(()),
        }
    }

    /// A sequence's tokens.
    fn cost(&self, ids: &Vec<u32>) -> usize {
        ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_before_a_space_and_a_suffix_starts_at_a_run_of_them() {
        let text = "one two   three four";
        assert_eq!(prefix_at_space(text, 9), Some("one two "));
        assert_eq!(prefix_at_space(text, 100), None);
        // From byte 20 - 9 = 11, inside "three": the next run starts
        // before "four", and keeps its space.
        assert_eq!(suffix_at_space(text, 9), Some(" four"));
        // From the run after "two": all of it; from inside it, not.
        assert_eq!(suffix_at_space(text, 13), Some("   three four"));
        assert_eq!(suffix_at_space(text, 12), Some(" four"));
        assert_eq!(suffix_at_space(text, 100), None);
        assert_eq!(suffix_at_space("abcdefgh", 4), None, "no space");
        // A start inside a character moves past it.
        assert_eq!(suffix_at_space("ééé é", 4), Some(" é"));
    }
}
