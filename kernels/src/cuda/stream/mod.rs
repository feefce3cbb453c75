//! One CUDA stream and its buffers, and the run cache its device shares.
//!
//! # Host work on the GPU path
//!
//! What the stream's thread does besides waiting, per run and per chunk (a
//! kmeans step is ~1.6 ms on an H100, so 0.2 ms of it is an eighth):
//!
//! | when | work | cost |
//! | --- | --- | --- |
//! | once per buffer | page-lock a kernel's large buffer ([`StreamWorker::pin`]) | driver time per page, [`super::host_pin_stats`] |
//! | per run and stream | find or upload the run's shared inputs ([`StreamWorker::run_input`]) | a lookup by the owner's id: no input is read to tell whether it changed |
//! | per chunk | copy inputs in ([`StreamWorker::upload_from`]) | none on the host when the buffer is page-locked; else a host copy into pinned staging at 7–10 GB/s |
//! | per chunk | one watched wait for the chunk's work ([`StreamWorker::finish_into`]) | a host function and a wake-up |
//! | per chunk | copy outputs out | page-locked: enqueued after the wait, then a second (short, unwatched) wait; else enqueued before it, then a host copy out of staging |
//!
//! Nothing is shared between the streams of a device while a chunk runs:
//! each has its own staging and device buffers, its copies are
//! asynchronous, and its waits are for its own stream only, so one stream's
//! copies run under another's kernel.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PinnedHostSlice, sys,
};

#[cfg(any(feature = "workloads", feature = "bert"))]
use super::blas::Blas;
use super::driver::{self, Device, error_for};
use super::nvrtc::Program;
use super::pin::{HostPin, Lock, PIN_MIN_BYTES};
use super::{CudaKernel, GpuInfo, guarded};
use crate::buf::Pinnable;
use crate::error::panic_message;
use crate::{Chunk, KernelError};

#[cfg(any(feature = "workloads", feature = "bert"))]
mod blas;
mod fit;
mod memory;
mod run_cache;

pub(crate) use memory::Out;
use memory::Slot;
pub(crate) use run_cache::RunCache;
use run_cache::RunKey;

/// A device address as a kernel argument (`const float*`, ...).
pub(crate) type DevPtr = u64;

/// One CUDA stream and its buffers, driven by one worker thread.
///
/// Buffers are kept between chunks and grow on demand: device memory, and
/// pinned host staging for copies from and to kernel buffers that are not
/// page-locked, one pair per slot a kernel asks for. Large kernel buffers
/// are page-locked once (in [`StreamWorker::begin_run`]) and copied straight
/// from and to. Inputs that are the same for every chunk of a run come from the
/// device's shared run cache, uploaded once per run.
pub struct StreamWorker {
    /// cuBLAS on this stream, opened by the first kernel that asks (first
    /// field: dropped before the stream it works on).
    #[cfg(any(feature = "workloads", feature = "bert"))]
    blas: Option<Blas>,
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
    index: usize,
    slots: Vec<Slot>,
    /// Items of the chunk being run, for [`KernelError::OutOfMemory`].
    items: usize,
    /// Run-cache buffers the chunk in flight reads: kept until the stream is
    /// synchronised, even when the chunk fails halfway (the cache may have
    /// let go of them meanwhile).
    held: Vec<Arc<CudaSlice<u8>>>,
    /// Whether this stream page-locks kernel buffers and copies straight
    /// from and to them ([`StreamWorker::set_host_pinning`]).
    pinning: super::HostPinning,
    /// Whether kernels compile in deterministic mode
    /// ([`StreamWorker::set_deterministic`]).
    deterministic: bool,
    /// The runtime's take-back flags and this worker's index among them
    /// ([`StreamWorker::watch_take_back`]).
    watch: Option<(Arc<[AtomicBool]>, usize)>,
    /// When the chunk in flight started, for [`KernelError::TakenBack`].
    started: Instant,
    /// Inside a chunk's [`CudaKernel::run_cuda`] (and the settling before
    /// it): only there are waits watched. A kernel's setup (`prepare`,
    /// `stage`) waits blocking, whatever the flag says.
    in_chunk: bool,
    /// A taken-back chunk's work is still in flight: it may read and write
    /// this worker's buffers until the stream is settled.
    unsettled: bool,
    /// The run-cache buffers that work reads, kept until then.
    unsettled_held: Vec<Arc<CudaSlice<u8>>>,
}

