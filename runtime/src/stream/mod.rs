//! Streaming inference: single requests in, batches out, each batch one job.
//!
//! ```text
//!  callers ──infer / try_infer──▶ bounded queue ──▶ batcher ──batch (max size / max wait)──▶
//!     ▲                          (full: Overloaded)     │          Model::build → Runtime::run_with
//!     └──────── one answer each: output, Overloaded, DeadlinePassed, Failed ◀── Model::outputs
//! ```
//!
//! A [`Model`] says how to make one kernel from a batch of inputs and how to
//! take each input's output back out of it. [`Stream::start`] gives a cheap,
//! cloneable handle. The batcher closes a batch when it holds
//! [`StreamConfig::max_batch`] requests or when its oldest request has waited
//! [`StreamConfig::max_wait`], and submits it as a job to the [`Runtime`]; up
//! to [`StreamConfig::in_flight`] batches run at once, so the next batch can
//! start on one device class while another still runs the previous one.
//!
//! Batches are too short to probe: each runs on the speed models the
//! profiler learned from earlier batches, on the class predicted to finish it
//! first, or split across classes when that is sooner by more than the
//! split's added fixed cost is worth at the current load
//! ([`Placement::Hybrid`]; [`Placement::Greedy`] for Triton's whole batches
//! to the first free class).
//!
//! Every request is answered exactly once: its own output, or
//! [`StreamError::Overloaded`], [`StreamError::DeadlinePassed`],
//! [`StreamError::Failed`] (its batch's job failed), [`StreamError::Closed`].
//!
//! ```
//! use std::sync::Arc;
//! use coexec::stream::{Model, Stream, StreamConfig};
//! use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
//!
//! /// Doubles each input.
//! struct Double;
//! struct DoubleKernel { x: Vec<u64>, out: DisjointBuf<u64> }
//!
//! impl Kernel for DoubleKernel {
//!     fn name(&self) -> &str { "double" }
//!     fn items(&self) -> usize { self.x.len() }
//!     fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
//!         let out = self.out.chunk_mut(chunk); // exactly this chunk's outputs
//!         for (o, x) in out.iter_mut().zip(&self.x[chunk.range()]) { *o = 2 * x; }
//!         Ok(())
//!     }
//! }
//!
//! impl Model for Double {
//!     type Input = u64;
//!     type Output = u64;
//!     type Kernel = DoubleKernel;
//!     fn build(&self, x: Vec<u64>) -> Result<DoubleKernel, KernelError> {
//!         let out = DisjointBuf::new(x.len(), 1);
//!         Ok(DoubleKernel { x, out })
//!     }
//!     fn outputs(&self, k: DoubleKernel) -> Result<Vec<u64>, KernelError> {
//!         Ok(k.out.into_vec())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rt = Arc::new(coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().start().await?);
//! let stream = Stream::start(rt.clone(), Double, StreamConfig::new().max_batch(32))?;
//! assert_eq!(stream.infer(21).await?, 42);
//! stream.shutdown().await;
//! // The stream has let go of the runtime: shut it down too (it saves its
//! // profile), or keep it for other work.
//! Arc::try_unwrap(rt).map_err(|_| "the runtime is still shared")?.shutdown().await;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use coexec_kernels::{Kernel, KernelError};
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::host::HostCall;
use crate::{Error, JobOptions, Runtime};

mod place;

pub use place::Placement;
use place::{Learned, Placer};

/// How to serve a model over coexec: one kernel per batch of inputs.
///
/// `build` gets the inputs of a batch in arrival order; `outputs` must give
/// back exactly one output per input, in the same order (a batch whose
/// `outputs` has another length fails as a whole, so no caller ever receives
/// another's output).
///
/// An error or a panic in either fails its batch alone
/// ([`StreamError::Failed`]); the stream goes on, and calls the same model
/// for the next batches. A model with state of its own (a cache, a `Mutex`)
/// must leave it usable when it panics.
pub trait Model: Send + Sync + 'static {
    /// One request's input.
    type Input: Send + 'static;
    /// One request's output.
    type Output: Send + 'static;
    /// The kernel that computes a batch.
    type Kernel: Kernel;
    /// The kernel for a batch of inputs.
    fn build(&self, inputs: Vec<Self::Input>) -> Result<Self::Kernel, KernelError>;
    /// The outputs of a finished kernel, one per input, in order.
    fn outputs(&self, kernel: Self::Kernel) -> Result<Vec<Self::Output>, KernelError>;
}

