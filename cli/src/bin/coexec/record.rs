//! The record of an `embed` run, kept beside its output as
//! `<output>.coexec.json`: which model, corpus, slice and settings made
//! the rows. `embed --resume` continues an output only for the run that
//! wrote it, and `merge` joins only shards of one run, in the order of
//! their slices; a mismatch names the field and both values.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Failure;
use crate::corpus::{CorpusId, write_atomically};

/// The record's layout, checked on reading.
const FORMAT: &str = "coexec-embed-run/1";

/// A record is well under a KiB: past this, not read.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// What made an output's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRecord {
    pub(crate) format: String,
    /// The SHA-256 of the model's `model.safetensors`.
    pub(crate) model_sha256: String,
    /// The width of a row.
    pub(crate) dim: usize,
    /// Whether rows are scaled to unit length.
    pub(crate) normalized: bool,
    /// The JSON Lines field the texts were read from (`None`: plain text).
    pub(crate) field: Option<String>,
    /// The corpus: its size, lines and SHA-256.
    pub(crate) corpus_bytes: u64,
    pub(crate) corpus_lines: u64,
    pub(crate) corpus_sha256: String,
    /// The shard, `I/N` (`0/1` for the whole corpus).
    pub(crate) shard_index: usize,
    pub(crate) shard_count: usize,
    /// The corpus lines read (1-based, inclusive; `first > last` when none).
    pub(crate) first_line: usize,
    pub(crate) last_line: usize,
    /// The SHA-256 of the bytes of those lines, as read.
    pub(crate) read_sha256: String,
    /// The rows the output holds when done: one per line read.
    pub(crate) rows: usize,
}

/// What a run's record is made of.
pub(crate) struct RunSpec<'a> {
    pub(crate) model_sha256: &'a str,
    pub(crate) dim: usize,
    pub(crate) normalized: bool,
    pub(crate) field: Option<&'a str>,
    pub(crate) corpus: CorpusId,
    pub(crate) shard: (usize, usize),
    /// The corpus lines read, 0-based.
    pub(crate) lines: std::ops::Range<usize>,
    pub(crate) read_sha256: String,
}

impl RunRecord {
    pub(crate) fn new(s: RunSpec<'_>) -> Self {
        Self {
            format: FORMAT.into(),
            model_sha256: s.model_sha256.into(),
            dim: s.dim,
            normalized: s.normalized,
            field: s.field.map(Into::into),
            corpus_bytes: s.corpus.bytes,
            corpus_lines: s.corpus.lines,
            corpus_sha256: s.corpus.sha256,
            shard_index: s.shard.0,
            shard_count: s.shard.1,
            first_line: s.lines.start + 1,
            last_line: s.lines.end,
            read_sha256: s.read_sha256,
            rows: s.lines.len(),
        }
    }

    /// Where the record of `output` lives.
    pub(crate) fn path_of(output: &Path) -> PathBuf {
        let mut name = output.as_os_str().to_owned();
        name.push(".coexec.json");
        PathBuf::from(name)
    }

    /// Whether `path` names a record rather than an output.
    pub(crate) fn is_record(path: &Path) -> bool {
        path.to_string_lossy().ends_with(".coexec.json")
    }

    /// The record of `output`; an error naming it when it is missing or
    /// not a record.
    pub(crate) fn read(output: &Path) -> Result<Self, Failure> {
        let path = Self::path_of(output);
        let bad = |why: String| Failure::Usage(format!("{}: {why}", path.display()));
        let bytes = match coexec_kernels::read_file(&path, MAX_RECORD_BYTES) {
            Ok(b) => b,
            Err(coexec_kernels::KernelError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(Failure::Usage(format!(
                    "{}: no run record beside it ({}); only an output of `coexec embed` \
                     can be resumed or merged",
                    output.display(),
                    path.display()
                )));
            }
            Err(e) => return Err(Failure::Usage(e.to_string())),
        };
        let r: Self = serde_json::from_slice(&bytes).map_err(|e| {
            bad(format!(
                "line {}: not a run record of `coexec embed`: {e}",
                e.line()
            ))
        })?;
        if r.format != FORMAT {
            return Err(bad(format!(
                "format \"{}\", where this coexec writes \"{FORMAT}\"",
                r.format
            )));
        }
        Ok(r)
    }

