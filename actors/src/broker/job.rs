//! One job's scheduling state and the engine that carries out its policy.
//!
//! Everything here runs under the job's lock, on the worker thread that
//! claims or completes a chunk: no message is sent on the hot path.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use coexec_kernels::{ClaimSpace, Kernel, KernelError};

use super::space::Space;
use crate::device::{ClassInfo, End};
use crate::perfmodel::{Sample, SpeedModel};
use crate::policy::{
    plan_shares, Admission, Chunking, ClassSpeed, Probe, Steal, Thresholds, LATENCY_CHUNKS,
};
use crate::report::{
    imbalance, normalized, ChunkRecord, ClassReport, Phase, ProbeReport, RunReport,
};
use crate::ActorError;

/// Attempts a chunk gets before its job fails.
pub(crate) const MAX_ATTEMPTS: u32 = 4;

/// A cold probe's first chunk per worker: the items over this many times
/// the workers, then doubling.
const COLD_FIRST: usize = 4096;

/// In-run samples kept per class for the profiler.
const RUN_SAMPLES: usize = 256;

/// A chunk handed to a worker.
#[derive(Debug, Clone)]
pub(crate) struct ChunkInfo {
    pub(crate) range: Range<usize>,
    pub(crate) phase: Phase,
    pub(crate) attempt: u32,
    /// Where earlier attempts failed.
    pub(crate) failures: Failures,
    /// Seconds of one CPU worker's throughput for the chunk, when the CPU
    /// class is measured: what a `sim` device models its time from before
    /// it has run the kernel itself.
    pub(crate) cpu_secs: Option<f64>,
}

/// The classes on which a chunk failed once, and twice or more (bit `c`,
/// modulo 64).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Failures {
    once: u64,
    twice: u64,
}

impl Failures {
    fn add(mut self, c: usize) -> Self {
        let bit = class_bit(c);
        if self.once & bit != 0 {
            self.twice |= bit;
        }
        self.once |= bit;
        self
    }

    /// Whether class `c` failed the chunk twice: it goes elsewhere if it can.
    fn avoids(&self, c: usize) -> bool {
        self.twice & class_bit(c) != 0
    }
}

/// A chunk and the kernel to run it with. The worker drops the kernel handle
/// before reporting, so the caller gets its kernel back unshared.
#[derive(Clone)]
pub(crate) struct Claimed {
    pub(crate) info: ChunkInfo,
    pub(crate) kernel: Arc<dyn Kernel>,
    /// The job's claim space, to mint the chunk in.
    pub(crate) claims: Arc<ClaimSpace>,
}

#[derive(Debug, Clone)]
struct Retry {
    range: Range<usize>,
    attempts: u32,
    not_by: usize,
    failures: Failures,
}

fn class_bit(c: usize) -> u64 {
    1 << (c % 64)
}

#[derive(Debug, Clone, Default)]
struct ClassState {
    eligible: bool,
    workers: usize,
    model: SpeedModel,
    run_samples: VecDeque<Sample>,
    // Region accounting since the last (re)plan.
    claimed: usize,
    probe_target: usize,
    static_target: usize,
    probe_ramp: usize,
    probe_done: usize,
    probe_chunks: usize,
    probe_finish: f64,
    /// What the stored model predicted for this class's warm probe chunk,
    /// and the longest probe chunk it took (its own time: a compile before
    /// the first chunk is not in it).
    probe_predicted: f64,
    probe_secs: f64,
    // Static-phase throughput, for learning the split (the seed's step 4).
    static_items: usize,
    static_secs: f64,
    // Report.
    items: usize,
    chunks: usize,
    busy: f64,
    finish: f64,
}

impl ClassState {
    fn b(&self) -> Option<f64> {
        self.model.is_known().then(|| self.model.b())
    }
}

/// What the worker should do after completing or failing a chunk.
#[derive(Debug, Default)]
pub(crate) struct After {
    /// The job is over (done or failed): hand it to the broker.
    pub(crate) finished: bool,
    /// Something changed that may let idle workers claim: wake them.
    pub(crate) wake: bool,
}

