//! What a kernel's runs teach beyond its speed models: whether the last
//! co-executed run kept to its models (so the next may skip the probe), and
//! how each configuration's runs compared with their forecasts (so that a
//! run co-executes only where that pays).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::Forecast;

/// Weight of a run in a configuration's smoothed residual.
const RESIDUAL_WEIGHT: f64 = 0.3;
/// The most a run's residual counts beyond the smoothed one.
const MAX_STEP: f64 = 0.25;
/// Weight of a run in the co-executed runs' smoothed time, past the mean of
/// the first ten: it must hold a device's run-to-run spread (on the H100
/// lease a co-executed run took 0.8x or 1.3x the GPU alone by the GPU's
/// draw, modelled), where a residual follows a changed machine.
const COEXEC_WEIGHT: f64 = 0.1;
/// The least margin by which a co-executed run must end later than the
/// best single class's forecast to count as lost beyond the noise (the
/// margin is twice the configuration's own deviation where that is more).
pub(crate) const LOSS_MARGIN: f64 = 0.05;
/// How many deviations of a configuration's runs from its forecast make
/// the loss margin.
const NOISE_DEVIATIONS: f64 = 2.0;

/// Runs alone an entry of a profile that did not count them is taken to
/// smooth: past the mean of the first few.
const SETTLED_RUNS: u32 = 4;

/// The lowest residual learned: a run more than twice as fast as its plan
/// was planned from models it has just corrected (a probe's stall, a fixed
/// cost fitted as a speed), not by a method that overestimates. Learned,
/// such a run left a residual near -1 that made the next forecasts of its
/// configuration near zero: a sim with 5 ms of latency was forecast at
/// 1.2 ms alone, ran alone, and took 15 ms against the CPU's 9.6 ms.
const MIN_RESIDUAL: f64 = -0.5;

/// Weight of a co-executed run in its classes' smoothed pace.
const PACE_WEIGHT: f64 = 0.25;
/// How far one run moves a class's pace (as a log): a stall that made one
/// class of one run several times late is noise.
const MAX_PACE_STEP: f64 = 0.2;
/// Each learned run pulls a pace this much of the way back to 1 (as a
/// log): where the dynamic phase ends the classes together whatever the
/// split, a pace holds no drift from the runs' noise.
const PACE_LEAK: f64 = 0.02;
/// The most a pace slows or speeds a class in the plan.
const MAX_PACE: f64 = 2.0;
/// A run in which a class ran fewer items a worker than this teaches no
/// pace: that class's share moves by whole items, each a sizeable part of
/// its run, so its end cannot follow the pace, and the pace would only
/// wind up (`docs/results/vtime-pace.md`).
const PACE_MIN_ITEMS: f64 = 32.0;

