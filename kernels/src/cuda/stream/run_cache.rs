//! Inputs shared by every chunk of a run, kept on the device once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RunKey {
    pub(super) owner: usize,
    pub(super) tag: u64,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) print: u64,
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

/// A 64-bit hash of all of an input up to 1 MiB, and of 8192 evenly spread
/// 8-byte words (and the last one) beyond: at most a few hundred
/// microseconds, so it can run for every chunk.
pub(super) fn fingerprint(bytes: &[u8]) -> u64 {
    const WHOLE: usize = 1 << 20;
    const SAMPLES: usize = 8192;
    let word = |at: usize| -> u64 {
        let mut w = [0u8; 8];
        let b = &bytes[at..(at + 8).min(bytes.len())];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let mut h = (bytes.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut eat = |w: u64| {
        h = (h.rotate_left(23) ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    };
    if bytes.len() <= WHOLE {
        for at in (0..bytes.len()).step_by(8) {
            eat(word(at));
        }
    } else {
        let step = (bytes.len() - 8) / (SAMPLES - 1);
        for k in 0..SAMPLES {
            eat(word(k * step));
        }
        eat(word(bytes.len() - 8));
    }
    h ^ (h >> 29)
}
