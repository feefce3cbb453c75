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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PinnedHostSlice,
};

use super::blas::Blas;
use super::driver::{self, error_for, Device};
use super::nvrtc::Program;
use super::pin::{HostPin, Lock, PIN_MIN_BYTES};
use super::{guarded, is_deterministic, CudaKernel, GpuInfo};
use crate::buf::Pinnable;
use crate::error::panic_message;
use crate::{Chunk, KernelError};

mod run_cache;

pub(crate) use run_cache::RunCache;
use run_cache::RunKey;

/// Plain data that crosses the bus as bytes: no padding, no pointers, every
/// bit pattern valid.
/// # Safety
///
/// Every bit pattern of `size_of::<Self>()` bytes is a valid `Self`, and
/// `Self` has no padding: its bytes are copied to and from the device as is.
pub(crate) unsafe trait Pod: Copy + DeviceRepr + Send + Sync + 'static {}
// SAFETY: plain integers and floats: no padding, every bit pattern valid.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for f32 {}

fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding and no invalid bit patterns, so
    // their memory read as bytes is initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; and any bytes written are a valid `T` (`Pod`).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

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

#[derive(Default)]
struct Slot {
    host: Option<PinnedHostSlice<u8>>,
    dev: Option<CudaSlice<u8>>,
}

/// One of a chunk's host outputs for [`StreamWorker::finish_into`]: `dst`
/// gets the device slot's elements from `at` on.
pub(crate) struct Out<'a> {
    slot: usize,
    /// Byte offset in the slot.
    at: usize,
    dst: &'a mut [u8],
    /// The lock of the buffer `dst` is part of.
    pin: &'a HostPin,
}

