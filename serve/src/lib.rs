//! An HTTP inference service over a [`Stream`] of any [`ServeModel`]: the
//! JSON of a request and of its answer are the model's input and output
//! types (serde). `coexec serve` runs it with an MLP classifier
//! (`stream::MlpModel`, feature `workloads`: an input is a row of numbers,
//! an output a label and its class probabilities).
//!
//! ```text
//!  POST /v1/infer {"inputs": [Input, ...]} ──try_infer_many_by──▶ Stream ──batches──▶ Runtime
//!       ◀── {"outputs": [Output, ...]} (one per input, in order)
//!  GET /healthz (alive) · GET /readyz (503 while draining) · GET /metrics (Prometheus, when given one)
//! ```
//!
//! Every request gets an answer, never a panic: malformed JSON or an input
//! the model refuses ([`Model::check_input`](coexec::stream::Model::check_input)) 400, naming what was
//! expected (for an MLP: the width it takes, and finite `f32` numbers;
//! also an input so large that the model's output overflows, never a
//! `null` probability), a body over the limit 413 (refused by its
//! `Content-Length` before it is read), a body not all there 10 s after
//! the head 408, a wrong method 405, an unknown path 404, a full queue 429
//! with a `Retry-After` from the backlog and the measured drain rate (so
//! does a request the memory budget cannot cover now,
//! [`ServeConfig::memory_budget`]), a passed deadline 504.
//!
//! Embed the router in your own axum app ([`Service::router`]), or run it
//! on a listener with [`serve`], which stops accepting on a signal and
//! answers every request it accepted. The service records its metrics
//! through whatever recorder the application installed; `/metrics` is
//! among its routes when it is given a Prometheus handle
//! ([`ServeConfig::prometheus`], for instance coexec's own recorder from
//! [`metrics::install`]):
//!
//! ```no_run
//! # #[cfg(feature = "workloads")]
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use coexec::kernels::workloads::MlpWeights;
//! use coexec_serve::{ServeConfig, Service};
//! use coexec::stream::{MlpModel, StreamConfig};
//!
//! let prometheus = coexec_serve::metrics::install()?; // the application's choice
//! let rt = Arc::new(coexec::Runtime::builder().devices("cpu:1,sim:1@0.5")?.start().await?);
//! let weights = Arc::new(MlpWeights::load("examples/models/digits_mlp.safetensors")?);
//! let cfg = ServeConfig::new().prometheus(prometheus);
//! let svc = Service::start(rt, MlpModel::new(weights), StreamConfig::new(), cfg)?;
//! let app = axum::Router::new().merge(svc.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! coexec_serve::serve(listener, app, async { let _ = tokio::signal::ctrl_c().await; }).await;
//! svc.shutdown().await; // answers everything queued
//! # Ok(()) }
//! # #[cfg(not(feature = "workloads"))]
//! # fn main() {}
//! ```

#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;

use coexec::stream::{Stream, StreamConfig};
use coexec::{Error, Runtime};
mod body;
mod bounded;
mod budget;
mod error;
mod exporter;
mod infer;
mod model;
mod net;
#[cfg(feature = "tei")]
mod tei;
#[cfg(feature = "telemetry")]
mod telemetry;
#[cfg(test)]
mod tests;

/// coexec's Prometheus recorder, for the application to install, its
/// `/metrics` server, and the GPUs' telemetry
/// ([`GpuTelemetry`](metrics::GpuTelemetry)).
///
/// The `metrics` crate has one global recorder per process, and a library
/// must not take it behind the application's back: coexec installs its own
/// only when asked ([`install`](metrics::install),
/// [`MetricsServer::start`](metrics::MetricsServer::start)). Without any
/// recorder coexec's metrics cost nothing; with another recorder the
/// application installed, they go to it.
pub mod metrics {
    pub use crate::exporter::{MetricsServer, install};
    #[cfg(feature = "telemetry")]
    pub use crate::telemetry::GpuTelemetry;
}

