//! Text Embeddings Inference's HTTP API over an [`Embedder`]: a drop-in for
//! TEI's clients, served on every CPU core and GPU at once. Each route's
//! body and answer are the types of `tei/types.rs`, TEI's own.
//!
//! ```text
//!  POST /embed          {"inputs": str | [str], "normalize", "truncate", "dimensions"} → [[f32]]
//!  POST /embed_all      {"inputs": str | [str], "truncate", "truncation_direction"} → [[[f32]]] (a vector per token)
//!  POST /v1/embeddings  {"input": str | [str], "model", "dimensions"}  → {"object": "list", "data": [{"embedding", "index"}], "usage"}
//!  POST /similarity     {"inputs": {"source_sentence": str, "sentences": [str]}, "parameters": {"truncate"}} → [cosine]
//!  POST /rerank         {"query": str, "texts": [str], "raw_scores", "return_text"} → [{"index", "score", "text"}] (a cross-encoder)
//!  POST /predict        {"inputs": str | [str, str] | [[str] | [str, str]], "raw_scores"} → [{"score", "label"}] (a classifier)
//!  POST /tokenize       {"inputs": str | [str], "add_special_tokens": true} → [[{"id", "text", "special", "start", "stop"}]]
//!  POST /decode         {"ids": [u32] | [[u32]], "skip_special_tokens": true} → [str]
//!  GET  /info           model id and sha, max input length, batch limits
//!  GET  /health         200, 503 while draining
//! ```
//!
//! Also TEI's `POST /` and `/invocations` (the Inference API's and
//! SageMaker's: `/embed`, or `/rerank`, `/predict` by the model), `GET /`
//! and `/ping` (`/health`). `/embed` and `/v1/embeddings` take token ids
//! too (`[101, 7592]`, `[[101], [7592]]`), and `/v1/embeddings` writes
//! vectors as base64 of their little-endian `f32`s where asked.
//!
//! Texts are tokenised on the request's handler (a request of more than
//! [`BLOCKING_BYTES`] on tokio's blocking pool), never on coexec's workers.
//! `/tokenize` never truncates (its tokens count a text, or cut it into
//! pieces the model takes whole), and with `/decode` takes no place in the
//! queue; both hold their answers' bytes in the memory budget every route
//! shares ([`ServeConfig::memory_budget`](super::ServeConfig::memory_budget)).
//!
//! Errors are `{"error", "error_type"}` (on `/v1/embeddings` TEI's
//! OpenAI shape, `{"message", "code", "type"}`) with TEI 1.9's statuses:
//! 400 `Empty` (no input, an empty string), 422 `Validation` (too many
//! inputs, refused at the first one past the limit; an input past the
//! model's limit with `truncate: false`; JSON of the wrong shape; a token
//! id past the vocabulary; a text the model cannot take; an option coexec
//! does not serve: a `prompt_name` the model lacks, `dimensions` past the
//! model's; an `/embed_all` answer past its bound), 413 for a body over
//! the limit, 400 for a body that is not JSON, 422 `Tokenizer`, 429
//! `Overloaded` with `Retry-After` (a full queue, the memory budget
//! spent), 424 `Backend` for a vector that is not finite or a route of
//! another kind of model. A text's and a vector's refusals are their own
//! request's: the requests batched with them are answered.
//!
//! A success carries TEI's headers, measured per request: `x-compute-type`,
//! `x-compute-time` and `x-total-time` (ms from the body read to the
//! answer), `x-compute-characters`, `x-compute-tokens`, and the means over
//! its inputs of `x-tokenization-time`, `x-queue-time` and
//! `x-inference-time` (ms). TEI's `te_*` series are recorded beside
//! coexec's own.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use metrics::{counter, histogram};

use super::body::{Json, Received, limits, receive, timed};
use super::bounded::{Limits, Overflow, Refused, parse};
use super::error::{ErrorResponse, ErrorType, OpenAiError};
use super::infer::{failed, submit};
use super::{ServeModel, Service};
use crate::budget::Held;
use coexec::stream::{Checked, StreamError};
use coexec_models::{Embedder, TokenizeError, normalize};

pub(super) mod all;
pub(super) mod classify;
pub(super) mod openapi;
pub(super) mod tokens;
mod types;

use types::{
    EmbedRequest, EmbedResponse, EmbedSparseRequest, EmbedSparseResponse, Embedding,
    EmbeddingModel, EncodingFormat, Info, InputType, ModelType, OpenAiEmbedding, OpenAiRequest,
    OpenAiResponse, OpenAiUsage, Request, Sequence, SimilarityRequest, SimilarityResponse,
    SparseValue, TokenizeInput, TruncationDirection,
};

/// A request whose texts hold more bytes than this is tokenised on
/// tokio's blocking pool, not on the handler's worker thread.
pub const BLOCKING_BYTES: usize = 64 << 10;

