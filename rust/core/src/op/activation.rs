//! Activation layers: Activation, LeakyReLU (leaky, elu, selu, gelu, prelu), and the softmax
//! family (softmax, log_softmax, softmin, SoftmaxActivation), one pass per row.

use crate::op::KernelArgs;
use std::sync::Arc;

use super::grad::{Grad, InputGrads};
use super::{fast_math, parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor};
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

/// The per-element slope of prelu: gamma has one value per channel (axis 1), or one in all.
fn channel_of(i: usize, shape: &Shape, gamma_len: usize) -> usize {
    if gamma_len == 1 || shape.ndim() < 2 {
        return 0;
    }
    let inner: usize = shape.dims()[2..].iter().product();
    (i / inner.max(1)) % shape[1]
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
    fn randomized_forward(&self, ctx: &ExecContext, x: &Tensor, out: &Tensor, derivative: &Tensor) {
        let (lower, upper) = self.bounds;
        let (seed, train) = (ctx.seed, ctx.is_train);
        crate::dispatch_dtype!(x.dtype, T => {
            let (xp, op, dp) = (SendPtr(x.ptr::<T>()), SendPtr(out.ptr::<T>()), SendPtr(derivative.ptr::<T>()));
            parallel_chunks(x.size(), super::PARALLEL_GRAIN, |range| {
                for i in range {
                    let slope = if train { lower + (upper - lower) * crate::random::uniform(seed, i as u64) } else { 0.5 * (lower + upper) };
                    // SAFETY: i < size; both outputs are ours (out may alias x element-wise).
                    unsafe {
                        let v = (*xp.get().add(i)).to_f64();
                        *dp.get().add(i) = T::from_f64(if v > 0.0 { 1.0 } else { slope });
                        *op.get().add(i) = T::from_f64(if v > 0.0 { v } else { slope * v });
                    }
                }
            });
        });
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
        if let (Some(data), Some(gamma @ None)) = (inputs[0].clone(), inputs.get_mut(1)) {
            *gamma = Some(Shape::new(vec![if data.ndim() >= 2 { data[1] } else { 1 }]));
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
        if let Some(gamma) = inputs.get(1) {
            let channels = if inputs[0].ndim() >= 2 { inputs[0][1] } else { 1 };
            if gamma.size() != channels && gamma.size() != 1 {
                crate::bail!(Shape, "LeakyReLU(prelu): gamma {gamma} must hold one value per channel ({channels}) of {}", inputs[0]);
            }
        }
        Ok(vec![inputs[0].clone(); self.num_outputs()])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (x, out) = (&inputs[0], &outputs[0]);
        if self.kind == LeakyType::Rrelu {
            self.randomized_forward(ctx, x, out, &outputs[1]);
            return Ok(());
        }
        let slopes: Vec<f64> = match inputs.get(1) {
            Some(gamma) => crate::dispatch_dtype!(gamma.dtype, T => {
                // SAFETY: gamma is an input this op does not write.
                unsafe { gamma.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
            }),
            None => vec![self.slope],
        };
        let (kind, shape) = (self.kind, x.shape.clone());
        crate::dispatch_dtype!(x.dtype, T => {
            let (xp, op) = (SendPtr(x.ptr::<T>()), SendPtr(out.ptr::<T>()));
            parallel_chunks(x.size(), super::PARALLEL_GRAIN, |range| {
                for i in range {
                    let slope = slopes[channel_of(i, &shape, slopes.len())];
                    // SAFETY: i < size; the output is ours (and may alias x element-wise).
                    unsafe { *op.get().add(i) = T::from_f64(kind.value((*xp.get().add(i)).to_f64(), slope)) };
                }
            });
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
        let forward_output = self.forward.infer_shape(&inputs[1..])?;
        super::check_out_grad("_backward_LeakyReLU", &inputs[0], &forward_output[0])?;
        Ok(inputs[1..].to_vec())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, x) = (&inputs[0], &inputs[1]);
        let slopes: Vec<f64> = match inputs.get(2) {
            Some(gamma) => crate::dispatch_dtype!(gamma.dtype, T => {
                // SAFETY: gamma is an input this op does not write.
                unsafe { gamma.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
            }),
            None => vec![self.forward.slope],
        };
        let kind = self.forward.kind;
        let mut gamma_grad = vec![0f64; slopes.len()];
        crate::dispatch_dtype!(x.dtype, T => {
            // SAFETY: grad and data are inputs; the first output is this op's alone.
            let (gv, xv, dx) = unsafe { (g.slice::<T>(), x.slice::<T>(), outputs[0].slice_mut::<T>()) };
            for i in 0..xv.len() {
                let c = channel_of(i, &x.shape, slopes.len());
                let (xi, gi) = (xv[i].to_f64(), gv[i].to_f64());
                dx[i] = T::from_f64(gi * kind.derivative(xi, slopes[c]));
                if xi <= 0.0 {
                    gamma_grad[c] += gi * xi;
                }
            }
        });
        if let Some(dgamma) = outputs.get(1) {
            crate::dispatch_dtype!(dgamma.dtype, T => {
                // SAFETY: the second output is this op's alone.
                let o = unsafe { dgamma.slice_mut::<T>() };
                o.iter_mut().zip(&gamma_grad).for_each(|(v, &s)| *v = T::from_f64(s));
            });
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

impl Softmax {
    fn layout(&self, s: &Shape) -> Result<(usize, usize, usize, usize)> {
        if self.per_instance {
            let rows = s.dims().first().copied().unwrap_or(1);
            return Ok((1, rows, s.size() / rows.max(1), 1));
        }
        let axis = normalize_axis(self.axis, s.ndim())?;
        let d = s.dims();
        Ok((axis, d[..axis].iter().product(), d[axis], d[axis + 1..].iter().product()))
    }
}

/// `kind` of every lane of `x` into `y`, which is either all of `x` (in place) or disjoint from
/// it: `outer` blocks of `n * inner` elements, each lane `n` elements at stride `inner`, scaled by
/// `scale` first. Float32 rows (`inner == 1`) go through the vectorized row kernel, on all
/// threads; in place, each row is copied aside first (8 KB for 2000 classes, against the output
/// array the plan saves).
pub(super) fn softmax_lanes(x: &Tensor, y: &Tensor, (outer, n, inner): (usize, usize, usize), scale: f64, kind: SoftmaxKind) {
    if x.dtype == DType::F32 && inner == 1 {
        let (xp, yp) = (SendPtr(x.ptr::<f32>()), SendPtr(y.ptr::<f32>()));
        let in_place = x.raw() == y.raw();
        parallel_chunks(outer, ((1usize << 14) / n.max(1)).max(1), |rows| {
            let mut aside = if in_place { vec![0f32; n] } else { Vec::new() };
            for row in rows {
                // SAFETY: row `row` spans n contiguous elements inside both arrays and this task
                // alone writes it; in place, the row is read through this very slice (into
                // `aside`), so no shared slice ever overlaps it.
                let y = unsafe { std::slice::from_raw_parts_mut(yp.get().add(row * n), n) };
                let x: &[f32] = if in_place {
                    aside.copy_from_slice(y);
                    &aside
                } else {
                    // SAFETY: out of place, x and y are disjoint (the caller's contract).
                    unsafe { std::slice::from_raw_parts(xp.get().add(row * n), n) }
                };
                softmax_row_f32(x, y, scale as f32, kind == SoftmaxKind::LogSoftmax);
            }
        });
        return;
    }
    softmax_each_lane(x, y, (outer, n, inner), scale, kind, None);
}

/// Lane by lane, for any dtype and stride: `kind` of the first `lengths[lane]` values of each lane
/// (all `n` without `lengths`, which the caller has checked to be whole numbers up to `n`), zeros
/// after them. `y` is all of `x` or disjoint from it.
fn softmax_each_lane(x: &Tensor, y: &Tensor, (outer, n, inner): (usize, usize, usize), scale: f64, kind: SoftmaxKind, lengths: Option<&[f64]>) {
    crate::dispatch_dtype!(x.dtype, T => {
        let (xp, yp) = (SendPtr(x.ptr::<T>()), SendPtr(y.ptr::<T>()));
        parallel_chunks(outer * inner, ((1usize << 14) / n.max(1)).max(1), |lanes| {
            for lane in lanes {
                let (o, j) = (lane / inner, lane % inner);
                let start = o * n * inner + j;
                let valid = lengths.map_or(n, |lengths| lengths[lane] as usize);
                // SAFETY: lane (o, j) spans n elements at stride inner, inside both arrays, and
                // valid <= n.
                unsafe {
                    softmax_lane::<T>(xp.get().add(start), yp.get().add(start), valid, inner, scale, kind);
                    for k in valid..n {
                        *yp.get().add(start + k * inner) = T::default();
                    }
                }
            }
        });
    });
}

/// Softmax (or log-softmax) of one contiguous float32 row: a vectorized max, exponentials with
/// sixteen running sums, one scaling pass; compiled for the CPU's widest vectors.
fn softmax_row_f32(x: &[f32], y: &mut [f32], scale: f32, log: bool) {
    super::simd::vectorized(
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
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().expect("chunks_exact yields LANES values");
        for l in 0..LANES {
            lanes[l] = larger(lanes[l], c[l] * scale);
        }
    }
    let max = tail.iter().fold(lanes.into_iter().fold(f32::NEG_INFINITY, larger), |m, &v| larger(m, v * scale));
    let mut sums = [0f32; LANES];
    let split = x.len() - tail.len();
    let exp_at = |v: f32| fast_math::exp_f32(v * scale - max);
    if log {
        for c in x.chunks_exact(LANES) {
            let c: &[f32; LANES] = c.try_into().expect("chunks_exact yields LANES values");
            for l in 0..LANES {
                sums[l] += exp_at(c[l]);
            }
        }
        let total = sums.iter().sum::<f32>() + tail.iter().map(|&v| exp_at(v)).sum::<f32>();
        let log_sum = total.ln() + max;
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v * scale - log_sum;
        }
        return;
    }
    for (oc, xc) in y[..split].chunks_exact_mut(LANES).zip(x.chunks_exact(LANES)) {
        let (oc, xc): (&mut [f32; LANES], &[f32; LANES]) =
            (oc.try_into().expect("chunks_exact yields LANES values"), xc.try_into().expect("chunks_exact yields LANES values"));
        for l in 0..LANES {
            let e = exp_at(xc[l]);
            oc[l] = e;
            sums[l] += e;
        }
    }
    let mut total = sums.iter().sum::<f32>();
    for (o, &v) in y[split..].iter_mut().zip(tail) {
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
#[inline]
fn softmax_lane<T: Elem>(x: *const T, y: *mut T, n: usize, stride: usize, scale: f64, kind: SoftmaxKind) {
    if n == 0 {
        return;
    }
    // SAFETY (all pointer reads/writes below): the caller passes a lane of n elements at `stride`
    // inside the input and output.
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
    fn forward_with_lengths(&self, x: &Tensor, lengths: &Tensor, y: &Tensor, scale: f64) -> Result<()> {
        let (_, outer, n, inner) = self.layout(&x.shape)?;
        let lengths = super::normalization::to_f64(lengths);
        if let Some(bad) = lengths.iter().find(|&&l| !(0.0..=n as f64).contains(&l) || l.fract() != 0.0) {
            crate::bail!(Value, "softmax: length {bad} is not a whole number in [0, {n}]");
        }
        softmax_each_lane(x, y, (outer, n, inner), scale, self.kind, Some(&lengths));
        Ok(())
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
        let (axis, ..) = self.layout(&inputs[0])?;
        if let Some(length) = inputs.get(1) {
            let mut expected = inputs[0].dims().to_vec();
            expected.remove(axis);
            if length.dims() != expected {
                crate::bail!(Shape, "softmax: length has shape {length}, expected {} (data {} without axis {axis})", Shape::new(expected), inputs[0]);
            }
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        match self.dtype {
            Some(d) if d != inputs[0] => crate::bail!(Type, "softmax: dtype={d} differs from the input's {}; cast the input instead", inputs[0]),
            _ => Ok(vec![inputs[0]]),
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (_, outer, n, inner) = self.layout(&inputs[0].shape)?;
        let scale = if self.kind == SoftmaxKind::Softmin { -1.0 } else { 1.0 } / self.temperature;
        if self.use_length {
            return self.forward_with_lengths(&inputs[0], &inputs[1], &outputs[0], scale);
        }
        softmax_lanes(&inputs[0], &outputs[0], (outer, n, inner), scale, self.kind);
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        if self.use_length {
            crate::bail!(Device, "softmax with use_length has no GPU kernel yet (it runs on cpu contexts)");
        }
        let (_, outer, n, inner) = self.layout(&inputs[0].shape)?;
        let scale = if self.kind == SoftmaxKind::Softmin { -1.0 } else { 1.0 } / self.temperature;
        let lanes = crate::backend::cuda::kernels::Lanes { outer, n, inner };
        crate::backend::cuda::kernels::softmax(gpu, lanes, scale, self.kind == SoftmaxKind::LogSoftmax, &inputs[0], &outputs[0])
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

/// One contiguous float32 row of the softmax gradient: the row sum, then one write pass.
fn softmax_backward_row_f32(g: &[f32], y: &[f32], dx: &mut [f32], log: bool) {
    super::simd::vectorized(
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
        if inputs[0] != inputs[1] {
            crate::bail!(Shape, "softmax gradient: ograd has shape {}, the output {}", inputs[0], inputs[1]);
        }
        normalize_axis(self.axis, inputs[0].ndim())?;
        Ok(vec![inputs[0].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let shape = &inputs[0].shape;
        let axis = normalize_axis(self.axis, shape.ndim())?;
        let d = shape.dims();
        let (outer, n, inner) = (d[..axis].iter().product::<usize>(), d[axis], d[axis + 1..].iter().product::<usize>());
        let log = self.log;
        let grain = ((1usize << 14) / n.max(1)).max(1);
        if inputs[0].dtype == DType::F32 && inner == 1 {
            let (gp, yp, dp) = (SendPtr(inputs[0].ptr::<f32>()), SendPtr(inputs[1].ptr::<f32>()), SendPtr(outputs[0].ptr::<f32>()));
            parallel_chunks(outer, grain, |rows| {
                for row in rows {
                    // SAFETY: row `row` spans n contiguous elements of each array; this task owns
                    // its output row; the output aliases no input (no in-place pair).
                    let (g, y, dx) = unsafe {
                        (
                            std::slice::from_raw_parts(gp.get().add(row * n), n),
                            std::slice::from_raw_parts(yp.get().add(row * n), n),
                            std::slice::from_raw_parts_mut(dp.get().add(row * n), n),
                        )
                    };
                    softmax_backward_row_f32(g, y, dx, log);
                }
            });
            return Ok(());
        }
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (gp, yp, dp) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(inputs[1].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            parallel_chunks(outer * inner, grain, |lanes| {
                for lane in lanes {
                    let start = (lane / inner) * n * inner + lane % inner;
                    // SAFETY: lane `lane` spans n elements at stride inner inside every array; this
                    // task owns its output lane.
                    unsafe {
                        let at = |p: *mut T, k: usize| (*p.add(start + k * inner)).to_f64();
                        let total: f64 = (0..n).map(|k| if log { at(gp.get(), k) } else { at(gp.get(), k) * at(yp.get(), k) }).sum();
                        for k in 0..n {
                            let (gv, yv) = (at(gp.get(), k), at(yp.get(), k));
                            let v = if log { gv - yv.exp() * total } else { yv * (gv - total) };
                            *dp.get().add(start + k * inner) = T::from_f64(v);
                        }
                    }
                }
            });
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let shape = &inputs[0].shape;
        let axis = normalize_axis(self.axis, shape.ndim())?;
        let d = shape.dims();
        let lanes = crate::backend::cuda::kernels::Lanes { outer: d[..axis].iter().product(), n: d[axis], inner: d[axis + 1..].iter().product() };
        crate::backend::cuda::kernels::softmax_backward(gpu, lanes, self.log, &inputs[0], &inputs[1], &outputs[0])
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
