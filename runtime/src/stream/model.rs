//! What a stream serves: the [`Model`] trait, and the check of an input at
//! admission.

use std::sync::Arc;

use coexec_kernels::{Kernel, KernelError};

use super::StreamError;
use crate::Error;

/// How to serve a model over coexec: one kernel per batch of inputs.
///
/// `build` gets the inputs of a batch in arrival order; `outputs` must give
/// back exactly one output per input, in the same order (a batch whose
/// `outputs` has another length fails as a whole, so no caller ever receives
/// another's output).
///
/// An error or a panic in either fails its batch alone
/// ([`StreamError::Failed`]); the stream goes on, and calls the same model
/// for the next batches. A model with state of its own (a cache, a `Mutex`)
/// must leave it usable when it panics.
///
/// An input the model cannot take is better refused on its own, before it
/// is queued, than by `build`, which fails every request batched with it:
/// [`Model::check_input`] does that.
pub trait Model: Send + Sync + 'static {
    /// One request's input.
    type Input: Send + 'static;
    /// One request's output.
    type Output: Send + 'static;
    /// The kernel that computes a batch.
    type Kernel: Kernel;
    /// The kernel for a batch of inputs.
    fn build(&self, inputs: Vec<Self::Input>) -> Result<Self::Kernel, KernelError>;
    /// The outputs of a finished kernel, one per input, in order.
    fn outputs(&self, kernel: Self::Kernel) -> Result<Vec<Self::Output>, KernelError>;

    /// Refuses an input the model cannot take, saying why: the request
    /// gets [`StreamError::Invalid`] and is not queued, and the requests
    /// that would have shared its batch are untouched. Called on the
    /// caller's task at admission, so keep it cheap (a length, a range).
    /// A panic in it is [`StreamError::Failed`]. Default: every input is
    /// taken.
    fn check_input(&self, input: &Self::Input) -> Result<(), String> {
        let _ = input;
        Ok(())
    }

    /// What an input weighs against [`StreamConfig::max_batch_cost`](super::StreamConfig::max_batch_cost)
    /// (a text's tokens, for an encoder). Called by the batcher on each
    /// input as it joins a batch: keep it cheap. Default: 1.
    fn cost(&self, input: &Self::Input) -> usize {
        let _ = input;
        1
    }
}

/// A shared model is a model: a caller that keeps an `Arc` of its own
/// (to read the model's settings, as the HTTP service does) starts the
/// stream with a clone.
impl<M: Model + ?Sized> Model for Arc<M> {
    type Input = M::Input;
    type Output = M::Output;
    type Kernel = M::Kernel;

    fn build(&self, inputs: Vec<Self::Input>) -> Result<Self::Kernel, KernelError> {
        (**self).build(inputs)
    }

    fn outputs(&self, kernel: Self::Kernel) -> Result<Vec<Self::Output>, KernelError> {
        (**self).outputs(kernel)
    }

    fn check_input(&self, input: &Self::Input) -> Result<(), String> {
        (**self).check_input(input)
    }

    fn cost(&self, input: &Self::Input) -> usize {
        (**self).cost(input)
    }
}

/// `model.check_input(input)` for the input at `index`, a panic in it
/// becoming [`StreamError::Failed`].
pub(crate) fn check_input<M: Model + ?Sized>(
    model: &M,
    input: &M::Input,
    index: usize,
) -> Result<(), StreamError> {
    match KernelError::catch(|| Ok(model.check_input(input))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) => Err(StreamError::Invalid { index, why }),
        Err(e) => Err(StreamError::Failed(Arc::new(Error::Kernel(e)))),
    }
}
