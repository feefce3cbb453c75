//! Failed chunks: who may take them again, and in what size.

use super::*;

/// The classes on which a chunk failed once, and twice or more (bit `c`,
/// modulo 64).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Failures {
    once: u64,
    twice: u64,
}

impl Failures {
    pub(super) fn add(mut self, c: usize) -> Self {
        let bit = class_bit(c);
        if self.once & bit != 0 {
            self.twice |= bit;
        }
        self.once |= bit;
        self
    }

    /// Whether class `c` failed the chunk twice: it goes elsewhere if it can.
    pub(super) fn avoids(&self, c: usize) -> bool {
        self.twice & class_bit(c) != 0
    }
}

#[derive(Debug, Clone)]
/// A failed range waiting for another worker.
pub(super) struct Retry {
    pub(super) range: Range<usize>,
    pub(super) attempts: u32,
    pub(super) not_by: usize,
    pub(super) failures: Failures,
}

fn class_bit(c: usize) -> u64 {
    1 << (c % 64)
}

impl JobCore {
    /// A failed chunk (or its first part) for worker `w` of class `c`.
    ///
    /// The worker that failed it last takes it only when alone, and a class
    /// that failed it twice only when no other class can (two streams of a
    /// lost GPU must not use up its attempts). If those rules leave no
    /// worker in service that may take it, any worker may, so a retry never
    /// waits forever. Under the guard a retry is sized like a dynamic chunk:
    /// a slower worker takes a part and leaves the rest.
    pub(super) fn take_retry(&mut self, w: usize, c: usize, now: f64) -> Option<Retry> {
        if self.retries.is_empty() {
            return None;
        }
        let others = self.total_workers() > 1;
        let (st, wc) = (&self.st, &self.worker_class);
        // Workers of class `k` that may run `r`, leaving out its last failer.
        let usable = |r: &Retry, k: usize| {
            let s = &st[k];
            let last = usize::from(wc.get(r.not_by) == Some(&k));
            if s.eligible || s.standby {
                s.workers.saturating_sub(last)
            } else {
                0
            }
        };
        let elsewhere =
            |r: &Retry| (0..st.len()).any(|k| usable(r, k) > 0 && !r.failures.avoids(k));
        let class_ok = |r: &Retry, k: usize| !r.failures.avoids(k) || !elsewhere(r);
        let i = self.retries.iter().position(|r| {
            let anyone = (0..st.len()).any(|k| usable(r, k) > 0 && class_ok(r, k));
            !anyone || (class_ok(r, c) && (r.not_by != w || !others))
        })?;
        let mut r = self.retries.remove(i)?;
        if self.adm.guard {
            let n = r.range.len();
            let Some(m) = self.limit(w, c, n, now) else {
                self.retries.insert(i, r);
                return None;
            };
            let m = (m / self.grain * self.grain).max(self.grain);
            if m < n {
                let rest = Retry {
                    range: r.range.start + m..r.range.end,
                    ..r.clone()
                };
                r.range.end = r.range.start + m;
                self.retries.insert(i, rest);
            }
        }
        Some(r)
    }
}
