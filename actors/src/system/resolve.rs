//! What this machine has: cores, GPUs, and the device classes a spec makes of them.

use super::*;

/// Logical cores of this machine.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Most worker threads one class gets on this machine: every worker wakes to
/// look for work while jobs are live, and thousands of threads on a few
/// cores spend their time waking (cpu:4096 on two cores took a minute for a
/// job cpu:2 does in 0.3 s).
pub fn worker_cap() -> usize {
    (64 * cores()).max(256)
}

/// The GPUs CUDA can see, or why there are none.
pub fn gpus() -> Result<Vec<GpuInfo>, ActorError> {
    cuda::devices().map_err(|e| ActorError::Device {
        device: "cuda".into(),
        source: e,
    })
}

/// The device classes `devices` makes on this machine (`None`: the default:
/// every GPU with [`DEFAULT_STREAMS`] streams, and every core but one per GPU
/// for the CPU class — a GPU's host thread sleeps while its GPU works, but
/// staging copies and launches need a core's worth of time).
pub fn resolve(devices: Option<&DeviceList>) -> Result<(Vec<ClassInfo>, Vec<GpuInfo>), ActorError> {
    let found = match gpus() {
        Ok(g) => g,
        Err(e) => {
            if devices.is_none() {
                tracing::info!("no CUDA device: {e}; running on the CPUs");
            }
            Vec::new()
        }
    };
    let specs: Vec<DeviceSpec> = match devices {
        Some(d) => d.specs().to_vec(),
        None => {
            let mut v = vec![DeviceSpec::cpu(cores().saturating_sub(found.len()).max(1))];
            v.extend(found.iter().map(|g| DeviceSpec::cuda(g.id, None)));
            v
        }
    };
    let sims = specs
        .iter()
        .filter(|s| matches!(s.kind, DeviceKind::Sim { .. }))
        .count();
    let mut classes = Vec::new();
    let mut used_gpus = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        let (name, key, model, workers, end) = match &spec.kind {
            DeviceKind::Cpu => {
                let fp = Fingerprint::this_machine(vec![]);
                (
                    "cpu".to_string(),
                    "cpu".to_string(),
                    fp.cpu_model,
                    spec.workers.unwrap_or_else(cores),
                    End::Head,
                )
            }
            DeviceKind::Sim { speed, latency } => {
                let k = classes
                    .iter()
                    .filter(|c: &&ClassInfo| matches!(c.kind, DeviceKind::Sim { .. }))
                    .count();
                let name = if sims > 1 {
                    format!("sim{k}")
                } else {
                    "sim".into()
                };
                let key = format!("sim@{speed}+{}us", latency.as_micros());
                (
                    name,
                    key,
                    format!("simulated, {speed}x one CPU worker"),
                    spec.workers.unwrap_or(1),
                    End::Tail,
                )
            }
            DeviceKind::Cuda { id } => {
                let Some(g) = found.iter().find(|g| g.id == *id) else {
                    return Err(ActorError::DeviceSpec {
                        spec: format!("cuda:{id}"),
                        why: if found.is_empty() {
                            "no CUDA device on this machine".into()
                        } else {
                            format!("no such GPU; found {}", found.len())
                        },
                    });
                };
                used_gpus.push(g.clone());
                (
                    format!("cuda:{id}"),
                    format!("cuda:{id}:{}", g.name),
                    g.name.clone(),
                    spec.workers.unwrap_or(DEFAULT_STREAMS),
                    End::Tail,
                )
            }
        };
        let cap = worker_cap();
        let workers = if workers > cap {
            tracing::warn!(
                "{name}: {workers} workers on {} cores; running {cap} (more only contend for the cores)",
                cores()
            );
            cap
        } else {
            workers
        };
        if let DeviceKind::Sim { speed, .. } = spec.kind
            && !crate::device::SIM_SPEEDS.contains(&speed)
        {
            return Err(ActorError::DeviceSpec {
                spec: format!("sim@{speed}"),
                why: format!(
                    "speed {speed} outside [{}, {:e}]",
                    crate::device::SIM_SPEEDS.start(),
                    crate::device::SIM_SPEEDS.end()
                ),
            });
        }
        let fill_threads = match &spec.kind {
            DeviceKind::Cuda { id } => found
                .iter()
                .find(|g| g.id == *id)
                .map_or(0, coexec_kernels::cuda::fill_threads),
            _ => 0,
        };
        classes.push(ClassInfo {
            index,
            name,
            profile_key: key,
            kind: spec.kind.clone(),
            workers,
            end,
            model,
            fill_threads,
        });
    }
    if classes.is_empty() {
        return Err(ActorError::DeviceSpec {
            spec: String::new(),
            why: "no device".into(),
        });
    }
    Ok((classes, used_gpus))
}
