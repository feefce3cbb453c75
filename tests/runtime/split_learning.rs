//! The profiler learns the split, stores it per machine, and a second process
//! starts from it.

use coexec::kernels::Synthetic;
use coexec::{JobOptions, Runtime};

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// One CPU worker and a simulated accelerator eight times as fast (a wide
/// margin: the assertions hold even if a loaded machine skews the CPU's
/// calibration against the sim's modelled time fourfold), with profiles
/// in `dir`: each call is what another process would start. Every run
/// probes: the warm start and the single-class rule are off, because a
/// warm run that skips its probe, or one sent to the sim alone (which a
/// loaded machine's skewed first models can forecast), would report no
/// probe, and the probe's `shares_before` is how these tests read the
/// split a runtime started from.
fn runtime(dir: &std::path::Path) -> Runtime {
    let probing = coexec::Thresholds::default()
        .warm_start(false)
        .single_class(false);
    Runtime::builder()
        .devices("cpu:1,sim:1@8")
        .unwrap()
        .thresholds(probing)
        .profile_dir(dir)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_runtime_starts_from_the_stored_profile() {
    let dir = tempdir("learn");
    let n = 60_000;
    let first = {
        let rt = runtime(&dir);
        let d = rt.run(Synthetic::new(n, 200)).await.unwrap();
        assert!(rt.profile_path().unwrap().starts_with(&dir));
        rt.shutdown().await;
        d.report
    };
    let p = first.probe.expect("hybrid probes");
    assert_eq!(format!("{:?}", p.kind), "Cold");
    // Another runtime, as another process would: warm start.
    let rt = runtime(&dir);
    let second = rt.run(Synthetic::new(n, 200)).await.unwrap().report;
    let p = second.probe.expect("hybrid probes");
    assert_eq!(format!("{:?}", p.kind), "Warm");
    assert!(
        p.shares_before[1] > 0.5,
        "the stored split favours the faster sim: {p:?}"
    );
    rt.shutdown().await;
    // The profile and its lock file (saves merge under it).
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "one profile per machine");
}

#[tokio::test(flavor = "current_thread")]
async fn a_corrupt_profile_is_ignored_and_recalibrated() {
    let dir = tempdir("corrupt");
    let rt = runtime(&dir);
    rt.run(Synthetic::new(10_000, 10)).await.unwrap();
    let path = rt.profile_path().unwrap().to_path_buf();
    rt.shutdown().await;
    let corrupt = b"{\"version\": 1, \"fingerprint\": ";
    std::fs::write(&path, corrupt).unwrap();
    let rt = runtime(&dir);
    let r = rt.run(Synthetic::new(10_000, 10)).await.unwrap().report;
    assert_eq!(format!("{:?}", r.probe.unwrap().kind), "Cold");
    rt.shutdown().await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_ok(),
        "rewritten whole"
    );
    // The corrupt file is kept beside it, not destroyed.
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with(&format!("{name}.corrupt-"))
        })
        .collect();
    assert_eq!(aside.len(), 1, "moved aside once");
    assert_eq!(std::fs::read(aside[0].path()).unwrap(), corrupt);
}

