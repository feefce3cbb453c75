//! Profiles on disk: one JSON file per machine fingerprint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::RunHistory;
use super::disk::{
    Locked, OPEN_LOCK_WAIT, Pending, Unusable, merge_pending, read_profile, remove_orphans,
};
pub(crate) use super::disk::{SaveDone, SaveJob};
use super::history::ClassEnd;
pub(super) use super::validity::sanitize;
pub use super::validity::{MAX_FILE_BYTES, MAX_FIXED_S, MAX_KERNELS, SPEED_RANGE, implausible};
use crate::perfmodel::{Sample, SpeedModel};
use crate::policy::Forecast;

/// Format version of the profile file.
pub const PROFILE_VERSION: u32 = 1;

/// What identifies a machine: a profile from another one is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Fingerprint {
    /// CPU model name.
    pub cpu_model: String,
    /// Logical cores.
    pub cores: usize,
    /// Names of the real accelerators (GPUs), in ordinal order.
    pub accelerators: Vec<String>,
}

impl Fingerprint {
    /// This machine, with the given accelerator names.
    pub fn this_machine(accelerators: Vec<String>) -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            cpu_model,
            cores,
            accelerators,
        }
    }

    /// A short stable hash, for the file name.
    pub fn id(&self) -> String {
        // FNV-1a over the canonical JSON: stable across runs and Rust versions.
        let text = serde_json::to_string(self).unwrap_or_default();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// What is stored for one kernel variant.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KernelProfile {
    /// Speed model per device class key.
    pub models: BTreeMap<String, SpeedModel>,
    /// The stored split P per device class key (the seed's step 4).
    pub split: BTreeMap<String, f64>,
    /// Runs observed.
    pub runs: u64,
    /// What the runs taught beyond the models.
    #[serde(default)]
    pub history: RunHistory,
    /// When a run of it was last learned from (milliseconds since the Unix
    /// epoch): past [`MAX_KERNELS`], the least recently run go first.
    #[serde(default)]
    pub last_run_ms: u64,
}

/// The profile file's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProfileFile {
    /// Format version.
    pub version: u32,
    /// The machine it was learned on.
    pub fingerprint: Fingerprint,
    /// Per kernel profile key.
    #[serde(deserialize_with = "super::validity::recent_kernels")]
    pub kernels: BTreeMap<String, KernelProfile>,
}

/// Δ of the seed's step 4: the largest relative change of a class's share
/// between the stored split and a run's; infinite where nothing is stored.
///
/// ```
/// use coexec_actors::profiler::split_delta;
///
/// assert!((split_delta(&[0.5, 0.5], &[0.4, 0.6]) - 0.2).abs() < 1e-12);
/// assert!(split_delta(&[f64::NAN, 0.5], &[0.5, 0.5]).is_infinite());
/// ```
pub fn split_delta(stored: &[f64], learned: &[f64]) -> f64 {
    stored
        .iter()
        .zip(learned)
        .map(|(p, q)| {
            if p.is_finite() {
                (p - q).abs() / p.max(1e-9)
            } else {
                f64::INFINITY
            }
        })
        .filter(|d| !d.is_nan())
        .fold(0.0, f64::max)
}

/// What a finished run says beyond its chunks' samples.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunOutcome {
    /// Per class, when its workers started their first chunks (seconds
    /// after admission; `None` where it ran none).
    pub(crate) starts: Vec<Option<f64>>,
    /// Per class, how it ended the run (`None` where it ran nothing).
    pub(crate) ends: Vec<Option<ClassEnd>>,
    pub(crate) makespan: f64,
    /// Items in the run.
    pub(crate) items: usize,
    pub(crate) forecast: Option<Forecast>,
    /// δ′ of the whole run: the spread of each class's time over what its
    /// models predicted for its chunks.
    pub(crate) prediction_imbalance: Option<f64>,
}

/// The profiler's memory: models per kernel and class, and where they live.
#[derive(Debug)]
pub struct ProfileStore {
    path: Option<PathBuf>,
    /// Shared with a save in hand (which reads it only where the file on
    /// disk is missing or unusable): learning copies it only while a save
    /// holds it, and a save copies nothing.
    file: Arc<ProfileFile>,
    pending: BTreeMap<String, Pending>,
    dirty: bool,
    last_save: Option<Instant>,
    /// The last run's stamp (see [`KernelProfile::last_run_ms`]), so that
    /// this process's stamps increase even within a millisecond.
    last_stamp: u64,
}

/// What observing a run changed.
#[derive(Debug, Clone, Copy, Serialize)]
#[non_exhaustive]
pub struct Learned {
    /// Δ = relative change between the stored split and this run's (the seed's step 4).
    pub delta: f64,
    /// Whether Δ exceeded ν (or nothing was stored) and the split was replaced.
    pub split_replaced: bool,
}

