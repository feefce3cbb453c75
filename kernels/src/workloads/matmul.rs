//! matmul: a batch of independent `dim × dim` f32 matrix products `Cᵢ = Aᵢ·Bᵢ`.
//!
//! Item `i` is one whole product. Matrices are row-major and stored back to
//! back: `A[i][r][c]` is at `i·dim² + r·dim + c` (likewise `B`, `C`).
//!
//! # Operation order (a GPU twin reproduces it bit for bit)
//!
//! Every output element is one f32 accumulator chain, starting at `+0.0` and
//! adding the products in increasing `k`, each product rounded to f32 before
//! the add (no fused multiply-add; Rust never contracts, and a CUDA twin must be
//! compiled with `--fmad=false` or use `__fmul_rn`/`__fadd_rn`):
//!
//! ```text
//! C[r][c] = (((0 + A[r][0]·B[0][c]) + A[r][1]·B[1][c]) + …) + A[r][dim−1]·B[dim−1][c]
//! ```
//!
//! The CPU loop nest is i-k-j (for each row `r`, for each `k`, the whole row
//! `C[r][·] += A[r][k]·B[k][·]`), which walks `B` and `C` by rows and lets the
//! compiler vectorise the inner loop over `c` without reassociating anything.
//!
//! # Inputs
//!
//! Deterministic from a seed: element `e` (flat index within all of `A`, resp.
//! `B`) is `sym_unit(splitmix64(seed ^ (tag << 56) ^ e))` with `tag` 1 for `A`
//! and 2 for `B`, where `sym_unit(z) = (z >> 40)·2⁻²³ − 1` ∈ `[-1, 1)`, exact in f32.
//! Each element depends on its index alone, so they are filled on every core
//! (`rng::par_by_index`), bit-identical to a one-thread fill.

use serde::Serialize;

use super::rng::{par_by_index, stream, sym_unit_f32};
use super::{Workload, check_bytes, check_chunk};
use crate::buf::HostBuf;
use crate::{Chunk, DisjointBuf, Kernel, KernelError};

/// The size of a matmul batch: `count` products of `dim × dim` matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MatmulProblem {
    count: usize,
    dim: usize,
    seed: u64,
}

impl MatmulProblem {
    /// The paper's matrix size.
    pub const DEFAULT_DIM: usize = 100;
    /// The default input seed.
    pub const DEFAULT_SEED: u64 = 0x6d61_746d_756c;

    /// `count` products of `dim × dim` matrices. Refuses zero sizes and
    /// batches whose three matrices per product exceed 64 GiB.
    pub fn new(count: usize, dim: usize) -> Result<Self, KernelError> {
        check_bytes("matmul size", &[count, dim, dim, 3], 4)?;
        Ok(Self {
            count,
            dim,
            seed: Self::DEFAULT_SEED,
        })
    }

    /// The same problem with inputs from `seed`.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// Number of products (items).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Matrix dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Input seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Floating-point operations of the whole batch (`2·dim³` per product).
    pub fn flops(&self) -> f64 {
        2.0 * (self.dim as f64).powi(3) * self.count as f64
    }
}

/// The matmul kernel: item `i` computes `C[i] = A[i]·B[i]`.
#[derive(Debug)]
pub struct Matmul {
    problem: MatmulProblem,
    a: HostBuf<f32>,
    b: HostBuf<f32>,
    c: DisjointBuf<f32>,
}

impl Matmul {
    /// Generates the inputs of `problem` (see the module docs) and a zeroed output.
    pub fn new(problem: MatmulProblem) -> Result<Self, KernelError> {
        let n = problem.count * problem.dim * problem.dim;
        let generate = |tag: u64| -> Result<HostBuf<f32>, KernelError> {
            par_by_index("matmul inputs", n, |e| {
                sym_unit_f32(stream(problem.seed, tag, e))
            })
            .map(HostBuf::from)
        };
        let (a, b) = (generate(1)?, generate(2)?);
        // Zeroed on every core too (a one-thread memset of the output costs
        // as much as generating an input did).
        let c = DisjointBuf::from_vec(
            par_by_index("matmul output", n, |_| 0.0f32)?,
            problem.dim * problem.dim,
        );
        Ok(Self { problem, a, b, c })
    }

