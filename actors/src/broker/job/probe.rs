//! The probe phase: when it is complete, its imbalance δ′, and the re-plan.

use super::*;

/// A job's probe: each class's part while it is under way, then what it
/// found.
#[derive(Default)]
pub(super) struct Probing {
    /// Per class, the probe under way; `None` once it is over (or with no
    /// probe): the static and dynamic phases follow it.
    pub(super) under_way: Option<Vec<ProbeState>>,
    /// What the probe found, once it is over.
    pub(super) report: Option<ProbeReport>,
}

impl Probing {
    /// Class `c` completed a probe chunk of `n` items, from `end - secs` to
    /// `end`; nothing once the probe is over.
    pub(super) fn record(&mut self, c: usize, n: usize, end: f64, secs: f64) {
        if let Some(probe) = &mut self.under_way {
            probe[c].record(n, end, secs);
        }
    }

    /// Whether a `kind` probe is under way and every class of `st` that
    /// can run has done its part.
    pub(super) fn complete(&self, st: &[ClassState], kind: Probe) -> bool {
        let Some(probe) = &self.under_way else {
            return false;
        };
        st.iter()
            .zip(probe)
            .filter(|(s, _)| s.active())
            .all(|(s, p)| match kind {
                // Two chunks (the ramp doubles, so two sizes): one size
                // cannot tell a fixed cost from a slow throughput.
                Probe::Cold => p.chunks >= 2,
                _ => p.done >= s.region.probe_target,
            })
    }
}

impl JobCore {
    /// Whether a probe is under way and every class that can run has done
    /// its part.
    pub(super) fn probe_complete(&self) -> bool {
        self.probe.complete(&self.st, self.plan.adm.probe)
    }

    /// The probe is in: measure its imbalance and re-plan if the seed says
    /// so. Does nothing if no probe is under way.
    pub(super) fn end_probe(&mut self) {
        let Some(probe) = self.probe.under_way.take() else {
            return;
        };
        let kind = self.plan.adm.probe;
        // The classes that completed a probe chunk, with what they saw.
        let ran = || {
            self.st
                .iter()
                .zip(&probe)
                .filter(|(s, p)| s.eligible && p.chunks > 0)
        };
        let finish: Vec<f64> = ran().map(|(_, p)| p.finish).collect();
        // Warm: each class's probe time against the stored model's
        // prediction for it, so that a known fixed cost per chunk (an
        // accelerator's launch and transfers) is not mistaken for a wrong
        // model; with no fixed costs this is the seed's δ' of finish times.
        let warm =
            kind == Probe::Warm && ran().all(|(_, p)| p.predicted.is_finite() && p.predicted > 0.0);
        let imbalance = if warm {
            let ratio: Vec<f64> = ran().map(|(_, p)| p.secs / p.predicted).collect();
            imbalance(&ratio)
        } else {
            imbalance(&finish)
        };
        // Measured speed per class: items per second of probe, or, warm, the
        // stored speed scaled by how much faster than predicted it went.
        let rate: Vec<f64> = self
            .st
            .iter()
            .zip(&probe)
            .map(|(s, p)| match s.speed.b() {
                Some(b) if warm && p.chunks > 0 && p.secs > 0.0 => {
                    b * s.workers as f64 * p.predicted / p.secs
                }
                _ if p.chunks > 0 && p.finish > 0.0 => p.done as f64 / p.finish,
                _ => 0.0,
            })
            .collect();
        let measured = normalized(&rate);
        let replan = kind == Probe::Cold || imbalance > self.plan.th.mu;
        if replan && kind == Probe::Warm {
            // The stored models no longer match the machine: trust the probe.
            for s in &mut self.st {
                s.speed.reset_to_run();
            }
        }
        let before = self.plan.planned.clone();
        if replan {
            let left = self.progress.space.total_left();
            let speeds: Vec<ClassSpeed> = self
                .st
                .iter()
                .zip(self.classes.iter())
                .map(|(s, info)| ClassSpeed {
                    workers: s.workers,
                    a: s.speed.model.a(),
                    // The rates the probe measured, late workers included:
                    // no pace on top.
                    b: s.speed.b(),
                    eligible: s.eligible,
                    min_items: self.progress.grain,
                    // Mid-run: every class has started.
                    start: 0.0,
                    latency_chunks: self.plan.th.latency_chunks(info),
                })
                .collect();
            let (shares, _) = plan_shares(
                left,
                &speeds,
                1.0 + self.plan.adm.static_chunks_per_worker as f64,
            );
            let progress = &mut self.progress;
            progress.space.repartition(&shares, &progress.order);
            let frac = self.plan.static_fraction_after_probe();
            for (c, s) in self.st.iter_mut().enumerate() {
                let left = progress.space.left(c);
                s.region.replan(left, (left as f64 * frac) as usize);
            }
            self.plan.planned = shares;
        }
        self.probe.report = Some(ProbeReport {
            kind,
            imbalance,
            replanned: replan,
            shares_before: before,
            measured_shares: measured,
            shares_after: self.plan.planned.clone(),
        });
    }
}
