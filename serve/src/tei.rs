//! Text Embeddings Inference's HTTP API over an [`Embedder`]: a drop-in for
//! TEI's clients, served on every CPU core and GPU at once. Each route's
//! body and answer are the types of `tei/types.rs`, TEI's own.
//!
//! ```text
//!  POST /embed          {"inputs": str | [str], "normalize", "truncate", "dimensions"} → [[f32]]
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
//! Texts are tokenised on the request's handler (a request of more than
//! [`BLOCKING_BYTES`] on tokio's blocking pool), never on coexec's workers.
//! `/tokenize` never truncates (its tokens count a text, or cut it into
//! pieces the model takes whole), and with `/decode` takes no place in the
//! queue; both hold their answers' bytes in the memory budget every route
//! shares ([`ServeConfig::memory_budget`](super::ServeConfig::memory_budget)).
//! Errors are `{"error", "error_type"}` with TEI's statuses: 400 `Empty`
//! (no input, an empty string), 413 `Validation` (too many inputs, refused
//! at the first one past the limit; an input past the model's limit with
//! `truncate: false`; a body over the limit), 400 for a body that is not
//! JSON, 422 `Validation` for JSON of the wrong shape, a text the model
//! cannot take (no tokens) or an option coexec does not serve (a
//! a `prompt_name` the model lacks, a text that would be cut on the left, `base64`,
//! `dimensions` past the model's), 422 `Tokenizer`, 429 `Overloaded` with
//! `Retry-After` (a full queue, the memory budget spent), 500 `Backend`
//! for a vector that is not finite. A text's and a vector's refusals are
//! their own request's: the requests batched with them are answered.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use metrics::counter;

use super::body::{Json, Received, limits, receive, timed};
use super::bounded::{Limits, Overflow, Refused, parse};
use super::error::{ErrorResponse, ErrorType};
use super::infer::{failed, submit};
use super::{ServeModel, Service};
use crate::budget::Held;
use coexec::stream::StreamError;
use coexec_models::{Embedder, TokenizeError, normalize};

pub(super) mod classify;
pub(super) mod tokens;
mod types;

use types::{
    EmbedRequest, EmbedResponse, Embedding, EmbeddingModel, EncodingFormat, Info, ModelType,
    OpenAiEmbedding, OpenAiRequest, OpenAiResponse, OpenAiUsage, Request, Sequence,
    SimilarityRequest, SimilarityResponse, TokenizeInput, TruncationDirection,
};

/// A request whose texts hold more bytes than this is tokenised on
/// tokio's blocking pool, not on the handler's worker thread.
pub const BLOCKING_BYTES: usize = 64 << 10;

/// Token ids are the input of `/v1/infer` (for clients that tokenise
/// themselves); TEI's routes take text.
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

/// A 422 `Validation`.
fn validation(msg: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(ErrorType::Validation, msg)
}