    /// The problem size.
    pub fn problem(&self) -> &MatmulProblem {
        &self.problem
    }

    /// All `A` matrices, back to back.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn a(&self) -> &HostBuf<f32> {
        &self.a
    }

    /// All `B` matrices, back to back.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn b(&self) -> &HostBuf<f32> {
        &self.b
    }

    /// The output, item stride `dim²`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // read by the CUDA twin
    pub(crate) fn c(&self) -> &DisjointBuf<f32> {
        &self.c
    }

    /// The products, once the run is over.
    pub fn into_output(self) -> Vec<f32> {
        self.c.into_vec()
    }
}

/// `c = a·b` for one `dim × dim` product, in the documented order.
#[inline]
fn product(a: &[f32], b: &[f32], c: &mut [f32], dim: usize) {
    for (a_row, c_row) in a.chunks_exact(dim).zip(c.chunks_exact_mut(dim)) {
        c_row.fill(0.0);
        for (&a_rk, b_row) in a_row.iter().zip(b.chunks_exact(dim)) {
            for (cv, &bv) in c_row.iter_mut().zip(b_row) {
                *cv += a_rk * bv;
            }
        }
    }
}

impl Kernel for Matmul {
    fn cuda(&self) -> Option<&dyn crate::cuda::CudaKernel> {
        Some(self)
    }

    fn name(&self) -> &str {
        "matmul"
    }

    fn items(&self) -> usize {
        self.problem.count
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        check_chunk(chunk, self.items(), 1)?;
        let d2 = self.problem.dim * self.problem.dim;
        let out = self.c.chunk_mut(chunk);
        let a = &self.a[chunk.lo() * d2..chunk.hi() * d2];
        let b = &self.b[chunk.lo() * d2..chunk.hi() * d2];
        for ((a, b), c) in a
            .chunks_exact(d2)
            .zip(b.chunks_exact(d2))
            .zip(out.chunks_exact_mut(d2))
        {
            product(a, b, c, self.problem.dim);
        }
        Ok(())
    }
}

/// The products of a batch.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct MatmulResult {
    /// The problem.
    pub problem: MatmulProblem,
    /// All `C` matrices, back to back, row-major.
    #[serde(skip)]
    pub c: Vec<f32>,
}

impl MatmulResult {
    /// A checksum of the products: the f64 sum of every element.
    pub fn checksum(&self) -> f64 {
        self.c.iter().map(|&x| x as f64).sum()
    }
}

/// matmul as a one-step [`Workload`].
#[derive(Debug)]
pub struct MatmulJob {
    problem: MatmulProblem,
    pending: Option<Matmul>,
    done: Option<Matmul>,
}

impl MatmulJob {
    /// A job over `problem`; generates its inputs now.
    pub fn new(problem: MatmulProblem) -> Result<Self, KernelError> {
        Ok(Self {
            problem,
            pending: Some(Matmul::new(problem)?),
            done: None,
        })
    }
}

impl Workload for MatmulJob {
    type Step = Matmul;
    type Output = MatmulResult;

    fn next_step(&mut self) -> Result<Option<Matmul>, KernelError> {
        Ok(self.pending.take())
    }

    fn absorb(&mut self, step: Matmul) -> Result<(), KernelError> {
        if self.done.is_some() || step.problem != self.problem {
            return Err(KernelError::invalid("matmul step", "not this job's step"));
        }
        self.done = Some(step);
        Ok(())
    }

