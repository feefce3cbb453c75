//! `coexec merge`: the outputs of `coexec embed --shard i/n`, joined into
//! one file in the order of their slices, whatever the order they are
//! given in, after checking each against its run record: every shard of
//! one run (the same model, corpus and settings), each once, none missing,
//! each holding exactly the rows of its slice. Any mismatch is one line
//! naming the files and the values, exit 2, and nothing is written; the
//! joined file is written through a temporary file, with a record of its
//! own (shard 0/1).

use std::io::{BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::Failure;
use crate::corpus::{Corpus, write_via_temp};
use crate::embed::{Shard, index_dir, jsonl_rows, not_the_input, npy_header, output_is_npy};
use crate::record::{RunRecord, mismatch};

#[derive(Debug, clap::Args)]
pub(crate) struct MergeArgs {
    /// The joined file (`.npy` or `.jsonl`, as the shards); it must not
    /// exist.
    #[arg(long)]
    output: PathBuf,
    /// The corpus the shards came from: its size, lines and hash are
    /// checked against their records.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Where corpus line indexes are kept (as `embed --index-dir`).
    #[arg(long, env = "COEXEC_INDEX_DIR")]
    index_dir: Option<PathBuf>,
    /// The shards' outputs, in any order: one per shard, all of them.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
}

/// A `.npy` shard's rows, width, and where its data start.
struct NpyShape {
    rows: usize,
    dim: usize,
    data_at: u64,
}

/// Reads the float32 `.npy` header of `path` and checks its length.
fn npy_shape(path: &Path) -> Result<NpyShape, Failure> {
    let bad = |why: &str| Failure::Usage(format!("{}: {why}", path.display()));
    let mut f = crate::corpus::open(path)?;
    let mut pre = [0u8; 10];
    f.read_exact(&mut pre)
        .map_err(|_| bad("not a .npy file (too short)"))?;
    if &pre[..6] != b"\x93NUMPY" || pre[6] != 1 {
        return Err(bad("not a version 1 .npy file"));
    }
    let len = u16::from_le_bytes([pre[8], pre[9]]) as usize;
    let mut dict = vec![0; len];
    f.read_exact(&mut dict)
        .map_err(|_| bad("its .npy header is cut short"))?;
    let dict = String::from_utf8_lossy(&dict);
    if !dict.contains("'descr': '<f4'") || !dict.contains("'fortran_order': False") {
        return Err(bad("not a float32, C-order array"));
    }
    let shape = dict
        .split_once("'shape': (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(s, _)| s)
        .ok_or_else(|| bad("no shape in its .npy header"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().map_err(|_| bad("a shape that is not numbers")))
        .collect::<Result<_, _>>()?;
    let [rows, dim] = dims[..] else {
        return Err(bad("not a two-dimensional array"));
    };
    let data_at = 10 + len as u64;
    let size = f.metadata().map_err(|e| bad(&e.to_string()))?.len();
    let data = (rows as u64)
        .checked_mul(dim as u64)
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| bad(&format!("a shape ({rows}, {dim}) past any file's size")))?;
    if size != data_at + data {
        return Err(bad(&format!(
            "holds {} of its {rows} rows (unfinished? `coexec embed --resume` completes it)",
            (size.saturating_sub(data_at)) / (dim.max(1) * 4) as u64
        )));
    }
    Ok(NpyShape { rows, dim, data_at })
}

/// One shard: its file and record.
struct Part {
    path: PathBuf,
    record: RunRecord,
}

/// Reads the shards' records and puts them in their slices' order: every
/// shard of one run, each once.
fn parts(shards: &[PathBuf]) -> Result<Vec<Part>, Failure> {
    let mut parts = Vec::with_capacity(shards.len());
    for path in shards {
        if RunRecord::is_record(path) {
            return Err(Failure::Usage(format!(
                "{}: a run record; give the output beside it",
                path.display()
            )));
        }
        // A regular file only: a FIFO or a device is refused before
        // anything is read.
        crate::corpus::open(path)?;
        let record = RunRecord::read(path)?;
        if let Some(first) = parts.first() {
            let Part {
                path: p0,
                record: r0,
            } = first;
            let d = r0.differences(&record, false);
            if let Some(m) = mismatch(&p0.display().to_string(), &path.display().to_string(), &d) {
                return Err(Failure::Usage(format!("{m}: not shards of one run")));
            }
        }
        parts.push(Part {
            path: path.clone(),
            record,
        });
    }
    parts.sort_by_key(|p| p.record.shard_index);
    for w in parts.windows(2) {
        if w[0].record.shard_index == w[1].record.shard_index {
            return Err(Failure::Usage(format!(
                "{} and {} are both shard {}",
                w[0].path.display(),
                w[1].path.display(),
                w[0].record.shard()
            )));
        }
    }
    let count = parts[0].record.shard_count;
    let lines = parts[0].record.corpus_lines as usize;
    for (i, p) in parts.iter().enumerate() {
        let r = &p.record;
        let want = Shard::new(i, count).map_err(Failure::Usage)?.range(lines);
        // Sorted and without repeats: the first index out of place is the
        // first one missing.
        if r.shard_index != i {
            return Err(Failure::Usage(format!(
                "shard {i}/{count} (lines {} to {}) is missing",
                want.start + 1,
                want.end
            )));
        }
        if (r.first_line, r.last_line, r.rows) != (want.start + 1, want.end, want.len()) {
            return Err(Failure::Usage(format!(
                "{}: its record gives lines {} to {} ({} rows), where shard {} of {lines} lines owns {} to {}",
                p.path.display(),
                r.first_line,
                r.last_line,
                r.rows,
                r.shard(),
                want.start + 1,
                want.end
            )));
        }
    }
    if parts.len() < count {
        let want = Shard::new(parts.len(), count)
            .map_err(Failure::Usage)?
            .range(lines);
        return Err(Failure::Usage(format!(
            "shard {}/{count} (lines {} to {}) is missing",
            parts.len(),
            want.start + 1,
            want.end
        )));
    }
    Ok(parts)
}

pub(crate) fn merge(a: MergeArgs) -> Result<(), Failure> {
    if a.output.exists() {
        return Err(Failure::Usage(format!(
            "--output {} exists; remove it first",
            a.output.display()
        )));
    }
    let npy = output_is_npy("--output", &a.output)?;
    let parts = parts(&a.shards)?;
    let first = &parts[0].record;
    if let Some(input) = &a.input {
        let corpus = Corpus::open(input, index_dir(a.index_dir.as_deref()).as_deref())?;
        let id = corpus.id();
        let mut asked = first.clone();
        (asked.corpus_bytes, asked.corpus_lines, asked.corpus_sha256) =
            (id.bytes, id.lines, id.sha256);
        let d = first.differences(&asked, false);
        if let Some(m) = mismatch(
            &parts[0].path.display().to_string(),
            &format!("--input {}", corpus.path().display()),
            &d,
        ) {
            return Err(Failure::Usage(format!(
                "{m}: the shards are of another corpus"
            )));
        }
        not_the_input(&a.output, input)?;
    }
    let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", a.output.display()));
    let (rows, dim) = (first.corpus_lines as usize, first.dim);
    let shapes = if npy {
        let shapes = parts
            .iter()
            .map(|p| {
                let s = npy_shape(&p.path)?;
                if (s.rows, s.dim) != (p.record.rows, p.record.dim) {
                    return Err(Failure::Usage(format!(
                        "{}: {} rows of {} where its record gives {} of {}",
                        p.path.display(),
                        s.rows,
                        s.dim,
                        p.record.rows,
                        p.record.dim
                    )));
                }
                Ok(s)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(shapes)
    } else {
        None
    };
    joined(first).write(&a.output)?;
    let written = if let Some(shapes) = shapes {
        write_via_temp(&a.output, ".merging", |w| {
            w.write_all(&npy_header(rows, dim)).map_err(io)?;
            for (s, p) in shapes.iter().zip(&parts) {
                let mut f = crate::corpus::open(&p.path)?;
                f.seek(SeekFrom::Start(s.data_at)).map_err(io)?;
                let want = s.rows as u64 * s.dim as u64 * 4;
                let copied = std::io::copy(&mut f.take(want), w).map_err(io)?;
                if copied != want {
                    return Err(Failure::Run(format!(
                        "{}: cut while being merged",
                        p.path.display()
                    )));
                }
            }
            Ok(())
        })
    } else {
        write_via_temp(&a.output, ".merging", |w| {
            for p in &parts {
                let f = crate::corpus::open(&p.path)?;
                let (n, _) = jsonl_rows(
                    &p.path,
                    &mut BufReader::new(f),
                    p.record.first_line,
                    dim,
                    |row| w.write_all(row),
                )?;
                if n != p.record.rows {
                    return Err(Failure::Usage(format!(
                        "{}: {n} whole rows, but shard {} owns {} (lines {} to {}; unfinished? \
                         `coexec embed --resume` completes it)",
                        p.path.display(),
                        p.record.shard(),
                        p.record.rows,
                        p.record.first_line,
                        p.record.last_line
                    )));
                }
            }
            Ok(())
        })
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(RunRecord::path_of(&a.output));
        return Err(e);
    }
    outln!(
        "merged {} shards, {rows} rows, into {}",
        parts.len(),
        a.output.display()
    );
    Ok(())
}

/// The record of the joined file: the whole corpus, as one shard.
fn joined(first: &RunRecord) -> RunRecord {
    let mut r = first.clone();
    (r.shard_index, r.shard_count) = (0, 1);
    (r.first_line, r.last_line) = (1, first.corpus_lines as usize);
    r.rows = first.corpus_lines as usize;
    r.read_sha256 = first.corpus_sha256.clone();
    r
}
