//! Virtual time: the scheduler as it runs — the broker's admission, the job
//! engine, the profiler's store — driven by a modelled machine, run after
//! run, so that a bench of an iterative workload replays in milliseconds and
//! tests can assert what the scheduler would have done on it.
//!
//! The machine is a CPU class and one GPU of two streams, calibrated on the
//! H100 lease of 2026-11-23 (`h100-2026-11-23.json`, derived from that
//! lease's traces and bench figures by `scripts/vt_calibrate.py`):
//!
//! * a CPU worker wakes at the run's start plus a normal jitter, then takes
//!   `a + n/b` seconds per chunk, times a mean-one log-normal noise;
//! * a GPU stream pays the run's setup (`stage`) before its first chunk of a
//!   run; a chunk is a fixed latency `a` and then `max(n, min_work)` items of
//!   work at the device's rate, with the same kind of noise; chunks of both
//!   streams in their work phase share the device once their threads would
//!   occupy more than all of its SMs (two chunks that each fill it go at
//!   half speed; a sliver beside a chunk that leaves SMs idle does not
//!   slow it);
//! * co-executing, the GPU goes slower by a factor each run draws from
//!   those the lease's hybrid runs showed (the CPU workers and the streams'
//!   host threads share the cores and the memory bus): its work while a CPU
//!   worker of the job runs, its host side (a run's setup, a chunk's
//!   latency) throughout;
//! * a machine may instead share a host memory bus ([`Bus`], calibrated on
//!   the H200's pathfinder): while the GPU copies, the CPU's chunks go
//!   slower, and while CPU workers run, the GPU's work goes slower in
//!   proportion to how many do.
//!
//! Figures from here are modelled, never a GPU's.

mod bench;
mod calibration;
mod chunk;
mod contention;
mod oracle;
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use coexec_kernels::{Chunk, Kernel, KernelError};
use serde::Deserialize;

use crate::broker::admission::{self, Request};
use crate::broker::job::{Claimed, JobCore};
use crate::device::{ClassInfo, DeviceKind, End};
use crate::policy::{Policy, Thresholds, by_name};
use crate::profiler::{Fingerprint, Observe, ProfileStore, Stored};
use crate::{JobOptions, RunReport};

pub(crate) use bench::*;
pub(crate) use calibration::*;
use chunk::Running;

/// Whether run `r` gave items to more than one class.
pub(crate) fn coexecuted(r: &RunReport) -> bool {
    r.classes.iter().filter(|c| c.items > 0).count() > 1
}

/// splitmix64: a small, seedable generator (the tests need no crate for it).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// A log-normal factor of mean 1 and coefficient of variation `cv`.
    pub(crate) fn noise(&mut self, cv: f64) -> f64 {
        if cv <= 0.0 {
            return 1.0;
        }
        let s2 = (1.0 + cv * cv).ln();
        (s2.sqrt() * self.normal() - 0.5 * s2).exp()
    }
}

/// A host memory bus shared by the CPU workers of a memory-bound kernel and
/// the GPU's copies: while both draw from it, both go slower.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bus {
    /// How much slower a CPU chunk runs while a GPU chunk is in its work
    /// phase (its copies).
    pub(crate) cpu_slow: f64,
    /// How much slower the GPU's work runs while every CPU worker runs a
    /// chunk (in proportion for fewer).
    pub(crate) gpu_slow: f64,
}

/// The modelled machine: a CPU class of `cpu.workers` workers and a GPU
/// class of `gpu.streams` streams.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub(crate) cpu: CpuModel,
    pub(crate) gpu: GpuModel,
    /// A host memory bus the two classes share (`None`: they do not slow
    /// each other through it).
    pub(crate) bus: Option<Bus>,
    classes: Arc<[ClassInfo]>,
    worker_class: Arc<[usize]>,
}

/// Class indices.
pub(crate) const CPU: usize = 0;
pub(crate) const GPU: usize = 1;

