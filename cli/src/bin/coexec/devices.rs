//! `coexec devices`: the device classes and GPUs found, and why this
//! process sees the CPUs and GPUs it does:
//! the affinity mask and the cgroup's CPU quota (what Slurm's
//! `--cpus-per-task` and a Kubernetes CPU limit set), and
//! `CUDA_VISIBLE_DEVICES` (what Slurm's `--gres=gpu` and the NVIDIA device
//! plugin set; the CUDA driver itself hides the GPUs it leaves out, MIG
//! instances and UUIDs included). Read from Linux's `/proc` and `/sys`;
//! elsewhere each is "unknown".

use std::path::Path;

use crate::Failure;

/// What fences this process's devices.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Fence {
    /// CPUs online on the machine.
    online: Option<usize>,
    /// CPUs the affinity mask allows, as the kernel lists them (`0-3,8`).
    allowed: Option<String>,
    /// Their count.
    allowed_count: Option<usize>,
    /// The cgroup's CPU quota in CPUs (`None`: no quota, or unknown).
    quota_cpus: Option<f64>,
    /// `CUDA_VISIBLE_DEVICES` as set (`None`: unset, every GPU).
    cuda_visible_devices: Option<String>,
}

/// How many CPUs a kernel CPU list (`0-3,8,10-11`) names.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// A cgroup v2 `cpu.max` (`"200000 100000"`, `"max 100000"`) as CPUs.
fn quota_v2(cpu_max: &str) -> Option<f64> {
    let mut it = cpu_max.split_whitespace();
    let quota = it.next()?.parse::<f64>().ok()?;
    let period = it
        .next()
        .map_or(Some(100_000.0), |p| p.parse::<f64>().ok())?;
    (period > 0.0).then(|| quota / period)
}

/// The quota of this process's cgroup, v2 or v1 (`cpu.cfs_quota_us`).
fn quota() -> Option<f64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            let file = Path::new("/sys/fs/cgroup").join(path).join("cpu.max");
            if let Some(q) = std::fs::read_to_string(file)
                .ok()
                .and_then(|s| quota_v2(&s))
            {
                return Some(q);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            let dir = Path::new("/sys/fs/cgroup/cpu").join(path);
            let read = |f: &str| -> Option<f64> {
                std::fs::read_to_string(dir.join(f))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            if let (Some(q), Some(p)) = (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us"))
                && q > 0.0
                && p > 0.0
            {
                return Some(q / p);
            }
        }
    }
    None
}

impl Fence {
    pub(crate) fn read() -> Self {
        let allowed = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| l.trim().to_string())
            });
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| count_cpu_list(&s));
        Self {
            online,
            allowed_count: allowed.as_deref().and_then(count_cpu_list),
            allowed,
            quota_cpus: quota(),
            cuda_visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        }
    }

    /// Two lines: what limits the CPUs, and the GPUs.
    pub(crate) fn lines(&self, cores: usize) -> [String; 2] {
        let unknown = || "unknown".to_string();
        let mask = match (&self.allowed, self.allowed_count) {
            (Some(list), Some(n)) => format!("affinity allows {n} ({list})"),
            _ => "affinity unknown".into(),
        };
        let quota = self.quota_cpus.map_or("no cgroup CPU quota".into(), |q| {
            format!("cgroup quota {q:.2} CPUs")
        });
        let cpu = format!(
            "cpu: {cores} usable of {} online: {mask}; {quota}",
            self.online.map_or_else(unknown, |n| n.to_string())
        );
        let gpu = match &self.cuda_visible_devices {
            None => "gpu: CUDA_VISIBLE_DEVICES unset: every GPU the driver shows".into(),
            Some(v) if v.trim().is_empty() => "gpu: CUDA_VISIBLE_DEVICES is empty: no GPU".into(),
            Some(v) => {
                format!("gpu: CUDA_VISIBLE_DEVICES={v}: these, numbered from 0 in this order")
            }
        };
        [cpu, gpu]
    }
}

/// Prints the classes, the GPUs and the fence (or all of it as JSON).
pub(crate) fn devices(json: bool) -> Result<(), Failure> {
    let (classes, gpus) =
        coexec::machine::default_classes().map_err(|e| Failure::Run(e.to_string()))?;
    let why_no_gpu = coexec::machine::gpus().err().map(|e| e.to_string());
    let fence = Fence::read();
    if json {
        let v = serde_json::json!({ "classes": classes, "gpus": gpus, "no_gpu_reason": why_no_gpu, "fence": fence });
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    for c in &classes {
        outln!("{:<8} {:>3} workers  {}", c.name, c.workers, c.model);
    }
    for g in &gpus {
        outln!(
            "cuda:{}   {}  {:.1} GiB  {} SMs  compute {}.{}",
            g.id,
            g.name,
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.sm_count,
            g.compute_capability.0,
            g.compute_capability.1
        );
    }
    if let Some(why) = why_no_gpu {
        outln!("no CUDA device ({why})");
    }
    for line in fence.lines(coexec::machine::cores()) {
        outln!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list(""), Some(0));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("a"), None);
    }

    #[test]
    fn a_cgroup_v2_quota_is_read_in_cpus() {
        assert_eq!(quota_v2("200000 100000\n"), Some(2.0));
        assert_eq!(quota_v2("50000 100000"), Some(0.5));
        assert_eq!(quota_v2("max 100000"), None);
    }

    #[test]
    fn the_lines_say_what_fences_the_devices() {
        let f = Fence {
            online: Some(16),
            allowed: Some("0-3".into()),
            allowed_count: Some(4),
            quota_cpus: None,
            cuda_visible_devices: Some("GPU-8c3e,MIG-2f1a".into()),
        };
        let [cpu, gpu] = f.lines(4);
        assert_eq!(
            cpu,
            "cpu: 4 usable of 16 online: affinity allows 4 (0-3); no cgroup CPU quota"
        );
        assert_eq!(
            gpu,
            "gpu: CUDA_VISIBLE_DEVICES=GPU-8c3e,MIG-2f1a: these, numbered from 0 in this order"
        );
    }
}
