//! `coexec merge`: shards joined in order, and every count checked before
//! anything is written.

use std::path::{Path, PathBuf};

use crate::common;

/// A float32 `.npy` of `rows × dim` whose row `r` holds `first + r`.
fn npy(path: &Path, first: usize, rows: usize, dim: usize) {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
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

#[test]
fn shards_are_joined_in_order_and_their_counts_checked() {
    let d = dir("npy");
    // 10 lines in 3 shards: 3, 3 and 4 rows.
    let corpus = d.join("corpus.txt");
    std::fs::write(
        &corpus,
        (1..=10).map(|i| format!("t{i}\n")).collect::<String>(),
    )
    .unwrap();
    let p: Vec<PathBuf> = (0..3).map(|i| d.join(format!("part-{i}.npy"))).collect();
    npy(&p[0], 0, 3, 2);
    npy(&p[1], 3, 3, 2);
    npy(&p[2], 6, 4, 2);
    let out = d.join("all.npy");
    let o = Path::new("--output");
    let i = Path::new("--input");
    let (code, stdout, stderr) = merge(&[i, &corpus, o, &out, &p[0], &p[1], &p[2]]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("merged 3 shards, 10 rows"), "{stdout}");
    let b = std::fs::read(&out).unwrap();
    assert!(String::from_utf8_lossy(&b[..128]).contains("'shape': (10, 2)"));
    let v: Vec<f32> = b[128..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(v, (0..10).flat_map(|r| [r as f32; 2]).collect::<Vec<_>>());

    // The output exists: refused.
    let (code, _, stderr) = merge(&[o, &out, &p[0], &p[1], &p[2]]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("exists"), "{stderr}");
    let out = d.join("again.npy");
    // Out of order: shard 0 given 4 rows.
    let (code, _, stderr) = merge(&[i, &corpus, o, &out, &p[2], &p[1], &p[0]]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("part-2.npy: 4 rows, but shard 0/3 of 10 lines owns 3 (lines 1 to 3)"),
        "{stderr}"
    );
    // A shard missing: the counts no longer add up to the corpus.
    let (code, _, stderr) = merge(&[i, &corpus, o, &out, &p[0], &p[1]]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("part-0.npy: 3 rows, but shard 0/2 of 10 lines owns 5"),
        "{stderr}"
    );
    // A shard cut short (its task stopped mid-way).
    let bytes = std::fs::read(&p[1]).unwrap();
    std::fs::write(&p[1], &bytes[..bytes.len() - 5]).unwrap();
    let (code, _, stderr) = merge(&[o, &out, &p[0], &p[1], &p[2]]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("part-1.npy: holds 2 of its 3 rows"),
        "{stderr}"
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
    let out = d.join("all.jsonl");
    let o = Path::new("--output");
    let (code, stdout, stderr) = merge(&[o, &out, &a, &b]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("merged 2 shards, 5 rows"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        (1..=5).map(line).collect::<String>()
    );
    // Given twice: the second copy's numbers do not follow on.
    let (code, _, stderr) = merge(&[o, &d.join("x.jsonl"), &a, &a]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("a.jsonl:1: expected the row of corpus line 3"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
