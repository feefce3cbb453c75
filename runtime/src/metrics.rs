//! The Prometheus exporter.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::Error;

use coexec_actors::metrics::{enable_chunk_histograms, render_chunk_histograms, CHUNK_BUCKETS};

/// How often histograms are drained between scrapes (the exporter's default).
const UPKEEP: Duration = Duration::from_secs(5);

static INSTALLED: OnceLock<SocketAddr> = OnceLock::new();

/// Serves `/metrics` on `addr` (once per process; the recorder is global).
///
/// The exporter crate's own listener answers every path with the metrics;
/// a scrape endpoint should answer only its path, so a plain blocking server
/// on its own thread does the HTTP: one request per connection, 404 elsewhere.
pub(crate) fn install(addr: SocketAddr) -> Result<(), Error> {
    if let Some(prev) = INSTALLED.get() {
        return if *prev == addr {
            Ok(())
        } else {
            Err(Error::Metrics(format!(
                "already serving on {prev}; one exporter per process"
            )))
        };
    }
    let listener = TcpListener::bind(addr).map_err(|e| Error::Metrics(format!("{addr}: {e}")))?;
    let recorder = PrometheusBuilder::new()
        .set_buckets(&CHUNK_BUCKETS)
        .map_err(|e| Error::Metrics(e.to_string()))?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| Error::Metrics(e.to_string()))?;
    coexec_actors::metrics::describe();
    enable_chunk_histograms();

    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("coexec-metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP);
            upkeep.run_upkeep();
        })
        .map_err(|e| Error::Metrics(e.to_string()))?;
    std::thread::Builder::new()
        .name("coexec-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = serve(stream, &handle) {
                    tracing::debug!("metrics request: {e}");
                }
            }
        })
        .map_err(|e| Error::Metrics(e.to_string()))?;
    let _ = INSTALLED.set(addr);
    Ok(())
}

/// Answers one request: the exposition text for `GET /metrics`, 404 for any
/// other path, 405 for any other method.
fn serve(stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    // A client that never finishes its request must not stall the next scrape.
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Headers end at the first empty line; their content is not needed.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 0 && !line.trim_end().is_empty() {
        line.clear();
    }
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", handle.render() + &render_chunk_histograms()),
        ("GET", _) => (
            "404 Not Found",
            "not found; metrics are at /metrics\n".to_string(),
        ),
        _ => ("405 Method Not Allowed", "only GET\n".to_string()),
    };
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}
