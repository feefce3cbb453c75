//! Text Embeddings Inference 1.9's HTTP surface, request for request, on
//! the committed tiny models (tests/data/tiny-bert, a cross-encoder and a
//! classifier of tests/data/families): each answer's status, shape and
//! headers as TEI documents and answers them (`router/src/http/server.rs`,
//! `types.rs`), and TEI's `te_*` series on `/metrics`. docs/tei-compat.md
//! is the table these tests stand behind.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use coexec::stream::StreamConfig;
use coexec_models::Embedder;
use coexec_serve::{ServeConfig, Service};
use serde_json::{Value, json};

/// An answer: status, headers (lower-case names) and body.
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// A TEI timing or count header, as the whole number it must be.
    fn number(&self, name: &str) -> u64 {
        let v = self
            .headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name}: {:?}", self.headers));
        v.parse().unwrap_or_else(|e| panic!("{name}: {v:?}: {e}"))
    }
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
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
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    // The bodies here are small and sent whole: no chunked encoding.
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

fn post(addr: SocketAddr, path: &str, body: Value) -> Answer {
    http(addr, "POST", path, &body.to_string())
}

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

/// The limits the tests reach: 4 inputs a request, bodies of 64 KiB.
const MAX_INPUTS: usize = 4;
const MAX_BODY: usize = 64 << 10;

/// Serves `dir` on a loopback port, with `/metrics`, as `tiny` on TEI's
/// routes; runs `f` on its address, then stops.
async fn with_service(dir: PathBuf, f: impl FnOnce(SocketAddr) + Send + 'static) {
    with_service_as(dir, |cfg| cfg, f).await;
}

/// [`with_service`], its configuration changed by `cfg`.
async fn with_service_as(
    dir: PathBuf,
    cfg: impl FnOnce(ServeConfig) -> ServeConfig,
    f: impl FnOnce(SocketAddr) + Send + 'static,
) {
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .start()
            .await
            .unwrap(),
    );
    let model = Embedder::load(&dir).unwrap().with_id("org/tiny-model");
    let cfg = cfg(ServeConfig::new()
        .max_inputs(MAX_INPUTS)
        .max_body(MAX_BODY)
        .served_model_name("tiny")
        .prometheus(coexec_serve::metrics::install().unwrap()));
    let svc = Service::start(rt, model, StreamConfig::new(), cfg).unwrap();
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

/// An object's keys, sorted.
fn keys_of(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

/// Two answers of numbers alike within float rounding (the same inputs
/// in batches of other sizes), everything else equal.
fn assert_close(a: &Value, b: &Value) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() < 1e-5, "{x} against {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).for_each(|(x, y)| assert_close(x, y));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(keys_of(a), keys_of(b));
            x.iter().for_each(|(k, v)| assert_close(v, &y[k]));
        }
        _ => assert_eq!(a, b),
    }
}

/// TEI's error body on its own routes: `{"error", "error_type"}`, nothing
/// else.
fn assert_tei_error(a: &Answer, status: u16, kind: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    let e = a.json();
    assert_eq!(keys_of(&e), ["error", "error_type"], "{}", a.body);
    assert_eq!(e["error_type"], kind, "{}", a.body);
    assert!(!e["error"].as_str().unwrap().is_empty());
}

/// TEI's `OpenAICompatErrorResponse` on `/v1/embeddings`: `{"message",
/// "code", "type"}`, the status in `code`.
fn assert_openai_error(a: &Answer, status: u16, kind: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    let e = a.json();
    assert_eq!(keys_of(&e), ["code", "message", "type"], "{}", a.body);
    assert_eq!(e["code"], status);
    assert_eq!(e["type"], kind);
}

/// TEI's eight headers on a success, with their meanings: whole
/// milliseconds for the times (the total covering each part), characters
/// and tokens counted.
fn assert_tei_headers(a: &Answer, chars: u64, tokens: u64) {
    assert_eq!(a.headers["x-compute-type"], "cpu");
    assert_eq!(a.number("x-compute-characters"), chars);
    assert_eq!(a.number("x-compute-tokens"), tokens);
    let total = a.number("x-total-time");
    assert_eq!(a.number("x-compute-time"), total);
    for part in ["x-tokenization-time", "x-queue-time", "x-inference-time"] {
        assert!(
            a.number(part) <= total,
            "{part} past the total: {:?}",
            a.headers
        );
    }
}

