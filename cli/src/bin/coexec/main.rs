//! `coexec`: run and benchmark data-parallel jobs on every CPU core and GPU
//! stream at once.
#![forbid(unsafe_code)]

/// `println!` for what the CLI prints: a closed stdout (`coexec policies |
/// head -1`) ends the program quietly instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::emit(format_args!($($t)*))
    };
}

/// `eprintln!` that drops a failed write: a stderr whose reader went away
/// (a log shipper restarting: EPIPE) must not panic the process.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod bench;
mod corpus;
mod devices;
mod embed;
mod logging;
mod merge;
mod plot;
mod progress;
mod record;
mod report;
mod serve;
mod stats;
#[path = "../shared/usage.rs"]
mod usage;
mod workload;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use coexec::{JobOptions, Runtime};

use crate::workload::{Prepared, WorkloadArgs};

/// Run data-parallel work on every CPU core and GPU stream at once,
/// balanced to finish together.
#[derive(Debug, Parser)]
#[command(name = "coexec", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List the devices coexec finds (CPU cores, GPUs).
    Devices {
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the scheduling policies.
    Policies,
    /// Run one workload once and print a summary.
    Run {
        /// synthetic, empty, matmul, kmeans, pathfinder or nbody.
        workload: String,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: WorkloadArgs,
        /// Print the report and result as JSON.
        #[arg(long)]
        json: bool,
        /// pathfinder: print the result row as Rodinia does.
        #[arg(long)]
        print: bool,
        /// Write every chunk as a Chrome trace (opens in Perfetto).
        #[arg(long)]
        trace: Option<PathBuf>,
    },
    /// Run workloads on each device class alone and co-executed under each
    /// policy, and print the method's table.
    Bench {
        /// Workloads (default: matmul kmeans pathfinder nbody; `overhead`
        /// measures the scheduler's cost per chunk).
        workloads: Vec<String>,
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        args: WorkloadArgs,
        /// Policies to co-execute with, comma-separated.
        #[arg(long, default_value = "hybrid,static,static+dynamic")]
        policies: String,
        /// Repeats of every configuration at least (medians are reported);
        /// rounds go on until each median's 95% interval is within ±2% or
        /// --budget runs out.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Seconds per workload after which no further round starts once
        /// --repeat rounds, and at least 6 (the fewest that give a median
        /// a 95% interval), are done (0: exactly --repeat rounds).
        #[arg(long, default_value_t = 30.0)]
        budget: f64,
        /// Cold/warm pairs for the learning comparison: each pair runs the
        /// job on a fresh profile, then again from what it stored (0: none).
        #[arg(long, default_value_t = 5)]
        pairs: usize,
        /// Also sweep fixed splits between the two device classes (10% to
        /// 90% of the items to the first, then 2.5% steps around the best)
        /// and report the best as the `oracle` row: T_oracle, the limit
        /// this machine really reaches, beside T*, and T_oracle/T for
        /// every policy.
        #[arg(long)]
        oracle: bool,
        /// Write the results as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Draw the results as SVG (and the learning runs beside them).
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Serve the digits classifier (or --model FILE, an MLP) over HTTP
    /// (POST /v1/infer, /healthz, /readyz, /metrics), or a sentence
    /// embedding model (--model DIR) with Text Embeddings Inference's API,
    /// until SIGTERM or Ctrl-C, then answer every accepted request and
    /// exit 0.
    Serve(serve::ServeArgs),
    /// Embed a corpus (one text per line, or JSON Lines) with a sentence
    /// embedding model into a .npy or .jsonl file, on every device.
    Embed(embed::EmbedArgs),
    /// Join the outputs of `embed --shard I/N` in shard order, checking
    /// that each holds exactly its shard's rows.
    Merge(merge::MergeArgs),
}

/// Settings shared by `run` and `bench`.
#[derive(Debug, Clone, clap::Args)]
struct Common {
    /// Devices: cpu[:N], sim:N@SPEED[+LATENCY], cuda:ID[xSTREAMS], comma-separated.
    #[arg(long, env = "COEXEC_DEVICES")]
    devices: Option<String>,
    /// Default policy (see `coexec policies`).
    #[arg(long, env = "COEXEC_POLICY", default_value = "hybrid")]
    policy: String,
    /// Where profiles live (default: COEXEC_PROFILE_DIR, else the cache dir;
    /// `bench` keeps them in memory unless this is given).
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// Serve Prometheus metrics at this address while running (`/metrics`),
    /// the GPUs' telemetry (`coexec_gpu_*`, through NVML) among them.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// With --metrics: keep serving them this many seconds after the work
    /// ends, so that a scrape sees the finished jobs (at most 3600;
    /// SIGTERM or Ctrl-C ends the wait early).
    #[arg(long, value_name = "SECS", requires = "metrics",
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    metrics_linger: Option<u64>,
    /// Less output: no progress bars.
    #[arg(long, short)]
    quiet: bool,
}

/// A failure and whether it is the user's (exit 2) or the run's (exit 1),
/// or a run that finished with rows it could not compute (exit 3: `embed`
/// wrote every row, some of them NaN).
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    Run(String),
    Incomplete(String),
}

