//! `coexec embed`: a corpus's sentence embeddings into a `.npy` or JSONL
//! file, on every device at once.
//!
//! Lines are read in windows of [`WINDOW`]; a window is tokenised while
//! the one before it runs, and its texts go to the same batching stream
//! the service uses, so the vectors are the service's. Row `i` of the
//! output is line `i + 1` of the input: a bad line (not JSON, no such
//! field, empty) is reported by its number on stderr and written as a row
//! of NaN (`.npy`) or `{"line": n, "error": …}` (JSONL). An output that
//! exists is refused, or continued with `--resume` from its last whole
//! row.
//!
//! `--shard i/n` embeds only the `i`-th of `n` contiguous slices of the
//! corpus (a Slurm job array's task, say); `coexec merge` joins the shards'
//! outputs in order and checks their counts.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coexec::Runtime;
use coexec::embed::{Embedder, normalize};
use coexec::stream::{Stream, StreamConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::Failure;

/// Lines tokenised and queued at once.
const WINDOW: usize = 2048;

#[derive(Debug, clap::Args)]
pub(crate) struct EmbedArgs {
    /// The model folder (config.json, model.safetensors, tokenizer.json;
    /// `scripts/fetch_model.sh` fetches all-MiniLM-L6-v2).
    #[arg(long)]
    model: PathBuf,
    /// The corpus: JSON Lines (`.jsonl`, `.ndjson`: each line a string or
    /// an object with --field), else one text per line.
    #[arg(long)]
    input: PathBuf,
    /// The vectors: `.npy` (float32, one row per input line) or `.jsonl`
    /// (`{"line": n, "embedding": [...]}` per line).
    #[arg(long)]
    output: PathBuf,
    /// The field holding the text in a JSON Lines object.
    #[arg(long, default_value = "text")]
    field: String,
    /// Continue an output that exists from its last whole row.
    #[arg(long)]
    resume: bool,
    /// Only the I-th (from 0) of N contiguous slices of the corpus: lines
    /// I·L/N + 1 to (I+1)·L/N of L. Row numbers and errors keep the
    /// corpus's line numbers.
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// Write the pooled vectors as they are, not scaled to unit length.
    #[arg(long)]
    no_normalize: bool,
    /// Devices: cpu[:N], sim:N@SPEED[+LATENCY], cuda:ID[xSTREAMS], comma-separated.
    #[arg(long, env = "COEXEC_DEVICES")]
    devices: Option<String>,
    /// Most tokens in one batch.
    #[arg(long, default_value_t = 16384)]
    max_batch_tokens: usize,
    /// Batches running at once (default: one per device class, plus one).
    #[arg(long)]
    in_flight: Option<usize>,
    /// Where profiles live (default: COEXEC_PROFILE_DIR, else the cache dir).
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// One input line: its text, or why it has none.
type Line = Result<String, String>;

/// The `index`-th of `count` contiguous slices of a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    index: usize,
    count: usize,
}

impl Shard {
    pub(crate) fn new(index: usize, count: usize) -> Result<Self, String> {
        if count == 0 || index >= count {
            return Err(format!(
                "shard {index}/{count}: I must be below N, and N at least 1"
            ));
        }
        Ok(Self { index, count })
    }

    /// Its lines (0-based) of a corpus of `lines`: every line in exactly
    /// one shard, the shards in order, their sizes at most one apart.
    pub(crate) fn range(self, lines: usize) -> std::ops::Range<usize> {
        let at = |i: usize| (i as u128 * lines as u128 / self.count as u128) as usize;
        at(self.index)..at(self.index + 1)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: expected I/N, e.g. 0/3"))?;
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|e| format!("`{s}`: `{t}` {e}"))
        };
        Shard::new(num(i)?, num(n)?)
    }
}

/// Reads the texts of `path`'s lines (JSON Lines by extension, else plain).
fn read_lines(path: &Path, field: &str) -> Result<Vec<Line>, Failure> {
    let json = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl" | "ndjson")
    );
    let mut lines = Vec::new();
    for line in corpus_lines(path)? {
        let line = line?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        let text = match std::str::from_utf8(line) {
            Err(e) => Err(format!("not UTF-8: {e}")),
            Ok(s) if !json => Ok(s.to_string()),
            Ok(s) => match serde_json::from_str::<serde_json::Value>(s) {
                Err(e) => Err(format!("not JSON: {e}")),
                Ok(serde_json::Value::String(t)) => Ok(t),
                Ok(serde_json::Value::Object(o)) => match o.get(field) {
                    Some(serde_json::Value::String(t)) => Ok(t.clone()),
                    Some(v) => Err(format!("field `{field}` is not a string: {v}")),
                    None => Err(format!("no field `{field}`")),
                },
                Ok(v) => Err(format!("neither a string nor an object: {v}")),
            },
        };
        lines.push(text.and_then(|t| {
            if t.is_empty() {
                Err("empty text".into())
            } else {
                Ok(t)
            }
        }));
    }
    Ok(lines)
}

