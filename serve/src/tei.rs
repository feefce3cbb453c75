//! Text Embeddings Inference's HTTP API over an [`Embedder`]: a drop-in for
//! TEI's clients, served on every CPU core and GPU at once.
//!
//! ```text
//!  POST /embed          {"inputs": str | [str], "normalize": true, "truncate": true} → [[f32]]
//!  POST /v1/embeddings  {"input": str | [str], "model": …}  → {"object": "list", "data": [{"embedding", "index"}], "usage"}
//!  POST /similarity     {"inputs": {"source_sentence": str, "sentences": [str]}, "parameters": {"truncate": true}} → [cosine]
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
//! (no input, an empty string), 413 `Validation` (too many inputs, an
//! input past the model's limit with `truncate: false`, a body over the
//! limit), 400 for a body that is not JSON, 422 `Validation` for JSON of
//! the wrong shape or a text the model cannot take (no tokens), 422
//! `Tokenizer`, 429 `Overloaded` with `Retry-After` (a full queue, the
//! memory budget spent), 500 `Backend` for a vector that is not finite. A
//! text's and a vector's refusals are their own request's: the requests
//! batched with them are answered.

// The error of the request readers below is the answer to send (a 4xx
// `Response`, 128 bytes): made once per refused request, it is not worth a
// box.
#![allow(clippy::result_large_err)]

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics::counter;
use serde::Serialize;
use serde_json::{Value, json};

use super::body::{Received, full, receive, record};
use super::infer::{error, error_of, submit};
use super::{ServeModel, Service};
use coexec::stream::StreamError;
use coexec_models::{Embedder, TokenizeError, normalize};

mod request;
pub(super) mod tokens;

use request::{flag, kind, object, texts, unprocessable};

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

/// Which of TEI's shapes a request and its answer take.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Api {
    /// `POST /embed`.
    Tei,
    /// `POST /v1/embeddings`.
    OpenAi,
    /// `POST /similarity`: the source sentence first, then the others.
    Similarity,
}

impl Api {
    fn field(self) -> &'static str {
        match self {
            Api::Tei | Api::Similarity => "inputs",
            Api::OpenAi => "input",
        }
    }

    /// Where the request's `k`-th text is, for an error.
    fn at(self, k: usize) -> String {
        match (self, k) {
            (Api::Similarity, 0) => "inputs.source_sentence".into(),
            (Api::Similarity, k) => format!("inputs.sentences[{}]", k - 1),
            (api, k) => format!("{}[{k}]", api.field()),
        }
    }
}

/// A request's texts and flags, read from its JSON.
struct Parsed {
    texts: Vec<String>,
    normalize: bool,
    truncate: bool,
}

/// The texts of a request body, or its 4xx.
fn parse(api: Api, body: &[u8], most: usize) -> Result<Parsed, Response> {
    if api == Api::Similarity {
        return parse_similarity(body, most);
    }
    let field = api.field();
    let obj = object(body, &format!("{{\"{field}\": string or [string, ...]}}"))?;
    let texts = texts(obj.get(field), field, most)?;
    if api == Api::OpenAi
        && let Some(f) = obj.get("encoding_format")
        && f.as_str() != Some("float")
        && !f.is_null()
    {
        return Err(unprocessable(format!(
            "`encoding_format` {f} is not served; \"float\" is"
        )));
    }
    Ok(Parsed {
        texts,
        // OpenAI's embeddings are unit vectors.
        normalize: if api == Api::Tei {
            flag(&obj, "normalize")?
        } else {
            true
        },
        truncate: flag(&obj, "truncate")?,
    })
}

