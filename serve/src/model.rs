//! What a [`Model`] needs to be served over HTTP, and the MLP classifier's
//! answers to it.

use serde::Serialize;
use serde::de::DeserializeOwned;

#[cfg(feature = "workloads")]
use coexec::stream::MlpModel;
use coexec::stream::Model;

/// A [`Model`] the HTTP service can serve: a request's inputs are read as
/// its `Input` type from JSON and the answers written from its `Output`
/// type (serde), so the request is `{"inputs": [Input, ...]}` and the
/// answer `{"outputs": [Output, ...]}`.
///
/// Every method has a default: a model that takes any input it can parse
/// needs only `impl ServeModel for MyModel {}`. This one doubles numbers
/// (`{"inputs": [1, 2]}` answers `{"outputs": [2, 4]}`) and refuses those
/// whose double a JSON reader could not hold exactly:
///
/// ```
/// use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
/// use coexec_serve::ServeModel;
/// use coexec::stream::Model;
///
/// struct Double;
/// struct DoubleKernel { x: Vec<u64>, out: DisjointBuf<u64> }
///
/// impl Kernel for DoubleKernel {
///     fn name(&self) -> &str { "double" }
///     fn items(&self) -> usize { self.x.len() }
///     fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
///         let out = self.out.chunk_mut(chunk);
///         for (o, x) in out.iter_mut().zip(&self.x[chunk.range()]) { *o = 2 * x; }
///         Ok(())
///     }
/// }
///
/// impl Model for Double {
///     type Input = u64;
///     type Output = u64;
///     type Kernel = DoubleKernel;
///     fn build(&self, x: Vec<u64>) -> Result<DoubleKernel, KernelError> {
///         let out = DisjointBuf::new(x.len(), 1);
///         Ok(DoubleKernel { x, out })
///     }
///     fn outputs(&self, k: DoubleKernel) -> Result<Vec<u64>, KernelError> {
///         Ok(k.out.into_vec())
///     }
///     fn check_input(&self, x: &u64) -> Result<(), String> {
///         if *x < 1 << 52 { Ok(()) } else { Err(format!("{x} is 2^52 or more")) }
///     }
/// }
///
/// impl ServeModel for Double {
///     fn describe_input(&self) -> String {
///         "a whole number below 2^52".into()
///     }
/// }
/// ```
///
/// The service calls [`Model::check_input`] on every input before any is
/// queued (one refused input refuses its request, 400 `inputs[k]: why`, and
/// queues nothing); the stream calls [`Model::check_output`] on every
/// output (a refused one refuses its request, 400 `inputs[k]: why` on
/// `/v1/infer`, and no other).
pub trait ServeModel: Model<Input: DeserializeOwned, Output: Serialize> {
    /// One input as JSON, for the 400s' "expected …" (for an MLP of 64
    /// features, `[64 numbers]`).
    fn describe_input(&self) -> String {
        "input".into()
    }

    /// `n` inputs that [`Service::warm_up`](super::Service::warm_up) runs
    /// on each device class before serving, the costliest the model takes
    /// among them (so the largest buffers are allocated before the first
    /// request). Default: none, and no warm-up.
    fn warm_up_inputs(&self, n: usize) -> Vec<Self::Input> {
        let _ = n;
        Vec::new()
    }
}

/// An input is a row of the model's input width (checked by its
/// [`Model::check_input`]); an output whose probabilities are not all
/// finite (its [`Model::check_output`]) comes from an input so large that
/// the model's arithmetic overflowed, and is refused rather than answered
/// with `null`s.
#[cfg(feature = "workloads")]
impl ServeModel for MlpModel {
    fn describe_input(&self) -> String {
        format!("[{} numbers]", self.weights().inputs())
    }

    /// Rows of zeros: every input costs the same.
    fn warm_up_inputs(&self, n: usize) -> Vec<Vec<f32>> {
        vec![vec![0.0; self.weights().inputs()]; n]
    }
}
