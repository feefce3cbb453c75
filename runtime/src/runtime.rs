use std::sync::Arc;

use coexec_actors::{ClassInfo, Engine, JobOptions, RunReport};
use coexec_kernels::Workload;
use coexec_kernels::cuda::GpuInfo;
use coexec_kernels::{Kernel, KernelError};

use crate::host::HostCall;
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
///     let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().start().await?;
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
}

impl Runtime {
    /// A builder with the defaults: every core and every GPU, `hybrid`,
    /// profiles in the user's cache directory.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn start(b: Builder) -> Result<Self, Error> {
        Ok(Self {
            engine: Engine::start(b.cfg)?,
        })
    }

    /// Runs `kernel` on every device class that can run it, under the
    /// runtime's policy, and gives it back with every item computed exactly
    /// once.
    ///
    /// # Cancellation
    ///
    /// The job runs only while this future is alive: dropping it (a
    /// `select!` that took another branch, a `timeout`, an aborted task)
    /// cancels the job. None of its chunks is handed out any more; the
    /// chunks workers already hold run to their end and are discarded (a
    /// kernel's `run_cpu` is never interrupted midway), and the kernel is
    /// dropped, with its outputs, once the last of them is done — at most
    /// one chunk's time later. Other jobs and the runtime go on.
    ///
    /// ```
    /// use std::time::Duration;
    /// use coexec::kernels::Synthetic;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), coexec::Error> {
    /// let rt = coexec::Runtime::builder().devices("cpu:1")?.in_memory_profiles().start().await?;
    /// // Seconds of work in chunks of a few ms, given 10 ms: cancelled when
    /// // the timeout drops it.
    /// let long = rt.run_with(Synthetic::new(1_000_000, 10_000), coexec::JobOptions::new().chunk(100));
    /// assert!(tokio::time::timeout(Duration::from_millis(10), long).await.is_err());
    /// // The runtime is free for the next job at once.
    /// assert!(rt.run(Synthetic::new(1_000, 10)).await?.kernel.verify().is_ok());
    /// rt.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn run<K: Kernel>(&self, kernel: K) -> Result<Done<K>, Error> {
        self.run_with(kernel, JobOptions::default()).await
    }

    /// [`Runtime::run`] with per-job options (policy, priority, weight,
    /// device classes, tracing). Dropping the future cancels the job, as for
    /// [`Runtime::run`].
    pub async fn run_with<K: Kernel>(&self, kernel: K, opts: JobOptions) -> Result<Done<K>, Error> {
        let k = Arc::new(kernel);
        let report = self.engine.submit(k.clone(), opts).await?;
        // Workers drop their handles before the job is reported over, so the
        // kernel is ours alone again.
        let kernel = Arc::try_unwrap(k)
            .map_err(|_| Error::Internal("the kernel is still shared after its run".into()))?;
        Ok(Done { kernel, report })
    }

    /// Pays each device class's first-use costs before real work arrives (a
    /// GPU's kernel compilation, library handles, weights' upload; a CPU's
    /// page faults): runs a kernel from `make` on each class alone, in
    /// chunks of one item so that it spreads over the class's workers, and
    /// learns nothing from it (the profile stays as it was). `make(n)` gives
    /// a kernel of `n` inputs of its own kind (sequences, rows), twice the
    /// class's workers. Returns each class's name and how long its warm-up
    /// took; an error of any class ends it.
    ///
    /// ```
    /// use coexec::kernels::Synthetic;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), coexec::Error> {
    /// let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().start().await?;
    /// let warmed = rt.warm_up(|n| Ok(Synthetic::new(n, 10))).await?;
    /// assert_eq!(warmed.len(), rt.classes().len());
    /// assert!(rt.profile().await?.kernels.is_empty()); // nothing learned
    /// rt.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn warm_up<K: Kernel>(
        &self,
        make: impl Fn(usize) -> Result<K, KernelError>,
    ) -> Result<Vec<(String, std::time::Duration)>, Error> {
        let mut warmed = Vec::new();
        for c in self.classes().iter().filter(|c| c.workers > 0) {
            let kernel = make(2 * c.workers)?;
            let opts = JobOptions::new().classes([c.index]).chunk(1).learn(false);
            let start = std::time::Instant::now();
            self.run_with(kernel, opts).await?;
            warmed.push((c.name.clone(), start.elapsed()));
        }
        Ok(warmed)
    }

    /// Drives an iterative job to its end: each step is one run (so the
    /// profiler learns between steps), with the workload's host step between.
    /// Returns the job's output and every run's report. Dropping the future
    /// cancels the step in progress, as for [`Runtime::run`], and no later
    /// step starts.
    ///
    /// The workload's host code (`next_step`, `absorb`) runs on tokio's
    /// blocking pool where it takes more than 100 µs (the first call always
    /// does), and inline where it is quicker than handing it over; a panic in
    /// it fails the job with [`KernelError::Panicked`](crate::kernels::KernelError).
    ///
    /// ```
    /// use coexec::kernels::{OneShot, Synthetic};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), coexec::Error> {
    /// let rt = coexec::Runtime::builder().devices("cpu:2")?.in_memory_profiles().start().await?;
    /// let job = OneShot::new(Synthetic::new(10_000, 4)); // one step; any `Workload` drives the same
    /// let (out, reports) = rt.drive(job, Default::default()).await?;
    /// out.expect("the step came back").verify().expect("every item exactly once");
    /// assert_eq!(reports.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn drive<W: Workload + 'static>(
        &self,
        mut w: W,
        opts: JobOptions,
    ) -> Result<(W::Output, Vec<RunReport>), Error> {
        let (next, absorb) = (HostCall::default(), HostCall::default());
        let mut reports = Vec::new();
        loop {
            let (back, step) = next
                .run("Workload::next_step", move || {
                    let step = KernelError::catch(|| w.next_step());
                    (w, step)
                })
                .await?;
            w = back;
            let Some(step) = step? else { break };
            let done = self.run_with(step, opts.clone()).await?;
            reports.push(done.report);
            let kernel = done.kernel;
            let (back, absorbed) = absorb
                .run("Workload::absorb", move || {
                    let r = KernelError::catch(|| w.absorb(kernel));
                    (w, r)
                })
                .await?;
            w = back;
            absorbed?;
        }
        // `finish` hands the result over (no host work expected): inline.
        let out = KernelError::catch(|| Ok(w.finish()))?;
        Ok((out, reports))
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

    /// The GPUs in use.
    pub fn gpus(&self) -> &[GpuInfo] {
        self.engine.gpus()
    }

    /// Where the profile file lives (`None`: in memory only).
    pub fn profile_path(&self) -> Option<&std::path::Path> {
        self.engine.profile_path()
    }

    /// The cores of the CPU workers and of every other thread, when built
    /// with [`Builder::bind_workers`](crate::Builder::bind_workers).
    pub fn binding(&self) -> Option<&crate::Binding> {
        self.engine.binding()
    }

    /// With workers bound, binds every other thread of this process (an
    /// embedding tokio runtime's included; threads started later inherit
    /// it from the thread that starts them) to the cores the CPU workers
    /// leave. For a program that owns its process, as `coexec serve` does.
    /// Returns how many threads it bound (0 when workers are not bound).
    pub fn bind_other_threads(&self) -> Result<usize, Error> {
        let Some(b) = self.binding() else {
            return Ok(0);
        };
        coexec_actors::bind::bind_process_threads(&b.host, "coexec-cpu-").map_err(|e| {
            Error::Config {
                what: "bind",
                why: e.to_string(),
            }
        })
    }

    /// Everything the profiler knows.
    pub async fn profile(&self) -> Result<crate::profile::ProfileFile, Error> {
        Ok(self.engine.profile().await?)
    }

    /// Waits for every submitted job to finish, then stops every thread,
    /// and saves the profile.
    ///
    /// It never blocks the executor it is awaited on: the worker and actor
    /// threads (each worker first finishes the chunk in hand) are waited for
    /// on a thread of their own, which wakes this future when they have
    /// ended. Dropping this future before it is done stops the runtime as
    /// dropping it does ([`Runtime::shutdown_now`]).
    pub async fn shutdown(mut self) {
        self.engine.drain().await;
        self.engine.shutdown_async(false).await;
    }

    /// Stops now: jobs still running fail with
    /// [`ActorError::Shutdown`](crate::ActorError::Shutdown). Dropping the
    /// runtime does the same.
    ///
    /// Inside a tokio runtime it does not block: the threads end on their own
    /// once the chunk in hand is done, and a thread of coexec's waits for
    /// them and saves the profile — a process that exits at once may lose
    /// that save (await [`Runtime::shutdown`] to be sure of it). Outside any
    /// tokio runtime it returns once every thread has ended.
    pub fn shutdown_now(self) {
        drop(self);
    }
}