/// `/similarity`'s texts (the source sentence, then the others) and its
/// `parameters.truncate`, or its 4xx. Its vectors are unit vectors: their
/// dot products are the cosines.
fn parse_similarity(body: &[u8], most: usize) -> Result<Parsed, Response> {
    let shape = r#"{"inputs": {"source_sentence": string, "sentences": [string, ...]}}"#;
    let obj = object(body, shape)?;
    let Some(Value::Object(inputs)) = obj.get("inputs") else {
        return Err(unprocessable(format!("`inputs` must be an object {shape}")));
    };
    let source = match inputs.get("source_sentence") {
        Some(Value::String(s)) if s.is_empty() => {
            return Err(error_of(
                StatusCode::BAD_REQUEST,
                "Empty",
                "`inputs.source_sentence` is an empty string",
            ));
        }
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(unprocessable("`inputs.source_sentence` must be a string"));
        }
    };
    if matches!(inputs.get("sentences"), Some(Value::Array(a)) if a.is_empty()) {
        return Err(error_of(
            StatusCode::BAD_REQUEST,
            "Empty",
            "`inputs.sentences` cannot be empty",
        ));
    }
    // The source sentence counts in the batch.
    if let Some(Value::Array(a)) = inputs.get("sentences")
        && a.len() + 1 > most
    {
        return Err(error_of(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Validation",
            format!(
                "batch size {} > maximum allowed batch size {most}",
                a.len() + 1
            ),
        ));
    }
    let sentences = match inputs.get("sentences") {
        v @ Some(Value::Array(_)) => texts(v, "inputs.sentences", most)?,
        _ => {
            return Err(unprocessable(
                "`inputs.sentences` must be an array of strings",
            ));
        }
    };
    let truncate = match obj.get("parameters") {
        None | Some(Value::Null) => true,
        Some(Value::Object(p)) => flag(p, "truncate")?,
        Some(v) => {
            return Err(unprocessable(format!(
                "`parameters` must be an object, not {}",
                kind(v)
            )));
        }
    };
    let mut texts = Vec::with_capacity(sentences.len() + 1);
    texts.push(source);
    texts.extend(sentences);
    Ok(Parsed {
        texts,
        normalize: true,
        truncate,
    })
}

/// The ids of each text, or the 4xx of the first that fails.
fn tokenize(model: &Embedder, api: Api, p: &Parsed) -> Result<Vec<Vec<u32>>, Response> {
    p.texts
        .iter()
        .enumerate()
        .map(|(k, t)| {
            model.tokenize(t, p.truncate).map_err(|e| match e {
                TokenizeError::TooLong { .. } => error_of(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Validation",
                    format!("`{}`: {e}", api.at(k)),
                ),
                _ => error_of(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Tokenizer",
                    format!("`{}`: {e}", api.at(k)),
                ),
            })
        })
        .collect()
}

