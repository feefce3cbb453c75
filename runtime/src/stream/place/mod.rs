//! Where each batch runs: the placer, a plain struct on a clock of its own
//! (seconds as `f64`), so its decisions are tested on virtual time.
//!
//! A batch is too short to probe (a probe, a static and a dynamic chunk
//! would each pay a device's fixed cost), so batches run on learned models:
//! the profiler's `t(n) = a + n/b` per worker of each class, read from every
//! batch's report. Under [`Placement::Hybrid`] a batch goes to the class
//! predicted to finish it first, counting the batches each class already
//! runs, or is split across classes when that finishes it sooner by more
//! than the split's added fixed cost is worth at the current load. A class
//! with no model yet gets whole batches while it is free (the cold start
//! learns from the first batches). [`Placement::Greedy`] is the baseline
//! users know from Triton's CPU and GPU instance groups: whole batches to
//! whichever class is free first. Under load, a class whose work slows the
//! fastest class more than it adds is held back (`contend.rs`).

mod contend;
mod learn;
mod placed;
mod placement;
mod slot;
#[cfg(test)]
mod tests;

use contend::Hold;
pub use placement::Placement;
use slot::{Running, Slot};
/// A split must finish at least this much sooner than the best single class
/// to be worth a second class's fixed costs and the models' error.
const SPLIT_GAIN: f64 = 0.05;

/// A batch goes to a class slower than the fastest only where that ends it
/// at least this much sooner (from now) than the fastest class would.
const SLOWER_GAIN: f64 = 0.2;

/// Seconds over which the placer averages the capacity it places, to know
/// how loaded the classes are (see [`Placer::utilization`]).
const LOAD_WINDOW: f64 = 0.5;

/// A class passed over for [`REMEASURE_SKIPS`] batches in a row and for at
/// least this long (seconds) is given the next batch whole, so that its
/// model is measured again: one bad measurement (a first batch stalled on a
/// loaded machine) must not exile it for good. While the other classes keep
/// up that happens at most once every ten seconds per class (once a second
/// put 1% of the requests at 1000/s on a class that made them wait: the
/// p99), and none while every class gets batches.
const REMEASURE_AFTER: f64 = 10.0;
/// See [`REMEASURE_AFTER`].
const REMEASURE_SKIPS: usize = 64;
/// Where the classes in use are nearly full ([`Placer::utilization`] at
/// least [`BUSY`]), the class passed over may be the capacity missing: it
/// is measured again after this long (seconds) and [`BUSY_SKIPS`] batches.
const BUSY_REMEASURE_AFTER: f64 = 1.0;
/// See [`BUSY_REMEASURE_AFTER`].
const BUSY_SKIPS: usize = 16;
/// See [`BUSY_REMEASURE_AFTER`].
const BUSY: f64 = 0.9;

/// Weight of a batch in a class's smoothed lag ([`Slot::lag`]).
const LAG_WEIGHT: f64 = 0.2;
/// The lags believed: a batch far outside is a stall, not the class.
const LAG_RANGE: (f64, f64) = (0.5, 8.0);

/// A batch's place: the share of its items per class, and the ticket that
/// [`Placer::finished`] takes back.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    pub(crate) ticket: u64,
    /// Per class (the runtime's order), summing to 1.
    pub(crate) shares: Vec<f64>,
    /// Predicted end on the placer's clock (`NaN` while a model is missing).
    pub(crate) finish: f64,
}

impl Decision {
    /// The classes with a share.
    pub(crate) fn classes(&self) -> Vec<usize> {
        (0..self.shares.len())
            .filter(|&c| self.shares[c] > 0.0)
            .collect()
    }
}

/// What one class did in a finished batch (from its report).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Learned {
    /// Whether the class ran items of this batch (its model is then the
    /// newest; another class's is what the profiler had at admission).
    pub(crate) ran: bool,
    pub(crate) workers: usize,
    pub(crate) a: f64,
    /// Items per second per worker; 0 when unknown.
    pub(crate) b: f64,
}

/// Places batches; see the module docs.
#[derive(Debug)]
pub(crate) struct Placer {
    mode: Placement,
    slots: Vec<Slot>,
    next: u64,
    /// Capacity placed (items, see [`Slot::spend`]), decaying with
    /// [`LOAD_WINDOW`], as of `load_at` (the placer's clock).
    load: f64,
    load_at: f64,
    /// How much longer than predicted split batches took, from placement to
    /// their report, smoothed (1 until measured): a split pays a second
    /// class's fixed cost and, where that class computes on a host core (a
    /// `sim`), slows the others, which the models do not know.
    split_lag: f64,
}

