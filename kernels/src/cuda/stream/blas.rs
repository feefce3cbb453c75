//! The stream's cuBLAS calls, for the twins built on it (the MLP and the
//! sentence encoder): one handle per stream, opened on first use.

use super::{Blas, DevPtr, StreamWorker};
use crate::KernelError;

impl StreamWorker {
    /// Enqueues the dense layer `y = x · Wᵀ` (row-major `x` `[rows, inp]`,
    /// `W` `[out, inp]`, `y` `[rows, out]`) on this stream through cuBLAS,
    /// opening cuBLAS for this stream on first use.
    ///
    /// # Safety
    ///
    /// `x`, `w` and `y` are device addresses of this worker's device holding
    /// at least `rows·inp`, `out·inp` and `rows·out` f32, valid until the
    /// stream is synchronised; `y` overlaps neither input.
    pub(crate) unsafe fn dense(
        &mut self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), KernelError> {
        let blas = self.blas()?;
        // SAFETY: the caller's promise.
        unsafe { blas.dense(x, w, y, rows, inp, out) }
    }

    /// Enqueues the strided-batched product `g` with operands at `a`, `b`
    /// and `c` through cuBLAS.
    ///
    /// # Safety
    ///
    /// `a`, `b` and `c` are device addresses of this worker's device
    /// holding at least `g.extents()` f32 each, valid until the stream is
    /// synchronised; `c` overlaps neither input.
    #[cfg(feature = "bert")]
    pub(crate) unsafe fn gemm(
        &mut self,
        g: &crate::cuda::bert::plan::Gemm,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> Result<(), KernelError> {
        let blas = self.blas()?;
        // SAFETY: the caller's promise.
        unsafe { blas.gemm(g, a, b, c) }
    }

    /// This stream's cuBLAS handle, opened on first use (the context is
    /// current: every entry point binds it before calling a kernel).
    fn blas(&mut self) -> Result<&Blas, KernelError> {
        if self.blas.is_none() {
            self.blas = Some(Blas::new(&self.stream)?);
        }
        Ok(self.blas.as_ref().expect("just opened"))
    }
}