fn ids_of(addr: SocketAddr, text: &str) -> Vec<u32> {
    let a = post(addr, "/tokenize", json!({"inputs": text}));
    assert_eq!(a.status, 200, "{}", a.body);
    a.json()[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap() as u32)
        .collect()
}

/// `/embed` and `/v1/embeddings`: texts and token ids, base64, TEI 1.9's
/// statuses and error shapes, its headers, `/info`, the SageMaker and
/// Inference API routes, the OpenAPI document, and the `te_*` series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_model_answers_as_tei_does() {
    with_service(data("tiny-bert"), |addr| {
        let text = "the quick brown fox";
        let ids = ids_of(addr, text);
        let dim = {
            let a = post(addr, "/embed", json!({"inputs": text}));
            assert_eq!(a.status, 200, "{}", a.body);
            assert_tei_headers(&a, text.chars().count() as u64, ids.len() as u64);
            a.json()[0].as_array().unwrap().len()
        };

        // Token ids: one list, a batch of lists, texts among them; the
        // same vectors as the text's.
        let by_text = post(addr, "/embed", json!({"inputs": [text]})).json();
        let a = post(addr, "/embed", json!({"inputs": ids}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_tei_headers(&a, ids.len() as u64, ids.len() as u64);
        assert_close(&a.json(), &by_text);
        let a = post(addr, "/embed", json!({"inputs": [ids, text]}));
        assert_eq!(a.status, 200, "{}", a.body);
        let v = a.json();
        assert_close(&json!([v[0], v[1]]), &json!([by_text[0], by_text[0]]));
        // An id past the vocabulary (357 word pieces): 422, never a panic.
        let a = post(addr, "/embed", json!({"inputs": [101, 357, 102]}));
        assert_tei_error(&a, 422, "Validation");
        assert!(a.body.contains("357"), "{}", a.body);
        let a = post(addr, "/embed", json!({"inputs": [[101], []]}));
        assert_tei_error(&a, 400, "Empty");

        // TEI 1.9's statuses: too many inputs 422 (1.8: 413), a text past
        // the limit with `truncate: false` 422, a body over the limit 413,
        // no input 400.
        let many = vec!["a"; MAX_INPUTS + 1];
        assert_tei_error(
            &post(addr, "/embed", json!({"inputs": many})),
            422,
            "Validation",
        );
        let long = "word ".repeat(600);
        let a = post(addr, "/embed", json!({"inputs": long, "truncate": false}));
        assert_tei_error(&a, 422, "Validation");
        let a = post(addr, "/embed", json!({"inputs": long}));
        assert_eq!(a.status, 200, "TEI's auto_truncate: {}", a.body);
        let a = post(addr, "/embed", json!({"inputs": "a".repeat(MAX_BODY)}));
        assert_tei_error(&a, 413, "Validation");
        assert_tei_error(&post(addr, "/embed", json!({"inputs": []})), 400, "Empty");
        // Token ids are cut on the left as asked (the last 256 kept);
        // texts too (`a_text_is_cut_on_the_left_as_tei_cuts_it`).
        let short = post(
            addr,
            "/embed",
            json!({"inputs": "a", "truncation_direction": "left"}),
        );
        assert_eq!(short.status, 200, "{}", short.body);
        let mut many_ids = vec![ids[1]; 300];
        many_ids.extend(&ids);
        let kept = many_ids[many_ids.len() - 256..].to_vec();
        let a = post(
            addr,
            "/embed",
            json!({"inputs": many_ids, "truncation_direction": "left"}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_close(
            &a.json(),
            &post(addr, "/embed", json!({"inputs": kept})).json(),
        );
        assert_eq!(a.number("x-compute-tokens"), 256);
        // `dimensions`: the first n values, normalised after the cut; 0 or
        // past the model's width 422.
        let v = post(addr, "/embed", json!({"inputs": text, "dimensions": 8})).json();
        let cut = v[0].as_array().unwrap();
        let norm: f64 = cut.iter().map(|x| x.as_f64().unwrap().powi(2)).sum();
        assert_eq!(cut.len(), 8);
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        for d in [0, dim + 1] {
            let a = post(addr, "/embed", json!({"inputs": text, "dimensions": d}));
            assert_tei_error(&a, 422, "Validation");
        }
        // A model whose modules end with Normalize gives unit vectors
        // whatever `normalize` says (sentence-transformers' answer; TEI's
        // is the pooled vector).
        let v = post(addr, "/embed", json!({"inputs": text, "normalize": false})).json();
        let norm: f64 = v[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap().powi(2))
            .sum();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");

        // A route for another kind of model: TEI's 424 (this model has no
        // SPLADE pooling).
        assert_tei_error(
            &post(addr, "/embed_sparse", json!({"inputs": "a"})),
            424,
            "Backend",
        );
        let a = post(addr, "/rerank", json!({"query": "a", "texts": ["b"]}));
        assert_tei_error(&a, 424, "Backend");
        assert_tei_error(
            &post(addr, "/predict", json!({"inputs": "a"})),
            424,
            "Backend",
        );

        // OpenAI's route: its answer (the served name as `model`), base64
        // of the same little-endian f32s, and its errors in its shape.
        let a = post(
            addr,
            "/v1/embeddings",
            json!({"input": [text, ids], "model": "tiny"}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_tei_headers(
            &a,
            (text.chars().count() + ids.len()) as u64,
            2 * ids.len() as u64,
        );
        let v = a.json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "tiny");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 2 * ids.len(), "total_tokens": 2 * ids.len()})
        );
        assert_eq!(v["data"][1]["object"], "embedding");
        assert_eq!(v["data"][1]["index"], 1);
        let floats: Vec<f32> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
        assert_eq!(floats.len(), dim);
        let a = post(
            addr,
            "/v1/embeddings",
            json!({"input": text, "encoding_format": "base64"}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        let b64 = a.json()["data"][0]["embedding"]
            .as_str()
            .unwrap()
            .to_string();
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let decoded: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(decoded, floats);
        let many = vec!["a"; MAX_INPUTS + 1];
        let a = post(addr, "/v1/embeddings", json!({"input": many}));
        assert_openai_error(&a, 422, "Validation");
        assert_openai_error(
            &post(addr, "/v1/embeddings", json!({"input": []})),
            400,
            "Empty",
        );
        let a = post(addr, "/v1/embeddings", json!({"input": [1, 400]}));
        assert_openai_error(&a, 422, "Validation");

        // SageMaker's and the Inference API's routes: `/embed` for a model
        // of embeddings, `/health` for their GETs.
        for path in ["/", "/invocations"] {
            let a = post(addr, path, json!({"inputs": [text]}));
            assert_eq!(a.status, 200, "{path}: {}", a.body);
            assert_close(&a.json(), &by_text);
        }
        for path in ["/", "/ping", "/health"] {
            let a = http(addr, "GET", path, "");
            assert_eq!((a.status, a.body.as_str()), (200, ""), "{path}");
        }

        // The OpenAPI document, generated from the types: every route TEI
        // documents, and the inputs' shapes.
        let a = http(addr, "GET", "/api-doc/openapi.json", "");
        assert_eq!(a.status, 200);
        let doc = a.json();
        assert!(
            doc["openapi"].as_str().is_some_and(|v| v.starts_with('3')),
            "{doc}"
        );
        for path in [
            "/embed",
            "/embed_all",
            "/v1/embeddings",
            "/similarity",
            "/rerank",
            "/predict",
            "/tokenize",
            "/decode",
        ] {
            assert!(doc["paths"][path]["post"].is_object(), "{path}");
        }
        for path in ["/info", "/health"] {
            assert!(doc["paths"][path]["get"].is_object(), "{path}");
        }
        assert!(doc["components"]["schemas"]["Input"]["oneOf"].is_array());

        // `/info`: TEI's fields, the id it was started with.
        let info = http(addr, "GET", "/info", "").json();
        assert_eq!(info["model_id"], "org/tiny-model");
        assert_eq!(info["served_model_name"], "tiny");
        assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
        assert_eq!(info["max_client_batch_size"], MAX_INPUTS);
        assert_eq!(info["auto_truncate"], true);
        // A library service built without a token limit per batch says so.
        assert!(info["max_batch_tokens"].is_null(), "{info}");
        assert_eq!(info["tokenization_workers"], 2, "tokio's workers tokenise");
        // coexec's `model_sha` is the weights' SHA-256 (TEI: the Hub
        // revision, null for a local folder).
        let sha = info["model_sha"].as_str().unwrap();
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sha}"
        );
        for field in ["sha", "docker_label"] {
            assert!(
                info[field].is_null() || info[field].is_string(),
                "{field}: {info}"
            );
        }
        for field in [
            "model_sha",
            "model_dtype",
            "max_concurrent_requests",
            "max_input_length",
            "max_batch_requests",
            "version",
        ] {
            assert!(!info[field].is_null(), "{field}: {info}");
        }

        // `te_request_failure` counts what TEI's handlers count: a body
        // that is not JSON, refused before them, is not; an empty input is.
        let validation_failures = || {
            let m = http(addr, "GET", "/metrics", "").body;
            m.lines()
                .find_map(|l| l.strip_prefix(r#"te_request_failure{err="validation"} "#))
                .map_or(0.0, |v| v.parse::<f64>().unwrap())
        };
        let before = validation_failures();
        assert_eq!(http(addr, "POST", "/embed", "{not json").status, 400);
        assert_eq!(validation_failures(), before);
        assert_eq!(post(addr, "/embed", json!({"inputs": ""})).status, 400);
        assert_eq!(validation_failures(), before + 1.0);

        // TEI's series, with their types and labels.
        let metrics = http(addr, "GET", "/metrics", "").body;
        for (name, kind) in [
            ("te_request_count", "counter"),
            ("te_request_success", "counter"),
            ("te_request_failure", "counter"),
            ("te_request_duration", "histogram"),
            ("te_request_tokenization_duration", "histogram"),
            ("te_request_queue_duration", "histogram"),
            ("te_request_inference_duration", "histogram"),
            ("te_request_input_length", "histogram"),
            ("te_queue_size", "gauge"),
            ("te_batch_next_size", "histogram"),
            ("te_batch_next_tokens", "histogram"),
            ("te_embed_count", "counter"),
            ("te_embed_success", "counter"),
            ("te_embed_duration", "histogram"),
            ("te_embed_tokenization_duration", "histogram"),
            ("te_embed_queue_duration", "histogram"),
            ("te_embed_inference_duration", "histogram"),
        ] {
            assert!(
                metrics.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} as a {kind}:\n{metrics}"
            );
        }
        for series in [
            r#"te_request_count{method="single"}"#,
            r#"te_request_count{method="batch"}"#,
            r#"te_request_success{method="batch"}"#,
            r#"te_request_failure{err="batch_size"}"#,
            r#"te_request_failure{err="validation"}"#,
            r#"te_request_failure{err="model_type"}"#,
            r#"te_request_duration_bucket{le="#,
        ] {
            assert!(metrics.contains(series), "{series}:\n{metrics}");
        }
    })
    .await;
}

/// A cross-encoder: `POST /` and `/invocations` are `/rerank`; `/embed`
/// is TEI's 424; TEI's headers on `/rerank`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reranker_answers_as_tei_does() {
    with_service(data("families/bert-reranker"), |addr| {
        let body = json!({"query": "a cat", "texts": ["a dog", "a cat sat"]});
        let a = post(addr, "/rerank", body.clone());
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.headers["x-compute-type"], "cpu");
        a.number("x-compute-tokens");
        let ranks = a.json();
        for path in ["/", "/invocations"] {
            let a = post(addr, path, body.clone());
            assert_eq!(a.status, 200, "{path}: {}", a.body);
            assert_close(&a.json(), &ranks);
        }
        assert_tei_error(
            &post(addr, "/embed", json!({"inputs": "a"})),
            424,
            "Backend",
        );
        let a = post(addr, "/v1/embeddings", json!({"input": "a"}));
        assert_openai_error(&a, 424, "Backend");
        // No token vectors: TEI's 424, as for `/embed`.
        let a = post(addr, "/embed_all", json!({"inputs": "a"}));
        assert_tei_error(&a, 424, "Backend");
        assert!(a.body.contains("not an embedding model"), "{}", a.body);
        // A pair past the limit is cut on the left as on the right (the
        // longer text first), never refused.
        let long = "a cat sat on the mat ".repeat(60);
        for direction in ["left", "right"] {
            let body =
                json!({"query": "a cat", "texts": [long], "truncation_direction": direction});
            let a = post(addr, "/rerank", body);
            assert_eq!(a.status, 200, "{direction}: {}", a.body);
        }
        let info = http(addr, "GET", "/info", "").json();
        assert!(info["model_type"]["reranker"].is_object(), "{info}");
    })
    .await;
}

