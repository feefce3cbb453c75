//! The MLP's GPU twin: its layers as cuBLAS GEMMs in pieces of
//! rows, with bias, ReLU and softmax in `src/cu/mlp.cu`.

use std::sync::Arc;

use cudarc::driver::CudaFunction;

use super::super::stream::DevPtr;
use super::*;

/// Bytes of one hidden-activation buffer of the mlp twin: a chunk runs in
/// pieces of rows whose activations fit, so device and pinned buffers stay
/// small (reserved once, in `prepare`) however large the chunk.
const MLP_PIECE_BYTES: usize = 16 << 20;

/// Rows per piece for a hidden width of `hidden`, at least one.
fn mlp_piece(hidden: usize) -> usize {
    (MLP_PIECE_BYTES / (hidden * 4).max(1)).max(1)
}

impl MlpWeights {
    /// Each layer's weights and bias on `w`'s device, `[w1, b1, w2, b2, …]`,
    /// uploaded once per device and load (see [`StreamWorker::run_input`]).
    fn on_device(&self, w: &mut StreamWorker) -> Result<Vec<Arc<DevBytes>>, KernelError> {
        let id = self.id();
        let mut bufs = Vec::with_capacity(2 * self.depth());
        for i in 0..self.depth() {
            let (wt, b, _, _) = self.layer(i);
            bufs.push(w.run_input(id, wt)?);
            bufs.push(w.run_input(id, b)?);
        }
        Ok(bufs)
    }

    /// Rows per piece: as many as the widest activation allows.
    fn piece(&self) -> usize {
        mlp_piece(self.widths().into_iter().max().unwrap_or(1))
    }
}

/// The stream's slots for the mlp twin: input rows, two hidden activations
/// (the layers ping-pong between them), the probabilities.
const MLP_X: usize = 0;
const MLP_H: [usize; 2] = [1, 2];
const MLP_P: usize = 3;

/// Enqueues the layers on `n` rows at `x` into `p`, the hidden activations
/// in the two `MLP_H` slots: each layer's GEMM, then (when `ew` is given)
/// its bias and activation.
///
/// # Safety
///
/// `x` holds `n·inputs` f32 and `p` `n·classes`, both valid until the stream
/// is synchronised; the `MLP_H` slots are reserved for `n` rows of the
/// widest hidden layer; `weights` are `m`'s, from [`MlpWeights::on_device`].
unsafe fn layers(
    w: &mut StreamWorker,
    m: &MlpWeights,
    weights: &[Arc<DevBytes>],
    x: DevPtr,
    p: DevPtr,
    n: usize,
    ew: Option<(&CudaFunction, &CudaFunction)>,
) -> Result<(), KernelError> {
    let depth = m.depth();
    let mut from = x;
    for i in 0..depth {
        let (_, _, inp, out) = m.layer(i);
        let last = i + 1 == depth;
        let to = if last {
            p
        } else {
            w.scratch::<f32>(MLP_H[i % 2], n * out)?
        };
        let (wt, b) = (w.addr(&weights[2 * i]), w.addr(&weights[2 * i + 1]));
        let (n32, out32) = (n as u32, out as u32);
        // SAFETY: `from` holds n·inp f32 (the input, or the previous layer's
        // slot), `to` n·out (the other slot, or `p`); the weights hold
        // [out, inp] and the bias [out] f32 in the run cache, held until the
        // stream is synchronised. `to` overlaps neither input: consecutive
        // layers use different slots. `bias_act(float* y, const float* b,
        // u32 rows, u32 out, u32 relu)` and `bias_softmax(float* y, const
        // float* b, u32 rows, u32 classes)` touch y[0..rows·out) and
        // b[0..out) only.
        unsafe {
            w.dense(from, wt, to, n, inp, out)?;
            if let Some((bias_act, bias_softmax)) = ew {
                if last {
                    w.launch(bias_softmax, grid_1d(n, 128), &[&to, &b, &n32, &out32])?;
                } else {
                    // Blocks for an element-wise pass over n·out values
                    // (grid-stride).
                    let g = grid_1d((n * out).min(1 << 24), 256);
                    w.launch(bias_act, g, &[&to, &b, &n32, &out32, &1u32])?;
                }
            }
        }
        from = to;
    }
    Ok(())
}

impl CudaKernel for Mlp {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        w.function(&MLP, "bias_act")?;
        w.function(&MLP, "bias_softmax")?;
        let m = self.weights();
        let rows = m.piece().min(self.items().max(1));
        let h = m.widest_hidden().max(1);
        w.reserve_slot(MLP_X, rows * m.inputs() * 4)?;
        w.reserve_slot(MLP_H[0], rows * h * 4)?;
        w.reserve_slot(MLP_H[1], rows * h * 4)?;
        w.reserve_slot(MLP_P, rows * m.classes() * 4)?;
        // One row and one full piece through the products open cuBLAS for
        // this stream (handle, workspace, the lazily loaded kernels it picks
        // for both shapes) now rather than in the first chunks, whose time
        // would teach the profiler a GPU many times slower than it is. The
        // rows are whatever the slots hold; their outputs are never read.
        let weights = m.on_device(w)?;
        for n in [1, rows] {
            let x = w.scratch::<f32>(MLP_X, n * m.inputs())?;
            let p = w.scratch::<f32>(MLP_P, n * m.classes())?;
            // SAFETY: each slot holds at least `rows` rows of its layer
            // (reserved above), the weights are `m`'s; all held until
            // `finish`.
            unsafe { layers(w, m, &weights, x, p, n, None)? };
        }
        w.finish()?;
        drop(weights);
        Ok(())
    }

    fn stage(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        self.weights().on_device(w).map(drop)
    }

    fn threads_per_item(&self) -> usize {
        // cuBLAS's FP32 kernels compute about 16 outputs of a hidden layer
        // per thread: a row occupies width / 16 threads, 64 at 1024 units,
        // so the smallest GPU chunk on an H100 (132 SMs of 1024 threads) is
        // about 2100 rows. A batch of fewer rows runs whole on the GPU.
        (self.weights().widths().into_iter().max().unwrap_or(1) / 16).max(1)
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let m = self.weights();
        let (inp, c) = (m.inputs(), m.classes());
        let bias_act = w.function(&MLP, "bias_act")?;
        let bias_softmax = w.function(&MLP, "bias_softmax")?;
        let weights = m.on_device(w)?;
        let probs = self.probs();
        let dst = probs.chunk_mut(chunk);
        let piece = m.piece();
        for lo in (chunk.lo()..chunk.hi()).step_by(piece) {
            let hi = (lo + piece).min(chunk.hi());
            let n = hi - lo;
            let x = w.upload(MLP_X, &[&self.x()[lo * inp..hi * inp]])?;
            let p = w.scratch::<f32>(MLP_P, n * c)?;
            // SAFETY: `x` holds n·inp f32 and `p` n·c (slots sized in
            // `prepare` for a piece), the hidden slots a piece of the widest
            // layer; the weights are `m`'s, held until `finish_into`.
            unsafe {
                layers(w, m, &weights, x, p, n, Some((&bias_act, &bias_softmax)))?;
            }
            let at = (lo - chunk.lo()) * c;
            let out = &mut dst[at..at + n * c];
            w.finish_into(&mut [Out::new(MLP_P, 0, out, probs.pin())])?;
        }
        drop(weights);
        Ok(())
    }
}
