//! The probe phase: when it is complete, its imbalance δ′, and the re-plan.

use super::*;

impl JobCore {
    pub(super) fn probe_complete(&self) -> bool {
        self.st
            .iter()
            .filter(|s| s.eligible && s.workers > 0)
            .all(|s| match self.adm.probe {
                // Two chunks (the ramp doubles, so two sizes): one size
                // cannot tell a fixed cost from a slow throughput.
                Probe::Cold => s.probe_chunks >= 2,
                _ => s.probe_done >= s.probe_target,
            })
    }

    /// The probe is in: measure its imbalance and re-plan if the seed says so.
    pub(super) fn end_probe(&mut self) {
        self.probing = false;
        let finish: Vec<f64> = self
            .st
            .iter()
            .filter(|s| s.eligible && s.probe_chunks > 0)
            .map(|s| s.probe_finish)
            .collect();
        // Warm: each class's probe time against the stored model's
        // prediction for it, so that a known fixed cost per chunk (an
        // accelerator's launch and transfers) is not mistaken for a wrong
        // model; with no fixed costs this is the seed's δ' of finish times.
        let warm = self.adm.probe == Probe::Warm
            && self
                .st
                .iter()
                .filter(|s| s.eligible && s.probe_chunks > 0)
                .all(|s| s.probe_predicted.is_finite() && s.probe_predicted > 0.0);
        let imbalance = if warm {
            let ratio: Vec<f64> = self
                .st
                .iter()
                .filter(|s| s.eligible && s.probe_chunks > 0)
                .map(|s| s.probe_secs / s.probe_predicted)
                .collect();
            imbalance(&ratio)
        } else {
            imbalance(&finish)
        };
        // Measured speed per class: items per second of probe, or, warm, the
        // stored speed scaled by how much faster than predicted it went.
        let rate: Vec<f64> = self
            .st
            .iter()
            .map(|s| match s.b() {
                Some(b) if warm && s.probe_chunks > 0 && s.probe_secs > 0.0 => {
                    b * s.workers as f64 * s.probe_predicted / s.probe_secs
                }
                _ if s.probe_chunks > 0 && s.probe_finish > 0.0 => {
                    s.probe_done as f64 / s.probe_finish
                }
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
                .map(|s| ClassSpeed {
                    workers: s.workers,
                    a: s.model.a(),
                    b: s.b(),
                    eligible: s.eligible,
                    min_items: self.grain,
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
