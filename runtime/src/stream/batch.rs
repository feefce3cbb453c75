//! The batcher: the task that forms batches, and each batch's job on its
//! own task (placed, built by the model, run, answered).

use std::sync::Arc;
use std::time::{Duration, Instant};

use coexec_kernels::{Kernel, KernelError};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::model::checked_output;
use super::place::{Learned, Placer};
use super::{BatchTiming, Model, Observer, Request, Shared, StreamConfig, StreamError};
use crate::host::HostCall;
use crate::{Error, JobOptions, Runtime};

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
    if let Some(coarse) = at.checked_sub(FINE)
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse.into()).await;
    }
    let rest = at.saturating_duration_since(Instant::now());
    if !rest.is_zero() {
        // A failed join (the runtime shutting down) ends the wait as well.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(rest)).await;
    }
}

/// The task that forms batches and starts their jobs.
pub(super) struct Batcher<M: Model> {
    pub(super) rt: Arc<Runtime>,
    /// `None` under `Placement::Runtime`.
    pub(super) placer: Option<Arc<std::sync::Mutex<Placer>>>,
    /// The placer's clock starts here.
    pub(super) epoch: Instant,
    pub(super) model: Arc<M>,
    pub(super) calls: Arc<ModelCalls>,
    pub(super) cfg: StreamConfig,
    pub(super) rx: mpsc::Receiver<Request<M>>,
    pub(super) shared: Arc<Shared>,
}

impl<M: Model> Batcher<M> {
    pub(super) async fn run(mut self) {
        let slots = Arc::new(Semaphore::new(self.cfg.in_flight));
        let mut running = JoinSet::new();
        let mut closing = false;
        // A request that would have passed its batch's cost limit: the
        // next batch's first.
        let mut carry: Option<Request<M>> = None;
        loop {
            while running.try_join_next().is_some() {}
            // A batch forms only once it can start: while every slot is busy,
            // requests wait in the queue, which is what fills it.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                break;
            };
            let first = match carry.take() {
                Some(r) => Some(r),
                None if closing => self.rx.recv().await,
                None => tokio::select! {
                    r = self.rx.recv() => r,
                    () = self.shared.close.notified() => {
                        closing = true;
                        self.rx.close();
                        self.rx.recv().await
                    }
                },
            };
            let Some(first) = first else { break };
            // `max_wait` is checked at start; a far deadline saturates.
            let close_at = first
                .enqueued
                .checked_add(self.cfg.max_wait)
                .unwrap_or(first.enqueued + StreamConfig::MAX_WAIT_LIMIT);
            let mut batch = Vec::with_capacity(self.cfg.max_batch.min(1024));
            let max_cost = self.cfg.max_batch_cost.unwrap_or(usize::MAX);
            let mut cost = cost_of(&*self.model, &first.input);
            batch.push(first);
            // One wait per batch, polled across arrivals.
            let wait = wait_until(close_at);
            tokio::pin!(wait);
            while batch.len() < self.cfg.max_batch && cost < max_cost {
                let next = match self.rx.try_recv() {
                    Ok(r) => Some(r),
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
                                Some(r) => Some(r),
                                None => break,
                            },
                            () = &mut wait => break,
                            () = self.shared.close.notified() => {
                                closing = true;
                                self.rx.close();
                                None
                            }
                        }
                    }
                };
                if let Some(r) = next {
                    let c = cost_of(&*self.model, &r.input);
                    if cost.saturating_add(c) > max_cost {
                        carry = Some(r);
                        break;
                    }
                    cost += c;
                    batch.push(r);
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

/// `model.cost(input)`; a panic in it counts the input as 1 (the batcher
/// must go on: the input's own batch will fail it, if anything does).
fn cost_of<M: Model>(model: &M, input: &M::Input) -> usize {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.cost(input))).unwrap_or(1)
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
pub(super) struct ModelCalls {
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
    /// The options of a batch of `items`: placed by the placer (its policy,
    /// its classes), or as configured.
    fn place(&self, items: usize, backlog: usize) -> (JobOptions, Option<u64>) {
        let Some(p) = &self.placer else {
            return (self.opts.clone(), None);
        };
        let now = self.epoch.elapsed().as_secs_f64();
        match lock(p).place(items, backlog, now) {
            Some(d) => {
                let opts = self.opts.clone().policy(d.policy()).classes(d.classes());
                (opts, Some(d.ticket))
            }
            None => (self.opts.clone(), None),
        }
    }

    /// Runs the kernel of a batch of `size` inputs: in phases that every
    /// CPU worker shares where it has fewer inputs than the CPU workers,
    /// only CPU classes may run it and the model cuts it
    /// ([`Model::phased`]); else as one job. The kernel back, and the
    /// job's report (none for phases).
    async fn run_kernel(
        &self,
        k: M::Kernel,
        size: usize,
        opts: JobOptions,
    ) -> Result<(M::Kernel, Option<crate::RunReport>), Error> {
        let classes = self.rt.classes();
        let eligible: Vec<&crate::ClassInfo> = classes
            .iter()
            .filter(|c| c.workers > 0)
            .filter(|c| {
                opts.only_classes()
                    .is_none_or(|only| only.contains(&c.index))
            })
            .collect();
        let cpu_only = eligible
            .iter()
            .all(|c| matches!(c.kind, crate::DeviceKind::Cpu));
        let workers: usize = eligible.iter().map(|c| c.workers).sum();
        let k = if cpu_only && size < workers {
            // User code: a panic in it fails this batch, not the stream.
            let model = &self.model;
            let cut = catch_in("Model::phased", || Ok(model.phased(k, workers)))?;
            match cut {
                Ok(phases) => {
                    let (k, _) = phases.run(&self.rt, opts).await?;
                    return Ok((k, None));
                }
                Err(k) => k,
            }
        } else {
            k
        };
        let d = self.rt.run_with(k, opts).await?;
        Ok((d.kernel, Some(d.report)))
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
                // Placed by its items, the unit the speed models count in
                // (a row of an MLP, a token-equivalent of an encoder); the
                // requests queued behind it counted in items at this
                // batch's mean.
                let items = k.items();
                let queued = backlog.saturating_mul(items) / size.max(1);
                let (opts, ticket) = self.place(items, queued);
                // Frees the batch's place on every path, a panic's
                // included: a place never given back would count as a
                // batch running on its classes for good, and the placer
                // would pass them over.
                let place = PlaceGuard {
                    placer: self.placer.as_deref(),
                    ticket,
                    epoch: self.epoch,
                };
                let done = self.run_kernel(k, size, opts).await;
                let (run, delivering) = (started.elapsed(), Instant::now());
                // A batch run in phases teaches the placer nothing: its
                // reports are its phases', not the batch's.
                place.learn(done.as_ref().ok().and_then(|d| d.1.as_ref()));
                let outs = match done {
                    Ok((kernel, _)) => {
                        let model = self.model.clone();
                        // Each output checked where it is taken out: a
                        // refused one fails its own request only.
                        self.calls
                            .outputs
                            .run("Model::outputs", move || {
                                let outs = catch_in("Model::outputs", || model.outputs(kernel))?;
                                Ok::<_, KernelError>(
                                    outs.into_iter()
                                        .map(|o| checked_output(&*model, o))
                                        .collect::<Vec<_>>(),
                                )
                            })
                            .await
                            .and_then(|o| Ok(o?))
                    }
                    Err(e) => Err(e),
                };
                (outs, run, delivering)
            }
            Err(e) => (Err(e), Duration::ZERO, Instant::now()),
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
                    let _ = reply.send(out.map(|o| (o, started)));
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
