use super::*;

fn fp() -> Fingerprint {
    Fingerprint {
        cpu_model: "Test CPU".into(),
        cores: 2,
        accelerators: vec![],
    }
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn round_trips_and_learns() {
    let dir = tempdir("rt");
    let classes = vec!["cpu".to_string(), "sim@2".to_string()];
    let mut s = ProfileStore::open(&dir, fp());
    let samples = vec![
        vec![Sample {
            items: 100.0,
            secs: 0.01,
        }],
        vec![Sample {
            items: 100.0,
            secs: 0.005,
        }],
    ];
    let l = s.observe("k", &classes, &samples, &[1.0 / 3.0, 2.0 / 3.0], 0.05);
    assert!(l.split_replaced);
    s.save().unwrap();
    let s2 = ProfileStore::open(&dir, fp());
    let m = s2.models("k", &classes);
    assert!((m[1].b() - 2e4).abs() < 1e-6);
    // A second run within ν keeps the stored split.
    let mut s2 = s2;
    let l = s2.observe("k", &classes, &samples, &[0.34, 0.66], 0.05);
    assert!(!l.split_replaced && l.delta < 0.05);
}

#[test]
fn corrupt_and_foreign_profiles_are_ignored() {
    let dir = tempdir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("coexec-profile-{}.json", fp().id()));
    std::fs::write(&path, "{ not json").unwrap();
    let s = ProfileStore::open(&dir, fp());
    assert!(s.file().kernels.is_empty());
    // Foreign: a file with another fingerprint under this name.
    let mut other = ProfileStore::in_memory(Fingerprint { cores: 64, ..fp() });
    other.observe(
        "k",
        &["cpu".into()],
        &[vec![Sample {
            items: 1.0,
            secs: 1.0,
        }]],
        &[1.0],
        0.05,
    );
    std::fs::write(&path, serde_json::to_string(other.file()).unwrap()).unwrap();
    let s = ProfileStore::open(&dir, fp());
    assert!(s.file().kernels.is_empty());
}

fn run_of(store: &mut ProfileStore, kernel: &str, secs: f64) {
    let classes = vec!["cpu".to_string()];
    let samples = vec![vec![Sample { items: 100.0, secs }; 4]];
    store.observe(kernel, &classes, &samples, &[1.0], 0.05);
}

#[test]
fn two_stores_on_one_file_add_up_instead_of_overwriting() {
    let dir = tempdir("merge");
    let mut a = ProfileStore::open(&dir, fp());
    let mut b = ProfileStore::open(&dir, fp());
    run_of(&mut a, "ka", 0.01);
    run_of(&mut b, "kb", 0.02);
    run_of(&mut b, "kb", 0.02);
    a.save().unwrap();
    b.save().unwrap();
    run_of(&mut a, "kb", 0.02);
    a.save().unwrap();
    let c = ProfileStore::open(&dir, fp());
    let k = &c.file().kernels;
    assert_eq!(k["ka"].runs, 1);
    assert_eq!(k["kb"].runs, 3, "b's two runs and a's one");
    assert!(k["ka"].models["cpu"].is_known() && k["kb"].models["cpu"].is_known());
    assert_eq!(k["kb"].models["cpu"].observed, 12);
}

#[test]
fn orphaned_temporary_files_are_removed() {
    let dir = tempdir("tmp");
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("coexec-profile-{}.json", fp().id());
    let orphan = dir.join(format!("{name}.999999.tmp"));
    let unrelated = dir.join("other.json.1.tmp");
    std::fs::write(&orphan, "half a profile").unwrap();
    std::fs::write(&unrelated, "not ours").unwrap();
    let mut s = ProfileStore::open(&dir, fp());
    assert!(!orphan.exists(), "an orphan from a killed save is removed");
    std::fs::write(&orphan, "half a profile").unwrap();
    run_of(&mut s, "k", 0.01);
    s.save().unwrap();
    assert!(!orphan.exists());
    assert!(unrelated.exists(), "only this profile's temporary files go");
}

#[test]
fn implausible_models_and_long_windows_are_dropped_on_load() {
    let dir = tempdir("sane");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("coexec-profile-{}.json", fp().id()));
    let mut good = SpeedModel::default();
    for _ in 0..3 * crate::perfmodel::WINDOW {
        good.observe(100.0, 0.01);
    }
    let mut v = serde_json::to_value(ProfileStore::in_memory(fp()).file()).unwrap();
    let mut long = serde_json::to_value(&good).unwrap();
    let sample = long["samples"][0].clone();
    long["samples"] = serde_json::Value::Array(vec![sample; 10 * crate::perfmodel::WINDOW]);
    v["kernels"]["k"] = serde_json::json!({
        "models": {
            "cpu": long,
            "sim@2+0us": serde_json::to_value(SpeedModel::with_params(1e308, 1e5)).unwrap(),
            "sim@3+0us": serde_json::to_value(SpeedModel::with_params(0.0, 1e-300)).unwrap(),
        },
        "split": { "cpu": 0.5, "sim@2+0us": 7.0 },
        "runs": 3,
    });
    std::fs::write(&path, v.to_string()).unwrap();
    let s = ProfileStore::open(&dir, fp());
    let k = &s.file().kernels["k"];
    assert_eq!(k.models.len(), 1, "only the plausible model stays");
    assert_eq!(k.models["cpu"].samples().len(), crate::perfmodel::WINDOW);
    assert!(k.split.is_empty(), "a split that is not shares goes");
    assert_eq!(k.runs, 3);
}

/// A profile folder that cannot be written: the save fails naming the
/// file, keeps what was learned, and the next try waits a save interval
/// (before, a stream tried and warned at every batch: 274 warnings in
/// 1.5 s).
#[test]
fn a_failed_save_names_the_file_and_waits_before_trying_again() {
    let dir = tempdir("unwritable");
    std::fs::create_dir_all(&dir).unwrap();
    // A regular file where the profile folder should be.
    let blocker = dir.join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let mut s = ProfileStore::open(&blocker.join("profiles"), fp());
    run_of(&mut s, "k", 0.01);
    let every = std::time::Duration::from_secs(1);
    assert_eq!(s.save_wait(every), std::time::Duration::ZERO);
    let e = s.save().unwrap_err();
    assert!(e.to_string().contains("not-a-dir"), "{e}");
    assert!(s.save_wait(every) > std::time::Duration::from_millis(500));
    assert!(s.models("k", &["cpu".to_string()])[0].observed > 0, "kept");
    let _ = std::fs::remove_dir_all(&dir);
}
