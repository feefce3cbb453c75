//! A request's way in, shared by every route that takes a body: the body
//! read under its limits, a full queue's 429 before the parse, and each
//! answer counted by outcome.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use metrics::{counter, histogram};

use super::budget::Held;
use super::infer::{error, inputs_in, outcome_of};
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
/// (413, 408, 400, each closing the connection).
pub(super) async fn body_of<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, Response> {
    let i = &svc.inner;
    match read_body(headers, body, i.cfg.max_body, i.cfg.body_deadline).await {
        Ok(b) => Ok(b),
        Err(fault) => {
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
            // The rest of the body was not read: the connection cannot
            // carry another request.
            let mut r = error(status, why);
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(r)
        }
    }
}

/// What a queued route's request holds, per byte of its body: the body,
/// what is parsed from it (a TEI text's `Value`, then its `String`), its
/// inputs (an MLP's `f32`s take fewer bytes than their digits); its
/// outputs are bounded by the queue's places.
const QUEUED_BYTES_PER_BODY_BYTE: u64 = 4;

/// A request's body, read and not refused for a full queue.
pub(super) struct Received {
    pub(super) body: Bytes,
    /// Its share of the memory budget, while the request lives.
    pub(super) held: Held,
    /// The drain had not begun when its head came.
    pub(super) accepted: bool,
    /// The most inputs a request may carry.
    pub(super) most: usize,
}

/// Whether the queue has no room now for `rows` more inputs of a request
/// the drain had not begun for (`accepted`): the 429 before its parse.
pub(super) fn full<M: ServeModel>(svc: &Service<M>, rows: usize, accepted: bool) -> bool {
    let s = &svc.inner.stream;
    accepted && s.queued() + rows > s.capacity()
}

/// Reads a request's body ([`body_of`]), and refuses it with 429 when the
/// inputs it holds (counted by a scan) cannot fit in the queue.
pub(super) async fn receive<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Received, Response> {
    let i = &svc.inner;
    // A request whose head came before the drain began is answered, though
    // its body may finish arriving after it.
    let accepted = !i.draining.load(Ordering::Acquire);
    let body = body_of(svc, headers, body).await?;
    // Under overload most requests are turned away, and the parse is a
    // large part of a request's cost on the handlers (a third of a 200's,
    // by `perf`): a request whose inputs (counted by a scan) cannot fit is
    // refused before it.
    // One that could never fit is left to the parse, to get its 400 (413).
    let most = i.cfg.max_inputs.min(i.stream.capacity());
    let rows = inputs_in(&body);
    if rows <= most && full(svc, rows, accepted) {
        return Err(svc.overloaded());
    }
    let held = svc.take_budget(QUEUED_BYTES_PER_BODY_BYTE * body.len() as u64)?;
    Ok(Received {
        body,
        held,
        accepted,
        most,
    })
}

/// Counts and times an answer in `coexec_requests_total` and
/// `coexec_request_duration_seconds` by its outcome.
pub(super) fn record(r: &Response, t0: Instant) {
    let o = outcome_of(r);
    counter!("coexec_requests_total", "outcome" => o).increment(1);
    histogram!("coexec_request_duration_seconds", "outcome" => o)
        .record(t0.elapsed().as_secs_f64());
}
