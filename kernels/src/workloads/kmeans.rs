//! kmeans (Rodinia 3.1, openmp `kmeans_clustering.c`): assign every point to
//! its nearest centre, recompute the centres, repeat.
//!
//! # Semantics (Rodinia's)
//!
//! * initial centres = the first `K` points; initial membership −1;
//! * a point goes to the centre at the least squared Euclidean distance,
//!   `d = Σ_f (x_f − c_f)²` summed in feature order from `+0.0` in f32; the
//!   centres are scanned in order with a strict `<` starting from `FLT_MAX`, so
//!   the first minimum wins (and a point whose distances are all ≥ `FLT_MAX` or
//!   NaN goes to centre 0, where Rodinia reads an uninitialised index);
//! * `delta` = points whose membership changed; the new centre is the per-cluster
//!   sum over the per-cluster count (`sum / (float)count`); an empty cluster keeps
//!   its centre;
//! * the loop is Rodinia's `do { … } while (delta > threshold && loop++ < 500)`:
//!   at most 501 iterations.
//!
//! # Steps, items and the summation order
//!
//! One run ([`KmeansStep`]) is one iteration; item = one point. The reduction
//! is split into blocks of [`KmeansConfig::block`] points ([`Kernel::grain`]),
//! so chunks always cover whole blocks. For each block `b` a chunk writes
//!
//! * `sums[b][k][f]`: f32, from `+0.0`, adding `x[i][f]` for the block's points
//!   `i` with membership `k` in increasing `i`;
//! * `counts[b][k]`: u32 points per cluster; `changed[b]`: u32 changed points.
//!
//! The host step combines blocks in increasing `b`, in f32 from `+0.0`
//! (`total = ((0 + sums[0][k][f]) + sums[1][k][f]) + …`), and counts and
//! changes as integers. The result is
//! bit-identical however the points are split into chunks, and a GPU twin that
//! keeps this order matches it bit for bit.
//!
//! With one block it is exactly Rodinia's single-thread order (checked bit for
//! bit on the real inputs). Rodinia with `T` threads sums per thread, so its own
//! results change with the thread count; blocks of 1024 are also far more
//! accurate than one long f32 chain (on `kdd_cup`: 5·10⁻⁷ from the exact means
//! against Rodinia's 5·10⁻³).
//!
//! # Input files
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
use std::sync::Arc;

use serde::Serialize;

use super::{check_bytes, check_chunk, try_zeroed, Workload};
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

/// Points to cluster: `points × features` f32 values, row-major.
#[derive(Debug, Clone)]
pub struct KmeansData {
    points: usize,
    features: usize,
    values: Vec<f32>,
    source: Option<PathBuf>,
}

impl KmeansData {
    /// Reads a Rodinia kmeans input file, plain text or xz-compressed.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, KernelError> {
        let path = path.as_ref();
        let io = |source| KernelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let raw = std::fs::read(path).map_err(io)?;
        if raw.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
            let mut text = Vec::new();
            text.try_reserve(raw.len().saturating_mul(8))
                .map_err(|e| KernelError::Input {
                    path: path.to_path_buf(),
                    line: 0,
                    why: format!("cannot allocate for decompression: {e}"),
                })?;
            // Bounded: a small .xz can decompress to more than the machine has.
            let limit = super::memory_limit() / 2;
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
        use super::rng::{par_by_index, stream};
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
    if rest.len() >= 2 && rest[0] == b'0' && (rest[1] | 0x20) == b'x' {
        if let Some(v) = hex_float(&rest[2..]) {
            return sign(v) as f32;
        }
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

/// kmeans parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KmeansConfig {
    /// Number of clusters `K`.
    pub clusters: usize,
    /// The loop goes on while more than this many points changed.
    pub threshold: f32,
    /// Rodinia's `500`: at most `max_loops + 1` iterations.
    pub max_loops: usize,
    /// Points per reduction block (the kernel's grain).
    pub block: usize,
}

impl Default for KmeansConfig {
    /// Rodinia's `-k 5 -t 0.001`, blocks of 1024 points.
    fn default() -> Self {
        Self {
            clusters: 5,
            threshold: 0.001,
            max_loops: 500,
            block: 1024,
        }
    }
}

impl KmeansConfig {
    /// `clusters` clusters and Rodinia's `threshold`, other fields default.
    pub fn new(clusters: usize, threshold: f32) -> Result<Self, KernelError> {
        Self {
            clusters,
            threshold,
            ..Self::default()
        }
        .validated()
    }

