//! The earliest-finish guard (see `docs/method.md`): whether a worker
//! should take a chunk, and how much, given when the others would finish.

use super::*;

impl JobCore {
    /// The earliest-finish guard and the EFT rule: how many items worker `w`
    /// may take, or `None` if others would finish the rest sooner without it.
    /// With nothing of the job in flight the worker always takes something,
    /// so a job cannot stall on refusals.
    pub(super) fn limit(&mut self, w: usize, c: usize, n: usize, now: f64) -> Option<usize> {
        let got = self.limit_for(w, c, n, now);
        self.worker[w].declined = got.is_none();
        got
    }

    fn limit_for(&mut self, w: usize, c: usize, n: usize, now: f64) -> Option<usize> {
        let Some(b) = self.paced_b(c) else {
            return Some(n);
        };
        let a = self.st[c].speed.model.a();
        let need = self
            .progress
            .grain
            .min(self.progress.space.total_left())
            .max(1);
        let progress = self.progress.in_flight == 0;
        if let Chunking::Eft(_) = self.plan.adm.chunking {
            let mine = now + a + n as f64 / b;
            let beaten = self.worker_class.iter().enumerate().any(|(v, &cv)| {
                v != w
                    && self.st[cv].active()
                    && self.paced_b(cv).is_some_and(|bv| {
                        self.worker[v].busy_until.max(now)
                            + self.st[cv].speed.model.a()
                            + n as f64 / bv
                            < mine
                    })
            });
            return (!beaten || progress).then_some(n);
        }
        if !self.plan.adm.guard {
            return Some(n);
        }
        // When the others would finish what is left without this worker:
        // each starts on it once its chunk in flight is done and its fixed
        // cost paid, then goes at its speed (water-filling over the starts).
        let left = self.progress.space.total_left() as f64;
        let mut starts = std::mem::take(&mut self.scratch);
        starts.clear();
        let mut idle_siblings = 0;
        for (v, &cv) in self.worker_class.iter().enumerate() {
            if v == w || !self.st[cv].active() {
                continue;
            }
            // An idle worker of this worker's own class is in the same place
            // as this one and would refuse for the same reason: counted, the
            // idle workers of a class each leave a few expensive items to the
            // others, and they run one at a time.
            if cv == c && !self.worker[v].running {
                idle_siblings += 1;
                continue;
            }
            // Nor is an idle worker that last declined: it waits for the
            // others to take the rest, as this one would. (Counted, two
            // classes that each leave the tail to the other take it one
            // small chunk at a time.)
            if !self.worker[v].running && self.worker[v].declined {
                continue;
            }
            let Some(bv) = self.paced_b(cv) else {
                self.scratch = starts;
                return Some(n);
            };
            // A worker that has not started on this job yet starts when its
            // class does (a thread's wake-up, a stream's upload of the
            // run's inputs), not now.
            //
            // A running worker's end is predicted again by its class's
            // current model (every chunk that ends updates it); one past
            // even that is not about to be free: it is counted free after
            // as long again as it has overrun. Counted free now, a tail's
            // overdue workers would each be left a share they take a fixed
            // cost later, and every worker that comes back would leave the
            // rest to them again: a tail of ever smaller chunks, each paying
            // the fixed cost once more.
            let ws = &self.worker[v];
            let free = if ws.running {
                let (begun, items) = ws.in_flight;
                let end = begun + self.predict(cv, items);
                if end < now { now + (now - end) } else { end }
            } else if ws.first_start.is_nan() {
                self.st[cv].speed.model.start()
            } else {
                ws.busy_until
            };
            let start = (free - now).max(0.0) + self.st[cv].speed.model.a();
            // Fewer items than its least work take a GPU as long as that.
            let least = self.least_of(cv);
            let bv = if least > self.progress.grain && left < least as f64 {
                bv * left / least as f64
            } else {
                bv
            };
            starts.push((start, bv));
        }
        let t_others = finish_time(&mut starts, left);
        // The balanced end: no more than this worker's part of what is left
        // if everyone, itself included, shares it to finish together.
        // Without it a class with a fixed cost per chunk (whose chunks are
        // floored at `latency_chunks·a·b`) takes the whole rest in one chunk
        // while the others idle: a device that pays a few ms of wake-up per
        // chunk ends its run long after the others. (The idle workers of
        // its class share it too.)
        starts.extend(std::iter::repeat_n((a, b), 1 + idle_siblings));
        let fair = finish_time(&mut starts, left).map_or(f64::INFINITY, |t| ((t - a) * b).ceil());
        self.scratch = starts;
        let Some(t_others) = t_others else {
            return Some(n);
        };
        // A GPU's balanced part is at least its least work: a smaller chunk
        // takes as long.
        let least = self.least_of(c);
        let fair_floor = if least > self.progress.grain {
            least
        } else {
            need
        };
        let mut max = ((t_others - a) * b)
            .floor()
            .min(fair.max(fair_floor as f64));
        // A CPU worker that takes a chunk takes at least its fixed cost's
        // worth, or the rest: a smaller cut ends it at most one fixed cost
        // sooner, and the items it leaves cost another worker a fixed cost.
        // (It still declines where the guard says so.)
        if !self.classes[c].is_accel() && max >= need as f64 {
            max = max.max((a * b).floor().min(left));
        }
        if max >= n as f64 {
            Some(n)
        } else if self.st[c].fill.may_try_small(max, self.progress.grain) && max >= need as f64 {
            // The fill is an assumption until a chunk below it is measured:
            // one such chunk a run, where the class's recent chunks hold
            // too few, measures it (at worst it takes a fill's time).
            self.st[c].fill.tried_small = true;
            Some(max as usize)
        } else if least > self.progress.grain && max < least as f64 {
            // A GPU chunk smaller than its least work takes about as long
            // as that (below the device's fill, its few blocks each run the
            // whole kernel, or share the SMs with a sibling stream's chunk):
            // if not even that would end before the others end the rest,
            // leave it to them, unless nothing is in flight.
            progress.then_some(n.min(least))
        } else if max >= need as f64 {
            Some(max as usize)
        } else if progress {
            Some(need)
        } else {
            None
        }
    }

