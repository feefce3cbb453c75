//! Reading safetensors files: tensors by name, dtype and shape, with errors
//! that name the file and the tensor (the MLP's and the encoder's
//! weights); and the dense layers' GEMMs both models run.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::KernelError;

/// The bytes of the regular file `path`, at most what this machine can
/// hold ([`crate::memory_limit`]), or an error naming it.
pub fn read(path: &Path) -> Result<Vec<u8>, KernelError> {
    crate::read_file(path, crate::memory_limit())
}

/// A tensor read out of a safetensors file: its shape and its f32 or i64
/// elements (little-endian in the file, copied out since the file's bytes need
/// not be aligned).
#[cfg_attr(not(feature = "workloads"), allow(dead_code))]
pub struct Tensor<T = f32> {
    /// Its dimensions.
    pub shape: Vec<usize>,
    /// Its elements, row-major.
    pub data: Box<[T]>,
}

/// A [`KernelError::Tensor`] naming the file and the tensor.
pub fn tensor_err(path: &Path, tensor: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        why: e.to_string(),
    }
}

/// Reads `name` as `dtype` with `rank = want.len()` dimensions, each equal to
/// `want[d]` where that is `Some`, and every dimension positive.
pub fn read_raw<'a>(
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

/// Reads `name` as f32 ([`read_raw`]'s checks): an F32 tensor as it is,
/// an F16 or BF16 one widened to f32 (exactly: every half value is an
/// f32). Any other dtype is an error naming the tensor, as is a value
/// that is not finite.
pub fn read_f32(
    st: &SafeTensors<'_>,
    path: &Path,
    name: &str,
    want: &[Option<usize>],
) -> Result<Tensor, KernelError> {
    let dtype = match st.tensor(name).map(|t| t.dtype()) {
        Ok(d @ (Dtype::F16 | Dtype::BF16)) => d,
        _ => Dtype::F32,
    };
    let (shape, bytes) = read_raw(st, path, name, dtype, want)?;
    let data: Box<[f32]> = match dtype {
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    };
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Err(tensor_err(
            path,
            name,
            format!("element {i} is {}", data[i]),
        ));
    }
    Ok(Tensor { shape, data })
}

#[cfg(feature = "workloads")]
/// Reads `name` as i64 ([`read_raw`]'s checks).
pub fn read_i64(
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

/// `y += x·Wᵀ` for `rows` rows as one packed GEMM (`matrixmultiply`'s
/// `sgemm`; the MLP's): `x` is `rows × inp`, `W` row-major `out × inp` (PyTorch's
/// layout, read as its transpose), `y` `rows × out`.
#[cfg(feature = "workloads")]
pub fn add_xwt(x: &[f32], rows: usize, w: &[f32], inp: usize, out: usize, y: &mut [f32]) {
    // Internal invariant (the callers size the slices); checked because the
    // GEMM below reads through raw pointers.
    assert!(x.len() >= rows * inp && w.len() >= out * inp && y.len() >= rows * out);
    // SAFETY: `x` holds `rows × inp` elements at row stride `inp`, `W` holds
    // `out × inp` read as its transpose (`inp × out`, row stride 1, column
    // stride `inp`), `y` holds `rows × out` at row stride `out`; all three
    // lengths are checked above and `y` does not alias `x` or `W` (it is a
    // `&mut`).
    unsafe {
        matrixmultiply::sgemm(
            rows,
            inp,
            out,
            1.0,
            x.as_ptr(),
            inp as isize,
            1,
            w.as_ptr(),
            1,
            inp as isize,
            1.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
}

/// `y += x·Wᵀ` for `rows` rows as one `gemm` GEMM: `x` is `rows × inp`,
/// `W` row-major `out × inp` (read as its transpose), `y` `rows × out`.
/// The encoder's dense layers, and the MLP's rows one at a time (where it
/// reads `W` in place, without `matrixmultiply`'s packing).
pub fn gemm_add_xwt(x: &[f32], rows: usize, w: &[f32], inp: usize, out: usize, y: &mut [f32]) {
    // Internal invariant (the callers size the slices); checked because the
    // GEMM below reads through raw pointers.
    assert!(x.len() >= rows * inp && w.len() >= out * inp && y.len() >= rows * out);
    // SAFETY: `x` holds `rows × inp` elements (column stride 1, row stride
    // `inp`), `W` holds `out × inp`, read as its transpose (`inp × out`:
    // column stride `inp`, row stride 1), `y` holds `rows × out` (column
    // stride 1, row stride `out`); lengths checked above. `y` does not alias
    // `x` or `W` (a `&mut`). With `read_dst`, `y := 1·y + 1·x·Wᵀ`; f32 is a
    // type `gemm` takes, so it does not panic.
    unsafe {
        gemm::gemm(
            rows,
            out,
            inp,
            y.as_mut_ptr(),
            1,
            out as isize,
            true,
            x.as_ptr(),
            1,
            inp as isize,
            w.as_ptr(),
            inp as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
