//! An output buffer that several workers write at once, each into its own items.

use std::cell::UnsafeCell;
use std::ops::Range;

/// A fixed-size buffer of `items × stride` elements whose item ranges are written
/// concurrently by the workers that own them.
///
/// The runtime hands every item range of a job to exactly one worker at a time
/// (the broker's claim is the proof), so two workers never touch the same
/// elements. The buffer itself cannot check that; the one way to write it is the
/// `unsafe` [`DisjointBuf::slice_mut`], whose caller states the guarantee.
pub struct DisjointBuf<T> {
    data: Box<[UnsafeCell<T>]>,
    stride: usize,
}

// SAFETY: the buffer hands out `&mut` only through `slice_mut`, whose contract
// forbids overlapping live borrows; shared reads happen only through `&mut self`
// or `into_vec`, after all writers are gone.
unsafe impl<T: Send> Sync for DisjointBuf<T> {}

impl<T: Copy + Default> DisjointBuf<T> {
    /// A buffer of `items` items of `stride` elements each, filled with `T::default()`.
    pub fn new(items: usize, stride: usize) -> Self {
        Self::filled(items, stride, T::default())
    }

    /// A buffer of `items × stride` elements, each `value`.
    pub fn filled(items: usize, stride: usize, value: T) -> Self {
        let data = (0..items * stride)
            .map(|_| UnsafeCell::new(value))
            .collect();
        Self { data, stride }
    }
}

impl<T> DisjointBuf<T> {
    /// Wraps an existing vector; its length must be a multiple of `stride`.
    pub fn from_vec(v: Vec<T>, stride: usize) -> Self {
        assert!(
            stride > 0 && v.len().is_multiple_of(stride),
            "length not a multiple of stride"
        );
        Self {
            data: v.into_iter().map(UnsafeCell::new).collect(),
            stride,
        }
    }

    /// Number of items.
    pub fn items(&self) -> usize {
        self.data.len() / self.stride.max(1)
    }

    /// Elements per item.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The elements of items `range`, for writing.
    ///
    /// # Safety
    ///
    /// No other reference to any element of these items may be alive while the
    /// returned slice is: the caller owns `range` exclusively (a chunk the
    /// broker handed to this worker) and takes at most one slice of it per
    /// buffer at a time.
    ///
    /// # Panics
    ///
    /// If `range` is out of bounds.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [T] {
        let lo = range.start * self.stride;
        let hi = range.end * self.stride;
        let cells = &self.data[lo..hi];
        // SAFETY: `UnsafeCell<T>` has the layout of `T`; exclusivity over these
        // elements is the caller's promise above.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), cells.len()) }
    }

    /// All elements, for reading once writers are done.
    pub fn as_slice(&mut self) -> &[T] {
        let len = self.data.len();
        // SAFETY: `&mut self` excludes every writer; layout as above.
        unsafe { std::slice::from_raw_parts(UnsafeCell::raw_get(self.data.as_ptr()), len) }
    }

    /// All elements, for reading, from a shared reference.
    ///
    /// # Safety
    ///
    /// No writer may be active on any element (the job is not running).
    pub unsafe fn as_slice_shared(&self) -> &[T] {
        // SAFETY: the caller guarantees no concurrent writer.
        unsafe {
            std::slice::from_raw_parts(UnsafeCell::raw_get(self.data.as_ptr()), self.data.len())
        }
    }

    /// The elements as a vector.
    pub fn into_vec(self) -> Vec<T> {
        self.data
            .into_vec()
            .into_iter()
            .map(UnsafeCell::into_inner)
            .collect()
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
    use super::*;

    #[test]
    fn disjoint_writes_land() {
        let mut b = DisjointBuf::<u32>::new(10, 2);
        std::thread::scope(|s| {
            for (lo, hi) in [(0, 4), (4, 10)] {
                let b = &b;
                s.spawn(move || {
                    // SAFETY: the two ranges are disjoint and each taken once.
                    let out = unsafe { b.slice_mut(lo..hi) };
                    for (k, v) in out.iter_mut().enumerate() {
                        *v = (lo * 2 + k) as u32;
                    }
                });
            }
        });
        assert_eq!(b.as_slice(), (0..20).collect::<Vec<u32>>().as_slice());
    }
}