/// A corpus file's lines, as `embed` numbers them and `merge` counts them:
/// split at `\n`, the last one with or without its line break.
pub(crate) fn corpus_lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<Vec<u8>, Failure>>, Failure> {
    let file = File::open(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    let path = path.to_path_buf();
    Ok(BufReader::new(file)
        .split(b'\n')
        .map(move |l| l.map_err(|e| Failure::Run(format!("{}: {e}", path.display())))))
}

/// Where rows go: `.npy` or JSON Lines, appended in order.
enum Sink {
    Npy(BufWriter<File>, usize),
    Jsonl(BufWriter<File>),
}

/// The `.npy` header of a `rows × dim` float32 array, padded to 64 bytes.
pub(crate) fn npy_header(rows: usize, dim: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    let len = (dict.len() + pad + 1) as u16;
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.extend(std::iter::repeat_n(b' ', pad));
    h.push(b'\n');
    h
}

impl Sink {
    /// Opens `path` for `rows × dim`; the rows already there when
    /// resuming (a partial last row cut off).
    fn open(path: &Path, rows: usize, dim: usize, resume: bool) -> Result<(Self, usize), Failure> {
        let npy = match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => true,
            Some("jsonl" | "ndjson") => false,
            _ => {
                return Err(Failure::Usage(format!(
                    "--output {}: the name must end in .npy or .jsonl",
                    path.display()
                )));
            }
        };
        let exists = path.exists();
        if exists && !resume {
            return Err(Failure::Usage(format!(
                "--output {} exists: --resume continues it, or remove it",
                path.display()
            )));
        }
        let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", path.display()));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        if npy {
            let header = npy_header(rows, dim);
            let done = if len == 0 {
                f.write_all(&header).map_err(io)?;
                0
            } else {
                let mut old = vec![0; header.len()];
                let same = f.read_exact(&mut old).is_ok() && old == header;
                if !same {
                    return Err(Failure::Usage(format!(
                        "--output {}: not a {rows} × {dim} float32 .npy of this input; \
                         cannot resume it",
                        path.display()
                    )));
                }
                ((len - header.len() as u64) / (dim as u64 * 4)) as usize
            };
            let end = header.len() as u64 + (done * dim * 4) as u64;
            f.set_len(end).map_err(io)?;
            f.seek(SeekFrom::Start(end)).map_err(io)?;
            Ok((Sink::Npy(BufWriter::new(f), dim), done))
        } else {
            let mut text = Vec::new();
            f.read_to_end(&mut text).map_err(io)?;
            // Whole lines only: a partial last one is cut off.
            let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            let done = text[..end].iter().filter(|&&b| b == b'\n').count();
            if done > rows {
                return Err(Failure::Usage(format!(
                    "--output {} holds {done} rows, more than the input's {rows} lines",
                    path.display()
                )));
            }
            f.set_len(end as u64).map_err(io)?;
            f.seek(SeekFrom::Start(end as u64)).map_err(io)?;
            Ok((Sink::Jsonl(BufWriter::new(f)), done))
        }
    }

    fn row(&mut self, line: usize, v: Result<&[f32], &str>) -> std::io::Result<()> {
        match self {
            Sink::Npy(w, dim) => {
                let nan = vec![f32::NAN; *dim];
                let v = v.unwrap_or(&nan);
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.write_all(&bytes)
            }
            Sink::Jsonl(w) => {
                let s = match v {
                    Ok(v) => serde_json::json!({"line": line, "embedding": v}),
                    Err(e) => serde_json::json!({"line": line, "error": e}),
                };
                writeln!(w, "{s}")
            }
        }
    }

    fn finish(self) -> std::io::Result<()> {
        match self {
            Sink::Npy(mut w, _) | Sink::Jsonl(mut w) => {
                w.flush()?;
                w.get_ref().sync_all()
            }
        }
    }
}

