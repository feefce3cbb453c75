//! No hidden global effects: `Runtime::builder()` reads no environment
//! variable; `Builder::from_env()` reads coexec's, and later calls override
//! them. One test in its own binary: it sets the process's environment.

use std::ffi::OsStr;

use coexec::{ActorError, Builder, Error, Runtime};

/// Sets an environment variable while this binary runs one thread.
fn set_env(key: &str, value: impl AsRef<OsStr>) {
    // SAFETY: this binary holds one test, and every call comes before its
    // first runtime starts a thread: nothing reads the environment at the
    // same time.
    unsafe { std::env::set_var(key, value) };
}

#[test]
fn only_from_env_reads_the_environment() {
    let dir = std::env::temp_dir().join(format!("coexec-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A bad spec in the environment is an error of from_env, not of build.
    set_env("COEXEC_DEVICES", "cpu:0");
    assert!(matches!(
        Builder::from_env(),
        Err(Error::Actor(ActorError::DeviceSpec { .. }))
    ));
    set_env("COEXEC_DEVICES", "cpu:1,sim:1@2");
    set_env("COEXEC_POLICY", "no-such-policy");
    set_env("COEXEC_PROFILE_DIR", dir.as_os_str());

    // The plain builder sees none of it.
    let rt = Runtime::builder()
        .devices("cpu:1")
        .expect("spec")
        .build()
        .expect("builds whatever COEXEC_POLICY says");
    assert_eq!(rt.classes().len(), 1);
    assert!(
        rt.profile_path().is_none_or(|p| !p.starts_with(&dir)),
        "{:?}",
        rt.profile_path()
    );
    rt.shutdown_now();

    // from_env reads all three.
    let r = Builder::from_env().expect("COEXEC_DEVICES parses").build();
    assert!(
        matches!(r, Err(Error::Actor(ActorError::UnknownPolicy(ref p))) if p == "no-such-policy"),
        "{r:?}"
    );
    let rt = Builder::from_env()
        .expect("COEXEC_DEVICES parses")
        .policy("hybrid")
        .build()
        .expect("a later call overrides the environment");
    let names: Vec<&str> = rt.classes().iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["cpu", "sim"]);
    assert!(
        rt.profile_path().is_some_and(|p| p.starts_with(&dir)),
        "{:?}",
        rt.profile_path()
    );
    rt.shutdown_now();

    let _ = std::fs::remove_dir_all(&dir);
}
