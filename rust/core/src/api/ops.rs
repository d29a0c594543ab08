//! Operators as Rust functions: element-wise math, reductions, linear algebra, shape and
//! indexing operators, creation and random sampling.
//!
//! Every function pushes one registered operator onto the engine and returns at once; the
//! result's values are computed asynchronously and read with [`NDArray::to_vec`] (which waits).
//! Errors in the arguments (shapes, dtypes, parameters) are returned right away; an error inside
//! a running kernel is returned by the next read of its output, naming the operator, its input
//! shapes and the line of the call. Each function takes its operator's typed parameters from
//! [`crate::params`]; [`call`] reaches every other registered operator the same way.
//!
//! ```
//! use oxnet::params::{ReduceParams, TransposeParams};
//! use oxnet::{ops, Context, NDArray};
//!
//! let x = NDArray::from_slice(&[1f32, 2., 3., 4., 5., 6.], [2, 3], Context::cpu(0))?;
//! let rows = ops::sum(&x, ReduceParams::new().axis(Some(vec![1])))?;
//! assert_eq!(rows.to_vec::<f32>()?, [6., 15.]);
//! let t = ops::transpose(&x, TransposeParams::new())?;
//! assert_eq!(t.shape().dims(), [3, 2]);
//! # Ok::<(), oxnet::Error>(())
//! ```

use std::panic::Location;
use std::sync::Arc;

use crate::base::{Context, DType};
use crate::error::Result;
use crate::imperative::{self, PushSite, Site};
use crate::ndarray::NDArray;
use crate::op::params::NoParams;
use crate::op::typed::*;
use crate::op::{self, Attrs, Params};

/// Where a Rust call pushed an operator; turned into text only if the operator fails.
struct CallerSite(&'static Location<'static>);

impl PushSite for CallerSite {
    fn location(&self) -> String {
        format!("{}:{}", self.0.file(), self.0.line())
    }
}

#[track_caller]
fn caller_site() -> Site {
    Some(Arc::new(CallerSite(Location::caller())))
}

#[track_caller]
fn invoke(name: &str, inputs: &[&NDArray], attrs: &Attrs, out: Option<Vec<NDArray>>) -> Result<Vec<NDArray>> {
    let site = caller_site();
    let operator = op::lookup(name)?.instantiate(name, attrs)?;
    let visible = operator.num_visible_outputs();
    let inputs: Vec<NDArray> = inputs.iter().map(|&a| a.clone()).collect();
    let mut outputs = imperative::invoke_operator(name, operator, attrs, &inputs, out, Context::default(), site)?;
    // Outputs kept only for the gradient (Dropout's mask) stay inside the engine.
    outputs.truncate(visible);
    Ok(outputs)
}

/// Invoke the operator registered as `name` (or one of its MXNet aliases) on `inputs` with its
/// typed parameters; returns the outputs a caller sees (MXNet's visible outputs).
///
/// The parameters reach the operator as MXNet's attribute strings, so a struct that does not
/// belong to the operator is refused with the operator's own message naming the unknown
/// parameter.
#[track_caller]
pub fn call<P: Params>(name: &str, inputs: &[&NDArray], params: &P) -> Result<Vec<NDArray>> {
    invoke(name, inputs, &params.to_attrs(), None)
}

/// [`call`] for an operator with one visible output.
#[track_caller]
pub fn call1<P: Params>(name: &str, inputs: &[&NDArray], params: &P) -> Result<NDArray> {
    let outputs = invoke(name, inputs, &params.to_attrs(), None)?;
    outputs.into_iter().next().ok_or_else(|| crate::err!(Value, "operator {name} has no visible output"))
}

/// [`call`] writing the outputs into existing arrays of the right shape and dtype (MXNet's
/// `out=`); an output may be one of the inputs where the operator allows it, as the optimizer
/// updates do.
#[track_caller]
pub fn call_into<P: Params>(name: &str, inputs: &[&NDArray], params: &P, out: &[&NDArray]) -> Result<()> {
    invoke(name, inputs, &params.to_attrs(), Some(out.iter().map(|&a| a.clone()).collect()))?;
    Ok(())
}

