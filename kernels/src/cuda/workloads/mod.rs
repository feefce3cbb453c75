//! The GPU twins of the workloads written against the stream directly:
//! `impl CudaKernel` for the kernel types not (yet) declared as twins
//! ([`crate::GpuTwin`]): they do what a declared launch cannot (matmul's
//! pieces, pathfinder's passes and 2-D band copies, the mlp's cuBLAS calls;
//! the synthetic kernel's audit is in `cuda/synthetic.rs`). Each copies its chunk's
//! inputs in, launches the kernel of `src/cu/<name>.cu`, and copies the
//! outputs into the kernel's host buffers. The transfer-bound ones (matmul,
//! pathfinder, kmeans) page-lock their large buffers in `stage`, so their
//! chunks copy straight from and to them; the mlp (a service's small
//! batches) and the synthetic kernel stage their copies. nbody and kmeans
//! are declared twins (`workloads/nbody.rs`, `workloads/kmeans/step.rs`).

use cudarc::driver::LaunchConfig;

use super::CudaKernel;
use super::nvrtc::{MATMUL, MLP, PATHFINDER};
use super::stream::{Out, StreamWorker, grid_1d};

/// A run-cache buffer on the device.
type DevBytes = cudarc::driver::CudaSlice<u8>;
use super::{MAX_LAUNCH, too_large};
use crate::workloads::{Matmul, Mlp, MlpWeights, PathfinderStep, check_chunk};
use crate::{Chunk, Kernel, KernelError};

mod mlp;

/// Bytes of one matmul device buffer (each of a, b and c): a chunk is
/// copied and multiplied in pieces of this size, so the device buffers (and
/// the pinned staging, where the host buffers are not page-locked) stay
/// small, allocated once, however large the chunk. Growing pinned buffers to
/// a large chunk's size cost seconds on an H100.
const MATMUL_PIECE_BYTES: usize = 32 << 20;

/// Products per piece, at least one.
fn matmul_piece(d2: usize) -> usize {
    (MATMUL_PIECE_BYTES / (d2 * 4).max(1)).max(1)
}

impl Matmul {
    /// Bytes of one piece's a, b or c for this problem.
    fn piece_bytes(&self) -> usize {
        let d2 = self.problem().dim().pow(2);
        matmul_piece(d2).min(self.items().max(1)) * d2 * 4
    }
}

impl CudaKernel for Matmul {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        w.function(&MATMUL, "matmul")?;
        let bytes = self.piece_bytes();
        (0..3).try_for_each(|slot| w.reserve_device(slot, bytes))
    }

    fn stage(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        // a, b and c page-locked, or staging for those that are not.
        let bytes = self.piece_bytes();
        let bufs = [
            self.a().pinnable(),
            self.b().pinnable(),
            self.c().pinnable(),
        ];
        for (slot, buf) in bufs.into_iter().enumerate() {
            // One run per job: not locked where only reused buffers are.
            if !w.pin(buf, false) {
                w.reserve_slot(slot, bytes)?;
            }
        }
        Ok(())
    }

    fn threads_per_item(&self) -> usize {
        // One 16×16 block per output tile.
        (self.problem().dim().div_ceil(16)).pow(2) * 256
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        const TILE: u32 = 16;
        check_chunk(chunk, self.items(), 1)?;
        let dim = self.problem().dim();
        let d2 = dim * dim;
        if chunk.len() > MAX_LAUNCH {
            return Err(too_large(chunk));
        }
        let f = w.function(&MATMUL, "matmul")?;
        let tiles = (dim as u32).div_ceil(TILE);
        let dst = self.c().chunk_mut(chunk);
        let piece = matmul_piece(d2);
        let (a_all, b_all) = (self.a(), self.b());
        for lo in (chunk.lo()..chunk.hi()).step_by(piece) {
            let hi = (lo + piece).min(chunk.hi());
            let n = hi - lo;
            let a = w.upload_from(0, &a_all[lo * d2..hi * d2], a_all.pin())?;
            let b = w.upload_from(1, &b_all[lo * d2..hi * d2], b_all.pin())?;
            let c = w.scratch::<f32>(2, n * d2)?;
            let cfg = LaunchConfig {
                grid_dim: (tiles * tiles, (n as u32).min(65_535), 1),
                block_dim: (TILE, TILE, 1),
                shared_mem_bytes: 0,
            };
            let (count, dim32) = (n as u32, dim as u32);
            // SAFETY: `matmul(const float* a, const float* b, float* c, u32
            // count, u32 dim)`; each buffer holds `count·dim²` f32, the
            // kernel reads and writes no more.
            unsafe { w.launch(&f, cfg, &[&a, &b, &c, &count, &dim32])? };
            let at = (lo - chunk.lo()) * d2;
            let out = &mut dst[at..at + n * d2];
            w.finish_into(&mut [Out::new(2, 0, out, self.c().pin())])?;
        }
        Ok(())
    }
}

