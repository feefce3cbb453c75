//! How much memory one workload buffer may take: the tightest of what the
//! machine has available, the process's address-space limit (`ulimit -v`)
//! and its cgroup's memory limit (a container's), each less what the
//! process or the cgroup already uses.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the machine's memory cannot be read, the most a workload buffer
/// may take (64 GiB): beyond it a size is a typo, not a benchmark.
pub(crate) const MAX_BYTES: u64 = 64 << 30;

/// The limit and which of the three it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    pub(crate) bytes: u64,
    pub(crate) what: &'static str,
}

/// The limit, measured once per process, when first asked.
pub(crate) fn limit() -> Limit {
    static LIMIT: OnceLock<Limit> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        tightest(
            read(Path::new("/proc/meminfo")).as_deref(),
            read(Path::new("/proc/self/limits")).as_deref(),
            read(Path::new("/proc/self/status")).as_deref(),
            read(Path::new("/proc/self/cgroup"))
                .map(|c| cgroup_headroom(&c, Path::new("/sys/fs/cgroup"), read)),
        )
    })
}

/// The tightest of the limits the files give (each `None` where unread).
fn tightest(
    meminfo: Option<&str>,
    limits: Option<&str>,
    status: Option<&str>,
    cgroup: Option<Option<u64>>,
) -> Limit {
    let candidates = [
        (
            meminfo.and_then(|m| kib_field(m, "MemAvailable:")),
            "memory available at start",
        ),
        (
            limits
                .zip(status)
                .and_then(|(l, s)| address_space_headroom(l, s)),
            "address-space limit (ulimit -v) less what the process maps",
        ),
        (cgroup.flatten(), "cgroup's memory limit less its usage"),
    ];
    candidates
        .into_iter()
        .filter_map(|(b, what)| b.map(|bytes| Limit { bytes, what }))
        .min_by_key(|l| l.bytes)
        .unwrap_or(Limit {
            bytes: MAX_BYTES,
            what: "default, memory unknown",
        })
}

/// A `Name:   123 kB` line of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let v = text.lines().find_map(|l| l.strip_prefix(name))?;
    let kib: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The soft `Max address space` of `/proc/self/limits` less the process's
/// `VmSize`; `None` when unlimited.
fn address_space_headroom(limits: &str, status: &str) -> Option<u64> {
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))?
        .split_whitespace()
        .next()?;
    let cap: u64 = soft.parse().ok()?; // "unlimited" does not parse
    Some(cap.saturating_sub(kib_field(status, "VmSize:").unwrap_or(0)))
}

/// The least headroom (limit less usage) of the process's cgroup and its
/// ancestors under `root` (`/sys/fs/cgroup`), from `/proc/self/cgroup`:
/// `memory.max` and `memory.current` under cgroup v2, `memory/…/
/// memory.limit_in_bytes` and `memory.usage_in_bytes` under v1. `None`
/// when no level sets a limit.
fn cgroup_headroom(
    cgroup: &str,
    root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let number = |p: PathBuf| read(&p).and_then(|s| s.trim().parse::<u64>().ok());
    let mut least: Option<u64> = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, max, used) = if id == "0" && controllers.is_empty() {
            (root.to_path_buf(), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // The cgroup, then each ancestor up to the root of the mount.
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            // "max" (v2's unlimited) does not parse.
            if let Some(cap) = number(dir.join(max)) {
                let headroom = cap.saturating_sub(number(dir.join(used)).unwrap_or(0));
                least = Some(least.map_or(headroom, |l| l.min(headroom)));
            }
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    least
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MEMINFO: &str = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
    const UNLIMITED: &str = "Max cpu time              unlimited            unlimited            seconds\n\
        Max address space         unlimited            unlimited            bytes\n";
    const AS_6G: &str =
        "Max address space         6144000000           unlimited            bytes\n";
    const STATUS: &str = "Name:\tcoexec\nVmPeak:\t  200000 kB\nVmSize:\t  100000 kB\n";

    fn files(f: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> + use<> {
        let m: HashMap<PathBuf, String> = f
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect();
        move |p: &Path| m.get(p).cloned()
    }

    #[test]
    fn the_tightest_limit_wins_and_is_named() {
        let l = tightest(Some(MEMINFO), Some(UNLIMITED), Some(STATUS), Some(None));
        assert_eq!(l.bytes, 20_000_000 * 1024);
        assert_eq!(l.what, "memory available at start");
        let l = tightest(Some(MEMINFO), Some(AS_6G), Some(STATUS), Some(None));
        assert_eq!(l.bytes, 6_144_000_000 - 100_000 * 1024);
        assert!(l.what.contains("ulimit -v"), "{}", l.what);
        let l = tightest(
            Some(MEMINFO),
            Some(AS_6G),
            Some(STATUS),
            Some(Some(1 << 30)),
        );
        assert_eq!(l.bytes, 1 << 30);
        assert!(l.what.contains("cgroup"), "{}", l.what);
        assert_eq!(tightest(None, None, None, None).bytes, MAX_BYTES);
    }

    #[test]
    fn cgroup_v2_limits_are_read_up_the_tree() {
        let root = Path::new("/sys/fs/cgroup");
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "max\n"),
            ("/sys/fs/cgroup/kubepods/memory.max", "4294967296\n"),
            ("/sys/fs/cgroup/kubepods/memory.current", "1073741824\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "max\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.current", "1000\n"),
        ]);
        assert_eq!(
            cgroup_headroom("0::/kubepods/pod1\n", root, &read),
            Some(3 << 30)
        );
        // A container's namespace: its own cgroup is the root.
        let read = files(&[
            ("/sys/fs/cgroup/memory.max", "2147483648\n"),
            ("/sys/fs/cgroup/memory.current", "147483648\n"),
        ]);
        assert_eq!(cgroup_headroom("0::/\n", root, &read), Some(2_000_000_000));
        assert_eq!(cgroup_headroom("0::/\n", root, files(&[])), None);
    }

    #[test]
    fn cgroup_v1_limits_are_read_from_the_memory_controller() {
        let root = Path::new("/sys/fs/cgroup");
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
                "1000000\n",
            ),
            (
                "/sys/fs/cgroup/memory/job/memory.usage_in_bytes",
                "400000\n",
            ),
        ]);
        let cgroup = "9:name=systemd:/\n4:memory:/job\n3:cpuset:/\n";
        assert_eq!(cgroup_headroom(cgroup, root, &read), Some(600_000));
    }
}
