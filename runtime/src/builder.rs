use std::path::PathBuf;

use coexec_actors::policy::{Thresholds, by_name};
use coexec_actors::{DeviceList, EngineConfig, JobOrder, ProfileDir};

use crate::{Error, Runtime};

/// Builds a [`Runtime`].
///
/// [`Runtime::builder`] starts from the defaults and reads no environment
/// variable: what it builds depends only on the calls made. A program that
/// wants coexec's variables (`COEXEC_DEVICES`, `COEXEC_POLICY`,
/// `COEXEC_PROFILE_DIR`) to apply asks for them with [`Builder::from_env`].
///
/// In async code, [`Builder::start`] builds on a blocking thread; elsewhere
/// [`Builder::build`] does the same work on the calling thread:
///
/// ```
/// # async fn demo() -> Result<(), coexec::Error> {
/// let rt = coexec::Runtime::builder()
///     .devices("cpu:2,sim:1@4")?
///     .policy("hybrid")
///     .in_memory_profiles()
///     .start()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Builder {
    pub(crate) cfg: EngineConfig,
}

impl Builder {
    /// The defaults ([`Runtime::builder`]), then what the environment says:
    ///
    /// | variable             | as if                        |
    /// |----------------------|------------------------------|
    /// | `COEXEC_DEVICES`     | [`Builder::devices`]         |
    /// | `COEXEC_POLICY`      | [`Builder::policy`]          |
    /// | `COEXEC_PROFILE_DIR` | [`Builder::profile_dir`]     |
    ///
    /// An unset or empty variable leaves the default. Calls after this one
    /// override the environment (the `coexec` command line reads the same
    /// variables through its flags).
    ///
    /// ```
    /// # fn demo() -> Result<(), coexec::Error> {
    /// // The environment decides, unless the program says otherwise.
    /// let rt = coexec::Builder::from_env()?.in_memory_profiles().build()?;
    /// # Ok(()) }
    /// ```
    pub fn from_env() -> Result<Self, Error> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut b = Runtime::builder();
        if let Some(spec) = var("COEXEC_DEVICES") {
            b = b.devices(&spec)?;
        }
        if let Some(p) = var("COEXEC_POLICY") {
            b = b.policy(&p);
        }
        if let Some(d) = std::env::var_os("COEXEC_PROFILE_DIR").filter(|d| !d.is_empty()) {
            b = b.profile_dir(d);
        }
        Ok(b)
    }

    /// The devices, as a spec (`cpu:2,sim:1@10+50us,cuda:0x4`). Default:
    /// every GPU found, with two streams each, and every core but one per
    /// GPU.
    pub fn devices(mut self, spec: &str) -> Result<Self, Error> {
        self.cfg.devices = Some(spec.parse::<DeviceList>()?);
        Ok(self)
    }

    /// The devices, already parsed.
    pub fn device_list(mut self, devices: DeviceList) -> Self {
        self.cfg.devices = Some(devices);
        self
    }

    /// The default policy (see `coexec policies`). Default: `hybrid`.
    pub fn policy(mut self, name: &str) -> Self {
        self.cfg.policy = name.to_string();
        self
    }

    /// The seed's thresholds μ, ν and the phase fractions.
    pub fn thresholds(mut self, t: Thresholds) -> Self {
        self.cfg.thresholds = t;
        self
    }

    /// Keep profiles in `dir` (default: the user's cache directory,
    /// `~/.cache/coexec` on Linux; only memory where there is none).
    pub fn profile_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cfg.profile_dir = ProfileDir::At(dir.into());
        self
    }

    /// Neither read nor write profiles: every process starts cold.
    pub fn in_memory_profiles(mut self) -> Self {
        self.cfg.profile_dir = ProfileDir::InMemory;
        self
    }

    /// Which job a free worker serves first (default FIFO).
    pub fn job_order(mut self, order: JobOrder) -> Self {
        self.cfg.order = order;
        self
    }

    /// Record every chunk of every run in its report (for timelines).
    pub fn trace(mut self, on: bool) -> Self {
        self.cfg.trace = on;
        self
    }

    /// Bind each CPU worker to a core of its own, and every other thread
    /// coexec starts (`sim` and GPU workers, the actor system) to the cores
    /// the CPU workers leave, as StarPU binds its workers (Linux only;
    /// elsewhere `build` fails with [`Error::Config`]). A program that owns
    /// its process can put its own threads on those cores too
    /// ([`Runtime::bind_other_threads`]), so that nothing preempts a CPU
    /// worker mid-chunk. Off by default.
    ///
    /// ```no_run
    /// let rt = coexec::Runtime::builder()
    ///     .devices("cpu:1,sim:1@0.5")?
    ///     .bind_workers(true)
    ///     .build()?;
    /// let b = rt.binding().expect("bound");
    /// println!("CPU worker on core {:?}, the rest on {:?}", b.workers, b.host);
    /// # Ok::<(), coexec::Error>(())
    /// ```
    pub fn bind_workers(mut self, on: bool) -> Self {
        self.cfg.bind = on;
        self
    }

    /// Whether the GPU streams compile `.cu` kernels in deterministic mode:
    /// on by default, the GPU twins then do the CPU's floating-point
    /// operations in its order (see
    /// [`StreamWorker::set_deterministic`](crate::kernels::cuda::StreamWorker::set_deterministic));
    /// off allows fused multiply-add, faster and different in the last bits.
    /// This runtime's streams only: nothing process-wide changes.
    pub fn deterministic(mut self, on: bool) -> Self {
        self.cfg.deterministic = on;
        self
    }

    /// Which kernel buffers the GPU streams page-lock
    /// ([`HostPinning`](crate::kernels::cuda::HostPinning); every large one
    /// by default). This runtime's streams only.
    ///
    /// ```
    /// use coexec::kernels::cuda::HostPinning;
    /// let b = coexec::Runtime::builder().host_pinning(HostPinning::Reused).deterministic(false);
    /// # drop(b);
    /// ```
    pub fn host_pinning(mut self, choice: crate::kernels::cuda::HostPinning) -> Self {
        self.cfg.host_pinning = choice;
        self
    }

    /// Starts the runtime: the actor system on its own thread, one thread per
    /// worker. It blocks the calling thread while it opens the GPUs (CUDA's
    /// initialisation can take seconds), reads the profile under its lock
    /// (which another process may hold while it saves) and starts the
    /// threads: call it where blocking is fine (`main`, a test, a blocking
    /// thread), and [`Builder::start`] from async code. It needs no tokio
    /// runtime and reads no environment variable ([`Builder::from_env`]
    /// does).
    pub fn build(self) -> Result<Runtime, Error> {
        by_name(&self.cfg.policy)?;
        self.cfg.thresholds.check().map_err(|why| Error::Config {
            what: "thresholds",
            why,
        })?;
        Runtime::start(self)
    }

    /// [`Builder::build`] on tokio's blocking pool: the executor thread that
    /// awaits it runs other tasks meanwhile (on a current-thread runtime,
    /// every other task). Dropping the future before it is ready drops the
    /// runtime it builds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), coexec::Error> {
    /// let rt = coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?;
    /// rt.shutdown().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn start(self) -> Result<Runtime, Error> {
        match tokio::task::spawn_blocking(move || self.build()).await {
            Ok(built) => built,
            // As `build` would have: its panic goes on in the caller.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Internal(format!("building the runtime: {e}"))),
        }
    }
}