impl ProfileStore {
    /// A store that lives only in memory.
    pub fn in_memory(fingerprint: Fingerprint) -> Self {
        Self {
            path: None,
            file: Arc::new(ProfileFile {
                version: PROFILE_VERSION,
                fingerprint,
                kernels: BTreeMap::new(),
            }),
            pending: BTreeMap::new(),
            dirty: false,
            last_save: None,
            last_stamp: 0,
        }
    }

    /// The store for `fingerprint` in `dir`, loaded if a valid file is there.
    /// A corrupt or foreign file is ignored with a warning and recalibrated
    /// (the next save moves it aside, to `<file>.corrupt-<secs>` or
    /// `.foreign-<secs>`, and writes a new one); a file of another format
    /// version (a newer coexec's) is neither read nor ever written, and
    /// this store lives in memory; implausible models in a valid file are
    /// dropped with one warning (and measured again).
    pub fn open(dir: &Path, fingerprint: Fingerprint) -> Self {
        let path = dir.join(format!("coexec-profile-{}.json", fingerprint.id()));
        let mut store = Self::in_memory(fingerprint);
        if let Some(why) = super::disk::folder_problem(dir) {
            tracing::warn!("{why}: this process learns in memory");
            return store;
        }
        if path.parent().is_some_and(Path::exists) {
            match Locked::take(&path, OPEN_LOCK_WAIT) {
                Ok(_lock) => remove_orphans(&path),
                Err(e) => tracing::warn!("profile lock: {e}; reading the profile without it"),
            }
        }
        match read_profile(&path, &store.file.fingerprint) {
            Ok(Some((f, dropped))) => {
                if !dropped.is_empty() {
                    tracing::warn!(
                        path = %path.display(),
                        "profile: {} stored model(s) or split(s) not believed, measuring again: {}",
                        dropped.len(),
                        dropped.join("; ")
                    );
                }
                // This process's runs are more recent than any stored.
                store.last_stamp = f.kernels.values().map(|k| k.last_run_ms).max().unwrap_or(0);
                store.file = Arc::new(f);
            }
            Ok(None) => {}
            Err(why @ Unusable::Version(_)) => {
                // Never written either: this process learns in memory.
                tracing::warn!(
                    path = %path.display(),
                    "profile {why}: neither read nor written; this process learns in memory"
                );
                return store;
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), "profile {why}: ignored, recalibrating (the next save moves it aside)")
            }
        }
        store.path = Some(path);
        store
    }

    /// Where the file lives, if anywhere.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The stored models of kernel `key` for the given class keys.
    pub fn models(&self, key: &str, classes: &[String]) -> Vec<SpeedModel> {
        let k = self.file.kernels.get(key);
        classes
            .iter()
            .map(|c| k.and_then(|k| k.models.get(c)).cloned().unwrap_or_default())
            .collect()
    }

    /// The stored split of kernel `key` per class (NaN where none is stored).
    pub fn split(&self, key: &str, classes: &[String]) -> Vec<f64> {
        let k = self.file.kernels.get(key);
        classes
            .iter()
            .map(|c| k.and_then(|k| k.split.get(c)).copied().unwrap_or(f64::NAN))
            .collect()
    }

    /// The run history of kernel `key`.
    pub fn history(&self, key: &str) -> RunHistory {
        self.file
            .kernels
            .get(key)
            .map(|k| k.history.clone())
            .unwrap_or_default()
    }

    /// Learns what a run of kernel `key` says beyond its samples: the
    /// classes' starts and the run history (`mu`: the seed's μ).
    pub(crate) fn observe_outcome(
        &mut self,
        key: &str,
        classes: &[String],
        run: &RunOutcome,
        mu: f64,
    ) {
        let (k, pending) = self.kernel_mut(key);
        for (c, s) in classes.iter().zip(&run.starts) {
            if let Some(s) = *s {
                let m = k.models.entry(c.clone()).or_default();
                m.observe_start(s);
                pending.starts.insert(c.clone(), m.start());
            }
        }
        if let Some(f) = &run.forecast {
            k.history
                .learn(f, run.makespan, run.items, run.prediction_imbalance, mu);
            if f.classes > 1 {
                k.history.learn_pace(classes, &run.ends, run.items);
            }
            pending.history = Some(k.history.clone());
        }
        self.dirty = true;
    }

    /// Kernel `key`'s profile and pending learning, stamped as run now;
    /// the least recently run kernel goes first where `key` is new and
    /// [`MAX_KERNELS`] are stored.
    fn kernel_mut(&mut self, key: &str) -> (&mut KernelProfile, &mut Pending) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_stamp = now.max(self.last_stamp.saturating_add(1));
        let file = Arc::make_mut(&mut self.file);
        if file.kernels.len() >= MAX_KERNELS && !file.kernels.contains_key(key) {
            let oldest = file
                .kernels
                .iter()
                .min_by_key(|(k, p)| (p.last_run_ms, *k))
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                file.kernels.remove(&k);
                self.pending.remove(&k);
            }
        }
        let k = file.kernels.entry(key.to_string()).or_default();
        k.last_run_ms = self.last_stamp;
        let pending = self.pending.entry(key.to_string()).or_default();
        pending.last_run_ms = self.last_stamp;
        (k, pending)
    }

    /// Everything stored.
    pub fn file(&self) -> &ProfileFile {
        &self.file
    }

    /// Folds a run's samples into the models and applies the seed's ν rule to
    /// the split.
    pub fn observe(
        &mut self,
        key: &str,
        classes: &[String],
        samples: &[Vec<Sample>],
        learned: &[f64],
        nu: f64,
    ) -> Learned {
        let (k, pending) = self.kernel_mut(key);
        for (c, s) in classes.iter().zip(samples) {
            if s.is_empty() {
                continue;
            }
            let m = k.models.entry(c.clone()).or_default();
            for x in s {
                m.observe(x.items, x.secs);
            }
            // What the next load would not believe is not kept (a fixed
            // cost past `MAX_FIXED_S`): the class is measured again, as
            // after that load.
            if let Some(why) = implausible(m) {
                tracing::debug!(kernel = key, class = %c, "not learned: {why}");
                k.models.remove(c);
                pending.samples.remove(c);
                continue;
            }
            let (kept, n) = pending.samples.entry(c.clone()).or_default();
            kept.extend_from_slice(s);
            let excess = kept.len().saturating_sub(crate::perfmodel::WINDOW);
            kept.drain(..excess);
            *n += s.len() as u64;
        }
        k.runs += 1;
        pending.runs += 1;
        let stored: Vec<f64> = classes
            .iter()
            .map(|c| k.split.get(c).copied().unwrap_or(f64::NAN))
            .collect();
        let delta = split_delta(&stored, learned);
        let split_replaced = delta > nu && learned.iter().sum::<f64>() > 0.0;
        if split_replaced {
            k.split = classes
                .iter()
                .cloned()
                .zip(learned.iter().copied())
                .collect();
            pending.split = Some(k.split.clone());
        }
        self.dirty = true;
        Learned {
            delta,
            split_replaced,
        }
    }

    /// Writes the file if anything changed: under the profile's lock, reads
    /// what is on disk now (other processes may have saved since this one
    /// loaded), adds this process's new samples and runs to it, and replaces
    /// the file atomically (temporary file, rename). The store then holds the
    /// merged profile. A failed save counts as a save for
    /// [`ProfileStore::save_wait`] (a profile folder that cannot be written
    /// is tried again a save interval later, not at every run), and its
    /// error names the file.
    pub fn save(&mut self) -> std::io::Result<()> {
        match self.take_save() {
            Some(job) => {
                let done = job.write();
                self.finish_save(done)
            }
            None => Ok(()),
        }
    }

    /// What a save writes, taken out of the store so that another thread
    /// can write it ([`SaveJob::write`]) while this one goes on learning;
    /// `None` where there is nothing to save. Hand the outcome back with
    /// [`ProfileStore::finish_save`].
    pub(crate) fn take_save(&mut self) -> Option<SaveJob> {
        let path = self.path.clone()?;
        if !self.dirty {
            return None;
        }
        self.last_save = Some(Instant::now());
        self.dirty = false;
        Some(SaveJob {
            path,
            file: self.file.clone(),
            pending: std::mem::take(&mut self.pending),
        })
    }

    /// Takes a save's outcome back: on success the merged file becomes the
    /// store's, with what was learned since the save was taken added to it;
    /// on failure what the save held is pending again, for the next.
    pub(crate) fn finish_save(&mut self, done: SaveDone) -> std::io::Result<()> {
        match done {
            SaveDone::Written(mut merged) => {
                merge_pending(&self.pending, &mut merged);
                self.file = Arc::new(merged);
                Ok(())
            }
            // A newer coexec's profile appeared meanwhile: it is never
            // written; this process goes on in memory.
            SaveDone::Refused(why) => {
                self.path = None;
                Err(std::io::Error::other(format!(
                    "{why}: not overwritten; this process learns in memory from now on"
                )))
            }
            SaveDone::Failed(e, job) => {
                let newer = std::mem::replace(&mut self.pending, job.pending);
                for (key, p) in newer {
                    self.pending.entry(key).or_default().absorb(p);
                }
                self.dirty = true;
                Err(e)
            }
        }
    }

    /// Whether something was learned since the last save was taken.
    pub(crate) fn dirty(&self) -> bool {
        self.dirty
    }

    /// How long until a save keeps saves `every` apart (zero: now).
    pub fn save_wait(&self, every: std::time::Duration) -> std::time::Duration {
        self.last_save.map_or(std::time::Duration::ZERO, |t| {
            every.saturating_sub(t.elapsed())
        })
    }
}

#[cfg(test)]
mod tests;
