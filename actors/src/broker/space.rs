//! A job's unclaimed items, cut into one region per device class.
//!
//! Each region is a list of grain-aligned intervals in index order. Its owner
//! eats from its own end (CPUs from the head, accelerators from the tail);
//! a thief eats from the far end. With one CPU class and one accelerator the
//! two regions touch, and the CPU eating into the accelerator's region from
//! the head is exactly the seed's double-ended queue.

use std::collections::VecDeque;
use std::ops::Range;

use crate::device::End;

/// The unclaimed items of one job.
#[derive(Debug, Clone)]
pub(crate) struct Space {
    regions: Vec<VecDeque<Range<usize>>>,
    left: Vec<usize>,
    total_left: usize,
    grain: usize,
}

impl Space {
    /// `0..items` cut into `shares.len()` regions laid out in `order` (region
    /// indices, physical left to right), each about `shares[r]` of the items.
    pub(crate) fn new(items: usize, grain: usize, shares: &[f64], order: &[usize]) -> Self {
        let mut s = Self {
            regions: vec![VecDeque::new(); shares.len()],
            left: vec![0; shares.len()],
            total_left: 0,
            grain: grain.max(1),
        };
        s.fill(std::slice::from_ref(&(0..items)), shares, order);
        s
    }

    /// Unclaimed items in region `r`.
    pub(crate) fn left(&self, r: usize) -> usize {
        self.left[r]
    }

    /// Unclaimed items in all regions.
    pub(crate) fn total_left(&self) -> usize {
        self.total_left
    }

    /// Items of region `r` at its `end`: about `n` (rounded up to the grain),
    /// never crossing an interval.
    pub(crate) fn take(&mut self, r: usize, end: End, n: usize) -> Option<Range<usize>> {
        let g = self.grain;
        let q = &mut self.regions[r];
        let got = match end {
            End::Head => {
                let iv = q.front_mut()?;
                let want = n.max(1).div_ceil(g) * g;
                let hi = iv.end.min(iv.start.saturating_add(want));
                let got = iv.start..hi;
                iv.start = hi;
                if iv.start >= iv.end {
                    q.pop_front();
                }
                got
            }
            End::Tail => {
                let iv = q.back_mut()?;
                // Interval starts are grain-aligned; cut on the grain below.
                let cut = iv.end.saturating_sub(n.max(1)).max(iv.start);
                let lo = iv.start + (cut - iv.start) / g * g;
                let got = lo..iv.end;
                iv.end = lo;
                if iv.start >= iv.end {
                    q.pop_back();
                }
                got
            }
        };
        self.left[r] -= got.len();
        self.total_left -= got.len();
        Some(got)
    }

    /// Cuts everything unclaimed anew by `shares`, regions laid out in `order`.
    pub(crate) fn repartition(&mut self, shares: &[f64], order: &[usize]) {
        let mut all: Vec<Range<usize>> =
            self.regions.iter_mut().flat_map(|q| q.drain(..)).collect();
        all.sort_by_key(|r| r.start);
        self.left.iter_mut().for_each(|l| *l = 0);
        self.total_left = 0;
        self.fill(&all, shares, order);
    }

    fn fill(&mut self, intervals: &[Range<usize>], shares: &[f64], order: &[usize]) {
        let total: usize = intervals.iter().map(|r| r.len()).sum();
        let sum: f64 = order.iter().map(|&r| shares[r].max(0.0)).sum();
        let g = self.grain;
        let mut ivs = intervals.iter().filter(|r| !r.is_empty()).cloned();
        let mut cur = ivs.next();
        let mut placed = 0usize;
        let mut cum = 0.0;
        for (k, &r) in order.iter().enumerate() {
            cum += shares[r].max(0.0);
            // Cumulative target, so rounding never drifts; the last region
            // takes whatever is left.
            let target = if k + 1 == order.len() || sum <= 0.0 {
                if sum <= 0.0 && k + 1 < order.len() {
                    0
                } else {
                    total
                }
            } else {
                ((cum / sum * total as f64).round() as usize).min(total)
            };
            while placed < target {
                let Some(iv) = cur.clone() else { break };
                let need = target - placed;
                if iv.len() <= need {
                    placed += iv.len();
                    self.push(r, iv);
                    cur = ivs.next();
                } else {
                    // Cut inside the interval on a grain boundary.
                    let cut = (iv.start + need.div_ceil(g) * g).min(iv.end);
                    placed += cut - iv.start;
                    self.push(r, iv.start..cut);
                    cur = Some(cut..iv.end);
                    if cut == iv.end {
                        cur = ivs.next();
                    }
                }
            }
        }
        while let Some(iv) = cur {
            // Only when every share is zero: park the rest in the first region.
            self.push(order[0], iv);
            cur = ivs.next();
        }
    }

