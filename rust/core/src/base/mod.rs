//! The vocabulary every module shares: element types, shapes and devices.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod context;
mod dtype;
mod shape;

pub use context::{Context, DeviceType};
pub use dtype::{as_acc_mut, Bool8, DType, Elem};
/// Path the dtype dispatch macro names the boolean element type by.
pub mod dtype_bool {
    pub use super::dtype::Bool8;
}
pub use shape::{merge_partial, normalize_axis, unify_partial, Dims, PartialShape, Shape};
