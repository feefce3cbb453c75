//! The runtime's integration tests, one binary (one link) for all but the
//! few that change process-wide state (the environment, the panic hook, the
//! metrics recorder): those are binaries of their own, beside this one.

mod broker_exactly_once;
mod cancel;
mod gpu_twin;
#[cfg(feature = "workloads")]
mod in_tokio;
mod inline;
#[cfg(feature = "workloads")]
mod mlp_accuracy;
mod split_learning;
#[cfg(feature = "workloads")]
mod stream_exactly_once;
mod trace_file;
mod zero_items;
