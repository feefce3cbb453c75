//! Starting and stopping the actors and the worker threads.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use actix::{Actor, Addr, AsyncContext};
use coexec_kernels::Kernel;
use coexec_kernels::cuda::{self, GpuInfo, HostPinning, StreamWorker};

use crate::bind::Binding;
use crate::broker::registry::{Event, JobOrder, Registry};
use crate::broker::vetted::Vetted;
use crate::broker::{Admitter, Broker, JobOptions};
use crate::device::{ClassInfo, DeviceKind, DeviceList, DeviceSpec, End};
use crate::policy::{Thresholds, by_name};
use crate::profiler::{Fingerprint, Flush, ProfileFile, ProfileStore, Profiler, Profiles};
use crate::worker::{self, CpuExec, Executor, GpuExec, SimExec};
use crate::{ActorError, RunReport};

mod resolve;

pub use resolve::{cores, gpus, resolve, worker_cap};

/// CUDA streams per GPU when a spec does not say.
pub const DEFAULT_STREAMS: usize = 2;

/// Where profiles go: this directory, or only memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileDir {
    /// The user's cache directory (`~/.cache/coexec`), or only memory where
    /// there is none. No environment variable is read.
    Default,
    /// This directory.
    At(PathBuf),
    /// Nothing is read or written.
    InMemory,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Devices; `None`: every core and every GPU found.
    pub devices: Option<DeviceList>,
    /// Default policy name.
    pub policy: String,
    /// The seed's thresholds.
    pub thresholds: Thresholds,
    /// Where profiles live.
    pub profile_dir: ProfileDir,
    /// Which job a free worker serves first.
    pub order: JobOrder,
    /// Record every chunk of every run.
    pub trace: bool,
    /// Bind each CPU worker to a core of its own and every other thread
    /// coexec starts to the cores left ([`crate::bind`]).
    pub bind: bool,
    /// GPU streams compile kernels in deterministic mode
    /// ([`StreamWorker::set_deterministic`]).
    pub deterministic: bool,
    /// Which kernel buffers GPU streams page-lock
    /// ([`StreamWorker::set_host_pinning`]).
    pub host_pinning: HostPinning,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            devices: None,
            policy: "hybrid".into(),
            thresholds: Thresholds::default(),
            profile_dir: ProfileDir::Default,
            order: JobOrder::Fifo,
            trace: false,
            bind: false,
            deterministic: true,
            host_pinning: HostPinning::default(),
        }
    }
}

/// Binds the calling thread to `cores` when binding is on; a refusal (a
/// container that forbids it, say) costs speed, not correctness: a warning.
fn bind_or_warn(cores: Option<&[usize]>) {
    if let Some(cores) = cores
        && let Err(e) = crate::bind::bind(None, cores)
    {
        tracing::warn!(?cores, "could not bind this thread: {e}");
    }
}

/// The running actor system and workers.
pub struct Engine {
    admitter: Admitter,
    profiles: Arc<Profiles>,
    profiler: Addr<Profiler>,
    reg: Arc<Registry>,
    system: Option<actix::System>,
    system_thread: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    profile_path: Option<PathBuf>,
    gpus: Vec<GpuInfo>,
    binding: Option<Binding>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("classes", &self.reg.classes)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts the actor system on its own thread and one thread per worker.
    pub fn start(cfg: EngineConfig) -> Result<Self, ActorError> {
        let policy = by_name(&cfg.policy)?;
        let (classes, used_gpus) = resolve(cfg.devices.as_ref())?;
        let fingerprint =
            Fingerprint::this_machine(used_gpus.iter().map(|g| g.name.clone()).collect());
        let store = match &cfg.profile_dir {
            ProfileDir::InMemory => ProfileStore::in_memory(fingerprint),
            ProfileDir::At(d) => ProfileStore::open(d, fingerprint),
            ProfileDir::Default => match dirs::cache_dir() {
                Some(d) => ProfileStore::open(&d.join("coexec"), fingerprint),
                None => ProfileStore::in_memory(fingerprint),
            },
        };
        let profile_path = store.path().map(PathBuf::from);
        let classes: Arc<[ClassInfo]> = classes.into();
        let worker_class: Arc<[usize]> = classes
            .iter()
            .flat_map(|c| std::iter::repeat_n(c.index, c.workers))
            .collect();
        let binding = if cfg.bind {
            let cpu_workers = classes
                .iter()
                .filter(|c| matches!(c.kind, DeviceKind::Cpu))
                .map(|c| c.workers)
                .sum();
            let allowed = crate::bind::allowed().map_err(|e| ActorError::Config {
                what: "bind",
                why: e.to_string(),
            })?;
            Some(Binding::plan(cpu_workers, &allowed))
        } else {
            None
        };
        let (ev_tx, ev_rx) = flume::unbounded::<Event>();
        let reg = Arc::new(Registry::new(
            classes.clone(),
            worker_class.clone(),
            cfg.order,
            ev_tx,
        ));
        let profiles = Arc::new(Profiles::new(store, cfg.thresholds.mu, cfg.thresholds.nu));
        let _ = reg.profiles.set(profiles.clone());
        let admitter = Admitter::new(
            reg.clone(),
            profiles.clone(),
            cfg.thresholds,
            policy,
            cfg.trace,
        );

        // The actor system, on its own thread: an embedding tokio runtime is
        // never asked to host actix.
        let (tx, rx) = std::sync::mpsc::channel();
        let reg2 = reg.clone();
        let reg_gone = reg.clone();
        let profiles2 = profiles.clone();
        let host = binding.as_ref().map(|b| b.host.clone());
        let system_thread = std::thread::Builder::new()
            .name("coexec-actors".into())
            .spawn(move || {
                bind_or_warn(host.as_deref());
                // However this thread ends (a panic in a handler included),
                // live jobs fail and waiting callers are answered at once.
                let _dead = SystemGone(reg_gone);
                let sys = actix_rt::System::new();
                sys.block_on(async move {
                    let profiler = Profiler::start(profiles2);
                    // The broker hears the registry's events.
                    Broker::create(|ctx| {
                        ctx.add_stream(ev_rx.into_stream());
                        Broker { reg: reg2 }
                    });
                    let _ = tx.send((profiler, actix::System::current()));
                });
                if let Err(e) = sys.run() {
                    tracing::error!("actor system stopped with an error: {e}");
                }
            })
            .map_err(|e| ActorError::System(e.to_string()))?;
        let (profiler, system) = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| ActorError::System(format!("did not start: {e}")))?;

