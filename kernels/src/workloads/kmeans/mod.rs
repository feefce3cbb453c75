//! kmeans (Rodinia 3.1, openmp `kmeans_clustering.c`): assign every point to
//! its nearest centre, recompute the centres, repeat.
//!
//! # Semantics (Rodinia's)
//!
//! * initial centres = the first `K` points; initial membership −1;
//! * a point goes to the centre at the least squared Euclidean distance,
//!   `d = Σ_f (x_f − c_f)²` summed in feature order from `+0.0` in f32; the
//!   centres are scanned in order with a strict `<` starting from `FLT_MAX`, so
//!   the first minimum wins (and a point whose distances are all ≥ `FLT_MAX` or
//!   NaN goes to centre 0, where Rodinia reads an uninitialised index);
//! * `delta` = points whose membership changed; the new centre is the per-cluster
//!   sum over the per-cluster count (`sum / (float)count`); an empty cluster keeps
//!   its centre;
//! * the loop is Rodinia's `do { … } while (delta > threshold && loop++ < 500)`:
//!   at most 501 iterations.
//!
//! # Steps, items and the summation order
//!
//! One run ([`KmeansStep`]) is one iteration; item = one point. The reduction
//! is split into blocks of [`KmeansConfig::block`] points ([`Kernel::grain`](crate::Kernel::grain)),
//! so chunks always cover whole blocks. For each block `b` a chunk writes
//!
//! * `sums[b][k][f]`: f32, from `+0.0`, adding `x[i][f]` for the block's points
//!   `i` with membership `k` in increasing `i`;
//! * `counts[b][k]`: u32 points per cluster; `changed[b]`: u32 changed points.
//!
//! The host step combines blocks in increasing `b`, in f32 from `+0.0`
//! (`total = ((0 + sums[0][k][f]) + sums[1][k][f]) + …`), and counts and
//! changes as integers. The result is
//! bit-identical however the points are split into chunks, and a GPU twin that
//! keeps this order matches it bit for bit.
//!
//! With one block it is exactly Rodinia's single-thread order (checked bit for
//! bit on the real inputs). Rodinia with `T` threads sums per thread, so its own
//! results change with the thread count; blocks of 1024 are also far more
//! accurate than one long f32 chain (on `kdd_cup`: 5·10⁻⁷ from the exact means
//! against Rodinia's 5·10⁻³).
//!
//! The input format is described in `kmeans/input.rs`.

mod input;
mod job;
mod step;
#[cfg(test)]
mod tests;

pub use input::KmeansData;
pub use job::{KmeansJob, KmeansResult};
pub use step::{KmeansConfig, KmeansStep};
