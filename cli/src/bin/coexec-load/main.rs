//! `coexec-load`: an open-loop HTTP load generator for `coexec serve`,
//! loopback only.
//!
//! ```text
//! rates ─► schedule i at start + i/rate ─► POST /v1/infer (rows of the test set)
//!                                            │ answer, 429, 503, 504, timeout, cut
//!                                            ▼
//!          tally per rate: counts, labels vs the test labels, HDR latencies
//!          measured from each request's *scheduled* time
//! ```
//!
//! ```text
//! coexec-load --target http://127.0.0.1:8080 --rate 100,200,400 --requests 2000
//! coexec-load --target http://127.0.0.1:8080 --rate 50 --capacity-p99-ms 50
//! coexec-load --rate 500,1000 --rounds 5 \
//!     --server 'old=/tmp/old/coexec serve --addr 127.0.0.1:0 --profile-dir {profile_dir}' \
//!     --server 'new=coexec serve --addr 127.0.0.1:0 --profile-dir {profile_dir}'
//! ```
#![forbid(unsafe_code)]

mod capacity;
mod compare;
mod dataset;
mod openloop;
mod ratio;
mod record;
mod report;
mod servers;
mod target;
#[path = "../shared/usage.rs"]
mod usage;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

use crate::dataset::Dataset;
use crate::openloop::Plan;
use crate::report::RateReport;

/// Open-loop load generator for `coexec serve` (loopback targets only).
///
/// Request i of each rate is sent at start + i/rate whatever the earlier
/// ones are doing, and its latency counts from that scheduled time.
///
/// Exit status: 0 when the run went through, whatever the server answered;
/// 2 for a usage error; 1 after the report when a rate got no answer at all,
/// the server broke its contract (a duplicated, malformed or crossed
/// answer), or the --record file could not be written.
#[derive(Debug, Parser)]
#[command(name = "coexec-load", version, about)]
struct Args {
    /// The server: http://HOST:PORT[/PATH] (path defaults to /v1/infer).
    /// HOST must resolve to loopback addresses only. With --server, only
    /// its path is used.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    target: String,
    /// Start the server(s) to load instead, side by side: NAME=COMMAND,
    /// repeatable; the first is the base of the ratios. Each measured run
    /// gets a fresh server (`sh -c 'exec COMMAND'`, `{profile_dir}` replaced
    /// by a folder of its own), a warm-up, then the rates or the capacity
    /// search; it is stopped with SIGTERM and must exit 0. The command must
    /// print `listening on http://ADDR` (`coexec serve --addr 127.0.0.1:0`).
    #[arg(long, value_name = "NAME=COMMAND", conflicts_with = "record")]
    server: Vec<String>,
    /// With --server: rounds; the servers' order rotates each round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// With --server: requests sent before each measured run.
    #[arg(long, default_value_t = 600)]
    warmup_requests: u64,
    /// With --server: the warm-up's rate, requests per second.
    #[arg(long, default_value_t = 500.0)]
    warmup_rate: f64,
    /// With --server: seconds a server may take to print its address.
    #[arg(long, default_value_t = 60.0)]
    ready_timeout: f64,
    /// With --server: where the servers' logs go (default: a new folder
    /// under the temporary directory, named at the start).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Arrival rates in requests per second, comma-separated; each runs in
    /// turn.
    #[arg(long, value_delimiter = ',', required = true)]
    rate: Vec<f64>,
    /// Requests sent at each rate.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// Send at least this many seconds of load at each rate (requests =
    /// the larger of --requests and rate x seconds), so that a capacity
    /// search's fast probes last as long as its slow ones.
    #[arg(long, value_name = "S", conflicts_with = "record")]
    probe_seconds: Option<f64>,
    /// Each rate stops this many seconds after its start; what has not
    /// answered by then counts as lost, what was not sent as unsent.
    #[arg(long, default_value_t = 60.0)]
    duration_limit: f64,
    /// Seconds a request may take, from its scheduled time, before it counts
    /// as lost.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Rows of the test set in each request.
    #[arg(long, default_value_t = 1)]
    rows_per_request: usize,
    /// Requests in flight at most (one connection each).
    #[arg(long, default_value_t = 1024)]
    max_in_flight: usize,
    /// The rows and labels: a safetensors file with `x`, `y` (and optionally
    /// `pred`). Default: the committed digits test split, built in.
    #[arg(long, conflicts_with = "texts")]
    data: Option<PathBuf>,
    /// Texts instead of rows, for an embedding service (target
    /// http://HOST:PORT/embed): a JSON Lines file, each line a string or
    /// an object with a `text` field. Each answer is checked for one unit
    /// vector per text.
    #[arg(long)]
    texts: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Search for the capacity: the highest rate whose probe keeps the p99
    /// of its 200s within this many milliseconds, loses nothing and has at
    /// most 1% of 429/503/504s. --rate gives the start (one rate); rates
    /// double until a probe fails, then the interval is bisected to within
    /// 10%; a probe failing on latency or refusals alone is tried once more.
    #[arg(long, value_name = "MS", conflicts_with = "record")]
    capacity_p99_ms: Option<f64>,
    /// Also write every request's fate to this CSV file, one line each:
    /// rate, index, scheduled_ms, scheduled_unix_ms, send_lag_ms, outcome
    /// (HTTP status, refused, timeout, cut, closed or unsent), latency_ms.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

/// Requests a rate may send: the duplicate check keeps one flag per
/// request.
const MAX_REQUESTS: u64 = 10_000_000;

/// The committed digits test split, built in so that the generator runs
/// from any directory.
const BUILT_IN_DATA: &[u8] = include_bytes!("../../../../examples/models/digits_test.safetensors");
const BUILT_IN_DATA_NAME: &str = "built-in examples/models/digits_test.safetensors";

/// The JSON report.
#[derive(Serialize)]
struct Report<'a> {
    target: &'a str,
    rows_per_request: usize,
    timeout_s: f64,
    duration_limit_s: f64,
    max_in_flight: usize,
    data: String,
    rates: &'a [RateReport],
    /// With --capacity-p99-ms: the bound, each probe's verdict (in the
    /// order of `rates`) and what the search found.
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<CapacityReport>,
}

