use coexec_actors::ActorError;
use coexec_kernels::KernelError;

/// Errors a coexec user meets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the scheduler: a bad device spec, an unknown policy, a job that
    /// failed, a shutdown.
    #[error(transparent)]
    Actor(#[from] ActorError),
    /// From a kernel or its inputs.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A request to a [`Stream`](crate::stream::Stream) got no output
    /// (so `?` works on `infer` in a function returning this error).
    #[error(transparent)]
    Stream(#[from] crate::stream::StreamError),
    /// An invalid builder setting.
    #[error("invalid setting {what}: {why}")]
    Config {
        /// The setting.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// A bug in coexec: an invariant of the runtime did not hold. Please
    /// report it.
    #[error("internal error (a bug in coexec): {0}")]
    Internal(String),
    /// The Prometheus exporter could not start.
    #[error("metrics exporter: {0}")]
    Metrics(String),
    /// The metrics address could not be bound (in use, not allowed).
    #[error("metrics address {addr}: {source}")]
    MetricsBind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A service address could not be bound (in use, not allowed).
    #[error("address {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing an output file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