/// The answer to a body [`parse`] refused as an `R`: 413 for more inputs
/// than a request may carry, 429 for more than the queue has room for now,
/// 400 for a body that is not JSON, 422 for JSON of another shape.
fn refused<R: Request>(svc: &Service<Embedder>, e: Refused) -> ErrorResponse {
    match e {
        Refused::Overflow(Overflow::NoRoom { .. }) => svc.overloaded(),
        Refused::Overflow(Overflow::TooMany { at_least, most }) => ErrorResponse::too_large(
            format!("batch size of at least {at_least} > maximum allowed batch size {most}"),
        ),
        Refused::Json(e) if e.is_data() => validation(format!("expected {}: {e}", R::SHAPE)),
        Refused::Json(e) => {
            validation(format!("the body is not JSON: {e}")).with_status(StatusCode::BAD_REQUEST)
        }
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
    match parse::<R>(body, limits) {
        Ok(_) if !object => Err(validation(format!("expected a JSON object {}", R::SHAPE))),
        Err(Refused::Json(e)) if e.is_data() && !object => {
            Err(validation(format!("expected a JSON object {}", R::SHAPE)))
        }
        parsed => parsed.map_err(|e| refused::<R>(svc, e)),
    }
}

/// `texts` with the model's prompt `name` put before each, as
/// sentence-transformers does before tokenising (no name: the model's
/// default prompt, if it has one). A name the model does not define is a
/// 422 naming the prompts it has.
pub(crate) fn prompted(
    model: &Embedder,
    name: Option<&str>,
    texts: Vec<String>,
) -> Result<Vec<String>, ErrorResponse> {
    let prompt = match name {
        None => model.default_prompt(),
        Some(n) => Some(model.prompt(n).ok_or_else(|| {
            let names: Vec<&str> = model.prompt_names().collect();
            validation(format!(
                "`prompt_name` {n:?} is not one of the model's prompts {names:?}"
            ))
        })?),
    };
    Ok(match prompt {
        Some(p) if !p.is_empty() => texts.into_iter().map(|t| format!("{p}{t}")).collect(),
        _ => texts,
    })
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

/// How a request's texts are tokenised.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// Cut past the model's limit (else 413).
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

/// The ids of each input, or the 4xx of the first that fails. An input
/// past the model's limit that would have to be cut on the left is
/// refused: only cutting on the right is served.
fn tokenize(
    model: &Embedder,
    api: Api,
    texts: &[Sequence],
    cut: Cut,
) -> Result<Vec<Vec<u32>>, ErrorResponse> {
    let left = cut.direction == TruncationDirection::Left;
    texts
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let right = cut.truncate && !left;
            match t {
                Sequence::Single(t) => model.tokenize(t, right),
                Sequence::Pair(a, b) => model.tokenize_pair(a, b, right),
            }
            .map_err(|e| match e {
                TokenizeError::TooLong { .. } if cut.truncate => validation(format!(
                    "`{}`: {e}; cutting it on the left (`truncation_direction`) is not served",
                    api.at(k)
                )),
                TokenizeError::TooLong { .. } => {
                    ErrorResponse::too_large(format!("`{}`: {e}", api.at(k)))
                }
                _ => ErrorResponse::new(ErrorType::Tokenizer, format!("`{}`: {e}", api.at(k))),
            })
        })
        .collect()
}

/// A request read by [`read`] holds this: its share of the budget and
/// whether the drain had begun.
struct Admitted {
    held: Held,
    accepted: bool,
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
    Ok((req, Admitted { held, accepted }))
}

/// Whether the queue has no room now for `rows` more inputs of a request
/// the drain had not begun for (`accepted`).
fn full(svc: &Service<Embedder>, rows: usize, accepted: bool) -> bool {
    let s = &svc.inner.stream;
    accepted && s.queued() + rows > s.capacity()
}

/// `texts` tokenised off the handler, checked, queued and answered: their
/// vectors (not normalised) and their tokens. A classifier has none: 424.
async fn embed_texts(
    svc: &Service<Embedder>,
    api: Api,
    admitted: Admitted,
    texts: Vec<String>,
    cut: Cut,
) -> Result<(Vec<Vec<f32>>, usize), ErrorResponse> {
    if svc.model().labels().is_some() {
        return Err(not_a("an embedding model"));
    }
    let texts = texts.into_iter().map(Sequence::Single).collect();
    run_inputs(svc, api, admitted, texts, cut).await
}

/// TEI's 424 for a route of another kind of model than the one served.
fn not_a(kind: &str) -> ErrorResponse {
    failed(format!("model is not {kind}")).with_status(StatusCode::FAILED_DEPENDENCY)
}

/// `texts` (texts or pairs) tokenised off the handler, checked, queued and
/// answered: the model's outputs (vectors, or a classifier's logits) and
/// the tokens.
async fn run_inputs(
    svc: &Service<Embedder>,
    api: Api,
    admitted: Admitted,
    texts: Vec<Sequence>,
    cut: Cut,
) -> Result<(Vec<Vec<f32>>, usize), ErrorResponse> {
    let Admitted { held, accepted } = admitted;
    // A single text is no list the parse bounds: the queue checked by the
    // parsed count before the tokenizer's work.
    if full(svc, texts.len(), accepted) {
        return Err(svc.overloaded());
    }
    let model = svc.model().clone();
    let bytes: usize = texts.iter().map(Sequence::len).sum();
    // The budget goes along with the work: a client that leaves drops
    // this handler, not the tokenizer's run on the blocking pool.
    let tokenized = off_the_handler(bytes, move || {
        tokenize(&model, api, &texts, cut).map(|ids| (ids, held))
    });
    let (ids, _held) = tokenized.await?;
    // Each text's ids checked on their own before any is queued (at least
    // one token, each within the embedding matrix): a text the model
    // cannot take is refused with its request, and fails no batch-mate.
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let ids = match svc.inner.stream.check(ids) {
        Ok(ids) => ids,
        Err(StreamError::Invalid { index, why }) => {
            return Err(validation(format!("`{}`: {why}", api.at(index))));
        }
        Err(e) => return Err(failed(e.to_string())),
    };
    // A vector that is not finite is the model's failure, TEI's
    // `Backend`, for its own request: never a 200 of `null`s.
    let refused = |k, why| failed(format!("`{}`: {why}", api.at(k)));
    let vectors = submit(svc, accepted, ids, None, refused).await?;
    counter!("coexec_embed_sequences_total").increment(vectors.len() as u64);
    counter!("coexec_embed_tokens_total").increment(tokens as u64);
    Ok((vectors, tokens))
}

