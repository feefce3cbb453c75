//! The server loop of the service and of the metrics exporter:
//! connections bounded and evicted idle-first, request heads and responses
//! under deadlines, and the drain on a signal.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, header};
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics::counter;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::{Connections, Requests, TimedIo, WatchedBody};
use coexec::Error;

/// Longest a client may take to send a request head, from its first byte
/// (the default of [`ServerConfig::head_deadline`]).
pub(crate) const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// Longest a keep-alive connection may sit idle, waiting for the first byte
/// of its next request. Longer than the idle timeouts of common HTTP client
/// pools (90 s for hyper's, reqwest's and Go's), so that the client, not
/// the server, closes an idle connection: when the server does, a request
/// sent on it as the close is on its way is lost. The default of
/// [`ServerConfig::idle_timeout`].
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long [`serve`] lets open connections go on after its signal before
/// it closes the idle ones.
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Default bound on a drain ([`ServerConfig::drain_timeout`]): well inside
/// Kubernetes' default grace period of 30 s, with room for the stream to
/// answer what it queued before the process exits.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a response may wait on a client that does not take its bytes
/// (its socket buffer full), from the last write that made progress, as
/// nginx's `send_timeout`: then the connection closes.
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Largest request head read (larger heads get 431).
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Connections [`serve`] serves at once. A client past it takes the slot of
/// the connection idle longest, which is asked to close; while every
/// connection is busy with a request, it waits (and the ones after it wait
/// in the kernel's accept queue). Keep it below the process's limit of open
/// files (`ulimit -n`).
pub const MAX_CONNECTIONS: usize = 4096;
/// Descriptors kept for everything but connections (the listener, the
/// runtime's threads and files, a profile save) when the connection limit
/// is clamped to the process's limit on open files.
const FD_RESERVE: usize = 64;
/// How often a client waiting for a slot looks again for an idle
/// connection to close, while every connection was busy.
pub(crate) const EVICT_RETRY: Duration = Duration::from_millis(100);
/// How long a connection asked to close for a waiting client has to give
/// its slot back before another is asked.
pub(crate) const EVICT_AGAIN: Duration = Duration::from_secs(1);

/// How [`serve_with`] serves: how many connections at once, how long a
/// client may take over a request head or sit idle, and how long a drain
/// may last. Build with [`ServerConfig::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// let cfg = coexec_serve::ServerConfig::new()
///     .max_connections(512)
///     .drain_timeout(Duration::from_secs(25));
/// assert_eq!(cfg.max_connections_len(), 512);
/// ```
#[derive(Debug, Clone)]
pub struct ServerConfig {
    max_connections: usize,
    drain_timeout: Duration,
    drain_grace: Duration,
    head_deadline: Duration,
    idle_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerConfig {
    /// [`MAX_CONNECTIONS`] connections, a drain of at most
    /// [`DRAIN_TIMEOUT`] after a grace of [`DRAIN_GRACE`], 5 s for a request
    /// head, 120 s idle between requests.
    pub fn new() -> Self {
        Self {
            max_connections: MAX_CONNECTIONS,
            drain_timeout: DRAIN_TIMEOUT,
            drain_grace: DRAIN_GRACE,
            head_deadline: HEAD_DEADLINE,
            idle_timeout: IDLE_TIMEOUT,
        }
    }

    /// Connections served at once (at least one).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.clamp(1, Semaphore::MAX_PERMITS);
        self
    }

    /// Longest the drain after the signal may last; past it the
    /// connections still open are closed, counted in
    /// `coexec_drain_closed_connections_total` and logged.
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// How long open connections go on after the signal before the idle
    /// ones are closed (default [`DRAIN_GRACE`]; at most the drain).
    pub fn drain_grace(mut self, d: Duration) -> Self {
        self.drain_grace = d;
        self
    }

    /// Longest a client may take to send a request head, from its first
    /// byte (default 5 s): a client dripping its head is cut off then.
    pub fn head_deadline(mut self, d: Duration) -> Self {
        self.head_deadline = d;
        self
    }

