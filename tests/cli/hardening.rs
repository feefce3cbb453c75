//! Hostile input, faults and concurrency: nothing a user, a kernel or a
//! device does hangs or aborts the runtime, and the command line says what
//! it refused in one line.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coexec::kernels::{Chunk, Kernel, KernelError, Synthetic};

/// Runs `fut` on a fresh runtime on its own thread; a hang fails the test
/// after `limit` instead of never ending.
fn within<T: Send + 'static>(
    limit: Duration,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio");
        let _ = tx.send(rt.block_on(fut));
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}"))
}

/// A kernel whose `items()` panics after `calm` calls, or changes after
/// `calm` calls when `grow` is set.
#[derive(Debug)]
struct Moody {
    calls: AtomicUsize,
    calm: usize,
    grow: bool,
}

impl Kernel for Moody {
    fn name(&self) -> &str {
        "moody"
    }
    fn items(&self) -> usize {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n >= self.calm {
            assert!(self.grow, "items() gave up");
            return 2000;
        }
        1000
    }
    fn run_cpu(&self, _chunk: &Chunk) -> Result<(), KernelError> {
        Ok(())
    }
}

/// A kernel whose every chunk panics.
#[derive(Debug)]
struct Panics;

impl Kernel for Panics {
    fn name(&self) -> &str {
        "panics"
    }
    fn items(&self) -> usize {
        1000
    }
    fn run_cpu(&self, _chunk: &Chunk) -> Result<(), KernelError> {
        panic!("a bug in the kernel")
    }
}