    fn finish(self) -> MatmulResult {
        let c = self
            .done
            .or(self.pending)
            .map(Matmul::into_output)
            .unwrap_or_default();
        MatmulResult {
            problem: self.problem,
            c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::run_sequential;
    use super::super::testutil::{run_workload_split, splits};
    use super::*;
    use proptest::prelude::*;

    /// The textbook triple loop in f64.
    fn reference(a: &[f32], b: &[f32], dim: usize) -> Vec<f64> {
        let mut c = vec![0.0f64; dim * dim];
        for r in 0..dim {
            for col in 0..dim {
                let mut s = 0.0f64;
                for k in 0..dim {
                    s += a[r * dim + k] as f64 * b[k * dim + col] as f64;
                }
                c[r * dim + col] = s;
            }
        }
        c
    }

    #[test]
    fn matches_f64_reference() {
        // Tolerance: a dim-term f32 dot product of values in [-1, 1) errs by at
        // most ~dim·2⁻²⁴·Σ|aₖbₖ| ≤ dim²·6e-8; 1e-4 absolute covers dim 17 with margin.
        let p = MatmulProblem::new(3, 17).unwrap().with_seed(5);
        let k = Matmul::new(p).unwrap();
        let (a, b) = (k.a().to_vec(), k.b().to_vec());
        let out = run_sequential(MatmulJob {
            problem: p,
            pending: Some(k),
            done: None,
        })
        .unwrap();
        for i in 0..3 {
            let r = reference(&a[i * 289..(i + 1) * 289], &b[i * 289..(i + 1) * 289], 17);
            for (x, y) in out.c[i * 289..(i + 1) * 289].iter().zip(&r) {
                assert!((*x as f64 - y).abs() < 1e-4, "{x} vs {y}");
            }
        }
    }

    #[test]
    fn exact_order_is_the_documented_chain() {
        let p = MatmulProblem::new(1, 9).unwrap();
        let mut k = Matmul::new(p).unwrap();
        crate::with_chunk(&mut k, 0..1, |k, c| k.run_cpu(c)).unwrap();
        let (a, b) = (k.a().to_vec(), k.b().to_vec());
        let c = k.into_output();
        for r in 0..9 {
            for col in 0..9 {
                let mut s = 0.0f32;
                for kk in 0..9 {
                    s += a[r * 9 + kk] * b[kk * 9 + col];
                }
                assert_eq!(s.to_bits(), c[r * 9 + col].to_bits());
            }
        }
    }

    #[test]
    fn parallel_inputs_equal_the_one_thread_loop() {
        for (count, dim, seed) in [
            (1, 1, 0),
            (3, 17, 5),
            (70, 100, MatmulProblem::DEFAULT_SEED),
        ] {
            let p = MatmulProblem::new(count, dim).unwrap().with_seed(seed);
            let k = Matmul::new(p).unwrap();
            for (tag, got) in [(1, k.a()), (2, k.b())] {
                // The reference: the one-thread loop this crate used before.
                let want: Vec<f32> = (0..(count * dim * dim) as u64)
                    .map(|e| sym_unit_f32(stream(seed, tag, e)))
                    .collect();
                assert_eq!(want.len(), got.len());
                assert!(
                    want.iter()
                        .zip(got.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                );
            }
        }
    }

    #[test]
    fn refuses_bad_sizes() {
        assert!(MatmulProblem::new(0, 100).is_err());
        assert!(MatmulProblem::new(10, 0).is_err());
        assert!(MatmulProblem::new(usize::MAX / 2, 100).is_err());
        assert!(MatmulProblem::new(1 << 20, 1000).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn any_split_is_bit_identical((cuts, seed) in splits(12)) {
            let p = MatmulProblem::new(37, 12).unwrap();
            let whole = run_sequential(MatmulJob::new(p).unwrap()).unwrap();
            let split = run_workload_split(MatmulJob::new(p).unwrap(), &cuts, seed).unwrap();
            prop_assert!(whole.c.iter().zip(&split.c).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}
