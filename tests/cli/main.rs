//! The tests that run the command-line binaries (`CARGO_BIN_EXE_*` exists
//! only for a package's own binaries), one test binary. The exporter's test
//! installs the process's metrics recorder and is a binary of its own.

mod common;
mod server;

mod cli;
mod compare_servers;
mod embed_hostile;
mod embed_model;
mod embed_pipeline;
mod hardening;
mod load_generator;
mod merge;
mod profile_sharing;
mod serve;
