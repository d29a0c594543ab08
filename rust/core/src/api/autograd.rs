//! Autograd from Rust: scopes that switch recording and training on or off for the current
//! thread (MXNet keeps both flags per thread), and gradients of recorded computations.
//!
//! ```
//! use oxnet::{Context, NDArray};
//!
//! let mut x = NDArray::from_slice(&[3f32, 1., 4.], [3], Context::cpu(0))?;
//! x.attach_grad()?;
//! let y = {
//!     let _recording = oxnet::record();
//!     ((&x * &x)? + (&x * 5.0)?)? // x² + 5x
//! };
//! y.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec::<f32>()?, [11., 7., 13.]); // 2x + 5
//! # Ok::<(), oxnet::Error>(())
//! ```

use std::marker::PhantomData;

use crate::autograd::{self as tape, BackwardOptions, FlagsGuard, Wrt};
use crate::error::Result;
use crate::graph::GradReq;
use crate::ndarray::NDArray;

/// Restores the thread's recording and training flags when dropped. The flags belong to the
/// thread that set them, so the scope cannot be sent to another thread.
#[must_use = "the flags are restored as soon as the scope is dropped"]
pub struct AutogradScope {
    _flags: FlagsGuard,
    _this_thread: PhantomData<*const ()>,
}

fn scope(recording: bool, training: bool) -> AutogradScope {
    AutogradScope { _flags: FlagsGuard::set(recording, training), _this_thread: PhantomData }
}

/// Record operators on arrays that need gradients, in training mode, until the scope is dropped
/// (MXNet's `autograd.record()`).
pub fn record() -> AutogradScope {
    scope(true, true)
}

/// [`record`] choosing the mode: `train_mode = false` records with Dropout and BatchNorm in
/// inference behaviour (MXNet's `autograd.record(train_mode=False)`).
pub fn record_with(train_mode: bool) -> AutogradScope {
    scope(true, train_mode)
}

/// Stop recording, in inference mode, until the scope is dropped (MXNet's `autograd.pause()`).
pub fn pause() -> AutogradScope {
    scope(false, false)
}

/// Training behaviour without changing whether operators are recorded.
pub fn train_mode() -> AutogradScope {
    scope(tape::is_recording(), true)
}

/// Inference behaviour without changing whether operators are recorded.
pub fn predict_mode() -> AutogradScope {
    scope(tape::is_recording(), false)
}

/// Gradients of the sum of `heads` with respect to `variables`, returned rather than stored
/// (MXNet's `autograd.grad`); the variables must have been marked with
/// [`NDArray::attach_grad`] before recording.
pub fn grad(heads: &[&NDArray], variables: &[&NDArray]) -> Result<Vec<NDArray>> {
    let heads: Vec<NDArray> = heads.iter().map(|&h| h.clone()).collect();
    let variables: Vec<NDArray> = variables.iter().map(|&v| v.clone()).collect();
    let options = BackwardOptions { retain_graph: false, create_graph: false, train_mode: true };
    tape::backward(&heads, &vec![None; heads.len()], Wrt::Arrays(&variables), options)
}

impl NDArray {
    /// Make this array a variable whose gradient [`NDArray::backward`] writes into a buffer of
    /// zeros allocated here (MXNet's `attach_grad()`). Only this handle (and clones taken after
    /// the call) belongs to the graph.
    pub fn attach_grad(&mut self) -> Result<()> {
        let buffer = NDArray::zeros(self.shape().clone(), self.dtype(), self.context())?;
        *self = tape::mark_variables(&[self.detached()], &[buffer], &[GradReq::Write])?.swap_remove(0);
        Ok(())
    }

    /// The gradient buffer of a variable (see [`NDArray::attach_grad`]).
    pub fn grad(&self) -> Option<NDArray> {
        tape::grad_of(self)
    }

    /// Differentiate this recorded result (its elements summed) into the gradient buffers of
    /// the variables it was computed from, in training mode; the recorded graph is released.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false)
    }

    /// [`NDArray::backward`] weighting the result's elements by `head_grad` (ones when `None`)
    /// and, with `retain_graph`, keeping the graph for another backward pass.
    pub fn backward_with(&self, head_grad: Option<&NDArray>, retain_graph: bool) -> Result<()> {
        let options = BackwardOptions { retain_graph, create_graph: false, train_mode: true };
        tape::backward(std::slice::from_ref(self), &[head_grad.cloned()], Wrt::MarkedVariables, options)?;
        Ok(())
    }
}
