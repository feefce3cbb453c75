//! `coexec embed`: a corpus's sentence embeddings into a `.npy` or JSONL
//! file, on every device at once.
//!
//! Lines are read in windows of at most [`WINDOW`] lines and
//! [`WINDOW_BYTES`] bytes, each line at most `--max-line-bytes` of it; a
//! window is tokenised while the one before it runs, and its texts go to
//! the same batching stream the service uses, so the vectors are the
//! service's. Row `i` of the output is line `i + 1` of the input: a bad
//! line (not JSON, no such field, empty, refused by the model, a vector
//! that is not finite) is reported by its number on stderr and written as
//! a row of NaN (`.npy`) or `{"line": n, "error": …}` (JSONL).
//!
//! Beside the output, `<output>.coexec.json` records the run (model,
//! corpus and the hash of the lines read, shard, settings: [`RunRecord`]).
//! An output that exists is refused, or continued with `--resume` from its
//! last whole row, for the run its record names only.
//!
//! `--shard i/n` embeds only the `i`-th of `n` contiguous slices of the
//! corpus (a Slurm job array's task, say), reading only that slice (the
//! corpus's line index, [`crate::corpus`], is built once); `coexec merge`
//! joins the shards' outputs in the order of their records.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coexec::Runtime;
use coexec::stream::{Stream, StreamConfig, StreamError};
use coexec_models::{Embedder, TokenizeError, normalize};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::Failure;
use crate::corpus::{Corpus, RawLine, Slice, read_line};
use crate::record::{RunRecord, RunSpec, mismatch};

/// Most lines tokenised and queued at once.
const WINDOW: usize = 2048;

/// Most bytes of text in one window: with `--max-line-bytes`, what bounds
/// the memory a window of long lines takes.
const WINDOW_BYTES: usize = 64 << 20;

#[derive(Debug, clap::Args)]
pub(crate) struct EmbedArgs {
    /// The model folder (config.json, model.safetensors, tokenizer.json;
    /// `scripts/fetch_model.sh` fetches all-MiniLM-L6-v2).
    #[arg(long)]
    model: PathBuf,
    /// The corpus, a regular file: JSON Lines (`.jsonl`, `.ndjson`: each
    /// line a string or an object with --field), else one text per line.
    #[arg(long)]
    input: PathBuf,
    /// The vectors: `.npy` (float32, one row per input line) or `.jsonl`
    /// (`{"line": n, "embedding": [...]}` per line); the run's record is
    /// written beside it as `<output>.coexec.json`.
    #[arg(long)]
    output: PathBuf,
    /// The field holding the text in a JSON Lines object.
    #[arg(long, default_value = "text")]
    field: String,
    /// Continue an output that exists from its last whole row (the same
    /// model, corpus, shard and settings only: its record is checked).
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
    /// The most bytes of one line read: a JSON line past it is a bad line;
    /// a plain-text line is cut there (at a space), which changes nothing
    /// when its first bytes hold more tokens than the model takes, and is
    /// a bad line otherwise.
    #[arg(long, default_value_t = 16 << 20)]
    max_line_bytes: usize,
    /// Where corpus line indexes are kept (default: COEXEC_INDEX_DIR, else
    /// the cache dir's coexec/corpus-index): a shard seeks to its lines.
    #[arg(long, env = "COEXEC_INDEX_DIR")]
    index_dir: Option<PathBuf>,
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

/// One input line: its token ids, or why it has none.
type Line = Result<Vec<u32>, String>;

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

/// Where corpus indexes are kept: `dir`, else the cache dir's.
pub(crate) fn index_dir(dir: Option<&Path>) -> Option<PathBuf> {
    dir.map(Path::to_path_buf)
        .or_else(|| dirs::cache_dir().map(|d| d.join("coexec").join("corpus-index")))
}

/// Whether `path` is read as JSON Lines (by its extension).
pub(crate) fn is_json_lines(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl" | "ndjson")
    )
}