/// `POST /embed`: a vector per text.
pub(super) async fn embed(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(async {
        let (req, admitted) = receive_as::<EmbedRequest>(&svc, &headers, body, |l| l).await?;
        let dims = dimensions(svc.model(), req.dimensions)?;
        let texts = req.inputs.into_texts("inputs")?;
        let texts = prompted(svc.model(), req.prompt_name.as_deref(), texts)?;
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (mut vectors, _) = embed_texts(&svc, Api::Tei, admitted, texts, cut).await?;
        finish(&mut vectors, dims, req.normalize.unwrap_or(true));
        Ok(Json(EmbedResponse(vectors)))
    })
    .await
}

/// `POST /v1/embeddings` (and `/embeddings`): OpenAI's answer, of unit
/// vectors.
pub(super) async fn openai(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(async {
        let (req, admitted) = receive_as::<OpenAiRequest>(&svc, &headers, body, |l| l).await?;
        if req.encoding_format == Some(EncodingFormat::Base64) {
            return Err(validation(
                r#"`encoding_format` "base64" is not served; "float" is"#,
            ));
        }
        let dims = dimensions(svc.model(), req.dimensions)?;
        let texts = req.input.into_texts("input")?;
        let cut = Cut::new(None, TruncationDirection::Right);
        let (mut vectors, tokens) = embed_texts(&svc, Api::OpenAi, admitted, texts, cut).await?;
        finish(&mut vectors, dims, true);
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(index, v)| OpenAiEmbedding {
                object: "embedding",
                embedding: Embedding::Float(v),
                index,
            })
            .collect();
        Ok(Json(OpenAiResponse {
            object: "list",
            data,
            model: svc.model().id().to_owned(),
            usage: OpenAiUsage {
                prompt_tokens: tokens,
                total_tokens: tokens,
            },
        }))
    })
    .await
}

/// `POST /similarity`: the cosine of each sentence with the source
/// sentence, from unit vectors (their dot products).
pub(super) async fn similarity(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(async {
        // The source sentence counts in the batch.
        let (req, admitted) =
            receive_as::<SimilarityRequest>(&svc, &headers, body, |l| l.after(1)).await?;
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
        let texts = prompted(svc.model(), params.prompt_name.as_deref(), texts)?;
        let cut = Cut::new(params.truncate, params.truncation_direction);
        let (mut vectors, _) = embed_texts(&svc, Api::Similarity, admitted, texts, cut).await?;
        finish(&mut vectors, None, true);
        let cosines = match vectors.split_first() {
            Some((source, others)) => others
                .iter()
                .map(|v| v.iter().zip(source).map(|(a, b)| a * b).sum())
                .collect(),
            None => Vec::new(),
        };
        Ok(Json(SimilarityResponse(cosines)))
    })
    .await
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
pub(super) async fn info(State(svc): State<Service<Embedder>>) -> Json<Info> {
    let i = &svc.inner;
    let m = svc.model();
    let w = m.weights();
    Json(Info {
        model_id: m.id().to_owned(),
        model_sha: m.sha256().to_owned(),
        model_dtype: "float32",
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
        tokenization_workers: 0,
        version: env!("CARGO_PKG_VERSION"),
        router: "coexec",
    })
}

/// `GET /health`: 200, 503 `Unhealthy` while draining.
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
