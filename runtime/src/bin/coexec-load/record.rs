//! `--record FILE`: every request's fate, one CSV line each, so that a p99
//! can be traced to the moments its slow requests were scheduled (a spike
//! once a second, a stall at the start, a slow tail at the end).
//!
//! ```text
//! rate,index,scheduled_ms,send_lag_ms,outcome,latency_ms
//! 1500,0,0.000,0.041,200,3.912
//! 1500,1,0.667,0.038,503,0.802
//! 1500,2,1.333,0.040,timeout,
//! ```
//!
//! `scheduled_ms` is the request's due time since the rate's start and
//! `latency_ms` runs from it to the answer's last byte (empty when nothing
//! answered); `outcome` is the HTTP status, or `refused`, `timeout`, `cut`,
//! `closed` (see [`Lost`]), or `unsent` when the time limit came first.

use std::io::Write;
use std::time::Duration;

use crate::report::Lost;

/// The CSV header line.
pub(crate) const HEADER: &str = "rate,index,scheduled_ms,send_lag_ms,outcome,latency_ms\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Unsent,
    /// Sent, nothing heard yet (a run's end settles every sent request, so
    /// this is only seen while it runs).
    Sent,
    Status(u16),
    Refused,
    Lost(Lost),
}

#[derive(Debug, Clone, Copy)]
struct Row {
    send_lag: Duration,
    fate: Fate,
    latency: Option<Duration>,
}

/// One rate's requests, by index.
pub(crate) struct Trace {
    rate: f64,
    rows: Vec<Row>,
}

impl Trace {
    /// Room for `requests` rows, refused (not aborted) when memory is short.
    pub(crate) fn new(rate: f64, requests: u64) -> Result<Self, String> {
        let n = usize::try_from(requests).map_err(|_| "too many requests to record".to_string())?;
        let mut rows = Vec::new();
        rows.try_reserve_exact(n).map_err(|_| {
            format!(
                "--record: no memory for {requests} rows (about {} MiB)",
                requests.saturating_mul(std::mem::size_of::<Row>() as u64) >> 20
            )
        })?;
        rows.resize(
            n,
            Row {
                send_lag: Duration::ZERO,
                fate: Fate::Unsent,
                latency: None,
            },
        );
        Ok(Self { rate, rows })
    }

    pub(crate) fn sent(&mut self, index: u64, lag: Duration) {
        if let Some(r) = self.rows.get_mut(index as usize) {
            r.send_lag = lag;
            r.fate = Fate::Sent;
        }
    }

    /// An answer; a duplicate answer keeps the first.
    pub(crate) fn answered(&mut self, index: u64, status: u16, latency: Duration) {
        if let Some(r) = self.rows.get_mut(index as usize) {
            if r.latency.is_none() {
                r.fate = Fate::Status(status);
                r.latency = Some(latency);
            }
        }
    }

    pub(crate) fn refused(&mut self, index: u64) {
        self.settle(index, Fate::Refused);
    }

    pub(crate) fn lost(&mut self, index: u64, why: Lost) {
        self.settle(index, Fate::Lost(why));
    }

    fn settle(&mut self, index: u64, fate: Fate) {
        if let Some(r) = self.rows.get_mut(index as usize) {
            r.fate = fate;
        }
    }

    /// Writes the rows, without the header.
    pub(crate) fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        for (i, r) in self.rows.iter().enumerate() {
            let scheduled = i as f64 / self.rate * 1000.0;
            let outcome = match r.fate {
                Fate::Unsent => "unsent".to_string(),
                Fate::Sent => "sent".to_string(),
                Fate::Status(s) => s.to_string(),
                Fate::Refused => "refused".to_string(),
                Fate::Lost(Lost::Timeout) => "timeout".to_string(),
                Fate::Lost(Lost::Cut) => "cut".to_string(),
                Fate::Lost(Lost::Closed) => "closed".to_string(),
            };
            write!(w, "{},{i},{scheduled:.3},", self.rate)?;
            if r.fate == Fate::Unsent {
                write!(w, ",")?;
            } else {
                write!(w, "{:.3},", ms(r.send_lag))?;
            }
            match r.latency {
                Some(l) => writeln!(w, "{outcome},{:.3}", ms(l))?,
                None => writeln!(w, "{outcome},")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_request_in_index_order() {
        let mut t = Trace::new(1000.0, 5).unwrap();
        t.sent(0, Duration::from_micros(40));
        t.sent(1, Duration::from_micros(50));
        t.sent(2, Duration::from_micros(60));
        t.sent(3, Duration::from_micros(70));
        t.answered(1, 503, Duration::from_micros(800));
        t.answered(0, 200, Duration::from_micros(3912));
        // A duplicate keeps the first answer.
        t.answered(0, 500, Duration::from_micros(9000));
        t.lost(2, Lost::Timeout);
        t.refused(3);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "1000,0,0.000,0.040,200,3.912\n\
             1000,1,1.000,0.050,503,0.800\n\
             1000,2,2.000,0.060,timeout,\n\
             1000,3,3.000,0.070,refused,\n\
             1000,4,4.000,,unsent,\n"
        );
        assert_eq!(HEADER.trim_end().split(',').count(), 6);
    }

    #[test]
    fn a_record_too_big_for_memory_is_refused() {
        let e = Trace::new(10.0, u64::MAX >> 8).err().unwrap();
        assert!(
            e.starts_with("--record: no memory") || e.contains("too many"),
            "{e}"
        );
    }
}
