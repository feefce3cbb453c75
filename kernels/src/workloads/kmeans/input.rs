//! Rodinia kmeans input files and generated inputs of the same shape.
//!
//!
//! Rodinia's text format, plain or `.xz` (detected by its magic bytes): one
//! object per line; the first token (ended by space or tab, as Rodinia's
//! `strtok(line, " \t\n")`) is an id and ignored; the rest, separated by runs of
//! spaces, commas and tabs, are features read as C `atof` (a leading number
//! prefix, `inf`/`nan`, hex floats; anything else — `tcp` — is 0.0) and stored
//! as f32. Blank lines are skipped. `\r` counts as a separator, so CRLF files
//! read as LF ones; lines of any length are one line (Rodinia's `fgets` would
//! split lines past 1023 bytes).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::super::check_bytes;
use crate::KernelError;
use crate::claim::next_id;

/// Points to cluster: `points × features` f32 values, row-major.
#[derive(Debug, Clone)]
pub struct KmeansData {
    pub(super) points: usize,
    pub(super) features: usize,
    pub(super) values: Vec<f32>,
    pub(super) source: Option<PathBuf>,
    /// Unique in the process (a clone shares it, and the values): a GPU
    /// keeps the points on the device under it for every run of a job.
    id: u64,
}

impl KmeansData {
    /// Reads a Rodinia kmeans input file, plain text or xz-compressed.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, KernelError> {
        let path = path.as_ref();
        let raw = crate::read_file(path, crate::memory_limit() / 2)?;
        if raw.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            let mut text = Vec::new();
            text.try_reserve(raw.len().saturating_mul(8))
                .map_err(|e| KernelError::Input {
                    path: path.to_path_buf(),
                    line: 0,
                    why: format!("cannot allocate for decompression: {e}"),
                })?;
            // Bounded: a small .xz can decompress to more than the machine has.
            let limit = super::super::memory_limit() / 2;
            xz2::read::XzDecoder::new(raw.as_slice())
                .take(limit.saturating_add(1))
                .read_to_end(&mut text)
                .map_err(|e| KernelError::Input {
                    path: path.to_path_buf(),
                    line: 0,
                    why: format!("corrupt or truncated xz data: {e}"),
                })?;
            if text.len() as u64 > limit {
                return Err(KernelError::Input {
                    path: path.to_path_buf(),
                    line: 0,
                    why: format!(
                        "decompresses to more than {:.1} GiB (half the memory available at start)",
                        limit as f64 / (1u64 << 30) as f64
                    ),
                });
            }
            Self::parse(&text, path)
        } else {
            Self::parse(&raw, path)
        }
    }

    /// Parses Rodinia's text format (module docs); `path` names the source in errors.
    pub fn parse(text: &[u8], path: &Path) -> Result<Self, KernelError> {
        let err = |line: usize, why: String| KernelError::Input {
            path: path.to_path_buf(),
            line,
            why,
        };
        let is_sep = |b: u8| matches!(b, b' ' | b',' | b'\t' | b'\r');
        let mut values: Vec<f32> = Vec::new();
        let mut features: Option<(usize, usize)> = None;
        let mut points = 0usize;
        for (no, line) in text.split(|&b| b == b'\n').enumerate() {
            let no = no + 1;
            let mut p = line
                .iter()
                .position(|&b| !matches!(b, b' ' | b'\t' | b'\r'))
                .unwrap_or(line.len());
            if p == line.len() {
                continue;
            }
            // The id: Rodinia ends it at space or tab only.
            while p < line.len() && !matches!(line[p], b' ' | b'\t' | b'\r') {
                p += 1;
            }
            let start = values.len();
            loop {
                while p < line.len() && is_sep(line[p]) {
                    p += 1;
                }
                if p == line.len() {
                    break;
                }
                let e = line[p..]
                    .iter()
                    .position(|&b| is_sep(b))
                    .map_or(line.len(), |k| p + k);
                let v = atof(&line[p..e]);
                if !v.is_finite() {
                    return Err(err(
                        no,
                        format!(
                            "`{}` is not a finite number",
                            String::from_utf8_lossy(&line[p..e])
                        ),
                    ));
                }
                values.push(v);
                p = e;
            }
            let nf = values.len() - start;
            match features {
                None if nf == 0 => return Err(err(no, "no features after the object id".into())),
                None => features = Some((nf, no)),
                Some((f, first)) if f != nf => {
                    return Err(err(no, format!("{nf} features, but line {first} has {f}")));
                }
                Some(_) => {}
            }
            points += 1;
        }
        let Some((features, _)) = features else {
            return Err(err(0, "no objects (empty file)".into()));
        };
        Ok(Self {
            points,
            features,
            values,
            source: Some(path.to_path_buf()),
            id: next_id(),
        })
    }

    /// Points from memory: `values` holds `points × features` values, row-major.
    pub fn from_values(
        points: usize,
        features: usize,
        values: Vec<f32>,
    ) -> Result<Self, KernelError> {
        check_bytes("kmeans data", &[points, features], 4)?;
        if values.len() != points * features {
            return Err(KernelError::invalid(
                "kmeans data",
                format!("{} values for {points} × {features}", values.len()),
            ));
        }
        Ok(Self {
            points,
            features,
            values,
            source: None,
            id: next_id(),
        })
    }

    /// The shape of Rodinia's `kdd_cup`: points.
    pub const KDD_POINTS: usize = 494_020;
    /// The shape of Rodinia's `kdd_cup`: features per point.
    pub const KDD_FEATURES: usize = 34;
    /// The default seed of [`KmeansData::generated`].
    pub const GENERATED_SEED: u64 = 0x6b6d_6561_6e73;
    /// Blobs in [`KmeansData::generated`].
    pub const GENERATED_BLOBS: u64 = 8;

    /// A generated input where Rodinia's files are absent, in the spirit of
    /// Rodinia's own synthetic inputs (its `datagen` draws clustered
    /// points): [`KmeansData::GENERATED_BLOBS`] Gaussian blobs in
    /// `features` dimensions with value ranges like `kdd_cup`'s columns.
    ///
    /// Feature `j` has a range `[0, hi_j]` following kdd_cup's column kinds
    /// (for 34 features: `j = 0` a duration, up to 1000; `1, 2` byte counts,
    /// up to 5000; `3..=15` small counts, up to 4; `16, 17` connection
    /// counts, up to 511; `18..=24` and `27..=33` rates, up to 1; `25, 26`
    /// host counts, up to 255; beyond 34 the pattern repeats). Blob `b`'s
    /// centre is `hi_j · unit(stream(seed, 21, b·features + j))` and its
    /// spread `hi_j / 20`. Point `i` belongs to blob
    /// `stream(seed, 20, i) mod blobs`; its value `j` is the centre plus the
    /// spread times a standard normal (Box–Muller in f64 from draws
    /// `stream(seed, 22, 2e)` and `stream(seed, 22, 2e + 1)` with
    /// `e = i·features + j`), clamped to the range and rounded to f32. Every value depends on
    /// its index alone, so the input is generated on every core.
    pub fn generated(points: usize, features: usize, seed: u64) -> Result<Self, KernelError> {
        use super::super::rng::{par_by_index, stream};
        check_bytes("kmeans data", &[points, features], 4)?;
        let n = points * features;
        let hi = |j: usize| -> f64 {
            match j % 34 {
                0 => 1000.0,
                1 | 2 => 5000.0,
                3..=15 => 4.0,
                16 | 17 => 511.0,
                25 | 26 => 255.0,
                _ => 1.0,
            }
        };
        let unit = |z: u64| (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        let values = par_by_index("kmeans data", n, |e| {
            let (i, j) = (e / features as u64, (e % features as u64) as usize);
            let b = stream(seed, 20, i) % Self::GENERATED_BLOBS;
            let h = hi(j);
            let centre = h * unit(stream(seed, 21, b * features as u64 + j as u64));
            // 1 − unit ∈ (0, 1]: the logarithm is finite.
            let u1 = 1.0 - unit(stream(seed, 22, 2 * e));
            let u2 = unit(stream(seed, 22, 2 * e + 1));
            let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (centre + h / 20.0 * normal).clamp(0.0, h) as f32
        })?;
        Ok(Self {
            points,
            features,
            values,
            source: None,
            id: next_id(),
        })
    }

    /// `kdd_cup`'s shape, generated ([`KmeansData::generated`] with
    /// [`KmeansData::GENERATED_SEED`]): what kmeans runs on where Rodinia's
    /// file is absent.
    pub fn generated_kdd_shape() -> Result<Self, KernelError> {
        Self::generated(Self::KDD_POINTS, Self::KDD_FEATURES, Self::GENERATED_SEED)
    }

    /// Number of points.
    pub fn points(&self) -> usize {
        self.points
    }

    /// Features per point.
    pub fn features(&self) -> usize {
        self.features
    }

    /// This data set's process-unique id (its values never change).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// All values, row-major.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Point `i`'s features.
    pub fn point(&self, i: usize) -> &[f32] {
        &self.values[i * self.features..(i + 1) * self.features]
    }

    /// The file the points came from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }
}

