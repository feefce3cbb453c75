//! `POST /v1/infer`: the body read under its limits, the rows checked,
//! the requests queued on the stream, and the answer, with a Retry-After
//! computed from the rate the service drains its queue at.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use metrics::gauge;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::body::{Received, receive, record};
use super::{ServeModel, Service};
use coexec::stream::{Checked, Pending, StreamError};

/// Rows answered per second, measured over windows of at least
/// [`DrainRate::WINDOW`] (a plain struct on a caller's clock).
#[derive(Debug, Default)]
pub(super) struct DrainRate {
    /// Start of the current window (seconds) and rows answered in it.
    start: f64,
    rows: u64,
    /// The last full window's rate; 0 until one is measured.
    rate: f64,
}

impl DrainRate {
    pub(super) const WINDOW: f64 = 0.5;
    /// The shortest partial window the first estimate is taken from.
    pub(super) const FIRST_SPAN: f64 = 0.05;

    pub(super) fn answered(&mut self, rows: u64, now: f64) {
        if self.rows == 0 && now - self.start > Self::WINDOW {
            // The first answer after a quiet spell opens a window: the
            // quiet time says nothing about how fast a backlog drains.
            self.start = now;
            self.rows = rows;
            return;
        }
        self.rows += rows;
        let span = now - self.start;
        if span >= Self::WINDOW {
            let r = self.rows as f64 / span;
            // Smoothed: one odd window moves the estimate halfway.
            self.rate = if self.rate > 0.0 {
                0.5 * (self.rate + r)
            } else {
                r
            };
            self.start = now;
            self.rows = 0;
        }
    }

    /// The rate at `now`: a window that has run long with few rows lowers
    /// it; before the first full window, the window so far once it spans
    /// [`DrainRate::FIRST_SPAN`]; 0 (nothing measured) before that.
    pub(super) fn rate(&self, now: f64) -> f64 {
        let span = now - self.start;
        if self.rate <= 0.0 {
            return if self.rows > 0 && span >= Self::FIRST_SPAN {
                self.rows as f64 / span
            } else {
                0.0
            };
        }
        if span > 2.0 * Self::WINDOW {
            let current = self.rows as f64 / span;
            return self.rate.min(current.max(self.rate * Self::WINDOW / span));
        }
        self.rate
    }
}

/// Seconds a rejected client should wait: the time to drain `backlog` rows
/// at `rate` rows/s, rounded up, at least 1, at most `cap`. With nothing
/// measured yet (a fresh server's first burst), 1: the retry then finds a
/// measured rate, where the cap would turn a client away for 30 s over a
/// backlog that drains in milliseconds.
pub(super) fn retry_after(backlog: usize, rate: f64, cap: Duration) -> u64 {
    let cap = cap.as_secs().max(1);
    if !(rate.is_finite() && rate > 0.0) {
        return 1;
    }
    ((backlog as f64 / rate).ceil() as u64).clamp(1, cap)
}

/// Why a request was refused, as its JSON body says: `{"error": why,
/// "error_type": kind}`, the kind as Text Embeddings Inference names it
/// (from the status: 429 `Overloaded`, 503 `Unhealthy`, 5xx `Backend`,
/// other 4xx `Validation`).
pub(super) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    let kind = match status {
        StatusCode::TOO_MANY_REQUESTS => "Overloaded",
        StatusCode::SERVICE_UNAVAILABLE => "Unhealthy",
        s if s.is_server_error() => "Backend",
        _ => "Validation",
    };
    error_of(status, kind, msg)
}

