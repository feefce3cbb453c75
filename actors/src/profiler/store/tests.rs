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
    // A regular file where the profile folder should be, put there after
    // the start (a folder that is a file at the start keeps the store in
    // memory).
    let blocker = dir.join("not-a-dir");
    let mut s = ProfileStore::open(&blocker.join("profiles"), fp());
    std::fs::write(&blocker, b"x").unwrap();
    run_of(&mut s, "k", 0.01);
    let every = std::time::Duration::from_secs(1);
    assert_eq!(s.save_wait(every), std::time::Duration::ZERO);
    let e = s.save().unwrap_err();
    assert!(e.to_string().contains("not-a-dir"), "{e}");
    assert!(s.save_wait(every) > std::time::Duration::from_millis(500));
    assert!(s.models("k", &["cpu".to_string()])[0].observed > 0, "kept");
    let _ = std::fs::remove_dir_all(&dir);
}

fn profile_path(dir: &Path) -> PathBuf {
    dir.join(format!("coexec-profile-{}.json", fp().id()))
}

/// Save and load share one validity rule: the empty kernel over 2^32 items
/// (8.5e14 items/s, refused by the next load before) is kept and believed
/// after a load; a model the load would refuse (a fixed cost of 100 s) is
/// not kept, so the file saved loads with nothing dropped.
#[test]
fn what_is_saved_is_what_the_next_load_believes() {
    let dir = tempdir("one-rule");
    let classes = vec!["cpu".to_string(), "sim@2+0us".to_string()];
    let mut s = ProfileStore::open(&dir, fp());
    let sample = |items: f64, secs: f64| Sample { items, secs };
    let samples = vec![
        vec![sample(4_294_967_296.0, 5e-6)],
        vec![sample(10.0, 100.001), sample(1000.0, 100.1)],
    ];
    s.observe("empty", &classes, &samples, &[0.5, 0.5], 0.05);
    let k = &s.file().kernels["empty"];
    assert!(k.models["cpu"].b() > 8e14, "{}", k.models["cpu"].b());
    assert!(
        !k.models.contains_key("sim@2+0us"),
        "a fixed cost of 100 s is not kept"
    );
    s.save().unwrap();
    let (f, dropped) = read_profile(&profile_path(&dir), &fp()).unwrap().unwrap();
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(f.kernels["empty"].models.len(), 1);
    assert!(f.kernels["empty"].models["cpu"].b() > 8e14);
    let _ = std::fs::remove_dir_all(&dir);
}

