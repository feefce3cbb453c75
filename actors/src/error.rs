use coexec_kernels::KernelError;

/// Errors of the actor layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActorError {
    /// A device spec that does not parse or names nothing usable.
    #[error("bad device spec `{spec}`: {why}")]
    DeviceSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        why: String,
    },
    /// A policy name that is not registered.
    #[error("unknown policy `{0}` (see `coexec policies`)")]
    UnknownPolicy(String),
    /// No device class of this runtime can run the kernel.
    #[error("no device of this runtime can run kernel `{kernel}`: {why}")]
    NoDevice {
        /// Kernel name.
        kernel: String,
        /// Why not.
        why: String,
    },
    /// A chunk kept failing; the job gave up.
    #[error(
        "job `{kernel}` failed: items {lo}..{hi} failed {attempts} times; last error: {source}"
    )]
    ChunkFailed {
        /// Kernel name.
        kernel: String,
        /// First item of the chunk.
        lo: usize,
        /// One past its last item.
        hi: usize,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        source: KernelError,
    },
    /// A kernel method panicked, or a kernel contradicted itself (its
    /// `items()` changed during its run).
    #[error("kernel `{kernel}`: {why}")]
    KernelMisbehaved {
        /// Kernel name (`?` if `name()` itself failed).
        kernel: String,
        /// What it did.
        why: String,
    },
    /// The policy panicked planning a job; that job fails, the runtime
    /// goes on.
    #[error("policy `{policy}` failed to plan job `{kernel}`: {why}")]
    PolicyFailed {
        /// The policy's name.
        policy: String,
        /// Kernel name.
        kernel: String,
        /// The panic.
        why: String,
    },
    /// The job was cancelled because the runtime shut down.
    #[error("the runtime shut down before the job finished")]
    Shutdown,
    /// The job was cancelled because its caller stopped waiting for it (the
    /// future of `run` was dropped). Nobody is left to receive this; it names
    /// the job's end in logs.
    #[error("the job was cancelled: its caller stopped waiting")]
    Cancelled,
    /// A device could not be started.
    #[error("device {device}: {source}")]
    Device {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: KernelError,
    },
    /// The actor system could not be started or reached.
    #[error("actor system: {0}")]
    System(String),
    /// An invalid setting.
    #[error("invalid setting {what}: {why}")]
    Config {
        /// The setting.
        what: &'static str,
        /// Why.
        why: String,
    },
}
