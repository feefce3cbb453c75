//! nbody: all-pairs softened gravity, as NVIDIA cuda-samples' CPU reference
//! (`bodysystemcpu_impl.h`), in f32.
//!
//! Item = one body per step; one run ([`NbodyStep`]) is one time step. A run
//! reads the old positions (shared, read-only) and writes the new position and
//! velocity of its bodies into separate buffers; the host step swaps them.
//!
//! # Operation order (a GPU twin reproduces it bit for bit)
//!
//! For body `i`, `a = (0, 0, 0)`, then for every `j = 0, 1, …, N−1` in order
//! (`j = i` included: `r = 0` adds `+0`):
//!
//! ```text
//! rx = xj − xi;  ry = yj − yi;  rz = zj − zi
//! d2 = ((rx·rx + ry·ry) + rz·rz) + eps²
//! inv = 1 / sqrt(d2)            IEEE sqrt then IEEE division — not rsqrt
//! s  = mj · ((inv·inv)·inv)
//! ax += rx·s;  ay += ry·s;  az += rz·s
//! ```
//!
//! then `v' = (v + a·dt)·damping` and `p' = p + v'·dt`, per component. Every
//! operation is rounded to f32 on its own: no fused multiply-add (a CUDA twin
//! needs `--fmad=false`, `-prec-sqrt=true`, `-prec-div=true` and `sqrtf`, not
//! `rsqrtf`). NVIDIA computes `(float)sqrt((double)d2)`, which equals the f32
//! `sqrt` exactly (double rounding is harmless for square roots). With unit
//! masses NVIDIA's `force·invMass` is the acceleration itself.
//!
//! The CPU kernel walks `j` in order for 8 bodies `i` at once (one lane each),
//! so the compiler vectorises across bodies and each lane keeps the order above.
//!
//! # Initial state
//!
//! NVIDIA's "shell" configuration with `rand()/RAND_MAX` replaced by
//! `u_k = unit(splitmix64(seed ^ (3 << 56) ^ k))` (`k = 0, 1, …`, top 24 bits
//! over 2²⁴): a point `q = (2u−1, 2u−1, 2u−1)` is drawn, rejected when
//! `|q| > 1` or `|q| < 10⁻⁶`, normalised, and scaled per coordinate by
//! `inner + (outer − inner)·u` (`inner = 2.5·1.54`, `outer = 4·1.54`); mass 1;
//! velocity = `(p × axis)·(1.54·8)` with `axis = z`, or `(q.y, q.x, 0)`
//! normalised when `1 − q·z < 10⁻⁶`.

use serde::Serialize;

use super::rng::{stream, unit_f32};
use super::{Workload, check_bytes, check_chunk};
use crate::{Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin};

/// The twin's source: one softened all-pairs step, the CPU's operations in
/// the CPU's order.
const NBODY_CU: CudaSource = CudaSource::new("nbody.cu", include_str!("../cu/nbody.cu"));

/// An N-body problem: `bodies` bodies advanced `steps` time steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NbodyProblem {
    bodies: usize,
    steps: usize,
    seed: u64,
    dt: f32,
    eps2: f32,
    damping: f32,
}

impl NbodyProblem {
    /// NVIDIA's demo time step.
    pub const DT: f32 = 0.016;
    /// NVIDIA's softening squared (`0.1²`).
    pub const EPS2: f32 = 0.01;
    /// NVIDIA's damping.
    pub const DAMPING: f32 = 1.0;
    /// The default seed of the initial state.
    pub const DEFAULT_SEED: u64 = 0x006e_626f_6479;
    /// The most bodies accepted (the all-pairs cost grows with its square).
    pub const MAX_BODIES: usize = 1 << 26;

    /// `bodies` bodies for `steps` steps. Refuses zero sizes and more than
    /// [`NbodyProblem::MAX_BODIES`] bodies.
    pub fn new(bodies: usize, steps: usize) -> Result<Self, KernelError> {
        check_bytes("nbody size", &[bodies, steps], 1)?;
        if bodies > Self::MAX_BODIES {
            return Err(KernelError::invalid(
                "nbody bodies",
                format!("{bodies} exceeds {}", Self::MAX_BODIES),
            ));
        }
        Ok(Self {
            bodies,
            steps,
            seed: Self::DEFAULT_SEED,
            dt: Self::DT,
            eps2: Self::EPS2,
            damping: Self::DAMPING,
        })
    }

