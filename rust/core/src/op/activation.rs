//! Activation layers: Activation, LeakyReLU (leaky, elu, selu, gelu, prelu), and the softmax
//! family (softmax, log_softmax, softmin, SoftmaxActivation), one pass per row.

use crate::op::KernelArgs;
use std::sync::Arc;

use super::grad::{Grad, InputGrads};
use super::{exactly, parallel_chunks, parallel_units, ExecContext, InOut, OpDef, Operator, SendPtr};
use crate::backend::cpu::fast_math;
use crate::base::{normalize_axis, DType, Elem, Shape};
use crate::error::Result;
use crate::graph::Entry;

crate::param_choice! {
    /// Activation's function.
    pub enum ActivationType { Relu = "relu", Sigmoid = "sigmoid", Tanh = "tanh", Softrelu = "softrelu", Softsign = "softsign" }
}

crate::op_params! {
    pub struct ActivationParams {
        /// Activation function.
        act_type: ActivationType,
    }
}

/// Activation: the element-wise operator its act_type names, under MXNet's layer name.
struct Activation {
    inner: Arc<dyn Operator>,
}

impl Operator for Activation {
    /// MXNet registers no input names for Activation (monitors call its input `input0`).
    fn declares_input_names(&self) -> bool {
        false
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.inner.infer_shape(inputs)
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        self.inner.inplace_pairs()
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        self.inner.forward(ctx, args)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        self.inner.gradient(d)
    }
    fn elementwise(&self) -> Option<super::Elementwise> {
        self.inner.elementwise()
    }
}

crate::op_params! {
    pub struct LeakyReLUParams {
        /// The rectifier.
        act_type: LeakyType = LeakyType::Leaky,
        /// Negative slope (leaky) or scale of the negative part (elu).
        slope: f64 = 0.25,
        /// Lower bound of the random slope ('rrelu').
        lower_bound: f64 = 0.125,
        /// Upper bound of the random slope ('rrelu').
        upper_bound: f64 = 0.334,
    }
}

// MXNet keeps SELU's constants as `float` for every dtype; the same rounded values make
// float32 results bit-identical to `lambda * x` computed in float32.
#[allow(clippy::excessive_precision)] // MXNet's literal, rounded to f32 as MXNet rounds it
const SELU_ALPHA: f64 = 1.673_263_242_354_377_3_f32 as f64;
#[allow(clippy::excessive_precision)]
const SELU_LAMBDA: f64 = 1.050_700_987_355_480_5_f32 as f64;

crate::param_choice! {
    /// LeakyReLU's rectifier.
    pub enum LeakyType {
        Leaky = "leaky",
        Elu = "elu",
        Selu = "selu",
        Gelu = "gelu",
        /// A learned slope per channel (the `gamma` input).
        Prelu = "prelu",
        /// Randomized leaky ReLU: while training each negative element gets a slope drawn from
        /// U(lower_bound, upper_bound); at inference the mean slope.
        Rrelu = "rrelu",
    }
}

impl LeakyType {
    #[inline(always)]
    fn value(self, x: f64, slope: f64) -> f64 {
        match self {
            LeakyType::Leaky | LeakyType::Prelu | LeakyType::Rrelu => {
                if x > 0.0 {
                    x
                } else {
                    slope * x
                }
            }
            LeakyType::Elu => {
                if x > 0.0 {
                    x
                } else {
                    slope * x.exp_m1()
                }
            }
            LeakyType::Selu => SELU_LAMBDA * if x > 0.0 { x } else { SELU_ALPHA * x.exp_m1() },
            LeakyType::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        }
    }
    #[inline(always)]
    fn derivative(self, x: f64, slope: f64) -> f64 {
        match self {
            LeakyType::Leaky | LeakyType::Prelu | LeakyType::Rrelu => {
                if x > 0.0 {
                    1.0
                } else {
                    slope
                }
            }
            LeakyType::Elu => {
                if x > 0.0 {
                    1.0
                } else {
                    slope * x.exp()
                }
            }
            LeakyType::Selu => SELU_LAMBDA * if x > 0.0 { 1.0 } else { SELU_ALPHA * x.exp() },
            LeakyType::Gelu => {
                let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
                cdf + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
            }
        }
    }
}

/// The elements `range` of data of `shape` cut where prelu's slope changes, as (channel, elements
/// relative to `range.start`): gamma has one value per channel (axis 1), or one in all (and
/// then, or without a channel axis, the range is one run of channel 0).
fn slope_runs(shape: &Shape, slopes: usize, range: std::ops::Range<usize>) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> {
    let (inner, channels) = match shape.dims() {
        [_, channels, rest @ ..] if slopes != 1 => (rest.iter().product::<usize>().max(1), (*channels).max(1)),
        _ => (usize::MAX, 1),
    };
    let (base, end) = (range.start, range.end);
    let mut at = base;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let block = at / inner;
        let run_end = (block + 1).saturating_mul(inner).min(end);
        let run = (block % channels, at - base..run_end - base);
        at = run_end;
        Some(run)
    })
}

