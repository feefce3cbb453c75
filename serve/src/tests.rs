use std::future::Future;

use super::body::*;
use super::infer::*;
use super::*;
use crate::net::server::*;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue};

/// Connections whose handshake the kernel completed before the signal
/// are answered, not reset when the listener closes: the signal is
/// ready from the start, so the accept loop may take none of them
/// (before, each was lost with probability about a half).
#[test]
fn connections_queued_at_the_signal_get_an_answer() {
    use std::io::{Read, Write};
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    let mut clients: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                .unwrap();
            c
        })
        .collect();
    std_listener.set_nonblocking(true).unwrap();
    tokio.block_on(async {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        let app = Router::new().route("/x", get(|| async { "answered" }));
        tokio::time::timeout(
            Duration::from_secs(10),
            serve(listener, app, std::future::ready(())),
        )
        .await
        .expect("serve returns");
    });
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer)
            .expect("an answer, not a reset");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.ends_with("answered"), "{answer:?}");
    }
}

/// Past the connection limit, a new client takes the slot of the
/// keep-alive connection idle longest (never one with a head or a
/// request in progress), instead of waiting for it to time out.
#[test]
fn a_client_past_the_limit_takes_the_slot_of_the_connection_idle_longest() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio.block_on(async {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            let app = Router::new().route("/x", get(|| async { "answered" }));
            let signal = async {
                let _ = stopped.await;
            };
            serve_with(
                listener,
                app,
                signal,
                ServerConfig::new().max_connections(2),
            )
            .await;
        });
    });
    const HEAD: &[u8] = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n";
    let connect = || {
        let c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    };
    // One answer on a keep-alive connection (a timeout fails the test).
    let answer = |c: &mut TcpStream| {
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(b"answered") {
            let n = c.read(&mut buf).expect("an answer in time");
            assert!(n > 0, "closed before the answer: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
    };
    // Closed by the server: end of stream or a reset, not a timeout.
    let closed = |c: &mut TcpStream| match c.read(&mut [0u8; 64]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let (mut a, mut b) = (connect(), connect());
    a.write_all(HEAD).unwrap();
    answer(&mut a);
    pause();
    b.write_all(HEAD).unwrap();
    answer(&mut b);
    pause();
    // Both slots hold idle connections; a third client is answered.
    let mut c = connect();
    c.write_all(HEAD).unwrap();
    answer(&mut c);
    assert!(closed(&mut a), "the connection idle longest was closed");
    // b, idle longer than c, is reading a head: a fourth client takes
    // c's slot, not b's.
    b.write_all(b"GET /x HTTP/1.1\r\n").unwrap();
    pause();
    let mut d = connect();
    d.write_all(HEAD).unwrap();
    answer(&mut d);
    assert!(closed(&mut c), "the idle connection was closed");
    b.write_all(b"host: t\r\n\r\n").unwrap();
    answer(&mut b);
    let _ = stop.send(());
    drop((b, d));
    server.join().unwrap();
}

#[test]
fn retry_after_follows_the_backlog_and_the_drain_rate() {
    let cap = Duration::from_secs(30);
    assert_eq!(retry_after(1000, 100.0, cap), 10);
    assert_eq!(retry_after(1001, 100.0, cap), 11);
    assert_eq!(retry_after(10, 1000.0, cap), 1, "at least 1 s");
    assert_eq!(retry_after(1_000_000, 10.0, cap), 30, "capped");
    assert_eq!(retry_after(5, 0.0, cap), 1, "nothing measured yet");
}

/// A first burst after a quiet start is measured over the burst, not
/// over the quiet time (before: 30 s `Retry-After` for a backlog that
/// drained in milliseconds, on a server idle for its first 10 s).
#[test]
fn drain_rate_after_a_quiet_spell_measures_the_burst() {
    let mut d = DrainRate::default();
    d.answered(100, 10.0);
    assert_eq!(d.rate(10.01), 0.0, "too short to tell");
    d.answered(900, 10.1);
    assert!((d.rate(10.1) - 10_000.0).abs() < 1e-6, "{}", d.rate(10.1));
    d.answered(4000, 10.5);
    assert!((d.rate(10.5) - 10_000.0).abs() < 1e-6, "{}", d.rate(10.5));
    assert_eq!(retry_after(5000, d.rate(10.5), Duration::from_secs(30)), 1);
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

fn with_length(n: usize) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    h
}

#[test]
fn a_body_is_read_within_its_limit_and_deadline() {
    let limit = 8;
    let d = Duration::from_secs(5);
    let ok = block_on(read_body(&with_length(5), Body::from("12345"), limit, d));
    assert_eq!(ok.unwrap(), Bytes::from("12345"));
    // Declared over the limit: refused before reading (this body would
    // never end).
    let (_tx, never) = http_body_util::Channel::<Bytes, std::io::Error>::new(1);
    let r = block_on(read_body(&with_length(9), Body::new(never), limit, d));
    assert_eq!(r, Err(BodyFault::TooLarge));
    // Undeclared (chunked) and over the limit as it arrives.
    let r = block_on(read_body(
        &HeaderMap::new(),
        Body::from("123456789"),
        limit,
        d,
    ));
    assert_eq!(r, Err(BodyFault::TooLarge));
}

/// On paused time: the clock moves only when every task waits, so the
/// deadline is met exactly, whatever the machine's load.
#[tokio::test(start_paused = true)]
async fn a_stalled_body_ends_at_its_deadline() {
    let (mut tx, body) = http_body_util::Channel::<Bytes, std::io::Error>::new(1);
    let t = tokio::time::Instant::now();
    tx.send_data(Bytes::from("{")).await.unwrap();
    // `tx` lives on: the body neither ends nor fails.
    let r = read_body(
        &with_length(100),
        Body::new(body),
        1024,
        Duration::from_millis(100),
    )
    .await;
    drop(tx);
    assert_eq!(r, Err(BodyFault::Stalled));
    let took = t.elapsed();
    assert!(
        (Duration::from_millis(100)..=Duration::from_millis(101)).contains(&took),
        "{took:?}"
    );
}

/// A frame of one byte that, like hyper's, keeps a whole read buffer
/// alive; counts how many are alive at once.
struct Frame {
    buf: Vec<u8>,
    live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..1]
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A body sent one byte per frame is held as its bytes, not as its frames
/// (each frame's buffer dropped as it is read): a client sending one byte
/// per TCP segment held kilobytes per byte.
#[test]
fn a_body_of_tiny_frames_keeps_its_bytes_not_its_frames() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const FRAMES: usize = 2000;
    let live = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (mut tx, body) = http_body_util::Channel::<Bytes, std::io::Error>::new(1);
    let (l, p) = (live.clone(), peak.clone());
    let r = block_on(async move {
        let send = async move {
            for k in 0..FRAMES {
                let n = l.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(n, Ordering::SeqCst);
                let mut buf = vec![0u8; 8192];
                buf[0] = b'0' + (k % 10) as u8;
                let frame = Frame {
                    buf,
                    live: l.clone(),
                };
                if tx.send_data(Bytes::from_owner(frame)).await.is_err() {
                    break;
                }
            }
        };
        let headers = with_length(FRAMES);
        let read = read_body(&headers, Body::new(body), 1 << 20, Duration::from_secs(5));
        tokio::join!(send, read).1
    });
    let got = r.unwrap();
    assert_eq!(got.len(), FRAMES);
    assert!(
        got.iter()
            .enumerate()
            .all(|(k, &b)| b == b'0' + (k % 10) as u8)
    );
    assert_eq!(live.load(Ordering::SeqCst), 0);
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 4, "{peak} frames alive at once");
}

