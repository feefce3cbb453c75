//! The profiler learns the split, stores it per machine, and a second process
//! starts from it.

use coexec::kernels::Synthetic;
use coexec::Runtime;

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// One CPU worker and a simulated accelerator twice as fast, with profiles
/// in `dir`: each call is what another process would start.
fn runtime(dir: &std::path::Path) -> Runtime {
    Runtime::builder()
        .devices("cpu:1,sim:1@2")
        .unwrap()
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
    // The profile and its lock file (saves merge under it, issue 13).
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
    std::fs::write(&path, b"{\"version\": 1, \"fingerprint\": ").unwrap();
    let rt = runtime(&dir);
    let r = rt.run(Synthetic::new(10_000, 10)).await.unwrap().report;
    assert_eq!(format!("{:?}", r.probe.unwrap().kind), "Cold");
    rt.shutdown().await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_ok(),
        "rewritten whole"
    );
}
