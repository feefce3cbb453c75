//! pathfinder (Rodinia 3.1): the cheapest path down a grid of costs.
//!
//! The grid has `rows` rows of `cols` cells; cell `(t, n)` is glibc
//! `rand() % 10` after `srand(9)`, filled row-major (Rodinia's `init`). The
//! result row starts as row 0, and for `t = 1..rows`:
//!
//! ```text
//! dst[n] = wall[t][n] + min(src[n−1], src[n], src[n+1])   (neighbours outside 0..cols dropped)
//! ```
//!
//! # Steps and items
//!
//! One run ([`PathfinderStep`]) advances `h` rows at once (`h` = the pyramid
//! height, the last run fewer) over all columns; item = one output column.
//! A chunk `[lo, hi)` reads the previous result over `[lo − h, hi + h)`
//! (clamped to the grid) and computes the shrinking trapezoid of Rodinia's
//! pyramid, so its own columns come out exact whatever the split: every level
//! loses one column of validity on each side that is not a grid edge. On the
//! CPU the chunk is further cut into bands of [`PathfinderStep::BAND`] columns,
//! each its own trapezoid, so a band's two scratch rows stay in cache for all
//! `h` levels. Integers make every order exact.

use std::io::Write;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::rng::par_generate_arc;
use super::{check_bytes, check_chunk, try_zeroed, Workload};
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

/// glibc's `rand()`: the `random_r` TYPE_3 additive feedback generator
/// (`r[i] = r[i−3] + r[i−31]` mod 2³², output `r >> 1`), seeded by
/// `srand(seed)` exactly as glibc does (Park–Miller fill of 31 words, 310
/// outputs discarded).
///
/// ```
/// use coexec_kernels::workloads::GlibcRand;
///
/// let mut r = GlibcRand::new(9);
/// assert_eq!(r.next_i32(), 444454915);
/// ```
#[derive(Debug, Clone)]
pub struct GlibcRand {
    state: [u32; 31],
    f: usize,
    r: usize,
}

impl GlibcRand {
    /// The generator after `srand(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; 31];
        let mut word = if seed == 0 { 1i32 } else { seed as i32 };
        state[0] = word as u32;
        for s in state.iter_mut().skip(1) {
            // Park–Miller "minimal standard" by Schrage's method, as glibc.
            let hi = word / 127_773;
            let lo = word % 127_773;
            word = 16_807 * lo - 2_836 * hi;
            if word < 0 {
                word += 2_147_483_647;
            }
            *s = word as u32;
        }
        let mut g = Self { state, f: 3, r: 0 };
        for _ in 0..310 {
            g.next_i32();
        }
        g
    }

    /// The next `rand()` value, in `0..2³¹`.
    #[inline]
    pub fn next_i32(&mut self) -> i32 {
        let v = self.state[self.f].wrapping_add(self.state[self.r]);
        self.state[self.f] = v;
        self.f = if self.f == 30 { 0 } else { self.f + 1 };
        self.r = if self.r == 30 { 0 } else { self.r + 1 };
        (v >> 1) as i32
    }

    /// The generator `n` draws further on, in `O(31² · log n)` without
    /// drawing them. The words obey `x[i+31] = x[i+28] + x[i]` mod 2³², a
    /// linear recurrence with characteristic polynomial `P = t³¹ − t²⁸ − 1`,
    /// so with the current window `y[0..31]` (the last 31 words, oldest
    /// first), `y[k] = Σⱼ cⱼ·y[j]` where `Σⱼ cⱼ tʲ = tᵏ mod P` (P is monic,
    /// so the division works over the integers mod 2³²).
    ///
    /// ```
    /// use coexec_kernels::workloads::GlibcRand;
    ///
    /// let mut a = GlibcRand::new(9);
    /// for _ in 0..1000 {
    ///     a.next_i32();
    /// }
    /// let mut b = GlibcRand::new(9).jumped(1000);
    /// assert_eq!(a.next_i32(), b.next_i32());
    /// ```
    pub fn jumped(&self, n: u64) -> Self {
        let y: [u32; 31] = std::array::from_fn(|j| self.state[(self.f + j) % 31]);
        // c = tⁿ mod P, by squaring.
        let mut c = [0u32; 31];
        c[0] = 1;
        let mut base = [0u32; 31];
        base[1] = 1;
        let mut e = n;
        while e > 0 {
            if e & 1 == 1 {
                c = poly_mulmod(&c, &base);
            }
            base = poly_mulmod(&base, &base);
            e >>= 1;
        }
        // The new window is y[n..n+31]: tⁿ⁺ᵐ for m = 0..31.
        let mut state = [0u32; 31];
        for s in &mut state {
            *s = c.iter().zip(&y).fold(0u32, |acc, (&cj, &yj)| {
                acc.wrapping_add(cj.wrapping_mul(yj))
            });
            c = poly_times_t(&c);
        }
        // Oldest word first at 0; the feedback tap is 3 words behind the
        // front, i.e. 28 ahead of it.
        Self { state, f: 0, r: 28 }
    }
}

