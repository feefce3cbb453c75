//! The summary of side-by-side runs: each server's value per round, the
//! median over rounds, and the ratio to the first server's (the base) with
//! a 90% interval from a paired bootstrap over rounds. A resample draws
//! whole rounds, so each server keeps the conditions it met beside the
//! others in that round. The same server under two names is an A/A check:
//! its interval is what the machine's noise alone does to the ratio in
//! that many rounds.

use std::fmt::Write as _;

use serde::Serialize;

use crate::compare::Run;
use crate::servers::ServerSpec;

/// What a summary cell holds.
const P50: &str = "p50 of 200s, ms";
const P99: &str = "p99 of 200s, ms";
const CAPACITY: &str = "capacity, req/s";

/// Bootstrap resamples per interval.
const RESAMPLES: usize = 2000;
/// Rounds below which no interval is given.
const MIN_ROUNDS_FOR_INTERVAL: usize = 3;

/// One cell of the summary: a server's value per round (`None` where the
/// run had none), the median and the ratio to the base.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Cell {
    pub(crate) server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<f64>,
    pub(crate) what: &'static str,
    pub(crate) per_round: Vec<Option<f64>>,
    pub(crate) median: Option<f64>,
    /// Median over the rounds both have, over the base's.
    pub(crate) ratio: Option<f64>,
    /// 5th and 95th percentiles of the bootstrapped ratio.
    pub(crate) interval: Option<(f64, f64)>,
}

