//! The Prometheus exporter.

use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::PrometheusBuilder;

use crate::Error;

/// Chunk durations: 10 µs to 100 s, a few buckets a decade.
const CHUNK_BUCKETS: &[f64] =
    &[1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0];

static INSTALLED: OnceLock<SocketAddr> = OnceLock::new();

/// Serves `/metrics` on `addr` (once per process; the recorder is global).
pub(crate) fn install(addr: SocketAddr) -> Result<(), Error> {
    if let Some(prev) = INSTALLED.get() {
        return if *prev == addr {
            Ok(())
        } else {
            Err(Error::Metrics(format!("already serving on {prev}; one exporter per process")))
        };
    }
    let builder = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(CHUNK_BUCKETS)
        .map_err(|e| Error::Metrics(e.to_string()))?;
    // The exporter's HTTP server needs a tokio runtime; give it its own thread
    // so an embedding application's runtime is untouched.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("coexec-metrics".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            rt.block_on(async move {
                match builder.build() {
                    Ok((recorder, server)) => {
                        if let Err(e) = metrics::set_global_recorder(recorder) {
                            let _ = tx.send(Err(e.to_string()));
                            return;
                        }
                        coexec_actors::metrics::describe();
                        let _ = tx.send(Ok(()));
                        let _ = server.await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        })
        .map_err(|e| Error::Metrics(e.to_string()))?;
    rx.recv().map_err(|e| Error::Metrics(e.to_string()))?.map_err(Error::Metrics)?;
    let _ = INSTALLED.set(addr);
    Ok(())
}
