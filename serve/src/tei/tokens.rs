//! TEI's tokenizer routes: `POST /tokenize` (each text's tokens, never
//! truncated) and `POST /decode` (the text of token ids). They run on the
//! request's handler (a large request on tokio's blocking pool) and take
//! no place in the queue.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::request::{flag, kind, object, texts, unprocessable};
use super::{client_batch, off_the_handler};
use crate::Service;
use crate::body::body_of;
use crate::budget::held_body;
use crate::infer::{error, error_of};
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
/// 220 bytes each at the peak (its JSON value, its token's text, the
/// decoded text; measured: 67 MiB for 320 000 ids).
const DECODE_BYTES_PER_BODY_BYTE: u64 = 128;

/// `POST /tokenize`: each text's tokens, never truncated.
pub(crate) async fn tokenize(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let most = client_batch(&svc);
    // TEI's bound on an untruncated text: its answer is some 35 bytes a
    // character of text (a token's JSON for each one-letter word).
    let limit = svc.model().max_input_length() * MAX_CHAR_MULTIPLIER;
    let read = |obj: &serde_json::Map<String, Value>| {
        let texts = texts(obj.get("inputs"), "inputs", most)?;
        for (k, t) in texts.iter().enumerate() {
            let chars = t.chars().count();
            if chars > limit {
                return Err(error_of(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Validation",
                    format!("`inputs[{k}]` must have less than {limit} characters. Given: {chars}"),
                ));
            }
        }
        Ok((texts, flag(obj, "add_special_tokens")?))
    };
    let shape = "{\"inputs\": string or [string, ...]}";
    each_of(
        &svc,
        &headers,
        body,
        (shape, "inputs", TOKENIZE_BYTES_PER_BODY_BYTE),
        read,
        String::len,
        |m, t, special| m.tokens(t, special),
    )
    .await
}

/// `POST /decode`: the text of each list of token ids.
pub(crate) async fn decode(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let most = client_batch(&svc);
    let read = |obj: &serde_json::Map<String, Value>| {
        Ok((id_lists(obj, most)?, flag(obj, "skip_special_tokens")?))
    };
    let shape = "{\"ids\": [id, ...] or [[id, ...], ...]}";
    let bytes = |ids: &Vec<u32>| 4 * ids.len();
    each_of(
        &svc,
        &headers,
        body,
        (shape, "ids", DECODE_BYTES_PER_BODY_BYTE),
        read,
        bytes,
        |m, ids, skip| m.decode(ids, skip),
    )
    .await
}

/// A tokenizer route: reads the body's JSON object (`shape`, `field`: what
/// it should hold and the name of its items, for errors), takes its items
/// and flag with `read`, runs `each` on every item off the handler where
/// they hold more than [`BLOCKING_BYTES`] (`bytes` of each), and answers
/// the results as a JSON array, or the first failure's 422. It holds
/// `weight` bytes of the memory budget per byte of its body from the read
/// until its answer is written (429 when they are not free), so that
/// concurrent requests at the limit cannot add gigabytes.
async fn each_of<I, O>(
    svc: &Service<Embedder>,
    headers: &HeaderMap,
    body: Body,
    (shape, field, weight): (&str, &'static str, u64),
    read: impl FnOnce(&serde_json::Map<String, Value>) -> Result<(Vec<I>, bool), Response>,
    bytes: impl Fn(&I) -> usize,
    each: impl Fn(&Embedder, &I, bool) -> Result<O, TokenizeError> + Send + 'static,
) -> Response
where
    I: Send + 'static,
    O: Serialize + Send + 'static,
{
    let body = match body_of(svc, headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let held = match svc.take_budget(weight.saturating_mul(body.len() as u64)) {
        Ok(h) => h,
        Err(r) => return r,
    };
    let parsed = object(&body, shape).and_then(|obj| read(&obj));
    drop(body);
    let (items, flag) = match parsed {
        Ok(p) => p,
        Err(r) => return r,
    };
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
                    error_of(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "Tokenizer",
                        format!("`{field}[{k}]`: {e}"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let json = serde_json::to_vec(&answers)
            .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok(held_body(json, held))
    })
    .await;
    match answer {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(r) => r,
    }
}

/// `obj["ids"]`: one list of token ids, or at most `most` lists; none
/// empty. Or the 4xx.
fn id_lists(obj: &serde_json::Map<String, Value>, most: usize) -> Result<Vec<Vec<u32>>, Response> {
    let empty = |what: String| error_of(StatusCode::BAD_REQUEST, "Empty", what);
    let ids = |v: &Value, at: &str| -> Result<Vec<u32>, Response> {
        let Value::Array(a) = v else {
            return Err(unprocessable(format!(
                "`{at}` must be an array of token ids, not {}",
                kind(v)
            )));
        };
        if a.is_empty() {
            return Err(empty(format!("`{at}` cannot be empty")));
        }
        a.iter()
            .enumerate()
            .map(|(k, id)| {
                id.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        unprocessable(format!("`{at}[{k}]` must be a token id, not {id}"))
                    })
            })
            .collect()
    };
    let v = obj
        .get("ids")
        .ok_or_else(|| unprocessable("missing field `ids`"))?;
    match v {
        Value::Array(a) if a.first().is_some_and(Value::is_array) => {
            if a.len() > most {
                return Err(error_of(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Validation",
                    format!("batch size {} > maximum allowed batch size {most}", a.len()),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(k, l)| ids(l, &format!("ids[{k}]")))
                .collect()
        }
        v => Ok(vec![ids(v, "ids")?]),
    }
}
