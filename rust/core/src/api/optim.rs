//! Optimizer steps as in-place updates of a weight from its gradient: MXNet's fused update
//! operators, which Gluon's `Trainer` runs, called with their typed parameters. Each one is
//! pushed onto the engine like any operator, so a training loop does not wait for it.
//!
//! State arrays (momentum, Adam's moments) start as zeros of the weight's shape
//! ([`crate::ops::zeros_like`]) and are updated in place too.

use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::typed::{AdamParams, SgdMomParams, SgdParams};

use super::ops::call_into;

/// `weight -= lr * (rescale_grad * grad + wd * weight)`, the gradient clipped to
/// `±clip_gradient` when that is positive.
#[track_caller]
pub fn sgd_update(weight: &NDArray, grad: &NDArray, params: SgdParams) -> Result<()> {
    call_into("sgd_update", &[weight, grad], &params, &[weight])
}

/// SGD with momentum: `mom = momentum * mom - lr * (rescale_grad * grad + wd * weight)`, then
/// `weight += mom`.
#[track_caller]
pub fn sgd_mom_update(weight: &NDArray, grad: &NDArray, mom: &NDArray, params: SgdMomParams) -> Result<()> {
    call_into("sgd_mom_update", &[weight, grad, mom], &params, &[weight])
}

/// Adam: moving averages `mean` and `var` of the gradient and its square, then
/// `weight -= lr * mean / (sqrt(var) + epsilon)`. As in MXNet, `lr` is the caller's (bias
/// correction is folded into it by the caller, as Gluon's Adam does).
#[track_caller]
pub fn adam_update(weight: &NDArray, grad: &NDArray, mean: &NDArray, var: &NDArray, params: AdamParams) -> Result<()> {
    call_into("adam_update", &[weight, grad, mean, var], &params, &[weight])
}
