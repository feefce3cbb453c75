//! Side-by-side runs of servers the generator starts (`--server`): builds
//! or settings compared on one machine under the same load.
//!
//! ```text
//! for round in 1..=rounds:                    servers rotated each round,
//!   for rate in rates (or one capacity search):     so none always goes first
//!     for server in rotated(servers):
//!       start ─► warm-up ─► measure ─► SIGTERM, exit 0 expected
//! ```
//!
//! The summary ([`crate::ratio`]) gives each server's medians over rounds
//! and its ratio to the first server's.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::capacity::Capacity;
use crate::dataset::Dataset;
use crate::openloop::{self, HttpClient};
use crate::report::{self, RateReport};
use crate::servers::{self, ServerSpec};
use crate::{Args, Failure, data_name, json, measure, plan, print, ratio, target};

/// One measured run: a fresh server, its warm-up, then one rate or one
/// capacity search.
#[derive(Debug, Serialize)]
pub(crate) struct Run {
    pub(crate) round: usize,
    pub(crate) server: String,
    pub(crate) command: String,
    pub(crate) log: String,
    /// The server's exit code after SIGTERM (`None`: killed past the
    /// limit, or ended by a signal).
    pub(crate) exit: Option<i32>,
    pub(crate) reports: Vec<RateReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) capacity: Option<Capacity>,
}

impl Run {
    /// What the run did against the service's contract.
    pub(crate) fn broken(&self) -> Option<String> {
        let why = match self.exit {
            Some(0) => crate::report::broken(&self.reports),
            Some(code) => Some(format!("the server exited {code} on SIGTERM")),
            None => Some(format!(
                "the server did not exit on SIGTERM within {} s",
                crate::servers::STOP_LIMIT.as_secs()
            )),
        }?;
        Some(format!("round {}, {}: {why}", self.round, self.server))
    }
}

/// The order servers run in round `round` (0-based): rotated by one each
/// round.
pub(crate) fn order(servers: &[ServerSpec], round: usize) -> Vec<&ServerSpec> {
    let k = round % servers.len().max(1);
    servers[k..].iter().chain(&servers[..k]).collect()
}

/// One line per run, for the progress on stderr.
pub(crate) fn line(run: &Run) -> String {
    let mut s = format!("round {}, {}:", run.round, run.server);
    for r in &run.reports {
        let acc = r.accuracy.map_or_else(|| "-".into(), |a| format!("{a:.4}"));
        let _ = write!(
            s,
            " [{}/s: 200 {}, 429 {}, 503 {}, 504 {}, lost {}, accuracy {acc}, p50/p99 {}/{} ms]",
            r.rate,
            r.ok,
            r.status_429,
            r.status_503,
            r.status_504,
            r.lost,
            r.latency_ok.show(r.latency_ok.p50_ms),
            r.latency_ok.show(r.latency_ok.p99_ms),
        );
    }
    match (run.capacity, run.exit) {
        (Some(c), _) => {
            let _ = write!(s, " capacity {:?}", c.passed);
        }
        (None, Some(0)) => {}
        (None, code) => {
            let _ = write!(s, " exit {code:?}");
        }
    }
    s
}

/// The JSON report of `--server` runs.
#[derive(Serialize)]
struct CompareReport<'a> {
    servers: &'a [ServerSpec],
    rounds: usize,
    path: &'a str,
    rows_per_request: usize,
    requests: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    probe_seconds: Option<f64>,
    warmup_requests: u64,
    warmup_rate: f64,
    timeout_s: f64,
    data: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity_p99_ms: Option<f64>,
    runs: &'a [Run],
    summary: &'a [ratio::Cell],
}