/// [`error`] with the `error_type` given.
pub(super) fn error_of(status: StatusCode, kind: &str, msg: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": msg.into(), "error_type": kind }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// 503 while draining, with `Connection: close`: the client opens no more
/// requests on a connection that is about to close (a request sent on an
/// idle keep-alive connection as the server closes it is lost on the wire).
pub(super) fn draining() -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining: not accepting requests",
    );
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// The inputs a body `{"inputs": [...], ...}` holds, at least 1: a cheap
/// count for refusing before the parse. It counts the values of the first
/// array at the object's top level by its commas, whatever the inputs are
/// (numbers, arrays, objects; strings skipped, escapes and all). A
/// malformed body may count wrong; it then gets a 429 instead of its 400
/// while the queue is full.
pub(super) fn inputs_in(body: &[u8]) -> usize {
    let (mut depth, mut commas, mut any) = (0usize, 0usize, false);
    let (mut in_inputs, mut in_str, mut escaped) = (false, false, false);
    for &b in body {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        let element = in_inputs && depth == 2;
        match b {
            b'"' => {
                in_str = true;
                any |= element;
            }
            b'[' if depth == 1 && !in_inputs => {
                in_inputs = true;
                depth += 1;
            }
            b'[' | b'{' => {
                any |= element;
                depth += 1;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                if in_inputs && depth < 2 {
                    break;
                }
            }
            b',' if element => commas += 1,
            b if b.is_ascii_whitespace() => {}
            _ => any |= element,
        }
    }
    (commas + usize::from(any)).max(1)
}

/// What a request to `svc` looks like, for its 400s.
pub(super) fn expected<M: ServeModel>(svc: &Service<M>) -> String {
    format!(
        r#"a JSON object {{"inputs": [{}, ...]}}"#,
        svc.inner.model.describe_input()
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, bound = "I: DeserializeOwned")]
pub(super) struct InferRequest<I> {
    inputs: Vec<I>,
    #[serde(default, deserialize_with = "deadline_ms")]
    pub(super) deadline_ms: Option<u64>,
}

/// The longest `deadline_ms` accepted: a day (longer is no deadline a
/// client waits for, and past `Instant`'s range it would overflow).
pub(super) const MAX_DEADLINE_MS: u64 = 86_400_000;

/// `deadline_ms`: a whole number of milliseconds up to [`MAX_DEADLINE_MS`],
/// or null; anything else is refused with an error that names the field.
fn deadline_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let v = Option::<serde_json::Value>::deserialize(d)?;
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(ms) if ms <= MAX_DEADLINE_MS => Ok(Some(ms)),
            _ => Err(serde::de::Error::custom(format!(
                "`deadline_ms` must be a whole number of milliseconds from 0 to {MAX_DEADLINE_MS}, not {v}"
            ))),
        },
    }
}

/// Rows counted in `in_flight` while it lives: a client that goes away
/// drops the handler, and its rows must leave the backlog with it.
pub(super) struct Counted<'a>(&'a AtomicU64, u64);

impl<'a> Counted<'a> {
    fn new(c: &'a AtomicU64, n: u64) -> Self {
        c.fetch_add(n, Ordering::Relaxed);
        Self(c, n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

#[derive(Serialize)]
pub(super) struct InferResponse<'a, O> {
    outputs: &'a [O],
}

/// The outcomes of `coexec_requests_total` and
/// `coexec_request_duration_seconds`.
pub(super) const OUTCOMES: [&str; 6] = [
    "success",
    "invalid",
    "overloaded",
    "deadline",
    "failed",
    "unavailable",
];

/// A `/v1/infer` answer's outcome, read from the answer itself so that the
/// counter and the latency histogram cannot disagree: a 429 is a full
/// queue, a 503 a draining or closed service.
pub(super) fn outcome_of(r: &Response) -> &'static str {
    match r.status() {
        StatusCode::OK => "success",
        StatusCode::GATEWAY_TIMEOUT => "deadline",
        StatusCode::TOO_MANY_REQUESTS => "overloaded",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_client_error() => "invalid",
        _ => "failed",
    }
}

pub(super) async fn infer<M: ServeModel>(
    State(svc): State<Service<M>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t0 = Instant::now();
    let r = infer_inner(&svc, &headers, body).await;
    record(&r, t0);
    r
}

pub(super) async fn infer_inner<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let i = &svc.inner;
    let Received {
        body,
        held: _held,
        accepted,
        most,
    } = match receive(svc, headers, body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    // serde's derived structs also take a JSON array of their fields
    // (`[[[...]], 100]`): only an object is the documented form.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return error(
            StatusCode::BAD_REQUEST,
            format!("expected {}: the body is not a JSON object", expected(svc)),
        );
    }
    let req: InferRequest<M::Input> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("expected {}: {e}", expected(svc)),
            );
        }
    };
    if req.inputs.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("expected {}: `inputs` is empty", expected(svc)),
        );
    }
    // More rows than the queue holds could never be accepted.
    if req.inputs.len() > most {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{} inputs in one request; at most {most}", req.inputs.len()),
        );
    }
    let inputs = match i.stream.check(req.inputs) {
        Ok(inputs) => inputs,
        Err(StreamError::Invalid { index, why }) => {
            return error(StatusCode::BAD_REQUEST, format!("inputs[{index}]: {why}"));
        }
        Err(e) => {
            tracing::error!("the model's input check failed: {e}");
            return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        }
    };
    let deadline = req.deadline_ms.map(Duration::from_millis);
    // An input the model took can still have no meaningful answer (an
    // MLP's arithmetic overflowing): refused, not answered with `null`s.
    let refused = |k, why| error(StatusCode::BAD_REQUEST, format!("inputs[{k}]: {why}"));
    let outputs = match submit(svc, accepted, inputs, deadline, refused).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let outputs = &outputs[..];
    match serde_json::to_string(&InferResponse { outputs }) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Queues a request's checked `inputs` on the stream, all or none, and