impl CudaKernel for PathfinderStep {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        w.function(&PATHFINDER, "pathfinder").map(drop)
    }

    fn stage(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        // The grid once per job (the steps share it), the two rows once per
        // job too (they turn into each other in place).
        w.pin(self.wall().pinnable(), true);
        w.pin(self.src().pinnable(), true);
        w.pin(self.dst().pinnable(), true);
        Ok(())
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        /// Rows one launch advances at most: with 1024-column tiles each
        /// block still writes 1024 − 2·448 = 128 columns.
        const MAX_PASS: usize = 448;
        check_chunk(chunk, self.items(), 1)?;
        let (cols, h, t0) = (self.cols(), self.height(), self.first_row());
        if cols > i32::MAX as usize || chunk.len() > MAX_LAUNCH {
            return Err(too_large(chunk));
        }
        let f = w.function(&PATHFINDER, "pathfinder")?;
        // The previous row over the chunk and its ghost zones.
        let (lo, hi) = (chunk.lo(), chunk.hi());
        let (mut in_lo, in_hi) = (lo.saturating_sub(h), (hi + h).min(cols));
        let src = self.src();
        let mut input = w.upload_from(0, &src[in_lo..in_hi], src.pin())?;
        // This run's rows over the same columns only: a chunk moves its own
        // share of the grid (whole rows per run would cost every chunk's
        // worker the full band, whatever its share).
        let (wall_lo, pitch) = (in_lo, in_hi - in_lo);
        let wall = self.wall();
        let first = t0 * cols + wall_lo;
        let band_ptr = w.upload_rows(3, &wall[first..], wall.pin(), (cols, pitch, h))?;
        let mut in_len = in_hi - in_lo;
        let (mut done, mut out_slot) = (0usize, 1usize);
        while done < h {
            let hp = (h - done).min(MAX_PASS);
            let rest = h - done - hp;
            // Later passes still need `rest` columns of ghost zone each side.
            let (o_lo, o_hi) = (lo.saturating_sub(rest), (hi + rest).min(cols));
            let out = w.scratch::<i32>(out_slot, o_hi - o_lo)?;
            let tile: u32 = if hp <= 96 { 256 } else { 1024 };
            let width = tile as usize - 2 * hp;
            let cfg = LaunchConfig {
                grid_dim: ((o_hi - o_lo).div_ceil(width) as u32, 1, 1),
                block_dim: (tile, 1, 1),
                shared_mem_bytes: 0,
            };
            let wall = band_ptr + (done * pitch) as u64;
            let band: (i32, i32) = (wall_lo as i32, pitch as i32);
            let args: (i32, i32, i32, i32, i32, i32) = (
                in_lo as i32,
                in_len as i32,
                cols as i32,
                hp as i32,
                o_lo as i32,
                (o_hi - o_lo) as i32,
            );
            // SAFETY: `pathfinder(const int* src, int src_off, int src_len,
            // const u8* wall, int wall_lo, int pitch, int cols, int hp, int
            // out_lo, int out_len, int* dst)`: `input` holds `in_len` i32 of
            // columns from `in_lo`, `wall` `hp` rows of `pitch` bytes (columns
            // from `wall_lo`) inside slot 3, `out` `o_hi − o_lo` i32; the
            // kernel reads the wall only inside those columns and writes
            // inside `out` only.
            unsafe {
                w.launch(
                    &f,
                    cfg,
                    &[
                        &input, &args.0, &args.1, &wall, &band.0, &band.1, &args.2, &args.3,
                        &args.4, &args.5, &out,
                    ],
                )?
            };
            (input, in_lo, in_len) = (out, o_lo, o_hi - o_lo);
            done += hp;
            if done < h {
                out_slot = 3 - out_slot; // ping-pong between slots 1 and 2
            }
        }
        debug_assert_eq!((in_lo, in_len), (lo, hi - lo));
        let dst = self.dst().chunk_mut(chunk);
        w.finish_into(&mut [Out::new(out_slot, 0, dst, self.dst().pin())])
    }
}
