//! What a finished job tells its submitter and the profiler.

use super::*;

impl JobCore {
    /// The run's report, once it is over; `Err` if it failed.
    pub(crate) fn report(&mut self) -> Result<RunReport, ActorError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        // A short job can end before every class finished a probe chunk:
        // report what the probe saw (nothing to do once it is over).
        self.end_probe();
        let makespan = self.st.iter().map(|s| s.finish).fold(0.0, f64::max);
        let classes: Vec<ClassReport> = self
            .st
            .iter()
            .zip(self.classes.iter())
            .map(|(s, info)| ClassReport {
                name: info.name.clone(),
                workers: s.workers,
                items: s.items,
                chunks: s.chunks,
                busy_s: s.busy,
                finish_s: s.finish,
                share: s.items as f64 / self.items.max(1) as f64,
                model_a_s: s.model.a(),
                model_b_items_per_s: s.b().unwrap_or(0.0),
                start_s: self.class_start(info.index),
                model_ratio: (s.chunks > 0 && s.predicted > 0.0).then(|| s.busy / s.predicted),
            })
            .collect();
        // δ′ of the whole run: each class's time against its models'.
        let ratios: Option<Vec<f64>> = classes
            .iter()
            .filter(|c| c.chunks > 0)
            .map(|c| c.model_ratio)
            .collect();
        let prediction_imbalance = ratios.map(|r| imbalance(&r));
        let fin: Vec<f64> = classes
            .iter()
            .filter(|c| c.items > 0)
            .map(|c| c.finish_s)
            .collect();
        let imbalance = imbalance(&fin);
        // The seed's step 4: the split the static phase would have balanced.
        let rate: Vec<f64> = self
            .st
            .iter()
            .map(|s| {
                if s.static_secs > 0.0 {
                    s.workers as f64 * s.static_items as f64 / s.static_secs
                } else {
                    0.0
                }
            })
            .collect();
        let learned_split = if rate.iter().sum::<f64>() > 0.0 {
            normalized(&rate)
        } else {
            self.planned.clone()
        };
        // The seed's ν rule, as the profiler will apply it to these numbers.
        let split_delta = self
            .learns_split
            .then(|| crate::profiler::split_delta(&self.stored_split, &learned_split));
        let split_stored =
            split_delta.is_some_and(|d| d > self.th.nu && learned_split.iter().sum::<f64>() > 0.0);
        Ok(RunReport {
            kernel: self.name.clone(),
            policy: self.policy.clone(),
            items: self.items,
            started_s: 0.0,
            makespan_s: makespan,
            ideal_s: self
                .total_speed()
                .map_or(f64::NAN, |v| self.items as f64 / v),
            imbalance,
            split: self.planned.clone(),
            learned_split,
            probe: self.probe_report.clone(),
            retries: self.retried,
            split_delta,
            split_stored,
            forecast: self.forecast.clone(),
            prediction_imbalance,
            classes,
            chunks: self.trace.take().unwrap_or_default(),
        })
    }

    /// When class `c`'s workers started their first chunks, on average
    /// (`None`: none ran one).
    fn class_start(&self, c: usize) -> Option<f64> {
        let starts: Vec<f64> = self
            .worker_class
            .iter()
            .zip(&self.worker)
            .filter(|&(&k, w)| k == c && w.first_start.is_finite())
            .map(|(_, w)| w.first_start)
            .collect();
        (!starts.is_empty()).then(|| starts.iter().sum::<f64>() / starts.len() as f64)
    }

    /// Samples of this run per class, for the profiler.
    pub(crate) fn samples(&self) -> Vec<Vec<Sample>> {
        self.st
            .iter()
            .map(|s| s.run_samples.iter().copied().collect())
            .collect()
    }
}