pub use model::ServeModel;
#[cfg(feature = "tei")]
pub use tei::BLOCKING_BYTES;

pub use crate::net::server::{
    DRAIN_GRACE, DRAIN_TIMEOUT, Drained, MAX_CONNECTIONS, ServerConfig, bind, serve, serve_with,
};
use error::{ErrorResponse, ErrorType};
use infer::{DrainRate, OUTCOMES, infer, retry_after};

/// The service's limits. Build with [`ServeConfig::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// let cfg = coexec_serve::ServeConfig::new()
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
    body_deadline: Duration,
    memory_budget: u64,
    prometheus: Option<PrometheusHandle>,
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    served_model_name: Option<String>,
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    max_embed_all_values: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ServeConfig {
    /// Bodies up to 2 MiB arriving within 10 s, 1024 inputs per request,
    /// no default deadline, `Retry-After` at most 30 s, a memory budget of
    /// 1 GiB, `/embed_all` answers of at most 2²⁴ values.
    pub fn new() -> Self {
        Self {
            max_body: 2 << 20,
            max_inputs: 1024,
            deadline: None,
            max_retry_after: Duration::from_secs(30),
            body_deadline: body::BODY_DEADLINE,
            memory_budget: 1 << 30,
            prometheus: None,
            served_model_name: None,
            max_embed_all_values: 1 << 24,
        }
    }

    /// The most values one `POST /embed_all` answer may hold: its inputs'
    /// tokens × the model's hidden width (default 2²⁴, 16 777 216: 64 MiB
    /// as `f32`, some 250 MiB of JSON; 128 inputs of 512 tokens on a
    /// model 256 wide). A request past it is refused with TEI's 422
    /// `Validation` once its texts are tokenised, before anything runs;
    /// one within it holds 24 bytes a value of the memory budget
    /// ([`ServeConfig::memory_budget`]) until its answer is written (the
    /// vectors, their copy and their JSON), and gets 429 while the budget
    /// cannot cover that.
    #[cfg(feature = "tei")]
    pub fn max_embed_all_values(mut self, values: usize) -> Self {
        self.max_embed_all_values = values;
        self
    }

    /// The model's name on TEI's routes: `/info`'s `served_model_name`
    /// and `/v1/embeddings`' `model` (TEI's `--served-model-name`;
    /// default: the model's id).
    #[cfg(feature = "tei")]
    pub fn served_model_name(mut self, name: impl Into<String>) -> Self {
        self.served_model_name = Some(name.into());
        self
    }

    /// The bytes the requests in progress may hold at once, by an upper
    /// estimate from each body's length (default 1 GiB): a request's
    /// body and what is parsed from it, and for the tokenizer routes
    /// (`/tokenize`, `/decode`) their answers, some 170 bytes a token.
    /// One budget for every route, shared with the queue's admission: a
    /// request it cannot cover now gets 429, as a full queue does; one
    /// larger than all of it waits until it can run alone.
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Serves `GET /metrics` from `handle`: the recorder the application
    /// installed (coexec's own from [`crate::metrics::install`], or one it
    /// built). Without it the router has no `/metrics`, and the
    /// application serves its metrics where it likes.
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// Largest request body in bytes (larger: 413).
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Longest a client may take to send a request body once its head is
    /// in (default 10 s; then 408 and the connection closes): a stalled
    /// upload holds a connection slot, and a drain, no longer than this.
    pub fn body_deadline(mut self, d: Duration) -> Self {
        self.body_deadline = d;
        self
    }

    /// Most inputs in one request (more: 400 on `/v1/infer`, 422 on TEI's
    /// routes, as TEI 1.9's), refused as the body is read, at the first
    /// input past it.
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

    /// The largest `Retry-After` a 429 suggests.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.max_retry_after = d;
        self
    }

    /// The body limit set.
    pub fn max_body_len(&self) -> usize {
        self.max_body
    }
}

