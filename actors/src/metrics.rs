//! Metric names and the handles workers keep, through the `metrics` facade.
//!
//! Nothing is recorded unless the application (or `coexec --metrics`)
//! installs a recorder; without one every call here is a no-op. Labels are
//! bounded: `device_class` and `worker` by the device spec, `kernel` by the
//! kernels the program runs, `policy` by the registry, `phase` by the method.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Unit,
};

use crate::report::Phase;
use crate::RunReport;

/// Registers every metric's help text and unit with the installed recorder.
pub fn describe() {
    describe_counter!(
        "coexec_items_total",
        Unit::Count,
        "Items computed, per device class and kernel."
    );
    describe_counter!(
        "coexec_chunks_total",
        Unit::Count,
        "Chunks computed, per device class, kernel and phase."
    );
    // `metrics` counters are integers; seconds accumulate in gauges that only
    // ever grow (use them as counters: rate() works).
    describe_gauge!(
        "coexec_worker_busy_seconds",
        Unit::Seconds,
        "Seconds a worker spent running chunks (only grows)."
    );
    describe_gauge!(
        "coexec_worker_idle_seconds",
        Unit::Seconds,
        "Seconds a worker waited for work (only grows)."
    );
    describe_counter!(
        "coexec_chunk_retries_total",
        Unit::Count,
        "Chunks that went back to the broker: failed on a worker, or taken back."
    );
    describe_counter!(
        "coexec_chunks_taken_back_total",
        Unit::Count,
        "Chunks taken back from a device far past its predicted time (a slow or stalled device; they ran elsewhere)."
    );
    describe_counter!(
        "coexec_device_failures_total",
        Unit::Count,
        "Workers taken out of service after repeated device errors."
    );
    describe_gauge!(
        "coexec_jobs_in_flight",
        Unit::Count,
        "Jobs admitted and not yet finished (the broker's queue depth)."
    );
    describe_counter!(
        "coexec_jobs_completed_total",
        Unit::Count,
        "Jobs finished with every item computed."
    );
    describe_counter!("coexec_jobs_failed_total", Unit::Count, "Jobs that failed.");
    describe_histogram!(
        "coexec_job_makespan_seconds",
        Unit::Seconds,
        "Makespan of finished jobs."
    );
    describe_gauge!(
        "coexec_split_share",
        Unit::Count,
        "Share of the last run's items per device class (0..1)."
    );
    describe_gauge!(
        "coexec_imbalance",
        Unit::Count,
        "Imbalance δ of the last run of a kernel (0..1)."
    );
    describe_gauge!(
        "coexec_model_fixed_seconds",
        Unit::Seconds,
        "Speed model: fixed cost per chunk (a)."
    );
    describe_gauge!(
        "coexec_model_items_per_second",
        Unit::Count,
        "Speed model: items per second per worker (b)."
    );
}

/// One worker's handles and what it has not reported yet.
///
/// Counting on every chunk into handles that all workers of a class share
/// would make the workers contend for them; instead each worker adds up
/// locally and flushes every [`FLUSH_CHUNKS`] chunks, every
/// [`FLUSH_BUSY_S`] seconds of work, and whenever it runs out of chunks.
///
/// The `metrics` handles are resolved against the recorder installed when
/// they are made; a recorder installed later (a service started on a
/// runtime already running) bumps [`RECORDER_GEN`] and the worker resolves
/// them again at its next report; otherwise such a worker's busy and idle
/// time, retries and chunk durations would go nowhere.
pub(crate) struct WorkerLabels {
    class: String,
    worker: usize,
    busy: Gauge,
    idle: Gauge,
    retries: Counter,
    taken_back: Counter,
    per_kernel: HashMap<String, KernelHandles>,
    pending: Pending,
    /// Whether coexec's exporter is on: chunk histograms are counted.
    histograms: bool,
    /// The [`RECORDER_GEN`] the handles were resolved at.
    generation: u64,
}

/// Chunks a worker batches before reporting them.
pub(crate) const FLUSH_CHUNKS: usize = 256;
/// Seconds of work a worker batches before reporting them.
pub(crate) const FLUSH_BUSY_S: f64 = 0.1;

