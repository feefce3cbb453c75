//! The profiler actor: per-kernel speed models for each device class,
//! learned from every run and remembered across processes.

mod disk;
mod history;
mod saver;
mod store;
mod validity;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message};

use history::ClassEnd;
pub use history::{Pace, RunHistory, RunTime};
pub(crate) use store::RunOutcome;
pub use store::{
    Fingerprint, KernelProfile, Learned, MAX_FILE_BYTES, MAX_FIXED_S, MAX_KERNELS, PROFILE_VERSION,
    ProfileFile, ProfileStore, SPEED_RANGE, implausible, split_delta,
};

use crate::perfmodel::{Sample, SpeedModel};
use saver::Saver;
use store::SaveDone;

/// How often the profile file is rewritten at most while runs stream in.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The profile store, shared: a submitter looks its kernel up under the
/// lock ([`Profiles::lookup`]) and the worker that finishes a run folds the
/// run in ([`Profiles::learn`]) before it answers, both on their own
/// threads with no message; the [`Profiler`] actor only schedules and
/// writes the saves. A run's submitter thus starts its next run from what
/// the last one taught, with no hop to wait for.
pub(crate) struct Profiles {
    store: Mutex<ProfileStore>,
    /// Whether the store has a file to save to (an in-memory one asks the
    /// actor for nothing).
    saved: bool,
    mu: f64,
    nu: f64,
    /// Set when a save was asked for and not yet taken in hand: the runs
    /// learned from meanwhile ask no more (one message per save, not per
    /// run).
    asked: AtomicBool,
    actor: OnceLock<Addr<Profiler>>,
}

impl Profiles {
    pub(crate) fn new(store: ProfileStore, mu: f64, nu: f64) -> Self {
        Self {
            saved: store.path().is_some(),
            store: Mutex::new(store),
            mu,
            nu,
            asked: AtomicBool::new(false),
            actor: OnceLock::new(),
        }
    }

    /// The store. No kernel code runs under this lock, and none of its
    /// holders panics with it held (the store's updates are arithmetic);
    /// should one, the store is still usable.
    fn store(&self) -> MutexGuard<'_, ProfileStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stored models, split and history of kernel `key` for the
    /// classes of profile keys `classes`.
    pub(crate) fn lookup(&self, key: &str, classes: &[String]) -> Stored {
        let store = self.store();
        Stored {
            models: store.models(key, classes),
            split: store.split(key, classes),
            history: store.history(key),
        }
    }

    /// Folds a finished run in, and asks the actor for a save unless one
    /// is already asked for.
    pub(crate) fn learn(&self, run: &Observe) {
        run.apply(&mut self.store(), self.mu, self.nu);
        if self.saved && !self.asked.swap(true, Ordering::AcqRel) {
            match self.actor.get() {
                Some(actor) => actor.do_send(SaveSoon),
                // No actor (yet, or any more): the next ask tries again.
                None => self.asked.store(false, Ordering::Release),
            }
        }
    }

    /// A copy of everything stored.
    pub(crate) fn dump(&self) -> ProfileFile {
        self.store().file().clone()
    }
}

/// The actor that saves the shared [`Profiles`]' store.
pub(crate) struct Profiler {
    pub(crate) profiles: Arc<Profiles>,
    /// Whether a save is already scheduled.
    save_due: bool,
    /// The thread that writes the file, from the first save on.
    saver: Option<Saver>,
    /// Whether that thread has a save in hand.
    saving: bool,
    /// The last failed save's error, warned about once: the same failure
    /// again (the retry at shutdown, say) is logged at debug level.
    failed: Option<String>,
}

impl Profiler {
    /// The actor of `profiles`, which it asks for saves from then on.
    pub(crate) fn start(profiles: Arc<Profiles>) -> Addr<Self> {
        let me = Self {
            profiles: profiles.clone(),
            save_due: false,
            saver: None,
            saving: false,
            failed: None,
        }
        .start();
        let _ = profiles.actor.set(me.clone());
        me
    }

    /// Saves what was learned at most once per [`SAVE_EVERY`] (at a
    /// stream's hundreds of batches a second, a save per batch would keep
    /// the disk busy): now if the last save is older, else once that much
    /// time has passed, and once the save in hand is written.
    fn save_soon(&mut self, ctx: &mut Context<Self>) {
        if self.save_due || self.saving {
            return;
        }
        let wait = self.profiles.store().save_wait(SAVE_EVERY);
        match wait {
            Duration::ZERO => self.start_save(ctx),
            wait => {
                self.save_due = true;
                ctx.run_later(wait, |act, ctx| {
                    act.save_due = false;
                    act.start_save(ctx);
                });
            }
        }
    }

    /// Hands the save to the writer thread (started here the first time);
    /// writes it on this thread only if no thread could be had.
    fn start_save(&mut self, ctx: &mut Context<Self>) {
        // Taken in hand: what is learned from now on asks again.
        self.profiles.asked.store(false, Ordering::Release);
        let Some(job) = self.profiles.store().take_save() else {
            return;
        };
        if self.saver.is_none() {
            let me = ctx.address().downgrade();
            match Saver::start(move || {
                if let Some(profiler) = me.upgrade() {
                    profiler.do_send(Saved);
                }
            }) {
                Ok(s) => self.saver = Some(s),
                Err(e) => tracing::warn!("no thread to save the profile on ({e}): saving inline"),
            }
        }
        let job = match &self.saver {
            Some(saver) => match saver.give(job) {
                None => {
                    self.saving = true;
                    return;
                }
                Some(job) => job,
            },
            None => job,
        };
        self.finish(job.write());
    }

