//! Host buffers of the kernels: inputs ([`HostBuf`]) and outputs that
//! several workers write at once, each into its own items ([`DisjointBuf`]).
//!
//! Both own their memory together with its page-lock slot ([`HostPin`]): a
//! GPU stream may page-lock the memory once, so that chunks copy straight
//! from and to it (`cuda/pin.rs`), and the owner unlocks it before the
//! memory is freed.

use std::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};

use crate::claim::{Chunk, ClaimSpace, next_id};
use crate::cuda::HostPin;

/// Buffers smaller than this are never page-locked: staging them costs
/// under 0.1 ms.
pub(crate) const PIN_MIN_BYTES: usize = 1 << 20;

/// Spare capacity after a buffer that may be page-locked, so that two such
/// buffers never share a page (the driver locks whole pages, and refuses to
/// lock one twice): at least a page, 64 KiB on ARM servers.
const PIN_SLACK_BYTES: usize = 64 << 10;

/// The capacity to allocate for `n` elements of a buffer that may be
/// page-locked: `n`, plus [`PIN_SLACK_BYTES`] when it is large enough to be.
pub(crate) fn pinnable_capacity<T>(n: usize) -> usize {
    let size = std::mem::size_of::<T>().max(1);
    if n.saturating_mul(size) < PIN_MIN_BYTES {
        n
    } else {
        n.saturating_add(PIN_SLACK_BYTES.div_ceil(size))
    }
}

/// A kernel's input on the host: a fixed-size slice that a GPU stream may
/// page-lock for as long as the buffer lives (read it through `Deref`).
pub(crate) struct HostBuf<T> {
    /// Released before `data` is freed (`Drop`), so a lock never outlives
    /// the memory it locks.
    pin: HostPin,
    /// Never grows or shrinks (it would move); its spare capacity, if any
    /// ([`pinnable_capacity`]), keeps the next buffer off its last page.
    data: Vec<T>,
}

impl<T> From<Vec<T>> for HostBuf<T> {
    fn from(data: Vec<T>) -> Self {
        Self {
            pin: HostPin::default(),
            data,
        }
    }
}

impl<T> Deref for HostBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T> HostBuf<T> {
    /// The page-lock slot, for copies from and to the memory.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pin(&self) -> &HostPin {
        &self.pin
    }

    /// The whole allocation with its page-lock slot, for a stream to lock.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pinnable(&self) -> Pinnable<'_> {
        // SAFETY: `data` is this buffer's allocation (its elements), which
        // never moves or changes size while the buffer owns it (no method
        // grows or shrinks it); the buffer releases `pin` before it frees
        // `data` (`Drop`, `into_vec`), and hands both on together otherwise
        // (`into_parts`).
        unsafe {
            Pinnable::new(
                &self.pin,
                self.data.as_ptr() as usize,
                std::mem::size_of_val(self.data.as_slice()),
            )
        }
    }

    /// The elements as a vector, unlocked first.
    pub(crate) fn into_vec(mut self) -> Vec<T> {
        let unlocked = self.pin.release();
        let data = std::mem::take(&mut self.data);
        if unlocked { data } else { moved_out(data) }
    }

    /// The lock slot and the memory, handed on together (the new owner
    /// takes over releasing the lock before freeing the memory).
    fn into_parts(mut self) -> (HostPin, Vec<T>) {
        (
            std::mem::take(&mut self.pin),
            std::mem::take(&mut self.data),
        )
    }
}

impl<T> Drop for HostBuf<T> {
    fn drop(&mut self) {
        if !self.pin.release() {
            // The driver still locks these pages: never give them back to
            // the allocator (a buffer allocated there later would be copied
            // as if locked, from pages that are no longer its own).
            std::mem::forget(std::mem::take(&mut self.data));
        }
    }
}

impl<T> std::fmt::Debug for HostBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf")
            .field("len", &self.data.len())
            .field("pin", &self.pin)
            .finish()
    }
}