/// A kernel's run history (see the module docs); `Default` knows nothing.
///
/// ```
/// use coexec_actors::profiler::RunHistory;
///
/// let h = RunHistory::default();
/// assert!(!h.trusted);
/// assert_eq!(h.residual("cpu+gpu"), 0.0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunHistory {
    /// Whether the last co-executed run's classes each kept to their
    /// models within μ (δ′ over the whole run): the next needs no probe.
    #[serde(default)]
    pub trusted: bool,
    /// Per configuration (the class keys that got items, joined by `+`):
    /// its makespan over its plan's, less one, smoothed over its runs.
    #[serde(default)]
    pub residuals: BTreeMap<String, f64>,
    /// Co-executed runs in a row that came out slower than the best single
    /// class's forecast.
    #[serde(default)]
    pub losses: u32,
    /// Runs `hybrid` kept to one class since the last co-executed one.
    #[serde(default)]
    pub since_coexec: u32,
    /// Single-class runs `hybrid` still owes after a lost co-execution.
    #[serde(default)]
    pub cooling: u32,
    /// Whether the last co-executed run beat the single class's forecast.
    #[serde(default)]
    pub last_coexec_won: bool,
    /// How often co-executed runs lost to the single class's forecast,
    /// smoothed over them (0 to 1).
    #[serde(default)]
    pub loss_rate: f64,
    /// Per configuration: how far its runs strayed from their forecast
    /// (the observed residual from the smoothed one, absolute), smoothed:
    /// the noise a loss must stand out of.
    #[serde(default)]
    pub deviations: BTreeMap<String, f64>,
    /// Co-executing was last seen to lose to the best single class by
    /// more than the noise: `hybrid` keeps to that class, co-executing
    /// again only as a trial.
    #[serde(default)]
    pub held_off: bool,
    /// Per class (its profile key): this kernel's runs on that class
    /// alone, measured. What co-executing must beat, where the speed models
    /// are learned from co-executed runs too: on a shared memory bus those
    /// hold the contended speeds, and forecast each class alone too slow.
    #[serde(default)]
    pub alone: BTreeMap<String, RunTime>,
    /// Co-executed runs since a class last ran alone.
    #[serde(default)]
    pub since_alone: u32,
    /// Co-executed runs: their time, the mean of the first runs of about
    /// one size, then smoothed (as [`RunHistory::alone`]'s). A loss beyond
    /// the noise holds co-executing off only where this is not below the
    /// best class alone; judged again when a class's run alone is measured.
    #[serde(default, alias = "last_coexec")]
    pub coexec: Option<RunTime>,
    /// Per class (its profile key): how much later than the run's other
    /// classes it ended its co-executed runs of about one size, smoothed
    /// (1: with them). `hybrid` divides the class's speed by it in the
    /// plan and the guard. A plan of mean speeds ends every class
    /// together, but a class of many workers whose chunks vary ends with
    /// its slowest worker, and where the others cannot take its last items
    /// for less (a GPU's chunk costs its fill) the run waits for it.
    #[serde(default)]
    pub pace: BTreeMap<String, Pace>,
}

/// How a class ended a co-executed run: when its last chunk ended
/// (seconds after admission) and how many items a worker it ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClassEnd {
    pub(crate) secs: f64,
    pub(crate) items_per_worker: f64,
}

/// A class's pace in co-executed runs of about `items` items (see
/// [`RunHistory::pace`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pace {
    /// Items in the last run it was learned from.
    #[serde(default)]
    pub items: usize,
    /// How much later than the run's other classes the class ends,
    /// smoothed (1: with them; 1.2: as if 20% slower).
    #[serde(default)]
    pub factor: f64,
}

/// A run of `items` that takes `secs` (for runs alone, smoothed over the
/// runs of about that size).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunTime {
    /// Items in the last such run.
    pub items: usize,
    /// Seconds a run of `items` takes, smoothed.
    pub secs: f64,
    /// Runs this entry has seen: for a class alone, at any size; for the
    /// co-executed runs, at about this size (0 in a profile written before
    /// they were counted).
    #[serde(default)]
    pub runs: u32,
}

/// Whether a run of `items` is of about the size of one of `stored` (within
/// a factor of two), for what was learned at that size to stand for it.
fn near(items: usize, stored: usize) -> bool {
    stored > 0 && (0.5..=2.0).contains(&(items as f64 / stored as f64))
}

impl RunTime {
    /// A run of `items` alone, scaled from the measured one where the sizes
    /// are within a factor of two of each other (further apart, a fixed
    /// cost per run would make the scaling wrong); `None` otherwise, or
    /// where the stored run is not one (a hand-edited profile).
    pub fn secs_for(&self, items: usize) -> Option<f64> {
        let plausible = self.secs.is_finite() && self.secs > 0.0;
        (plausible && near(items, self.items))
            .then_some(self.secs * items as f64 / self.items as f64)
    }

