//! The Prometheus exporter, scraped over plain HTTP after a real job.
//!
//! The recorder is global to the process, so everything that needs it lives
//! in this one binary and this one test.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use coexec::kernels::Synthetic;

const ITEMS: usize = 12_000;

/// One sample line: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The exposition text: `# TYPE` lines by metric name, and every sample.
#[derive(Debug, Default)]
struct Exposition {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Exposition {
    fn parse(text: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest
                    .split_once(' ')
                    .ok_or_else(|| format!("bad TYPE line {line:?}"))?;
                out.types.insert(name.to_string(), kind.trim().to_string());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .ok_or_else(|| format!("bad sample {line:?}"))?;
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse::<f64>()
                    .map_err(|e| format!("bad value in {line:?}: {e}"))?,
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest
                        .strip_suffix('}')
                        .ok_or_else(|| format!("unclosed labels in {line:?}"))?;
                    (name.to_string(), parse_labels(body)?)
                }
            };
            out.samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Ok(out)
    }

    fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    fn sum(&self, name: &str) -> f64 {
        self.series(name).map(|s| s.value).sum()
    }
}

/// `a="x",b="y"` (values hold no escaped quotes here: label values are
/// device classes, kernels, phases and policies).
fn parse_labels(body: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body.trim_start_matches(',');
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("bad labels {body:?}"))?;
        let (value, after) = after
            .split_once('"')
            .ok_or_else(|| format!("bad labels {body:?}"))?;
        labels.insert(key.trim().to_string(), value.to_string());
        rest = after.trim_start_matches(',');
    }
    Ok(labels)
}

/// `GET path` over HTTP/1.1 with `Connection: close`: (status, body).
fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), Box<dyn std::error::Error>> {
    // The exporter's thread may still be binding: retry the connect briefly.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    };
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8(raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no end of headers")?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or("no status line")?
        .parse::<u16>()?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").ok_or("bad chunk header")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| e.to_string())?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("short chunk")?);
        body = rest
            .get(size..)
            .ok_or("short chunk")?
            .trim_start_matches("\r\n");
    }
}

