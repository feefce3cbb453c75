//! An HTTP inference service over a [`Stream`]: the digits classifier (or any
//! [`MlpWeights`]) behind axum, as `coexec serve` runs it.
//!
//! ```text
//!  POST /v1/infer {"inputs": [[64 numbers], ...]} ──try_infer_many_by──▶ Stream ──batches──▶ Runtime
//!       ◀── {"outputs": [{"label": L, "probs": [10 numbers]}, ...]} (one per input, in order)
//!  GET /healthz (alive) · GET /readyz (503 while draining) · GET /metrics (Prometheus)
//! ```
//!
//! Every request gets an answer, never a panic: malformed JSON, a wrong
//! shape or a number that is not a finite `f32` 400 (naming what was
//! expected; also an input so large that the model's output overflows,
//! never a `null` probability), a body over the limit 413 (refused by its
//! `Content-Length` before it is read), a body not all there 10 s after
//! the head 408, a wrong method 405, an unknown path 404, a full queue 503
//! with a `Retry-After` from the backlog and the measured drain rate, a
//! passed deadline 504.
//!
//! Embed the router in your own axum app ([`Service::router`]), or run it
//! on a listener with [`serve`], which stops accepting on a signal and
//! answers every request it accepted:
//!
//! ```no_run
//! use std::sync::Arc;
//! use coexec::kernels::workloads::MlpWeights;
//! use coexec::serve::{ServeConfig, Service};
//! use coexec::stream::StreamConfig;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = Arc::new(coexec::Runtime::builder().devices("cpu:1,sim:1@0.5")?.start().await?);
//! let weights = Arc::new(MlpWeights::load("examples/models/digits_mlp.safetensors")?);
//! let svc = Service::start(rt, weights, StreamConfig::new(), ServeConfig::new())?;
//! let app = axum::Router::new().merge(svc.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! coexec::serve::serve(listener, app, async { let _ = tokio::signal::ctrl_c().await; }).await;
//! svc.shutdown().await; // answers everything queued
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use coexec_kernels::workloads::{argmax, MlpWeights};
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::net::{Connections, HeadDeadline, Requests, WatchedBody};
use crate::stream::{MlpModel, Pending, Stream, StreamConfig, StreamError};
use crate::{Error, Runtime};

/// Longest a client may take to send a request head, from its first byte.
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Longest a keep-alive connection may sit idle, waiting for the first byte
/// of its next request. Longer than the idle timeouts of common HTTP client
/// pools (90 s for hyper's, reqwest's and Go's), so that the client, not
/// the server, closes an idle connection: when the server does, a request
/// sent on it as the close is on its way is lost.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a client may take to send a request body once its head is in
/// (then 408): a stalled upload holds a connection slot, and at shutdown
/// the process, no longer than this.
const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// How long [`serve`] lets open connections go on after its signal before
/// it closes the idle ones.
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Largest request head read (larger heads get 431).
const MAX_HEAD: usize = 16 * 1024;
/// Connections [`serve`] serves at once. A client past it takes the slot of
/// the connection idle longest, which is asked to close; while every
/// connection is busy with a request, it waits (and the ones after it wait
/// in the kernel's accept queue). Keep it below the process's limit of open
/// files (`ulimit -n`).
pub const MAX_CONNECTIONS: usize = 4096;
/// How often a client waiting for a slot looks again for an idle
/// connection to close, while every connection was busy.
const EVICT_RETRY: Duration = Duration::from_millis(100);
/// How long a connection asked to close for a waiting client has to give
/// its slot back before another is asked.
const EVICT_AGAIN: Duration = Duration::from_secs(1);

