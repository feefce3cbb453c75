//! GPU telemetry: each GPU's utilisation, memory, power, temperature and
//! SM clock, read through NVML on a thread of its own at an interval and
//! set as `coexec_gpu_*` gauges through the `metrics` facade (so they reach
//! whichever recorder the process has: coexec's exporter or the
//! application's).
//!
//! NVML is loaded at run time (`libnvidia-ml.so`, via `nvml-wrapper`):
//! without it nothing is sampled and no `coexec_gpu_*` series exists, so
//! no dashboard reads a zero that no GPU reported; instead
//! `coexec_telemetry_up{source="nvml"}` is 0 and its `reason` label says
//! why. A reading NVML does not support on a device (utilisation on a MIG
//! instance, say) is left out, never set to zero.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// One GPU's readings; `None` where NVML could not read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuReading {
    /// The GPU as CUDA numbers it in this process (`cuda:N`).
    pub(crate) index: usize,
    pub(crate) uuid: String,
    pub(crate) model: String,
    /// Share of the last sample period a kernel ran, 0 to 1.
    pub(crate) utilization: Option<f64>,
    /// Share of it the memory was read or written, 0 to 1.
    pub(crate) memory_utilization: Option<f64>,
    pub(crate) memory_used_bytes: Option<u64>,
    pub(crate) memory_free_bytes: Option<u64>,
    pub(crate) power_watts: Option<f64>,
    pub(crate) temperature_celsius: Option<f64>,
    pub(crate) sm_clock_hertz: Option<f64>,
}

/// Where readings come from: NVML, or a fake in tests.
pub(crate) trait Source: Send + 'static {
    /// The GPUs' readings now.
    fn read(&mut self) -> Vec<GpuReading>;
}

/// Sets the gauges of `readings`; a reading that is `None` is not set.
pub(crate) fn record(readings: &[GpuReading]) {
    for r in readings {
        let labels = [
            ("gpu", r.index.to_string()),
            ("uuid", r.uuid.clone()),
            ("model", r.model.clone()),
        ];
        let set = |name: &'static str, v: Option<f64>| {
            if let Some(v) = v {
                metrics::gauge!(name, &labels).set(v);
            }
        };
        set("coexec_gpu_utilization_ratio", r.utilization);
        set("coexec_gpu_memory_utilization_ratio", r.memory_utilization);
        set(
            "coexec_gpu_memory_used_bytes",
            r.memory_used_bytes.map(|b| b as f64),
        );
        set(
            "coexec_gpu_memory_free_bytes",
            r.memory_free_bytes.map(|b| b as f64),
        );
        set("coexec_gpu_power_watts", r.power_watts);
        set("coexec_gpu_temperature_celsius", r.temperature_celsius);
        set("coexec_gpu_sm_clock_hertz", r.sm_clock_hertz);
    }
}

/// The gauges' help texts, as `/metrics` shows them (only where NVML
/// reads: no `coexec_gpu_*` line at all without it).
fn describe() {
    use metrics::describe_gauge as d;
    d!(
        "coexec_gpu_utilization_ratio",
        "Share of the last NVML sample period a kernel ran on the GPU (DCGM_FI_DEV_GPU_UTIL / 100)"
    );
    d!(
        "coexec_gpu_memory_utilization_ratio",
        "Share of the last NVML sample period device memory was read or written (DCGM_FI_DEV_MEM_COPY_UTIL / 100)"
    );
    d!(
        "coexec_gpu_memory_used_bytes",
        "Device memory allocated (DCGM_FI_DEV_FB_USED, in bytes)"
    );
    d!(
        "coexec_gpu_memory_free_bytes",
        "Device memory free (DCGM_FI_DEV_FB_FREE, in bytes)"
    );
    d!(
        "coexec_gpu_power_watts",
        "Board power draw (DCGM_FI_DEV_POWER_USAGE)"
    );
    d!(
        "coexec_gpu_temperature_celsius",
        "GPU die temperature (DCGM_FI_DEV_GPU_TEMP)"
    );
    d!(
        "coexec_gpu_sm_clock_hertz",
        "SM clock (DCGM_FI_DEV_SM_CLOCK, in Hz)"
    );
    describe_up();
}

fn describe_up() {
    metrics::describe_gauge!(
        "coexec_telemetry_up",
        "1 while a telemetry source reads; 0, with the reason, where it cannot"
    );
}

