//! An MLP classifier (any [`Mlp`](coexec_kernels::workloads::Mlp)) as a
//! stream [`Model`].

use std::sync::Arc;

use coexec_kernels::KernelError;
use coexec_kernels::workloads::{MlpWeights, argmax};
use serde::{Deserialize, Serialize};

use super::Model;

/// One input's class: the most probable label and every class's
/// probability (as JSON, `{"label": 3, "probs": [...]}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classification {
    /// The most probable class (the first of ties).
    pub label: usize,
    /// Each class's probability, summing to 1.
    pub probs: Vec<f32>,
}

/// A ready [`Model`] for [`Mlp`](coexec_kernels::workloads::Mlp) classifiers:
/// an input is one row of features, an output its [`Classification`].
///
/// ```no_run
/// use std::sync::Arc;
/// use coexec::kernels::workloads::MlpWeights;
/// use coexec::stream::{MlpModel, Stream, StreamConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let w = Arc::new(MlpWeights::load("examples/models/digits_mlp.safetensors")?);
/// let rt = Arc::new(coexec::Runtime::builder().devices("cpu:2")?.start().await?);
/// let stream = Stream::start(rt, MlpModel::new(w), StreamConfig::new())?;
/// let class = stream.infer(vec![0.0; 64]).await?;
/// assert_eq!(class.probs.len(), 10);
/// assert!(class.label < 10);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MlpModel {
    weights: Arc<MlpWeights>,
}

impl MlpModel {
    /// Serves `weights`.
    pub fn new(weights: Arc<MlpWeights>) -> Self {
        Self { weights }
    }

    /// The weights served.
    pub fn weights(&self) -> &Arc<MlpWeights> {
        &self.weights
    }
}

impl Model for MlpModel {
    type Input = Vec<f32>;
    type Output = Classification;
    type Kernel = coexec_kernels::workloads::Mlp;

    /// Refuses (failing the batch) a row of the wrong length, which
    /// [`Model::check_input`] keeps out of the queue.
    fn build(&self, rows: Vec<Vec<f32>>) -> Result<Self::Kernel, KernelError> {
        let f = self.weights.inputs();
        if let Some(r) = rows.iter().find(|r| r.len() != f) {
            return Err(KernelError::invalid(
                "mlp input",
                format!("a row of {} features; the model takes {f}", r.len()),
            ));
        }
        coexec_kernels::workloads::Mlp::new(self.weights.clone(), rows.concat())
    }

    /// A row of exactly the model's input width, of finite `f32` (JSON
    /// numbers past ±3.4e38 read as infinite).
    fn check_input(&self, row: &Vec<f32>) -> Result<(), String> {
        let f = self.weights.inputs();
        if row.len() != f {
            return Err(format!(
                "{} numbers; the model takes {f} numbers per input",
                row.len()
            ));
        }
        match row.iter().position(|x| !x.is_finite()) {
            Some(j) => Err(format!(
                "number {j} is not finite within f32's range (±3.4e38)"
            )),
            None => Ok(()),
        }
    }

    /// Probabilities all finite: an input so large that the model's
    /// arithmetic overflowed has none, and is refused rather than
    /// answered with NaN.
    fn check_output(&self, out: &Classification) -> Result<(), String> {
        if out.probs.iter().all(|p| p.is_finite()) {
            Ok(())
        } else {
            Err("the model's output overflows for this input \
                 (its values are far outside the model's range)"
                .into())
        }
    }

    fn outputs(&self, k: Self::Kernel) -> Result<Vec<Classification>, KernelError> {
        let c = self.weights.classes();
        Ok(k.into_probs()
            .chunks_exact(c)
            .map(|p| Classification {
                label: argmax(p).unwrap_or(0),
                probs: p.to_vec(),
            })
            .collect())
    }
}