    /// The same configuration with blocks of `block` points.
    pub fn with_block(self, block: usize) -> Result<Self, KernelError> {
        Self { block, ..self }.validated()
    }

    /// Checks the fields: positive clusters and block, a threshold that is a number.
    pub fn validated(self) -> Result<Self, KernelError> {
        if self.clusters == 0 {
            return Err(KernelError::invalid(
                "kmeans clusters",
                "must be at least 1",
            ));
        }
        if self.block == 0 {
            return Err(KernelError::invalid("kmeans block", "must be at least 1"));
        }
        if self.threshold.is_nan() || self.threshold < 0.0 {
            return Err(KernelError::invalid(
                "kmeans threshold",
                format!("{} is not a fraction of points at least 0", self.threshold),
            ));
        }
        Ok(self)
    }
}

/// One kmeans iteration over all points.
#[derive(Debug)]
// `centres` and the accessors are what a GPU twin reads.
#[allow(dead_code)]
pub struct KmeansStep {
    data: Arc<KmeansData>,
    clusters: usize,
    block: usize,
    centres: Vec<f32>,
    /// Centres as groups of [`LANES`] clusters, `[group][feature][lane]`.
    centres_t: Vec<f32>,
    membership: DisjointBuf<i32>,
    sums: DisjointBuf<f32>,
    counts: DisjointBuf<u32>,
    changed: DisjointBuf<u32>,
}

/// Clusters whose distances one pass over a point's features computes.
const LANES: usize = 8;

// Read by the GPU twin (`cuda/`), not by the CPU kernel.
#[allow(dead_code)]
impl KmeansStep {
    /// The points.
    pub(crate) fn data(&self) -> &Arc<KmeansData> {
        &self.data
    }

    /// `K`.
    pub(crate) fn clusters(&self) -> usize {
        self.clusters
    }

    /// Points per reduction block.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// This iteration's centres, `K × F` row-major.
    pub(crate) fn centres(&self) -> &[f32] {
        &self.centres
    }

    /// Membership per point (read, then overwritten).
    pub(crate) fn membership(&self) -> &DisjointBuf<i32> {
        &self.membership
    }

    /// Per-block partial sums, item stride `K × F`.
    pub(crate) fn sums(&self) -> &DisjointBuf<f32> {
        &self.sums
    }

    /// Per-block counts, item stride `K`.
    pub(crate) fn counts(&self) -> &DisjointBuf<u32> {
        &self.counts
    }

    /// Per-block changed points, item stride 1.
    pub(crate) fn changed(&self) -> &DisjointBuf<u32> {
        &self.changed
    }

    /// The nearest centre of `x` (module docs).
    #[inline]
    fn nearest(&self, x: &[f32]) -> usize {
        let f = x.len();
        let (mut best, mut idx) = (f32::MAX, 0usize);
        for (g, ct) in self.centres_t.chunks_exact(f * LANES).enumerate() {
            let mut acc = [0.0f32; LANES];
            for (&xf, c) in x.iter().zip(ct.chunks_exact(LANES)) {
                for (a, &c) in acc.iter_mut().zip(c) {
                    let d = xf - c;
                    *a += d * d;
                }
            }
            let live = LANES.min(self.clusters - g * LANES);
            for (l, &d) in acc[..live].iter().enumerate() {
                if d < best {
                    best = d;
                    idx = g * LANES + l;
                }
            }
        }
        idx
    }
}

impl Kernel for KmeansStep {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "kmeans"
    }