/// C `atof` on one token, as f32 (`(float)strtod(s, NULL)`): leading
/// whitespace, a sign, then the longest prefix that is a decimal float
/// (`digits[.digits][e[±]digits]`), a hex float (`0x…[p[±]digits]`), `inf`,
/// `infinity` or `nan`; 0.0 when there is none. Decimal values are rounded
/// correctly to f64 and then to f32, as glibc does.
pub(crate) fn atof(s: &[u8]) -> f32 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let start = i;
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = |v: f64| if neg { -v } else { v };
    let rest = &s[i..];
    let starts = |w: &[u8]| rest.len() >= w.len() && rest[..w.len()].eq_ignore_ascii_case(w);
    if starts(b"inf") {
        return sign(f64::INFINITY) as f32;
    }
    if starts(b"nan") {
        return sign(f64::NAN) as f32;
    }
    if rest.len() >= 2
        && rest[0] == b'0'
        && (rest[1] | 0x20) == b'x'
        && let Some(v) = hex_float(&rest[2..])
    {
        return sign(v) as f32;
    }
    // Decimal: mantissa digits into `m` while they fit, exponent in `e10`.
    let (mut m, mut e10, mut digits, mut exact) = (0u64, 0i64, 0usize, true);
    let digit = |b: Option<&u8>| b.filter(|b| b.is_ascii_digit()).map(|b| (b - b'0') as u64);
    while let Some(d) = digit(s.get(i)) {
        if m < 100_000_000_000_000_000 {
            m = m * 10 + d;
        } else {
            e10 += 1;
            exact &= d == 0;
        }
        digits += 1;
        i += 1;
    }
    if s.get(i) == Some(&b'.') {
        let mut j = i + 1;
        while let Some(d) = digit(s.get(j)) {
            if m < 100_000_000_000_000_000 {
                m = m * 10 + d;
                e10 -= 1;
            } else {
                exact &= d == 0;
            }
            digits += 1;
            j += 1;
        }
        if digits > 0 {
            i = j;
        }
    }
    if digits == 0 {
        return 0.0;
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        let eneg = match s.get(j) {
            Some(b'-') => {
                j += 1;
                true
            }
            Some(b'+') => {
                j += 1;
                false
            }
            _ => false,
        };
        if digit(s.get(j)).is_some() {
            let mut x = 0i64;
            while let Some(d) = digit(s.get(j)) {
                x = (x * 10 + d as i64).min(1 << 40);
                j += 1;
            }
            e10 += if eneg { -x } else { x };
            i = j;
        }
    }
    if m == 0 {
        return sign(0.0) as f32;
    }
    // Clinger's fast path: an exact mantissa times an exact power of ten,
    // one correctly rounded operation.
    const POW10: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    if exact && m < (1 << 53) && e10.unsigned_abs() <= 22 {
        let v = m as f64;
        let v = if e10 >= 0 {
            v * POW10[e10 as usize]
        } else {
            v / POW10[(-e10) as usize]
        };
        return sign(v) as f32;
    }
    // Rare: let the standard library round the exact prefix.
    std::str::from_utf8(&s[start..i])
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .map_or(0.0, |v| v as f32)
}

