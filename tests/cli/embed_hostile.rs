//! The embedding service against hostile model folders and texts (issue
//! 65): copies of the test model with one edit, each refused at load
//! naming its file and field, and texts the model cannot take refused for
//! their own request while other clients' requests are answered.
//!
//! Each test runs on all-MiniLM-L6-v2 where it is here
//! (`COEXEC_EMBED_MODEL`, or `scripts/fetch_model.sh`'s cache), else on
//! tests/data/tiny-bert (`common::embed_model`).

use std::net::SocketAddr;

use coexec_models::Embedder;

use crate::common::{self, Hostile};
use crate::server::{Server, http};

/// Why `Embedder::load(dir)` failed (never its `Debug`: that is the
/// weights).
fn load_error(dir: &std::path::Path) -> String {
    match Embedder::load(dir) {
        Ok(_) => panic!("{}: loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// `coexec serve --model DIR` exits 2 at once with one line on stderr that
/// holds every one of `words` (killed, and the test failed, if it serves
/// instead).
fn serve_refuses(dir: &str, words: &[&str]) {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let profiles = std::env::temp_dir().join(format!("hostile-serve-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args(["serve", "--model", dir, "--addr", "127.0.0.1:0"])
        .args(["--devices", "cpu:1", "--profile-dir"])
        .arg(&profiles)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{dir}: served instead of refusing the model");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&profiles);
    let (code, err) = (out.status.code(), String::from_utf8_lossy(&out.stderr));
    assert_eq!(code, Some(2), "stderr {err:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err:?}");
    for w in words {
        assert!(lines[0].contains(w), "{w:?} in {err:?}");
    }
}

/// A copy of the model whose query and key weights are scaled by 1e19:
/// attention's scores overflow, and every vector is NaN. Before, it was
/// served, and `/embed`, `/v1/embeddings` and `/similarity` answered 200
/// with `null`s; now a forward pass on a probe sentence refuses it.
#[test]
fn a_model_whose_outputs_overflow_is_refused_at_load() {
    let model = common::embed_model("a_model_whose_outputs_overflow_is_refused_at_load");
    let h = Hostile::overflowing(&model.dir, "overflow");
    let e = load_error(&h.dir);
    assert!(
        e.contains("model.safetensors") && e.contains("not finite"),
        "{e}"
    );
    serve_refuses(h.arg(), &["model.safetensors", "not finite"]);
}

/// A tokenizer.json whose word `hello` has id 99 999: the vocabulary's
/// count is unchanged, so the old check on the count passed it, and a text
/// holding `hello` failed its whole batch (500 `batch failed` for every
/// request batched with it). The largest id is what must fit the
/// embedding matrix.
#[test]
fn a_tokenizer_id_past_the_embedding_matrix_is_refused_at_load() {
    let model = common::embed_model("a_tokenizer_id_past_the_embedding_matrix_is_refused_at_load");
    let h = Hostile::new(&model.dir, "vocab");
    h.edit_json("tokenizer.json", |t| {
        t["model"]["vocab"]["hello"] = 99_999.into()
    });
    let e = load_error(&h.dir);
    assert!(
        e.contains("tokenizer.json")
            && e.contains("\"hello\" has id 99999")
            && e.contains(&format!("{} rows", model.vocab_size)),
        "{e}"
    );
    serve_refuses(h.arg(), &["tokenizer.json", "99999"]);
}

/// `max_seq_length` 1 or 2 leaves no room for a text between `[CLS]` and
/// `[SEP]`: before, it loaded, and `truncate: false` cut an 8-token text
/// to nothing and answered 200. 3 is the least BERT's frame allows.
#[test]
fn a_max_seq_length_below_the_special_token_frame_is_refused_at_load() {
    let model =
        common::embed_model("a_max_seq_length_below_the_special_token_frame_is_refused_at_load");
    let h = Hostile::new(&model.dir, "seq-length");
    for n in [1, 2] {
        h.write(
            "sentence_bert_config.json",
            format!("{{\"max_seq_length\": {n}}}").as_bytes(),
        );
        let e = load_error(&h.dir);
        assert!(
            e.contains("sentence_bert_config.json: field `max_seq_length`")
                && e.contains("at least 3"),
            "{e}"
        );
    }
    serve_refuses(h.arg(), &["sentence_bert_config.json", "max_seq_length"]);
    h.write("sentence_bert_config.json", br#"{"max_seq_length": 3}"#);
    let m = Embedder::load(&h.dir).unwrap();
    assert_eq!(m.tokenize("a b c d e f g h", true).unwrap().len(), 3);
    assert!(m.tokenize("a b c d e f g h", false).is_err());
}

/// A dangling link for sentence-transformers' optional files is refused
/// naming the file: before, it was taken as absent (mean pooling, the
/// model's 512 positions).
#[test]
fn a_dangling_link_in_the_model_folder_is_refused_by_name() {
    let model = common::embed_model("a_dangling_link_in_the_model_folder_is_refused_by_name");
    for file in ["1_Pooling/config.json", "sentence_bert_config.json"] {
        let h = Hostile::new(&model.dir, "dangling");
        let path = h.dir.join(file);
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(h.dir.join("nowhere.json"), &path).unwrap();
        serve_refuses(h.arg(), &[file, "symbolic link", "does not exist"]);
    }
}

/// `--max-client-batch-size 0` would refuse every array: exit 2, one line.
/// Before, the server started.
#[test]
fn a_client_batch_of_zero_is_refused() {
    let (code, _, err) = common::coexec(
        "hostile-client-batch",
        &[
            "serve",
            "--max-client-batch-size",
            "0",
            "--addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--max-client-batch-size"), "{err}");
}

/// `body` posted to `path` on `addr`: its status, and its error's kind
/// where it has one (TEI's `error_type`; on `/v1/embeddings` TEI's OpenAI
/// shape's `type`).
fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> (u16, String) {
    let a = http(addr, "POST", path, body.to_string().as_bytes());
    let kind = serde_json::from_str::<serde_json::Value>(&a.body)
        .ok()
        .and_then(|v| {
            v.get("error_type")
                .or_else(|| v.get("type"))
                .and_then(|k| k.as_str().map(String::from))
        })
        .unwrap_or_default();
    (a.status, kind)
}

/// A tokenizer without a post-processor gives `"   "` no tokens at all.
/// Before, such a text was queued and failed its batch: every good request
/// batched with it got 500 `batch failed`. Now each route refuses it for
/// its own request (422 `Validation`) before it is queued, and the good
/// requests sent with it, batched together by a long `--max-wait-us`, are
/// answered.
#[test]
fn a_text_with_no_tokens_fails_only_its_own_request() {
    let model = common::embed_model("a_text_with_no_tokens_fails_only_its_own_request");
    let h = Hostile::new(&model.dir, "no-tokens");
    h.edit_json("tokenizer.json", |t| {
        t["post_processor"] = serde_json::Value::Null
    });
    let srv = Server::start(&[
        "--model",
        h.arg(),
        "--devices",
        "cpu:1",
        "--max-wait-us",
        "300000",
    ]);
    let addr = srv.addr;
    let blank = "   ";
    let cases = [
        (
            "/embed",
            serde_json::json!({ "inputs": ["a good text", "another one"] }),
            serde_json::json!({ "inputs": ["fine", blank] }),
        ),
        (
            "/v1/embeddings",
            serde_json::json!({ "input": ["a good text"] }),
            serde_json::json!({ "input": blank }),
        ),
        (
            "/similarity",
            serde_json::json!({ "inputs": { "source_sentence": "a cat", "sentences": ["a dog"] } }),
            serde_json::json!({ "inputs": { "source_sentence": "a cat", "sentences": ["fine", blank] } }),
        ),
    ];
    for (path, good, bad) in cases {
        let goods: Vec<_> = (0..4)
            .map(|_| {
                let good = good.clone();
                std::thread::spawn(move || post(addr, path, &good))
            })
            .collect();
        let refused = post(addr, path, &bad);
        assert_eq!(
            refused,
            (422, "Validation".into()),
            "{path}: the blank text"
        );
        for g in goods {
            assert_eq!(g.join().unwrap().0, 200, "{path}: a good request");
        }
    }
}

/// `/tokenize` under the memory budget (`--memory-budget-mib`): a request
/// holds its share from the read until its answer is written, so a client
/// that does not read a 50 MB answer keeps it held, and a request the rest
/// cannot cover gets 429 `Overloaded` with `Retry-After`; once that client
/// goes, the budget is whole again. Before, `/tokenize` had no budget:
/// 16 concurrent requests at the limit added 2.5 GB of RSS.
#[test]
fn tokenize_answers_are_held_in_the_memory_budget_until_written() {
    use std::io::{Read, Write};
    let model = common::embed_model("tokenize_answers_are_held_in_the_memory_budget_until_written");
    let srv = Server::start(&[
        "--model",
        model.arg(),
        "--devices",
        "cpu:1",
        "--memory-budget-mib",
        "64",
    ]);
    let addr = srv.addr;
    // 750 000 one-letter words: an answer of some 50 MB, past the whole
    // budget by its estimate (it runs alone) and most of it once written.
    let texts = vec![("a ".repeat(31_000)).trim_end().to_string(); 24];
    let big = serde_json::json!({ "inputs": texts }).to_string();
    let mut reader = std::net::TcpStream::connect(addr).unwrap();
    write!(
        reader,
        "POST /tokenize HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{big}",
        big.len()
    )
    .unwrap();
    // Its head only: the answer's body stays unread, in the server.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        reader.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    // 180 kB of text is 33 MiB by the estimate: more than is left.
    let small = serde_json::json!({ "inputs": vec!["a ".repeat(30_000); 3] }).to_string();
    let a = http(addr, "POST", "/tokenize", small.as_bytes());
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(a.json()["error_type"], "Overloaded");
    assert!(a.header("retry-after").is_some());
    drop(reader);
    // Dropped with its connection, the answer gives its bytes back (the
    // server notices the close within a few retries).
    let mut status = 0;
    for _ in 0..100 {
        status = http(addr, "POST", "/tokenize", small.as_bytes()).status;
        if status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(status, 200, "the budget is whole again");
}