/// How often a watched wait looks at its take-back flag (it wakes at once
/// when the stream's work is done).
const TAKE_BACK_POLL: Duration = Duration::from_millis(2);

impl std::fmt::Debug for StreamWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamWorker")
            .field("device", &self.dev.info.id)
            .field("stream", &self.index)
            .finish_non_exhaustive()
    }
}

impl StreamWorker {
    /// A new stream on device `device` (an ordinal among the visible GPUs);
    /// `stream` is the worker's index on that device, for names and reports.
    ///
    /// The first worker of a device creates the device's shared context.
    /// [`KernelError::CudaUnavailable`] when there is no driver or no such
    /// device.
    pub fn new(device: usize, stream: usize) -> Result<Self, KernelError> {
        let dev = driver::device(device)?;
        let s = guarded("creating a CUDA stream", || {
            dev.ctx.new_stream().map_err(driver::error)
        })?;
        Ok(Self {
            #[cfg(any(feature = "workloads", feature = "bert"))]
            blas: None,
            dev,
            stream: s,
            index: stream,
            slots: Vec::new(),
            items: 0,
            held: Vec::new(),
            pinning: super::HostPinning::default(),
            deterministic: true,
            watch: None,
            started: Instant::now(),
            in_chunk: false,
            unsettled: false,
            unsettled_held: Vec::new(),
        })
    }

    /// Lets the runtime take back the chunk this stream runs: while
    /// `flags[index]` is set, a wait inside [`StreamWorker::run`] for the
    /// chunk's work ends with [`KernelError::TakenBack`] instead of waiting
    /// on. The work stays in flight and writes nothing outside this
    /// worker's own buffers (a kernel copies results out only after its wait
    /// for them succeeds; one that works in pieces may have copied earlier
    /// pieces, which a retry writes again); its copies in may still read the
    /// kernel's page-locked inputs, whose memory is not freed before they
    /// are done. The next use of the stream, or
    /// [`StreamWorker::wait_idle`], waits for it first. Whoever sets the
    /// flag clears it before the next chunk. A kernel's setup
    /// ([`StreamWorker::prepare`], [`StreamWorker::begin_run`]) is never
    /// taken back.
    ///
    /// A watched wait sleeps until a host function the stream runs after
    /// the chunk's work wakes it, and looks at the flag every 2 ms.
    /// Unwatched (the default), waiting is `cuStreamSynchronize`.
    pub fn watch_take_back(&mut self, flags: Arc<[AtomicBool]>, index: usize) {
        assert!(index < flags.len(), "take-back flag {index} out of range");
        self.watch = Some((flags, index));
    }

    /// Chooses which kernel buffers this stream page-locks from now on
    /// (see [`super::HostPinning`]; [`HostPinning::All`](super::HostPinning::All)
    /// unless set here). Buffers another stream locked are staged here
    /// while this stream's choice is off. Results are the same bit for bit.
    pub fn set_host_pinning(&mut self, choice: super::HostPinning) {
        self.pinning = choice;
    }

    /// Chooses how `.cu` kernels are compiled for this stream from now on
    /// (modules compiled in either mode stay cached per device).
    ///
    /// Deterministic (the default) compiles with `--fmad=false`, IEEE
    /// division and square root: the GPU does exactly the CPU's
    /// floating-point operations in the CPU's order, and results are
    /// bit-identical to [`crate::Kernel::run_cpu`] for the kernels written
    /// that way (the paper's workloads, declared twins that mirror their CPU
    /// code). The twins built on cuBLAS (the MLP, the sentence encoder) sum
    /// in cuBLAS's order and use CUDA's `expf`/`erff`: equal to the CPU's
    /// within float rounding, not bit for bit. Fast mode allows fused
    /// multiply-add contraction (`--fmad=true`): faster, and different in
    /// the last bits.
    pub fn set_deterministic(&mut self, on: bool) {
        self.deterministic = on;
    }