struct Inner<M: ServeModel> {
    stream: Stream<Arc<M>>,
    model: Arc<M>,
    /// The runtime the stream runs on, for the jobs a route runs itself
    /// (`/embed_all`'s). Weak: the stream's batcher holds it while it
    /// runs, and the caller's `Arc` unwraps for [`Runtime::shutdown`] once
    /// the service has shut down.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    rt: Weak<Runtime>,
    /// Inputs of those jobs, running or waiting for the runtime: they take
    /// places of the queue as its own inputs do.
    direct: AtomicUsize,
    cfg: ServeConfig,
    /// `/readyz` answers 200 (until a drain begins or `set_ready(false)`).
    ready: AtomicBool,
    draining: AtomicBool,
    epoch: Instant,
    drain: Mutex<DrainRate>,
    /// Rows accepted and not yet answered.
    in_flight: AtomicU64,
    /// What the requests in progress hold ([`ServeConfig::memory_budget`]).
    budget: Arc<budget::Budget>,
    /// The stream's batch limits, for `/info`.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    batch_len: usize,
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    batch_cost: Option<usize>,
    /// Whether the runtime has CPU (or simulated) classes, and GPU ones:
    /// TEI's `x-compute-type`.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    devices: (bool, bool),
}

/// The inference service: a [`Stream`] of a [`ServeModel`] and the HTTP
/// handlers in front of it. Cheap to clone.
pub struct Service<M: ServeModel> {
    inner: Arc<Inner<M>>,
}

