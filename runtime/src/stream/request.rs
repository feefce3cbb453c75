//! A request on its way through the stream, and its caller's end.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::oneshot;

use super::{Model, StreamError};

/// A request ready for the queue, and its caller's end.
pub(super) type Enqueued<M> = (Request<M>, Pending<<M as Model>::Output>);

pub(super) struct Request<M: Model> {
    pub(super) input: M::Input,
    pub(super) enqueued: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) reply: oneshot::Sender<Result<M::Output, StreamError>>,
}

/// A request in the stream; resolves to its answer. Dropping it abandons the
/// request (its batch runs on; its output is discarded).
#[derive(Debug)]
pub struct Pending<O> {
    pub(super) rx: oneshot::Receiver<Result<O, StreamError>>,
    pub(super) deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<O> Future for Pending<O> {
    type Output = Result<O, StreamError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(r) = Pin::new(&mut self.rx).poll(cx) {
            // A dropped sender means the batcher died without answering.
            return Poll::Ready(r.unwrap_or(Err(StreamError::Closed)));
        }
        match self.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(StreamError::DeadlinePassed)),
            _ => Poll::Pending,
        }
    }
}