impl From<coexec::Error> for Failure {
    fn from(e: coexec::Error) -> Self {
        use coexec::ActorError as A;
        use coexec::kernels::KernelError as K;
        match &e {
            coexec::Error::Kernel(
                K::Input { .. }
                | K::Invalid { .. }
                | K::Io { .. }
                | K::Tensor { .. }
                | K::Config { .. },
            )
            | coexec::Error::Actor(A::DeviceSpec { .. } | A::UnknownPolicy(_))
            | coexec::Error::Config { .. }
            | coexec::Error::MetricsBind { .. }
            | coexec::Error::Bind { .. } => Failure::Usage(e.to_string()),
            _ => Failure::Run(e.to_string()),
        }
    }
}

impl From<coexec::kernels::KernelError> for Failure {
    fn from(e: coexec::kernels::KernelError) -> Self {
        Failure::from(coexec::Error::Kernel(e))
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            errln!("coexec: {}", usage::one_line(&e));
            return ExitCode::from(2);
        }
    };
    logging::init();
    // The command owns its process: a kernel panicking on every chunk is
    // printed once, not once per chunk and retry.
    coexec::kernels::KernelError::print_each_panic_once();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("coexec: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            errln!("coexec: {}", m.lines().next().unwrap_or(""));
            ExitCode::from(2)
        }
        Err(Failure::Run(m)) => {
            errln!("coexec: {}", m.lines().next().unwrap_or(""));
            ExitCode::FAILURE
        }
        Err(Failure::Incomplete(m)) => {
            errln!("coexec: {}", m.lines().next().unwrap_or(""));
            ExitCode::from(3)
        }
    }
}