impl<M: ServeModel> Clone for Service<M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<M: ServeModel> std::fmt::Debug for Service<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("stream", &self.inner.stream)
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl<M: ServeModel> Service<M> {
    /// Starts a stream of `model` on `rt` (its batches timed into the
    /// service's metrics) and the service over it. Installs no metrics
    /// recorder: the service records into the one the application
    /// installed, if any.
    pub fn start(
        rt: Arc<Runtime>,
        model: M,
        stream: StreamConfig,
        cfg: ServeConfig,
    ) -> Result<Self, Error> {
        describe();
        let stream = stream.on_batch(|t| {
            let n = t.size.max(1);
            histogram!("coexec_batch_size").record(t.size as f64);
            #[cfg(feature = "tei")]
            histogram!("te_batch_next_size").record(t.size as f64);
            histogram!("coexec_request_queue_duration_seconds")
                .record_many((t.total_wait + t.prepare).as_secs_f64() / n as f64, n);
            histogram!("coexec_request_inference_duration_seconds")
                .record_many((t.run + t.deliver).as_secs_f64(), n);
        });
        let model = Arc::new(model);
        let (batch_len, batch_cost) = (stream.max_batch_len(), stream.max_batch_cost_limit());
        let gpu = |c: &coexec::ClassInfo| matches!(c.kind, coexec::DeviceKind::Cuda { .. });
        let devices = (
            rt.classes().iter().any(|c| !gpu(c)),
            rt.classes().iter().any(gpu),
        );
        let weak = Arc::downgrade(&rt);
        let stream = Stream::start(rt, model.clone(), stream)?;
        let budget = budget::Budget::new(cfg.memory_budget);
        Ok(Self {
            inner: Arc::new(Inner {
                stream,
                model,
                rt: weak,
                direct: AtomicUsize::new(0),
                cfg,
                ready: AtomicBool::new(true),
                draining: AtomicBool::new(false),
                epoch: Instant::now(),
                drain: Mutex::new(DrainRate::default()),
                in_flight: AtomicU64::new(0),
                budget,
                batch_len,
                batch_cost,
                devices,
            }),
        })
    }

    /// The model served.
    pub fn model(&self) -> &M {
        &self.inner.model
    }

    /// Runs the model once on each of `rt`'s device classes alone
    /// ([`Runtime::warm_up`], nothing learned) on its
    /// [`ServeModel::warm_up_inputs`], so that the first requests do not
    /// pay a device's first-use costs: call it before listening. `rt` is
    /// the runtime the service was started on. Returns each class's name
    /// and how long it took; nothing where the model gives no inputs.
    pub async fn warm_up(&self, rt: &Runtime) -> Result<Vec<(String, Duration)>, Error> {
        let m = self.model();
        if m.warm_up_inputs(1).is_empty() {
            return Ok(Vec::new());
        }
        rt.warm_up(|n| m.build(m.warm_up_inputs(n))).await
    }

    /// The routes: `POST /v1/infer`, `GET /healthz`, `GET /readyz`, and
    /// `GET /metrics` when given a handle ([`ServeConfig::prometheus`]);
    /// JSON 404 elsewhere, 405 for another method. Merge it into an app
    /// with routes of its own, or add a fallback after it
    /// ([`Router::fallback`] replaces this one).
    pub fn router(&self) -> Router {
        let routes: &'static str = if self.inner.cfg.prometheus.is_some() {
            "POST /v1/infer; GET /healthz, /readyz, /metrics"
        } else {
            "POST /v1/infer; GET /healthz, /readyz"
        };
        self.router_with(Router::new(), routes)
    }

    /// [`Service::router`]'s routes and `extra`, with `routes` (all of
    /// them) named in the 404s and 405s.
    fn router_with(&self, extra: Router<Self>, routes: &'static str) -> Router {
        let json405 = move || async move { method_not_allowed(routes) };
        let mut r = extra
            .route("/v1/infer", post(infer::<M>).fallback(json405))
            .route("/healthz", get(|| async { "ok\n" }).fallback(json405))
            .route("/readyz", get(ready::<M>).fallback(json405));
        if self.inner.cfg.prometheus.is_some() {
            r = r.route("/metrics", get(scrape::<M>).fallback(json405));
        }
        r.fallback(move || async move {
            ErrorResponse::new(ErrorType::Validation, format!("not found: {routes}"))
                .with_status(StatusCode::NOT_FOUND)
        })
        .with_state(self.clone())
    }

    /// Stops being ready: `/readyz` answers 503 and new inferences 503
    /// (requests already accepted are answered).
    pub fn start_draining(&self) {
        self.set_ready(false);
        self.inner.draining.store(true, Ordering::Release);
    }

    /// Whether `/readyz` answers 200; inferences are served either way.
    /// For the drain delay a load balancer needs: not ready at once on
    /// SIGTERM, so that it stops routing here, while the requests it still
    /// sends meanwhile are answered; then [`Service::start_draining`].
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
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

    /// The queue's free places: its capacity less the inputs waiting in it
    /// and those of the jobs the routes run themselves.
    fn room(&self) -> usize {
        let i = &self.inner;
        i.stream
            .capacity()
            .saturating_sub(i.stream.queued() + i.direct.load(Ordering::Relaxed))
    }

    /// The 429 of a full queue.
    fn overloaded(&self) -> ErrorResponse {
        let why = format!(
            "the queue of {} requests is full",
            self.inner.stream.capacity()
        );
        self.overloaded_because(&why)
    }

    /// `bytes` of the memory budget for a request, or its 429.
    fn take_budget(&self, bytes: u64) -> Result<budget::Held, ErrorResponse> {
        let b = &self.inner.budget;
        b.try_take(bytes).ok_or_else(|| {
            self.overloaded_because(&format!(
                "the requests in progress hold {} of the {} bytes they may take at once, \
                 and this one needs {bytes} more",
                b.held(),
                b.limit()
            ))
        })
    }

    /// 429 `overloaded: <why>; retry after N s`, with its `Retry-After`.
    fn overloaded_because(&self, why: &str) -> ErrorResponse {
        let i = &self.inner;
        let rate = i
            .drain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rate(self.now());
        let backlog = i.in_flight.load(Ordering::Relaxed) as usize;
        let secs = retry_after(backlog, rate, i.cfg.max_retry_after);
        // 429, not 503: a full queue is this moment's load, not the
        // service failing; a 5xx would burn availability budgets, make
        // proxies eject the pod and trigger `retry_on: 5xx` retries.
        ErrorResponse::overloaded(format!("overloaded: {why}; retry after {secs} s"), secs)
    }
}