/// Elements `run` of `values` (one of the runs [`slope_runs`] cut them into).
fn run_of<T>(values: &[T], run: std::ops::Range<usize>) -> Result<&[T]> {
    let len = values.len();
    values.get(run.clone()).ok_or_else(|| crate::err!(Runtime, "LeakyReLU: elements {run:?} of {len}"))
}

fn run_of_mut<T>(values: &mut [T], run: std::ops::Range<usize>) -> Result<&mut [T]> {
    let len = values.len();
    values.get_mut(run.clone()).ok_or_else(|| crate::err!(Runtime, "LeakyReLU: elements {run:?} of {len}"))
}

/// The slope of `channel`, or an error naming prelu's gamma.
fn slope_of(slopes: &[f64], channel: usize) -> Result<f64> {
    slopes.get(channel).copied().ok_or_else(|| crate::err!(Shape, "LeakyReLU(prelu): no slope for channel {channel} in gamma of {}", slopes.len()))
}

struct LeakyReLU {
    kind: LeakyType,
    slope: f64,
    /// rrelu's slope range.
    bounds: (f64, f64),
}

impl LeakyReLU {
    /// rrelu: out = x or slope * x, and the hidden second output holds each element's
    /// derivative (1 or its slope) for the gradient, as Dropout keeps its mask.
    fn randomized_forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (lower, upper) = self.bounds;
        let (seed, train) = (ctx.seed, ctx.is_train);
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, out, derivative) = (args.input::<T>(0)?, args.output::<T>(0)?, args.output::<T>(1)?);
            if out.len() != x.len() || derivative.len() != x.len() {
                crate::bail!(Runtime, "LeakyReLU(rrelu): {} values into outputs of {} and {}", x.len(), out.len(), derivative.len());
            }
            // Both outputs in the pieces `parallel_chunks(x.len(), PARALLEL_GRAIN, ..)` would make.
            let (n, threads) = (x.len(), crate::engine::parallel::threads());
            let piece = if n <= super::PARALLEL_GRAIN || threads <= 1 { n.max(1) } else { n.div_ceil(threads * 4).max(super::PARALLEL_GRAIN) };
            let pieces: Vec<_> = x.chunks(piece).zip(out.chunks_mut(piece)).zip(derivative.chunks_mut(piece)).enumerate().collect();
            crate::engine::parallel::map_owned(pieces, |_, (p, ((x, out), derivative))| {
                for (i, ((&x, o), d)) in (p * piece..).zip(x.iter().zip(out.iter_mut()).zip(derivative.iter_mut())) {
                    let slope = if train { lower + (upper - lower) * crate::random::uniform(seed, i as u64) } else { 0.5 * (lower + upper) };
                    let v = x.to_f64();
                    *d = T::from_f64(if v > 0.0 { 1.0 } else { slope });
                    *o = T::from_f64(if v > 0.0 { v } else { slope * v });
                }
            });
        });
        Ok(())
    }
}

impl Operator for LeakyReLU {
    fn input_names(&self) -> Vec<String> {
        if self.kind == LeakyType::Prelu {
            vec!["data".into(), "gamma".into()]
        } else {
            vec!["data".into()]
        }
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let (Some(data), Some(gamma @ None)) = (inputs.first().cloned().flatten(), inputs.get_mut(1)) {
            let channels = match data.dims() {
                [_, channels, ..] => *channels,
                _ => 1,
            };
            *gamma = Some(Shape::new(vec![channels]));
        }
        Ok(())
    }
    fn num_outputs(&self) -> usize {
        if self.kind == LeakyType::Rrelu {
            2
        } else {
            1
        }
    }
    fn num_visible_outputs(&self) -> usize {
        1
    }
    fn needs_rng(&self) -> bool {
        self.kind == LeakyType::Rrelu
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let Some((data, rest)) = inputs.split_first() else {
            crate::bail!(Shape, "LeakyReLU: the data input is missing");
        };
        if let Some(gamma) = rest.first() {
            let channels = match data.dims() {
                [_, channels, ..] => *channels,
                _ => 1,
            };
            if gamma.size() != channels && gamma.size() != 1 {
                crate::bail!(Shape, "LeakyReLU(prelu): gamma {gamma} must hold one value per channel ({channels}) of {data}");
            }
        }
        Ok(vec![data.clone(); self.num_outputs()])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        if self.kind == LeakyType::Rrelu {
            return self.randomized_forward(ctx, args);
        }
        let slopes: Vec<f64> = if args.inputs().len() > 1 { args.input_f64(1)? } else { vec![self.slope] };
        let (kind, shape) = (self.kind, args.input_shape(0)?);
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if x.len() != y.len() {
                crate::bail!(Runtime, "LeakyReLU: {} values into an output of {}", x.len(), y.len());
            }
            parallel_units(y, 1, super::PARALLEL_GRAIN, |start, piece| {
                let x = run_of(x, start..start + piece.len())?;
                for (channel, run) in slope_runs(shape, slopes.len(), start..start + piece.len()) {
                    let slope = slope_of(&slopes, channel)?;
                    let (x, y) = (run_of(x, run.clone())?, run_of_mut(piece, run)?);
                    for (y, &x) in y.iter_mut().zip(x) {
                        *y = T::from_f64(kind.value(x.to_f64(), slope));
                    }
                }
                Ok(())
            })?;
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        if self.kind == LeakyType::Rrelu {
            let derivative = d.output(1);
            return Ok(vec![Some(d.mul(&g, &derivative)?)]);
        }
        let attrs = [("act_type", self.kind.name().to_string()), ("slope", format!("{:?}", self.slope))];
        if self.kind == LeakyType::Prelu {
            let gamma = d.input(1);
            let grads = d.op_outputs("_backward_LeakyReLU", &attrs, &[&g, &x, &gamma])?;
            return Ok(grads.into_iter().map(Some).collect());
        }
        Ok(vec![Some(d.op("_backward_LeakyReLU", &attrs, &[&g, &x])?)])
    }
}

