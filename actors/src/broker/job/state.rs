//! Per class, what a job keeps: its part in the plan; what it knows of the
//! class's speed ([`Speed`]) and of the least a chunk costs ([`Fill`]);
//! its region's accounting ([`Region`]); its report figures ([`Tally`]);
//! its part of a probe under way ([`ProbeState`]); and per worker, its part
//! in the job ([`WorkerState`]).

use std::collections::VecDeque;

use crate::perfmodel::{Sample, SpeedModel};
use crate::report::Phase;

/// In-run samples kept per class for the profiler.
const RUN_SAMPLES: usize = 256;

#[derive(Debug, Clone, Default)]
pub(super) struct ClassState {
    pub(super) eligible: bool,
    pub(super) workers: usize,
    /// It may run the kernel and has workers, but the plan gives it
    /// nothing: it stands by for retries (see `Admission::standby`).
    pub(super) standby: bool,
    /// Given a region only to be measured again (the plan left it out):
    /// until one of its chunks ends, its own region's chunks are not
    /// judged by the model they are there to replace.
    pub(super) remeasured: bool,
    /// What the plan divided its speed by (`Admission::pace`; 1 where it
    /// did not): the guard divides it alike.
    pub(super) pace: f64,
    pub(super) speed: Speed,
    pub(super) fill: Fill,
    pub(super) region: Region,
    pub(super) tally: Tally,
}

impl ClassState {
    /// Whether its workers can claim from the job: it may run the kernel,
    /// the plan gives it a share, and it has workers.
    pub(super) fn active(&self) -> bool {
        self.eligible && self.workers > 0
    }

    /// Its workers' items per second together (`None` without a model).
    pub(super) fn class_speed(&self) -> Option<f64> {
        self.speed.b().map(|b| b * self.workers as f64)
    }
}

/// What the job knows of a class's speed: the model it refines as chunks
/// end, the model it was admitted with, and this run's samples.
#[derive(Debug, Clone, Default)]
pub(super) struct Speed {
    pub(super) model: SpeedModel,
    /// The model as admitted, before this run's chunks refine
    /// [`Speed::model`]: what the run is measured against.
    pub(super) admitted: SpeedModel,
    /// This run's latest [`RUN_SAMPLES`] samples, for the profiler.
    pub(super) run_samples: VecDeque<Sample>,
}

impl Speed {
    /// A class admitted with `model`.
    pub(super) fn new(model: SpeedModel) -> Self {
        Self {
            admitted: model.clone(),
            model,
            run_samples: VecDeque::new(),
        }
    }

    pub(super) fn b(&self) -> Option<f64> {
        self.model.is_known().then(|| self.model.b())
    }

    /// The class took `secs` for `items`: the model learns it, and the
    /// run's samples keep it.
    pub(super) fn observe(&mut self, items: usize, secs: f64) {
        self.model.observe(items as f64, secs);
        if self.run_samples.len() == RUN_SAMPLES {
            self.run_samples.pop_front();
        }
        self.run_samples.push_back(Sample {
            items: items as f64,
            secs,
        });
    }

    /// The run's samples, oldest first.
    pub(super) fn samples(&self) -> Vec<Sample> {
        self.run_samples.iter().copied().collect()
    }

    /// The model forgets what it was admitted with and keeps only this
    /// run's samples (if it has any).
    pub(super) fn reset_to_run(&mut self) {
        let samples = self.samples();
        if !samples.is_empty() {
            self.model.reset_to(&samples);
        }
    }
}

/// How small a class's chunks may be: what fills its device, and the least
/// work a chunk costs.
#[derive(Debug, Clone, Default)]
pub(super) struct Fill {
    /// The smallest chunk it is given while its own region lasts (enough
    /// to fill a GPU; see `ClassInfo::min_chunk`).
    pub(super) min_chunk: usize,
    /// The least work a chunk costs, in items (a chunk of fewer takes as
    /// long as one of this many), and whether its recent chunks measured it
    /// (`guard::least_work`). Unmeasured, a GPU's is its fill.
    pub(super) least: (usize, bool),
    /// Whether this run tried a chunk below an unmeasured fill.
    pub(super) tried_small: bool,
}

impl Fill {
    /// Whether the class may take a chunk of `max` items, below its fill,
    /// to measure what such a chunk costs: its recent chunks did not, and
    /// it has not tried one this run.
    pub(super) fn may_try_small(&self, max: f64, grain: usize) -> bool {
        self.min_chunk > grain && max < self.min_chunk as f64 && !self.least.1 && !self.tried_small
    }
}

