//! The accept loop's steps, shared by the metrics endpoint and the service
//! (a connection slot, then a connection; or, for the service, a connection,
//! then a slot, freed by closing the connection idle longest when there is
//! none); and, for the service, its connections' bookkeeping and the
//! deadlines on their request heads and responses ([`conn`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[cfg(feature = "serve")]
mod conn;
#[cfg(feature = "serve")]
pub(crate) use conn::{Connections, Requests, TimedIo, WatchedBody};

/// How long to wait after a failed accept (out of descriptors and the like).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Waits for a free slot of `slots`, then for a connection on `listener`,
/// backing off and trying again when an accept fails. `None` once `slots`
/// is closed. Cancel-safe: dropping it releases the slot and loses no
/// connection, so callers race it against their stop signal.
pub(crate) async fn accept_bounded(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    what: &str,
) -> Option<(OwnedSemaphorePermit, TcpStream)> {
    let permit = slots.clone().acquire_owned().await.ok()?;
    Some((permit, accept(listener, what).await))
}

/// The next connection on `listener`, backing off and trying again when an
/// accept fails. Cancel-safe.
pub(crate) async fn accept(listener: &TcpListener, what: &str) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((s, _)) => return s,
            Err(e) => {
                tracing::debug!("{what} accept: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}
