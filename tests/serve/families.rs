//! The TEI routes on models of other families than BERT with mean pooling
//! (tests/data/families): a model's prompts as `prompt_name`, its Dense
//! module's width, and what `/info` says of its family, pooling, weights
//! and GPU twin.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use coexec::stream::StreamConfig;
use coexec_models::Embedder;
use coexec_serve::{ServeConfig, Service};

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

fn family(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/families")
        .join(name)
}

/// Serves `dir` on a loopback port; runs `f` on its address, then stops.
async fn with_service(dir: &Path, f: impl FnOnce(SocketAddr) + Send + 'static) {
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .start()
            .await
            .unwrap(),
    );
    let model = Embedder::load(dir).unwrap();
    let svc = Service::start(rt, model, StreamConfig::new(), ServeConfig::new()).unwrap();
    let listener = coexec_serve::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(coexec_serve::serve(listener, svc.tei_router(), async {
        let _ = stopped.await;
    }));
    tokio::task::spawn_blocking(move || f(addr)).await.unwrap();
    let _ = stop.send(());
    server.await.unwrap();
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<String>,
    vectors: Vec<Vec<f64>>,
}

/// A named prompt is put before each text, as the reference did; a name
/// the model lacks is a 422 that names the prompts it has; the Dense
/// module's 24 values come back, not the encoder's 32.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_and_a_dense_module_are_the_models_own() {
    let dir = family("bert-cls-dense");
    let r: Reference =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    with_service(&dir, move |addr| {
        let texts: Vec<&str> = r.sentences.iter().take(4).map(String::as_str).collect();
        let body = serde_json::json!({"inputs": texts, "prompt_name": "query"}).to_string();
        let (status, answer) = http(addr, "POST", "/embed", &body);
        assert_eq!(status, 200, "{answer}");
        let got: Vec<Vec<f64>> = serde_json::from_str(&answer).unwrap();
        for (g, want) in got.iter().zip(&r.vectors) {
            assert_eq!(g.len(), 24);
            let cos = cosine(g, want);
            assert!(cos > 1.0 - 1e-9, "cosine {cos}");
        }
        // Without the prompt the vectors differ: the prompt was applied.
        let body = serde_json::json!({"inputs": texts}).to_string();
        let (_, answer) = http(addr, "POST", "/embed", &body);
        let plain: Vec<Vec<f64>> = serde_json::from_str(&answer).unwrap();
        let cos = cosine(&plain[0], &r.vectors[0]);
        assert!(cos < 1.0 - 1e-6, "cosine {cos} without the prompt");

        let body = serde_json::json!({"inputs": "x", "prompt_name": "search"}).to_string();
        let (status, answer) = http(addr, "POST", "/embed", &body);
        assert_eq!(status, 422, "{answer}");
        assert!(
            answer.contains("search") && answer.contains("passage") && answer.contains("query"),
            "{answer}"
        );
        let (status, answer) = http(addr, "GET", "/info", "");
        assert_eq!(status, 200);
        let info: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(info["model_family"], "bert");
        assert_eq!(info["model_type"]["embedding"]["pooling"], "cls");
        assert_eq!(info["model_dim"], 24);
        assert_eq!(info["gpu_twin"], true);
        assert_eq!(
            info["model_prompts"],
            serde_json::json!(["document", "passage", "query"])
        );
    })
    .await;
}

/// MPNet's `/info`: its family, f32 weights, and the CPU workers alone
/// (its relative-position bias is not in the GPU twin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mpnet_model_says_it_runs_on_the_cpus() {
    with_service(&family("mpnet-mean"), |addr| {
        let (status, answer) = http(addr, "GET", "/info", "");
        assert_eq!(status, 200);
        let info: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(info["model_family"], "mpnet");
        assert_eq!(info["model_weights_dtype"], "float32");
        assert_eq!(info["gpu_twin"], false);
        let (status, answer) = http(addr, "POST", "/embed", r#"{"inputs": "a b c"}"#);
        assert_eq!(status, 200, "{answer}");
    })
    .await;
}
