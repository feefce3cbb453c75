//! `POST /v1/infer`: the body read under its limits, the rows checked,
//! the requests queued on the stream, and the answer, with a Retry-After
//! computed from the rate the service drains its queue at.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::body::{Json, Received, limits, receive, timed};
use super::bounded::{Batch, Overflow, Refused, parse};
use super::error::{ErrorResponse, ErrorType};
use super::{ServeModel, Service};
use coexec::stream::{Checked, Pending, Served, StreamError};

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

/// 503 `Unhealthy` while draining, with `Connection: close`: the client
/// opens no more requests on a connection that is about to close (a
/// request sent on an idle keep-alive connection as the server closes it
/// is lost on the wire).
pub(super) fn draining() -> ErrorResponse {
    ErrorResponse::new(ErrorType::Unhealthy, "draining: not accepting requests").closing()
}

/// 400 `Validation`: `/v1/infer`'s status for every request it cannot
/// take (malformed, of the wrong shape, an input the model refuses).
pub(super) fn invalid(msg: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(ErrorType::Validation, msg).with_status(StatusCode::BAD_REQUEST)
}

/// 424 `Backend` (TEI 1.9's status; `/v1/infer` answers 500, [`infer`]).
pub(super) fn failed(msg: impl Into<String>) -> ErrorResponse {
    ErrorResponse::new(ErrorType::Backend, msg)
}

/// 504 `Backend`: the request's deadline passed before its answer.
pub(super) fn deadline_passed() -> ErrorResponse {
    failed("deadline passed").with_status(StatusCode::GATEWAY_TIMEOUT)
}

/// What a request to `svc` looks like, for its 400s.
pub(super) fn expected<M: ServeModel>(svc: &Service<M>) -> String {
    format!(
        r#"a JSON object {{"inputs": [{}, ...]}}"#,
        svc.inner.model.describe_input()
    )
}

/// `/v1/infer`'s body: `{"inputs": [Input, ...], "deadline_ms": n}`, no
/// other field; the inputs bounded while they are read ([`Batch`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, bound = "I: DeserializeOwned")]
pub(super) struct InferRequest<I> {
    inputs: Batch<I>,
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
    pub(super) fn new(c: &'a AtomicU64, n: u64) -> Self {
        c.fetch_add(n, Ordering::Relaxed);
        Self(c, n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// `/v1/infer`'s answer: one output per input, in order.
#[derive(Serialize)]
pub(super) struct InferResponse<O> {
    outputs: Vec<O>,
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
        // TEI's `Backend` status: the model failed, not the request.
        StatusCode::FAILED_DEPENDENCY => "failed",
        s if s.is_client_error() => "invalid",
        _ => "failed",
    }
}

pub(super) async fn infer<M: ServeModel>(
    State(svc): State<Service<M>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // coexec's own route keeps a server error's 500 for a model that
    // failed: TEI's 424 is TEI's routes' (a client of `/v1/infer` retries
    // on 5xx).
    let own = |e: ErrorResponse| {
        if e.error_type == ErrorType::Backend && e.status() == StatusCode::FAILED_DEPENDENCY {
            e.with_status(StatusCode::INTERNAL_SERVER_ERROR)
        } else {
            e
        }
    };
    timed(async { infer_inner(&svc, &headers, body).await.map_err(own) }).await
}

async fn infer_inner<M: ServeModel>(
    svc: &Service<M>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Json<InferResponse<M::Output>>, ErrorResponse> {
    let i = &svc.inner;
    let Received {
        body,
        held: _held,
        accepted,
    } = receive(svc, headers, body).await?;
    // serde's derived structs also take a JSON array of their fields
    // (`[[[...]], 100]`): only an object is the documented form.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(invalid(format!(
            "expected {}: the body is not a JSON object",
            expected(svc)
        )));
    }
    let req: InferRequest<M::Input> = match parse(&body, limits(svc, accepted)) {
        Ok(r) => r,
        Err(Refused::Overflow(Overflow::NoRoom { .. })) => return Err(svc.overloaded()),
        Err(Refused::Overflow(Overflow::TooMany { at_least, most })) => {
            return Err(invalid(format!(
                "at least {at_least} inputs in one request; at most {most}"
            )));
        }
        Err(Refused::Json(e)) => return Err(invalid(format!("expected {}: {e}", expected(svc)))),
    };
    if req.inputs.0.is_empty() {
        return Err(invalid(format!(
            "expected {}: `inputs` is empty",
            expected(svc)
        )));
    }
    let inputs = match i.stream.check(req.inputs.0) {
        Ok(inputs) => inputs,
        Err(StreamError::Invalid { index, why }) => {
            return Err(invalid(format!("inputs[{index}]: {why}")));
        }
        Err(e) => {
            tracing::error!("the model's input check failed: {e}");
            return Err(failed(e.to_string()));
        }
    };
    let deadline = req.deadline_ms.map(Duration::from_millis);
    // An input the model took can still have no meaningful answer (an
    // MLP's arithmetic overflowing): refused, not answered with `null`s.
    let refused = |k, why| invalid(format!("inputs[{k}]: {why}"));
    drop(body);
    let outputs = submit(svc, accepted, inputs, deadline, refused).await?;
    Ok(Json(InferResponse {
        outputs: outputs.into_iter().map(|(o, _)| o).collect(),
    }))
}

/// Queues a request's checked `inputs` on the stream, all or none, and
/// awaits their outputs in order, each with where its time went; `Err` is the answer to send instead (503
/// when the drain began before the request's head, `accepted` false; 429,
/// 504, 500; `refused(k, why)` for the `k`-th output the model refused,
/// [`StreamError::Output`]). `deadline` is the request's own, else the
/// service's.
pub(super) async fn submit<M: ServeModel>(
    svc: &Service<M>,
    accepted: bool,
    inputs: Checked<M::Input>,
    deadline: Option<Duration>,
    refused: impl FnOnce(usize, String) -> ErrorResponse,
) -> Result<Vec<(M::Output, Served)>, ErrorResponse> {
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
            StreamError::DeadlinePassed => return Err(deadline_passed()),
            // Not reached: the callers refuse more rows than the queue holds.
            e @ StreamError::TooMany { .. } => return Err(invalid(e.to_string())),
            _ => return Err(draining()),
        },
    };
    super::set_queue_size(i.stream.queued());
    let _counted = Counted::new(&i.in_flight, rows as u64);
    let mut outputs = Vec::with_capacity(rows);
    let mut failure = None;
    for (k, p) in pending.into_iter().enumerate() {
        match p.timed().await {
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
        Some((_, StreamError::DeadlinePassed)) => Err(deadline_passed()),
        Some((_, StreamError::Overloaded { .. })) => Err(svc.overloaded()),
        Some((_, StreamError::Closed)) => Err(ErrorResponse::new(
            ErrorType::Unhealthy,
            "the stream closed",
        )),
        Some((k, StreamError::Output { why })) => {
            tracing::warn!("output {k} of a request refused: {why}");
            Err(refused(k, why))
        }
        Some((_, e)) => {
            tracing::error!("inference failed: {e}");
            Err(failed(e.to_string()))
        }
    }
}
