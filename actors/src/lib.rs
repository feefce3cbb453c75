//! coexec's actors: who runs what, when.
//!
//! An implementation detail of [`coexec`](https://docs.rs/coexec): depend
//! on `coexec`, which re-exports what an application needs (the runtime,
//! device specs, policies, profiles, reports); this crate's own API may
//! change in any release.
//!
//! ```text
//!   runtime ──Submit──▶ Broker actor ──admits──▶ Registry (jobs, item spaces)
//!                          ▲                      ▲  claim / complete / finish
//!              WorkerLost  │                      │  (locks, no messages)
//!                 (flume)  └──── Worker threads: cpu:0.., sim.., cuda:0/s0..
//!                                    │ the worker that ends a job closes it:
//!                                    ├──Observe──▶ Profiler actor ──▶ profile JSON
//!                                    └──reply────▶ the submitter     (speed models)
//! ```
//!
//! The broker and the profiler are actix actors on the actor system's own
//! thread; every worker is an OS thread that pulls chunks from the registry
//! the broker owns. The scheduling logic lives in plain structs
//! (`broker::space`, `broker::job`, [`policy`], [`perfmodel`]) that the
//! actors only feed.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

pub mod bind;
mod broker;
mod device;
mod error;
pub mod metrics;
pub mod perfmodel;
pub mod policy;
pub mod profiler;
mod report;
mod system;
#[cfg(test)]
mod vtime;
mod worker;

pub use broker::registry::JobOrder;
pub use broker::{INLINE_MAX, JobOptions};
pub use device::{ClassInfo, DeviceKind, DeviceList, DeviceSpec, End, MAX_WORKERS, SIM_SPEEDS};
pub use error::ActorError;
pub use perfmodel::{Sample, SpeedModel};
pub use report::{ChunkRecord, ClassReport, Phase, ProbeReport, RunReport, imbalance};
pub use system::{
    DEFAULT_STREAMS, Engine, EngineConfig, ProfileDir, cores, gpus, resolve, worker_cap,
};
