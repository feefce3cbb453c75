//! A user's own model behind the HTTP service: the JSON of requests and
//! answers comes from the model's types, its checks give the 400s, and the
//! service installs no metrics recorder but records into the one the
//! application installed. A test binary of its own: the process's global
//! recorder is this test's.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

use coexec::kernels::{Chunk, DisjointBuf, Kernel, KernelError};
use coexec::stream::{Model, StreamConfig};
use coexec_serve::{ServeConfig, ServeModel, Service};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pair {
    a: u32,
    b: u32,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Sum {
    sum: u64,
}

struct Adder {
    pairs: Vec<Pair>,
    out: DisjointBuf<Sum>,
}

impl Kernel for Adder {
    fn name(&self) -> &str {
        "adder"
    }
    fn items(&self) -> usize {
        self.pairs.len()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        for (o, p) in self
            .out
            .chunk_mut(chunk)
            .iter_mut()
            .zip(&self.pairs[chunk.range()])
        {
            o.sum = u64::from(p.a) + u64::from(p.b);
        }
        Ok(())
    }
}

struct AddModel;

impl Model for AddModel {
    type Input = Pair;
    type Output = Sum;
    type Kernel = Adder;
    fn build(&self, pairs: Vec<Pair>) -> Result<Adder, KernelError> {
        let out = DisjointBuf::new(pairs.len(), 1);
        Ok(Adder { pairs, out })
    }
    fn outputs(&self, k: Adder) -> Result<Vec<Sum>, KernelError> {
        Ok(k.out.into_vec())
    }
    fn check_input(&self, p: &Pair) -> Result<(), String> {
        if p.a == 13 || p.b == 13 {
            Err("13 is unlucky".into())
        } else {
            Ok(())
        }
    }
}

impl ServeModel for AddModel {
    fn describe_input(&self) -> String {
        r#"{"a": n, "b": n}"#.into()
    }

    fn warm_up_inputs(&self, n: usize) -> Vec<Pair> {
        vec![Pair { a: 1, b: 1 }; n]
    }
}

/// Status code and body of one request on a fresh connection.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_model_is_served_with_the_applications_recorder() {
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .start()
            .await
            .unwrap(),
    );
    let svc = Service::start(rt, AddModel, StreamConfig::new(), ServeConfig::new()).unwrap();

    // The service took no recorder: the application's own goes in after it.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .expect("Service::start must leave the process's recorder to the application");

    // The app's /metrics beside the service's routes (which have none: a
    // second `/metrics` would make `merge` panic).
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || async move { handle.render() }),
        )
        .merge(svc.router());
    let listener = coexec_serve::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(coexec_serve::serve(listener, app, async {
        let _ = stopped.await;
    }));

    let answers = tokio::task::spawn_blocking(move || {
        vec![
            http(
                addr,
                "POST",
                "/v1/infer",
                r#"{"inputs": [{"a": 1, "b": 2}, {"b": 40, "a": 2}]}"#,
            ),
            http(
                addr,
                "POST",
                "/v1/infer",
                r#"{"inputs": [{"a": 1, "b": 2}, {"a": 13, "b": 0}]}"#,
            ),
            http(addr, "POST", "/v1/infer", r#"{"inputs": [{"a": "one"}]}"#),
            http(addr, "GET", "/metrics", ""),
        ]
    })
    .await
    .unwrap();

    assert_eq!(
        answers[0],
        (200, r#"{"outputs":[{"sum":3},{"sum":42}]}"#.to_string())
    );
    let (status, body) = &answers[1];
    assert_eq!(*status, 400, "{body}");
    assert!(body.contains("inputs[1]: 13 is unlucky"), "{body}");
    let (status, body) = &answers[2];
    assert_eq!(*status, 400, "{body}");
    assert!(
        body.contains(r#"{\"inputs\": [{\"a\": n, \"b\": n}, ...]}"#),
        "the model's own description: {body}"
    );
    let (status, metrics) = &answers[3];
    assert_eq!(*status, 200);
    for line in [
        r#"coexec_requests_total{outcome="success"} 1"#,
        r#"coexec_requests_total{outcome="invalid"} 2"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} in the application's recorder:\n{metrics}"
        );
    }

    // The runtime's workers and broker started before the application's
    // recorder went in; what they record still reaches it, chunk durations
    // included. A worker reports once it runs out of chunks, which may be
    // just after the answer: a few scrapes, bounded.
    let wanted = [
        r#"coexec_items_total{device_class="cpu",kernel="adder"}"#,
        r#"coexec_chunks_total{device_class="cpu",kernel="adder""#,
        // The application's recorder sets no buckets: a summary.
        r#"coexec_chunk_duration_seconds{device_class="cpu",kernel="adder",quantile="1"}"#,
        r#"coexec_chunk_duration_seconds_count{device_class="cpu",kernel="adder"}"#,
        r#"coexec_chunk_duration_seconds_sum{device_class="cpu",kernel="adder"}"#,
        r#"coexec_worker_busy_seconds{device_class="cpu",worker="0"}"#,
        r#"coexec_jobs_completed_total{kernel="adder""#,
        r#"coexec_batch_size_count"#,
    ];
    let scrape = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        for _ in 0..50 {
            text = http(addr, "GET", "/metrics", "").1;
            if wanted.iter().all(|w| text.contains(w)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        text
    })
    .await
    .unwrap();
    for w in wanted {
        // Summed over the series it starts (chunks by phase: some are 0).
        let values: Vec<f64> = scrape
            .lines()
            .filter(|l| l.starts_with(w))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(
            !values.is_empty(),
            "{w} in the application's recorder:\n{scrape}"
        );
        let total: f64 = values.iter().sum();
        assert!(total > 0.0, "{w} = {total}:\n{scrape}");
    }

    let _ = stop.send(());
    server.await.unwrap();
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_runs_on_every_class_alone_and_teaches_nothing() {
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:2,sim:1@2")
            .unwrap()
            .in_memory_profiles()
            .start()
            .await
            .unwrap(),
    );
    let svc = Service::start(
        rt.clone(),
        AddModel,
        StreamConfig::new(),
        ServeConfig::new(),
    )
    .unwrap();
    let warmed = svc.warm_up(&rt).await.unwrap();
    let classes: Vec<&str> = warmed.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(classes, ["cpu", "sim"]);
    // Twice each class's workers, each on its own class.
    assert_eq!(
        rt.progress(),
        [("cpu".to_string(), 4), ("sim".to_string(), 2)]
    );
    assert!(
        rt.profile().await.unwrap().kernels.is_empty(),
        "a warm-up must leave the profile as it was"
    );
    svc.shutdown().await;
}
