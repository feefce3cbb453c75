//! mlp: the forward pass of a trained MLP classifier over the rows of a
//! batch, the model a streaming inference service serves.
//!
//! Item `i` is one input row. The network has any number of dense layers
//! of any widths, ReLU after each but the last, softmax at the end (as
//! `scripts/train_digits.py` trains it with scikit-learn's `MLPClassifier`);
//! the digits model is 64 → 1024 → 1024 → 10:
//!
//! ```text
//!   x [rows, in] ─▶ dense fc1 + ReLU ─▶ … ─▶ dense fcN ─▶ softmax ─▶ probs [rows, classes]
//!                   [w1, in]                 [classes, w(N-1)]
//! ```
//!
//! Weights are read from a safetensors file: `fc1.weight`, `fc2.weight`, …
//! (float32, `[out, in]`, the PyTorch layout, each layer's `in` the
//! previous one's `out`) and `fcK.bias` (float32, `[out]`); the layer count
//! and widths come from the file. Inputs are used as given: the committed
//! digits model expects pixel intensities divided by 16 (each in `[0, 1]`),
//! the scaling its script applied when training.
//!
//! The CPU computes each chunk's rows as one GEMM per layer (`matrixmultiply`'s
//! `sgemm`, packed and vectorised) over tiles of at most [`Mlp::TILE_ROWS`]
//! rows, so the hidden activations of a tile stay in cache-sized scratch; a
//! tile of fewer than 8 rows runs as one matrix–vector product per row
//! (`gemm`'s), which skips the GEMM's packing of the weights.
//!
//! The GPU twin (in `cuda/workloads/mlp.rs`) runs the same layers as cuBLAS
//! `sgemm` calls (cudarc's bindings, the library opened at run time) and adds
//! bias, ReLU and softmax in `cu/mlp.cu`. The weights cross the bus once per
//! device and load, not per batch. Its probabilities match the CPU's to float
//! tolerance, not bit for bit: cuBLAS sums in its own order, whatever the
//! stream's math mode (`StreamWorker::set_deterministic`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use coexec_kernels::workloads::{run_sequential, Mlp, MlpWeights};
//! use coexec_kernels::OneShot;
//!
//! let w = Arc::new(MlpWeights::load("examples/models/digits_mlp.safetensors")?);
//! let row = vec![0.0f32; w.inputs()]; // one blank 8×8 image, scaled
//! let k = run_sequential(OneShot::new(Mlp::new(w, row)?))?.expect("absorbed");
//! let probs = k.into_probs();
//! assert_eq!(probs.len(), 10);
//! # Ok::<(), coexec_kernels::KernelError>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::SafeTensors;

use super::{check_chunk, try_zeroed};
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

/// Below this many rows a layer runs as one matrix–vector product per row
/// (`gemm`'s GEMV path, which reads `W` where it lies) instead of one
/// `matrixmultiply` GEMM. That GEMM packs all of `W` on every call and pads
/// the rows to its 8-row tile, so 1 to 8 rows cost it the same: ~0.42 ms for
/// the digits model's 1024 × 1024 hidden layer, where one row's GEMV costs
/// ~0.05 ms (2-core EPYC VM). `gemm` is called one row at a time: its GEMM
/// for 2 rows or more is slower than `matrixmultiply`'s (~0.81 ms for 2 to
/// 4 rows). `cargo bench --bench mlp_forward` measures both sides of the
/// switch.
const GEMV_ROWS: usize = 8;

/// One dense layer `y = x·Wᵀ + b`, `W` row-major `[out, in]`.
#[derive(Debug)]
struct Dense {
    w: Box<[f32]>,
    b: Box<[f32]>,
    inp: usize,
    out: usize,
}

impl Dense {
    /// `y[r][o] = b[o] + Σₖ x[r][k]·W[o][k]` for `rows` rows, then ReLU when
    /// `relu`.
    fn forward(&self, x: &[f32], rows: usize, y: &mut [f32], relu: bool) {
        // Internal invariant (the callers size the slices); checked because the
        // GEMM below reads through raw pointers.
        assert!(x.len() >= rows * self.inp && y.len() >= rows * self.out);
        for y_row in y[..rows * self.out].chunks_exact_mut(self.out) {
            y_row.copy_from_slice(&self.b);
        }
        if rows < GEMV_ROWS {
            for (x_row, y_row) in x
                .chunks_exact(self.inp)
                .zip(y[..rows * self.out].chunks_exact_mut(self.out))
            {
                crate::tensors::gemm_add_xwt(x_row, 1, &self.w, self.inp, self.out, y_row);
            }
        } else {
            crate::tensors::add_xwt(x, rows, &self.w, self.inp, self.out, y);
        }
        if relu {
            for v in &mut y[..rows * self.out] {
                *v = v.max(0.0);
            }
        }
    }
}

