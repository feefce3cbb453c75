//! Co-execution that costs more than it adds.
//!
//! Classes share a host: a CPU worker's cores and memory bus are those the
//! threads feeding a GPU use, and a `sim` computes on a host core. On the
//! H200 machine, twelve CPU workers running the encoder cut the GPU's own
//! rate from 410–460k to 266k work units a second while adding 8k of their
//! own (`docs/results/embed-gpu-h200-2026-11-27.txt`), and the placer, seeing
//! the GPU slower, gave the CPU more. The models cannot see this: each
//! class's speed is measured while the others run. So the placer measures
//! it: each class's speed in batches that ran alone and in batches that
//! overlapped another class's ([`Slot::alone`], [`Slot::shared`]). A slower
//! class is held back while what its work costs the fastest class (the
//! fastest's workers times its speed lost) exceeds what it adds (its own
//! capacity); it is measured again at the idle cadence
//! ([`super::REMEASURE_AFTER`]), which refreshes the fastest's shared
//! speed too, with a small part of a batch (what it computes in the time
//! the fastest takes for the rest), not a whole one: a whole CPU batch every
//! ten seconds would cost the GPU 2.6% of its rate in a model of that
//! machine (0.66 s at 40% less speed).
//! Until both speeds of the fastest class are measured, a slower class gets
//! only such parts: one as soon as it is free while the speed beside it is
//! missing, none while the speed alone is. All of this only while the
//! placer is loaded (a backlog, or the classes nearly full): idle, the
//! fastest class has time to spare and a split shortens the batch.

use super::{Placer, Slot};

/// Whether a slower class is held back from a loaded placer's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// It adds more than it costs (or nothing is known against it).
    No,
    /// The fastest class's speed beside another's is unknown: a small part
    /// as soon as this class is free measures it.
    Measure,
    /// The fastest class's speed alone is unknown: nothing until it is.
    Wait,
    /// It costs the fastest more than it adds: a small part at the idle
    /// cadence measures both again.
    Later,
}

impl Placer {
    /// Marks the batches running on every class other than those `shares`
    /// puts work on as overlapping another class's.
    pub(super) fn mark_shared(&mut self, shares: &[f64]) {
        for c in 0..self.slots.len() {
            if shares.iter().enumerate().any(|(d, s)| d != c && *s > 0.0) {
                for r in &mut self.slots[c].running {
                    r.shared = true;
                }
            }
        }
    }

    /// Whether a class other than `c` runs a batch (other than `ticket`).
    pub(super) fn others_busy(&self, c: usize, ticket: Option<u64>) -> bool {
        self.slots
            .iter()
            .enumerate()
            .any(|(d, s)| d != c && s.running.iter().any(|r| Some(r.ticket) != ticket))
    }

    /// The class of `known` with the most capacity.
    pub(super) fn fastest(&self, known: &[usize]) -> Option<usize> {
        known.iter().copied().max_by(|&x, &y| {
            self.slots[x]
                .capacity()
                .total_cmp(&self.slots[y].capacity())
        })
    }

    /// Whether class `c` is held back, and when it is measured again: it is
    /// not `fast` (the fastest known class), and its co-execution costs
    /// `fast` more than it adds, or that cost is not measured yet.
    ///
    /// A class that would compute less than an item per worker while the
    /// fastest runs a batch of `n` is left to the other rules: it cannot
    /// cost much, nor be measured by a part.
    pub(super) fn hold(&self, c: usize, fast: usize, n: f64) -> Hold {
        if c == fast || self.part(c, fast, n) < self.slots[c].workers.max(1) as f64 {
            return Hold::No;
        }
        let f: &Slot = &self.slots[fast];
        match (f.alone, f.shared) {
            (None, Some(_)) => Hold::Wait,
            (_, None) => Hold::Measure,
            (Some(_), Some(_)) if self.slots[c].capacity() < f.contention_loss() => Hold::Later,
            _ => Hold::No,
        }
    }

    /// The shares of a batch of `n` items that measures held-back class `c`
    /// again beside `fast`: `c` gets what it computes while `fast` runs the
    /// rest (at most half), and its predicted end.
    pub(super) fn remeasure_part(
        &self,
        c: usize,
        fast: usize,
        n: f64,
        now: f64,
    ) -> (Vec<f64>, f64) {
        let (s, f) = (&self.slots[c], &self.slots[fast]);
        let x = self.part(c, fast, n);
        let mut shares = vec![0.0; self.slots.len()];
        shares[c] = x / n;
        shares[fast] = 1.0 - x / n;
        let end = |slot: &Slot, items: f64| slot.free_at(now) + slot.time(items).unwrap_or(0.0);
        (shares, end(s, x).max(end(f, n - x)))
    }

    /// The items class `c` computes while `fast` runs a batch of `n`, at
    /// most half of it.
    fn part(&self, c: usize, fast: usize, n: f64) -> f64 {
        let span = self.slots[fast].time(n).unwrap_or(0.0);
        (self.slots[c].capacity() * span).min(n / 2.0)
    }
}