/// Why a request got no output.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The queue was full ([`Stream::try_infer`], [`Stream::try_infer_many`]);
    /// nothing was enqueued. Worth trying again later.
    #[error("overloaded: the queue of {capacity} requests is full")]
    Overloaded {
        /// The queue's capacity.
        capacity: usize,
    },
    /// More inputs in one [`Stream::try_infer_many`] call than the queue
    /// can ever hold; nothing was enqueued, and trying again cannot help.
    #[error("{inputs} inputs in one call; the queue holds at most {capacity}")]
    TooMany {
        /// The inputs in the call.
        inputs: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The request's deadline passed before its output was ready.
    #[error("deadline passed")]
    DeadlinePassed,
    /// The job of the request's batch failed (shared by the whole batch).
    #[error("batch failed: {0}")]
    Failed(#[source] Arc<Error>),
    /// The stream is shut down. (A panic in the model is
    /// [`StreamError::Failed`] with [`KernelError::Panicked`].)
    #[error("stream closed")]
    Closed,
}

/// A request that [`Stream::try_infer`] (or [`Stream::try_infer_many`]) did
/// not enqueue, with its input given back: a caller can retry it later or
/// send it elsewhere without a copy (see [`Stream::try_infer`]'s example).
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
    /// [`StreamError::TooMany`], [`StreamError::DeadlinePassed`] or
    /// [`StreamError::Closed`].
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

/// Timings of one batch, given to [`StreamConfig::on_batch`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct BatchTiming {
    /// Requests that reached the kernel.
    pub size: usize,
    /// How long the oldest request waited in the queue before the batch closed.
    pub oldest_wait: Duration,
    /// The waits of all `size` requests, summed (their mean is this over `size`).
    pub total_wait: Duration,
    /// The stream's own time before the job: dropping abandoned and expired
    /// requests, and [`Model::build`].
    pub prepare: Duration,
    /// The job: [`Runtime::run_with`], from call to return.
    pub run: Duration,
    /// The stream's own time after the job: [`Model::outputs`] and handing
    /// every output to its caller.
    pub deliver: Duration,
}

impl BatchTiming {
    /// The stream path's own cost: `prepare + deliver`.
    pub fn overhead(&self) -> Duration {
        self.prepare + self.deliver
    }
}

type Observer = Arc<dyn Fn(&BatchTiming) + Send + Sync>;

/// The batcher's limits. Build with [`StreamConfig::new`] and its setters.
///
/// ```
/// use std::time::Duration;
/// let cfg = coexec::stream::StreamConfig::new()
///     .max_batch(64)
///     .max_wait(Duration::from_millis(2))
///     .queue(1024);
/// assert_eq!(cfg.max_batch_len(), 64);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct StreamConfig {
    max_batch: usize,
    max_wait: Duration,
    queue: usize,
    in_flight: usize,
    job: JobOptions,
    placement: Placement,
    on_batch: Option<Observer>,
}