    fn items(&self) -> usize {
        self.data.points
    }

    fn grain(&self) -> usize {
        self.block
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), self.block)?;
        if chunk.is_empty() {
            return Ok(());
        }
        let (k, f, g) = (self.clusters, self.data.features, self.block);
        // This chunk's points, and the blocks they fill (chunks are
        // block-aligned, so no other chunk shares a block).
        let (member, sums, counts, changed) = (
            self.membership.chunk_mut(chunk),
            self.sums.chunk_mut_blocks(chunk, g),
            self.counts.chunk_mut_blocks(chunk, g),
            self.changed.chunk_mut_blocks(chunk, g),
        );
        let pts = &self.data.values[chunk.lo() * f..chunk.hi() * f];
        let per_block = member.chunks_mut(g).zip(pts.chunks(g * f));
        let partials = sums
            .chunks_exact_mut(k * f)
            .zip(counts.chunks_exact_mut(k))
            .zip(changed.iter_mut());
        for ((member, pts), ((sums, counts), changed)) in per_block.zip(partials) {
            sums.fill(0.0);
            counts.fill(0);
            let mut moved = 0u32;
            for (m, x) in member.iter_mut().zip(pts.chunks_exact(f)) {
                let c = self.nearest(x);
                moved += u32::from(*m != c as i32);
                *m = c as i32;
                counts[c] += 1;
                for (s, &v) in sums[c * f..(c + 1) * f].iter_mut().zip(x) {
                    *s += v;
                }
            }
            *changed = moved;
        }
        Ok(())
    }
}

/// The outcome of a kmeans job.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct KmeansResult {
    /// `K`.
    pub clusters: usize,
    /// Features per point.
    pub features: usize,
    /// Final centres, `K × F` row-major.
    pub centres: Vec<f32>,
    /// Iterations run (1 ..= `max_loops + 1`).
    pub iterations: usize,
    /// Points that changed cluster in the last iteration.
    pub last_delta: u64,
    /// Cluster of each point (−1 only if no iteration ran).
    #[serde(skip)]
    pub membership: Vec<i32>,
}

impl KmeansResult {
    /// Centre `k`'s features.
    pub fn centre(&self, k: usize) -> &[f32] {
        &self.centres[k * self.features..(k + 1) * self.features]
    }
}

/// A step's buffers between runs: membership, block sums, counts, changes.
type Buffers = (
    DisjointBuf<i32>,
    DisjointBuf<f32>,
    DisjointBuf<u32>,
    DisjointBuf<u32>,
);

/// kmeans as a [`Workload`]: one run per iteration; the host step combines
/// the blocks' partial sums (module docs) into the next centres.
#[derive(Debug)]
pub struct KmeansJob {
    data: Arc<KmeansData>,
    config: KmeansConfig,
    centres: Vec<f32>,
    iterations: usize,
    loops: usize,
    last_delta: u64,
    done: bool,
    bufs: Option<Buffers>,
}