/// The weights of an MLP classifier of any depth and widths, loaded once and
/// shared (behind an [`Arc`]) by every batch's [`Mlp`] kernel.
#[derive(Debug)]
pub struct MlpWeights {
    layers: Vec<Dense>,
    source: PathBuf,
    /// Unique in the process: a GPU keeps these weights on the device under
    /// it (they never change once loaded).
    id: u64,
}

/// Most layers a model may have: far past any MLP worth serving, and a
/// bound on what a hostile file can make the loader look for.
const MAX_LAYERS: usize = 64;

impl MlpWeights {
    /// Reads and checks a safetensors file (see the module docs for the tensors
    /// it must hold). Errors name the file and the tensor at fault.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, KernelError> {
        let path = path.as_ref();
        let bytes = read(path)?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses safetensors `bytes`; `origin` names them in errors.
    ///
    /// The layers are `fc1`, `fc2`, … up to the first `fcN.weight` missing;
    /// each layer's input width is the previous one's output width, the
    /// last layer's output width is the number of classes (at least 2), and
    /// the file holds no other tensor.
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self, KernelError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| tensor_err(origin, "", e))?;
        let mut layers: Vec<Dense> = Vec::new();
        for k in 1..=MAX_LAYERS {
            let name = format!("fc{k}.weight");
            if k > 1 && st.tensor(&name).is_err() {
                break;
            }
            let inp = layers.last().map(|l| l.out);
            let w = read_f32(&st, origin, &name, &[None, inp])?;
            let out = w.shape[0];
            let b = read_f32(&st, origin, &format!("fc{k}.bias"), &[Some(out)])?;
            layers.push(Dense {
                inp: w.shape[1],
                out,
                w: w.data,
                b: b.data,
            });
        }
        let n = layers.len();
        let known = |name: &str| {
            (1..=n).any(|k| name == format!("fc{k}.weight") || name == format!("fc{k}.bias"))
        };
        let mut extra: Vec<&str> = st.names().into_iter().filter(|t| !known(t)).collect();
        if !extra.is_empty() {
            extra.sort_unstable();
            return Err(tensor_err(
                origin,
                extra[0],
                format!(
                    "not a layer of an MLP of fc1..fc{n} (layers are fc1, fc2, ... \
                     numbered without a gap; the file also holds {extra:?})"
                ),
            ));
        }
        let classes = layers[n - 1].out;
        if classes < 2 {
            return Err(KernelError::Tensor {
                path: origin.to_path_buf(),
                tensor: format!("fc{n}.weight"),
                why: format!("{classes} output class(es); a classifier needs at least 2"),
            });
        }
        let model = Self {
            layers,
            source: origin.to_path_buf(),
            id: crate::claim::next_id(),
        };
        model.check_no_overflow()?;
        Ok(model)
    }

    /// Refuses a model whose output is not finite on a row of zeros or a
    /// row of ones: weights or biases so large (finite, near `f32::MAX`)
    /// that they overflow on any input, so that every request would fail
    /// for the model's fault, reported as the input's.
    fn check_no_overflow(&self) -> Result<(), KernelError> {
        let (inp, c) = (self.inputs(), self.classes());
        let mut x = vec![0.0f32; 2 * inp];
        x[inp..].fill(1.0);
        let mut probs = vec![0.0f32; 2 * c];
        self.forward(&x, &mut probs)?;
        if probs.iter().all(|p| p.is_finite()) {
            return Ok(());
        }
        Err(KernelError::Tensor {
            path: self.source.clone(),
            tensor: format!("fc1..fc{}", self.depth()),
            why: "the output on a row of zeros or of ones is not finite: weights or biases \
                  so large that any input overflows f32"
                .into(),
        })
    }

    /// Features per input row (64 for the digits model).
    pub fn inputs(&self) -> usize {
        self.layers[0].inp
    }

    /// The widths from input to output: `[inputs, hidden…, classes]`
    /// (`[64, 1024, 1024, 10]` for the digits model).
    pub fn widths(&self) -> Vec<usize> {
        std::iter::once(self.inputs())
            .chain(self.layers.iter().map(|l| l.out))
            .collect()
    }

    /// Units in the widest hidden layer; 0 for a model of one layer.
    pub fn widest_hidden(&self) -> usize {
        let n = self.layers.len();
        self.layers[..n - 1]
            .iter()
            .map(|l| l.out)
            .max()
            .unwrap_or(0)
    }

    /// Output classes (10 for the digits model).
    pub fn classes(&self) -> usize {
        self.layers[self.layers.len() - 1].out
    }

    /// The file the weights came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Number of dense layers.
    pub fn depth(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i` (from 0): its weights `[out, in]`, bias `[out]`, `in` and
    /// `out`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn layer(&self, i: usize) -> (&[f32], &[f32], usize, usize) {
        let l = &self.layers[i];
        (&l.w, &l.b, l.inp, l.out)
    }

    /// This load's process-unique id.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Floating-point operations of one row's forward pass (multiply and add
    /// counted apart; bias, ReLU and softmax left out).
    pub fn flops_per_row(&self) -> f64 {
        self.layers
            .iter()
            .map(|l| 2.0 * l.inp as f64 * l.out as f64)
            .sum()
    }

    /// Class probabilities of `rows` rows of `x` into `probs` (`rows × classes`),
    /// `TILE_ROWS` rows at a time, the hidden activations of a tile
    /// ping-ponging between two scratch buffers.
    fn forward(&self, x: &[f32], probs: &mut [f32]) -> Result<(), KernelError> {
        let (inp, h, c) = (self.inputs(), self.widest_hidden(), self.classes());
        let rows = probs.len() / c;
        let tile = tile_rows(rows, h);
        let mut a = try_zeroed::<f32>("mlp scratch", tile * h)?;
        let mut b = try_zeroed::<f32>("mlp scratch", tile * h)?;
        let (last, hidden) = self.layers.split_last().expect("at least one layer");
        for (x, p) in x.chunks(tile * inp).zip(probs.chunks_mut(tile * c)) {
            let n = p.len() / c;
            // The latest activations are in `a` once a hidden layer ran.
            for (i, l) in hidden.iter().enumerate() {
                if i == 0 {
                    l.forward(x, n, &mut a, true);
                } else {
                    l.forward(&a, n, &mut b, true);
                    std::mem::swap(&mut a, &mut b);
                }
            }
            let from: &[f32] = if hidden.is_empty() { x } else { &a };
            last.forward(from, n, p, false);
            p.chunks_exact_mut(c).for_each(softmax);
        }
        Ok(())
    }
}

/// The most a forward pass's two activation buffers may hold together: a
/// model with a very wide hidden layer runs fewer rows a tile rather than
/// allocate `2 × TILE_ROWS × width` floats (a 4 000 000-unit layer took
/// 2 GB for one batch). At 1024 units a tile keeps its 128 rows.
const SCRATCH_BYTES: usize = 64 << 20;

/// Rows per tile for a chunk of `rows` rows through hidden layers at most
/// `widest` wide: [`Mlp::TILE_ROWS`] at most, fewer where their scratch
/// would pass [`SCRATCH_BYTES`], one at least.
pub(super) fn tile_rows(rows: usize, widest: usize) -> usize {
    let per_row = 2 * widest.max(1) * std::mem::size_of::<f32>();
    Mlp::TILE_ROWS
        .min(rows.max(1))
        .min((SCRATCH_BYTES / per_row).max(1))
}

/// In place, shifted by the maximum so no `exp` overflows.
fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
    }
}

/// The forward pass over a batch of rows: item `i` writes the class
/// probabilities of row `i`.
#[derive(Debug)]
pub struct Mlp {
    weights: Arc<MlpWeights>,
    x: Box<[f32]>,
    probs: DisjointBuf<f32>,
}

impl Mlp {
    /// Rows per GEMM tile within a chunk: large enough for the GEMM to run near
    /// its peak, small enough that a tile's hidden activations (2 × 128 ×
    /// hidden floats, 1 MiB at 1024 units) stay in L2/L3.
    pub const TILE_ROWS: usize = 128;

    /// A batch of `inputs.len() / weights.inputs()` rows, back to back.
    /// Refuses a length that is not a whole number of rows.
    pub fn new(weights: Arc<MlpWeights>, inputs: Vec<f32>) -> Result<Self, KernelError> {
        let inp = weights.inputs();
        if !inputs.len().is_multiple_of(inp) {
            return Err(KernelError::invalid(
                "mlp batch",
                format!(
                    "{} values is not a whole number of {inp}-feature rows",
                    inputs.len()
                ),
            ));
        }
        let rows = inputs.len() / inp;
        let probs = DisjointBuf::from_vec(
            try_zeroed("mlp output", rows * weights.classes())?,
            weights.classes(),
        );
        Ok(Self {
            weights,
            x: inputs.into_boxed_slice(),
            probs,
        })
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<MlpWeights> {
        &self.weights
    }

    /// Number of rows (items).
    pub fn rows(&self) -> usize {
        self.probs.items()
    }

    /// The input rows, back to back.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn x(&self) -> &[f32] {
        &self.x
    }

    /// The output buffer (`classes` values per row).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn probs(&self) -> &DisjointBuf<f32> {
        &self.probs
    }

    /// The class probabilities, `rows × classes`, once the run is over.
    pub fn into_probs(self) -> Vec<f32> {
        self.probs.into_vec()
    }
}

impl Kernel for Mlp {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "mlp"
    }

    fn items(&self) -> usize {
        self.rows()
    }

    fn profile_key(&self) -> String {
        let w = &self.weights;
        let widths: Vec<String> = w.widths().iter().map(usize::to_string).collect();
        format!("mlp/{}", widths.join("x"))
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let inp = self.weights.inputs();
        let x = &self.x[chunk.lo() * inp..chunk.hi() * inp];
        self.weights.forward(x, self.probs.chunk_mut(chunk))
    }
}

mod io;
#[cfg(test)]
mod tests;

use crate::tensors::{read, read_f32, tensor_err};
pub use io::{LabeledRows, argmax};