impl std::fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamConfig")
            .field("max_batch", &self.max_batch)
            .field("max_wait", &self.max_wait)
            .field("queue", &self.queue)
            .field("in_flight", &self.in_flight)
            .field("job", &self.job)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamConfig {
    /// Batches of up to 32 requests, 1 ms wait, a queue of 1024, 2 batches in flight.
    pub fn new() -> Self {
        Self {
            max_batch: 32,
            max_wait: Duration::from_millis(1),
            queue: 1024,
            in_flight: 2,
            job: JobOptions::default(),
            placement: Placement::Hybrid,
            on_batch: None,
        }
    }

    /// Most requests in one batch.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    /// Longest a batch waits for more requests after its oldest arrived,
    /// kept to within tens of µs (not tokio's 1 ms timer tick); zero sends a
    /// batch with whatever is queued when it forms.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Requests the queue holds before [`Stream::try_infer`] answers
    /// overloaded (and [`Stream::infer`] waits for room): those not yet in a
    /// batch. The batch forming takes its requests out of the queue, so up to
    /// `max_batch` more may be accepted while it waits for company; at most
    /// [`StreamConfig::MAX_QUEUE`].
    pub fn queue(mut self, n: usize) -> Self {
        self.queue = n;
        self
    }

    /// Batches running at once (each a job; the runtime places them); at
    /// most [`StreamConfig::MAX_IN_FLIGHT`].
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = n;
        self
    }

    /// The options of every batch's job. A policy or device classes set
    /// here take the placement's place ([`Placement::Runtime`]).
    pub fn job(mut self, opts: JobOptions) -> Self {
        if opts.policy.is_some() || opts.classes.is_some() {
            self.placement = Placement::Runtime;
        }
        self.job = opts;
        self
    }

    /// Where batches run (default [`Placement::Hybrid`]).
    pub fn placement(mut self, p: Placement) -> Self {
        self.placement = p;
        self
    }

    /// Called once per batch that reached a kernel, on the task that ran it
    /// (keep it short: it is on the path to the next batch's callers).
    pub fn on_batch(mut self, f: impl Fn(&BatchTiming) + Send + Sync + 'static) -> Self {
        self.on_batch = Some(Arc::new(f));
        self
    }

    /// The longest [`StreamConfig::max_wait`] accepted: a batch that waits
    /// longer for company than a client waits for its answer serves no one.
    pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(10);

    /// The largest [`StreamConfig::queue`] accepted (what tokio's bounded
    /// channel can count; the queue allocates as it fills, not up front).
    pub const MAX_QUEUE: usize = Semaphore::MAX_PERMITS;

    /// The largest [`StreamConfig::in_flight`] accepted.
    pub const MAX_IN_FLIGHT: usize = Semaphore::MAX_PERMITS;

    /// The batch limit set.
    pub fn max_batch_len(&self) -> usize {
        self.max_batch
    }

    fn check(&self) -> Result<(), Error> {
        for (what, v) in [
            ("stream max_batch", self.max_batch),
            ("stream queue", self.queue),
            ("stream in_flight", self.in_flight),
        ] {
            if v == 0 {
                return Err(Error::Config {
                    what,
                    why: "must be at least 1".into(),
                });
            }
        }
        for (what, v, most) in [
            ("stream queue", self.queue, Self::MAX_QUEUE),
            ("stream in_flight", self.in_flight, Self::MAX_IN_FLIGHT),
        ] {
            if v > most {
                return Err(Error::Config {
                    what,
                    why: format!("{v} is more than {most}"),
                });
            }
        }
        if self.max_wait > Self::MAX_WAIT_LIMIT {
            return Err(Error::Config {
                what: "stream max_wait",
                why: format!(
                    "{:?} is longer than a batch may wait ({:?} at most)",
                    self.max_wait,
                    Self::MAX_WAIT_LIMIT
                ),
            });
        }
        Ok(())
    }
}

/// A request ready for the queue, and its caller's end.
type Enqueued<M> = (Request<M>, Pending<<M as Model>::Output>);

struct Request<M: Model> {
    input: M::Input,
    enqueued: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Result<M::Output, StreamError>>,
}

struct Shared {
    close: Notify,
    done: watch::Receiver<bool>,
    capacity: usize,
}

/// A cheap, cloneable handle to a batching stream over a [`Model`].
///
/// Dropping every handle closes the stream once its queue is drained; so does
/// [`Stream::shutdown`], which also waits for it.
pub struct Stream<M: Model> {
    tx: mpsc::Sender<Request<M>>,
    shared: Arc<Shared>,
}

impl<M: Model> Clone for Stream<M> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<M: Model> std::fmt::Debug for Stream<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("queued", &self.queued())
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

impl<M: Model> Stream<M> {
    /// Starts the batcher on the current tokio runtime. Errors on a zero
    /// limit or outside a tokio runtime.
    pub fn start(rt: Arc<Runtime>, model: M, cfg: StreamConfig) -> Result<Self, Error> {
        cfg.check()?;
        let handle = tokio::runtime::Handle::try_current().map_err(|e| Error::Config {
            what: "stream",
            why: format!("must start inside a tokio runtime: {e}"),
        })?;
        let (tx, rx) = mpsc::channel(cfg.queue);
        let (done_tx, done) = watch::channel(false);
        let shared = Arc::new(Shared {
            close: Notify::new(),
            done,
            capacity: cfg.queue,
        });
        let placer = (cfg.placement != Placement::Runtime).then(|| {
            let workers: Vec<usize> = rt.classes().iter().map(|c| c.workers).collect();
            Arc::new(std::sync::Mutex::new(Placer::new(cfg.placement, &workers)))
        });
        let batcher = Batcher {
            rt,
            placer,
            epoch: Instant::now(),
            model: Arc::new(model),
            calls: Arc::default(),
            cfg,
            rx,
            shared: shared.clone(),
        };
        handle.spawn(async move {
            batcher.run().await;
            let _ = done_tx.send(true);
        });
        Ok(Self { tx, shared })
    }

    /// The output for `input`, waiting for room in the queue first.
    ///
    /// Dropping the future before it is enqueued enqueues nothing; after, the
    /// request still runs with its batch and its output is discarded.
    pub async fn infer(&self, input: M::Input) -> Result<M::Output, StreamError> {
        self.enqueue(input, None).await?.await
    }