/// `a·b mod (t³¹ − t²⁸ − 1)`, coefficients mod 2³².
fn poly_mulmod(a: &[u32; 31], b: &[u32; 31]) -> [u32; 31] {
    let mut p = [0u32; 61];
    for (i, &ai) in a.iter().enumerate() {
        if ai == 0 {
            continue;
        }
        for (j, &bj) in b.iter().enumerate() {
            p[i + j] = p[i + j].wrapping_add(ai.wrapping_mul(bj));
        }
    }
    // tⁱ = tⁱ⁻³¹·(t²⁸ + 1), highest first so every carried term is reduced too.
    for i in (31..61).rev() {
        let v = p[i];
        p[i - 3] = p[i - 3].wrapping_add(v);
        p[i - 31] = p[i - 31].wrapping_add(v);
    }
    std::array::from_fn(|i| p[i])
}

/// `c·t mod (t³¹ − t²⁸ − 1)`.
fn poly_times_t(c: &[u32; 31]) -> [u32; 31] {
    let top = c[30];
    let mut out = [0u32; 31];
    out[1..].copy_from_slice(&c[..30]);
    out[28] = out[28].wrapping_add(top);
    out[0] = out[0].wrapping_add(top);
    out
}

/// A pathfinder grid: `cols` columns, `rows` rows, costs from `srand(seed)`,
/// advanced `pyramid` rows per run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PathfinderProblem {
    cols: usize,
    rows: usize,
    pyramid: usize,
    seed: u32,
}

impl PathfinderProblem {
    /// Rows advanced per run unless set (Rodinia's GPU runs use 20; the CPU
    /// gains little beyond it and ghost work grows with its square).
    pub const DEFAULT_PYRAMID: usize = 20;
    /// Rodinia's `M_SEED`.
    pub const RODINIA_SEED: u32 = 9;

    /// A `cols × rows` grid with Rodinia's seed. Refuses zero sizes, grids
    /// over 64 GiB, and more rows than an `i32` path cost can hold.
    pub fn new(cols: usize, rows: usize) -> Result<Self, KernelError> {
        // The grid is `i32`s.
        check_bytes("pathfinder size", &[cols, rows], 4)?;
        if rows > (i32::MAX / 9) as usize {
            return Err(KernelError::invalid(
                "pathfinder rows",
                format!("{rows} rows could overflow an i32 path cost"),
            ));
        }
        Ok(Self {
            cols,
            rows,
            pyramid: Self::DEFAULT_PYRAMID,
            seed: Self::RODINIA_SEED,
        })
    }

    /// The same grid advanced `h` rows per run (`h ≥ 1`).
    pub fn with_pyramid(self, h: usize) -> Result<Self, KernelError> {
        if h == 0 {
            return Err(KernelError::invalid(
                "pathfinder pyramid",
                "must be at least 1",
            ));
        }
        Ok(Self { pyramid: h, ..self })
    }

    /// The same grid from `srand(seed)`.
    pub fn with_seed(self, seed: u32) -> Self {
        Self { seed, ..self }
    }

    /// Columns (items per run).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows per run.
    pub fn pyramid(&self) -> usize {
        self.pyramid
    }

    /// Number of runs: `⌈(rows − 1) / pyramid⌉`.
    pub fn steps(&self) -> usize {
        (self.rows - 1).div_ceil(self.pyramid)
    }
}

/// One run: rows `t0 .. t0 + h` added to the result row.
#[derive(Debug)]
pub struct PathfinderStep {
    wall: Arc<[u8]>,
    cols: usize,
    t0: usize,
    h: usize,
    src: Vec<i32>,
    dst: DisjointBuf<i32>,
}

impl PathfinderStep {
    /// Columns per CPU band (see the module docs).
    pub const BAND: usize = 8192;

