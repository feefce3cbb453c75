use super::{Admission, PlanContext, Policy, Probe, hybrid_among};
use crate::profiler::RunHistory;

/// The seed's queue-based hybrid: probe, static split by measured speed, then
/// a double-ended queue that CPUs eat from the head and accelerators from the
/// tail, in shrinking chunks, until they meet. On warm models it co-executes
/// only where that pays, and skips the probe while the models hold (see
/// `docs/method.md`, "Warm runs").
pub(super) struct Hybrid;

/// How much faster than the best single class a co-executed run must be
/// forecast to be: within this, the single class runs alone (a forecast's
/// error is a few percent; a needless co-execution costs every class's
/// start and the tail's imbalance).
pub(super) const COEXEC_MARGIN: f64 = 0.05;

impl Policy for Hybrid {
    fn name(&self) -> &'static str {
        "hybrid"
    }
    fn describe(&self) -> &'static str {
        "the seed's method: probe, static split by measured speed, then a guarded deque eaten from both ends (default)"
    }
    fn admit(&self, ctx: &PlanContext<'_>) -> Admission {
        let co = hybrid_among(ctx, |_| true);
        let Some(fc) = co.forecast.clone() else {
            // Some class has no model yet: the probe measures it.
            return co;
        };
        let th = &ctx.thresholds;
        let single = if th.single_class {
            best_single(ctx)
        } else {
            None
        };
        // Both rules send runs to one class: off if either is.
        let due = if th.hold_off && th.single_class {
            alone_due(ctx)
        } else {
            None
        };
        match (single, due) {
            // Co-executing is not forecast to pay: the best class alone.
            (Some((c, t)), _)
                if fc.classes > 1
                    && !Race {
                        coexec: fc.predicted_s,
                        plan: fc.plan_s,
                        single: t,
                    }
                    .pays(ctx.history, th.hold_off, ctx.items) =>
            {
                alone_on(ctx, c, t, fc.predicted_s)
            }
            // The plan itself leaves classes out (too slow to help): the
            // class forecast to be fastest alone, its residual counted, which
            // the plan does not know; the broker re-measures the others now
            // and then.
            (Some((c, t)), _) if fc.classes < 2 => {
                let mut a = hybrid_among(ctx, |k| k.index == c);
                a.standby = true;
                if let Some(f) = &mut a.forecast {
                    f.single = Some((c, t));
                }
                a
            }
            // Co-executing, but an accelerator never ran this kernel alone
            // (or not for a long while): it runs alone this once, so that
            // co-executing is judged against its measured time, not
            // against models that co-executed runs taught (on a shared
            // memory bus, the contended speeds).
            (_, Some((c, t))) if fc.classes > 1 => alone_on(ctx, c, t, fc.predicted_s),
            _ => {
                let mut a = co;
                if th.warm_start && a.probe == Probe::Warm && ctx.history.trusted {
                    a.probe = Probe::None;
                }
                if let Some(f) = &mut a.forecast {
                    f.single = single;
                    f.coexec_s = Some(f.predicted_s);
                }
                a
            }
        }
    }
}

/// The job on class `c` alone, forecast at `t` where co-executing was at
/// `coexec_s`: the others stand by (a chunk that fails or is taken back
/// goes to them), and none is given a region to be measured again.
fn alone_on(ctx: &PlanContext<'_>, c: usize, t: f64, coexec_s: f64) -> Admission {
    let mut a = hybrid_among(ctx, |k| k.index == c);
    a.remeasure = false;
    a.standby = true;
    if let Some(f) = &mut a.forecast {
        f.single = Some((c, t));
        f.coexec_s = Some(coexec_s);
    }
    a
}

/// A co-executed run against the best single class, each as forecast
/// for the job (seconds).
#[derive(Debug, Clone, Copy)]
struct Race {
    /// Co-executing: its plan with its configuration's residual.
    coexec: f64,
    /// Co-executing's plan alone, without the residual.
    plan: f64,
    /// The best single class.
    single: f64,
}

