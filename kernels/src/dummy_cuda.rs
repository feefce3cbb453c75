//! Stand-in for the `cuda` module when the `cuda` feature is off: the same
//! names, and every constructor answers [`KernelError::CudaUnavailable`].

use crate::{Chunk, KernelError};

const OFF: &str = "coexec was built without the `cuda` feature";

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

/// The visible GPUs; always an error in this build.
pub fn devices() -> Result<Vec<GpuInfo>, KernelError> {
    Err(KernelError::CudaUnavailable(OFF.into()))
}

/// Which kernel buffers stream workers page-lock (the same choices as with
/// CUDA; nothing is locked in this build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HostPinning {
    /// Nothing.
    Off,
    /// The buffers a job keeps across its runs.
    Reused,
    /// Every large buffer.
    #[default]
    All,
}

impl std::str::FromStr for HostPinning {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Ok(Self::Off),
            "reused" | "on" | "1" | "true" | "yes" => Ok(Self::Reused),
            "all" => Ok(Self::All),
            other => Err(format!(
                "`{other}` is not one of off, reused, all (page-locking kernel buffers)"
            )),
        }
    }
}

/// What page-locking kernel buffers has cost: nothing in this build.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[non_exhaustive]
pub struct HostPinStats {
    /// Buffers page-locked.
    pub locked: u64,
    /// Their bytes.
    pub locked_bytes: u64,
    /// Seconds spent locking them.
    pub lock_secs: f64,
    /// Seconds spent unlocking them.
    pub unlock_secs: f64,
    /// Buffers the driver refused to lock.
    pub refused: u64,
    /// Why the last one was refused.
    pub last_refusal: Option<String>,
}

/// All zero in this build.
pub fn host_pin_stats() -> HostPinStats {
    HostPinStats::default()
}

/// A buffer's page-lock slot: never locked in this build.
#[derive(Debug, Default)]
pub(crate) struct HostPin {
    _never_locked: (),
}

impl HostPin {
    /// Nothing to unlock.
    pub(crate) fn release(&mut self) -> bool {
        true
    }
}

/// One CUDA stream and its buffers, driven by one worker thread.
#[derive(Debug)]
pub struct StreamWorker {
    never: std::convert::Infallible,
}

impl StreamWorker {
    /// Always [`KernelError::CudaUnavailable`] in this build.
    pub fn new(_device: usize, _stream: usize) -> Result<Self, KernelError> {
        Err(KernelError::CudaUnavailable(OFF.into()))
    }

    /// Runs `chunk` of `kernel` on this stream (unreachable: no value exists).
    pub fn run(&mut self, _kernel: &dyn CudaKernel, _chunk: &Chunk) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Compiles what `kernel` launches (unreachable: no value exists).
    pub fn prepare(&mut self, _kernel: &dyn CudaKernel) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Starts a run of `kernel` on this stream (unreachable: no value exists).
    pub fn begin_run(&mut self, _kernel: &dyn CudaKernel) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Lets the runtime take back this stream's chunk (unreachable: no
    /// value exists).
    pub fn watch_take_back(
        &mut self,
        _flags: std::sync::Arc<[std::sync::atomic::AtomicBool]>,
        _index: usize,
    ) {
        match self.never {}
    }

    /// Waits for a taken-back chunk's work (unreachable: no value exists).
    pub fn wait_idle(&mut self) {
        match self.never {}
    }

    /// Chooses this stream's copy path (unreachable: no value exists).
    pub fn set_host_pinning(&mut self, _choice: HostPinning) {
        match self.never {}
    }

    /// Chooses this stream's math mode (unreachable: no value exists).
    pub fn set_deterministic(&mut self, _on: bool) {
        match self.never {}
    }

    /// The device's ordinal (unreachable).
    pub fn device(&self) -> usize {
        match self.never {}
    }

    /// This worker's index on its device (unreachable).
    pub fn stream_index(&self) -> usize {
        match self.never {}
    }

    /// What the device is (unreachable).
    pub fn info(&self) -> &GpuInfo {
        match self.never {}
    }
}

/// The GPU twin of a kernel.
pub trait CudaKernel: Send + Sync {
    /// Runs the items of `chunk` on `worker`'s stream and returns once their
    /// results are in the kernel's host outputs.
    fn run_cuda(&self, worker: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError>;

    /// Compiles what [`CudaKernel::run_cuda`] launches, ahead of the first
    /// chunk (compiled code is cached per device for the process).
    fn prepare(&self, worker: &mut StreamWorker) -> Result<(), KernelError> {
        let _ = worker;
        Ok(())
    }

    /// Uploads what every chunk of a run reads, before its first chunk.
    fn stage(&self, worker: &mut StreamWorker) -> Result<(), KernelError> {
        let _ = worker;
        Ok(())
    }

    /// GPU threads one item occupies.
    fn threads_per_item(&self) -> usize {
        1
    }
}

/// Resident threads that keep a GPU's SMs busy.
pub fn fill_threads(info: &GpuInfo) -> usize {
    info.sm_count as usize * 1024
}

/// The kernels that have a GPU twin in the `cuda` build implement the trait
/// here too, so `Kernel::cuda` can answer `Some(self)` in every build (no
/// worker exists to call it with).
macro_rules! no_twin {
    ($($t:ty),* $(,)?) => {$(
        impl CudaKernel for $t {
            fn run_cuda(&self, worker: &mut StreamWorker, _chunk: &Chunk) -> Result<(), KernelError> {
                match worker.never {}
            }
        }
    )*};
}

no_twin!(crate::Synthetic);
#[cfg(feature = "workloads")]
no_twin!(
    crate::workloads::Matmul,
    crate::workloads::PathfinderStep,
    crate::workloads::Mlp,
);

/// A declared twin is a CUDA kernel; nothing runs it in this build.
impl<K: crate::GpuTwin> CudaKernel for K {
    fn run_cuda(&self, worker: &mut StreamWorker, _chunk: &Chunk) -> Result<(), KernelError> {
        match worker.never {}
    }
}
