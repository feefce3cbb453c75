//! Taking back a chunk that runs far past its prediction.
//!
//! A device whose chunk has run [`OVERDUE_FACTOR`] times its predicted time
//! (plus [`OVERDUE_SLACK_S`] of scheduling noise) is given up on for that
//! chunk, if another class could run it: the job sets the worker's
//! take-back flag, the worker's executor ends the attempt with
//! [`KernelError::TakenBack`](coexec_kernels::KernelError::TakenBack), and
//! the range goes back as a retry that another worker takes first. The
//! prediction is the worker's own class model, or, for a class not yet
//! measured (a cold probe), the fastest measured class's time for the chunk.
//!
//! Only executors that hold no write in flight while they wait honour the
//! flag: the `sim` device writes its outputs before its modelled wait, and a
//! CUDA stream copies a chunk's results out only after its wait for them
//! succeeds, leaving a taken-back chunk's work in flight on its own buffers
//! (the stream waits for it before its next chunk; see
//! `StreamWorker::watch_take_back`). A CPU worker inside `run_cpu` cannot be
//! stopped, and its claim stays the only one on its range, so the
//! exactly-once property holds either way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::JobCore;

/// A chunk is overdue past this many times its predicted time...
pub(crate) const OVERDUE_FACTOR: f64 = 8.0;
/// ...plus this many seconds.
pub(crate) const OVERDUE_SLACK_S: f64 = 0.02;

/// Per-worker state of the take-back watch.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The registry's flags, one per worker.
    flags: Option<Arc<[AtomicBool]>>,
    /// Workers whose executors honour the flag.
    watched: Vec<usize>,
    /// Whether each worker's chunk in flight was already taken back.
    flagged: Vec<bool>,
}

impl JobCore {
    /// Gives the job the registry's take-back flags (see the module docs).
    pub(crate) fn with_take_back(mut self, flags: Arc<[AtomicBool]>) -> Self {
        let n = self.worker_class.len();
        self.watch.watched = (0..n)
            .filter(|&w| {
                let c = self.worker_class[w];
                matches!(
                    self.classes[c].kind,
                    crate::device::DeviceKind::Sim { .. } | crate::device::DeviceKind::Cuda { .. }
                )
            })
            .collect();
        self.watch.flagged = vec![false; n];
        self.watch.flags = Some(flags);
        self
    }

    /// Worker `w` starts a chunk: its flag is cleared. The chunk is watched
    /// from its begin in [`WorkerState::in_flight`](super::state::WorkerState).
    pub(super) fn watch_start(&mut self, w: usize) {
        let Some(flags) = &self.watch.flags else {
            return;
        };
        self.watch.flagged[w] = false;
        flags[w].store(false, Ordering::Release);
    }

    /// Worker `w`'s chunk starts over at `now` (its setup is done): it
    /// begins now, its predicted end moves with it, a flag set meanwhile is
    /// cleared, and the chunk is watched from `now`.
    pub(crate) fn watch_restart(&mut self, w: usize, now: f64) {
        if !self.worker[w].running {
            return;
        }
        let items = self.worker[w].in_flight.1;
        let predicted = self.predict(self.worker_class[w], items);
        let ws = &mut self.worker[w];
        ws.in_flight.0 = now;
        ws.busy_until = now + predicted;
        self.watch_start(w);
    }

    /// Sets the flag of every watched worker whose chunk is overdue at `now`.
    pub(super) fn take_back_overdue(&mut self, now: f64) {
        let Some(flags) = &self.watch.flags else {
            return;
        };
        for &v in &self.watch.watched {
            if !self.worker[v].running || self.watch.flagged[v] {
                continue;
            }
            let cv = self.worker_class[v];
            let elsewhere = (0..self.st.len()).any(|k| {
                k != cv && (self.st[k].eligible || self.st[k].standby) && self.st[k].workers > 0
            });
            if !elsewhere {
                continue;
            }
            let (start, items) = self.worker[v].in_flight;
            let own = self.st[cv]
                .speed
                .b()
                .map(|_| self.st[cv].speed.model.predict(items as f64));
            let fastest = (0..self.st.len())
                .filter(|&k| self.st[k].eligible && self.st[k].speed.b().is_some())
                .map(|k| self.st[k].speed.model.predict(items as f64))
                .fold(f64::INFINITY, f64::min);
            let predicted = own.unwrap_or(fastest);
            if !(predicted.is_finite() && predicted > 0.0) {
                continue;
            }
            if now - start > OVERDUE_FACTOR * predicted + OVERDUE_SLACK_S {
                tracing::warn!(
                    worker = v,
                    items,
                    secs = now - start,
                    predicted,
                    "chunk far past its prediction: taken back, it runs elsewhere"
                );
                self.watch.flagged[v] = true;
                flags[v].store(true, Ordering::Release);
            }
        }
    }

    /// `n` items at the CPU class's measured throughput, if there is one.
    pub(super) fn cpu_secs(&self, n: usize) -> Option<f64> {
        if self.watch.watched.is_empty() {
            return None;
        }
        let c = self
            .classes
            .iter()
            .position(|k| matches!(k.kind, crate::device::DeviceKind::Cpu))?;
        self.st[c].speed.b().map(|b| n as f64 / b)
    }

    /// What a taken-back attempt teaches: its class took at least `secs`
    /// for `items` (a lower bound, so the model learns the device is slow).
    pub(super) fn taken_back(&mut self, c: usize, items: usize, secs: f64) {
        self.st[c].speed.observe(items, secs);
    }
}
