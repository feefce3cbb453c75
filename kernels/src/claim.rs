//! Claims: the proof that a worker owns a range of a job's items.
//!
//! A [`Chunk`] is the only key to a kernel's outputs ([`DisjointBuf::chunk_mut`]).
//! Every chunk belongs to a [`ClaimSpace`] (one per job), which records its
//! live claims and refuses one that overlaps another ([`Chunk::claim`]), so
//! two live chunks of a space never share an item: the runtime's broker
//! claims the ranges it hands its workers, [`with_chunk`] and
//! [`claim_parts`] the ranges of a kernel its caller holds exclusively. A
//! chunk cannot be cloned and is not `Sync`, so it stays with the one call
//! that runs it, and its items return to the space when it is dropped.
//!
//! A buffer binds to the space of the first chunk that writes it and
//! refuses, by a panic, chunks of another space while that space is alive;
//! so a buffer shared between two kernels (an `Arc<DisjointBuf>` in both)
//! cannot be written by two jobs at once.
//!
//! [`DisjointBuf::chunk_mut`]: crate::DisjointBuf::chunk_mut

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-wide id (never 0).
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The item space of one job, within which live claims never overlap.
#[derive(Debug)]
pub struct ClaimSpace {
    id: u64,
    /// The live claims' ranges, start to end; empty ranges are not kept
    /// (they hold no item).
    live: Mutex<BTreeMap<usize, usize>>,
}

impl ClaimSpace {
    /// A new space, distinct from every other.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            id: next_id(),
            live: Default::default(),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Records `r` as live unless it overlaps a live claim.
    fn enter(&self, r: &Range<usize>) -> bool {
        if r.is_empty() {
            return true;
        }
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        // Live ranges are disjoint, so ordered by start they are ordered by
        // end too: of those starting before `r` ends, the last one reaches
        // furthest, and `r` overlaps some live range if and only if it
        // overlaps that one.
        if let Some((_, &end)) = live.range(..r.end).next_back()
            && end > r.start
        {
            return false;
        }
        live.insert(r.start, r.end);
        true
    }

    fn leave(&self, r: &Range<usize>) {
        if !r.is_empty() {
            self.live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&r.start);
        }
    }
}

/// A claim: items `[lo, hi)` of one job, owned by the call that holds it.
///
/// Kernels read the range and get their outputs for exactly these items
/// through [`DisjointBuf::chunk_mut`](crate::DisjointBuf::chunk_mut). Safe
/// code cannot create or clone a chunk:
///
/// ```compile_fail
/// let c = coexec_kernels::Chunk { range: 0..8 }; // private fields
/// ```
///
/// ```compile_fail
/// fn twice(c: &coexec_kernels::Chunk) -> (coexec_kernels::Chunk, coexec_kernels::Chunk) {
///     (c.clone(), c.clone()) // not Clone
/// }
/// ```
///
/// ```compile_fail
/// fn share(c: &coexec_kernels::Chunk) {
///     std::thread::scope(|s| { s.spawn(|| c.len()); }); // not Sync
/// }
/// ```
#[derive(Debug)]
pub struct Chunk {
    range: Range<usize>,
    space: Arc<ClaimSpace>,
    /// Ids of the buffers this claim has handed out slices of.
    taken: RefCell<Vec<u64>>,
}

impl Chunk {
    /// A claim on `range` in `space`, or `None` if `range` overlaps a live
    /// claim of the space (or is inverted). The items return to the space
    /// when the chunk is dropped.
    ///
    /// ```
    /// use coexec_kernels::{Chunk, ClaimSpace};
    ///
    /// let space = ClaimSpace::new();
    /// let a = Chunk::claim(&space, 0..600).unwrap();
    /// assert!(Chunk::claim(&space, 500..1000).is_none()); // items 500..600 are a's
    /// let b = Chunk::claim(&space, 600..1000).unwrap();
    /// drop(a);
    /// assert!(Chunk::claim(&space, 0..600).is_some());
    /// # drop(b);
    /// ```
    pub fn claim(space: &Arc<ClaimSpace>, range: Range<usize>) -> Option<Self> {
        if range.start > range.end || !space.enter(&range) {
            return None;
        }
        Some(Self {
            range,
            space: space.clone(),
            taken: RefCell::new(Vec::new()),
        })
    }

