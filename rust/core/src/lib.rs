//! oxnet core: Apache MXNet 1.x rebuilt in Rust.
//!
//! Tensors ([`ndarray::NDArray`]) live in pooled storage ([`storage`]); every operation is a
//! registered operator ([`op`]) pushed onto the dependency engine ([`engine`]) with the variables it
//! reads and writes, so independent work runs concurrently while Python keeps issuing calls.
//! Nothing here depends on Python: a Rust program can embed this crate directly.

pub mod autograd;
pub mod backend;
pub mod base;
pub mod engine;
pub mod error;
pub mod executor;
pub mod graph;
pub mod imperative;
pub mod io;
pub mod ndarray;
pub mod op;
pub mod pass;
pub mod random;
pub mod storage;
pub mod symbol;
mod sync;

pub use base::{Context, DType, DeviceType, Shape};
pub use error::{Error, ErrorKind, Result};
pub use ndarray::NDArray;
