//! The open loop: request `i` is scheduled at `start + i / rate` and goes out
//! then, whatever earlier requests are doing, and its latency runs from that
//! scheduled time. A server that falls behind therefore shows its queueing in
//! the latencies instead of slowing the generator down (coordinated
//! omission). Every request ends by itself: answered, refused, timed out, or
//! cut at the run's time limit, so a run never outlasts that limit.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::dataset::Dataset;
use crate::record::Trace;
use crate::report::{Check, Lost, Outcome, RateReport, Tally};
use crate::target::Target;

/// The header carrying each request's index; a server that echoes it lets
/// the generator see an answer meant for another request.
pub(crate) const REQUEST_ID: &str = "x-request-id";

/// The largest answer body read, per row of the request.
const BODY_LIMIT_PER_ROW: usize = 64 * 1024;

/// The HTTP client: HTTP/1.1 with keep-alive, a new connection whenever no
/// idle one is free (so an open loop is never serialized behind one socket).
pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client for up to `max_idle` kept-alive connections.
pub(crate) fn client(max_idle: usize) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

/// One rate's settings.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) rate: f64,
    pub(crate) requests: u64,
    pub(crate) rows_per_request: usize,
    /// Each request's timeout, from its scheduled time.
    pub(crate) timeout: Duration,
    /// The run stops this long after its start.
    pub(crate) duration_limit: Duration,
    /// Requests in flight at most; a request beyond waits for a slot, and
    /// the wait counts in its latency (and as a late send).
    pub(crate) max_in_flight: usize,
}

impl Plan {
    /// When request `i` is due, after the start.
    pub(crate) fn due(&self, i: u64) -> Duration {
        Duration::from_secs_f64(i as f64 / self.rate)
    }
}

/// What a 200 carries.
#[derive(Deserialize)]
struct InferResponse {
    outputs: Vec<InferOutput>,
}

#[derive(Deserialize)]
struct InferOutput {
    label: i64,
    probs: Vec<f64>,
}

/// Checks a 200's body against the rows that were sent.
pub(crate) fn check_body(body: &[u8], rows: &[usize], data: &Dataset) -> Check {
    if data.is_texts() {
        return check_vectors(body, rows.len());
    }
    let resp: InferResponse = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            let head = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
            return Check::Malformed(format!(
                "not {{\"outputs\": [...]}}: {e} (body starts {head:?})"
            ));
        }
    };
    if resp.outputs.len() != rows.len() {
        return Check::Malformed(format!(
            "{} outputs for {} inputs",
            resp.outputs.len(),
            rows.len()
        ));
    }
    if let Some(o) = resp
        .outputs
        .iter()
        .find(|o| o.label < 0 || o.label as usize >= o.probs.len())
    {
        return Check::Malformed(format!(
            "label {} outside its {} probabilities",
            o.label,
            o.probs.len()
        ));
    }
    let correct = rows
        .iter()
        .zip(&resp.outputs)
        .filter(|&(&r, o)| data.labels[r] == o.label)
        .count() as u64;
    let agree = data.predicted.as_ref().map(|p| {
        rows.iter()
            .zip(&resp.outputs)
            .filter(|&(&r, o)| p[r] == o.label)
            .count() as u64
    });
    Check::Valid {
        rows: rows.len() as u64,
        correct: Some(correct),
        agree,
    }
}

/// Checks an embedding service's 200 (`/embed`: `[[f32]]`): one vector per
/// text, all of one width, finite, of unit length (`normalize` defaults
/// to true).
fn check_vectors(body: &[u8], texts: usize) -> Check {
    let v: Vec<Vec<f64>> = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            let head = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
            return Check::Malformed(format!(
                "not [[number, ...], ...]: {e} (body starts {head:?})"
            ));
        }
    };
    if v.len() != texts {
        return Check::Malformed(format!("{} vectors for {texts} texts", v.len()));
    }
    let dim = v.first().map_or(0, Vec::len);
    for (k, x) in v.iter().enumerate() {
        let norm = x.iter().map(|a| a * a).sum::<f64>().sqrt();
        if x.len() != dim || dim == 0 || !(norm - 1.0).abs().lt(&1e-3) {
            return Check::Malformed(format!(
                "vector {k}: {} values of norm {norm} (the first has {dim})",
                x.len()
            ));
        }
    }
    Check::Valid {
        rows: texts as u64,
        correct: None,
        agree: None,
    }
}

