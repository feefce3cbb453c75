//! `coexec serve`: an MLP classifier behind HTTP (the built-in digits model,
//! or any MLP in safetensors given by `--model FILE`), or a sentence
//! embedding model with Text Embeddings Inference's API (`--model DIR`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coexec::Runtime;
use coexec::kernels::workloads::MlpWeights;
use coexec::stream::{MlpModel, Placement, StreamConfig};
use coexec_models::Embedder;
use coexec_serve::{ServeConfig, ServeModel, ServerConfig, Service};

use crate::Failure;

/// The committed model, built into the binary so that `coexec serve` runs
/// from any directory and after the checkout has moved.
const BUILT_IN_MODEL: &[u8] = include_bytes!("../../../../examples/models/digits_mlp.safetensors");

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0: any free port, printed on start).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Devices: cpu[:N], sim:N@SPEED[+LATENCY], cuda:ID[xSTREAMS], comma-separated.
    #[arg(long, env = "COEXEC_DEVICES")]
    devices: Option<String>,
    /// Where batches run: hybrid (on learned speed models, split when
    /// sooner) or greedy (whole batches to the first free class). One class
    /// alone: --devices cpu:1 or --devices sim:1@0.5.
    #[arg(long, default_value = "hybrid", value_parser = ["hybrid", "greedy"])]
    policy: String,
    /// Most requests (input rows, or texts) in one batch. Default: 128 for
    /// an MLP, whose every batch packs its 4 MiB hidden layer once (one
    /// core runs 26 k rows/s in 32-row batches and 33 k in 128-row ones:
    /// `cargo bench --bench mlp_forward`); 256 texts for an embedding
    /// model, whose batches --max-batch-tokens bounds.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Embedding model: most tokens in one batch (TEI's
    /// --max-batch-tokens).
    #[arg(long, default_value_t = 16384)]
    max_batch_tokens: usize,
    /// Most inputs in one request, at least 1; more get 422 on TEI's
    /// routes, as TEI 1.9's, and 400 on /v1/infer (TEI's
    /// --max-client-batch-size). Default: 32 for an embedding model, 1024
    /// rows for an MLP.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_client_batch_size: Option<u64>,
    /// Embedding model: the id `/info` gives (default: --model as given,
    /// as TEI gives the --model-id it was started with).
    #[arg(long)]
    model_id: Option<String>,
    /// Embedding model: the name `/info` and `/v1/embeddings` give (TEI's
    /// --served-model-name; default: the model's id).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Longest a batch waits for more requests after its first, in µs (at most 10 s).
    #[arg(long, default_value_t = 1000)]
    max_wait_us: u64,
    /// Requests (input rows) waiting at most; more get 429.
    #[arg(long, default_value_t = 1024)]
    queue: usize,
    /// MiB the requests in progress may hold at once, by an estimate from
    /// each body's length (a /tokenize answer takes some 170 bytes a
    /// token); a request it cannot cover now gets 429, as a full queue
    /// does.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    memory_budget_mib: u64,
    /// The model. A file: an MLP classifier in safetensors (`fc1.weight`,
    /// `fc1.bias`, `fc2.weight`, …; any depth and widths, read from the
    /// file), on `POST /v1/infer`. A folder: a BERT-family sentence
    /// embedding model (config.json, model.safetensors, tokenizer.json;
    /// `scripts/fetch_model.sh` fetches all-MiniLM-L6-v2), on Text
    /// Embeddings Inference's API (`POST /embed`, `/v1/embeddings`, `GET
    /// /info`, `/health`). Default: the committed digits model, built in.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where profiles live (default: COEXEC_PROFILE_DIR, else the cache dir).
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// Deadline of a request that names none, in ms (default: none).
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Batches placed on devices at once (default: one per device class,
    /// plus one under hybrid).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    in_flight: Option<u64>,
    /// Connections served at once; past it, a new client takes the slot of
    /// the keep-alive connection idle longest (keep it below `ulimit -n`).
    #[arg(long, default_value_t = coexec_serve::MAX_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_connections: u64,
    /// Longest a client may take to send a request head, in ms, from its
    /// first byte: a client dripping its head is cut off then.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    head_timeout_ms: u64,
    /// Longest a client may take to send a request body once its head is
    /// in, in ms: then 408 and the connection closes.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    body_timeout_ms: u64,
    /// Longest the drain after SIGTERM, SIGHUP or Ctrl-C may last, in
    /// seconds, counted after --drain-delay-s; past it the connections still
    /// open are closed (counted in `coexec_drain_closed_connections_total`)
    /// and the process exits 0. The exit comes at most delay + timeout
    /// after the signal (and the profile's save, at most 5 s): keep that
    /// sum under Kubernetes' terminationGracePeriodSeconds.
    #[arg(long, default_value_t = coexec_serve::DRAIN_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    drain_timeout_s: u64,
    /// Seconds between SIGTERM and the drain: `/readyz` answers 503 at
    /// once, so that a load balancer or Kubernetes stops routing here,
    /// while everything that still arrives is served; then the listener
    /// closes and the drain begins. A second signal cuts it short. Set it
    /// to the time your balancer takes to notice (its health-check
    /// interval times its fall count).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    drain_delay_s: u64,
    /// Bind each CPU worker to a core of its own and every other thread
    /// (handlers, sim and GPU workers, actors) to the cores left (Linux).
    #[arg(long)]
    bind_workers: bool,
    /// Seconds between GPU telemetry samples (`coexec_gpu_*` on /metrics:
    /// utilisation, memory, power, temperature, SM clock, through NVML);
    /// 0: none.
    #[arg(long, default_value_t = 5.0)]
    gpu_telemetry_s: f64,
}