#[derive(Serialize)]
struct CapacityReport {
    bound_ms: f64,
    verdicts: Vec<capacity::Verdict>,
    #[serde(flatten)]
    found: capacity::Capacity,
}

/// A failure and whether it is the user's (exit 2) or the run's (exit 1).
enum Failure {
    Usage(String),
    Run(String),
}

fn check_args(a: &Args) -> Result<(), Failure> {
    let usage = |m: String| Err(Failure::Usage(m));
    if let Some(r) = a.rate.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        return usage(format!(
            "--rate: {r} is not a positive number of requests per second"
        ));
    }
    if a.requests == 0 {
        return usage("--requests must be at least 1".into());
    }
    if a.requests > MAX_REQUESTS {
        return usage(format!(
            "--requests {} is over the {MAX_REQUESTS} a rate may send",
            a.requests
        ));
    }
    for (flag, v) in [
        ("--duration-limit", a.duration_limit),
        ("--timeout", a.timeout),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
            return usage(format!("{flag} must be seconds in (0, 86400], got {v}"));
        }
    }
    if let Some(p) = a.probe_seconds
        && !(p.is_finite() && p > 0.0 && p <= 3600.0)
    {
        return usage(format!("--probe-seconds must be in (0, 3600], got {p}"));
    }
    if a.rows_per_request == 0 {
        return usage("--rows-per-request must be at least 1".into());
    }
    if a.max_in_flight == 0 {
        return usage("--max-in-flight must be at least 1".into());
    }
    if !a.server.is_empty() {
        if a.rounds == 0 || a.rounds > 1000 {
            return usage(format!("--rounds must be in 1..=1000, got {}", a.rounds));
        }
        if a.warmup_requests > 0 && !(a.warmup_rate.is_finite() && a.warmup_rate > 0.0) {
            return usage(format!(
                "--warmup-rate: {} is not a positive number of requests per second",
                a.warmup_rate
            ));
        }
        if !(a.ready_timeout.is_finite() && a.ready_timeout > 0.0 && a.ready_timeout <= 86_400.0) {
            return usage(format!(
                "--ready-timeout must be seconds in (0, 86400], got {}",
                a.ready_timeout
            ));
        }
    }
    if let Some(b) = a.capacity_p99_ms {
        if !(b.is_finite() && b > 0.0) {
            return usage(format!(
                "--capacity-p99-ms must be a positive number of ms, got {b}"
            ));
        }
        if a.rate.len() != 1 {
            return usage("--capacity-p99-ms takes one --rate: where the search starts".into());
        }
    }
    Ok(())
}