impl Placer {
    /// A placer over classes with `workers[c]` workers each.
    pub(crate) fn new(mode: Placement, workers: &[usize]) -> Self {
        Self {
            mode,
            slots: workers
                .iter()
                .map(|&workers| Slot {
                    workers,
                    lag: 1.0,
                    ..Default::default()
                })
                .collect(),
            next: 0,
            load: 0.0,
            load_at: 0.0,
            split_lag: 1.0,
        }
    }

    /// The share of the classes' capacity that recent batches took, as
    /// their models predict it: capacity placed per second over the last
    /// [`LOAD_WINDOW`] or so (fixed costs included), over the capacity of
    /// the classes with a model. 0 when idle, near 1 when every class is
    /// kept busy.
    fn utilization(&self, now: f64) -> f64 {
        let capacity: f64 = self
            .slots
            .iter()
            .filter(|s| s.usable())
            .map(Slot::capacity)
            .sum();
        if capacity <= 0.0 {
            return 0.0;
        }
        self.decayed_load(now) / (LOAD_WINDOW * capacity)
    }

    fn decayed_load(&self, now: f64) -> f64 {
        self.load * (-(now - self.load_at).max(0.0) / LOAD_WINDOW).exp()
    }

    /// Seeds class `c`'s model (a stored profile, or a test).
    #[cfg(test)]
    fn set_model(&mut self, c: usize, a: f64, b: f64) {
        self.slots[c].a = a;
        self.slots[c].b = Some(b);
    }

    /// Where a batch of `items` items closed at `now` runs, with `backlog`
    /// items still queued behind it. `None` when no class has a worker in
    /// service (the runtime then fails the job).
    pub(crate) fn place(&mut self, items: usize, backlog: usize, now: f64) -> Option<Decision> {
        let n = items.max(1) as f64;
        let k = self.slots.len();
        let usable: Vec<usize> = (0..k).filter(|&c| self.slots[c].usable()).collect();
        if usable.is_empty() {
            return None;
        }
        let one = |c: usize| {
            let mut s = vec![0.0; k];
            s[c] = 1.0;
            s
        };
        let (shares, finish) = match self.mode {
            Placement::Greedy => {
                // Free first: fewest batches running, then predicted free
                // soonest, then the runtime's order.
                let c = *usable
                    .iter()
                    .min_by(|&&x, &&y| {
                        let (sx, sy) = (&self.slots[x], &self.slots[y]);
                        sx.running
                            .len()
                            .cmp(&sy.running.len())
                            .then(sx.free_at(now).total_cmp(&sy.free_at(now)))
                    })
                    .unwrap_or(&usable[0]);
                let s = &self.slots[c];
                (one(c), s.free_at(now) + s.time(n).unwrap_or(f64::NAN))
            }
            Placement::Hybrid | Placement::Runtime => {
                let unknown: Vec<usize> = usable
                    .iter()
                    .copied()
                    .filter(|&c| self.slots[c].b.is_none())
                    .collect();
                let known: Vec<usize> = usable
                    .iter()
                    .copied()
                    .filter(|&c| self.slots[c].b.is_some())
                    .collect();
                // Cold start: a class with no model learns from a whole batch
                // when it is free (or when nothing is known at all).
                let cold = unknown
                    .iter()
                    .copied()
                    .find(|&c| self.slots[c].running.is_empty())
                    .or_else(|| {
                        known.is_empty().then(|| {
                            *unknown
                                .iter()
                                .min_by_key(|&&c| self.slots[c].running.len())
                                .unwrap_or(&unknown[0])
                        })
                    });
                // A known class left idle too long while the others ran
                // batches is measured again; one held back for what it
                // costs the others (`contend.rs`) at the idle cadence.
                let busy = self.utilization(now) >= BUSY;
                let fast = self.fastest(&known);
                let hold: Vec<Hold> = (0..k)
                    .map(|c| match fast {
                        Some(f) if busy || backlog > 0 => self.hold(c, f, n),
                        _ => Hold::No,
                    })
                    .collect();
                let stale = (known.len() > 1)
                    .then(|| {
                        known
                            .iter()
                            .copied()
                            .filter(|&c| {
                                let s = &self.slots[c];
                                let (after, skips) = match hold[c] {
                                    Hold::No if busy => (BUSY_REMEASURE_AFTER, BUSY_SKIPS),
                                    Hold::No | Hold::Later => (REMEASURE_AFTER, REMEASURE_SKIPS),
                                    Hold::Measure => (0.0, 0),
                                    Hold::Wait => (f64::INFINITY, usize::MAX),
                                };
                                s.running.is_empty()
                                    && s.skipped >= skips
                                    && now - s.placed_at >= after
                            })
                            .max_by_key(|&c| self.slots[c].skipped)
                    })
                    .flatten();
                match (cold, stale) {
                    (Some(c), _) => (one(c), f64::NAN),
                    (None, Some(c)) if hold[c] != Hold::No => {
                        self.remeasure_part(c, fast.unwrap_or(c), n, now)
                    }
                    (None, Some(c)) => {
                        let s = &self.slots[c];
                        (one(c), s.free_at(now) + s.time(n).unwrap_or(f64::NAN))
                    }
                    (None, None) => {
                        let worth: Vec<usize> = known
                            .iter()
                            .copied()
                            .filter(|&c| hold[c] == Hold::No)
                            .collect();
                        self.best(&worth, n, backlog as f64, now)
                    }
                }
            }
        };
        self.next += 1;
        let ticket = self.next;
        let placed: f64 = shares
            .iter()
            .enumerate()
            .filter(|(_, s)| **s > 0.0)
            .filter_map(|(c, s)| self.slots[c].spend(n * s))
            .sum();
        self.load = self.decayed_load(now) + placed;
        self.load_at = self.load_at.max(now);
        self.mark_shared(&shares);
        let split = shares.iter().filter(|s| **s > 0.0).count() > 1;
        for (c, s) in shares.iter().enumerate() {
            let shared = *s > 0.0 && (split || self.others_busy(c, None));
            let slot = &mut self.slots[c];
            if *s > 0.0 {
                let end = slot.free_at(now) + slot.time(n * s).unwrap_or(0.0);
                slot.running.push(Running {
                    ticket,
                    end,
                    placed: now,
                    shared,
                });
                slot.placed_at = now;
                slot.skipped = 0;
            } else {
                slot.skipped += 1;
            }
        }
        Some(Decision {
            ticket,
            shares,
            finish,
        })
    }