pub(crate) async fn serve(a: ServeArgs) -> Result<(), Failure> {
    if !(a.gpu_telemetry_s.is_finite() && a.gpu_telemetry_s >= 0.0) {
        return Err(Failure::Usage(format!(
            "--gpu-telemetry-s must be 0 or more seconds, not {}",
            a.gpu_telemetry_s
        )));
    }
    if let Some(dir) = a.model.as_ref().filter(|p| p.is_dir()) {
        let id = a
            .model_id
            .clone()
            .unwrap_or_else(|| dir.display().to_string());
        let model = Embedder::load(dir)?.with_id(id);
        let mut cfg = ServeConfig::new();
        if let Some(name) = &a.served_model_name {
            cfg = cfg.served_model_name(name.clone());
        }
        tracing::info!(
            model = %dir.display(),
            sha256 = model.sha256(),
            "serving sentence embeddings of {} dimensions, inputs up to {} tokens",
            model.dim(),
            model.max_input_length()
        );
        let stream = |s: StreamConfig| {
            s.max_batch(a.max_batch.unwrap_or(256))
                .max_batch_cost(Some(a.max_batch_tokens))
        };
        let inputs = client_batch(a.max_client_batch_size, 32);
        return run(&a, model, stream, inputs, cfg, Service::tei_router).await;
    }
    let weights = Arc::new(match &a.model {
        Some(path) => MlpWeights::load(path)?,
        None => MlpWeights::from_bytes(
            BUILT_IN_MODEL,
            std::path::Path::new("built-in examples/models/digits_mlp.safetensors"),
        )?,
    });
    let widths: Vec<String> = weights.widths().iter().map(usize::to_string).collect();
    tracing::info!(
        model = %weights.source().display(),
        widths = %widths.join(" → "),
        "serving an MLP of {} inputs",
        weights.inputs()
    );
    let body = body_limit(weights.inputs())
        .map_err(|why| Failure::Usage(format!("--model {}: {why}", weights.source().display())))?;
    let stream = |s: StreamConfig| s.max_batch(a.max_batch.unwrap_or(128));
    let inputs = client_batch(a.max_client_batch_size, 1024);
    let cfg = ServeConfig::new().max_body(body);
    run(
        &a,
        MlpModel::new(weights),
        stream,
        inputs,
        cfg,
        Service::router,
    )
    .await
}