    /// The grid, row-major, one byte per cell.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn wall(&self) -> &Arc<[u8]> {
        &self.wall
    }

    /// Grid width.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// First grid row this run adds.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn first_row(&self) -> usize {
        self.t0
    }

    /// Rows this run adds.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn height(&self) -> usize {
        self.h
    }

    /// The result row before this run (row `t0 − 1`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn src(&self) -> &[i32] {
        &self.src
    }

    /// The result row after this run.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn dst(&self) -> &DisjointBuf<i32> {
        &self.dst
    }

    /// Writes columns `lo..hi` of the result after `h` more rows into `out`.
    fn band(&self, lo: usize, hi: usize, out: &mut [i32], scratch: &mut (Vec<i32>, Vec<i32>)) {
        let cols = self.cols;
        let off = lo.saturating_sub(self.h);
        let end = (hi + self.h).min(cols);
        let (cur, nxt) = scratch;
        cur.clear();
        cur.extend_from_slice(&self.src[off..end]);
        nxt.clear();
        nxt.resize(end - off, 0);
        // Columns [ca, cb) of `cur` are exact.
        let (mut ca, mut cb) = (off, end);
        for t in self.t0..self.t0 + self.h {
            let na = if ca > 0 { ca + 1 } else { 0 };
            let nb = if cb < cols { cb - 1 } else { cols };
            let wall = &self.wall[t * cols..(t + 1) * cols];
            step_row(cur, nxt, wall, off, na, nb, cols);
            std::mem::swap(cur, nxt);
            (ca, cb) = (na, nb);
        }
        debug_assert!(ca <= lo && hi <= cb);
        out.copy_from_slice(&cur[lo - off..hi - off]);
    }
}

/// `nxt[n] = wall[n] + min(cur[n−1], cur[n], cur[n+1])` for global columns
/// `na..nb`; `cur`/`nxt` hold columns from `off`.
#[inline]
fn step_row(
    cur: &[i32],
    nxt: &mut [i32],
    wall: &[u8],
    off: usize,
    na: usize,
    nb: usize,
    cols: usize,
) {
    if na >= nb {
        return;
    }
    if na == 0 {
        let right = if cols > 1 { cur[1 - off] } else { i32::MAX };
        nxt[0] = wall[0] as i32 + cur[0].min(right);
    }
    let (s, e) = (na.max(1), nb.min(cols - 1));
    if s < e {
        let l = &cur[s - 1 - off..e - 1 - off];
        let c = &cur[s - off..e - off];
        let r = &cur[s + 1 - off..e + 1 - off];
        let w = &wall[s..e];
        for ((((o, &l), &c), &r), &w) in
            nxt[s - off..e - off].iter_mut().zip(l).zip(c).zip(r).zip(w)
        {
            *o = w as i32 + l.min(c).min(r);
        }
    }
    if nb == cols && cols > na.max(1) {
        let n = cols - 1;
        nxt[n - off] = wall[n] as i32 + cur[n - off].min(cur[n - 1 - off]);
    }
}

impl Kernel for PathfinderStep {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "pathfinder"
    }

    fn items(&self) -> usize {
        self.cols
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.cols, 1)?;
        let out = self.dst.chunk_mut(chunk);
        let mut scratch = (Vec::new(), Vec::new());
        let mut lo = chunk.lo();
        for o in out.chunks_mut(Self::BAND) {
            self.band(lo, lo + o.len(), o, &mut scratch);
            lo += o.len();
        }
        Ok(())
    }
}

/// The result row of a pathfinder job.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct PathfinderResult {
    /// The problem.
    pub problem: PathfinderProblem,
    /// Cheapest path cost ending at each column of the last row.
    #[serde(skip)]
    pub row: Vec<i32>,
}

