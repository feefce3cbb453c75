//! A corpus as `embed` and `merge` read it: a regular file of lines (split
//! at `\n`, the last one with or without its line break), indexed once and
//! read by slices.
//!
//! The index holds the corpus's size, line count and SHA-256, and the byte
//! offset of every [`STRIDE`]-th line. It is built by one pass over the
//! file in constant memory and kept in an index folder keyed by the
//! corpus's path, so a shard task of a Slurm array seeks to its slice and
//! reads only that: the first task builds the index under a lock, the
//! others wait for it and read it. An index whose corpus has since changed
//! (size, modification time or inode) is built again.
//!
//! A line is read with a cap on its bytes: the reader never holds more of
//! one line than the cap, whatever the file holds.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Failure;

/// Lines between two offsets the index keeps: a slice starts at most this
/// many lines past the offset it seeks to.
const STRIDE: u64 = 4096;

/// The index file's layout version.
const INDEX_VERSION: u32 = 1;

/// An index file is a few KiB to a few MiB: past this, not read.
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// What identifies the corpus file an index was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    bytes: u64,
    modified_ns: u128,
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let modified_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Self {
            bytes: meta.len(),
            modified_ns,
            inode: meta.ino(),
            device: meta.dev(),
        }
    }
}

/// A corpus's line index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Index {
    version: u32,
    stamp: Stamp,
    lines: u64,
    sha256: String,
    /// `offsets[k]`: where line `k·STRIDE` (0-based) starts.
    offsets: Vec<u64>,
}

/// What a corpus is, as a run's record gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CorpusId {
    /// Its size in bytes.
    pub(crate) bytes: u64,
    /// Its lines.
    pub(crate) lines: u64,
    /// The SHA-256 of its bytes, hex.
    pub(crate) sha256: String,
}

/// An indexed corpus file.
pub(crate) struct Corpus {
    path: PathBuf,
    index: Index,
}

/// Reads `bytes` bytes of `r` into `f`, a piece at a time.
fn each_piece(r: &mut impl Read, mut bytes: u64, mut f: impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    while bytes > 0 {
        let want = buf.len().min(usize::try_from(bytes).unwrap_or(usize::MAX));
        let n = r.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ended early (cut while being read?)",
            ));
        }
        f(&buf[..n]);
        bytes -= n as u64;
    }
    Ok(())
}

impl Corpus {
    /// Opens the corpus `path` (a regular file only: a FIFO or a device is
    /// refused at once) and its index, building the index where it is
    /// missing or stale. `index_dir` keeps indexes; `None`, or a folder
    /// that cannot be written, builds it in memory for this run.
    pub(crate) fn open(path: &Path, index_dir: Option<&Path>) -> Result<Self, Failure> {
        let file = open(path)?;
        let stamp = Stamp::of(&file.metadata().map_err(|e| run_err(path, e))?);
        let index = match index_dir {
            Some(dir) => Self::stored_index(path, file, stamp, dir)?,
            None => build_index(path, file, stamp)?,
        };
        Ok(Self {
            path: path.to_path_buf(),
            index,
        })
    }

    /// The index kept in `dir`, built there under a lock when missing or
    /// stale (other processes wait for it, then read it).
    fn stored_index(path: &Path, file: File, stamp: Stamp, dir: &Path) -> Result<Index, Failure> {
        let canonical = path.canonicalize().map_err(|e| run_err(path, e))?;
        let key = format!(
            "{:x}",
            Sha256::digest(canonical.as_os_str().as_encoded_bytes())
        );
        let at = dir.join(format!("{}.json", &key[..32]));
        let read = || -> Option<Index> {
            let bytes = coexec_kernels::read_file(&at, MAX_INDEX_BYTES).ok()?;
            serde_json::from_slice::<Index>(&bytes)
                .ok()
                .filter(|i| i.version == INDEX_VERSION && i.stamp == stamp)
        };
        if let Some(i) = read() {
            return Ok(i);
        }
        if std::fs::create_dir_all(dir).is_err() {
            return build_index(path, file, stamp);
        }
        // One builder at a time; a lock that cannot be had (a file system
        // without locks) only costs the others a pass of their own.
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(at.with_extension("lock"))
            .ok()
            .filter(|l| l.lock().is_ok());
        if let Some(i) = read() {
            return Ok(i);
        }
        let index = build_index(path, file, stamp)?;
        // Written whole, then renamed into place: a reader sees the old
        // index, or none, or the new one. One that cannot be written costs
        // the next run a pass of its own, nothing else.
        if let Ok(json) = serde_json::to_vec(&index) {
            let _ = write_atomically(&at, &json);
        }
        drop(lock);
        Ok(index)
    }