/// The service's limits. Build with [`ServeConfig::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// let cfg = coexec::serve::ServeConfig::new()
///     .max_body(1 << 20)
///     .deadline(Some(Duration::from_millis(200)));
/// assert_eq!(cfg.max_body_len(), 1 << 20);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    max_body: usize,
    max_inputs: usize,
    deadline: Option<Duration>,
    max_retry_after: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ServeConfig {
    /// Bodies up to 2 MiB, 1024 inputs per request, no default deadline,
    /// `Retry-After` at most 30 s.
    pub fn new() -> Self {
        Self {
            max_body: 2 << 20,
            max_inputs: 1024,
            deadline: None,
            max_retry_after: Duration::from_secs(30),
        }
    }

    /// Largest request body in bytes (larger: 413).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Most inputs in one request (more: 400).
    pub fn max_inputs(mut self, n: usize) -> Self {
        self.max_inputs = n;
        self
    }

    /// The deadline of a request that names none (`deadline_ms` in its
    /// body); `None`: no deadline.
    pub fn deadline(mut self, d: Option<Duration>) -> Self {
        self.deadline = d;
        self
    }

    /// The largest `Retry-After` a 503 suggests.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.max_retry_after = d;
        self
    }

    /// The body limit set.
    pub fn max_body_len(&self) -> usize {
        self.max_body
    }
}

/// Rows answered per second, measured over windows of at least
/// [`DrainRate::WINDOW`] (a plain struct on a caller's clock).
#[derive(Debug, Default)]
struct DrainRate {
    /// Start of the current window (seconds) and rows answered in it.
    start: f64,
    rows: u64,
    /// The last full window's rate; 0 until one is measured.
    rate: f64,
}

impl DrainRate {
    const WINDOW: f64 = 0.5;
    /// The shortest partial window the first estimate is taken from.
    const FIRST_SPAN: f64 = 0.05;

    fn answered(&mut self, rows: u64, now: f64) {
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
    fn rate(&self, now: f64) -> f64 {
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
fn retry_after(backlog: usize, rate: f64, cap: Duration) -> u64 {
    let cap = cap.as_secs().max(1);
    if !(rate.is_finite() && rate > 0.0) {
        return 1;
    }
    ((backlog as f64 / rate).ceil() as u64).clamp(1, cap)
}

struct Inner {
    stream: Stream<MlpModel>,
    weights: Arc<MlpWeights>,
    cfg: ServeConfig,
    metrics: PrometheusHandle,
    draining: AtomicBool,
    epoch: Instant,
    drain: Mutex<DrainRate>,
    /// Rows accepted and not yet answered.
    in_flight: AtomicU64,
}

/// The inference service: a [`Stream`] of an [`MlpModel`] and the HTTP
/// handlers in front of it. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("stream", &self.inner.stream)
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

/// Why a request was refused, as its JSON body says.
fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": msg.into() }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// 503 while draining, with `Connection: close`: the client opens no more
/// requests on a connection that is about to close (a request sent on an
/// idle keep-alive connection as the server closes it is lost on the wire).
fn draining() -> Response {
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

/// The rows a body `{"inputs": [[...], ...]}` holds, by its brackets (no
/// other part of a well-formed body has one), at least 1: a cheap count
/// for refusing before the parse. A malformed body may count wrong; it
/// then gets a 503 instead of its 400 while the queue is full.
fn rows_in(body: &[u8]) -> usize {
    body.iter()
        .filter(|&&b| b == b'[')
        .count()
        .saturating_sub(1)
        .max(1)
}

const EXPECTED: &str = r#"a JSON object {"inputs": [[64 numbers], ...]}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InferRequest {
    inputs: Vec<Vec<f32>>,
    #[serde(default)]
    deadline_ms: Option<u64>,
}

/// Rows counted in `in_flight` while it lives: a client that goes away
/// drops the handler, and its rows must leave the backlog with it.
struct Counted<'a>(&'a AtomicU64, u64);

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

/// One input's answer; probabilities as f32 (shortest round-trip digits).
#[derive(Serialize)]
struct Output<'a> {
    label: usize,
    probs: &'a [f32],
}

#[derive(Serialize)]
struct InferResponse<'a> {
    outputs: Vec<Output<'a>>,
}

/// The outcomes of `coexec_requests_total` and
/// `coexec_request_duration_seconds`.
const OUTCOMES: [&str; 6] = [
    "success",
    "invalid",
    "overloaded",
    "deadline",
    "failed",
    "unavailable",
];