/// Sets `coexec_telemetry_up{source, reason}`: 1 while a source reads, 0
/// with the reason where it cannot.
fn up(source: &'static str, reason: Result<(), &str>) {
    let (v, why) = match reason {
        Ok(()) => (1.0, String::new()),
        Err(why) => (0.0, why.to_string()),
    };
    metrics::gauge!("coexec_telemetry_up", "source" => source, "reason" => why).set(v);
}

/// NVML's readings of the GPUs this process may use: those
/// `CUDA_VISIBLE_DEVICES` names (indices or UUIDs, in its order), else all.
struct Nvml {
    nvml: nvml_wrapper::Nvml,
    /// For each visible GPU in CUDA's order, how NVML finds it.
    gpus: Vec<Select>,
}

#[derive(Debug, Clone, PartialEq)]
enum Select {
    Index(u32),
    Uuid(String),
}

/// The GPUs `CUDA_VISIBLE_DEVICES` leaves (`None`: unset, every GPU).
/// CUDA stops at the first entry it cannot parse; so does this.
fn visible(var: Option<&str>) -> Option<Vec<Select>> {
    let var = var?;
    let mut out = Vec::new();
    for e in var.split(',').map(str::trim) {
        if let Ok(i) = e.parse::<u32>() {
            out.push(Select::Index(i));
        } else if e.starts_with("GPU-") || e.starts_with("MIG-") {
            out.push(Select::Uuid(e.to_string()));
        } else {
            break;
        }
    }
    Some(out)
}

impl Nvml {
    fn open() -> Result<Self, String> {
        // The driver installs `libnvidia-ml.so.1`; the unversioned name
        // nvml-wrapper asks for comes with development packages only.
        let nvml = nvml_wrapper::Nvml::init()
            .or_else(|_| {
                nvml_wrapper::Nvml::builder()
                    .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
                    .init()
            })
            .map_err(|e| format!("NVML: {e}"))?;
        let gpus = match visible(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref()) {
            Some(g) => g,
            None => {
                let n = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
                (0..n).map(Select::Index).collect()
            }
        };
        if gpus.is_empty() {
            return Err("no GPU: CUDA_VISIBLE_DEVICES leaves none".into());
        }
        Ok(Self { nvml, gpus })
    }
}

impl Source for Nvml {
    fn read(&mut self) -> Vec<GpuReading> {
        use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
        let mut out = Vec::new();
        for (index, sel) in self.gpus.iter().enumerate() {
            let d = match sel {
                Select::Index(i) => self.nvml.device_by_index(*i),
                Select::Uuid(u) => self.nvml.device_by_uuid(u.as_str()),
            };
            let Ok(d) = d else { continue };
            let util = d.utilization_rates().ok();
            let mem = d.memory_info().ok();
            out.push(GpuReading {
                index,
                uuid: d.uuid().unwrap_or_default(),
                model: d.name().unwrap_or_default(),
                utilization: util.as_ref().map(|u| f64::from(u.gpu) / 100.0),
                memory_utilization: util.as_ref().map(|u| f64::from(u.memory) / 100.0),
                memory_used_bytes: mem.as_ref().map(|m| m.used),
                memory_free_bytes: mem.as_ref().map(|m| m.free),
                power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
                sm_clock_hertz: d.clock_info(Clock::SM).ok().map(|mhz| f64::from(mhz) * 1e6),
            });
        }
        out
    }
}

/// GPU telemetry sampled on a thread of its own until dropped.
///
/// Start it once per process, beside the exporter or the application's
/// own recorder; without NVML it samples nothing and says why
/// ([`GpuTelemetry::status`], and `coexec_telemetry_up`).
///
/// ```
/// use std::time::Duration;
/// let t = coexec_serve::metrics::GpuTelemetry::start(Duration::from_secs(5));
/// match t.status() {
///     Ok(gpus) => println!("watching {gpus} GPUs"),
///     Err(why) => println!("no GPU telemetry: {why}"),
/// }
/// ```
#[derive(Debug)]
pub struct GpuTelemetry {
    status: Result<usize, String>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl GpuTelemetry {
    /// Samples every GPU this process may use (those `CUDA_VISIBLE_DEVICES`
    /// leaves) every `interval` (at least 100 ms), off the caller's thread.
    pub fn start(interval: Duration) -> Self {
        match Nvml::open() {
            Ok(nvml) => Self::with_source(nvml, interval),
            Err(why) => {
                tracing::info!("GPU telemetry off: {why}");
                describe_up();
                up("nvml", Err(&why));
                Self {
                    status: Err(why),
                    stop: None,
                    thread: None,
                }
            }
        }
    }

    pub(crate) fn with_source(mut source: impl Source, interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(100));
        describe();
        let first = source.read();
        let gpus = first.len();
        record(&first);
        up("nvml", Ok(()));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("coexec-gpu-telemetry".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    record(&source.read());
                }
            });
        match thread {
            Ok(t) => Self {
                status: Ok(gpus),
                stop: Some(stop),
                thread: Some(t),
            },
            Err(e) => Self {
                status: Err(format!("cannot start the telemetry thread: {e}")),
                stop: None,
                thread: None,
            },
        }
    }

    /// The GPUs sampled, or why there are none.
    pub fn status(&self) -> Result<usize, &str> {
        self.status.as_ref().map(|n| *n).map_err(String::as_str)
    }
}

