//! Why a request got no output, and a request handed back unqueued.

use std::sync::Arc;

use crate::Error;

/// Why a request got no output.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The queue was full ([`Stream::try_infer`](super::Stream::try_infer), [`Stream::try_infer_many`](super::Stream::try_infer_many));
    /// nothing was enqueued. Worth trying again later.
    #[error("overloaded: the queue of {capacity} requests is full")]
    Overloaded {
        /// The queue's capacity.
        capacity: usize,
    },
    /// More inputs in one [`Stream::try_infer_many`](super::Stream::try_infer_many) call than the queue
    /// can ever hold; nothing was enqueued, and trying again cannot help.
    #[error("{inputs} inputs in one call; the queue holds at most {capacity}")]
    TooMany {
        /// The inputs in the call.
        inputs: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The model refused the input ([`Model::check_input`](super::Model::check_input));
    /// nothing was enqueued. `index` is its place in a
    /// [`Stream::try_infer_many`](super::Stream::try_infer_many) call (0 for one input).
    #[error("input {index} refused: {why}")]
    Invalid {
        /// The refused input's place in the call.
        index: usize,
        /// Why, in the model's words.
        why: String,
    },
    /// The model refused the request's output
    /// ([`Model::check_output`](super::Model::check_output): values that
    /// are not finite, say); the other requests of its batch got theirs.
    #[error("output refused: {why}")]
    Output {
        /// Why, in the model's words.
        why: String,
    },
    /// The request's deadline passed before its output was ready.
    #[error("deadline passed")]
    DeadlinePassed,
    /// The job of the request's batch failed (shared by the whole batch).
    #[error("batch failed: {0}")]
    Failed(#[source] Arc<Error>),
    /// The stream is shut down. (A panic in the model is
    /// [`StreamError::Failed`] with [`KernelError::Panicked`](coexec_kernels::KernelError::Panicked).)
    #[error("stream closed")]
    Closed,
}

/// A request that [`Stream::try_infer`](super::Stream::try_infer) (or [`Stream::try_infer_many`](super::Stream::try_infer_many)) did
/// not enqueue, with its input given back: a caller can retry it later or
/// send it elsewhere without a copy (see [`Stream::try_infer`](super::Stream::try_infer)'s example).
///
/// `?` turns it into its [`StreamError`] and drops the input. Into other
/// error types (`Box<dyn Error + Send + Sync>`, `anyhow::Error`) `?` carries
/// the input along and needs it to be `Sync`; `.map_err(StreamError::from)?`
/// keeps only the error.
pub struct Rejected<I> {
    input: I,
    error: StreamError,
}

impl<I> Rejected<I> {
    pub(crate) fn new(input: I, error: StreamError) -> Self {
        Rejected { input, error }
    }

    /// Why the request was not enqueued: [`StreamError::Overloaded`],
    /// [`StreamError::TooMany`], [`StreamError::Invalid`],
    /// [`StreamError::DeadlinePassed`], [`StreamError::Closed`], or
    /// [`StreamError::Failed`] for a panic in the model's check.
    pub fn error(&self) -> &StreamError {
        &self.error
    }

    /// The input, as it was passed in.
    pub fn into_input(self) -> I {
        self.input
    }

    /// The input and the error.
    pub fn into_parts(self) -> (I, StreamError) {
        (self.input, self.error)
    }
}

// Not derived: the input need not be `Debug`, and may be large.
impl<I> std::fmt::Debug for Rejected<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<I> std::fmt::Display for Rejected<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<I> std::error::Error for Rejected<I> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl<I> From<Rejected<I>> for StreamError {
    fn from(r: Rejected<I>) -> Self {
        r.error
    }
}
