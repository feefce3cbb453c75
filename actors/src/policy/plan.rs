//! The split planner: shares of a run's items per class that minimise the
//! predicted makespan.

/// What the planner knows of one class.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClassSpeed {
    /// Workers in service.
    pub workers: usize,
    /// Fixed seconds per chunk, if known.
    pub a: f64,
    /// Items per second per worker; `None` when the class has no model yet.
    pub b: Option<f64>,
    /// Whether the class may run this job at all.
    pub eligible: bool,
    /// Smallest chunk worth giving it.
    pub min_items: usize,
    /// Seconds after the run's admission that its workers start (0: at once).
    pub start: f64,
    /// Its chunks are at least this many times `a·b` items long
    /// ([`LATENCY_CHUNKS`] for an accelerator,
    /// [`Thresholds::cpu_latency_chunks`](super::Thresholds::cpu_latency_chunks)
    /// for CPUs).
    pub latency_chunks: f64,
}

impl ClassSpeed {
    /// A class of `workers` workers, eligible, that costs `a` seconds per
    /// chunk and runs `b` items per second per worker (`None`: unknown),
    /// worth chunks of one item or more.
    pub fn new(workers: usize, a: f64, b: Option<f64>) -> Self {
        Self {
            workers,
            a,
            b,
            eligible: true,
            min_items: 1,
            start: 0.0,
            latency_chunks: LATENCY_CHUNKS,
        }
    }

    /// The least items of a chunk: `latency_chunks·a·b` (`None` without a
    /// model).
    pub(crate) fn latency_floor(&self) -> Option<f64> {
        self.b.map(|b| self.latency_chunks * self.a * b)
    }

    /// Sets how many times its fixed cost per chunk a chunk is at least
    /// long (see [`ClassSpeed::latency_chunks`]).
    pub fn latency_chunks(mut self, chunks: f64) -> Self {
        self.latency_chunks = chunks.max(0.0);
        self
    }

    /// Sets when its workers start, in seconds after the run's admission.
    pub fn start(mut self, secs: f64) -> Self {
        self.start = secs.max(0.0);
        self
    }

    /// Sets whether the class may run the job.
    pub fn eligible(mut self, eligible: bool) -> Self {
        self.eligible = eligible;
        self
    }

    /// Sets the smallest chunk worth giving the class.
    pub fn min_items(mut self, items: usize) -> Self {
        self.min_items = items;
        self
    }
}

/// An accelerator's chunk is at least this many times its class's fixed
/// cost per chunk long (the fixed cost is then at most 5% of it), where the
/// job is large enough: its launch and transfer setup are paid a few times
/// per run, not once per small chunk.
pub const LATENCY_CHUNKS: f64 = 19.0;

/// A CPU class's chunk is at least this many times its fixed cost per chunk
/// long by default (the fixed cost at most 20% of it; see
/// [`Thresholds::cpu_latency_chunks`](super::Thresholds::cpu_latency_chunks)). A CPU class ends when the
/// slowest of its many workers ends its last chunk, and a worker's chunk
/// times vary (by 17% chunk to chunk, and up to 22% worker to worker, on
/// the H100 lease's 15 cores): its last chunks must be short for its
/// workers to end together. Guided sizing keeps its earlier chunks long;
/// only the run's last few pay the larger share. In virtual time on the
/// lease's machine, kmeans' 10 ms runs end 2% sooner with 4 than with
/// [`LATENCY_CHUNKS`] (E 0.893 → 0.904, `vtime::tests::kmeans_tail`).
pub const CPU_LATENCY_CHUNKS: f64 = 4.0;

/// Items one worker with fixed cost `a` and throughput `b` gets through by
/// time `t`, paying its fixed cost once per chunk: at most `max_chunks`
/// (rounded up) chunks, but no more than its items fill at
/// `latency_chunks·a·b` each (plus the probe's).
fn per_worker(t: f64, a: f64, b: f64, max_chunks: f64, latency_chunks: f64) -> f64 {
    let k_max = max_chunks.max(1.0).ceil() as usize;
    if a <= 0.0 || k_max == 1 {
        return (b * (t - max_chunks.max(1.0) * a.max(0.0))).max(0.0);
    }
    let fill = latency_chunks * a * b;
    // With k chunks a worker holds at most (k - 1) chunks' fill; the largest
    // count is not limited. Past b·t / fill chunks more only cost more.
    let k_max = k_max.min(2 + (b * t / fill).clamp(0.0, 1e6) as usize);
    (1..=k_max)
        .map(|k| {
            let n = b * (t - k as f64 * a);
            if k == k_max {
                n
            } else {
                n.min((k - 1) as f64 * fill)
            }
        })
        .fold(0.0, f64::max)
}