    /// Compiles (or finds compiled) what `kernel` launches on this device,
    /// so that the first chunk's time is the chunk's alone.
    pub fn prepare(&mut self, kernel: &dyn CudaKernel) -> Result<(), KernelError> {
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.bind()?;
            self.settle()?;
            kernel.prepare(self)
        }))
        .unwrap_or_else(|p| {
            Err(KernelError::Cuda(format!(
                "panic while compiling a kernel: {}",
                panic_message(&*p)
            )))
        })
    }

    /// Starts a run of `kernel` on this stream ([`CudaKernel::stage`]):
    /// uploads what every chunk of the run reads and page-locks the kernel's
    /// large buffers (the first time a buffer is seen), before the first
    /// chunk is timed. Call it once per run, before the run's first chunk
    /// here; without it the chunks find or upload their run inputs
    /// themselves, and stage their copies.
    pub fn begin_run(&mut self, kernel: &dyn CudaKernel) -> Result<(), KernelError> {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.bind()?;
            self.settle()?;
            kernel.stage(self)
        }))
        .unwrap_or_else(|p| {
            Err(KernelError::Cuda(format!(
                "panic while staging a run's inputs: {}",
                panic_message(&*p)
            )))
        });
        self.held.clear();
        r
    }

    /// Makes this stream's context current on the calling thread.
    fn bind(&self) -> Result<(), KernelError> {
        let ctx = self.stream.context();
        // An error recorded by a drop elsewhere (cudarc keeps one per context)
        // is not this chunk's: clear it. A sticky context error shows again
        // in the next call, and fails the chunk there.
        let _ = ctx.check_err();
        ctx.bind_to_thread().map_err(driver::error)
    }

    /// Runs `chunk` of `kernel` on this stream and returns once its results
    /// are in the kernel's host outputs. A CUDA failure is
    /// [`KernelError::Cuda`]; memory too small for the chunk is
    /// [`KernelError::OutOfMemory`], and a smaller chunk may succeed.
    pub fn run(&mut self, kernel: &dyn CudaKernel, chunk: &Chunk) -> Result<(), KernelError> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.items = chunk.len();
        self.started = Instant::now();
        self.in_chunk = true;
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.bind()?;
            self.settle()?;
            kernel.run_cuda(self, chunk)
        }))
        // A panic in a twin's code is the kernel's fault: a failed chunk,
        // run again, not a device error that counts against the stream.
        .unwrap_or_else(|p| Err(KernelError::Panicked(panic_message(&*p).to_string())));
        match &r {
            // Taken back: the work stays in flight, and so do the buffers it
            // reads; the next use of the stream settles it.
            Err(KernelError::TakenBack { .. }) => {
                self.unsettled = true;
                self.unsettled_held.append(&mut self.held);
            }
            // A chunk that failed halfway may have left copies in flight; let
            // them finish before the buffers are reused (errors here repeat
            // the first).
            Err(_) => {
                let _ = self.stream.synchronize();
                self.held.clear();
            }
            Ok(()) => self.held.clear(),
        }
        self.in_chunk = false;
        r
    }

    /// Waits for the work a taken-back chunk left in flight, if any: blocking
    /// and unwatched. A worker calls this before it takes another chunk, so
    /// a stream still busy with abandoned work holds no chunk meanwhile; an
    /// error of that work shows again in the next chunk (CUDA errors of a
    /// context are sticky).
    pub fn wait_idle(&mut self) {
        if self.unsettled {
            let _ = self.stream.synchronize();
            self.unsettled = false;
            self.unsettled_held.clear();
        }
    }

    /// Waits for the work a taken-back chunk left in flight, if any, before
    /// its buffers are used again; watched like [`StreamWorker::finish`], so
    /// a stream still busy with it can be taken back again.
    fn settle(&mut self) -> Result<(), KernelError> {
        if !self.unsettled {
            return Ok(());
        }
        if let Err(e @ KernelError::TakenBack { .. }) = self.wait() {
            return Err(e);
        }
        // Done, or failed: either way nothing is in flight any more.
        self.wait_idle();
        Ok(())
    }

    /// Waits for everything enqueued on this stream: blocking, or, watched,
    /// until the work is done or the take-back flag is set.
    fn wait(&self) -> Result<(), KernelError> {
        let err = self.err();
        let Some((flags, index)) = self.watch.as_ref().filter(|_| self.in_chunk) else {
            return self.stream.synchronize().map_err(err);
        };
        let stream = self.stream.cu_stream();
        let signal = Arc::new(Signal {
            done: AtomicBool::new(false),
            thread: std::thread::current(),
        });
        let raw = Arc::into_raw(signal.clone());
        // SAFETY: `stream` is this worker's live stream; `wake` takes back the
        // reference it is given, exactly once, and calls no CUDA function.
        // Were the host function not enqueued, the reference is taken back
        // here instead. (It is never called, and one `Signal` leaks, if the
        // context fails first.)
        let enqueued =
            unsafe { cu::stream::launch_host_function(stream, wake, raw.cast_mut().cast()) };
        if let Err(e) = enqueued {
            // SAFETY: not enqueued, so `wake` will never see it.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(err(e));
        }
        let query = || {
            // SAFETY: `stream` is this worker's live stream.
            match unsafe { cudarc::driver::sys::cuStreamQuery(stream) }.result() {
                Ok(()) => Ok(true),
                Err(cu::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY)) => {
                    Ok(false)
                }
                Err(e) => Err(err(e)),
            }
        };
        wait_watched(&signal, query, &flags[*index], self.started, TAKE_BACK_POLL)
    }

    /// The device's ordinal.
    pub fn device(&self) -> usize {
        self.dev.info.id
    }

    /// This worker's index on its device.
    pub fn stream_index(&self) -> usize {
        self.index
    }

    /// What the device is.
    pub fn info(&self) -> &GpuInfo {
        &self.dev.info
    }

    // ---- for the `CudaKernel` implementations of this crate ----

    /// Function `name` of `program`, compiled for this device in this
    /// stream's math mode.
    pub(crate) fn function(
        &self,
        program: &Program,
        name: &str,
    ) -> Result<CudaFunction, KernelError> {
        self.dev.function(program, name, self.deterministic)
    }

    /// The sizes of `f`'s parameters, as the driver reports them.
    pub(crate) fn param_sizes(&self, f: &CudaFunction) -> Result<Arc<[usize]>, KernelError> {
        self.dev.param_sizes(f)
    }

    fn err(&self) -> impl Fn(cu::DriverError) -> KernelError + use<> {
        error_for(self.items)
    }

    /// Enqueues a launch of `f` with the kernel arguments `args`.
    ///
    /// # Safety
    ///
    /// `args` must match `f`'s parameters in number, order and type, and every
    /// device address among them must stay valid, and be large enough for what
    /// the kernel reads and writes, until the stream is synchronised.
    pub(crate) unsafe fn launch(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[&dyn Arg],
    ) -> Result<(), KernelError> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: the caller's promise above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(self.err())
    }
}