    /// The item range.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// First item.
    pub fn lo(&self) -> usize {
        self.range.start
    }

    /// One past the last item.
    pub fn hi(&self) -> usize {
        self.range.end
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.range.end - self.range.start
    }

    /// Whether the chunk holds no item.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Lets the claim hand out every buffer's slice once more (to run the
    /// chunk again after a failed attempt): `&mut self` proves that no slice
    /// taken through it is still alive.
    pub fn rearm(&mut self) {
        self.taken.get_mut().clear();
    }

    pub(crate) fn space(&self) -> &Arc<ClaimSpace> {
        &self.space
    }

    /// Records that buffer `buf` hands out its slice for this claim; panics
    /// if it already did (two live `&mut` to the same elements otherwise).
    pub(crate) fn take(&self, buf: u64) {
        let mut t = self.taken.borrow_mut();
        assert!(
            !t.contains(&buf),
            "a buffer's slice was taken twice from the same chunk"
        );
        t.push(buf);
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.space.leave(&self.range);
    }
}

/// Runs `f` with a claim on `range` of `kernel`, which the caller holds
/// exclusively: the safe way to run a kernel outside the runtime (tests,
/// [`run_sequential`](crate::run_sequential), baselines).
///
/// ```
/// use coexec_kernels::{with_chunk, Kernel, Synthetic};
///
/// let mut k = Synthetic::new(1000, 10);
/// with_chunk(&mut k, 0..600, |k, c| k.run_cpu(c)).unwrap();
/// with_chunk(&mut k, 600..1000, |k, c| k.run_cpu(c)).unwrap();
/// k.verify().unwrap();
/// ```
///
/// # Panics
///
/// If `range` is inverted (its start past its end).
pub fn with_chunk<K: ?Sized, R>(
    kernel: &mut K,
    range: Range<usize>,
    f: impl FnOnce(&K, &Chunk) -> R,
) -> R {
    let space = ClaimSpace::new();
    // The space is new: only an inverted range is refused.
    let chunk =
        Chunk::claim(&space, range.clone()).unwrap_or_else(|| panic!("inverted range {range:?}"));
    f(kernel, &chunk)
}

/// Claims on the parts of `kernel`'s items between consecutive `cuts`
/// (`cuts` non-decreasing; `[0, 600, 1000]` gives `0..600` and `600..1000`),
/// in a space of their own, with the kernel to run them: the safe way to run
/// a kernel in parallel outside the runtime (the rayon baseline). Each chunk
/// goes to one thread (`Chunk` is `Send`, not `Sync` or `Clone`).
///
/// ```
/// use coexec_kernels::{claim_parts, Kernel, Synthetic};
///
/// let mut k = Synthetic::new(1000, 10);
/// let (kr, parts) = claim_parts(&mut k, &[0, 600, 1000]);
/// std::thread::scope(|s| {
///     for c in parts {
///         s.spawn(move || kr.run_cpu(&c).unwrap());
///     }
/// });
/// k.verify().unwrap();
/// ```
///
/// # Panics
///
/// If `cuts` decrease.
pub fn claim_parts<'k, K: ?Sized>(kernel: &'k mut K, cuts: &[usize]) -> (&'k K, Vec<Chunk>) {
    assert!(
        cuts.windows(2).all(|w| w[0] <= w[1]),
        "cuts must not decrease"
    );
    let space = ClaimSpace::new();
    let parts = cuts
        .windows(2)
        // Consecutive cuts of a non-decreasing list, in a space of their
        // own: disjoint, so none is refused.
        .filter_map(|w| Chunk::claim(&space, w[0]..w[1]))
        .collect();
    (kernel, parts)
}
