//! `coexec merge`: the outputs of `coexec embed --shard i/n`, joined in
//! shard order into one file, after checking that they hold exactly the
//! rows their shards own: a shard missing, given twice, cut short or grown
//! past its slice is an error naming the file, and nothing is written.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::Failure;
use crate::embed::{Shard, corpus_lines, npy_header};

#[derive(Debug, clap::Args)]
pub(crate) struct MergeArgs {
    /// The joined file (`.npy` or `.jsonl`, as the shards); it must not
    /// exist.
    #[arg(long)]
    output: PathBuf,
    /// The corpus the shards came from: its line count is checked against
    /// theirs (without it, the shards' own total is taken).
    #[arg(long)]
    input: Option<PathBuf>,
    /// The shards' outputs, shard 0 first: one per shard, all of them.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
}

/// A `.npy` shard: its rows, width, and where its data start.
struct NpyShard {
    rows: usize,
    dim: usize,
    data_at: u64,
}

/// Reads a float32 `.npy` header written by `coexec embed`.
fn npy_shape(path: &Path) -> Result<NpyShard, Failure> {
    let bad = |why: &str| Failure::Usage(format!("{}: {why}", path.display()));
    let mut f = File::open(path).map_err(|e| bad(&e.to_string()))?;
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
    let want = data_at + (rows * dim * 4) as u64;
    if size != want {
        return Err(bad(&format!(
            "holds {} of its {rows} rows (unfinished? `coexec embed --resume` completes it)",
            (size.saturating_sub(data_at)) / (dim.max(1) * 4) as u64
        )));
    }
    Ok(NpyShard { rows, dim, data_at })
}

/// The lines `coexec embed` reads from `path`.
fn count_lines(path: &Path) -> Result<usize, Failure> {
    corpus_lines(path)?.try_fold(0, |n, line| line.map(|_| n + 1))
}

pub(crate) fn merge(a: MergeArgs) -> Result<(), Failure> {
    if a.output.exists() {
        return Err(Failure::Usage(format!(
            "--output {} exists; remove it first",
            a.output.display()
        )));
    }
    let npy = match a.output.extension().and_then(|e| e.to_str()) {
        Some("npy") => true,
        Some("jsonl" | "ndjson") => false,
        _ => {
            return Err(Failure::Usage(format!(
                "--output {}: the name must end in .npy or .jsonl",
                a.output.display()
            )));
        }
    };
    let count = a.shards.len();
    let rows = if npy {
        let shapes = a
            .shards
            .iter()
            .map(|p| npy_shape(p))
            .collect::<Result<Vec<_>, _>>()?;
        let total = match &a.input {
            Some(input) => count_lines(input)?,
            None => shapes.iter().map(|s| s.rows).sum(),
        };
        for (i, (s, path)) in shapes.iter().zip(&a.shards).enumerate() {
            check_rows(path, i, count, total, s.rows)?;
            if s.dim != shapes[0].dim {
                return Err(Failure::Usage(format!(
                    "{}: {} columns where shard 0 has {}",
                    path.display(),
                    s.dim,
                    shapes[0].dim
                )));
            }
        }
        let dim = shapes.first().map_or(0, |s| s.dim);
        write_all(&a.output, |w| {
            w.write_all(&npy_header(total, dim))?;
            for (s, path) in shapes.iter().zip(&a.shards) {
                let mut f = File::open(path)?;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(s.data_at))?;
                std::io::copy(&mut f.take((s.rows * s.dim * 4) as u64), w)?;
            }
            Ok(())
        })?;
        total
    } else {
        let mut lines = Vec::new();
        for path in &a.shards {
            lines.push(jsonl_lines(
                path,
                lines.iter().map(Vec::len).sum::<usize>(),
            )?);
        }
        let total = match &a.input {
            Some(input) => count_lines(input)?,
            None => lines.iter().map(Vec::len).sum(),
        };
        for (i, (l, path)) in lines.iter().zip(&a.shards).enumerate() {
            check_rows(path, i, count, total, l.len())?;
        }
        write_all(&a.output, |w| {
            for line in lines.iter().flatten() {
                w.write_all(line)?;
            }
            Ok(())
        })?;
        total
    };
    outln!(
        "merged {count} shards, {rows} rows, into {}",
        a.output.display()
    );
    Ok(())
}

/// Shard `i` of `count` over `total` lines must hold exactly its slice.
fn check_rows(
    path: &Path,
    i: usize,
    count: usize,
    total: usize,
    rows: usize,
) -> Result<(), Failure> {
    let want = Shard::new(i, count).map_err(Failure::Usage)?.range(total);
    if rows == want.len() {
        return Ok(());
    }
    Err(Failure::Usage(format!(
        "{}: {rows} rows, but shard {i}/{count} of {total} lines owns {} (lines {} to {})",
        path.display(),
        want.len(),
        want.start + 1,
        want.end
    )))
}

/// A JSON Lines shard's lines, each checked to carry the corpus line
/// number that follows the `before` lines of the shards before it.
fn jsonl_lines(path: &Path, before: usize) -> Result<Vec<Vec<u8>>, Failure> {
    let f = File::open(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (n, line) in BufReader::new(f).split(b'\n').enumerate() {
        let mut line = line.map_err(|e| Failure::Run(format!("{}: {e}", path.display())))?;
        let want = before + n + 1;
        let got = serde_json::from_slice::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v.get("line").and_then(|l| l.as_u64()));
        if got != Some(want as u64) {
            return Err(Failure::Usage(format!(
                "{}:{}: expected the row of corpus line {want}",
                path.display(),
                n + 1
            )));
        }
        line.push(b'\n');
        out.push(line);
    }
    Ok(out)
}

/// Writes `path` through a temporary file beside it, renamed into place
/// once whole.
fn write_all(
    path: &Path,
    f: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let tmp = path.with_extension("merging");
    let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", path.display()));
    let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
    let done = f(&mut w)
        .and_then(|()| w.flush())
        .and_then(|()| w.get_ref().sync_all());
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    std::fs::rename(&tmp, path).map_err(io)
}
