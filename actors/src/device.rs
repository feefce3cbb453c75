//! Device specs (`cpu:2,sim:1@10+50us,cuda:0x4`) and the device classes they make.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::ActorError;

/// Which end of the item space a class eats from, as in the method's deque:
/// CPUs from the head, accelerators from the tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum End {
    /// Lowest items first.
    Head,
    /// Highest items first.
    Tail,
}

/// What kind of processor a class is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum DeviceKind {
    /// CPU cores, one worker each.
    Cpu,
    /// A simulated accelerator: each chunk takes `latency + cost/speed`, where
    /// `cost` is what one CPU worker would spend on it. It exists to test and
    /// measure balancing where no GPU is present.
    Sim {
        /// Speed relative to one CPU worker.
        speed: f64,
        /// Fixed cost per chunk.
        #[serde(with = "secs")]
        latency: Duration,
    },
    /// One CUDA GPU, one worker per stream.
    Cuda {
        /// Device ordinal among the visible GPUs.
        id: usize,
    },
}

mod secs {
    pub(super) fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// One entry of a device spec: a device class and how many workers it gets.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DeviceSpec {
    /// The processor.
    #[serde(flatten)]
    pub kind: DeviceKind,
    /// Workers (CPU cores, simulated units, or CUDA streams). `None`: the default.
    pub workers: Option<usize>,
}

impl DeviceSpec {
    /// `n` CPU workers.
    pub fn cpu(n: usize) -> Self {
        Self {
            kind: DeviceKind::Cpu,
            workers: Some(n),
        }
    }

    /// `n` simulated workers, each `speed` times one CPU worker, with `latency` per chunk.
    pub fn sim(n: usize, speed: f64, latency: Duration) -> Self {
        Self {
            kind: DeviceKind::Sim { speed, latency },
            workers: Some(n),
        }
    }

    /// GPU `id` with `streams` workers (`None`: the default, 2).
    pub fn cuda(id: usize, streams: Option<usize>) -> Self {
        Self {
            kind: DeviceKind::Cuda { id },
            workers: streams,
        }
    }
}

/// Most workers one class may have: more is a typo, not a machine.
pub const MAX_WORKERS: usize = 4096;

/// Speeds a simulated device may have, relative to one CPU worker: slower
/// than a hundredth of a core, one chunk would outlast any probe; the upper
/// bound keeps `cost / speed` well above a nanosecond's rounding.
pub const SIM_SPEEDS: std::ops::RangeInclusive<f64> = 0.01..=1e9;

/// A parsed device list, as given to `--devices` or `COEXEC_DEVICES`.
///
/// Parse one from a spec, or build one from [`DeviceSpec`]s:
///
/// ```
/// use std::time::Duration;
///
/// use coexec_actors::{DeviceList, DeviceSpec};
///
/// let d: DeviceList = "cpu:2,sim:1@10+50us".parse().unwrap();
/// assert_eq!(d.to_string(), "cpu:2,sim:1@10+50us");
/// assert!("cpu:0".parse::<DeviceList>().is_err());
///
/// let built = DeviceList::new(vec![DeviceSpec::cpu(2), DeviceSpec::sim(1, 4.0, Duration::ZERO)]);
/// assert_eq!(built.to_string(), "cpu:2,sim:1@4");
/// assert_eq!(built.specs()[0], DeviceSpec::cpu(2));
///
/// // `for spec in &built` goes over the entries; entries collect into a list.
/// let cpus: DeviceList = built.specs().iter().take(1).cloned().collect();
/// assert_eq!(cpus.to_string(), "cpu:2");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceList(Vec<DeviceSpec>);

impl DeviceList {
    /// A list of `specs`, as given. Unlike parsing, this checks nothing
    /// (the runtime refuses a simulated speed outside [`SIM_SPEEDS`] when
    /// it starts).
    pub fn new(specs: Vec<DeviceSpec>) -> Self {
        Self(specs)
    }

    /// The entries, in order.
    pub fn specs(&self) -> &[DeviceSpec] {
        &self.0
    }
}