/// awaits their outputs in order; `Err` is the answer to send instead (503
/// when the drain began before the request's head, `accepted` false; 429,
/// 504, 500; `refused(k, why)` for the `k`-th output the model refused,
/// [`StreamError::Output`]). `deadline` is the request's own, else the
/// service's.
pub(super) async fn submit<M: ServeModel>(
    svc: &Service<M>,
    accepted: bool,
    inputs: Checked<M::Input>,
    deadline: Option<Duration>,
    refused: impl FnOnce(usize, String) -> Response,
) -> Result<Vec<M::Output>, Response> {
    let i = &svc.inner;
    if !accepted {
        return Err(draining());
    }
    let rows = inputs.len();
    let deadline = deadline.or(i.cfg.deadline).map(|d| Instant::now() + d);
    // All the request's rows are queued, or none: a refused request leaves
    // nothing in the queue. (A deadline already past is checked first: 504
    // before 429.)
    let admitted = i.stream.try_infer_checked(inputs, deadline);
    let pending: Vec<Pending<M::Output>> = match admitted {
        Ok(pending) => pending,
        Err(rejected) => match rejected.error() {
            StreamError::Overloaded { .. } => return Err(svc.overloaded()),
            StreamError::DeadlinePassed => {
                return Err(error(StatusCode::GATEWAY_TIMEOUT, "deadline passed"));
            }
            // Not reached: the callers refuse more rows than the queue holds.
            e @ StreamError::TooMany { .. } => {
                return Err(error(StatusCode::BAD_REQUEST, e.to_string()));
            }
            _ => return Err(draining()),
        },
    };
    gauge!("coexec_queue_size").set(i.stream.queued() as f64);
    let _counted = Counted::new(&i.in_flight, rows as u64);
    let mut outputs = Vec::with_capacity(rows);
    let mut failure = None;
    for (k, p) in pending.into_iter().enumerate() {
        match p.await {
            Ok(out) => outputs.push(out),
            Err(e) => {
                failure = Some((k, e));
                break;
            }
        }
    }
    i.drain
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .answered(rows as u64, svc.now());
    match failure {
        None => Ok(outputs),
        Some((_, StreamError::DeadlinePassed)) => {
            Err(error(StatusCode::GATEWAY_TIMEOUT, "deadline passed"))
        }
        Some((_, StreamError::Overloaded { .. })) => Err(svc.overloaded()),
        Some((_, StreamError::Closed)) => {
            Err(error(StatusCode::SERVICE_UNAVAILABLE, "the stream closed"))
        }
        Some((k, StreamError::Output { why })) => {
            tracing::warn!("output {k} of a request refused: {why}");
            Err(refused(k, why))
        }
        Some((_, e)) => {
            tracing::error!("inference failed: {e}");
            Err(error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
        }
    }
}
