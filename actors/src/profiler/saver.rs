//! The profile's writer thread. A save takes the profile's lock (which
//! another process may hold while it saves), reads, merges and writes the
//! file: on the profiler's thread, which the broker shares, an admission
//! would wait behind it.

use std::sync::mpsc;

use super::store::{SaveDone, SaveJob};

/// The writer thread: takes [`SaveJob`]s, hands back their [`SaveDone`]s.
/// It ends once this handle is dropped and its job in hand is written.
pub(crate) struct Saver {
    jobs: mpsc::Sender<SaveJob>,
    done: mpsc::Receiver<SaveDone>,
}

impl Saver {
    /// Starts the thread; it calls `wake` after each save, when its outcome
    /// is ready to take.
    pub(crate) fn start(wake: impl Fn() + Send + 'static) -> std::io::Result<Self> {
        let (jobs, inbox) = mpsc::channel::<SaveJob>();
        let (outbox, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("coexec-profile".into())
            .spawn(move || {
                for job in inbox {
                    if outbox.send(job.write()).is_err() {
                        break;
                    }
                    wake();
                }
            })?;
        Ok(Self { jobs, done })
    }

    /// Gives the thread `job`; the job comes back if the thread is gone.
    pub(crate) fn give(&self, job: SaveJob) -> Option<SaveJob> {
        self.jobs.send(job).err().map(|e| e.0)
    }

    /// A finished save's outcome, if one is ready.
    pub(crate) fn try_take(&self) -> Option<SaveDone> {
        self.done.try_recv().ok()
    }

    /// Waits for the save in hand to finish (`None`: the thread is gone).
    pub(crate) fn wait(&self) -> Option<SaveDone> {
        self.done.recv().ok()
    }
}
