//! What the placer learns from a finished batch: its classes' models, its
//! callers' lag, and each class's speed alone or beside another's.

use super::{LAG_RANGE, LAG_WEIGHT, Learned, Placer};

impl Placer {
    /// A batch is over at `now` (its report came back): frees its classes
    /// and learns from what its report says of each class (`learned[c]`;
    /// empty when the batch failed), and, where it ran on one class, how
    /// long its callers waited against the prediction ([`Slot::lag`]).
    pub(crate) fn finished(&mut self, ticket: u64, learned: &[Learned], now: f64) {
        let on: Vec<usize> = (0..self.slots.len())
            .filter(|&c| self.slots[c].running.iter().any(|r| r.ticket == ticket))
            .collect();
        // When it was placed and predicted to end (the latest of its parts).
        let (mut placed, mut end) = (f64::NAN, f64::NEG_INFINITY);
        for &c in &on {
            if let Some(r) = self.slots[c].running.iter().find(|r| r.ticket == ticket) {
                placed = r.placed;
                end = end.max(r.end);
            }
        }
        let (waited, predicted) = (now - placed, end - placed);
        if !learned.is_empty() && predicted > 0.0 && waited.is_finite() && waited > 0.0 {
            // A class's parts are predicted with its lag; a split's end is
            // predicted without the split's own.
            let (lag, base) = match on.as_slice() {
                [c] => (Some(&mut self.slots[*c].lag), None),
                [] => (None, None),
                _ => (Some(&mut self.split_lag), Some(1.0)),
            };
            if let Some(lag) = lag {
                let seen =
                    (base.unwrap_or(*lag) * waited / predicted).clamp(LAG_RANGE.0, LAG_RANGE.1);
                *lag += LAG_WEIGHT * (seen - *lag);
            }
        }
        // Whether each class's part overlapped another class's work.
        let shared: Vec<bool> = (0..self.slots.len())
            .map(|c| {
                self.slots[c]
                    .running
                    .iter()
                    .any(|r| r.ticket == ticket && r.shared)
                    || self.others_busy(c, Some(ticket))
            })
            .collect();
        for slot in &mut self.slots {
            slot.running.retain(|r| r.ticket != ticket);
        }
        for ((slot, l), shared) in self.slots.iter_mut().zip(learned).zip(shared) {
            slot.workers = l.workers;
            let fresh = l.ran || slot.b.is_none();
            if fresh && l.b.is_finite() && l.b > 0.0 && l.a.is_finite() && l.a >= 0.0 {
                slot.a = l.a;
                slot.b = Some(l.b);
            }
            if l.ran && l.b.is_finite() && l.b > 0.0 {
                slot.learn_speed(l.b, shared);
            }
        }
    }
}