    /// [`Stream::infer`] with a deadline: [`StreamError::DeadlinePassed`] if
    /// neither room in the queue nor the output came by then.
    pub async fn infer_by(
        &self,
        input: M::Input,
        deadline: Instant,
    ) -> Result<M::Output, StreamError> {
        match tokio::time::timeout_at(deadline.into(), self.enqueue(input, Some(deadline))).await {
            Ok(pending) => pending?.await,
            Err(_) => Err(StreamError::DeadlinePassed),
        }
    }

    /// Enqueues `input` at once, or gives it back with
    /// [`StreamError::Overloaded`] when the queue is full
    /// ([`StreamError::Closed`] once the stream is shut down). Await the
    /// [`Pending`] for the output.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use coexec::stream::{Model, Stream, StreamConfig, StreamError};
    /// # use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
    /// # struct Echo;
    /// # struct EchoKernel { x: Vec<u64>, out: DisjointBuf<u64> }
    /// # impl Kernel for EchoKernel {
    /// #     fn name(&self) -> &str { "echo" }
    /// #     fn items(&self) -> usize { self.x.len() }
    /// #     fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
    /// #         self.out.chunk_mut(c).copy_from_slice(&self.x[c.range()]); Ok(())
    /// #     }
    /// # }
    /// # impl Model for Echo {
    /// #     type Input = u64; type Output = u64; type Kernel = EchoKernel;
    /// #     fn build(&self, x: Vec<u64>) -> Result<EchoKernel, KernelError> {
    /// #         let out = DisjointBuf::new(x.len(), 1); Ok(EchoKernel { x, out })
    /// #     }
    /// #     fn outputs(&self, k: EchoKernel) -> Result<Vec<u64>, KernelError> { Ok(k.out.into_vec()) }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = Arc::new(coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?);
    /// let stream = Stream::start(rt, Echo, StreamConfig::new().queue(4))?;
    /// let (mut pending, mut later) = (Vec::new(), Vec::new());
    /// for x in 0..100 {
    ///     match stream.try_infer(x) {
    ///         Ok(p) => pending.push(p),
    ///         // Full: the input comes back, to retry later or send elsewhere.
    ///         Err(rejected) => later.push(rejected.into_input()),
    ///     }
    /// }
    /// let mut answers = Vec::new();
    /// for p in pending {
    ///     answers.push(p.await?);
    /// }
    /// for x in later {
    ///     answers.push(stream.infer(x).await?); // waits for room
    /// }
    /// answers.sort();
    /// assert_eq!(answers, (0..100).collect::<Vec<_>>()); // none lost
    /// # stream.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn try_infer(&self, input: M::Input) -> Result<Pending<M::Output>, Rejected<M::Input>> {
        self.try_infer_inner(input, None)
    }

    /// [`Stream::try_infer`] with a deadline; an input whose deadline has
    /// already passed comes back with [`StreamError::DeadlinePassed`].
    pub fn try_infer_by(
        &self,
        input: M::Input,
        deadline: Instant,
    ) -> Result<Pending<M::Output>, Rejected<M::Input>> {
        self.try_infer_inner(input, Some(deadline))
    }

    /// Enqueues all of `inputs`, in order, or none of them: one request of
    /// many rows is admitted whole or given back whole, with
    /// [`StreamError::Overloaded`] when the queue has fewer free places than
    /// `inputs`, [`StreamError::TooMany`] when there are more inputs than its
    /// [`capacity`](Stream::capacity), or [`StreamError::Closed`]; no place
    /// in the queue is taken by a call it refuses. No inputs: `Ok` with no
    /// [`Pending`] (while the stream is open).
    ///
    /// Only admission is all-or-nothing. The admitted inputs keep their
    /// order, but other callers' requests may enter the queue between them,
    /// so they may run in different batches and end differently (one
    /// [`Pending`] per input, in order: some outputs, some
    /// [`StreamError::Failed`] or [`StreamError::DeadlinePassed`]). A call
    /// needs all its places free at one moment: under a steady stream of
    /// single requests, or while [`Stream::infer`] callers wait for room
    /// (they are served first), a large call may be refused again and again.
    /// A deadline already past is checked first, so such a call gets
    /// [`StreamError::DeadlinePassed`] whatever the queue holds.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use coexec::stream::{Model, Stream, StreamConfig, StreamError};
    /// # use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
    /// # struct Echo;
    /// # struct EchoKernel { x: Vec<u64>, out: DisjointBuf<u64> }
    /// # impl Kernel for EchoKernel {
    /// #     fn name(&self) -> &str { "echo" }
    /// #     fn items(&self) -> usize { self.x.len() }
    /// #     fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
    /// #         self.out.chunk_mut(c).copy_from_slice(&self.x[c.range()]); Ok(())
    /// #     }
    /// # }
    /// # impl Model for Echo {
    /// #     type Input = u64; type Output = u64; type Kernel = EchoKernel;
    /// #     fn build(&self, x: Vec<u64>) -> Result<EchoKernel, KernelError> {
    /// #         let out = DisjointBuf::new(x.len(), 1); Ok(EchoKernel { x, out })
    /// #     }
    /// #     fn outputs(&self, k: EchoKernel) -> Result<Vec<u64>, KernelError> { Ok(k.out.into_vec()) }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = Arc::new(coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?);
    /// let stream = Stream::start(rt, Echo, StreamConfig::new().queue(8))?;
    /// let mut outputs = Vec::new();
    /// for p in stream.try_infer_many(vec![1, 2, 3])? {
    ///     outputs.push(p.await?);
    /// }
    /// assert_eq!(outputs, [1, 2, 3]);
    /// // More rows than the queue can ever hold: all of them come back.
    /// let rejected = stream.try_infer_many((0..9).collect()).unwrap_err();
    /// assert!(matches!(rejected.error(), StreamError::TooMany { inputs: 9, capacity: 8 }));
    /// assert_eq!(rejected.into_input().len(), 9);
    /// # stream.shutdown().await;
    /// # Ok(()) }
    /// ```
    // The whole type in the signature reads better than an alias would.
    #[allow(clippy::type_complexity)]
    pub fn try_infer_many(
        &self,
        inputs: Vec<M::Input>,
    ) -> Result<Vec<Pending<M::Output>>, Rejected<Vec<M::Input>>> {
        self.try_infer_many_inner(inputs, None)
    }

    /// [`Stream::try_infer_many`] with one deadline for all the inputs.
    // The whole type in the signature reads better than an alias would.
    #[allow(clippy::type_complexity)]
    pub fn try_infer_many_by(
        &self,
        inputs: Vec<M::Input>,
        deadline: Instant,
    ) -> Result<Vec<Pending<M::Output>>, Rejected<Vec<M::Input>>> {
        self.try_infer_many_inner(inputs, Some(deadline))
    }

    /// Requests waiting in the queue (not yet in a batch).
    pub fn queued(&self) -> usize {
        self.shared.capacity - self.tx.capacity()
    }

    /// The queue's capacity.
    pub fn capacity(&self) -> usize {
        self.shared.capacity
    }

    /// Stops taking requests (new ones get [`StreamError::Closed`]), answers
    /// every queued and running one, and returns when the last is answered.
    /// The stream then holds no reference to its [`Runtime`]: the caller's
    /// `Arc` may be unwrapped for [`Runtime::shutdown`] (see the module
    /// example). Dropping every handle instead also answers what is queued,
    /// in the background.
    pub async fn shutdown(&self) {
        self.shared.close.notify_one();
        let mut done = self.shared.done.clone();
        // An error means the batcher is gone, which is done as well.
        let _ = done.wait_for(|d| *d).await;
    }

    fn request(
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Enqueued<M>, Rejected<M::Input>> {
        let now = Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            return Err(Rejected::new(input, StreamError::DeadlinePassed));
        }
        Ok(Self::request_at(input, deadline, now))
    }

    /// A request enqueued at `now` (its deadline already checked).
    fn request_at(input: M::Input, deadline: Option<Instant>, now: Instant) -> Enqueued<M> {
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            rx,
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
        };
        let req = Request {
            input,
            enqueued: now,
            deadline,
            reply,
        };
        (req, pending)
    }

    async fn enqueue(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Pending<M::Output>, StreamError> {
        let (req, pending) = Self::request(input, deadline)?;
        self.tx.send(req).await.map_err(|_| StreamError::Closed)?;
        Ok(pending)
    }

    fn try_infer_inner(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Pending<M::Output>, Rejected<M::Input>> {
        let (req, pending) = Self::request(input, deadline)?;
        match self.tx.try_send(req) {
            Ok(()) => Ok(pending),
            Err(mpsc::error::TrySendError::Full(req)) => Err(Rejected::new(
                req.input,
                StreamError::Overloaded {
                    capacity: self.shared.capacity,
                },
            )),
            Err(mpsc::error::TrySendError::Closed(req)) => {
                Err(Rejected::new(req.input, StreamError::Closed))
            }
        }
    }

    // The whole type in the signature reads better than an alias would.
    #[allow(clippy::type_complexity)]
    fn try_infer_many_inner(
        &self,
        inputs: Vec<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Pending<M::Output>>, Rejected<Vec<M::Input>>> {
        let now = Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            return Err(Rejected::new(inputs, StreamError::DeadlinePassed));
        }
        // tokio answers `Full` to a call larger than the queue even when it
        // is closed: closed first, then a call that can never fit.
        if self.tx.is_closed() {
            return Err(Rejected::new(inputs, StreamError::Closed));
        }
        let capacity = self.shared.capacity;
        if inputs.len() > capacity {
            let n = inputs.len();
            return Err(Rejected::new(
                inputs,
                StreamError::TooMany {
                    inputs: n,
                    capacity,
                },
            ));
        }
        // All the places at once, or none: the queue never holds part of a call.
        let permits = match self.tx.try_reserve_many(inputs.len()) {
            Ok(permits) => permits,
            Err(mpsc::error::TrySendError::Full(())) => {
                return Err(Rejected::new(inputs, StreamError::Overloaded { capacity }));
            }
            Err(mpsc::error::TrySendError::Closed(())) => {
                return Err(Rejected::new(inputs, StreamError::Closed));
            }
        };
        let mut pending = Vec::with_capacity(inputs.len());
        for (permit, input) in permits.zip(inputs) {
            let (req, p) = Self::request_at(input, deadline, now);
            permit.send(req);
            pending.push(p);
        }
        Ok(pending)
    }
}

/// A request in the stream; resolves to its answer. Dropping it abandons the
/// request (its batch runs on; its output is discarded).
#[derive(Debug)]
pub struct Pending<O> {
    rx: oneshot::Receiver<Result<O, StreamError>>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
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

/// Resolves at `at`, to within a thread's sleep precision (tens of µs on
/// Linux). tokio's timer rounds a deadline up to its next 1 ms tick, which
/// made a 200 µs `max_wait` wait ~1.3 ms and a zero one ~1 ms per row
/// (measured on `coexec serve --devices cpu:1`, 16-row requests at 100/s:
/// mean queue wait per row 1.27 ms at 200 µs, 1.10 ms at 0, 2.10 ms at the
/// 1000 µs default). So tokio waits out all but the last 2 ms, and a
/// blocking-pool thread sleeps the rest; one such thread per forming batch
/// at most, for at most 2 ms after the batch no longer needs it.
async fn wait_until(at: Instant) {
    const FINE: Duration = Duration::from_millis(2);
    if let Some(coarse) = at.checked_sub(FINE) {
        if coarse > Instant::now() {
            tokio::time::sleep_until(coarse.into()).await;
        }
    }
    let rest = at.saturating_duration_since(Instant::now());
    if !rest.is_zero() {
        // A failed join (the runtime shutting down) ends the wait as well.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

/// The task that forms batches and starts their jobs.
struct Batcher<M: Model> {
    rt: Arc<Runtime>,
    /// `None` under [`Placement::Runtime`].
    placer: Option<Arc<std::sync::Mutex<Placer>>>,
    /// The placer's clock starts here.
    epoch: Instant,
    model: Arc<M>,
    calls: Arc<ModelCalls>,
    cfg: StreamConfig,
    rx: mpsc::Receiver<Request<M>>,
    shared: Arc<Shared>,
}

impl<M: Model> Batcher<M> {
    async fn run(mut self) {
        let slots = Arc::new(Semaphore::new(self.cfg.in_flight));
        let mut running = JoinSet::new();
        let mut closing = false;
        loop {
            while running.try_join_next().is_some() {}
            // A batch forms only once it can start: while every slot is busy,
            // requests wait in the queue, which is what fills it.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let first = if closing {
                self.rx.recv().await
            } else {
                tokio::select! {
                    r = self.rx.recv() => r,
                    () = self.shared.close.notified() => {
                        closing = true;
                        self.rx.close();
                        self.rx.recv().await
                    }
                }
            };
            let Some(first) = first else { break };
            // `max_wait` is checked at start; a far deadline saturates.
            let close_at = first
                .enqueued
                .checked_add(self.cfg.max_wait)
                .unwrap_or(first.enqueued + StreamConfig::MAX_WAIT_LIMIT);
            let mut batch = Vec::with_capacity(self.cfg.max_batch.min(1024));
            batch.push(first);
            // One wait per batch, polled across arrivals.
            let wait = wait_until(close_at);
            tokio::pin!(wait);
            while batch.len() < self.cfg.max_batch {
                match self.rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) if closing => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    // Past `close_at` (always so with a zero `max_wait`) the
                    // batch goes with what is queued, without a timer.
                    Err(mpsc::error::TryRecvError::Empty) if Instant::now() >= close_at => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        // A close while the batch forms sends it at once:
                        // shutdown drains the queue, it does not wait out
                        // `max_wait`.
                        tokio::select! {
                            r = self.rx.recv() => match r {
                                Some(r) => batch.push(r),
                                None => break,
                            },
                            () = &mut wait => break,
                            () = self.shared.close.notified() => {
                                closing = true;
                                self.rx.close();
                            }
                        }
                    }
                }
            }
            let closed = Instant::now();
            // Items still queued behind this batch: the placer keeps every
            // class busy while there are any.
            let backlog = self.rx.len();
            let job = BatchJob {
                rt: self.rt.clone(),
                placer: self.placer.clone(),
                epoch: self.epoch,
                model: self.model.clone(),
                calls: self.calls.clone(),
                opts: self.cfg.job.clone(),
                on_batch: self.cfg.on_batch.clone(),
            };
            running.spawn(async move {
                job.run(batch, closed, backlog).await;
                drop(slot);
            });
        }
        while running.join_next().await.is_some() {}
    }
}

