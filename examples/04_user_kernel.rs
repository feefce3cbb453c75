//! Your own kernel, with no `unsafe`: a saxpy (`y[i] = a·x[i] + y0[i]`) and a
//! per-item norm, written through the chunk the runtime hands each worker.
//!
//! The chunk is the worker's claim on its items; `DisjointBuf::chunk_mut`
//! turns it into the outputs of exactly those items, so workers write at once
//! without locks and without any way to touch each other's outputs.

use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};

struct Saxpy {
    a: f32,
    x: Vec<f32>,
    y0: Vec<f32>,
    /// Outputs: one element per item...
    y: DisjointBuf<f32>,
    /// ...and a second buffer, taken through the same chunk.
    sq: DisjointBuf<f32>,
}

impl Kernel for Saxpy {
    fn name(&self) -> &str {
        "saxpy"
    }

    fn items(&self) -> usize {
        self.x.len()
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        let (y, sq) = (self.y.chunk_mut(chunk), self.sq.chunk_mut(chunk));
        let r = chunk.range();
        for (((y, sq), x), y0) in y
            .iter_mut()
            .zip(sq)
            .zip(&self.x[r.clone()])
            .zip(&self.y0[r])
        {
            *y = self.a * x + y0;
            *sq = *y * *y;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), coexec::Error> {
    let n = 1_000_000;
    let k = Saxpy {
        a: 2.0,
        x: (0..n).map(|i| i as f32).collect(),
        y0: vec![1.0; n],
        y: DisjointBuf::new(n, 1),
        sq: DisjointBuf::new(n, 1),
    };
    let rt = coexec::Runtime::builder()
        .devices("cpu:2,sim:1@2")?
        .in_memory_profiles()
        .start()
        .await?;
    let done = rt.run(k).await?;
    // The kernel is ours again: its outputs are read through ownership.
    let y = done.kernel.y.into_vec();
    assert!(
        y.iter()
            .enumerate()
            .all(|(i, v)| *v == 2.0 * i as f32 + 1.0)
    );
    // A saxpy over a million items is a job of a few milliseconds: too short
    // for the method's probe, static and dynamic phases to balance well on a
    // cold profile, so the split and the imbalance printed here vary from
    // run to run (docs/limits.md). A job of a second or more balances;
    // so do later runs of the same kernel on a stored profile.
    println!("{}", done.report.summary());
    rt.shutdown().await;
    Ok(())
}
