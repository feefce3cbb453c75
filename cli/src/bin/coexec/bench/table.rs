//! The bench's text table: each class alone, T*, then a line per policy
//! with its E and speed-up, each with its interval.

use super::median;
use crate::report::{LearningRun, WorkloadBench};
use crate::stats::rel_half_width;

/// `±x.x%` of a median's interval, `±?` without one (under 6 runs).
fn pm(median: f64, ci: Option<(f64, f64)>) -> String {
    let w = rel_half_width(median, ci);
    if w.is_finite() {
        format!("±{:.1}%", 100.0 * w)
    } else {
        "±?".into()
    }
}

/// E with its interval. Nothing beats T* (the ideal on these devices): an
/// E above 1 is the noise of the measurement, shown as `= T*` within it.
fn efficiency_text(e: f64, ci: Option<(f64, f64)>) -> String {
    if e > 1.0 {
        let w = ci.map(|(lo, hi)| (hi - 1.0).max(1.0 - lo).max(e - 1.0));
        match w {
            Some(w) => format!("= T* within ±{:.1}%", 100.0 * w),
            None => "= T* ±?".into(),
        }
    } else {
        format!("{e:.3} {}", pm(e, ci))
    }
}

/// The speed-up over the best class alone with its interval; one whose
/// interval holds 1 is marked as inside the noise.
fn speedup_text(s: f64, ci: Option<(f64, f64)>) -> String {
    let noise = match ci {
        Some((lo, hi)) => lo <= 1.0 && 1.0 <= hi,
        None => true,
    };
    format!(
        "{s:.3}x {}{}",
        pm(s, ci),
        if noise { " (noise)" } else { "" }
    )
}

pub(super) fn print_table(w: &WorkloadBench) {
    outln!("\n{} ({}; {} items per run)", w.name, w.params, w.items);
    outln!(
        "  inputs generated in {:.2} s on {} threads (outside every T)",
        w.inputs_s,
        rayon::current_num_threads()
    );
    let p = &w.host_pinning;
    if p.locked + p.refused > 0 {
        outln!(
            "  page-locked for DMA ({}): {} buffers, {:.2} GB in {:.3} s, unlocked in {:.3} s{}",
            p.choice,
            p.locked,
            p.locked_bytes as f64 / 1e9,
            p.lock_s,
            p.unlock_s,
            match &p.last_refusal {
                Some(why) => format!("; {} refused ({why})", p.refused),
                None => String::new(),
            }
        );
    }
    for a in &w.alone {
        let note = if a.predicted {
            "  (predicted by its speed model: a run alone did not end within 20x the fastest)"
        } else {
            ""
        };
        outln!(
            "  T alone {:<14} {:>9.4} s {}{note}",
            a.class,
            a.median_s,
            pm(a.median_s, a.ci_s)
        );
    }
    outln!("  T* = 1/Σ(1/T_i)        {:>9.4} s", w.ideal_s);
    if let Some(o) = &w.oracle {
        let best = o.tried.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
        if o.tried.is_empty() {
            outln!(
                "  T_oracle               {:>9.4} s  (the best class alone: no fixed split could beat it)",
                o.makespan_s
            );
        } else {
            outln!(
                "  T_oracle               {:>9.4} s  (the best fixed split measured: {:.1}% / {:.1}%, {} splits tried, best of them {:.4} s; the best class alone where less)",
                o.makespan_s,
                100.0 * o.share[0],
                100.0 * o.share.get(1).copied().unwrap_or(0.0),
                o.tried.len(),
                best
            );
        }
    }
    outln!(
        "  {:<16} {:>9} {:>8} {:>24} {:>24} {:>7} {:>7}  split",
        "policy",
        "T (s)",
        "±95%",
        "E",
        "speed-up",
        "T_or/T",
        "δ"
    );
    for p in &w.policies {
        let split = p
            .classes
            .iter()
            .map(|c| format!("{} {:.1}%", c.name, 100.0 * c.share))
            .collect::<Vec<_>>()
            .join(", ");
        outln!(
            "  {:<16} {:>9.4} {:>8} {:>24} {:>24} {:>7} {:>7.3}  {}",
            p.policy,
            p.makespan_s,
            pm(p.makespan_s, p.ci_s),
            efficiency_text(p.efficiency, p.efficiency_ci),
            speedup_text(p.speedup_vs_best, p.speedup_ci),
            p.vs_oracle
                .map_or_else(|| "-".into(), |r| format!("{r:.3}")),
            p.imbalance,
            split
        );
    }
    if !w.learning.is_empty() {
        // Odd runs start cold, even runs from the profile the odd run stored.
        let pick = |warm: bool, f: fn(&LearningRun) -> f64| {
            median(
                &w.learning
                    .iter()
                    .filter(|l| (l.run % 2 == 0) == warm)
                    .map(f)
                    .collect::<Vec<_>>(),
            )
        };
        let ratios: Vec<f64> = w
            .learning
            .chunks_exact(2)
            .map(|p| p[1].efficiency / p[0].efficiency)
            .collect();
        outln!(
            "  learning ({} pairs, medians): cold run probe δ' {:.3}, E {:.3}  →  second run probe δ' {:.3}, E {:.3}  (second/first per pair {:.3})",
            w.learning.len() / 2,
            pick(false, |l| l.probe_imbalance),
            pick(false, |l| l.efficiency),
            pick(true, |l| l.probe_imbalance),
            pick(true, |l| l.efficiency),
            median(&ratios),
        );
    }
    if let Some(b) = &w.baseline {
        outln!(
            "  CPU only vs rayon ({} threads): coexec {:.4} s, rayon {:.4} s, ratio rayon/coexec {:.3}",
            b.threads,
            b.coexec_cpu_s,
            b.rayon_s,
            b.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_efficiency_above_one_never_reads_as_a_number() {
        assert_eq!(efficiency_text(0.95, Some((0.9, 1.0))), "0.950 ±5.3%");
        assert_eq!(efficiency_text(0.95, None), "0.950 ±?");
        // Above 1: equal to T* within the farther of the interval's ends
        // from 1 (at least E's own distance from it).
        assert_eq!(
            efficiency_text(1.04, Some((0.9, 1.2))),
            "= T* within ±20.0%"
        );
        assert_eq!(efficiency_text(1.3, Some((1.1, 1.2))), "= T* within ±30.0%");
        assert_eq!(efficiency_text(1.04, None), "= T* ±?");
    }
}
