//! `bench --oracle`: the best fixed split this machine really reaches,
//! transfers and a shared memory bus included, where T* = 1/Σ(1/T_i)
//! counts neither.
//!
//! Static splits of two classes are swept over the first class's share:
//! 10% to 90% in steps of 10%, then 2.5% steps within 7.5% of the best,
//! each split run [`ROUNDS`] times (the splits interleaved in every
//! round, as the bench's rows are), judged by its median. The best is then
//! run as often as a row of the table, for its median and interval. Its
//! time, or the best class alone's where that is less (a split of all the
//! items to one class is a fixed split too), is T_oracle.

use std::sync::Arc;

use coexec::policy::{Admission, PlanContext, Policy};
use coexec::{JobOptions, RunReport, Runtime};

use super::{job_time, median};
use crate::Failure;
use crate::stats::MIN_CI_SAMPLES;
use crate::workload::Prepared;

/// Runs of each split in the sweep.
const ROUNDS: usize = 3;

/// A fixed split: each class's share of the items in one region, one
/// chunk per worker, no stealing.
struct FixedSplit(Vec<f64>);

impl Policy for FixedSplit {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn describe(&self) -> &'static str {
        "a fixed split of the items between the classes"
    }
    fn admit(&self, _: &PlanContext<'_>) -> Admission {
        Admission::split(self.0.clone())
    }
}

/// What the sweep found.
pub(crate) struct Found {
    /// The first class's share of the best split.
    pub(crate) share: f64,
    /// The best split's job times, and the reports of its run nearest their
    /// median.
    pub(crate) runs: Vec<(f64, Vec<RunReport>)>,
    /// Every split tried: the first class's share and its median job time.
    pub(crate) tried: Vec<(f64, f64)>,
}

/// The sweep on `w` (two classes).
pub(crate) async fn search(rt: &Runtime, w: &Prepared) -> Result<Found, Failure> {
    let mut tried = Vec::new();
    let coarse: Vec<f64> = (1..=9).map(|k| f64::from(k) / 10.0).collect();
    sweep(rt, w, &coarse, &mut tried).await?;
    let best = best_of(&tried);
    let fine: Vec<f64> = [-0.075, -0.05, -0.025, 0.025, 0.05, 0.075]
        .iter()
        .map(|d| best + d)
        .filter(|x| *x > 0.0 && *x < 1.0)
        .collect();
    sweep(rt, w, &fine, &mut tried).await?;
    let share = best_of(&tried);
    let mut runs = Vec::with_capacity(MIN_CI_SAMPLES);
    for _ in 0..MIN_CI_SAMPLES {
        let reports = run(rt, w, share).await?;
        runs.push((job_time(&reports), reports));
    }
    Ok(Found { share, runs, tried })
}

/// Each of `shares` [`ROUNDS`] times, interleaved; their medians into
/// `tried`.
async fn sweep(
    rt: &Runtime,
    w: &Prepared,
    shares: &[f64],
    tried: &mut Vec<(f64, f64)>,
) -> Result<(), Failure> {
    let mut times = vec![Vec::with_capacity(ROUNDS); shares.len()];
    for _ in 0..ROUNDS {
        for (k, &x) in shares.iter().enumerate() {
            times[k].push(job_time(&run(rt, w, x).await?));
        }
    }
    tried.extend(shares.iter().zip(&times).map(|(&x, t)| (x, median(t))));
    Ok(())
}

async fn run(rt: &Runtime, w: &Prepared, share: f64) -> Result<Vec<RunReport>, Failure> {
    let policy: Arc<dyn Policy> = Arc::new(FixedSplit(vec![share, 1.0 - share]));
    Ok(w.run(rt, JobOptions::new().policy(policy)).await?.reports)
}

/// The share whose median is least (0.5 where none was tried).
fn best_of(tried: &[(f64, f64)]) -> f64 {
    tried
        .iter()
        .filter(|t| t.1.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0.5, |t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_split_is_the_least_median() {
        assert_eq!(best_of(&[(0.1, 3.0), (0.2, 1.0), (0.3, f64::NAN)]), 0.2);
        assert_eq!(best_of(&[]), 0.5);
    }
}