async fn handle(svc: &Service<Embedder>, api: Api, headers: &HeaderMap, body: Body) -> Response {
    let Received {
        body,
        held,
        accepted,
        most,
    } = match receive(svc, headers, body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let parsed = match parse(api, &body, most) {
        Ok(p) => p,
        Err(r) => return r,
    };
    drop(body);
    // The queue checked again by the parsed count, before the tokenizer's
    // work: the scan counts a top-level array's values, and `/similarity`
    // nests its texts.
    if full(svc, parsed.texts.len(), accepted) {
        return svc.overloaded();
    }
    let model = svc.model().clone();
    let bytes: usize = parsed.texts.iter().map(String::len).sum();
    // The budget goes along with the work: a client that leaves drops
    // this handler, not the tokenizer's run on the blocking pool.
    let tokenized = off_the_handler(bytes, move || {
        tokenize(&model, api, &parsed).map(|ids| (ids, parsed, held))
    });
    let (ids, parsed, _held) = match tokenized.await {
        Ok(t) => t,
        Err(r) => return r,
    };
    // Each text's ids checked on their own before any is queued (at least
    // one token, each within the embedding matrix): a text the model
    // cannot take is refused with its request, and fails no batch-mate.
    let tokens: usize = ids.iter().map(Vec::len).sum();
    let ids = match svc.inner.stream.check(ids) {
        Ok(ids) => ids,
        Err(StreamError::Invalid { index, why }) => {
            return error_of(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Validation",
                format!("`{}`: {why}", api.at(index)),
            );
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    // A vector that is not finite is the model's failure, TEI's
    // `Backend`, for its own request: never a 200 of `null`s.
    let refused = |k, why| {
        error_of(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Backend",
            format!("`{}`: {why}", api.at(k)),
        )
    };
    let mut vectors = match submit(svc, accepted, ids, None, refused).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    counter!("coexec_embed_sequences_total").increment(vectors.len() as u64);
    counter!("coexec_embed_tokens_total").increment(tokens as u64);
    if parsed.normalize {
        vectors.iter_mut().for_each(|v| normalize(v));
    }
    let body = match api {
        Api::Tei => serde_json::to_string(&vectors),
        Api::Similarity => {
            let cosines: Vec<f32> = match vectors.split_first() {
                Some((source, others)) => others
                    .iter()
                    .map(|v| v.iter().zip(source).map(|(a, b)| a * b).sum())
                    .collect(),
                None => Vec::new(),
            };
            serde_json::to_string(&cosines)
        }
        Api::OpenAi => serde_json::to_string(&OpenAiList {
            object: "list",
            data: vectors
                .iter()
                .enumerate()
                .map(|(index, embedding)| OpenAiEmbedding {
                    object: "embedding",
                    embedding,
                    index,
                })
                .collect(),
            model: svc.model().id(),
            usage: Usage {
                prompt_tokens: tokens,
                total_tokens: tokens,
            },
        }),
    };
    json_response(body)
}

/// `/v1/embeddings`' answer (vectors as `f32`, written shortest).
#[derive(Serialize)]
struct OpenAiList<'a> {
    object: &'static str,
    data: Vec<OpenAiEmbedding<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct OpenAiEmbedding<'a> {
    object: &'static str,
    embedding: &'a [f32],
    index: usize,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// Times and counts a request as `/v1/infer`'s are.
async fn timed(svc: Service<Embedder>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let t0 = Instant::now();
    let r = handle(&svc, api, &headers, body).await;
    record(&r, t0);
    r
}

pub(super) async fn embed(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(svc, Api::Tei, headers, body).await
}

pub(super) async fn similarity(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(svc, Api::Similarity, headers, body).await
}

pub(super) async fn openai(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    timed(svc, Api::OpenAi, headers, body).await
}

/// The most texts (or id lists) a request may carry: `/info`'s
/// `max_client_batch_size`.
fn client_batch(svc: &Service<Embedder>) -> usize {
    let i = &svc.inner;
    i.cfg.max_inputs.min(i.stream.capacity())
}

/// `body` as JSON, or a 500.
fn json_response(body: Result<String, serde_json::Error>) -> Response {
    match body {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Runs `f` on tokio's blocking pool where the request holds more than
/// [`BLOCKING_BYTES`], else here.
async fn off_the_handler<T: Send + 'static>(
    bytes: usize,
    f: impl FnOnce() -> Result<T, Response> + Send + 'static,
) -> Result<T, Response> {
    if bytes <= BLOCKING_BYTES {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))
}

pub(super) async fn info(State(svc): State<Service<Embedder>>) -> Response {
    let i = &svc.inner;
    let m = svc.model();
    let pooling = match m.weights().config().pooling {
        coexec_models::bert::Pooling::Cls => "cls",
        _ => "mean",
    };
    let body = json!({
        "model_id": m.id(),
        "model_sha": m.sha256(),
        "model_dtype": "float32",
        "model_type": {"embedding": {"pooling": pooling}},
        "max_concurrent_requests": i.stream.capacity(),
        "max_input_length": m.max_input_length(),
        "max_batch_tokens": i.batch_cost,
        "max_batch_requests": i.batch_len,
        "max_client_batch_size": client_batch(&svc),
        "auto_truncate": true,
        "tokenization_workers": 0,
        "version": env!("CARGO_PKG_VERSION"),
        "router": "coexec",
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) async fn health(State(svc): State<Service<Embedder>>) -> Response {
    if svc.inner.draining.load(Ordering::Acquire) {
        error(StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        StatusCode::OK.into_response()
    }
}