    /// `before` with a run of `items` that took `secs`: the mean of the
    /// first runs, then smoothed with weight `least`, where `before` is of
    /// about that size; else the run stands for its own size, and the
    /// count of runs goes on (an entry of a profile that did not count its
    /// runs stands for several).
    fn with_run(before: Option<&Self>, items: usize, secs: f64, least: f64) -> Self {
        let Some(b) = before else {
            return RunTime {
                items,
                secs,
                runs: 1,
            };
        };
        let runs = if b.runs == 0 { SETTLED_RUNS } else { b.runs }.saturating_add(1);
        let secs = match b.secs_for(items) {
            Some(before) => {
                let weight = (1.0 / f64::from(runs)).max(least);
                before + weight * (secs - before)
            }
            None => secs,
        };
        RunTime { items, secs, runs }
    }
}

impl RunHistory {
    /// The smoothed residual of `config` (0 where it never ran).
    pub fn residual(&self, config: &str) -> f64 {
        self.residuals
            .get(config)
            .copied()
            .unwrap_or(0.0)
            .max(MIN_RESIDUAL)
    }

    /// Single-class runs to wait, after `losses` lost co-executions in a
    /// row, before trying to co-execute again where only the residual of the
    /// losses stands in the way: 64, 128, then 256.
    pub fn retry_after(losses: u32) -> u32 {
        64 << losses.min(2)
    }

    /// The fastest class alone on a run of `items`, as measured
    /// ([`RunHistory::alone`]); `None` where no class ran alone at about
    /// that size.
    pub fn best_alone(&self, items: usize) -> Option<f64> {
        self.alone
            .values()
            .filter_map(|a| a.secs_for(items))
            .min_by(f64::total_cmp)
    }

    /// Class `key`'s pace in a co-executed run of `items` (see
    /// [`RunHistory::pace`]): 1 where none was learned within a factor of
    /// two of that size.
    pub fn pace_for(&self, key: &str, items: usize) -> f64 {
        self.pace
            .get(key)
            .filter(|p| p.factor.is_finite() && p.factor > 0.0 && near(items, p.items))
            .map_or(1.0, |p| p.factor.clamp(1.0 / MAX_PACE, MAX_PACE))
    }

    /// Learns the classes' paces from a co-executed run of `items` in which
    /// class `keys[i]` ended as `ends[i]` says (`None`: it ran nothing):
    /// each class's end over the geometric mean of the ends, smoothed as a
    /// log. A run in which fewer than two classes ran, or any class that
    /// ran did fewer than [`PACE_MIN_ITEMS`] a worker, teaches nothing.
    pub(crate) fn learn_pace(&mut self, keys: &[String], ends: &[Option<ClassEnd>], items: usize) {
        let ran: Vec<(&String, f64)> = keys
            .iter()
            .zip(ends)
            .filter_map(|(k, e)| e.map(|e| (k, e)))
            .filter(|(_, e)| e.secs.is_finite() && e.secs > 0.0)
            .filter(|(_, e)| e.items_per_worker >= PACE_MIN_ITEMS)
            .map(|(k, e)| (k, e.secs.ln()))
            .collect();
        if ran.len() != ends.iter().flatten().count() {
            return;
        }
        if ran.len() < 2 {
            return;
        }
        let mean = ran.iter().map(|r| r.1).sum::<f64>() / ran.len() as f64;
        for (key, end) in ran {
            let before = self.pace_for(key, items).ln();
            let step = (end - mean).clamp(-MAX_PACE_STEP, MAX_PACE_STEP);
            let factor = ((1.0 - PACE_LEAK) * before + PACE_WEIGHT * step)
                .exp()
                .clamp(1.0 / MAX_PACE, MAX_PACE);
            self.pace.insert(key.clone(), Pace { items, factor });
        }
    }