impl Drop for StreamWorker {
    fn drop(&mut self) {
        // A taken-back chunk's copies may still read and write the pinned
        // buffers about to be freed.
        if self.unsettled {
            let _ = self.stream.synchronize();
        }
    }
}

/// What a watched wait's host function tells its waiter: the stream ran
/// everything enqueued before the host function.
struct Signal {
    done: AtomicBool,
    thread: std::thread::Thread,
}

/// The host function a watched wait enqueues: marks the work done and wakes
/// the waiting thread. CUDA counts the stream as busy until this returns,
/// so the waiter looks at `done`, not only at the stream.
extern "C" fn wake(arg: *mut std::ffi::c_void) {
    // SAFETY: `arg` is the reference to a `Signal` that `StreamWorker::wait`
    // leaked for this one call.
    let signal = unsafe { Arc::from_raw(arg.cast_const().cast::<Signal>()) };
    signal.done.store(true, Ordering::Release);
    signal.thread.unpark();
}

/// Waits until `signal` or `query` says the work is done, sleeping between
/// looks until woken (`Thread::unpark`) or `poll` passes; a set `flag` ends
/// the wait with [`KernelError::TakenBack`] after the seconds since `t0`.
/// Work found done is never taken back; a `query` error ends the wait.
fn wait_watched(
    signal: &Signal,
    mut query: impl FnMut() -> Result<bool, KernelError>,
    flag: &AtomicBool,
    t0: Instant,
    poll: Duration,
) -> Result<(), KernelError> {
    loop {
        if signal.done.load(Ordering::Acquire) || query()? {
            return Ok(());
        }
        if flag.load(Ordering::Acquire) {
            return Err(KernelError::TakenBack {
                secs: t0.elapsed().as_secs_f64(),
            });
        }
        std::thread::park_timeout(poll);
    }
}

/// A kernel argument: a device address, or a scalar by value.
pub(crate) trait Arg {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}

impl<T: DeviceRepr> Arg for T {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        use cudarc::driver::PushKernelArg;
        b.arg(self);
    }
}

/// A 1-D launch of `n` threads in blocks of `block`.
pub(crate) fn grid_1d(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(block as u64).max(1) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

// The tests drive the paper's workloads through a stream.
#[cfg(all(test, feature = "workloads"))]
mod tests;