/// `--record`'s file while the run writes it.
struct Recording<'a> {
    path: &'a Path,
    file: BufWriter<File>,
    /// The rows, lent to each rate's run; `None` once a write failed.
    trace: Option<record::Trace>,
    error: Option<String>,
}

/// What one server's rates, or its capacity search, gave.
struct Measured {
    reports: Vec<RateReport>,
    verdicts: Vec<capacity::Verdict>,
    found: Option<capacity::Capacity>,
}

fn plan(a: &Args, rate: f64, requests: u64) -> Plan {
    Plan {
        rate,
        requests,
        rows_per_request: a.rows_per_request,
        timeout: Duration::from_secs_f64(a.timeout),
        duration_limit: Duration::from_secs_f64(a.duration_limit),
        max_in_flight: a.max_in_flight,
    }
}

/// The requests sent at `rate`: --requests, or more under --probe-seconds.
fn requests_at(a: &Args, rate: f64) -> u64 {
    let seconds = a.probe_seconds.map_or(0, |s| (s * rate).ceil() as u64);
    a.requests.max(seconds).min(MAX_REQUESTS)
}

/// The rates in turn, or the capacity search from the first; each rate's
/// progress on stderr after `label` (`None`: quiet).
async fn measure(
    a: &Args,
    client: &openloop::HttpClient,
    target: &Arc<target::Target>,
    data: &Arc<Dataset>,
    rates: &[f64],
    mut recording: Option<&mut Recording<'_>>,
    label: Option<&str>,
) -> Measured {
    let label = label.filter(|_| !a.json);
    let mut reports = Vec::with_capacity(rates.len());
    let mut search = a.capacity_p99_ms.map(|_| capacity::Search::new(rates[0]));
    let mut verdicts = Vec::new();
    let mut rates = rates.iter().copied();
    loop {
        let next = match &search {
            Some(s) => s.next(),
            None => rates.next(),
        };
        let Some(rate) = next else { break };
        let trace = recording.as_mut().and_then(|r| r.trace.take());
        let (r, trace) = openloop::run(
            client,
            target,
            data,
            &plan(a, rate, requests_at(a, rate)),
            trace,
        )
        .await;
        // A failed write stops the recording, not the run: the report
        // still comes, then exit 1.
        if let (Some(rec), Some(t)) = (recording.as_mut(), trace) {
            match t.write(&mut rec.file).and_then(|()| rec.file.flush()) {
                Ok(()) => rec.trace = Some(t),
                Err(e) => rec.error = Some(format!("--record {}: {e}", rec.path.display())),
            }
        }
        if let Some(label) = label {
            eprintln!(
                "{label}rate {rate}/s: {} sent, {} answered, {} of them 200, p99 of the 200s {} ms",
                r.sent,
                r.latency_all.count,
                r.ok,
                r.latency_ok.show(r.latency_ok.p99_ms)
            );
        }
        if let (Some(s), Some(bound)) = (&mut search, a.capacity_p99_ms) {
            let v = capacity::verdict(&r, bound);
            if let Some(label) = label {
                eprintln!("{label}rate {rate}/s: {v:?}");
            }
            s.record(v);
            verdicts.push(v);
        }
        reports.push(r);
    }
    Measured {
        reports,
        verdicts,
        found: search.as_ref().map(capacity::Search::result),
    }
}

