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

/// What kind of failure an [`Error`] is, whichever layer it came from:
/// one `match` for a caller deciding what to do (retry, report the input,
/// fix the setting, give up).
///
/// ```
/// use coexec::kernels::{Chunk, Kernel, KernelError};
/// use coexec::ErrorKind;
///
/// #[derive(Debug)]
/// struct Broken;
/// impl Kernel for Broken {
///     fn name(&self) -> &str { "broken" }
///     fn items(&self) -> usize { 10 }
///     fn run_cpu(&self, _: &Chunk) -> Result<(), KernelError> {
///         Err(KernelError::Failed("the disk went away".into()))
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), coexec::Error> {
/// let e = coexec::Runtime::builder().devices("tpu:1").unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::Config);
///
/// let rt = coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?;
/// let e = rt.run(Broken).await.unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::Failed); // tried again, then given up
/// rt.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A setting, device spec or policy name the caller gave is wrong.
    Config,
    /// A kernel's or model's input is wrong: a file, a tensor, a parameter.
    Input,
    /// A device could not run: no CUDA, a CUDA error, out of its memory, no
    /// device left that can run the kernel.
    Device,
    /// The job failed: a chunk kept failing, or user code panicked or
    /// contradicted itself.
    Failed,
    /// A stream's queue was full (or a call larger than it): try again
    /// later or elsewhere.
    Overloaded,
    /// A request's deadline passed before its output came.
    Deadline,
    /// The runtime or the stream shut down, or the caller stopped waiting.
    Closed,
    /// An address could not be bound, a file not written, the metrics not
    /// started.
    Io,
    /// A bug in coexec.
    Internal,
}

impl Error {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Actor(e) => actor_kind(e),
            Error::Kernel(e) => kernel_kind(e),
            Error::Stream(e) => stream_kind(e),
            Error::Config { .. } => ErrorKind::Config,
            Error::Internal(_) => ErrorKind::Internal,
            Error::Metrics(_)
            | Error::MetricsBind { .. }
            | Error::Bind { .. }
            | Error::Io { .. } => ErrorKind::Io,
        }
    }
}

fn actor_kind(e: &ActorError) -> ErrorKind {
    match e {
        ActorError::DeviceSpec { .. }
        | ActorError::UnknownPolicy(_)
        | ActorError::Config { .. } => ErrorKind::Config,
        ActorError::NoDevice { .. } | ActorError::Device { .. } => ErrorKind::Device,
        ActorError::ChunkFailed { .. }
        | ActorError::KernelMisbehaved { .. }
        | ActorError::PolicyFailed { .. } => ErrorKind::Failed,
        ActorError::Shutdown | ActorError::Cancelled => ErrorKind::Closed,
        // The actor system failing, and variants added later.
        _ => ErrorKind::Internal,
    }
}

fn kernel_kind(e: &KernelError) -> ErrorKind {
    match e {
        KernelError::Invalid { .. }
        | KernelError::Input { .. }
        | KernelError::Tensor { .. }
        | KernelError::Config { .. }
        | KernelError::Io { .. } => ErrorKind::Input,
        KernelError::CudaUnavailable(_)
        | KernelError::Cuda(_)
        | KernelError::OutOfMemory { .. }
        | KernelError::DeviceMemory { .. }
        | KernelError::Unsupported { .. } => ErrorKind::Device,
        KernelError::Panicked(_) | KernelError::TakenBack { .. } | KernelError::Failed(_) => {
            ErrorKind::Failed
        }
        // Variants added later.
        _ => ErrorKind::Internal,
    }
}

fn stream_kind(e: &crate::stream::StreamError) -> ErrorKind {
    use crate::stream::StreamError as S;
    match e {
        S::Overloaded { .. } | S::TooMany { .. } => ErrorKind::Overloaded,
        S::Invalid { .. } => ErrorKind::Input,
        S::DeadlinePassed => ErrorKind::Deadline,
        // The model's answer, not the caller's input, is at fault.
        S::Output { .. } => ErrorKind::Failed,
        S::Failed(inner) => inner.kind(),
        S::Closed => ErrorKind::Closed,
    }
}