    /// What the corpus is: size, lines, hash.
    pub(crate) fn id(&self) -> CorpusId {
        CorpusId {
            bytes: self.index.stamp.bytes,
            lines: self.index.lines,
            sha256: self.index.sha256.clone(),
        }
    }

    /// Its lines.
    pub(crate) fn lines(&self) -> usize {
        self.index.lines as usize
    }

    /// Its file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Lines `range` (0-based) of the corpus, to read.
    pub(crate) fn slice(&self, range: std::ops::Range<usize>) -> Result<Slice, Failure> {
        let file = open(&self.path)?;
        if Stamp::of(&file.metadata().map_err(|e| run_err(&self.path, e))?) != self.index.stamp {
            return Err(Failure::Run(format!(
                "{}: changed while being read",
                self.path.display()
            )));
        }
        let mut r = BufReader::with_capacity(1 << 16, file);
        let start = self.seek_line(&mut r, range.start as u64)?;
        let end = if range.end as u64 >= self.index.lines {
            self.index.stamp.bytes
        } else {
            self.seek_line(&mut r, range.end as u64)?
        };
        r.seek(SeekFrom::Start(start))
            .map_err(|e| run_err(&self.path, e))?;
        Ok(Slice {
            path: self.path.clone(),
            reader: r,
            start,
            end,
            at: start,
            first_line: range.start,
            lines: range.len(),
        })
    }

    /// Where line `line` (0-based) starts: the index's offset before it,
    /// then the lines between read past.
    fn seek_line(&self, r: &mut BufReader<File>, line: u64) -> Result<u64, Failure> {
        let k = (line / STRIDE) as usize;
        let Some(&from) = self.index.offsets.get(k) else {
            return Ok(self.index.stamp.bytes);
        };
        r.seek(SeekFrom::Start(from))
            .map_err(|e| run_err(&self.path, e))?;
        let mut at = from;
        for _ in 0..line % STRIDE {
            at += skip_line(r).map_err(|e| run_err(&self.path, e))?;
        }
        Ok(at)
    }
}

/// The regular file `path`, for reading.
pub(crate) fn open(path: &Path) -> Result<File, Failure> {
    coexec_kernels::open_regular(path).map_err(|e| Failure::Usage(e.to_string()))
}

fn run_err(path: &Path, e: std::io::Error) -> Failure {
    Failure::Run(format!("{}: {e}", path.display()))
}

/// The index of `file`: one pass, a MiB held at a time.
fn build_index(path: &Path, mut file: File, stamp: Stamp) -> Result<Index, Failure> {
    let mut sha = Sha256::new();
    let (mut newlines, mut at, mut last) = (0u64, 0u64, b'\n');
    let mut offsets = vec![0];
    each_piece(&mut file, stamp.bytes, |piece| {
        sha.update(piece);
        for (i, &b) in piece.iter().enumerate() {
            if b == b'\n' {
                newlines += 1;
                if newlines.is_multiple_of(STRIDE) {
                    offsets.push(at + i as u64 + 1);
                }
            }
        }
        at += piece.len() as u64;
        last = piece[piece.len() - 1];
    })
    .map_err(|e| run_err(path, e))?;
    let lines = newlines + u64::from(last != b'\n');
    // An offset at the very end starts no line.
    offsets.truncate(lines.div_ceil(STRIDE) as usize);
    Ok(Index {
        version: INDEX_VERSION,
        stamp,
        lines,
        sha256: format!("{:x}", sha.finalize()),
        offsets,
    })
}

