//! Neural-network operators as Rust functions, each with its typed parameters from
//! [`crate::params`].
//!
//! Layers whose bias is optional take it as an `Option`: `None` sets the operator's `no_bias`,
//! so the two can never disagree. Operators that behave differently in training (Dropout,
//! BatchNorm) follow the training flag that [`crate::record`] and [`crate::train_mode`] set.
//!
//! ```
//! use oxnet::params::{ActivationParams, ActivationType, FullyConnectedParams};
//! use oxnet::{nn, Context, NDArray};
//!
//! let cpu = Context::cpu(0);
//! let x = NDArray::from_slice(&[1f32, -2., 3.], [1, 3], cpu)?;
//! let w = NDArray::from_slice(&[1f32, 1., 1., 0., 1., 0.], [2, 3], cpu)?;
//! let b = NDArray::from_slice(&[0.5f32, 0.], [2], cpu)?;
//! let y = nn::fully_connected(&x, &w, Some(&b), FullyConnectedParams::new(2))?;
//! let y = nn::activation(&y, ActivationParams::new(ActivationType::Relu))?;
//! assert_eq!(y.to_vec::<f32>()?, [2.5, 0.]);
//! # Ok::<(), oxnet::Error>(())
//! ```

use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::params::NoParams;
use crate::op::typed::*;

use super::ops::{call, call1};

/// `x . weightᵀ + bias`, weight of shape `(num_hidden, features)`.
#[track_caller]
pub fn fully_connected(x: &NDArray, weight: &NDArray, bias: Option<&NDArray>, params: FullyConnectedParams) -> Result<NDArray> {
    let params = params.no_bias(bias.is_none());
    call1("FullyConnected", &[&[x, weight][..], bias.as_slice()].concat(), &params)
}

/// 1-D, 2-D or 3-D convolution of channels-first data, weight of shape
/// `(num_filter, channels / num_group, kernel...)`.
#[track_caller]
pub fn convolution(x: &NDArray, weight: &NDArray, bias: Option<&NDArray>, params: ConvolutionParams) -> Result<NDArray> {
    let params = params.no_bias(bias.is_none());
    call1("Convolution", &[&[x, weight][..], bias.as_slice()].concat(), &params)
}

/// Transposed convolution, weight of shape `(channels, num_filter / num_group, kernel...)`.
#[track_caller]
pub fn deconvolution(x: &NDArray, weight: &NDArray, bias: Option<&NDArray>, params: DeconvolutionParams) -> Result<NDArray> {
    let params = params.no_bias(bias.is_none());
    call1("Deconvolution", &[&[x, weight][..], bias.as_slice()].concat(), &params)
}

/// Max, average, sum or Lp pooling over windows (or the whole input with `global_pool`).
#[track_caller]
pub fn pooling(x: &NDArray, params: PoolingParams) -> Result<NDArray> {
    call1("Pooling", &[x], &params)
}

/// relu, sigmoid, tanh, softrelu or softsign, element-wise.
#[track_caller]
pub fn activation(x: &NDArray, params: ActivationParams) -> Result<NDArray> {
    call1("Activation", &[x], &params)
}

/// Leaky ReLU and its variants (leaky, elu, selu, gelu, rrelu; prelu with a per-channel
/// `gamma`).
#[track_caller]
pub fn leaky_relu(x: &NDArray, gamma: Option<&NDArray>, params: LeakyReLUParams) -> Result<NDArray> {
    call1("LeakyReLU", &[&[x][..], gamma.as_slice()].concat(), &params)
}

/// Batch normalization over `params.axis`. While training it normalizes with the batch's
/// statistics and updates `moving_mean` and `moving_var` in place.
#[track_caller]
pub fn batch_norm(
    x: &NDArray,
    gamma: &NDArray,
    beta: &NDArray,
    moving_mean: &NDArray,
    moving_var: &NDArray,
    params: BatchNormParams,
) -> Result<NDArray> {
    call1("BatchNorm", &[x, gamma, beta, moving_mean, moving_var], &params)
}

/// Layer normalization over `params.axis`, then `gamma` scale and `beta` shift.
#[track_caller]
pub fn layer_norm(x: &NDArray, gamma: &NDArray, beta: &NDArray, params: LayerNormParams) -> Result<NDArray> {
    call1("LayerNorm", &[x, gamma, beta], &params)
}

/// Zeroes elements with probability `params.p` while training and scales the rest by
/// `1 / (1 - p)`; the identity otherwise.
#[track_caller]
pub fn dropout(x: &NDArray, params: DropoutParams) -> Result<NDArray> {
    call1("Dropout", &[x], &params)
}

/// Softmax along `params.axis`.
#[track_caller]
pub fn softmax(x: &NDArray, params: SoftmaxParams) -> Result<NDArray> {
    call1("softmax", &[x], &params)
}

/// Log of the softmax along `params.axis`.
#[track_caller]
pub fn log_softmax(x: &NDArray, params: SoftmaxParams) -> Result<NDArray> {
    call1("log_softmax", &[x], &params)
}

/// Rows of `weight` `(input_dim, output_dim)` looked up by the indices in `indices`.
#[track_caller]
pub fn embedding(indices: &NDArray, weight: &NDArray, params: EmbeddingParams) -> Result<NDArray> {
    call1("Embedding", &[indices, weight], &params)
}

/// The cross-entropy of `softmax(logits)` against integer class `labels`, summed over the
/// batch (one value).
#[track_caller]
pub fn softmax_cross_entropy(logits: &NDArray, labels: &NDArray) -> Result<NDArray> {
    call1("softmax_cross_entropy", &[logits, labels], &NoParams)
}

/// Softmax whose gradient is the cross-entropy gradient against `label` (the output layer of
/// MXNet's symbolic networks).
#[track_caller]
pub fn softmax_output(x: &NDArray, label: &NDArray, params: SoftmaxOutputParams) -> Result<NDArray> {
    call1("SoftmaxOutput", &[x, label], &params)
}

/// A stacked (bidirectional) relu/tanh RNN, LSTM or GRU over `(time, batch, input)` data with
/// all weights in one `parameters` vector; `state` (and for LSTM `state_cell`) hold the initial
/// states. Returns the output and, with `state_outputs`, the final states.
#[track_caller]
pub fn rnn(x: &NDArray, parameters: &NDArray, state: &NDArray, state_cell: Option<&NDArray>, params: RnnParams) -> Result<Vec<NDArray>> {
    call("RNN", &[&[x, parameters, state][..], state_cell.as_slice()].concat(), &params)
}
