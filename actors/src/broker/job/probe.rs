//! The probe phase: when it is complete, its imbalance δ′, and the re-plan.

use super::*;

impl JobCore {
    /// Whether a probe is under way and every class that can run has done
    /// its part.
    pub(super) fn probe_complete(&self) -> bool {
        let Some(probe) = &self.probe else {
            return false;
        };
        self.st
            .iter()
            .zip(probe)
            .filter(|(s, _)| s.eligible && s.workers > 0)
            .all(|(s, p)| match self.adm.probe {
                // Two chunks (the ramp doubles, so two sizes): one size
                // cannot tell a fixed cost from a slow throughput.
                Probe::Cold => p.chunks >= 2,
                _ => p.done >= s.probe_target,
            })
    }

    /// The probe is in: measure its imbalance and re-plan if the seed says
    /// so. Does nothing if no probe is under way.
    pub(super) fn end_probe(&mut self) {
        let Some(probe) = self.probe.take() else {
            return;
        };
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
        let warm = self.adm.probe == Probe::Warm
            && ran().all(|(_, p)| p.predicted.is_finite() && p.predicted > 0.0);
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
            .map(|(s, p)| match s.b() {
                Some(b) if warm && p.chunks > 0 && p.secs > 0.0 => {
                    b * s.workers as f64 * p.predicted / p.secs
                }
                _ if p.chunks > 0 && p.finish > 0.0 => p.done as f64 / p.finish,
                _ => 0.0,
            })
            .collect();
        let measured = normalized(&rate);
        let replan = self.adm.probe == Probe::Cold || imbalance > self.th.mu;
        if replan && self.adm.probe == Probe::Warm {
            // The stored models no longer match the machine: trust the probe.
            for s in &mut self.st {
                let samples: Vec<Sample> = s.run_samples.iter().copied().collect();
                if !samples.is_empty() {
                    s.model.reset_to(&samples);
                }
            }
        }
        let before = self.planned.clone();
        if replan {
            let left = self.space.total_left();
            let speeds: Vec<ClassSpeed> = self
                .st
                .iter()
                .zip(self.classes.iter())
                .map(|(s, info)| ClassSpeed {
                    workers: s.workers,
                    a: s.model.a(),
                    // The rates the probe measured, late workers included:
                    // no pace on top.
                    b: s.b(),
                    eligible: s.eligible,
                    min_items: self.grain,
                    // Mid-run: every class has started.
                    start: 0.0,
                    latency_chunks: self.th.latency_chunks(info),
                })
                .collect();
            let (shares, _) = plan_shares(
                left,
                &speeds,
                1.0 + self.adm.static_chunks_per_worker as f64,
            );
            self.space.repartition(&shares, &self.order);
            let rest = 1.0 - self.th.warm_probe;
            let frac = if rest > 0.0 {
                (self.adm.static_fraction / rest).min(1.0)
            } else {
                0.0
            };
            for (c, s) in self.st.iter_mut().enumerate() {
                s.claimed = 0;
                s.region = self.space.left(c);
                s.probe_target = 0;
                s.static_target = (self.space.left(c) as f64 * frac) as usize;
            }
            self.planned = shares;
        }
        self.probe_report = Some(ProbeReport {
            kind: self.adm.probe,
            imbalance,
            replanned: replan,
            shares_before: before,
            measured_shares: measured,
            shares_after: self.planned.clone(),
        });
    }
}