/// A `/v1/infer` answer's outcome, read from the answer itself so that the
/// counter and the latency histogram cannot disagree: a 503 with
/// `Retry-After` is a full queue, one without it a draining or closed
/// service.
fn outcome_of(r: &Response) -> &'static str {
    match r.status() {
        StatusCode::OK => "success",
        StatusCode::GATEWAY_TIMEOUT => "deadline",
        StatusCode::SERVICE_UNAVAILABLE if r.headers().contains_key(header::RETRY_AFTER) => {
            "overloaded"
        }
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_client_error() => "invalid",
        _ => "failed",
    }
}

impl Service {
    /// Starts a stream of `weights` on `rt` (its batches timed into the
    /// service's metrics) and the service over it. Installs the process's
    /// Prometheus recorder if none is.
    pub fn start(
        rt: Arc<Runtime>,
        weights: Arc<MlpWeights>,
        stream: StreamConfig,
        cfg: ServeConfig,
    ) -> Result<Self, Error> {
        let metrics = crate::metrics::handle()?;
        describe();
        let stream = stream.on_batch(|t| {
            let n = t.size.max(1);
            histogram!("coexec_batch_size").record(t.size as f64);
            histogram!("coexec_request_queue_duration_seconds")
                .record_many((t.total_wait + t.prepare).as_secs_f64() / n as f64, n);
            histogram!("coexec_request_inference_duration_seconds")
                .record_many((t.run + t.deliver).as_secs_f64(), n);
        });
        let stream = Stream::start(rt, MlpModel::new(weights.clone()), stream)?;
        Ok(Self {
            inner: Arc::new(Inner {
                stream,
                weights,
                cfg,
                metrics,
                draining: AtomicBool::new(false),
                epoch: Instant::now(),
                drain: Mutex::new(DrainRate::default()),
                in_flight: AtomicU64::new(0),
            }),
        })
    }

    /// The routes: `POST /v1/infer`, `GET /healthz`, `GET /readyz`, `GET
    /// /metrics`; JSON 404 elsewhere, 405 for another method.
    pub fn router(&self) -> Router {
        let json405 = || async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: POST /v1/infer; GET /healthz, /readyz, /metrics",
            )
        };
        Router::new()
            .route("/v1/infer", post(infer).fallback(json405))
            .route("/healthz", get(|| async { "ok\n" }).fallback(json405))
            .route("/readyz", get(ready).fallback(json405))
            .route("/metrics", get(scrape).fallback(json405))
            .fallback(|| async {
                error(
                    StatusCode::NOT_FOUND,
                    "not found: POST /v1/infer; GET /healthz, /readyz, /metrics",
                )
            })
            .with_state(self.clone())
    }

    /// Stops being ready: `/readyz` answers 503 and new inferences 503
    /// (requests already accepted are answered).
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    /// Drains ([`Service::start_draining`]), answers every queued request
    /// and stops the stream.
    pub async fn shutdown(&self) {
        self.start_draining();
        self.inner.stream.shutdown().await;
    }

    fn now(&self) -> f64 {
        self.inner.epoch.elapsed().as_secs_f64()
    }

    fn overloaded(&self) -> Response {
        let i = &self.inner;
        let rate = i
            .drain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rate(self.now());
        let backlog = i.in_flight.load(Ordering::Relaxed) as usize;
        let secs = retry_after(backlog, rate, i.cfg.max_retry_after);
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "overloaded: the queue of {} requests is full; retry after {secs} s",
                i.stream.capacity()
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        r
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        "coexec_request_duration_seconds",
        Unit::Seconds,
        "Inference requests, arrival to answer, by outcome (as coexec_requests_total)."
    );
    describe_histogram!(
        "coexec_request_queue_duration_seconds",
        Unit::Seconds,
        "Time an input row waited before its batch's job started (one sample per row, its batch's mean; a request of n rows counts n times)."
    );
    describe_histogram!(
        "coexec_request_inference_duration_seconds",
        Unit::Seconds,
        "Time of an input row's batch job and delivery (one sample per row; a request of n rows counts n times)."
    );
    describe_histogram!(
        "coexec_batch_size",
        Unit::Count,
        "Input rows per batch (a request of n rows brings n)."
    );
    describe_gauge!(
        "coexec_queue_size",
        Unit::Count,
        "Input rows waiting in the stream's queue, not yet in a batch."
    );
    describe_counter!(
        "coexec_requests_total",
        Unit::Count,
        "Inference requests by outcome: success, invalid, overloaded, deadline, failed, unavailable."
    );
    // Every outcome from the start, at 0: `rate()` and `increase()` then
    // see a series' first requests, and an alert its first burst.
    for o in OUTCOMES {
        counter!("coexec_requests_total", "outcome" => o).increment(0);
    }
}

