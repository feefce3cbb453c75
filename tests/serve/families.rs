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

/// The rotary families through the service: each folder's `/info` (family,
/// dtype, pooling, the CPU workers alone) and its vectors on `/embed` and
/// `/v1/embeddings` against its reference (Qwen3's with its instruction
/// prompt, as the reference took it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rotary_families_serve_their_references() {
    for (name, fam, dtype, pooling, prompt) in [
        (
            "qwen3-lasttoken",
            "qwen3",
            "bfloat16",
            "last_token",
            Some("query"),
        ),
        ("modernbert-mean", "modernbert", "float32", "mean", None),
        ("nomic-bert-hub", "nomic_bert", "float32", "mean", None),
        ("gte-hub", "gte", "float16", "cls", None),
    ] {
        let dir = family(name);
        let r: Reference =
            serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
        with_service(&dir, move |addr| {
            let (status, answer) = http(addr, "GET", "/info", "");
            assert_eq!(status, 200, "{name}: {answer}");
            let info: serde_json::Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(info["model_family"], fam, "{name}");
            assert_eq!(info["model_weights_dtype"], dtype, "{name}");
            assert_eq!(
                info["model_type"]["embedding"]["pooling"], pooling,
                "{name}"
            );
            assert_eq!(info["gpu_twin"], false, "{name}");
            let texts: Vec<&str> = r
                .sentences
                .iter()
                .rev()
                .take(3)
                .map(String::as_str)
                .collect();
            let want: Vec<&Vec<f64>> = r.vectors.iter().rev().take(3).collect();
            let mut body = serde_json::json!({"inputs": texts});
            if let Some(p) = prompt {
                body["prompt_name"] = p.into();
            }
            let (status, answer) = http(addr, "POST", "/embed", &body.to_string());
            assert_eq!(status, 200, "{name}: {answer}");
            let got: Vec<Vec<f64>> = serde_json::from_str(&answer).unwrap();
            for (g, w) in got.iter().zip(&want) {
                let cos = cosine(g, w);
                assert!(cos > 1.0 - 1e-9, "{name}: cosine {cos}");
            }
            let mut body = serde_json::json!({"input": texts[0], "model": "m"});
            if let Some(p) = prompt {
                body["prompt_name"] = p.into();
            }
            let (status, answer) = http(addr, "POST", "/v1/embeddings", &body.to_string());
            assert_eq!(status, 200, "{name}: {answer}");
            let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
            let g: Vec<f64> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
            let cos = cosine(&g, want[0]);
            assert!(
                cos > 1.0 - 1e-9,
                "{name}: /v1/embeddings cosine {cos}: {answer}"
            );
        })
        .await;
    }
}

#[derive(serde::Deserialize)]
struct Scores {
    pairs: Vec<Vec<String>>,
    logits: Vec<Vec<f64>>,
}