impl Machine {
    pub(crate) fn new(cpu: CpuModel, gpu: GpuModel) -> Self {
        let classes: Arc<[ClassInfo]> = vec![
            ClassInfo {
                index: CPU,
                name: "cpu".into(),
                profile_key: "cpu".into(),
                kind: DeviceKind::Cpu,
                workers: cpu.workers,
                end: End::Head,
                model: "virtual CPU".into(),
                fill_threads: 0,
            },
            // A simulated unit stands for the GPU: the engine treats it as an
            // accelerator (it eats from the tail, its chunks fill it), and it
            // needs no CUDA twin of the kernel.
            ClassInfo {
                index: GPU,
                name: "gpu".into(),
                profile_key: "gpu".into(),
                kind: DeviceKind::Sim {
                    speed: 1.0,
                    latency: std::time::Duration::ZERO,
                },
                workers: gpu.streams,
                end: End::Tail,
                model: "virtual GPU".into(),
                fill_threads: gpu.capacity_items,
            },
        ]
        .into();
        let worker_class: Arc<[usize]> = std::iter::repeat_n(CPU, cpu.workers)
            .chain(std::iter::repeat_n(GPU, gpu.streams))
            .collect();
        Self {
            cpu,
            gpu,
            bus: None,
            classes,
            worker_class,
        }
    }

    /// The machine of a calibrated workload.
    pub(crate) fn of(w: &Workload) -> Self {
        Self::new(w.cpu.clone(), w.gpu.clone())
    }

    /// Runs `job` to its end in virtual time; its makespan.
    pub(crate) fn simulate(&self, job: &mut JobCore, rng: &mut Rng) -> f64 {
        let nw = self.worker_class.len();
        // When each worker first looks for a chunk: CPU threads wake with a
        // jitter; GPU streams start at once (their wake is in `stage`).
        let mut free_at: Vec<f64> = self
            .worker_class
            .iter()
            .map(|&c| match c {
                CPU => self.wake(rng),
                _ => 0.0,
            })
            .collect();
        // Per stream, whether it has done this run's setup.
        let mut staged = vec![false; nw];
        let mut running: Vec<Option<Running>> = (0..nw).map(|_| None).collect();
        let claimable = job.claimable();
        let slowdown = match self.gpu.coexec_slowdown.len() {
            0 => 1.0,
            n => self.gpu.coexec_slowdown[(rng.next_u64() % n as u64) as usize],
        };
        // The host side of a stream (a run's setup, a chunk's launch and
        // copy latency) competes with the CPU workers whenever the job runs
        // on both classes.
        let host_slow = if claimable[CPU] && claimable[GPU] {
            slowdown
        } else {
            1.0
        };
        let mut now = 0.0;
        let mut steps = 0u64;
        // An idle worker refused by the guard looks again this often (the
        // worker loop's 1 ms wait while a job is live), or at any event.
        const POLL: f64 = 1e-3;
        while !job.is_over() {
            steps += 1;
            assert!(steps < 50_000_000, "virtual job does not end");
            for w in 0..nw {
                if running[w].is_some() || free_at[w] > now {
                    continue;
                }
                let c = self.worker_class[w];
                match job.claim(w, c, now) {
                    Some(ch) => {
                        let first = !std::mem::replace(&mut staged[w], true);
                        running[w] = Some(self.start((w, c), ch, now, first, host_slow, rng))
                    }
                    None => free_at[w] = now + POLL,
                }
            }
            // The next event: a CPU chunk's end, a GPU chunk's latency or
            // work ending at the current sharing, or an idle worker looking.
            let cpu_busy = running.iter().flatten().any(|r| r.cpu);
            // Chunks in their work phase share the device once their threads
            // would occupy more than all of it.
            let occupancy: f64 = running
                .iter()
                .flatten()
                .filter(|r| r.gpu_work(now))
                .map(|r| {
                    (r.claimed.info.range.len() as f64 / self.gpu.capacity_items as f64).min(1.0)
                })
                .sum();
            let mut sharing = occupancy.max(1.0) * if cpu_busy { slowdown } else { 1.0 };
            // The bus: the GPU's copies slow with the share of CPU workers
            // drawing from it, the CPU's chunks while the GPU copies.
            let mut cpu_sharing = 1.0;
            if let Some(bus) = self.bus {
                let cpu_running = running.iter().flatten().filter(|r| r.cpu).count();
                let busy = cpu_running as f64 / self.cpu.workers.max(1) as f64;
                sharing *= 1.0 + (bus.gpu_slow - 1.0) * busy;
                if occupancy > 0.0 {
                    cpu_sharing = bus.cpu_slow;
                }
            }
            let mut next = f64::INFINITY;
            for (w, r) in running.iter().enumerate() {
                match r {
                    Some(r) => next = next.min(r.next_event(now, sharing, cpu_sharing)),
                    None if claimable[self.worker_class[w]] => next = next.min(free_at[w].max(now)),
                    None => {}
                }
            }
            assert!(next.is_finite(), "nothing runs and the job is not over");
            // Advance every chunk's work at the sharing that held until now.
            for r in running.iter_mut().flatten() {
                r.advance(now, next, sharing, cpu_sharing);
            }
            now = next;
            for w in 0..nw {
                let done = running[w].as_ref().is_some_and(|r| r.done(now));
                if done {
                    let r = running[w].take().expect("checked above");
                    let c = self.worker_class[w];
                    let after = job.complete(w, c, &r.claimed.info, r.start, now);
                    // A ring wakes the idle workers of the job, each after a
                    // thread's wake-up (drawn like a run's start).
                    if after.wake {
                        for (v, f) in free_at.iter_mut().enumerate() {
                            if running[v].is_none() && v != w {
                                *f = f.min(now + self.wake(rng));
                            }
                        }
                    }
                    free_at[w] = now;
                }
            }
        }
        now
    }