/// Writes one line to stdout; exits (0) if the reader has gone.
pub(crate) fn emit(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        errln!("coexec: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// Refuses an output path that cannot be written, before a long run: its
/// folder must exist and it must not be a folder itself.
fn check_output(flag: &str, path: &std::path::Path) -> Result<(), Failure> {
    let bad = |why: &str| Err(Failure::Usage(format!("{flag} {}: {why}", path.display())));
    if path.is_dir() {
        return bad("is a directory");
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if !dir.is_dir() {
        return bad("its folder does not exist");
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => bad(&e.to_string()),
    }
}

/// COEXEC_CUDA_PIN: which kernel buffers the GPU streams page-lock (unset
/// or empty: the default).
pub(crate) fn host_pinning() -> Result<coexec::kernels::cuda::HostPinning, Failure> {
    match std::env::var_os("COEXEC_CUDA_PIN").filter(|v| !v.is_empty()) {
        Some(v) => v
            .to_string_lossy()
            .parse()
            .map_err(|why| Failure::Usage(format!("COEXEC_CUDA_PIN: {why}"))),
        None => Ok(Default::default()),
    }
}

/// A runtime for `common`; `bench` defaults to in-memory profiles.
pub(crate) fn build(
    common: &Common,
    devices: Option<&str>,
    in_memory: bool,
) -> Result<Runtime, Failure> {
    // The library reads no environment: the command line does, for
    // COEXEC_DEVICES and COEXEC_POLICY through its flags and for
    // COEXEC_PROFILE_DIR and COEXEC_CUDA_PIN below (`bench` without
    // --profile-dir stays in memory whatever it says).
    let mut b = Runtime::builder()
        .policy(&common.policy)
        .host_pinning(host_pinning()?);
    if let Some(d) = devices.or(common.devices.as_deref()) {
        b = b.devices(d)?;
    }
    b = match &common.profile_dir {
        Some(d) => b.profile_dir(d),
        None if in_memory => b.in_memory_profiles(),
        None => match std::env::var_os("COEXEC_PROFILE_DIR").filter(|d| !d.is_empty()) {
            Some(d) => b.profile_dir(d),
            None => b,
        },
    };
    let rt = b.build()?;
    if let Some(addr) = common.metrics
        && EXPORTER.get().is_none()
    {
        let m = coexec_serve::metrics::MetricsServer::start(addr)?;
        // On stderr: stdout may be JSON. With port 0 this is the only way to
        // learn the port.
        errln!("coexec: metrics at http://{}/metrics", m.addr());
        let _ = EXPORTER.set(m);
    }
    Ok(rt)
}

/// With --metrics: the exporter, started with the command's first runtime
/// and kept for the life of the process.
static EXPORTER: std::sync::OnceLock<coexec_serve::metrics::MetricsServer> =
    std::sync::OnceLock::new();

/// With --metrics: the GPUs' telemetry (`coexec_gpu_*`) on the same
/// exporter, sampled every second while the command lives (a run is short;
/// `serve` has its own interval).
pub(crate) fn gpu_telemetry(common: &Common) -> Option<coexec_serve::metrics::GpuTelemetry> {
    common
        .metrics
        .map(|_| coexec_serve::metrics::GpuTelemetry::start(std::time::Duration::from_secs(1)))
}

/// Keeps the exporter up for `--metrics-linger` seconds after the work.
pub(crate) async fn linger(common: &Common) {
    let (Some(secs), Some(addr)) = (common.metrics_linger, EXPORTER.get().map(|m| m.addr())) else {
        return;
    };
    errln!("coexec: metrics stay at http://{addr}/metrics for {secs} s (Ctrl-C ends it)");
    tokio::select! {
        () = tokio::time::sleep(std::time::Duration::from_secs(secs)) => {}
        () = serve::shutdown_signal() => {}
    }
}

async fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.cmd {
        Cmd::Devices { json } => devices::devices(json),
        Cmd::Policies => {
            for name in coexec::policy::names() {
                let p = coexec::policy::by_name(name).map_err(|e| Failure::Run(e.to_string()))?;
                outln!("{:<16} {}", p.name(), p.describe());
            }
            Ok(())
        }
        Cmd::Run {
            workload,
            common,
            args,
            json,
            print,
            trace,
        } => run(&workload, &common, &args, json, print, trace).await,
        Cmd::Bench {
            workloads,
            common,
            args,
            policies,
            repeat,
            budget,
            pairs,
            oracle,
            json,
            plot,
        } => {
            for (flag, p) in [("--json", &json), ("--plot", &plot)] {
                if let Some(p) = p {
                    check_output(flag, p)?;
                }
            }
            let rounds = bench::Rounds {
                repeat,
                pairs,
                budget_s: budget,
                oracle,
            };
            bench::bench(workloads, &common, &args, &policies, rounds, json, plot).await
        }
        Cmd::Serve(args) => serve::serve(args).await,
        Cmd::Embed(args) => embed::embed(args).await,
        Cmd::Merge(args) => merge::merge(args),
    }
}

async fn run(
    name: &str,
    common: &Common,
    args: &WorkloadArgs,
    json: bool,
    print: bool,
    trace: Option<PathBuf>,
) -> Result<(), Failure> {
    if let Some(p) = &trace {
        check_output("--trace", p)?;
    }
    let rt = std::sync::Arc::new(build(common, None, false)?);
    let _telemetry = gpu_telemetry(common);
    let speeds = class_speeds(&rt);
    let t = std::time::Instant::now();
    let w = Prepared::new(name, args, false, &speeds)?;
    let prepare_s = t.elapsed().as_secs_f64();
    let opts = JobOptions::new().trace(trace.is_some());
    let bars = progress::start(rt.clone(), w.items() as u64, common.quiet || json || print);
    let outcome = w.run(&rt, opts).await;
    bars.finish();
    let ran = outcome?;
    let t_output = std::time::Instant::now();
    // Inputs: built once (grid, kmeans input) and for the job (matrices, bodies).
    let (inputs_s, runs_s) = (prepare_s + ran.inputs_s, ran.wall_s);
    let (result, reports) = (ran.result, ran.reports);
    if let Some(path) = &trace {
        coexec::trace::write_chrome_trace(path, &reports, rt.classes())?;
    }
    if print && let Some(text) = result.get("row_text").and_then(|v| v.as_str()) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
    }
    if json {
        let mut result = result;
        if let Some(o) = result.as_object_mut() {
            o.remove("row_text");
        }
        let v = serde_json::json!({ "workload": name, "params": w.params(args), "input": w.input(), "result": result, "runs": reports, "inputs_s": inputs_s, "runs_s": runs_s });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else if !print {
        let total: f64 = reports.iter().map(|r| r.makespan_s).sum();
        let last = reports.last();
        let mut line = format!(
            "{name}: {} run(s), {} items each, {total:.4}s",
            reports.len(),
            w.items()
        );
        if let Some(r) = last {
            line += &format!("; last run: {}", r.summary());
        }
        outln!("{line}");
        if let Some(input) = w.input() {
            outln!("  input: {input}");
        }
        if let Some(o) = result.as_object() {
            for (k, v) in o
                .iter()
                .filter(|(k, _)| *k != "row_text" && *k != "membership")
            {
                outln!("  {k}: {v}");
            }
        }
    }
    if !json && !print {
        outln!(
            "time: inputs {inputs_s:.2} s ({} threads), runs {runs_s:.2} s, output {:.2} s",
            rayon::current_num_threads(),
            t_output.elapsed().as_secs_f64()
        );
    }
    linger(common).await;
    match std::sync::Arc::try_unwrap(rt) {
        Ok(rt) => rt.shutdown().await,
        Err(_) => {
            return Err(Failure::Run(
                "the runtime is still shared after the run".into(),
            ));
        }
    }
    Ok(())
}

/// Σ over classes of workers × speed relative to one CPU worker (GPUs count
/// as 10: only used to size synthetic runs).
pub(crate) fn class_speeds(rt: &Runtime) -> Vec<f64> {
    rt.classes()
        .iter()
        .map(|c| {
            // CPU workers beyond the cores add no speed: sizing by them would
            // make `cpu:4096` a 4096-core job on any machine.
            let workers = match c.kind {
                coexec::DeviceKind::Cpu => c.workers.min(coexec::machine::cores()),
                _ => c.workers,
            };
            workers as f64
                * match c.kind {
                    coexec::DeviceKind::Cpu => 1.0,
                    coexec::DeviceKind::Sim { speed, .. } => speed,
                    // A GPU, or a kind of accelerator added since: a guess
                    // the first run's probe corrects.
                    _ => 10.0,
                }
        })
        .collect()
}
