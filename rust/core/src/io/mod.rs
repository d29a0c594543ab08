//! Files MXNet users already have.
//!
//! Everything here reads bytes a user (or an attacker) supplies: no unwrap and no unchecked
//! indexing, so that a corrupt file can only ever produce an error.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod file;
pub mod params;