    /// How long a sleeping worker thread takes to look once woken: the
    /// lease's CPU workers' first start in a run, and its spread.
    fn wake(&self, rng: &mut Rng) -> f64 {
        (self.cpu.start_s + self.cpu.start_spread_s * rng.normal()).max(0.0)
    }

    /// Worker `w` of class `c` starts `claimed` at `now` (`first`: its
    /// first chunk of the run), its host side slowed `host_slow` times.
    fn start(
        &self,
        (w, c): (usize, usize),
        claimed: Claimed,
        now: f64,
        first: bool,
        host_slow: f64,
        rng: &mut Rng,
    ) -> Running {
        let n = claimed.info.range.len() as f64;
        if c == CPU {
            let own = self.cpu.worker_factors.get(w).copied().unwrap_or(1.0);
            let d = (self.cpu.a_s + n / self.cpu.b_per_worker) * own * rng.noise(self.cpu.noise_cv);
            return Running {
                claimed,
                start: now,
                latency_until: now,
                work_left: d,
                cpu: true,
            };
        }
        // A stream's first chunk of a run waits for the run's setup; like the
        // worker loop, the chunk's own time starts after it.
        let mut start = now;
        if first {
            start += self.gpu.stage_s * rng.noise(self.gpu.noise_cv) * host_slow;
        }
        let noise = rng.noise(self.gpu.noise_cv);
        let work = n.max(self.gpu.min_work_items as f64) / self.gpu.device_items_per_s;
        Running {
            claimed,
            start,
            latency_until: start + self.gpu.a_s * noise * host_slow,
            work_left: work * noise,
            cpu: false,
        }
    }

    /// One job of `items` items under `opts`, admitted from `store` as the
    /// broker admits it, simulated, and learned from as the profiler learns:
    /// its report.
    pub(crate) fn run(&self, ctx: &mut Series, opts: &JobOptions, items: usize) -> RunReport {
        let kernel: Arc<dyn Kernel> = Arc::new(Virtual {
            name: ctx.name.clone(),
            items,
        });
        let keys: Vec<String> = self.classes.iter().map(|c| c.profile_key.clone()).collect();
        let key = kernel.profile_key();
        ctx.seen += 1;
        // The lease's method had no warm start and no single-class rule; its
        // plans and guard knew nothing of when a class starts, its guard
        // counted idle and refusing workers as available, and its tail
        // chunks kept the latency floor.
        let lease = !ctx.thresholds.single_class && !ctx.thresholds.warm_start;
        let mut models = ctx.store.models(&key, &keys);
        if lease {
            models = models.into_iter().map(|m| m.with_start(0.0)).collect();
        }
        let stored = Stored {
            models,
            split: ctx.store.split(&key, &keys),
            history: ctx.store.history(&key),
        };
        let admitted = admission::admit(Request {
            kernel: &*kernel,
            opts,
            default_policy: &*ctx.default_policy,
            classes: &self.classes,
            in_service: self.classes.iter().map(|c| c.workers).collect(),
            stored,
            thresholds: ctx.thresholds,
            seen: ctx.seen,
            trace: ctx.trace,
        });
        let mut job = JobCore::new(
            kernel,
            admitted,
            self.classes.clone(),
            self.worker_class.clone(),
        );
        self.simulate(&mut job, &mut ctx.rng);
        let report = job.report().expect("a virtual job does not fail");
        Observe::of(key, keys, &report, job.samples()).apply(
            &mut ctx.store,
            ctx.thresholds.mu,
            ctx.thresholds.nu,
        );
        report
    }