/// `data`'s values moved into a fresh allocation; `data`'s own memory,
/// still page-locked, is leaked.
fn moved_out<T>(data: Vec<T>) -> Vec<T> {
    let old = ManuallyDrop::new(data);
    let mut fresh = Vec::with_capacity(old.len());
    // SAFETY: `old` holds `len` initialised values and is never used again:
    // its values are moved (copied bit for bit into the spare capacity of
    // `fresh`, a distinct allocation of at least `len`, which then owns
    // them; the originals are neither read nor dropped afterwards, and
    // their allocation is leaked), so each value has one owner.
    unsafe {
        std::ptr::copy_nonoverlapping(old.as_ptr(), fresh.as_mut_ptr(), old.len());
        fresh.set_len(old.len());
    }
    fresh
}

/// A host allocation with the page-lock slot its owner releases before
/// freeing it: what a GPU stream may page-lock. Only the owners in this
/// module make one.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct Pinnable<'a> {
    pin: &'a HostPin,
    addr: usize,
    len: usize,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl<'a> Pinnable<'a> {
    /// # Safety
    ///
    /// The `len` bytes at `addr` are one allocation that does not move or
    /// shrink while `pin` is locked, and its owner holds `pin` and releases
    /// it ([`HostPin::release`]) before it frees the memory.
    unsafe fn new(pin: &'a HostPin, addr: usize, len: usize) -> Self {
        Self { pin, addr, len }
    }

    /// The page-lock slot.
    pub(crate) fn pin(&self) -> &'a HostPin {
        self.pin
    }

    /// The allocation's first byte.
    pub(crate) fn addr(&self) -> usize {
        self.addr
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// `T`s as `UnsafeCell<T>`s, in place.
fn into_cells<T>(v: Vec<T>) -> Vec<UnsafeCell<T>> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: `UnsafeCell<T>` is `repr(transparent)` over `T` (same size,
    // alignment and validity), so the allocation of `capacity` `T`s is one
    // of as many cells (the same layout to free it with), its first `len`
    // holding the same values; `v` owned it alone and is not used again.
    unsafe {
        Vec::from_raw_parts(
            v.as_mut_ptr().cast::<UnsafeCell<T>>(),
            v.len(),
            v.capacity(),
        )
    }
}

/// `UnsafeCell<T>`s as `T`s, in place.
fn from_cells<T>(v: Vec<UnsafeCell<T>>) -> Vec<T> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: as in `into_cells`, the other way; owning the vector
    // excludes every other access to the cells.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
}

/// A fixed-size buffer of `items × stride` elements whose item ranges are written
/// concurrently by the workers that own them.
///
/// The one way to write it from `&self` is [`DisjointBuf::chunk_mut`] (or
/// [`DisjointBuf::chunk_mut_blocks`]), which takes the worker's claim
/// ([`Chunk`]) and gives the elements of exactly the claim's items. Claims of
/// one job never overlap, a claim hands out each buffer's slice once, and
/// the map from items to elements is fixed for the job at its first claim
/// (item `i` is buffer item `i`, or block `i / grain`), so two `&mut` to the
/// same element cannot exist. A kernel with several output buffers takes
/// one slice from each with the same chunk:
///
/// ```
/// use coexec_kernels::{with_chunk, DisjointBuf};
///
/// let (mut a, mut b) = (DisjointBuf::<u32>::new(8, 1), DisjointBuf::<u32>::new(8, 2));
/// with_chunk(&mut (), 2..4, |_, c| {
///     let (x, y) = (a.chunk_mut(c), b.chunk_mut(c));
///     x.fill(1);
///     y.fill(2);
/// });
/// assert_eq!(a.as_slice(), &[0, 0, 1, 1, 0, 0, 0, 0]);
/// assert_eq!(&b.as_slice()[4..8], &[2, 2, 2, 2]);
/// ```
///
/// Taking the same buffer's slice twice from one chunk panics, and so does
/// taking it with another map than the job's first claim used (the two
/// claims below own items 0..4 and 4..8, but block 1 of 4 items would be
/// element 1, which the first slice holds):
///
/// ```should_panic
/// use coexec_kernels::{claim_parts, DisjointBuf};
///
/// let mut b = DisjointBuf::<u32>::new(8, 1);
/// let (b, parts) = claim_parts(&mut b, &[0, 4, 8]);
/// let x = b.chunk_mut(&parts[0]); // items 0..4: elements 0..4
/// let y = b.chunk_mut_blocks(&parts[1], 4); // panics: another map
/// x[1] = y[0];
/// ```
///
/// A slice cannot outlive its chunk, and nothing else gives `&mut` to the
/// elements:
///
/// ```compile_fail
/// use coexec_kernels::{with_chunk, DisjointBuf};
/// let b = DisjointBuf::<u32>::new(8, 1);
/// let s = with_chunk(&mut (), 0..4, |_, c| b.chunk_mut(c)); // outlives the chunk
/// ```
///
/// ```compile_fail
/// let b = coexec_kernels::DisjointBuf::<u32>::new(8, 1);
/// let s: &mut [u32] = b.slice_mut(0..8); // no unchecked write access
/// ```
///
/// Reading needs `&mut self` ([`DisjointBuf::as_slice`]) or ownership
/// ([`DisjointBuf::into_vec`]): no writer can be active then.
///
/// A GPU stream may page-lock a large buffer for as long as it lives, to
/// copy results straight into it; dropping the buffer (or
/// [`DisjointBuf::into_vec`]) first waits for those streams and unlocks it.
pub struct DisjointBuf<T> {
    mem: HostBuf<UnsafeCell<T>>,
    stride: usize,
    /// This buffer's id, for the claims' "taken" check.
    id: u64,
    /// The id of the claim space (job) it is bound to; 0: none yet.
    owner_id: AtomicU64,
    /// Items per element block while bound to that space (1: item `i` is
    /// buffer item `i`): the item-to-element map every claim of the job
    /// must use. Written before `owner_id` (release), under `owner`.
    owner_grain: AtomicUsize,
    /// That space, to tell whether it is still alive.
    owner: Mutex<Weak<ClaimSpace>>,
}