/// The value of hex-float digits after `0x` (`h[.h][p[±]d]`), or `None` when
/// no hex digit follows (then `atof` reads just the `0`). Mantissas past 60
/// bits are truncated.
fn hex_float(s: &[u8]) -> Option<f64> {
    let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16)).map(u64::from);
    let (mut m, mut e2, mut digits, mut i) = (0u64, 0i64, 0usize, 0usize);
    while let Some(d) = hex(s.get(i)) {
        if m >> 56 == 0 {
            m = m << 4 | d;
        } else {
            e2 += 4;
        }
        digits += 1;
        i += 1;
    }
    if s.get(i) == Some(&b'.') {
        i += 1;
        while let Some(d) = hex(s.get(i)) {
            if m >> 56 == 0 {
                m = m << 4 | d;
                e2 -= 4;
            }
            digits += 1;
            i += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    if matches!(s.get(i), Some(b'p' | b'P')) {
        let mut j = i + 1;
        let neg = s.get(j) == Some(&b'-');
        if matches!(s.get(j), Some(b'-' | b'+')) {
            j += 1;
        }
        if s.get(j).is_some_and(u8::is_ascii_digit) {
            let mut x = 0i64;
            while let Some(b) = s.get(j).filter(|b| b.is_ascii_digit()) {
                x = (x * 10 + (b - b'0') as i64).min(1 << 20);
                j += 1;
            }
            e2 += if neg { -x } else { x };
        }
    }
    Some(m as f64 * 2f64.powi(e2.clamp(-2000, 2000) as i32))
}