/// A job's scheduling state.
pub(crate) struct JobCore {
    kernel: Option<Arc<dyn Kernel>>,
    /// The claim space the job's chunks are minted in; dropped with the
    /// kernel, so the kernel's buffers are free for its next run.
    claims: Option<Arc<ClaimSpace>>,
    name: String,
    policy: String,
    items: usize,
    grain: usize,
    adm: Admission,
    th: Thresholds,
    classes: Arc<[ClassInfo]>,
    st: Vec<ClassState>,
    home: Vec<usize>,
    order: Vec<usize>,
    space: Space,
    probing: bool,
    probe_report: Option<ProbeReport>,
    planned: Vec<f64>,
    retries: VecDeque<Retry>,
    retried: usize,
    in_flight: usize,
    done: usize,
    worker_class: Arc<[usize]>,
    busy_until: Vec<f64>,
    /// Whether each worker has a chunk of this job in flight.
    running: Vec<bool>,
    failed: Option<ActorError>,
    finished: bool,
    trace: Option<Vec<ChunkRecord>>,
    /// The split stored for this kernel when the job was admitted.
    stored_split: Vec<f64>,
    /// Reused by the guard: (start, speed) of the other workers.
    scratch: Vec<(f64, f64)>,
    /// Per class, the smallest chunk it is given while its own region
    /// lasts (enough to fill a GPU; see `ClassInfo::min_chunk`).
    min_chunk: Vec<usize>,
    /// Chunks far past their prediction, taken back (`overdue.rs`).
    watch: overdue::Watch,
}

