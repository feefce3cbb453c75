//! One CUDA stream and its buffers, and the run cache its device shares.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result as cu;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PinnedHostSlice,
};

use super::blas::Blas;
use super::driver::{self, error_for, Device};
use super::nvrtc::Program;
use super::{guarded, is_deterministic, CudaKernel, GpuInfo};
use crate::error::panic_message;
use crate::{Chunk, KernelError};

mod run_cache;

pub(crate) use run_cache::RunCache;
use run_cache::{fingerprint, RunKey};

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

/// A device address as a kernel argument (`const float*`, ...).
pub(crate) type DevPtr = u64;

/// One CUDA stream and its buffers, driven by one worker thread.
///
/// Buffers are kept between chunks and grow on demand: pinned host staging
/// (so copies are truly asynchronous DMA) and device memory, one pair per
/// slot a kernel asks for. Inputs that are the same for every chunk of a run
/// come from the device's shared run cache, uploaded once per run.
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
    /// This run's run-cache buffers, found without fingerprinting the
    /// input again (a run's inputs do not change while it runs); valid
    /// from [`StreamWorker::begin_run`] to the next one.
    run_memo: Option<Vec<(MemoKey, Arc<CudaSlice<u8>>)>>,
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

/// A run input as this run's memo knows it: owner, tag, address, length.
type MemoKey = (usize, u64, usize, usize);

#[derive(Default)]
struct Slot {
    host: Option<PinnedHostSlice<u8>>,
    dev: Option<CudaSlice<u8>>,
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
            run_memo: None,
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
    /// pieces, which a retry writes again); the next use of the stream, or
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

    /// Starts a run of `kernel` on this stream: uploads what every chunk of
    /// the run reads ([`CudaKernel::stage`]) before the first chunk is timed,
    /// and lets the run's chunks find those buffers without fingerprinting
    /// the inputs again. Call it once per run, before the run's first chunk
    /// here; without it every chunk looks its run inputs up in full.
    pub fn begin_run(&mut self, kernel: &dyn CudaKernel) -> Result<(), KernelError> {
        self.run_memo = Some(Vec::new());
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
        if r.is_err() {
            self.run_memo = None;
        }
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
    /// kernel's `prepare`, so the allocation is not in a chunk's time).
    pub(crate) fn reserve_slot(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        self.reserve(slot, bytes).map(drop)
    }

    /// Makes slot `slot` hold at least `bytes` bytes on both sides.
    fn reserve(&mut self, slot: usize, bytes: usize) -> Result<&mut Slot, KernelError> {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Slot::default);
        }
        let err = self.err();
        // Grow by half again so a run of growing chunks reallocates rarely.
        let want = |have: usize| bytes.max(have + have / 2).max(4096);
        let s = &mut self.slots[slot];
        if s.dev.as_ref().is_none_or(|d| d.len() < bytes) {
            let n = want(s.dev.as_ref().map_or(0, |d| d.len()));
            s.dev = None; // free before allocating the larger one
                          // SAFETY: the memory is uninitialised; every use writes before it
                          // reads (a copy in, or a kernel's output).
            s.dev = Some(unsafe { self.stream.alloc::<u8>(n) }.map_err(&err)?);
        }
        if s.host.as_ref().is_none_or(|h| h.len() < bytes) {
            let n = want(s.host.as_ref().map_or(0, |h| h.len()));
            s.host = None;
            // Flags 0, not cudarc's default write-combined: outputs are read
            // back on the host, and write-combined memory is very slow to read.
            // SAFETY: uninitialised; bytes are written before they are read.
            s.host = Some(
                unsafe { self.stream.context().alloc_pinned_with_flags::<u8>(n, 0) }
                    .map_err(&err)?,
            );
        }
        Ok(s)
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
        let err = self.err();
        let stream = self.stream.clone();
        let s = self.reserve(slot, total)?;
        let host = s.host.as_mut().expect("reserved");
        let dev = s.dev.as_ref().expect("reserved");
        let staged = &mut host.as_mut_slice().map_err(&err)?[..total];
        let mut at = 0;
        for p in parts {
            let b = as_bytes(p);
            staged[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        let (ptr, _record) = dev.device_ptr(&stream);
        if total > 0 {
            // SAFETY: `staged` is pinned memory of this context that lives in
            // this worker until the copy is done (every chunk ends with
            // `finish`, a failed chunk is synchronised by `run`, a taken-back
            // one is settled before the buffers are touched again, and `Drop`
            // synchronises); the device buffer holds at least `total` bytes.
            unsafe { cu::memcpy_htod_async(ptr, &*staged, stream.cu_stream()) }.map_err(&err)?;
        }
        Ok(ptr)
    }

    /// Device scratch of `len` elements in slot `slot` (a kernel's output).
    pub(crate) fn scratch<T: Pod>(
        &mut self,
        slot: usize,
        len: usize,
    ) -> Result<DevPtr, KernelError> {
        let stream = self.stream.clone();
        let s = self.reserve(slot, len * std::mem::size_of::<T>())?;
        let (ptr, _record) = s.dev.as_ref().expect("reserved").device_ptr(&stream);
        Ok(ptr)
    }

    /// Enqueues the copy of slot `slot`'s first `len` device elements to its
    /// pinned buffer; read them with [`StreamWorker::downloaded`] after
    /// [`StreamWorker::finish`].
    pub(crate) fn download<T: Pod>(&mut self, slot: usize, len: usize) -> Result<(), KernelError> {
        let bytes = len * std::mem::size_of::<T>();
        let err = self.err();
        let stream = self.stream.clone();
        let s = self.reserve(slot, bytes)?;
        let dev = s.dev.as_ref().expect("reserved");
        let (ptr, _record) = dev.device_ptr(&stream);
        let host = s.host.as_mut().expect("reserved");
        let dst = &mut host.as_mut_slice().map_err(&err)?[..bytes];
        if bytes > 0 {
            // SAFETY: pinned destination of `bytes` bytes that outlives the
            // copy (see `upload`); the source holds at least that many.
            unsafe { cu::memcpy_dtoh_async(dst, ptr, stream.cu_stream()) }.map_err(&err)?;
        }
        Ok(())
    }

    /// Waits until everything enqueued on this stream (only this one) is done.
    /// The thread sleeps meanwhile (the context uses blocking sync). Watched
    /// ([`StreamWorker::watch_take_back`]), the wait may end in
    /// [`KernelError::TakenBack`] with the work still in flight: a kernel
    /// then returns that error before it copies anything out.
    pub(crate) fn finish(&self) -> Result<(), KernelError> {
        self.wait()
    }

    /// The first `len` elements of slot `slot`'s pinned buffer, as the last
    /// [`StreamWorker::download`] left them (call [`StreamWorker::finish`]
    /// first).
    pub(crate) fn downloaded<T: Pod>(&self, slot: usize, len: usize) -> &[T] {
        let bytes = len * std::mem::size_of::<T>();
        let host = self.slots[slot].host.as_ref().expect("downloaded slot");
        assert!(host.len() >= bytes);
        let ptr = host.as_ptr().expect("pinned buffer");
        assert!(
            ptr.cast::<T>().is_aligned(),
            "pinned buffers are page aligned"
        );
        // SAFETY: the buffer holds at least `bytes` initialised bytes (written
        // by the completed copy), is aligned for `T` (pinned allocations are
        // page aligned), every bit pattern is a valid `T`, and `&self` keeps
        // it from being reallocated while the slice lives.
        unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len) }
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