/// One batch's job, run on its own task.
struct BatchJob<M: Model> {
    rt: Arc<Runtime>,
    placer: Option<Arc<std::sync::Mutex<Placer>>>,
    epoch: Instant,
    model: Arc<M>,
    calls: Arc<ModelCalls>,
    opts: JobOptions,
    on_batch: Option<Observer>,
}

/// Where the model's callbacks run (see [`HostCall`]): a model that builds
/// its kernel in microseconds keeps doing so inline, one that takes longer
/// is moved off the executor.
#[derive(Debug, Default)]
struct ModelCalls {
    build: HostCall,
    outputs: HostCall,
}

fn lock(p: &std::sync::Mutex<Placer>) -> std::sync::MutexGuard<'_, Placer> {
    // The placer's state stays consistent across a panic (none is expected).
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs user code named `what`; a panic in it becomes
/// [`KernelError::Panicked`] with `what` in its message.
fn catch_in<T>(what: &str, f: impl FnOnce() -> Result<T, KernelError>) -> Result<T, KernelError> {
    KernelError::catch(f).map_err(|e| match e {
        KernelError::Panicked(m) => KernelError::Panicked(format!("in {what}: {m}")),
        e => e,
    })
}

/// A batch's place with the placer, given back exactly once: by
/// [`PlaceGuard::learn`] with what the batch's report teaches, or on drop
/// (a panic, a cancelled task) with nothing learned.
struct PlaceGuard<'a> {
    placer: Option<&'a std::sync::Mutex<Placer>>,
    ticket: Option<u64>,
    /// The placer's clock's zero.
    epoch: Instant,
}