        let mut engine = Self {
            admitter,
            profiles,
            profiler,
            reg: reg.clone(),
            system: Some(system),
            system_thread: Some(system_thread),
            workers: Vec::new(),
            profile_path,
            gpus: used_gpus,
            binding: binding.clone(),
        };
        // Workers; a GPU stream is created on its own thread and says whether it came up.
        let (up_tx, up_rx) = std::sync::mpsc::channel::<Result<(), ActorError>>();
        let watch_gpus = classes.len() > 1;
        let (deterministic, pinning) = (cfg.deterministic, cfg.host_pinning);
        for (w, &c) in worker_class.iter().enumerate() {
            let info = classes[c].clone();
            let k = w - worker_class.iter().position(|&x| x == c).unwrap_or(w);
            let reg = reg.clone();
            let up = up_tx.clone();
            let name = format!("coexec-{}-{k}", info.name.replace(':', ""));
            let cores = binding.as_ref().and_then(|b| match info.kind {
                DeviceKind::Cpu => b.workers.get(k).map(|&c| vec![c]),
                _ => Some(b.host.clone()),
            });
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    bind_or_warn(cores.as_deref());
                    let exec: Box<dyn Executor> = match info.kind {
                        DeviceKind::Cpu => Box::new(CpuExec),
                        DeviceKind::Sim { speed, latency } => Box::new(SimExec::new(
                            speed,
                            latency,
                            Some((reg.take_back.clone(), w)),
                        )),
                        DeviceKind::Cuda { id } => match StreamWorker::new(id, k) {
                            Ok(mut stream) => {
                                stream.set_deterministic(deterministic);
                                stream.set_host_pinning(pinning);
                                // A chunk can be taken back only where another
                                // class could run it instead.
                                if watch_gpus {
                                    stream.watch_take_back(reg.take_back.clone(), w);
                                }
                                Box::new(GpuExec::new(stream))
                            }
                            Err(e) => {
                                let _ = up.send(Err(ActorError::Device {
                                    device: format!("{}/s{k}", info.name),
                                    source: e,
                                }));
                                return;
                            }
                        },
                    };
                    let _ = up.send(Ok(()));
                    drop(up);
                    worker::work(reg, w, exec);
                })
                .map_err(|e| ActorError::System(e.to_string()))?;
            engine.workers.push(h);
        }
        drop(up_tx);
        for _ in 0..worker_class.len() {
            match up_rx.recv_timeout(Duration::from_secs(60)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(ActorError::System("a worker did not start".into())),
            }
        }
        Ok(engine)
    }

    /// The device classes.
    pub fn classes(&self) -> &[ClassInfo] {
        &self.reg.classes
    }

    /// The GPUs in use.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// Where the profile file lives, if anywhere.
    pub fn profile_path(&self) -> Option<&std::path::Path> {
        self.profile_path.as_deref()
    }

    /// The cores of each CPU worker and of every other thread, when the
    /// engine was started with [`EngineConfig::bind`].
    pub fn binding(&self) -> Option<&Binding> {
        self.binding.as_ref()
    }

    /// Runs `kernel` to the end; every item exactly once, or an error.
    ///
    /// Dropping the returned future cancels the job: none of its chunks is
    /// handed out any more, the chunks in flight finish and are discarded,
    /// and the kernel is dropped once no worker holds it.
    pub async fn submit(
        &self,
        kernel: Arc<dyn Kernel>,
        opts: JobOptions,
    ) -> Result<RunReport, ActorError> {
        if self.reg.is_closed() {
            return Err(ActorError::Shutdown);
        }
        // The kernel's metadata is asked here, on the caller's thread and
        // under a guard, never on the actors' thread.
        let vetted = Arc::new(Vetted::new(kernel.clone())?);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.reg.owe();
        let mut waiting = Waiting {
            reg: &self.reg,
            reply: rx,
            answered: false,
        };
        // Admitted here, on the caller's thread: the first thread to hear
        // of the job after this is the worker that claims it.
        self.admitter.admit(vetted.clone(), opts, tx);
        let report = match waiting.answer().await {
            Ok(r) => r?,
            Err(_) => {
                // Dropped unanswered: the actor system is gone.
                self.reg.forgive();
                return Err(ActorError::Shutdown);
            }
        };
        vetted.still_matches(&*kernel)?;
        Ok(report)
    }

    /// Items computed per class since the engine started.
    pub fn progress(&self) -> Vec<u64> {
        self.reg.progress()
    }

    /// Everything the profiler has stored.
    pub async fn profile(&self) -> Result<ProfileFile, ActorError> {
        Ok(self.profiles.dump())
    }

    /// Waits until every submitted job is over and answered.
    pub async fn drain(&self) {
        self.reg.drained().await
    }

    /// Stops everything; with `cancel`, live jobs fail with
    /// [`ActorError::Shutdown`]. Saves the profile. Blocks until every thread
    /// has ended (workers finish the chunk in hand first): for threads that
    /// are not an async executor's; async code calls
    /// [`Engine::shutdown_async`].
    pub fn shutdown(&mut self, cancel: bool) {
        if let Some(s) = self.stop(cancel) {
            s.wait();
        }
    }

    /// [`Engine::shutdown`] without blocking the caller: the threads are
    /// waited for on a thread of its own, which answers when they have ended.
    pub async fn shutdown_async(&mut self, cancel: bool) {
        let Some(s) = self.stop(cancel) else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiter = std::thread::Builder::new()
            .name("coexec-shutdown".into())
            .spawn(move || {
                s.wait();
                let _ = tx.send(());
            });
        match waiter {
            Ok(_) => {
                let _ = rx.await;
            }
            // The threads still end on their own; only the wait is lost.
            Err(e) => tracing::warn!("shutdown: cannot wait for the threads: {e}"),
        }
    }

    /// Tells everything to stop (once) and hands back what to wait for.
    fn stop(&mut self, cancel: bool) -> Option<Stopping> {
        let system = self.system.take()?;
        self.reg.close(cancel);
        Some(Stopping {
            workers: std::mem::take(&mut self.workers),
            profiler: self.profiler.clone(),
            system,
            system_thread: self.system_thread.take(),
        })
    }
}

