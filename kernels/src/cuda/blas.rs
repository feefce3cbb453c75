//! cuBLAS, opened at run time like the driver and NVRTC: one handle per
//! stream worker, bound to that worker's stream.

use std::sync::{Arc, OnceLock};

use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaContext, CudaStream};

use super::guarded;
use super::stream::DevPtr;
use crate::KernelError;

/// Whether a cuBLAS library can be opened. Only `dlopen`s.
fn libcublas_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the candidate library names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// A size as cuBLAS's `int`.
fn int(n: usize) -> Result<i32, KernelError> {
    i32::try_from(n)
        .map_err(|_| KernelError::invalid("cuBLAS product", format!("{n} exceeds cuBLAS's int")))
}

fn error(what: &str) -> impl Fn(result::CublasError) -> KernelError + '_ {
    move |e| KernelError::Cuda(format!("{what}: {e}"))
}

/// A cuBLAS handle whose work goes to one stream.
pub(super) struct Blas {
    handle: sys::cublasHandle_t,
    /// The context the handle was created in, made current again to destroy
    /// it (a drop may run on a thread where another context is current).
    ctx: Arc<CudaContext>,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as one thread
// uses it at a time; `Blas` is owned by one `StreamWorker`, which `&mut self`
// keeps to one thread at a time.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle on `stream` (whose context must be current on this thread),
    /// in cuBLAS's default math mode: plain FP32, no TF32 tensor-core
    /// rounding.
    pub(super) fn new(stream: &CudaStream) -> Result<Self, KernelError> {
        if !libcublas_present() {
            return Err(KernelError::CudaUnavailable(
                "no cuBLAS library (libcublas) found; put the CUDA toolkit's lib64 on \
                 LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        guarded("creating a cuBLAS handle", || {
            let handle = result::create_handle().map_err(error("cublasCreate"))?;
            let blas = Self {
                handle,
                ctx: stream.context().clone(),
            };
            // SAFETY: the handle was just created; the stream is alive (the
            // caller's worker owns it and outlives this handle).
            unsafe { result::set_stream(handle, stream.cu_stream() as sys::cudaStream_t) }
                .map_err(error("cublasSetStream"))?;
            // SAFETY: valid handle and mode.
            unsafe { sys::cublasSetMathMode(handle, sys::cublasMath_t::CUBLAS_DEFAULT_MATH) }
                .result()
                .map_err(error("cublasSetMathMode"))?;
            Ok(blas)
        })
    }

    /// Enqueues `y = x · Wᵀ` for row-major `x` `[rows, inp]`, `W` `[out,
    /// inp]` and `y` `[rows, out]` (the PyTorch layout of a dense layer).
    ///
    /// cuBLAS is column-major: row-major `y` is column-major `yᵀ` `[out,
    /// rows]`, and `yᵀ = W · xᵀ` where column-major `W` with leading
    /// dimension `inp` is read transposed.
    ///
    /// # Safety
    ///
    /// `x`, `w` and `y` are device addresses of this handle's context holding
    /// at least `rows·inp`, `out·inp` and `rows·out` f32, valid until the
    /// stream is synchronised; `y` does not overlap `x` or `w`.
    pub(super) unsafe fn dense(
        &self,
        x: DevPtr,
        w: DevPtr,
        y: DevPtr,
        rows: usize,
        inp: usize,
        out: usize,
    ) -> Result<(), KernelError> {
        let (m, n, k) = (int(out)?, int(rows)?, int(inp)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's promise on the buffers; m, n, k and the leading
        // dimensions describe exactly those sizes; alpha and beta are host
        // scalars (the handle's default pointer mode).
        unsafe {
            result::sgemm(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                &alpha,
                w as *const f32,
                k,
                x as *const f32,
                k,
                &beta,
                y as *mut f32,
                m,
            )
        }
        .map_err(error("cublasSgemm"))
    }

    /// Enqueues the strided-batched product `g` (column-major, as
    /// [`Gemm`](crate::cuda::bert::plan::Gemm) describes it).
    ///
    /// # Safety
    ///
    /// `a`, `b` and `c` are device addresses of this handle's context
    /// holding at least `g.extents()` f32 each, valid until the stream is
    /// synchronised; `c` overlaps neither input.
    #[cfg(feature = "bert")]
    pub(super) unsafe fn gemm(
        &self,
        g: &crate::cuda::bert::plan::Gemm,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> Result<(), KernelError> {
        let long = |n: usize| {
            i64::try_from(n)
                .map_err(|_| KernelError::invalid("batched product", format!("stride {n}")))
        };
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let beta = 0.0f32;
        // SAFETY: the caller's promise on the buffers; the sizes, leading
        // dimensions and strides are `g`'s, whose extents the caller
        // checked; alpha and beta are host scalars.
        unsafe {
            result::sgemm_strided_batched(
                self.handle,
                op(g.ta),
                op(g.tb),
                int(g.m)?,
                int(g.n)?,
                int(g.k)?,
                &g.alpha,
                a as *const f32,
                int(g.lda)?,
                long(g.sa)?,
                b as *const f32,
                int(g.ldb)?,
                long(g.sb)?,
                &beta,
                c as *mut f32,
                int(g.ldc)?,
                long(g.sc)?,
                int(g.batch)?,
            )
        }
        .map_err(error("cublasSgemmStridedBatched"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // An error at teardown has no one to report to; without the context
        // current the handle is left for the context's own destruction.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created in `new` and destroyed only here, with its
            // context current.
            let _ = unsafe { result::destroy_handle(self.handle) };
        }
    }
}