/// `_backward_LeakyReLU(grad, data[, gamma])`: the input gradient (and prelu's gamma gradient).
struct LeakyReLUBackward {
    forward: LeakyReLU,
}

impl Operator for LeakyReLUBackward {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["grad".to_string(), "data".to_string()];
        if self.forward.kind == LeakyType::Prelu {
            names.push("gamma".into());
        }
        names
    }
    fn num_outputs(&self) -> usize {
        if self.forward.kind == LeakyType::Prelu {
            2
        } else {
            1
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let Some((grad, forward_inputs)) = inputs.split_first() else {
            crate::bail!(Shape, "_backward_LeakyReLU: the output gradient is missing");
        };
        let forward_output = self.forward.infer_shape(forward_inputs)?;
        let Some(output) = forward_output.first() else {
            crate::bail!(Shape, "_backward_LeakyReLU: LeakyReLU inferred no output");
        };
        super::check_out_grad("_backward_LeakyReLU", grad, output)?;
        Ok(forward_inputs.to_vec())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let slopes: Vec<f64> = if args.inputs().len() > 2 { args.input_f64(2)? } else { vec![self.forward.slope] };
        let (kind, shape) = (self.forward.kind, args.input_shape(1)?);
        let mut gamma_grad = vec![0f64; slopes.len()];
        crate::dispatch_dtype!(args.input_dtype(1)?, T => {
            let (gv, xv, dx) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
            if gv.len() != xv.len() || dx.len() != xv.len() {
                crate::bail!(Runtime, "_backward_LeakyReLU: {} gradient and {} data values into {}", gv.len(), xv.len(), dx.len());
            }
            for (channel, run) in slope_runs(shape, slopes.len(), 0..xv.len()) {
                let slope = slope_of(&slopes, channel)?;
                let sum = gamma_grad.get_mut(channel).ok_or_else(|| crate::err!(Shape, "_backward_LeakyReLU: no gamma gradient for channel {channel}"))?;
                let (gv, xv, dx) = (run_of(gv, run.clone())?, run_of(xv, run.clone())?, run_of_mut(dx, run)?);
                for ((d, g), x) in dx.iter_mut().zip(gv).zip(xv) {
                    let (xi, gi) = (x.to_f64(), g.to_f64());
                    *d = T::from_f64(gi * kind.derivative(xi, slope));
                    if xi <= 0.0 {
                        *sum += gi * xi;
                    }
                }
            }
        });
        if args.outputs().len() > 1 {
            args.output_from_f64(1, &gamma_grad)?;
        }
        Ok(())
    }
}