async fn ready(State(svc): State<Service>) -> Response {
    if svc.inner.draining.load(Ordering::Acquire) {
        error(StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        "ready\n".into_response()
    }
}

async fn scrape(State(svc): State<Service>) -> Response {
    let i = &svc.inner;
    gauge!("coexec_queue_size").set(i.stream.queued() as f64);
    i.metrics.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&i.metrics),
    )
        .into_response()
}

async fn infer(State(svc): State<Service>, headers: HeaderMap, body: Body) -> Response {
    let t0 = Instant::now();
    let r = infer_inner(&svc, &headers, body).await;
    let o = outcome_of(&r);
    counter!("coexec_requests_total", "outcome" => o).increment(1);
    histogram!("coexec_request_duration_seconds", "outcome" => o)
        .record(t0.elapsed().as_secs_f64());
    r
}

/// Why a request body was not read.
#[derive(Debug, PartialEq)]
enum BodyFault {
    /// Over `limit` bytes, by its `Content-Length` or as it arrived.
    TooLarge,
    /// Not all there within [`BODY_DEADLINE`].
    Stalled,
    /// The connection failed while reading it.
    Read(String),
}

/// Reads a body of at most `limit` bytes within `deadline`. A declared
/// length over the limit is refused before any of the body is read (a
/// client that sent `Expect: 100-continue` is not asked for it).
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, BodyFault> {
    use http_body_util::{BodyExt, LengthLimitError, Limited};
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyFault::TooLarge);
    }
    match tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await {
        Err(_) => Err(BodyFault::Stalled),
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyFault::TooLarge),
        Ok(Err(e)) => Err(BodyFault::Read(e.to_string())),
    }
}

/// The first value of `rows` that is not a finite `f32` (JSON numbers past
/// ±3.4e38 become infinite when read as one; an overflowing model's outputs
/// are infinite or NaN), as (row, column).
fn first_non_finite(rows: &[Vec<f32>]) -> Option<(usize, usize)> {
    rows.iter()
        .enumerate()
        .find_map(|(k, r)| r.iter().position(|x| !x.is_finite()).map(|j| (k, j)))
}