    /// The device copy of `data`, uploaded once per run and device: the first
    /// stream to ask uploads (and waits for the upload), the others reuse it.
    ///
    /// `owner` is the kernel whose run this is, and `tag` anything the kernel
    /// knows that tells its runs apart (a row or iteration number; 0 if
    /// nothing). The entry is keyed by those, the data's address and length,
    /// and a fingerprint of its contents (all of it up to 1 MiB, an even
    /// sample beyond), so a new run whose changed inputs sit at the same
    /// address misses. The one case it cannot see is a large input changed
    /// only between the sampled words, at the same address, with the same
    /// owner address and tag; kernels whose large run inputs change from run
    /// to run pass a distinguishing `tag`.
    ///
    /// Hold the returned buffer until the chunk's stream is synchronised.
    pub(crate) fn run_input<T: Pod, O: ?Sized>(
        &mut self,
        owner: &O,
        tag: u64,
        data: &[T],
    ) -> Result<Arc<CudaSlice<u8>>, KernelError> {
        let bytes = as_bytes(data);
        let memo_key: MemoKey = (
            owner as *const O as *const () as usize,
            tag,
            bytes.as_ptr() as usize,
            bytes.len(),
        );
        if let Some(buf) = self
            .run_memo
            .as_ref()
            .and_then(|m| m.iter().find(|(k, _)| *k == memo_key))
            .map(|(_, b)| b.clone())
        {
            self.held.push(buf.clone());
            return Ok(buf);
        }
        let buf = self.run_input_lookup(owner, tag, bytes)?;
        if let Some(m) = self.run_memo.as_mut() {
            m.push((memo_key, buf.clone()));
        }
        Ok(buf)
    }

    fn run_input_lookup<O: ?Sized>(
        &mut self,
        owner: &O,
        tag: u64,
        bytes: &[u8],
    ) -> Result<Arc<CudaSlice<u8>>, KernelError> {
        let key = RunKey {
            owner: owner as *const O as *const () as usize,
            tag,
            ptr: bytes.as_ptr() as usize,
            len: bytes.len(),
            print: fingerprint(bytes),
        };
        self.cached(key, bytes)
    }

    /// The run-cache buffer under `key`, uploading `bytes` into it on a miss.
    fn cached(&mut self, key: RunKey, bytes: &[u8]) -> Result<Arc<CudaSlice<u8>>, KernelError> {
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

    /// The device copy of `data`, which stays the same for as long as `id`
    /// names it (a model's weights): uploaded by the first stream of the
    /// device to ask, then found by `id`, address and length without reading
    /// `data` again. Kept in the device's run cache while it is used.
    ///
    /// Hold the returned buffer until the chunk's stream is synchronised.
    pub(crate) fn resident<T: Pod>(
        &mut self,
        id: u64,
        data: &[T],
    ) -> Result<Arc<CudaSlice<u8>>, KernelError> {
        let bytes = as_bytes(data);
        let key = RunKey {
            owner: 0, // no run's owner has address 0
            tag: id,
            ptr: bytes.as_ptr() as usize,
            len: bytes.len(),
            print: 0,
        };
        self.cached(key, bytes)
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