/// Token ids are the input of `/v1/infer` (for clients that tokenise
/// themselves); TEI's routes take texts or ids.
impl ServeModel for Embedder {
    fn describe_input(&self) -> String {
        format!(
            "[token ids, 1 to {}]",
            self.weights().config().max_positions
        )
    }

    /// Texts of the longest input and of shorter ones in turn, so that
    /// both the largest buffers and the short sequences' paths are used.
    fn warm_up_inputs(&self, n: usize) -> Vec<Vec<u32>> {
        let long = "coexec warms every device before it serves. ".repeat(64);
        (0..n)
            .filter_map(|i| {
                let words = [usize::MAX, 4, 16, 64][i % 4];
                let text: String = long.split_inclusive(' ').take(words).collect();
                self.tokenize(&text, true).ok()
            })
            .collect()
    }
}

/// Which of the model's routes a request came to, for its errors.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    /// `POST /embed`.
    Tei,
    /// `POST /v1/embeddings`.
    OpenAi,
    /// `POST /similarity`: the source sentence first, then the others.
    Similarity,
    /// `POST /rerank`: the query with each text.
    Rerank,
    /// `POST /predict`.
    Predict,
}

impl Api {
    /// Where the request's `k`-th input is.
    fn at(self, k: usize) -> String {
        match (self, k) {
            (Api::Similarity, 0) => "inputs.source_sentence".into(),
            (Api::Similarity, k) => format!("inputs.sentences[{}]", k - 1),
            (Api::Tei | Api::Predict, k) => format!("inputs[{k}]"),
            (Api::OpenAi, k) => format!("input[{k}]"),
            (Api::Rerank, k) => format!("texts[{k}]"),
        }
    }
}

impl Sequence {
    fn len(&self) -> usize {
        match self {
            Sequence::Single(t) => t.len(),
            Sequence::Pair(a, b) => a.len() + b.len(),
        }
    }
}

/// One input to run: a text or a pair to tokenise, token ids as the
/// client gave them (TEI's `EncodingInput`), or a text or ids to put
/// after a prompt (tokenised off the handler with the rest).
#[derive(Debug)]
pub(super) enum Item {
    Seq(Sequence),
    Ids(Vec<u32>),
    Prompted { prompt: Arc<str>, input: InputType },
}

impl Item {
    /// Its bytes, for the choice of where to tokenise.
    fn bytes(&self) -> usize {
        match self {
            Item::Seq(s) => s.len(),
            Item::Ids(ids) => 4 * ids.len(),
            Item::Prompted { prompt, input } => {
                prompt.len()
                    + match input {
                        InputType::Text(t) => t.len(),
                        InputType::Ids(ids) => 4 * ids.len(),
                    }
            }
        }
    }

    /// TEI's `x-compute-characters` of it, as the client sent it (a
    /// prompt not counted): a text's characters, a list's ids.
    fn chars(&self) -> usize {
        match self {
            Item::Seq(Sequence::Single(t))
            | Item::Prompted {
                input: InputType::Text(t),
                ..
            } => t.chars().count(),
            Item::Seq(Sequence::Pair(a, b)) => a.chars().count() + b.chars().count(),
            Item::Ids(ids)
            | Item::Prompted {
                input: InputType::Ids(ids),
                ..
            } => ids.len(),
        }
    }
}

impl<T> types::Input<T> {
    /// TEI's `method` label of `te_request_count`: one input or a batch.
    fn method(&self) -> &'static str {
        match self {
            types::Input::Single(_) => "single",
            types::Input::Batch(_) => "batch",
        }
    }
}

/// A 422 `Validation`.
fn validation(msg: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(ErrorType::Validation, msg)
}

/// The answer to a body [`parse`] refused as an `R`: 422 for more inputs
/// than a request may carry (TEI 1.9's status; ≤ 1.8 answered 413), 429
/// for more than the queue has room for now, 400 for a body that is not
/// JSON, 422 for JSON of another shape.
fn refused<R: Request>(svc: &Service<Embedder>, e: Refused) -> ErrorResponse {
    match e {
        Refused::Overflow(Overflow::NoRoom { .. }) => svc.overloaded(),
        Refused::Overflow(Overflow::TooMany { at_least, most }) => validation(format!(
            "batch size of at least {at_least} > maximum allowed batch size {most}"
        ))
        .because("batch_size"),
        Refused::Json(e) if e.is_data() => {
            validation(format!("expected {}: {e}", R::SHAPE)).uncounted()
        }
        Refused::Json(e) => validation(format!("the body is not JSON: {e}"))
            .with_status(StatusCode::BAD_REQUEST)
            .uncounted(),
    }
}

/// `body` read as an `R`, its input list bounded by `limits`.
fn read<R: Request>(
    svc: &Service<Embedder>,
    body: &[u8],
    limits: Limits,
) -> Result<R, ErrorResponse> {
    // serde's derived structs also take a JSON array of their fields:
    // only an object is TEI's form.
    let object = body.trim_ascii_start().first() == Some(&b'{');
    let not_an_object = || validation(format!("expected a JSON object {}", R::SHAPE)).uncounted();
    match parse::<R>(body, limits) {
        Ok(_) if !object => Err(not_an_object()),
        Err(Refused::Json(e)) if e.is_data() && !object => Err(not_an_object()),
        parsed => parsed.map_err(|e| refused::<R>(svc, e)),
    }
}