impl FromIterator<DeviceSpec> for DeviceList {
    fn from_iter<I: IntoIterator<Item = DeviceSpec>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a DeviceList {
    type Item = &'a DeviceSpec;
    type IntoIter = std::slice::Iter<'a, DeviceSpec>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromStr for DeviceList {
    type Err = ActorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| ActorError::DeviceSpec {
            spec: s.to_string(),
            why,
        };
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            if part.is_empty() {
                return Err(bad("empty entry".into()));
            }
            let (name, rest) = part.split_once(':').unwrap_or((part, ""));
            let spec = match name {
                "cpu" => DeviceSpec {
                    kind: DeviceKind::Cpu,
                    workers: if rest.is_empty() {
                        None
                    } else {
                        Some(count(rest).map_err(bad)?)
                    },
                },
                "sim" => {
                    let (n, model) = rest.split_once('@').ok_or_else(|| {
                        bad(format!(
                            "`{part}`: a sim device is sim:N@SPEED[+LATENCY], e.g. sim:1@10+50us"
                        ))
                    })?;
                    let (speed, lat) = match model.split_once('+') {
                        Some((sp, lat)) => (sp, Some(lat)),
                        None => (model, None),
                    };
                    let speed: f64 = speed
                        .parse()
                        .ok()
                        .filter(|x: &f64| SIM_SPEEDS.contains(x))
                        .ok_or_else(|| {
                            bad(format!(
                                "`{speed}` is not a speed in [{}, {:e}]",
                                SIM_SPEEDS.start(),
                                SIM_SPEEDS.end()
                            ))
                        })?;
                    let latency = match lat {
                        Some(l) => duration(l).map_err(bad)?,
                        None => Duration::ZERO,
                    };
                    DeviceSpec {
                        kind: DeviceKind::Sim { speed, latency },
                        workers: Some(count(n).map_err(bad)?),
                    }
                }
                "cuda" | "gpu" => {
                    if rest.is_empty() {
                        return Err(bad("cuda needs a device id: cuda:ID[xSTREAMS]".into()));
                    }
                    let (id, streams) = match rest.split_once('x') {
                        Some((id, st)) => (id, Some(count(st).map_err(bad)?)),
                        None => (rest, None),
                    };
                    let id: usize = id
                        .parse()
                        .map_err(|_| bad(format!("`{id}` is not a device id")))?;
                    DeviceSpec::cuda(id, streams)
                }
                other => {
                    return Err(bad(format!(
                        "unknown device `{other}` (expected cpu, sim or cuda)"
                    )));
                }
            };
            if out.iter().any(|d: &DeviceSpec| same_device(d, &spec)) {
                return Err(bad(format!("`{part}` names a device twice")));
            }
            out.push(spec);
        }
        Ok(Self(out))
    }
}

fn same_device(a: &DeviceSpec, b: &DeviceSpec) -> bool {
    match (&a.kind, &b.kind) {
        (DeviceKind::Cpu, DeviceKind::Cpu) => true,
        (DeviceKind::Cuda { id: x }, DeviceKind::Cuda { id: y }) => x == y,
        _ => false,
    }
}

fn count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("a device needs at least one worker".into()),
        Ok(n) if n > MAX_WORKERS => Err(format!("{n} workers is more than {MAX_WORKERS}")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a worker count")),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(v) = s.strip_suffix("us") {
        (v, 1e-6)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else {
        return Err(format!("latency `{s}` needs a unit: us, ms or s"));
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * scale <= 10.0 => {
            Ok(Duration::from_secs_f64(v * scale))
        }
        _ => Err(format!("`{s}` is not a latency between 0 and 10 s")),
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.specs().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match (&d.kind, d.workers) {
                (DeviceKind::Cpu, None) => write!(f, "cpu")?,
                (DeviceKind::Cpu, Some(n)) => write!(f, "cpu:{n}")?,
                (DeviceKind::Sim { speed, latency }, n) => {
                    write!(f, "sim:{}@{speed}", n.unwrap_or(1))?;
                    if !latency.is_zero() {
                        write!(f, "+{}us", latency.as_micros())?;
                    }
                }
                (DeviceKind::Cuda { id }, None) => write!(f, "cuda:{id}")?,
                (DeviceKind::Cuda { id }, Some(s)) => write!(f, "cuda:{id}x{s}")?,
            }
        }
        Ok(())
    }
}