    /// The same problem from another initial state.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// Bodies (items per step).
    pub fn bodies(&self) -> usize {
        self.bodies
    }

    /// Time steps (runs).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Body–body interactions of the whole job (`N²` per step).
    pub fn interactions(&self) -> f64 {
        (self.bodies as f64).powi(2) * self.steps as f64
    }
}

/// Positions, masses and velocities, structure of arrays.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Bodies {
    /// x coordinates.
    pub x: Vec<f32>,
    /// y coordinates.
    pub y: Vec<f32>,
    /// z coordinates.
    pub z: Vec<f32>,
    /// Masses.
    pub m: Vec<f32>,
    /// x velocities.
    pub vx: Vec<f32>,
    /// y velocities.
    pub vy: Vec<f32>,
    /// z velocities.
    pub vz: Vec<f32>,
}

impl Bodies {
    /// The "shell" initial state of `n` bodies from `seed` (module docs),
    /// generated on every core and equal bit for bit to drawing `u_k` one
    /// after the other. The draws come in triples: triple `t` is
    /// `u_{3t}, u_{3t+1}, u_{3t+2}`; a body is an accepted direction triple
    /// followed by its scale triple, and a rejected triple is skipped. Which
    /// triples are accepted depends on each triple alone (computed in
    /// parallel); where bodies start is a cheap scan of those flags; each
    /// body is then computed from its start alone (in parallel).
    pub fn shell(n: usize, seed: u64) -> Self {
        use rayon::prelude::*;
        // Acceptance is the unit ball over the cube, π/6 ≈ 0.52: a body takes
        // 2.9 triples on average; more are flagged if these run out.
        let mut triples = n as u64 * 3 + 1024;
        let starts = loop {
            let accepted: Vec<bool> = (0..triples)
                .into_par_iter()
                .map(|t| shell_direction(seed, t).is_some())
                .collect();
            let mut starts = Vec::with_capacity(n);
            let mut t = 0;
            while starts.len() < n && t < accepted.len() {
                if accepted[t] {
                    starts.push(t as u64);
                    t += 2;
                } else {
                    t += 1;
                }
            }
            if starts.len() == n {
                break starts;
            }
            triples *= 2;
        };
        let rows: Vec<[f32; 6]> = starts.par_iter().map(|&t| shell_body(seed, t)).collect();
        let col = |c: usize| rows.iter().map(|r| r[c]).collect::<Vec<f32>>();
        Bodies {
            x: col(0),
            y: col(1),
            z: col(2),
            m: vec![1.0; n],
            vx: col(3),
            vy: col(4),
            vz: col(5),
        }
    }

    /// Number of bodies.
    pub fn len(&self) -> usize {
        self.x.len()
    }

    /// Whether there is no body.
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }
}

/// The draw `u_k` of the shell state.
fn shell_u(seed: u64, k: u64) -> f32 {
    unit_f32(stream(seed, 3, k))
}

/// Triple `t` as a body's direction: `q` normalised, or `None` where the
/// shell rejects it (`|q| > 1` or `|q| < 10⁻⁶`).
fn shell_direction(seed: u64, t: u64) -> Option<[f32; 3]> {
    let u = |i: u64| shell_u(seed, 3 * t + i);
    let q = [u(0) * 2.0 - 1.0, u(1) * 2.0 - 1.0, u(2) * 2.0 - 1.0];
    let len = (q[0] * q[0] + q[1] * q[1] + q[2] * q[2]).sqrt();
    if !(1e-6..=1.0).contains(&len) {
        return None;
    }
    Some([q[0] / len, q[1] / len, q[2] / len])
}

