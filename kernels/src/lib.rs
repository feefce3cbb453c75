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
//! coexec is in this crate.
//!
//! ```
//! use coexec_kernels::{Chunk, Kernel, Synthetic};
//!
//! let k = Synthetic::new(1000, 10);
//! k.run_cpu(&Chunk::new(0..600)).unwrap();
//! k.run_cpu(&Chunk::new(600..1000)).unwrap();
//! k.verify().unwrap();
//! ```
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

mod buf;
mod error;
mod kernel;
pub mod workloads;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "dummy_cuda.rs"]
pub mod cuda;

pub use buf::DisjointBuf;
pub use error::KernelError;
pub use kernel::{Chunk, Kernel};
pub use workloads::{run_sequential, Empty, OneShot, Synthetic, Workload};