/// A class's region accounting since the last (re)plan.
#[derive(Debug, Clone, Default)]
pub(super) struct Region {
    /// Items it claimed from its own region.
    pub(super) claimed: usize,
    /// Its region's items at the last (re)plan.
    pub(super) size: usize,
    /// Items of its region the probe takes (0 with no probe, and after a
    /// re-plan): its static phase starts there. Read after the probe too, so
    /// it is not in [`ProbeState`].
    pub(super) probe_target: usize,
    pub(super) static_target: usize,
}

impl Region {
    /// Whether its claims have not yet reached the probe's part.
    pub(super) fn in_probe(&self) -> bool {
        self.claimed < self.probe_target
    }

    /// Whether its claims have not yet reached the end of the static part.
    pub(super) fn in_static(&self) -> bool {
        self.claimed < self.probe_target + self.static_target
    }

    /// Whether others have taken items from it, `left` of it being left.
    pub(super) fn eaten(&self, left: usize) -> bool {
        self.claimed + left < self.size
    }

    /// A re-plan gave it `size` items, `static_target` of them static.
    pub(super) fn replan(&mut self, size: usize, static_target: usize) {
        self.claimed = 0;
        self.size = size;
        self.probe_target = 0;
        self.static_target = static_target;
    }
}

/// A class's figures for the report.
#[derive(Debug, Clone, Default)]
pub(super) struct Tally {
    pub(super) items: usize,
    pub(super) chunks: usize,
    pub(super) busy: f64,
    pub(super) finish: f64,
    /// What the model at admission predicted for the chunks it completed.
    pub(super) predicted: f64,
    // Static-phase throughput, for learning the split (the seed's step 4).
    pub(super) static_items: usize,
    pub(super) static_secs: f64,
}

impl Tally {
    /// A chunk of `n` items in `phase` ended at `end` after `secs`; the
    /// model at admission predicted `predicted` for it.
    pub(super) fn record(&mut self, n: usize, phase: Phase, secs: f64, end: f64, predicted: f64) {
        self.items += n;
        self.chunks += 1;
        self.busy += secs;
        self.finish = self.finish.max(end);
        if predicted.is_finite() {
            self.predicted += predicted;
        } else {
            self.predicted = f64::NAN;
        }
        if phase == Phase::Static {
            self.static_items += n;
            self.static_secs += secs;
        }
    }

    /// Its time against what the model at admission predicted for it
    /// (`None` before a chunk ended, or without a prediction).
    pub(super) fn model_ratio(&self) -> Option<f64> {
        (self.chunks > 0 && self.predicted > 0.0).then(|| self.busy / self.predicted)
    }

    /// Items per second of `workers` workers in the static phase (0 if it
    /// had none).
    pub(super) fn static_rate(&self, workers: usize) -> f64 {
        if self.static_secs > 0.0 {
            workers as f64 * self.static_items as f64 / self.static_secs
        } else {
            0.0
        }
    }
}

/// One worker's part in a job.
#[derive(Debug, Clone)]
pub(super) struct WorkerState {
    /// When its chunk of this job in flight is predicted to end (seconds
    /// since the job started); when its last one ended, between chunks.
    pub(super) busy_until: f64,
    /// Whether it has a chunk of this job in flight.
    pub(super) running: bool,
    /// While it runs a chunk: when the chunk began (seconds since the job
    /// started; an accelerator's first, when its setup ends) and its items.
    pub(super) in_flight: (f64, usize),
    /// When it started its first chunk of this job (NaN: none yet).
    pub(super) first_start: f64,
    /// Whether its last look at this job was a refusal by the guard
    /// (cleared when it claims).
    pub(super) declined: bool,
}

impl Default for WorkerState {
    fn default() -> Self {
        Self {
            busy_until: 0.0,
            running: false,
            in_flight: (0.0, 0),
            first_start: f64::NAN,
            declined: false,
        }
    }
}

/// One class's part of the probe under way; dropped when the probe ends
/// (`probe.rs`).
#[derive(Debug, Clone, Default)]
pub(super) struct ProbeState {
    /// Next cold probe chunk per worker: starts small and doubles.
    pub(super) ramp: usize,
    /// Items and chunks of probe completed.
    pub(super) done: usize,
    pub(super) chunks: usize,
    /// When its latest probe chunk ended (seconds since the job started).
    pub(super) finish: f64,
    /// What the stored model predicted for this class's warm probe chunk,
    /// and the longest probe chunk it took (its own time: a compile before
    /// the first chunk is not in it).
    pub(super) predicted: f64,
    pub(super) secs: f64,
}

impl ProbeState {
    /// A probe chunk of `n` items ran from `end - secs` to `end`.
    pub(super) fn record(&mut self, n: usize, end: f64, secs: f64) {
        self.done += n;
        self.chunks += 1;
        self.finish = self.finish.max(end);
        self.secs = self.secs.max(secs);
    }
}
