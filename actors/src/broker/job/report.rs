//! What a finished job tells its submitter and the profiler.

use super::*;

/// A record of every chunk that ended, when the job keeps one.
pub(super) struct Trace(Option<Vec<ChunkRecord>>);

impl Trace {
    /// A record kept if `on`.
    pub(super) fn new(on: bool) -> Self {
        Self(on.then(Vec::new))
    }

    /// Worker `w` completed `chunk` in `start..end`.
    pub(super) fn record(&mut self, w: usize, chunk: &ChunkInfo, start: f64, end: f64) {
        if let Some(t) = &mut self.0 {
            t.push(ChunkRecord {
                worker: w,
                lo: chunk.range.start,
                hi: chunk.range.end,
                start,
                end,
                phase: chunk.phase,
            });
        }
    }

    /// The record so far (empty if none is kept); later chunks go unrecorded.
    fn take(&mut self) -> Vec<ChunkRecord> {
        self.0.take().unwrap_or_default()
    }
}

impl JobCore {
    /// The run's report, once it is over; `Err` if it failed.
    pub(crate) fn report(&mut self) -> Result<RunReport, ActorError> {
        if let Some(e) = self.life.failed.take() {
            return Err(e);
        }
        // A short job can end before every class finished a probe chunk:
        // report what the probe saw (nothing to do once it is over).
        self.end_probe();
        let makespan = self.st.iter().map(|s| s.tally.finish).fold(0.0, f64::max);
        let classes: Vec<ClassReport> = self
            .st
            .iter()
            .zip(self.classes.iter())
            .map(|(s, info)| ClassReport {
                name: info.name.clone(),
                workers: s.workers,
                items: s.tally.items,
                chunks: s.tally.chunks,
                busy_s: s.tally.busy,
                finish_s: s.tally.finish,
                share: s.tally.items as f64 / self.progress.items.max(1) as f64,
                model_a_s: s.speed.model.a(),
                model_b_items_per_s: s.speed.b().unwrap_or(0.0),
                start_s: self.class_start(info.index),
                model_ratio: s.tally.model_ratio(),
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
            .map(|s| s.tally.static_rate(s.workers))
            .collect();
        let learned_split = if rate.iter().sum::<f64>() > 0.0 {
            normalized(&rate)
        } else {
            self.plan.planned.clone()
        };
        let (split_delta, split_stored) = self.plan.split_verdict(&learned_split);
        Ok(RunReport {
            kernel: self.life.name.clone(),
            policy: self.plan.policy.clone(),
            items: self.progress.items,
            started_s: 0.0,
            makespan_s: makespan,
            ideal_s: self
                .total_speed()
                .map_or(f64::NAN, |v| self.progress.items as f64 / v),
            imbalance,
            split: self.plan.planned.clone(),
            learned_split,
            probe: self.probe.report.clone(),
            retries: self.retries.retried,
            split_delta,
            split_stored,
            forecast: self.plan.adm.forecast.clone(),
            prediction_imbalance,
            classes,
            chunks: self.trace.take(),
            inline: false,
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
        self.st.iter().map(|s| s.speed.samples()).collect()
    }
}