/// The prompt to put before each text: the model's prompt `name` (no
/// name: its default prompt, if it has one), or a 422 naming the prompts
/// it has.
fn prompt_of<'m>(
    model: &'m Embedder,
    name: Option<&str>,
) -> Result<Option<&'m str>, ErrorResponse> {
    let prompt = match name {
        None => model.default_prompt(),
        Some(n) => Some(model.prompt(n).ok_or_else(|| {
            let names: Vec<&str> = model.prompt_names().collect();
            validation(format!(
                "`prompt_name` {n:?} is not one of the model's prompts {names:?}"
            ))
        })?),
    };
    Ok(prompt.filter(|p| !p.is_empty()))
}

/// `texts` with the model's prompt `name` put before each, as
/// sentence-transformers does before tokenising ([`prompt_of`]).
pub(crate) fn prompted(
    model: &Embedder,
    name: Option<&str>,
    texts: Vec<String>,
) -> Result<Vec<String>, ErrorResponse> {
    Ok(match prompt_of(model, name)? {
        Some(p) => texts.into_iter().map(|t| format!("{p}{t}")).collect(),
        None => texts,
    })
}

/// `/embed`'s, `/v1/embeddings`' and `/similarity`'s inputs as items to
/// run, the model's prompt ([`prompt_of`]) to go before each. Token ids
/// are taken as they are, unless there is a prompt: then, as TEI does,
/// they are decoded (special tokens left out), put after the prompt and
/// tokenised again.
fn prompted_inputs(
    model: &Embedder,
    name: Option<&str>,
    inputs: Vec<InputType>,
) -> Result<Vec<Item>, ErrorResponse> {
    let prompt: Option<Arc<str>> = prompt_of(model, name)?.map(Arc::from);
    Ok(inputs
        .into_iter()
        .map(|input| match (input, &prompt) {
            (InputType::Text(t), None) => Item::Seq(Sequence::Single(t)),
            (InputType::Ids(ids), None) => Item::Ids(ids),
            (input, Some(p)) => Item::Prompted {
                prompt: p.clone(),
                input,
            },
        })
        .collect())
}

/// A 422 for an id past the model's vocabulary.
fn check_ids(model: &Embedder, api: Api, k: usize, ids: &[u32]) -> Result<(), ErrorResponse> {
    let vocab = model.weights().config().vocab;
    match ids.iter().position(|&id| id as usize >= vocab) {
        Some(j) => Err(validation(format!(
            "`{}`: token id {} at {j} is not below the model's vocabulary of {vocab}",
            api.at(k),
            ids[j]
        ))),
        None => Ok(()),
    }
}

/// The vectors' length asked for (`dimensions`), checked against the
/// model's, or its 422.
fn dimensions(model: &Embedder, asked: Option<usize>) -> Result<Option<usize>, ErrorResponse> {
    match asked {
        Some(0) => Err(validation("`dimensions` should be positive")),
        Some(d) if d > model.dim() => Err(validation(format!(
            "`dimensions` {d} is more than the model's {}",
            model.dim()
        ))),
        d => Ok(d),
    }
}

/// Each vector cut to its first `dims` values, then normalised if asked:
/// TEI's order, so that a cut vector is a unit vector too.
fn finish(vectors: &mut [Vec<f32>], dims: Option<usize>, unit: bool) {
    for v in vectors {
        if let Some(d) = dims {
            v.truncate(d);
        }
        if unit {
            normalize(v);
        }
    }
}

/// A vector as OpenAI's `encoding_format: "base64"` writes it: its
/// little-endian `f32` bytes in standard base64.
fn base64_of(v: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// How a request's texts are tokenised.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// Cut past the model's limit (else 422).
    truncate: bool,
    direction: TruncationDirection,
}

impl Cut {
    fn new(truncate: Option<bool>, direction: TruncationDirection) -> Self {
        Self {
            // TEI's `auto_truncate`, on (`/info` says so).
            truncate: truncate.unwrap_or(true),
            direction,
        }
    }
}