/// 405 `Validation`, naming the routes there are.
fn method_not_allowed(routes: &'static str) -> ErrorResponse {
    ErrorResponse::new(
        ErrorType::Validation,
        format!("method not allowed: {routes}"),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

/// Text Embeddings Inference's API (see `tei.rs`).
#[cfg(feature = "tei")]
impl Service<coexec_models::Embedder> {
    /// TEI's routes — `POST /embed`, `/embed_all` (every token's vector;
    /// TEI's 424 on a SPLADE model or a classifier), `/embed_sparse` (a
    /// SPLADE model's; TEI's 424 on another), `POST /v1/embeddings` (and
    /// `/embeddings`), `POST /similarity`, `/rerank`, `/predict`,
    /// `/tokenize`, `/decode`, `GET /info`, `GET /health`; SageMaker's and
    /// the Inference API's `POST /` and `/invocations` (`/embed`, or
    /// `/embed_sparse`, `/rerank` or `/predict`, as TEI chooses by the
    /// model) and `GET /`, `/ping` (`/health`); the OpenAPI document at
    /// `GET /api-doc/openapi.json` — and [`Service::router`]'s (token ids
    /// on `/v1/infer`, `/healthz`, `/readyz`, `/metrics` when given a
    /// handle).
    pub fn tei_router(&self) -> Router {
        let routes: &'static str = if self.inner.cfg.prometheus.is_some() {
            "POST /, /invocations, /embed, /embed_all, /embed_sparse, /v1/embeddings, /embeddings, /similarity, /rerank, /predict, /tokenize, /decode, /v1/infer; GET /, /ping, /info, /health, /api-doc/openapi.json, /healthz, /readyz, /metrics"
        } else {
            "POST /, /invocations, /embed, /embed_all, /embed_sparse, /v1/embeddings, /embeddings, /similarity, /rerank, /predict, /tokenize, /decode, /v1/infer; GET /, /ping, /info, /health, /api-doc/openapi.json, /healthz, /readyz"
        };
        let json405 = move || async move { method_not_allowed(routes) };
        let tei = Router::new()
            .route("/embed", post(tei::embed).fallback(json405))
            .route("/embed_all", post(tei::all::embed_all).fallback(json405))
            .route("/embed_sparse", post(tei::embed_sparse).fallback(json405))
            .route("/v1/embeddings", post(tei::openai).fallback(json405))
            .route("/embeddings", post(tei::openai).fallback(json405))
            .route("/similarity", post(tei::similarity).fallback(json405))
            .route("/rerank", post(tei::classify::rerank).fallback(json405))
            .route("/predict", post(tei::classify::predict).fallback(json405))
            .route("/tokenize", post(tei::tokens::tokenize).fallback(json405))
            .route("/decode", post(tei::tokens::decode).fallback(json405))
            .route("/info", get(tei::info).fallback(json405))
            .route("/health", get(tei::health).fallback(json405))
            .route("/", get(tei::health).post(tei::by_model).fallback(json405))
            .route("/invocations", post(tei::by_model).fallback(json405))
            .route("/ping", get(tei::health).fallback(json405))
            .route(
                "/api-doc/openapi.json",
                get(tei::openapi::openapi_json).fallback(json405),
            );
        self.router_with(tei, routes)
    }
}

fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
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
    describe_counter!(
        "coexec_drain_closed_connections_total",
        Unit::Count,
        "Connections still open at the drain's deadline after a signal, closed then (their answers lost)."
    );
    counter!("coexec_drain_closed_connections_total").increment(0);
    #[cfg(feature = "tei")]
    {
        describe_counter!(
            "coexec_embed_tokens_total",
            Unit::Count,
            "Tokens of the texts embedded (answered /embed, /v1/embeddings and /similarity inputs)."
        );
        describe_counter!(
            "coexec_embed_sequences_total",
            Unit::Count,
            "Texts embedded (answered /embed, /v1/embeddings and /similarity inputs)."
        );
        describe_histogram!(
            "coexec_embed_batch_tokens",
            Unit::Count,
            "Tokens per batch of an embedding model."
        );
        describe_tei();
    }
    // Every outcome from the start, at 0: `rate()` and `increase()` then
    // see a series' first requests, and an alert its first burst.
    for o in OUTCOMES {
        counter!("coexec_requests_total", "outcome" => o).increment(0);
    }
}

