//! The Prometheus exporter: `/metrics` over HTTP/1.1, served by axum on the
//! service's server loop (`net::server`) and a tokio runtime this module
//! owns, for as long as the coexec runtime lives.
//!
//! A scrape must not depend on another client's manners: every connection
//! is its own task (idle or slow clients hold only themselves), the request
//! head is bounded in size and in time ([`HEAD_DEADLINE`]), a connection
//! idle longer than [`IDLE_TIMEOUT`] is closed, and past
//! [`MAX_CONNECTIONS`] a new client takes the slot of the one idle longest.
//!
//! What ends with the runtime: the server, its tokio runtime and its thread.
//! What does not: the recorder and its upkeep thread. The `metrics` crate
//! has one global recorder per process, set once and never removed, so the
//! first exporter (or the application, through [`install`]) installs
//! coexec's and it stays until the process exits; later exporters serve
//! it.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use coexec::metrics::CHUNK_BUCKETS;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::oneshot;

use crate::net::server::ServerConfig;
use coexec::Error;

/// How often histograms are drained into their buckets, scrape or not.
const UPKEEP: Duration = Duration::from_secs(1);
/// Longest a client may take to send its request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Longest a connection may sit idle between scrapes (Prometheus keeps its
/// connection open between scrapes, 15 s apart by default: past this it
/// opens another).
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; past it a new client takes the slot of the
/// connection idle longest.
const MAX_CONNECTIONS: usize = 512;
/// Longest the exporter waits, when its runtime ends, for a scrape in
/// progress to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The recorder is global to the process: installed once, shared by every
/// runtime that serves metrics, never removed (the `metrics` crate has no
/// way to).
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Buckets of `coexec_batch_size` (input rows per batch).
const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Buckets of `coexec_embed_batch_tokens` (tokens per batch of an
/// embedding model; `--max-batch-tokens` is 16384 by default).
const TOKEN_BUCKETS: [f64; 12] = [
    16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 65536.0,
];

/// Buckets of the service's request latencies (`coexec_request_*_seconds`):
/// finer than the chunks' 1-3-10 steps where a service's bounds lie, and
/// with 50 ms among them, so the share of requests within a 50 ms bound is
/// one bucket's count.
const REQUEST_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0,
    5.0,
];

/// TEI's histograms (`te_*`, Text Embeddings Inference's names beside
/// coexec's own) with TEI's buckets (`router/src/prometheus.rs`), so that
/// a dashboard's `histogram_quantile` over them reads as it does on TEI:
/// the durations 35 steps of 1.5× from 15 µs, input lengths and batch
/// sizes and tokens powers of two.
fn tei_buckets(b: PrometheusBuilder) -> Result<PrometheusBuilder, BuildError> {
    let durations: Vec<f64> = (1..=35).map(|k| 1e-5 * 1.5f64.powi(k)).collect();
    let powers = |n: i32| (0..n).map(|x| 2f64.powi(x)).collect::<Vec<f64>>();
    let full = |name: &str| Matcher::Full(name.into());
    let mut b = b;
    for kind in ["request", "embed", "predict"] {
        for part in ["", "_tokenization", "_queue", "_inference"] {
            b = b.set_buckets_for_metric(full(&format!("te_{kind}{part}_duration")), &durations)?;
        }
    }
    b.set_buckets_for_metric(full("te_request_input_length"), &powers(20))?
        .set_buckets_for_metric(full("te_batch_next_size"), &powers(13))?
        .set_buckets_for_metric(full("te_batch_next_tokens"), &powers(21))
}

/// Installs coexec's Prometheus recorder as the process's global one (once:
/// later calls return the same handle) and returns the handle to render it
/// with, as `GET /metrics` does ([`crate::ServeConfig::prometheus`]).
/// Its histograms are drained every second whether or not anyone scrapes.
///
/// Errors with [`Error::Metrics`] where the application installed another
/// recorder first.
///
/// ```
/// let h = coexec_serve::metrics::install()?;
/// metrics::counter!("my_app_requests_total").increment(1);
/// assert!(h.render().contains("my_app_requests_total 1"));
/// # Ok::<(), coexec::Error>(())
/// ```
pub fn install() -> Result<PrometheusHandle, Error> {
    handle()
}

