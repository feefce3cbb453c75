//! `coexec merge`: shards joined in the order of their run records, and
//! every record, count and length checked before anything is written. The
//! shards here are written by hand with their records; the pipeline with
//! a model is `embed_pipeline.rs`.

use std::path::{Path, PathBuf};

use crate::common;

/// The run record `coexec embed` writes beside `output`, for shard `i/n`
/// of a corpus of `lines` lines.
fn record(output: &Path, i: usize, n: usize, lines: usize, dim: usize) {
    let (start, end) = (i * lines / n, (i + 1) * lines / n);
    let r = serde_json::json!({
        "format": "coexec-embed-run/1",
        "model_sha256": "m",
        "dim": dim,
        "normalized": true,
        "field": null,
        "corpus_bytes": 1000,
        "corpus_lines": lines,
        "corpus_sha256": "c",
        "shard_index": i,
        "shard_count": n,
        "first_line": start + 1,
        "last_line": end,
        "read_sha256": format!("r{i}"),
        "rows": end - start,
    });
    std::fs::write(format!("{}.coexec.json", output.display()), r.to_string()).unwrap();
}

/// A float32 `.npy` of `rows × dim` whose row `r` holds `first + r`.
fn npy(path: &Path, first: usize, rows: usize, dim: usize) {
    npy_shaped(path, first, rows, dim, &format!("({rows}, {dim})"));
}

fn npy_shaped(path: &Path, first: usize, rows: usize, dim: usize, shape: &str) {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.div_ceil(64) * 64 - unpadded;
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend(((dict.len() + pad + 1) as u16).to_le_bytes());
    b.extend(dict.as_bytes());
    b.extend(std::iter::repeat_n(b' ', pad));
    b.push(b'\n');
    for r in 0..rows {
        for _ in 0..dim {
            b.extend(((first + r) as f32).to_le_bytes());
        }
    }
    std::fs::write(path, b).unwrap();
}

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-merge-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn merge(args: &[&Path]) -> (i32, String, String) {
    let a: Vec<&str> = args.iter().map(|p| p.to_str().unwrap()).collect();
    common::coexec("merge", &[&["merge"][..], &a].concat())
}

fn refused(got: (i32, String, String), says: &str) {
    let (code, _, stderr) = got;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(says), "expected `{says}` in: {stderr}");
}

#[test]
fn shards_are_joined_in_their_records_order_whatever_the_arguments() {
    let d = dir("npy");
    // 10 lines in 3 shards: 3, 3 and 4 rows.
    let p: Vec<PathBuf> = (0..3).map(|i| d.join(format!("part-{i}.npy"))).collect();
    for (i, (first, rows)) in [(0, 3), (3, 3), (6, 4)].into_iter().enumerate() {
        npy(&p[i], first, rows, 2);
        record(&p[i], i, 3, 10, 2);
    }
    let out = d.join("all.npy");
    let o = Path::new("--output");
    // Given backwards: joined in shard order all the same.
    let (code, stdout, stderr) = merge(&[o, &out, &p[2], &p[0], &p[1]]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("merged 3 shards, 10 rows"), "{stdout}");
    let b = std::fs::read(&out).unwrap();
    assert!(String::from_utf8_lossy(&b[..128]).contains("'shape': (10, 2)"));
    let v: Vec<f32> = b[128..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(v, (0..10).flat_map(|r| [r as f32; 2]).collect::<Vec<_>>());
    // The joined file has a record of its own: the whole corpus.
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{}.coexec.json", out.display())).unwrap())
            .unwrap();
    assert_eq!(
        (r["shard_count"].as_u64(), r["rows"].as_u64()),
        (Some(1), Some(10))
    );

    // The output exists: refused.
    refused(merge(&[o, &out, &p[0], &p[1], &p[2]]), "exists");
    let out = d.join("again.npy");
    refused(
        merge(&[o, &out, &p[0], &p[1], &p[1], &p[2]]),
        "are both shard 1/3",
    );
    refused(
        merge(&[o, &out, &p[0], &p[2]]),
        "shard 1/3 (lines 4 to 6) is missing",
    );
    refused(
        merge(&[o, &out, &p[0], &p[1]]),
        "shard 2/3 (lines 7 to 10) is missing",
    );
    // A shard of another run (another model).
    let q = d.join("other-1.npy");
    npy(&q, 3, 3, 2);
    record(&q, 1, 3, 10, 2);
    let rec = format!("{}.coexec.json", q.display());
    let text = std::fs::read_to_string(&rec)
        .unwrap()
        .replace("\"m\"", "\"m2\"");
    std::fs::write(&rec, text).unwrap();
    refused(merge(&[o, &out, &p[0], &q, &p[2]]), "has model_sha256 m, ");
    // A shard cut short (its task stopped mid-way).
    let bytes = std::fs::read(&p[1]).unwrap();
    std::fs::write(&p[1], &bytes[..bytes.len() - 5]).unwrap();
    refused(
        merge(&[o, &out, &p[0], &p[1], &p[2]]),
        "part-1.npy: holds 2 of its 3 rows",
    );
    // A header whose rows × dim × 4 wraps to 0 bytes.
    npy_shaped(&p[1], 0, 0, 4, &format!("({}, 4)", 1u64 << 62));
    refused(
        merge(&[o, &out, &p[0], &p[1], &p[2]]),
        "past any file's size",
    );
    assert!(!out.exists(), "nothing written");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn json_lines_shards_carry_their_corpus_line_numbers() {
    let d = dir("jsonl");
    let line = |n: usize| format!("{{\"line\": {n}, \"embedding\": [0.5]}}\n");
    let a = d.join("a.jsonl");
    let b = d.join("b.jsonl");
    std::fs::write(&a, line(1) + &line(2)).unwrap();
    std::fs::write(&b, line(3) + &line(4) + &line(5)).unwrap();
    record(&a, 0, 2, 5, 1);
    record(&b, 1, 2, 5, 1);
    let out = d.join("all.jsonl");
    let o = Path::new("--output");
    let (code, stdout, stderr) = merge(&[o, &out, &b, &a]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("merged 2 shards, 5 rows"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        (1..=5).map(line).collect::<String>()
    );
    refused(
        merge(&[o, &d.join("x.jsonl"), &a, &a]),
        "are both shard 0/2",
    );
    // Rows whose numbers are not the shard's.
    std::fs::write(&b, line(3) + &line(9) + &line(5)).unwrap();
    refused(
        merge(&[o, &d.join("x.jsonl"), &a, &b]),
        "b.jsonl:2: the row of line 9, where corpus line 4's row was due",
    );
    assert!(!d.join("x.jsonl").exists(), "nothing written");
    let _ = std::fs::remove_dir_all(&d);
}
