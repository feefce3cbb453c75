//! Inputs shared by every chunk of a run, kept on the device once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

/// A cached input: the id of the owner that keeps it unchanged (see
/// [`StreamWorker::run_input`](super::StreamWorker::run_input)), and where
/// it is (an owner may have several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RunKey {
    id: u64,
    ptr: usize,
    len: usize,
}

impl RunKey {
    pub(super) fn new(id: u64, bytes: &[u8]) -> Self {
        Self {
            id,
            ptr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }
}

pub(super) type Entry = Arc<Mutex<Option<Arc<CudaSlice<u8>>>>>;

/// Inputs shared by every chunk of a run, on one device, and constants
/// (a model's weights) shared by every run. Small and recent: a run reads a
/// few inputs, and a new run's inputs push out the least recently used ones
/// (buffers still held by a stream are freed when it lets go).
#[derive(Default)]
pub(crate) struct RunCache {
    entries: Mutex<VecDeque<(RunKey, Entry)>>,
}

impl RunCache {
    pub(super) const CAPACITY: usize = 16;

    pub(super) fn entry(&self, key: RunKey) -> Entry {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = entries.iter().position(|(k, _)| *k == key) {
            // Most recently used last, so constants used by every run stay.
            let hit = entries.remove(i).expect("found");
            let e = hit.1.clone();
            entries.push_back(hit);
            return e;
        }
        let e = Entry::default();
        entries.push_back((key, e.clone()));
        while entries.len() > Self::CAPACITY {
            entries.pop_front();
        }
        e
    }
}