impl KmeansJob {
    /// A job clustering `data` with `config`. Refuses `K` larger than the number
    /// of points (an input error naming the file when the data came from one).
    pub fn new(
        data: impl Into<Arc<KmeansData>>,
        config: KmeansConfig,
    ) -> Result<Self, KernelError> {
        let data: Arc<KmeansData> = data.into();
        let config = config.validated()?;
        let (n, f, k) = (data.points, data.features, config.clusters);
        if k > n {
            let why = format!("{k} clusters but only {n} points");
            return Err(match &data.source {
                Some(p) => KernelError::Input {
                    path: p.clone(),
                    line: 0,
                    why,
                },
                None => KernelError::invalid("kmeans clusters", why),
            });
        }
        let blocks = n.div_ceil(config.block);
        check_bytes("kmeans partial sums", &[blocks, k, f], 4)?;
        let centres = data.values[..k * f].to_vec();
        let mut member = try_zeroed::<i32>("kmeans membership", n)?;
        member.fill(-1);
        let bufs = (
            DisjointBuf::from_vec(member, 1),
            DisjointBuf::from_vec(try_zeroed("kmeans sums", blocks * k * f)?, k * f),
            DisjointBuf::from_vec(try_zeroed("kmeans counts", blocks * k)?, k),
            DisjointBuf::from_vec(try_zeroed("kmeans changes", blocks)?, 1),
        );
        Ok(Self {
            data,
            config,
            centres,
            iterations: 0,
            loops: 0,
            last_delta: 0,
            done: false,
            bufs: Some(bufs),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KmeansConfig {
        &self.config
    }
}

impl Workload for KmeansJob {
    type Step = KmeansStep;
    type Output = KmeansResult;

    fn next_step(&mut self) -> Result<Option<KmeansStep>, KernelError> {
        if self.done {
            return Ok(None);
        }
        let Some((membership, sums, counts, changed)) = self.bufs.take() else {
            return Err(KernelError::invalid(
                "kmeans step",
                "the previous step was not absorbed",
            ));
        };
        let (k, f) = (self.config.clusters, self.data.features);
        let groups = k.div_ceil(LANES);
        let mut centres_t = vec![0.0f32; groups * f * LANES];
        for c in 0..k {
            for j in 0..f {
                centres_t[(c / LANES * f + j) * LANES + c % LANES] = self.centres[c * f + j];
            }
        }
        Ok(Some(KmeansStep {
            data: self.data.clone(),
            clusters: k,
            block: self.config.block,
            centres: self.centres.clone(),
            centres_t,
            membership,
            sums,
            counts,
            changed,
        }))
    }

    fn absorb(&mut self, mut step: KmeansStep) -> Result<(), KernelError> {
        if self.bufs.is_some() || self.done || !Arc::ptr_eq(&step.data, &self.data) {
            return Err(KernelError::invalid(
                "kmeans step",
                "not this job's current step",
            ));
        }
        let (k, f) = (self.config.clusters, self.data.features);
        let sums = step.sums.as_slice();
        let counts = step.counts.as_slice();
        for c in 0..k {
            let count: u64 = counts.chunks_exact(k).map(|b| u64::from(b[c])).sum();
            if count == 0 {
                continue;
            }
            for j in 0..f {
                let mut total = 0.0f32;
                for b in sums.chunks_exact(k * f) {
                    total += b[c * f + j];
                }
                self.centres[c * f + j] = total / count as f32;
            }
        }
        let delta: u64 = step.changed.as_slice().iter().map(|&d| u64::from(d)).sum();
        self.iterations += 1;
        self.last_delta = delta;
        // Rodinia: while (delta > threshold && loop++ < 500)
        if (delta as f32) > self.config.threshold && self.loops < self.config.max_loops {
            self.loops += 1;
        } else {
            self.done = true;
        }
        self.bufs = Some((step.membership, step.sums, step.counts, step.changed));
        Ok(())
    }

    fn finish(self) -> KmeansResult {
        let membership = self.bufs.map(|b| b.0.into_vec()).unwrap_or_default();
        KmeansResult {
            clusters: self.config.clusters,
            features: self.data.features,
            centres: self.centres,
            iterations: self.iterations,
            last_delta: self.last_delta,
            membership,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::rng::{stream, sym_unit_f32};
    use super::super::run_sequential;
    use super::super::testutil::{run_workload_split, splits};
    use super::*;
    use proptest::prelude::*;

    /// Where the Rodinia inputs are: `COEXEC_KMEANS_DATA`, else
    /// `shared/data/rodinia-kmeans` beside the repository.
    fn data_dir() -> PathBuf {
        std::env::var_os("COEXEC_KMEANS_DATA")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../shared/data/rodinia-kmeans"
                ))
            })
    }

    #[test]
    fn generated_input_is_deterministic_clustered_and_in_range() {
        let a = KmeansData::generated(5000, 34, 7).unwrap();
        let b = KmeansData::generated(5000, 34, 7).unwrap();
        assert_eq!((a.points(), a.features()), (5000, 34));
        assert!(a
            .values()
            .iter()
            .zip(b.values())
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        let c = KmeansData::generated(5000, 34, 8).unwrap();
        assert_ne!(a.values(), c.values());
        for i in 0..a.points() {
            for (j, &v) in a.point(i).iter().enumerate() {
                let hi = match j {
                    0 => 1000.0,
                    1 | 2 => 5000.0,
                    3..=15 => 4.0,
                    16 | 17 => 511.0,
                    25 | 26 => 255.0,
                    _ => 1.0,
                };
                assert!((0.0..=hi).contains(&v) && v.is_finite(), "{i},{j}: {v}");
            }
        }
        // Points of one blob lie near each other: kmeans converges.
        let got = run_sequential(KmeansJob::new(a, KmeansConfig::default()).unwrap()).unwrap();
        assert!(got.iterations < 100, "{} iterations", got.iterations);
        let kdd = KmeansData::generated_kdd_shape().unwrap();
        assert_eq!((kdd.points(), kdd.features()), (494_020, 34));
    }

    /// Rodinia's `kmeans_clustering`, single thread, written out plainly.
    #[allow(clippy::needless_range_loop)]
    fn reference(data: &KmeansData, k: usize, threshold: f32) -> (Vec<f32>, usize, Vec<i32>) {
        let (n, f) = (data.points(), data.features());
        let mut clusters: Vec<f32> = data.values()[..k * f].to_vec();
        let mut membership = vec![-1i32; n];
        let mut loops = 0;
        let mut iterations = 0;
        loop {
            let mut delta = 0.0f32;
            let mut new_len = vec![0i32; k];
            let mut new_c = vec![0.0f32; k * f];
            for i in 0..n {
                let pt = data.point(i);
                let mut min = f32::MAX;
                let mut index = 0;
                for c in 0..k {
                    let mut ans = 0.0f32;
                    for j in 0..f {
                        ans += (pt[j] - clusters[c * f + j]) * (pt[j] - clusters[c * f + j]);
                    }
                    if ans < min {
                        min = ans;
                        index = c;
                    }
                }
                if membership[i] != index as i32 {
                    delta += 1.0;
                }
                membership[i] = index as i32;
                new_len[index] += 1;
                for j in 0..f {
                    new_c[index * f + j] += pt[j];
                }
            }
            for c in 0..k {
                for j in 0..f {
                    if new_len[c] > 0 {
                        clusters[c * f + j] = new_c[c * f + j] / new_len[c] as f32;
                    }
                }
            }
            iterations += 1;
            let go = delta > threshold && {
                let l = loops;
                loops += 1;
                l < 500
            };
            if !go {
                break;
            }
        }
        (clusters, iterations, membership)
    }

    /// `n` points around `k` well separated centres, from `seed`.
    fn blobs(n: usize, f: usize, k: usize, seed: u64) -> KmeansData {
        let mut v = Vec::with_capacity(n * f);
        for i in 0..n {
            let c = (stream(seed, 9, i as u64) % k as u64) as f32;
            for j in 0..f {
                v.push(c * 10.0 + sym_unit_f32(stream(seed, 10, (i * f + j) as u64)) * 3.0);
            }
        }
        KmeansData::from_values(n, f, v).unwrap()
    }

    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("coexec-kmeans-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn atof_reads_like_c() {
        let cases: &[(&str, f32)] = &[
            ("1.5", 1.5),
            ("-2", -2.0),
            ("+3", 3.0),
            ("1e3", 1000.0),
            ("1e", 1.0),
            ("1e+", 1.0),
            ("2.5E-1x", 0.25),
            (".5", 0.5),
            ("5.", 5.0),
            ("1.2.3", 1.2),
            ("0.00", 0.0),
            ("00", 0.0),
            ("tcp", 0.0),
            ("", 0.0),
            ("-", 0.0),
            (".", 0.0),
            ("0x10", 16.0),
            ("0x1.8p1", 3.0),
            ("0x", 0.0),
            ("0xg", 0.0),
            ("1e400", f32::INFINITY),
            ("-1e400", f32::NEG_INFINITY),
            ("1e-50", 0.0),
            ("inf", f32::INFINITY),
            ("-Infinity", f32::NEG_INFINITY),
            ("  7", 7.0),
            ("0.1", 0.1),
            ("3.4028235e38", f32::MAX),
            ("123456789012345678901234567890", 1.2345679e29),
            ("0.000000000000000000000000000001234", 1.234e-30),
            ("18347", 18347.0),
        ];
        for &(s, want) in cases {
            assert_eq!(atof(s.as_bytes()).to_bits(), want.to_bits(), "atof({s:?})");
        }
        assert!(atof(b"nan").is_nan() && atof(b"-NaN(1)").is_nan());
        assert_eq!(atof(b"-0").to_bits(), (-0.0f32).to_bits());
        // Double rounding through f64, as (float)strtod does.
        for s in [
            "0.1",
            "1.0000000596046448",
            "3.14159265358979",
            "2.2250738585072014e-308",
        ] {
            assert_eq!(atof(s.as_bytes()), s.parse::<f64>().unwrap() as f32, "{s}");
        }
    }

    #[test]
    fn parses_rodinia_text_and_tcp_tokens() {
        // Rodinia ends the id at a space or tab only: `2,3,4,5` is one id
        // with no features, so its line is ragged.
        let text = b"1 0 1.5 2\n\n2,3,4,5\n";
        let e = KmeansData::parse(text, Path::new("t"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t:3:"), "{e}");
        let text = b"1 0 1.5 2\n7 3,4,5\n3\t0 tcp 7\r\n";
        let d = KmeansData::parse(text, Path::new("t")).unwrap();
        assert_eq!(d.values(), &[0.0, 1.5, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 7.0]);
    }

    #[test]
    fn bad_inputs_name_file_and_line() {
        let p = temp_file("ragged.txt", b"1 1 2 3\n2 4 5 6\n3 7 8\n");
        let e = KmeansData::read(&p).unwrap_err().to_string();
        assert!(
            e.contains("ragged.txt:3:") && e.contains("2 features"),
            "{e}"
        );
        let p = temp_file("empty.txt", b"\n  \n");
        let e = KmeansData::read(&p).unwrap_err().to_string();
        assert!(e.contains("empty.txt:0:") && e.contains("empty"), "{e}");
        let p = temp_file("noid.txt", b"17\n");
        assert!(KmeansData::read(&p)
            .unwrap_err()
            .to_string()
            .contains("noid.txt:1:"));
        let e = KmeansData::read(std::env::temp_dir().join("coexec-absent-dir/nope")).unwrap_err();
        assert!(matches!(e, KernelError::Io { .. }));
        // A truncated xz file.
        let mut xz = Vec::new();
        {
            use std::io::Write;
            let mut enc = xz2::write::XzEncoder::new(&mut xz, 6);
            for i in 0..2000 {
                writeln!(enc, "{i} {} {}", i % 7, i % 3).unwrap();
            }
            enc.finish().unwrap();
        }
        let whole = temp_file("ok.xz", &xz);
        assert_eq!(KmeansData::read(&whole).unwrap().points(), 2000);
        let cut = temp_file("cut.xz", &xz[..xz.len() / 2]);
        let e = KmeansData::read(&cut).unwrap_err().to_string();
        assert!(e.contains("cut.xz:0:") && e.contains("xz"), "{e}");
        // A text file cut mid-line.
        let cutline = temp_file("cutline.txt", b"1 1 2 3\n2 4 5 6\n3 7");
        assert!(KmeansData::read(&cutline)
            .unwrap_err()
            .to_string()
            .contains("cutline.txt:3:"));
        // More clusters than points.
        let small = KmeansData::read(temp_file("two.txt", b"1 1 2\n2 3 4\n")).unwrap();
        let e = KmeansJob::new(small, KmeansConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("two.txt:0:") && e.contains("5 clusters"), "{e}");
    }

    #[test]
    fn refuses_bad_configs() {
        assert!(KmeansConfig::new(0, 0.001).is_err());
        assert!(KmeansConfig::new(5, f32::NAN).is_err());
        assert!(KmeansConfig::default().with_block(0).is_err());
        assert!(KmeansData::from_values(0, 3, vec![]).is_err());
        assert!(KmeansData::from_values(2, 3, vec![0.0; 5]).is_err());
    }

    #[test]
    fn one_block_is_rodinia_bit_for_bit() {
        for (k, seed) in [(1, 1), (3, 2), (5, 3), (11, 4)] {
            let d = blobs(700, 6, 4, seed);
            let (want, iters, member) = reference(&d, k, 0.001);
            let cfg = KmeansConfig::new(k, 0.001)
                .unwrap()
                .with_block(1024)
                .unwrap();
            let got = run_sequential(KmeansJob::new(d, cfg).unwrap()).unwrap();
            assert_eq!(got.iterations, iters);
            assert_eq!(got.membership, member);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.centres), bits(&want), "k={k}");
        }
    }

    #[test]
    fn many_blocks_close_to_rodinia() {
        // Block sums reassociate the per-cluster f32 sums: relative error of
        // 3000-term sums of values ≤ 33 in magnitude stays below 1e-5.
        let d = blobs(3000, 5, 3, 7);
        let (want, iters, member) = reference(&d, 3, 0.001);
        let cfg = KmeansConfig::new(3, 0.001).unwrap().with_block(64).unwrap();
        let got = run_sequential(KmeansJob::new(d, cfg).unwrap()).unwrap();
        assert_eq!(got.iterations, iters);
        assert_eq!(got.membership, member);
        for (a, b) in got.centres.iter().zip(&want) {
            assert!((a - b).abs() / b.abs().max(1.0) < 1e-5, "{a} vs {b}");
        }
    }

    /// Rodinia 3.1 openmp kmeans (`-k 5 -t 0.001`, one thread) on the `100`
    /// file: 8 iterations and these centres, printed with `%.9g`.
    const RODINIA_100: &str = include_str!("../../tests/fixtures/rodinia_kmeans_100.txt");

    /// Rodinia's iteration count and centres from a fixture (`iterations N`
    /// then one `k: values…` line per centre).
    pub(super) fn fixture(text: &str) -> (usize, Vec<f32>) {
        let mut iters = 0;
        let mut centres = Vec::new();
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("iterations ") {
                iters = n.trim().parse().unwrap();
            } else if let Some((_, vals)) = line.split_once(": ") {
                centres.extend(vals.split_whitespace().map(|v| v.parse::<f32>().unwrap()));
            }
        }
        (iters, centres)
    }

    #[test]
    #[ignore = "needs ../shared/data/rodinia-kmeans (or COEXEC_KMEANS_DATA): run with -- --ignored"]
    fn rodinia_100_file() {
        let path = data_dir().join("100");
        let d = KmeansData::read(&path).unwrap();
        assert_eq!((d.points(), d.features()), (100, 34));
        let (want, iters, member) = reference(&d, 5, 0.001);
        let got = run_sequential(KmeansJob::new(d, KmeansConfig::default()).unwrap()).unwrap();
        assert_eq!((got.iterations, &got.membership), (iters, &member));
        assert_eq!(got.centres, want);
        let (r_iters, r_centres) = fixture(RODINIA_100);
        assert_eq!(got.iterations, r_iters);
        assert_eq!(got.centres, r_centres);
    }

    /// The real inputs against Rodinia's own single-thread results (release:
    /// `cargo test --release -p coexec-kernels -- --ignored`).
    #[test]
    #[ignore = "heavy: run with --release -- --ignored"]
    fn rodinia_real_files() {
        for (file, fixture_text) in [
            (
                "204800.txt.xz",
                include_str!("../../tests/fixtures/rodinia_kmeans_204800.txt"),
            ),
            (
                "819200.txt.xz",
                include_str!("../../tests/fixtures/rodinia_kmeans_819200.txt"),
            ),
            (
                "kdd_cup.xz",
                include_str!("../../tests/fixtures/rodinia_kmeans_kdd_cup.txt"),
            ),
        ] {
            let t = std::time::Instant::now();
            let d = Arc::new(KmeansData::read(data_dir().join(file)).unwrap());
            let load = t.elapsed();
            let (iters, want) = fixture(fixture_text);
            let worst = |got: &[f32]| {
                got.iter()
                    .zip(&want)
                    .map(|(a, b)| ((a - b).abs() / b.abs().max(1.0)) as f64)
                    .fold(0.0, f64::max)
            };
            // One block is Rodinia's single-thread summation order: bit for bit.
            let one = KmeansConfig::default().with_block(d.points()).unwrap();
            let got = run_sequential(KmeansJob::new(d.clone(), one).unwrap()).unwrap();
            assert_eq!(got.iterations, iters, "{file}, one block");
            assert_eq!(got.centres, want, "{file}, one block");
            // Blocks of 1024 reassociate the sums.
            let t = std::time::Instant::now();
            let dd = d.clone();
            let got = run_sequential(KmeansJob::new(d, KmeansConfig::default()).unwrap()).unwrap();
            let run = t.elapsed();
            // Which is nearer the exact means of the final clusters (f64)?
            let (k, f) = (got.clusters, got.features);
            let mut exact = vec![0.0f64; k * f];
            let mut n = vec![0usize; k];
            for (i, &m) in got.membership.iter().enumerate() {
                n[m as usize] += 1;
                for j in 0..f {
                    exact[m as usize * f + j] += dd.point(i)[j] as f64;
                }
            }
            let off = |c: &[f32]| {
                (0..k * f)
                    .map(|e| {
                        (c[e] as f64 - exact[e] / n[e / f] as f64).abs()
                            / (exact[e] / n[e / f] as f64).abs().max(1.0)
                    })
                    .fold(0.0, f64::max)
            };
            eprintln!(
                "{file}: load {load:?}; blocks of 1024: {} iterations (Rodinia {iters}) in {run:?}, \
                 worst rel diff to Rodinia {:.3e}; vs f64 means: ours {:.3e}, Rodinia's {:.3e}",
                got.iterations,
                worst(&got.centres),
                off(&got.centres),
                off(&want),
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn any_split_is_bit_identical((cuts, seed) in splits(12), k in 1usize..10) {
            let d = Arc::new(blobs(2500, 3, 4, 99));
            let cfg = KmeansConfig::new(k, 0.001).unwrap().with_block(128).unwrap();
            let whole = run_sequential(KmeansJob::new(d.clone(), cfg).unwrap()).unwrap();
            let split = run_workload_split(KmeansJob::new(d, cfg).unwrap(), &cuts, seed).unwrap();
            prop_assert_eq!(whole.iterations, split.iterations);
            prop_assert_eq!(&whole.membership, &split.membership);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&whole.centres), bits(&split.centres));
        }
    }
}
