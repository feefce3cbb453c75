//! The labelled rows of a test split, saved beside a model.

use std::path::Path;

use safetensors::SafeTensors;

use crate::KernelError;
use crate::tensors::{read, read_f32, read_i64, tensor_err};

/// A labelled test split saved beside a model by `scripts/train_digits.py`:
/// the rows (scaled as for training), their true labels, the labels the
/// script's own forward pass gave, and its probabilities for the first rows.
///
/// ```no_run
/// use coexec_kernels::workloads::LabeledRows;
///
/// let t = LabeledRows::load("examples/models/digits_test.safetensors")?;
/// assert_eq!(t.x.len(), t.rows() * t.features);
/// # Ok::<(), coexec_kernels::KernelError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LabeledRows {
    /// Features per row.
    pub features: usize,
    /// The rows, back to back (tensor `x`, f32 `[rows, features]`).
    pub x: Vec<f32>,
    /// True labels (tensor `y`, i64 `[rows]`).
    pub labels: Vec<i64>,
    /// The training script's predicted labels (tensor `pred`, i64 `[rows]`).
    pub predicted: Vec<i64>,
    /// The script's class probabilities for the first `probs.len() / classes`
    /// rows (tensor `probs`, f32 `[k, classes]`).
    pub probs: Vec<f32>,
    /// Classes per row of `probs`.
    pub classes: usize,
}

impl LabeledRows {
    /// Reads and checks the file; errors name the file and the tensor.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, KernelError> {
        let path = path.as_ref();
        let bytes = read(path)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| tensor_err(path, "", e))?;
        let x = read_f32(&st, path, "x", &[None, None])?;
        let (rows, features) = (x.shape[0], x.shape[1]);
        let y = read_i64(&st, path, "y", &[Some(rows)])?;
        let pred = read_i64(&st, path, "pred", &[Some(rows)])?;
        let probs = read_f32(&st, path, "probs", &[None, None])?;
        if probs.shape[0] > rows {
            return Err(tensor_err(
                path,
                "probs",
                format!("{} rows, more than the {rows} of `x`", probs.shape[0]),
            ));
        }
        Ok(Self {
            features,
            x: x.data.into_vec(),
            labels: y.data.into_vec(),
            predicted: pred.data.into_vec(),
            classes: probs.shape[1],
            probs: probs.data.into_vec(),
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.labels.len()
    }
}

/// The index of the largest value (the first on ties), `None` when empty.
///
/// ```
/// assert_eq!(coexec_kernels::workloads::argmax(&[0.1, 0.7, 0.2]), Some(1));
/// ```
pub fn argmax(v: &[f32]) -> Option<usize> {
    v.iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f32)>, (i, &x)| match best {
            Some((_, b)) if b >= x => best,
            _ => Some((i, x)),
        })
        .map(|(i, _)| i)
}
