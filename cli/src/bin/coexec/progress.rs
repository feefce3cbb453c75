//! Progress bars on stderr while jobs run: one per device class and a total.
//!
//! A background thread polls [`coexec::Runtime::progress`] every
//! [`POLL`]; the runtime counts items per class from its start, so the bars
//! show what was done since [`start`]. Nothing is drawn when the user asked
//! for quiet or stderr is not a terminal (a pipe, a CI log), so output that
//! is read by programs stays clean.
//!
//! ```text
//!      cpu [██████████                    ]  12000 items  31%
//!      sim [██████████████████            ]  20000 items  51%
//!    total [████████████████████████      ]  32000/38000  4s eta 1s
//! ```

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the bars are refreshed.
const POLL: Duration = Duration::from_millis(100);

/// Bars being drawn; [`Progress::finish`] stops and clears them.
pub(crate) struct Progress {
    /// Dropping it wakes the poller for its last update.
    stop: Option<Sender<()>>,
    poller: Option<JoinHandle<()>>,
}

/// Starts drawing progress for `total_items` items (the whole command's work,
/// over every job it will submit); with `quiet`, or when stderr is not a
/// terminal, draws nothing.
///
/// The poller holds a clone of `rt` until [`Progress::finish`], so call that
/// before `Arc::try_unwrap(rt)` and `shutdown`.
pub(crate) fn start(rt: Arc<coexec::Runtime>, total_items: u64, quiet: bool) -> Progress {
    if quiet || !std::io::stderr().is_terminal() {
        return Progress {
            stop: None,
            poller: None,
        };
    }
    let base: Vec<u64> = rt.progress().iter().map(|(_, n)| *n).collect();
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
    let class_bars: Vec<ProgressBar> = rt
        .progress()
        .into_iter()
        .map(|(name, _)| {
            // A class's bar is measured against the whole job, so its fill
            // is its share of the work.
            let bar = multi.add(ProgressBar::new(total_items));
            bar.set_style(style(
                "{prefix:>8} [{bar:30.cyan/blue}] {pos:>10} items {percent:>3}%",
            ));
            bar.set_prefix(name);
            bar
        })
        .collect();
    let total = multi.add(ProgressBar::new(total_items));
    total.set_style(style(
        "{prefix:>8} [{bar:30.green/white}] {pos:>10}/{len} {elapsed} eta {eta}",
    ));
    total.set_prefix("total");

    let (stop, stopped) = mpsc::channel::<()>();
    let poller = std::thread::Builder::new()
        .name("coexec-progress".into())
        .spawn(move || {
            let update = || {
                let now = rt.progress();
                let mut sum = 0;
                for ((bar, (_, n)), b0) in class_bars.iter().zip(&now).zip(&base) {
                    let done = n.saturating_sub(*b0);
                    sum += done;
                    bar.set_position(done);
                }
                // More items than announced (a step the caller did not count):
                // grow the bars rather than overflow them.
                if sum > total.length().unwrap_or(0) {
                    for bar in class_bars.iter().chain([&total]) {
                        bar.set_length(sum);
                    }
                }
                total.set_position(sum);
            };
            // A message or a hung-up sender both mean stop.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                update();
            }
            update();
            for bar in &class_bars {
                bar.finish_and_clear();
            }
            total.finish_and_clear();
            let _ = multi.clear();
        });
    match poller {
        Ok(h) => Progress {
            stop: Some(stop),
            poller: Some(h),
        },
        // No thread, no bars: progress is a nicety, the run goes on.
        Err(_) => Progress {
            stop: None,
            poller: None,
        },
    }
}

impl Progress {
    /// Draws the final counts, clears the bars and stops the poller (which
    /// drops its handle on the runtime).
    pub(crate) fn finish(self) {
        drop(self);
    }
}

impl Drop for Progress {
    /// An early return (an error mid-command) clears the bars as well.
    fn drop(&mut self) {
        self.stop.take();
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
    }
}

/// A bar style from a template that is known to parse.
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("█▉▊▋▌▍▎▏ ")
}