// SAFETY: `&self` hands out `&mut [T]` only through `chunk_mut*`, for elements
// of the caller's claim: live claims of one space never overlap (the space
// refuses an overlapping one, `Chunk::claim`), the buffer serves one live space at a
// time and maps items to elements one way for it (`bind`), so disjoint
// claims get disjoint elements, and a claim hands out one slice per buffer
// (`Chunk::take`).
// So sharing the buffer moves `T` values between threads (`T: Send`); `T:
// Sync` as well, since the elements are reachable from several threads over
// the buffer's life.
unsafe impl<T: Send + Sync> Sync for DisjointBuf<T> {}

impl<T: Copy + Default> DisjointBuf<T> {
    /// A buffer of `items` items of `stride` elements each, filled with `T::default()`.
    pub fn new(items: usize, stride: usize) -> Self {
        Self::filled(items, stride, T::default())
    }

    /// A buffer of `items × stride` elements, each `value`.
    pub fn filled(items: usize, stride: usize, value: T) -> Self {
        Self::from_vec(vec![value; items * stride], stride)
    }
}

impl<T> DisjointBuf<T> {
    /// Wraps an existing vector (in place); its length must be a multiple
    /// of `stride`.
    pub fn from_vec(v: Vec<T>, stride: usize) -> Self {
        Self::from_host(HostBuf::from(v), stride)
    }

    /// Wraps a host buffer in place, keeping its page-lock (a kernel's
    /// input row that becomes the next run's output row).
    pub(crate) fn from_host(h: HostBuf<T>, stride: usize) -> Self {
        assert!(
            stride > 0 && h.len().is_multiple_of(stride),
            "length not a multiple of stride"
        );
        let (pin, data) = h.into_parts();
        Self {
            mem: HostBuf {
                pin,
                data: into_cells(data),
            },
            stride,
            id: next_id(),
            owner_id: AtomicU64::new(0),
            owner_grain: AtomicUsize::new(1),
            owner: Mutex::new(Weak::new()),
        }
    }

    /// The elements as a host buffer, in place, keeping the page-lock.
    /// Owning the buffer proves that no writer is active.
    pub(crate) fn into_host(self) -> HostBuf<T> {
        let (pin, data) = self.mem.into_parts();
        HostBuf {
            pin,
            data: from_cells(data),
        }
    }