pub(crate) async fn embed(a: EmbedArgs) -> Result<(), Failure> {
    if a.max_batch_tokens == 0 {
        return Err(Failure::Usage(
            "--max-batch-tokens must be at least 1".into(),
        ));
    }
    let model = Embedder::load(&a.model)?;
    let mut lines = read_lines(&a.input, &a.field)?;
    // Line `first + 1` of the corpus is this run's first.
    let first = match a.shard {
        Some(shard) => {
            let r = shard.range(lines.len());
            lines.truncate(r.end);
            lines.drain(..r.start);
            r.start
        }
        None => 0,
    };
    let (mut sink, done) = Sink::open(&a.output, lines.len(), model.dim(), a.resume)?;
    let mut b = Runtime::builder();
    if let Some(d) = &a.devices {
        b = b.devices(d)?;
    }
    if let Some(d) = &a.profile_dir {
        b = b.profile_dir(d);
    }
    let rt = Arc::new(b.build()?);
    let in_flight = a.in_flight.unwrap_or(rt.classes().len() + 1).max(1);
    let stream = Stream::start(
        rt.clone(),
        model.clone(),
        StreamConfig::new()
            .max_batch(256)
            .max_batch_cost(Some(a.max_batch_tokens))
            .max_wait(Duration::ZERO)
            .queue(2 * WINDOW)
            .in_flight(in_flight),
    )?;
    let bar = if a.quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::with_draw_target(
            Some(lines.len() as u64),
            ProgressDrawTarget::stderr_with_hz(10),
        );
        if let Ok(s) =
            ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} lines {per_sec} eta {eta}")
        {
            b.set_style(s);
        }
        b
    };
    bar.set_position(done as u64);
    let t0 = Instant::now();
    let (mut texts, mut tokens, mut bad) = (0usize, 0usize, 0usize);
    let normalized = !a.no_normalize;
    let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", a.output.display()));
    // The next window is tokenised on the blocking pool while this one runs.
    let tokenize = |from: usize| {
        let (model, window): (Embedder, Vec<Line>) = (
            model.clone(),
            lines[from..(from + WINDOW).min(lines.len())].to_vec(),
        );
        tokio::task::spawn_blocking(move || {
            window
                .into_iter()
                .map(|l| l.and_then(|t| model.tokenize(&t, true).map_err(|e| e.to_string())))
                .collect::<Vec<_>>()
        })
    };
    // Two windows are queued at a time: while the results of the older one
    // are written, the stream already holds the next, so no device idles at
    // a window's end waiting for its slowest batch.
    let mut next = (done < lines.len()).then(|| tokenize(done));
    let mut queued = std::collections::VecDeque::new();
    let mut submitted = done;
    let mut at = done;
    loop {
        if let Some(window) = next.take() {
            let window = window.await.map_err(|e| Failure::Run(e.to_string()))?;
            let pending: Vec<_> = window
                .into_iter()
                .map(|ids| {
                    ids.map(|ids| {
                        tokens += ids.len();
                        let s = stream.clone();
                        tokio::spawn(async move { s.infer(ids).await })
                    })
                })
                .collect();
            submitted += pending.len();
            if submitted < lines.len() {
                next = Some(tokenize(submitted));
            }
            queued.push_back(pending);
            if queued.len() < 2 && next.is_some() {
                continue;
            }
        }
        let Some(pending) = queued.pop_front() else {
            break;
        };
        for p in pending {
            let line = first + at + 1;
            match p {
                Ok(h) => {
                    let mut v = h
                        .await
                        .map_err(|e| Failure::Run(e.to_string()))?
                        .map_err(|e| Failure::Run(format!("line {line}: {e}")))?;
                    if normalized {
                        normalize(&mut v);
                    }
                    sink.row(line, Ok(&v)).map_err(io)?;
                    texts += 1;
                }
                Err(why) => {
                    bar.suspend(|| errln!("{}:{line}: {why}", a.input.display()));
                    sink.row(line, Err(&why)).map_err(io)?;
                    bad += 1;
                }
            }
            at += 1;
            bar.inc(1);
        }
    }
    sink.finish().map_err(io)?;
    bar.finish_and_clear();
    stream.shutdown().await;
    drop(stream);
    let split = rt
        .progress()
        .iter()
        .map(|(class, items)| format!("{class} {items}"))
        .collect::<Vec<_>>()
        .join(", ");
    if let Ok(rt) = Arc::try_unwrap(rt) {
        rt.shutdown().await;
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    outln!(
        "embedded {texts} texts ({tokens} tokens) in {secs:.2} s: {:.1} texts/s, {:.0} tokens/s; \
         {bad} bad lines, {done} rows resumed; {} rows of {} in {}; work units per class: {split}",
        texts as f64 / secs,
        tokens as f64 / secs,
        lines.len(),
        model.dim(),
        a.output.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_line_once_in_order() {
        for lines in [0, 1, 2, 7, 30_000, 30_001] {
            for count in 1..=5 {
                let mut next = 0;
                for index in 0..count {
                    let r = Shard::new(index, count).unwrap().range(lines);
                    assert_eq!(r.start, next, "{index}/{count} of {lines}");
                    assert!(r.len() <= lines / count + 1);
                    next = r.end;
                }
                assert_eq!(next, lines);
            }
        }
    }

    #[test]
    fn a_shard_is_read_as_i_of_n() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard::new(2, 3).unwrap()));
        for bad in ["3/3", "0/0", "1", "a/3", "-1/3", "1/3/4"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
