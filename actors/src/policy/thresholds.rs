//! The method's thresholds (μ, ν, the probe and static fractions) and the
//! rules that can be turned off.

use super::{CPU_LATENCY_CHUNKS, LATENCY_CHUNKS};
use crate::device::ClassInfo;

/// The seed's thresholds and the engine's chunking constants (see
/// `docs/method.md`): start from the defaults and set what differs.
///
/// ```
/// use coexec_actors::policy::Thresholds;
///
/// let t = Thresholds::default().mu(0.2).static_fraction(0.7);
/// assert!(t.check().is_ok());
/// // Probing 50% and handing out 80% statically leaves nothing to steal.
/// assert!(Thresholds::default().warm_probe(0.5).check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Thresholds {
    /// μ: a probe whose imbalance exceeds this replaces the stored split.
    pub(crate) mu: f64,
    /// ν: a split that moved by more than this (relative) is stored.
    pub(crate) nu: f64,
    /// Fraction of a cold run each class probes (the seed: 5%).
    pub(crate) cold_probe: f64,
    /// Fraction of a warm run probed, split by the stored plan (the seed: 10%).
    pub(crate) warm_probe: f64,
    /// Fraction of a run handed out statically (the seed: 80%).
    pub(crate) static_fraction: f64,
    /// Static chunks per worker: more hedge against a slowed worker, fewer
    /// cost less.
    pub(crate) static_chunks_per_worker: usize,
    /// Warm start: a run whose kernel's last co-executed run kept to its
    /// models within μ skips the probe (see `docs/method.md`).
    #[serde(default = "yes")]
    pub(crate) warm_start: bool,
    /// The single-class rule: `hybrid` co-executes only where its forecast
    /// is clearly below the best single class's, and goes to that class
    /// alone otherwise (see `docs/method.md`).
    #[serde(default = "yes")]
    pub(crate) single_class: bool,
    /// The hold-off: after a co-executed run that ended later than the best
    /// single class's forecast by more than the noise, `hybrid` keeps to
    /// that class and co-executes again only as a bounded trial (see
    /// `docs/method.md`).
    #[serde(default = "yes")]
    pub(crate) hold_off: bool,
    /// A CPU class's chunks are at least this many times its fixed cost
    /// per chunk long (an accelerator's, [`LATENCY_CHUNKS`] times).
    #[serde(default = "cpu_latency_chunks")]
    pub(crate) cpu_latency_chunks: f64,
}

fn yes() -> bool {
    true
}

fn cpu_latency_chunks() -> f64 {
    CPU_LATENCY_CHUNKS
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            mu: 0.10,
            nu: 0.05,
            cold_probe: 0.05,
            warm_probe: 0.10,
            static_fraction: 0.80,
            static_chunks_per_worker: 4,
            warm_start: true,
            single_class: true,
            hold_off: true,
            cpu_latency_chunks: CPU_LATENCY_CHUNKS,
        }
    }
}

impl Thresholds {
    /// Refuses values out of range, saying which: fractions outside
    /// [0, 1], a warm probe and a static share above the whole run, no
    /// static chunks.
    pub fn check(&self) -> Result<(), String> {
        let frac = |x: f64| (0.0..=1.0).contains(&x);
        for (name, v) in [
            ("mu", self.mu),
            ("nu", self.nu),
            ("cold_probe", self.cold_probe),
            ("warm_probe", self.warm_probe),
            ("static_fraction", self.static_fraction),
        ] {
            if !frac(v) {
                return Err(format!("{name} = {v} is not a fraction in [0, 1]"));
            }
        }
        if self.warm_probe + self.static_fraction > 1.0 {
            return Err(format!(
                "warm_probe + static_fraction = {} is more than the whole run",
                self.warm_probe + self.static_fraction
            ));
        }
        if self.static_chunks_per_worker == 0 {
            return Err("static_chunks_per_worker is 0".into());
        }
        if !(self.cpu_latency_chunks.is_finite() && self.cpu_latency_chunks > 0.0) {
            return Err(format!(
                "cpu_latency_chunks = {} is not positive",
                self.cpu_latency_chunks
            ));
        }
        Ok(())
    }

    /// Sets μ.
    pub fn mu(mut self, mu: f64) -> Self {
        self.mu = mu;
        self
    }

    /// Sets ν.
    pub fn nu(mut self, nu: f64) -> Self {
        self.nu = nu;
        self
    }

    /// Sets the fraction of a cold run each class probes.
    pub fn cold_probe(mut self, fraction: f64) -> Self {
        self.cold_probe = fraction;
        self
    }

    /// Sets the fraction of a warm run probed.
    pub fn warm_probe(mut self, fraction: f64) -> Self {
        self.warm_probe = fraction;
        self
    }

    /// Sets the fraction of a run handed out statically.
    pub fn static_fraction(mut self, fraction: f64) -> Self {
        self.static_fraction = fraction;
        self
    }

    /// Sets the static chunks per worker.
    pub fn static_chunks_per_worker(mut self, chunks: usize) -> Self {
        self.static_chunks_per_worker = chunks;
        self
    }

    /// Turns the warm start on or off.
    pub fn warm_start(mut self, on: bool) -> Self {
        self.warm_start = on;
        self
    }

    /// Turns the single-class rule on or off.
    pub fn single_class(mut self, on: bool) -> Self {
        self.single_class = on;
        self
    }

    /// Turns the hold-off after a clearly lost co-execution on or off.
    pub fn hold_off(mut self, on: bool) -> Self {
        self.hold_off = on;
        self
    }

    /// Sets how many times its fixed cost per chunk a CPU class's chunk is
    /// at least long.
    pub fn cpu_latency_chunks(mut self, chunks: f64) -> Self {
        self.cpu_latency_chunks = chunks.max(0.0);
        self
    }

    /// How many times its fixed cost per chunk a chunk of `class` is at
    /// least long: [`Thresholds::cpu_latency_chunks`] for CPUs, whose many
    /// workers' last chunks must end together; [`LATENCY_CHUNKS`] for an
    /// accelerator, whose launch and transfer setup are paid per chunk.
    pub(crate) fn latency_chunks(&self, class: &ClassInfo) -> f64 {
        if class.is_accel() {
            LATENCY_CHUNKS
        } else {
            self.cpu_latency_chunks
        }
    }
}
