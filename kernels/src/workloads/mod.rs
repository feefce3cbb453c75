//! The workloads: scheduler test kernels and the method's four benchmarks.

mod synthetic;

pub use synthetic::{busy_ns_per_round, Empty, Synthetic};
