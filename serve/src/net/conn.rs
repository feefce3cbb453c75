//! The service's connections: the idle ones it may close for a new one,
//! its requests in flight, the deadline on request heads and the watched
//! request bodies.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `idle_since` of a connection that is not idle: a head or a request is
/// in progress (or the connection's first head is awaited), or it was
/// already asked to close.
const BUSY: u64 = u64::MAX;

/// Nanoseconds since a process-wide epoch: when connections went idle.
fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(BUSY - 1)
}

/// One HTTP/1.1 connection's request count, kept by the service that answers
/// it and read by its [`TimedIo`] stream, and whether and since when it
/// is idle (for [`Connections::evict_idlest`]).
#[derive(Debug)]
pub(crate) struct Requests {
    /// Requests whose head was complete (the service was called).
    started: AtomicU64,
    /// Whether a request is being answered (its body may still be arriving).
    running: AtomicBool,
    /// Since when the connection has waited for its next request (see
    /// [`now_ns`]), or [`BUSY`].
    idle_since: AtomicU64,
    /// Asks the connection to close once its request in progress, if any,
    /// is answered.
    pub(crate) evict: tokio::sync::Notify,
    /// Asked to close: never idle again.
    evicted: AtomicBool,
}

impl Default for Requests {
    fn default() -> Self {
        Self {
            started: AtomicU64::new(0),
            running: AtomicBool::new(false),
            // The first head is timed from the connection: not idle.
            idle_since: AtomicU64::new(BUSY),
            evict: tokio::sync::Notify::new(),
            evicted: AtomicBool::new(false),
        }
    }
}

impl Requests {
    /// Marks a request started; it runs until the guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.running.store(true, Ordering::Release);
        self.busy();
        Running(self.clone())
    }

    /// A head or request is in progress: not idle.
    fn busy(&self) {
        self.idle_since.store(BUSY, Ordering::Release);
    }
}

/// A request being answered; dropping it (answered or cancelled) ends it,
/// and the connection waits for its next request from then.
pub(crate) struct Running(Arc<Requests>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        // One asked to close stays busy, so that it is not picked again.
        if !self.0.evicted.load(Ordering::Acquire) {
            self.0.idle_since.store(now_ns(), Ordering::Release);
        }
    }
}

/// A server's open connections, so that one out of connection slots can
/// close the one idle longest for a new client (as nginx reuses keep-alive
/// connections): otherwise idle keep-alive connections, each allowed to wait
/// up to the idle timeout, could hold every slot while new clients wait.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    open: std::sync::Mutex<std::collections::HashMap<u64, Arc<Requests>>>,
    next: AtomicU64,
}

impl Connections {
    /// Registers a connection's state until the guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, requests: Arc<Requests>) -> Open {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, requests);
        Open {
            conns: self.clone(),
            id,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Requests>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections with a request in progress.
    pub(crate) fn in_progress(&self) -> usize {
        self.lock()
            .values()
            .filter(|r| r.running.load(Ordering::Acquire))
            .count()
    }

    /// Asks the connection idle longest to close; whether one was idle. A
    /// request that reaches it as it closes is lost to its client, as on
    /// any server that closes idle connections: this runs only when every
    /// slot is taken and a new client waits.
    pub(crate) fn evict_idlest(&self) -> bool {
        let open = self.lock();
        let mut idle: Vec<(u64, &Arc<Requests>)> = open
            .values()
            .map(|r| (r.idle_since.load(Ordering::Acquire), r))
            .filter(|(t, _)| *t != BUSY)
            .collect();
        idle.sort_unstable_by_key(|(t, _)| *t);
        for (t, r) in idle {
            // Busy again since it was read: try the next.
            if r.idle_since
                .compare_exchange(t, BUSY, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                r.evicted.store(true, Ordering::Release);
                r.evict.notify_one();
                return true;
            }
        }
        false
    }
}

/// A registered connection; dropping it unregisters it.
pub(crate) struct Open {
    conns: Arc<Connections>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

/// A connection whose request heads must arrive within `limit` of their
/// first byte, and its first head within `limit` of the connection, while
/// an idle keep-alive connection (no byte of a next request yet) is left to
/// the server's longer idle timeout; and whose writes fail once the client
/// has taken none of the bytes for `write_limit` (its receive window
/// full), so that a client that never reads holds neither a connection
/// slot nor a drain.
///
/// hyper's `header_read_timeout` starts as soon as it waits for a head, so
/// it closes a keep-alive connection idle for that long; a client that
/// sends its next request on it as the close is on its way loses that
/// request (a client's pool commonly keeps idle connections for 90 s). Here
/// a head's clock starts with its first byte, and a body's bytes read while
/// the service answers its request never start it. Two cases are left to the
/// idle timeout: a head whose first bytes arrived together with the
/// previous request (pipelined), and the rest of a body the service did not
/// read (the service then answers with `Connection: close`, see
/// [`WatchedBody`], so the connection does not outlive it).
pub(crate) struct TimedIo<S> {
    io: S,
    requests: Arc<Requests>,
    limit: Duration,
    /// The head being read: the count of requests started before it.
    head: Option<u64>,
    /// When that head must be complete (one timer per connection, reset for
    /// each head).
    clock: Pin<Box<Sleep>>,
    write_limit: Duration,
    /// When a write that could not proceed must have (made when a write
    /// first waits; `None` while writes proceed).
    write_clock: Option<Pin<Box<Sleep>>>,
    /// Whether `write_clock` runs: the last write waited.
    write_waiting: bool,
}

impl<S> TimedIo<S> {
    pub(crate) fn new(
        io: S,
        requests: Arc<Requests>,
        limit: Duration,
        write_limit: Duration,
    ) -> Self {
        // The first head is timed from the connection: a client that
        // connects and sends nothing gives its slot back after `limit`.
        TimedIo {
            io,
            requests,
            limit,
            head: Some(0),
            clock: Box::pin(tokio::time::sleep(limit)),
            write_limit,
            write_clock: None,
            write_waiting: false,
        }
    }