/// Reads past one line and its line break; its length in bytes.
fn skip_line(r: &mut impl BufRead) -> std::io::Result<u64> {
    let mut n = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(n);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(n + i as u64 + 1);
            }
            None => {
                let len = buf.len();
                r.consume(len);
                n += len as u64;
            }
        }
    }
}

/// One line as read: at most the cap's bytes of it, without its line
/// break (nor a `\r` before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawLine {
    /// Its first bytes, at most the cap.
    pub(crate) bytes: Vec<u8>,
    /// Its whole length, when longer than the cap (the rest was skipped).
    pub(crate) cut_from: Option<u64>,
}

/// Lines `first_line..first_line + lines` of a corpus, read in order.
pub(crate) struct Slice {
    path: PathBuf,
    reader: BufReader<File>,
    start: u64,
    end: u64,
    at: u64,
    first_line: usize,
    lines: usize,
}

impl Slice {
    /// Its first line's number in the corpus (0-based).
    pub(crate) fn first_line(&self) -> usize {
        self.first_line
    }

    /// Its lines.
    pub(crate) fn lines(&self) -> usize {
        self.lines
    }

    /// The SHA-256 of its bytes (hex), read once through; the slice is then
    /// read again from its start.
    pub(crate) fn sha256(&mut self) -> Result<String, Failure> {
        let mut sha = Sha256::new();
        self.reader
            .seek(SeekFrom::Start(self.start))
            .map_err(|e| run_err(&self.path, e))?;
        each_piece(&mut self.reader, self.end - self.start, |p| sha.update(p))
            .map_err(|e| run_err(&self.path, e))?;
        self.reader
            .seek(SeekFrom::Start(self.start))
            .map_err(|e| run_err(&self.path, e))?;
        self.at = self.start;
        Ok(format!("{:x}", sha.finalize()))
    }

    /// Reads past `n` lines.
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), Failure> {
        for _ in 0..n {
            if self.at >= self.end {
                break;
            }
            self.at += skip_line(&mut self.reader).map_err(|e| run_err(&self.path, e))?;
        }
        Ok(())
    }

    /// The next line, at most `cap` bytes of it; `None` past the slice.
    pub(crate) fn next_line(&mut self, cap: usize) -> Result<Option<RawLine>, Failure> {
        if self.at >= self.end {
            return Ok(None);
        }
        let (line, used, _) =
            read_line(&mut self.reader, cap).map_err(|e| run_err(&self.path, e))?;
        self.at += used;
        Ok(Some(line))
    }
}

