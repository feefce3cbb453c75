//! The runtime's own cost per chunk, with metrics off and on.
//!
//! The empty kernel does nothing, so a job's time is all scheduling: admission,
//! claims, completion, the report. `dynamic` cuts a job into about 16 equal
//! chunks per worker, so `Empty::new(2 * 16)` on two CPU workers is a job of
//! one-item chunks; criterion's throughput line (elements/s) reads as chunks
//! per second, and µs per chunk is its inverse.
//!
//! Both cases run in one process, in one group, side by side: first with no
//! recorder (every metric call is a no-op), then with the Prometheus recorder
//! installed — once installed it stays for the process, so the order matters.
//!
//! ```text
//! cargo bench -p coexec --bench overhead
//! ```

use std::time::Duration;

use coexec::kernels::Empty;
use coexec::{JobOptions, Runtime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// Workers, and chunks per worker under `dynamic`.
const WORKERS: usize = 2;
const CHUNKS_PER_WORKER: usize = 16;
const ITEMS: usize = WORKERS * CHUNKS_PER_WORKER;

fn runtime() -> Runtime {
    Runtime::builder()
        .devices(&format!("cpu:{WORKERS}"))
        .expect("a valid device spec")
        .in_memory_profiles()
        .build()
        .expect("the runtime starts")
}

fn options() -> JobOptions {
    JobOptions::new().policy(coexec::policy::by_name("dynamic").expect("dynamic is registered"))
}

fn overhead(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut g = c.benchmark_group(format!(
        "overhead/empty_{ITEMS}_items_{WORKERS}_cpu_dynamic"
    ));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for label in ["metrics_off", "metrics_on"] {
        if label == "metrics_on" {
            // The Prometheus recorder, as `coexec-serve`'s exporter installs it.
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("no recorder installed before");
        }
        let rt = runtime();
        let opts = options();
        // Chunks per job, as the runtime cut it: the unit of the throughput line.
        let done = tokio
            .block_on(rt.run_with(Empty::new(ITEMS), opts.clone()))
            .expect("the empty job runs");
        let chunks: usize = done.report.classes.iter().map(|c| c.chunks).sum();
        eprintln!("{label}: {chunks} chunks per job of {ITEMS} items");
        g.throughput(Throughput::Elements(chunks as u64));
        g.bench_function(label, |b| {
            b.iter(|| {
                tokio
                    .block_on(rt.run_with(Empty::new(ITEMS), opts.clone()))
                    .expect("the empty job runs")
            })
        });
        tokio.block_on(rt.shutdown());
    }
    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