/// The ids of each input and how long its tokenising took, or the 4xx of
/// the first that fails. Texts and token ids past the model's limit are
/// cut at the end asked for (a text's special tokens kept), or refused
/// with `truncate: false`.
fn tokenize(
    model: &Embedder,
    api: Api,
    items: Vec<Item>,
    cut: Cut,
) -> Result<Vec<(Vec<u32>, Duration)>, ErrorResponse> {
    let direction = cut.direction.into();
    let max = model.max_input_length();
    let text = |t: &str| model.tokenize_from(t, cut.truncate, direction);
    items
        .into_iter()
        .enumerate()
        .map(|(k, item)| {
            let t0 = Instant::now();
            let ids = match item {
                Item::Seq(Sequence::Single(t)) => text(&t),
                Item::Seq(Sequence::Pair(a, b)) => {
                    model.tokenize_pair_from(&a, &b, cut.truncate, direction)
                }
                Item::Prompted {
                    prompt,
                    input: InputType::Text(t),
                } => text(&format!("{prompt}{t}")),
                Item::Prompted {
                    prompt,
                    input: InputType::Ids(ids),
                } => {
                    check_ids(model, api, k, &ids)?;
                    model
                        .decode(&ids, true)
                        .and_then(|t| text(&format!("{prompt}{t}")))
                }
                Item::Ids(mut ids) => {
                    check_ids(model, api, k, &ids)?;
                    if ids.len() > max {
                        if !cut.truncate {
                            return Err(validation(format!(
                                "`{}`: {} token ids, more than the model's {max}",
                                api.at(k),
                                ids.len()
                            )));
                        }
                        if cut.direction == TruncationDirection::Left {
                            ids.drain(..ids.len() - max);
                        } else {
                            ids.truncate(max);
                        }
                    }
                    Ok(ids)
                }
            }
            .map_err(|e| match e {
                TokenizeError::TooLong { .. } => validation(format!("`{}`: {e}", api.at(k))),
                _ => ErrorResponse::new(ErrorType::Tokenizer, format!("`{}`: {e}", api.at(k))),
            })?;
            Ok((ids, t0.elapsed()))
        })
        .collect()
}

/// A request read by [`read`] holds this: its share of the budget,
/// whether the drain had begun, when it was in (TEI's start) and TEI's
/// `method` of it.
struct Admitted {
    held: Held,
    accepted: bool,
    start: Instant,
    method: &'static str,
}

impl Admitted {
    /// Counted in `te_request_count` as `method` (`single`, `batch`).
    fn counted(mut self, method: &'static str) -> Self {
        counter!("te_request_count", "method" => method).increment(1);
        self.method = method;
        self
    }
}

/// Reads an embedding route's body as an `R`, its list bounded by the
/// client batch and the queue's room (`bounds` adapts them to the route).
async fn receive_as<R: Request>(
    svc: &Service<Embedder>,
    headers: &HeaderMap,
    body: Body,
    bounds: impl FnOnce(Limits) -> Limits,
) -> Result<(R, Admitted), ErrorResponse> {
    let Received {
        body,
        held,
        accepted,
    } = receive(svc, headers, body).await?;
    let req = read(svc, &body, bounds(limits(svc, accepted)))?;
    let start = Instant::now();
    Ok((
        req,
        Admitted {
            held,
            accepted,
            start,
            method: "batch",
        },
    ))
}

/// Whether the queue has no room now for `rows` more inputs of a request
/// the drain had not begun for (`accepted`).
fn full(svc: &Service<Embedder>, rows: usize, accepted: bool) -> bool {
    accepted && svc.room() < rows
}

/// `items` run by [`run_inputs`] on a model of embeddings: their vectors
/// (not normalised). A classifier has none: 424.
async fn embed_items(
    svc: &Service<Embedder>,
    api: Api,
    admitted: Admitted,
    items: Vec<Item>,
    cut: Cut,
) -> Result<(Vec<Vec<f32>>, Done), ErrorResponse> {
    if svc.model().labels().is_some() {
        return Err(not_a("an embedding model"));
    }
    run_inputs(svc, api, admitted, items, cut).await
}

/// TEI's 424 for a route of another kind of model than the one served.
fn not_a(kind: &str) -> ErrorResponse {
    failed(format!("model is not {kind}")).because("model_type")
}

/// What a request cost, measured: TEI's response headers and its
/// `te_request_*` metrics. Times are the means over its inputs, as TEI's.
pub(super) struct Done {
    method: &'static str,
    compute_type: &'static str,
    chars: usize,
    tokens: usize,
    start: Instant,
    tokenization: Duration,
    queue: Duration,
    inference: Duration,
}

impl Done {
    /// Counts the success in TEI's `te_request_*` and gives TEI's headers
    /// (times in whole milliseconds).
    fn answered(&self) -> HeaderMap {
        let total = self.start.elapsed();
        counter!("te_request_success", "method" => self.method).increment(1);
        histogram!("te_request_duration").record(total.as_secs_f64());
        histogram!("te_request_tokenization_duration").record(self.tokenization.as_secs_f64());
        histogram!("te_request_queue_duration").record(self.queue.as_secs_f64());
        histogram!("te_request_inference_duration").record(self.inference.as_secs_f64());
        let ms = |d: Duration| HeaderValue::from(d.as_millis() as u64);
        let mut h = HeaderMap::new();
        h.insert(
            "x-compute-type",
            HeaderValue::from_static(self.compute_type),
        );
        h.insert("x-compute-time", ms(total));
        h.insert("x-compute-characters", HeaderValue::from(self.chars));
        h.insert("x-compute-tokens", HeaderValue::from(self.tokens));
        h.insert("x-total-time", ms(total));
        h.insert("x-tokenization-time", ms(self.tokenization));
        h.insert("x-queue-time", ms(self.queue));
        h.insert("x-inference-time", ms(self.inference));
        h
    }
}

