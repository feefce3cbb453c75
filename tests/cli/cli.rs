//! The command line: misuse exits 2 with one line; runs print what they did.

use std::process::Command;

use crate::common;

/// `coexec args…`: see `common::coexec`.
fn coexec(args: &[&str]) -> (i32, String, String) {
    common::coexec("coexec-cli-test", args)
}

#[test]
fn misuse_exits_2_with_one_line() {
    let bad_file = std::env::temp_dir().join(format!("coexec-bad-{}.txt", std::process::id()));
    std::fs::write(&bad_file, "1 2 3\n2 4 x 6\n3 1\n").unwrap();
    let bad = bad_file.to_str().unwrap();
    for args in [
        vec!["run", "bogus"],
        vec!["run", "synthetic", "--devices", "cpu:0"],
        vec!["run", "synthetic", "--devices", "sim:1@fast"],
        vec!["run", "synthetic", "--policy", "fastest"],
        vec!["run", "synthetic", "--size", "0"],
        vec!["run", "matmul", "--count", "99999999999999"],
        vec!["run", "kmeans", "--file", "/nonexistent/points.txt"],
        vec!["run", "kmeans", "--file", bad],
        vec!["run", "kmeans", "--file", bad, "--clusters", "0"],
        vec!["bench", "--repeat", "0"],
        vec!["bench", "nosuch"],
        vec!["frobnicate"],
        vec!["run", "synthetic", "--size", "ten"],
        vec!["run", "synthetic", "--metrics-linger", "5"],
        vec![
            "bench",
            "--metrics",
            "127.0.0.1:0",
            "--metrics-linger",
            "9999",
        ],
    ] {
        let (code, _, err) = coexec(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (_, _, err) = coexec(&["run", "kmeans", "--file", bad]);
    assert!(
        err.contains(bad) && err.contains(":2:"),
        "names the file and line: {err}"
    );
    // The one line says what is missing or allowed (before, clap's first
    // line alone: "the following required arguments were not provided:").
    for (args, says) in [
        (vec!["run"], "<WORKLOAD>"),
        (
            vec!["serve", "--policy", "cpu-only"],
            "[possible values: hybrid, greedy]",
        ),
        (vec!["serve", "--max-connections", "0"], "1..=1048576"),
    ] {
        let (code, _, err) = coexec(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn run_and_list() {
    let (code, out, err) = coexec(&[
        "run",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@2",
        "--size",
        "5000",
        "--work",
        "10",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("synthetic") && out.contains("verified: true"),
        "{out}"
    );
    let (code, out, _) = coexec(&[
        "run",
        "pathfinder",
        "--cols",
        "1000",
        "--rows",
        "20",
        "--json",
        "--devices",
        "cpu:2",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["result"]["sha256"].as_str().unwrap().len(), 64);
    let (code, out, _) = coexec(&["policies"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 8);
    let (code, out, _) = coexec(&["devices"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("cpu"));
}

/// `coexec devices` uses the CPUs its affinity mask allows and the GPUs
/// `CUDA_VISIBLE_DEVICES` leaves, and says so (Slurm's `--cpus-per-task`
/// and `--gres` set those two).
#[test]
fn devices_are_those_the_fence_leaves_and_it_is_named() {
    if !std::path::Path::new("/usr/bin/taskset").exists() {
        eprintln!("skipped: no taskset");
        return;
    }
    let out = std::process::Command::new("/usr/bin/taskset")
        .args(["-c", "0", env!("CARGO_BIN_EXE_coexec"), "devices"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("COEXEC_DEVICES")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.starts_with("cpu        1 workers"), "{text}");
    assert!(
        text.contains("cpu: 1 usable of ") && text.contains("affinity allows 1 (0)"),
        "{text}"
    );
    assert!(
        text.contains("gpu: CUDA_VISIBLE_DEVICES is empty: no GPU"),
        "{text}"
    );
}

/// A class whose warm-up model says it is far too slow to run alone is
/// checked by a run alone (cut at 20x the fastest, at least 1 s) before its
/// time is a prediction: a sim with 5 ms of latency was printed as "T alone
/// sim 10.16 s (predicted)" for a job it runs in about 10 ms, and its
/// forecast then stayed near zero.
#[test]
fn bench_measures_a_class_its_warm_up_mispredicted() {
    let (code, out, err) = coexec(&[
        "bench",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@2+5ms",
        "--policies",
        "hybrid",
        "--size",
        "2000",
        "--work",
        "200",
        "--repeat",
        "3",
        "--budget",
        "0",
        "--pairs",
        "0",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let sim = out
        .lines()
        .find(|l| l.contains("T alone sim"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(!sim.contains("predicted"), "{sim}");
    let secs: f64 = sim.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(secs < 1.0, "{sim}");
}

/// The default synthetic size with a class 2500 times the CPU's speed: the
/// slowest class alone is capped at 20x the 0.6 s target (12 M items of
/// about a microsecond), where it was sized by the sum of the speeds (731 M
/// items, 17 GB, 7 minutes on the 2-core VM).
#[test]
fn a_default_bench_size_stays_within_the_slowest_class_s_reach() {
    let (code, out, err) = coexec(&[
        "bench",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@2500",
        "--policies",
        "hybrid",
        "--repeat",
        "1",
        "--budget",
        "0",
        "--pairs",
        "0",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let header = out
        .lines()
        .find(|l| l.starts_with("synthetic ("))
        .unwrap_or_else(|| panic!("{out}"));
    let items: usize = header
        .split("--size ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{header}"));
    // 20 x 0.6 s at no more than 1 µs an item (the busy rounds' measured
    // cost sets it; 1000 rounds take about 1 µs).
    assert!((1000..=40_000_000).contains(&items), "{header}");
}

/// `--oracle` sweeps fixed splits and reports the best as a row, with
/// every policy's time against it.
#[test]
fn bench_oracle_reports_the_best_fixed_split() {
    let dir = std::env::temp_dir().join(format!("coexec-oracle-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("bench.json");
    let (code, out, err) = coexec(&[
        "bench",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@1",
        "--policies",
        "hybrid",
        "--size",
        "20000",
        "--work",
        "100",
        "--repeat",
        "1",
        "--budget",
        "0",
        "--pairs",
        "0",
        "--oracle",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("T_oracle"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let w = &v["workloads"][0];
    let oracle = &w["oracle"];
    // The coarse grid (9) and up to 5 shares around T*'s, then up to 4
    // around the best (fewer where one was tried already).
    let tried = oracle["tried"].as_array().unwrap().len();
    assert!((9..=18).contains(&tried), "{oracle}");
    let share = oracle["share"][0].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{oracle}");
    let t = oracle["makespan_s"].as_f64().unwrap();
    assert!(t <= w["best_alone_s"].as_f64().unwrap(), "{oracle}");
    let policies = w["policies"].as_array().unwrap();
    assert!(policies.iter().any(|p| p["policy"] == "oracle"), "{w}");
    for p in policies {
        let r = p["vs_oracle"].as_f64().unwrap();
        let want = t / p["makespan_s"].as_f64().unwrap();
        assert!((r - want).abs() < 1e-9, "{p}");
    }
}

#[test]
fn bench_without_an_accelerator_runs_the_cpu_classes() {
    // As in CI: accel-only has nothing to run on, the rest still runs.
    let json = std::env::temp_dir().join(format!("coexec-bench-{}.json", std::process::id()));
    let (code, out, err) = coexec(&[
        "bench",
        "synthetic",
        "--devices",
        "cpu:2",
        "--policies",
        "accel-only,cpu-only,hybrid",
        "--size",
        "20000",
        "--work",
        "10",
        "--repeat",
        "1",
        "--pairs",
        "1",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("`accel-only`: not run"), "{err}");
    assert!(out.contains("hybrid") && out.contains("cpu-only"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let policies: Vec<&str> = v["workloads"][0]["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["cpu-only", "hybrid"]);
}

#[test]
fn the_same_bits_whatever_the_split() {
    // 20 000 points in 8 features: many 1024-point blocks, cut differently
    // by every device mix and policy below.
    let file = std::env::temp_dir().join(format!("coexec-kmeans-{}.txt", std::process::id()));
    let mut text = String::new();
    let mut x: u64 = 12345;
    for i in 0..20_000 {
        text += &i.to_string();
        for _ in 0..8 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text += &format!(" {:.4}", (x >> 40) as f64 / (1u64 << 24) as f64 * 100.0);
        }
        text.push('\n');
    }
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    let mixes = [
        ("cpu:2", "hybrid"),
        ("cpu:1,sim:1@1", "dynamic"),
        ("cpu:1", "static"),
        ("cpu:2,sim:2@3", "guided"),
    ];
    for (workload, extra) in [
        ("kmeans", vec!["--file", f, "--clusters", "6"]),
        ("matmul", vec!["--count", "300", "--dim", "24"]),
        ("nbody", vec!["--bodies", "1000", "--steps", "3"]),
        (
            "pathfinder",
            vec!["--cols", "5000", "--rows", "60", "--pyramid", "7"],
        ),
    ] {
        let mut seen = Vec::new();
        for (devices, policy) in mixes {
            let mut args = vec![
                "run",
                workload,
                "--json",
                "--devices",
                devices,
                "--policy",
                policy,
            ];
            args.extend(extra.iter().copied());
            let (code, out, err) = coexec(&args);
            assert_eq!(code, 0, "{workload} {devices} {policy}: {err}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            seen.push(v["result"].to_string());
        }
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "{workload}: {seen:?}"
        );
    }
}

#[test]
fn the_default_bench_runs_without_the_kmeans_input() {
    // A clone without Rodinia's data beside it: kmeans is left out, with a
    // line saying how to give it, and the other workloads run.
    let out = Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args([
            "bench",
            "--devices",
            "cpu:2",
            "--repeat",
            "1",
            "--budget",
            "0",
            "--pairs",
            "0",
            "--count",
            "50",
            "--size",
            "500",
            "--rows",
            "20",
            "--steps",
            "1",
            "--quiet",
        ])
        .env("COEXEC_KMEANS_DATA", "/nonexistent/coexec-data")
        .env_remove("COEXEC_DEVICES")
        .output()
        .expect("run coexec");
    let (out_s, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // A kmeans folder named explicitly but missing is an error naming it
    // (only an absent default falls back to the generated input).
    let _ = out_s;
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("/nonexistent/coexec-data/kdd_cup.xz"), "{err}");
}

/// `bench --metrics` on a fixed port: the learning pairs' runtimes share the
/// one exporter. Before, each pair's runtime started its own on the same
/// port, and the bench exited 2 with "Address already in use".
#[test]
fn bench_serves_its_metrics_on_a_fixed_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let (code, _, err) = coexec(&[
        "bench",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@2",
        "--size",
        "2000",
        "--repeat",
        "1",
        "--budget",
        "0",
        "--pairs",
        "1",
        "--quiet",
        "--metrics",
        &addr,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.matches("metrics at").count(), 1, "one exporter: {err}");
}