    /// Shares and predicted finish of the best placement among `known`
    /// classes: one class, or the split that finishes first when it gains
    /// more than [`SPLIT_GAIN`] and pays for the work it adds.
    ///
    /// A split makes this batch sooner but pays a second class's fixed
    /// cost: a worker runs one chunk at a time, so that time is taken from
    /// the batches arriving while it runs. That `extra` is counted in
    /// seconds of all the classes' capacity ([`Slot::overhead`]: a fixed
    /// cost is the items it could have computed). A heuristic prices it: with
    /// the classes busy a share `ρ` of their capacity
    /// ([`Placer::utilization`]), treated as one queue, a second of added
    /// work delays later batches by about `ρ/(1−ρ)` seconds (the factor of
    /// a queue's mean wait), so a split is taken only when the time it
    /// saves this batch covers that: `gain ≥ extra·ρ/(1−ρ)`. Idle, or with
    /// no fixed costs, every gainful split is taken; loaded, only those
    /// whose fixed costs are small beside what they save. It also keeps
    /// splits out where the rest of the cost is not modelled: a batch
    /// split ends with its later part, and each part's time varies (on the
    /// VM, 1.3× the prediction at p90, ~2× at p99); the `sim` computes its
    /// part on a host core beside the CPU worker. Measured on
    /// `cpu:1,sim:1@0.5` at 1500 requests/s of 16 rows (the CPU alone about
    /// 70% busy): splitting ~48-row batches 40 + 8 saved ~0.2 ms each and
    /// cost the sim ~1.1 ms, and hybrid's p99 was 10.6 ms against 6.4 on
    /// the CPU alone; with this rule, 7.8 (medians of five rounds,
    /// `docs/results/serve-split-pays-ab.md`).
    ///
    /// With `backlog` items queued behind the batch, the batch goes whole
    /// to the class free soonest among those that would finish it before
    /// the fastest class could get through it and the backlog: every class
    /// then eats from the queue until they meet, as the method's deque
    /// does with a job's items. Without it a slower class stays idle while
    /// requests queue, since the fastest class always finishes the next
    /// batch first (measured: `cpu:1,sim:1@0.5` at 800 requests/s of 16
    /// rows ran 99.9% of the rows on the CPU, p99 30–47 ms).
    fn best(&self, known: &[usize], n: f64, backlog: f64, now: f64) -> (Vec<f64>, f64) {
        let k = self.slots.len();
        let finish = |c: usize| {
            let s = &self.slots[c];
            s.free_at(now) + s.time(n).unwrap_or(f64::INFINITY)
        };
        let single = known
            .iter()
            .map(|&c| (c, finish(c)))
            .min_by(|x, y| x.1.total_cmp(&y.1));
        let Some((c1, t1)) = single else {
            return (vec![0.0; k], f64::NAN);
        };
        // A slower class takes the batch only where it ends it clearly
        // sooner than the fastest class would after its queue: its
        // prediction leaves out what it costs the others (a `sim` computes
        // on a host core the others need).
        let fastest = known
            .iter()
            .copied()
            .min_by(|&x, &y| {
                let t = |c: usize| self.slots[c].time(n).unwrap_or(f64::INFINITY);
                t(x).total_cmp(&t(y))
            })
            .unwrap_or(c1);
        let (c1, t1) = if c1 != fastest && t1 - now > (1.0 - SLOWER_GAIN) * (finish(fastest) - now)
        {
            (fastest, finish(fastest))
        } else {
            (c1, t1)
        };
        if backlog > 0.0 {
            let s1 = &self.slots[c1];
            let horizon = s1.free_at(now) + s1.time(n + backlog).unwrap_or(f64::INFINITY);
            let free = |c: usize| self.slots[c].free_at(now);
            let pick = known
                .iter()
                .map(|&c| (c, finish(c)))
                .filter(|&(_, t)| t <= horizon)
                .min_by(|x, y| free(x.0).total_cmp(&free(y.0)).then(x.1.total_cmp(&y.1)));
            if let Some((c, t)) = pick {
                let mut shares = vec![0.0; k];
                shares[c] = 1.0;
                return (shares, t);
            }
        }
        let mut shares = vec![0.0; k];
        if let Some((split, t)) = self.split(known, n, now) {
            // As split batches have turned out, against their prediction.
            let t = now + (t - now) * self.split_lag;
            let rho = self.utilization(now);
            let capacity: f64 = known.iter().map(|&c| self.slots[c].capacity()).sum();
            let overhead: f64 = split
                .iter()
                .filter_map(|&(c, x)| self.slots[c].overhead(x))
                .sum();
            let extra = if capacity > 0.0 {
                (overhead - self.slots[c1].overhead(n).unwrap_or(0.0)).max(0.0) / capacity
            } else {
                0.0
            };
            let pays = extra <= 0.0 || (rho < 1.0 && (t1 - t) * (1.0 - rho) >= extra * rho);
            if pays && t < now + (t1 - now) * (1.0 - SPLIT_GAIN) {
                for (c, x) in split {
                    shares[c] = x / n;
                }
                return (shares, t);
            }
        }
        shares[c1] = 1.0;
        (shares, t1)
    }