impl PlaceGuard<'_> {
    /// Frees the batch's place and learns from its report (`None`: failed).
    fn learn(mut self, report: Option<&crate::RunReport>) {
        let (Some(p), Some(t)) = (self.placer, self.ticket.take()) else {
            return;
        };
        let learned: Vec<Learned> = report.map_or(Vec::new(), |r| {
            r.classes
                .iter()
                .map(|c| Learned {
                    ran: c.items > 0,
                    workers: c.workers,
                    a: c.model_a_s,
                    b: c.model_b_items_per_s,
                })
                .collect()
        });
        let now = self.epoch.elapsed().as_secs_f64();
        lock(p).finished(t, &learned, now);
    }
}

impl Drop for PlaceGuard<'_> {
    fn drop(&mut self) {
        if let (Some(p), Some(t)) = (self.placer, self.ticket.take()) {
            let now = self.epoch.elapsed().as_secs_f64();
            lock(p).finished(t, &[], now);
        }
    }
}

impl<M: Model> BatchJob<M> {
    /// The options of a batch of `size`: placed by the placer (its policy,
    /// its classes), or as configured.
    fn place(&self, size: usize, backlog: usize) -> (JobOptions, Option<u64>) {
        let Some(p) = &self.placer else {
            return (self.opts.clone(), None);
        };
        let now = self.epoch.elapsed().as_secs_f64();
        match lock(p).place(size, backlog, now) {
            Some(d) => {
                let opts = self.opts.clone().policy(d.policy()).classes(d.classes());
                (opts, Some(d.ticket))
            }
            None => (self.opts.clone(), None),
        }
    }

