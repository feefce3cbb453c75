//! What the idle workers of one class wait on: a ring count, and a
//! condition variable only the sleepers cost.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long an idle worker spins, looking for a ring, before it sleeps:
/// about a thread wake's cost, so a worker that finds nothing to do loses
/// that much CPU at most, and a job that comes sooner costs no wake.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// What the idle workers of one class wait on.
#[derive(Default)]
pub(crate) struct Bell {
    count: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
    /// Workers of the class asleep on `cv`, or about to be.
    sleepers: AtomicUsize,
    /// Live jobs this class can claim from.
    pub(crate) live: AtomicUsize,
}

impl Bell {
    /// Counts a ring, and wakes the sleepers if there are any: a ring with
    /// every worker awake (busy, or spinning after its last chunk) costs
    /// two atomic operations, no lock and no system call.
    ///
    /// A sleeper counts itself before it looks at the count, and a ring
    /// counts before it looks for sleepers (both sequentially consistent):
    /// either the sleeper sees the ring and does not sleep, or the ring
    /// sees the sleeper and notifies under the lock the sleeper holds
    /// until it waits.
    pub(crate) fn ring(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    /// The rings so far. Sequentially consistent: [`Bell::wait`]'s look
    /// after it counts itself a sleeper pairs with [`Bell::ring`]'s.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits for a ring after `seen`, or for `stop`, at most `timeout`:
    /// first spinning for up to [`SPIN`] (a job that follows the last
    /// within that time is claimed with no wake), then asleep.
    pub(crate) fn wait(&self, seen: u64, timeout: Duration, stop: impl Fn() -> bool) {
        let rung = || self.count() != seen || stop();
        let spin = Instant::now();
        while !rung() {
            if spin.elapsed() >= SPIN.min(timeout) {
                let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.sleepers.fetch_add(1, Ordering::SeqCst);
                if !rung() {
                    let _ = self.cv.wait_timeout_while(g, timeout, |_| !rung());
                }
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            // Lets a thread that is ready run first (a submitter woken by
            // the answer, on a machine with no core to spare).
            std::thread::yield_now();
        }
    }
}
