//! What runs on a device.
//!
//! ```text
//!   Kernel (items 0..n)                       one trait, one name per operation
//!     ├─ run_cpu(chunk)      always compiled  any CPU thread, disjoint outputs
//!     ├─ run_modeled(chunk)  optional         the `sim` device's shortcut
//!     └─ cuda() → CudaKernel feature "cuda"   NVRTC-compiled .cu twin
//! ```
//!
//! The workloads of the method's paper live in [`workloads`]: [`Synthetic`] and
//! [`Empty`] for testing and measuring the scheduler, and the four benchmarks
//! (matmul, kmeans, pathfinder, nbody). All `unsafe` code and every CUDA call of
//! coexec is in this crate, but for one line: the worker loop of
//! `coexec-actors` mints each [`Chunk`] (the claim on a job's items) with
//! [`Chunk::new_unchecked`]. Kernels need no `unsafe`: a chunk unlocks the
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

pub mod baseline;
mod buf;
mod claim;
mod error;
mod kernel;
mod twin;
pub mod workloads;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "dummy_cuda.rs"]
pub mod cuda;

pub use buf::DisjointBuf;
pub use claim::{claim_parts, with_chunk, Chunk, ClaimSpace};
pub use error::KernelError;
pub use kernel::Kernel;
pub use twin::{CudaSource, DeviceCopy, GpuTwin, Twin, TwinInput};
pub use workloads::{run_sequential, Empty, OneShot, Synthetic, Workload};