/// The report as JSON, one line feed after it.
fn json(report: &impl Serialize) -> Result<String, Failure> {
    let mut s = serde_json::to_string_pretty(report)
        .map_err(|e| Failure::Run(format!("cannot encode the report: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// Writes the report; a closed stdout (`| head`) is not an error.
fn print(out: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::Run(format!("cannot write to stdout: {e}"))),
    }
}

fn data_name(a: &Args) -> String {
    a.texts
        .as_ref()
        .or(a.data.as_ref())
        .map_or_else(|| BUILT_IN_DATA_NAME.into(), |p| p.display().to_string())
}

async fn run(a: Args) -> Result<(), Failure> {
    check_args(&a)?;
    let data = match (&a.texts, &a.data) {
        (Some(path), _) => Dataset::texts(path),
        (None, Some(path)) => Dataset::load(path),
        (None, None) => {
            Dataset::from_bytes(std::path::Path::new(BUILT_IN_DATA_NAME), BUILT_IN_DATA)
        }
    }
    .map_err(|e| Failure::Usage(e.to_string()))?;
    let data = Arc::new(data);
    let client = openloop::client(a.max_in_flight);
    if !a.server.is_empty() {
        return compare::run(&a, &client, &data).await;
    }
    let target = target::resolve(&a.target)
        .await
        .map_err(|e| Failure::Usage(e.to_string()))?;
    let target = Arc::new(target);
    // Opened, its header written and its rows allocated before the run, so
    // a bad path or a size this machine cannot hold costs no load.
    let mut recording = match &a.record {
        Some(path) => {
            let trace = record::Trace::new(a.requests, coexec::kernels::workloads::memory_limit())
                .map_err(Failure::Usage)?;
            let file = File::create(path)
                .map(BufWriter::new)
                .and_then(|mut f| {
                    f.write_all(record::HEADER.as_bytes())?;
                    f.flush()?;
                    Ok(f)
                })
                .map_err(|e| Failure::Usage(format!("--record {}: {e}", path.display())))?;
            Some(Recording {
                path,
                file,
                trace: Some(trace),
                error: None,
            })
        }
        None => None,
    };
    let m = measure(
        &a,
        &client,
        &target,
        &data,
        &a.rate,
        recording.as_mut(),
        Some("coexec-load: "),
    )
    .await;
    let out = if a.json {
        let report = Report {
            target: &a.target,
            rows_per_request: a.rows_per_request,
            timeout_s: a.timeout,
            duration_limit_s: a.duration_limit,
            max_in_flight: a.max_in_flight,
            data: data_name(&a),
            rates: &m.reports,
            capacity: a
                .capacity_p99_ms
                .zip(m.found)
                .map(|(bound_ms, found)| CapacityReport {
                    bound_ms,
                    verdicts: m.verdicts.clone(),
                    found,
                }),
        };
        json(&report)?
    } else {
        let mut s = format!(
            "coexec-load: {} ({}), {} row(s)/request, latency from scheduled send, ms of 200s\n",
            a.target, target.addr, a.rows_per_request
        );
        s.push_str(&report::table(&m.reports));
        for n in report::notes(&m.reports) {
            s.push_str(&format!("note: {n}\n"));
        }
        if let (Some(bound), Some(c)) = (a.capacity_p99_ms, m.found) {
            s.push_str(&capacity::summary(bound, c));
        }
        s
    };
    print(&out)?;
    match recording
        .and_then(|r| r.error)
        .or_else(|| report::broken(&m.reports))
    {
        Some(why) => Err(Failure::Run(why)),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("coexec-load: {}", usage::one_line(&e));
            return ExitCode::from(2);
        }
    };
    // One thread: the generator shares a small machine with the server it
    // measures, and one thread keeps thousands of requests in flight.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("coexec-load: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("coexec-load: {}", m.lines().next().unwrap_or(""));
            ExitCode::from(2)
        }
        Err(Failure::Run(m)) => {
            eprintln!("coexec-load: {}", m.lines().next().unwrap_or(""));
            ExitCode::FAILURE
        }
    }
}