impl Race {
    /// Whether co-executing pays, for a job of `items` items (`hold_off`:
    /// [`Thresholds::hold_off`](super::Thresholds::hold_off)):
    ///
    /// * not while the single-class runs owed to a lost co-execution last
    ///   (one after a loss, doubling with each loss in a row: a noisy
    ///   device does not make the runs flap);
    /// * not, after a co-executed run that lost beyond the noise where the
    ///   co-executed runs do not win on average ([`RunHistory::held_off`]),
    ///   until enough single-class runs have passed for a trial (see
    ///   [`trial_gap`]);
    /// * yes right after a co-executed run that beat the single class (a
    ///   streak that wins goes on whatever an older residual says);
    /// * yes where it is forecast clearly faster;
    /// * yes where the co-executed runs of about `items` items have been
    ///   clearly faster on average ([`RunHistory::coexec`], at least
    ///   [`MEASURED_RUNS`] of them): measured runs outweigh a forecast
    ///   whose residual a few slow ones raised;
    /// * yes where it would be but for its residual (earlier co-executions
    ///   that came out slow) and enough single-class runs have passed to
    ///   try again (see [`trial_gap`]).
    fn pays(self, h: &RunHistory, hold_off: bool, items: usize) -> bool {
        let bar = (1.0 - COEXEC_MARGIN) * self.single;
        let gap = trial_gap(h.losses, self.coexec, self.single);
        if h.cooling > 0 || (hold_off && h.held_off && h.since_coexec < gap) {
            return false;
        }
        let measured = h
            .coexec
            .filter(|c| c.runs >= MEASURED_RUNS)
            .and_then(|c| c.secs_for(items));
        (h.last_coexec_won && h.since_coexec == 0)
            || self.coexec < bar
            || measured.is_some_and(|t| t < bar)
            || (self.plan < bar && h.since_coexec >= gap)
    }
}

/// Co-executed runs at about a size before their mean time decides
/// whether co-executing pays.
const MEASURED_RUNS: u32 = 3;

/// Trials of co-executing where only its residual stands against it cost,
/// on average, at most this share of the single class's time.
const TRIAL_COST: f64 = 0.005;

/// Single-class runs before such a trial: 64, 128, then 256 after `losses`
/// lost co-executions in a row, or more where the trial is forecast
/// (`predicted` against `single`) to lose more than [`TRIAL_COST`] of that
/// many runs' time. A GPU whose start alone is several 0.1 ms runs long is
/// tried every few hundred runs, not every 64 (each trial tripled a run).
fn trial_gap(losses: u32, predicted: f64, single: f64) -> u32 {
    let loss = (predicted / single - 1.0).max(0.0);
    let gap = (loss / TRIAL_COST).ceil().min(f64::from(u32::MAX)) as u32;
    RunHistory::retry_after(losses).max(gap)
}

/// The class that alone is forecast to end the job first, with its
/// forecast: its run alone as measured at about this size where there is
/// one ([`RunHistory::alone`]), else from its model; `None` unless at least
/// two classes could run it and each has a model.
fn best_single(ctx: &PlanContext<'_>) -> Option<(usize, f64)> {
    let able: Vec<usize> = able(ctx).collect();
    if able.len() < 2 || !ctx.all_known() {
        return None;
    }
    able.into_iter()
        .filter_map(|c| {
            let measured = ctx.history.alone.get(&ctx.classes[c].profile_key);
            let t = measured.and_then(|a| a.secs_for(ctx.items));
            t.or_else(|| modelled_alone(ctx, c)).map(|t| (c, t))
        })
        .min_by(|x, y| x.1.total_cmp(&y.1))
}

/// The classes that could run the job.
fn able<'a>(ctx: &'a PlanContext<'_>) -> impl Iterator<Item = usize> + 'a {
    (0..ctx.speeds.len()).filter(|&c| ctx.speeds[c].eligible && ctx.speeds[c].workers > 0)
}

/// Class `c` alone on the job, forecast from its model.
fn modelled_alone(ctx: &PlanContext<'_>, c: usize) -> Option<f64> {
    let mut shares = vec![0.0; ctx.speeds.len()];
    shares[c] = 1.0;
    ctx.forecast(ctx.speeds, &shares).map(|f| f.predicted_s)
}

/// Co-executed runs after which an accelerator runs alone again, so that
/// what co-executing must beat stays measured: 4 after its first run
/// alone, 16 after its second, 64 after its third, then every 256. One run
/// alone can be a slow one (a device whose runs vary by a tenth, or one
/// planned from models that co-executed runs slowed); the next few make
/// the measurement a mean, at a cost of a few runs in hundreds.
fn refresh_after(runs_alone: u32) -> u32 {
    (4u32 << (2 * runs_alone.saturating_sub(1).min(3))).min(ALONE_REFRESH)
}

/// The most co-executed runs between two runs of an accelerator alone.
const ALONE_REFRESH: u32 = 256;