/// Where the service computes: TEI's `x-compute-type` (TEI writes
/// `gpu+optimized` whatever it runs on): `cpu`, `gpu`, or `gpu+cpu` where
/// batches run on both, by the runtime's device classes (a GPU counted
/// where the model's weights have a GPU twin).
fn compute_type(svc: &Service<Embedder>) -> &'static str {
    let (cpu, gpu) = svc.inner.devices;
    match (cpu, gpu && svc.model().weights().gpu_twin()) {
        (true, true) => "gpu+cpu",
        (false, true) => "gpu",
        _ => "cpu",
    }
}

/// A TEI route's answer: on success its body as JSON with TEI's headers;
/// a failure counted in `te_request_failure` by TEI's `err` label, and on
/// OpenAI's route (`openai`) written in its shape. Both are counted in
/// `coexec_requests_total` as every route's answers are.
async fn answer<T: serde::Serialize>(
    openai: bool,
    f: impl Future<Output = Result<(Done, T), ErrorResponse>>,
) -> Response {
    answer_with(openai, async {
        f.await.map(|(done, body)| (done, Json(body)))
    })
    .await
}

/// [`answer`] of a body already made (`/embed_all`'s JSON, written off
/// the handler).
async fn answer_with<T: IntoResponse>(
    openai: bool,
    f: impl Future<Output = Result<(Done, T), ErrorResponse>>,
) -> Response {
    timed(async {
        match f.await {
            Ok((done, body)) => Ok((done.answered(), body)),
            Err(e) => {
                if let Some(err) = e.te_err() {
                    counter!("te_request_failure", "err" => err).increment(1);
                }
                Err(if openai { e.openai() } else { e })
            }
        }
    })
    .await
}

/// Whether an answer is a classifier's (`te_predict_*`) or embeddings
/// (`te_embed_*`).
fn te_kind(api: Api) -> &'static str {
    match api {
        Api::Rerank | Api::Predict => "predict",
        Api::Tei | Api::OpenAi | Api::Similarity => "embed",
    }
}

/// `items` tokenised off the handler, checked, queued and answered: the
/// model's outputs (vectors, or a classifier's logits) and what they cost.
async fn run_inputs(
    svc: &Service<Embedder>,
    api: Api,
    admitted: Admitted,
    items: Vec<Item>,
    cut: Cut,
) -> Result<(Vec<Vec<f32>>, Done), ErrorResponse> {
    let (ids, ready) = ready(svc, api, admitted, items, cut).await?;
    // A vector that is not finite is the model's failure, TEI's
    // `Backend`, for its own request: never a 200 of `null`s.
    let refused = |k, why| failed(format!("`{}`: {why}", api.at(k)));
    let answered = submit(svc, ready.accepted, ids, None, refused).await?;
    counter!("coexec_embed_sequences_total").increment(answered.len() as u64);
    counter!("coexec_embed_tokens_total").increment(ready.tokens as u64);
    let times: Vec<_> = answered
        .iter()
        .map(|(_, s)| (s.queued, s.inference))
        .collect();
    let done = ready.done(svc, &times);
    Ok((answered.into_iter().map(|(out, _)| out).collect(), done))
}

/// A request's inputs tokenised and checked ([`ready`]): what its answer
/// needs of it, and its share of the budget, held until it is answered.
struct Ready {
    accepted: bool,
    start: Instant,
    method: &'static str,
    /// `te_embed_*` or `te_predict_*` ([`te_kind`]).
    kind: &'static str,
    chars: usize,
    tokens: usize,
    /// Each input's tokenising.
    tokenized: Vec<Duration>,
    _held: Held,
}

