//! The profile on disk: read and checked, locked while a process merges
//! and writes it, and what a process learned since its last save, merged
//! into whatever the file holds by then.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::RunHistory;
#[cfg(doc)]
use super::store::KernelProfile;
use super::store::{Fingerprint, MAX_FILE_BYTES, PROFILE_VERSION, ProfileFile, sanitize};
use crate::perfmodel::Sample;
use coexec_kernels::KernelError;

/// What this process learned since its last save: merged into whatever is
/// on disk at the next save, so that processes sharing a profile add up
/// instead of overwriting each other.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// New samples per class key (the last [`WINDOW`](crate::perfmodel::WINDOW)
    /// of them: a model keeps no more) and how many there were in all.
    pub(super) samples: BTreeMap<String, (Vec<Sample>, u64)>,
    pub(super) runs: u64,
    /// The split this process stored, if it replaced the one it found.
    pub(super) split: Option<BTreeMap<String, f64>>,
    /// The run starts this process smoothed, per class key.
    pub(super) starts: BTreeMap<String, f64>,
    /// The run history as this process left it, if it learned any.
    pub(super) history: Option<RunHistory>,
    /// When this process last ran it (see [`KernelProfile::last_run_ms`]).
    pub(super) last_run_ms: u64,
}

/// Reads the profile at `path`: `Ok(None)` if there is none, `Err` with a
/// sentence if it is unusable (corrupt, another version, another machine).
/// What is loaded is sanitized; the second value says what was dropped.
pub(super) fn read_profile(
    path: &Path,
    fingerprint: &Fingerprint,
) -> Result<Option<(ProfileFile, Vec<String>)>, Unusable> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => return Err(Unusable::TooLarge(m.len())),
        _ => {}
    }
    // A regular file only (a FIFO would block the start, a device never
    // end), and never past the cap, even one growing while it is read.
    let text = match coexec_kernels::read_file(path, MAX_FILE_BYTES) {
        Ok(b) => String::from_utf8(b).map_err(|e| Unusable::Unreadable(e.to_string()))?,
        Err(KernelError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(KernelError::Io { source, .. }) => {
            return Err(Unusable::Unreadable(source.to_string()));
        }
        Err(e) => return Err(Unusable::Unreadable(e.to_string())),
    };
    // The version first, from any JSON object that has one: a newer
    // coexec's profile need not parse as this one's.
    // Only the version is kept from this pass: the rest is skipped, not
    // built as a tree (a profile near the cap took 1.25 GB parsed so).
    #[derive(serde::Deserialize)]
    struct Version {
        version: Option<u64>,
    }
    let version = serde_json::from_str::<Version>(&text)
        .ok()
        .and_then(|v| v.version);
    if let Some(v) = version.filter(|&v| v != u64::from(PROFILE_VERSION)) {
        return Err(Unusable::Version(v));
    }
    match serde_json::from_str::<ProfileFile>(&text) {
        Ok(f) if f.fingerprint != *fingerprint => Err(Unusable::Foreign),
        Ok(mut f) => {
            let dropped = sanitize(&mut f);
            Ok(Some((f, dropped)))
        }
        Err(e) => Err(Unusable::Corrupt(e.to_string())),
    }
}

/// Why a profile file cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Unusable {
    /// Another format version (a newer coexec sharing the folder): neither
    /// read nor ever written by this one.
    Version(u64),
    /// Learned on another machine (a copied file).
    Foreign,
    /// Not a profile (cut short, edited, another program's).
    Corrupt(String),
    /// Over [`MAX_FILE_BYTES`] (its size): not read.
    TooLarge(u64),
    /// The file could not be read.
    Unreadable(String),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version(v) => write!(
                f,
                "has format version {v}, and this coexec reads and writes version {PROFILE_VERSION}"
            ),
            Self::Foreign => f.write_str("was learned on another machine"),
            Self::Corrupt(e) => write!(f, "is corrupt ({e})"),
            Self::TooLarge(n) => write!(
                f,
                "is {n} bytes, over the limit of {MAX_FILE_BYTES}: not read"
            ),
            Self::Unreadable(e) => write!(f, "is unreadable ({e})"),
        }
    }
}

