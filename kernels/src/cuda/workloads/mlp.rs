//! The digits MLP's GPU twin: its three layers as cuBLAS GEMMs in pieces of
//! rows, with bias, ReLU and softmax in `src/cu/mlp.cu`.

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
    /// Each layer's weights and bias on `w`'s device, uploaded once per
    /// device and load (see [`StreamWorker::run_input`]).
    fn on_device(
        &self,
        w: &mut StreamWorker,
    ) -> Result<[std::sync::Arc<DevBytes>; 6], KernelError> {
        let id = self.id();
        let mut bufs = Vec::with_capacity(6);
        for i in 0..3 {
            let (wt, b, _, _) = self.layer(i);
            bufs.push(w.run_input(id, wt)?);
            bufs.push(w.run_input(id, b)?);
        }
        Ok(bufs.try_into().expect("six buffers"))
    }
}

/// The stream's slots for the mlp twin: input rows, the two hidden
/// activations, the probabilities.
const MLP_X: usize = 0;
const MLP_H1: usize = 1;
const MLP_H2: usize = 2;
const MLP_P: usize = 3;

impl CudaKernel for Mlp {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        w.function(&MLP, "bias_act")?;
        w.function(&MLP, "bias_softmax")?;
        let m = self.weights();
        let rows = mlp_piece(m.hidden()).min(self.items().max(1));
        w.reserve_slot(MLP_X, rows * m.inputs() * 4)?;
        w.reserve_slot(MLP_H1, rows * m.hidden() * 4)?;
        w.reserve_slot(MLP_H2, rows * m.hidden() * 4)?;
        w.reserve_slot(MLP_P, rows * m.classes() * 4)?;
        // One row and one full piece through the three products open cuBLAS
        // for this stream (handle, workspace, the lazily loaded kernels it
        // picks for both shapes) now rather than in the first chunks, whose
        // time would teach the profiler a GPU many times slower than it is.
        // The rows are whatever the slots hold; their outputs are never read.
        let weights = m.on_device(w)?;
        let [w1, _, w2, _, w3, _] = weights.each_ref().map(|b| w.addr(b));
        for n in [1, rows] {
            let (x, h1) = (
                w.scratch::<f32>(MLP_X, n * m.inputs())?,
                w.scratch::<f32>(MLP_H1, n * m.hidden())?,
            );
            let (h2, p) = (
                w.scratch::<f32>(MLP_H2, n * m.hidden())?,
                w.scratch::<f32>(MLP_P, n * m.classes())?,
            );
            // SAFETY: each slot holds at least `rows` rows of its layer
            // (reserved above), the weights their layer; all held until
            // `finish`.
            unsafe {
                w.dense(x, w1, h1, n, m.inputs(), m.hidden())?;
                w.dense(h1, w2, h2, n, m.hidden(), m.hidden())?;
                w.dense(h2, w3, p, n, m.hidden(), m.classes())?;
            }
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
        // per thread: a row occupies hidden / 16 threads, 64 at 1024 units,
        // so the smallest GPU chunk on an H100 (132 SMs of 1024 threads) is
        // about 2100 rows. A batch of fewer rows runs whole on the GPU.
        (self.weights().hidden() / 16).max(1)
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let m = self.weights();
        let (inp, h, c) = (m.inputs(), m.hidden(), m.classes());
        let bias_act = w.function(&MLP, "bias_act")?;
        let bias_softmax = w.function(&MLP, "bias_softmax")?;
        let weights = m.on_device(w)?;
        let [w1, b1, w2, b2, w3, b3] = weights.each_ref().map(|b| w.addr(b));
        let probs = self.probs();
        let dst = probs.chunk_mut(chunk);
        let piece = mlp_piece(h);
        for lo in (chunk.lo()..chunk.hi()).step_by(piece) {
            let hi = (lo + piece).min(chunk.hi());
            let n = hi - lo;
            let x = w.upload(MLP_X, &[&self.x()[lo * inp..hi * inp]])?;
            let h1 = w.scratch::<f32>(MLP_H1, n * h)?;
            let h2 = w.scratch::<f32>(MLP_H2, n * h)?;
            let p = w.scratch::<f32>(MLP_P, n * c)?;
            let (n32, h32, c32) = (n as u32, h as u32, c as u32);
            // Blocks for an element-wise pass over `n·h` values (grid-stride).
            let ew = grid_1d((n * h).min(1 << 24), 256);
            // SAFETY: `x` holds n·inp f32, `h1` and `h2` n·h, `p` n·c (slots
            // sized above); the weights and biases hold their layer's
            // [out, in] and [out] f32 in the run cache, held until the
            // stream is synchronised by `finish`. Outputs overlap no input.
            // `bias_act(float* y, const float* b, u32 rows, u32 out, u32
            // relu)` and `bias_softmax(float* y, const float* b, u32 rows,
            // u32 classes)` touch y[0..rows·out) and b[0..out) only.
            unsafe {
                w.dense(x, w1, h1, n, inp, h)?;
                w.launch(&bias_act, ew, &[&h1, &b1, &n32, &h32, &1u32])?;
                w.dense(h1, w2, h2, n, h, h)?;
                w.launch(&bias_act, ew, &[&h2, &b2, &n32, &h32, &1u32])?;
                w.dense(h2, w3, p, n, h, c)?;
                w.launch(&bias_softmax, grid_1d(n, 128), &[&p, &b3, &n32, &c32])?;
            }
            let at = (lo - chunk.lo()) * c;
            let out = &mut dst[at..at + n * c];
            w.finish_into(&mut [Out::new(MLP_P, 0, out, probs.pin())])?;
        }
        drop(weights);
        Ok(())
    }
}