fn free_loopback_port() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_after_a_job_shows_its_items_chunks_and_durations()
-> Result<(), Box<dyn std::error::Error>> {
    let addr = free_loopback_port()?;
    let _exporter = coexec_serve::metrics::MetricsServer::start(addr)?;
    let rt = coexec::Runtime::builder()
        .devices("cpu:2,sim:1@2")?
        .in_memory_profiles()
        .build()?;
    let mut done = rt.run(Synthetic::new(ITEMS, 50)).await?;
    done.kernel.verify()?;
    let chunks: usize = done.report.classes.iter().map(|c| c.chunks).sum();
    assert!(chunks > 0);

    // Scraping off the async workers: the client blocks.
    let (status, text) =
        tokio::task::spawn_blocking(move || get(addr, "/metrics").map_err(|e| e.to_string()))
            .await??;
    assert_eq!(status, 200, "{text}");
    let m = Exposition::parse(&text)?;

    assert_eq!(
        m.types.get("coexec_items_total").map(String::as_str),
        Some("counter"),
        "{text}"
    );
    assert_eq!(
        m.types.get("coexec_chunks_total").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        m.sum("coexec_items_total"),
        ITEMS as f64,
        "items counted once each"
    );
    assert_eq!(
        m.sum("coexec_chunks_total"),
        chunks as f64,
        "chunks counted once each"
    );
    for s in m.series("coexec_items_total") {
        assert_eq!(
            s.labels.get("kernel").map(String::as_str),
            Some("synthetic")
        );
        assert!(
            ["cpu", "sim"].contains(&s.labels.get("device_class").map_or("", String::as_str)),
            "{s:?}"
        );
    }
    for s in m.series("coexec_chunks_total") {
        let phase = s.labels.get("phase").map_or("", String::as_str);
        assert!(
            ["probe", "static", "dynamic", "retry"].contains(&phase),
            "{s:?}"
        );
    }

    // One histogram through the `metrics` facade: typed as one, its
    // `_bucket`, `_count` and `_sum` series no metrics of their own.
    let h = "coexec_chunk_duration_seconds";
    assert_eq!(
        m.types.get(h).map(String::as_str),
        Some("histogram"),
        "{text}"
    );
    for suffix in ["_bucket", "_count", "_sum"] {
        assert!(!m.types.contains_key(&format!("{h}{suffix}")), "{text}");
    }
    let bucket_name = format!("{h}_bucket");
    let buckets: Vec<&Sample> = m.series(&bucket_name).collect();
    assert!(buckets.iter().all(|b| b.labels.contains_key("le")));
    let inf: Vec<&Sample> = buckets
        .iter()
        .copied()
        .filter(|b| b.labels["le"] == "+Inf")
        .collect();
    assert!(!inf.is_empty(), "no +Inf bucket");
    assert!(buckets.len() > inf.len(), "only the +Inf bucket");
    let count = m.sum(&format!("{h}_count"));
    assert_eq!(count, chunks as f64, "one duration per chunk");
    assert_eq!(
        inf.iter().map(|b| b.value).sum::<f64>(),
        count,
        "+Inf bucket holds every chunk"
    );
    let sum = m.sum(&format!("{h}_sum"));
    assert!(sum > 0.0 && sum.is_finite(), "{h}_sum = {sum}");
    // Cumulative buckets never shrink as `le` grows, per label set.
    let mut by_series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for b in &buckets {
        let mut key = b.labels.clone();
        let le = key.remove("le").unwrap_or_default();
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        by_series
            .entry(format!("{key:?}"))
            .or_default()
            .push((le, b.value));
    }
    for (series, mut bs) in by_series {
        bs.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(
            bs.windows(2).all(|w| w[0].1 <= w[1].1),
            "{series}: buckets not cumulative: {bs:?}"
        );
    }

    assert!(m.sum("coexec_jobs_completed_total") >= 1.0, "{text}");
    assert!(m.sum("coexec_worker_busy_seconds") > 0.0);

    let (status, _) =
        tokio::task::spawn_blocking(move || get(addr, "/other").map_err(|e| e.to_string()))
            .await??;
    assert_eq!(status, 404, "only /metrics is served");

    rt.shutdown().await;
    Ok(())
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit`:
/// a hang shows up as a failure, not as a test that never ends.
fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .map_err(|_| format!("did not finish within {limit:?}"))?
}

#[test]
fn a_scrape_answers_while_idle_and_slow_clients_hold_connections()
-> Result<(), Box<dyn std::error::Error>> {
    let exporter = coexec_serve::metrics::MetricsServer::start("127.0.0.1:0".parse()?)?;
    let rt = coexec::Runtime::builder()
        .devices("cpu:1")?
        .in_memory_profiles()
        .build()?;
    let addr = exporter.addr();
    assert_ne!(addr.port(), 0, "the bound port is reported");

    // 50 clients that connect and say nothing.
    let idle: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)))
        .collect::<Result<_, _>>()?;
    // One that drips a header byte every 100 ms, for as long as it may.
    let drip = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    let dripper = std::thread::spawn(move || {
        let mut drip = drip;
        let started = Instant::now();
        let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
        let _ = drip.write_all(head);
        while started.elapsed() < Duration::from_secs(15) {
            if drip.write_all(b"a").is_err() {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    });
    std::thread::sleep(Duration::from_millis(200));

    // A scrape while all of them are open.
    let t = Instant::now();
    let (status, body) = within(Duration::from_secs(3), move || {
        get(addr, "/metrics").map_err(|e| e.to_string())
    })?;
    let took = t.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(1), "scrape took {took:?}");

    // Concurrent scrapers all answer.
    let scrapers: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || get(addr, "/metrics").map(|r| r.0).ok()))
        .collect();
    for s in scrapers {
        assert_eq!(s.join().ok().flatten(), Some(200));
    }

    // The drip client is cut off by the deadline, not served forever.
    let cut = dripper.join().map_err(|_| "dripper panicked")?;
    let cut = cut.ok_or("the slow client was never cut off")?;
    assert!(cut < Duration::from_secs(10), "cut off after {cut:?}");

    // A head larger than the limit is refused, not read into memory.
    let big = within(Duration::from_secs(5), move || {
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(4)))
            .map_err(|e| e.to_string())?;
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ");
        let _ = s.write_all(&vec![b'a'; 64 * 1024]);
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        Ok(String::from_utf8_lossy(&raw).into_owned())
    })?;
    assert!(
        big.is_empty() || big.starts_with("HTTP/1.1 431"),
        "an oversized head was answered: {big:?}"
    );
    drop(idle);

    // Another exporter cannot take the port; the error says so.
    let taken = coexec_serve::metrics::MetricsServer::start(addr);
    assert!(
        matches!(taken, Err(coexec::Error::MetricsBind { .. })),
        "{taken:?}"
    );

    // The server ends when stopped, its runtime's shutdown beside it.
    let rt_done = within(Duration::from_secs(10), move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(async {
                rt.shutdown().await;
                exporter.stop().await;
            });
        Ok(())
    });
    rt_done?;
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "still serving after shutdown"
    );
    Ok(())
}

/// `coexec run --metrics ADDR --metrics-linger S`: once the run has printed
/// its results the exporter is still up, and a scrape shows the finished
/// job (before, the exporter stopped with the run, so a scrape every 15 s
/// never saw a short one); SIGTERM ends the wait, exit 0.
#[test]
fn run_keeps_its_metrics_up_for_the_linger() -> Result<(), Box<dyn std::error::Error>> {
    let body = scrape_a_lingering_run("linger", &[])?;
    let m = Exposition::parse(&body)?;
    assert!(
        m.sum("coexec_jobs_completed_total") >= 1.0,
        "no finished job in the scrape:\n{body}"
    );
    // The GPUs' telemetry is on the same exporter: it says whether NVML
    // reads, and without it no `coexec_gpu_*` sample stands for a GPU.
    assert!(
        body.contains("coexec_telemetry_up{"),
        "no telemetry status in the scrape:\n{body}"
    );
    assert!(
        m.sum("coexec_telemetry_up") > 0.0 || !body.contains("\ncoexec_gpu_"),
        "GPU samples without NVML:\n{body}"
    );
    Ok(())
}

/// GPU telemetry through NVML loaded as the driver installs it
/// (`libnvidia-ml.so.1` on the library path, no unversioned name), here a
/// fake one (`fake_nvml.c`) with a whole GPU and a MIG instance:
/// `CUDA_VISIBLE_DEVICES` names the MIG instance first by UUID, then the GPU
/// by index, and `/metrics` shows each reading in the exporter's units
/// under the number CUDA gives the device, and no utilisation for the MIG
/// instance, which does not report it (rather than a zero).
#[test]
fn gpu_telemetry_reads_nvml_as_the_driver_installs_it() -> Result<(), Box<dyn std::error::Error>> {
    let lib = std::env::temp_dir().join(format!("coexec-nvml-lib-{}", std::process::id()));
    std::fs::create_dir_all(&lib)?;
    let source = lib.join("fake_nvml.c");
    std::fs::write(&source, include_str!("fake_nvml.c"))?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let built = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(lib.join("libnvidia-ml.so.1"))
        .arg(&source)
        .output();
    if !built.as_ref().is_ok_and(|b| b.status.success()) {
        let _ = std::fs::remove_dir_all(&lib);
    }
    let built = built?;
    assert!(
        built.status.success(),
        "{cc:?} could not build the fake NVML: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let body = scrape_a_lingering_run(
        "fake-nvml",
        &[
            ("LD_LIBRARY_PATH", lib.as_os_str()),
            ("CUDA_VISIBLE_DEVICES", "MIG-fake-b,0".as_ref()),
        ],
    );
    let _ = std::fs::remove_dir_all(&lib);
    let body = body?;
    let m = Exposition::parse(&body)?;
    let up: Vec<_> = m.series("coexec_telemetry_up").collect();
    assert!(
        up.len() == 1 && up[0].value == 1.0 && up[0].labels["reason"].is_empty(),
        "NVML not read:\n{body}"
    );
    // (gpu, uuid, model) as CUDA numbers the devices: the MIG instance first.
    let gpus = [
        ("0", "MIG-fake-b", "Fake H200 MIG 1g.18gb"),
        ("1", "GPU-fake-a", "Fake H200"),
    ];
    let value = |name: &str, gpu: usize| {
        let (index, uuid, model) = gpus[gpu];
        let found: Vec<f64> = m
            .series(name)
            .filter(|s| {
                s.labels.get("gpu").map(String::as_str) == Some(index)
                    && s.labels.get("uuid").map(String::as_str) == Some(uuid)
                    && s.labels.get("model").map(String::as_str) == Some(model)
            })
            .map(|s| s.value)
            .collect();
        assert!(found.len() <= 1, "{name} twice for {uuid}:\n{body}");
        found.first().copied()
    };
    let gib = f64::from(1u32 << 30);
    let want = [
        ("coexec_gpu_utilization_ratio", [None, Some(0.37)]),
        ("coexec_gpu_memory_utilization_ratio", [None, Some(0.12)]),
        ("coexec_gpu_memory_used_bytes", [Some(2.0 * gib), Some(gib)]),
        (
            "coexec_gpu_memory_free_bytes",
            [Some(16.0 * gib), Some(3.0 * gib)],
        ),
        ("coexec_gpu_power_watts", [Some(234.567), Some(123.456)]),
        ("coexec_gpu_temperature_celsius", [Some(62.0), Some(61.0)]),
        ("coexec_gpu_sm_clock_hertz", [Some(1.98e9), Some(1.755e9)]),
    ];
    for (name, per_gpu) in want {
        for (gpu, want) in per_gpu.into_iter().enumerate() {
            let got = value(name, gpu);
            let close = match (got, want) {
                (Some(g), Some(w)) => (g - w).abs() <= 1e-9 * w.abs(),
                (g, w) => g == w,
            };
            assert!(close, "{name} of {}: {got:?}, want {want:?}", gpus[gpu].1);
        }
    }
    Ok(())
}

/// `coexec run synthetic` on one core with `--metrics` and a long linger,
/// with `env` set: the scrape taken once the run has printed its results.
/// Then SIGTERM, which must end the run's wait at once with exit 0.
fn scrape_a_lingering_run(
    name: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<String, Box<dyn std::error::Error>> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let addr = free_loopback_port()?;
    let profiles = std::env::temp_dir().join(format!("coexec-{name}-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args([
            "run",
            "synthetic",
            "--devices",
            "cpu:1",
            "--size",
            "20000",
            "--quiet",
        ])
        .args(["--metrics", &addr.to_string(), "--metrics-linger", "60"])
        .arg("--profile-dir")
        .arg(&profiles)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    // The last line the run prints: the job is over when it comes.
    let ended = within(Duration::from_secs(60), move || {
        let mut lines = std::io::BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("time:") => return Ok(lines),
                Some(Ok(_)) => {}
                other => return Err(format!("the run ended without its time line: {other:?}")),
            }
        }
    });
    let scraped = ended.and_then(|_lines| {
        let (code, body) = get(addr, "/metrics").map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("scrape: {code}"));
        }
        Ok(body)
    });
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?;
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            return Err("still lingering 10 s after SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_dir_all(&profiles);
    let body = scraped?;
    assert!(killed.success());
    assert!(status.success(), "{status}");
    Ok(body)
}
