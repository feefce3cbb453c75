//! What a profile may hold: the one validity rule that loading and saving
//! share, and the caps on kernels and file size.

use std::collections::BTreeMap;

use super::store::{KernelProfile, ProfileFile};
use crate::perfmodel::SpeedModel;

/// A stored fixed cost per chunk above this is not believed (seconds): no
/// probe measures a chunk's launch and transfer at a minute.
pub const MAX_FIXED_S: f64 = 60.0;
/// Speeds outside this range are not believed (items per second per
/// worker): slower than an item per quarter hour. No finite speed is too
/// fast: a chunk whose time is all fixed cost fits a speed as large as
/// `f64` holds (a GPU's 1e20 items/s on short matmul runs; the empty
/// kernel's 8.5e14).
pub const SPEED_RANGE: std::ops::RangeInclusive<f64> = 1e-3..=f64::MAX;

/// Why a stored model is not believed, or `None` if it is plausible.
///
/// ```
/// use coexec_actors::profiler::implausible;
/// use coexec_actors::SpeedModel;
///
/// assert!(implausible(&SpeedModel::with_params(1e-4, 2e5)).is_none());
/// assert!(implausible(&SpeedModel::with_params(1e308, 2e5)).is_some());
/// assert!(implausible(&SpeedModel::with_params(0.0, 1e-300)).is_some());
/// ```
pub fn implausible(m: &SpeedModel) -> Option<String> {
    let (a, b) = (m.a(), m.b());
    if !(a.is_finite() && (0.0..=MAX_FIXED_S).contains(&a)) {
        return Some(format!("fixed cost {a} s outside 0..={MAX_FIXED_S} s"));
    }
    if !(b.is_finite() && SPEED_RANGE.contains(&b)) {
        return Some(format!(
            "speed {b} items/s outside {:e}..={:e}",
            SPEED_RANGE.start(),
            SPEED_RANGE.end()
        ));
    }
    let bad = m
        .samples()
        .iter()
        .filter(|s| !(s.items.is_finite() && s.secs.is_finite() && s.items > 0.0 && s.secs > 0.0))
        .count();
    (bad > 0).then(|| format!("{bad} sample(s) not finite and positive"))
}

/// Kernels a profile keeps at most: past it, the least recently run are
/// dropped (a service that made a kernel key per request would otherwise
/// grow its profile, and every load and save, without end).
pub const MAX_KERNELS: usize = 512;
/// Largest profile file read (bytes): a larger one is not read (it would
/// take seconds and gigabytes to parse) and is moved aside at the next
/// save. [`MAX_KERNELS`] kernels with four classes' full sample windows
/// take about 14 MiB (28 KiB each).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The one validity rule of a profile, applied to what is loaded and to
/// what is saved alike: implausible models, splits that are not shares,
/// sample windows longer than [`WINDOW`](crate::perfmodel::WINDOW), and
/// kernels past [`MAX_KERNELS`] (the least recently run) are dropped.
/// Returns what was dropped, one entry per model, split or kernel count.
pub(super) fn sanitize(file: &mut ProfileFile) -> Vec<String> {
    let mut dropped = Vec::new();
    let excess = file.kernels.len().saturating_sub(MAX_KERNELS);
    if excess > 0 {
        let mut by_age: Vec<(u64, String)> = file
            .kernels
            .iter()
            .map(|(k, p)| (p.last_run_ms, k.clone()))
            .collect();
        by_age.sort_unstable();
        for (_, k) in by_age.into_iter().take(excess) {
            file.kernels.remove(&k);
        }
        dropped.push(format!(
            "{excess} least recently run kernel(s) past the cap of {MAX_KERNELS}"
        ));
    }
    for (kernel, k) in &mut file.kernels {
        k.models.retain(|class, m| match implausible(m) {
            Some(why) => {
                dropped.push(format!("{kernel:?}/{class:?}: {why}"));
                false
            }
            None => {
                m.keep_window();
                true
            }
        });
        let shares_ok = k
            .split
            .values()
            .all(|p| p.is_finite() && (0.0..=1.0).contains(p))
            && k.split.values().sum::<f64>() <= 1.0 + 1e-6;
        if !shares_ok {
            dropped.push(format!(
                "{kernel:?}: stored split {:?} is not shares",
                k.split
            ));
            k.split.clear();
        }
    }
    dropped
}

/// The kernels of a profile being read, the [`MAX_KERNELS`] most recently
/// run kept as they come and the rest dropped at once: reading costs what
/// is kept, not what the file holds (a file of 10^6 tiny kernels under the
/// byte cap took 690 MB to parse whole).
pub(super) fn recent_kernels<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, KernelProfile>, D::Error> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    struct Recent;
    impl<'de> serde::de::Visitor<'de> for Recent {
        type Value = BTreeMap<String, KernelProfile>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of kernel profiles")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            // Oldest first; an entry whose key was replaced since is stale.
            let mut by_age = BinaryHeap::new();
            let mut dropped = 0usize;
            while let Some((key, k)) = m.next_entry::<String, KernelProfile>()? {
                by_age.push(Reverse((k.last_run_ms, key.clone())));
                kept.insert(key, k);
                while kept.len() > MAX_KERNELS {
                    let Some(Reverse((t, key))) = by_age.pop() else {
                        break;
                    };
                    if kept.get(&key).is_some_and(|k| k.last_run_ms == t) {
                        kept.remove(&key);
                        dropped += 1;
                    }
                }
            }
            if dropped > 0 {
                tracing::warn!(
                    "profile: {dropped} least recently run kernel(s) past the cap of {MAX_KERNELS} not read"
                );
            }
            Ok(kept)
        }
    }
    d.deserialize_map(Recent)
}