/// A device class as the runtime runs it: workers that share a speed model.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ClassInfo {
    /// Index among the runtime's classes.
    pub index: usize,
    /// Display name (`cpu`, `sim`, `cuda:0`).
    pub name: String,
    /// Key of this class in profiles: stable across processes on one machine.
    pub profile_key: String,
    /// The processor.
    #[serde(flatten)]
    pub kind: DeviceKind,
    /// Worker count.
    pub workers: usize,
    /// Which end of the item space it eats from.
    pub end: End,
    /// Model / marketing name, for reports (`NVIDIA H100 80GB HBM3`).
    pub model: String,
    /// Resident GPU threads that keep the device busy (0 for CPUs and
    /// simulated units): a chunk is never smaller than the items that
    /// occupy this many threads, since a smaller one measures launch
    /// latency rather than the device's throughput.
    pub fill_threads: usize,
}

impl ClassInfo {
    /// Whether this class is an accelerator (simulated or real).
    pub fn is_accel(&self) -> bool {
        !matches!(self.kind, DeviceKind::Cpu)
    }

    /// Whether its workers are streams of one GPU (one whose fill,
    /// [`ClassInfo::fill_threads`], is known), alike and sharing the
    /// device; CPU cores and simulated units are workers of their own.
    pub fn streams_share_a_device(&self) -> bool {
        self.fill_threads > 0
    }

    /// The one class of `classes` that `active` leaves, where its workers
    /// are one GPU's streams: alike and sharing the device, so that one
    /// stream's early end leaves the device to the others, and more chunks
    /// buy them no balance, only more fixed costs.
    pub(crate) fn one_device_alone(
        classes: &[ClassInfo],
        active: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let mut on = (0..classes.len()).filter(|&c| active(c));
        match (on.next(), on.next()) {
            (Some(c), None) if classes[c].streams_share_a_device() => Some(c),
            _ => None,
        }
    }

    /// The smallest chunk of `kernel` worth giving this class: on a GPU the
    /// items that occupy [`ClassInfo::fill_threads`] threads (at most the
    /// kernel's items), elsewhere one grain.
    pub fn min_chunk(&self, kernel: &dyn coexec_kernels::Kernel) -> usize {
        let grain = kernel.grain().max(1);
        if self.fill_threads == 0 {
            return grain;
        }
        let per = kernel.cuda().map_or(1, |k| k.threads_per_item().max(1));
        self.fill_threads
            .div_ceil(per)
            .min(kernel.items())
            .next_multiple_of(grain)
            .max(grain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let d: DeviceList = "cpu:4, sim:2@0.5, sim:1@2500+100us,cuda:1x3"
            .parse()
            .unwrap();
        assert_eq!(d.specs().len(), 4);
        assert_eq!(
            d.specs()[2].kind,
            DeviceKind::Sim {
                speed: 2500.0,
                latency: Duration::from_micros(100)
            }
        );
        assert_eq!(d.specs()[3], DeviceSpec::cuda(1, Some(3)));
        assert_eq!(
            "cpu".parse::<DeviceList>().unwrap().specs()[0].workers,
            None
        );
    }

    #[test]
    fn rejects_malformed_specs_with_a_reason() {
        for (s, why) in [
            ("", "empty entry"),
            ("cpu:0", "at least one worker"),
            ("cpu:x", "not a worker count"),
            ("cpu:2,cpu:1", "twice"),
            ("sim:1", "sim:N@SPEED"),
            ("sim:1@-2", "not a speed"),
            ("sim:1@2+5", "needs a unit"),
            ("tpu:1", "unknown device"),
            ("cuda", "needs a device id"),
            ("cpu:99999", "more than"),
        ] {
            let e = s.parse::<DeviceList>().unwrap_err().to_string();
            assert!(e.contains(why), "{s:?} gave {e:?}");
        }
    }
}
