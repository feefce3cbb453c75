//! A stream's memory: device buffers and pinned staging per slot, grown on
//! demand; page-locked kernel buffers copied straight from and to; uploads
//! (whole, from a host offset, by rows, once per run) and the chunk's
//! downloads into its output buffers.

use super::*;

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

pub(super) fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: `Pod` types have no padding and no invalid bit patterns, so
    // their memory read as bytes is initialised; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

pub(super) fn as_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; and any bytes written are a valid `T` (`Pod`).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) host: Option<PinnedHostSlice<u8>>,
    pub(super) dev: Option<CudaSlice<u8>>,
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

impl StreamWorker {
    /// Makes slot `slot` hold at least `bytes` bytes on both sides (for a
    /// kernel's `prepare` or `stage`, so the allocation is not in a chunk's
    /// time).
    // Raw stream calls of the paper's workloads' twins.
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
    pub(crate) fn reserve_slot(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        self.reserve_device(slot, bytes)?;
        self.reserve_host(slot, bytes)
    }

    /// Makes slot `slot` hold at least `bytes` bytes on the device (a slot
    /// whose copies go straight from and to page-locked memory needs no
    /// staging).
    // Raw stream calls of the paper's workloads' twins.
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
    pub(crate) fn reserve_device(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
        self.reserve_dev(slot, bytes).map(drop)
    }

    /// The size a slot grows to when it must hold `bytes` and holds `have`:
    /// by half again at least, so a run of growing chunks reallocates rarely.
    pub(super) fn grown(bytes: usize, have: usize) -> usize {
        bytes.max(have + have / 2).max(4096)
    }

    pub(super) fn slot(&mut self, slot: usize) -> &mut Slot {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, Slot::default);
        }
        &mut self.slots[slot]
    }

    /// Slot `slot`'s device buffer, at least `bytes` long; its address.
    pub(super) fn reserve_dev(&mut self, slot: usize, bytes: usize) -> Result<DevPtr, KernelError> {
        let err = self.err();
        let stream = self.stream.clone();
        let have = self.slot(slot).dev.as_ref().map(|d| d.len());
        if have.is_none_or(|h| h < bytes) {
            self.slots[slot].dev = None; // free before allocating the larger one
            let n = self.slot_bytes(bytes, have.unwrap_or(0))?;
            // SAFETY: the memory is uninitialised; every use writes before it
            // reads (a copy in, or a kernel's output).
            self.slots[slot].dev = Some(unsafe { stream.alloc::<u8>(n) }.map_err(&err)?);
        }
        let s = &self.slots[slot];
        let (ptr, _record) = s.dev.as_ref().expect("reserved").device_ptr(&stream);
        Ok(ptr)
    }

    /// Makes slot `slot`'s pinned staging at least `bytes` long.
    pub(super) fn reserve_host(&mut self, slot: usize, bytes: usize) -> Result<(), KernelError> {
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
    /// locked under [`crate::cuda::HostPinning::Reused`]). `false`: this stream stages its copies (not chosen, a
    /// buffer under [`PIN_MIN_BYTES`], or the driver refused; the reason is
    /// in [`super::host_pin_stats`]).
    pub(crate) fn pin(&mut self, mem: Pinnable<'_>, reused: bool) -> bool {
        let wanted = match self.pinning {
            crate::cuda::HostPinning::Off => false,
            crate::cuda::HostPinning::Reused => reused,
            crate::cuda::HostPinning::All => true,
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
    pub(super) fn direct(&self, addr: usize, len: usize, pin: &HostPin) -> bool {
        if self.pinning == crate::cuda::HostPinning::Off || len == 0 {
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
    pub(super) fn stage_in(
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
    // Raw stream calls of the paper's workloads' twins.
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
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
    // Raw stream calls of the paper's workloads' twins.
    #[cfg_attr(not(feature = "workloads"), allow(dead_code))]
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
        self.check_run_buffer(bytes.len())?;
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

    /// The device address of a run-cache buffer.
    pub(crate) fn addr(&self, buf: &CudaSlice<u8>) -> DevPtr {
        let (ptr, _record) = buf.device_ptr(&self.stream);
        ptr
    }
}