    /// Learns from a finished run of `items`: its forecast, its makespan,
    /// and how far its classes strayed from their models (`None`: not
    /// measured, e.g. a cold start). `mu` is the seed's μ.
    pub(crate) fn learn(
        &mut self,
        forecast: &Forecast,
        makespan: f64,
        items: usize,
        prediction_imbalance: Option<f64>,
        mu: f64,
    ) {
        if !(makespan.is_finite() && makespan > 0.0) {
            return;
        }
        // A forecast without a plan teaches no residual.
        let observed = (forecast.plan_s > 0.0).then(|| makespan / forecast.plan_s - 1.0);
        // The noise a loss must stand out of, before this run counts.
        let margin = LOSS_MARGIN.max(NOISE_DEVIATIONS * self.deviation(&forecast.config));
        if let Some(observed) = observed.filter(|&o| o >= MIN_RESIDUAL) {
            let r = self
                .residuals
                .entry(forecast.config.clone())
                .or_insert(observed);
            let d = self
                .deviations
                .entry(forecast.config.clone())
                .or_insert(0.0);
            *d += RESIDUAL_WEIGHT * ((observed - *r).abs().min(1.0) - *d);
            // One run moves it by at most a quarter of the plan: a run that
            // a passing stall made several times slower (seen on the H100, a
            // GPU slowed sevenfold for one co-executed run) is noise, not a
            // new machine; one that keeps recurring still moves it within
            // runs.
            let step = (observed - *r).clamp(-MAX_STEP, MAX_STEP);
            *r = (*r + RESIDUAL_WEIGHT * step).max(MIN_RESIDUAL);
        }
        if forecast.classes < 2 {
            self.learn_alone(&forecast.config, items, makespan);
            // Only runs `hybrid` kept to one class where it could have
            // co-executed count: a run the caller limited to one class
            // (a bench's class-alone jobs between the hybrid ones) neither
            // pays a lost co-execution's cooling nor brings a trial nearer.
            if forecast.single.is_some() {
                self.since_coexec = self.since_coexec.saturating_add(1);
                self.cooling = self.cooling.saturating_sub(1);
            }
            return;
        }
        self.since_coexec = 0;
        self.since_alone = self.since_alone.saturating_add(1);
        // The mean's count restarts at a size far from the stored one (the
        // runs alone keep counting for `refresh_after`; a mean does not).
        let before = self.coexec.filter(|c| c.secs_for(items).is_some());
        let coexec = RunTime::with_run(before.as_ref(), items, makespan, COEXEC_WEIGHT);
        self.coexec = Some(coexec);
        self.trusted = prediction_imbalance.is_some_and(|d| d <= mu);
        // The best single class: as forecast, or as measured alone where
        // that is faster (the forecast's models may hold contended speeds).
        let single = match (forecast.single.map(|s| s.1), self.best_alone(items)) {
            (Some(f), Some(m)) => Some(f.min(m)),
            (f, m) => f.or(m),
        };
        let lost = single.is_some_and(|single| makespan > single);
        // Co-executed runs of this size, this one included, do not beat the
        // single class on average. Where they do, a loss is a draw of a
        // device whose co-executed runs vary (on the H100 lease, a GPU
        // slowed 1.0-2.2x run by run), not co-executing losing.
        let losing = single.is_some_and(|single| coexec.secs > single);
        // Lost beyond the noise: the next run goes to the single class, and
        // co-executing comes back only as a trial (`policy::hybrid`).
        self.held_off = losing && single.is_some_and(|single| makespan > (1.0 + margin) * single);
        self.loss_rate += RESIDUAL_WEIGHT * (f64::from(u8::from(lost)) - self.loss_rate);
        self.last_coexec_won = !lost;
        if lost {
            self.losses = self.losses.saturating_add(1);
            // Slower than the best class alone was forecast to be, where
            // losing has become the rule: the next run goes to that class
            // (`cooling`), and each loss in a row doubles the runs it stays
            // there. An isolated loss within the noise, on a device that
            // mostly wins, moves the residual instead: reacting to each
            // would make the runs flap. (One beyond the noise holds
            // co-executing off at once: `held_off`.)
            if self.loss_rate > 0.5 && losing {
                self.cooling = 1 << (self.losses - 1).min(6);
                // And the residual holds the whole loss: co-executing waits
                // until the models say otherwise (or a trial).
                if let Some(observed) = observed {
                    let r = self
                        .residuals
                        .entry(forecast.config.clone())
                        .or_insert(observed);
                    *r = r.max(observed);
                }
            }
        } else {
            self.losses = 0;
        }
    }

