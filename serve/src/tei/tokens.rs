//! TEI's tokenizer routes: `POST /tokenize` (each text's tokens, never
//! truncated) and `POST /decode` (the text of token ids). They run on the
//! request's handler (a large request on tokio's blocking pool) and take
//! no place in the queue.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::types::{DecodeRequest, DecodeResponse, TokenizeRequest, TokenizeResponse};
use super::{off_the_handler, prompted, read};
use crate::Service;
use crate::body::{body_of, client_batch};
use crate::bounded::Limits;
use crate::budget::held_body;
use crate::error::{ErrorResponse, ErrorType};
use crate::infer::failed;
use coexec_models::{Embedder, TokenizeError};

/// `/tokenize` refuses a text of more than this many characters per token
/// the model takes (TEI's bound: 64 000 for a model of 256 tokens).
const MAX_CHAR_MULTIPLIER: usize = 250;

/// What `/tokenize` holds per byte of its body, for the memory budget: a
/// text has at most a token per byte (a run of `.`, each its own token;
/// `[CLS]` and `[SEP]` fit in the quotes and comma around a text), and a
/// token held by the tokenizer's encoding, as a [`Token`](coexec_models::Token)
/// and as its JSON (some 65 bytes) took 170 bytes at the peak (measured:
/// 336 MiB for a body of 2 MB of `.`).
const TOKENIZE_BYTES_PER_BODY_BYTE: u64 = 192;

/// What `/decode` holds per byte of its body: an id per 2 bytes (`0,`),
/// 220 bytes each at the peak (measured, 67 MiB for 320 000 ids, when each
/// id was read as a JSON value; its token's text, the decoded text). Read
/// as `u32`s the ids hold less; the bound stands.
const DECODE_BYTES_PER_BODY_BYTE: u64 = 128;

/// `POST /tokenize`: each text's tokens, never truncated.
#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "Text Embeddings Inference",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "The answer", body = Vec<Vec<super::openapi::SimpleToken>>),
        (status = 400, description = "No input, or an empty one", body = ErrorResponse),
        (status = 422, description = "A tokenizer error, or a text past its bound", body = ErrorResponse),
    )
)]
pub(crate) async fn tokenize(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ErrorResponse> {
    // TEI's bound on an untruncated text: its answer is some 35 bytes a
    // character of text (a token's JSON for each one-letter word).
    let limit = svc.model().max_input_length() * MAX_CHAR_MULTIPLIER;
    let items = |svc: &Service<Embedder>, body: &[u8], limits| {
        let req: TokenizeRequest = read(svc, body, limits)?;
        let texts = req.inputs.into_texts("inputs")?;
        let texts = prompted(svc.model(), req.prompt_name.as_deref(), texts)?;
        for (k, t) in texts.iter().enumerate() {
            let chars = t.chars().count();
            if chars > limit {
                return Err(ErrorResponse::new(
                    ErrorType::Validation,
                    format!("`inputs[{k}]` must have less than {limit} characters. Given: {chars}"),
                ));
            }
        }
        Ok((texts, req.add_special_tokens.unwrap_or(true)))
    };
    each_of::<_, _, TokenizeResponse>(
        &svc,
        &headers,
        body,
        ("inputs", TOKENIZE_BYTES_PER_BODY_BYTE),
        items,
        String::len,
        |m, t, special| m.tokens(t, special),
    )
    .await
}

/// `POST /decode`: the text of each list of token ids.
#[utoipa::path(
    post,
    path = "/decode",
    tag = "Text Embeddings Inference",
    request_body = DecodeRequest,
    responses(
        (status = 200, description = "The answer", body = Vec<String>),
        (status = 400, description = "No ids", body = ErrorResponse),
        (status = 422, description = "A tokenizer error", body = ErrorResponse),
    )
)]
pub(crate) async fn decode(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ErrorResponse> {
    let items = |svc: &Service<Embedder>, body: &[u8], limits| {
        let req: DecodeRequest = read(svc, body, limits)?;
        Ok((
            req.ids.into_lists()?,
            req.skip_special_tokens.unwrap_or(true),
        ))
    };
    let bytes = |ids: &Vec<u32>| 4 * ids.len();
    each_of::<_, _, DecodeResponse>(
        &svc,
        &headers,
        body,
        ("ids", DECODE_BYTES_PER_BODY_BYTE),
        items,
        bytes,
        |m, ids, skip| m.decode(ids, skip),
    )
    .await
}

/// A tokenizer route: reads the body (`items`: its items and flag, or the
/// refusal; `field` names the items in errors), runs `each` on every item
/// off the handler where they hold more than [`BLOCKING_BYTES`](super::BLOCKING_BYTES)
/// (`bytes` of each), and answers the results as an `A`, or the
/// first failure's 422 `Tokenizer`. It holds `weight` bytes of the memory
/// budget per byte of its body from the read until its answer is written
/// (429 when they are not free), so that concurrent requests at the limit
/// cannot add gigabytes. The batch is bounded by the client batch; these
/// routes queue nothing, so the queue's room does not bound it.
async fn each_of<I, O, A>(
    svc: &Service<Embedder>,
    headers: &HeaderMap,
    body: Body,
    (field, weight): (&'static str, u64),
    items: impl FnOnce(&Service<Embedder>, &[u8], Limits) -> Result<(Vec<I>, bool), ErrorResponse>,
    bytes: impl Fn(&I) -> usize,
    each: impl Fn(&Embedder, &I, bool) -> Result<O, TokenizeError> + Send + 'static,
) -> Result<Response, ErrorResponse>
where
    I: Send + 'static,
    O: Send + 'static,
    A: FromIterator<O> + Serialize,
{
    let body = body_of(svc, headers, body).await?;
    let held = svc.take_budget(weight.saturating_mul(body.len() as u64))?;
    let parsed = items(svc, &body, Limits::new(client_batch(svc), usize::MAX));
    drop(body);
    let (items, flag) = parsed?;
    let model = svc.model().clone();
    let size = items.iter().map(bytes).sum();
    // The budget goes along with the work and then with the answer's
    // bytes, until the server drops them.
    let answer = off_the_handler(size, move || {
        let answers = items
            .iter()
            .enumerate()
            .map(|(k, item)| {
                each(&model, item, flag).map_err(|e| {
                    ErrorResponse::new(ErrorType::Tokenizer, format!("`{field}[{k}]`: {e}"))
                })
            })
            .collect::<Result<A, _>>()?;
        let json = serde_json::to_vec(&answers).map_err(|e| failed(e.to_string()))?;
        Ok(held_body(json, held))
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], answer).into_response())
}