crate::op_params! {
    pub struct SoftmaxParams {
        /// The axis along which to normalize.
        axis: i64 = -1,
        /// Temperature: the input is divided by it first.
        temperature: Option<f64> = None,
        /// Output dtype (only the input's dtype is supported).
        dtype: Option<DType> = None,
        /// Whether a second input gives each lane's valid length along the axis (softmax and
        /// softmin): positions past it output 0.
        use_length: bool = false,
    }
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum SoftmaxKind {
    Softmax,
    LogSoftmax,
    Softmin,
}

struct Softmax {
    kind: SoftmaxKind,
    /// Requested output dtype; only the input's own dtype is supported.
    dtype: Option<DType>,
    axis: i64,
    temperature: f64,
    /// SoftmaxActivation's 'instance' mode: each instance's features, all axes but the first.
    per_instance: bool,
    use_length: bool,
}

/// The lanes of `s` along `axis`: (axis, outer, n, inner), `outer` blocks of `n * inner` elements,
/// each lane `n` elements at stride `inner`.
fn axis_lanes(op: &str, s: &Shape, axis: i64) -> Result<(usize, usize, usize, usize)> {
    let axis = normalize_axis(axis, s.ndim())?;
    let (before, rest) = s.dims().split_at_checked(axis).unwrap_or_default();
    let [n, after @ ..] = rest else {
        crate::bail!(Shape, "{op}: axis {axis} is not an axis of {s}");
    };
    Ok((axis, before.iter().product(), *n, after.iter().product()))
}

impl Softmax {
    fn layout(&self, s: &Shape) -> Result<(usize, usize, usize, usize)> {
        if self.per_instance {
            let rows = s.dims().first().copied().unwrap_or(1);
            return Ok((1, rows, s.size() / rows.max(1), 1));
        }
        axis_lanes("softmax", s, self.axis)
    }
}

/// `kind` of every lane of input 0 into output 0, which is either the input's memory (a declared
/// in-place pair) or disjoint from it: `outer` blocks of `n * inner` elements, each lane `n`
/// elements at stride `inner`, scaled by `scale` first. Float32 rows (`inner == 1`) go through
/// the vectorized row kernel, on all threads; in place, each row is copied aside first (8 KB for
/// 2000 classes, against the output array the plan saves).
pub(super) fn softmax_lanes(args: &KernelArgs, (outer, n, inner): (usize, usize, usize), scale: f64, kind: SoftmaxKind) -> Result<()> {
    if args.input_dtype(0)? == DType::F32 && inner == 1 {
        return softmax_rows_f32(args.in_place::<f32>(0, 0)?, (outer, n), scale as f32, kind == SoftmaxKind::LogSoftmax);
    }
    softmax_each_lane(args, (outer, n, inner), scale, kind, None)
}

/// The first `len` values of `values`, or an error naming the layout they were expected to hold.
fn lanes_of<T>(values: &mut [T], len: usize, (outer, n, inner): (usize, usize, usize)) -> Result<&mut [T]> {
    let available = values.len();
    values.get_mut(..len).ok_or_else(|| crate::err!(Runtime, "softmax: {available} values for {outer} x {n} x {inner} lanes"))
}

/// [`softmax_lanes`] over contiguous float32 rows of `n` values, split over the threads in whole
/// rows.
fn softmax_rows_f32(values: InOut<'_, f32>, (outer, n): (usize, usize), scale: f32, log: bool) -> Result<()> {
    let (len, layout) = (outer * n, (outer, n, 1));
    if len == 0 {
        return Ok(());
    }
    let grain = ((1usize << 14) / n).max(1);
    match values {
        InOut::Separate(x, y) => {
            let x = x.get(..len).ok_or_else(|| crate::err!(Runtime, "softmax: {} input values for {outer} rows of {n}", x.len()))?;
            parallel_units(lanes_of(y, len, layout)?, n, grain, |first, rows| {
                let x =
                    x.get(first * n..first * n + rows.len()).ok_or_else(|| crate::err!(Runtime, "softmax: rows from {first} lie past the input"))?;
                for (x, y) in x.chunks_exact(n).zip(rows.chunks_exact_mut(n)) {
                    softmax_row_f32(x, y, scale, log);
                }
                Ok(())
            })
        }
        InOut::Same(y) => parallel_units(lanes_of(y, len, layout)?, n, grain, |_, rows| {
            let mut aside = vec![0f32; n];
            for y in rows.chunks_exact_mut(n) {
                aside.copy_from_slice(y);
                softmax_row_f32(&aside, y, scale, log);
            }
            Ok(())
        }),
    }
}

/// Lane by lane, for any dtype and stride: `kind` of the first `lengths[lane]` values of each lane
/// of input 0 (all `n` without `lengths`, which the caller has checked to be whole numbers up to
/// `n`), zeros after them, into output 0, which is the input's memory or disjoint from it.
fn softmax_each_lane(args: &KernelArgs, layout: (usize, usize, usize), scale: f64, kind: SoftmaxKind, lengths: Option<&[f64]>) -> Result<()> {
    let (outer, n, inner) = layout;
    let (lanes, len) = (outer * inner, outer * n * inner);
    if let Some(lengths) = lengths.filter(|l| l.len() != lanes) {
        crate::bail!(Shape, "softmax: {} lengths for {lanes} lanes", lengths.len());
    }
    crate::dispatch_dtype!(args.input_dtype(0)?, T => {
        // Lanes interleave at stride `inner`, so the threads' lanes are not slices of their own:
        // each task reads and writes its lanes through pointers into the checked arrays.
        let (x, y): (*const T, *mut T) = match args.in_place::<T>(0, 0)? {
            InOut::Separate(x, y) => {
                if x.len() < len {
                    crate::bail!(Runtime, "softmax: {} input values for {outer} x {n} x {inner} lanes", x.len());
                }
                (x.as_ptr(), lanes_of(y, len, layout)?.as_mut_ptr())
            }
            InOut::Same(y) => {
                let y = lanes_of(y, len, layout)?.as_mut_ptr();
                (y.cast_const(), y)
            }
        };
        let (xp, yp) = (SendPtr(x.cast_mut()), SendPtr(y));
        parallel_chunks(lanes, ((1usize << 14) / n.max(1)).max(1), |task_lanes| {
            for lane in task_lanes {
                let (o, j) = (lane / inner, lane % inner);
                let start = o * n * inner + j;
                let valid = lengths.and_then(|lengths| lengths.get(lane)).map_or(n, |&l| (l as usize).min(n));
                // SAFETY: both arrays hold at least `len` = outer * n * inner elements (checked
                // above, before the threads start), and lane (o, j), o < outer and j < inner,
                // spans the n elements start + k * inner < (o + 1) * n * inner <= len; valid <= n.
                // Lanes are disjoint and this task alone owns this one; in place, x is y and
                // `softmax_lane` reads each element before writing it.
                unsafe {
                    softmax_lane::<T>(xp.get().add(start), yp.get().add(start), valid, inner, scale, kind);
                    for k in valid..n {
                        *yp.get().add(start + k * inner) = T::default();
                    }
                }
            }
        });
    });
    Ok(())
}

/// Softmax (or log-softmax) of one contiguous float32 row: a vectorized max, exponentials with
/// sixteen running sums, one scaling pass; compiled for the CPU's widest vectors.
fn softmax_row_f32(x: &[f32], y: &mut [f32], scale: f32, log: bool) {
    crate::backend::cpu::simd::vectorized(
        #[inline(always)]
        || softmax_row_f32_body(x, y, scale, log),
    )
}

/// Independent accumulators per row: one AVX-512 register (two AVX2 ones).
const LANES: usize = 16;

#[inline(always)]
fn softmax_row_f32_body(x: &[f32], y: &mut [f32], scale: f32, log: bool) {
    // Whole chunks of LANES values in fixed-size arrays keep the accumulators in registers; the
    // comparison form of max ignores NaN as f32::max does (a NaN still reaches every output
    // through its exponential) without f32::max's extra NaN test per lane.
    // `y` is as long as `x` (both are rows of one layout), so their blocks and tails pair up.
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let (blocks, tail) = x.as_chunks::<LANES>();
    for block in blocks {
        for (lane, &v) in lanes.iter_mut().zip(block) {
            *lane = larger(*lane, v * scale);
        }
    }
    let max = tail.iter().fold(lanes.into_iter().fold(f32::NEG_INFINITY, larger), |m, &v| larger(m, v * scale));
    let mut sums = [0f32; LANES];
    let exp_at = |v: f32| fast_math::exp_f32(v * scale - max);
    if log {
        for block in blocks {
            for (sum, &v) in sums.iter_mut().zip(block) {
                *sum += exp_at(v);
            }
        }
        let total = sums.iter().sum::<f32>() + tail.iter().map(|&v| exp_at(v)).sum::<f32>();
        let log_sum = total.ln() + max;
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v * scale - log_sum;
        }
        return;
    }
    let (out_blocks, out_tail) = y.as_chunks_mut::<LANES>();
    for (oc, xc) in out_blocks.iter_mut().zip(blocks) {
        for ((o, sum), &v) in oc.iter_mut().zip(sums.iter_mut()).zip(xc) {
            let e = exp_at(v);
            *o = e;
            *sum += e;
        }
    }
    let mut total = sums.iter().sum::<f32>();
    for (o, &v) in out_tail.iter_mut().zip(tail) {
        *o = exp_at(v);
        total += *o;
    }
    let inv = 1.0 / total;
    for o in y.iter_mut() {
        *o *= inv;
    }
}

