use std::sync::Arc;

use coexec_actors::{ClassInfo, Engine, JobOptions, RunReport};
use coexec_kernels::cuda::GpuInfo;
use coexec_kernels::workloads::Workload;
use coexec_kernels::Kernel;

use crate::{Builder, Error};

/// A finished run: the kernel back, with every item computed, and its report.
#[derive(Debug)]
#[non_exhaustive]
pub struct Done<K> {
    /// The kernel, holding its outputs.
    pub kernel: K,
    /// What happened.
    pub report: RunReport,
}

/// coexec's runtime: the broker, the profiler and one worker per CPU core,
/// simulated unit and GPU stream.
///
/// It is `Send + Sync`: share it (`Arc<Runtime>`) between tasks and submit
/// from all of them at once; jobs are served FIFO by default
/// ([`Builder::job_order`]).
///
/// ```
/// use coexec::kernels::Synthetic;
///
/// #[tokio::main]
/// async fn main() -> Result<(), coexec::Error> {
///     let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().build()?;
///     let mut done = rt.run(Synthetic::new(10_000, 50)).await?;
///     done.kernel.verify().expect("every item exactly once");
///     println!("{}", done.report.summary());
///     rt.shutdown().await;
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct Runtime {
    engine: Engine,
    /// Stops with the runtime (declared after `engine`: it outlives the
    /// last job's metrics).
    metrics: Option<crate::metrics::MetricsServer>,
}

impl Runtime {
    /// A builder with the defaults: every core and every GPU, `hybrid`,
    /// profiles in the user's cache directory.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn start(b: Builder) -> Result<Self, Error> {
        let metrics = b
            .metrics
            .map(crate::metrics::MetricsServer::start)
            .transpose()?;
        Ok(Self {
            engine: Engine::start(b.cfg)?,
            metrics,
        })
    }

    /// Runs `kernel` on every device class that can run it, under the
    /// runtime's policy, and gives it back with every item computed exactly
    /// once.
    pub async fn run<K: Kernel>(&self, kernel: K) -> Result<Done<K>, Error> {
        self.run_with(kernel, JobOptions::default()).await
    }

    /// [`Runtime::run`] with per-job options (policy, priority, weight,
    /// device classes, tracing).
    pub async fn run_with<K: Kernel>(&self, kernel: K, opts: JobOptions) -> Result<Done<K>, Error> {
        let k = Arc::new(kernel);
        let report = self.engine.submit(k.clone(), opts).await?;
        // Workers drop their handles before the job is reported over, so the
        // kernel is ours alone again.
        let kernel = Arc::try_unwrap(k)
            .map_err(|_| Error::Internal("the kernel is still shared after its run".into()))?;
        Ok(Done { kernel, report })
    }

    /// Drives an iterative job to its end: each step is one run (so the
    /// profiler learns between steps), with the workload's host step between.
    /// Returns the job's output and every run's report.
    ///
    /// ```
    /// use coexec::kernels::workloads::{MatmulJob, MatmulProblem};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), coexec::Error> {
    /// let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().build()?;
    /// let (out, reports) = rt.drive(MatmulJob::new(MatmulProblem::new(64, 32)?)?, Default::default()).await?;
    /// assert_eq!(out.c.len(), 64 * 32 * 32);
    /// assert_eq!(reports.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn drive<W: Workload>(
        &self,
        mut w: W,
        opts: JobOptions,
    ) -> Result<(W::Output, Vec<RunReport>), Error> {
        let mut reports = Vec::new();
        while let Some(step) = w.next_step()? {
            let done = self.run_with(step, opts.clone()).await?;
            reports.push(done.report);
            w.absorb(done.kernel)?;
        }
        Ok((w.finish(), reports))
    }

    /// The device classes and their workers.
    pub fn classes(&self) -> &[ClassInfo] {
        self.engine.classes()
    }

    /// Items computed per device class (name, items) since the runtime
    /// started: cheap to poll, for progress displays.
    pub fn progress(&self) -> Vec<(String, u64)> {
        self.classes()
            .iter()
            .map(|c| c.name.clone())
            .zip(self.engine.progress())
            .collect()
    }

    /// Where `/metrics` is served, with the port the system chose if the
    /// builder asked for port 0 (`None`: no exporter).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr())
    }

    /// The GPUs in use.
    pub fn gpus(&self) -> &[GpuInfo] {
        self.engine.gpus()
    }

    /// Where the profile file lives (`None`: in memory only).
    pub fn profile_path(&self) -> Option<&std::path::Path> {
        self.engine.profile_path()
    }

    /// Everything the profiler knows.
    pub async fn profile(&self) -> Result<crate::profile::ProfileFile, Error> {
        Ok(self.engine.profile().await?)
    }

    /// Waits for every submitted job to finish, then stops and saves the
    /// profile.
    pub async fn shutdown(mut self) {
        self.engine.drain().await;
        self.engine.shutdown(false);
        if let Some(m) = self.metrics.take() {
            m.stop().await;
        }
    }

    /// Stops now: jobs still running fail with a shutdown error. (Dropping
    /// the runtime does the same.)
    pub fn shutdown_now(mut self) {
        self.engine.shutdown(true);
    }
}
