//! What a kernel's runs teach beyond its speed models: whether the last
//! co-executed run kept to its models (so the next may skip the probe), and
//! how each configuration's runs compared with their forecasts (so that a
//! run co-executes only where that pays).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::Forecast;

/// Weight of a run in a configuration's smoothed residual.
const RESIDUAL_WEIGHT: f64 = 0.3;

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
    /// Runs since the last co-executed one.
    #[serde(default)]
    pub since_coexec: u32,
    /// Single-class runs still owed after a lost co-execution.
    #[serde(default)]
    pub cooling: u32,
    /// Whether the last co-executed run beat the single class's forecast.
    #[serde(default)]
    pub last_coexec_won: bool,
    /// How often co-executed runs lost to the single class's forecast,
    /// smoothed over them (0 to 1).
    #[serde(default)]
    pub loss_rate: f64,
    /// Per class key, how much slower than its model the class went when
    /// co-executing (its chunks' time over the model's prediction for
    /// them), smoothed: classes sharing cores, memory and the bus slow each
    /// other, which a model learned partly alone does not know.
    #[serde(default)]
    pub slowdowns: BTreeMap<String, f64>,
}

/// The slowdowns believed: a run far outside is noise, not a machine.
const SLOWDOWN_RANGE: std::ops::RangeInclusive<f64> = 0.25..=4.0;

impl RunHistory {
    /// The smoothed residual of `config` (0 where it never ran).
    pub fn residual(&self, config: &str) -> f64 {
        self.residuals.get(config).copied().unwrap_or(0.0)
    }

    /// How much slower than its model class `key` goes co-executing (1
    /// where it never did).
    pub fn slowdown(&self, key: &str) -> f64 {
        self.slowdowns.get(key).copied().unwrap_or(1.0)
    }

    /// Single-class runs to wait, after `losses` lost co-executions in a
    /// row, before trying to co-execute again where only the residual of the
    /// losses stands in the way: 64, 128, then 256.
    pub fn retry_after(losses: u32) -> u32 {
        64 << losses.min(2)
    }

    /// Learns from a finished run: its forecast, its makespan, and how far
    /// its classes strayed from their models (`None`: not measured, e.g. a
    /// cold start). `mu` is the seed's μ.
    pub(crate) fn learn(
        &mut self,
        forecast: &Forecast,
        makespan: f64,
        prediction_imbalance: Option<f64>,
        ratios: &[(String, Option<f64>)],
        mu: f64,
    ) {
        if !(makespan.is_finite() && makespan > 0.0 && forecast.plan_s > 0.0) {
            return;
        }
        let observed = makespan / forecast.plan_s - 1.0;
        let r = self
            .residuals
            .entry(forecast.config.clone())
            .or_insert(observed);
        *r += RESIDUAL_WEIGHT * (observed - *r);
        if forecast.classes < 2 {
            self.since_coexec = self.since_coexec.saturating_add(1);
            self.cooling = self.cooling.saturating_sub(1);
            return;
        }
        self.since_coexec = 0;
        self.trusted = prediction_imbalance.is_some_and(|d| d <= mu);
        // The run started from its models slowed by `forecast.slowdown`; a
        // class's time over that prediction says how far off the slowdown was.
        for (c, (key, ratio)) in ratios.iter().enumerate() {
            let (Some(ratio), Some(&k)) = (ratio, forecast.slowdown.get(c)) else {
                continue;
            };
            let seen = (k * ratio).clamp(*SLOWDOWN_RANGE.start(), *SLOWDOWN_RANGE.end());
            let s = self.slowdowns.entry(key.clone()).or_insert(seen);
            *s += RESIDUAL_WEIGHT * (seen - *s);
        }
        let lost = forecast.single.is_some_and(|(_, single)| makespan > single);
        self.loss_rate += RESIDUAL_WEIGHT * (f64::from(u8::from(lost)) - self.loss_rate);
        self.last_coexec_won = !lost;
        if lost {
            self.losses = self.losses.saturating_add(1);
            // Slower than the best class alone was forecast to be, where
            // losing has become the rule: the next run goes to that class
            // (`cooling`), and each loss in a row doubles the runs it stays
            // there. An isolated loss on a device that mostly wins moves the
            // residual instead: reacting to each would make the runs flap.
            if self.loss_rate > 0.5 {
                self.cooling = 1 << (self.losses - 1).min(6);
            }
        } else {
            self.losses = 0;
        }
    }
}