/// A cross-encoder serves `/rerank`: the query with each text, sorted by
/// the sigmoid of its logit (the logit itself with `raw_scores`), the texts
/// back where asked; and not `/embed` (TEI's 424), where a model of
/// embeddings does not serve `/rerank` or `/predict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_encoder_reranks_and_does_not_embed() {
    let dir = family("bert-reranker");
    let r: Scores =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    with_service(&dir, move |addr| {
        // The reference's pairs of its first query.
        let query = r.pairs[0][0].clone();
        let (texts, want): (Vec<String>, Vec<f64>) = r
            .pairs
            .iter()
            .zip(&r.logits)
            .filter(|(p, _)| p.len() == 2 && p[0] == query)
            .map(|(p, l)| (p[1].clone(), l[0]))
            .unzip();
        assert!(texts.len() >= 4);
        let body =
            serde_json::json!({"query": query, "texts": texts, "raw_scores": true}).to_string();
        let (status, answer) = http(addr, "POST", "/rerank", &body);
        assert_eq!(status, 200, "{answer}");
        let ranks: Vec<serde_json::Value> = serde_json::from_str(&answer).unwrap();
        assert_eq!(ranks.len(), texts.len());
        for w in ranks.windows(2) {
            assert!(w[0]["score"].as_f64() >= w[1]["score"].as_f64(), "{answer}");
        }
        for rank in &ranks {
            let i = rank["index"].as_u64().unwrap() as usize;
            let got = rank["score"].as_f64().unwrap();
            assert!(
                (got - want[i]).abs() < 1e-4,
                "text {i}: {got} against {}",
                want[i]
            );
            assert!(rank.get("text").is_none());
        }
        let body =
            serde_json::json!({"query": query, "texts": texts, "return_text": true}).to_string();
        let (_, answer) = http(addr, "POST", "/rerank", &body);
        let ranks: Vec<serde_json::Value> = serde_json::from_str(&answer).unwrap();
        for rank in &ranks {
            let i = rank["index"].as_u64().unwrap() as usize;
            let sigmoid = 1.0 / (1.0 + (-want[i]).exp());
            assert!((rank["score"].as_f64().unwrap() - sigmoid).abs() < 1e-4);
            assert_eq!(rank["text"], texts[i].as_str());
        }
        // Bad bodies: 4xx JSON, and the service goes on.
        for (body, status) in [
            (r#"{"query": "q", "texts": []}"#, 400),
            (r#"{"query": "q"}"#, 422),
            (r#"{"query": "q", "texts": "t"}"#, 422),
            (r#"{"query": "", "texts": ["t"]}"#, 400),
        ] {
            let (got, answer) = http(addr, "POST", "/rerank", body);
            assert_eq!(got, status, "{body}: {answer}");
            assert!(answer.contains("error_type"), "{answer}");
        }
        let (status, answer) = http(addr, "POST", "/embed", r#"{"inputs": "a"}"#);
        assert_eq!(status, 424, "{answer}");
        assert!(answer.contains("not an embedding model"), "{answer}");
        let (status, answer) = http(addr, "GET", "/info", "");
        assert_eq!(status, 200);
        let info: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(
            info["model_type"]["reranker"]["id2label"]["0"], "LABEL_0",
            "{answer}"
        );
    })
    .await;
    with_service(&family("mpnet-mean"), |addr| {
        for path in ["/rerank", "/predict"] {
            let (status, answer) = http(
                addr,
                "POST",
                path,
                r#"{"query": "q", "texts": ["t"], "inputs": "t"}"#,
            );
            assert_eq!(status, 424, "{path}: {answer}");
        }
    })
    .await;
}

/// A classifier serves `/predict`: every label's softmax score, highest
/// first, for a text, a pair, or a batch of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classifier_predicts_labels() {
    let dir = family("xlm-roberta-classifier");
    let r: Scores =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    with_service(&dir, move |addr| {
        let labels = ["negative", "neutral", "positive"];
        let softmax = |l: &[f64]| {
            let m = l.iter().copied().fold(f64::MIN, f64::max);
            let e: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect::<Vec<_>>()
        };
        let check = |got: &serde_json::Value, logits: &[f64]| {
            let want = softmax(logits);
            let got = got.as_array().unwrap();
            assert_eq!(got.len(), 3);
            for w in got.windows(2) {
                assert!(w[0]["score"].as_f64() >= w[1]["score"].as_f64());
            }
            for p in got {
                let k = labels.iter().position(|l| p["label"] == *l).unwrap();
                assert!((p["score"].as_f64().unwrap() - want[k]).abs() < 1e-4);
            }
        };
        let single = r.pairs.iter().position(|p| p.len() == 1).unwrap();
        let pair = r.pairs.iter().position(|p| p.len() == 2).unwrap();
        let body = serde_json::json!({"inputs": r.pairs[single][0]}).to_string();
        let (status, answer) = http(addr, "POST", "/predict", &body);
        assert_eq!(status, 200, "{answer}");
        check(&serde_json::from_str(&answer).unwrap(), &r.logits[single]);
        let body = serde_json::json!({"inputs": r.pairs[pair]}).to_string();
        let (_, answer) = http(addr, "POST", "/predict", &body);
        check(&serde_json::from_str(&answer).unwrap(), &r.logits[pair]);
        let body = serde_json::json!({"inputs": [r.pairs[single], r.pairs[pair]]}).to_string();
        let (_, answer) = http(addr, "POST", "/predict", &body);
        let batch: Vec<serde_json::Value> = serde_json::from_str(&answer).unwrap();
        check(&batch[0], &r.logits[single]);
        check(&batch[1], &r.logits[pair]);
        for body in [
            r#"{"inputs": ["a", "b", "c"]}"#,
            r#"{"inputs": 7}"#,
            r#"{"inputs": [["a", ""]]}"#,
        ] {
            let (status, answer) = http(addr, "POST", "/predict", body);
            assert!((400..500).contains(&status), "{body}: {status} {answer}");
        }
        // A classifier of three labels is no re-ranker.
        let (status, _) = http(addr, "POST", "/rerank", r#"{"query": "q", "texts": ["t"]}"#);
        assert_eq!(status, 424);
    })
    .await;
}
