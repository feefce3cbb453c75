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

/// A job's failed ranges waiting for another worker, oldest first.
#[derive(Default)]
pub(super) struct Retries {
    pub(super) queue: VecDeque<Retry>,
    /// Chunks that failed or were taken back, for the report.
    pub(super) retried: usize,
}

impl Retries {
    /// Worker `w` of class `class` failed `chunk`, which has used
    /// `attempts` of its attempts (`oom`: it ran out of device memory): it
    /// goes back for another worker, in halves on `grain` where memory ran
    /// out.
    pub(super) fn requeue(
        &mut self,
        chunk: &ChunkInfo,
        attempts: u32,
        w: usize,
        class: usize,
        oom: bool,
        grain: usize,
    ) {
        let r = chunk.range.clone();
        // Out of device memory: try again in halves (on the grain), on
        // any device; other failures go to another kind of device first.
        let half = (r.len() / 2).div_ceil(grain) * grain;
        let parts = if oom && half > 0 && half < r.len() {
            vec![r.start..r.start + half, r.start + half..r.end]
        } else {
            vec![r]
        };
        // Halves may fit where the whole did not: not counted against
        // the class.
        let failures = if parts.len() == 2 {
            chunk.failures
        } else {
            chunk.failures.add(class)
        };
        for range in parts {
            self.queue.push_back(Retry {
                range,
                attempts,
                not_by: w,
                failures,
            });
        }
    }

    /// Where in the queue the first retry is that worker `w` of class `c`
    /// may take (`others`: whether the job has another worker), by the
    /// rules of [`JobCore::take_retry`]; `st` and `worker_class` are the
    /// job's.
    fn position(
        &self,
        w: usize,
        c: usize,
        others: bool,
        st: &[ClassState],
        worker_class: &[usize],
    ) -> Option<usize> {
        // Workers of class `k` that may run `r`, leaving out its last failer.
        let usable = |r: &Retry, k: usize| {
            let s = &st[k];
            let last = usize::from(worker_class.get(r.not_by) == Some(&k));
            if s.eligible || s.standby {
                s.workers.saturating_sub(last)
            } else {
                0
            }
        };
        let elsewhere =
            |r: &Retry| (0..st.len()).any(|k| usable(r, k) > 0 && !r.failures.avoids(k));
        let class_ok = |r: &Retry, k: usize| !r.failures.avoids(k) || !elsewhere(r);
        self.queue.iter().position(|r| {
            let anyone = (0..st.len()).any(|k| usable(r, k) > 0 && class_ok(r, k));
            !anyone || (class_ok(r, c) && (r.not_by != w || !others))
        })
    }
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
        if self.retries.queue.is_empty() {
            return None;
        }
        let others = self.total_workers() > 1;
        let i = self
            .retries
            .position(w, c, others, &self.st, &self.worker_class)?;
        let mut r = self.retries.queue.remove(i)?;
        if self.plan.adm.guard {
            let n = r.range.len();
            let Some(m) = self.limit(w, c, n, now) else {
                self.retries.queue.insert(i, r);
                return None;
            };
            let g = self.progress.grain;
            let m = (m / g * g).max(g);
            if m < n {
                let rest = Retry {
                    range: r.range.start + m..r.range.end,
                    ..r.clone()
                };
                r.range.end = r.range.start + m;
                self.retries.queue.insert(i, rest);
            }
        }
        Some(r)
    }
}
