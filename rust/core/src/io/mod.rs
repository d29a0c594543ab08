//! Files MXNet users already have.

pub mod params;
