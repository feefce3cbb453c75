//! The broker: owns every job's item space and hands out chunks.

pub(crate) mod job;
pub(crate) mod space;