/// `items` counted in TEI's `te_*_count`, tokenised off the handler and
/// checked (at least one token each, each within the embedding matrix)
/// before any is run: a text the model cannot take is refused with its
/// request, and fails no batch-mate.
async fn ready(
    svc: &Service<Embedder>,
    api: Api,
    admitted: Admitted,
    items: Vec<Item>,
    cut: Cut,
) -> Result<(Checked<Vec<u32>>, Ready), ErrorResponse> {
    let Admitted {
        held,
        accepted,
        start,
        method,
    } = admitted;
    let n = items.len();
    let kind = te_kind(api);
    if kind == "predict" {
        counter!("te_predict_count").increment(n as u64);
    } else {
        counter!("te_embed_count").increment(n as u64);
    }
    // A single text is no list the parse bounds: the queue checked by the
    // parsed count before the tokenizer's work.
    if full(svc, n, accepted) {
        return Err(svc.overloaded());
    }
    let model = svc.model().clone();
    let bytes: usize = items.iter().map(Item::bytes).sum();
    let chars: usize = items.iter().map(Item::chars).sum();
    // The budget goes along with the work: a client that leaves drops
    // this handler, not the tokenizer's run on the blocking pool.
    let tokenized = off_the_handler(bytes, move || {
        tokenize(&model, api, items, cut).map(|ids| (ids, held))
    });
    let (tokenized, held) = tokenized.await?;
    let (ids, tokenized): (Vec<Vec<u32>>, Vec<Duration>) = tokenized.into_iter().unzip();
    for i in &ids {
        histogram!("te_request_input_length").record(i.len() as f64);
    }
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let ids = match svc.inner.stream.check(ids) {
        Ok(ids) => ids,
        Err(StreamError::Invalid { index, why }) => {
            return Err(validation(format!("`{}`: {why}", api.at(index))));
        }
        Err(e) => return Err(failed(e.to_string())),
    };
    let ready = Ready {
        accepted,
        start,
        method,
        kind,
        chars,
        tokens,
        tokenized,
        _held: held,
    };
    Ok((ids, ready))
}

impl Ready {
    /// What the request cost, its inputs answered, each after
    /// `times[k]` (its wait in the queue, its inference): TEI's
    /// `te_embed_*` (or `te_predict_*`) of each, and the means of its
    /// headers.
    fn done(&self, svc: &Service<Embedder>, times: &[(Duration, Duration)]) -> Done {
        let total = self.start.elapsed();
        let (mut queue, mut inference) = (Duration::ZERO, Duration::ZERO);
        for (&(q, i), &tok) in times.iter().zip(&self.tokenized) {
            queue += q;
            inference += i;
            te_input(self.kind, total, tok, q, i);
        }
        let mean = |d: Duration| d / self.tokenized.len().max(1) as u32;
        Done {
            method: self.method,
            compute_type: compute_type(svc),
            chars: self.chars,
            tokens: self.tokens,
            start: self.start,
            tokenization: mean(self.tokenized.iter().sum()),
            queue: mean(queue),
            inference: mean(inference),
        }
    }
}

/// TEI's `te_embed_*` (or `te_predict_*`) of one input answered.
fn te_input(kind: &str, total: Duration, tokenization: Duration, queued: Duration, run: Duration) {
    let (success, duration, tok, queue, inference) = if kind == "predict" {
        (
            counter!("te_predict_success"),
            histogram!("te_predict_duration"),
            histogram!("te_predict_tokenization_duration"),
            histogram!("te_predict_queue_duration"),
            histogram!("te_predict_inference_duration"),
        )
    } else {
        (
            counter!("te_embed_success"),
            histogram!("te_embed_duration"),
            histogram!("te_embed_tokenization_duration"),
            histogram!("te_embed_queue_duration"),
            histogram!("te_embed_inference_duration"),
        )
    };
    success.increment(1);
    duration.record(total.as_secs_f64());
    tok.record(tokenization.as_secs_f64());
    queue.record(queued.as_secs_f64());
    inference.record(run.as_secs_f64());
}

/// `POST /embed`: a vector per input.
#[utoipa::path(
    post,
    path = "/embed",
    tag = "Text Embeddings Inference",
    request_body = EmbedRequest,
    responses(
        (status = 200, description = "The answer", body = EmbedResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model failed, or is of another kind", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
pub(super) async fn embed(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(false, async {
        let (req, admitted) = receive_as::<EmbedRequest>(&svc, &headers, body, |l| l).await?;
        let admitted = admitted.counted(req.inputs.method());
        let normalise = req.normalize.unwrap_or(true);
        if normalise {
            not_normalised_splade(&svc)?;
        }
        let dims = dimensions(svc.model(), req.dimensions)?;
        let inputs = req.inputs.into_inputs("inputs")?;
        let items = prompted_inputs(svc.model(), req.prompt_name.as_deref(), inputs)?;
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (mut vectors, done) = embed_items(&svc, Api::Tei, admitted, items, cut).await?;
        finish(&mut vectors, dims, normalise);
        Ok((done, EmbedResponse(vectors)))
    })
    .await
}

/// The model's name on TEI's routes (`--served-model-name`, else its id).
fn served_name(svc: &Service<Embedder>) -> String {
    svc.inner
        .cfg
        .served_model_name
        .clone()
        .unwrap_or_else(|| svc.model().id().to_owned())
}

/// `POST /v1/embeddings` (and `/embeddings`): OpenAI's answer, of unit
/// vectors, as numbers or base64; its errors in OpenAI's shape.
#[utoipa::path(
    post,
    path = "/v1/embeddings",
    tag = "Text Embeddings Inference",
    request_body = OpenAiRequest,
    responses(
        (status = 200, description = "The answer", body = OpenAiResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = OpenAiError),
        (status = 413, description = "A body over the limit", body = OpenAiError),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = OpenAiError),
        (status = 424, description = "The model failed, or is of another kind", body = OpenAiError),
        (status = 429, description = "Overloaded", body = OpenAiError),
    )
)]
pub(super) async fn openai(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(true, async {
        let (req, admitted) = receive_as::<OpenAiRequest>(&svc, &headers, body, |l| l).await?;
        let admitted = admitted.counted(req.input.method());
        not_normalised_splade(&svc)?;
        let dims = dimensions(svc.model(), req.dimensions)?;
        let inputs = req.input.into_inputs("input")?;
        // The prompt named (coexec's field), else TEI's: the model's
        // default prompt, if it has one.
        let items = prompted_inputs(svc.model(), req.prompt_name.as_deref(), inputs)?;
        let cut = Cut::new(None, TruncationDirection::Right);
        let (mut vectors, done) = embed_items(&svc, Api::OpenAi, admitted, items, cut).await?;
        finish(&mut vectors, dims, true);
        let base64 = req.encoding_format == Some(EncodingFormat::Base64);
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(index, v)| OpenAiEmbedding {
                object: "embedding",
                embedding: if base64 {
                    Embedding::Base64(base64_of(&v))
                } else {
                    Embedding::Float(v)
                },
                index,
            })
            .collect();
        let usage = OpenAiUsage {
            prompt_tokens: done.tokens,
            total_tokens: done.tokens,
        };
        let body = OpenAiResponse {
            object: "list",
            data,
            model: served_name(&svc),
            usage,
        };
        Ok((done, body))
    })
    .await
}

