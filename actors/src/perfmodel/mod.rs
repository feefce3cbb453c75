//! Speed models: how long a chunk of `n` items takes on one worker of a class.
//!
//! `t(n) = a + n / b`: a fixed cost per chunk `a` (launch, transfer latency,
//! claiming) and a throughput `b` in items per second per worker. The model is
//! refitted from a window of recent chunks with outliers dropped, so one slow
//! chunk (a page fault storm, a noisy neighbour) does not wreck it. Beside it,
//! a run's start `s`: how long after a run is admitted the class's workers
//! start their first chunk (a thread's wake-up; a GPU stream's upload of the
//! run's inputs), paid once per run.

use serde::{Deserialize, Serialize};

/// Chunks kept per model for refitting.
pub const WINDOW: usize = 64;

/// One finished chunk: `items` items in `secs` seconds on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Items in the chunk.
    pub items: f64,
    /// Seconds it took on its worker.
    pub secs: f64,
}

/// `t(n) = a + n / b` for one (kernel, device class), with its recent samples.
///
/// ```
/// use coexec_actors::SpeedModel;
///
/// let mut m = SpeedModel::default();
/// for n in [100.0, 200.0, 400.0, 800.0] {
///     m.observe(n, 0.001 + n / 1e5); // 1 ms fixed cost, 100k items/s
/// }
/// assert!((m.a() - 0.001).abs() < 1e-6);
/// assert!((m.b() - 1e5).abs() / 1e5 < 1e-6);
/// assert!((m.predict(1000.0) - 0.011).abs() < 1e-6);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpeedModel {
    a: f64,
    b: f64,
    samples: Vec<Sample>,
    /// Chunks observed over the model's life.
    pub observed: u64,
    /// Seconds from a run's admission to the class's first chunks, smoothed
    /// over runs (0 until a run measured it).
    #[serde(default)]
    start: f64,
}

/// Weight of a run's start in the smoothed one.
const START_WEIGHT: f64 = 0.25;

impl SpeedModel {
    /// A model with the given parameters and no samples.
    pub fn with_params(a: f64, b: f64) -> Self {
        Self {
            a: a.max(0.0),
            b,
            samples: Vec::new(),
            observed: 0,
            start: 0.0,
        }
    }

    /// Sets the run's start (seconds before the class's first chunks).
    pub fn with_start(mut self, secs: f64) -> Self {
        self.start = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        self
    }

    /// Seconds from a run's admission to the class's first chunks.
    pub fn start(&self) -> f64 {
        self.start
    }

    /// Folds one run's start into the smoothed one; the first sets it.
    /// Non-finite or negative values are ignored.
    pub fn observe_start(&mut self, secs: f64) {
        if !(secs.is_finite() && secs >= 0.0) {
            return;
        }
        self.start = if self.start > 0.0 {
            self.start + START_WEIGHT * (secs - self.start)
        } else {
            secs
        };
    }

    /// Fixed seconds per chunk.
    pub fn a(&self) -> f64 {
        self.a
    }

    /// Items per second per worker.
    pub fn b(&self) -> f64 {
        self.b
    }

    /// Whether the model has been fitted at least once.
    pub fn is_known(&self) -> bool {
        self.b.is_finite() && self.b > 0.0
    }

    /// The recent samples (the last [`WINDOW`] chunks, in no particular order).
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Predicted seconds for a chunk of `n` items on one worker.
    pub fn predict(&self, n: f64) -> f64 {
        if self.is_known() {
            self.a + n / self.b
        } else {
            f64::NAN
        }
    }

    /// Adds a finished chunk and refits. Non-finite or non-positive samples are
    /// ignored.
    pub fn observe(&mut self, items: f64, secs: f64) {
        if !(items.is_finite() && secs.is_finite() && items > 0.0 && secs > 0.0) {
            return;
        }
        // A ring: the fit does not depend on the samples' order.
        let sample = Sample { items, secs };
        if self.samples.len() < WINDOW {
            self.samples.push(sample);
        } else {
            self.samples[self.observed as usize % WINDOW] = sample;
        }
        self.observed += 1;
        // A refit sorts the window twice: do it on every sample while the
        // model is young, then on every fourth (the hot path calls this per chunk).
        if self.samples.len() < 16 || self.observed.is_multiple_of(4) || !self.is_known() {
            self.refit();
        }
    }

    /// Keeps at most [`WINDOW`] samples (a file written by hand or by an
    /// older build may hold more): what is loaded is what a run would keep.
    pub fn keep_window(&mut self) {
        self.samples.truncate(WINDOW);
    }