/// A classifier: `POST /` is `/predict`, single and batch; TEI's
/// `te_predict_*` series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classifier_answers_as_tei_does() {
    with_service(data("families/distilbert-classifier"), |addr| {
        let a = post(addr, "/predict", json!({"inputs": "a fine day"}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.number("x-compute-characters"), 10);
        let single = a.json();
        assert!(single[0]["label"].is_string() && single[0]["score"].is_number());
        for path in ["/", "/invocations"] {
            let a = post(addr, path, json!({"inputs": "a fine day"}));
            assert_eq!(a.status, 200, "{path}: {}", a.body);
            assert_close(&a.json(), &single);
        }
        let a = post(addr, "/", json!({"inputs": [["a fine day"], ["a", "b"]]}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.json().as_array().unwrap().len(), 2);
        assert_tei_error(
            &post(addr, "/embed_all", json!({"inputs": "a fine day"})),
            424,
            "Backend",
        );
        let metrics = http(addr, "GET", "/metrics", "").body;
        for name in [
            "te_predict_count",
            "te_predict_success",
            "te_predict_duration",
            "te_predict_tokenization_duration",
            "te_predict_queue_duration",
            "te_predict_inference_duration",
        ] {
            assert!(
                metrics.contains(&format!("# TYPE {name} ")),
                "{name}:\n{metrics}"
            );
        }
    })
    .await;
}

/// A prompt goes before texts and token ids alike (the ids decoded, put
/// after it and tokenised again, as TEI does), and is not counted in
/// `x-compute-characters`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_before_texts_and_token_ids_alike() {
    with_service(data("families/bert-cls-dense"), |addr| {
        let text = "a cat sat";
        let ids = ids_of(addr, text);
        let by_text = post(
            addr,
            "/embed",
            json!({"inputs": text, "prompt_name": "query"}),
        );
        assert_eq!(by_text.status, 200, "{}", by_text.body);
        assert_eq!(by_text.number("x-compute-characters"), 9);
        let by_ids = post(
            addr,
            "/embed",
            json!({"inputs": ids, "prompt_name": "query"}),
        );
        assert_eq!(by_ids.status, 200, "{}", by_ids.body);
        assert_eq!(by_ids.number("x-compute-characters"), ids.len() as u64);
        assert_eq!(
            by_ids.number("x-compute-tokens"),
            by_text.number("x-compute-tokens")
        );
        assert_close(&by_ids.json(), &by_text.json());
        // Without the prompt, the ids' vector is another.
        let plain = post(addr, "/embed", json!({"inputs": ids})).json();
        let (a, b) = (&plain[0], &by_text.json()[0]);
        assert!(
            a.as_array()
                .unwrap()
                .iter()
                .zip(b.as_array().unwrap())
                .any(|(x, y)| { (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() > 1e-4 }),
            "the prompt changed nothing"
        );
    })
    .await;
}

/// A SPLADE model: `/embed_sparse` gives each input's non-zero values by
/// index (the dense vector's, `/embed` with `normalize: false`), and is
/// `POST /`; normalised vectors are TEI's 424 for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_splade_model_answers_as_tei_does() {
    with_service(data("families/bert-splade"), |addr| {
        let text = "a cat sat on the mat";
        let a = post(addr, "/embed_sparse", json!({"inputs": [text]}));
        assert_eq!(a.status, 200, "{}", a.body);
        a.number("x-compute-tokens");
        let sparse = a.json();
        let values = sparse[0].as_array().unwrap();
        assert!(!values.is_empty());
        let dense = post(
            addr,
            "/embed",
            json!({"inputs": [text], "normalize": false}),
        )
        .json();
        let dense = dense[0].as_array().unwrap();
        let nonzero: Vec<Value> = dense
            .iter()
            .enumerate()
            .filter(|(_, v)| v.as_f64().unwrap() != 0.0)
            .map(|(index, value)| json!({"index": index, "value": value}))
            .collect();
        assert_close(&sparse[0], &Value::Array(nonzero));
        for path in ["/", "/invocations"] {
            let a = post(addr, path, json!({"inputs": [text]}));
            assert_eq!(a.status, 200, "{path}: {}", a.body);
            assert_close(&a.json(), &sparse);
        }
        assert_tei_error(
            &post(addr, "/embed", json!({"inputs": text})),
            424,
            "Backend",
        );
        let a = post(addr, "/v1/embeddings", json!({"input": text}));
        assert_openai_error(&a, 424, "Backend");
        // TEI's "`embed_all` is not available for SPLADE models".
        let a = post(addr, "/embed_all", json!({"inputs": text}));
        assert_tei_error(&a, 424, "Backend");
        assert!(a.body.contains("SPLADE"), "{}", a.body);
        let info = http(addr, "GET", "/info", "").json();
        assert_eq!(info["model_type"]["embedding"]["pooling"], "splade");
    })
    .await;
}