/// Softmax of one lane of `n` values at `stride`, written the same way (one read for the max,
/// one pass for the exponentials and their sum, one scaling pass). `y` may equal `x`: each
/// element is read before it is written, and never read from `x` after that.
///
/// # Safety
/// `x` and `y` point at lanes of `n` elements `stride` apart, `x`'s readable and `y`'s writable,
/// that nothing else reaches meanwhile; the two are the same lane or do not overlap.
#[inline]
unsafe fn softmax_lane<T: Elem>(x: *const T, y: *mut T, n: usize, stride: usize, scale: f64, kind: SoftmaxKind) {
    if n == 0 {
        return;
    }
    // SAFETY (all pointer reads/writes below): k < n, so every element lies in the lanes the
    // caller vouches for.
    let at = |k: usize| unsafe { (*x.add(k * stride)).to_f64() * scale };
    let mut max = f64::NEG_INFINITY;
    for k in 0..n {
        max = max.max(at(k));
    }
    let mut sum = 0.0;
    for k in 0..n {
        let e = (at(k) - max).exp();
        sum += e;
        if kind != SoftmaxKind::LogSoftmax {
            unsafe { *y.add(k * stride) = T::from_f64(e) };
        }
    }
    if kind == SoftmaxKind::LogSoftmax {
        let log_sum = sum.ln() + max;
        for k in 0..n {
            unsafe { *y.add(k * stride) = T::from_f64(at(k) - log_sum) };
        }
    } else {
        let inv = 1.0 / sum;
        for k in 0..n {
            unsafe { *y.add(k * stride) = T::from_f64((*y.add(k * stride)).to_f64() * inv) };
        }
    }
}

impl Softmax {
    /// Softmax over the first `length` positions of every lane, zeros after them.
    fn forward_with_lengths(&self, args: &KernelArgs, scale: f64) -> Result<()> {
        let (_, outer, n, inner) = self.layout(args.input_shape(0)?)?;
        let lengths = args.input_f64(1)?;
        if let Some(bad) = lengths.iter().find(|&&l| !(0.0..=n as f64).contains(&l) || l.fract() != 0.0) {
            crate::bail!(Value, "softmax: length {bad} is not a whole number in [0, {n}]");
        }
        softmax_each_lane(args, (outer, n, inner), scale, self.kind, Some(&lengths))
    }
}

