//! `--record FILE`: every request's fate, one CSV line each, so that a p99
//! can be traced to the moments its slow requests were scheduled (a stall
//! of tens of ms, a slow start, a slow tail) and lined up with the server's
//! logs and metrics.
//!
//! ```text
//! rate,index,scheduled_ms,scheduled_unix_ms,send_lag_ms,outcome,latency_ms
//! 1500,0,0.000,1764072000005.000,0.041,200,3.912
//! 1500,1,0.667,1764072000005.667,0.038,503,0.802
//! 1500,2,1.333,1764072000006.333,0.040,timeout,
//! ```
//!
//! `scheduled_ms` is the request's due time since its rate's start, and
//! `scheduled_unix_ms` the same moment on the wall clock; `latency_ms` runs
//! from it to the answer's last byte (empty when nothing answered).
//! `outcome` is the HTTP status (`200-malformed` or `200-crossed` for a 200
//! that failed its check), or `refused`, `timeout`, `cut`, `closed` (see
//! [`Lost`]), or `unsent` when the time limit came first. Times are kept in
//! whole µs and saturate at 4294 s.

use std::io::Write;
use std::time::Duration;

use crate::report::{Check, Lost};

/// The CSV header line.
pub(crate) const HEADER: &str =
    "rate,index,scheduled_ms,scheduled_unix_ms,send_lag_ms,outcome,latency_ms\n";

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Unsent,
    /// Sent, nothing heard yet (a run's end settles every sent request, so
    /// this is only seen while it runs).
    Sent,
    Status(u16, Verdict),
    Refused,
    Lost(Lost),
}

/// How a 200's body checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Fine,
    Malformed,
    Crossed,
}

/// 12 bytes a request: 10 million requests (a rate's most) take 120 MB.
#[derive(Debug, Clone, Copy)]
struct Row {
    send_lag_us: u32,
    /// `u32::MAX`: no answer.
    latency_us: u32,
    fate: Fate,
}

const NONE: u32 = u32::MAX;

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).map_or(NONE - 1, |us| us.min(NONE - 1))
}

const EMPTY: Row = Row {
    send_lag_us: 0,
    latency_us: NONE,
    fate: Fate::Unsent,
};

/// One rate's requests, by index; reused from rate to rate.
pub(crate) struct Trace {
    rate: f64,
    /// The wall clock at the rate's start, ms since the Unix epoch.
    start_unix_ms: f64,
    rows: Vec<Row>,
}

impl Trace {
    /// Room for `requests` rows, refused when it would take more than a
    /// quarter of `memory` (the bytes this machine had available): the
    /// server being measured shares the machine.
    pub(crate) fn new(requests: u64, memory: u64) -> Result<Self, String> {
        let bytes = requests.saturating_mul(std::mem::size_of::<Row>() as u64);
        if bytes > memory / 4 {
            return Err(format!(
                "--record: {requests} requests take {} MiB, over a quarter of the {} MiB available",
                bytes >> 20,
                memory >> 20
            ));
        }
        let n = usize::try_from(requests).map_err(|_| "--record: too many requests".to_string())?;
        let mut rows = Vec::new();
        rows.try_reserve_exact(n)
            .map_err(|e| format!("--record: cannot allocate {requests} rows: {e}"))?;
        rows.resize(n, EMPTY);
        Ok(Self {
            rate: 0.0,
            start_unix_ms: 0.0,
            rows,
        })
    }

    /// Clears the rows for a new rate.
    pub(crate) fn reset(&mut self, rate: f64) {
        self.rate = rate;
        self.start_unix_ms = 0.0;
        self.rows.fill(EMPTY);
    }

    /// The rate's start on the wall clock.
    pub(crate) fn started(&mut self, at: std::time::SystemTime) {
        self.start_unix_ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    }