    /// Whether a warm co-executed run of the kernel has been learned from
    /// (a configuration of two classes or more has a residual).
    pub fn coexecuted(&self) -> bool {
        self.residuals.keys().any(|config| config.contains('+'))
    }

    /// Records a run of `items` on class `key` alone that took `secs`:
    /// smoothed into the one stored where the sizes are near, else in its
    /// place.
    ///
    /// The co-executed runs' time, if of about this size, is judged again
    /// against the best class alone as measured: longer by more than
    /// [`LOSS_MARGIN`] holds co-executing off; not, releases a hold that a
    /// forecast of a class alone too fast had set.
    fn learn_alone(&mut self, key: &str, items: usize, secs: f64) {
        self.since_alone = 0;
        // The mean of the first three runs, then smoothed: one run of a
        // device whose runs vary by a tenth does not stand for the class
        // for a hundred runs. The count goes on across sizes: jobs of varied
        // sizes do not make the class run alone every few runs
        // (`refresh_after`).
        let next = RunTime::with_run(self.alone.get(key), items, secs, RESIDUAL_WEIGHT);
        self.alone.insert(key.to_string(), next);
        let co = self.coexec.and_then(|c| c.secs_for(items));
        if let (Some(co), Some(best)) = (co, self.best_alone(items)) {
            self.held_off = co > (1.0 + LOSS_MARGIN) * best;
        }
    }