impl Operator for Softmax {
    fn input_names(&self) -> Vec<String> {
        if self.use_length {
            vec!["data".into(), "length".into()]
        } else {
            vec!["data".into()]
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let Some((data, rest)) = inputs.split_first() else {
            crate::bail!(Shape, "softmax: the data input is missing");
        };
        let (axis, ..) = self.layout(data)?;
        if let Some(length) = rest.first() {
            let expected: Vec<usize> = data.dims().iter().enumerate().filter(|&(a, _)| a != axis).map(|(_, &d)| d).collect();
            if length.dims() != expected {
                crate::bail!(Shape, "softmax: length has shape {length}, expected {} (data {data} without axis {axis})", Shape::new(expected));
            }
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&data) = inputs.first() else {
            crate::bail!(Type, "softmax: the data input is missing");
        };
        match self.dtype {
            Some(d) if d != data => crate::bail!(Type, "softmax: dtype={d} differs from the input's {data}; cast the input instead"),
            _ => Ok(vec![data]),
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let scale = if self.kind == SoftmaxKind::Softmin { -1.0 } else { 1.0 } / self.temperature;
        if self.use_length {
            return self.forward_with_lengths(args, scale);
        }
        let (_, outer, n, inner) = self.layout(args.input_shape(0)?)?;
        softmax_lanes(args, (outer, n, inner), scale, self.kind)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[super::Tensor], outputs: &[super::Tensor]) -> Result<()> {
        if self.use_length {
            crate::bail!(Device, "softmax with use_length has no GPU kernel yet (it runs on cpu contexts)");
        }
        let ([x], [y]) = (exactly("softmax", "input", inputs)?, exactly("softmax", "output", outputs)?);
        let (_, outer, n, inner) = self.layout(&x.shape)?;
        let scale = if self.kind == SoftmaxKind::Softmin { -1.0 } else { 1.0 } / self.temperature;
        let lanes = crate::backend::cuda::kernels::Lanes { outer, n, inner };
        crate::backend::cuda::kernels::softmax(gpu, lanes, scale, self.kind == SoftmaxKind::LogSoftmax, x, y)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (y, g) = (d.output(0), d.out_grad(0));
        let keep = if self.per_instance {
            vec![("axis", "(0,)".to_string()), ("exclude", "True".to_string()), ("keepdims", "True".to_string())]
        } else {
            vec![("axis", format!("({},)", self.axis)), ("keepdims", "True".to_string())]
        };
        let dx = match self.kind {
            _ if !self.per_instance => {
                let name = if self.kind == SoftmaxKind::LogSoftmax { "_backward_log_softmax" } else { "_backward_softmax" };
                d.op(name, &[("axis", self.axis.to_string())], &[&g, &y])?
            }
            SoftmaxKind::LogSoftmax => {
                let total = d.op("sum", &keep, &[&g])?;
                let p = d.unary("exp", &y)?;
                let spread = d.binary("broadcast_mul", &p, &total)?;
                d.binary("elemwise_sub", &g, &spread)?
            }
            _ => {
                let gy = d.mul(&g, &y)?;
                let total = d.op("sum", &keep, &[&gy])?;
                let centered = d.binary("broadcast_sub", &g, &total)?;
                d.mul(&y, &centered)?
            }
        };
        let factor = if self.kind == SoftmaxKind::Softmin { -1.0 } else { 1.0 } / self.temperature;
        let dx: Entry = if factor == 1.0 { dx } else { d.scalar("_mul_scalar", &dx, factor)? };
        // Masked positions output 0, so the softmax gradient (a multiple of y) is 0 there too.
        let mut grads = vec![Some(dx)];
        if self.use_length {
            grads.push(None);
        }
        Ok(grads)
    }
}

crate::op_params! {
    pub struct SoftmaxBackwardParams {
        /// The axis the forward pass normalized along.
        axis: i64 = -1,
    }
}

/// The gradient of softmax (`dx = y * (g - sum(g * y))`) or log-softmax
/// (`dx = g - exp(y) * sum(g)`) from the output gradient `g` and the output `y`, in one pass
/// per row with no temporaries (temperature and softmin's sign are applied by the caller).
struct SoftmaxBackward {
    axis: i64,
    log: bool,
}

/// The `n` values of the lane of `values` from `start` at stride `inner`, as f64 (callers check
/// that the lane lies inside `values`; past its end it yields fewer).
#[inline(always)]
fn lane_values<T: Elem>(values: &[T], start: usize, inner: usize, n: usize) -> impl Iterator<Item = f64> + '_ {
    values.get(start..).unwrap_or_default().iter().step_by(inner.max(1)).take(n).map(|v| v.to_f64())
}

/// One contiguous float32 row of the softmax gradient: the row sum, then one write pass.
fn softmax_backward_row_f32(g: &[f32], y: &[f32], dx: &mut [f32], log: bool) {
    crate::backend::cpu::simd::vectorized(
        #[inline(always)]
        || softmax_backward_row_body(g, y, dx, log),
    )
}

#[inline(always)]
fn softmax_backward_row_body(g: &[f32], y: &[f32], dx: &mut [f32], log: bool) {
    // Running sums in lanes, so that the reduction vectorizes.
    let mut sums = [0f32; LANES];
    for (gc, yc) in g.chunks(LANES).zip(y.chunks(LANES)) {
        for ((s, &gv), &yv) in sums.iter_mut().zip(gc).zip(yc) {
            *s += if log { gv } else { gv * yv };
        }
    }
    let total: f32 = sums.iter().sum();
    for ((d, &gv), &yv) in dx.iter_mut().zip(g).zip(y) {
        *d = if log { gv - fast_math::exp_f32(yv) * total } else { yv * (gv - total) };
    }
}

impl Operator for SoftmaxBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["ograd".into(), "output".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [ograd, output] = exactly("softmax gradient", "input", inputs)?;
        if ograd != output {
            crate::bail!(Shape, "softmax gradient: ograd has shape {ograd}, the output {output}");
        }
        normalize_axis(self.axis, ograd.ndim())?;
        Ok(vec![ograd.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (_, outer, n, inner) = axis_lanes("softmax gradient", args.input_shape(0)?, self.axis)?;
        let (log, len) = (self.log, outer * n * inner);
        if len == 0 {
            return Ok(());
        }
        let grain = ((1usize << 14) / n).max(1);
        let short = |what: &str, values: usize| crate::err!(Runtime, "softmax gradient: {values} {what} values for {outer} x {n} x {inner} lanes");
        if args.input_dtype(0)? == DType::F32 && inner == 1 {
            let (g, y, dx) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(0)?);
            let (g, y) = (g.get(..len).ok_or_else(|| short("ograd", g.len()))?, y.get(..len).ok_or_else(|| short("output", y.len()))?);
            let dx_len = dx.len();
            let dx = dx.get_mut(..len).ok_or_else(|| short("gradient", dx_len))?;
            return parallel_units(dx, n, grain, |first, rows| {
                let span = first * n..first * n + rows.len();
                let (g, y) = (g.get(span.clone()).ok_or_else(|| short("ograd", g.len()))?, y.get(span).ok_or_else(|| short("output", y.len()))?);
                for ((g, y), dx) in g.chunks_exact(n).zip(y.chunks_exact(n)).zip(rows.chunks_exact_mut(n)) {
                    softmax_backward_row_f32(g, y, dx, log);
                }
                Ok(())
            });
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (g, y, dx) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
            if g.len() < len || y.len() < len || dx.len() < len {
                crate::bail!(Runtime, "softmax gradient: {}, {} and {} values for {outer} x {n} x {inner} lanes", g.len(), y.len(), dx.len());
            }
            // Lanes interleave at stride `inner`: each task writes its lanes of dx through a
            // pointer into it (the inputs are read as slices).
            let dp = SendPtr(dx.as_mut_ptr());
            parallel_chunks(outer * inner, grain, |lanes| {
                for lane in lanes {
                    let start = (lane / inner) * n * inner + lane % inner;
                    let lane_of = |values| lane_values(values, start, inner, n);
                    let total: f64 = if log { lane_of(g).sum() } else { lane_of(g).zip(lane_of(y)).map(|(gv, yv)| gv * yv).sum() };
                    for (k, (gv, yv)) in lane_of(g).zip(lane_of(y)).enumerate() {
                        let v = if log { gv - yv.exp() * total } else { yv * (gv - total) };
                        // SAFETY: dx holds at least len = outer * n * inner elements (checked
                        // above, before the threads start); lane (o, j), o < outer and j < inner,
                        // spans start + k * inner < (o + 1) * n * inner <= len for k < n (the
                        // lanes of g and y yield at most n values). This task alone owns the lane.
                        unsafe { *dp.get().add(start + k * inner) = T::from_f64(v) };
                    }
                }
            });
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[super::Tensor], outputs: &[super::Tensor]) -> Result<()> {
        let ([g, y], [dx]) = (exactly("softmax gradient", "input", inputs)?, exactly("softmax gradient", "output", outputs)?);
        let (_, outer, n, inner) = axis_lanes("softmax gradient", &g.shape, self.axis)?;
        let lanes = crate::backend::cuda::kernels::Lanes { outer, n, inner };
        crate::backend::cuda::kernels::softmax_backward(gpu, lanes, self.log, g, y, dx)
    }
    /// Second-order gradients from the head gradient h: log-softmax gives
    /// `(h - sum(h e), -h e sum(g))` with e = exp(y); softmax gives
    /// `(y (h - sum(h y)), h (g - sum(g y)) - g sum(h y))`.
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, y, h) = (d.input(0), d.input(1), d.out_grad(0));
        let keep = [("axis", format!("({},)", self.axis)), ("keepdims", "True".to_string())];
        if self.log {
            let e = d.unary("exp", &y)?;
            let he = d.mul(&h, &e)?;
            let he_sum = d.op("sum", &keep, &[&he])?;
            let dg = d.binary("broadcast_sub", &h, &he_sum)?;
            let g_sum = d.op("sum", &keep, &[&g])?;
            let scaled = d.binary("broadcast_mul", &he, &g_sum)?;
            let dy = d.unary("negative", &scaled)?;
            return Ok(vec![Some(dg), Some(dy)]);
        }
        let hy = d.mul(&h, &y)?;
        let hy_sum = d.op("sum", &keep, &[&hy])?;
        let centered_h = d.binary("broadcast_sub", &h, &hy_sum)?;
        let dg = d.mul(&y, &centered_h)?;
        let gy = d.mul(&g, &y)?;
        let gy_sum = d.op("sum", &keep, &[&gy])?;
        let centered_g = d.binary("broadcast_sub", &g, &gy_sum)?;
        let first = d.mul(&h, &centered_g)?;
        let second = d.binary("broadcast_mul", &g, &hy_sum)?;
        let dy = d.binary("elemwise_sub", &first, &second)?;
        Ok(vec![Some(dg), Some(dy)])
    }
}