impl<'a> Out<'a> {
    /// Elements `at..at + dst.len()` of slot `slot` into `dst`, a part of a
    /// kernel buffer whose lock is `pin`.
    pub(crate) fn new<T: Pod>(slot: usize, at: usize, dst: &'a mut [T], pin: &'a HostPin) -> Self {
        Self {
            slot,
            at: at * std::mem::size_of::<T>(),
            dst: as_bytes_mut(dst),
            pin,
        }
    }
}

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
            blas: None,
            dev,
            stream: s,
            index: stream,
            slots: Vec::new(),
            items: 0,
            held: Vec::new(),
            pinning: super::host_pinning(),
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
    /// (see [`super::HostPinning`]; what [`super::set_host_pinning`] chose
    /// when the stream was made, unless set here). Buffers another stream
    /// locked are staged here while this stream's choice is off. Results
    /// are the same bit for bit.
    pub fn set_host_pinning(&mut self, choice: super::HostPinning) {
        self.pinning = choice;
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
        .unwrap_or_else(|p| {
            Err(KernelError::Cuda(format!(
                "panic while running a chunk: {}",
                panic_message(&*p)
            )))
        });
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

    /// Function `name` of `program`, compiled for this device in the current
    /// math mode.
    pub(crate) fn function(
        &self,
        program: &Program,
        name: &str,
    ) -> Result<CudaFunction, KernelError> {
        self.dev.function(program, name, is_deterministic())
    }

    fn err(&self) -> impl Fn(cu::DriverError) -> KernelError {
        error_for(self.items)
    }

    /// Makes slot `slot` hold at least `bytes` bytes on both sides (for a
    /// kernel's `prepare` or `stage`, so the allocation is not in a chunk's
    /// time).
    pub(crate) fn reserve_slot(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        self.reserve_device(slot, bytes)?;
        self.reserve_host(slot, bytes)
    }

    /// Makes slot `slot` hold at least `bytes` bytes on the device (a slot
    /// whose copies go straight from and to page-locked memory needs no
    /// staging).
    pub(crate) fn reserve_device(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        self.reserve_dev(slot, bytes).map(drop)
    }

    /// The size a slot grows to when it must hold `bytes` and holds `have`:
    /// by half again at least, so a run of growing chunks reallocates rarely.
    fn grown(bytes: usize, have: usize) -> usize {
        bytes.max(have + have / 2).max(4096)
    }

    fn slot(&mut self, slot: usize) -> &mut Slot {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Slot::default);
        }
        &mut self.slots[slot]
    }

    /// Slot `slot`'s device buffer, at least `bytes` long; its address.
    fn reserve_dev(&mut self, slot: usize, bytes: usize) -> Result<DevPtr, KernelError> {
        let err = self.err();
        let stream = self.stream.clone();
        let s = self.slot(slot);
        if s.dev.as_ref().is_none_or(|d| d.len() < bytes) {
            let n = Self::grown(bytes, s.dev.as_ref().map_or(0, |d| d.len()));
            s.dev = None; // free before allocating the larger one
                          // SAFETY: the memory is uninitialised; every use writes before it
                          // reads (a copy in, or a kernel's output).
            s.dev = Some(unsafe { stream.alloc::<u8>(n) }.map_err(&err)?);
        }
        let (ptr, _record) = s.dev.as_ref().expect("reserved").device_ptr(&stream);
        Ok(ptr)
    }

    /// Makes slot `slot`'s pinned staging at least `bytes` long.
    fn reserve_host(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        let err = self.err();
        let stream = self.stream.clone();
        let s = self.slot(slot);
        if s.host.as_ref().is_none_or(|h| h.len() < bytes) {
            let n = Self::grown(bytes, s.host.as_ref().map_or(0, |h| h.len()));
            if s.host.is_some() {
                // Copies this chunk enqueued may still use the old buffer,
                // and freeing pinned memory is not ordered on the stream.
                stream.synchronize().map_err(&err)?;
            }
            s.host = None;
            // Flags 0, not cudarc's default write-combined: outputs are read
            // back on the host, and write-combined memory is very slow to read.
            // SAFETY: uninitialised; bytes are written before they are read.
            let ctx = stream.context();
            s.host = Some(unsafe { ctx.alloc_pinned_with_flags::<u8>(n, 0) }.map_err(&err)?);
        }
        Ok(())
    }

    /// Page-locks `mem` (a kernel buffer's whole allocation), once per
    /// buffer for as long as it lives, so that this run's chunks copy
    /// straight from and to it; for a kernel's `stage`. `reused`: the job
    /// keeps the buffer across its runs (a one-run job's buffer is not
    /// locked under [`super::HostPinning::Reused`]). `false`: this stream stages its copies (not chosen, a
    /// buffer under [`PIN_MIN_BYTES`], or the driver refused; the reason is
    /// in [`super::host_pin_stats`]).
    pub(crate) fn pin(&mut self, mem: Pinnable<'_>, reused: bool) -> bool {
        let wanted = match self.pinning {
            super::HostPinning::Off => false,
            super::HostPinning::Reused => reused,
            super::HostPinning::All => true,
        };
        if !wanted || mem.len() < PIN_MIN_BYTES {
            return false;
        }
        let ctx = self.stream.context().clone();
        let lock = mem.pin().lock_with(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: a `Pinnable` is made only by the owner of the
                // allocation it names, which does not move it and releases
                // `mem.pin()` (where this lock goes) before freeing it.
                unsafe { Lock::register(&ctx, mem.addr(), mem.len()) }
            }))
            .unwrap_or(None) // a driver without the entry point: staged
        });
        match lock {
            Some(l) => {
                l.add_user(&self.stream);
                true
            }
            None => false,
        }
    }

    /// Whether the `len` bytes at `addr` are copied straight from or to
    /// (page-locked by `pin`, which then waits for this stream before it
    /// unlocks them).
    fn direct(&self, addr: usize, len: usize, pin: &HostPin) -> bool {
        if self.pinning == super::HostPinning::Off || len == 0 {
            return false;
        }
        match pin.covering(addr, len) {
            Some(l) => {
                l.add_user(&self.stream);
                true
            }
            None => false,
        }
    }

    /// Copies `parts`, back to back, into slot `slot`'s pinned buffer and
    /// enqueues their copy to the device; returns the device address. The
    /// host copy is done when this returns, so the inputs may change
    /// afterwards.
    pub(crate) fn upload<T: Pod>(
        &mut self,
        slot: usize,
        parts: &[&[T]],
    ) -> Result<DevPtr, KernelError> {
        let total: usize = parts.iter().map(|p| std::mem::size_of_val(*p)).sum();
        self.stage_in(slot, total, |staged| {
            let mut at = 0;
            for p in parts {
                let b = as_bytes(p);
                staged[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
        })
    }

    /// Fills slot `slot`'s pinned staging with `total` bytes by `fill` and
    /// enqueues their copy to the device; the device address.
    fn stage_in(
        &mut self,
        slot: usize,
        total: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<DevPtr, KernelError> {
        let err = self.err();
        let ptr = self.reserve_dev(slot, total)?;
        self.reserve_host(slot, total)?;
        let stream = self.stream.clone();
        let host = self.slots[slot].host.as_mut().expect("reserved");
        let staged = &mut host.as_mut_slice().map_err(&err)?[..total];
        fill(staged);
        if total > 0 {
            // SAFETY: `staged` is pinned memory of this context that lives in
            // this worker until the copy is done (every chunk ends with a
            // wait, a failed chunk is synchronised by `run`, a taken-back
            // one is settled before the buffers are touched again, and `Drop`
            // synchronises); the device buffer holds at least `total` bytes.
            unsafe { cu::memcpy_htod_async(ptr, &*staged, stream.cu_stream()) }.map_err(&err)?;
        }
        Ok(ptr)
    }

    /// Enqueues the copy of `src`, a part of a kernel buffer whose lock is
    /// `pin`, into slot `slot` on the device; the device address. Straight
    /// from `src` when the buffer is page-locked ([`StreamWorker::pin`]),
    /// else staged ([`StreamWorker::upload`]).
    pub(crate) fn upload_from<T: Pod>(
        &mut self,
        slot: usize,
        src: &[T],
        pin: &HostPin,
    ) -> Result<DevPtr, KernelError> {
        let bytes = as_bytes(src);
        if !self.direct(bytes.as_ptr() as usize, bytes.len(), pin) {
            return self.upload(slot, &[src]);
        }
        let ptr = self.reserve_dev(slot, bytes.len())?;
        // SAFETY: the device buffer holds at least `bytes.len()` bytes. The
        // source is page-locked memory (the copy engine reads it after this
        // returns, maybe after the chunk ended, if it is taken back) that
        // stays allocated until its lock is released, which waits for this
        // stream first (`direct` made it a user). The owner may write those
        // bytes meanwhile only once the chunk is over (a retry of a
        // taken-back chunk, the next run): the copy then reads a mix of old
        // and new values into this stream's own device buffer, which only
        // the abandoned work reads, and whose results are never copied out
        // (a chunk copies out only after its wait succeeds). The device
        // writes no host memory here.
        unsafe { cu::memcpy_htod_async(ptr, bytes, self.stream.cu_stream()) }
            .map_err(self.err())?;
        Ok(ptr)
    }

    /// Enqueues the copy of `rows` rows of `width` elements, `pitch` apart
    /// in `src` (which starts at the first row's first element; `src` is a
    /// part of a kernel buffer whose lock is `pin`), into slot `slot` on the
    /// device, back to back; the device address. Straight from `src` (one
    /// 2-D copy) when the buffer is page-locked, else gathered into staging.
    pub(crate) fn upload_rows<T: Pod>(
        &mut self,
        slot: usize,
        src: &[T],
        pin: &HostPin,
        (pitch, width, rows): (usize, usize, usize),
    ) -> Result<DevPtr, KernelError> {
        let sz = std::mem::size_of::<T>();
        let span = if rows == 0 {
            0
        } else {
            (rows - 1) * pitch + width
        };
        if width > pitch || span > src.len() {
            return Err(KernelError::invalid(
                "rows to upload",
                format!(
                    "{rows} rows of {width} elements {pitch} apart in {} elements",
                    src.len()
                ),
            ));
        }
        let total = rows * width * sz;
        let bytes = as_bytes(&src[..span]);
        if total == 0 || !self.direct(bytes.as_ptr() as usize, bytes.len(), pin) {
            return self.stage_in(slot, total, |staged| {
                if width == 0 {
                    return;
                }
                for (r, dst) in staged.chunks_exact_mut(width * sz).enumerate() {
                    dst.copy_from_slice(&bytes[r * pitch * sz..(r * pitch + width) * sz]);
                }
            });
        }
        let ptr = self.reserve_dev(slot, total)?;
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: bytes.as_ptr().cast(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: pitch * sz,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: ptr,
            dstArray: std::ptr::null_mut(),
            dstPitch: width * sz,
            WidthInBytes: width * sz,
            Height: rows,
        };
        // SAFETY: the source rows lie inside `bytes` (checked above), which
        // is page-locked as in `upload_from` (same argument for copies still
        // in flight after the chunk); the device buffer holds `rows` rows of
        // `width · sz` bytes; the descriptor is read before this returns.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.stream.cu_stream()) }
            .result()
            .map_err(self.err())?;
        Ok(ptr)
    }

    /// Device scratch of `len` elements in slot `slot` (a kernel's output).
    pub(crate) fn scratch<T: Pod>(
        &mut self,
        slot: usize,
        len: usize,
    ) -> Result<DevPtr, KernelError> {
        self.reserve_dev(slot, len * std::mem::size_of::<T>())
    }

    /// Waits until everything enqueued on this stream (only this one) is done.
    /// The thread sleeps meanwhile (the context uses blocking sync). Watched
    /// ([`StreamWorker::watch_take_back`]), the wait may end in
    /// [`KernelError::TakenBack`] with the work still in flight.
    pub(crate) fn finish(&self) -> Result<(), KernelError> {
        self.wait()
    }

    /// Waits for the chunk's work and copies its results into the kernel's
    /// host outputs `outs`; the chunk's results are there when this returns
    /// `Ok`.
    ///
    /// The wait for the work is watched ([`StreamWorker::finish`]); if it
    /// ends in [`KernelError::TakenBack`], nothing has been written to any
    /// output, and nothing will be: outputs that are page-locked are copied
    /// into straight from the device, but only once the wait succeeded,
    /// then waited for unwatched (a short copy); the others go through this
    /// stream's staging (copied there before the wait, out of it after).
    pub(crate) fn finish_into(&mut self, outs: &mut [Out<'_>]) -> Result<(), KernelError> {
        assert!(outs.len() <= 64, "at most 64 outputs per chunk");
        let err = self.err();
        let stream = self.stream.clone();
        let mut direct = 0u64;
        for (k, o) in outs.iter().enumerate() {
            let need = o.at + o.dst.len();
            let have = self.slots.get(o.slot).and_then(|s| s.dev.as_ref());
            if have.is_none_or(|d| d.len() < need) {
                return Err(KernelError::invalid(
                    "chunk output",
                    format!("slot {} holds fewer than {need} bytes", o.slot),
                ));
            }
            if self.direct(o.dst.as_ptr() as usize, o.dst.len(), o.pin) {
                direct |= 1 << k;
            } else {
                // All staging sized before the first copy into it (outputs
                // may share a slot).
                self.reserve_host(o.slot, need)?;
            }
        }
        for (k, o) in outs.iter().enumerate() {
            if direct & (1 << k) != 0 {
                continue;
            }
            let need = o.at + o.dst.len();
            let s = &mut self.slots[o.slot];
            let (src, _record) = s.dev.as_ref().expect("checked").device_ptr(&stream);
            let host = s.host.as_mut().expect("reserved");
            let staged = &mut host.as_mut_slice().map_err(&err)?[o.at..need];
            if !staged.is_empty() {
                // SAFETY: pinned destination of this worker, alive until
                // the copy is done (see `stage_in`); the device slot holds
                // at least `need` bytes (checked above).
                unsafe { cu::memcpy_dtoh_async(staged, src + o.at as u64, stream.cu_stream()) }
                    .map_err(&err)?;
            }
        }
        self.wait()?;
        if direct != 0 {
            for (k, o) in outs.iter_mut().enumerate() {
                if direct & (1 << k) == 0 {
                    continue;
                }
                let dev = self.slots[o.slot].dev.as_ref().expect("checked");
                let (src, _record) = dev.device_ptr(&stream);
                // SAFETY: `o.dst` is page-locked (this stream is a user of
                // its lock) and borrowed exclusively by this call, which
                // synchronises the stream before it returns `Ok` (on an
                // error `run` synchronises it before the chunk is given up;
                // a failed context abandons its work); the device slot holds
                // at least `at + len` bytes (checked above). The chunk's
                // work succeeded and no watched wait follows, so the chunk
                // cannot be taken back while this copy is in flight: no
                // write reaches items handed to another worker.
                unsafe {
                    cu::memcpy_dtoh_async(&mut *o.dst, src + o.at as u64, stream.cu_stream())
                }
                .map_err(&err)?;
            }
            stream.synchronize().map_err(&err)?;
        }
        for (k, o) in outs.iter_mut().enumerate() {
            if direct & (1 << k) != 0 || o.dst.is_empty() {
                continue;
            }
            let host = self.slots[o.slot].host.as_ref().expect("staged above");
            let staged = host.as_slice().map_err(&err)?;
            o.dst.copy_from_slice(&staged[o.at..o.at + o.dst.len()]);
        }
        Ok(())
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

    /// The device copy of `data`, uploaded once per device for as long as
    /// `id` names it: the first stream of the device to ask uploads it (and
    /// waits for the upload), the others find it by `id`, address and
    /// length, without reading `data`.
    ///
    /// `id` comes from [`crate::claim::next_id`] (never reused in the
    /// process) and belongs to an owner that gives only shared access to
    /// `data` for as long as it lives: a kernel's own input (one run:
    /// kmeans' centres, nbody's positions), a data set (every run of a job:
    /// kmeans' points), a model's weights (every batch). So an input that
    /// changes between runs comes under a new id and crosses the bus again,
    /// and one that does not is found without hashing it. Entries of ids no
    /// longer asked for drop out of the small cache as new ones come.
    ///
    /// Hold the returned buffer until the chunk's stream is synchronised.
    pub(crate) fn run_input<T: Pod>(
        &mut self,
        id: u64,
        data: &[T],
    ) -> Result<Arc<CudaSlice<u8>>, KernelError> {
        let bytes = as_bytes(data);
        let key = RunKey::new(id, bytes);
        let entry = self.dev.run_cache.entry(key);
        let mut slot = entry.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(buf) = slot.as_ref() {
            self.held.push(buf.clone());
            return Ok(buf.clone());
        }
        let err = self.err();
        // SAFETY: uninitialised until the copy below fills all of it.
        let mut buf = unsafe { self.stream.alloc::<u8>(bytes.len().max(1)) }.map_err(&err)?;
        if !bytes.is_empty() {
            self.stream
                .memcpy_htod(bytes, &mut buf.slice_mut(..bytes.len()))
                .map_err(&err)?;
        }
        // Complete before any other stream may read it (no event tracking).
        self.stream.synchronize().map_err(&err)?;
        let buf = Arc::new(buf);
        *slot = Some(buf.clone());
        self.held.push(buf.clone());
        Ok(buf)
    }

    /// Enqueues the dense layer `y = x · Wᵀ` (row-major `x` `[rows, inp]`,
    /// `W` `[out, inp]`, `y` `[rows, out]`) on this stream through cuBLAS,
    /// opening cuBLAS for this stream on first use.
    ///
    /// # Safety
    ///
    /// `x`, `w` and `y` are device addresses of this worker's device holding
    /// at least `rows·inp`, `out·inp` and `rows·out` f32, valid until the
    /// stream is synchronised; `y` overlaps neither input.
    pub(crate) unsafe fn dense(
        &mut self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), KernelError> {
        let blas = self.blas()?;
        // SAFETY: the caller's promise.
        unsafe { blas.dense(x, w, y, rows, inp, out) }
    }

    /// This stream's cuBLAS handle, opened on first use (the context is
    /// current: every entry point binds it before calling a kernel).
    fn blas(&mut self) -> Result<&Blas, KernelError> {
        if self.blas.is_none() {
            self.blas = Some(Blas::new(&self.stream)?);
        }
        Ok(self.blas.as_ref().expect("just opened"))
    }

    /// The device address of a run-cache buffer.
    pub(crate) fn addr(&self, buf: &CudaSlice<u8>) -> DevPtr {
        let (ptr, _record) = buf.device_ptr(&self.stream);
        ptr
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

#[cfg(test)]
mod tests;
