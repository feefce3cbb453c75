//! `coexec-load` against a stub server on 127.0.0.1:0: open-loop latencies
//! include the server's queueing, every outcome is counted where it belongs,
//! a run stops at its time limit, crossed-up answers show, and targets off
//! this machine are refused. Every run here is a few dozen requests and a few
//! seconds at most.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::Value;

/// How the stub answers request `id` (the generator's `x-request-id`).
#[derive(Clone, Copy)]
enum Behavior {
    /// Correct answers, one at a time, each taking this long.
    Serial(Duration),
    /// By `id % 4`: 200, 429 (with Retry-After), 504, never.
    Mixed,
    /// Never answers.
    Hang,
    /// 200s with a wrong label on every row.
    WrongLabels,
    /// Odd ids: one output too many; ids divisible by 4: another request's id.
    Broken,
}

struct Stub {
    behavior: Behavior,
    serial: tokio::sync::Mutex<()>,
}

/// Rows of the synthetic data: row r is filled with r, its label r % 10.
const ROWS: usize = 20;
const FEATURES: usize = 4;

fn data_file() -> PathBuf {
    // One file per call: tests run in parallel threads of one process.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "coexec-load-test-{}-{}.safetensors",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let x: Vec<u8> = (0..ROWS * FEATURES)
        .flat_map(|i| ((i / FEATURES) as f32).to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..ROWS as i64)
        .flat_map(|r| (r % 10).to_le_bytes())
        .collect();
    let bytes = safetensors::serialize(
        [
            (
                "x",
                TensorView::new(Dtype::F32, vec![ROWS, FEATURES], &x).unwrap(),
            ),
            ("y", TensorView::new(Dtype::I64, vec![ROWS], &y).unwrap()),
            ("pred", TensorView::new(Dtype::I64, vec![ROWS], &y).unwrap()),
        ],
        None,
    )
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `{"outputs": [...]}` for the body's rows, labels shifted by `shift`.
fn outputs(body: &[u8], shift: i64, extra: bool) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    let mut outs: Vec<Value> = v["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let label = (row[0].as_f64().unwrap() as i64 + shift) % 10;
            let mut probs = vec![0.0; 10];
            probs[label as usize] = 1.0;
            serde_json::json!({"label": label, "probs": probs})
        })
        .collect();
    if extra {
        outs.push(outs[0].clone());
    }
    serde_json::json!({ "outputs": outs }).to_string()
}

async fn infer(State(s): State<Arc<Stub>>, headers: HeaderMap, body: Bytes) -> Response {
    let id: u64 = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let hang = || tokio::time::sleep(Duration::from_secs(3600));
    match s.behavior {
        Behavior::Serial(d) => {
            let _one_at_a_time = s.serial.lock().await;
            tokio::time::sleep(d).await;
            outputs(&body, 0, false).into_response()
        }
        Behavior::Mixed => match id % 4 {
            0 => outputs(&body, 0, false).into_response(),
            1 => (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "1")],
                "full",
            )
                .into_response(),
            2 => (StatusCode::GATEWAY_TIMEOUT, "deadline passed").into_response(),
            _ => {
                hang().await;
                StatusCode::OK.into_response()
            }
        },
        Behavior::Hang => {
            hang().await;
            StatusCode::OK.into_response()
        }
        Behavior::WrongLabels => outputs(&body, 1, false).into_response(),
        Behavior::Broken => {
            if id % 2 == 1 {
                outputs(&body, 0, true).into_response()
            } else if id.is_multiple_of(4) {
                (
                    [("x-request-id", (id + 1).to_string())],
                    outputs(&body, 0, false),
                )
                    .into_response()
            } else {
                outputs(&body, 0, false).into_response()
            }
        }
    }
}

/// Starts a stub on 127.0.0.1:0 in a thread of its own; it lives as long as
/// the test process.
fn stub(behavior: Behavior) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let state = Arc::new(Stub {
                behavior,
                serial: tokio::sync::Mutex::new(()),
            });
            let app = Router::new()
                .route("/v1/infer", post(infer))
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// `coexec-load args…`: (exit code, stdout, stderr, how long it ran).
pub(crate) fn load(args: &[&str]) -> (i32, String, String, Duration) {
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_coexec-load"))
        .args(args)
        .output()
        .expect("run coexec-load");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t0.elapsed(),
    )
}

