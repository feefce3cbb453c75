//! One kmeans iteration as a kernel: assign each point, sum per block.

use std::sync::Arc;

use serde::Serialize;

use super::super::check_chunk;
use super::KmeansData;
use crate::{Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin};

/// The twin's source: one iteration over whole reduction blocks, the CPU's
/// operations in the CPU's order.
const KMEANS_CU: CudaSource = CudaSource::new("kmeans.cu", include_str!("../../cu/kmeans.cu"));

/// kmeans parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub struct KmeansConfig {
    /// Number of clusters `K`.
    pub clusters: usize,
    /// The loop goes on while more than this many points changed.
    pub threshold: f32,
    /// Rodinia's `500`: at most `max_loops + 1` iterations.
    pub max_loops: usize,
    /// Points per reduction block (the kernel's grain).
    pub block: usize,
}

impl Default for KmeansConfig {
    /// Rodinia's `-k 5 -t 0.001`, blocks of 1024 points.
    fn default() -> Self {
        Self {
            clusters: 5,
            threshold: 0.001,
            max_loops: 500,
            block: 1024,
        }
    }
}

impl KmeansConfig {
    /// `clusters` clusters and Rodinia's `threshold`, other fields default.
    pub fn new(clusters: usize, threshold: f32) -> Result<Self, KernelError> {
        Self {
            clusters,
            threshold,
            ..Self::default()
        }
        .validated()
    }

    /// The same configuration with blocks of `block` points.
    pub fn with_block(self, block: usize) -> Result<Self, KernelError> {
        Self { block, ..self }.validated()
    }

    /// Checks the fields: positive clusters and block, a threshold that is a number.
    pub fn validated(self) -> Result<Self, KernelError> {
        if self.clusters == 0 {
            return Err(KernelError::invalid(
                "kmeans clusters",
                "must be at least 1",
            ));
        }
        if self.block == 0 {
            return Err(KernelError::invalid("kmeans block", "must be at least 1"));
        }
        if self.threshold.is_nan() || self.threshold < 0.0 {
            return Err(KernelError::invalid(
                "kmeans threshold",
                format!("{} is not a fraction of points at least 0", self.threshold),
            ));
        }
        Ok(self)
    }
}

/// One kmeans iteration over all points.
#[derive(Debug)]
// `centres` and the accessors are what a GPU twin reads.
#[allow(dead_code)]
pub struct KmeansStep {
    /// Unique in the process: names this step's centres, which never
    /// change while it lives, on a GPU.
    pub(super) id: u64,
    pub(super) data: Arc<KmeansData>,
    pub(super) clusters: usize,
    pub(super) block: usize,
    pub(super) centres: Vec<f32>,
    /// Centres as groups of [`LANES`] clusters, `[group][feature][lane]`.
    pub(super) centres_t: Vec<f32>,
    pub(super) membership: DisjointBuf<i32>,
    pub(super) sums: DisjointBuf<f32>,
    pub(super) counts: DisjointBuf<u32>,
    pub(super) changed: DisjointBuf<u32>,
}

/// Clusters whose distances one pass over a point's features computes.
pub(super) const LANES: usize = 8;

impl KmeansStep {
    /// This step's process-unique id.
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The points.
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn data(&self) -> &Arc<KmeansData> {
        &self.data
    }

    /// This iteration's centres, `K × F` row-major.
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn centres(&self) -> &[f32] {
        &self.centres
    }

    /// The nearest centre of `x` (module docs).
    #[inline]
    fn nearest(&self, x: &[f32]) -> usize {
        let f = x.len();
        let (mut best, mut idx) = (f32::MAX, 0usize);
        for (g, ct) in self.centres_t.chunks_exact(f * LANES).enumerate() {
            let mut acc = [0.0f32; LANES];
            for (&xf, c) in x.iter().zip(ct.chunks_exact(LANES)) {
                for (a, &c) in acc.iter_mut().zip(c) {
                    let d = xf - c;
                    *a += d * d;
                }
            }
            let live = LANES.min(self.clusters - g * LANES);
            for (l, &d) in acc[..live].iter().enumerate() {
                if d < best {
                    best = d;
                    idx = g * LANES + l;
                }
            }
        }
        idx
    }
}

/// The GPU twin, declared: the data set's points (keyed by the data set,
/// so they cross the bus once per job and device) and this step's centres
/// as run inputs, the chunk's memberships read and rewritten in place, and
/// per reduction block its partial sums, counts and changed points; one
/// CUDA block of 256 threads per reduction block.
impl GpuTwin for KmeansStep {
    fn twin(&self) -> Twin<'_> {
        let d = &self.data;
        Twin::new(&KMEANS_CU, "kmeans")
            .block_per_grain(256)
            .run_slice(d.id(), d.values())
            .run_slice(self.id, &self.centres)
            .in_out(&self.membership)
            .block_output(&self.sums)
            .block_output(&self.counts)
            .block_output(&self.changed)
            .scalar(u32::try_from(self.clusters).unwrap_or(u32::MAX))
            .scalar(u32::try_from(d.features()).unwrap_or(u32::MAX))
            .scalar(u32::try_from(self.block).unwrap_or(u32::MAX))
    }
}

impl Kernel for KmeansStep {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "kmeans"
    }

    fn items(&self) -> usize {
        self.data.points
    }

    fn grain(&self) -> usize {
        self.block
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), self.block)?;
        if chunk.is_empty() {
            return Ok(());
        }
        let (k, f, g) = (self.clusters, self.data.features, self.block);
        // This chunk's points, and the blocks they fill (chunks are
        // block-aligned, so no other chunk shares a block).
        let (member, sums, counts, changed) = (
            self.membership.chunk_mut(chunk),
            self.sums.chunk_mut_blocks(chunk, g),
            self.counts.chunk_mut_blocks(chunk, g),
            self.changed.chunk_mut_blocks(chunk, g),
        );
        let pts = &self.data.values[chunk.lo() * f..chunk.hi() * f];
        let per_block = member.chunks_mut(g).zip(pts.chunks(g * f));
        let partials = sums
            .chunks_exact_mut(k * f)
            .zip(counts.chunks_exact_mut(k))
            .zip(changed.iter_mut());
        for ((member, pts), ((sums, counts), changed)) in per_block.zip(partials) {
            sums.fill(0.0);
            counts.fill(0);
            let mut moved = 0u32;
            for (m, x) in member.iter_mut().zip(pts.chunks_exact(f)) {
                let c = self.nearest(x);
                moved += u32::from(*m != c as i32);
                *m = c as i32;
                counts[c] += 1;
                for (s, &v) in sums[c * f..(c + 1) * f].iter_mut().zip(x) {
                    *s += v;
                }
            }
            *changed = moved;
        }
        Ok(())
    }
}
