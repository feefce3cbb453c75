//! A request's way in, shared by every route that takes a body: the body
//! read under its limits and its share of the memory budget taken; and
//! its answer's way out, as JSON ([`Json`]), counted by outcome.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics::{counter, histogram};
use serde::Serialize;

use super::bounded::Limits;
use super::budget::Held;
use super::error::{ErrorResponse, ErrorType};
use super::infer::outcome_of;
use super::{ServeModel, Service};

/// The default of [`super::ServeConfig::body_deadline`].
pub(super) const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// Why a request body was not read.
#[derive(Debug, PartialEq)]
pub(super) enum BodyFault {
    /// Over `limit` bytes, by its `Content-Length` or as it arrived.
    TooLarge,
    /// Not all there within the body deadline.
    Stalled,
    /// The connection failed while reading it.
    Read(String),
}

/// Reads a body of at most `limit` bytes within `deadline`. A declared
/// length over the limit is refused before any of the body is read (a
/// client that sent `Expect: 100-continue` is not asked for it).
///
/// Memory follows the bytes received, not the frames they came in: each
/// frame is copied into one buffer and dropped at once. A frame is a slice
/// of the connection's read buffer and keeps all of it alive, so keeping
/// the frames (as collecting them does) let a client sending one byte per
/// TCP segment hold kilobytes per byte.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, BodyFault> {
    use http_body_util::BodyExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyFault::TooLarge);
    }
    let read = async {
        let mut body = body;
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyFault::Read(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if data.len() > limit - buf.len() {
                return Err(BodyFault::TooLarge);
            }
            // A body that came whole (the common case) is kept as it is.
            if buf.is_empty() && http_body::Body::is_end_stream(&body) {
                return Ok(data);
            }
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(BodyFault::Stalled))
}

/// The body under the service's limits, or the answer to send instead
/// (413, 408, 400 `Validation`, each closing the connection: the rest of
/// the body was not read).
pub(super) async fn body_of<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ErrorResponse> {
    let i = &svc.inner;
    read_body(headers, body, i.cfg.max_body, i.cfg.body_deadline)
        .await
        .map_err(|fault| {
            let (status, why) = match fault {
                BodyFault::TooLarge => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body over the limit of {} bytes", i.cfg.max_body),
                ),
                BodyFault::Stalled => (
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body did not arrive within {:?}", i.cfg.body_deadline),
                ),
                BodyFault::Read(e) => (
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                ),
            };
            ErrorResponse::new(ErrorType::Validation, why)
                .with_status(status)
                .closing()
                .uncounted()
        })
}

/// What a queued route's request holds, per byte of its body: the body,
/// what is parsed from it (a TEI text's `String`), its inputs (an MLP's
/// `f32`s take fewer bytes than their digits); its outputs are bounded by
/// the queue's places.
const QUEUED_BYTES_PER_BODY_BYTE: u64 = 4;

/// A queued route's request body, read, with its share of the budget.
pub(super) struct Received {
    pub(super) body: Bytes,
    /// Its share of the memory budget, while the request lives.
    pub(super) held: Held,
    /// The drain had not begun when its head came.
    pub(super) accepted: bool,
}

/// The bounds of a queued route's input list now: the most a request may
/// carry ([`client_batch`]), and the queue's free places, unless the drain
/// began before its head (`accepted` false: it gets its 503 when queued).
pub(super) fn limits<M: ServeModel>(svc: &Service<M>, accepted: bool) -> Limits {
    let room = if accepted { svc.room() } else { usize::MAX };
    Limits::new(client_batch(svc), room)
}

/// The most inputs a request may carry: `/info`'s
/// `max_client_batch_size` (more rows than the queue holds could never be
/// accepted).
pub(super) fn client_batch<M: ServeModel>(svc: &Service<M>) -> usize {
    let i = &svc.inner;
    i.cfg.max_inputs.min(i.stream.capacity())
}

/// Reads a queued route's request body ([`body_of`]) and takes its share
/// of the memory budget (429 when the budget cannot cover it now).
pub(super) async fn receive<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Received, ErrorResponse> {
    // A request whose head came before the drain began is answered, though
    // its body may finish arriving after it.
    let accepted = !svc.inner.draining.load(Ordering::Acquire);
    let body = body_of(svc, headers, body).await?;
    let held = svc.take_budget(QUEUED_BYTES_PER_BODY_BYTE * body.len() as u64)?;
    Ok(Received {
        body,
        held,
        accepted,
    })
}

/// An answer's body: `T` as JSON (`Content-Type: application/json`).
pub(super) struct Json<T>(pub(super) T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
            // Not reached for the service's types (no map with non-string
            // keys); not an ErrorResponse, whose own body goes through here.
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        }
    }
}

/// Counts and times an answer in `coexec_requests_total` and
/// `coexec_request_duration_seconds` by its outcome.
pub(super) fn record(r: &Response, t0: Instant) {
    let o = outcome_of(r);
    counter!("coexec_requests_total", "outcome" => o).increment(1);
    histogram!("coexec_request_duration_seconds", "outcome" => o)
        .record(t0.elapsed().as_secs_f64());
}

/// A queued route's answer, counted and timed ([`record`]).
pub(super) async fn timed<T: IntoResponse>(
    answer: impl Future<Output = Result<T, ErrorResponse>>,
) -> Response {
    let t0 = Instant::now();
    let r = answer.await.into_response();
    record(&r, t0);
    r
}
