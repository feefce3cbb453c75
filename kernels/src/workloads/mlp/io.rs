//! Reading the model's safetensors files: tensors by name and dtype, and
//! the labelled rows of a test split.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::read;
use crate::KernelError;

/// A tensor read out of a safetensors file: its shape and its f32 or i64
/// elements (little-endian in the file, copied out since the file's bytes need
/// not be aligned).
pub(super) struct Tensor<T = f32> {
    pub(super) shape: Vec<usize>,
    pub(super) data: Box<[T]>,
}

pub(super) fn tensor_err(path: &Path, tensor: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        why: e.to_string(),
    }
}

/// Reads `name` as `dtype` with `rank = want.len()` dimensions, each equal to
/// `want[d]` where that is `Some`, and every dimension positive.
pub(super) fn read_raw<'a>(
    st: &SafeTensors<'a>,
    path: &Path,
    name: &str,
    dtype: Dtype,
    want: &[Option<usize>],
) -> Result<(Vec<usize>, &'a [u8]), KernelError> {
    let t = st.tensor(name).map_err(|_| {
        let mut names = st.names();
        names.sort_unstable();
        tensor_err(path, name, format!("missing (the file holds {names:?})"))
    })?;
    if t.dtype() != dtype {
        return Err(tensor_err(
            path,
            name,
            format!("dtype {:?}, expected {dtype:?}", t.dtype()),
        ));
    }
    let shape = t.shape().to_vec();
    let fits = shape.len() == want.len()
        && shape
            .iter()
            .zip(want)
            .all(|(&s, w)| s > 0 && w.is_none_or(|w| w == s));
    if !fits {
        let want: Vec<String> = want
            .iter()
            .map(|w| w.map_or("_".into(), |w| w.to_string()))
            .collect();
        return Err(tensor_err(
            path,
            name,
            format!("shape {shape:?}, expected [{}]", want.join(", ")),
        ));
    }
    Ok((shape, t.data()))
}

pub(super) fn read_f32(
    st: &SafeTensors<'_>,
    path: &Path,
    name: &str,
    want: &[Option<usize>],
) -> Result<Tensor, KernelError> {
    let (shape, bytes) = read_raw(st, path, name, Dtype::F32, want)?;
    let data: Box<[f32]> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Err(tensor_err(
            path,
            name,
            format!("element {i} is {}", data[i]),
        ));
    }
    Ok(Tensor { shape, data })
}

pub(super) fn read_i64(
    st: &SafeTensors<'_>,
    path: &Path,
    name: &str,
    want: &[Option<usize>],
) -> Result<Tensor<i64>, KernelError> {
    let (shape, bytes) = read_raw(st, path, name, Dtype::I64, want)?;
    let data = bytes
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .collect();
    Ok(Tensor { shape, data })
}

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