/// Refuses an output that is the input itself (the same file by device
/// and inode, whatever the names).
pub(crate) fn not_the_input(output: &Path, input: &Path) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(o), Ok(i)) = (std::fs::metadata(output), std::fs::metadata(input)) else {
        return Ok(());
    };
    if (o.dev(), o.ino()) == (i.dev(), i.ino()) {
        return Err(Failure::Usage(format!(
            "--output {} is the input {}: refused, it would overwrite the corpus",
            output.display(),
            input.display()
        )));
    }
    Ok(())
}

/// Reads a slice's lines in windows and tokenises them.
struct Reader {
    slice: Slice,
    json: bool,
    field: String,
    cap: usize,
    model: Embedder,
}

impl Reader {
    /// The next window's lines, tokenised: at most [`WINDOW`] lines and
    /// [`WINDOW_BYTES`] bytes; empty past the slice.
    fn window(&mut self) -> Result<Vec<Line>, Failure> {
        let (mut out, mut bytes) = (Vec::new(), 0);
        while out.len() < WINDOW && bytes < WINDOW_BYTES {
            let Some(raw) = self.slice.next_line(self.cap)? else {
                break;
            };
            bytes += raw.bytes.len();
            out.push(self.tokens(raw));
        }
        Ok(out)
    }

    fn tokens(&self, raw: RawLine) -> Line {
        let cut = raw.cut_from;
        let text = text_of(raw, self.json, &self.field, self.cap)?;
        if text.is_empty() {
            return Err("empty text".into());
        }
        let Some(len) = cut else {
            return self.model.tokenize(&text, true).map_err(|e| e.to_string());
        };
        // A cut line's vector is the whole line's only when its first
        // bytes already hold more tokens than the model takes.
        match self.model.tokenize(&text, false) {
            Err(TokenizeError::TooLong { .. }) => {
                self.model.tokenize(&text, true).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
            Ok(_) => Err(format!(
                "{len} bytes, past --max-line-bytes {}, and its first bytes hold fewer \
                 tokens than the model's {}: not embedded (raise --max-line-bytes)",
                self.cap,
                self.model.max_input_length()
            )),
        }
    }
}

/// The text of one line: the line itself, or its JSON string or field.
fn text_of(raw: RawLine, json: bool, field: &str, cap: usize) -> Result<String, String> {
    if let Some(len) = raw.cut_from {
        if json {
            return Err(format!(
                "{len} bytes, past --max-line-bytes {cap}: a JSON line is read whole or not at all"
            ));
        }
        // Cut within the cap at a whole character, then at a space, so no
        // word is cut in two.
        let mut bytes = raw.bytes;
        if let Err(e) = std::str::from_utf8(&bytes)
            && e.error_len().is_none()
        {
            bytes.truncate(e.valid_up_to());
        }
        let text =
            String::from_utf8(bytes).map_err(|e| format!("not UTF-8: {}", e.utf8_error()))?;
        let at = text
            .char_indices()
            .rev()
            .find(|(_, c)| c.is_whitespace())
            .map_or(text.len(), |(i, _)| i);
        return Ok(text[..at].to_string());
    }
    let text =
        String::from_utf8(raw.bytes).map_err(|e| format!("not UTF-8: {}", e.utf8_error()))?;
    if !json {
        return Ok(text);
    }
    match serde_json::from_str::<serde_json::Value>(&text) {
        Err(e) => Err(format!("not JSON: {e}")),
        Ok(serde_json::Value::String(t)) => Ok(t),
        Ok(serde_json::Value::Object(mut o)) => match o.remove(field) {
            Some(serde_json::Value::String(t)) => Ok(t),
            Some(v) => Err(format!("field `{field}` is not a string: {v}")),
            None => Err(format!("no field `{field}`")),
        },
        Ok(v) => Err(format!("neither a string nor an object: {v}")),
    }
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

/// Whether `path` names a `.npy` output (else JSON Lines); other names are
/// refused.
pub(crate) fn output_is_npy(flag: &str, path: &Path) -> Result<bool, Failure> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => Ok(true),
        Some("jsonl" | "ndjson") => Ok(false),
        _ => Err(Failure::Usage(format!(
            "{flag} {}: the name must end in .npy or .jsonl",
            path.display()
        ))),
    }
}