    pub(crate) fn sent(&mut self, index: u64, lag: Duration) {
        if let Some(r) = self.rows.get_mut(index as usize) {
            r.send_lag_us = micros(lag);
            r.fate = Fate::Sent;
        }
    }

    /// An answer and, for a 200, its check; a duplicate answer keeps the
    /// first.
    pub(crate) fn answered(
        &mut self,
        index: u64,
        status: u16,
        latency: Duration,
        check: Option<&Check>,
    ) {
        let verdict = match check {
            Some(Check::Malformed(_)) => Verdict::Malformed,
            Some(Check::Crossed) => Verdict::Crossed,
            _ => Verdict::Fine,
        };
        if let Some(r) = self.rows.get_mut(index as usize)
            && r.latency_us == NONE
        {
            r.fate = Fate::Status(status, verdict);
            r.latency_us = micros(latency);
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
        let ms = |us: u32| f64::from(us) / 1000.0;
        for (i, r) in self.rows.iter().enumerate() {
            let scheduled = i as f64 / self.rate * 1000.0;
            let outcome = match r.fate {
                Fate::Unsent => "unsent".to_string(),
                Fate::Sent => "sent".to_string(),
                Fate::Status(s, Verdict::Fine) => s.to_string(),
                Fate::Status(s, Verdict::Malformed) => format!("{s}-malformed"),
                Fate::Status(s, Verdict::Crossed) => format!("{s}-crossed"),
                Fate::Refused => "refused".to_string(),
                Fate::Lost(Lost::Timeout) => "timeout".to_string(),
                Fate::Lost(Lost::Cut) => "cut".to_string(),
                Fate::Lost(Lost::Closed) => "closed".to_string(),
            };
            write!(
                w,
                "{},{i},{scheduled:.3},{:.3},",
                self.rate,
                self.start_unix_ms + scheduled
            )?;
            if r.fate != Fate::Unsent {
                write!(w, "{:.3}", ms(r.send_lag_us))?;
            }
            write!(w, ",{outcome},")?;
            if r.latency_us != NONE {
                write!(w, "{:.3}", ms(r.latency_us))?;
            }
            writeln!(w)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_request_in_index_order() {
        let mut t = Trace::new(6, 1 << 30).unwrap();
        t.reset(1000.0);
        t.started(std::time::UNIX_EPOCH + Duration::from_secs(2));
        for i in 0..5 {
            t.sent(i, Duration::from_micros(40 + 10 * i));
        }
        t.answered(1, 503, Duration::from_micros(800), None);
        let fine = Check::Valid {
            rows: 1,
            correct: Some(1),
            agree: None,
        };
        t.answered(0, 200, Duration::from_micros(3912), Some(&fine));
        // A duplicate keeps the first answer.
        t.answered(0, 500, Duration::from_micros(9000), None);
        t.lost(2, Lost::Timeout);
        t.refused(3);
        t.answered(4, 200, Duration::from_micros(1500), Some(&Check::Crossed));
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "1000,0,0.000,2000.000,0.040,200,3.912\n\
             1000,1,1.000,2001.000,0.050,503,0.800\n\
             1000,2,2.000,2002.000,0.060,timeout,\n\
             1000,3,3.000,2003.000,0.070,refused,\n\
             1000,4,4.000,2004.000,0.080,200-crossed,1.500\n\
             1000,5,5.000,2005.000,,unsent,\n"
        );
        assert_eq!(HEADER.trim_end().split(',').count(), 7);
        // A new rate starts from clean rows.
        t.reset(10.0);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .lines()
                .all(|l| l.ends_with(",,unsent,"))
        );
    }

    #[test]
    fn a_record_too_big_for_this_machine_is_refused() {
        let e = Trace::new(10_000_000, 400 << 20).err().unwrap();
        assert!(e.contains("over a quarter of the 400 MiB available"), "{e}");
        assert!(Trace::new(1_000_000, 64 << 20).is_ok());
        assert_eq!(std::mem::size_of::<Row>(), 12);
    }
}