impl PathfinderResult {
    /// Writes the row as Rodinia's `BENCH_PRINT` does: `"%d "` per value, then
    /// a newline.
    pub fn write_rodinia<W: Write>(&self, mut w: W) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(12 * 4096);
        for chunk in self.row.chunks(4096) {
            buf.clear();
            for v in chunk {
                // Writing into a Vec cannot fail.
                let _ = write!(buf, "{v} ");
            }
            w.write_all(&buf)?;
        }
        w.write_all(b"\n")
    }

    /// The row as Rodinia prints it.
    pub fn rodinia_text(&self) -> String {
        let mut v = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_rodinia(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    }

    /// SHA-256 (lowercase hex) of [`PathfinderResult::rodinia_text`].
    pub fn sha256_hex(&self) -> String {
        struct H(Sha256);
        impl Write for H {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.update(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut h = H(Sha256::new());
        // Hashing cannot fail.
        let _ = self.write_rodinia(&mut h);
        h.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// pathfinder as a [`Workload`]: generates the grid, then one run per
/// `pyramid` rows; the host step swaps the two result rows.
#[derive(Debug)]
pub struct PathfinderJob {
    problem: PathfinderProblem,
    wall: Arc<[u8]>,
    /// Grid row the current result row has reached.
    row_at: usize,
    src: Option<Vec<i32>>,
    spare: Option<Vec<i32>>,
}

impl PathfinderJob {
    /// Generates the grid of `problem` (glibc `rand() % 10`, row-major).
    pub fn new(problem: PathfinderProblem) -> Result<Self, KernelError> {
        let cells = problem.cols * problem.rows;
        // On every core: each block of cells starts from the generator
        // jumped ahead to its first cell (`GlibcRand::jumped`), so the grid
        // is the one-thread sequence bit for bit.
        let g0 = GlibcRand::new(problem.seed);
        let wall = par_generate_arc("pathfinder grid", cells, |first| {
            let mut g = g0.jumped(first);
            move || (g.next_i32() % 10) as u8
        })?;
        let src: Vec<i32> = wall[..problem.cols].iter().map(|&c| c as i32).collect();
        Ok(Self {
            problem,
            wall,
            row_at: 0,
            src: Some(src),
            spare: Some(try_zeroed("pathfinder row", problem.cols)?),
        })
    }

    /// The problem.
    pub fn problem(&self) -> &PathfinderProblem {
        &self.problem
    }

    /// A fresh job over the same grid, without generating it again (for
    /// repeated runs of one problem).
    pub fn restart(&self) -> Result<Self, KernelError> {
        let src: Vec<i32> = self.wall[..self.problem.cols]
            .iter()
            .map(|&c| c as i32)
            .collect();
        Ok(Self {
            problem: self.problem,
            wall: self.wall.clone(),
            row_at: 0,
            src: Some(src),
            spare: Some(try_zeroed("pathfinder row", self.problem.cols)?),
        })
    }
}

impl Workload for PathfinderJob {
    type Step = PathfinderStep;
    type Output = PathfinderResult;

    fn next_step(&mut self) -> Result<Option<PathfinderStep>, KernelError> {
        if self.row_at + 1 >= self.problem.rows {
            return Ok(None);
        }
        let (Some(src), Some(spare)) = (self.src.take(), self.spare.take()) else {
            return Err(KernelError::invalid(
                "pathfinder step",
                "the previous step was not absorbed",
            ));
        };
        let h = self
            .problem
            .pyramid
            .min(self.problem.rows - 1 - self.row_at);
        Ok(Some(PathfinderStep {
            wall: self.wall.clone(),
            cols: self.problem.cols,
            t0: self.row_at + 1,
            h,
            src,
            dst: DisjointBuf::from_vec(spare, 1),
        }))
    }

    fn absorb(&mut self, step: PathfinderStep) -> Result<(), KernelError> {
        if self.src.is_some() || step.t0 != self.row_at + 1 || !Arc::ptr_eq(&step.wall, &self.wall)
        {
            return Err(KernelError::invalid(
                "pathfinder step",
                "not this job's current step",
            ));
        }
        self.row_at += step.h;
        self.spare = Some(step.src);
        self.src = Some(step.dst.into_vec());
        Ok(())
    }

    fn finish(self) -> PathfinderResult {
        PathfinderResult {
            problem: self.problem,
            row: self.src.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::run_sequential;
    use super::super::testutil::{run_workload_split, splits};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn jumped_equals_drawing() {
        let mut seq = GlibcRand::new(9);
        let mut drawn = 0u64;
        for n in [0u64, 1, 2, 3, 30, 31, 32, 100, 1000, 12_345, 70_000] {
            while drawn < n {
                seq.next_i32();
                drawn += 1;
            }
            let mut j = GlibcRand::new(9).jumped(n);
            let mut s = seq.clone();
            for _ in 0..100 {
                assert_eq!(s.next_i32(), j.next_i32(), "after {n} draws");
            }
        }
        // Jumps compose from any position.
        let mut a = GlibcRand::new(3).jumped(17).jumped(40);
        let mut b = GlibcRand::new(3).jumped(57);
        assert_eq!(a.next_i32(), b.next_i32());
    }

    #[test]
    fn parallel_grid_equals_the_one_thread_loop() {
        // Sizes below, at and across the generation block, ragged ends.
        let block = super::super::rng::GEN_BLOCK;
        for (cols, rows) in [(1, 1), (7, 3), (1000, 1), (block / 10 + 3, 21), (333, 9000)] {
            let p = PathfinderProblem::new(cols, rows).unwrap();
            let job = PathfinderJob::new(p).unwrap();
            // The reference: the one-thread fill this crate used before.
            let mut g = GlibcRand::new(p.seed);
            assert_eq!(job.wall.len(), cols * rows);
            assert!(job.wall.iter().all(|&c| c == (g.next_i32() % 10) as u8));
        }
    }

    /// Rodinia's loop, one row at a time, from the same grid.
    fn reference(p: PathfinderProblem) -> Vec<i32> {
        let mut g = GlibcRand::new(p.seed);
        let wall: Vec<i32> = (0..p.cols * p.rows).map(|_| g.next_i32() % 10).collect();
        let mut src: Vec<i32> = wall[..p.cols].to_vec();
        let mut dst = vec![0; p.cols];
        for t in 1..p.rows {
            for n in 0..p.cols {
                let mut m = src[n];
                if n > 0 {
                    m = m.min(src[n - 1]);
                }
                if n + 1 < p.cols {
                    m = m.min(src[n + 1]);
                }
                dst[n] = wall[t * p.cols + n] + m;
            }
            std::mem::swap(&mut src, &mut dst);
        }
        src
    }

    #[test]
    fn glibc_rand_first_outputs_after_srand_9() {
        let mut g = GlibcRand::new(9);
        let first: Vec<i32> = (0..5).map(|_| g.next_i32()).collect();
        assert_eq!(
            first,
            [444454915, 1502197874, 436864165, 770686807, 1899516530]
        );
        // srand(1) is glibc's default state: rand() starts 1804289383, 846930886.
        let mut g = GlibcRand::new(1);
        assert_eq!((g.next_i32(), g.next_i32()), (1804289383, 846930886));
    }

    #[test]
    fn matches_row_by_row_reference() {
        for (cols, rows, h) in [
            (1, 5, 3),
            (2, 7, 1),
            (37, 30, 4),
            (300, 41, 20),
            (9000, 12, 5),
        ] {
            let p = PathfinderProblem::new(cols, rows)
                .unwrap()
                .with_pyramid(h)
                .unwrap();
            let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
            assert_eq!(out.row, reference(p), "{cols}×{rows} h={h}");
        }
        let p = PathfinderProblem::new(5, 1).unwrap();
        assert_eq!(
            run_sequential(PathfinderJob::new(p).unwrap()).unwrap().row,
            reference(p)
        );
    }

    #[test]
    fn rodinia_1000x10_row() {
        // First values of Rodinia 3.1 openmp `pathfinder 1000 10` (BENCH_PRINT).
        let p = PathfinderProblem::new(1000, 10).unwrap();
        let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
        let text = out.rodinia_text();
        assert!(text.starts_with("24 20 24 17 14 18 24 28 27 20 14 21 19 18 16 21 20 17 15 29 "));
        assert!(text.ends_with(" \n"));
    }

    #[test]
    fn refuses_bad_sizes() {
        assert!(PathfinderProblem::new(0, 10).is_err());
        assert!(PathfinderProblem::new(10, 0).is_err());
        assert!(PathfinderProblem::new(10, 10)
            .unwrap()
            .with_pyramid(0)
            .is_err());
        assert!(PathfinderProblem::new(1 << 40, 1 << 10).is_err());
        assert!(PathfinderProblem::new(1, 1 << 30).is_err());
    }

    /// SHA-256 of the result rows printed by Rodinia 3.1 openmp `pathfinder 100000 100`
    /// and `pathfinder 1000000 100` (BENCH_PRINT, last line); release only.
    #[test]
    #[ignore = "heavy: run with --release -- --ignored"]
    fn rodinia_checksums() {
        for (cols, sha) in [
            (
                100_000,
                "d1ef70774261b081deeaf9d3406814c32112e9924599e1e0bcdc1a23fe9ec8de",
            ),
            (
                1_000_000,
                "187facab22d103c489459cb1a9318c167c17300e763c46f505be497a6bb03035",
            ),
        ] {
            let p = PathfinderProblem::new(cols, 100).unwrap();
            let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
            assert_eq!(out.sha256_hex(), sha, "{cols}×100");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_split_is_bit_identical((cuts, seed) in splits(12), h in 1usize..9) {
            let p = PathfinderProblem::new(1500, 23).unwrap().with_pyramid(h).unwrap();
            let whole = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
            let split = run_workload_split(PathfinderJob::new(p).unwrap(), &cuts, seed).unwrap();
            prop_assert_eq!(whole.row, split.row);
        }
    }
}