#[derive(Default)]
struct Pending {
    kernel: String,
    items: u64,
    chunks: [u64; 4],
    busy: f64,
    /// Chunk durations, bucketed here (not cumulative; the last is +Inf).
    buckets: [u64; CHUNK_BUCKETS.len() + 1],
    sum_ns: u64,
    count: usize,
}

struct KernelHandles {
    items: Counter,
    duration: Arc<ChunkHistogram>,
    chunks: [Counter; 4],
}

/// Upper bounds of the chunk-duration buckets: 10 µs to 100 s.
pub const CHUNK_BUCKETS: [f64; 15] = [
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0,
];

/// A Prometheus histogram of chunk durations for one (device class,
/// kernel), bucketed by the workers themselves.
///
/// The `metrics` facade keeps every observation until the exporter drains it,
/// which at a microsecond per chunk would cost more than the chunk; workers
/// count buckets locally instead and add them here when they flush, and
/// [`render_chunk_histograms`] writes the exposition text.
#[derive(Default)]
struct ChunkHistogram {
    buckets: [AtomicU64; CHUNK_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

static HISTOGRAMS_ON: AtomicBool = AtomicBool::new(false);

/// Bumped each time coexec installs its recorder (see [`WorkerLabels`]).
static RECORDER_GEN: AtomicU64 = AtomicU64::new(0);

/// Chunk-duration histograms by (device class, kernel).
type Histograms = Mutex<BTreeMap<(String, String), Arc<ChunkHistogram>>>;

fn histograms() -> &'static Histograms {
    static H: OnceLock<Histograms> = OnceLock::new();
    H.get_or_init(Default::default)
}

/// Starts counting chunk-duration histograms (the exporter calls this when it
/// installs its recorder).
pub fn enable_chunk_histograms() {
    HISTOGRAMS_ON.store(true, Ordering::Release);
    RECORDER_GEN.fetch_add(1, Ordering::AcqRel);
}

fn chunk_histogram(class: &str, kernel: &str) -> Arc<ChunkHistogram> {
    let mut h = histograms().lock().unwrap_or_else(|e| e.into_inner());
    h.entry((class.to_string(), kernel.to_string()))
        .or_default()
        .clone()
}

/// `coexec_chunk_duration_seconds` in Prometheus' text format, for appending
/// to the recorder's own output.
pub fn render_chunk_histograms() -> String {
    let h = histograms().lock().unwrap_or_else(|e| e.into_inner());
    let mut out = String::new();
    if h.is_empty() {
        return out;
    }
    let name = "coexec_chunk_duration_seconds";
    let _ = writeln!(out, "# HELP {name} Wall time of one chunk on its worker.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for ((class, kernel), hist) in h.iter() {
        let labels = format!(
            "device_class=\"{}\",kernel=\"{}\"",
            escape(class),
            escape(kernel)
        );
        let mut cumulative = 0;
        for (i, b) in hist.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = CHUNK_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = hist.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(
            out,
            "{name}_count{{{labels}}} {}",
            hist.count.load(Ordering::Relaxed)
        );
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl WorkerLabels {
    pub(crate) fn new(class: &str, worker: usize) -> Self {
        let generation = RECORDER_GEN.load(Ordering::Acquire);
        let labels = [
            ("device_class", class.to_string()),
            ("worker", worker.to_string()),
        ];
        Self {
            class: class.to_string(),
            worker,
            busy: gauge!("coexec_worker_busy_seconds", &labels),
            idle: gauge!("coexec_worker_idle_seconds", &labels),
            retries: counter!("coexec_chunk_retries_total", "device_class" => class.to_string()),
            taken_back: counter!(
                "coexec_chunks_taken_back_total",
                "device_class" => class.to_string()
            ),
            per_kernel: HashMap::new(),
            pending: Pending::default(),
            histograms: HISTOGRAMS_ON.load(Ordering::Acquire),
            generation,
        }
    }

    /// Resolves the handles again if a recorder was installed since.
    fn refresh(&mut self) {
        if RECORDER_GEN.load(Ordering::Acquire) != self.generation {
            let pending = std::mem::take(&mut self.pending);
            *self = Self::new(&self.class, self.worker);
            self.pending = pending;
        }
    }

    pub(crate) fn chunk_done(&mut self, kernel: &str, phase: Phase, items: usize, secs: f64) {
        if self.pending.kernel != kernel {
            self.flush();
            self.pending.kernel.clear();
            self.pending.kernel.push_str(kernel);
        }
        let p = &mut self.pending;
        p.items += items as u64;
        p.chunks[phase as usize] += 1;
        p.busy += secs;
        p.buckets[CHUNK_BUCKETS.partition_point(|&b| b < secs)] += 1;
        p.sum_ns += (secs * 1e9) as u64;
        p.count += 1;
        if p.count >= FLUSH_CHUNKS || p.busy >= FLUSH_BUSY_S {
            self.flush();
        }
    }

    /// Reports everything batched so far.
    pub(crate) fn flush(&mut self) {
        if self.pending.count == 0 {
            return;
        }
        self.refresh();
        let p = &mut self.pending;
        self.busy.increment(p.busy);
        let class = &self.class;
        let h = self.per_kernel.entry(p.kernel.clone()).or_insert_with(|| {
            let kernel = p.kernel.clone();
            let l = |phase: &'static str| counter!("coexec_chunks_total", "device_class" => class.clone(), "kernel" => kernel.clone(), "phase" => phase);
            KernelHandles {
                items: counter!("coexec_items_total", "device_class" => class.clone(), "kernel" => kernel.clone()),
                duration: chunk_histogram(class, &kernel),
                chunks: [l("probe"), l("static"), l("dynamic"), l("retry")],
            }
        });
        h.items.increment(p.items);
        for (counter, n) in h.chunks.iter().zip(p.chunks) {
            if n > 0 {
                counter.increment(n);
            }
        }
        if self.histograms {
            for (total, n) in h.duration.buckets.iter().zip(p.buckets) {
                if n > 0 {
                    total.fetch_add(n, Ordering::Relaxed);
                }
            }
            h.duration.sum_ns.fetch_add(p.sum_ns, Ordering::Relaxed);
            h.duration
                .count
                .fetch_add(p.count as u64, Ordering::Relaxed);
        }
        p.items = 0;
        p.chunks = [0; 4];
        p.busy = 0.0;
        p.buckets = Default::default();
        p.sum_ns = 0;
        p.count = 0;
    }

    /// A chunk went back to the broker; `taken_back` when it did not fail
    /// but ran far past its prediction.
    pub(crate) fn chunk_failed(&mut self, taken_back: bool) {
        self.refresh();
        self.retries.increment(1);
        if taken_back {
            self.taken_back.increment(1);
        }
    }

    pub(crate) fn idle(&mut self, secs: f64) {
        self.refresh();
        self.idle.increment(secs);
    }
}

impl Drop for WorkerLabels {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A worker taken out of service.
pub(crate) fn device_failed(class: &str) {
    counter!("coexec_device_failures_total", "device_class" => class.to_string()).increment(1);
}

/// The broker's queue depth.
pub(crate) fn jobs_in_flight(n: usize) {
    gauge!("coexec_jobs_in_flight").set(n as f64);
}

/// A finished job.
pub(crate) fn job_finished(kernel: &str, policy: &str, result: Result<&RunReport, ()>) {
    match result {
        Ok(r) => {
            counter!("coexec_jobs_completed_total", "kernel" => kernel.to_string(), "policy" => policy.to_string()).increment(1);
            histogram!("coexec_job_makespan_seconds", "kernel" => kernel.to_string(), "policy" => policy.to_string()).record(r.makespan_s);
            gauge!("coexec_imbalance", "kernel" => kernel.to_string()).set(r.imbalance);
            for c in &r.classes {
                let l = [("kernel", kernel.to_string()), ("device_class", c.name.clone())];
                gauge!("coexec_split_share", &l).set(c.share);
                gauge!("coexec_model_fixed_seconds", &l).set(c.model_a_s);
                gauge!("coexec_model_items_per_second", &l).set(c.model_b_items_per_s);
            }
        }
        Err(()) => {
            counter!("coexec_jobs_failed_total", "kernel" => kernel.to_string(), "policy" => policy.to_string()).increment(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_back_chunk_counts_as_a_retry_and_as_taken_back() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut l = WorkerLabels::new("sim", 1);
            l.chunk_failed(false);
            l.chunk_failed(true);
            l.chunk_failed(true);
        });
        let text = handle.render();
        assert!(
            text.contains("coexec_chunk_retries_total{device_class=\"sim\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("coexec_chunks_taken_back_total{device_class=\"sim\"} 2"),
            "{text}"
        );
    }
}