    fn push(&mut self, r: usize, iv: Range<usize>) {
        if iv.is_empty() {
            return;
        }
        self.left[r] += iv.len();
        self.total_left += iv.len();
        let q = &mut self.regions[r];
        match q.back_mut() {
            Some(last) if last.end == iv.start => last.end = iv.end,
            _ => q.push_back(iv),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_classes_form_the_seeds_deque() {
        let mut s = Space::new(100, 1, &[0.3, 0.7], &[0, 1]);
        assert_eq!((s.left(0), s.left(1)), (30, 70));
        assert_eq!(s.take(0, End::Head, 10), Some(0..10));
        assert_eq!(s.take(1, End::Tail, 10), Some(90..100));
        // The CPU empties its region and eats into the accelerator's from the head.
        assert_eq!(s.take(0, End::Head, 100), Some(10..30));
        assert_eq!(s.take(0, End::Head, 1), None);
        assert_eq!(s.take(1, End::Head, 5), Some(30..35));
        assert_eq!(s.total_left(), 55);
    }

    #[test]
    fn claims_respect_the_grain() {
        let mut s = Space::new(1000, 64, &[0.5, 0.5], &[0, 1]);
        let a = s.take(0, End::Head, 10).unwrap();
        assert_eq!(a, 0..64);
        let b = s.take(1, End::Tail, 10).unwrap();
        assert_eq!(b.start % 64, 0);
        assert_eq!(b.end, 1000);
    }

    #[test]
    fn repartition_moves_the_boundary() {
        let mut s = Space::new(100, 1, &[0.5, 0.5], &[0, 1]);
        s.take(0, End::Head, 10);
        s.take(1, End::Tail, 10);
        s.repartition(&[0.25, 0.75], &[0, 1]);
        assert_eq!((s.left(0), s.left(1)), (20, 60));
        assert_eq!(s.take(0, End::Tail, 100), Some(10..30));
        assert_eq!(s.take(1, End::Head, 1), Some(30..31));
    }

    proptest! {
        /// Whatever the shares, layout, claims and repartitions, every item is
        /// handed out exactly once and claims stay on the grain.
        #[test]
        fn claims_partition_the_items(
            items in 0usize..5000,
            grain in 1usize..100,
            shares in proptest::collection::vec(0.0f64..1.0, 1..5),
            ops in proptest::collection::vec((0usize..8, any::<bool>(), 1usize..400, 0u8..20), 0..300),
        ) {
            let k = shares.len();
            let order: Vec<usize> = (0..k).rev().collect();
            let mut s = Space::new(items, grain, &shares, &order);
            let mut seen = vec![0u8; items];
            for (r, head, n, repart) in ops {
                if repart == 0 {
                    s.repartition(&shares.iter().rev().cloned().collect::<Vec<_>>(), &order);
                    continue;
                }
                let end = if head { End::Head } else { End::Tail };
                if let Some(got) = s.take(r % k, end, n) {
                    prop_assert!(!got.is_empty());
                    prop_assert!(got.start % grain == 0);
                    prop_assert!(got.end % grain == 0 || got.end == items);
                    for i in got { seen[i] += 1; }
                }
            }
            for r in 0..k {
                while let Some(got) = s.take(r, End::Head, 1000) {
                    for i in got { seen[i] += 1; }
                }
            }
            prop_assert_eq!(s.total_left(), 0);
            prop_assert!(seen.iter().all(|&c| c == 1));
        }
    }
}
