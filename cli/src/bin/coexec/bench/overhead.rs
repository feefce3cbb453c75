//! `coexec bench overhead`, and the machine a report names.

use coexec::{JobOptions, Runtime};

use super::median;
use crate::report::{Machine, Overhead};
use crate::{Common, Failure, build};

/// The scheduler's cost per chunk: the empty kernel, one item per chunk, on
/// the CPU workers. Measured side by side with the Prometheus recorder: a
/// runtime whose metric handles were registered before the recorder was
/// installed (so they are no-ops) alternates with one built after it.
pub(super) async fn overhead(common: &Common, repeat: usize) -> Result<Overhead, Failure> {
    let devices = common.devices.as_deref().unwrap_or("cpu:2");
    let plain = build(common, Some(devices), true)?;
    let workers: usize = plain.classes().iter().map(|c| c.workers).sum();
    let chunks = 1_000_000;
    let opts = JobOptions::new().chunk(1);
    once(&plain, &opts, chunks).await?; // warm-up; registers this runtime's handles as no-ops
    // As `--metrics` runs: the exporter on an ephemeral loopback port.
    let exporter = coexec_serve::metrics::MetricsServer::start(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        0,
    )));
    let metered = match exporter.and_then(|m| {
        let rt = Runtime::builder()
            .devices(devices)?
            .in_memory_profiles()
            .build()?;
        Ok((rt, m))
    }) {
        Ok((rt, exporter)) => {
            once(&rt, &opts, chunks).await?;
            Some((rt, exporter))
        }
        Err(e) => {
            errln!("no Prometheus exporter ({e}): measuring without metrics only");
            None
        }
    };
    // Pairs in alternating order (off-on, on-off, ...): each pair's ratio
    // compares two adjacent runs, and neither side always goes first.
    let (mut off, mut on, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..repeat {
        match &metered {
            Some((rt, _)) => {
                let (m, p) = if i % 2 == 1 {
                    let m = once(rt, &opts, chunks).await?;
                    (m, once(&plain, &opts, chunks).await?)
                } else {
                    let p = once(&plain, &opts, chunks).await?;
                    (once(rt, &opts, chunks).await?, p)
                };
                on.push(m);
                off.push(p);
                ratios.push(m / p);
            }
            None => off.push(once(&plain, &opts, chunks).await?),
        }
    }
    plain.shutdown().await;
    if let Some((rt, exporter)) = metered {
        rt.shutdown().await;
        exporter.stop().await;
    }
    let secs = median(&off);
    Ok(Overhead {
        workers,
        repeat,
        chunks,
        seconds: secs,
        us_per_chunk: secs / chunks as f64 * 1e6,
        chunks_per_second: chunks as f64 / secs,
        with_metrics_us_per_chunk: (!on.is_empty()).then(|| median(&on) / chunks as f64 * 1e6),
        with_metrics_ratio: (!ratios.is_empty()).then(|| median(&ratios)),
    })
}

/// One run of the empty kernel; its makespan.
async fn once(rt: &Runtime, opts: &JobOptions, chunks: usize) -> Result<f64, Failure> {
    let done = rt
        .run_with(coexec::kernels::Empty::new(chunks), opts.clone())
        .await?;
    Ok(done.report.makespan_s)
}

pub(super) fn machine(rt: &Runtime) -> Machine {
    let fp = coexec::profile::Fingerprint::this_machine(
        rt.gpus().iter().map(|g| g.name.clone()).collect(),
    );
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Machine {
        cpu_model: fp.cpu_model,
        cores: fp.cores,
        gpus: fp.accelerators,
        date: format_utc(secs),
    }
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days).
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
