//! The bytes the requests in progress may hold at once, by estimate: one
//! budget that every route taking a body draws from (the queue's routes
//! at admission, `/tokenize` and `/decode`, whose answers are far larger
//! than their bodies), so that concurrent requests cannot add memory
//! without bound. A request the budget cannot cover now gets 429, as a
//! full queue does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A budget of bytes (a plain struct: its callers decide what a request
/// weighs).
#[derive(Debug)]
pub(super) struct Budget {
    limit: u64,
    held: AtomicU64,
}

impl Budget {
    pub(super) fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicU64::new(0),
        })
    }

    /// The budget's size.
    pub(super) fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes held now.
    pub(super) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `bytes` while they are free, or `None`. A request that weighs
    /// more than the whole budget takes all of it (it runs alone, never
    /// refused for good).
    pub(super) fn try_take(self: &Arc<Self>, bytes: u64) -> Option<Held> {
        let bytes = bytes.min(self.limit);
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |h| {
                (h.saturating_add(bytes) <= self.limit).then_some(h + bytes)
            })
            .ok()?;
        Some(Held {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`Budget`], given back on drop: moved along with
/// the work they cover (onto the blocking pool, into an answer's body), so
/// that they are held as long as the memory is, and not only while the
/// handler waits (a client that goes away drops its handler, not the work
/// under way).
#[derive(Debug)]
pub(super) struct Held {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Held {
    /// Gives back all but `bytes` (the estimate taken was an upper bound,
    /// and the work now knows what it holds).
    pub(super) fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget
                .held
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// `bytes`, kept alive with the budget they hold: an answer's body that
/// gives its bytes back to the budget when the server drops it, once
/// written.
pub(super) fn held_body(bytes: Vec<u8>, mut held: Held) -> axum::body::Bytes {
    held.shrink_to(bytes.len() as u64);
    axum::body::Bytes::from_owner(Owned { bytes, _held: held })
}

struct Owned {
    bytes: Vec<u8>,
    _held: Held,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_is_free_and_gives_it_back_on_drop() {
        let b = Budget::new(100);
        let a = b.try_take(60).expect("free");
        assert!(b.try_take(41).is_none(), "over the budget");
        let c = b.try_take(40).expect("exactly the rest");
        assert_eq!(b.held(), 100);
        drop(a);
        assert_eq!(b.held(), 40);
        drop(c);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_request_past_the_budget_takes_all_of_it_and_runs_alone() {
        let b = Budget::new(100);
        let big = b.try_take(1_000).expect("alone, it runs");
        assert_eq!(b.held(), 100);
        assert!(b.try_take(1).is_none());
        drop(big);
        assert!(b.try_take(u64::MAX).is_some());
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_body_holds_its_own_length_until_dropped() {
        let b = Budget::new(1_000);
        let held = b.try_take(900).unwrap();
        let body = held_body(vec![7; 30], held);
        assert_eq!(b.held(), 30, "the estimate shrunk to the answer");
        let copy = body.clone();
        drop(body);
        assert_eq!(b.held(), 30, "a clone still holds it");
        assert_eq!(&copy[..], &[7; 30][..]);
        drop(copy);
        assert_eq!(b.held(), 0);
    }
}