crate::param_choice! {
    /// What SoftmaxActivation normalizes over.
    pub enum SoftmaxActivationMode {
        /// Each row over all its features.
        Instance = "instance",
        /// Axis 1.
        Channel = "channel",
    }
}

crate::op_params! {
    pub struct SoftmaxActivationParams {
        /// What is normalized together.
        mode: SoftmaxActivationMode = SoftmaxActivationMode::Instance,
    }
}

fn leaky_relu(p: LeakyReLUParams) -> Result<LeakyReLU> {
    let kind = p.act_type;
    if kind == LeakyType::Rrelu && !(p.lower_bound <= p.upper_bound) {
        crate::bail!(Param, "LeakyReLU(rrelu): lower_bound {} must not exceed upper_bound {}", p.lower_bound, p.upper_bound);
    }
    Ok(LeakyReLU { kind, slope: p.slope, bounds: (p.lower_bound, p.upper_bound) })
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "Activation",
        &[],
        "Applies an activation function element-wise: relu, sigmoid, tanh, softrelu or softsign.",
        |p: ActivationParams| {
            let unary = match p.act_type {
                ActivationType::Relu => "relu",
                ActivationType::Sigmoid => "sigmoid",
                ActivationType::Tanh => "tanh",
                ActivationType::Softrelu => "_softrelu",
                ActivationType::Softsign => "softsign",
            };
            Ok(Activation { inner: super::lookup(unary)?.instantiate(unary, &Default::default())? })
        },
    ));
    add(OpDef::new(
        "LeakyReLU",
        &[],
        "LeakyType rectified linear units and variants: leaky, elu, selu, gelu, prelu (gamma per channel), rrelu (random slopes while training).",
        leaky_relu,
    ));
    add(OpDef::new("_backward_LeakyReLU", &[], "Gradient of LeakyReLU.", |p: LeakyReLUParams| Ok(LeakyReLUBackward { forward: leaky_relu(p)? })));
    let softmax = |kind: SoftmaxKind| {
        move |p: SoftmaxParams| {
            if p.use_length && kind == SoftmaxKind::LogSoftmax {
                crate::bail!(Param, "log_softmax: use_length is not supported (as in MXNet); use softmax with use_length");
            }
            let temperature = p.temperature.unwrap_or(1.0);
            if temperature == 0.0 {
                crate::bail!(Param, "softmax: temperature must be non-zero");
            }
            Ok(Softmax { kind, dtype: p.dtype, axis: p.axis, temperature, per_instance: false, use_length: p.use_length })
        }
    };
    add(OpDef::new("softmax", &[], "Applies the softmax function along an axis (one pass per row).", softmax(SoftmaxKind::Softmax)));
    add(OpDef::new("log_softmax", &[], "Computes the log of the softmax along an axis.", softmax(SoftmaxKind::LogSoftmax)));
    add(OpDef::new("_backward_softmax", &[], "Gradient of softmax from its output gradient and output.", |p: SoftmaxBackwardParams| {
        Ok(SoftmaxBackward { axis: p.axis, log: false })
    }));
    add(OpDef::new("_backward_log_softmax", &[], "Gradient of log_softmax from its output gradient and output.", |p: SoftmaxBackwardParams| {
        Ok(SoftmaxBackward { axis: p.axis, log: true })
    }));
    add(OpDef::new("softmin", &[], "Applies the softmin function (softmax of the negated input) along an axis.", softmax(SoftmaxKind::Softmin)));
    add(OpDef::new(
        "SoftmaxActivation",
        &[],
        "Softmax over each instance (mode='instance') or over channels (mode='channel').",
        |p: SoftmaxActivationParams| {
            let per_instance = p.mode == SoftmaxActivationMode::Instance;
            Ok(Softmax { kind: SoftmaxKind::Softmax, dtype: None, axis: 1, temperature: 1.0, per_instance, use_length: false })
        },
    ));
}
