//! coexec runs data-parallel work on every processor of a machine at once —
//! each CPU core and each GPU stream — and keeps them all busy until the same
//! moment.
//!
//! ```text
//!  your tokio task ──run(kernel)──▶ broker admits, on your thread ──▶ item space [cpu ▶▶ ...... ◀◀ gpu]
//!        ▲                              │ plans from                     ▲ claim/complete (no messages)
//!        │ Done{kernel, report}         ▼                                │
//!        └──────────────────────── profile store ◀── learned by workers: cpu:0 cpu:1 … cuda:0/s0 cuda:0/s1
//!                                  (speed models; the Profiler actor saves its JSON)
//! ```
//!
//! A job is a [`Kernel`](kernels::Kernel) over items `0..n`. The default
//! policy is the queue-based hybrid method: a probe measures each device
//! class, 80% of the items are split by measured speed, and the rest sit in a
//! double-ended queue that CPUs eat from the head and accelerators from the
//! tail until they meet. What the profiler learns is kept per machine, so the
//! next run — in this process or the next — starts balanced.
//!
//! ```
//! use coexec::kernels::Synthetic;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), coexec::Error> {
//! // One CPU worker and a simulated accelerator twice as fast.
//! let rt = coexec::Runtime::builder().devices("cpu:1,sim:1@2")?.in_memory_profiles().start().await?;
//! let mut done = rt.run(Synthetic::new(20_000, 100)).await?;
//! assert!(done.kernel.verify().is_ok());
//! assert_eq!(done.report.classes.iter().map(|c| c.items).sum::<usize>(), 20_000);
//! rt.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! In async code coexec behaves as a tokio user expects: no call blocks an
//! executor thread ([`Runtime::shutdown`] and dropping the runtime wait for
//! coexec's threads on a thread of their own); dropping the future of
//! [`Runtime::run`] cancels the job (see its docs); [`Runtime::builder`] reads
//! no environment variable ([`Builder::from_env`] does); the structs handed
//! back or filled in are `#[non_exhaustive]`, with setters where you fill
//! them ([`JobOptions::new`], [`Thresholds`]).
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod builder;
mod error;
mod host;
mod runtime;
pub mod stream;
pub mod trace;

pub use builder::Builder;
pub use coexec_actors::ActorError;
pub use coexec_actors::bind::Binding;
pub use coexec_actors::policy::Thresholds;
pub use coexec_actors::{
    ChunkRecord, ClassInfo, ClassReport, DeviceKind, DeviceList, DeviceSpec, End, INLINE_MAX,
    JobOptions, JobOrder, Phase, ProbeReport, RunReport,
};
pub use error::{Error, ErrorKind};
pub use runtime::{Done, Runtime};

/// What the profiler keeps per machine ([`Runtime::profile`]): per kernel,
/// a speed model for each device class and the last split.
pub mod profile {
    pub use coexec_actors::perfmodel::{Sample, SpeedModel};
    pub use coexec_actors::profiler::{Fingerprint, KernelProfile, ProfileFile};
}

/// Kernels: the trait, the claim ([`Chunk`](kernels::Chunk)), the output
/// buffer and the workloads.
pub mod kernels {
    pub use coexec_kernels::{
        Chunk, CudaSource, DeviceCopy, DisjointBuf, Empty, GpuTwin, Kernel, KernelError, OneShot,
        Synthetic, Twin, TwinInput, run_sequential, with_chunk,
    };

    /// The built-in workloads: the method's benchmarks and the scheduler's
    /// test kernels (feature `workloads`, off by default).
    #[cfg(feature = "workloads")]
    pub mod workloads {
        pub use coexec_kernels::workloads::{
            Bodies, GlibcRand, KmeansConfig, KmeansData, KmeansJob, KmeansResult, KmeansStep,
            LabeledRows, Matmul, MatmulJob, MatmulProblem, MatmulResult, Mlp, MlpWeights, NbodyJob,
            NbodyProblem, NbodyResult, NbodyStep, PathfinderJob, PathfinderProblem,
            PathfinderResult, PathfinderStep, argmax, busy_ns_per_round, check_bytes, memory_limit,
        };
        pub use coexec_kernels::{Empty, OneShot, Synthetic, Workload, run_sequential};
    }

    /// A kernel's GPU twin ([`Kernel::cuda`]; declare one with
    /// [`GpuTwin`]) and the GPUs.
    pub mod cuda {
        pub use coexec_kernels::cuda::{CudaKernel, GpuInfo, HostPinning, StreamWorker, devices};
    }
}

/// What this machine offers, without starting a runtime: its cores, its
/// GPUs and the device classes coexec makes of them by default.
///
/// ```
/// let (classes, gpus) = coexec::machine::default_classes()?;
/// assert!(classes.iter().any(|c| c.workers > 0));
/// assert!(coexec::machine::cores() >= 1);
/// if let Err(why) = coexec::machine::gpus() {
///     println!("no GPU: {why}");
/// }
/// # let _ = gpus;
/// # Ok::<(), coexec::Error>(())
/// ```
pub mod machine {
    use crate::kernels::cuda::GpuInfo;
    use crate::{ClassInfo, Error};

    /// Logical cores this process may use.
    pub fn cores() -> usize {
        coexec_actors::cores()
    }

    /// The most worker threads one class gets here: 64 per core, at least
    /// 256 (a larger count is capped, with a warning).
    pub fn worker_cap() -> usize {
        coexec_actors::worker_cap()
    }

    /// The GPUs CUDA can see, or why there are none.
    pub fn gpus() -> Result<Vec<GpuInfo>, Error> {
        Ok(coexec_actors::gpus()?)
    }

    /// The device classes of the default devices (every GPU with two
    /// streams, the CPU class on every core but one per GPU) and the GPUs
    /// they use.
    pub fn default_classes() -> Result<(Vec<ClassInfo>, Vec<GpuInfo>), Error> {
        Ok(coexec_actors::resolve(None)?)
    }
}

/// What coexec records through the `metrics` facade, for an application
/// that installs its own recorder: the chunk-duration histogram's buckets
/// (seconds), and the metrics' descriptions (`describe`, for the
/// recorder's `# HELP` lines). `coexec-serve`'s exporter uses both.
pub mod metrics {
    pub use coexec_actors::metrics::{CHUNK_BUCKETS, describe};
}

/// Policies: the built-in ones by name, and the trait to write one.
pub mod policy {
    pub use coexec_actors::policy::{
        Admission, Chunking, ClassSpeed, PlanContext, Policy, Probe, Steal, by_name,
    };

    /// The names of the built-in policies, in the order `coexec policies`
    /// lists them.
    pub fn names() -> impl Iterator<Item = &'static str> {
        coexec_actors::policy::POLICIES.iter().map(|p| p.name())
    }
}

/// The few names most programs need.
pub mod prelude {
    #[doc(no_inline)]
    pub use crate::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
    #[doc(no_inline)]
    pub use crate::{Done, Error, JobOptions, RunReport, Runtime};
}
