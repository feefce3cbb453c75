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
//! [`StreamError::Overloaded`], [`StreamError::Invalid`] (the model refused
//! the input at admission), [`StreamError::Output`] (the model refused its
//! output: the batch's other requests get theirs),
//! [`StreamError::DeadlinePassed`], [`StreamError::Failed`] (its batch's job
//! failed), [`StreamError::Closed`].
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

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Notify, mpsc, watch};

use crate::{Error, Runtime};

mod batch;
mod config;
mod error;
#[cfg(feature = "workloads")]
mod mlp;
mod model;
mod place;
mod request;

use batch::Batcher;
use config::Observer;
pub use config::{BatchTiming, StreamConfig};
pub use error::{Rejected, StreamError};
#[cfg(feature = "workloads")]
pub use mlp::{Classification, MlpModel};
use model::check_input;
pub use model::{Checked, Model, Phased};
pub use place::Placement;
use place::Placer;
use request::{Enqueued, Request};
pub use request::{Pending, Served};

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
    /// For [`Model::check_input`] at admission.
    model: Arc<M>,
}

impl<M: Model> Clone for Stream<M> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
            model: self.model.clone(),
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
        let model = Arc::new(model);
        let batcher = Batcher {
            rt,
            placer,
            epoch: Instant::now(),
            model: model.clone(),
            calls: Arc::default(),
            cfg,
            rx,
            shared: shared.clone(),
        };
        handle.spawn(async move {
            batcher.run().await;
            let _ = done_tx.send(true);
        });
        Ok(Self { tx, shared, model })
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
        self.try_infer_many_inner(inputs, None, true)
    }

    /// [`Stream::try_infer_many`] with one deadline for all the inputs.
    // The whole type in the signature reads better than an alias would.
    #[allow(clippy::type_complexity)]
    pub fn try_infer_many_by(
        &self,
        inputs: Vec<M::Input>,
        deadline: Instant,
    ) -> Result<Vec<Pending<M::Output>>, Rejected<Vec<M::Input>>> {
        self.try_infer_many_inner(inputs, Some(deadline), true)
    }

    /// Runs the model's [`Model::check_input`] on each of `inputs`, in
    /// order: [`Checked`] inputs, or the first refusal
    /// ([`StreamError::Invalid`] with its index; [`StreamError::Failed`]
    /// where the check panicked). A service checks a request's inputs
    /// first, to answer with the index of a bad one before anything else
    /// (a draining server's 503 included), and hands the stream the
    /// checked inputs ([`Stream::try_infer_checked`]), which it does not
    /// check twice.
    pub fn check(&self, inputs: Vec<M::Input>) -> Result<Checked<M::Input>, StreamError> {
        for (k, x) in inputs.iter().enumerate() {
            check_input(&*self.model, x, k)?;
        }
        Ok(Checked(inputs))
    }

    /// [`Stream::try_infer_many`] (with a deadline where given) for inputs
    /// [`Stream::check`] passed.
    // The whole type in the signature reads better than an alias would.
    #[allow(clippy::type_complexity)]
    pub fn try_infer_checked(
        &self,
        inputs: Checked<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Pending<M::Output>>, Rejected<Vec<M::Input>>> {
        self.try_infer_many_inner(inputs.0, deadline, false)
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
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Enqueued<M>, Rejected<M::Input>> {
        let now = Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            return Err(Rejected::new(input, StreamError::DeadlinePassed));
        }
        if let Err(e) = check_input(&*self.model, &input, 0) {
            return Err(Rejected::new(input, e));
        }
        Ok(Request::at(input, deadline, now))
    }

    async fn enqueue(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Pending<M::Output>, StreamError> {
        let (req, pending) = self.request(input, deadline)?;
        self.tx.send(req).await.map_err(|_| StreamError::Closed)?;
        Ok(pending)
    }

    fn try_infer_inner(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Pending<M::Output>, Rejected<M::Input>> {
        let (req, pending) = self.request(input, deadline)?;
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
        check: bool,
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
        let refused = check
            .then(|| {
                inputs
                    .iter()
                    .enumerate()
                    .find_map(|(k, x)| check_input(&*self.model, x, k).err())
            })
            .flatten();
        if let Some(e) = refused {
            return Err(Rejected::new(inputs, e));
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
            let (req, p) = Request::at(input, deadline, now);
            permit.send(req);
            pending.push(p);
        }
        Ok(pending)
    }
}
