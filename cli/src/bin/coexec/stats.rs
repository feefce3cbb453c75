//! A distribution-free confidence interval for a median (order statistics).
//!
//! For `n` independent times from any continuous distribution, the number
//! below the true median is Binomial(n, ½); so `[x₍ₖ₎, x₍ₙ₋ₖ₊₁₎]` (sorted,
//! 1-based) covers the median with probability `1 − 2·P(B ≤ k − 1)`. We take
//! the largest `k` whose coverage is still ≥ 95%. Below 6 samples no such
//! interval exists (`[min, max]` of 5 covers 93.75%).

/// The fewest samples with a 95% interval of their median.
pub(crate) const MIN_CI_SAMPLES: usize = 6;

/// The 95% interval of the median of `xs`, or `None` under
/// [`MIN_CI_SAMPLES`] samples (or any NaN).
pub(crate) fn median_ci95(xs: &[f64]) -> Option<(f64, f64)> {
    let n = xs.len();
    if n < MIN_CI_SAMPLES || xs.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    // P(B ≤ j) for B ~ Binomial(n, ½), accumulated in f64 (n is small).
    let half_n = 0.5f64.powi(n as i32);
    let mut cdf = 0.0;
    let mut coef = 1.0f64; // C(n, j)
    let mut k = 0;
    for j in 0..n {
        cdf += coef * half_n;
        coef = coef * (n - j) as f64 / (j + 1) as f64;
        // Interval [x₍ⱼ₊₁₎, x₍ₙ₋ⱼ₎] misses with probability 2·P(B ≤ j).
        if 2.0 * cdf <= 0.05 {
            k = j + 1;
        } else {
            break;
        }
    }
    if k == 0 {
        return None;
    }
    Some((s[k - 1], s[n - k]))
}

/// The larger distance from `median` to the interval's ends, relative to
/// the median; infinite without an interval.
pub(crate) fn rel_half_width(median: f64, ci: Option<(f64, f64)>) -> f64 {
    match ci {
        Some((lo, hi)) if median > 0.0 => ((median - lo).max(hi - median)) / median,
        _ => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statistics_are_the_textbook_ones() {
        assert_eq!(median_ci95(&[1.0; 5]), None);
        // n = 6: [x₁, x₆] covers 1 − 2/64 = 96.9%.
        let six = [6.0, 1.0, 5.0, 2.0, 4.0, 3.0];
        assert_eq!(median_ci95(&six), Some((1.0, 6.0)));
        // n = 10: k = 2 (2·P(B ≤ 1) = 2.1%; k = 3 would miss 10.9%).
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_ci95(&ten), Some((2.0, 9.0)));
        // n = 20: k = 6 (2·P(B ≤ 5) = 4.1%, 2·P(B ≤ 6) = 11.5%).
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(median_ci95(&twenty), Some((6.0, 15.0)));
        assert_eq!(median_ci95(&[1.0, 2.0, f64::NAN, 3.0, 4.0, 5.0]), None);
    }

    #[test]
    fn covers_the_median_at_least_95_percent() {
        // Skewed times (exponential), true median ln 2; 2000 trials of n = 9.
        let mut state = 7u64;
        let mut u = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut covered = 0;
        for _ in 0..2000 {
            let xs: Vec<f64> = (0..9).map(|_| -u().ln()).collect();
            let (lo, hi) = median_ci95(&xs).unwrap();
            if lo <= std::f64::consts::LN_2 && std::f64::consts::LN_2 <= hi {
                covered += 1;
            }
        }
        // Exact coverage for n = 9 is 1 − 2·P(B ≤ 1) = 96.1%.
        assert!(covered >= 1880, "{covered} of 2000");
    }

    #[test]
    fn half_width() {
        assert!((rel_half_width(2.0, Some((1.9, 2.1))) - 0.05).abs() < 1e-12);
        assert!(rel_half_width(2.0, None).is_infinite());
    }
}