    /// `runs` runs of `items` items under `opts`: the job's time (the sum of
    /// its runs' makespans, as `coexec bench` counts it) and its reports.
    pub(crate) fn job(
        &self,
        ctx: &mut Series,
        opts: &JobOptions,
        items: usize,
        runs: usize,
    ) -> (f64, Vec<RunReport>) {
        let reports: Vec<RunReport> = (0..runs).map(|_| self.run(ctx, opts, items)).collect();
        (reports.iter().map(|r| r.makespan_s).sum(), reports)
    }

    pub(crate) fn classes(&self) -> &[ClassInfo] {
        &self.classes
    }

    /// The machine of a calibrated workload, its CPU throughput and GPU rate
    /// fitted so that each class alone takes the measured time under the
    /// lease's settings ([`lease_thresholds`]; the calibration's first
    /// guesses ignore the engine's chunking and tail).
    pub(crate) fn fitted(w: &Workload) -> Self {
        let mut m = Self::of(w);
        for _ in 0..4 {
            let (cpu, gpu) = m.alone_times(w, 11);
            m.cpu.b_per_worker *= cpu / w.measured.t_cpu_s;
            m.gpu.device_items_per_s *= gpu / w.measured.t_gpu_s;
        }
        m
    }

    /// Each class alone on `w`'s job, warm, under the fit's reference
    /// ([`TracedAlone`]): the median of 3 jobs.
    fn alone_times(&self, w: &Workload, seed: u64) -> (f64, f64) {
        let hybrid: Arc<dyn Policy> = Arc::new(TracedAlone);
        let mut t = [0.0; 2];
        for (c, t) in [CPU, GPU].into_iter().zip(&mut t) {
            let mut s = Series::new(&w.name, seed);
            s.thresholds = lease_thresholds();
            let opts = JobOptions::new().policy(hybrid.clone()).classes([c]);
            self.job(&mut s, &opts, w.items, w.runs);
            let mut v: Vec<f64> = (0..3)
                .map(|_| self.job(&mut s, &opts, w.items, w.runs).0)
                .collect();
            *t = median(&mut v);
        }
        (t[0], t[1])
    }
}

/// The method's settings as on the H100 lease: no warm start, no
/// single-class rule, CPU chunks floored like an accelerator's. (The
/// lease's guard itself is not replayed: the scheduler has one engine.)
pub(crate) fn lease_thresholds() -> Thresholds {
    Thresholds::default()
        .warm_start(false)
        .single_class(false)
        .cpu_latency_chunks(crate::policy::LATENCY_CHUNKS)
}

/// The fit's fixed reference: hybrid with a device alone keeping the
/// thresholds' static fraction (a dynamic tail after its one static chunk
/// a stream), so that how the engine now cuts a device's run alone does not
/// move the fitted rates and engines can be compared on one machine.
struct TracedAlone;

impl Policy for TracedAlone {
    fn name(&self) -> &'static str {
        "hybrid"
    }
    fn describe(&self) -> &'static str {
        "hybrid, a device alone with a dynamic tail"
    }
    fn admit(&self, ctx: &crate::policy::PlanContext<'_>) -> crate::policy::Admission {
        let adm = by_name("hybrid").expect("hybrid exists").admit(ctx);
        let per = adm.static_chunks_per_worker;
        adm.static_part(ctx.thresholds.static_fraction, per)
    }
}

/// A kernel that does nothing: its time is the machine's model.
struct Virtual {
    name: String,
    items: usize,
}

impl Kernel for Virtual {
    fn name(&self) -> &str {
        &self.name
    }
    fn items(&self) -> usize {
        self.items
    }
    fn run_cpu(&self, _: &Chunk) -> Result<(), KernelError> {
        Ok(())
    }
}

/// A fixed split: this share of the items to the CPU, the rest to the GPU,
/// one region each.
#[cfg(test)]
pub(crate) struct Split(pub(crate) f64);

#[cfg(test)]
impl Policy for Split {
    fn name(&self) -> &'static str {
        "split"
    }
    fn describe(&self) -> &'static str {
        "a fixed split"
    }
    fn admit(&self, _: &crate::policy::PlanContext<'_>) -> crate::policy::Admission {
        crate::policy::Admission::split(vec![self.0, 1.0 - self.0])
    }
}