    /// The split of `n` items over `classes` that ends first, each class
    /// starting when it is free and paying its fixed cost once: the end `T`
    /// solves `Σ w·b·(T − free − a) = n`. A class that would get less than
    /// one item per worker is left out. `None` unless two classes remain.
    fn split(&self, classes: &[usize], n: f64, now: f64) -> Option<(Vec<(usize, f64)>, f64)> {
        let mut active: Vec<usize> = classes.to_vec();
        loop {
            if active.len() < 2 {
                return None;
            }
            let start = |c: usize| self.slots[c].free_at(now) + self.slots[c].a * self.slots[c].lag;
            let rate = |c: usize| self.slots[c].capacity();
            // Classes in order of start; add them while the next starts
            // before the running ones would be done.
            active.sort_by(|&x, &y| start(x).total_cmp(&start(y)));
            let (mut t, mut done, mut r) = (start(active[0]), 0.0, 0.0);
            let mut end = f64::INFINITY;
            for (i, &c) in active.iter().enumerate() {
                let s = start(c);
                done += r * (s - t);
                t = s;
                r += rate(c);
                let next = active.get(i + 1).map_or(f64::INFINITY, |&d| start(d));
                if r > 0.0 && done + r * (next - t) >= n {
                    end = t + (n - done) / r;
                    break;
                }
            }
            if !end.is_finite() {
                return None;
            }
            let got: Vec<(usize, f64)> = active
                .iter()
                .map(|&c| (c, rate(c) * (end - start(c)).max(0.0)))
                .collect();
            match got
                .iter()
                .filter(|(c, x)| *x < self.slots[*c].workers.max(1) as f64)
                .min_by(|x, y| x.1.total_cmp(&y.1))
            {
                Some(&(c, _)) => active.retain(|&d| d != c),
                None => return Some((got, end)),
            }
        }
    }
}