macro_rules! unary {
    ($($(#[doc = $doc:literal])* $name:ident = $op:literal;)*) => {
        $(
            $(#[doc = $doc])*
            #[track_caller]
            pub fn $name(x: &NDArray) -> Result<NDArray> {
                call1($op, &[x], &NoParams)
            }
        )*

        /// Element-wise math as methods, for chaining (`x.exp()?.sum_all()?`).
        impl NDArray {
            $(
                $(#[doc = $doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<NDArray> {
                    call1($op, &[self], &NoParams)
                }
            )*
        }
    };
}

unary! {
    /// `|x|` element-wise.
    abs = "abs";
    /// The sign (-1, 0 or 1) element-wise.
    sign = "sign";
    /// Rounded to the nearest integer, halves away from zero.
    round = "round";
    /// Rounded up element-wise.
    ceil = "ceil";
    /// Rounded down element-wise.
    floor = "floor";
    /// `x * x` element-wise.
    square = "square";
    /// Square root element-wise.
    sqrt = "sqrt";
    /// `1 / sqrt(x)` element-wise.
    rsqrt = "rsqrt";
    /// `e^x` element-wise.
    exp = "exp";
    /// `e^x - 1` element-wise, exact near zero.
    expm1 = "expm1";
    /// Natural logarithm element-wise.
    log = "log";
    /// `ln(1 + x)` element-wise, exact near zero.
    log1p = "log1p";
    /// Base-2 logarithm element-wise.
    log2 = "log2";
    /// Base-10 logarithm element-wise.
    log10 = "log10";
    /// Sine element-wise.
    sin = "sin";
    /// Cosine element-wise.
    cos = "cos";
    /// Tangent element-wise.
    tan = "tan";
    /// Hyperbolic tangent element-wise.
    tanh = "tanh";
    /// `1 / (1 + e^-x)` element-wise.
    sigmoid = "sigmoid";
    /// `max(x, 0)` element-wise.
    relu = "relu";
    /// `x / (1 + |x|)` element-wise.
    softsign = "softsign";
    /// Gauss error function element-wise.
    erf = "erf";
    /// `1 / x` element-wise.
    reciprocal = "reciprocal";
    /// `-x` element-wise (also `-&x`).
    negative = "negative";
}

macro_rules! binary {
    ($($(#[doc = $doc:literal])* $name:ident = $op:literal;)*) => {
        $(
            $(#[doc = $doc])*
            #[track_caller]
            pub fn $name(lhs: &NDArray, rhs: &NDArray) -> Result<NDArray> {
                call1($op, &[lhs, rhs], &NoParams)
            }
        )*
    };
}

binary! {
    /// `lhs + rhs` with NumPy broadcasting (also `&a + &b`).
    add = "broadcast_add";
    /// `lhs - rhs` with broadcasting (also `&a - &b`).
    sub = "broadcast_sub";
    /// `lhs * rhs` with broadcasting (also `&a * &b`).
    mul = "broadcast_mul";
    /// `lhs / rhs` with broadcasting (also `&a / &b`).
    div = "broadcast_div";
    /// `lhs ^ rhs` with broadcasting.
    power = "broadcast_power";
    /// The larger of the two with broadcasting (NaN if either is NaN).
    maximum = "broadcast_maximum";
    /// The smaller of the two with broadcasting (NaN if either is NaN).
    minimum = "broadcast_minimum";
    /// 1 where `lhs == rhs`, else 0, with broadcasting.
    equal = "broadcast_equal";
    /// 1 where `lhs != rhs`, else 0, with broadcasting.
    not_equal = "broadcast_not_equal";
    /// 1 where `lhs > rhs`, else 0, with broadcasting.
    greater = "broadcast_greater";
    /// 1 where `lhs >= rhs`, else 0, with broadcasting.
    greater_equal = "broadcast_greater_equal";
    /// 1 where `lhs < rhs`, else 0, with broadcasting.
    lesser = "broadcast_lesser";
    /// 1 where `lhs <= rhs`, else 0, with broadcasting.
    lesser_equal = "broadcast_lesser_equal";
}

/// Sum over `params.axis` (all axes when `None`).
#[track_caller]
pub fn sum(x: &NDArray, params: ReduceParams) -> Result<NDArray> {
    call1("sum", &[x], &params)
}

/// Mean over `params.axis` (all axes when `None`).
#[track_caller]
pub fn mean(x: &NDArray, params: ReduceParams) -> Result<NDArray> {
    call1("mean", &[x], &params)
}

/// Maximum over `params.axis` (all axes when `None`).
#[track_caller]
pub fn max(x: &NDArray, params: ReduceParams) -> Result<NDArray> {
    call1("max", &[x], &params)
}

/// Minimum over `params.axis` (all axes when `None`).
#[track_caller]
pub fn min(x: &NDArray, params: ReduceParams) -> Result<NDArray> {
    call1("min", &[x], &params)
}

/// Product over `params.axis` (all axes when `None`).
#[track_caller]
pub fn prod(x: &NDArray, params: ReduceParams) -> Result<NDArray> {
    call1("prod", &[x], &params)
}

/// Index of the maximum along `params.axis` (of the flattened array when `None`), as floats
/// like MXNet.
#[track_caller]
pub fn argmax(x: &NDArray, params: ArgReduceParams) -> Result<NDArray> {
    call1("argmax", &[x], &params)
}

/// Index of the minimum along `params.axis` (of the flattened array when `None`).
#[track_caller]
pub fn argmin(x: &NDArray, params: ArgReduceParams) -> Result<NDArray> {
    call1("argmin", &[x], &params)
}

/// L1 or L2 norm over `params.axis` (all axes by default).
#[track_caller]
pub fn norm(x: &NDArray, params: NormParams) -> Result<NDArray> {
    call1("norm", &[x], &params)
}

/// Whether every element of `a` is within `params.atol + params.rtol * |b|` of `b`'s: a
/// one-element uint8 array holding 1 or 0 (`_contrib_allclose`).
#[track_caller]
pub fn allclose(a: &NDArray, b: &NDArray, params: AllCloseParams) -> Result<NDArray> {
    call1("_contrib_allclose", &[a, b], &params)
}

/// Matrix product of the last axis of `lhs` with the first of `rhs` (either transposed first).
#[track_caller]
pub fn dot(lhs: &NDArray, rhs: &NDArray, params: DotParams) -> Result<NDArray> {
    call1("dot", &[lhs, rhs], &params)
}

/// Matrix products of `(batch, n, k)` and `(batch, k, m)` batches.
#[track_caller]
pub fn batch_dot(lhs: &NDArray, rhs: &NDArray, params: DotParams) -> Result<NDArray> {
    call1("batch_dot", &[lhs, rhs], &params)
}

/// Reshape with MXNet's special codes (`0` copies a dimension, `-1` infers one, `-2`, `-3`,
/// `-4`); [`NDArray::reshape`] takes a plain shape.
#[track_caller]
pub fn reshape(x: &NDArray, params: ReshapeParams) -> Result<NDArray> {
    call1("Reshape", &[x], &params)
}

/// Permute the axes (reverse them when `params.axes` is empty).
#[track_caller]
pub fn transpose(x: &NDArray, params: TransposeParams) -> Result<NDArray> {
    call1("transpose", &[x], &params)
}

/// Swap two axes.
#[track_caller]
pub fn swapaxes(x: &NDArray, params: SwapAxesParams) -> Result<NDArray> {
    call1("SwapAxis", &[x], &params)
}

/// Insert an axis of size one.
#[track_caller]
pub fn expand_dims(x: &NDArray, params: ExpandDimsParams) -> Result<NDArray> {
    call1("expand_dims", &[x], &params)
}

/// Remove axes of size one (all of them when `params.axis` is `None`).
#[track_caller]
pub fn squeeze(x: &NDArray, params: SqueezeParams) -> Result<NDArray> {
    call1("squeeze", &[x], &params)
}

/// Collapse every axis after the first into one.
#[track_caller]
pub fn flatten(x: &NDArray) -> Result<NDArray> {
    call1("Flatten", &[x], &NoParams)
}

/// Join arrays along axis `dim`.
#[track_caller]
pub fn concat(arrays: &[&NDArray], dim: i64) -> Result<NDArray> {
    call1("Concat", arrays, &ConcatParams::new(arrays.len()).dim(dim))
}

/// Join arrays of one shape along a new axis `axis`.
#[track_caller]
pub fn stack(arrays: &[&NDArray], axis: i64) -> Result<NDArray> {
    call1("stack", arrays, &StackParams::new(arrays.len()).axis(axis))
}

/// Split into `params.num_outputs` equal parts along `params.axis`.
#[track_caller]
pub fn split(x: &NDArray, params: SliceChannelParams) -> Result<Vec<NDArray>> {
    call("SliceChannel", &[x], &params)
}

/// The region `begin..end` (with `step`) of every axis given.
#[track_caller]
pub fn slice(x: &NDArray, params: SliceParams) -> Result<NDArray> {
    call1("slice", &[x], &params)
}

/// The range `begin..end` along one axis.
#[track_caller]
pub fn slice_axis(x: &NDArray, params: SliceAxisParams) -> Result<NDArray> {
    call1("slice_axis", &[x], &params)
}

/// Elements of `x` at `indices` along `params.axis`.
#[track_caller]
pub fn take(x: &NDArray, indices: &NDArray, params: TakeParams) -> Result<NDArray> {
    call1("take", &[x, indices], &params)
}

/// One element per position along `params.axis`, chosen by `index`.
#[track_caller]
pub fn pick(x: &NDArray, index: &NDArray, params: PickParams) -> Result<NDArray> {
    call1("pick", &[x, index], &params)
}

/// Indices as one-hot vectors of length `params.depth`.
#[track_caller]
pub fn one_hot(indices: &NDArray, params: OneHotParams) -> Result<NDArray> {
    call1("one_hot", &[indices], &params)
}

/// `x` where `condition` is non-zero, else `y` (MXNet's `where`).
#[track_caller]
pub fn where_cond(condition: &NDArray, x: &NDArray, y: &NDArray) -> Result<NDArray> {
    call1("where", &[condition, x, y], &NoParams)
}

/// Values limited to `[a_min, a_max]`.
#[track_caller]
pub fn clip(x: &NDArray, params: ClipParams) -> Result<NDArray> {
    call1("clip", &[x], &params)
}

/// Broadcast to `params.shape` (0 keeps a dimension).
#[track_caller]
pub fn broadcast_to(x: &NDArray, params: BroadcastToParams) -> Result<NDArray> {
    call1("broadcast_to", &[x], &params)
}

/// The whole array repeated `params.reps` times along each axis.
#[track_caller]
pub fn tile(x: &NDArray, params: TileParams) -> Result<NDArray> {
    call1("tile", &[x], &params)
}

/// Each element repeated `params.repeats` times along `params.axis`.
#[track_caller]
pub fn repeat(x: &NDArray, params: RepeatParams) -> Result<NDArray> {
    call1("repeat", &[x], &params)
}

/// Reverse the order along the given axes.
#[track_caller]
pub fn flip(x: &NDArray, params: FlipParams) -> Result<NDArray> {
    call1("reverse", &[x], &params)
}

/// The `k` largest (or smallest) along an axis: indices, values, a mask, or both values and
/// indices (`ret_typ = "both"`: two outputs).
#[track_caller]
pub fn topk(x: &NDArray, params: TopkParams) -> Result<Vec<NDArray>> {
    call("topk", &[x], &params)
}

/// Sorted copy along an axis.
#[track_caller]
pub fn sort(x: &NDArray, params: SortParams) -> Result<NDArray> {
    call1("sort", &[x], &params)
}

/// Indices that sort along an axis.
#[track_caller]
pub fn argsort(x: &NDArray, params: ArgsortParams) -> Result<NDArray> {
    call1("argsort", &[x], &params)
}

/// Element-wise sum of any number of arrays of one shape.
#[track_caller]
pub fn add_n(arrays: &[&NDArray]) -> Result<NDArray> {
    call1("add_n", arrays, &AddNParams::new(arrays.len()))
}

/// Zeros of `x`'s shape and dtype.
#[track_caller]
pub fn zeros_like(x: &NDArray) -> Result<NDArray> {
    call1("zeros_like", &[x], &NoParams)
}

/// Ones of `x`'s shape and dtype.
#[track_caller]
pub fn ones_like(x: &NDArray) -> Result<NDArray> {
    call1("ones_like", &[x], &NoParams)
}

/// Values from `start` to `stop` by `step` (MXNet's `arange`).
#[track_caller]
pub fn arange(params: ArangeParams) -> Result<NDArray> {
    call1("_arange", &[], &params)
}

/// Samples of U(`low`, `high`), reproducible after [`crate::random::seed`].
#[track_caller]
pub fn random_uniform(params: UniformParams) -> Result<NDArray> {
    call1("_random_uniform", &[], &params)
}

/// Samples of N(`loc`, `scale`²), reproducible after [`crate::random::seed`].
#[track_caller]
pub fn random_normal(params: NormalParams) -> Result<NDArray> {
    call1("_random_normal", &[], &params)
}

/// The elements converted to `dtype` (also [`NDArray::astype`]).
#[track_caller]
pub fn cast(x: &NDArray, dtype: DType) -> Result<NDArray> {
    call1("Cast", &[x], &CastParams::new(dtype))
}
