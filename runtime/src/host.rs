//! Host callbacks — user code between runs: a stream model's `build` and
//! `outputs`, a workload's `next_step` and `absorb` — kept off the executor
//! thread once they take long.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Error;

/// A callback that took longer than this runs on tokio's blocking pool
/// next time: tokio asks tasks to reach an `.await` every 10–100 µs, and
/// handing a callback to the pool costs a few tens of µs, which a callback
/// of a few µs (a batch of 16 rows copied into a kernel) should not pay.
pub(crate) const BLOCKING_AFTER: Duration = Duration::from_micros(100);

/// Where one callback runs: on the blocking pool the first time (its cost is
/// unknown), then inline while its last call took under [`BLOCKING_AFTER`]
/// and on the pool while it took longer.
#[derive(Debug)]
pub(crate) struct HostCall {
    slow: AtomicBool,
}

impl Default for HostCall {
    fn default() -> Self {
        Self {
            slow: AtomicBool::new(true),
        }
    }
}

impl HostCall {
    /// Runs `f` where its last call says (inline outside a tokio runtime).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Error> {
        let timed = move || {
            let t0 = Instant::now();
            let r = f();
            (r, t0.elapsed())
        };
        let (r, took) = match tokio::runtime::Handle::try_current() {
            Ok(h) if self.slow.load(Ordering::Relaxed) => h
                .spawn_blocking(timed)
                .await
                .map_err(|e| Error::Internal(format!("{what} on the blocking pool: {e}")))?,
            _ => timed(),
        };
        self.slow.store(took > BLOCKING_AFTER, Ordering::Relaxed);
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_pool() -> bool {
        std::thread::current()
            .name()
            .is_none_or(|n| !n.starts_with("host-test-main"))
    }

    #[test]
    fn quick_calls_come_inline_and_slow_ones_go_to_the_pool() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // `block_on` runs on the calling thread: named, to tell it from the
        // pool's.
        let main = std::thread::Builder::new().name("host-test-main".into());
        main.spawn(move || {
            rt.block_on(async {
                let h = HostCall::default();
                let slow = |h: &HostCall| h.slow.load(Ordering::Relaxed);
                // Unknown: the pool.
                assert!(h.run("t", on_pool).await.unwrap());
                // Quick: inline next (a call preempted past the bar keeps
                // the pool once more).
                for _ in 0..5 {
                    if !slow(&h) {
                        break;
                    }
                    h.run("t", on_pool).await.unwrap();
                }
                assert!(!slow(&h), "quick calls were timed under the bar");
                assert!(!h.run("t", on_pool).await.unwrap());
                // Slow (real work): the next call goes to the pool.
                let spin = || {
                    let t0 = Instant::now();
                    let mut x = 0u64;
                    while t0.elapsed() < 3 * BLOCKING_AFTER {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                };
                h.run("t", spin).await.unwrap();
                assert!(slow(&h));
                assert!(h.run("t", on_pool).await.unwrap());
            });
        })
        .unwrap()
        .join()
        .unwrap();
    }
}
