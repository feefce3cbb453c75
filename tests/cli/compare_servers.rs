//! `coexec-load --server`: servers the generator starts itself, side by
//! side, each run on a fresh one, stopped with SIGTERM.

use serde_json::Value;

/// `coexec-load args…`: (exit code, stdout, stderr).
fn load(args: &[&str]) -> (i32, String, String) {
    let (rc, out, err, _) = crate::load_generator::load(args);
    (rc, out, err)
}

fn serve(name: &str) -> String {
    format!(
        "{name}={} serve --addr 127.0.0.1:0 --devices cpu:1 --profile-dir {{profile_dir}}",
        env!("CARGO_BIN_EXE_coexec")
    )
}

#[test]
fn two_servers_side_by_side_in_rotated_rounds() {
    let logs = std::env::temp_dir().join(format!("coexec-compare-test-{}", std::process::id()));
    let (a, b) = (serve("a"), serve("b"));
    let (rc, out, err) = load(&[
        "--server",
        &a,
        "--server",
        &b,
        "--rate",
        "400",
        "--requests",
        "200",
        "--rounds",
        "2",
        "--warmup-requests",
        "50",
        "--log-dir",
        logs.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let runs = v["runs"].as_array().unwrap();
    let order: Vec<(u64, &str)> = runs
        .iter()
        .map(|r| (r["round"].as_u64().unwrap(), r["server"].as_str().unwrap()))
        .collect();
    assert_eq!(order, [(1, "a"), (1, "b"), (2, "b"), (2, "a")]);
    for r in runs {
        assert_eq!(r["exit"], 0, "{r}");
        let rate = &r["reports"][0];
        assert_eq!(rate["ok"], 200, "{rate}");
        assert!(rate["accuracy"].as_f64().unwrap() > 0.9, "{rate}");
        // Each run's server had a profile folder of its own, gone after.
        let command = r["command"].as_str().unwrap();
        let dir = command.split_whitespace().last().unwrap();
        assert!(dir.contains("coexec-load-profile-"), "{command}");
        assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
        let log = std::fs::read_to_string(r["log"].as_str().unwrap()).unwrap();
        assert!(log.contains("listening on http://127.0.0.1:"), "{log}");
    }
    // p50 and p99 of each server; the base's ratio is 1.
    let cells = v["summary"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{cells:?}");
    assert_eq!(cells[0]["ratio"].as_f64(), Some(1.0));
    assert!(
        cells
            .iter()
            .all(|c| c["per_round"].as_array().unwrap().len() == 2)
    );
    let _ = std::fs::remove_dir_all(&logs);
}

#[test]
fn a_server_that_never_listens_fails_the_run_and_bad_specs_exit_2() {
    let logs = std::env::temp_dir().join(format!("coexec-mute-test-{}", std::process::id()));
    // A shell comment keeps the placeholder out of sleep's arguments.
    let (rc, _, err) = load(&[
        "--server",
        "mute=sleep 20 # {profile_dir}",
        "--rate",
        "10",
        "--ready-timeout",
        "1",
        "--log-dir",
        logs.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&logs);
    assert_eq!(rc, 1, "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(
        last.contains("--server mute: no `listening on http://ADDR` line within 1 s")
            && last.contains("its log: "),
        "{err}"
    );

    for (spec, why) in [
        ("a=coexec serve", "has no {profile_dir}"),
        ("a b=x {profile_dir}", "letters, digits"),
        ("nothing", "NAME=COMMAND"),
    ] {
        let (rc, _, err) = load(&["--server", spec, "--rate", "10"]);
        assert_eq!(rc, 2, "{spec}: {err}");
        assert!(
            err.contains(why) && err.lines().count() == 1,
            "{spec}: {err}"
        );
    }
    let a = serve("a");
    let (rc, _, err) = load(&["--server", &a, "--server", &a, "--rate", "10"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("given twice"), "{err}");
}