    /// Runs `batch`, closed at `closed` by the batcher (so the task's start
    /// counts in the stream's cost, not in the requests' queueing).
    async fn run(self, batch: Vec<Request<M>>, closed: Instant, backlog: usize) {
        let oldest_wait = batch
            .first()
            .map_or(Duration::ZERO, |r| closed - r.enqueued);
        let mut inputs = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        let mut total_wait = Duration::ZERO;
        for r in batch {
            if r.reply.is_closed() {
                continue; // its caller went away: no one to answer
            }
            if r.deadline.is_some_and(|d| d <= closed) {
                let _ = r.reply.send(Err(StreamError::DeadlinePassed));
                continue;
            }
            total_wait += closed - r.enqueued;
            inputs.push(r.input);
            replies.push(r.reply);
        }
        if replies.is_empty() {
            return;
        }
        let size = replies.len();
        let (opts, ticket) = self.place(size, backlog);
        // Frees the batch's place on every path, a panic's included: a place
        // never given back would count as a batch running on its classes
        // for good, and the placer would pass them over.
        let place = PlaceGuard {
            placer: self.placer.as_deref(),
            ticket,
            epoch: self.epoch,
        };
        // The model is user code: a panic in it fails this batch, not the
        // stream.
        let model = self.model.clone();
        let kernel = self
            .calls
            .build
            .run("Model::build", move || {
                catch_in("Model::build", || model.build(inputs))
            })
            .await
            .and_then(|k| Ok(k?));
        let started = Instant::now();
        let (outputs, run, delivering) = match kernel {
            Ok(k) => {
                let done = self.rt.run_with(k, opts).await;
                let (run, delivering) = (started.elapsed(), Instant::now());
                place.learn(done.as_ref().ok().map(|d| &d.report));
                let outs = match done {
                    Ok(d) => {
                        let (model, kernel) = (self.model.clone(), d.kernel);
                        self.calls
                            .outputs
                            .run("Model::outputs", move || {
                                catch_in("Model::outputs", || model.outputs(kernel))
                            })
                            .await
                            .and_then(|o| Ok(o?))
                    }
                    Err(e) => Err(e),
                };
                (outs, run, delivering)
            }
            Err(e) => {
                place.learn(None);
                (Err(e), Duration::ZERO, Instant::now())
            }
        };
        let outputs = outputs.and_then(|o| {
            if o.len() == size {
                Ok(o)
            } else {
                Err(Error::Kernel(KernelError::invalid(
                    "model outputs",
                    format!(
                        "Model::outputs gave {} outputs for a batch of {size} inputs",
                        o.len()
                    ),
                )))
            }
        });
        match outputs {
            Ok(outs) => {
                for (reply, out) in replies.into_iter().zip(outs) {
                    let _ = reply.send(Ok(out));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for reply in replies {
                    let _ = reply.send(Err(StreamError::Failed(e.clone())));
                }
            }
        }
        if let Some(f) = &self.on_batch {
            let timing = BatchTiming {
                size,
                oldest_wait,
                total_wait,
                prepare: started - closed,
                run,
                deliver: delivering.elapsed(),
            };
            // Answers are out already; a panicking observer loses only its
            // own record of this batch.
            if let Err(e) = catch_in("the stream's on_batch observer", || {
                f(&timing);
                Ok(())
            }) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// A ready [`Model`] for [`Mlp`](coexec_kernels::workloads::Mlp) classifiers:
/// an input is one row of features, an output its class probabilities.
///
/// ```no_run
/// use std::sync::Arc;
/// use coexec::kernels::workloads::MlpWeights;
/// use coexec::stream::{MlpModel, Stream, StreamConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Arc::new(MlpWeights::load("examples/models/digits_mlp.safetensors")?);
/// let rt = Arc::new(coexec::Runtime::builder().devices("cpu:2")?.start().await?);
/// let stream = Stream::start(rt, MlpModel::new(w), StreamConfig::new())?;
/// let probs = stream.infer(vec![0.0; 64]).await?;
/// assert_eq!(probs.len(), 10);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MlpModel {
    weights: Arc<coexec_kernels::workloads::MlpWeights>,
}

impl MlpModel {
    /// Serves `weights`.
    pub fn new(weights: Arc<coexec_kernels::workloads::MlpWeights>) -> Self {
        Self { weights }
    }
}

impl Model for MlpModel {
    type Input = Vec<f32>;
    type Output = Vec<f32>;
    type Kernel = coexec_kernels::workloads::Mlp;

    /// Refuses (failing the batch) a row of the wrong length; a server checks
    /// rows before they reach the stream.
    fn build(&self, rows: Vec<Vec<f32>>) -> Result<Self::Kernel, KernelError> {
        let f = self.weights.inputs();
        if let Some(r) = rows.iter().find(|r| r.len() != f) {
            return Err(KernelError::invalid(
                "mlp input",
                format!("a row of {} features; the model takes {f}", r.len()),
            ));
        }
        coexec_kernels::workloads::Mlp::new(self.weights.clone(), rows.concat())
    }

    fn outputs(&self, k: Self::Kernel) -> Result<Vec<Vec<f32>>, KernelError> {
        let c = self.weights.classes();
        Ok(k.into_probs()
            .chunks_exact(c)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
