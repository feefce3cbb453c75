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

use super::rng::par_generate;
use super::{Workload, check_bytes, check_chunk, try_zeroed};
use crate::buf::HostBuf;
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

mod glibc_rand;

pub use glibc_rand::GlibcRand;

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
    wall: Arc<HostBuf<u8>>,
    cols: usize,
    t0: usize,
    h: usize,
    src: HostBuf<i32>,
    dst: DisjointBuf<i32>,
}

impl PathfinderStep {
    /// Columns per CPU band (see the module docs).
    pub const BAND: usize = 8192;

    /// The grid, row-major, one byte per cell.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn wall(&self) -> &HostBuf<u8> {
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
    pub(crate) fn src(&self) -> &HostBuf<i32> {
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
    wall: Arc<HostBuf<u8>>,
    /// Grid row the current result row has reached.
    row_at: usize,
    /// The result row and the spare one, which turn into each run's input
    /// and output rows in place (a GPU keeps them page-locked throughout).
    src: Option<HostBuf<i32>>,
    spare: Option<HostBuf<i32>>,
}

impl PathfinderJob {
    /// Generates the grid of `problem` (glibc `rand() % 10`, row-major).
    pub fn new(problem: PathfinderProblem) -> Result<Self, KernelError> {
        let cells = problem.cols * problem.rows;
        // On every core: each block of cells starts from the generator
        // jumped ahead to its first cell (`GlibcRand::jumped`), so the grid
        // is the one-thread sequence bit for bit.
        let g0 = GlibcRand::new(problem.seed);
        let wall = par_generate("pathfinder grid", cells, |first| {
            let mut g = g0.jumped(first);
            move || (g.next_i32() % 10) as u8
        })?;
        Self::from_wall(problem, Arc::new(HostBuf::from(wall)))
    }

    /// A job at its first row over `wall`.
    fn from_wall(problem: PathfinderProblem, wall: Arc<HostBuf<u8>>) -> Result<Self, KernelError> {
        let mut src: Vec<i32> = try_zeroed("pathfinder row", problem.cols)?;
        for (s, &c) in src.iter_mut().zip(&wall[..problem.cols]) {
            *s = c as i32;
        }
        Ok(Self {
            problem,
            wall,
            row_at: 0,
            src: Some(HostBuf::from(src)),
            spare: Some(HostBuf::from(try_zeroed("pathfinder row", problem.cols)?)),
        })
    }

    /// The problem.
    pub fn problem(&self) -> &PathfinderProblem {
        &self.problem
    }

    /// A fresh job over the same grid, without generating it again (for
    /// repeated runs of one problem).
    pub fn restart(&self) -> Result<Self, KernelError> {
        Self::from_wall(self.problem, self.wall.clone())
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
            dst: DisjointBuf::from_host(spare, 1),
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
        self.src = Some(step.dst.into_host());
        Ok(())
    }

    fn finish(self) -> PathfinderResult {
        PathfinderResult {
            problem: self.problem,
            row: self.src.map(HostBuf::into_vec).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests;
