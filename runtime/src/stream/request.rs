//! A request on its way through the stream, and its caller's end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{Model, StreamError};

/// A request ready for the queue, and its caller's end.
pub(super) type Enqueued<M> = (Request<M>, Pending<<M as Model>::Output>);

pub(super) struct Request<M: Model> {
    pub(super) input: M::Input,
    pub(super) enqueued: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) reply: oneshot::Sender<Reply<M::Output>>,
}

impl<M: Model> Request<M> {
    /// A request enqueued at `now` (its deadline already checked).
    pub(super) fn at(input: M::Input, deadline: Option<Instant>, now: Instant) -> Enqueued<M> {
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            rx,
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
            enqueued: now,
        };
        let req = Request {
            input,
            enqueued: now,
            deadline,
            reply,
        };
        (req, pending)
    }
}

/// An answer, and when its batch's job started.
pub(super) type Reply<O> = Result<(O, Instant), StreamError>;

/// Where a request's time went in the stream, measured
/// ([`Pending::timed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Served {
    /// From the request's arrival in the queue to its batch's job start
    /// (the batch's forming and [`Model::build`](super::Model::build)
    /// included).
    pub queued: Duration,
    /// From its batch's job start to its answer reaching the caller.
    pub inference: Duration,
}

/// A request in the stream; resolves to its answer. Dropping it abandons the
/// request (its batch runs on; its output is discarded).
#[derive(Debug)]
pub struct Pending<O> {
    pub(super) rx: oneshot::Receiver<Reply<O>>,
    pub(super) deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    pub(super) enqueued: Instant,
}

impl<O> Pending<O> {
    fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<Reply<O>> {
        if let Poll::Ready(r) = Pin::new(&mut self.rx).poll(cx) {
            // A dropped sender means the batcher died without answering.
            return Poll::Ready(r.unwrap_or(Err(StreamError::Closed)));
        }
        match self.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(StreamError::DeadlinePassed)),
            _ => Poll::Pending,
        }
    }

    /// The answer and where its time went: its wait in the queue and its
    /// batch's inference, measured on the stream's clock (as TEI's
    /// `x-queue-time` and `x-inference-time` are). Dropping the future
    /// abandons the request, as dropping the `Pending` does.
    pub async fn timed(mut self) -> Result<(O, Served), StreamError> {
        let (out, started) = std::future::poll_fn(|cx| self.poll_reply(cx)).await?;
        let served = Served {
            queued: started.saturating_duration_since(self.enqueued),
            inference: started.elapsed(),
        };
        Ok((out, served))
    }
}

impl<O> Future for Pending<O> {
    type Output = Result<O, StreamError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_reply(cx).map(|r| r.map(|(out, _)| out))
    }
}
