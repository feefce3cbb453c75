//! `--server NAME=COMMAND`: a server the generator starts itself, one fresh
//! process per measured run, so that configurations or builds can be
//! compared side by side on one machine.
//!
//! The command runs under `sh -c 'exec COMMAND'` (so the signal reaches the
//! server itself, not a shell), with `{profile_dir}` replaced by a folder
//! of its own, made before and removed after the run: runs never share
//! what a server learned. The server must print `listening on
//! http://ADDR` on its standard output (`coexec serve --addr 127.0.0.1:0`
//! does); its standard error, and the rest of its standard output, go to a
//! log file per run. It is stopped with SIGTERM and must exit 0 within
//! [`STOP_LIMIT`], else it is killed and the run counts as broken.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a server may take to exit after SIGTERM (its drain included).
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(30);

/// The placeholder a command must hold.
const PROFILE_DIR: &str = "{profile_dir}";

/// A named server command, as given.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ServerSpec {
    pub(crate) name: String,
    pub(crate) command: String,
}

impl ServerSpec {
    /// Parses `NAME=COMMAND`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let Some((name, command)) = text.split_once('=') else {
            return Err(format!("--server wants NAME=COMMAND, got `{text}`"));
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(format!(
                "--server name `{name}`: letters, digits, '_', '.' and '-' only"
            ));
        }
        if command.trim().is_empty() {
            return Err(format!("--server {name}: the command is empty"));
        }
        if !command.contains(PROFILE_DIR) {
            return Err(format!(
                "--server {name}: the command has no {PROFILE_DIR}, so its runs would share what they learn"
            ));
        }
        Ok(Self {
            name: name.into(),
            command: command.into(),
        })
    }
}

/// A running server.
pub(crate) struct Running {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// The command as run (placeholder filled in).
    pub(crate) command: String,
    pub(crate) log: PathBuf,
    profile_dir: PathBuf,
    stopped: bool,
}

impl Running {
    /// Starts `spec`, its log in `log_dir` under `tag`, and waits up to
    /// `ready` for its `listening on` line.
    pub(crate) fn start(
        spec: &ServerSpec,
        log_dir: &Path,
        tag: &str,
        ready: Duration,
    ) -> Result<Self, String> {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let profile_dir = std::env::temp_dir().join(format!(
            "coexec-load-profile-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&profile_dir)
            .map_err(|e| format!("cannot make {}: {e}", profile_dir.display()))?;
        let command = spec
            .command
            .replace(PROFILE_DIR, &profile_dir.to_string_lossy());
        let log = log_dir.join(format!("server-{tag}.log"));
        let started = File::create(&log)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| format!("cannot write {}: {e}", log.display()))
            .and_then(|(err, mut out)| {
                let _ = writeln!(out, "$ {command}");
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("exec {command}"))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(err)
                    .spawn()
                    .map(|child| (child, out))
                    .map_err(|e| format!("--server {}: cannot run sh: {e}", spec.name))
            });
        let (mut child, out) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&profile_dir);
                return Err(e);
            }
        };
        let stdout = child.stdout.take();
        // From here on, dropping `running` kills the server and removes
        // its folder.
        let mut running = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            command,
            log,
            profile_dir,
            stopped: false,
        };
        let addr = stdout
            .ok_or_else(|| "no standard output".to_string())
            .and_then(|s| wait_for_address(s, out, ready))
            .map_err(|why| {
                format!(
                    "--server {}: {why} (its log: {})",
                    spec.name,
                    running.log.display()
                )
            })?;
        running.addr = addr;
        Ok(running)
    }

    /// SIGTERM, then a bounded wait: the exit code (`None`: killed, or
    /// ended by a signal).
    pub(crate) fn stop(mut self) -> Option<i32> {
        self.stopped = true;
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + STOP_LIMIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.code(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.profile_dir);
    }
}

/// Reads the server's standard output on a thread of its own until the
/// `listening on` line; that thread then copies the rest into the log (a
/// pipe nobody reads would block the server once full).
fn wait_for_address(
    stdout: std::process::ChildStdout,
    mut log: File,
    ready: Duration,
) -> Result<SocketAddr, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut tx = Some(tx);
        while let Some(Ok(line)) = lines.next() {
            let _ = writeln!(log, "{line}");
            if let Some(addr) = line.trim().strip_prefix("listening on http://")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(addr.parse::<SocketAddr>().map_err(|e| e.to_string()));
            }
        }
    });
    match rx.recv_timeout(ready) {
        Ok(Ok(addr)) => Ok(addr),
        Ok(Err(e)) => Err(format!("its `listening on` address does not parse: {e}")),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "no `listening on http://ADDR` line within {} s",
            ready.as_secs_f64()
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err("it exited before printing `listening on http://ADDR`".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_command() {
        let s = ServerSpec::parse("old=/x/coexec serve --profile-dir {profile_dir} --a=b").unwrap();
        assert_eq!(s.name, "old");
        assert_eq!(
            s.command,
            "/x/coexec serve --profile-dir {profile_dir} --a=b"
        );
        for bad in [
            "old",
            "=cmd {profile_dir}",
            "a b=cmd {profile_dir}",
            "a= ",
            "a=cmd",
        ] {
            assert!(ServerSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