/// The body whose direction is triple `t` (accepted) and scale triple
/// `t + 1`: position and velocity, `[x, y, z, vx, vy, vz]`.
fn shell_body(seed: u64, t: u64) -> [f32; 6] {
    let scale = 1.54f32;
    let vscale = scale * 8.0;
    let (inner, outer) = (2.5 * scale, 4.0 * scale);
    let q = shell_direction(seed, t).unwrap_or([0.0, 0.0, 1.0]);
    let u = |i: u64| shell_u(seed, 3 * (t + 1) + i);
    let p = [
        q[0] * (inner + (outer - inner) * u(0)),
        q[1] * (inner + (outer - inner) * u(1)),
        q[2] * (inner + (outer - inner) * u(2)),
    ];
    let mut axis = [0.0f32, 0.0, 1.0];
    if 1.0 - q[2] < 1e-6 {
        let l = (q[1] * q[1] + q[0] * q[0]).sqrt().max(f32::MIN_POSITIVE);
        axis = [q[1] / l, q[0] / l, 0.0];
    }
    let v = [
        p[1] * axis[2] - p[2] * axis[1],
        p[2] * axis[0] - p[0] * axis[2],
        p[0] * axis[1] - p[1] * axis[0],
    ];
    [
        p[0],
        p[1],
        p[2],
        v[0] * vscale,
        v[1] * vscale,
        v[2] * vscale,
    ]
}

/// Bodies computed per pass over `j`.
const LANES: usize = 8;

/// One time step: new positions and velocities from the old state.
#[derive(Debug)]
pub struct NbodyStep {
    /// Unique in the process: names `old`, which never changes while the
    /// step lives, on a GPU.
    id: u64,
    problem: NbodyProblem,
    old: Bodies,
    new_pos: [DisjointBuf<f32>; 3],
    new_vel: [DisjointBuf<f32>; 3],
}

impl NbodyStep {
    /// This step's process-unique id.
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The state before this step (read by every chunk).
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn old(&self) -> &Bodies {
        &self.old
    }

    /// `(dt, eps², damping)`.
    pub(crate) fn params(&self) -> (f32, f32, f32) {
        (self.problem.dt, self.problem.eps2, self.problem.damping)
    }
}

/// The GPU twin, declared: every chunk reads all old positions and masses
/// (uploaded once per run and device) and its own old velocities, and
/// writes its new positions and velocities. Blocks of 256: the source's
/// shared-memory tile.
impl GpuTwin for NbodyStep {
    fn twin(&self) -> Twin<'_> {
        let (o, id) = (&self.old, self.id);
        let (dt, eps2, damping) = self.params();
        let [px, py, pz] = &self.new_pos;
        let [vx, vy, vz] = &self.new_vel;
        Twin::new(&NBODY_CU, "nbody")
            .block_size(256)
            .run_slice(id, &o.x)
            .run_slice(id, &o.y)
            .run_slice(id, &o.z)
            .run_slice(id, &o.m)
            .item_slice(&o.vx, 1)
            .item_slice(&o.vy, 1)
            .item_slice(&o.vz, 1)
            .output(px)
            .output(py)
            .output(pz)
            .output(vx)
            .output(vy)
            .output(vz)
            .scalar(u32::try_from(o.x.len()).unwrap_or(u32::MAX))
            .scalar(dt)
            .scalar(eps2)
            .scalar(damping)
    }
}

impl Kernel for NbodyStep {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "nbody"
    }

    fn items(&self) -> usize {
        self.problem.bodies
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        if chunk.is_empty() {
            return Ok(());
        }
        let (dt, eps2, damping) = self.params();
        let o = &self.old;
        // The chunk unlocks one slice of each of the six buffers.
        let (px, py, pz) = (
            self.new_pos[0].chunk_mut(chunk),
            self.new_pos[1].chunk_mut(chunk),
            self.new_pos[2].chunk_mut(chunk),
        );
        let (vx, vy, vz) = (
            self.new_vel[0].chunk_mut(chunk),
            self.new_vel[1].chunk_mut(chunk),
            self.new_vel[2].chunk_mut(chunk),
        );
        let last = chunk.hi() - 1;
        let mut g = chunk.lo();
        while g < chunk.hi() {
            // Lanes past the chunk repeat its last body and are not stored.
            let idx: [usize; LANES] = std::array::from_fn(|l| (g + l).min(last));
            let xi = idx.map(|i| o.x[i]);
            let yi = idx.map(|i| o.y[i]);
            let zi = idx.map(|i| o.z[i]);
            let (mut ax, mut ay, mut az) = ([0.0f32; LANES], [0.0f32; LANES], [0.0f32; LANES]);
            for (((&xj, &yj), &zj), &mj) in o.x.iter().zip(&o.y).zip(&o.z).zip(&o.m) {
                for l in 0..LANES {
                    let rx = xj - xi[l];
                    let ry = yj - yi[l];
                    let rz = zj - zi[l];
                    let d2 = rx * rx + ry * ry + rz * rz + eps2;
                    let inv = 1.0 / d2.sqrt();
                    let s = mj * (inv * inv * inv);
                    ax[l] += rx * s;
                    ay[l] += ry * s;
                    az[l] += rz * s;
                }
            }
            for l in 0..LANES.min(chunk.hi() - g) {
                let (i, k) = (g + l, g + l - chunk.lo());
                let nvx = (o.vx[i] + ax[l] * dt) * damping;
                let nvy = (o.vy[i] + ay[l] * dt) * damping;
                let nvz = (o.vz[i] + az[l] * dt) * damping;
                vx[k] = nvx;
                vy[k] = nvy;
                vz[k] = nvz;
                px[k] = o.x[i] + nvx * dt;
                py[k] = o.y[i] + nvy * dt;
                pz[k] = o.z[i] + nvz * dt;
            }
            g += LANES;
        }
        Ok(())
    }
}