    /// Class `c`'s speed per worker as the plan counted it: its model's,
    /// divided by its pace in co-executed runs of this size
    /// ([`RunHistory::pace`](crate::profiler::RunHistory::pace)). The
    /// guard and the EFT rule count it so; chunk sizes and a probe's
    /// re-plan (from the rates the probe measured) follow the model's own.
    pub(super) fn paced_b(&self, c: usize) -> Option<f64> {
        self.st[c].speed.b().map(|b| b / self.st[c].pace)
    }

    /// The least work a chunk of class `c` costs, in items.
    fn least_of(&self, c: usize) -> usize {
        self.st[c].fill.least.0
    }

    /// Worker `w` of class `c` claimed `n` items at `now` (seconds since the
    /// job started): when it begins on them and when it should be done; the take-back
    /// watch starts on it.
    /// An accelerator's first chunk of the job waits for its class's start
    /// (a stream's upload of the run's inputs, after the claim), which the
    /// chunk's own time leaves out: predicted from the claim, a stream's
    /// first chunk would look done while it still runs, and the guard would
    /// count the stream as about to take the rest. The worker loop moves the
    /// begin to the setup's real end ([`JobCore::watch_restart`]). A CPU
    /// worker begins at its claim.
    pub(super) fn start_chunk(&mut self, w: usize, c: usize, n: usize, now: f64) {
        let begins = if self.classes[c].is_accel() && self.worker[w].first_start.is_nan() {
            now.max(self.st[c].speed.model.start())
        } else {
            now
        };
        let predicted = self.predict(c, n);
        let ws = &mut self.worker[w];
        ws.in_flight = (begins, n);
        ws.busy_until = begins + predicted;
        ws.running = true;
        self.watch_start(w);
    }

    pub(super) fn predict(&self, c: usize, n: usize) -> f64 {
        let p = self.st[c].speed.model.predict(n as f64);
        if p.is_finite() { p } else { 0.0 }
    }

    pub(super) fn total_workers(&self) -> usize {
        self.st
            .iter()
            .filter(|s| s.eligible)
            .map(|s| s.workers)
            .sum()
    }

    /// Items per second of every eligible worker, if every class is known.
    pub(super) fn total_speed(&self) -> Option<f64> {
        self.st
            .iter()
            .filter(|s| s.active())
            .map(ClassState::class_speed)
            .sum()
    }

    pub(super) fn time_left(&self, r: usize) -> f64 {
        let owner = &self.st[r];
        let v = owner.class_speed().unwrap_or(0.0);
        if v > 0.0 && owner.eligible {
            self.progress.space.left(r) as f64 / v
        } else {
            f64::INFINITY
        }
    }
}

/// When workers that start at `starts[i].0` (seconds from now) and then go
/// at `starts[i].1` items per second have done `items` between them; `None`
/// if none can (no speed). Sorts `starts`.
pub(super) fn finish_time(starts: &mut [(f64, f64)], items: f64) -> Option<f64> {
    starts.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let (mut done, mut rate) = (0.0, 0.0);
    for (i, &(t, b)) in starts.iter().enumerate() {
        rate += b;
        let next = starts.get(i + 1).map_or(f64::INFINITY, |p| p.0);
        if rate > 0.0 && done + rate * (next - t) >= items {
            return Some(t + (items - done) / rate);
        }
        done += rate * (next - t);
    }
    None
}

/// The least work a chunk of a class whose chunks fill it at `fill` items
/// costs, in items, and whether its recent chunks measured it: from the
/// chunks of at most half a fill in `model`'s window (at least
/// [`SMALL_SAMPLES`]), the median of the work each took time for at the
/// model's speed (`(t - a)·b`, between its own items and the fill). Until
/// then the fill: a chunk below it is taken to cost a whole one. On the
/// H100 lease, a 1024-item kmeans chunk took 0.167 ms where a fill
/// (135 168 items) took about 0.5 ms.
pub(super) fn least_work(model: &SpeedModel, fill: usize, grain: usize) -> (usize, bool) {
    if fill <= grain || !model.is_known() {
        return (fill, false);
    }
    let (a, b) = (model.a(), model.b());
    let mut work: Vec<f64> = model
        .samples()
        .iter()
        .filter(|s| s.items <= fill as f64 / 2.0)
        .map(|s| ((s.secs - a) * b).clamp(s.items, fill as f64))
        .collect();
    if work.len() < SMALL_SAMPLES {
        return (fill, false);
    }
    let mid = work.len() / 2;
    let (_, m, _) = work.select_nth_unstable_by(mid, f64::total_cmp);
    let least = (m.ceil() as usize)
        .next_multiple_of(grain)
        .clamp(grain, fill);
    (least, true)
}

/// Chunks below half a fill that measure a class's least work.
const SMALL_SAMPLES: usize = 3;
