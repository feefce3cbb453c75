//! The machine's calibration: per workload, the CPU class and the GPU as the
//! H100 lease measured them, read from `h100-2026-11-23.json`.

use super::*;

/// A lease's machine and workloads, as the calibration script wrote them.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Calibration {
    pub(crate) workloads: Vec<Workload>,
}

/// One workload of the lease: its shape, its devices, what was measured.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Workload {
    pub(crate) name: String,
    pub(crate) items: usize,
    pub(crate) runs: usize,
    pub(crate) cpu: CpuModel,
    pub(crate) gpu: GpuModel,
    pub(crate) measured: Measured,
}

/// The CPU class on one workload.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CpuModel {
    pub(crate) workers: usize,
    pub(crate) a_s: f64,
    pub(crate) b_per_worker: f64,
    pub(crate) start_s: f64,
    pub(crate) start_spread_s: f64,
    pub(crate) noise_cv: f64,
    /// Per worker, how much longer than the class's model its chunks take.
    #[serde(default)]
    pub(crate) worker_factors: Vec<f64>,
}

/// The GPU on one workload.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct GpuModel {
    pub(crate) streams: usize,
    /// Items whose threads occupy every SM: chunks in flight together share
    /// the device only when they would occupy more than this.
    pub(crate) capacity_items: usize,
    pub(crate) a_s: f64,
    pub(crate) min_work_items: usize,
    pub(crate) device_items_per_s: f64,
    pub(crate) stage_s: f64,
    pub(crate) noise_cv: f64,
    /// Per traced co-executed run, how much slower the GPU went than alone:
    /// a run draws one, and the GPU's work goes that much slower while a CPU
    /// worker of the job runs a chunk.
    pub(crate) coexec_slowdown: Vec<f64>,
}

/// What the lease measured.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Measured {
    pub(crate) t_cpu_s: f64,
    pub(crate) t_gpu_s: f64,
    pub(crate) policies_s: BTreeMap<String, f64>,
    pub(crate) e_hybrid: f64,
}

/// The H100 lease of 2026-11-23.
pub(crate) fn h100() -> Calibration {
    serde_json::from_str(include_str!("h100-2026-11-23.json"))
        .expect("the committed calibration parses")
}

impl Calibration {
    pub(crate) fn workload(&self, name: &str) -> &Workload {
        self.workloads
            .iter()
            .find(|w| w.name == name)
            .unwrap_or_else(|| panic!("no workload {name} in the calibration"))
    }
}