    /// Writes the record of `output`, whole or not at all.
    pub(crate) fn write(&self, output: &Path) -> Result<(), Failure> {
        let path = Self::path_of(output);
        let mut json = serde_json::to_vec_pretty(self).map_err(|e| Failure::Run(e.to_string()))?;
        json.push(b'\n');
        write_atomically(&path, &json)
    }

    /// The fields in which `self` and `other` differ, each as
    /// `(name, self's value, other's value)`; `shard` leaves out those
    /// that tell one shard of a run from another.
    pub(crate) fn differences(
        &self,
        other: &Self,
        shard: bool,
    ) -> Vec<(&'static str, String, String)> {
        let mut d = Vec::new();
        let mut check = |name: &'static str, a: String, b: String| {
            if a != b {
                d.push((name, a, b));
            }
        };
        check(
            "model_sha256",
            self.model_sha256.clone(),
            other.model_sha256.clone(),
        );
        check("dim", self.dim.to_string(), other.dim.to_string());
        check(
            "normalized",
            self.normalized.to_string(),
            other.normalized.to_string(),
        );
        check(
            "field",
            format!("{:?}", self.field),
            format!("{:?}", other.field),
        );
        check(
            "corpus_bytes",
            self.corpus_bytes.to_string(),
            other.corpus_bytes.to_string(),
        );
        check(
            "corpus_lines",
            self.corpus_lines.to_string(),
            other.corpus_lines.to_string(),
        );
        check(
            "corpus_sha256",
            self.corpus_sha256.clone(),
            other.corpus_sha256.clone(),
        );
        check(
            "shard_count",
            self.shard_count.to_string(),
            other.shard_count.to_string(),
        );
        if shard {
            check(
                "shard_index",
                self.shard_index.to_string(),
                other.shard_index.to_string(),
            );
            check(
                "first_line",
                self.first_line.to_string(),
                other.first_line.to_string(),
            );
            check(
                "last_line",
                self.last_line.to_string(),
                other.last_line.to_string(),
            );
            check(
                "read_sha256",
                self.read_sha256.clone(),
                other.read_sha256.clone(),
            );
            check("rows", self.rows.to_string(), other.rows.to_string());
        }
        d
    }

    /// `I/N`.
    pub(crate) fn shard(&self) -> String {
        format!("{}/{}", self.shard_index, self.shard_count)
    }
}

/// One line naming the first difference: `what` had `a`, `other` `b`.
pub(crate) fn mismatch(
    what: &str,
    other: &str,
    d: &[(&'static str, String, String)],
) -> Option<String> {
    let (name, a, b) = d.first()?;
    let more = match d.len() {
        1 => String::new(),
        n => format!(" (and {} other fields)", n - 1),
    };
    Some(format!("{what} has {name} {a}, {other} has {b}{more}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RunRecord {
        RunRecord::new(RunSpec {
            model_sha256: "aa",
            dim: 4,
            normalized: true,
            field: Some("text"),
            corpus: CorpusId {
                bytes: 10,
                lines: 3,
                sha256: "cc".into(),
            },
            shard: (1, 3),
            lines: 1..2,
            read_sha256: "dd".into(),
        })
    }

    #[test]
    fn a_record_reads_back_as_written_and_names_its_differences() {
        let d = std::env::temp_dir().join(format!("coexec-record-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let out = d.join("part-1.npy");
        let r = record();
        r.write(&out).unwrap();
        assert!(RunRecord::is_record(&RunRecord::path_of(&out)));
        assert_eq!(RunRecord::read(&out).unwrap(), r);
        let mut other = r.clone();
        other.normalized = false;
        other.first_line = 9;
        assert_eq!(r.differences(&other, false).len(), 1);
        let d2 = r.differences(&other, true);
        assert_eq!(
            mismatch("a", "b", &d2).unwrap(),
            "a has normalized true, b has false (and 1 other fields)"
        );
        std::fs::write(RunRecord::path_of(&out), b"{\"format\": 1}").unwrap();
        assert!(matches!(RunRecord::read(&out), Err(Failure::Usage(_))));
        std::fs::remove_file(RunRecord::path_of(&out)).unwrap();
        match RunRecord::read(&out) {
            Err(Failure::Usage(m)) => assert!(m.contains("no run record"), "{m}"),
            _ => panic!("a missing record was read"),
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