impl JobCore {
    /// A job over `kernel`, planned by `adm`. `models[c]` is the stored model
    /// of class `c` for this kernel; `eligible[c]` whether it can run it;
    /// `in_service[c]` its workers; `worker_class[w]` the class of worker `w`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        kernel: Arc<dyn Kernel>,
        policy: &str,
        adm: Admission,
        th: Thresholds,
        classes: Arc<[ClassInfo]>,
        models: Vec<SpeedModel>,
        stored_split: Vec<f64>,
        eligible: Vec<bool>,
        in_service: Vec<usize>,
        worker_class: Arc<[usize]>,
        trace: bool,
    ) -> Self {
        let items = kernel.items();
        let grain = kernel.grain().max(1);
        let k = classes.len();
        // Head-eaters first, so a CPU region touches the accelerator regions.
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&c| (classes[c].end == End::Tail, c));
        let (home, space) = if adm.pool {
            let mut shares = vec![0.0; k];
            shares[order[0]] = 1.0;
            (vec![order[0]; k], Space::new(items, grain, &shares, &order))
        } else {
            (
                (0..k).collect(),
                Space::new(items, grain, &adm.shares, &order),
            )
        };
        let mut st: Vec<ClassState> = (0..k)
            .map(|c| ClassState {
                eligible: eligible[c] && adm.shares[c] > 0.0,
                workers: in_service[c],
                model: models[c].clone(),
                ..Default::default()
            })
            .collect();
        let total_workers: usize = st.iter().filter(|s| s.eligible).map(|s| s.workers).sum();
        let min_chunk: Vec<usize> = classes.iter().map(|c| c.min_chunk(&*kernel)).collect();
        for (c, s) in st.iter_mut().enumerate() {
            let region = if adm.pool { items } else { space.left(c) };
            let w = s.workers.max(1);
            match adm.probe {
                Probe::Warm => {
                    s.probe_target = (region as f64 * th.warm_probe) as usize;
                    let chunk = s.probe_target.div_ceil(w).max(min_chunk[c]).min(region);
                    s.probe_predicted = s.model.predict(chunk.max(1) as f64);
                }
                Probe::Cold => {
                    // A GPU's probe fills it at least once: smaller chunks
                    // measure its launch latency, not its speed.
                    s.probe_target = ((items as f64 * th.cold_probe) as usize)
                        .max(min_chunk[c])
                        .min(region);
                    // Start small and double: bounded in time even on a very
                    // slow device.
                    s.probe_ramp = (items / (COLD_FIRST * total_workers.max(1)))
                        .max(grain)
                        .min(s.probe_target / w)
                        .max(min_chunk[c])
                        .max(1);
                }
                Probe::None => {}
            }
            s.static_target = (region as f64 * adm.static_fraction) as usize;
        }
        let probing = adm.probe != Probe::None;
        let planned = adm.shares.clone();
        let failed = (items > 0 && total_workers == 0).then(|| ActorError::NoDevice {
            kernel: kernel.name().to_string(),
            why: format!("policy `{policy}` leaves no device class that can run it"),
        });
        // A job over by admission (no items, or no device) holds no handle:
        // its submitter is answered at once and must get the kernel back
        // unshared.
        let finished = items == 0 || failed.is_some();
        Self {
            kernel: (!finished).then(|| kernel.clone()),
            claims: (!finished).then(ClaimSpace::new),
            name: kernel.name().to_string(),
            policy: policy.to_string(),
            items,
            grain,
            adm,
            th,
            classes,
            st,
            home,
            order,
            space,
            probing,
            probe_report: None,
            planned,
            retries: VecDeque::new(),
            retried: 0,
            in_flight: 0,
            done: 0,
            busy_until: vec![0.0; worker_class.len()],
            running: vec![false; worker_class.len()],
            worker_class,
            finished,
            failed,
            trace: trace.then(Vec::new),
            stored_split,
            scratch: Vec::new(),
            min_chunk,
            watch: overdue::Watch::default(),
        }
    }

    /// Drops the job's handle on its kernel (the job is over), so that a
    /// submitter answered next is the kernel's only owner.
    pub(crate) fn release_kernel(&mut self) {
        debug_assert!(self.finished, "kernel released from a live job");
        self.kernel = None;
        self.claims = None;
    }

    /// Whether no worker needs to look at this job again.
    pub(crate) fn is_over(&self) -> bool {
        self.finished
    }

    /// The next chunk for worker `w` of class `c` at `now` (seconds since the
    /// job started), or `None` if it should take nothing from this job now.
    pub(crate) fn claim(&mut self, w: usize, c: usize, now: f64) -> Option<Claimed> {
        if self.finished || self.failed.is_some() || !self.st[c].eligible || self.st[c].workers == 0
        {
            return None;
        }
        let kernel = self.kernel.clone()?;
        let claims = self.claims.clone()?;
        self.take_back_overdue(now);
        if let Some(r) = self.take_retry(w, c, now) {
            self.in_flight += 1;
            self.busy_until[w] = now + self.predict(c, r.range.len());
            self.running[w] = true;
            self.watch_start(w, r.range.len(), now);
            let info = ChunkInfo {
                cpu_secs: self.cpu_secs(r.range.len()),
                range: r.range,
                phase: Phase::Retry,
                attempt: r.attempts,
                failures: r.failures,
            };
            return Some(Claimed {
                info,
                kernel,
                claims,
            });
        }
        let (range, phase) = self.take_fresh(w, c, now)?;
        self.in_flight += 1;
        self.busy_until[w] = now + self.predict(c, range.len());
        self.running[w] = true;
        self.watch_start(w, range.len(), now);
        Some(Claimed {
            info: ChunkInfo {
                cpu_secs: self.cpu_secs(range.len()),
                range,
                phase,
                attempt: 0,
                failures: Failures::default(),
            },
            kernel,
            claims,
        })
    }

    /// A failed chunk (or its first part) for worker `w` of class `c`.
    ///
    /// The worker that failed it last takes it only when alone, and a class
    /// that failed it twice only when no other class can (two streams of a
    /// lost GPU must not use up its attempts). If those rules leave no
    /// worker in service that may take it, any worker may, so a retry never
    /// waits forever. Under the guard a retry is sized like a dynamic chunk:
    /// a slower worker takes a part and leaves the rest.
    fn take_retry(&mut self, w: usize, c: usize, now: f64) -> Option<Retry> {
        if self.retries.is_empty() {
            return None;
        }
        let others = self.total_workers() > 1;
        let (st, wc) = (&self.st, &self.worker_class);
        // Workers of class `k` that may run `r`, leaving out its last failer.
        let usable = |r: &Retry, k: usize| {
            let s = &st[k];
            let last = usize::from(wc.get(r.not_by) == Some(&k));
            if s.eligible {
                s.workers.saturating_sub(last)
            } else {
                0
            }
        };
        let elsewhere =
            |r: &Retry| (0..st.len()).any(|k| usable(r, k) > 0 && !r.failures.avoids(k));
        let class_ok = |r: &Retry, k: usize| !r.failures.avoids(k) || !elsewhere(r);
        let i = self.retries.iter().position(|r| {
            let anyone = (0..st.len()).any(|k| usable(r, k) > 0 && class_ok(r, k));
            !anyone || (class_ok(r, c) && (r.not_by != w || !others))
        })?;
        let mut r = self.retries.remove(i)?;
        if self.adm.guard {
            let n = r.range.len();
            let Some(m) = self.limit(w, c, n, now) else {
                self.retries.insert(i, r);
                return None;
            };
            let m = (m / self.grain * self.grain).max(self.grain);
            if m < n {
                let rest = Retry {
                    range: r.range.start + m..r.range.end,
                    ..r.clone()
                };
                r.range.end = r.range.start + m;
                self.retries.insert(i, rest);
            }
        }
        Some(r)
    }

    fn take_fresh(&mut self, w: usize, c: usize, now: f64) -> Option<(Range<usize>, Phase)> {
        let end = self.classes[c].end;
        let r = self.home[c];
        if self.space.left(r) > 0 {
            let (n, phase) = self.own_size(c);
            let n = n.max(self.min_chunk[c]);
            let n = match phase {
                Phase::Dynamic => self.limit(w, c, n, now)?,
                // Under the guard a static chunk is never larger than a
                // dynamic one would be here: once others have eaten into this
                // class's region (it was planned too large), a slow device
                // must not commit to a quarter of its old share at the end.
                Phase::Static if self.adm.guard => {
                    let n = n.min(self.dynamic_size(c));
                    self.limit(w, c, n, now)?
                }
                _ => n,
            };
            let got = self.space.take(r, end, n)?;
            let s = &mut self.st[c];
            s.claimed += got.len();
            return Some((got, phase));
        }
        if self.adm.steal == Steal::Never {
            return None;
        }
        // Steal from the far end of the region with the most predicted time left.
        let victim = (0..self.classes.len())
            .filter(|&v| v != r && self.space.left(v) > 0)
            .max_by(|&x, &y| self.time_left(x).total_cmp(&self.time_left(y)))?;
        let n = self.dynamic_size(c);
        let n = self.limit(w, c, n, now)?;
        let far = match self.classes[victim].end {
            End::Head => End::Tail,
            End::Tail => End::Head,
        };
        let got = self.space.take(victim, far, n)?;
        Some((got, Phase::Dynamic))
    }

    /// Chunk size and phase for a claim from the class's own region.
    fn own_size(&mut self, c: usize) -> (usize, Phase) {
        let s = &self.st[c];
        let w = s.workers.max(1);
        if self.probing && s.claimed < s.probe_target {
            return match self.adm.probe {
                Probe::Cold => {
                    let n = s.probe_ramp.max(1);
                    let cap = (s.probe_target / w).max(self.grain);
                    self.st[c].probe_ramp = (n * 2).min(cap);
                    (n, Phase::Probe)
                }
                _ => ((s.probe_target.div_ceil(w)).max(1), Phase::Probe),
            };
        }
        if self.probing && self.adm.probe == Probe::Cold {
            // Probe quota spent before every class reported: keep going in
            // probe-sized chunks rather than commit to an unplanned split.
            return (s.probe_ramp.max(1), Phase::Probe);
        }
        if s.claimed < s.probe_target + s.static_target {
            let per = self.adm.static_chunks_per_worker.max(1);
            // Fewer, larger static chunks where a chunk's fixed cost would
            // otherwise weigh (an accelerator's launch and transfer setup).
            let floor = s.b().map_or(0.0, |b| LATENCY_CHUNKS * s.model.a() * b) as usize;
            let n = (s.static_target / (w * per))
                .max(floor)
                .min(s.static_target.div_ceil(w));
            return (n.max(1), Phase::Static);
        }
        (self.dynamic_size(c), Phase::Dynamic)
    }

    fn dynamic_size(&self, c: usize) -> usize {
        let g = self.grain;
        let left = self.space.total_left() as f64;
        let n = match self.adm.chunking {
            Chunking::Fixed(n) | Chunking::Eft(n) => n as f64,
            Chunking::Guided => {
                let share = match (self.st[c].b(), self.total_speed()) {
                    (Some(b), Some(v)) => b / v,
                    _ => 1.0 / self.total_workers().max(1) as f64,
                };
                left * share / 2.0
            }
            Chunking::TimeGuided => match (self.st[c].b(), self.total_speed()) {
                (Some(b), Some(v)) => {
                    let floor = LATENCY_CHUNKS * self.st[c].model.a() * b;
                    (b * left / v / 2.0).max(floor)
                }
                _ => left / (2.0 * self.total_workers().max(1) as f64),
            },
        };
        (n.ceil() as usize).max(g).max(self.min_chunk[c]).max(1)
    }

    /// The earliest-finish guard and the EFT rule: how many items worker `w`
    /// may take, or `None` if others would finish the rest sooner without it.
    /// With nothing of the job in flight the worker always takes something,
    /// so a job cannot stall on refusals.
    fn limit(&mut self, w: usize, c: usize, n: usize, now: f64) -> Option<usize> {
        let Some(b) = self.st[c].b() else {
            return Some(n);
        };
        let a = self.st[c].model.a();
        let need = self.grain.min(self.space.total_left()).max(1);
        let progress = self.in_flight == 0;
        if let Chunking::Eft(_) = self.adm.chunking {
            let mine = now + a + n as f64 / b;
            let beaten = self.worker_class.iter().enumerate().any(|(v, &cv)| {
                v != w
                    && self.st[cv].eligible
                    && self.st[cv].workers > 0
                    && self.st[cv].b().is_some_and(|bv| {
                        self.busy_until[v].max(now) + self.st[cv].model.a() + n as f64 / bv < mine
                    })
            });
            return (!beaten || progress).then_some(n);
        }
        if !self.adm.guard {
            return Some(n);
        }
        // When the others would finish what is left without this worker:
        // each starts on it once its chunk in flight is done and its fixed
        // cost paid, then goes at its speed (water-filling over the starts).
        let mut starts = std::mem::take(&mut self.scratch);
        starts.clear();
        for (v, &cv) in self.worker_class.iter().enumerate() {
            if v == w || !self.st[cv].eligible || self.st[cv].workers == 0 {
                continue;
            }
            let Some(bv) = self.st[cv].b() else {
                self.scratch = starts;
                return Some(n);
            };
            let start = (self.busy_until[v] - now).max(0.0) + self.st[cv].model.a();
            starts.push((start, bv));
        }
        let left = self.space.total_left() as f64;
        let t_others = finish_time(&mut starts, left);
        // The balanced end (issue 13): no more than this worker's part of
        // what is left if everyone, itself included, shares it to finish
        // together. Without it a class with a fixed cost per chunk (whose
        // chunks are floored at LATENCY_CHUNKS·a·b) takes the whole rest in
        // one chunk while the others idle: cold runs of cpu:1,sim:1@2 whose
        // sim paid a few ms of wake-up per chunk ended at imbalance 0.1-0.5.
        starts.push((a, b));
        let fair = finish_time(&mut starts, left).map_or(f64::INFINITY, |t| ((t - a) * b).ceil());
        self.scratch = starts;
        let Some(t_others) = t_others else {
            return Some(n);
        };
        // A GPU's balanced part is at least what fills it: a smaller chunk
        // takes as long as a full one.
        let fill = self.min_chunk[c];
        let fair_floor = if fill > self.grain { fill } else { need };
        let max = ((t_others - a) * b)
            .floor()
            .min(fair.max(fair_floor as f64));
        if max >= n as f64 {
            Some(n)
        } else if fill > self.grain && max < fill as f64 && self.sibling_busy(w, c) {
            // A GPU chunk smaller than the device's fill, next to a chunk in
            // flight on another stream of the same device, only competes
            // with it for SMs and takes about as long as a full one (its
            // few blocks each run the whole kernel): leave the rest to the
            // others, unless nothing is in flight. (On an idle device a
            // sliver still helps.)
            progress.then_some(n.min(fill))
        } else if max >= need as f64 {
            Some(max as usize)
        } else if progress {
            Some(need)
        } else {
            None
        }
    }

    /// Whether another worker of class `c` has a chunk in flight.
    fn sibling_busy(&self, w: usize, c: usize) -> bool {
        self.worker_class
            .iter()
            .zip(&self.running)
            .enumerate()
            .any(|(v, (&cv, &busy))| v != w && cv == c && busy)
    }

    fn predict(&self, c: usize, n: usize) -> f64 {
        let p = self.st[c].model.predict(n as f64);
        if p.is_finite() {
            p
        } else {
            0.0
        }
    }

    fn total_workers(&self) -> usize {
        self.st
            .iter()
            .filter(|s| s.eligible)
            .map(|s| s.workers)
            .sum()
    }

    /// Items per second of every eligible worker, if every class is known.
    fn total_speed(&self) -> Option<f64> {
        self.st
            .iter()
            .filter(|s| s.eligible && s.workers > 0)
            .map(|s| s.b().map(|b| b * s.workers as f64))
            .sum()
    }

    fn time_left(&self, r: usize) -> f64 {
        let owner = &self.st[r];
        let v = owner.b().map(|b| b * owner.workers as f64).unwrap_or(0.0);
        if v > 0.0 && owner.eligible {
            self.space.left(r) as f64 / v
        } else {
            f64::INFINITY
        }
    }

    /// Worker `w` of class `c` finished `chunk` in `start..end` (seconds since
    /// the job started).
    pub(crate) fn complete(
        &mut self,
        w: usize,
        c: usize,
        chunk: &ChunkInfo,
        start: f64,
        end: f64,
    ) -> After {
        let n = chunk.range.len();
        let secs = (end - start).max(1e-9);
        self.in_flight -= 1;
        self.done += n;
        self.busy_until[w] = end;
        self.running[w] = false;
        let s = &mut self.st[c];
        s.items += n;
        s.chunks += 1;
        s.busy += secs;
        s.finish = s.finish.max(end);
        s.model.observe(n as f64, secs);
        if s.run_samples.len() == RUN_SAMPLES {
            s.run_samples.pop_front();
        }
        s.run_samples.push_back(Sample {
            items: n as f64,
            secs,
        });
        match chunk.phase {
            Phase::Probe => {
                s.probe_done += n;
                s.probe_chunks += 1;
                s.probe_finish = s.probe_finish.max(end);
                s.probe_secs = s.probe_secs.max(secs);
            }
            Phase::Static => {
                s.static_items += n;
                s.static_secs += secs;
            }
            _ => {}
        }
        if let Some(t) = &mut self.trace {
            t.push(ChunkRecord {
                worker: w,
                lo: chunk.range.start,
                hi: chunk.range.end,
                start,
                end,
                phase: chunk.phase,
            });
        }
        let mut after = After::default();
        if self.probing && self.probe_complete() {
            self.end_probe();
            after.wake = true;
        }
        if self.done == self.items && self.in_flight == 0 {
            self.finished = true;
            self.kernel = None;
            self.claims = None;
            self.claims = None;
            after.finished = true;
        }
        after
    }

    /// Worker `w` of class `c` failed `chunk`: it goes back for another worker.
    pub(crate) fn fail(&mut self, w: usize, chunk: &ChunkInfo, err: KernelError) -> After {
        self.in_flight -= 1;
        self.busy_until[w] = 0.0;
        self.running[w] = false;
        self.retried += 1;
        // A chunk taken back did not fail: it does not use up an attempt.
        let attempts = match &err {
            KernelError::TakenBack { secs } => {
                self.taken_back(self.worker_class[w], chunk.range.len(), *secs);
                chunk.attempt
            }
            _ => chunk.attempt + 1,
        };
        let mut after = After {
            wake: true,
            ..After::default()
        };
        if attempts >= MAX_ATTEMPTS {
            self.failed = Some(ActorError::ChunkFailed {
                kernel: self.name.clone(),
                lo: chunk.range.start,
                hi: chunk.range.end,
                attempts,
                source: err,
            });
        } else {
            let r = chunk.range.clone();
            // Out of device memory: try again in halves (on the grain), on
            // any device; other failures go to another kind of device first.
            let half = (r.len() / 2).div_ceil(self.grain) * self.grain;
            let oom = matches!(err, KernelError::OutOfMemory { .. });
            let parts = if oom && half > 0 && half < r.len() {
                vec![r.start..r.start + half, r.start + half..r.end]
            } else {
                vec![r]
            };
            // Halves may fit where the whole did not: not counted against
            // the class.
            let failures = if parts.len() == 2 {
                chunk.failures
            } else {
                chunk.failures.add(self.worker_class[w])
            };
            for range in parts {
                self.retries.push_back(Retry {
                    range,
                    attempts,
                    not_by: w,
                    failures,
                });
            }
        }
        if self.failed.is_some() {
            self.finished = true;
            self.kernel = None;
            self.claims = None;
            self.claims = None;
            after.finished = true;
        }
        after
    }

    /// Class `c` lost a worker; fails the job if nobody is left to run it.
    pub(crate) fn worker_lost(&mut self, c: usize, why: &str) -> After {
        self.st[c].workers = self.st[c].workers.saturating_sub(1);
        let mut after = After {
            wake: true,
            ..After::default()
        };
        if self.finished {
            return after;
        }
        if self.adm.steal == Steal::Never
            && self.st[c].workers == 0
            && self.space.left(self.home[c]) > 0
        {
            // Nobody else would take its region: let everyone in.
            self.adm.steal = Steal::Always;
        }
        if self.total_workers() == 0 {
            self.failed = Some(ActorError::NoDevice {
                kernel: self.name.clone(),
                why: format!("every device that could run it is out of service (last: {why})"),
            });
            self.finished = true;
            self.kernel = None;
            self.claims = None;
            self.claims = None;
            after.finished = true;
        }
        after
    }

    /// Ends the job at once (shutdown, or its caller stopped waiting): no
    /// more claims; chunks in flight complete into a job that is over.
    pub(crate) fn cancel(&mut self, why: ActorError) {
        if !self.finished {
            self.failed = Some(why);
            self.finished = true;
            self.kernel = None;
            self.claims = None;
            self.claims = None;
        }
    }

    fn probe_complete(&self) -> bool {
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
    fn end_probe(&mut self) {
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

    /// The run's report, once it is over; `Err` if it failed.
    pub(crate) fn report(&mut self) -> Result<RunReport, ActorError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if self.probing {
            // A short job can end before every class finished a probe chunk:
            // report what the probe saw.
            self.end_probe();
        }
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
            })
            .collect();
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
        let split_delta = crate::profiler::split_delta(&self.stored_split, &learned_split);
        let split_stored = split_delta > self.th.nu && learned_split.iter().sum::<f64>() > 0.0;
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
            split_delta: Some(split_delta),
            split_stored,
            classes,
            chunks: self.trace.take().unwrap_or_default(),
        })
    }

    /// Kernel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Samples of this run per class, for the profiler.
    pub(crate) fn samples(&self) -> Vec<Vec<Sample>> {
        self.st
            .iter()
            .map(|s| s.run_samples.iter().copied().collect())
            .collect()
    }
}

/// When workers that start at `starts[i].0` (seconds from now) and then go
/// at `starts[i].1` items per second have done `items` between them; `None`
/// if none can (no speed). Sorts `starts`.
fn finish_time(starts: &mut [(f64, f64)], items: f64) -> Option<f64> {
    starts.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let (mut done, mut rate) = (0.0, 0.0);
    for (i, &(t, b)) in starts.iter().enumerate() {
        rate += b;
        let next = starts.get(i + 1).map_or(f64::INFINITY, |p| p.0);
        if rate > 0.0 && done + rate * (next - t) >= items {
            return Some(t + (items - done) / rate);
        }
        done += rate * (next - t);
    }
    None
}

mod overdue;
#[cfg(test)]
mod tests;
