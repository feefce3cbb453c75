//! Profiles on disk: one JSON file per machine fingerprint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::perfmodel::{Sample, SpeedModel};

/// Format version of the profile file.
pub const PROFILE_VERSION: u32 = 1;

/// What identifies a machine: a profile from another one is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct KernelProfile {
    /// Speed model per device class key.
    pub models: BTreeMap<String, SpeedModel>,
    /// The stored split P per device class key (the seed's step 4).
    pub split: BTreeMap<String, f64>,
    /// Runs observed.
    pub runs: u64,
}

/// The profile file's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileFile {
    /// Format version.
    pub version: u32,
    /// The machine it was learned on.
    pub fingerprint: Fingerprint,
    /// Per kernel profile key.
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

/// The profiler's memory: models per kernel and class, and where they live.
#[derive(Debug)]
pub struct ProfileStore {
    path: Option<PathBuf>,
    file: ProfileFile,
    dirty: bool,
    last_save: Option<Instant>,
}

/// What observing a run changed.
#[derive(Debug, Clone, Copy, Serialize)]
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
            file: ProfileFile {
                version: PROFILE_VERSION,
                fingerprint,
                kernels: BTreeMap::new(),
            },
            dirty: false,
            last_save: None,
        }
    }

    /// The store for `fingerprint` in `dir`, loaded if a valid file is there.
    /// A corrupt or foreign file is ignored with a warning and recalibrated
    /// (overwritten at the next save).
    pub fn open(dir: &Path, fingerprint: Fingerprint) -> Self {
        let path = dir.join(format!("coexec-profile-{}.json", fingerprint.id()));
        let mut store = Self::in_memory(fingerprint);
        match std::fs::read_to_string(&path) {
            Ok(text) => match serde_json::from_str::<ProfileFile>(&text) {
                Ok(f)
                    if f.version == PROFILE_VERSION && f.fingerprint == store.file.fingerprint =>
                {
                    store.file = f;
                }
                Ok(f) if f.version != PROFILE_VERSION => tracing::warn!(
                    path = %path.display(),
                    "profile has format version {}, expected {PROFILE_VERSION}: ignored, recalibrating",
                    f.version
                ),
                Ok(_) => {
                    tracing::warn!(path = %path.display(), "profile was learned on another machine: ignored, recalibrating")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), "profile is corrupt ({e}): ignored, recalibrating")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), "profile unreadable ({e}): ignored"),
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
        let k = self.file.kernels.entry(key.to_string()).or_default();
        for (c, s) in classes.iter().zip(samples) {
            if s.is_empty() {
                continue;
            }
            let m = k.models.entry(c.clone()).or_default();
            for x in s {
                m.observe(x.items, x.secs);
            }
        }
        k.runs += 1;
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
        }
        self.dirty = true;
        Learned {
            delta,
            split_replaced,
        }
    }

    /// Writes the file if anything changed (atomically: temp file, rename).
    pub fn save(&mut self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if !self.dirty {
            return Ok(());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        let text = serde_json::to_string_pretty(&self.file).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)?;
        self.dirty = false;
        self.last_save = Some(Instant::now());
        Ok(())
    }

    /// Saves if dirty and the last save is older than `every`.
    pub fn save_debounced(&mut self, every: std::time::Duration) -> std::io::Result<()> {
        if self.last_save.is_none_or(|t| t.elapsed() >= every) {
            self.save()
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp() -> Fingerprint {
        Fingerprint {
            cpu_model: "Test CPU".into(),
            cores: 2,
            accelerators: vec![],
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("coexec-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trips_and_learns() {
        let dir = tempdir("rt");
        let classes = vec!["cpu".to_string(), "sim@2".to_string()];
        let mut s = ProfileStore::open(&dir, fp());
        let samples = vec![
            vec![Sample {
                items: 100.0,
                secs: 0.01,
            }],
            vec![Sample {
                items: 100.0,
                secs: 0.005,
            }],
        ];
        let l = s.observe("k", &classes, &samples, &[1.0 / 3.0, 2.0 / 3.0], 0.05);
        assert!(l.split_replaced);
        s.save().unwrap();
        let s2 = ProfileStore::open(&dir, fp());
        let m = s2.models("k", &classes);
        assert!((m[1].b() - 2e4).abs() < 1e-6);
        // A second run within ν keeps the stored split.
        let mut s2 = s2;
        let l = s2.observe("k", &classes, &samples, &[0.34, 0.66], 0.05);
        assert!(!l.split_replaced && l.delta < 0.05);
    }

    #[test]
    fn corrupt_and_foreign_profiles_are_ignored() {
        let dir = tempdir("bad");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("coexec-profile-{}.json", fp().id()));
        std::fs::write(&path, "{ not json").unwrap();
        let s = ProfileStore::open(&dir, fp());
        assert!(s.file().kernels.is_empty());
        // Foreign: a file with another fingerprint under this name.
        let mut other = ProfileStore::in_memory(Fingerprint { cores: 64, ..fp() });
        other.observe(
            "k",
            &["cpu".into()],
            &[vec![Sample {
                items: 1.0,
                secs: 1.0,
            }]],
            &[1.0],
            0.05,
        );
        std::fs::write(&path, serde_json::to_string(other.file()).unwrap()).unwrap();
        let s = ProfileStore::open(&dir, fp());
        assert!(s.file().kernels.is_empty());
    }
}