    /// Records a save's outcome; the kind of its error, if it failed.
    fn finish(&mut self, done: SaveDone) -> Option<std::io::ErrorKind> {
        let done = self.profiles.store().finish_save(done);
        match done {
            Ok(()) => {
                self.failed = None;
                None
            }
            Err(e) => {
                let kind = e.kind();
                let e = e.to_string();
                if self.failed.as_ref() == Some(&e) {
                    tracing::debug!("could not save the profile, again: {e}");
                } else {
                    tracing::warn!("could not save the profile: {e}");
                    self.failed = Some(e);
                }
                Some(kind)
            }
        }
    }
}

impl Actor for Profiler {
    type Context = Context<Self>;
}

/// What [`Profiles::lookup`] answers.
pub(crate) struct Stored {
    pub(crate) models: Vec<SpeedModel>,
    pub(crate) split: Vec<f64>,
    pub(crate) history: RunHistory,
}

/// A finished run's samples, folded in ([`Profiles::learn`]) by the worker
/// that finished the run before it answers the run's submitter, so the
/// submitter's next run starts from them.
pub(crate) struct Observe {
    pub(crate) key: String,
    pub(crate) classes: Vec<String>,
    pub(crate) samples: Vec<Vec<Sample>>,
    pub(crate) learned_split: Vec<f64>,
    pub(crate) outcome: RunOutcome,
}

impl Observe {
    /// What the profiler learns from the run `report` of kernel `key`, whose
    /// chunks took `samples` per class.
    pub(crate) fn of(
        key: String,
        classes: Vec<String>,
        report: &crate::RunReport,
        samples: Vec<Vec<Sample>>,
    ) -> Self {
        let forecast = report.forecast.clone();
        Self {
            key,
            classes,
            samples,
            outcome: RunOutcome {
                starts: report.classes.iter().map(|c| c.start_s).collect(),
                // A run kept off some class teaches no pace either: the
                // others' ends say nothing of it.
                ends: if report.split_delta.is_some() {
                    report
                        .classes
                        .iter()
                        .map(|c| {
                            (c.items > 0).then(|| ClassEnd {
                                secs: c.finish_s,
                                items_per_worker: c.items as f64 / c.workers.max(1) as f64,
                            })
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                makespan: report.makespan_s,
                items: report.items,
                forecast,
                prediction_imbalance: report.prediction_imbalance,
            },
            // A run kept off some class learns no split.
            learned_split: if report.split_delta.is_some() {
                report.learned_split.clone()
            } else {
                Vec::new()
            },
        }
    }

    /// Learns nothing of the classes' starts from this run.
    pub(crate) fn forget_starts(&mut self) {
        self.outcome.starts.iter_mut().for_each(|s| *s = None);
    }

    /// Folds it into `store` (`mu`, `nu`: the seed's μ and ν).
    pub(crate) fn apply(&self, store: &mut ProfileStore, mu: f64, nu: f64) -> Learned {
        store.observe_outcome(&self.key, &self.classes, &self.outcome, mu);
        store.observe(
            &self.key,
            &self.classes,
            &self.samples,
            &self.learned_split,
            nu,
        )
    }
}

/// Something was learned: save it soon ([`Profiles::learn`] sends it once
/// per save).
#[derive(Message)]
#[rtype(result = "()")]
struct SaveSoon;

impl Handler<SaveSoon> for Profiler {
    type Result = ();
    fn handle(&mut self, _: SaveSoon, ctx: &mut Context<Self>) {
        self.save_soon(ctx);
    }
}

/// Writes the profile now; answers on `done`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Flush {
    pub(crate) done: std::sync::mpsc::Sender<()>,
}

impl Handler<Flush> for Profiler {
    type Result = ();
    fn handle(&mut self, m: Flush, _: &mut Context<Self>) {
        // The runtime is shutting down: what is learned is written before
        // it ends, on this thread, after the save in hand. If that one
        // waited out its bound on a lock another process holds, no second
        // wait: the shutdown waits for the lock once at most.
        let mut held = false;
        if std::mem::take(&mut self.saving)
            && let Some(done) = self.saver.as_ref().and_then(Saver::wait)
        {
            held = self.finish(done) == Some(std::io::ErrorKind::WouldBlock);
        }
        if held {
            tracing::warn!("the final save is skipped: the profile's lock is still held");
        } else {
            let job = self.profiles.store().take_save();
            if let Some(job) = job {
                self.finish(job.write());
            }
        }
        let _ = m.done.send(());
    }
}

/// The writer thread finished a save.
#[derive(Message)]
#[rtype(result = "()")]
struct Saved;

impl Handler<Saved> for Profiler {
    type Result = ();
    fn handle(&mut self, _: Saved, ctx: &mut Context<Self>) {
        let Some(done) = self.saver.as_ref().and_then(Saver::try_take) else {
            return;
        };
        self.saving = false;
        // Learned while the save was written: saved in turn. A failed save
        // is tried again at the next run's learning (or at shutdown), not
        // on a timer: a profile folder that cannot be written would be
        // retried every second for nothing.
        let written = matches!(done, SaveDone::Written(_));
        self.finish(done);
        if written && self.profiles.store().dirty() {
            self.save_soon(ctx);
        }
    }
}
