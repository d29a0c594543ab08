//! oxnet core: Apache MXNet 1.x rebuilt in Rust.
//!
//! Tensors ([`NDArray`]) live in pooled storage ([`storage`]); every operation is a registered
//! operator ([`op`]) pushed onto the dependency engine ([`engine`]) with the variables it reads
//! and writes, so independent work runs concurrently while the caller keeps issuing calls.
//! Nothing here depends on Python: the Python package is one user of this crate, and a Rust
//! program can embed it the same way.
//!
//! # Use from Rust
//!
//! Arrays are built with [`NDArray::from_slice`], [`NDArray::zeros`], [`NDArray::ones`] or
//! [`NDArray::full`] and read back with [`NDArray::to_vec`]; `+ - * /` work between arrays
//! (broadcasting) and with scalars. Operators are functions taking their typed parameters:
//! [`nn`] for layers, [`ops`] for math, shapes and indexing, [`optim`] for optimizer steps,
//! and [`ops::call`] for any registered operator by name with its struct from [`params`].
//! [`record`] starts recording for [`NDArray::backward`]; [`Symbol::apply`] composes graphs;
//! [`Model`] runs a saved MXNet model (or a composed graph) with memory planned for inference.
//!
//! ```
//! use oxnet::prelude::*;
//!
//! let cpu = Context::cpu(0);
//! let x = NDArray::from_slice(&[1f32, 2., 3., 4.], [2, 2], cpu)?;
//! let mut w = NDArray::from_slice(&[0.5f32, -1., 1., 1.], [2, 2], cpu)?;
//! let b = NDArray::zeros([2], DType::F32, cpu)?;
//! w.attach_grad()?;
//! let loss = {
//!     let _recording = oxnet::record();
//!     let y = nn::fully_connected(&x, &w, Some(&b), FullyConnectedParams::new(2))?; // x wᵀ + b
//!     ops::relu(&y)?.sum_all()?
//! };
//! assert_eq!(loss.to_scalar::<f32>()?, 10.0);
//! loss.backward()?;
//! let grad = w.grad().expect("w is a variable");
//! assert_eq!(grad.to_vec::<f32>()?, [0., 0., 4., 6.]); // only the second unit is active
//! optim::sgd_update(&w, &grad, SgdParams::new(0.25))?;
//! assert_eq!(w.to_vec::<f32>()?, [0.5, -1., 0., -0.5]);
//! # Ok::<(), oxnet::Error>(())
//! ```
//!
//! # Errors
//!
//! Every fallible call returns [`Result`] with an [`Error`] whose [`ErrorKind`] is what the
//! Python package turns into its exception type (`IndexError` for [`ErrorKind::Index`], as
//! Python's iteration protocol needs; `MXNetError` for every other kind, as MXNet raises)
//! and whose message is the same text. Bad arguments fail at the call; a kernel that fails while
//! running (an index out of range under `mode="raise"`) fails the next read of its outputs
//! ([`NDArray::to_vec`], [`NDArray::wait_to_read`], [`engine::wait_all`]), naming the operator,
//! its input shapes and the source line of the call. Arithmetic operators return `Result` too,
//! so nothing panics on bad shapes.
//!
//! # Threads and memory
//!
//! Work runs on the engine's thread pool (all cores by default; `OXNET_ENGINE_TYPE=NaiveEngine`
//! runs every operator synchronously, for debugging). Array memory is 64-byte aligned and
//! pooled by oxnet (freed blocks are kept by size class and reused): blocks of 256 KiB and more
//! are mapped from the kernel directly; smaller ones come from the program's global allocator,
//! and those of at most 1 KiB bypass the pool's free lists, since the allocator's per-thread
//! caches reuse them more cheaply.
//!
//! The global allocator, which also serves the small allocations of each call (operator
//! instances, shapes, engine bookkeeping), is the embedding program's choice: a library cannot
//! set it without overriding the program's own. The Python extension uses mimalloc, with its
//! purge delay raised from 10 ms to 1 s (`mi_option_set(mi_option_purge_delay, 1000)`: a
//! training loop frees and reuses the same memory every few milliseconds, and each early
//! return to the OS cost a page fault on reuse, 4% of a LeNet step). A Rust program gets the
//! allocator by declaring it (`#[global_allocator] static A: mimalloc::MiMalloc =
//! mimalloc::MiMalloc;`) and the delay by setting that option at startup. Measured on the
//! project's 2-core machine: a 2x2 `ops::add` costs 1.34 µs with mimalloc against 1.61 µs with
//! the system allocator, a tiny recorded forward-and-backward step 18 µs against 22 µs, while
//! `Model::predict` (planned memory) is unchanged.

mod api;
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
pub mod profiler;
pub mod random;
pub mod storage;
pub mod symbol;

pub use base::{Context, DType, DeviceType, Shape};
pub use error::{Error, ErrorKind, Result};
pub use ndarray::NDArray;
pub use op::typed as params;
pub use symbol::Symbol;

pub use api::{grad, nn, ops, optim, pause, predict_mode, record, record_with, train_mode, AutogradScope, Model};

/// The names most programs use, with every operator's parameter struct: `use oxnet::prelude::*;`.
pub mod prelude {
    pub use crate::params::*;
    pub use crate::{nn, ops, optim, Context, DType, Model, NDArray, Shape, Symbol};
}