/// Shares per class (summing to 1 over eligible classes) and the predicted
/// makespan, for `items` items where each worker starts at its class's
/// `start` and pays its fixed cost once per chunk, for at most
/// `chunks_per_worker` chunks (fewer where its chunks are kept large against
/// that cost, see [`LATENCY_CHUNKS`]).
///
/// A class whose share would be smaller than its smallest useful chunk gets
/// nothing and the rest is re-planned without it: coexec never waits on a
/// device that cannot finish before the others (the paper's N-body case).
/// Classes with no model yet are assumed as fast per worker as the mean of
/// the known ones (all equal when none is known).
///
/// ```
/// use coexec_actors::policy::{plan_shares, ClassSpeed};
///
/// let cpu = ClassSpeed::new(1, 0.0, Some(100.0));
/// let gpu = ClassSpeed::new(1, 0.0, Some(300.0));
/// let (shares, t) = plan_shares(1000, &[cpu, gpu], 4.0);
/// assert!((shares[0] - 0.25).abs() < 1e-9 && (t - 2.5).abs() < 1e-6);
/// ```
pub fn plan_shares(
    items: usize,
    classes: &[ClassSpeed],
    chunks_per_worker: f64,
) -> (Vec<f64>, f64) {
    let known: Vec<f64> = classes
        .iter()
        .filter(|c| c.eligible && c.workers > 0)
        .filter_map(|c| c.b)
        .collect();
    let fallback = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let mut active: Vec<bool> = classes
        .iter()
        .map(|c| c.eligible && c.workers > 0)
        .collect();
    let s = items as f64;
    loop {
        let speed = |c: &ClassSpeed| c.workers as f64 * c.b.unwrap_or(fallback);
        let fixed =
            |c: &ClassSpeed| c.start.max(0.0) + chunks_per_worker.max(1.0).ceil() * c.a.max(0.0);
        let alloc = |t: f64, c: &ClassSpeed| {
            let t = t - c.start.max(0.0);
            if t <= 0.0 {
                return 0.0;
            }
            c.workers as f64
                * per_worker(
                    t,
                    c.a,
                    c.b.unwrap_or(fallback),
                    chunks_per_worker,
                    c.latency_chunks,
                )
        };
        let Some(hi) = classes
            .iter()
            .zip(&active)
            .filter(|(_, a)| **a)
            .map(|(c, _)| fixed(c) + s / speed(c))
            .min_by(f64::total_cmp)
        else {
            return (vec![0.0; classes.len()], f64::INFINITY);
        };
        let (mut lo, mut hi) = (0.0, hi);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            let got: f64 = classes
                .iter()
                .zip(&active)
                .filter(|(_, a)| **a)
                .map(|(c, _)| alloc(mid, c))
                .sum();
            if got >= s {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let n: Vec<f64> = classes
            .iter()
            .zip(&active)
            .map(|(c, a)| if *a { alloc(hi, c) } else { 0.0 })
            .collect();
        // Drop the class furthest below its smallest useful chunk, then re-plan.
        let worst = classes
            .iter()
            .enumerate()
            .filter(|(i, c)| active[*i] && n[*i] < c.min_items as f64)
            .min_by(|(i, _), (j, _)| n[*i].total_cmp(&n[*j]));
        match worst {
            Some((i, _)) if active.iter().filter(|a| **a).count() > 1 => active[i] = false,
            _ => {
                let total: f64 = n.iter().sum();
                let shares = n
                    .iter()
                    .map(|x| if total > 0.0 { x / total } else { 0.0 })
                    .collect();
                return (shares, hi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(workers: usize, a: f64, b: Option<f64>) -> ClassSpeed {
        ClassSpeed::new(workers, a, b)
    }

    #[test]
    fn a_late_start_shifts_work_away() {
        // Finish together: n0/100 = 2 + n1/100 with n0 + n1 = 1000.
        let late = ClassSpeed::new(1, 0.0, Some(100.0)).start(2.0);
        let (s, t) = plan_shares(1000, &[c(1, 0.0, Some(100.0)), late], 1.0);
        assert!((s[0] - 0.6).abs() < 1e-9, "{s:?}");
        assert!((t - 6.0).abs() < 1e-6);
        // A class that would start after the others are done gets nothing.
        let too_late = ClassSpeed::new(1, 0.0, Some(100.0)).start(20.0);
        let (s, _) = plan_shares(1000, &[c(1, 0.0, Some(100.0)), too_late], 1.0);
        assert_eq!(s, vec![1.0, 0.0]);
    }

    #[test]
    fn balances_by_throughput() {
        let (s, t) = plan_shares(1200, &[c(2, 0.0, Some(100.0)), c(1, 0.0, Some(400.0))], 1.0);
        assert!((s[0] - 1.0 / 3.0).abs() < 1e-9, "{s:?}");
        assert!((t - 2.0).abs() < 1e-6);
    }

    #[test]
    fn fixed_cost_shifts_work_away() {
        let (s, _) = plan_shares(1000, &[c(1, 0.0, Some(100.0)), c(1, 1.0, Some(100.0))], 1.0);
        // Finish together: n0/100 = 1 + n1/100 with n0 + n1 = 1000.
        assert!((s[0] - 0.55).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_fixed_cost_is_paid_once_per_large_chunk_not_per_chunk_slot() {
        // 180 items fill less than one chunk of 19·a·b = 190 on the
        // accelerator: a probe and one chunk, 2 fixed costs, not 5.
        // 0.02 + n/1000 = (200 - n)/100 gives n = 180.
        let (s, t) = plan_shares(
            200,
            &[c(1, 0.0, Some(100.0)), c(1, 0.01, Some(1000.0))],
            5.0,
        );
        assert!((s[1] - 0.9).abs() < 1e-9, "{s:?}");
        assert!((t - 0.2).abs() < 1e-9);
    }

    #[test]
    fn a_device_that_cannot_help_gets_nothing() {
        // The paper's N-body: the accelerator is 2500x faster.
        let cpu = ClassSpeed {
            min_items: 4,
            ..c(1, 0.0, Some(1.0))
        };
        let (s, t) = plan_shares(8192, &[cpu, c(1, 0.0, Some(2500.0))], 4.0);
        assert_eq!(s, vec![0.0, 1.0]);
        assert!((t - 8192.0 / 2500.0).abs() < 1e-6);
    }

    #[test]
    fn unknown_and_ineligible_classes() {
        let (s, _) = plan_shares(100, &[c(1, 0.0, None), c(3, 0.0, None)], 1.0);
        assert!((s[0] - 0.25).abs() < 1e-9);
        let off = ClassSpeed {
            eligible: false,
            ..c(8, 0.0, Some(1e9))
        };
        let (s, _) = plan_shares(100, &[c(1, 0.0, Some(1.0)), off], 1.0);
        assert_eq!(s, vec![1.0, 0.0]);
        let (s, t) = plan_shares(100, &[off], 1.0);
        assert_eq!(s, vec![0.0]);
        assert!(t.is_infinite());
    }

    proptest::proptest! {
        #[test]
        fn shares_are_a_distribution(
            items in 1usize..1_000_000,
            speeds in proptest::collection::vec((1usize..32, 0.0f64..0.01, 1e-3f64..1e9), 1..5),
        ) {
            let cls: Vec<_> = speeds.iter().map(|&(w, a, b)| c(w, a, Some(b))).collect();
            let (s, t) = plan_shares(items, &cls, 4.0);
            let sum: f64 = s.iter().sum();
            proptest::prop_assert!((sum - 1.0).abs() < 1e-9, "{:?}", s);
            proptest::prop_assert!(s.iter().all(|x| x.is_finite() && *x >= 0.0));
            proptest::prop_assert!(t.is_finite() && t > 0.0);
        }
    }
}