/// `--server`: every round, rate and server in turn, each run on a fresh
/// server; then the medians and ratios.
pub(crate) async fn run(a: &Args, client: &HttpClient, data: &Arc<Dataset>) -> Result<(), Failure> {
    let specs = a
        .server
        .iter()
        .map(|s| ServerSpec::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::Usage)?;
    if let Some(dup) = specs
        .iter()
        .enumerate()
        .find(|(i, s)| specs[..*i].iter().any(|t| t.name == s.name))
    {
        return Err(Failure::Usage(format!(
            "--server name `{}` is given twice",
            dup.1.name
        )));
    }
    let path = target::path(&a.target).map_err(|e| Failure::Usage(e.to_string()))?;
    let log_dir = a.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("coexec-load-logs-{}", std::process::id()))
    });
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| Failure::Usage(format!("--log-dir {}: {e}", log_dir.display())))?;
    eprintln!("coexec-load: the servers' logs go to {}", log_dir.display());
    let ready = Duration::from_secs_f64(a.ready_timeout);
    // One capacity search per run, or one run per fixed rate.
    let keys: Vec<Option<f64>> = match a.capacity_p99_ms {
        Some(_) => vec![None],
        None => a.rate.iter().copied().map(Some).collect(),
    };
    let mut runs = Vec::new();
    for round in 0..a.rounds {
        for key in &keys {
            for spec in order(&specs, round) {
                let tag = match key {
                    Some(rate) => format!("{}-{rate}-r{}", spec.name, round + 1),
                    None => format!("{}-r{}", spec.name, round + 1),
                };
                let server =
                    servers::Running::start(spec, &log_dir, &tag, ready).map_err(Failure::Run)?;
                let target = target::resolve(&format!("http://{}{path}", server.addr))
                    .await
                    .map_err(|e| Failure::Run(e.to_string()))?;
                let target = Arc::new(target);
                if a.warmup_requests > 0 {
                    let warm = plan(a, a.warmup_rate, a.warmup_requests);
                    openloop::run(client, &target, data, &warm, None).await;
                }
                let rates = [key.unwrap_or(a.rate[0])];
                let label = format!("coexec-load: round {}, {}: ", round + 1, spec.name);
                // A capacity search's probes are shown; a fixed rate is
                // the run's own line.
                let label = key.is_none().then_some(label.as_str());
                let m = measure(a, client, &target, data, &rates, None, label).await;
                let (command, log) = (server.command.clone(), server.log.display().to_string());
                let run = Run {
                    round: round + 1,
                    server: spec.name.clone(),
                    command,
                    log,
                    exit: server.stop(),
                    reports: m.reports,
                    capacity: m.found,
                };
                eprintln!("coexec-load: {}", line(&run));
                runs.push(run);
            }
        }
    }
    let cells = ratio::summary(&runs, &specs, a.rounds);
    let out = if a.json {
        let report = CompareReport {
            servers: &specs,
            rounds: a.rounds,
            path: &path,
            rows_per_request: a.rows_per_request,
            requests: a.requests,
            probe_seconds: a.probe_seconds,
            warmup_requests: a.warmup_requests,
            warmup_rate: a.warmup_rate,
            timeout_s: a.timeout,
            data: data_name(a),
            capacity_p99_ms: a.capacity_p99_ms,
            runs: &runs,
            summary: &cells,
        };
        json(&report)?
    } else {
        let mut s = format!(
            "coexec-load: {} server(s), {} round(s), {} row(s)/request; medians over rounds\n",
            specs.len(),
            a.rounds,
            a.rows_per_request
        );
        s.push_str(&ratio::table(&cells, &runs));
        for r in &runs {
            for n in report::notes(&r.reports) {
                s.push_str(&format!("note: round {}, {}: {n}\n", r.round, r.server));
            }
        }
        s
    };
    print(&out)?;
    let broken: Vec<String> = runs.iter().filter_map(Run::broken).collect();
    match broken.first() {
        Some(first) => Err(Failure::Run(format!(
            "{} run(s) broke the contract; the first: {first}",
            broken.len()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_servers_each_round() {
        let s = ["a", "b", "c"].map(ratio::tests::spec);
        let names = |r| {
            order(&s, r)
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(0), ["a", "b", "c"]);
        assert_eq!(names(1), ["b", "c", "a"]);
        assert_eq!(names(3), ["a", "b", "c"]);
    }

    #[test]
    fn a_run_is_broken_by_a_bad_exit() {
        let mut r = ratio::tests::run(1, "a", 1.0, 1);
        assert_eq!(r.broken(), None);
        r.exit = Some(1);
        assert!(r.broken().unwrap().contains("exited 1"));
        r.exit = None;
        assert!(r.broken().unwrap().contains("did not exit"));
    }
}
