//! The kmeans loop as a workload: runs steps until few points move.

use std::sync::Arc;

use serde::Serialize;

use super::super::{Workload, check_bytes, try_zeroed};
use super::step::LANES;
use super::{KmeansConfig, KmeansData, KmeansStep};
use crate::{DisjointBuf, KernelError};

/// The outcome of a kmeans job.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct KmeansResult {
    /// `K`.
    pub clusters: usize,
    /// Features per point.
    pub features: usize,
    /// Final centres, `K × F` row-major.
    pub centres: Vec<f32>,
    /// Iterations run (1 ..= `max_loops + 1`).
    pub iterations: usize,
    /// Points that changed cluster in the last iteration.
    pub last_delta: u64,
    /// Cluster of each point (−1 only if no iteration ran).
    #[serde(skip)]
    pub membership: Vec<i32>,
}

impl KmeansResult {
    /// Centre `k`'s features.
    pub fn centre(&self, k: usize) -> &[f32] {
        &self.centres[k * self.features..(k + 1) * self.features]
    }
}

/// A step's buffers between runs: membership, block sums, counts, changes.
type Buffers = (
    DisjointBuf<i32>,
    DisjointBuf<f32>,
    DisjointBuf<u32>,
    DisjointBuf<u32>,
);

/// kmeans as a [`Workload`]: one run per iteration; the host step combines
/// the blocks' partial sums (module docs) into the next centres.
#[derive(Debug)]
pub struct KmeansJob {
    pub(super) data: Arc<KmeansData>,
    pub(super) config: KmeansConfig,
    pub(super) centres: Vec<f32>,
    pub(super) iterations: usize,
    pub(super) loops: usize,
    pub(super) last_delta: u64,
    pub(super) done: bool,
    pub(super) bufs: Option<Buffers>,
}

impl KmeansJob {
    /// A job clustering `data` with `config`. Refuses `K` larger than the number
    /// of points (an input error naming the file when the data came from one).
    pub fn new(
        data: impl Into<Arc<KmeansData>>,
        config: KmeansConfig,
    ) -> Result<Self, KernelError> {
        let data: Arc<KmeansData> = data.into();
        let config = config.validated()?;
        let (n, f, k) = (data.points, data.features, config.clusters);
        if k > n {
            let why = format!("{k} clusters but only {n} points");
            return Err(match &data.source {
                Some(p) => KernelError::Input {
                    path: p.clone(),
                    line: 0,
                    why,
                },
                None => KernelError::invalid("kmeans clusters", why),
            });
        }
        let blocks = n.div_ceil(config.block);
        check_bytes("kmeans partial sums", &[blocks, k, f], 4)?;
        let centres = data.values[..k * f].to_vec();
        let mut member = try_zeroed::<i32>("kmeans membership", n)?;
        member.fill(-1);
        let bufs = (
            DisjointBuf::from_vec(member, 1),
            DisjointBuf::from_vec(try_zeroed("kmeans sums", blocks * k * f)?, k * f),
            DisjointBuf::from_vec(try_zeroed("kmeans counts", blocks * k)?, k),
            DisjointBuf::from_vec(try_zeroed("kmeans changes", blocks)?, 1),
        );
        Ok(Self {
            data,
            config,
            centres,
            iterations: 0,
            loops: 0,
            last_delta: 0,
            done: false,
            bufs: Some(bufs),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &KmeansConfig {
        &self.config
    }
}

impl Workload for KmeansJob {
    type Step = KmeansStep;
    type Output = KmeansResult;

    fn next_step(&mut self) -> Result<Option<KmeansStep>, KernelError> {
        if self.done {
            return Ok(None);
        }
        let Some((membership, sums, counts, changed)) = self.bufs.take() else {
            return Err(KernelError::invalid(
                "kmeans step",
                "the previous step was not absorbed",
            ));
        };
        let (k, f) = (self.config.clusters, self.data.features);
        let groups = k.div_ceil(LANES);
        let mut centres_t = vec![0.0f32; groups * f * LANES];
        for c in 0..k {
            for j in 0..f {
                centres_t[(c / LANES * f + j) * LANES + c % LANES] = self.centres[c * f + j];
            }
        }
        Ok(Some(KmeansStep {
            id: crate::claim::next_id(),
            data: self.data.clone(),
            clusters: k,
            block: self.config.block,
            centres: self.centres.clone(),
            centres_t,
            membership,
            sums,
            counts,
            changed,
        }))
    }

    fn absorb(&mut self, mut step: KmeansStep) -> Result<(), KernelError> {
        if self.bufs.is_some() || self.done || !Arc::ptr_eq(&step.data, &self.data) {
            return Err(KernelError::invalid(
                "kmeans step",
                "not this job's current step",
            ));
        }
        let (k, f) = (self.config.clusters, self.data.features);
        let sums = step.sums.as_slice();
        let counts = step.counts.as_slice();
        for c in 0..k {
            let count: u64 = counts.chunks_exact(k).map(|b| u64::from(b[c])).sum();
            if count == 0 {
                continue;
            }
            for j in 0..f {
                let mut total = 0.0f32;
                for b in sums.chunks_exact(k * f) {
                    total += b[c * f + j];
                }
                self.centres[c * f + j] = total / count as f32;
            }
        }
        let delta: u64 = step.changed.as_slice().iter().map(|&d| u64::from(d)).sum();
        self.iterations += 1;
        self.last_delta = delta;
        // Rodinia: while (delta > threshold && loop++ < 500)
        if (delta as f32) > self.config.threshold && self.loops < self.config.max_loops {
            self.loops += 1;
        } else {
            self.done = true;
        }
        self.bufs = Some((step.membership, step.sums, step.counts, step.changed));
        Ok(())
    }

    fn finish(self) -> KmeansResult {
        let membership = self.bufs.map(|b| b.0.into_vec()).unwrap_or_default();
        KmeansResult {
            clusters: self.config.clusters,
            features: self.data.features,
            centres: self.centres,
            iterations: self.iterations,
            last_delta: self.last_delta,
            membership,
        }
    }
}
