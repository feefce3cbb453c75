//! The placement a stream is configured with.

use std::str::FromStr;

use crate::Error;

/// How a stream places its batches on the device classes
/// ([`StreamConfig::placement`](crate::stream::StreamConfig::placement)).
///
/// ```
/// use coexec::stream::Placement;
/// assert_eq!("greedy".parse::<Placement>().unwrap(), Placement::Greedy);
/// assert!("fastest".parse::<Placement>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// Each batch on the class predicted to finish it first (classes busy
    /// with earlier batches count), or split across classes by their speed
    /// models when that finishes it sooner and, under load, the time saved
    /// is worth the fixed cost the split adds. No probe per batch.
    #[default]
    Hybrid,
    /// Whole batches to whichever class is free first (Triton's instance
    /// groups), for comparison.
    Greedy,
    /// Each batch is an ordinary job under the runtime's policy, probe
    /// included (what [`StreamConfig::job`](crate::stream::StreamConfig::job) sets).
    Runtime,
}

impl Placement {
    /// The names `FromStr` takes.
    pub const NAMES: &'static [&'static str] = &["hybrid", "greedy", "runtime"];
}

impl FromStr for Placement {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "hybrid" => Ok(Self::Hybrid),
            "greedy" => Ok(Self::Greedy),
            "runtime" => Ok(Self::Runtime),
            _ => Err(Error::Config {
                what: "placement",
                why: format!("`{s}` is not one of {:?}", Self::NAMES),
            }),
        }
    }
}