async fn infer_inner(svc: &Service, headers: &HeaderMap, body: Body) -> Response {
    let i = &svc.inner;
    let body = match read_body(headers, body, i.cfg.max_body, BODY_DEADLINE).await {
        Ok(b) => b,
        Err(fault) => {
            let (status, why) = match fault {
                BodyFault::TooLarge => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body over the limit of {} bytes", i.cfg.max_body),
                ),
                BodyFault::Stalled => (
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the body did not arrive within {} s",
                        BODY_DEADLINE.as_secs()
                    ),
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
            return r;
        }
    };
    // Under overload most requests are turned away, and the parse is a
    // large part of a request's cost on the handlers (a third of a 200's,
    // by `perf`): a request whose rows (counted by their brackets) cannot
    // fit is refused before it.
    // One that could never fit is left to the parse, to get its 400.
    let most = i.cfg.max_inputs.min(i.stream.capacity());
    let rows = rows_in(&body);
    if rows <= most
        && i.stream.queued() + rows > i.stream.capacity()
        && !i.draining.load(Ordering::Acquire)
    {
        return svc.overloaded();
    }
    // serde's derived structs also take a JSON array of their fields
    // (`[[[...]], 100]`): only an object is the documented form.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return error(
            StatusCode::BAD_REQUEST,
            format!("expected {EXPECTED}: the body is not a JSON object"),
        );
    }
    let req: InferRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, format!("expected {EXPECTED}: {e}"));
        }
    };
    let f = i.weights.inputs();
    if req.inputs.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("expected {EXPECTED}: `inputs` is empty"),
        );
    }
    // More rows than the queue holds could never be accepted.
    if req.inputs.len() > most {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{} inputs in one request; at most {most}", req.inputs.len()),
        );
    }
    if let Some((k, row)) = req.inputs.iter().enumerate().find(|(_, r)| r.len() != f) {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "expected {f} numbers per input: inputs[{k}] has {}",
                row.len()
            ),
        );
    }
    if let Some((k, j)) = first_non_finite(&req.inputs) {
        return error(
            StatusCode::BAD_REQUEST,
            format!(
                "expected finite numbers within f32's range (±3.4e38): inputs[{k}][{j}] is not"
            ),
        );
    }
    if i.draining.load(Ordering::Acquire) {
        return draining();
    }
    let rows = req.inputs.len();
    let deadline = req
        .deadline_ms
        .map(Duration::from_millis)
        .or(i.cfg.deadline)
        .map(|d| Instant::now() + d);
    // All the request's rows are queued, or none: a refused request leaves
    // nothing in the queue. (A deadline already past is checked first: 504
    // before 503.)
    let admitted = match deadline {
        Some(d) => i.stream.try_infer_many_by(req.inputs, d),
        None => i.stream.try_infer_many(req.inputs),
    };
    let pending: Vec<Pending<Vec<f32>>> = match admitted {
        Ok(pending) => pending,
        Err(rejected) => match rejected.error() {
            StreamError::Overloaded { .. } => return svc.overloaded(),
            StreamError::DeadlinePassed => {
                return error(StatusCode::GATEWAY_TIMEOUT, "deadline passed");
            }
            // Not reached: more rows than `most` got their 400 above.
            e @ StreamError::TooMany { .. } => {
                return error(StatusCode::BAD_REQUEST, e.to_string())
            }
            _ => return draining(),
        },
    };
    gauge!("coexec_queue_size").set(i.stream.queued() as f64);
    let _counted = Counted::new(&i.in_flight, rows as u64);
    let mut outputs = Vec::with_capacity(rows);
    let mut failure = None;
    for p in pending {
        match p.await {
            Ok(probs) => outputs.push(probs),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    i.drain
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .answered(rows as u64, svc.now());
    // Finite inputs can still be large enough to overflow the model's
    // arithmetic: such a row has no meaningful answer, not a `null` one.
    if failure.is_none() {
        if let Some((k, _)) = first_non_finite(&outputs) {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "inputs[{k}]: the model's output overflows for this input \
                     (its values are far outside the model's range)"
                ),
            );
        }
    }
    match failure {
        None => {
            let outputs = outputs
                .iter()
                .map(|p| Output {
                    label: argmax(p).unwrap_or(0),
                    probs: p,
                })
                .collect();
            match serde_json::to_string(&InferResponse { outputs }) {
                Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        Some(StreamError::DeadlinePassed) => error(StatusCode::GATEWAY_TIMEOUT, "deadline passed"),
        Some(StreamError::Overloaded { .. }) => svc.overloaded(),
        Some(StreamError::Closed) => error(StatusCode::SERVICE_UNAVAILABLE, "the stream closed"),
        Some(e) => {
            tracing::error!("inference failed: {e}");
            error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

/// Serves `app` on `listener` until `signal` completes; then accepts the
/// connections already in the listen queue (they get an answer, not a
/// reset), stops accepting, lets open connections go on for up to
/// [`DRAIN_GRACE`] (a draining [`Service`] answers their requests 503 with
/// `Connection: close`), and returns once every connection's requests are
/// answered.
///
/// Each connection is its own task; request heads are bounded in size and
/// time. At most [`MAX_CONNECTIONS`] are served at once (at shutdown, the
/// ones still in the listen queue come on top): a client past that takes
/// the slot of the keep-alive connection idle longest, which is closed (a
/// request its client sends just then is lost, as on any server that
/// closes idle connections), so idle connections cannot lock new clients
/// out; while every connection has a request in progress, it waits. Use a
/// loopback address unless the service is meant to be reachable from
/// elsewhere.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send,
) {
    serve_bounded(listener, app, signal, MAX_CONNECTIONS).await;
}

/// [`serve`] with at most `max_connections` connections at once (at least
/// one) instead of [`MAX_CONNECTIONS`].
pub async fn serve_bounded(
    listener: tokio::net::TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send,
    max_connections: usize,
) {
    let (stop_tx, stop) = watch::channel(false);
    let service = TowerToHyperService::new(app);
    let slots = Arc::new(Semaphore::new(
        max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let open = Arc::new(Connections::default());
    let mut conns = tokio::task::JoinSet::new();
    let spawn = |conns: &mut tokio::task::JoinSet<()>,
                 (permit, stream): (Option<OwnedSemaphorePermit>, TcpStream)| {
        let service = service.clone();
        let mut stop = stop.clone();
        let open = open.clone();
        conns.spawn(async move {
            let requests = Arc::new(Requests::default());
            let _open = open.open(requests.clone());
            let evicted = requests.clone();
            let io = HeadDeadline::new(stream, requests.clone(), HEAD_DEADLINE);
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let running = requests.start();
                let (parts, body) = req.into_parts();
                let (body, read) = WatchedBody::new(body);
                let answer = service.call(hyper::Request::from_parts(parts, body));
                async move {
                    let mut answer = answer.await;
                    drop(running);
                    // A body left unread would be drained after the answer,
                    // untimed: close instead (a wrong path or method).
                    if let Ok(r) = &mut answer {
                        if !read.load(Ordering::Acquire) {
                            r.headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("close"));
                        }
                    }
                    answer
                }
            });
            // hyper's head timeout runs from when it starts waiting for a
            // head, idle time included: here it is the idle timeout, and
            // `HeadDeadline` times the head itself.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection: {e}");
                    }
                }
                () = async {
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => {}
                        () = evicted.evict.notified() => {}
                    }
                } => {
                    // Finish the request in progress, then close.
                    conn.as_mut().graceful_shutdown();
                    if let Err(e) = conn.await {
                        tracing::debug!("connection: {e}");
                    }
                }
            }
            drop(permit);
        });
    };
    let mut signal = std::pin::pin!(signal);
    // A client accepted while every slot was taken: it gets the slot of the
    // connection idle longest, asked to close, or the next one freed.
    let mut waiting: Option<TcpStream> = None;
    // When a connection was last asked to close for it: another is asked
    // only when none was idle then, or that one has not closed within
    // `EVICT_AGAIN` (a request slipped in before it closed).
    let mut evicted: Option<tokio::time::Instant> = None;
    loop {
        while conns.try_join_next().is_some() {}
        let c = tokio::select! {
            () = &mut signal => break,
            s = crate::net::accept(&listener, "service"), if waiting.is_none() => {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => (Some(p), s),
                    Err(_) => {
                        evicted = open.evict_idlest().then(tokio::time::Instant::now);
                        waiting = Some(s);
                        continue;
                    }
                }
            }
            p = slots.clone().acquire_owned(), if waiting.is_some() => match (p, waiting.take()) {
                (Ok(p), Some(s)) => (Some(p), s),
                _ => break,
            },
            // Every connection was busy: look again for one gone idle.
            () = tokio::time::sleep(EVICT_RETRY), if waiting.is_some() => {
                if evicted.is_none_or(|t| t.elapsed() >= EVICT_AGAIN) {
                    evicted = open.evict_idlest().then(tokio::time::Instant::now);
                }
                continue;
            }
        };
        spawn(&mut conns, c);
    }
    // Accepted before the signal: answered, even one slot over the limit.
    if let Some(s) = waiting.take() {
        spawn(&mut conns, (slots.clone().try_acquire_owned().ok(), s));
    }
    // The kernel completed these connections' handshakes: closing the
    // listener would reset them, and a client that already sent its request
    // would lose it (seen under load: 1 request in 6900). Taken over the
    // limit if need be: there are only as many as the listen queue held.
    while let Ok(c) =
        tokio::time::timeout(Duration::ZERO, crate::net::accept(&listener, "service")).await
    {
        spawn(&mut conns, (slots.clone().try_acquire_owned().ok(), c));
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
}

