//! What one rate's run counted: outcomes tallied into a report, printed as a
//! table or JSON.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::record::Trace;

/// Why a sent request never got an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// No answer within the per-request timeout.
    Timeout,
    /// Still waiting when the run's time limit came.
    Cut,
    /// The connection closed or failed after the request went out.
    Closed,
}

/// How a 200's body compared with what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Check {
    /// One output per input: how many labels matched the true ones (`None`
    /// for texts, which have no labels) and, where the data has the
    /// reference model's labels, how many matched those.
    Valid {
        rows: u64,
        correct: Option<u64>,
        agree: Option<u64>,
    },
    /// Not the expected JSON, or the wrong number of outputs.
    Malformed(String),
    /// Answered with another request's id.
    Crossed,
}

/// The fate of one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// An HTTP answer; `latency` runs from the scheduled send to the last
    /// byte of the body.
    Answered {
        index: u64,
        status: u16,
        latency: Duration,
        /// For 429: whether it carried `Retry-After`.
        retry_after: bool,
        /// For 200 only.
        check: Option<Check>,
        /// Since the run's start.
        at: Duration,
    },
    /// The connection could not be made: the server never saw the request.
    Refused { index: u64 },
    /// Sent and never answered.
    Lost { index: u64, why: Lost },
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Latency {
    pub(crate) count: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl Latency {
    /// `v` (one of these percentiles) in ms for a table, or `-` with no
    /// answers: not a 0 that reads as fast.
    pub(crate) fn show(&self, v: f64) -> String {
        if self.count == 0 {
            "-".to_string()
        } else {
            format!("{v:.2}")
        }
    }

    fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// One rate's results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RateReport {
    /// Target arrival rate, requests per second.
    pub(crate) rate: f64,
    /// Requests asked for.
    pub(crate) requests: u64,
    /// Requests sent (scheduled before the time limit).
    pub(crate) sent: u64,
    /// Requests never sent because the time limit came first.
    pub(crate) unsent: u64,
    pub(crate) ok: u64,
    /// Too many requests: the queue was full (with `Retry-After`).
    pub(crate) status_429: u64,
    /// Unavailable: draining or not ready.
    pub(crate) status_503: u64,
    pub(crate) status_504: u64,
    /// Any other status.
    pub(crate) other: u64,
    /// 429s without a `Retry-After` header.
    pub(crate) status_429_without_retry_after: u64,
    /// Connections refused: the server never saw these.
    pub(crate) refused: u64,
    /// Sent and never answered: `lost_timeout + lost_cut + lost_closed`.
    pub(crate) lost: u64,
    pub(crate) lost_timeout: u64,
    pub(crate) lost_cut: u64,
    pub(crate) lost_closed: u64,
    /// Requests answered more than once.
    pub(crate) duplicated: u64,
    /// 200s whose body was not one output per input.
    pub(crate) malformed: u64,
    /// 200s that echoed another request's id.
    pub(crate) crossed: u64,
    /// The first malformed body's problem, to show what went wrong.
    pub(crate) first_malformed: Option<String>,
    /// Rows checked in valid 200s.
    pub(crate) rows_checked: u64,
    /// Share of checked rows whose label is the true one.
    pub(crate) accuracy: Option<f64>,
    /// Share of checked rows whose label is the reference model's.
    pub(crate) agreement: Option<f64>,
    /// Seconds from the first scheduled send to the last answer.
    pub(crate) elapsed_s: f64,
    /// Answers (any status) per second over `elapsed_s`.
    pub(crate) throughput: f64,
    /// 200s per second over `elapsed_s`.
    pub(crate) goodput: f64,
    /// Sends that left more than 10 ms after their scheduled time (the
    /// generator itself, or its connection cap, fell behind).
    pub(crate) late_sends: u64,
    pub(crate) max_send_lag_ms: f64,
    /// Latency of the 200s.
    pub(crate) latency_ok: Latency,
    /// Latency of every answer, whatever its status.
    pub(crate) latency_all: Latency,
}

/// A send that left this late counts as late.
const LATE: Duration = Duration::from_millis(10);

/// Accumulates outcomes into a [`RateReport`].
pub(crate) struct Tally {
    rate: f64,
    requests: u64,
    report: RateReport,
    answered: Vec<bool>,
    correct: u64,
    /// Rows with a label checked.
    labelled: u64,
    agree: u64,
    agree_rows: u64,
    last_answer: Duration,
    hist_ok: Histogram<u64>,
    hist_all: Histogram<u64>,
    /// Every request's fate, with `--record`.
    trace: Option<Trace>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 1 hour at 3 significant digits; these bounds are valid.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap_or_else(|_| unreachable!())
}

impl Tally {
    pub(crate) fn new(rate: f64, requests: u64) -> Self {
        let empty = Latency::of(&histogram());
        Self {
            rate,
            requests,
            report: RateReport {
                rate,
                requests,
                sent: 0,
                unsent: 0,
                ok: 0,
                status_429: 0,
                status_503: 0,
                status_504: 0,
                other: 0,
                status_429_without_retry_after: 0,
                refused: 0,
                lost: 0,
                lost_timeout: 0,
                lost_cut: 0,
                lost_closed: 0,
                duplicated: 0,
                malformed: 0,
                crossed: 0,
                first_malformed: None,
                rows_checked: 0,
                accuracy: None,
                agreement: None,
                elapsed_s: 0.0,
                throughput: 0.0,
                goodput: 0.0,
                late_sends: 0,
                max_send_lag_ms: 0.0,
                latency_ok: empty.clone(),
                latency_all: empty,
            },
            answered: vec![false; requests as usize],
            correct: 0,
            labelled: 0,
            agree: 0,
            agree_rows: 0,
            last_answer: Duration::ZERO,
            hist_ok: histogram(),
            hist_all: histogram(),
            trace: None,
        }
    }

    /// Keeps every request's fate too (`--record`).
    pub(crate) fn with_trace(mut self, trace: Trace) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Request `index` went out `lag` after its scheduled time.
    pub(crate) fn sent(&mut self, index: u64, lag: Duration) {
        if let Some(t) = &mut self.trace {
            t.sent(index, lag);
        }
        self.report.sent += 1;
        if lag > LATE {
            self.report.late_sends += 1;
        }
        let ms = lag.as_secs_f64() * 1000.0;
        if ms > self.report.max_send_lag_ms {
            self.report.max_send_lag_ms = ms;
        }
    }

    pub(crate) fn record(&mut self, o: Outcome) {
        if let Some(t) = &mut self.trace {
            match &o {
                Outcome::Refused { index } => t.refused(*index),
                Outcome::Lost { index, why } => t.lost(*index, *why),
                Outcome::Answered {
                    index,
                    status,
                    latency,
                    check,
                    ..
                } => t.answered(*index, *status, *latency, check.as_ref()),
            }
        }
        let r = &mut self.report;
        match o {
            Outcome::Refused { .. } => r.refused += 1,
            Outcome::Lost { why, .. } => match why {
                Lost::Timeout => r.lost_timeout += 1,
                Lost::Cut => r.lost_cut += 1,
                Lost::Closed => r.lost_closed += 1,
            },
            Outcome::Answered {
                index,
                status,
                latency,
                retry_after,
                check,
                at,
            } => {
                let seen = self.answered.get_mut(index as usize);
                match seen {
                    Some(true) => {
                        r.duplicated += 1;
                        return;
                    }
                    Some(s) => *s = true,
                    None => {}
                }
                self.last_answer = self.last_answer.max(at);
                let us = latency.as_micros().min(u64::MAX as u128) as u64;
                self.hist_all.saturating_record(us.max(1));
                match status {
                    200 => {
                        r.ok += 1;
                        self.hist_ok.saturating_record(us.max(1));
                    }
                    429 => {
                        r.status_429 += 1;
                        if !retry_after {
                            r.status_429_without_retry_after += 1;
                        }
                    }
                    503 => r.status_503 += 1,
                    504 => r.status_504 += 1,
                    _ => r.other += 1,
                }
                match check {
                    None => {}
                    Some(Check::Valid {
                        rows,
                        correct,
                        agree,
                    }) => {
                        r.rows_checked += rows;
                        if let Some(c) = correct {
                            self.correct += c;
                            self.labelled += rows;
                        }
                        if let Some(a) = agree {
                            self.agree += a;
                            self.agree_rows += rows;
                        }
                    }
                    Some(Check::Malformed(why)) => {
                        r.malformed += 1;
                        r.first_malformed.get_or_insert(why);
                    }
                    Some(Check::Crossed) => r.crossed += 1,
                }
            }
        }
    }

    /// The report, and the trace if one was kept.
    pub(crate) fn finish(mut self) -> (RateReport, Option<Trace>) {
        let r = &mut self.report;
        debug_assert_eq!(r.rate, self.rate);
        r.unsent = self.requests - r.sent;
        r.lost = r.lost_timeout + r.lost_cut + r.lost_closed;
        r.accuracy = (self.labelled > 0).then(|| self.correct as f64 / self.labelled as f64);
        r.agreement = (self.agree_rows > 0).then(|| self.agree as f64 / self.agree_rows as f64);
        r.elapsed_s = self.last_answer.as_secs_f64();
        let answered = self.hist_all.len();
        if r.elapsed_s > 0.0 {
            r.throughput = answered as f64 / r.elapsed_s;
            r.goodput = r.ok as f64 / r.elapsed_s;
        }
        r.latency_ok = Latency::of(&self.hist_ok);
        r.latency_all = Latency::of(&self.hist_all);
        (self.report, self.trace)
    }
}

/// The human table, one line per rate.
pub(crate) fn table(reports: &[RateReport]) -> String {
    let mut s = format!(
        "{:>8} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
        "rate/s",
        "sent",
        "200",
        "429",
        "503",
        "504",
        "other",
        "lost",
        "refsd",
        "dup/bad",
        "acc",
        "answ/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "p99all ms"
    );
    for r in reports {
        let acc = r
            .accuracy
            .map_or_else(|| "-".to_string(), |a| format!("{a:.4}"));
        let (ok, all) = (&r.latency_ok, &r.latency_all);
        s.push_str(&format!(
            "{:>8.1} {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} {:>5} {:>5} {:>7} {:>6} {:>8.1} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
            r.rate,
            r.sent,
            r.ok,
            r.status_429,
            r.status_503,
            r.status_504,
            r.other,
            r.lost,
            r.refused,
            format!("{}/{}", r.duplicated, r.malformed + r.crossed),
            acc,
            r.throughput,
            ok.show(ok.p50_ms),
            ok.show(ok.p95_ms),
            ok.show(ok.p99_ms),
            ok.show(ok.max_ms),
            all.show(all.p99_ms),
        ));
    }
    s
}

/// Why the run fails (exit 1, after the report): a rate whose sends got no
/// answer at all, or a service that broke its contract: an answer
/// duplicated, malformed, or meant for another request. Timeouts, 429s, 503s and
/// 504s are answers a service may give under load, so they alone do not
/// fail a run.
pub(crate) fn broken(reports: &[RateReport]) -> Option<String> {
    reports.iter().find_map(|r| {
        let bad = r.duplicated + r.malformed + r.crossed;
        if r.sent > 0 && r.latency_all.count == 0 {
            Some(format!("rate {}: no request was answered", r.rate))
        } else if bad > 0 {
            Some(format!(
                "rate {}: {} duplicated, {} malformed, {} crossed answers",
                r.rate, r.duplicated, r.malformed, r.crossed
            ))
        } else {
            None
        }
    })
}

/// Warnings worth a line under the table.
pub(crate) fn notes(reports: &[RateReport]) -> Vec<String> {
    let mut v = Vec::new();
    for r in reports {
        if r.sent > 0 && r.latency_all.count == 0 {
            let hint = if r.refused == r.sent {
                ": is the server up?"
            } else {
                ""
            };
            v.push(format!(
                "rate {}: no request was answered ({} refused, {} lost){hint}",
                r.rate, r.refused, r.lost
            ));
        }
        if r.unsent > 0 {
            v.push(format!(
                "rate {}: time limit reached, {} of {} requests never sent",
                r.rate, r.unsent, r.requests
            ));
        }
        if r.late_sends > 0 {
            v.push(format!(
                "rate {}: {} sends left > {} ms late (max {:.1} ms): the generator fell behind",
                r.rate,
                r.late_sends,
                LATE.as_millis(),
                r.max_send_lag_ms
            ));
        }
        if let Some(m) = &r.first_malformed {
            v.push(format!(
                "rate {}: {} malformed answers, first: {m}",
                r.rate, r.malformed
            ));
        }
        if r.crossed > 0 {
            v.push(format!(
                "rate {}: {} answers carried another request's id",
                r.rate, r.crossed
            ));
        }
        if r.status_429_without_retry_after > 0 {
            v.push(format!(
                "rate {}: {} 429s without Retry-After",
                r.rate, r.status_429_without_retry_after
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(index: u64, status: u16, ms: u64, check: Option<Check>) -> Outcome {
        Outcome::Answered {
            index,
            status,
            latency: Duration::from_millis(ms),
            retry_after: false,
            check,
            at: Duration::from_millis(100 * (index + 1)),
        }
    }

    #[test]
    fn tallies_every_kind_of_outcome() {
        let mut t = Tally::new(10.0, 10);
        for i in 0..8 {
            t.sent(i, Duration::ZERO);
        }
        t.sent(8, Duration::from_millis(20));
        let valid = |c| {
            Some(Check::Valid {
                rows: 2,
                correct: Some(c),
                agree: Some(c),
            })
        };
        t.record(answered(0, 200, 10, valid(2)));
        t.record(answered(1, 200, 30, valid(1)));
        t.record(answered(1, 200, 30, valid(1)));
        t.record(answered(2, 429, 1, None));
        t.record(answered(3, 504, 50, None));
        t.record(answered(4, 500, 2, None));
        t.record(answered(5, 200, 20, Some(Check::Malformed("x".into()))));
        t.record(Outcome::Lost {
            index: 6,
            why: Lost::Timeout,
        });
        t.record(Outcome::Lost {
            index: 7,
            why: Lost::Cut,
        });
        t.record(Outcome::Refused { index: 8 });
        let (r, _) = t.finish();
        assert_eq!((r.sent, r.unsent), (9, 1));
        assert_eq!((r.ok, r.status_429, r.status_504, r.other), (3, 1, 1, 1));
        assert_eq!(r.status_429_without_retry_after, 1);
        assert_eq!(
            (r.lost, r.lost_timeout, r.lost_cut, r.refused),
            (2, 1, 1, 1)
        );
        assert_eq!((r.duplicated, r.malformed), (1, 1));
        assert_eq!(r.first_malformed.as_deref(), Some("x"));
        assert_eq!(r.rows_checked, 4);
        assert_eq!(r.accuracy, Some(0.75));
        assert_eq!(r.agreement, Some(0.75));
        assert_eq!((r.late_sends, r.max_send_lag_ms), (1, 20.0));
        assert_eq!(r.latency_ok.count, 3);
        assert_eq!(r.latency_all.count, 6);
        assert!((r.latency_ok.max_ms - 30.0).abs() < 0.1);
        assert!((r.latency_all.max_ms - 50.0).abs() < 0.1);
        // Last answer at 600 ms; 6 answers.
        assert!((r.elapsed_s - 0.6).abs() < 1e-9);
        assert!((r.throughput - 10.0).abs() < 1e-9);
        assert_eq!(table(std::slice::from_ref(&r)).lines().count(), 2);
        assert_eq!(
            broken(std::slice::from_ref(&r)).as_deref(),
            Some("rate 10: 1 duplicated, 1 malformed, 0 crossed answers")
        );
        assert!(notes(&[r]).len() >= 3);
    }

    /// Nothing answered (no server): the latency columns say `-`, not 0.00,
    /// and a note says so.
    #[test]
    fn a_run_with_no_answer_shows_no_latency() {
        let mut t = Tally::new(10.0, 2);
        for i in 0..2 {
            t.sent(i, Duration::ZERO);
            t.record(Outcome::Refused { index: i });
        }
        let (r, _) = t.finish();
        let table = table(std::slice::from_ref(&r));
        let row = table.lines().nth(1).unwrap();
        assert!(!row.contains("0.00"), "{row}");
        assert!(row.trim_end().ends_with('-'), "{row}");
        let notes = notes(std::slice::from_ref(&r));
        assert!(
            notes
                .iter()
                .any(|n| n.contains("no request was answered (2 refused")),
            "{notes:?}"
        );
        assert!(broken(&[r]).is_some());
    }
}
