//! Metric names and the handles workers keep, through the `metrics` facade.
//!
//! Nothing is recorded unless the application (or `coexec --metrics`)
//! installs a recorder; without one every call here is a no-op. Labels are
//! bounded: `device_class` and `worker` by the device spec, `kernel` by the
//! kernels the program runs, `policy` by the registry, `phase` by the method.
//!
//! Histograms are `histogram!`s: their buckets are the exporter's to set
//! ([`CHUNK_BUCKETS`] for the chunk durations; coexec's exporter sets them).
//! A recorder may keep every sample until it is drained:
//! `metrics-exporter-prometheus` keeps each (16 bytes) until a scrape or
//! `PrometheusHandle::run_upkeep`, which coexec's exporter runs every second.

use std::collections::HashMap;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

use crate::RunReport;
use crate::report::Phase;

/// Registers every metric's help text and unit with the installed recorder.
pub fn describe() {
    describe_histogram!(
        "coexec_chunk_duration_seconds",
        Unit::Seconds,
        "Seconds a chunk took on its worker, per device class and kernel."
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
/// Chunk durations are kept as they are (a histogram takes samples, not
/// counts) and recorded one by one at the flush, not on each chunk's path
/// (`metrics-exporter-prometheus` takes some 50 ns a sample on the 2-core
/// VM, and drains it at upkeep).
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
    /// Seconds each chunk took, at most [`FLUSH_CHUNKS`] (room for them is
    /// made once, with the worker's labels).
    durations: Vec<f64>,
}

struct KernelHandles {
    items: Counter,
    chunks: [Counter; 4],
    duration: Histogram,
}

/// Upper bounds of `coexec_chunk_duration_seconds`' buckets, 10 µs to
/// 100 s, for an exporter to set (a `metrics` histogram carries none).
///
/// ```
/// use coexec_actors::metrics::CHUNK_BUCKETS;
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
///
/// let name = Matcher::Full("coexec_chunk_duration_seconds".into());
/// let recorder = PrometheusBuilder::new()
///     .set_buckets_for_metric(name, &CHUNK_BUCKETS)?
///     .build_recorder();
/// # Ok::<(), metrics_exporter_prometheus::BuildError>(())
/// ```
pub const CHUNK_BUCKETS: [f64; 15] = [
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0,
];

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
            pending: Pending {
                durations: Vec::with_capacity(FLUSH_CHUNKS),
                ..Pending::default()
            },
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
        p.durations.push(secs);
        if p.durations.len() >= FLUSH_CHUNKS || p.busy >= FLUSH_BUSY_S {
            self.flush();
        }
    }

    /// Reports everything batched so far.
    pub(crate) fn flush(&mut self) {
        if self.pending.durations.is_empty() {
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
                duration: histogram!("coexec_chunk_duration_seconds", "device_class" => class.clone(), "kernel" => kernel.clone()),
            }
        });
        h.items.increment(p.items);
        for (counter, n) in h.chunks.iter().zip(p.chunks) {
            if n > 0 {
                counter.increment(n);
            }
        }
        for &secs in &p.durations {
            h.duration.record(secs);
        }
        p.items = 0;
        p.chunks = [0; 4];
        p.busy = 0.0;
        p.durations.clear();
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

    /// What a recorder is asked for: each metric's kind and name, and
    /// every sample a histogram gets.
    #[derive(Default)]
    struct Registrations {
        metrics: std::sync::Mutex<Vec<(&'static str, String)>>,
        samples: std::sync::Arc<Samples>,
    }

    #[derive(Default)]
    struct Samples(std::sync::Mutex<Vec<f64>>);

    impl metrics::HistogramFn for Samples {
        fn record(&self, value: f64) {
            self.0.lock().unwrap().push(value);
        }
    }

    impl Registrations {
        fn note(&self, kind: &'static str, key: &metrics::Key) {
            self.metrics
                .lock()
                .unwrap()
                .push((kind, key.name().to_string()));
        }
    }

    impl metrics::Recorder for Registrations {
        fn describe_counter(&self, _: metrics::KeyName, _: Option<Unit>, _: metrics::SharedString) {
        }
        fn describe_gauge(&self, _: metrics::KeyName, _: Option<Unit>, _: metrics::SharedString) {}
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> Counter {
            self.note("counter", key);
            Counter::noop()
        }
        fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> Gauge {
            self.note("gauge", key);
            Gauge::noop()
        }
        fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> Histogram {
            self.note("histogram", key);
            Histogram::from_arc(self.samples.clone())
        }
    }

    const DURATIONS: [f64; 4] = [2e-5, 2e-5, 5e-3, 50.0];

    fn run_chunks() {
        let mut l = WorkerLabels::new("cpu", 0);
        for secs in DURATIONS {
            l.chunk_done("k", Phase::Dynamic, 1, secs);
        }
        l.flush();
    }

    #[test]
    fn chunk_durations_reach_any_recorder_as_one_histogram() {
        let recorder = Registrations::default();
        metrics::with_local_recorder(&recorder, run_chunks);
        let metrics = recorder.metrics.lock().unwrap();
        let durations: Vec<_> = metrics
            .iter()
            .filter(|(_, name)| name.starts_with("coexec_chunk_duration_seconds"))
            .collect();
        assert_eq!(
            durations,
            [&("histogram", "coexec_chunk_duration_seconds".to_string())],
            "{metrics:?}"
        );
        // Nothing else made by hand into a histogram's series.
        assert!(
            metrics
                .iter()
                .all(|(_, n)| !["_bucket", "_sum", "_count"].iter().any(|s| n.ends_with(s))),
            "{metrics:?}"
        );
        assert_eq!(*recorder.samples.0.lock().unwrap(), DURATIONS);
    }

    #[test]
    fn chunk_durations_are_a_prometheus_histogram_with_the_chunk_buckets() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
            .set_buckets(&CHUNK_BUCKETS)
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            describe();
            run_chunks();
        });
        let text = handle.render();
        assert!(
            text.contains("# TYPE coexec_chunk_duration_seconds histogram\n"),
            "{text}"
        );
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
