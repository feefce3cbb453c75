//! The one HTTP server of the service and the metrics exporter
//! ([`server`]): the accept loop (a connection, then a slot, freed by
//! closing the connection idle longest when there is none), the
//! connections' bookkeeping and the deadlines on their request heads and
//! responses ([`conn`]).

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

mod conn;
pub(crate) mod server;
pub(crate) use conn::{Connections, Requests, TimedIo, WatchedBody};

/// How long to wait after a failed accept (out of descriptors and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Whether a minute has passed since the last out-of-descriptors warning.
fn warn_now() -> bool {
    static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
    if due {
        *last = Some(std::time::Instant::now());
    }
    due
}

/// The next connection on `listener`, backing off and trying again when an
/// accept fails. Cancel-safe.
pub(crate) async fn accept(listener: &TcpListener, what: &str) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((s, _)) => return s,
            Err(e) => {
                // Out of descriptors is the operator's to know (at most one
                // warning a minute); other failures are a client's.
                if matches!(e.raw_os_error(), Some(23 | 24)) && warn_now() {
                    tracing::warn!("{what} accept: {e}: clients wait until a connection closes");
                } else {
                    tracing::debug!("{what} accept: {e}");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}