/// Reads one line of `r`, keeping at most `cap` bytes of it; with the
/// bytes it took from `r` (its line break included) and whether it ended
/// in a line break. At the end of `r`, an empty line and 0.
pub(crate) fn read_line(r: &mut impl BufRead, cap: usize) -> std::io::Result<(RawLine, u64, bool)> {
    let mut bytes = Vec::new();
    let (mut len, mut used, mut last, mut ended) = (0u64, 0u64, None, false);
    while !ended {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let take;
        (take, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        let room = cap.saturating_sub(bytes.len());
        bytes.extend_from_slice(&buf[..take.min(room)]);
        if take > 0 {
            last = Some(buf[take - 1]);
        }
        len += take as u64;
        let n = take + usize::from(ended);
        r.consume(n);
        used += n as u64;
    }
    // A `\r` before the line break is not the line's.
    let len = len - u64::from(last == Some(b'\r'));
    bytes.truncate(usize::try_from(len).unwrap_or(usize::MAX));
    let cut = len > bytes.len() as u64;
    Ok((
        RawLine {
            bytes,
            cut_from: cut.then_some(len),
        },
        used,
        ended,
    ))
}

/// Writes `path` through a temporary file beside it (`path` and `suffix`),
/// renamed into place once whole and on disk; nothing is left on an error.
pub(crate) fn write_via_temp(
    path: &Path,
    suffix: &str,
    f: impl FnOnce(&mut BufWriter<File>) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    let tmp = PathBuf::from(name);
    let io = |e: std::io::Error| Failure::Run(format!("{}: {e}", path.display()));
    let done = File::create(&tmp).map_err(io).and_then(|file| {
        let mut w = BufWriter::new(file);
        f(&mut w)?;
        w.flush().map_err(io)?;
        w.get_ref().sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Writes `bytes` to `path` whole or not at all ([`write_via_temp`]).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    write_via_temp(path, &format!(".tmp{}", std::process::id()), |w| {
        w.write_all(bytes)
            .map_err(|e| Failure::Run(format!("{}: {e}", path.display())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str, text: &[u8]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("coexec-corpus-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("corpus.txt");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn read_all(s: &mut Slice, cap: usize) -> Vec<RawLine> {
        let mut out = Vec::new();
        while let Some(l) = s.next_line(cap).unwrap() {
            out.push(l);
        }
        out
    }

    #[test]
    fn slices_read_exactly_their_lines_across_strides() {
        let n = 3 * STRIDE as usize + 17;
        let text: String = (0..n).map(|i| format!("line {i}\r\n")).collect();
        let p = scratch("slices", text.as_bytes());
        let dir = p.parent().unwrap().join("index");
        let c = Corpus::open(&p, Some(&dir)).unwrap();
        assert_eq!(c.lines(), n);
        assert_eq!(c.id().bytes, text.len() as u64);
        assert_eq!(
            c.id().sha256,
            format!("{:x}", Sha256::digest(text.as_bytes()))
        );
        // The index is kept, and read the second time.
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            2,
            "index and lock"
        );
        let again = Corpus::open(&p, Some(&dir)).unwrap();
        assert_eq!(again.index, c.index);
        for r in [0..0, 0..1, 4095..4097, 4096..8192, 5000..n, n..n, 17..9000] {
            let mut s = c.slice(r.clone()).unwrap();
            let want: Vec<String> = (r.start..r.end).map(|i| format!("line {i}")).collect();
            let bytes: String = (r.start..r.end).map(|i| format!("line {i}\r\n")).collect();
            assert_eq!(
                s.sha256().unwrap(),
                format!("{:x}", Sha256::digest(bytes.as_bytes()))
            );
            let got: Vec<String> = read_all(&mut s, 64)
                .into_iter()
                .map(|l| String::from_utf8(l.bytes).unwrap())
                .collect();
            assert_eq!(got, want, "{r:?}");
        }
    }

    #[test]
    fn a_changed_corpus_is_indexed_again() {
        let p = scratch("stale", b"a\nb\n");
        let dir = p.parent().unwrap().join("index");
        assert_eq!(Corpus::open(&p, Some(&dir)).unwrap().lines(), 2);
        std::fs::write(&p, b"a\nb\nc").unwrap();
        let c = Corpus::open(&p, Some(&dir)).unwrap();
        assert_eq!(c.lines(), 3, "the last line without its line break");
        let mut s = c.slice(2..3).unwrap();
        assert_eq!(read_all(&mut s, 8)[0].bytes, b"c");
    }

    #[test]
    fn a_line_past_the_cap_is_cut_and_the_next_read_whole() {
        let long = vec![b'x'; 100_000];
        let mut text = long.clone();
        text.extend_from_slice(b"\nshort\n\n");
        let p = scratch("cap", &text);
        let c = Corpus::open(&p, None).unwrap();
        assert_eq!(c.lines(), 3);
        let lines = read_all(&mut c.slice(0..3).unwrap(), 1000);
        assert_eq!(lines[0].bytes.len(), 1000);
        assert_eq!(lines[0].cut_from, Some(100_000));
        assert_eq!(
            lines[1],
            RawLine {
                bytes: b"short".to_vec(),
                cut_from: None
            }
        );
        assert_eq!(lines[2].bytes, b"");
    }

    #[test]
    fn an_empty_corpus_has_no_lines() {
        let p = scratch("empty", b"");
        let c = Corpus::open(&p, None).unwrap();
        assert_eq!(c.lines(), 0);
        assert!(read_all(&mut c.slice(0..0).unwrap(), 8).is_empty());
    }

    #[test]
    fn special_files_are_refused_before_they_are_read() {
        for p in ["/dev/zero", "/"] {
            match Corpus::open(Path::new(p), None) {
                Err(Failure::Usage(m)) => assert!(m.contains("not a regular file"), "{m}"),
                _ => panic!("{p} was taken as a corpus"),
            }
        }
    }
}