/// A panic is the kernel's fault, not the device's: it fails its job and
/// is no strike against the worker, so five panicking jobs on a machine of
/// one worker (three device errors in a row take a worker out of service)
/// leave it serving the next job. The same rule holds for a GPU stream,
/// whose twin's panics `StreamWorker::run` turns into the same error.
#[test]
fn panics_fail_their_jobs_and_take_no_worker_out_of_service() {
    within(Duration::from_secs(60), async {
        let rt = coexec::Runtime::builder()
            .devices("sim:1@1")?
            .in_memory_profiles()
            .build()?;
        for _ in 0..5 {
            let e = rt.run(Panics).await.expect_err("a panicking job fails");
            assert!(e.to_string().contains("a bug in the kernel"), "{e}");
        }
        let mut done = rt.run(Synthetic::new(5_000, 10)).await?;
        done.kernel.verify()?;
        rt.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .unwrap();
}

#[test]
fn a_kernel_whose_items_panics_fails_its_job_and_nothing_else() {
    within(Duration::from_secs(30), async {
        let rt = coexec::Runtime::builder()
            .devices("cpu:2")?
            .in_memory_profiles()
            .build()?;
        // At submission (0) and in the check after the run (1).
        for calm in [0, 1] {
            let bad = Moody {
                calls: AtomicUsize::new(0),
                calm,
                grow: false,
            };
            let e = rt
                .run(bad)
                .await
                .expect_err("a panicking items() is an error");
            assert!(e.to_string().contains("moody"), "{e}");
        }
        // The runtime is still there for the next job, and shuts down.
        let mut done = rt.run(Synthetic::new(5_000, 10)).await?;
        done.kernel.verify()?;
        rt.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .expect("runtime survives");
}

#[test]
fn items_changing_during_the_run_is_an_error_not_a_silent_ok() {
    within(Duration::from_secs(30), async {
        let rt = coexec::Runtime::builder()
            .devices("cpu:2")?
            .in_memory_profiles()
            .build()?;
        let grows = Moody {
            calls: AtomicUsize::new(0),
            calm: 1,
            grow: true,
        };
        let e = rt.run(grows).await.expect_err("items() changed");
        assert!(e.to_string().contains("items()"), "{e}");
        rt.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .expect("no hang");
}

#[test]
fn extreme_sim_speeds_are_refused_not_a_hang() {
    for spec in ["sim:1@1e-300", "sim:1@1e-6", "sim:1@1e300"] {
        let e = coexec::Runtime::builder().devices(spec).map(|b| b.build());
        assert!(matches!(e, Err(_) | Ok(Err(_))), "{spec} accepted");
    }
    // Through the library, past the parser: refused at start.
    let list = coexec::DeviceList::new(vec![
        coexec::DeviceSpec::cpu(1),
        coexec::DeviceSpec::sim(1, 1e-300, Duration::ZERO),
    ]);
    let r = coexec::Runtime::builder()
        .device_list(list)
        .in_memory_profiles()
        .build();
    assert!(r.is_err(), "sim speed 1e-300 accepted by the builder");
}

#[test]
fn thousands_of_cpu_workers_are_capped_and_finish_quickly() {
    within(Duration::from_secs(60), async {
        let rt = coexec::Runtime::builder()
            .devices("cpu:4096")?
            .in_memory_profiles()
            .build()?;
        let cap = coexec::machine::worker_cap();
        assert_eq!(rt.classes()[0].workers, cap.min(4096));
        let t = std::time::Instant::now();
        let mut done = rt.run(Synthetic::new(200_000, 10)).await?;
        done.kernel.verify()?;
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        rt.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .expect("capped");
}

#[test]
fn a_class_condemned_by_its_stored_model_is_measured_again() {
    within(Duration::from_secs(60), async {
        let dir = std::env::temp_dir().join(format!("coexec-condemned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let build = || {
            coexec::Runtime::builder()
                .devices("cpu:1,sim:1@2")
                .map(|b| b.profile_dir(&dir).build())
        };
        // Learn, then condemn the sim: a plausible but dreadful speed.
        let rt = build()??;
        rt.run(Synthetic::new(20_000, 50)).await?;
        let path = rt.profile_path().ok_or("no profile path")?.to_path_buf();
        rt.shutdown().await;
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let models = v["kernels"]["synthetic/w50"]["models"]
            .as_object_mut()
            .ok_or("no models")?;
        // A cold run this short may finish on the CPU before the sim's first
        // chunk, leaving no sim model to condemn: then write one under the
        // class's key.
        let key = models
            .keys()
            .find(|k| k.starts_with("sim"))
            .cloned()
            .unwrap_or_else(|| "sim@2+0us".to_string());
        models.insert(
            key,
            serde_json::json!({ "a": 0.0, "b": 0.01, "samples": [], "observed": 10 }),
        );
        std::fs::write(&path, v.to_string())?;

        let rt = build()??;
        let mut sim_items = Vec::new();
        // The class is measured again every 8th job. Its region may be
        // eaten by the CPU before the sim's thread wakes on a busy machine
        // (a job of 20 000 items lasts ~2 ms here; CI lost both chances of
        // 16 such jobs once, and all four of 32 jobs of 200 000 items with
        // the CLI's other tests running beside it): jobs of 10^6 items,
        // four chances.
        for _ in 0..32 {
            let mut done = rt.run(Synthetic::new(1_000_000, 50)).await?;
            done.kernel.verify()?;
            sim_items.push(done.report.classes[1].items);
        }
        rt.shutdown().await;
        eprintln!("sim items per run: {sim_items:?}");
        assert!(
            sim_items.iter().any(|&n| n > 0),
            "the sim never ran again: {sim_items:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .expect("re-measured");
}

#[test]
fn a_chunk_far_past_its_prediction_is_taken_back() {
    // The sim is 100x slower than one core, but its stored model says 10x
    // faster: the plan hands it most of the job. Its first chunk alone would
    // take ~7 s here; taken back once far past its prediction, the job ends
    // on the CPU in well under a second (bound: 5 s).
    let dir = std::env::temp_dir().join(format!("coexec-overdue-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let build = |dir: std::path::PathBuf| {
        coexec::Runtime::builder()
            .devices("cpu:1,sim:1@0.01")
            .map(|b| b.profile_dir(dir).build())
    };
    let d = dir.clone();
    let path = within(Duration::from_secs(60), async move {
        let rt = build(d)??;
        rt.run(Synthetic::new(20_000, 1000)).await?;
        let path = rt.profile_path().ok_or("no profile path")?.to_path_buf();
        rt.shutdown().await;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(path)
    })
    .expect("learning run");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let models = v["kernels"]["synthetic/w1000"]["models"]
        .as_object_mut()
        .expect("models");
    let cpu_b = models["cpu"]["b"].as_f64().expect("a cpu model");
    let key = models
        .keys()
        .find(|k| k.starts_with("sim"))
        .cloned()
        .unwrap_or_else(|| "sim@0.01+0us".to_string());
    models.insert(
        key,
        serde_json::json!({ "a": 0.0, "b": cpu_b * 10.0, "samples": [], "observed": 10 }),
    );
    std::fs::write(&path, v.to_string()).unwrap();

    let d = dir.clone();
    within(Duration::from_secs(5), async move {
        let rt = build(d)??;
        let mut done = rt.run(Synthetic::new(200_000, 1000)).await?;
        done.kernel.verify()?;
        rt.shutdown().await;
        eprintln!(
            "retries {}, sim items {}, makespan {:.3} s",
            done.report.retries, done.report.classes[1].items, done.report.makespan_s
        );
        assert!(done.report.retries >= 1, "nothing was taken back");
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .expect("taken back");
    let _ = std::fs::remove_dir_all(&dir);
}

use crate::common;

/// `coexec args…`: see `common::coexec`.
fn coexec(args: &[&str]) -> (i32, String, String) {
    common::coexec("coexec-hardening-test", args)
}

fn refused_in_one_line(args: &[&str], says: &str) {
    let (code, _, err) = coexec(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
}

#[test]
fn sizes_past_this_machines_memory_exit_2_naming_the_limit() {
    refused_in_one_line(
        &[
            "run",
            "synthetic",
            "--size",
            "4294967296",
            "--devices",
            "cpu:1",
        ],
        "memory limit",
    );
    refused_in_one_line(
        &["run", "pathfinder", "--cols", "4294967296", "--rows", "100"],
        "memory limit",
    );
}

/// A size within the machine's memory but past the process's address-space
/// limit exits 2 naming that limit (it aborted with rc 134: the check read
/// only the memory available).
#[cfg(target_os = "linux")]
#[test]
fn sizes_past_the_address_space_limit_exit_2_naming_it() {
    let out = std::process::Command::new("sh")
        .args(["-c", "ulimit -v 3000000 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_coexec"))
        .args(["run", "synthetic", "--size", "2000000000", "--work", "0"])
        .args(["--devices", "cpu:1"])
        .env(
            "COEXEC_PROFILE_DIR",
            std::env::temp_dir().join("coexec-hardening-as"),
        )
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("ulimit -v"), "{err}");
}

#[test]
fn kmeans_input_with_nan_or_inf_and_negative_thresholds_are_refused() {
    let dir = std::env::temp_dir().join(format!("coexec-hardening-km-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in [
        ("nan.txt", "1 0.5 1\n2 nan 2\n3 1 1\n"),
        ("inf.txt", "1 0.5 1\n2 1 -inf\n3 1 1\n"),
        ("big.txt", "1 0.5 1\n2 1 1e39\n3 1 1\n"),
    ] {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        let f = f.to_str().unwrap();
        refused_in_one_line(&["run", "kmeans", "--file", f, "--clusters", "2"], ":2:");
        refused_in_one_line(&["run", "kmeans", "--file", f, "--clusters", "2"], f);
    }
    let good = dir.join("good.txt");
    std::fs::write(&good, "1 0.5 1\n2 1 2\n3 1 1\n").unwrap();
    refused_in_one_line(
        &[
            "run",
            "kmeans",
            "--file",
            good.to_str().unwrap(),
            "--clusters",
            "2",
            "--threshold=-0.5",
        ],
        "threshold",
    );
}

#[test]
fn output_paths_are_checked_before_the_bench_runs() {
    let t = std::time::Instant::now();
    for flag in ["--json", "--plot"] {
        refused_in_one_line(
            &[
                "bench",
                "synthetic",
                "--devices",
                "cpu:1",
                flag,
                "/nonexistent-coexec-dir/out",
            ],
            "/nonexistent-coexec-dir/out",
        );
    }
    refused_in_one_line(
        &[
            "run",
            "synthetic",
            "--size",
            "1000",
            "--trace",
            "/nonexistent-coexec-dir/t.json",
        ],
        "--trace",
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_closed_stdout_ends_quietly() {
    // `bench … | head -1` printed "failed printing to stdout: Broken pipe"
    // and exited 101; `policies | head -1` the same before.
    let bench = [
        "bench",
        "synthetic",
        "--devices",
        "cpu:1,sim:1@2",
        "--size",
        "20000",
        "--repeat",
        "1",
        "--pairs",
        "0",
        "--budget",
        "0",
    ];
    for args in [&["policies"][..], &bench[..]].into_iter().cycle().take(6) {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coexec"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(out.status.code(), Some(0), "{err}");
    }
}

#[test]
fn metrics_flag_reports_its_port_and_a_port_in_use_exits_2() {
    let (code, _, err) = coexec(&[
        "run",
        "synthetic",
        "--size",
        "1000",
        "--devices",
        "cpu:1",
        "--metrics",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, 0, "{err}");
    let port = err
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse::<u16>().ok());
    assert!(port.is_some_and(|p| p != 0), "{err}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    refused_in_one_line(
        &[
            "run",
            "synthetic",
            "--size",
            "1000",
            "--devices",
            "cpu:1",
            "--metrics",
            &addr,
        ],
        &addr,
    );
}

#[test]
fn warnings_to_a_file_carry_no_colour_codes() {
    let (code, _, err) = coexec(&[
        "run",
        "synthetic",
        "--size",
        "1000",
        "--devices",
        "cpu:4096",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("WARN"), "a warning is expected: {err}");
    assert!(!err.contains('\u{1b}'), "ANSI codes in {err:?}");
}

/// A profile folder that is a regular file (or lies under one) is named in
/// one warning that says so, and the process learns in memory (before, each
/// save warned "File exists (os error 17)" or "Not a directory"). By hand:
/// `touch f; coexec run synthetic --profile-dir f`.
#[test]
fn a_profile_folder_that_is_a_file_is_named_once() {
    let d = scratch("folder-is-a-file");
    let blocker = d.join("blocker");
    std::fs::write(&blocker, b"a file, not a folder").unwrap();
    for dir in [blocker.clone(), blocker.join("profiles")] {
        let (code, _, err) = run_with_profiles(dir.to_str().unwrap());
        assert_eq!(code, 0, "{err}");
        let says = format!("{} is a file, not a folder", blocker.display());
        assert_eq!(err.matches(&says).count(), 1, "{err}");
        assert!(!err.contains("os error"), "{err}");
        assert!(!err.contains("could not save"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A kernel's name in a profile is text from a file: a line break in it is
/// escaped in the log, never a forged log line. By hand: add a kernel named
/// `"x\n2026-01-01T00:00:00Z  WARN forged"` with a split `{"cpu": 7}` to a
/// profile, then `coexec run synthetic`.
#[test]
fn names_read_from_a_profile_cannot_forge_log_lines() {
    let d = scratch("forged");
    let dir = d.to_str().unwrap().to_string();
    let (code, _, err) = run_with_profiles(&dir);
    assert_eq!(code, 0, "{err}");
    let profile = file_ending(&d, "json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&profile).unwrap()).unwrap();
    let kernels = json["kernels"].as_object_mut().unwrap();
    let mut forged = kernels.values().next().unwrap().clone();
    forged["split"] = serde_json::json!({ "cpu": 7.0 });
    let name = "x\n2026-01-01T00:00:00.000000Z  WARN forged\r\u{7}";
    kernels.insert(name.into(), forged);
    std::fs::write(&profile, serde_json::to_vec(&json).unwrap()).unwrap();
    let (code, _, err) = run_with_profiles(&dir);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("not believed"), "{err}");
    assert!(err.contains(r"x\n2026"), "the break is escaped: {err}");
    assert!(
        err.lines().all(|l| !l.starts_with("2026-01-01")),
        "a forged line: {err}"
    );
    assert!(!err.contains(['\r', '\u{7}']), "{err:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The process reading stderr goes away (a log shipper restarting), then a
/// warning is logged: the write's EPIPE is dropped, the run ends as it
/// would have (before, the logger panicked: exit 101). By hand: `coexec run
/// synthetic --profile-dir /etc/hostname/x 2> >(exit 0)`.
#[test]
fn a_stderr_whose_reader_is_gone_ends_nothing() {
    let blocker =
        std::env::temp_dir().join(format!("coexec-hardening-epipe-{}", std::process::id()));
    std::fs::write(&blocker, b"a file, not a folder").unwrap();
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader); // gone before the first warning
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args([
            "run",
            "synthetic",
            "--size",
            "10000",
            "--devices",
            "cpu:1",
            "--quiet",
        ])
        .arg("--profile-dir")
        .arg(blocker.join("profiles"))
        .stdout(std::process::Stdio::piped())
        .stderr(writer)
        .output()
        .expect("run coexec");
    let _ = std::fs::remove_file(&blocker);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("verified: true"), "{stdout}");
}

/// A scratch folder of this test process, emptied first.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("coexec-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mkfifo(path: &std::path::Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

/// A short run that keeps its profile in `dir`.
fn run_with_profiles(dir: &str) -> (i32, String, String) {
    coexec(&[
        "run",
        "synthetic",
        "--size",
        "20000",
        "--devices",
        "cpu:1",
        "--quiet",
        "--profile-dir",
        dir,
    ])
}

/// The file of `dir` whose name ends in `.ext`.
fn file_ending(dir: &std::path::Path, ext: &str) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == ext))
        .unwrap_or_else(|| panic!("no .{ext} file in {}", dir.display()))
}

/// Input files that are not regular files are refused at once, naming the
/// file: a FIFO (opening it blocked before listening, forever) and a link
/// to `/dev/zero` (it reports no length, so the size cap let 2 GB in). By
/// hand: `mkfifo f; coexec serve --model f`, `ln -s /dev/zero z; coexec run
/// kmeans --file z`.
#[test]
fn a_fifo_or_a_device_as_input_is_refused_at_once() {
    let d = scratch("special");
    let fifo = d.join("model.safetensors");
    mkfifo(&fifo);
    let zero = d.join("points.txt");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let (fifo_s, zero_s) = (fifo.to_str().unwrap(), zero.to_str().unwrap());
    let (f, z) = (fifo_s.to_string(), zero_s.to_string());
    let ((code, _, err), (kcode, _, kerr)) = within(Duration::from_secs(20), async move {
        let serve = coexec(&["serve", "--model", &f, "--addr", "127.0.0.1:0"]);
        let kmeans = coexec(&["run", "kmeans", "--file", &z, "--devices", "cpu:1"]);
        (serve, kmeans)
    });
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(fifo_s) && err.contains("a FIFO"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(kcode, 2, "{kerr}");
    assert!(kerr.contains(zero_s) && kerr.contains("a device"), "{kerr}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A profile that is a FIFO (another program's, or a prank) does not block
/// the start: it is unreadable, the run learns in memory and ends.
#[test]
fn a_fifo_as_the_profile_does_not_block_the_start() {
    let d = scratch("fifo-profile");
    let dir = d.to_str().unwrap().to_string();
    let (code, _, err) = run_with_profiles(&dir);
    assert_eq!(code, 0, "{err}");
    let profile = file_ending(&d, "json");
    std::fs::remove_file(&profile).unwrap();
    mkfifo(&profile);
    let (code, out, err) = within(
        Duration::from_secs(30),
        async move { run_with_profiles(&dir) },
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("verified: true"), "{out}");
    assert!(err.contains("a FIFO"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Another process holds the profile's lock (a coexec stopped mid-save):
/// the start waits a moment and reads the profile without it, the save
/// gives up after its bound with a warning, and the shutdown waits out that
/// bound once, not again for a final save; the run ends (before, both
/// blocked forever, silently). By hand: `flock PROFILE.lock sleep 600 &`,
/// then `coexec run synthetic`.
#[test]
fn a_held_profile_lock_delays_but_never_blocks() {
    let d = scratch("held-lock");
    let dir = d.to_str().unwrap().to_string();
    let (code, _, err) = run_with_profiles(&dir);
    assert_eq!(code, 0, "{err}");
    let lock = file_ending(&d, "lock");
    let held = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
    held.lock().unwrap();
    let (code, out, err) = within(
        Duration::from_secs(60),
        async move { run_with_profiles(&dir) },
    );
    drop(held);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("verified: true"), "{out}");
    assert!(err.contains("held by another process for 1s"), "{err}");
    let saves = err.matches("could not save the profile").count();
    assert_eq!(saves, 1, "the lock waited for once at shutdown: {err}");
    assert!(err.contains("the final save is skipped"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Under `ulimit -n 200` with the default 4096 connections, 260 idle
/// keep-alive clients: the cap is clamped to what the descriptors leave (with a
/// warning), so the idle ones are evicted for new clients and `/healthz`
/// answers (before, `accept` failed with EMFILE, the slots never filled,
/// nothing was evicted and every new client waited up to 120 s). By hand:
/// `sh -c 'ulimit -n 200; exec coexec serve'` and 260 idle connections.
#[test]
fn a_low_descriptor_limit_leaves_health_checks_answered() {
    use std::io::{BufRead, Read, Write};
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -n 200 && exec \"$0\" serve --devices cpu:1 --addr 127.0.0.1:0",
        ])
        .arg(env!("CARGO_BIN_EXE_coexec"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{line}"))
        .parse()
        .unwrap();
    // Keep-alive clients: one request each, answered, then idle.
    let idle: Vec<std::net::TcpStream> = (0..260)
        .map(|i| {
            let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
                .unwrap();
            let mut head = [0u8; 12];
            c.read_exact(&mut head)
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            assert_eq!(&head, b"HTTP/1.1 200", "client {i}");
            c
        })
        .collect();
    let t = std::time::Instant::now();
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    let took = t.elapsed();
    drop(idle);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{answer:?} after {took:?}; {err}"
    );
    assert!(err.contains("ulimit -n"), "a warning at start: {err}");
}

/// `bench --policies ""` (or only commas) names no policy: refused in one
/// line, exit 2, instead of an empty table.
#[test]
fn bench_with_no_policy_is_refused() {
    for p in ["", " , "] {
        refused_in_one_line(
            &["bench", "synthetic", "--devices", "cpu:1", "--policies", p],
            "names no policy",
        );
    }
}
