//! Where a job's items stand: their regions and how far the job is
//! through them.

use super::*;

/// The job's items: the space its chunks are taken from, which region each
/// class claims from, and how many are done.
pub(super) struct Progress {
    pub(super) items: usize,
    pub(super) grain: usize,
    pub(super) space: Space,
    /// Per class, the region it claims from: its own, or with a pool, the
    /// one region.
    pub(super) home: Vec<usize>,
    /// The regions in the item space's order: head-eaters first.
    pub(super) order: Vec<usize>,
    /// Items of completed chunks.
    pub(super) done: usize,
    /// Chunks claimed and not yet completed or failed.
    pub(super) in_flight: usize,
}

impl Progress {
    /// Items left in the region class `c` claims from.
    pub(super) fn own_left(&self, c: usize) -> usize {
        self.space.left(self.home[c])
    }

    /// Whether every item is done and no chunk is in flight.
    pub(super) fn is_done(&self) -> bool {
        self.done == self.items && self.in_flight == 0
    }
}
