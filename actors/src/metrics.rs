//! Metric names and the handles workers keep, through the `metrics` facade.
//!
//! Nothing is recorded unless the application (or `coexec --metrics`)
//! installs a recorder; without one every call here is a no-op. Labels are
//! bounded: `device_class` and `worker` by the device spec, `kernel` by the
//! kernels the program runs, `policy` by the registry, `phase` by the method.

use std::collections::HashMap;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
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
    describe_histogram!(
        "coexec_chunk_duration_seconds",
        Unit::Seconds,
        "Wall time of one chunk on its worker."
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
        "Chunks that failed on a worker and went back to the broker."
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

/// One worker's handles, created once so the hot path does no lookups.
pub(crate) struct WorkerLabels {
    class: String,
    busy: Gauge,
    idle: Gauge,
    retries: Counter,
    per_kernel: std::cell::RefCell<HashMap<String, KernelHandles>>,
}

struct KernelHandles {
    items: Counter,
    duration: Histogram,
    chunks: [Counter; 4],
}

impl WorkerLabels {
    pub(crate) fn new(class: &str, worker: usize) -> Self {
        let labels = [
            ("device_class", class.to_string()),
            ("worker", worker.to_string()),
        ];
        Self {
            class: class.to_string(),
            busy: gauge!("coexec_worker_busy_seconds", &labels),
            idle: gauge!("coexec_worker_idle_seconds", &labels),
            retries: counter!("coexec_chunk_retries_total", "device_class" => class.to_string()),
            per_kernel: Default::default(),
        }
    }

    pub(crate) fn chunk_done(&self, kernel: &str, phase: Phase, items: usize, secs: f64) {
        self.busy.increment(secs);
        let mut map = self.per_kernel.borrow_mut();
        if !map.contains_key(kernel) {
            let l = |phase: &'static str| counter!("coexec_chunks_total", "device_class" => self.class.clone(), "kernel" => kernel.to_string(), "phase" => phase);
            map.insert(
                kernel.to_string(),
                KernelHandles {
                    items: counter!("coexec_items_total", "device_class" => self.class.clone(), "kernel" => kernel.to_string()),
                    duration: histogram!("coexec_chunk_duration_seconds", "device_class" => self.class.clone(), "kernel" => kernel.to_string()),
                    chunks: [l("probe"), l("static"), l("dynamic"), l("retry")],
                },
            );
        }
        if let Some(h) = map.get(kernel) {
            h.items.increment(items as u64);
            h.duration.record(secs);
            h.chunks[phase as usize].increment(1);
        }
    }

    pub(crate) fn chunk_failed(&self) {
        self.retries.increment(1);
    }

    pub(crate) fn idle(&self, secs: f64) {
        self.idle.increment(secs);
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