/// The MLP refuses a row of another width or with a number that is not a
/// finite `f32`, naming the width its weights take, and an output that
/// overflowed.
#[cfg(feature = "workloads")]
#[test]
fn the_mlp_checks_rows_against_its_weights() {
    use coexec::stream::{Classification, MlpModel, Model};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let w = coexec::kernels::workloads::MlpWeights::load(dir.join("wine_mlp.safetensors")).unwrap();
    let m = MlpModel::new(std::sync::Arc::new(w));
    assert_eq!(m.describe_input(), "[13 numbers]");
    assert_eq!(m.check_input(&vec![1.0; 13]), Ok(()));
    let e = m.check_input(&vec![1.0; 64]).unwrap_err();
    assert!(e.contains("64 numbers") && e.contains("takes 13"), "{e}");
    let mut row = vec![0.0; 13];
    row[4] = f32::INFINITY;
    assert!(
        m.check_input(&row)
            .unwrap_err()
            .contains("number 4 is not finite")
    );
    let ok = Classification {
        label: 0,
        probs: vec![1.0, 0.0, 0.0],
    };
    assert_eq!(m.check_output(&ok), Ok(()));
    let bad = Classification {
        label: 0,
        probs: vec![f32::NAN, 0.0, 0.0],
    };
    assert!(m.check_output(&bad).unwrap_err().contains("overflows"));
}

#[test]
fn drain_rate_measures_windows_and_decays_when_idle() {
    let mut d = DrainRate::default();
    assert_eq!(d.rate(0.1), 0.0);
    d.answered(100, 0.25);
    d.answered(100, 0.5);
    assert!((d.rate(0.5) - 400.0).abs() < 1e-9);
    d.answered(100, 1.0);
    assert!(
        (d.rate(1.0) - 300.0).abs() < 1e-9,
        "smoothed: {}",
        d.rate(1.0)
    );
    // Nothing answered for 10 s: the estimate falls.
    assert!(d.rate(11.0) < 30.0, "{}", d.rate(11.0));
}

/// A bad `deadline_ms` is refused by name; a good one, or none, is taken.
#[test]
fn a_bad_deadline_is_refused_by_name() {
    let req = |d: &str| {
        serde_json::from_str::<InferRequest<Vec<f32>>>(&format!(
            r#"{{"inputs": [[1.0]], "deadline_ms": {d}}}"#
        ))
    };
    for bad in [
        "-1",
        "1.5",
        "1e20",
        "\"x\"",
        "18446744073709551615",
        "86400001",
    ] {
        let e = req(bad).expect_err(bad).to_string();
        assert!(e.contains("`deadline_ms`"), "{bad}: {e}");
    }
    assert_eq!(req("250").unwrap().deadline_ms, Some(250));
    assert_eq!(req("null").unwrap().deadline_ms, None);
    let none: InferRequest<Vec<f32>> = serde_json::from_str(r#"{"inputs": [[1.0]]}"#).unwrap();
    assert_eq!(none.deadline_ms, None);
}
