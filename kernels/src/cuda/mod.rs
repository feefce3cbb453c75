//! The CUDA device class, through cudarc (driver API + NVRTC, both opened at
//! run time).
//!
//! ```text
//!   devices()                     every visible GPU (CUDA_VISIBLE_DEVICES applies)
//!   StreamWorker::new(dev, s)     one CUDA stream, its pinned staging and device buffers
//!     │   shares, per device and process:
//!     ├─ the device's primary context, set to blocking sync (waiting threads sleep)
//!     ├─ the NVRTC-compiled modules of `src/cu/*.cu` (compiled once per arch and mode)
//!     └─ the run cache: inputs every chunk of a run reads (uploaded once per run)
//!   StreamWorker::begin_run(kernel)   once per run and stream, untimed
//!     run inputs to the run cache; the kernel's large buffers page-locked
//!     (once per buffer, for as long as it lives)
//!   StreamWorker::run(kernel, chunk)
//!     async copy in (DMA straight from page-locked buffers, else staged)
//!     → kernel → watched wait → async copy out → results in the kernel's
//!     host outputs
//! ```
//!
//! Several workers on one device overlap: each runs on its own host thread and
//! stream, so one stream's copies run under another's kernel.
//!
//! Large kernel buffers are page-locked by default;
//! [`StreamWorker::set_host_pinning`] chooses otherwise per stream
//! ([`HostPinning`]: none, or only those a job keeps across its runs; the
//! runtime's builder sets it for its streams), with the same results bit
//! for bit, and [`host_pin_stats`] tells what locking cost. (The `coexec`
//! CLI reads the choice from `COEXEC_CUDA_PIN`.)
//!
//! Nothing here assumes a GPU exists. Before the first driver call the driver
//! library's presence is checked (cudarc panics on a missing library, so a
//! panic from it is caught too) and every entry point answers
//! [`KernelError::CudaUnavailable`] on a machine without CUDA.
//!
//! ```
//! match coexec_kernels::cuda::devices() {
//!     Ok(gpus) => println!("{} GPU(s)", gpus.len()),
//!     Err(e) => println!("no GPU: {e}"),
//! }
//! ```

#[cfg(feature = "bert")]
pub mod bert;
#[cfg(any(feature = "workloads", feature = "bert"))]
mod blas;
mod driver;
mod nvrtc;
mod pin;
mod stream;
mod synthetic;
mod twin;
#[cfg(feature = "workloads")]
mod workloads;

use std::panic::AssertUnwindSafe;

use crate::{Chunk, KernelError};

#[cfg(feature = "workloads")]
use synthetic::{MAX_LAUNCH, too_large};

pub(crate) use pin::HostPin;
pub use pin::{HostPinStats, HostPinning, host_pin_stats};
pub use stream::StreamWorker;

/// A GPU as `coexec devices` lists it.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct GpuInfo {
    /// Ordinal among the visible devices.
    pub id: usize,
    /// Marketing name.
    pub name: String,
    /// Global memory in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

/// The visible GPUs, in ordinal order.
///
/// `Err(CudaUnavailable)` when no CUDA driver library is installed; an empty
/// list when the driver is there but sees no device (`CUDA_VISIBLE_DEVICES=`).
/// Creates no context, so it is cheap and leaves the devices untouched.
pub fn devices() -> Result<Vec<GpuInfo>, KernelError> {
    let Some(count) = driver::device_count()? else {
        return Ok(Vec::new());
    };
    (0..count).map(driver::info).collect()
}

/// The GPU twin of a kernel.
///
/// Implementations stage the chunk's inputs through the worker, launch, copy
/// back and write the chunk's host outputs; inputs the same for every chunk of
/// a run go through the worker's run cache so they cross the bus once per run
/// and device, not once per chunk.
pub trait CudaKernel: Send + Sync {
    /// Runs the items of `chunk` on `worker`'s stream and returns once their
    /// results are in the kernel's host outputs.
    fn run_cuda(&self, worker: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError>;

    /// Compiles what [`CudaKernel::run_cuda`] launches, ahead of the first
    /// chunk (compiled code is cached per device for the process), and
    /// reserves the stream's buffers at their working size, so that neither
    /// lands in a chunk's time.
    fn prepare(&self, worker: &mut StreamWorker) -> Result<(), KernelError> {
        let _ = worker;
        Ok(())
    }

    /// Uploads what every chunk of this run reads (through the run cache),
    /// before the run's first chunk on this stream: called once per run and
    /// stream by [`StreamWorker::begin_run`]. A once-per-run upload timed
    /// inside a small first chunk would teach the speed model that the GPU
    /// is thousands of times slower than it is.
    fn stage(&self, worker: &mut StreamWorker) -> Result<(), KernelError> {
        let _ = worker;
        Ok(())
    }

    /// GPU threads one item occupies. A chunk needs about
    /// `fill threads / threads_per_item` items to keep every SM busy; the
    /// runtime gives a GPU no smaller chunk (a smaller one measures launch
    /// latency, not throughput).
    fn threads_per_item(&self) -> usize {
        1
    }
}

/// Resident threads that keep a GPU's SMs busy enough to run at full
/// throughput: half of the 2048 each SM can hold (Volta to Hopper).
pub fn fill_threads(info: &GpuInfo) -> usize {
    info.sm_count as usize * 1024
}

/// Runs `f`, turning a panic inside cudarc (a library or symbol it could not
/// load) into an error instead of unwinding through the caller.
fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R, KernelError>) -> Result<R, KernelError> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(KernelError::CudaUnavailable(format!(
            "{what}: {}",
            crate::error::panic_message(&*payload)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a GPU driver this must be an error, not a panic;
    /// on a machine with one, every listed device must be described.
    #[test]
    fn devices_answers_without_panicking() {
        match devices() {
            Err(KernelError::CudaUnavailable(why)) => {
                eprintln!("no CUDA here: {why}");
                assert!(!why.is_empty());
            }
            Err(e) => panic!("unexpected error kind: {e}"),
            Ok(gpus) => {
                for (i, g) in gpus.iter().enumerate() {
                    assert_eq!(g.id, i);
                    assert!(g.sm_count > 0 && g.memory_bytes > 0, "{g:?}");
                }
            }
        }
    }

    #[test]
    fn without_libcuda_the_answer_names_the_driver() {
        if driver::libcuda_present() {
            // With a driver the answer must not blame a missing one.
            if let Err(KernelError::CudaUnavailable(why)) = devices() {
                assert_ne!(why, "no CUDA driver (libcuda) found");
            }
            return;
        }
        match devices() {
            Err(KernelError::CudaUnavailable(why)) => {
                assert_eq!(why, "no CUDA driver (libcuda) found");
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
        match StreamWorker::new(0, 0) {
            Err(KernelError::CudaUnavailable(_)) => {}
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn guarded_turns_panics_into_errors() {
        let r: Result<(), _> = guarded("loading", || panic!("Missing symbol cuFoo"));
        match r {
            Err(KernelError::CudaUnavailable(m)) => assert!(m.contains("cuFoo"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