/// The values compared: the p50 and p99 of the 200s at each fixed rate,
/// or the capacity found.
pub(crate) fn summary(runs: &[Run], servers: &[ServerSpec], rounds: usize) -> Vec<Cell> {
    let per_round = |server: &str, pick: &dyn Fn(&Run) -> Option<f64>| -> Vec<Option<f64>> {
        (1..=rounds)
            .map(|round| {
                runs.iter()
                    .filter(|r| r.round == round && r.server == server)
                    .find_map(pick)
            })
            .collect()
    };
    // (rate, what): the p50 and p99 of the 200s at each fixed rate, or
    // the capacity.
    let mut keys: Vec<(Option<f64>, &'static str)> = Vec::new();
    if runs.iter().any(|r| r.capacity.is_some()) {
        keys.push((None, CAPACITY));
    } else {
        for r in runs.iter().flat_map(|r| &r.reports) {
            if !keys.contains(&(Some(r.rate), P50)) {
                keys.extend([(Some(r.rate), P50), (Some(r.rate), P99)]);
            }
        }
    }
    let mut cells = Vec::new();
    for (key, what) in keys {
        let pick = |run: &Run| -> Option<f64> {
            match key {
                None => run.capacity.and_then(|c| c.passed),
                Some(rate) => run
                    .reports
                    .iter()
                    .find(|r| r.rate == rate && r.latency_ok.count > 0)
                    .map(|r| {
                        if what == P50 {
                            r.latency_ok.p50_ms
                        } else {
                            r.latency_ok.p99_ms
                        }
                    }),
            }
        };
        let base = per_round(&servers[0].name, &pick);
        for s in servers {
            let mine = per_round(&s.name, &pick);
            let (ratio, interval) = paired_ratio(&mine, &base);
            cells.push(Cell {
                server: s.name.clone(),
                rate: key,
                what,
                median: median(mine.iter().flatten().copied().collect()),
                per_round: mine,
                ratio,
                interval,
            });
        }
    }
    cells
}

/// The median of the values (`None` for none).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The ratio of medians over the rounds both have a value in, and its
/// bootstrap interval (from [`MIN_ROUNDS_FOR_INTERVAL`] such rounds on).
fn paired_ratio(mine: &[Option<f64>], base: &[Option<f64>]) -> (Option<f64>, Option<(f64, f64)>) {
    let pairs: Vec<(f64, f64)> = mine
        .iter()
        .zip(base)
        .filter_map(|(m, b)| m.zip(*b))
        .collect();
    let ratio_of = |pairs: &mut dyn Iterator<Item = (f64, f64)>| {
        let (m, b): (Vec<f64>, Vec<f64>) = pairs.unzip();
        median(m)
            .zip(median(b))
            .filter(|&(_, b)| b > 0.0)
            .map(|(m, b)| m / b)
    };
    let ratio = ratio_of(&mut pairs.iter().copied());
    if pairs.len() < MIN_ROUNDS_FOR_INTERVAL {
        return (ratio, None);
    }
    // A fixed seed: the same rounds give the same interval.
    let mut rng = SplitMix(0x5eed_c0ec);
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .filter_map(|_| {
            let n = pairs.len();
            ratio_of(&mut (0..n).map(|_| pairs[rng.below(n)]))
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let interval = (!ratios.is_empty()).then(|| (at(0.05), at(0.95)));
    (ratio, interval)
}

/// SplitMix64: enough randomness for resampling a handful of rounds.
struct SplitMix(u64);

impl SplitMix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// The summary as a table.
pub(crate) fn table(cells: &[Cell], runs: &[Run]) -> String {
    let mut s = String::new();
    let shown = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    let _ = writeln!(
        s,
        "{:>8} {:>12} {:>16} {:>30} {:>9} {:>8} {:>22}",
        "rate/s", "server", "what", "per round", "median", "accuracy", "/ first [90%]"
    );
    for c in cells {
        let rounds: Vec<String> = c.per_round.iter().map(|v| shown(*v)).collect();
        // Accuracy: the median over this server's runs at this rate.
        let acc = median(
            runs.iter()
                .filter(|r| r.server == c.server)
                .flat_map(|r| &r.reports)
                .filter(|r| c.rate.is_none_or(|rate| r.rate == rate))
                .filter_map(|r| r.accuracy)
                .collect(),
        );
        let ratio = match (c.ratio, c.interval) {
            (Some(r), Some((lo, hi))) => format!("{r:.3} [{lo:.3}, {hi:.3}]"),
            (Some(r), None) => format!("{r:.3}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:>8} {:>12} {:>16} {:>30} {:>9} {:>8} {:>22}",
            c.rate.map_or_else(|| "-".into(), |r| format!("{r}")),
            c.server,
            c.what,
            rounds.join(", "),
            shown(c.median),
            acc.map_or_else(|| "-".into(), |a| format!("{a:.4}")),
            ratio
        );
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::report::Tally;

    pub(crate) fn spec(name: &str) -> ServerSpec {
        ServerSpec::parse(&format!("{name}=x {{profile_dir}}")).unwrap()
    }

    pub(crate) fn run(round: usize, server: &str, rate: f64, p99_ms: u64) -> Run {
        let mut t = Tally::new(rate, 1);
        t.sent(0, Duration::ZERO);
        t.record(crate::report::Outcome::Answered {
            index: 0,
            status: 200,
            latency: Duration::from_millis(p99_ms),
            retry_after: false,
            check: None,
            at: Duration::from_millis(1),
        });
        Run {
            round,
            server: server.into(),
            command: String::new(),
            log: String::new(),
            exit: Some(0),
            reports: vec![t.finish().0],
            capacity: None,
        }
    }

    #[test]
    fn ratios_are_paired_by_round_with_an_interval() {
        let s = [spec("old"), spec("new")];
        let mut runs = Vec::new();
        for (round, (old, new)) in [(10, 20), (12, 24), (11, 22), (40, 80)].iter().enumerate() {
            runs.push(run(round + 1, "old", 100.0, *old));
            runs.push(run(round + 1, "new", 100.0, *new));
        }
        let cells = summary(&runs, &s, 4);
        // p50 and p99 (one answer a run: the same value) of each server.
        assert_eq!(cells.len(), 4);
        assert_eq!((cells[0].what, cells[2].what), (P50, P99));
        let (base, new) = (&cells[2], &cells[3]);
        assert!((base.ratio.unwrap() - 1.0).abs() < 1e-9);
        // Twice as slow in every round: every resample says 2.
        let r = new.ratio.unwrap();
        assert!((r - 2.0).abs() < 0.01, "{r}");
        let (lo, hi) = new.interval.unwrap();
        assert!(lo > 1.95 && hi < 2.05, "{lo} {hi}");
        assert!((new.median.unwrap() - 23.0).abs() < 0.1, "{:?}", new.median);
        let text = table(&cells, &runs);
        assert_eq!(text.lines().count(), 5, "{text}");
    }

    /// One run per rate: each rate's cell takes the run of that rate.
    #[test]
    fn each_rate_is_summarised_from_its_own_runs() {
        let s = [spec("a"), spec("b")];
        let mut runs = Vec::new();
        for round in 1..=3 {
            for (rate, ms) in [(100.0, 10), (200.0, 30)] {
                runs.push(run(round, "a", rate, ms));
                runs.push(run(round, "b", rate, 2 * ms));
            }
        }
        let cells = summary(&runs, &s, 3);
        assert_eq!(cells.len(), 8);
        let p99 = |rate: f64, server: &str| {
            cells
                .iter()
                .find(|c| c.rate == Some(rate) && c.server == server && c.what == P99)
                .unwrap()
        };
        assert!((p99(200.0, "a").median.unwrap() - 30.0).abs() < 0.1);
        assert!((p99(200.0, "b").ratio.unwrap() - 2.0).abs() < 0.01);
        assert!(p99(100.0, "b").per_round.iter().all(|v| v.is_some()));
    }

    #[test]
    fn a_round_without_a_value_is_left_out_of_the_pairing_and_two_rounds_give_no_interval() {
        let s = [spec("a"), spec("b")];
        let mut runs = vec![run(1, "a", 50.0, 10), run(1, "b", 50.0, 30)];
        runs.push(run(2, "a", 50.0, 10));
        let mut nothing = run(2, "b", 50.0, 1);
        nothing.reports[0].latency_ok.count = 0;
        runs.push(nothing);
        let cells = summary(&runs, &s, 2);
        let b99 = &cells[3];
        assert_eq!((b99.server.as_str(), b99.what), ("b", P99));
        assert_eq!(b99.per_round[1], None);
        assert!((b99.ratio.unwrap() - 3.0).abs() < 0.05);
        assert_eq!(b99.interval, None);
    }
}