/// At most `MAX_KERNELS` kernels are kept, the least recently run going
/// first, in memory, in the file and when two processes' kernels merge.
#[test]
fn the_least_recently_run_kernels_go_past_the_cap() {
    let dir = tempdir("cap");
    let mut a = ProfileStore::open(&dir, fp());
    for i in 0..MAX_KERNELS + 5 {
        run_of(&mut a, &format!("k{i}"), 0.01);
    }
    assert_eq!(a.file().kernels.len(), MAX_KERNELS);
    assert!(!a.file().kernels.contains_key("k4"), "the oldest went");
    assert!(a.file().kernels.contains_key("k5"));
    // Run again: no longer the least recently run.
    run_of(&mut a, "k5", 0.01);
    a.save().unwrap();
    // Another process adds kernels of its own to the same file.
    let mut b = ProfileStore::open(&dir, fp());
    assert_eq!(b.file().kernels.len(), MAX_KERNELS);
    run_of(&mut b, "new0", 0.01);
    run_of(&mut b, "new1", 0.01);
    b.save().unwrap();
    let (f, dropped) = read_profile(&profile_path(&dir), &fp()).unwrap().unwrap();
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(f.kernels.len(), MAX_KERNELS);
    let newest = format!("k{}", MAX_KERNELS + 4);
    for k in ["k5", "new0", "new1", &newest] {
        assert!(f.kernels.contains_key(k), "{k} kept");
    }
    assert!(!f.kernels.contains_key("k6") && !f.kernels.contains_key("k7"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file over `MAX_FILE_BYTES` is not read (10^6 kernels took a small run
/// 10.9 s and 3.3 GB) and is moved aside, not overwritten, at the next save.
#[test]
fn an_oversized_profile_is_not_read_and_kept_aside() {
    let dir = tempdir("oversized");
    std::fs::create_dir_all(&dir).unwrap();
    let path = profile_path(&dir);
    let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
    std::fs::write(&path, &big).unwrap();
    let mut s = ProfileStore::open(&dir, fp());
    assert!(s.file().kernels.is_empty());
    run_of(&mut s, "k", 0.01);
    s.save().unwrap();
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".oversized-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(aside[0].metadata().unwrap().len(), MAX_FILE_BYTES + 1);
    let (f, _) = read_profile(&path, &fp()).unwrap().unwrap();
    assert!(f.kernels.contains_key("k"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `MAX_KERNELS` kernels with full sample windows on four classes and a
/// run history fit well within `MAX_FILE_BYTES`: the size cap never
/// refuses a file the kernel cap allows.
#[test]
fn a_full_profile_fits_the_size_cap() {
    let mut s = ProfileStore::in_memory(fp());
    let classes: Vec<String> = ["cpu", "cuda:0", "cuda:1", "sim@2+0us"]
        .map(String::from)
        .to_vec();
    let samples: Vec<Vec<Sample>> = (0..4)
        .map(|c| {
            (0..crate::perfmodel::WINDOW)
                .map(|i| Sample {
                    items: 1000.0 + i as f64 + c as f64 / 7.0,
                    secs: 0.012_345_678_9 + i as f64 * 1e-7,
                })
                .collect()
        })
        .collect();
    for i in 0..MAX_KERNELS {
        s.observe(
            &format!("kmeans-{i:08}"),
            &classes,
            &samples,
            &[0.1, 0.3, 0.3, 0.3],
            0.05,
        );
    }
    let text = serde_json::to_string_pretty(s.file()).unwrap();
    assert!(
        (text.len() as u64) < MAX_FILE_BYTES / 2,
        "{} bytes",
        text.len()
    );
}

#[test]
fn reading_keeps_only_the_most_recently_run_kernels() {
    let kernels: serde_json::Map<String, serde_json::Value> = (0..MAX_KERNELS + 88)
        .map(|i| {
            // Out of age order, so that the cut is by age, not by position.
            let age = (i * 7919) % (MAX_KERNELS + 88);
            let k = serde_json::json!({"models": {}, "split": {}, "runs": 1, "last_run_ms": age});
            (format!("k{age}"), k)
        })
        .collect();
    let text = serde_json::json!({
        "version": PROFILE_VERSION,
        "fingerprint": fp(),
        "kernels": kernels,
    })
    .to_string();
    let f: ProfileFile = serde_json::from_str(&text).unwrap();
    assert_eq!(f.kernels.len(), MAX_KERNELS);
    let oldest_kept = f.kernels.values().map(|k| k.last_run_ms).min();
    assert_eq!(oldest_kept, Some(88), "the 88 least recently run went");
}

/// A profile linked into place (kept on a shared volume) stays a link: a
/// save replaces the file it points to (before, the rename replaced the
/// link with a regular file, silently).
#[test]
fn a_symlinked_profile_is_saved_through_its_link() {
    let dir = tempdir("link");
    let shared = tempdir("link-target");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&shared).unwrap();
    let mut first = ProfileStore::open(&shared, fp());
    run_of(&mut first, "k", 0.01);
    first.save().unwrap();
    let target = first.path().unwrap().to_path_buf();
    let link = dir.join(target.file_name().unwrap());
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let mut s = ProfileStore::open(&dir, fp());
    assert_eq!(s.file().kernels["k"].runs, 1, "read through the link");
    run_of(&mut s, "k", 0.01);
    s.save().unwrap();
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_symlink(), "the link is kept");
    let behind = ProfileStore::open(&shared, fp());
    assert_eq!(behind.file().kernels["k"].runs, 2, "the target is saved");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&shared);
}

/// A profile folder that is a regular file leaves the store in memory:
/// nothing to save, no error at each save.
#[test]
fn a_profile_folder_that_is_a_file_keeps_the_store_in_memory() {
    let dir = tempdir("file-folder");
    std::fs::write(&dir, b"not a folder").unwrap();
    let problem = super::super::disk::folder_problem(&dir.join("sub"));
    assert!(problem.is_some_and(|p| p.contains("is a file, not a folder")));
    let mut s = ProfileStore::open(&dir, fp());
    assert!(s.path().is_none());
    run_of(&mut s, "k", 0.01);
    s.save().unwrap();
    let _ = std::fs::remove_file(&dir);
}
