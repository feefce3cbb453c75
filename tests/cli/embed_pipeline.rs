//! `coexec embed` and `merge` as a corpus pipeline under a user's mistakes:
//! shards killed, resumed and merged in any order give one process's file
//! bit for bit, and every output of another run, every special file and
//! every output that is the input is refused with exit 2.
//!
//! They run on all-MiniLM-L6-v2 where it is here (`scripts/fetch_model.sh`),
//! else on tests/data/tiny-bert (`common::embed_model`): what they check is
//! the files, not what the vectors mean.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// The model folder as an argument, and its vectors' width.
fn model(test: &str) -> (String, usize) {
    let m = common::embed_model(test);
    (m.arg().to_string(), m.dim)
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-pipeline-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A JSON Lines corpus of `n` distinct texts, every 37th line not JSON.
fn corpus(path: &Path, n: usize, salt: &str) {
    let text: String = (0..n)
        .map(|i| {
            if i % 37 == 5 {
                "{not json\n".to_string()
            } else {
                format!(
                    "{}\n",
                    serde_json::json!({ "text": format!("{salt} sentence {i}: the cat sat on mat {}", i * 7 % 13) })
                )
            }
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

fn embed(model: &str, input: &Path, output: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut a = vec![
        "embed",
        "--model",
        model,
        "--input",
        s(input),
        "--output",
        s(output),
        "--devices",
        "cpu:2",
        "-q",
    ];
    a.extend_from_slice(extra);
    common::coexec("pipeline", &a)
}

fn merge(args: &[&str]) -> (i32, String, String) {
    common::coexec("pipeline", &[&["merge"][..], args].concat())
}

fn refused(got: (i32, String, String), says: &str) {
    let (code, _, stderr) = got;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(says), "expected `{says}` in: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
}

/// Starts `embed` and kills it (SIGKILL) once its output has rows of `dim`
/// floats; whether it was killed before it finished.
fn embed_killed(model: &str, dim: usize, input: &Path, output: &Path, shard: &str) -> bool {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args([
            "embed",
            "--model",
            model,
            "--input",
            s(input),
            "--output",
            s(output),
            "--devices",
            "cpu:1",
            "-q",
            "--shard",
            shard,
        ])
        .env("COEXEC_PROFILE_DIR", output.with_extension("profiles"))
        .env("COEXEC_INDEX_DIR", output.with_extension("index"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            return false;
        }
        if std::fs::metadata(output).is_ok_and(|m| m.len() > 128 + dim as u64 * 4) {
            child.kill().unwrap();
            return !child.wait().unwrap().success();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("embed did not write a row in 60 s");
}

#[test]
fn shards_killed_resumed_and_merged_in_any_order_equal_one_run() {
    let (m, dim) = model("shards_killed_resumed_and_merged_in_any_order_equal_one_run");
    let d = scratch("eleven");
    let input = d.join("corpus.jsonl");
    corpus(&input, 1100, "a");
    let whole = d.join("whole.npy");
    let (code, stdout, stderr) = embed(&m, &input, &whole, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("30 bad lines"), "{stdout}");
    let parts: Vec<PathBuf> = (0..11).map(|i| d.join(format!("shard_{i}.npy"))).collect();
    // Shard 3 killed mid-run, shard 7 cut mid-row as a full disk leaves it,
    // then both resumed.
    let killed = embed_killed(&m, dim, &input, &parts[3], "3/11");
    for (i, p) in parts.iter().enumerate() {
        if i != 3 {
            let (code, _, stderr) = embed(&m, &input, p, &["--shard", &format!("{i}/11")]);
            assert_eq!(code, 0, "{stderr}");
        }
    }
    let b = std::fs::read(&parts[7]).unwrap();
    // 37 rows and two thirds of the 38th.
    std::fs::write(&parts[7], &b[..128 + 37 * dim * 4 + dim * 8 / 3]).unwrap();
    for i in [3, 7] {
        let (code, stdout, stderr) = embed(
            &m,
            &input,
            &parts[i],
            &["--shard", &format!("{i}/11"), "--resume"],
        );
        assert_eq!(code, 0, "{stderr}");
        if i == 7 {
            assert!(stdout.contains("37 rows resumed"), "{stdout}");
        }
    }
    // The shell's glob order: shard_0 shard_1 shard_10 shard_2 …
    let mut glob: Vec<&str> = parts.iter().map(|p| s(p)).collect();
    glob.sort();
    let out = d.join("merged.npy");
    let mut a = vec!["--input", s(&input), "--output", s(&out)];
    a.extend(&glob);
    let (code, stdout, stderr) = merge(&a);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("merged 11 shards, 1100 rows"), "{stdout}");
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&whole).unwrap(),
        "the merged file equals one process's, bit for bit (shard 3 killed: {killed})"
    );

    // Every merge that is not of one run's shards, each once: refused.
    let out2 = d.join("again.npy");
    let o = ["--output", s(&out2)];
    refused(
        merge(&[&o[..], &[s(&parts[0]), s(&parts[0])], &glob[1..]].concat()),
        "are both shard 0/11",
    );
    refused(merge(&[&o[..], &glob[..10]].concat()), "is missing");
    refused(
        merge(&[&o[..], &[s(&parts[1]), s(&parts[0])]].concat()),
        "shard 2/11 (lines 201 to 300) is missing",
    );
    let other = d.join("other.jsonl");
    corpus(&other, 1100, "b");
    refused(
        merge(&[&o[..], &["--input", s(&other)], &glob].concat()),
        "the shards are of another corpus",
    );
    refused(
        merge(&[&o[..], &["--input", "/dev/zero"], &glob].concat()),
        "not a regular file",
    );
    refused(
        merge(&[&o[..], &["/dev/zero"]].concat()),
        "not a regular file",
    );
    let record = format!("{}.coexec.json", s(&parts[0]));
    refused(
        merge(&[&o[..], &[record.as_str()]].concat()),
        "a run record",
    );
    assert!(!out2.exists(), "nothing written");

    // Every resume onto another run's file: refused, the file untouched.
    let before = std::fs::read(&parts[1]).unwrap();
    refused(
        embed(&m, &input, &parts[1], &["--shard", "2/11", "--resume"]),
        "has shard_index 1, this run has 2",
    );
    refused(
        embed(&m, &other, &parts[1], &["--shard", "1/11", "--resume"]),
        "has corpus_sha256",
    );
    refused(
        embed(
            &m,
            &input,
            &parts[1],
            &["--shard", "1/11", "--resume", "--no-normalize"],
        ),
        "has normalized true, this run has false",
    );
    assert_eq!(std::fs::read(&parts[1]).unwrap(), before);
    // Bytes past its rows (403 rows' worth for 100).
    let grown = d.join("grown.npy");
    std::fs::copy(&parts[1], &grown).unwrap();
    std::fs::copy(
        format!("{}.coexec.json", s(&parts[1])),
        format!("{}.coexec.json", s(&grown)),
    )
    .unwrap();
    let mut g = std::fs::read(&grown).unwrap();
    g.extend(vec![0u8; 3 * dim * 4]);
    std::fs::write(&grown, &g).unwrap();
    refused(
        embed(&m, &input, &grown, &["--shard", "1/11", "--resume"]),
        "past its 100 rows",
    );
    // A file without a record (not embed's, or its record removed).
    let bare = d.join("bare.npy");
    std::fs::copy(&parts[1], &bare).unwrap();
    refused(
        embed(&m, &input, &bare, &["--shard", "1/11", "--resume"]),
        "no run record beside it",
    );
    refused(
        merge(&["--output", s(&out2), s(&bare)]),
        "no run record beside it",
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn json_lines_outputs_are_resumed_only_when_their_rows_are_this_runs() {
    let (m, _) = model("json_lines_outputs_are_resumed_only_when_their_rows_are_this_runs");
    let d = scratch("jsonl");
    let input = d.join("corpus.jsonl");
    corpus(&input, 40, "a");
    let out = d.join("v.jsonl");
    let (code, _, stderr) = embed(&m, &input, &out, &["--shard", "1/2"]);
    assert_eq!(code, 0, "{stderr}");
    let good = std::fs::read_to_string(&out).unwrap();
    let rows: Vec<&str> = good.lines().collect();
    assert_eq!(rows.len(), 20);
    // Cut mid-row: resumed to the same file.
    std::fs::write(&out, &good[..good.len() / 2]).unwrap();
    let (code, _, stderr) = embed(&m, &input, &out, &["--shard", "1/2", "--resume"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), good);
    // Shifted line numbers (another shard's rows), or a garbage line.
    let shifted = good.replace("\"line\":22", "\"line\":2");
    std::fs::write(&out, &shifted[..shifted.len() / 2]).unwrap();
    refused(
        embed(&m, &input, &out, &["--shard", "1/2", "--resume"]),
        "v.jsonl:2: the row of line 2, where corpus line 22's row was due",
    );
    let garbage = format!("{}\nnot a row at all\n", rows[0]);
    std::fs::write(&out, garbage).unwrap();
    refused(
        embed(&m, &input, &out, &["--shard", "1/2", "--resume"]),
        "v.jsonl:2: not a JSON row",
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_input_is_never_the_output_and_special_files_are_refused_at_once() {
    let (m, _) = model("the_input_is_never_the_output_and_special_files_are_refused_at_once");
    let d = scratch("same");
    let input = d.join("c.jsonl");
    corpus(&input, 20, "a");
    let before = std::fs::read(&input).unwrap();
    refused(embed(&m, &input, &input, &["--resume"]), "is the input");
    let link = d.join("link.jsonl");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    refused(embed(&m, &input, &link, &["--resume"]), "is the input");
    assert_eq!(
        std::fs::read(&input).unwrap(),
        before,
        "the corpus untouched"
    );
    refused(
        embed(&m, Path::new("/dev/zero"), &d.join("z.npy"), &[]),
        "not a regular file",
    );
    refused(
        embed(
            &m,
            Path::new("/dev/zero"),
            &d.join("z.npy"),
            &["--shard", "0/4"],
        ),
        "not a regular file",
    );
    let fifo = d.join("fifo.txt");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    refused(
        embed(&m, &fifo, &d.join("f.npy"), &["--shard", "1/2"]),
        "not a regular file",
    );
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "refused, not a hang"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_line_past_the_cap_is_embedded_by_its_first_bytes_or_refused_alone() {
    let (m, dim) = model("a_line_past_the_cap_is_embedded_by_its_first_bytes_or_refused_alone");
    let d = scratch("long");
    // A plain-text line of 4 MB: its vector is its first words'.
    let words: String = (0..400_000).map(|i| format!("w{} ", i % 97)).collect();
    let first: String = words.split(' ').take(300).collect::<Vec<_>>().join(" ");
    let input = d.join("c.txt");
    std::fs::write(&input, format!("{words}\n{first}\nshort line\n")).unwrap();
    let out = d.join("v.npy");
    let (code, stdout, stderr) = embed(&m, &input, &out, &["--max-line-bytes", "65536"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("0 bad lines"), "{stdout}");
    let v = std::fs::read(&out).unwrap();
    let row = |r: usize| &v[128 + r * dim * 4..128 + (r + 1) * dim * 4];
    assert_eq!(row(0), row(1), "the long line's vector is its first words'");
    // A JSON line past the cap is that line's error, the others embedded.
    let json = d.join("c.jsonl");
    let big = serde_json::json!({ "text": words }).to_string();
    std::fs::write(&json, format!("{big}\n\"short\"\n")).unwrap();
    let out = d.join("j.jsonl");
    let (code, stdout, stderr) = embed(&m, &json, &out, &["--max-line-bytes", "65536"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("1 bad lines") && stdout.contains("embedded 1 texts"),
        "{stdout}"
    );
    assert!(
        stderr.contains("c.jsonl:1:") && stderr.contains("past --max-line-bytes 65536"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_model_whose_vectors_overflow_is_refused_before_a_row_is_written() {
    let (m, _) = model("a_model_whose_vectors_overflow_is_refused_before_a_row_is_written");
    let d = scratch("overflow");
    let bad = common::Hostile::overflowing(Path::new(&m), "pipeline-overflow");
    let input = d.join("c.txt");
    std::fs::write(&input, "a cat sat\nthe dog slept\n").unwrap();
    let out = d.join("v.npy");
    let (code, stdout, stderr) = embed(bad.arg(), &input, &out, &[]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("model.safetensors") && stderr.contains("finite"),
        "{stderr}"
    );
    assert!(!out.exists(), "no NaN rows written");
    let _ = std::fs::remove_dir_all(&d);
}
