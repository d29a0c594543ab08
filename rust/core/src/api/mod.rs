//! The typed Rust API an embedding program uses: array constructors and arithmetic, operators
//! as functions taking their typed parameters, autograd scopes, graph composition with typed
//! parameters, and [`Model`] for running a saved MXNet model. Everything here is a thin layer over the same registry, engine and
//! executor the Python package drives, so results and error messages are the same.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod arith;
mod array;
mod autograd;
mod model;
pub mod nn;
pub mod ops;
pub mod optim;
mod symbol;

pub use autograd::{grad, pause, predict_mode, record, record_with, train_mode, AutogradScope};
pub use model::Model;