    /// Longest a keep-alive connection may sit idle before its next
    /// request's first byte (default 120 s, longer than common client
    /// pools' idle timeouts, so that the client closes first).
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// The connection limit set.
    pub fn max_connections_len(&self) -> usize {
        self.max_connections
    }
}

/// How a drain ended, as [`serve_with`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Drained {
    /// Connections still open at the drain's deadline, closed then (a
    /// client not reading its answers, or a request not answered in time).
    pub closed: usize,
    /// Of them, the ones with a request in progress (its answer lost).
    pub in_progress: usize,
}

/// Serves `app` on `listener` until `signal` completes; then accepts the
/// connections already in the listen queue (they get an answer, not a
/// reset), stops accepting, lets open connections go on for up to
/// [`DRAIN_GRACE`] (a draining [`Service`](crate::Service) answers their requests 503 with
/// `Connection: close`), and returns once every connection's requests are
/// answered, or at [`DRAIN_TIMEOUT`] after the signal, closing the
/// connections still open.
///
/// Each connection is its own task; request heads are bounded in size and
/// time, and a response waits at most 10 s on a client that does not read
/// it. At most [`MAX_CONNECTIONS`] are served at once (at shutdown, the
/// ones still in the listen queue come on top): a client past that takes
/// the slot of the keep-alive connection idle longest, which is closed (a
/// request its client sends just then is lost, as on any server that
/// closes idle connections), so idle connections cannot lock new clients
/// out; while every connection has a request in progress, it waits. Use a
/// loopback address unless the service is meant to be reachable from
/// elsewhere.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send,
) -> Drained {
    serve_with(listener, app, signal, ServerConfig::new()).await
}