    /// Drops the sample history and refits from `samples` (used when a probe
    /// shows that the stored model no longer matches the machine). The fixed
    /// cost is kept if `samples` are all of one size, since they cannot
    /// measure it.
    pub fn reset_to(&mut self, samples: &[Sample]) {
        self.samples.clear();
        let (a, b) = (self.a, self.b);
        for s in samples {
            self.observe(s.items, s.secs);
        }
        if !self.is_known() {
            self.a = a;
            self.b = b;
        }
    }

    fn refit(&mut self) {
        let kept = drop_outliers(&self.samples, self.a, self.b);
        if let Some((a, b)) = fit(&kept, self.a) {
            self.a = a;
            self.b = b;
        }
    }
}

/// Samples whose time is within 3 median absolute deviations (of the
/// per-item residual) of the window's own fit; a young window's without its
/// few worst ([`drop_worst_few`]). Judged against the window's fit, not the
/// model's: a model that has seen chunks of one size only (a class alone
/// cuts its static phase into equal chunks) holds no fixed cost, and the
/// tail's first small chunk, the one that shows it, would look like an
/// outlier to it and be dropped for as long as the model lives.
fn drop_outliers(samples: &[Sample], a: f64, b: f64) -> Vec<Sample> {
    if samples.len() < 8 || !(b.is_finite() && b > 0.0) {
        return drop_worst_few(samples, a);
    }
    let (a, b) = fit(samples, a).unwrap_or((a, b));
    let resid: Vec<f64> = samples
        .iter()
        .map(|s| (s.secs - (a + s.items / b)) / s.secs)
        .collect();
    let med = median(&resid);
    let mad = median(&resid.iter().map(|r| (r - med).abs()).collect::<Vec<_>>()).max(0.02);
    samples
        .iter()
        .zip(&resid)
        .filter(|(_, r)| (*r - med).abs() <= 3.0 * mad)
        .map(|(s, _)| *s)
        .collect()
}

/// A young model's samples (a cold probe's) without the few that its own fit
/// explains worst, each off by more than half its time: one chunk that paid
/// a wake-up or a page-fault storm would otherwise steer the whole fit (a
/// device whose first two 24- and 48-item chunks each paid 4 ms of wake-up
/// fits at 15× its speed and takes the whole job's rest in one chunk). Noise on a chunk's
/// time is one-sided (delays), so the slow are dropped first; at most
/// `(len − 2) / 2` go, so four samples out-vote one bad one and a model
/// cannot talk itself out of its own data.
fn drop_worst_few(samples: &[Sample], prev_a: f64) -> Vec<Sample> {
    let mut kept = samples.to_vec();
    for _ in 0..samples.len().saturating_sub(2) / 2 {
        let Some((a, b)) = fit(&kept, prev_a) else {
            break;
        };
        let worst = kept
            .iter()
            .enumerate()
            .map(|(i, s)| (i, (s.secs - (a + s.items / b)) / s.secs))
            .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()));
        match worst {
            Some((i, r)) if r.abs() > 0.5 => {
                kept.swap_remove(i);
            }
            _ => break,
        }
    }
    kept
}

/// Least squares for `t = a + n·c` with `a ≥ 0`, `c > 0`; weighted by `1/t²`
/// so that small chunks constrain `a` as much as large ones constrain `c`.
/// Where the sizes cannot separate the two, `a` is the previous estimate:
/// with sizes within 1.5× of each other if every sample took longer than it
/// (else 0); with spread sizes whose slope does not stand out of the
/// samples' noise (under twice its standard error: fifteen equal chunks
/// with worker-to-worker spread and one of twice the size fitted a CPU at
/// 4× its speed), at most the fastest sample's time. With separable sizes
/// whose fit would need `a < 0`, `a` is 0. `c` then fits `t − a` through
/// the origin.
fn fit(s: &[Sample], prev_a: f64) -> Option<(f64, f64)> {
    if s.is_empty() {
        return None;
    }
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let (mut nmin, mut nmax) = (f64::INFINITY, 0.0f64);
    for p in s {
        let w = 1.0 / (p.secs * p.secs);
        sw += w;
        sx += w * p.items;
        sy += w * p.secs;
        sxx += w * p.items * p.items;
        sxy += w * p.items * p.secs;
        nmin = nmin.min(p.items);
        nmax = nmax.max(p.items);
    }
    let det = sw * sxx - sx * sx;
    let spread = nmax > 1.5 * nmin && det > 0.0;
    let mut separable = spread;
    if spread {
        let c = (sw * sxy - sx * sy) / det;
        let a = (sy - c * sx) / sw;
        separable = slope_stands_out(s, a, c, sw / det);
        if separable && c > 0.0 && a >= 0.0 && c.is_finite() && a.is_finite() {
            return Some((a, 1.0 / c));
        }
    }
    // Throughput only. With sizes too close to separate the two, keep the
    // fixed cost already known (if every sample took longer than it); with
    // spread sizes whose slope is within the noise, keep it too, at most the
    // fastest sample's time (dropped to 0, a noisy GPU's model would
    // predict its large chunks several times too slow); with separable
    // sizes that asked for a < 0, the fixed cost is 0. Then c minimises
    // Σ w (t − a − n·c)².
    let known = prev_a.is_finite() && prev_a > 0.0;
    let fastest = s.iter().map(|p| p.secs).fold(f64::INFINITY, f64::min);
    let a = if !spread && known && s.iter().all(|p| p.secs > prev_a) {
        prev_a
    } else if spread && !separable && known {
        prev_a.min(fastest)
    } else {
        0.0
    };
    let c = (sxy - a * sx) / sxx;
    (c.is_finite() && c > 0.0).then(|| (a, 1.0 / c))
}

