//! What the CLI tests share.

/// `coexec args…` with a profile folder of this call's own (no state shared
/// between tests or left from an earlier run; removed after) and none of
/// the environment that would change its defaults: (exit code, stdout,
/// stderr). `tag` names the folder.
pub fn coexec(tag: &str, args: &[&str]) -> (i32, String, String) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let profiles = std::env::temp_dir().join(format!("{tag}-{}-{n}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_coexec"))
        .args(args)
        .env("COEXEC_PROFILE_DIR", &profiles)
        .env("COEXEC_INDEX_DIR", profiles.join("corpus-index"))
        .env_remove("COEXEC_DEVICES")
        .env_remove("COEXEC_POLICY")
        .env_remove("RUST_LOG")
        .output()
        .expect("run coexec");
    let _ = std::fs::remove_dir_all(&profiles);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