/// `coexec_queue_size`, and TEI's `te_queue_size` beside it.
fn set_queue_size(rows: usize) {
    gauge!("coexec_queue_size").set(rows as f64);
    #[cfg(feature = "tei")]
    gauge!("te_queue_size").set(rows as f64);
}

/// Text Embeddings Inference's `te_*` series, beside coexec's own, with
/// TEI's names, types and labels, so that TEI's dashboards and alerts read
/// coexec's service unchanged (docs/tei-compat.md).
#[cfg(feature = "tei")]
fn describe_tei() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    for (name, what) in [
        (
            "te_request_count",
            "TEI requests parsed, by method (single, batch).",
        ),
        (
            "te_request_success",
            "TEI requests answered 200, by method.",
        ),
        (
            "te_request_failure",
            "TEI requests refused or failed, by TEI's err label.",
        ),
        ("te_embed_count", "Inputs of embedding requests taken."),
        ("te_embed_success", "Inputs of embedding requests answered."),
        ("te_predict_count", "Inputs of /predict and /rerank taken."),
        (
            "te_predict_success",
            "Inputs of /predict and /rerank answered.",
        ),
    ] {
        describe_counter!(name, Unit::Count, what);
    }
    for kind in ["request", "embed", "predict"] {
        for (part, what) in [
            ("", "arrival (body read) to answer"),
            ("_tokenization", "tokenising"),
            ("_queue", "waiting in the queue"),
            ("_inference", "the batch's inference"),
        ] {
            let per = if kind == "request" {
                "a request (its inputs' mean)"
            } else {
                "an input"
            };
            describe_histogram!(
                format!("te_{kind}{part}_duration"),
                Unit::Seconds,
                format!("Seconds of {per}: {what}.")
            );
        }
    }
    describe_histogram!(
        "te_request_input_length",
        Unit::Count,
        "Tokens of each input."
    );
    describe_histogram!("te_batch_next_size", Unit::Count, "Inputs per batch.");
    describe_histogram!("te_batch_next_tokens", Unit::Count, "Tokens per batch.");
    describe_gauge!("te_queue_size", Unit::Count, "Inputs waiting in the queue.");
}

async fn ready<M: ServeModel>(
    State(svc): State<Service<M>>,
) -> Result<&'static str, ErrorResponse> {
    let i = &svc.inner;
    let unhealthy = |why| Err(ErrorResponse::new(ErrorType::Unhealthy, why));
    if i.draining.load(Ordering::Acquire) {
        unhealthy("draining")
    } else if !i.ready.load(Ordering::Acquire) {
        unhealthy("not ready: shutting down")
    } else {
        Ok("ready\n")
    }
}

async fn scrape<M: ServeModel>(State(svc): State<Service<M>>) -> Result<Response, ErrorResponse> {
    let i = &svc.inner;
    let Some(h) = &i.cfg.prometheus else {
        return Err(ErrorResponse::new(ErrorType::Validation, "no metrics here")
            .with_status(StatusCode::NOT_FOUND));
    };
    set_queue_size(i.stream.queued());
    h.run_upkeep();
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        h.render(),
    )
        .into_response())
}
