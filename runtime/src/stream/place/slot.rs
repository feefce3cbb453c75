//! What the placer knows of one class: its model, the batches it runs, its
//! lag, and when it was last given a batch.

/// What the placer knows of one class.
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    pub(super) workers: usize,
    /// Fixed seconds per chunk and items per second per worker (`b = None`:
    /// no model yet).
    pub(super) a: f64,
    pub(super) b: Option<f64>,
    /// Batches placed here and not yet finished.
    pub(super) running: Vec<Running>,
    /// How much longer than its model this class's batches took, from their
    /// placement to their report, smoothed (1 until measured): what its
    /// callers wait, where the model knows only the device's own time (a
    /// `sim` whose thread waits for a core, a GPU stream that queues).
    pub(super) lag: f64,
    /// When a batch was last placed here (the placer's clock).
    pub(super) placed_at: f64,
    /// Batches placed since, none of them here.
    pub(super) skipped: usize,
    /// Its workers' speed (items per second per worker) in batches that ran
    /// while no other class computed, and in batches that overlapped
    /// another class's, smoothed (`None` until seen): what co-executing
    /// costs it on a machine whose classes contend for the host (cores,
    /// memory bus, the threads that feed a GPU).
    pub(super) alone: Option<f64>,
    pub(super) shared: Option<f64>,
}

/// A batch placed on a class and not yet finished.
#[derive(Debug, Clone, Copy)]
pub(super) struct Running {
    pub(super) ticket: u64,
    /// Predicted end, on the placer's clock.
    pub(super) end: f64,
    /// When it was placed.
    pub(super) placed: f64,
    /// Whether another class computed during any of it (so far).
    pub(super) shared: bool,
}

/// Weight of a batch in [`Slot::alone`] and [`Slot::shared`].
const SPEED_WEIGHT: f64 = 0.25;

impl Slot {
    /// When the class is predicted to be free of its batches, from `now`.
    pub(super) fn free_at(&self, now: f64) -> f64 {
        self.running.iter().map(|r| r.end).fold(now, f64::max)
    }

    /// Seconds for `n` items on this class, one chunk per worker, as its
    /// callers have seen them take ([`Slot::lag`]).
    pub(super) fn time(&self, n: f64) -> Option<f64> {
        let b = self.b?;
        let w = (self.workers as f64).min(n.max(1.0));
        Some((self.a + n / (w * b)) * self.lag)
    }

    /// Folds in the speed `b` its workers had in a batch, alone or beside
    /// another class's.
    pub(super) fn learn_speed(&mut self, b: f64, shared: bool) {
        let est = if shared {
            &mut self.shared
        } else {
            &mut self.alone
        };
        *est = Some(est.map_or(b, |e| e + SPEED_WEIGHT * (b - e)));
    }

    /// Items per second its workers lose while another class computes
    /// (0 until both speeds are seen).
    pub(super) fn contention_loss(&self) -> f64 {
        match (self.alone, self.shared) {
            (Some(a), Some(s)) => self.workers as f64 * (a - s).max(0.0) / self.lag,
            _ => 0.0,
        }
    }

    pub(super) fn usable(&self) -> bool {
        self.workers > 0
    }

    /// Items per second of all its workers as its callers see them (0
    /// without a model).
    pub(super) fn capacity(&self) -> f64 {
        self.workers as f64 * self.b.unwrap_or(0.0) / self.lag
    }

    /// The capacity `n` items take on this class, in items: its workers'
    /// time on them (one chunk per worker, each paying the fixed cost)
    /// times their speed: `n` plus [`Slot::overhead`]. Comparable across
    /// classes, unlike seconds.
    pub(super) fn spend(&self, n: f64) -> Option<f64> {
        Some(n + self.overhead(n)?)
    }

    /// The items its fixed costs could have computed while `n` items run
    /// here, one chunk per worker: `w·a·b`.
    pub(super) fn overhead(&self, n: f64) -> Option<f64> {
        let w = (self.workers as f64).min(n.max(1.0));
        Some(w * self.a * self.b?)
    }
}