/// A profile of another format version (a newer coexec sharing the
/// folder) is neither read nor written: the runtime learns in memory.
#[tokio::test(flavor = "current_thread")]
async fn a_profile_of_another_version_is_never_written() {
    let dir = tempdir("version");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = runtime(&dir);
    let path = rt.profile_path().unwrap().to_path_buf();
    rt.shutdown().await;
    let newer = br#"{"version": 99, "kernels": {"synthetic/w10": {"shape": "new"}}}"#;
    std::fs::write(&path, newer).unwrap();
    let rt = runtime(&dir);
    assert!(rt.profile_path().is_none(), "in memory");
    for _ in 0..2 {
        rt.run(Synthetic::new(10_000, 10)).await.unwrap();
    }
    rt.shutdown().await;
    assert_eq!(std::fs::read(&path).unwrap(), newer, "left as it was");

    // Written by a newer coexec while this one runs: its next save is
    // refused, and it goes on in memory.
    std::fs::remove_file(&path).unwrap();
    let rt = runtime(&dir);
    rt.run(Synthetic::new(10_000, 10)).await.unwrap();
    // Its first save, written on the profile's thread.
    let t0 = std::time::Instant::now();
    while !path.exists() {
        assert!(t0.elapsed().as_secs() < 10, "the first run was never saved");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    std::fs::write(&path, newer).unwrap();
    for _ in 0..2 {
        rt.run(Synthetic::new(10_000, 10)).await.unwrap();
    }
    rt.shutdown().await;
    assert_eq!(std::fs::read(&path).unwrap(), newer, "not overwritten");
}

/// A run kept off a class (as a stream's batch is, placed whole on one
/// class) measures nothing of that class's speed, so it leaves the stored
/// split alone. It used to store `[1, 0]` or `[0, 1]`: a stream alternating
/// classes replaced the split at every batch, and each replacement rewrote
/// the profile file on the broker's thread.
#[tokio::test(flavor = "current_thread")]
async fn a_run_kept_off_a_class_leaves_the_stored_split_alone() {
    let dir = tempdir("kept-off");
    let n = 60_000;
    let rt = runtime(&dir);
    let full = rt.run(Synthetic::new(n, 200)).await.unwrap().report;
    assert!(full.split_delta.is_some(), "a run on every class learns");
    // The sim last: had it stored its `[1, 0]`, the sim would get nothing.
    for class in [1, 0] {
        let opts = JobOptions::new().classes([class]);
        let r = rt.run_with(Synthetic::new(n, 200), opts).await.unwrap();
        assert_eq!(r.report.split_delta, None, "class {class} only");
        assert!(!r.report.split_stored);
    }
    rt.shutdown().await;
    let rt = runtime(&dir);
    let p = rt.run(Synthetic::new(n, 200)).await.unwrap().report.probe;
    let p = p.expect("hybrid probes");
    assert_eq!(format!("{:?}", p.kind), "Warm");
    assert!(
        p.shares_before[1] > 0.5 && p.shares_before[0] > 0.0,
        "the split the full run learned, not a one-class run's: {p:?}"
    );
    rt.shutdown().await;
}

/// Saves are kept a second apart while runs stream in, and what the
/// runs within that second learned is still written within about a second,
/// with no further run and no shutdown (a trailing save), so a process
/// that is killed loses at most that second.
#[tokio::test(flavor = "current_thread")]
async fn runs_close_together_are_saved_without_a_shutdown() {
    let dir = tempdir("trailing");
    // One class: the split is `[1]` from the first run on, never replaced,
    // so only the samples and run counts of later runs are left to save.
    let rt = Runtime::builder()
        .devices("cpu:1")
        .unwrap()
        .profile_dir(&dir)
        .build()
        .unwrap();
    for _ in 0..3 {
        rt.run(Synthetic::new(10_000, 10)).await.unwrap();
    }
    let path = rt.profile_path().unwrap().to_path_buf();
    let runs = || -> u64 {
        let Ok(text) = std::fs::read_to_string(&path) else {
            return 0;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        v["kernels"]
            .as_object()
            .map_or(0, |k| k.values().filter_map(|p| p["runs"].as_u64()).sum())
    };
    let t0 = std::time::Instant::now();
    while runs() < 3 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the profile holds {} of 3 runs, 10 s after them",
            runs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    rt.shutdown().await;
}

/// A save waits for the profile's lock while another process saves; runs
/// do not wait with it: saves are written on a thread of their own, not
/// the one the broker and the profiler answer admissions on.
#[tokio::test(flavor = "current_thread")]
async fn runs_do_not_wait_behind_a_save() {
    use std::time::Duration;

    let dir = tempdir("save-off-thread");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = runtime(&dir);
    let path = rt.profile_path().unwrap().to_path_buf();
    // Another process saving, as far as this one can tell.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.with_extension("lock"))
        .unwrap();
    lock.lock().unwrap();
    // The first run's save waits for the lock; the later runs go on.
    for i in 0..4 {
        let run = rt.run(Synthetic::new(10_000, 10));
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .unwrap_or_else(|_| panic!("run {i} waited behind the save"))
            .unwrap();
    }
    lock.unlock().unwrap();
    // Shutting down writes what the held save and the later runs learned.
    rt.shutdown().await;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let runs: u64 = v["kernels"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|p| p["runs"].as_u64())
        .sum();
    assert_eq!(runs, 4);
}