/// The process-wide recorder's handle, installing it on first use.
pub(crate) fn handle() -> Result<PrometheusHandle, Error> {
    // Two runtimes starting at once must not both try to install.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let recorder = PrometheusBuilder::new()
        .set_buckets(&CHUNK_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full("coexec_batch_size".into()), &BATCH_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Prefix("coexec_request_".into()), &REQUEST_BUCKETS)
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("coexec_embed_batch_tokens".into()),
                &TOKEN_BUCKETS,
            )
        })
        .and_then(tei_buckets)
        .map_err(|e| Error::Metrics(e.to_string()))?
        .build_recorder();
    let h = recorder.handle();
    start_upkeep(h.clone())?;
    metrics::set_global_recorder(recorder).map_err(|e| Error::Metrics(e.to_string()))?;
    coexec::metrics::describe();
    Ok(HANDLE.get_or_init(|| h).clone())
}

/// Drains the recorder's histograms every [`UPKEEP`], for as long as the
/// process lives (as the recorder does). A histogram keeps every sample
/// until it is drained, and only a scrape drained them: a service that
/// nobody scraped grew by 16 MiB per 75 000 requests under overload, without
/// bound (five rounds of 10 s overload).
fn start_upkeep(h: PrometheusHandle) -> Result<(), Error> {
    std::thread::Builder::new()
        .name("coexec-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP);
                h.run_upkeep();
            }
        })
        .map(drop)
        .map_err(|e| Error::Metrics(format!("cannot start the histogram upkeep thread: {e}")))
}

/// A running exporter: `/metrics` on an address of its own, on a thread
/// and tokio runtime of its own (it depends on no runtime of the
/// application's); dropping it stops the server.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), coexec::Error> {
/// let m = coexec_serve::metrics::MetricsServer::start("127.0.0.1:0".parse().unwrap())?;
/// let rt = coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?;
/// println!("metrics at http://{}/metrics", m.addr());
/// rt.shutdown().await;
/// m.stop().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    /// Answered by the server's thread as it ends (its connections closed).
    ended: Option<oneshot::Receiver<()>>,
}

impl MetricsServer {
    /// Binds `addr` now (so a port in use is the caller's error) and serves
    /// `/metrics` there on a thread of its own until dropped.
    ///
    /// Installs coexec's recorder first where none is ([`install`]); a
    /// program that installed a recorder of its own gets
    /// [`Error::Metrics`].
    pub fn start(addr: SocketAddr) -> Result<Self, Error> {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|source| Error::MetricsBind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::MetricsBind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Metrics(e.to_string()))?;
        if !addr.ip().is_loopback() {
            tracing::warn!(
                "metrics served on {addr}: reachable from other machines, without authentication"
            );
        }
        let handle = handle()?;
        // A runtime of its own: the exporter must not depend on whether (or
        // which) tokio runtime the user has, and must end with ours.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Metrics(e.to_string()))?;
        let (stop, stopped) = oneshot::channel();
        let (end, ended) = oneshot::channel();
        std::thread::Builder::new()
            .name("coexec-metrics".into())
            .spawn(move || {
                rt.block_on(serve(listener, handle, stopped));
                // Its connection tasks go with it.
                drop(rt);
                let _ = end.send(());
            })
            .map_err(|e| Error::Metrics(e.to_string()))?;
        Ok(Self {
            addr,
            stop: Some(stop),
            ended: Some(ended),
        })
    }

    /// The address served (with the port the system chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits until its thread has closed every
    /// connection, without blocking the caller's executor (the thread says
    /// so on a channel; nothing is joined).
    pub async fn stop(mut self) {
        self.signal();
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
    }

    fn signal(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        // Not waited for here: a drop may happen on an async worker. The
        // thread ends as soon as it sees the signal; its connections go with it.
        self.signal();
    }
}

fn router(handle: PrometheusHandle) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let h = handle.clone();
                async move {
                    (
                        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                        h.render(),
                    )
                }
            }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "not found; metrics are at /metrics\n",
            )
                .into_response()
        })
}

async fn serve(
    listener: std::net::TcpListener,
    handle: PrometheusHandle,
    stopped: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics exporter: {e}");
            return;
        }
    };
    let cfg = ServerConfig::new()
        .max_connections(MAX_CONNECTIONS)
        .head_deadline(HEAD_DEADLINE)
        .idle_timeout(IDLE_TIMEOUT)
        .drain_grace(Duration::ZERO)
        .drain_timeout(DRAIN_TIMEOUT);
    crate::net::server::serve_with(
        listener,
        router(handle),
        async {
            let _ = stopped.await;
        },
        cfg,
    )
    .await;
}
