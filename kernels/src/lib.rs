//! What runs on a device.
//!
//! ```text
//!   Kernel (items 0..n)                       one trait, one name per operation
//!     ├─ run_cpu(chunk)      always compiled  any CPU thread, disjoint outputs
//!     ├─ run_modeled(chunk)  optional         the `sim` device's shortcut
//!     └─ cuda() → CudaKernel feature "cuda"   NVRTC-compiled .cu twin
//! ```
//!
//! The kernel contract ([`Kernel`], [`Chunk`], [`DisjointBuf`], [`GpuTwin`],
//! [`Workload`]) and the scheduler's test kernels ([`Synthetic`], [`Empty`])
//! are always built. The method paper's four benchmarks (matmul, kmeans,
//! pathfinder, nbody) and the MLP live in `workloads`, behind the
//! `workloads` feature (off by default) with the crates only they need
//! (safetensors, gemm, xz2, …). All `unsafe` code and every CUDA call of
//! coexec is in this crate. Kernels need no `unsafe`: a [`Chunk`] (a claim
//! on a job's items, refused where it would overlap a live one) unlocks the
//! outputs of exactly its items ([`DisjointBuf::chunk_mut`]).
//!
//! ```
//! use coexec_kernels::{with_chunk, Kernel, Synthetic};
//!
//! let mut k = Synthetic::new(1000, 10);
//! with_chunk(&mut k, 0..600, |k, c| k.run_cpu(c)).unwrap();
//! with_chunk(&mut k, 600..1000, |k, c| k.run_cpu(c)).unwrap();
//! k.verify().unwrap();
//! ```
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "workloads")]
pub mod baseline;
mod buf;
mod claim;
mod error;
mod file;
mod kernel;
#[cfg(feature = "bert")]
pub mod ops;
#[cfg(any(feature = "workloads", feature = "bert"))]
pub mod tensors;
mod twin;
mod workload;
#[cfg(feature = "workloads")]
pub mod workloads;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "dummy_cuda.rs"]
pub mod cuda;

pub use buf::DisjointBuf;
pub use claim::{Chunk, ClaimSpace, claim_parts, with_chunk};
pub use error::KernelError;
pub use file::{open_regular, read_file};
pub use kernel::Kernel;
pub use twin::{CudaSource, DeviceCopy, GpuTwin, Twin, TwinInput};
pub use workload::{
    Empty, OneShot, Synthetic, Workload, busy_ns_per_round, check_bytes, check_chunk, memory_limit,
    run_sequential, try_zeroed,
};
