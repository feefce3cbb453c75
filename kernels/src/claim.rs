//! Claims: the proof that a worker owns a range of a job's items.
//!
//! A [`Chunk`] is the only key to a kernel's outputs ([`DisjointBuf::chunk_mut`]).
//! Safe code cannot make one: the runtime's broker mints a chunk for items it
//! has handed to one worker alone (the one `unsafe` call, in
//! `coexec-actors`' worker loop), and [`with_chunk`] mints one for a caller
//! that holds the kernel exclusively (`&mut K`). A chunk cannot be cloned and
//! is not `Sync`, so it stays with the one call that runs it.
//!
//! Every chunk belongs to a [`ClaimSpace`] (one per job). A buffer binds to the
//! space of the first chunk that writes it and refuses, by a panic, chunks of
//! another space while that space is alive; so a buffer shared between two
//! kernels (an `Arc<DisjointBuf>` in both) cannot be written by two jobs at
//! once. In debug builds a space also records its live claims and panics on
//! an overlap.
//!
//! [`DisjointBuf::chunk_mut`]: crate::DisjointBuf::chunk_mut

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh process-wide id (never 0).
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The item space of one job, within which claims never overlap.
///
/// Creating one is harmless; what matters is minting chunks in it
/// ([`Chunk::new_unchecked`]).
#[derive(Debug)]
pub struct ClaimSpace {
    id: u64,
    #[cfg(debug_assertions)]
    live: std::sync::Mutex<Vec<Range<usize>>>,
}

impl ClaimSpace {
    /// A new space, distinct from every other.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            id: next_id(),
            #[cfg(debug_assertions)]
            live: Default::default(),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    #[cfg(debug_assertions)]
    fn enter(&self, r: &Range<usize>) {
        if r.is_empty() {
            return;
        }
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = live
            .iter()
            .find(|o| !o.is_empty() && o.start < r.end && r.start < o.end)
        {
            panic!("claim {r:?} overlaps live claim {o:?} of the same job (a bug in the broker)");
        }
        live.push(r.clone());
    }

    #[cfg(debug_assertions)]
    fn leave(&self, r: &Range<usize>) {
        if r.is_empty() {
            return;
        }
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = live.iter().position(|o| o == r) {
            live.swap_remove(i);
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
/// let space = coexec_kernels::ClaimSpace::new();
/// let c = coexec_kernels::Chunk::new_unchecked(&space, 0..8); // unsafe
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
    /// Mints a claim on `range` in `space`.
    ///
    /// # Safety
    ///
    /// While the returned chunk lives, no other live chunk of `space` may
    /// overlap `range`, and every chunk of `space` must be for the same
    /// kernel (the same item numbering). The broker's item space guarantees
    /// it (its partition property test is the proof); debug builds check it.
    #[doc(hidden)]
    pub unsafe fn new_unchecked(space: &Arc<ClaimSpace>, range: Range<usize>) -> Self {
        assert!(range.start <= range.end, "inverted range {range:?}");
        #[cfg(debug_assertions)]
        space.enter(&range);
        Self {
            range,
            space: space.clone(),
            taken: RefCell::new(Vec::new()),
        }
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
        #[cfg(debug_assertions)]
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
pub fn with_chunk<K: ?Sized, R>(
    kernel: &mut K,
    range: Range<usize>,
    f: impl FnOnce(&K, &Chunk) -> R,
) -> R {
    let space = ClaimSpace::new();
    // SAFETY: the space is new and this is its only chunk.
    let chunk = unsafe { Chunk::new_unchecked(&space, range) };
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
        // SAFETY: consecutive cuts of a non-decreasing list: the ranges are
        // disjoint, each minted once, in a space of their own.
        .map(|w| unsafe { Chunk::new_unchecked(&space, w[0]..w[1]) })
        .collect();
    (kernel, parts)
}