/// `POST /similarity`: the cosine of each sentence with the source
/// sentence, from unit vectors (their dot products).
#[utoipa::path(
    post,
    path = "/similarity",
    tag = "Text Embeddings Inference",
    request_body = SimilarityRequest,
    responses(
        (status = 200, description = "The answer", body = SimilarityResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model failed, or is of another kind", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
pub(super) async fn similarity(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(false, async {
        // The source sentence counts in the batch.
        let (req, admitted) =
            receive_as::<SimilarityRequest>(&svc, &headers, body, |l| l.after(1)).await?;
        let admitted = admitted.counted("batch");
        not_normalised_splade(&svc)?;
        let params = req.parameters.unwrap_or_default();
        let source = req.inputs.source_sentence;
        if source.is_empty() {
            return Err(types::empty(
                "`inputs.source_sentence` is an empty string".into(),
            ));
        }
        let sentences =
            TokenizeInput::Batch(req.inputs.sentences.0).into_texts("inputs.sentences")?;
        let mut texts = Vec::with_capacity(sentences.len() + 1);
        texts.push(source);
        texts.extend(sentences);
        let texts = texts.into_iter().map(InputType::Text).collect();
        let items = prompted_inputs(svc.model(), params.prompt_name.as_deref(), texts)?;
        let cut = Cut::new(params.truncate, params.truncation_direction);
        let (mut vectors, done) = embed_items(&svc, Api::Similarity, admitted, items, cut).await?;
        finish(&mut vectors, None, true);
        let cosines = match vectors.split_first() {
            Some((source, others)) => others
                .iter()
                .map(|v| v.iter().zip(source).map(|(a, b)| a * b).sum())
                .collect(),
            None => Vec::new(),
        };
        Ok((done, SimilarityResponse(cosines)))
    })
    .await
}

/// Whether the model pools with SPLADE (a vocabulary-wide sparse vector).
fn splade(svc: &Service<Embedder>) -> bool {
    svc.model().labels().is_none() && svc.model().weights().config().pooling.name() == "splade"
}

/// TEI's 424 for a SPLADE model's vectors normalised (`/embed`'s default,
/// `/v1/embeddings`, `/similarity`): its vectors are `/embed_sparse`'s.
fn not_normalised_splade(svc: &Service<Embedder>) -> Result<(), ErrorResponse> {
    if splade(svc) {
        return Err(failed("`normalize` is not available for SPLADE models").because("model_type"));
    }
    Ok(())
}

#[utoipa::path(
    post,
    path = "/embed_sparse",
    tag = "Text Embeddings Inference",
    request_body = EmbedSparseRequest,
    responses(
        (status = 200, description = "The answer", body = EmbedSparseResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model has no SPLADE pooling, or failed", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
/// `POST /embed_sparse`: a SPLADE model's sparse vectors, each input's
/// non-zero values by index; TEI's 424 on any other model.
pub(super) async fn embed_sparse(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(false, async {
        if !splade(&svc) {
            return Err(
                failed("model is not an embedding model with SPLADE pooling").because("model_type"),
            );
        }
        let (req, admitted) = receive_as::<EmbedSparseRequest>(&svc, &headers, body, |l| l).await?;
        let admitted = admitted.counted(req.inputs.method());
        let inputs = req.inputs.into_inputs("inputs")?;
        let items = prompted_inputs(svc.model(), req.prompt_name.as_deref(), inputs)?;
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (vectors, done) = embed_items(&svc, Api::Tei, admitted, items, cut).await?;
        let sparse = vectors
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .enumerate()
                    .filter(|&(_, value)| value != 0.0)
                    .map(|(index, value)| SparseValue { index, value })
                    .collect()
            })
            .collect();
        Ok((done, EmbedSparseResponse(sparse)))
    })
    .await
}

/// `POST /` and `POST /invocations` (the Inference API's and SageMaker's
/// route): `/embed` on a model of embeddings, `/embed_sparse` on a SPLADE
/// one, `/rerank` on a cross-encoder (one label), `/predict` on a
/// classifier, as TEI chooses by the model. (TEI's
/// `TASK=sentence-similarity` choice is not read.)
pub(super) async fn by_model(
    svc: State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match svc.model().labels().map(<[String]>::len) {
        None if splade(&svc) => embed_sparse(svc, headers, body).await,
        None => embed(svc, headers, body).await,
        Some(1) => classify::rerank(svc, headers, body).await,
        Some(_) => classify::predict(svc, headers, body).await,
    }
}

/// Runs `f` on tokio's blocking pool where the request holds more than
/// [`BLOCKING_BYTES`], else here.
async fn off_the_handler<T: Send + 'static>(
    bytes: usize,
    f: impl FnOnce() -> Result<T, ErrorResponse> + Send + 'static,
) -> Result<T, ErrorResponse> {
    if bytes <= BLOCKING_BYTES {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(failed(e.to_string())))
}

/// `GET /info`.
#[utoipa::path(get, path = "/info", tag = "Text Embeddings Inference",
    responses((status = 200, description = "The model served and the service's limits", body = Info)))]