/// Sends one request and waits for its answer until `give_up`.
#[allow(clippy::too_many_arguments)]
async fn one(
    client: HttpClient,
    target: Arc<Target>,
    data: Arc<Dataset>,
    index: u64,
    rows: Vec<usize>,
    start: Instant,
    scheduled: Instant,
    give_up: (Instant, Lost),
) -> Outcome {
    let req = Request::post(target.uri.clone())
        .header(HOST, &target.host_header)
        .header(CONTENT_TYPE, "application/json")
        .header(REQUEST_ID, index)
        .body(Full::new(Bytes::from(data.body(&rows))));
    let req = match req {
        Ok(r) => r,
        // The URI and headers were checked before the run; nothing here can
        // fail, but a failure must not pass for an answer.
        Err(_) => {
            return Outcome::Lost {
                index,
                why: Lost::Closed,
            };
        }
    };
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| e.is_connect())?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, BODY_LIMIT_PER_ROW * rows.len().max(1))
            .collect()
            .await
            .map_err(|_| false)?
            .to_bytes();
        Ok::<_, bool>((parts, body))
    };
    match tokio::time::timeout_at(give_up.0, exchange).await {
        Err(_) => Outcome::Lost {
            index,
            why: give_up.1,
        },
        Ok(Err(true)) => Outcome::Refused { index },
        Ok(Err(false)) => Outcome::Lost {
            index,
            why: Lost::Closed,
        },
        Ok(Ok((parts, body))) => {
            let now = Instant::now();
            let check = (parts.status == StatusCode::OK).then(|| {
                let echoed = parts.headers.get(REQUEST_ID).map(|v| v.as_bytes());
                match echoed {
                    Some(id) if id != index.to_string().as_bytes() => Check::Crossed,
                    _ => check_body(&body, &rows, &data),
                }
            });
            Outcome::Answered {
                index,
                status: parts.status.as_u16(),
                latency: now - scheduled,
                retry_after: parts.headers.contains_key(RETRY_AFTER),
                check,
                at: now - start,
            }
        }
    }
}

/// Runs one rate to its end and reports it, with every request's fate in
/// `trace` if one is given.
pub(crate) async fn run(
    client: &HttpClient,
    target: &Arc<Target>,
    data: &Arc<Dataset>,
    plan: &Plan,
    trace: Option<Trace>,
) -> (RateReport, Option<Trace>) {
    // A little lead so the first sends are not late by the setup.
    let lead = Duration::from_millis(5);
    let (start, wall) = (Instant::now() + lead, std::time::SystemTime::now() + lead);
    let mut tally = Tally::new(plan.rate, plan.requests);
    if let Some(mut t) = trace {
        t.reset(plan.rate);
        t.started(wall);
        tally = tally.with_trace(t);
    }
    let slots = Arc::new(Semaphore::new(plan.max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    let deadline = start + plan.duration_limit;
    for i in 0..plan.requests {
        let scheduled = start + plan.due(i);
        if scheduled >= deadline {
            break;
        }
        tokio::time::sleep_until(scheduled).await;
        // Reap what is done so memory stays flat on long runs.
        while let Some(done) = tasks.try_join_next() {
            if let Ok(o) = done {
                tally.record(o);
            }
        }
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            _ = tokio::time::sleep_until(deadline) => break,
        };
        let Ok(slot) = slot else { break };
        tally.sent(i, Instant::now().saturating_duration_since(scheduled));
        let timeout_at = scheduled + plan.timeout;
        let give_up = if timeout_at < deadline {
            (timeout_at, Lost::Timeout)
        } else {
            (deadline, Lost::Cut)
        };
        let fut = one(
            client.clone(),
            target.clone(),
            data.clone(),
            i,
            data.rows_for(i, plan.rows_per_request),
            start,
            scheduled,
            give_up,
        );
        tasks.spawn(async move {
            let o = fut.await;
            drop(slot);
            o
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(o) => tally.record(o),
            // A panicked request task is a bug here, not a server's answer.
            Err(e) => panic!("request task failed: {e}"),
        }
    }
    tally.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn data() -> Dataset {
        let bytes = crate::dataset::tests::file(10, 2, true);
        let path = std::env::temp_dir().join(format!("coexec-load-unit-{}.st", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let d = Dataset::load(Path::new(&path)).unwrap();
        let _ = std::fs::remove_file(&path);
        d
    }

    #[test]
    fn schedule_is_evenly_spaced() {
        let p = Plan {
            rate: 200.0,
            requests: 10,
            rows_per_request: 1,
            timeout: Duration::from_secs(1),
            duration_limit: Duration::from_secs(1),
            max_in_flight: 1,
        };
        assert_eq!(p.due(0), Duration::ZERO);
        assert_eq!(p.due(3), Duration::from_millis(15));
    }

    #[test]
    fn checks_counts_labels_and_shape() {
        let d = data();
        // Labels of rows 3 and 4 are 3 and 4.
        let good =
            br#"{"outputs":[{"label":3,"probs":[0,0,0,1,0]},{"label":4,"probs":[0,0,0,0,1]}]}"#;
        assert_eq!(
            check_body(good, &[3, 4], &d),
            Check::Valid {
                rows: 2,
                correct: Some(2),
                agree: Some(2)
            }
        );
        let swapped =
            br#"{"outputs":[{"label":4,"probs":[0,0,0,0,1]},{"label":3,"probs":[0,0,0,1,0]}]}"#;
        assert_eq!(
            check_body(swapped, &[3, 4], &d),
            Check::Valid {
                rows: 2,
                correct: Some(0),
                agree: Some(0)
            }
        );
        for bad in [
            &br#"{"outputs":[{"label":3,"probs":[0,0,0,1]}]}"#[..],
            br#"{"outputs":[{"label":9,"probs":[1]},{"label":4,"probs":[1,1,1,1,1]}]}"#,
            b"<html>",
            br#"{"output":[]}"#,
        ] {
            assert!(matches!(check_body(bad, &[3, 4], &d), Check::Malformed(_)));
        }
    }
}
