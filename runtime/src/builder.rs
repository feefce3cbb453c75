use std::net::SocketAddr;
use std::path::PathBuf;

use coexec_actors::policy::{by_name, Thresholds};
use coexec_actors::{DeviceList, EngineConfig, JobOrder, ProfileDir};

use crate::{Error, Runtime};

/// Builds a [`Runtime`].
///
/// ```
/// # async fn demo() -> Result<(), coexec::Error> {
/// let rt = coexec::Runtime::builder()
///     .devices("cpu:2,sim:1@4")?
///     .policy("hybrid")
///     .in_memory_profiles()
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Builder {
    pub(crate) cfg: EngineConfig,
    devices_set: bool,
    policy_set: bool,
    pub(crate) metrics: Option<SocketAddr>,
}

impl Builder {
    /// The devices, as a spec (`cpu:2,sim:1@10+50us,cuda:0x4`). Default:
    /// `COEXEC_DEVICES`, else every core and every GPU found.
    pub fn devices(mut self, spec: &str) -> Result<Self, Error> {
        self.cfg.devices = Some(spec.parse::<DeviceList>()?);
        self.devices_set = true;
        Ok(self)
    }

    /// The devices, already parsed.
    pub fn device_list(mut self, devices: DeviceList) -> Self {
        self.cfg.devices = Some(devices);
        self.devices_set = true;
        self
    }

    /// The default policy (see `coexec policies`). Default: `COEXEC_POLICY`,
    /// else `hybrid`.
    pub fn policy(mut self, name: &str) -> Self {
        self.cfg.policy = name.to_string();
        self.policy_set = true;
        self
    }

    /// The seed's thresholds μ, ν and the phase fractions.
    pub fn thresholds(mut self, t: Thresholds) -> Self {
        self.cfg.thresholds = t;
        self
    }

    /// Keep profiles in `dir` (default: `COEXEC_PROFILE_DIR`, else the
    /// user's cache directory).
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

    /// Serve Prometheus metrics at `addr` (`/metrics` only). Use a loopback
    /// address unless the metrics are meant to be reachable from elsewhere.
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// Starts the runtime: the actor system on its own thread, one thread per
    /// worker. Call it from anywhere; it does not need a tokio runtime.
    pub fn build(mut self) -> Result<Runtime, Error> {
        if !self.devices_set {
            if let Ok(spec) = std::env::var("COEXEC_DEVICES") {
                if !spec.trim().is_empty() {
                    self.cfg.devices = Some(spec.parse::<DeviceList>()?);
                }
            }
        }
        if !self.policy_set {
            if let Ok(p) = std::env::var("COEXEC_POLICY") {
                if !p.trim().is_empty() {
                    self.cfg.policy = p.trim().to_string();
                }
            }
        }
        by_name(&self.cfg.policy)?;
        let t = &self.cfg.thresholds;
        let frac = |x: f64| (0.0..=1.0).contains(&x);
        if !(frac(t.mu)
            && frac(t.nu)
            && frac(t.cold_probe)
            && frac(t.warm_probe)
            && frac(t.static_fraction))
            || t.warm_probe + t.static_fraction > 1.0
            || t.static_chunks_per_worker == 0
        {
            return Err(Error::Config {
                what: "thresholds",
                why: format!("{t:?} out of range"),
            });
        }
        Runtime::start(self)
    }
}