/// Whether the fitted slope `c` (intercept `a`) is at least twice its
/// standard error, `var_scale` being `Σw / det` of the weighted fit; two
/// samples fit exactly and pass.
fn slope_stands_out(s: &[Sample], a: f64, c: f64, var_scale: f64) -> bool {
    if s.len() <= 2 {
        return true;
    }
    let rss: f64 = s
        .iter()
        .map(|p| (p.secs - a - c * p.items).powi(2) / (p.secs * p.secs))
        .sum();
    let var_c = rss / (s.len() - 2) as f64 * var_scale;
    c * c >= 4.0 * var_c
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    // Selection, not a sort: this runs on the hot path every few chunks.
    let (lower, hi, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let hi = *hi;
    if n % 2 == 1 {
        hi
    } else {
        let lo = lower.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        0.5 * (lo + hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_start_is_smoothed_and_survives_a_save() {
        let mut m = SpeedModel::default();
        m.observe_start(0.004);
        assert_eq!(m.start(), 0.004);
        m.observe_start(0.008);
        assert!((m.start() - 0.005).abs() < 1e-12);
        m.observe_start(f64::NAN);
        m.observe_start(-1.0);
        assert!((m.start() - 0.005).abs() < 1e-12);
        let text = serde_json::to_string(&m).unwrap();
        let back: SpeedModel = serde_json::from_str(&text).unwrap();
        assert_eq!(back.start(), m.start());
        // A profile written before starts were kept loads with none.
        let old: SpeedModel =
            serde_json::from_str(r#"{"a":0.0,"b":1.0,"samples":[],"observed":0}"#).unwrap();
        assert_eq!(old.start(), 0.0);
    }

    #[test]
    fn unknown_until_observed() {
        let m = SpeedModel::default();
        assert!(!m.is_known());
        assert!(m.predict(10.0).is_nan());
    }

    #[test]
    fn one_size_gives_throughput_without_fixed_cost() {
        let mut m = SpeedModel::default();
        for _ in 0..5 {
            m.observe(1000.0, 0.01);
        }
        assert_eq!(m.a(), 0.0);
        assert!((m.b() - 1e5).abs() < 1e-6);
    }

    #[test]
    fn one_size_keeps_the_known_fixed_cost() {
        // A stored 1 ms per chunk, then chunks of a single size: the fixed
        // cost stays and the throughput is what is left of the time.
        let mut m = SpeedModel::with_params(0.001, 1e5);
        for _ in 0..3 {
            m.observe(1000.0, 0.001 + 1000.0 / 2e5);
        }
        assert_eq!(m.a(), 0.001);
        assert!((m.b() - 2e5).abs() < 1e-6, "b = {}", m.b());
    }

    #[test]
    fn one_slow_chunk_does_not_wreck_the_model() {
        let mut m = SpeedModel::default();
        for k in 0..40 {
            let n = 100.0 * (1 + k % 5) as f64;
            m.observe(n, 0.0005 + n / 2e5);
        }
        m.observe(300.0, 0.5); // 300x slower: preempted
        assert!((m.b() - 2e5).abs() / 2e5 < 0.02, "b = {}", m.b());
        assert!((m.a() - 0.0005).abs() < 1e-4, "a = {}", m.a());
    }

    #[test]
    fn ignores_garbage() {
        let mut m = SpeedModel::default();
        m.observe(f64::NAN, 1.0);
        m.observe(10.0, 0.0);
        m.observe(-1.0, 1.0);
        assert!(!m.is_known());
        assert_eq!(m.observed, 0);
    }

    #[test]
    fn follows_a_machine_that_changed_speed() {
        let mut m = SpeedModel::default();
        for _ in 0..WINDOW {
            m.observe(100.0, 0.001);
        }
        for _ in 0..WINDOW {
            m.observe(100.0, 0.002);
        }
        assert!((m.b() - 5e4).abs() / 5e4 < 0.01);
    }

    #[test]
    fn a_slow_first_chunk_does_not_steer_a_young_model() {
        // A sim 2x one core (~700k items/s): its first two chunks paid a
        // 4 ms wake-up each; the fit of all of them said 10M items/s.
        let mut m = SpeedModel::default();
        for (n, t) in [
            (24.0, 0.0043),
            (48.0, 0.0042),
            (1218.0, 0.0019),
            (1218.0, 0.0019),
            (1218.0, 0.0019),
            (1218.0, 0.0019),
            (609.0, 0.0010),
        ] {
            m.observe(n, t);
        }
        assert!((5e5..1e6).contains(&m.b()), "b = {}", m.b());
        assert!(m.a() < 5e-4, "a = {}", m.a());
    }

    #[test]
    fn a_fixed_cost_is_learned_after_chunks_of_one_size() {
        // A class alone: ten equal static chunks (which cannot show a
        // fixed cost), then the tail's small ones: 97 us a chunk.
        let mut m = SpeedModel::default();
        let t = |n: f64| 97e-6 + n / 1e9;
        for _ in 0..10 {
            m.observe(140_000.0, t(140_000.0));
        }
        assert_eq!(m.a(), 0.0);
        for n in [14_496.0, 30_000.0, 8_000.0] {
            m.observe(n, t(n));
        }
        assert!((m.a() - 97e-6).abs() < 5e-6, "a = {}", m.a());
        assert!((m.b() - 1e9).abs() / 1e9 < 0.05, "b = {}", m.b());
    }

    #[test]
    fn a_real_fixed_cost_is_not_dropped_as_an_outlier() {
        // Every chunk pays 4 ms (a launch): nothing is an outlier.
        let mut m = SpeedModel::default();
        for n in [24.0, 48.0, 10_000.0, 36_000.0, 64_000.0] {
            m.observe(n, 0.004 + n / 8e5);
        }
        assert!((m.a() - 0.004).abs() < 1e-4, "a = {}", m.a());
        assert!((m.b() - 8e5).abs() / 8e5 < 0.01, "b = {}", m.b());
    }

    #[test]
    fn sizes_that_do_not_stand_out_of_the_noise_keep_the_fixed_cost() {
        // A warm probe on 15 CPU workers (chunk times spread by the workers'
        // own speeds) and one worker's second chunk of twice the size: the
        // slope between the two sizes is within the noise.
        let mut samples: Vec<Sample> = [
            375.0, 541.0, 566.0, 532.0, 617.0, 455.0, 463.0, 670.0, 553.0, 591.0, 759.0, 562.0,
            698.0, 679.0, 993.0,
        ]
        .iter()
        .map(|us| Sample {
            items: 5605.0,
            secs: us * 1e-6,
        })
        .collect();
        samples.push(Sample {
            items: 11209.0,
            secs: 689e-6,
        });
        let mut m = SpeedModel::with_params(1.165e-4, 1.157e7);
        m.reset_to(&samples);
        assert_eq!(m.a(), 1.165e-4);
        assert!((0.8e7..1.5e7).contains(&m.b()), "b = {:e}", m.b());
    }

    #[test]
    fn a_noisy_slope_keeps_a_fixed_cost_below_the_fastest_chunk() {
        // A GPU of 100 us per chunk and 1e8 items/s: chunks of 1000 and
        // 4000 items, one of them faster than the known fixed cost. The
        // slope is within the noise, and with a fixed cost of 0 the model
        // would predict a million items at 40 ms against 10.1 ms.
        let samples: Vec<Sample> = [
            (1000.0, 90e-6),
            (1000.0, 170e-6),
            (4000.0, 120e-6),
            (4000.0, 160e-6),
        ]
        .iter()
        .map(|&(items, secs)| Sample { items, secs })
        .collect();
        let (a, b) = fit(&samples, 1e-4).unwrap();
        assert_eq!(a, 90e-6, "the fastest chunk's time");
        let t = a + 1e6 / b;
        assert!((5e-3..20e-3).contains(&t), "a million items in {t} s");
    }
}