    /// The page-lock slot, for copies into the elements.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pin(&self) -> &HostPin {
        self.mem.pin()
    }

    /// The whole allocation with its page-lock slot, for a stream to lock
    /// (writers may be active: locking reads and writes no element).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pinnable(&self) -> Pinnable<'_> {
        self.mem.pinnable()
    }

    /// Number of items.
    pub fn items(&self) -> usize {
        self.mem.len() / self.stride.max(1)
    }

    /// Elements per item.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Binds the buffer to `chunk`'s space with blocks of `grain` items, or
    /// panics if another live space (a job still running) holds it, or if
    /// this space's earlier claims used another grain: with two maps, two
    /// disjoint claims could reach the same elements.
    fn bind(&self, chunk: &Chunk, grain: usize) {
        let space = chunk.space();
        // Bound to this space already (which `chunk` keeps alive, so nobody
        // rebinds meanwhile): the acquire load makes its grain visible.
        if self.owner_id.load(Ordering::Acquire) != space.id() {
            let mut owner = self.owner.lock().unwrap_or_else(|e| e.into_inner());
            match owner.upgrade() {
                Some(live) if live.id() != space.id() => {
                    panic!("a DisjointBuf is written by two jobs at once (shared between kernels?)")
                }
                // Another worker of this job bound it since the load above.
                Some(_) => {}
                None => {
                    self.owner_grain.store(grain, Ordering::Relaxed);
                    *owner = std::sync::Arc::downgrade(space);
                    self.owner_id.store(space.id(), Ordering::Release);
                    return;
                }
            }
        }
        let bound = self.owner_grain.load(Ordering::Relaxed);
        assert!(
            bound == grain,
            "a DisjointBuf is written in blocks of {grain} items by a job whose first claim used blocks of {bound} (one buffer, one map per job)"
        );
    }

    /// The elements of `chunk`'s items, for writing.
    ///
    /// # Panics
    ///
    /// If the chunk is out of bounds, if this buffer's slice was already
    /// taken from `chunk`, if another job is writing the buffer, or if this
    /// job's claims took it in blocks ([`DisjointBuf::chunk_mut_blocks`]).
    #[allow(clippy::mut_from_ref)]
    pub fn chunk_mut<'a>(&'a self, chunk: &'a Chunk) -> &'a mut [T] {
        self.elements(chunk, chunk.range(), 1)
    }

    /// The elements of `chunk`'s blocks of `grain` items (item block `b` is
    /// this buffer's item `b`): for kernels that keep one partial result per
    /// block ([`Kernel::grain`](crate::Kernel::grain)).
    ///
    /// Sound because claims are grain-aligned: a chunk starts on a block
    /// boundary and ends on one or inside this buffer's last block, and every
    /// claim of a job uses the same grain, so two claims never share a block.
    ///
    /// # Panics
    ///
    /// If the chunk is not aligned that way, out of bounds, if this job's
    /// claims took the buffer with another grain (or item by item, grain 1),
    /// or as [`DisjointBuf::chunk_mut`].
    #[allow(clippy::mut_from_ref)]
    pub fn chunk_mut_blocks<'a>(&'a self, chunk: &'a Chunk, grain: usize) -> &'a mut [T] {
        assert!(grain > 0, "grain 0");
        let blocks = chunk.lo() / grain..chunk.hi().div_ceil(grain);
        assert!(
            chunk.lo().is_multiple_of(grain)
                && (chunk.hi().is_multiple_of(grain) || blocks.end == self.items()),
            "chunk {:?} is not aligned on grain {grain}",
            chunk.range()
        );
        self.elements(chunk, blocks, grain)
    }

    /// The elements of buffer items `items`, which `chunk`'s items map to
    /// in blocks of `grain`.
    #[allow(clippy::mut_from_ref)]
    fn elements<'a>(&'a self, chunk: &'a Chunk, items: Range<usize>, grain: usize) -> &'a mut [T] {
        let lo = items.start * self.stride;
        let hi = items.end * self.stride;
        let cells = &self.mem[lo..hi];
        self.bind(chunk, grain);
        chunk.take(self.id);
        // SAFETY: `UnsafeCell<T>` has the layout of `T`. No other reference to
        // these elements is alive: other claims of this space hold other items
        // and, mapped with the same grain (`bind`), other blocks; other spaces
        // are refused by `bind` while this one lives; this claim hands out
        // this buffer's slice once (`take`); and `&self` readers do not exist
        // (reads need `&mut self`).
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), cells.len()) }
    }

    /// All elements, for reading once writers are done.
    pub fn as_slice(&mut self) -> &[T] {
        self.as_mut_slice()
    }

    /// All elements, for writing with the buffer held exclusively.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        let len = self.mem.len();
        // SAFETY: `&mut self` excludes every writer; layout as above.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(self.mem.as_ptr()), len) }
    }

    /// The elements as a vector (in place unless page-locked memory could
    /// not be unlocked).
    pub fn into_vec(self) -> Vec<T> {
        self.into_host().into_vec()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for DisjointBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisjointBuf")
            .field("items", &self.items())
            .field("stride", &self.stride)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::with_chunk;

    fn mint(space: &Arc<ClaimSpace>, r: Range<usize>) -> Chunk {
        Chunk::claim(space, r).expect("the tests claim disjoint ranges per space")
    }

    #[test]
    fn buf_disjoint_claims_write_concurrently() {
        let mut b = DisjointBuf::<u32>::new(10, 2);
        let space = ClaimSpace::new();
        std::thread::scope(|s| {
            for (lo, hi) in [(0, 4), (4, 10)] {
                let (b, space) = (&b, &space);
                s.spawn(move || {
                    let c = mint(space, lo..hi);
                    let out = b.chunk_mut(&c);
                    for (k, v) in out.iter_mut().enumerate() {
                        *v = (lo * 2 + k) as u32;
                    }
                });
            }
        });
        assert_eq!(b.as_slice(), (0..20).collect::<Vec<u32>>().as_slice());
    }

    #[test]
    #[should_panic(expected = "taken twice")]
    fn buf_a_claim_gives_one_slice_per_buffer() {
        let b = DisjointBuf::<u32>::new(4, 1);
        let space = ClaimSpace::new();
        let c = mint(&space, 0..4);
        let _x = b.chunk_mut(&c);
        let _y = b.chunk_mut(&c);
    }

    #[test]
    fn buf_rearm_allows_a_second_attempt() {
        let mut b = DisjointBuf::<u32>::new(4, 1);
        let space = ClaimSpace::new();
        let mut c = mint(&space, 1..3);
        b.chunk_mut(&c).fill(1);
        c.rearm();
        b.chunk_mut(&c).fill(2);
        drop(c);
        assert_eq!(b.as_slice(), &[0, 2, 2, 0]);
    }

    #[test]
    #[should_panic(expected = "two jobs")]
    fn buf_two_live_jobs_cannot_share_a_buffer() {
        let b = DisjointBuf::<u32>::new(4, 1);
        let (s1, s2) = (ClaimSpace::new(), ClaimSpace::new());
        let c1 = mint(&s1, 0..2);
        let c2 = mint(&s2, 2..4);
        let _x = b.chunk_mut(&c1);
        let _y = b.chunk_mut(&c2);
    }

    #[test]
    fn buf_binds_to_the_next_job_once_the_first_is_gone() {
        let mut b = DisjointBuf::<u32>::new(4, 1);
        for v in 1..4 {
            let space = ClaimSpace::new();
            let c = mint(&space, 0..4);
            b.chunk_mut(&c).fill(v);
        }
        assert_eq!(b.as_slice(), &[3; 4]);
    }

    /// A claim that overlaps a live one of its space is refused, in every
    /// build (the space records its live claims in release builds too).
    #[test]
    fn buf_overlapping_claims_are_refused() {
        let space = ClaimSpace::new();
        let _a = mint(&space, 0..5);
        assert!(Chunk::claim(&space, 4..8).is_none());
        let _b = mint(&space, 5..8);
    }

    #[test]
    fn buf_blocks_follow_the_grain() {
        let mut b = DisjointBuf::<u32>::new(3, 1); // 3 blocks of 4 items: 10 items
        let space = ClaimSpace::new();
        {
            let (c1, c2) = (mint(&space, 0..4), mint(&space, 4..10));
            b.chunk_mut_blocks(&c1, 4).fill(1);
            b.chunk_mut_blocks(&c2, 4).fill(2);
        }
        assert_eq!(b.as_slice(), &[1, 2, 2]);
    }

    #[test]
    #[should_panic(expected = "not aligned")]
    fn buf_blocks_refuse_an_unaligned_chunk() {
        let b = DisjointBuf::<u32>::new(3, 1);
        let space = ClaimSpace::new();
        let c = mint(&space, 0..5);
        let _ = b.chunk_mut_blocks(&c, 4);
    }

    #[test]
    fn buf_large_buffers_keep_the_next_one_off_their_pages() {
        let n = PIN_MIN_BYTES / 4 + 1;
        let v: Vec<u32> = crate::workload::try_zeroed("test", n).unwrap();
        assert!((v.capacity() - v.len()) * 4 >= PIN_SLACK_BYTES);
        let (ptr, cap) = (v.as_ptr(), v.capacity());
        // Turned into an output and back in place: same memory, same room.
        let d = DisjointBuf::from_host(HostBuf::from(v), 1);
        let h = d.into_host();
        assert_eq!((h.as_ptr(), h.len()), (ptr, n));
        let v = DisjointBuf::from_vec(h.into_vec(), 1).into_vec();
        assert_eq!((v.as_ptr(), v.capacity()), (ptr, cap));
        // Small ones are never locked: no room kept.
        let s: Vec<u32> = crate::workload::try_zeroed("test", 10).unwrap();
        assert_eq!(s.capacity(), 10);
    }

    /// The overlap a second map would make: items 0..4 taken item by item are elements
    /// 0..4; items 4..8 in blocks of 4 would be element 1.
    #[test]
    #[should_panic(expected = "one map per job")]
    fn buf_items_and_blocks_cannot_mix_in_one_job() {
        let b = DisjointBuf::<u32>::new(8, 1);
        let space = ClaimSpace::new();
        let (c1, c2) = (mint(&space, 0..4), mint(&space, 4..8));
        let _x = b.chunk_mut(&c1);
        let _y = b.chunk_mut_blocks(&c2, 4);
    }

    /// Two grains on one buffer: 0..4 in blocks of 2 is elements 0..2, 4..8
    /// in blocks of 4 is element 1. Across two threads that would be a data
    /// race (Miri checks that neither thread gets its slice while the other
    /// writes): whichever binds second panics.
    #[test]
    fn buf_two_grains_cannot_mix_in_one_job_across_threads() {
        let mut b = DisjointBuf::<u32>::new(8, 1);
        let space = ClaimSpace::new();
        let refused = std::thread::scope(|s| {
            let workers: Vec<_> = [(0..4, 2), (4..8, 4)]
                .into_iter()
                .map(|(r, grain)| {
                    let (b, c) = (&b, mint(&space, r));
                    s.spawn(move || b.chunk_mut_blocks(&c, grain).fill(grain as u32))
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join())
                .filter(Result::is_err)
                .count()
        });
        assert_eq!(refused, 1, "one of the two maps is refused");
        let v = b.as_slice();
        assert!(
            v == [2, 2, 0, 0, 0, 0, 0, 0] || v == [0, 4, 0, 0, 0, 0, 0, 0],
            "{v:?}"
        );
    }

    #[test]
    fn buf_the_next_job_may_map_another_way() {
        let mut b = DisjointBuf::<u32>::new(4, 1);
        with_chunk(&mut (), 0..4, |_, c| b.chunk_mut(c).fill(1));
        with_chunk(&mut (), 0..8, |_, c| b.chunk_mut_blocks(c, 2).fill(2));
        assert_eq!(b.as_slice(), &[2; 4]);
    }

    #[test]
    fn buf_zero_items() {
        let mut b = DisjointBuf::<u32>::new(0, 3);
        let space = ClaimSpace::new();
        let c = mint(&space, 0..0);
        assert!(b.chunk_mut(&c).is_empty());
        drop(c);
        assert!(b.as_slice().is_empty());
    }
}