/// The final state of an N-body job.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct NbodyResult {
    /// The problem.
    pub problem: NbodyProblem,
    /// The bodies after the last step.
    #[serde(skip)]
    pub bodies: Bodies,
}

/// nbody as a [`Workload`]: one run per time step; the host step swaps the
/// old and new state buffers.
#[derive(Debug)]
pub struct NbodyJob {
    problem: NbodyProblem,
    done_steps: usize,
    state: Option<Bodies>,
    spare: Option<[Vec<f32>; 6]>,
}

impl NbodyJob {
    /// A job from the shell initial state of `problem`.
    pub fn new(problem: NbodyProblem) -> Result<Self, KernelError> {
        Self::from_bodies(problem, Bodies::shell(problem.bodies, problem.seed))
    }

    /// A job from a given state; its length must be `problem.bodies()`.
    pub fn from_bodies(problem: NbodyProblem, bodies: Bodies) -> Result<Self, KernelError> {
        let n = problem.bodies;
        let b = &bodies;
        if [&b.x, &b.y, &b.z, &b.m, &b.vx, &b.vy, &b.vz]
            .iter()
            .any(|v| v.len() != n)
        {
            return Err(KernelError::invalid(
                "nbody bodies",
                format!("every array must hold {n} bodies"),
            ));
        }
        Ok(Self {
            problem,
            done_steps: 0,
            state: Some(bodies),
            spare: Some(std::array::from_fn(|_| vec![0.0; n])),
        })
    }
}

impl Workload for NbodyJob {
    type Step = NbodyStep;
    type Output = NbodyResult;

    fn next_step(&mut self) -> Result<Option<NbodyStep>, KernelError> {
        if self.done_steps >= self.problem.steps {
            return Ok(None);
        }
        let (Some(old), Some(spare)) = (self.state.take(), self.spare.take()) else {
            return Err(KernelError::invalid(
                "nbody step",
                "the previous step was not absorbed",
            ));
        };
        let [a, b, c, d, e, f] = spare.map(|v| DisjointBuf::from_vec(v, 1));
        Ok(Some(NbodyStep {
            id: crate::claim::next_id(),
            problem: self.problem,
            old,
            new_pos: [a, b, c],
            new_vel: [d, e, f],
        }))
    }

    fn absorb(&mut self, step: NbodyStep) -> Result<(), KernelError> {
        if self.state.is_some() || step.problem != self.problem {
            return Err(KernelError::invalid(
                "nbody step",
                "not this job's current step",
            ));
        }
        let [x, y, z] = step.new_pos.map(DisjointBuf::into_vec);
        let [vx, vy, vz] = step.new_vel.map(DisjointBuf::into_vec);
        let old = step.old;
        self.spare = Some([old.x, old.y, old.z, old.vx, old.vy, old.vz]);
        self.state = Some(Bodies {
            x,
            y,
            z,
            m: old.m,
            vx,
            vy,
            vz,
        });
        self.done_steps += 1;
        Ok(())
    }

    fn finish(self) -> NbodyResult {
        NbodyResult {
            problem: self.problem,
            bodies: self.state.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests;