/// Binds `addr` (warning when it is not a loopback address).
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    if !addr.ip().is_loopback() {
        tracing::warn!("serving on {addr}: reachable from other machines, without authentication");
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections whose handshake the kernel completed before the signal
    /// are answered, not reset when the listener closes: the signal is
    /// ready from the start, so the accept loop may take none of them
    /// (before, each was lost with probability about a half).
    #[test]
    fn connections_queued_at_the_signal_get_an_answer() {
        use std::io::{Read, Write};
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let mut clients: Vec<std::net::TcpStream> = (0..4)
            .map(|_| {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.write_all(b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                    .unwrap();
                c
            })
            .collect();
        std_listener.set_nonblocking(true).unwrap();
        tokio.block_on(async {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            let app = Router::new().route("/x", get(|| async { "answered" }));
            tokio::time::timeout(
                Duration::from_secs(10),
                serve(listener, app, std::future::ready(())),
            )
            .await
            .expect("serve returns");
        });
        for c in &mut clients {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut answer = String::new();
            c.read_to_string(&mut answer)
                .expect("an answer, not a reset");
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
            assert!(answer.ends_with("answered"), "{answer:?}");
        }
    }

    /// Past the connection limit, a new client takes the slot of the
    /// keep-alive connection idle longest (never one with a head or a
    /// request in progress), instead of waiting for it to time out.
    #[test]
    fn a_client_past_the_limit_takes_the_slot_of_the_connection_idle_longest() {
        use std::io::{Read, Write};
        use std::net::TcpStream;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = std::thread::spawn(move || {
            let tokio = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            tokio.block_on(async {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let app = Router::new().route("/x", get(|| async { "answered" }));
                let signal = async {
                    let _ = stopped.await;
                };
                serve_bounded(listener, app, signal, 2).await;
            });
        });
        const HEAD: &[u8] = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n";
        let connect = || {
            let c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c
        };
        // One answer on a keep-alive connection (a timeout fails the test).
        let answer = |c: &mut TcpStream| {
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            while !got.ends_with(b"answered") {
                let n = c.read(&mut buf).expect("an answer in time");
                assert!(n > 0, "closed before the answer: {got:?}");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
        };
        // Closed by the server: end of stream or a reset, not a timeout.
        let closed = |c: &mut TcpStream| match c.read(&mut [0u8; 64]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        let pause = || std::thread::sleep(Duration::from_millis(20));
        let (mut a, mut b) = (connect(), connect());
        a.write_all(HEAD).unwrap();
        answer(&mut a);
        pause();
        b.write_all(HEAD).unwrap();
        answer(&mut b);
        pause();
        // Both slots hold idle connections; a third client is answered.
        let mut c = connect();
        c.write_all(HEAD).unwrap();
        answer(&mut c);
        assert!(closed(&mut a), "the connection idle longest was closed");
        // b, idle longer than c, is reading a head: a fourth client takes
        // c's slot, not b's.
        b.write_all(b"GET /x HTTP/1.1\r\n").unwrap();
        pause();
        let mut d = connect();
        d.write_all(HEAD).unwrap();
        answer(&mut d);
        assert!(closed(&mut c), "the idle connection was closed");
        b.write_all(b"host: t\r\n\r\n").unwrap();
        answer(&mut b);
        let _ = stop.send(());
        drop((b, d));
        server.join().unwrap();
    }

    #[test]
    fn rows_are_counted_by_their_brackets() {
        assert_eq!(rows_in(br#"{"inputs": [[1, 2], [3, 4], [5, 6]]}"#), 3);
        assert_eq!(rows_in(br#"{"inputs":[[0.5]],"deadline_ms":10}"#), 1);
        assert_eq!(rows_in(b"not json"), 1);
    }

    #[test]
    fn retry_after_follows_the_backlog_and_the_drain_rate() {
        let cap = Duration::from_secs(30);
        assert_eq!(retry_after(1000, 100.0, cap), 10);
        assert_eq!(retry_after(1001, 100.0, cap), 11);
        assert_eq!(retry_after(10, 1000.0, cap), 1, "at least 1 s");
        assert_eq!(retry_after(1_000_000, 10.0, cap), 30, "capped");
        assert_eq!(retry_after(5, 0.0, cap), 1, "nothing measured yet");
    }

    /// A first burst after a quiet start is measured over the burst, not
    /// over the quiet time (before: 30 s `Retry-After` for a backlog that
    /// drained in milliseconds, on a server idle for its first 10 s).
    #[test]
    fn drain_rate_after_a_quiet_spell_measures_the_burst() {
        let mut d = DrainRate::default();
        d.answered(100, 10.0);
        assert_eq!(d.rate(10.01), 0.0, "too short to tell");
        d.answered(900, 10.1);
        assert!((d.rate(10.1) - 10_000.0).abs() < 1e-6, "{}", d.rate(10.1));
        d.answered(4000, 10.5);
        assert!((d.rate(10.5) - 10_000.0).abs() < 1e-6, "{}", d.rate(10.5));
        assert_eq!(retry_after(5000, d.rate(10.5), Duration::from_secs(30)), 1);
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn with_length(n: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        h
    }

    #[test]
    fn a_body_is_read_within_its_limit_and_deadline() {
        let limit = 8;
        let d = Duration::from_secs(5);
        let ok = block_on(read_body(&with_length(5), Body::from("12345"), limit, d));
        assert_eq!(ok.unwrap(), Bytes::from("12345"));
        // Declared over the limit: refused before reading (this body would
        // never end).
        let (_tx, never) = http_body_util::Channel::<Bytes, std::io::Error>::new(1);
        let r = block_on(read_body(&with_length(9), Body::new(never), limit, d));
        assert_eq!(r, Err(BodyFault::TooLarge));
        // Undeclared (chunked) and over the limit as it arrives.
        let r = block_on(read_body(
            &HeaderMap::new(),
            Body::from("123456789"),
            limit,
            d,
        ));
        assert_eq!(r, Err(BodyFault::TooLarge));
    }

    #[test]
    fn a_stalled_body_ends_at_its_deadline() {
        let (mut tx, body) = http_body_util::Channel::<Bytes, std::io::Error>::new(1);
        let t = Instant::now();
        let r = block_on(async move {
            tx.send_data(Bytes::from("{")).await.unwrap();
            // `tx` lives on: the body neither ends nor fails.
            let r = read_body(
                &with_length(100),
                Body::new(body),
                1024,
                Duration::from_millis(100),
            )
            .await;
            drop(tx);
            r
        });
        assert_eq!(r, Err(BodyFault::Stalled));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn non_finite_inputs_are_found_by_row_and_column() {
        assert_eq!(first_non_finite(&[vec![1.0, 2.0], vec![0.0, 3e38]]), None);
        assert_eq!(
            first_non_finite(&[vec![1.0, 2.0], vec![0.0, f32::INFINITY]]),
            Some((1, 1))
        );
        assert_eq!(first_non_finite(&[vec![f32::NAN]]), Some((0, 0)));
    }

    #[test]
    fn drain_rate_measures_windows_and_decays_when_idle() {
        let mut d = DrainRate::default();
        assert_eq!(d.rate(0.1), 0.0);
        d.answered(100, 0.25);
        d.answered(100, 0.5);
        assert!((d.rate(0.5) - 400.0).abs() < 1e-9);
        d.answered(100, 1.0);
        assert!(
            (d.rate(1.0) - 300.0).abs() < 1e-9,
            "smoothed: {}",
            d.rate(1.0)
        );
        // Nothing answered for 10 s: the estimate falls.
        assert!(d.rate(11.0) < 30.0, "{}", d.rate(11.0));
    }
}