/// A vector's values as `f64`s.
fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// `v` scaled to unit length.
fn unit(v: &[f64]) -> Vec<f64> {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    v.iter().map(|x| x / n).collect()
}

/// tiny-bert's hidden width, from its own config.json.
fn hidden_of(dir: &str) -> usize {
    let text = std::fs::read_to_string(data(dir).join("config.json")).unwrap();
    let c: Value = serde_json::from_str(&text).unwrap();
    c["hidden_size"].as_u64().unwrap() as usize
}

/// The model's limit in tokens (tiny-bert's `max_seq_length`).
const MAX_TOKENS: usize = 256;

/// `POST /embed_all`: for each input, every token's vector after the last
/// layer (TEI's `[[[f32; hidden]; tokens]; inputs]`), special tokens
/// included, not pooled and not normalised: their mean, normalised, is
/// `/embed`'s vector (tiny-bert pools by the mean, then normalises). Its
/// bound on values, TEI's statuses and headers, and bad bodies refused
/// with JSON while the service serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tokens_vector_answers_as_tei_does() {
    let hidden = hidden_of("tiny-bert");
    // Three inputs of the model's limit, not four.
    let most = 3 * MAX_TOKENS * hidden;
    let cfg = move |c: ServeConfig| c.max_embed_all_values(most);
    with_service_as(data("tiny-bert"), cfg, move |addr| {
        let text = "the quick brown fox";
        let ids = ids_of(addr, text);
        let a = post(addr, "/embed_all", json!({"inputs": text}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_tei_headers(&a, text.chars().count() as u64, ids.len() as u64);
        let all = a.json();
        let inputs = all.as_array().unwrap();
        assert_eq!(inputs.len(), 1);
        let tokens: Vec<Vec<f64>> = inputs[0].as_array().unwrap().iter().map(floats).collect();
        assert_eq!(
            tokens.len(),
            ids.len(),
            "a vector per token, [CLS] and [SEP] too"
        );
        assert!(tokens.iter().all(|t| t.len() == hidden));
        // Not normalised: a layer norm's output is some sqrt(hidden) long.
        let norm = |t: &[f64]| t.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(
            tokens.iter().all(|t| (norm(t) - 1.0).abs() > 0.1),
            "normalised"
        );
        // Each token its own vector.
        assert!(tokens.windows(2).all(|w| w[0] != w[1]));
        // They are the encoder's own, token for token and in order.
        let model = Embedder::load(data("tiny-bert")).unwrap();
        let k = coexec_models::encoder::Encoder::token_vectors(
            model.weights().clone(),
            vec![ids.clone()],
        )
        .unwrap();
        let k = coexec::kernels::run_sequential(coexec::kernels::OneShot::new(k))
            .unwrap()
            .unwrap();
        assert_close(&all, &json!(k.into_token_vectors()));
        // Their mean, normalised, is the pooled vector.
        let mean: Vec<f64> = (0..hidden)
            .map(|j| tokens.iter().map(|t| t[j]).sum::<f64>() / tokens.len() as f64)
            .collect();
        let pooled = post(addr, "/embed", json!({"inputs": text})).json();
        assert_close(&json!(unit(&mean)), &pooled[0]);

        // Token ids, and a batch: the same vectors, in the request's order.
        let by_ids = post(addr, "/embed_all", json!({"inputs": ids})).json();
        assert_close(&by_ids, &all);
        let a = post(addr, "/embed_all", json!({"inputs": ["a", ids, text]}));
        assert_eq!(a.status, 200, "{}", a.body);
        let batch = a.json();
        assert_eq!(batch[0].as_array().unwrap().len(), ids_of(addr, "a").len());
        assert_close(&json!([batch[1], batch[2]]), &json!([all[0], all[0]]));
        assert_eq!(a.headers["x-compute-type"], "cpu");

        // A text past the limit is cut to it (TEI's auto_truncate), or
        // refused with `truncate: false`.
        let long = "word ".repeat(600);
        let a = post(addr, "/embed_all", json!({"inputs": long}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.json()[0].as_array().unwrap().len(), MAX_TOKENS);
        let a = post(
            addr,
            "/embed_all",
            json!({"inputs": long, "truncate": false}),
        );
        assert_tei_error(&a, 422, "Validation");
        // The bound on values: three inputs of the limit are within it,
        // four past it (TEI 1.9's 422, before anything runs).
        let a = post(addr, "/embed_all", json!({"inputs": vec![&long; 3]}));
        assert_eq!(a.status, 200, "{}", a.body);
        let a = post(addr, "/embed_all", json!({"inputs": vec![&long; 4]}));
        assert_tei_error(&a, 422, "Validation");
        assert!(a.body.contains(&most.to_string()), "{}", a.body);

        // Bad bodies: JSON errors, and the service serves on.
        for (body, status, kind) in [
            ("{not json", 400, "Validation"),
            (r#"{"inputs": 7}"#, 422, "Validation"),
            (r#"["a"]"#, 422, "Validation"),
            (r#"{"inputs": []}"#, 400, "Empty"),
            (r#"{"inputs": ""}"#, 400, "Empty"),
            (r#"{"inputs": [101, 357, 102]}"#, 422, "Validation"),
            (
                r#"{"inputs": ["a", "b", "c", "d", "e"]}"#,
                422,
                "Validation",
            ),
            (
                r#"{"inputs": "a", "prompt_name": "nope"}"#,
                422,
                "Validation",
            ),
            (
                r#"{"inputs": "a", "truncation_direction": "up"}"#,
                422,
                "Validation",
            ),
        ] {
            let a = http(addr, "POST", "/embed_all", body);
            assert_tei_error(&a, status, kind);
        }
        let a = http(addr, "GET", "/embed_all", "");
        assert_tei_error(&a, 405, "Validation");
        let a = post(addr, "/embed_all", json!({"inputs": text}));
        assert_eq!(a.status, 200, "{}", a.body);
        assert_close(&a.json(), &all);

        let doc = http(addr, "GET", "/api-doc/openapi.json", "").json();
        assert!(doc["paths"]["/embed_all"]["post"].is_object());
        assert!(doc["components"]["schemas"]["EmbedAllRequest"].is_object());
    })
    .await;
}

/// `truncation_direction: "left"` on a text past the limit keeps its last
/// tokens between `[CLS]` and `[SEP]`, as TEI's tokenizer cuts it: the
/// vector is that of those ids given directly, and not the right cut's.
/// The text is longer than the part the tokenizer reads of a long text
/// (32 bytes a token of the limit), so that part is checked against the
/// whole text's tokens (`/tokenize` never cuts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_is_cut_on_the_left_as_tei_cuts_it() {
    with_service(data("tiny-bert"), |addr| {
        let long = format!(
            "{}{}",
            "a ".repeat(3000),
            "the quick brown fox jumps over the lazy dog ".repeat(100)
        );
        assert!(long.len() > 32 * MAX_TOKENS && long.len() < MAX_BODY / 2);
        let whole = ids_of(addr, &long);
        let n = whole.len();
        assert!(n > 2 * MAX_TOKENS, "{n} tokens");
        let mut kept = vec![whole[0]];
        kept.extend(&whole[n - 1 - (MAX_TOKENS - 2)..]);
        assert_eq!(kept.len(), MAX_TOKENS);
        let mut first = whole[..MAX_TOKENS - 1].to_vec();
        first.push(whole[n - 1]);
        assert_ne!(kept, first, "the two cuts must differ");

        let left = post(
            addr,
            "/embed",
            json!({"inputs": long, "truncation_direction": "left"}),
        );
        assert_eq!(left.status, 200, "{}", left.body);
        assert_eq!(left.number("x-compute-tokens"), MAX_TOKENS as u64);
        let by_ids = post(addr, "/embed", json!({"inputs": kept})).json();
        assert_close(&left.json(), &by_ids);
        // The right cut is another vector: that of the first tokens.
        let right = post(addr, "/embed", json!({"inputs": long})).json();
        assert_close(
            &right,
            &post(addr, "/embed", json!({"inputs": first})).json(),
        );
        let (l, r) = (floats(&left.json()[0]), floats(&right[0]));
        assert!(l.iter().zip(&r).any(|(a, b)| (a - b).abs() > 1e-3));

        // TEI's spelling `Left` too; every route that cuts, the same cut.
        let a = post(
            addr,
            "/embed",
            json!({"inputs": [long], "truncation_direction": "Left"}),
        );
        assert_close(&a.json(), &by_ids);
        let a = post(
            addr,
            "/embed_all",
            json!({"inputs": long, "truncation_direction": "left"}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_close(
            &a.json(),
            &post(addr, "/embed_all", json!({"inputs": kept})).json(),
        );
        let a = post(
            addr,
            "/similarity",
            json!({"inputs": {"source_sentence": long, "sentences": [long]},
                   "parameters": {"truncation_direction": "left"}}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        // A text past 250 characters a token of the limit (TEI cuts such
        // a text to its first 64 000 before tokenising, so its left cut
        // keeps tokens from the middle): coexec keeps the text's own last
        // tokens, those of its tail (`/tokenize` refuses the whole text).
        let tail = "the quick brown fox jumps over the lazy dog ".repeat(40);
        let huge = format!("{}{tail}", "b ".repeat(31_200));
        assert!(huge.len() > 250 * MAX_TOKENS && huge.len() < MAX_BODY - 100);
        let t = ids_of(addr, &tail);
        assert!(t.len() > MAX_TOKENS, "{} tokens", t.len());
        let mut last = vec![t[0]];
        last.extend(&t[t.len() - 1 - (MAX_TOKENS - 2)..]);
        let a = post(
            addr,
            "/embed",
            json!({"inputs": huge, "truncation_direction": "left"}),
        );
        assert_eq!(a.status, 200, "{}", a.body);
        assert_close(
            &a.json(),
            &post(addr, "/embed", json!({"inputs": last})).json(),
        );
        // With `truncate: false` the text is refused whichever end.
        let a = post(
            addr,
            "/embed",
            json!({"inputs": long, "truncate": false, "truncation_direction": "left"}),
        );
        assert_tei_error(&a, 422, "Validation");
    })
    .await;
}