    /// The smoothed deviation of `config`'s runs from their forecast (0
    /// where it never ran; a stored value out of 0..=1 is taken as the
    /// nearest end, one that is not a number as 0).
    pub fn deviation(&self, config: &str) -> f64 {
        self.deviations
            .get(config)
            .copied()
            .filter(|d| !d.is_nan())
            .unwrap_or(0.0)
            .clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forecast(classes: usize, plan_s: f64, single: Option<f64>) -> Forecast {
        Forecast {
            config: if classes > 1 { "cpu+gpu" } else { "gpu" }.into(),
            classes,
            plan_s,
            predicted_s: plan_s,
            single: single.map(|t| (1, t)),
            coexec_s: None,
        }
    }

    #[test]
    fn a_class_that_ends_after_the_others_gets_a_pace_above_one() {
        let keys = ["cpu".to_string(), "gpu".to_string()];
        let end = |secs| {
            Some(ClassEnd {
                secs,
                items_per_worker: 1000.0,
            })
        };
        let mut h = RunHistory::default();
        // The CPU ends 20% after the GPU at equal paces, and the plan moves
        // its items by the paces: they settle where the two end together
        // (within the leak's pull), a geometric mean of 1.
        let ends = |h: &RunHistory| {
            let (cpu, gpu) = (h.pace_for("cpu", 300_000), h.pace_for("gpu", 300_000));
            [end(1.2e-3 / cpu), end(1.0e-3 / gpu)]
        };
        for _ in 0..60 {
            h.learn_pace(&keys, &ends(&h), 300_000);
        }
        let (cpu, gpu) = (h.pace_for("cpu", 300_000), h.pace_for("gpu", 300_000));
        assert!(cpu > 1.05 && gpu < 1.0, "{cpu} {gpu}");
        assert!((cpu * gpu - 1.0).abs() < 1e-9, "{cpu} {gpu}");
        let [Some(c), Some(g)] = ends(&h).map(|e| e.map(|e| e.secs)) else {
            unreachable!()
        };
        assert!((c / g - 1.0).abs() < 0.03, "{cpu} {gpu}: ends {c} {g}");
        // Not at another size, nor for a class never seen.
        assert_eq!(h.pace_for("cpu", 3_000_000), 1.0);
        assert_eq!(h.pace_for("sim", 300_000), 1.0);
        // A stall that made one run's CPU ten times late moves it by at
        // most the weight of one step.
        let before = h.pace_for("cpu", 300_000);
        h.learn_pace(&keys, &[end(1e-2), end(1e-3)], 300_000);
        let moved = h.pace_for("cpu", 300_000).ln() - (1.0 - PACE_LEAK) * before.ln();
        assert!(
            (moved - PACE_WEIGHT * MAX_PACE_STEP).abs() < 1e-9,
            "{moved}"
        );
        // Classes that end together bring it back to 1, slowly.
        for _ in 0..400 {
            h.learn_pace(&keys, &[end(1e-3), end(1e-3)], 300_000);
        }
        assert!((h.pace_for("cpu", 300_000) - 1.0).abs() < 0.01);
        // One class that ran teaches nothing; nor does a run where a class
        // ran a few items a worker.
        let mut h = RunHistory::default();
        h.learn_pace(&keys, &[end(1e-3), None], 300_000);
        let few = ClassEnd {
            secs: 2e-3,
            items_per_worker: PACE_MIN_ITEMS - 1.0,
        };
        h.learn_pace(&keys, &[end(1e-3), Some(few)], 300_000);
        assert!(h.pace.is_empty());
    }

    #[test]
    fn a_residual_learns_within_a_quarter_of_the_plan_per_run() {
        let mut h = RunHistory::default();
        // Runs `hybrid` kept to the GPU (the best single class).
        let f = forecast(1, 1.0, Some(1.0));
        h.learn(&f, 1.2, 1000, None, 0.1);
        assert!((h.residual("gpu") - 0.2).abs() < 1e-12);
        // A run ten times its plan moves it by a quarter times the weight.
        h.learn(&f, 10.0, 1000, None, 0.1);
        assert!((h.residual("gpu") - (0.2 + RESIDUAL_WEIGHT * MAX_STEP)).abs() < 1e-12);
        assert_eq!(h.since_coexec, 2);
    }

    /// A run far faster than its plan (planned from a broken model) teaches
    /// no residual, and none stays below -0.5: the next forecast of the
    /// configuration is at least half its plan.
    #[test]
    fn a_plan_far_too_slow_teaches_no_residual() {
        let mut h = RunHistory::default();
        h.learn(&forecast(1, 66.0, Some(66.0)), 0.0357, 1000, None, 0.1);
        assert_eq!(h.residual("gpu"), 0.0);
        assert_eq!(h.since_coexec, 1);
        h.residuals.insert("gpu".into(), -0.9995); // a profile saved before
        assert_eq!(h.residual("gpu"), MIN_RESIDUAL);
        // Runs slower than their plans raise it from there.
        h.learn(&forecast(1, 0.01, None), 0.015, 1000, None, 0.1);
        assert_eq!(h.residual("gpu"), MIN_RESIDUAL);
        h.learn(&forecast(1, 0.01, None), 0.015, 1000, None, 0.1);
        assert!(h.residual("gpu") > MIN_RESIDUAL, "{}", h.residual("gpu"));
    }

    #[test]
    fn losses_cool_down_only_where_losing_is_the_rule() {
        let mut h = RunHistory::default();
        let f = forecast(2, 1.0, Some(1.1));
        // An isolated loss: the residual moves, no run is owed.
        h.learn(&f, 1.2, 1000, Some(0.05), 0.1);
        assert_eq!((h.losses, h.cooling), (1, 0));
        assert!(h.trusted && !h.last_coexec_won);
        // Losses in a row: one single run owed, then two.
        h.learn(&f, 1.3, 1000, Some(0.2), 0.1);
        h.learn(&f, 1.3, 1000, Some(0.2), 0.1);
        assert!(h.loss_rate > 0.5 && !h.trusted);
        assert_eq!((h.losses, h.cooling), (3, 4));
        // Runs the caller limited to one class do not pay it off.
        for _ in 0..4 {
            h.learn(&forecast(1, 1.0, None), 1.0, 1000, None, 0.1);
        }
        assert_eq!((h.cooling, h.since_coexec), (4, 0));
        // Single-class runs of `hybrid`'s choosing do; a win resets the streak.
        for _ in 0..4 {
            h.learn(&forecast(1, 1.0, Some(1.0)), 1.0, 1000, None, 0.1);
        }
        assert_eq!((h.cooling, h.since_coexec), (0, 4));
        h.learn(&f, 0.9, 1000, Some(0.01), 0.1);
        assert_eq!((h.losses, h.since_coexec), (0, 0));
        assert!(h.last_coexec_won && h.trusted);
    }

    /// A co-executed run that ends more than the noise after the single
    /// class's forecast holds co-executing off; one within it does not,
    /// and a win lifts the hold.
    #[test]
    fn a_clear_loss_holds_co_executing_off() {
        let mut h = RunHistory::default();
        let f = forecast(2, 0.8, Some(1.0));
        h.learn(&f, 1.03, 1000, None, 0.1);
        assert!(!h.held_off, "3% behind is within the 5% margin");
        h.learn(&f, 1.2, 1000, None, 0.1);
        assert!(h.held_off);
        h.learn(&f, 0.9, 1000, None, 0.1);
        assert!(!h.held_off && h.last_coexec_won);
        // A forecast without a plan judges the loss, teaches no residual.
        let mut cold = RunHistory::default();
        cold.learn(&forecast(2, 0.0, Some(1.0)), 1.5, 1000, None, 0.1);
        assert!(cold.held_off);
        assert!(cold.residuals.is_empty() && cold.deviations.is_empty());
    }

    /// Runs that stray widely from their forecast widen the margin: a
    /// configuration whose runs swing by half their plan needs a loss of
    /// more than the swing before it is held off.
    #[test]
    fn noisy_runs_widen_the_loss_margin() {
        let mut h = RunHistory::default();
        let f = forecast(2, 0.8, Some(1.0));
        for k in 0..12 {
            let t = if k % 2 == 0 { 0.5 } else { 0.9 };
            h.learn(&f, t, 1000, None, 0.1);
        }
        let d = h.deviation("cpu+gpu");
        assert!(d > 0.15, "deviation {d}");
        h.learn(&f, 1.2, 1000, None, 0.1);
        assert!(!h.held_off, "20% behind is inside 2 x {d:.3}");
        h.deviations.insert("cpu+gpu".into(), f64::NAN);
        assert_eq!(h.deviation("cpu+gpu"), 0.0);
        h.deviations.insert("cpu+gpu".into(), 7.0);
        assert_eq!(h.deviation("cpu+gpu"), 1.0);
    }

    /// A class's runs alone are averaged while few, then smoothed: a slow
    /// first run weighs as one of the first three, not for many runs.
    #[test]
    fn runs_alone_are_a_mean_while_few() {
        let mut h = RunHistory::default();
        let alone = forecast(1, 1.0, None);
        let mut secs = Vec::new();
        for t in [1.24, 1.0, 1.0, 1.0, 1.0] {
            h.learn(&alone, t, 1000, None, 0.1);
            secs.push(h.alone["gpu"].secs);
        }
        let want = [1.24, 1.12, 1.08, 1.056, 1.0392];
        for (got, want) in secs.iter().zip(want) {
            assert!((got - want).abs() < 1e-9, "{secs:?}");
        }
        assert_eq!(h.alone["gpu"].runs, 5);
        // Far from its size, a run stands for its own size; the count goes on.
        h.learn(&alone, 5.0, 5000, None, 0.1);
        assert_eq!((h.alone["gpu"].runs, h.alone["gpu"].secs), (6, 5.0));
        // An entry that did not count its runs is smoothed, not replaced.
        h.alone.get_mut("gpu").unwrap().runs = 0;
        h.learn(&alone, 4.0, 5000, None, 0.1);
        assert!((h.alone["gpu"].secs - 4.7).abs() < 1e-9);
        assert_eq!(h.alone["gpu"].runs, SETTLED_RUNS + 1);
    }

    /// A co-executed run is judged against the class's run alone where one
    /// was measured at about its size, not only the forecast: models learned
    /// while co-executing (a shared memory bus) can forecast the class alone
    /// three times too slow, and the loss would never show.
    #[test]
    fn a_measured_run_alone_judges_co_executing() {
        let mut h = RunHistory::default();
        // The GPU alone, measured: 1000 items in 0.4 s.
        h.learn(&forecast(1, 0.4, None), 0.4, 1000, None, 0.1);
        assert_eq!(h.best_alone(1000), Some(0.4));
        let scaled = h.best_alone(1500).unwrap();
        assert!((scaled - 0.6).abs() < 1e-12, "scaled within 2x: {scaled}");
        assert_eq!(h.best_alone(5000), None, "too far to scale");
        // Co-executed in 0.7 s, against a forecast of 1.0 s alone: lost.
        h.learn(&forecast(2, 0.6, Some(1.0)), 0.7, 1000, None, 0.1);
        assert!(h.held_off && !h.last_coexec_won);
        assert_eq!(h.since_alone, 1);
        // Without the measurement the same run wins.
        let mut blind = RunHistory::default();
        blind.learn(&forecast(2, 0.6, Some(1.0)), 0.7, 1000, None, 0.1);
        assert!(!blind.held_off && blind.last_coexec_won);
        // Measured after a co-executed run that it beats: held off at once.
        let mut late = RunHistory::default();
        late.learn(&forecast(2, 0.6, Some(1.0)), 0.7, 1000, None, 0.1);
        assert!(!late.held_off);
        late.learn(&forecast(1, 0.4, None), 0.4, 1000, None, 0.1);
        assert!(late.held_off);
        // Judged lost against a forecast too fast, released once measured.
        let mut early = RunHistory::default();
        early.learn(&forecast(2, 0.6, Some(0.5)), 0.7, 1000, None, 0.1);
        assert!(early.held_off);
        early.learn(&forecast(1, 0.8, None), 0.8, 1000, None, 0.1);
        assert!(!early.held_off);
        // A stored run that is not one is ignored.
        h.alone.insert(
            "gpu".into(),
            RunTime {
                items: 0,
                secs: f64::NAN,
                runs: 1,
            },
        );
        assert_eq!(h.best_alone(1000), None);
    }

    #[test]
    fn a_loss_among_co_executed_runs_that_win_on_average_holds_nothing_off() {
        // The first co-executed run loses beyond the noise: held off at once.
        let mut first = RunHistory::default();
        first.learn(&forecast(2, 0.8, Some(1.0)), 1.3, 1000, None, 0.1);
        assert!(first.held_off);
        // Four that win by a fifth, then the same loss: a draw of a device
        // whose co-executed runs vary, not co-executing losing.
        let mut h = RunHistory::default();
        for _ in 0..4 {
            h.learn(&forecast(2, 0.8, Some(1.0)), 0.8, 1000, None, 0.1);
        }
        h.learn(&forecast(2, 0.8, Some(1.0)), 1.3, 1000, None, 0.1);
        assert!(!h.held_off && !h.last_coexec_won && h.cooling == 0);
        // Losses that go on bring the mean past the single class: by the
        // third, the losing streak's cooling sends the next runs to the
        // single class; held off once the loss stands out of the deviation
        // the losses themselves widened.
        let mut runs = 1;
        while h.cooling == 0 {
            h.learn(&forecast(2, 0.8, Some(1.0)), 1.3, 1000, None, 0.1);
            runs += 1;
            assert!(runs <= 3, "still co-executing after {runs} losses");
        }
        assert!(h.coexec.unwrap().secs > 1.0);
        while !h.held_off {
            h.learn(&forecast(2, 0.8, Some(1.0)), 1.3, 1000, None, 0.1);
            runs += 1;
            assert!(runs < 10, "not held off after {runs} losses");
        }
        // A profile that stored the last co-executed run reads it as the
        // first of the mean.
        let old: RunHistory =
            serde_json::from_str(r#"{"last_coexec": {"items": 1000, "secs": 0.7, "runs": 1}}"#)
                .expect("an older profile loads");
        assert_eq!(old.coexec.map(|c| c.secs), Some(0.7));
    }
}