/// Runs against `addr` with `--json` and returns the rates' reports.
fn run_json(addr: SocketAddr, extra: &[&str]) -> (Vec<Value>, Duration) {
    run_json_failing(addr, extra, None)
}

/// As [`run_json`], for a run that must exit 1 (the report printed first)
/// with `why` in its one stderr line; `None` expects exit 0.
fn run_json_failing(addr: SocketAddr, extra: &[&str], why: Option<&str>) -> (Vec<Value>, Duration) {
    let data = data_file();
    let target = format!("http://{addr}");
    let mut args = vec![
        "--target",
        &target,
        "--data",
        data.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let (rc, out, err, took) = load(&args);
    match why {
        None => assert_eq!(rc, 0, "stderr: {err}"),
        Some(why) => {
            assert_eq!(rc, 1, "stderr: {err}");
            assert!(
                err.starts_with("coexec-load: ") && err.contains(why),
                "{err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
    }
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (v["rates"].as_array().unwrap().clone(), took)
}

fn n(r: &Value, k: &str) -> u64 {
    r[k].as_u64().unwrap_or_else(|| panic!("`{k}` in {r}"))
}

fn ms(r: &Value, which: &str, k: &str) -> f64 {
    r[which][k].as_f64().unwrap()
}

#[test]
fn refuses_targets_off_this_machine_with_exit_2() {
    for target in [
        "http://10.0.0.1:8080",
        "http://example.com",
        "http://0.0.0.0:8080",
        "http://[2001:db8::1]:80",
        "https://127.0.0.1:8080",
        "127.0.0.1:8080",
    ] {
        let (rc, out, err, _) = load(&["--target", target, "--rate", "10", "--requests", "1"]);
        assert_eq!(rc, 2, "{target}: {err}");
        assert!(out.is_empty(), "{target}: {out}");
        assert_eq!(err.trim_end().lines().count(), 1, "{target}: {err}");
        assert!(err.starts_with("coexec-load: "), "{target}: {err}");
    }
    for bad in [
        &["--rate", "0"][..],
        &["--rate", "10", "--requests", "0"],
        &["--rate", "10", "--timeout", "-1"],
        &["--rate", "10", "--data", "/nonexistent/x.safetensors"],
        &["--bogus"],
    ] {
        let (rc, _, err, _) = load(bad);
        assert_eq!(rc, 2, "{bad:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad:?}: {err}");
    }
}

#[test]
fn open_loop_latency_includes_the_servers_queueing() {
    // The stub serves one request per 20 ms (50/s); 100/s arrive. Request i
    // is due at 10i ms and done near 20(i+1) ms, so its latency grows by
    // 10 ms a request. A closed loop would see 20 ms for every one.
    let addr = stub(Behavior::Serial(Duration::from_millis(20)));
    let (rates, _) = run_json(
        addr,
        &["--rate", "100", "--requests", "30", "--timeout", "5"],
    );
    let r = &rates[0];
    assert_eq!((n(r, "sent"), n(r, "ok"), n(r, "lost")), (30, 30, 0), "{r}");
    assert_eq!(r["accuracy"].as_f64(), Some(1.0));
    assert_eq!(r["agreement"].as_f64(), Some(1.0));
    assert!(ms(r, "latency_ok", "max_ms") >= 250.0, "{r}");
    assert!(ms(r, "latency_ok", "p99_ms") >= 200.0, "{r}");
    assert!(ms(r, "latency_ok", "p50_ms") >= 100.0, "{r}");
    // Throughput is the server's, not the offered rate.
    assert!(r["throughput"].as_f64().unwrap() < 60.0, "{r}");

    // Below its capacity the same stub answers in about its service time.
    let (rates, _) = run_json(addr, &["--rate", "10", "--requests", "8", "--timeout", "5"]);
    let r = &rates[0];
    assert_eq!(n(r, "ok"), 8, "{r}");
    assert!(ms(r, "latency_ok", "p50_ms") < 100.0, "{r}");
}

#[test]
fn counts_429_504_and_lost_where_they_belong() {
    let addr = stub(Behavior::Mixed);
    let (rates, took) = run_json(
        addr,
        &[
            "--rate",
            "200",
            "--requests",
            "40",
            "--timeout",
            "0.5",
            "--duration-limit",
            "5",
        ],
    );
    let r = &rates[0];
    assert_eq!(n(r, "sent"), 40, "{r}");
    assert_eq!(
        [
            n(r, "ok"),
            n(r, "status_429"),
            n(r, "status_504"),
            n(r, "other")
        ],
        [10, 10, 10, 0],
        "{r}"
    );
    assert_eq!(
        (n(r, "lost"), n(r, "lost_timeout"), n(r, "lost_cut")),
        (10, 10, 0),
        "{r}"
    );
    assert_eq!(
        (n(r, "refused"), n(r, "duplicated"), n(r, "malformed")),
        (0, 0, 0),
        "{r}"
    );
    assert_eq!(n(r, "status_429_without_retry_after"), 0, "{r}");
    assert_eq!(n(r, "status_503"), 0, "{r}");
    assert_eq!(n(&r["latency_ok"], "count"), 10, "{r}");
    assert_eq!(n(&r["latency_all"], "count"), 30, "{r}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn stops_by_itself_at_the_time_limit() {
    let addr = stub(Behavior::Hang);
    // Nothing answered: the report, then exit 1.
    let (rates, took) = run_json_failing(
        addr,
        &[
            "--rate",
            "20",
            "--requests",
            "1000",
            "--timeout",
            "60",
            "--duration-limit",
            "1",
        ],
        Some("rate 20: no request was answered"),
    );
    let r = &rates[0];
    let sent = n(r, "sent");
    assert!((15..=21).contains(&sent), "{r}");
    assert_eq!(n(r, "unsent"), 1000 - sent, "{r}");
    assert_eq!((n(r, "lost"), n(r, "lost_cut")), (sent, sent), "{r}");
    assert_eq!(n(r, "ok"), 0);
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn crossed_up_answers_show() {
    // Every label off by one: the answers parse, the accuracy collapses.
    let addr = stub(Behavior::WrongLabels);
    let (rates, _) = run_json(
        addr,
        &[
            "--rate",
            "200",
            "--requests",
            "10",
            "--rows-per-request",
            "3",
        ],
    );
    let r = &rates[0];
    assert_eq!((n(r, "ok"), n(r, "rows_checked")), (10, 30), "{r}");
    assert_eq!(r["accuracy"].as_f64(), Some(0.0));
    assert_eq!(r["agreement"].as_f64(), Some(0.0));

    // Wrong output counts are malformed; another request's id is crossed.
    // A broken contract fails the run, after its report; the record names
    // each broken answer.
    let addr = stub(Behavior::Broken);
    let file = std::env::temp_dir().join(format!("coexec-load-broken-{}.csv", std::process::id()));
    let (rates, _) = run_json_failing(
        addr,
        &[
            "--rate",
            "200",
            "--requests",
            "20",
            "--rows-per-request",
            "2",
            "--record",
            file.to_str().unwrap(),
        ],
        Some("0 duplicated, 10 malformed, 5 crossed answers"),
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let outcomes: Vec<&str> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(5).unwrap())
        .collect();
    let count = |o: &str| outcomes.iter().filter(|x| **x == o).count();
    assert_eq!(
        (count("200"), count("200-malformed"), count("200-crossed")),
        (5, 10, 5),
        "{text}"
    );
    let r = &rates[0];
    assert_eq!(
        (n(r, "ok"), n(r, "malformed"), n(r, "crossed")),
        (20, 10, 5),
        "{r}"
    );
    assert_eq!(n(r, "rows_checked"), 10, "{r}");
    assert_eq!(r["accuracy"].as_f64(), Some(1.0));
    assert!(
        r["first_malformed"]
            .as_str()
            .unwrap()
            .contains("3 outputs for 2 inputs"),
        "{r}"
    );
}

/// `--record`: one CSV line per request, in index order, with each one's
/// outcome and latency, across rates.
#[test]
fn records_every_requests_fate() {
    let addr = stub(Behavior::Mixed);
    let file = std::env::temp_dir().join(format!("coexec-load-record-{}.csv", std::process::id()));
    let record = file.to_str().unwrap();
    let (rates, _) = run_json(
        addr,
        &[
            "--rate",
            "200,400",
            "--requests",
            "20",
            "--timeout",
            "0.3",
            "--record",
            record,
        ],
    );
    assert_eq!(rates.len(), 2);
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("rate,index,scheduled_ms,scheduled_unix_ms,send_lag_ms,outcome,latency_ms")
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0;
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 40, "{text}");
    for (k, row) in rows.iter().enumerate() {
        let (rate, i) = if k < 20 { (200.0, k) } else { (400.0, k - 20) };
        assert_eq!(row.len(), 7, "{row:?}");
        assert_eq!(row[0].parse::<f64>().unwrap(), rate);
        assert_eq!(row[1], i.to_string());
        let scheduled: f64 = row[2].parse().unwrap();
        assert!(
            (scheduled - i as f64 * 1000.0 / rate).abs() < 1e-3,
            "{row:?}"
        );
        // The wall clock of the scheduled send: within the last minute.
        let unix: f64 = row[3].parse().unwrap();
        assert!(unix <= now_ms && unix > now_ms - 60_000.0, "{row:?}");
        assert!(row[4].parse::<f64>().unwrap() >= 0.0, "{row:?}");
        // The stub answers by id modulo 4: 200, 429, 504, never.
        let (outcome, answered) = match i % 4 {
            0 => ("200", true),
            1 => ("429", true),
            2 => ("504", true),
            _ => ("timeout", false),
        };
        assert_eq!(row[5], outcome, "{row:?}");
        assert_eq!(row[6].parse::<f64>().is_ok(), answered, "{row:?}");
    }
}

#[test]
fn a_record_file_that_cannot_be_written_exits_2_before_the_run() {
    let (rc, out, err, took) = load(&[
        "--target",
        "http://127.0.0.1:9",
        "--rate",
        "1",
        "--requests",
        "100",
        "--record",
        "/nonexistent/dir/trace.csv",
    ]);
    assert_eq!(rc, 2, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("--record /nonexistent/dir/trace.csv"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn several_rates_and_a_table() {
    let addr = stub(Behavior::Serial(Duration::from_millis(1)));
    let (rates, _) = run_json(addr, &["--rate", "50,100", "--requests", "5"]);
    assert_eq!(rates.len(), 2);
    assert_eq!(
        (rates[0]["rate"].as_f64(), rates[1]["rate"].as_f64()),
        (Some(50.0), Some(100.0))
    );
    let data = data_file();
    let target = format!("http://localhost:{}", addr.port());
    let (rc, out, err, _) = load(&[
        "--target",
        &target,
        "--data",
        data.to_str().unwrap(),
        "--rate",
        "100",
        "--requests",
        "3",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("rate/s") && out.contains("p99 ms"), "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
}

#[test]
fn a_capacity_search_brackets_a_serial_servers_rate() {
    // One request at a time, 5 ms each: about 200/s, past which the queue
    // (and the p99) grows with every request.
    let addr = stub(Behavior::Serial(Duration::from_millis(5)));
    let data = data_file();
    let target = format!("http://{addr}");
    let (rc, out, err, _) = load(&[
        "--target",
        &target,
        "--data",
        data.to_str().unwrap(),
        "--json",
        "--rate",
        "25",
        "--requests",
        "40",
        "--capacity-p99-ms",
        "50",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let c = &v["capacity"];
    let rates = v["rates"].as_array().unwrap();
    assert_eq!(c["verdicts"].as_array().unwrap().len(), rates.len(), "{c}");
    assert_eq!(rates[0]["rate"].as_f64(), Some(25.0));
    let (passed, failed) = (c["passed"].as_f64().unwrap(), c["failed"].as_f64().unwrap());
    assert!((50.0..=400.0).contains(&passed), "{c}");
    assert!(failed > passed && failed / passed <= 1.1 + 1e-9, "{c}");

    // One start rate only.
    let (rc, _, err, _) = load(&[
        "--target",
        &target,
        "--rate",
        "25,50",
        "--capacity-p99-ms",
        "50",
    ]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--capacity-p99-ms takes one --rate"), "{err}");
}
