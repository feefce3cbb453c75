//! The process's Prometheus recorder drains its histograms whether or not
//! anyone scrapes: a service nobody scrapes must not grow without bound.
//! A histogram keeps every sample until drained (~16 bytes each, measured
//! below), and before, only a scrape drained them. A test binary of its own, so that the
//! process's memory is this test's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coexec::kernels::workloads::MlpWeights;
use coexec::stream::{MlpModel, StreamConfig};
use coexec_serve::{ServeConfig, Service};

/// Resident memory in KiB (Linux), `None` elsewhere.
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Records 100 000 samples every 50 ms for `secs` seconds.
async fn record(h: &metrics::Histogram, secs: u64) -> u64 {
    let start = Instant::now();
    let mut recorded = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        for i in 0..100_000 {
            h.record(f64::from(i) * 1e-6);
        }
        recorded += 100_000;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    recorded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_are_drained_without_a_scrape() {
    if rss_kib().is_none() {
        eprintln!("skipped: no /proc/self/status to read the memory from");
        return;
    }
    let models = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let w = Arc::new(MlpWeights::load(models.join("digits_mlp.safetensors")).unwrap());
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .build()
            .unwrap(),
    );
    // coexec's recorder, installed as `coexec serve` does.
    let prometheus = coexec_serve::metrics::install().unwrap();
    let cfg = ServeConfig::new().prometheus(prometheus);
    let svc = Service::start(rt, MlpModel::new(w), StreamConfig::new(), cfg).unwrap();

    // ~2 M samples a second: 2 s to reach a steady state, then 4 s more,
    // which add ~100 MB if nothing drains them and nothing when a second's
    // worth at most is waiting.
    let h = metrics::histogram!("coexec_test_samples_seconds");
    record(&h, 2).await;
    let before = rss_kib().unwrap();
    let recorded = record(&h, 4).await;
    let after = rss_kib().unwrap();
    let grew = after.saturating_sub(before) / 1024;
    eprintln!("{recorded} samples, no scrape: RSS +{grew} MiB");
    assert!(
        grew < 32,
        "{recorded} histogram samples and no scrape: RSS {} -> {} MiB (+{grew} MiB)",
        before / 1024,
        after / 1024
    );
    svc.shutdown().await;
}