/// The accelerator to run alone before co-executing, with its forecast
/// alone: the one forecast fastest among those that never ran this kernel
/// alone or are due again ([`refresh_after`]); none before a warm
/// co-executed run ([`RunHistory::coexecuted`]). Only accelerators: their
/// transfers are what a shared memory bus slows, so theirs are the models
/// that co-executed runs understate (on the H200's pathfinder, modelled,
/// the GPU's forecast alone is about 3 times its time: slower than the CPU,
/// where alone it is 1.5 times faster).
fn alone_due(ctx: &PlanContext<'_>) -> Option<(usize, f64)> {
    let h = ctx.history;
    // Only once a warm co-executed run has been learned from: a stored
    // model that is wrong (a stale profile's) meets co-executing first,
    // where a chunk far past its prediction is taken back by another class
    // and the model corrected; alone, the others only stand by and the job
    // waits on the slow class.
    if !h.coexecuted() {
        return None;
    }
    let due = |c: usize| match h.alone.get(&ctx.classes[c].profile_key) {
        None => true,
        Some(a) => h.since_alone >= refresh_after(a.runs),
    };
    able(ctx)
        .filter(|&c| ctx.classes[c].is_accel())
        .filter(|&c| due(c))
        .filter_map(|c| modelled_alone(ctx, c).map(|t| (c, t)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiler::RunTime;

    /// Co-executing forecast at `coexec` (its plan at `plan`) against a
    /// single class forecast at 1.
    fn race(coexec: f64, plan: f64) -> Race {
        Race {
            coexec,
            plan,
            single: 1.0,
        }
    }

    #[test]
    fn an_accelerator_runs_alone_again_sooner_while_measured_little() {
        let after: Vec<u32> = (0..7).map(refresh_after).collect();
        assert_eq!(after, [4, 4, 16, 64, 256, 256, 256]);
    }

    #[test]
    fn a_trial_costs_at_most_half_a_percent_of_the_runs_between() {
        // Forecast 10% slower than the single class: 64, 128, then 256.
        assert_eq!(trial_gap(0, 1.1, 1.0), 64);
        assert_eq!(trial_gap(1, 1.1, 1.0), 128);
        assert_eq!(trial_gap(5, 1.1, 1.0), 256);
        // Three times slower: a trial loses two runs' time, once in 400.
        assert_eq!(trial_gap(0, 3.0, 1.0), 400);
        assert_eq!(trial_gap(0, f64::NAN, 1.0), 64);
        let mut h = RunHistory::default();
        h.residuals.insert("cpu+gpu".into(), 2.0);
        h.since_coexec = 300;
        // The plan pays (0.5 against 1.0) but its residual does not.
        assert!(!race(3.0, 0.5).pays(&h, true, 1000));
        h.since_coexec = 400;
        assert!(race(3.0, 0.5).pays(&h, true, 1000));
        assert!(
            !race(3.0, 1.0).pays(&h, true, 1000),
            "the plan itself does not pay"
        );
    }

    /// A clear loss holds co-executing off until a trial is due, however
    /// well the plan forecasts it; with the rule off it does not.
    #[test]
    fn a_hold_off_lasts_until_the_trial() {
        let mut h = RunHistory {
            held_off: true,
            ..RunHistory::default()
        };
        // Forecast at half the single class's time: it would pay at once.
        assert!(!race(0.5, 0.5).pays(&h, true, 1000));
        assert!(race(0.5, 0.5).pays(&h, false, 1000));
        h.since_coexec = trial_gap(0, 0.5, 1.0);
        assert!(race(0.5, 0.5).pays(&h, true, 1000));
    }

    /// Co-executed runs measured clearly faster than the single class on
    /// average pay, whatever the residual forecasts; fewer than three, a
    /// mean within the margin, or one of a size more than 2× away do not.
    #[test]
    fn measured_co_executed_runs_outweigh_their_residual() {
        let with = |secs: f64, runs: u32| RunHistory {
            coexec: Some(RunTime {
                items: 1000,
                secs,
                runs,
            }),
            ..RunHistory::default()
        };
        // The forecast with its residual: 1.05 against the single 1.0.
        let pays_at = |h: &RunHistory, items| race(1.05, 0.9).pays(h, true, items);
        assert!(!pays_at(&RunHistory::default(), 1000));
        assert!(pays_at(&with(0.9, 3), 1000));
        assert!(pays_at(&with(0.9, 3), 1040), "about the same size");
        assert!(!pays_at(&with(0.9, 2), 1000), "too few runs");
        assert!(!pays_at(&with(0.97, 10), 1000), "within the margin");
        assert!(!pays_at(&with(0.9, 10), 2500), "another size");
        let cooling = RunHistory {
            cooling: 1,
            ..with(0.9, 10)
        };
        assert!(!pays_at(&cooling, 1000), "a losing streak's cooling");
        let held = RunHistory {
            held_off: true,
            ..with(0.9, 10)
        };
        assert!(!pays_at(&held, 1000), "a hold until its trial");
    }
}
