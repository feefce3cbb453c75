//! The workloads: the method's four benchmarks and the MLP (behind the
//! `workloads` feature), with the workload contract and the scheduler's test
//! kernels re-exported from the crate root.
//!
//! Every benchmark is an iterative job — a [`Workload`] — made of kernel runs
//! with a host step between them:
//!
//! ```text
//!   Workload ──next_step()──▶ Step: Kernel ──run_cpu/run_cuda over 0..items──▶
//!      ▲                                                                    │
//!      └──────────────────────── absorb(step) ◀─────────────────────────────┘
//!   finish() ─▶ Output
//! ```
//!
//! | workload | item | steps |
//! | --- | --- | --- |
//! | [`MatmulJob`] | one `dim×dim` product | 1 |
//! | [`KmeansJob`] | one point | until converged (≤ 501) |
//! | [`PathfinderJob`] | one column | `⌈(rows−1)/pyramid⌉` |
//! | [`NbodyJob`] | one body | `steps` |
//! | [`Mlp`] (a kernel, one run per batch) | one input row | 1 |
//!
//! Any executor drives a workload the same way; [`run_sequential`] is the
//! simplest:
//!
//! ```
//! use coexec_kernels::workloads::{run_sequential, MatmulJob, MatmulProblem};
//!
//! let job = MatmulJob::new(MatmulProblem::new(4, 8)?)?;
//! let out = run_sequential(job)?;
//! assert_eq!(out.c.len(), 4 * 8 * 8);
//! # Ok::<(), coexec_kernels::KernelError>(())
//! ```

mod kmeans;
mod matmul;
mod mlp;
mod nbody;
mod pathfinder;
pub(crate) mod rng;

pub use kmeans::{KmeansConfig, KmeansData, KmeansJob, KmeansResult, KmeansStep};
pub use matmul::{Matmul, MatmulJob, MatmulProblem, MatmulResult};
pub use mlp::{LabeledRows, Mlp, MlpWeights, argmax};
pub use nbody::{Bodies, NbodyJob, NbodyProblem, NbodyResult, NbodyStep};
pub use pathfinder::{
    GlibcRand, PathfinderJob, PathfinderProblem, PathfinderResult, PathfinderStep,
};

// The contract, where the workloads and their users have always found it.
pub use crate::workload::{
    Empty, OneShot, Synthetic, Workload, busy_ns_per_round, check_bytes, memory_limit,
    run_sequential,
};

#[cfg(test)]
use crate::workload::testutil;
pub(crate) use crate::workload::{check_chunk, try_zeroed};
