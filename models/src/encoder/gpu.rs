//! The encoder's GPU twin: each chunk's sequences through
//! `coexec_kernels::cuda::bert` (the device code, and every `unsafe` it
//! needs), the weights as one [`BertImage`] per process, uploaded once per
//! device.

use coexec_kernels::cuda::bert::{self, BertImage};
use coexec_kernels::cuda::{CudaKernel, StreamWorker};
use coexec_kernels::{Chunk, Kernel, KernelError, check_chunk};

use super::Encoder;

impl CudaKernel for Encoder {
    fn prepare(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        bert::prepare(w, self.weights().image()?, &self.sorted())
    }

    fn stage(&self, w: &mut StreamWorker) -> Result<(), KernelError> {
        bert::stage(w, self.weights().image()?)
    }

    fn threads_per_item(&self) -> usize {
        self.weights()
            .image()
            .map_or(1, |img| bert::threads_per_item(img.shape()))
    }

    fn run_cuda(&self, w: &mut StreamWorker, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let seqs = self.centred_in(chunk.lo(), chunk.hi());
        if seqs.is_empty() {
            return Ok(());
        }
        let img: &BertImage = self.weights().image()?;
        let ids: Vec<&[u32]> = seqs.clone().map(|j| self.seq(j)).collect();
        let mut pooled = vec![0.0; ids.len() * self.weights().hidden()];
        bert::encode(w, img, &ids, &mut pooled)?;
        self.store(seqs, &pooled);
        Ok(())
    }
}