impl Drop for GpuTelemetry {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn visible_devices_are_read_as_cuda_reads_them() {
        assert_eq!(visible(None), None);
        assert_eq!(visible(Some("")), Some(vec![]));
        assert_eq!(
            visible(Some("2, GPU-8c3e-aa,MIG-2f1a/1/0")),
            Some(vec![
                Select::Index(2),
                Select::Uuid("GPU-8c3e-aa".into()),
                Select::Uuid("MIG-2f1a/1/0".into())
            ])
        );
        // CUDA ignores everything from the first entry it cannot read.
        assert_eq!(visible(Some("1,x,0")), Some(vec![Select::Index(1)]));
    }

    #[test]

    fn without_nvml_no_gpu_series_exists_and_the_reason_does() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let h = recorder.handle();
        let status = metrics::with_local_recorder(&recorder, || {
            GpuTelemetry::start(Duration::from_secs(1))
                .status()
                .map_err(str::to_string)
        });
        let text = h.render();
        match status {
            Ok(gpus) => eprintln!("skipped: NVML is here ({gpus} GPUs)"),
            Err(why) => {
                assert!(!text.contains("coexec_gpu_"), "{text}");
                let want = format!("coexec_telemetry_up{{source=\"nvml\",reason=\"{why}\"}} 0");
                assert!(text.contains(&want), "{want} in {text}");
            }
        }
    }

    /// A GPU whose readings count up, and a MIG instance without
    /// utilisation.
    struct Fake(Arc<Mutex<u32>>);

    impl Source for Fake {
        fn read(&mut self) -> Vec<GpuReading> {
            let mut n = self.0.lock().unwrap();
            *n += 1;
            vec![
                GpuReading {
                    index: 0,
                    uuid: "GPU-fake".into(),
                    model: "Fake H200".into(),
                    utilization: Some(0.5),
                    memory_utilization: Some(0.25),
                    memory_used_bytes: Some(1 << 30),
                    memory_free_bytes: Some(3 << 30),
                    power_watts: Some(f64::from(*n)),
                    temperature_celsius: Some(41.0),
                    sm_clock_hertz: Some(1.98e9),
                },
                GpuReading {
                    index: 1,
                    uuid: "MIG-fake".into(),
                    model: "Fake MIG 1g.18gb".into(),
                    memory_used_bytes: Some(5),
                    ..Default::default()
                },
            ]
        }
    }

    #[test]

    fn readings_become_gauges_and_missing_ones_none() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let h = recorder.handle();
        let reads = Arc::new(Mutex::new(0));
        metrics::with_local_recorder(&recorder, || {
            let t = GpuTelemetry::with_source(Fake(reads.clone()), Duration::from_millis(100));
            assert_eq!(t.status(), Ok(2));
        });
        let text = h.render();
        let line = |name: &str, gpu: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l.contains(&format!("gpu=\"{gpu}\"")))
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        assert_eq!(
            line("coexec_gpu_utilization_ratio", "0").as_deref(),
            Some("0.5")
        );
        assert_eq!(
            line("coexec_gpu_memory_used_bytes", "0").as_deref(),
            Some("1073741824")
        );
        assert_eq!(line("coexec_gpu_power_watts", "0").as_deref(), Some("1"));
        assert_eq!(
            line("coexec_gpu_sm_clock_hertz", "0").as_deref(),
            Some("1980000000")
        );
        assert!(text.contains("model=\"Fake H200\""), "{text}");
        // The MIG instance: its memory, and no utilisation at all.
        assert_eq!(
            line("coexec_gpu_memory_used_bytes", "1").as_deref(),
            Some("5")
        );
        assert_eq!(line("coexec_gpu_utilization_ratio", "1"), None);
        assert!(
            text.contains("coexec_telemetry_up{source=\"nvml\",reason=\"\"} 1"),
            "{text}"
        );
    }
}
