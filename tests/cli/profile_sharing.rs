//! Processes that share a profile directory add up what they learn: a save
//! merges into what is on disk under a lock instead of overwriting it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Concurrent pairs of processes, each pair two different kernels.
const PAIRS: usize = 20;

fn spawn(dir: &Path, work: &str) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args([
            "run",
            "synthetic",
            "--size",
            "4000",
            "--work",
            work,
            "--devices",
            "cpu:1",
            "-q",
        ])
        .arg("--profile-dir")
        .arg(dir)
        .env_remove("COEXEC_DEVICES")
        .env_remove("COEXEC_POLICY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
}

#[test]
fn concurrent_processes_on_one_profile_keep_every_kernel_and_every_run()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("coexec-profile-sharing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut children = Vec::new();
    for _ in 0..PAIRS {
        children.push(spawn(&dir, "300")?);
        children.push(spawn(&dir, "500")?);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for mut c in children {
        loop {
            if let Some(status) = c.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = c.stderr.take() {
                    std::io::Read::read_to_string(&mut e, &mut err)?;
                }
                assert!(status.success(), "{status}: {err}");
                break;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return Err("a process did not finish within 120 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let files: Vec<_> = std::fs::read_dir(&dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&files[0])?)?;
    for key in ["synthetic/w300", "synthetic/w500"] {
        let k = &v["kernels"][key];
        assert_eq!(k["runs"], PAIRS as u64, "{key}: {k}");
        let cpu = &k["models"]["cpu"];
        assert!(cpu["b"].as_f64().is_some_and(|b| b > 0.0), "{key}: {k}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
