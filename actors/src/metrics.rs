//! Metric names and the handles workers keep, through the `metrics` facade.
//!
//! Nothing is recorded unless the application (or `coexec --metrics`)
//! installs a recorder; without one every call here is a no-op. Labels are
//! bounded: `device_class` and `worker` by the device spec, `kernel` by the
//! kernels the program runs, `policy` by the registry, `phase` by the method.

use std::collections::HashMap;

use metrics::{
    Counter, Gauge, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};

use crate::RunReport;
use crate::report::Phase;

/// Registers every metric's help text and unit with the installed recorder.
pub fn describe() {
    describe_counter!(
        "coexec_chunk_duration_seconds_bucket",
        Unit::Count,
        "Chunks that took at most `le` seconds on their worker, per device class and kernel \
         (cumulative, as a Prometheus histogram's buckets: histogram_quantile reads them)."
    );
    describe_counter!(
        "coexec_chunk_duration_seconds_count",
        Unit::Count,
        "Chunks timed, per device class and kernel."
    );
    describe_gauge!(
        "coexec_chunk_duration_seconds_sum",
        Unit::Seconds,
        "Seconds the timed chunks took in all (only ever grows), per device class and kernel."
    );
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
/// they are made; a recorder installed later (by coexec's exporter, a
/// service started on a runtime already running, or the application) is
/// noticed at the worker's next report, which resolves them again:
/// otherwise such a worker's busy and idle time, retries and chunk
/// durations would go nowhere.
pub(crate) struct WorkerLabels {
    class: String,
    worker: usize,
    busy: Gauge,
    idle: Gauge,
    retries: Counter,
    taken_back: Counter,
    per_kernel: HashMap<String, KernelHandles>,
    pending: Pending,
    /// The recorder the handles were resolved against ([`recorder_id`]).
    recorder: usize,
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
    sum: f64,
    count: usize,
}

struct KernelHandles {
    items: Counter,
    chunks: [Counter; 4],
    duration: ChunkDurations,
}

/// Upper bounds of the chunk-duration buckets: 10 µs to 100 s.
pub const CHUNK_BUCKETS: [f64; 15] = [
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0,
];

/// `coexec_chunk_duration_seconds` for one (device class, kernel), as the
/// series of a Prometheus histogram (cumulative `_bucket` counters with an
/// `le` label, `_count`, `_sum`) made of plain counters and a gauge.
///
/// A `metrics` histogram keeps every observation until the recorder drains
/// it, which at a microsecond per chunk would cost more than the chunk;
/// workers bucket durations locally and add whole buckets here when they
/// flush, through the facade, so any recorder the application installs
/// gets them.
struct ChunkDurations {
    /// Per bound of [`CHUNK_BUCKETS`], then `+Inf`.
    buckets: [Counter; CHUNK_BUCKETS.len() + 1],
    count: Counter,
    sum: Gauge,
}

impl ChunkDurations {
    fn new(class: &str, kernel: &str) -> Self {
        let labels = |le: String| {
            [
                ("device_class", class.to_string()),
                ("kernel", kernel.to_string()),
                ("le", le),
            ]
        };
        let bound = |i: usize| CHUNK_BUCKETS.get(i).map_or("+Inf".into(), f64::to_string);
        let series = [
            ("device_class", class.to_string()),
            ("kernel", kernel.to_string()),
        ];
        Self {
            buckets: std::array::from_fn(|i| {
                counter!("coexec_chunk_duration_seconds_bucket", &labels(bound(i)))
            }),
            count: counter!("coexec_chunk_duration_seconds_count", &series),
            sum: gauge!("coexec_chunk_duration_seconds_sum", &series),
        }
    }

    /// Adds chunk counts per bucket (not cumulative), their seconds in all
    /// and their number.
    fn add(&self, per_bucket: &[u64], sum: f64, count: u64) {
        let mut cumulative = 0;
        for (total, n) in self.buckets.iter().zip(per_bucket) {
            cumulative += n;
            if cumulative > 0 {
                total.increment(cumulative);
            }
        }
        self.sum.increment(sum);
        self.count.increment(count);
    }
}

/// Which recorder the `metrics` macros record into on this thread now: its
/// address, compared and never followed.
fn recorder_id() -> usize {
    metrics::with_recorder(|r| std::ptr::from_ref(r).cast::<()>() as usize)
}

impl WorkerLabels {
    pub(crate) fn new(class: &str, worker: usize) -> Self {
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
            recorder: recorder_id(),
        }
    }

    /// Resolves the handles again if another recorder was installed since.
    fn refresh(&mut self) {
        if recorder_id() != self.recorder {
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
        p.sum += secs;
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
                chunks: [l("probe"), l("static"), l("dynamic"), l("retry")],
                duration: ChunkDurations::new(class, &kernel),
            }
        });
        h.items.increment(p.items);
        for (counter, n) in h.chunks.iter().zip(p.chunks) {
            if n > 0 {
                counter.increment(n);
            }
        }
        h.duration.add(&p.buckets, p.sum, p.count as u64);
        p.items = 0;
        p.chunks = [0; 4];
        p.busy = 0.0;
        p.buckets = Default::default();
        p.sum = 0.0;
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

    #[test]
    fn chunk_durations_reach_any_recorder_as_a_histograms_series() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let mut l = WorkerLabels::new("cpu", 0);
            for secs in [2e-5, 2e-5, 5e-3, 50.0] {
                l.chunk_done("k", Phase::Dynamic, 1, secs);
            }
            l.flush();
        });
        let text = handle.render();
        let series = |le: &str| {
            format!(
                "coexec_chunk_duration_seconds_bucket{{device_class=\"cpu\",kernel=\"k\",le=\"{le}\"}}"
            )
        };
        // Cumulative: each bound counts the chunks at or below it.
        for (le, n) in [
            ("0.00001", 0),
            ("0.00003", 2),
            ("0.001", 2),
            ("0.01", 3),
            ("30", 3),
            ("100", 4),
            ("+Inf", 4),
        ] {
            assert!(
                text.contains(&format!("{} {n}\n", series(le))),
                "le={le}:\n{text}"
            );
        }
        let labels = "{device_class=\"cpu\",kernel=\"k\"}";
        assert!(
            text.contains(&format!("coexec_chunk_duration_seconds_count{labels} 4\n")),
            "{text}"
        );
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("coexec_chunk_duration_seconds_sum{labels} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no sum:\n{text}"));
        assert!((sum - 50.00504).abs() < 1e-9, "{sum}");
    }
}
