//! The workloads' integration tests, one binary: each GPU twin against the
//! CPU (skipped without a GPU) and the rayon baseline.

mod cuda_equals_cpu;
mod rayon_baseline;
