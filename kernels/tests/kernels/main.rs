//! The workloads' integration tests, one binary: each GPU twin against the
//! CPU (ignored unless asked for: they need a GPU) and the rayon baseline.

mod cuda_equals_cpu;
mod rayon_baseline;