/// Moves the unusable profile at `path` aside, to `<path>.<kind>-<unix
/// seconds>`, so that writing a new one destroys nothing; its new name.
fn move_aside(path: &Path, kind: &str) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{kind}-{secs}"));
    let aside = PathBuf::from(name);
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// Where a save of `path` writes: a symlink to a regular file is followed,
/// so that the rename replaces the file it points to and the link stays (a
/// profile kept on a shared volume and linked into place). Anything else,
/// a dangling link or one to a device included, is replaced itself.
fn link_target(path: &Path) -> PathBuf {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let follow = is_link && std::fs::metadata(path).is_ok_and(|m| m.is_file());
    follow
        .then(|| std::fs::canonicalize(path).ok())
        .flatten()
        .unwrap_or_else(|| path.to_path_buf())
}

/// Why profiles cannot live in folder `dir`: it, or the nearest of its
/// parents that exists, is not a folder. `None` where a save can create it.
pub(super) fn folder_problem(dir: &Path) -> Option<String> {
    let existing = dir
        .ancestors()
        .find(|a| std::fs::symlink_metadata(a).is_ok())?;
    if std::fs::metadata(existing).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    Some(if existing == dir {
        format!(
            "the profile folder {} is a file, not a folder",
            dir.display()
        )
    } else {
        format!(
            "the profile folder {} cannot be made: {} is a file, not a folder",
            dir.display(),
            existing.display()
        )
    })
}

/// Longest a save waits for the profile's lock: a process holding it longer
/// is stopped or stuck mid-save, and this one's save fails with a warning
/// (what it learned stays in memory for the next save) instead of holding
/// its shutdown past its drain.
pub(super) const SAVE_LOCK_WAIT: Duration = Duration::from_secs(5);
/// Longest the start waits for it, only to clear stale temporary files (the
/// profile itself is read without it: saves replace it whole by rename).
pub(super) const OPEN_LOCK_WAIT: Duration = Duration::from_secs(1);
/// How often a waiting process tries the lock again.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// Holds the profile's lock file (`<profile>.lock`) while alive: one
/// process at a time reads, merges and renames.
pub(super) struct Locked(std::fs::File);