/// `--max-client-batch-size` (at least 1, by its parser), else `default`.
fn client_batch(flag: Option<u64>, default: usize) -> usize {
    flag.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// The largest body a request may have: the default, or, for a model whose
/// one input would not fit it, one input's worth at 24 bytes a number (an
/// f32 written in full and its comma); refused past [`MAX_MODEL_BODY`].
fn body_limit(numbers: usize) -> Result<usize, String> {
    let default = ServeConfig::new().max_body_len();
    let one_input = numbers.saturating_mul(24).saturating_add(1024);
    if one_input > MAX_MODEL_BODY {
        return Err(format!(
            "one input of {numbers} numbers needs a request body of up to {one_input} bytes, \
             over the {MAX_MODEL_BODY} one may take"
        ));
    }
    Ok(default.max(one_input))
}

/// The largest request body a model's input width may ask for.
const MAX_MODEL_BODY: usize = 256 << 20;

/// Serves `model` until a signal, then drains: the runtime from `a`'s
/// devices, the stream from `a`'s limits (and `stream`'s, the model's
/// own), the service from `cfg` and `a`, the routes from `routes`.
async fn run<M: ServeModel>(
    a: &ServeArgs,
    model: M,
    stream: impl FnOnce(StreamConfig) -> StreamConfig,
    max_inputs: usize,
    cfg: ServeConfig,
    routes: fn(&Service<M>) -> axum::Router,
) -> Result<(), Failure> {
    let mut b = Runtime::builder();
    if let Some(d) = &a.devices {
        b = b.devices(d)?;
    }
    if let Some(d) = &a.profile_dir {
        b = b.profile_dir(d);
    }
    let rt = Arc::new(b.bind_workers(a.bind_workers).build()?);
    if let Some(bd) = rt.binding() {
        let n = rt.bind_other_threads()?;
        tracing::info!(workers = ?bd.workers, host = ?bd.host, threads = n, "bound");
    }
    let placement: Placement = a.policy.parse()?;
    // One batch per class in flight, and one forming behind them.
    let in_flight = a.in_flight.map_or_else(
        || rt.classes().len().max(1) + usize::from(placement == Placement::Hybrid),
        |n| n as usize,
    );
    let stream = stream(
        StreamConfig::new()
            .max_wait(Duration::from_micros(a.max_wait_us))
            .queue(a.queue)
            .in_flight(in_flight)
            .placement(placement),
    );
    // The application installs the process's recorder; the service only
    // records into it and serves it.
    let prometheus = coexec_serve::metrics::install()?;
    // Sampled until the service ends.
    let _telemetry = (a.gpu_telemetry_s > 0.0).then(|| {
        coexec_serve::metrics::GpuTelemetry::start(Duration::from_secs_f64(
            a.gpu_telemetry_s.min(3600.0),
        ))
    });
    let cfg = cfg
        .deadline(a.deadline_ms.map(Duration::from_millis))
        .max_inputs(max_inputs)
        .body_deadline(Duration::from_millis(a.body_timeout_ms))
        .memory_budget(a.memory_budget_mib << 20)
        .prometheus(prometheus);
    let svc = Service::start(rt.clone(), model, stream, cfg)?;
    // Before `listening on`: a signal from then on drains.
    let first_signal = shutdown_signal();
    // Before listening: the first requests must not pay a GPU's kernel
    // compilation or a class's first allocations. A class that fails here
    // is left to the runtime, which re-runs its failed chunks elsewhere.
    match svc.warm_up(&rt).await {
        Ok(warmed) => {
            for (class, took) in warmed {
                tracing::info!(class, ms = took.as_secs_f64() * 1e3, "warmed up");
            }
        }
        Err(e) => tracing::warn!("warm-up failed, serving on: {e}"),
    }
    let listener = coexec_serve::bind(a.addr).await?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::Run(format!("{}: {e}", a.addr)))?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    }
    let signal = {
        let svc = svc.clone();
        let delay = Duration::from_secs(a.drain_delay_s);
        async move {
            first_signal.await;
            if !delay.is_zero() {
                tracing::info!("not ready; serving for {delay:?} before the drain");
                svc.set_ready(false);
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown_signal() => {}
                }
            }
            tracing::info!("draining: answering every accepted request");
            svc.start_draining();
        }
    };
    let server = ServerConfig::new()
        .max_connections(usize::try_from(a.max_connections).unwrap_or(usize::MAX))
        .drain_timeout(Duration::from_secs(a.drain_timeout_s))
        .head_deadline(Duration::from_millis(a.head_timeout_ms));
    coexec_serve::serve_with(listener, routes(&svc), signal, server).await;
    svc.shutdown().await;
    drop(svc);
    match Arc::try_unwrap(rt) {
        Ok(rt) => rt.shutdown().await,
        // A handler still holds it (none should): its jobs are answered.
        Err(_) => tracing::warn!("runtime still shared at exit"),
    }
    Ok(())
}

/// SIGTERM, SIGHUP (the terminal or session went away: drained the same,
/// not killed mid-request by the default action) or Ctrl-C. SIGTERM's and
/// SIGHUP's handlers are in place when this returns, before the future is
/// first polled: one right after `listening on` drains, not the default
/// action.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let handlers = {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(hup)) => Some((term, hup)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("no SIGTERM or SIGHUP handler ({e}); Ctrl-C only");
                None
            }
        }
    };
    let ctrl_c = tokio::signal::ctrl_c();
    async move {
        #[cfg(unix)]
        if let Some((mut term, mut hup)) = handlers {
            tokio::select! {
                _ = term.recv() => {}
                _ = hup.recv() => tracing::info!("SIGHUP: shutting down as for SIGTERM"),
                _ = ctrl_c => {}
            }
            return;
        }
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_limit_holds_one_input_or_the_model_is_refused() {
        let default = ServeConfig::new().max_body_len();
        assert_eq!(body_limit(64), Ok(default));
        assert_eq!(body_limit(1_200_000), Ok(1_200_000 * 24 + 1024));
        let e = body_limit(20_000_000).unwrap_err();
        assert!(e.contains("20000000 numbers"), "{e}");
    }
}
