//! What a stream serves: the [`Model`] trait, and the check of an input at
//! admission.

use std::sync::Arc;

use coexec_kernels::{Kernel, KernelError, Workload};

use super::StreamError;
use crate::{Error, JobOptions, Runtime};

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
/// [`Model::check_input`] does that. An output with no meaningful answer (a
/// vector of NaN) is refused on its own too, after the batch:
/// [`Model::check_output`].
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

    /// Refuses an output that has no meaningful answer, saying why (values
    /// that overflowed to NaN or infinity): that request alone gets
    /// [`StreamError::Output`], the requests of its batch their outputs.
    /// Called on each output as its batch ends, off the executor with
    /// [`Model::outputs`] when that is slow; keep it cheap. A panic in it
    /// is [`StreamError::Failed`] for that request. Default: every output
    /// is answered.
    fn check_output(&self, output: &Self::Output) -> Result<(), String> {
        let _ = output;
        Ok(())
    }

    /// The batch's kernel cut into phases that every CPU worker shares, for
    /// a batch too small to keep `workers` CPU workers busy as one job (a
    /// single long sentence): the stream runs it so, phase after phase
    /// ([`Runtime::drive`](crate::Runtime::drive)), where the batch has
    /// fewer inputs than the CPU class has workers and only CPU classes
    /// may run it (an accelerator's batch is never cut). `Err(kernel)`
    /// (the default): the batch runs as one job. Called on the batch's
    /// task: keep it cheap.
    fn phased(
        &self,
        kernel: Self::Kernel,
        workers: usize,
    ) -> Result<Phased<Self::Kernel>, Self::Kernel> {
        let _ = workers;
        Err(kernel)
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

    fn check_output(&self, output: &Self::Output) -> Result<(), String> {
        (**self).check_output(output)
    }

    fn cost(&self, input: &Self::Input) -> usize {
        (**self).cost(input)
    }

    fn phased(
        &self,
        kernel: Self::Kernel,
        workers: usize,
    ) -> Result<Phased<Self::Kernel>, Self::Kernel> {
        (**self).phased(kernel, workers)
    }
}

/// A batch's work as a [`Workload`] of phases, whose output is the batch's
/// kernel with every output computed ([`Model::phased`]).
pub struct Phased<K> {
    run: RunPhases<K>,
}

/// Runs the phases on a runtime under the batch's options.
type RunPhases<K> = Box<dyn for<'a> FnOnce(&'a Runtime, JobOptions) -> PhasesRun<'a, K> + Send>;

type PhasesRun<'a, K> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(K, usize), Error>> + Send + 'a>>;

impl<K: Send + 'static> Phased<K> {
    /// The phases of `w`, whose output is the kernel back.
    pub fn new<W: Workload<Output = K> + 'static>(w: W) -> Self {
        Self {
            run: Box::new(move |rt: &Runtime, opts: JobOptions| -> PhasesRun<'_, K> {
                Box::pin(async move {
                    let (k, reports) = rt.drive(w, opts).await?;
                    Ok((k, reports.len()))
                })
            }),
        }
    }

    /// A batch that cannot run (the model found out while cutting it):
    /// its requests fail with `err` ([`StreamError::Failed`]).
    pub fn failed(err: KernelError) -> Self {
        Self {
            run: Box::new(move |_: &Runtime, _: JobOptions| -> PhasesRun<'_, K> {
                Box::pin(async move { Err(Error::Kernel(err)) })
            }),
        }
    }

    /// Runs every phase; the kernel and how many jobs it took.
    pub(super) async fn run(self, rt: &Runtime, opts: JobOptions) -> Result<(K, usize), Error> {
        (self.run)(rt, opts).await
    }
}

impl<K> std::fmt::Debug for Phased<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phased").finish_non_exhaustive()
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

/// `model.check_output(output)`: the output, or why its request gets none
/// ([`StreamError::Output`]; [`StreamError::Failed`] for a panic in it).
pub(super) fn checked_output<M: Model + ?Sized>(
    model: &M,
    output: M::Output,
) -> Result<M::Output, StreamError> {
    match KernelError::catch(|| Ok(model.check_output(&output))) {
        Ok(Ok(())) => Ok(output),
        Ok(Err(why)) => Err(StreamError::Output { why }),
        Err(e) => Err(StreamError::Failed(Arc::new(Error::Kernel(e)))),
    }
}

/// Inputs each of which passed the model's [`Model::check_input`]
/// ([`Stream::check`](super::Stream::check)), for [`Stream::try_infer_checked`](super::Stream::try_infer_checked).
#[derive(Debug)]
pub struct Checked<I>(pub(super) Vec<I>);

impl<I> Checked<I> {
    /// Inputs checked.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The inputs back.
    pub fn into_inner(self) -> Vec<I> {
        self.0
    }
}