/// [`serve`] with its connection limit and drain bound from `cfg`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    app: Router,
    signal: impl Future<Output = ()> + Send,
    cfg: ServerConfig,
) -> Drained {
    let (stop_tx, stop) = watch::channel(false);
    let service = TowerToHyperService::new(app);
    let slots = Arc::new(Semaphore::new(within_descriptors(
        cfg.max_connections,
        open_files_limit(),
    )));
    let open = Arc::new(Connections::default());
    let mut conns = tokio::task::JoinSet::new();
    let spawn = |conns: &mut tokio::task::JoinSet<()>,
                 (permit, stream): (Option<OwnedSemaphorePermit>, TcpStream)| {
        let service = service.clone();
        let mut stop = stop.clone();
        let open = open.clone();
        let (head_deadline, idle_timeout) = (cfg.head_deadline, cfg.idle_timeout);
        conns.spawn(async move {
            let requests = Arc::new(Requests::default());
            let _open = open.open(requests.clone());
            let evicted = requests.clone();
            let io = TimedIo::new(stream, requests.clone(), head_deadline, WRITE_DEADLINE);
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let running = requests.start();
                let (parts, body) = req.into_parts();
                let (body, read) = WatchedBody::new(body);
                let answer = service.call(hyper::Request::from_parts(parts, body));
                async move {
                    let mut answer = answer.await;
                    drop(running);
                    // A body left unread would be drained after the answer,
                    // untimed: close instead (a wrong path or method).
                    if let Ok(r) = &mut answer
                        && !read.load(Ordering::Acquire)
                    {
                        r.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    answer
                }
            });
            // hyper's head timeout runs from when it starts waiting for a
            // head, idle time included: here it is the idle timeout, and
            // `TimedIo` times the head itself.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(idle_timeout)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection: {e}");
                    }
                }
                () = async {
                    tokio::select! {
                        _ = stop.wait_for(|s| *s) => {}
                        () = evicted.evict.notified() => {}
                    }
                } => {
                    // Finish the request in progress, then close.
                    conn.as_mut().graceful_shutdown();
                    if let Err(e) = conn.await {
                        tracing::debug!("connection: {e}");
                    }
                }
            }
            drop(permit);
        });
    };
    let mut signal = std::pin::pin!(signal);
    // A client accepted while every slot was taken: it gets the slot of the
    // connection idle longest, asked to close, or the next one freed.
    let mut waiting: Option<TcpStream> = None;
    // When a connection was last asked to close for it: another is asked
    // only when none was idle then, or that one has not closed within
    // `EVICT_AGAIN` (a request slipped in before it closed).
    let mut evicted: Option<tokio::time::Instant> = None;
    loop {
        while conns.try_join_next().is_some() {}
        let c = tokio::select! {
            () = &mut signal => break,
            s = super::accept(&listener, "server"), if waiting.is_none() => {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => (Some(p), s),
                    Err(_) => {
                        evicted = open.evict_idlest().then(tokio::time::Instant::now);
                        waiting = Some(s);
                        continue;
                    }
                }
            }
            p = slots.clone().acquire_owned(), if waiting.is_some() => match (p, waiting.take()) {
                (Ok(p), Some(s)) => (Some(p), s),
                _ => break,
            },
            // Every connection was busy: look again for one gone idle.
            () = tokio::time::sleep(EVICT_RETRY), if waiting.is_some() => {
                if evicted.is_none_or(|t| t.elapsed() >= EVICT_AGAIN) {
                    evicted = open.evict_idlest().then(tokio::time::Instant::now);
                }
                continue;
            }
        };
        spawn(&mut conns, c);
    }
    // Accepted before the signal: answered, even one slot over the limit.
    if let Some(s) = waiting.take() {
        spawn(&mut conns, (slots.clone().try_acquire_owned().ok(), s));
    }
    // The kernel completed these connections' handshakes: closing the
    // listener would reset them, and a client that already sent its request
    // would lose it (seen under load: 1 request in 6900). Taken over the
    // limit if need be: there are only as many as the listen queue held.
    while let Ok(c) = tokio::time::timeout(Duration::ZERO, super::accept(&listener, "server")).await
    {
        spawn(&mut conns, (slots.clone().try_acquire_owned().ok(), c));
    }
    drop(listener);
    let drained = tokio::time::timeout(cfg.drain_timeout, async {
        let _ = tokio::time::timeout(cfg.drain_grace, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        let _ = stop_tx.send(true);
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_ok() {
        return Drained::default();
    }
    let gone = Drained {
        closed: conns.len(),
        in_progress: open.in_progress(),
    };
    conns.shutdown().await;
    counter!("coexec_drain_closed_connections_total").increment(gone.closed as u64);
    tracing::warn!(
        "drain: {} connection(s) still open after {:?} closed, {} with a request in progress",
        gone.closed,
        cfg.drain_timeout,
        gone.in_progress
    );
    gone
}

/// `wanted` connections, or fewer where the process's limit on open files
/// (`limit`, `ulimit -n`) would run out first, with a warning: past that
/// limit `accept` fails, the slots never fill, so idle connections are
/// never evicted and every new client (a liveness probe too) waits.
fn within_descriptors(wanted: usize, limit: Option<usize>) -> usize {
    let Some(limit) = limit else { return wanted };
    let room = limit.saturating_sub(FD_RESERVE).max(1);
    if wanted > room {
        tracing::warn!(
            "{wanted} connections at once is more than the limit of {limit} open files \
             (ulimit -n) leaves room for: serving {room} at once; raise the limit to serve more"
        );
        room
    } else {
        wanted
    }
}

/// The process's soft limit on open files, from `/proc/self/limits`
/// (Linux); `None` where it cannot be read or is unlimited.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Binds `addr` (warning when it is not a loopback address).
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    if !addr.ip().is_loopback() {
        tracing::warn!("serving on {addr}: reachable from other machines, without authentication");
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_clamped_to_the_descriptors_left() {
        assert_eq!(within_descriptors(4096, None), 4096);
        assert_eq!(within_descriptors(4096, Some(1_048_576)), 4096);
        assert_eq!(within_descriptors(4096, Some(1024)), 1024 - FD_RESERVE);
        assert_eq!(within_descriptors(10, Some(20)), 1);
        assert!(open_files_limit().is_none_or(|n| n > 0));
    }
}
