//! The capacity search: the highest arrival rate a server keeps within a
//! p99 bound, found by probes (one bounded open-loop run each).
//!
//! Rates double from the start until a probe fails, then the interval
//! between the last pass and the first failure is bisected until it is
//! within [`RESOLUTION`]. A probe that fails on latency or on the server's
//! refusals alone (429, 503, 504) is tried once more before it counts as
//! failed: one stall of a shared machine must not halve the answer. A probe
//! that loses requests or breaks the contract is not retried.

use serde::Serialize;

use crate::report::RateReport;

/// The search stops once the first failing rate is within this factor of
/// the last passing one.
pub(crate) const RESOLUTION: f64 = 1.1;
/// Doublings from the start rate at most (the start times 2^16).
const MAX_DOUBLINGS: u32 = 16;
/// Share of the requests sent that may be answered other than 200.
const MAX_MISSES: f64 = 0.01;

/// Why a probe failed, or that it passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    Pass,
    /// The p99 of the 200s over the bound.
    Slow,
    /// More than 1% of the requests answered 429, 503, 504.
    Refused,
    /// Requests lost, refused connections, unsent, other statuses, or a
    /// broken contract (duplicated, malformed, crossed answers).
    Broken,
}

impl Verdict {
    /// Whether a second try may pass where this one failed.
    fn retried(self) -> bool {
        matches!(self, Verdict::Slow | Verdict::Refused)
    }
}

/// How a probe at one rate went against `bound_ms`.
pub(crate) fn verdict(r: &RateReport, bound_ms: f64) -> Verdict {
    let broken = r.lost + r.refused + r.unsent + r.other + r.duplicated + r.malformed + r.crossed;
    let misses = r.status_429 + r.status_503 + r.status_504;
    if broken > 0 || r.sent == 0 {
        Verdict::Broken
    } else if misses as f64 > MAX_MISSES * r.sent as f64 {
        Verdict::Refused
    } else if r.latency_ok.count == 0 || r.latency_ok.p99_ms > bound_ms {
        Verdict::Slow
    } else {
        Verdict::Pass
    }
}

/// The search's result: the highest rate that passed (`None`: not even
/// the start) and the first that failed above it (`None`: none failed up to
/// the largest tried).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Capacity {
    pub(crate) passed: Option<f64>,
    pub(crate) failed: Option<f64>,
}

/// The search as a plain state machine: [`Search::next`] names the rate
/// to probe, [`Search::record`] takes its verdict, until `next` is `None`.
#[derive(Debug)]
pub(crate) struct Search {
    rate: f64,
    passed: Option<f64>,
    failed: Option<f64>,
    /// The current rate failed once in a way a second try may pass.
    retrying: bool,
    doublings: u32,
    done: bool,
}

impl Search {
    pub(crate) fn new(start: f64) -> Self {
        Self {
            rate: start,
            passed: None,
            failed: None,
            retrying: false,
            doublings: 0,
            done: false,
        }
    }

    /// The rate to probe next; `None` once the search is over.
    pub(crate) fn next(&self) -> Option<f64> {
        (!self.done).then_some(self.rate)
    }

    /// The verdict of the probe at [`Search::next`]'s rate.
    pub(crate) fn record(&mut self, v: Verdict) {
        if v.retried() && !self.retrying {
            self.retrying = true;
            return;
        }
        self.retrying = false;
        if v == Verdict::Pass {
            self.passed = Some(self.rate);
        } else {
            self.failed = Some(self.rate);
        }
        match (self.passed, self.failed) {
            (Some(lo), None) if self.doublings < MAX_DOUBLINGS => {
                self.doublings += 1;
                self.rate = lo * 2.0;
            }
            (Some(lo), Some(hi)) if hi / lo > RESOLUTION => {
                // A whole number of requests per second where one lies
                // strictly between.
                let mid = (lo * hi).sqrt();
                self.rate = Some(mid.round())
                    .filter(|&r| r > lo && r < hi)
                    .unwrap_or(mid);
            }
            _ => self.done = true,
        }
    }

    /// What the search found (so far).
    pub(crate) fn result(&self) -> Capacity {
        Capacity {
            passed: self.passed,
            failed: self.failed,
        }
    }
}

/// The report's last line.
pub(crate) fn summary(bound_ms: f64, c: Capacity) -> String {
    let rate = |r: f64| format!("{r:.0}");
    match (c.passed, c.failed) {
        (Some(lo), Some(hi)) => format!(
            "capacity: {} requests/s at p99 <= {bound_ms} ms ({} failed)\n",
            rate(lo),
            rate(hi)
        ),
        (Some(lo), None) => format!(
            "capacity: at least {} requests/s at p99 <= {bound_ms} ms (the largest rate tried)\n",
            rate(lo)
        ),
        (None, Some(hi)) => format!(
            "capacity: below {} requests/s at p99 <= {bound_ms} ms (the start failed: start lower)\n",
            rate(hi)
        ),
        (None, None) => "capacity: no probe ran\n".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search_with(
        start: f64,
        mut probe: impl FnMut(f64) -> Verdict,
    ) -> (Capacity, Vec<(f64, Verdict)>) {
        let mut s = Search::new(start);
        let mut seen = Vec::new();
        while let Some(rate) = s.next() {
            let v = probe(rate);
            seen.push((rate, v));
            s.record(v);
        }
        (s.result(), seen)
    }

    #[test]
    fn finds_the_capacity_within_the_resolution() {
        let (c, seen) = search_with(50.0, |r| {
            if r <= 730.0 {
                Verdict::Pass
            } else {
                Verdict::Slow
            }
        });
        let (lo, hi) = (c.passed.unwrap(), c.failed.unwrap());
        assert!(lo <= 730.0 && hi > 730.0 && hi / lo <= RESOLUTION, "{c:?}");
        // 50..800 doubling (5 probes, the failure tried twice), then bisected.
        assert_eq!(
            &seen[..6].iter().map(|s| s.0).collect::<Vec<_>>(),
            &[50.0, 100.0, 200.0, 400.0, 800.0, 800.0]
        );
    }

    #[test]
    fn a_passing_second_try_counts_and_a_broken_probe_is_not_retried() {
        let mut tries = 0;
        let (c, seen) = search_with(100.0, |r| {
            tries += 1;
            match (r, tries) {
                (100.0, 1) => Verdict::Refused, // a stall: passes the second time
                (100.0, _) => Verdict::Pass,
                _ => Verdict::Broken,
            }
        });
        assert_eq!(c.passed, Some(100.0));
        assert!(
            seen.iter().filter(|s| s.0 == 200.0).count() == 1,
            "{seen:?}"
        );
    }

    #[test]
    fn nothing_passes_or_nothing_fails() {
        let (c, _) = search_with(10.0, |_| Verdict::Slow);
        assert_eq!(
            c,
            Capacity {
                passed: None,
                failed: Some(10.0)
            }
        );
        let (c, seen) = search_with(1.0, |_| Verdict::Pass);
        assert_eq!(
            c,
            Capacity {
                passed: Some(65536.0),
                failed: None
            }
        );
        assert_eq!(seen.len(), 17);
    }
}