pub(super) async fn info(State(svc): State<Service<Embedder>>) -> Json<Info> {
    let i = &svc.inner;
    let m = svc.model();
    let w = m.weights();
    Json(Info {
        model_id: m.id().to_owned(),
        model_sha: m.sha256().to_owned(),
        model_dtype: "float32",
        served_model_name: served_name(&svc),
        model_type: match m.labels() {
            None => ModelType::Embedding(EmbeddingModel {
                pooling: w.config().pooling.name(),
            }),
            Some(labels) => {
                let c = types::ClassifierModel {
                    id2label: labels
                        .iter()
                        .enumerate()
                        .map(|(i, l)| (i.to_string(), l.clone()))
                        .collect(),
                    label2id: labels
                        .iter()
                        .enumerate()
                        .map(|(i, l)| (l.clone(), i))
                        .collect(),
                };
                if labels.len() == 1 {
                    ModelType::Reranker(c)
                } else {
                    ModelType::Classifier(c)
                }
            }
        },
        model_family: w.config().family.model_type(),
        model_weights_dtype: w.stored_dtype(),
        model_dim: m.dim(),
        model_prompts: m.prompt_names().map(str::to_owned).collect(),
        gpu_twin: w.gpu_twin(),
        max_concurrent_requests: i.stream.capacity(),
        max_input_length: m.max_input_length(),
        max_batch_tokens: i.batch_cost,
        max_batch_requests: i.batch_len,
        max_client_batch_size: super::body::client_batch(&svc),
        auto_truncate: true,
        tokenization_workers: tokio::runtime::Handle::current().metrics().num_workers(),
        version: env!("CARGO_PKG_VERSION"),
        sha: option_env!("COEXEC_GIT_SHA"),
        docker_label: option_env!("DOCKER_LABEL"),
        router: "coexec",
    })
}

/// `GET /health`: 200, 503 `Unhealthy` while draining.
#[utoipa::path(get, path = "/health", tag = "Text Embeddings Inference",
    responses((status = 200, description = "Serving"),
        (status = 503, description = "Draining", body = ErrorResponse)))]
pub(super) async fn health(
    State(svc): State<Service<Embedder>>,
) -> Result<StatusCode, ErrorResponse> {
    if svc.inner.draining.load(Ordering::Acquire) {
        Err(ErrorResponse::new(ErrorType::Unhealthy, "draining"))
    } else {
        Ok(StatusCode::OK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TEI's order: cut, then normalised, so that a cut vector is a unit
    /// vector too; uncut and not normalised, a vector is as the model gave it.
    #[test]
    fn vectors_are_cut_to_their_dimensions_then_normalised() {
        let mut v = vec![vec![3.0, 4.0, 12.0]];
        finish(&mut v, Some(2), true);
        assert_eq!(v, [vec![0.6, 0.8]]);
        let mut v = vec![vec![3.0, 4.0, 12.0]];
        finish(&mut v, None, false);
        assert_eq!(v, [vec![3.0, 4.0, 12.0]]);
    }

    #[test]
    fn a_text_is_named_where_the_request_has_it() {
        assert_eq!(Api::Tei.at(2), "inputs[2]");
        assert_eq!(Api::OpenAi.at(0), "input[0]");
        assert_eq!(Api::Similarity.at(0), "inputs.source_sentence");
        assert_eq!(Api::Similarity.at(3), "inputs.sentences[2]");
    }
}
