//! `bench --oracle`: the best fixed split this machine really reaches,
//! transfers and a shared memory bus included, where T* = 1/Σ(1/T_i)
//! counts neither.
//!
//! Static splits of two classes are swept over the first class's share:
//! coarse — 10% to 90% in steps of 10%, and 0.5 to 1.5 times the share
//! that T* assumes (each class's share in proportion to its speed alone) —
//! then refined — 0.85, 0.925, 1.075 and 1.15 times the best share. A
//! split whose time could not beat the best class alone even if the
//! classes did not slow each other (its larger part's time alone) is not
//! run. Each split runs [`ROUNDS`] times (interleaved in every round, as
//! the bench's rows are) and is judged by its median. The best is then run
//! as often as a row of the table, for its median and interval. Its time,
//! or the best class alone's where that is less (a split of all the items
//! to one class is a fixed split too), is T_oracle.

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

/// The sweep on `w` (two classes, whose times alone are `alone`); `None`
/// where no split could beat the best class alone (a class's time alone
/// not a positive number).
pub(crate) async fn search(
    rt: &Runtime,
    w: &Prepared,
    alone: [f64; 2],
) -> Result<Option<Found>, Failure> {
    let mut tried = Vec::new();
    let ideal = alone[1] / (alone[0] + alone[1]);
    let coarse: Vec<f64> = (1..=9)
        .map(|k| f64::from(k) / 10.0)
        .chain([0.5, 0.75, 1.0, 1.25, 1.5].map(|f| f * ideal))
        .collect();
    sweep(rt, w, &worth_trying(&coarse, alone, &tried), &mut tried).await?;
    let best = best_of(&tried).unwrap_or(ideal);
    let fine: Vec<f64> = [0.85, 0.925, 1.075, 1.15].map(|f| f * best).to_vec();
    sweep(rt, w, &worth_trying(&fine, alone, &tried), &mut tried).await?;
    let Some(share) = best_of(&tried) else {
        return Ok(None);
    };
    let mut runs = Vec::with_capacity(MIN_CI_SAMPLES);
    for _ in 0..MIN_CI_SAMPLES {
        let reports = run(rt, w, share).await?;
        runs.push((job_time(&reports), reports));
    }
    Ok(Some(Found { share, runs, tried }))
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

/// The share whose median is least (`None` where none was tried).
fn best_of(tried: &[(f64, f64)]) -> Option<f64> {
    tried
        .iter()
        .filter(|t| t.1.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|t| t.0)
}

/// The shares of `candidates` strictly between 0 and 1, not tried yet (to
/// 0.1%), whose split could beat the best class alone: its larger part
/// alone (`alone` scaled by each share) must take less than the faster
/// class's whole job.
fn worth_trying(candidates: &[f64], alone: [f64; 2], tried: &[(f64, f64)]) -> Vec<f64> {
    let best = alone[0].min(alone[1]);
    let mut out: Vec<f64> = Vec::new();
    for &x in candidates {
        let fresh = |v: &[f64]| v.iter().all(|y| (x - y).abs() > 1e-3 * x.max(*y));
        let seen: Vec<f64> = tried.iter().map(|t| t.0).collect();
        if x > 0.0
            && x < 1.0
            && (x * alone[0]).max((1.0 - x) * alone[1]) < best
            && fresh(&seen)
            && fresh(&out)
        {
            out.push(x);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_split_is_the_least_median() {
        assert_eq!(
            best_of(&[(0.1, 3.0), (0.2, 1.0), (0.3, f64::NAN)]),
            Some(0.2)
        );
        assert_eq!(best_of(&[]), None);
    }

    /// A class 2500 times faster than the other: the uniform grid could
    /// not beat it alone and is not run; the shares near T*'s are.
    #[test]
    fn only_splits_that_could_win_are_tried() {
        let grid = [0.1, 0.5, 0.9, 0.0003, 0.0002, 0.0003];
        assert_eq!(worth_trying(&grid, [12.0, 0.0048], &[]), [0.0003, 0.0002]);
        // Two equal classes: every share but the extremes could win.
        assert_eq!(
            worth_trying(&[0.1, 0.5, 0.9], [1.0, 1.0], &[]),
            [0.1, 0.5, 0.9]
        );
        assert_eq!(
            worth_trying(&[0.5], [1.0, 1.0], &[(0.5, 0.6)]),
            Vec::<f64>::new()
        );
    }
}