/// A stopped engine's threads, still finishing.
struct Stopping {
    workers: Vec<JoinHandle<()>>,
    profiler: Addr<Profiler>,
    system: actix::System,
    system_thread: Option<JoinHandle<()>>,
}

impl Stopping {
    /// Waits for the workers (each finishes the chunk in hand), saves the
    /// profile, stops the actor system and waits for its thread: blocks for
    /// up to a chunk's time plus the profile's write.
    fn wait(self) {
        for h in self.workers {
            let _ = h.join();
        }
        let (done, wait) = std::sync::mpsc::channel();
        self.profiler.do_send(Flush { done });
        let _ = wait.recv_timeout(Duration::from_secs(5));
        self.system.stop();
        if let Some(h) = self.system_thread {
            let _ = h.join();
        }
    }
}

/// A submitter waiting for its job's answer. Dropped before the answer (the
/// caller dropped the future of `submit`), it cancels the job.
struct Waiting<'a> {
    reg: &'a Registry,
    reply: tokio::sync::oneshot::Receiver<Result<RunReport, ActorError>>,
    answered: bool,
}

impl Waiting<'_> {
    async fn answer(
        &mut self,
    ) -> Result<Result<RunReport, ActorError>, tokio::sync::oneshot::error::RecvError> {
        let r = (&mut self.reply).await;
        self.answered = true;
        r
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            // Closed first: the job's sender now reads closed, which is how
            // the broker (not yet admitted) and the scan below find it.
            self.reply.close();
            self.reg.cancel_abandoned();
        }
    }
}

/// Closes the registry when the actor system's thread ends.
struct SystemGone(Arc<Registry>);

impl Drop for SystemGone {
    fn drop(&mut self) {
        if !self.0.is_closed() {
            tracing::error!("the actor system stopped: failing live jobs");
        }
        self.0.close(true);
    }
}

impl Drop for Engine {
    /// Stops now (live jobs fail with [`ActorError::Shutdown`]). On an async
    /// executor's thread it does not wait for the threads, which end on their
    /// own once the chunk in hand is done: a thread of its own waits for them
    /// and saves the profile. Elsewhere it waits, as [`Engine::shutdown`].
    fn drop(&mut self) {
        let Some(s) = self.stop(true) else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            s.wait();
            return;
        }
        let waiter = std::thread::Builder::new()
            .name("coexec-shutdown".into())
            .spawn(move || s.wait());
        if let Err(e) = waiter {
            tracing::warn!("dropping the runtime: cannot wait for its threads: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