    /// `poll`'s result, timed: a write that keeps waiting (the client takes
    /// none of the bytes) fails after `write_limit`; one that proceeds
    /// stops the clock.
    fn timed_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let r = poll(&mut self.io, cx);
        if r.is_ready() {
            self.write_waiting = false;
            return r;
        }
        let at = tokio::time::Instant::now() + self.write_limit;
        let clock = self
            .write_clock
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if !self.write_waiting {
            self.write_waiting = true;
            clock.as_mut().reset(at);
        }
        if clock.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes of the response in time",
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let started = this.requests.started.load(Ordering::Acquire);
        // A head whose request has started since is complete.
        if this.head.is_some_and(|n| n != started) {
            this.head = None;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.requests.running.load(Ordering::Acquire) {
            return read; // a body: the handler bounds it
        }
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before && this.head.is_none() => {
                this.head = Some(started);
                this.requests.busy();
                let at = tokio::time::Instant::now() + this.limit;
                this.clock.as_mut().reset(at);
            }
            Poll::Pending if this.head.is_some() && this.clock.as_mut().poll(cx).is_ready() => {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete in time",
                )));
            }
            _ => {}
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.timed_write(cx, |io, cx| Pin::new(io).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.timed_write(cx, |io, cx| Pin::new(io).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.timed_write(cx, |io, cx| Pin::new(io).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A request body that records whether it was read to its end, so that a
/// response to a request whose body the service left unread can close the
/// connection (the rest of the body would otherwise be drained after the
/// response, outside any request's deadline).
pub(crate) struct WatchedBody<B> {
    inner: B,
    read: Arc<AtomicBool>,
}

impl<B: http_body::Body> WatchedBody<B> {
    /// `inner`, and the flag set once it has been read to its end (at once
    /// for an empty body).
    pub(crate) fn new(inner: B) -> (Self, Arc<AtomicBool>) {
        let read = Arc::new(AtomicBool::new(inner.is_end_stream()));
        let body = WatchedBody {
            inner,
            read: read.clone(),
        };
        (body, read)
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn timed(io: tokio::io::DuplexStream) -> TimedIo<tokio::io::DuplexStream> {
        let requests = Arc::new(Requests::default());
        TimedIo::new(
            io,
            requests,
            Duration::from_secs(5),
            Duration::from_secs(10),
        )
    }

    /// A response the client takes none of fails after the write limit; one
    /// the client takes slowly, a little at a time, goes on.
    #[tokio::test(start_paused = true)]
    async fn a_write_fails_only_while_the_client_takes_nothing() {
        let (server, _client) = tokio::io::duplex(64);
        let mut io = timed(server);
        let t = tokio::time::Instant::now();
        let e = io.write_all(&[7u8; 1024]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(10) && took < Duration::from_secs(11),
            "{took:?}"
        );

        let (server, mut client) = tokio::io::duplex(64);
        let mut io = timed(server);
        let reader = tokio::spawn(async move {
            let (mut buf, mut n) = ([0u8; 64], 0);
            while n < 1024 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                n += client.read(&mut buf).await.unwrap();
            }
            n
        });
        io.write_all(&[7u8; 1024]).await.unwrap();
        assert_eq!(reader.await.unwrap(), 1024);
    }
}
