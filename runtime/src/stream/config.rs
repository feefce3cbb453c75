//! The batcher's limits, and the timings it reports per batch.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::Placement;
use crate::{Error, JobOptions};

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
    /// requests, and [`Model::build`](super::Model::build).
    pub prepare: Duration,
    /// The job: [`Runtime::run_with`](crate::Runtime::run_with), from call to return.
    pub run: Duration,
    /// The stream's own time after the job: [`Model::outputs`](super::Model::outputs) and handing
    /// every output to its caller.
    pub deliver: Duration,
}

impl BatchTiming {
    /// The stream path's own cost: `prepare + deliver`.
    pub fn overhead(&self) -> Duration {
        self.prepare + self.deliver
    }
}

pub(super) type Observer = Arc<dyn Fn(&BatchTiming) + Send + Sync>;

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
    pub(super) max_batch: usize,
    pub(super) max_batch_cost: Option<usize>,
    pub(super) max_wait: Duration,
    pub(super) queue: usize,
    pub(super) in_flight: usize,
    pub(super) job: JobOptions,
    pub(super) placement: Placement,
    pub(super) on_batch: Option<Observer>,
}

impl std::fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamConfig")
            .field("max_batch", &self.max_batch)
            .field("max_batch_cost", &self.max_batch_cost)
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
            max_batch_cost: None,
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

    /// Most [`Model::cost`](super::Model::cost) in one batch (an encoder's:
    /// tokens), besides [`StreamConfig::max_batch`] requests; `None`: no
    /// such limit (the default). A request that would pass it starts the
    /// next batch; one that weighs more alone runs alone.
    pub fn max_batch_cost(mut self, cost: Option<usize>) -> Self {
        self.max_batch_cost = cost;
        self
    }

    /// Longest a batch waits for more requests after its oldest arrived,
    /// kept to within tens of µs (not tokio's 1 ms timer tick); zero sends a
    /// batch with whatever is queued when it forms.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Requests the queue holds before [`Stream::try_infer`](super::Stream::try_infer) answers
    /// overloaded (and [`Stream::infer`](super::Stream::infer) waits for room): those not yet in a
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
        if opts.restricts_placement() {
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

    /// The batch cost limit set.
    pub fn max_batch_cost_limit(&self) -> Option<usize> {
        self.max_batch_cost
    }

    pub(super) fn check(&self) -> Result<(), Error> {
        for (what, v) in [
            ("stream max_batch", self.max_batch),
            ("stream max_batch_cost", self.max_batch_cost.unwrap_or(1)),
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