/// The longest JSON Lines row of `dim` values `embed` writes, with room:
/// a line past it is no row of `embed`'s.
pub(crate) fn max_row_bytes(dim: usize) -> usize {
    dim * 32 + 4096
}

/// Checks that the whole lines of a JSON Lines output are rows `first`,
/// `first + 1`, … (corpus line numbers) of `dim` values or an error, each
/// written by `embed`; calls `row` with each line, its line break
/// included. Returns the rows and the bytes they take; a partial last line
/// is left out.
pub(crate) fn jsonl_rows(
    path: &Path,
    r: &mut impl std::io::BufRead,
    first: usize,
    dim: usize,
    mut row: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<(usize, u64), Failure> {
    let (mut rows, mut bytes) = (0usize, 0u64);
    loop {
        let (line, used, ended) = read_line(r, max_row_bytes(dim))
            .map_err(|e| Failure::Run(format!("{}: {e}", path.display())))?;
        if !ended {
            // The end, or a last line without its line break: an
            // unfinished row, cut off when resuming.
            return Ok((rows, bytes));
        }
        let want = first + rows;
        let bad = |why: &str| {
            Failure::Usage(format!(
                "{}:{}: {why}, where corpus line {want}'s row was due",
                path.display(),
                rows + 1
            ))
        };
        if line.cut_from.is_some() {
            return Err(bad("a line longer than any row"));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&line.bytes).map_err(|_| bad("not a JSON row"))?;
        if v.get("line").and_then(serde_json::Value::as_u64) != Some(want as u64) {
            return Err(bad(&format!(
                "the row of line {}",
                v.get("line").unwrap_or(&serde_json::Value::Null)
            )));
        }
        let ok = match (v.get("embedding"), v.get("error")) {
            (Some(serde_json::Value::Array(e)), None) => e.len() == dim,
            (None, Some(serde_json::Value::String(_))) => true,
            _ => false,
        };
        if !ok {
            return Err(bad(&format!("not a row of {dim} values nor an error")));
        }
        let mut l = line.bytes;
        l.push(b'\n');
        row(&l).map_err(|e| Failure::Run(format!("{e}")))?;
        rows += 1;
        bytes += used;
    }
}

impl Sink {
    /// Opens `path` for the rows of `record`; the rows already there when
    /// resuming (a partial last row cut off), the output checked to be
    /// that run's.
    fn open(path: &Path, record: &RunRecord, resume: bool) -> Result<(Self, usize), Failure> {
        let npy = output_is_npy("--output", path)?;
        let exists = path.exists();
        if exists && !resume {
            return Err(Failure::Usage(format!(
                "--output {} exists: --resume continues it, or remove it",
                path.display()
            )));
        }
        if exists {
            let old = RunRecord::read(path)?;
            let d = old.differences(record, true);
            if let Some(m) = mismatch(&format!("--output {}", path.display()), "this run", &d) {
                return Err(Failure::Usage(format!("{m}: cannot resume it")));
            }
        } else {
            record.write(path)?;
        }
        let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", path.display()));
        let (rows, dim) = (record.rows, record.dim);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let done = if npy {
            let header = npy_header(rows, dim);
            let mut old = Vec::new();
            (&mut f)
                .take(header.len() as u64)
                .read_to_end(&mut old)
                .map_err(io)?;
            // A header cut short is one this run was writing.
            if !header.starts_with(&old) {
                return Err(Failure::Usage(format!(
                    "--output {}: not a {rows} × {dim} float32 .npy of this run; cannot resume it",
                    path.display()
                )));
            }
            let row = dim as u64 * 4;
            let data = len.saturating_sub(header.len() as u64);
            if data > rows as u64 * row {
                return Err(Failure::Usage(format!(
                    "--output {}: {data} bytes of rows, past its {rows} rows of {row}; cannot resume it",
                    path.display()
                )));
            }
            let done = (data / row.max(1)) as usize;
            if (old.len()) < header.len() {
                f.seek(SeekFrom::Start(0)).map_err(io)?;
                f.write_all(&header).map_err(io)?;
            }
            let end = header.len() as u64 + done as u64 * row;
            f.set_len(end).map_err(io)?;
            f.seek(SeekFrom::Start(end)).map_err(io)?;
            done
        } else {
            let mut r = BufReader::new(&mut f);
            let (done, end) = jsonl_rows(path, &mut r, record.first_line, dim, |_| Ok(()))?;
            if done > rows {
                return Err(Failure::Usage(format!(
                    "--output {} holds {done} rows, more than this run's {rows} lines",
                    path.display()
                )));
            }
            drop(r);
            f.set_len(end).map_err(io)?;
            f.seek(SeekFrom::Start(end)).map_err(io)?;
            done
        };
        let w = BufWriter::new(f);
        Ok((
            if npy {
                Sink::Npy(w, dim)
            } else {
                Sink::Jsonl(w)
            },
            done,
        ))
    }

    fn row(&mut self, line: usize, v: Result<&[f32], &str>) -> std::io::Result<()> {
        match self {
            Sink::Npy(w, dim) => match v {
                Ok(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Err(_) => (0..*dim).try_for_each(|_| w.write_all(&f32::NAN.to_le_bytes())),
            },
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

/// What one line's answer from the stream makes of its row.
#[derive(Debug)]
enum Row {
    /// Its vector (normalised where asked).
    Vector(Vec<f32>),
    /// A NaN row: the model's vector was not finite.
    NotFinite(String),
    /// A NaN row: the model refused the input.
    Refused(String),
    /// The run stops: its batch failed (the rows before it are kept for
    /// `--resume`).
    Failed(StreamError),
}

fn row_of(got: Result<Vec<f32>, StreamError>, normalized: bool) -> Row {
    match got {
        Ok(mut v) if v.iter().all(|x| x.is_finite()) => {
            if normalized {
                normalize(&mut v);
            }
            Row::Vector(v)
        }
        Ok(_) => Row::NotFinite("the model's vector is not finite".into()),
        Err(StreamError::Output { why }) => Row::NotFinite(why),
        Err(e @ StreamError::Invalid { .. }) => Row::Refused(e.to_string()),
        Err(e) => Row::Failed(e),
    }
}

pub(crate) async fn embed(a: EmbedArgs) -> Result<(), Failure> {
    if a.max_batch_tokens == 0 {
        return Err(Failure::Usage(
            "--max-batch-tokens must be at least 1".into(),
        ));
    }
    if a.max_line_bytes == 0 {
        return Err(Failure::Usage("--max-line-bytes must be at least 1".into()));
    }
    output_is_npy("--output", &a.output)?;
    not_the_input(&a.output, &a.input)?;
    let corpus = Corpus::open(&a.input, index_dir(a.index_dir.as_deref()).as_deref())?;
    let model = Embedder::load(&a.model)?;
    let shard = a.shard.unwrap_or(Shard { index: 0, count: 1 });
    let range = shard.range(corpus.lines());
    let mut slice = corpus.slice(range.clone())?;
    let json = is_json_lines(&a.input);
    let record = RunRecord::new(RunSpec {
        model_sha256: model.sha256(),
        dim: model.dim(),
        normalized: !a.no_normalize,
        field: json.then_some(a.field.as_str()),
        corpus: corpus.id(),
        shard: (shard.index, shard.count),
        lines: range.clone(),
        read_sha256: slice.sha256()?,
    });
    let (mut sink, done) = Sink::open(&a.output, &record, a.resume)?;
    let first = slice.first_line();
    let total = slice.lines();
    slice.skip(done)?;
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
            Some(total as u64),
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
    let (mut texts, mut tokens, mut bad, mut not_finite) = (0usize, 0usize, 0usize, 0usize);
    let normalized = !a.no_normalize;
    let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", a.output.display()));
    // The next window is read and tokenised on the blocking pool while
    // this one runs; the reader goes there and comes back with it.
    let tokenize = |mut reader: Reader| {
        tokio::task::spawn_blocking(move || {
            let window = reader.window();
            (reader, window)
        })
    };
    let reader = Reader {
        slice,
        json,
        field: a.field.clone(),
        cap: a.max_line_bytes,
        model: model.clone(),
    };
    // Two windows are queued at a time: while the results of the older one
    // are written, the stream already holds the next, so no device idles at
    // a window's end waiting for its slowest batch.
    let mut next = (done < total).then(|| tokenize(reader));
    let mut queued = std::collections::VecDeque::new();
    let mut at = done;
    loop {
        if let Some(window) = next.take() {
            let (reader, window) = window.await.map_err(|e| Failure::Run(e.to_string()))?;
            let window = window?;
            let more = !window.is_empty();
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
            if more {
                next = Some(tokenize(reader));
                queued.push_back(pending);
            }
            if queued.len() < 2 && next.is_some() {
                continue;
            }
        }
        let Some(pending) = queued.pop_front() else {
            break;
        };
        for p in pending {
            let line = first + at + 1;
            let row = match p {
                Ok(h) => {
                    let got = h.await.map_err(|e| Failure::Run(e.to_string()))?;
                    match row_of(got, normalized) {
                        Row::Vector(v) => Ok(v),
                        Row::NotFinite(why) => {
                            not_finite += 1;
                            Err(why)
                        }
                        Row::Refused(why) => Err(why),
                        Row::Failed(e) => return Err(Failure::Run(format!("line {line}: {e}"))),
                    }
                }
                Err(why) => Err(why),
            };
            match &row {
                Ok(v) => {
                    sink.row(line, Ok(v)).map_err(io)?;
                    texts += 1;
                }
                Err(why) => {
                    bar.suspend(|| errln!("{}:{line}: {why}", a.input.display()));
                    sink.row(line, Err(why)).map_err(io)?;
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
    if at != total {
        return Err(Failure::Run(format!(
            "{}: {at} of its {total} lines read (changed while being read?)",
            a.input.display()
        )));
    }
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    outln!(
        "embedded {texts} texts ({tokens} tokens) in {secs:.2} s: {:.1} texts/s, {:.0} tokens/s; \
         {bad} bad lines ({not_finite} not finite), {done} rows resumed; {total} rows of {} in {}; \
         work units per class: {split}",
        texts as f64 / secs,
        tokens as f64 / secs,
        model.dim(),
        a.output.display()
    );
    if not_finite > 0 {
        return Err(Failure::Incomplete(format!(
            "{not_finite} rows are NaN where the model's vectors were not finite \
             (lines named above)"
        )));
    }
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
    fn each_answer_is_a_vector_a_nan_row_or_the_runs_end() {
        assert!(matches!(row_of(Ok(vec![3.0, 4.0]), true), Row::Vector(v) if v == [0.6, 0.8]));
        assert!(matches!(row_of(Ok(vec![3.0, 4.0]), false), Row::Vector(v) if v == [3.0, 4.0]));
        assert!(matches!(
            row_of(Ok(vec![1.0, f32::NAN]), true),
            Row::NotFinite(_)
        ));
        assert!(matches!(
            row_of(Ok(vec![f32::INFINITY]), false),
            Row::NotFinite(_)
        ));
        let out = StreamError::Output {
            why: "value 3 is inf".into(),
        };
        assert!(matches!(row_of(Err(out), true), Row::NotFinite(w) if w == "value 3 is inf"));
        let bad = StreamError::Invalid {
            index: 0,
            why: "0 tokens".into(),
        };
        assert!(matches!(row_of(Err(bad), true), Row::Refused(w) if w.contains("0 tokens")));
        assert!(matches!(
            row_of(Err(StreamError::Closed), true),
            Row::Failed(_)
        ));
    }

    #[test]
    fn a_shard_is_read_as_i_of_n() {
        assert_eq!("2/3".parse::<Shard>(), Ok(Shard::new(2, 3).unwrap()));
        for bad in ["3/3", "0/0", "1", "a/3", "-1/3", "1/3/4"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
