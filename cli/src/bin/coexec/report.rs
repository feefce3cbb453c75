//! What `coexec bench` measures, as written to `--json`.

use serde::Serialize;

/// The machine a bench ran on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub(crate) cpu_model: String,
    pub(crate) cores: usize,
    pub(crate) gpus: Vec<String>,
    /// UTC, RFC 3339.
    pub(crate) date: String,
}

/// A whole `coexec bench` invocation.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BenchReport {
    pub(crate) machine: Machine,
    /// The command line, as typed.
    pub(crate) command: String,
    /// The device spec in force.
    pub(crate) devices: String,
    pub(crate) repeat: usize,
    /// Cold/warm pairs of the learning comparison.
    pub(crate) pairs: usize,
    pub(crate) workloads: Vec<WorkloadBench>,
    pub(crate) overhead: Option<Overhead>,
}

/// One device class alone.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AloneResult {
    pub(crate) class: String,
    /// Median over the repeats.
    pub(crate) median_s: f64,
    pub(crate) runs_s: Vec<f64>,
    /// 95% interval of the median (order statistics; none under 6 runs).
    pub(crate) ci_s: Option<(f64, f64)>,
    /// Not run: the speed model's prediction for a class far slower than
    /// the fastest (see `coexec bench --help`).
    pub(crate) predicted: bool,
}

/// One device class's part of a co-executed run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClassResult {
    pub(crate) name: String,
    pub(crate) items: usize,
    pub(crate) finish_s: f64,
    pub(crate) share: f64,
}

/// One policy, co-executed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PolicyResult {
    pub(crate) policy: String,
    /// Median makespan over the repeats.
    pub(crate) makespan_s: f64,
    pub(crate) runs_s: Vec<f64>,
    /// 95% interval of the median makespan (none under 6 runs).
    pub(crate) ci_s: Option<(f64, f64)>,
    /// E's interval from T's and the classes' alone (interval arithmetic).
    pub(crate) efficiency_ci: Option<(f64, f64)>,
    /// The speed-up's interval, likewise.
    pub(crate) speedup_ci: Option<(f64, f64)>,
    /// T* = 1 / Σ 1/T_i over the classes alone.
    pub(crate) ideal_s: f64,
    /// E = T* / T.
    pub(crate) efficiency: f64,
    /// min_i T_i / T.
    pub(crate) speedup_vs_best: f64,
    /// δ of the median run.
    pub(crate) imbalance: f64,
    /// Per class, of the median run.
    pub(crate) classes: Vec<ClassResult>,
    /// With `--oracle`: T_oracle / T.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) vs_oracle: Option<f64>,
}

/// With `--oracle`: the best fixed split measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OracleResult {
    /// T_oracle: the best split's median, or the best class alone's where
    /// that is less.
    pub(crate) makespan_s: f64,
    /// Each class's share of the best split.
    pub(crate) share: Vec<f64>,
    /// Every split tried: the first class's share and its median job time.
    pub(crate) tried: Vec<(f64, f64)>,
}

/// One run of the cold-then-warm learning check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LearningRun {
    pub(crate) run: usize,
    /// `cold` or `warm`.
    pub(crate) probe: String,
    pub(crate) probe_imbalance: f64,
    pub(crate) replanned: bool,
    pub(crate) makespan_s: f64,
    pub(crate) efficiency: f64,
    /// Items share per class.
    pub(crate) split: Vec<f64>,
}

/// coexec CPU-only against the rayon baseline, side by side.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Baseline {
    pub(crate) threads: usize,
    pub(crate) rayon_s: f64,
    pub(crate) coexec_cpu_s: f64,
    /// rayon / coexec: ≥ 1 means coexec is at least as fast.
    pub(crate) ratio: f64,
}

/// One workload.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorkloadBench {
    pub(crate) name: String,
    /// Items per run (per step for iterative workloads).
    pub(crate) items: usize,
    /// Parameters, as the command line would give them.
    pub(crate) params: String,
    pub(crate) alone: Vec<AloneResult>,
    pub(crate) ideal_s: f64,
    pub(crate) best_class: String,
    pub(crate) best_alone_s: f64,
    pub(crate) policies: Vec<PolicyResult>,
    pub(crate) learning: Vec<LearningRun>,
    pub(crate) baseline: Option<Baseline>,
    /// Seconds generating (or reading) the inputs once, on every core:
    /// outside every time above.
    pub(crate) inputs_s: f64,
    /// What page-locking kernel buffers for the GPU cost during this
    /// workload's bench (inside the times of the runs that locked them).
    pub(crate) host_pinning: HostPinning,
    /// With `--oracle`: the measured limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) oracle: Option<OracleResult>,
}

/// Page-locking's count and cost over one workload's bench.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct HostPinning {
    /// The choice (`off`, `reused`, `all`).
    pub(crate) choice: String,
    pub(crate) locked: u64,
    pub(crate) locked_bytes: u64,
    pub(crate) lock_s: f64,
    pub(crate) unlock_s: f64,
    pub(crate) refused: u64,
    pub(crate) last_refusal: Option<String>,
}

/// The scheduler's own cost per chunk, with the empty kernel.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Overhead {
    pub(crate) workers: usize,
    /// Runs of each side (pairs, when metrics are measured too).
    pub(crate) repeat: usize,
    pub(crate) chunks: usize,
    /// Median over the repeats.
    pub(crate) seconds: f64,
    /// Wall seconds per chunk, in µs: the whole runtime's throughput.
    pub(crate) us_per_chunk: f64,
    pub(crate) chunks_per_second: f64,
    /// The same with the Prometheus recorder installed, if measured.
    pub(crate) with_metrics_us_per_chunk: Option<f64>,
    /// Median over side-by-side pairs of (with metrics) / (without): the
    /// two runs of a pair are adjacent, in alternating order, so the
    /// machine's drift cancels.
    pub(crate) with_metrics_ratio: Option<f64>,
}
