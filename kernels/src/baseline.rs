//! The rayon baseline: the same workloads, the same `run_cpu` kernel code,
//! driven by a plain rayon pool — "the careful rayon version of the same
//! computation" that coexec is measured against.
//!
//! The coexec CLI (`bench`'s rayon column) and the kernels' tests import it
//! from here like any module.
//!
//! Chunking: each step's items are cut into [`CHUNKS_PER_THREAD`] chunks per
//! pool thread, each a whole number of [`Kernel::grain`] blocks, and rayon's
//! work stealing hands them out. Few large chunks keep per-chunk costs (a
//! pathfinder chunk's ghost columns, the loop setup) negligible; four per
//! thread leave room to even out a thread that falls behind.

use crate::workloads::Workload;
use crate::{Kernel, KernelError, claim_parts};
use rayon::prelude::*;

/// Chunks per pool thread in each step.
pub const CHUNKS_PER_THREAD: usize = 4;

/// Runs `w` to completion on `pool`: each step's items in parallel over
/// grain-aligned chunks, the host steps on the calling thread.
pub fn run_rayon<W: Workload>(
    pool: &rayon::ThreadPool,
    mut w: W,
) -> Result<W::Output, KernelError> {
    while let Some(mut step) = w.next_step()? {
        run_step_rayon(pool, &mut step)?;
        w.absorb(step)?;
    }
    Ok(w.finish())
}

/// Computes every item of `kernel` once on `pool` (see the module docs for the
/// chunking); the first error stops the run and is returned.
pub fn run_step_rayon<K: Kernel>(
    pool: &rayon::ThreadPool,
    kernel: &mut K,
) -> Result<(), KernelError> {
    let n = kernel.items();
    if n == 0 {
        return Ok(());
    }
    let grain = kernel.grain().max(1);
    let blocks = n.div_ceil(grain);
    let per_chunk = blocks
        .div_ceil(pool.current_num_threads().max(1) * CHUNKS_PER_THREAD)
        .max(1)
        * grain;
    let chunks = n.div_ceil(per_chunk);
    let cuts: Vec<usize> = (0..=chunks).map(|c| (c * per_chunk).min(n)).collect();
    let (kernel, parts) = claim_parts(kernel, &cuts);
    pool.install(|| {
        parts
            .into_par_iter()
            .with_max_len(1)
            .try_for_each(|c| kernel.run_cpu(&c))
    })
}