impl Locked {
    /// The lock, waiting for it at most `wait`; past that an error of kind
    /// `WouldBlock` that says another process holds it.
    pub(super) fn take(path: &Path, wait: Duration) -> std::io::Result<Self> {
        let lock_path = path.with_extension("lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        let start = Instant::now();
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(Self(f)),
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(LOCK_RETRY)
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        format!(
                            "{}: held by another process for {wait:?} (a coexec stopped mid-save?)",
                            lock_path.display()
                        ),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Removes the temporary files of saves that never reached their rename
/// (a process killed mid-save). Only under the lock: a writer holds it from
/// its temporary file to its rename, so any found then is an orphan.
pub(super) fn remove_orphans(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{name}.");
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(n) = n.to_str() else { continue };
        if n.starts_with(&prefix) && n.ends_with(".tmp") {
            match std::fs::remove_file(e.path()) {
                Ok(()) => tracing::info!(file = n, "removed a stale temporary profile"),
                Err(e) => {
                    tracing::debug!(file = n, "could not remove a stale temporary profile: {e}")
                }
            }
        }
    }
}

/// Adds what a process learned since its last save (`pending`) to `disk`.
pub(super) fn merge_pending(pending: &BTreeMap<String, Pending>, disk: &mut ProfileFile) {
    for (key, p) in pending {
        let k = disk.kernels.entry(key.clone()).or_default();
        k.runs += p.runs;
        for (class, (samples, n)) in &p.samples {
            let m = k.models.entry(class.clone()).or_default();
            let before = m.observed;
            for s in samples {
                m.observe(s.items, s.secs);
            }
            m.observed = before + n;
        }
        if let Some(split) = &p.split {
            k.split = split.clone();
        }
        for (class, start) in &p.starts {
            let m = k.models.entry(class.clone()).or_default();
            *m = std::mem::take(m).with_start(*start);
        }
        if let Some(h) = &p.history {
            k.history = h.clone();
        }
        k.last_run_ms = k.last_run_ms.max(p.last_run_ms);
    }
}

impl Pending {
    /// Adds `newer`, learned after `self`: samples after these (the last
    /// window of them kept), runs added, the newer split, starts and history.
    pub(super) fn absorb(&mut self, newer: Pending) {
        for (class, (samples, n)) in newer.samples {
            let (kept, m) = self.samples.entry(class).or_default();
            kept.extend(samples);
            let excess = kept.len().saturating_sub(crate::perfmodel::WINDOW);
            kept.drain(..excess);
            *m += n;
        }
        self.runs += newer.runs;
        if newer.split.is_some() {
            self.split = newer.split;
        }
        self.starts.extend(newer.starts);
        if newer.history.is_some() {
            self.history = newer.history;
        }
        self.last_run_ms = self.last_run_ms.max(newer.last_run_ms);
    }
}

/// A save taken out of a [`ProfileStore`] ([`ProfileStore::take_save`]).
pub(crate) struct SaveJob {
    pub(super) path: PathBuf,
    /// The store's profile when the save was taken.
    pub(super) file: std::sync::Arc<ProfileFile>,
    /// What the store learned since its last save.
    pub(super) pending: BTreeMap<String, Pending>,
}

/// How a [`SaveJob`] ended.
pub(crate) enum SaveDone {
    /// The file as written: what was on disk with the job's learning added.
    Written(ProfileFile),
    /// Not written (the error names the file); the job, to learn from again.
    Failed(std::io::Error, SaveJob),
    /// Not written, and never to be: the file is another format version's
    /// (the sentence names the file).
    Refused(String),
}

/// Why [`SaveJob::write_merged`] wrote nothing.
enum NotWritten {
    Refused(Unusable),
    Io(std::io::Error),
}

impl From<std::io::Error> for NotWritten {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl SaveJob {
    /// Writes the profile: under its lock, reads what is on disk now (other
    /// processes may have saved since this one loaded), adds this process's
    /// new samples and runs to it, and replaces the file atomically
    /// (temporary file, rename).
    /// A panic while merging (a profile on disk that breaks an assumption)
    /// fails the save like an I/O error: the job and its learning come back.
    pub(crate) fn write(self) -> SaveDone {
        let written = coexec_kernels::KernelError::catch(|| Ok(self.write_merged()))
            .unwrap_or_else(|e| {
                Err(NotWritten::Io(std::io::Error::other(format!(
                    "merging: {e}"
                ))))
            });
        let path = self.path.display();
        match written {
            Ok(merged) => SaveDone::Written(merged),
            Err(NotWritten::Refused(why)) => SaveDone::Refused(format!("{path} {why}")),
            Err(NotWritten::Io(e)) => {
                let e = std::io::Error::new(e.kind(), format!("{path}: {e}"));
                SaveDone::Failed(e, self)
            }
        }
    }

    fn write_merged(&self) -> Result<ProfileFile, NotWritten> {
        let path = &link_target(&self.path);
        if let Some(dir) = path.parent() {
            if let Some(why) = folder_problem(dir) {
                return Err(std::io::Error::new(std::io::ErrorKind::NotADirectory, why).into());
            }
            std::fs::create_dir_all(dir)?;
        }
        let _lock = Locked::take(path, SAVE_LOCK_WAIT)?;
        remove_orphans(path);
        let merged = match read_profile(path, &self.file.fingerprint) {
            Ok(Some((mut disk, _))) => {
                merge_pending(&self.pending, &mut disk);
                disk
            }
            Ok(None) => (*self.file).clone(),
            Err(why @ Unusable::Version(_)) => return Err(NotWritten::Refused(why)),
            Err(why) => {
                let kind = match why {
                    Unusable::Foreign => "foreign",
                    Unusable::TooLarge(_) => "oversized",
                    _ => "corrupt",
                };
                let aside = move_aside(path, kind)?;
                tracing::warn!(
                    path = %path.display(),
                    "profile {why}: moved to {}, writing a new one",
                    aside.display()
                );
                (*self.file).clone()
            }
        };
        // Written by the rule it will be read by: what the next load would
        // drop (a kernel past the cap, an implausible model merged from
        // another process) is dropped now.
        let mut merged = merged;
        let dropped = sanitize(&mut merged);
        if !dropped.is_empty() {
            tracing::debug!(path = %path.display(), "profile: not saved: {}", dropped.join("; "));
        }
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        let text = serde_json::to_string_pretty(&merged).map_err(std::io::Error::other)?;
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        Ok(merged)
    }
}
