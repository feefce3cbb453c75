//! Binding threads to cores, as StarPU binds its workers: each CPU worker on
//! a core of its own, and everything else (accelerator and `sim` workers,
//! the actor system, a service's handlers) on the cores left over, so that
//! no other thread of the process preempts a CPU worker mid-chunk.
//!
//! Linux only (`sched_setaffinity`); elsewhere binding is refused with
//! [`std::io::ErrorKind::Unsupported`].

use std::io;

/// Which cores each thread gets: `workers[w]` for CPU worker `w` (in worker
/// order), `host` for every other thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The core of each CPU worker.
    pub workers: Vec<usize>,
    /// The cores for every other thread (all of `allowed` when the CPU
    /// workers take every core).
    pub host: Vec<usize>,
}

impl Binding {
    /// `cpu_workers` CPU workers over the cores in `allowed`: one core each
    /// (in order, wrapping when there are more workers than cores), and the
    /// cores no worker got for the rest.
    ///
    /// ```
    /// use coexec_actors::bind::Binding;
    /// let b = Binding::plan(1, &[0, 1]);
    /// assert_eq!((b.workers, b.host), (vec![0], vec![1]));
    /// let b = Binding::plan(2, &[0, 1]);
    /// assert_eq!((b.workers, b.host), (vec![0, 1], vec![0, 1]));
    /// ```
    pub fn plan(cpu_workers: usize, allowed: &[usize]) -> Self {
        if allowed.is_empty() {
            return Self {
                workers: Vec::new(),
                host: Vec::new(),
            };
        }
        let workers: Vec<usize> = (0..cpu_workers)
            .map(|w| allowed[w % allowed.len()])
            .collect();
        let left: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|c| !workers.contains(c))
            .collect();
        Self {
            workers,
            host: if left.is_empty() {
                allowed.to_vec()
            } else {
                left
            },
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "binding threads to cores is supported on Linux only",
    )
}

/// The cores this thread may run on now.
pub fn allowed() -> io::Result<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{CpuSet, sched_getaffinity};
        let set = sched_getaffinity(None)?;
        Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(unsupported())
    }
}

/// Binds thread `tid` (`None`: the calling thread) to `cores`.
pub fn bind(tid: Option<i32>, cores: &[usize]) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use rustix::thread::{CpuSet, sched_setaffinity};
        let mut set = CpuSet::new();
        for &c in cores.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
            set.set(c);
        }
        let pid = match tid {
            None => None,
            Some(t) => Some(rustix::thread::Pid::from_raw(t).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("thread id {t}"))
            })?),
        };
        Ok(sched_setaffinity(pid, &set)?)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (tid, cores);
        Err(unsupported())
    }
}

/// Binds every thread of this process to `host`, except those whose name
/// starts with `keep` (the CPU workers: `coexec-cpu-`). For a program that
/// owns its process, as `coexec serve` does: threads started later inherit
/// the binding of the thread that starts them. Returns how many threads it
/// bound.
pub fn bind_process_threads(host: &[usize], keep: &str) -> io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let path = entry?.path();
        let Some(tid) = path
            .file_name()
            .and_then(|t| t.to_str())
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if name.trim_end().starts_with(keep) {
            continue;
        }
        match bind(Some(tid), host) {
            Ok(()) => n += 1,
            // The thread ended since the listing.
            Err(e) if e.raw_os_error() == Some(3) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_get_a_core_each_and_the_host_what_is_left() {
        let b = Binding::plan(2, &[2, 3, 5]);
        assert_eq!(b.workers, [2, 3]);
        assert_eq!(b.host, [5]);
        let b = Binding::plan(0, &[0, 1]);
        assert_eq!((b.workers.len(), b.host), (0, vec![0, 1]));
        let b = Binding::plan(3, &[0, 1]);
        assert_eq!(b.workers, [0, 1, 0]);
        assert_eq!(b.host, [0, 1]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_bound_to_one_core_runs_there() {
        let all = allowed().unwrap();
        let last = *all.last().unwrap();
        std::thread::spawn(move || {
            bind(None, &[last]).unwrap();
            assert_eq!(allowed().unwrap(), [last]);
        })
        .join()
        .unwrap();
        // The test's own thread is untouched.
        assert_eq!(allowed().unwrap(), all);
    }
}
