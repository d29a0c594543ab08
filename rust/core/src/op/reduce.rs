//! Reductions over axes: sum, mean, prod, max, min, nansum, nanprod.
//!
//! The input is viewed as (outer, reduced, inner) blocks without copying whenever the reduced axes
//! are adjacent; otherwise the kept axes are first transposed to the front. Float32 sums run in
//! float32 vector lanes over short blocks whose totals are added in f64 (accurate and as fast as
//! the memory); other reductions accumulate eight independent f64 lanes.

use crate::op::KernelArgs;
use std::marker::PhantomData;

use super::grad::{tuple_attr, Grad, InputGrads};
use super::params::NoParams;
use super::rearrange::broadcast_into;
use super::shape_ops::transpose_into;
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, parallel_units, zero_gradient, ExecContext, OpDef, Operator, Reduction, PARALLEL_GRAIN};
use crate::base::{normalize_axis, DType, Elem, Shape};
use crate::error::Result;
use crate::graph::Entry;

pub trait Reducer: Send + Sync + 'static {
    /// The operator's name, for errors.
    const NAME: &'static str;
    const INIT: f64;
    /// Whether the accumulator is a plain sum of the elements (sum, mean), which float32 runs
    /// may accumulate in float32 lanes within short blocks.
    const PLAIN_SUM: bool = false;
    /// Whether `step` is exact in float32 (max, min), so float32 runs need no widening.
    const EXACT_IN_F32: bool = false;
    /// The reducer's name, when it has no value over zero elements (max, min): reducing an
    /// empty axis into a non-empty result is then an error instead of the identity (-inf, inf).
    const UNDEFINED_WHEN_EMPTY: Option<&'static str> = None;
    /// `step` in float32, used where `PLAIN_SUM` or `EXACT_IN_F32` holds.
    #[inline(always)]
    fn step_f32(acc: f32, x: f32) -> f32 {
        Self::step(acc as f64, x as f64) as f32
    }
    fn step(acc: f64, x: f64) -> f64;
    /// Combine two partial accumulators (for most reducers, one more step).
    fn merge(a: f64, b: f64) -> f64 {
        Self::step(a, b)
    }
    fn finish(acc: f64, _count: usize) -> f64 {
        acc
    }
    /// The input gradient; `spread` broadcasts a reduced-shape entry back to the input's shape.
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry>;
    /// The same reduction in CUDA C++ (see [`Reduction`]).
    const CUDA: Reduction;
}

pub(crate) const CUDA_SUM: Reduction = Reduction { init: "0", step: "acc + x", merge: "a + b", finish: "acc" };
const CUDA_PRODUCT: Reduction = Reduction { init: "1", step: "acc * x", merge: "a * b", finish: "acc" };

/// Broadcasts reduced-shape gradients back to the input shape of one reduction.
pub struct Spread {
    attrs: Vec<(&'static str, String)>,
}

impl Spread {
    fn new(p: &ReduceParams) -> Spread {
        let axis = match &p.axis {
            Some(a) => tuple_attr(a),
            None => "None".to_string(),
        };
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        Spread { attrs: vec![("axis", axis), ("keepdims", flag(p.keepdims)), ("exclude", flag(p.exclude))] }
    }
    fn apply(&self, d: &mut Grad, reduced: &Entry, x: &Entry, divide_by_count: bool) -> Result<Entry> {
        let mut attrs = self.attrs.clone();
        attrs.push(("divide_by_count", if divide_by_count { "True" } else { "False" }.to_string()));
        d.op("_broadcast_reduced_like", &attrs, &[reduced, x])
    }
}

/// Gradient of max/min: the output gradient goes to every element equal to the extreme.
fn extreme_grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
    let y_full = spread.apply(d, y, x, false)?;
    let hit = d.binary("_equal", x, &y_full)?;
    let g_full = spread.apply(d, g, x, false)?;
    d.mul(&g_full, &hit)
}

/// Gradient of prod/nanprod: prod / x times the output gradient.
fn product_grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
    let gy = d.mul(g, y)?;
    let gy_full = spread.apply(d, &gy, x, false)?;
    d.div(&gy_full, x)
}

/// Zero where `x` is NaN (NaN-ignoring reductions take no gradient there).
fn mask_nan(d: &mut Grad, x: &Entry, grad: &Entry) -> Result<Entry> {
    let nan = d.unary("isnan", x)?;
    let zeros = d.unary("zeros_like", x)?;
    d.op("where", &[], &[&nan, &zeros, grad])
}

struct Sum;
impl Reducer for Sum {
    const NAME: &'static str = "sum";
    const CUDA: Reduction = CUDA_SUM;
    const PLAIN_SUM: bool = true;
    #[inline(always)]
    fn step_f32(acc: f32, x: f32) -> f32 {
        acc + x
    }
    fn grad(d: &mut Grad, x: &Entry, _y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        spread.apply(d, g, x, false)
    }
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc + x
    }
}
struct Mean;
impl Reducer for Mean {
    const NAME: &'static str = "mean";
    const CUDA: Reduction = Reduction { finish: "acc / count", ..CUDA_SUM };
    const PLAIN_SUM: bool = true;
    #[inline(always)]
    fn step_f32(acc: f32, x: f32) -> f32 {
        acc + x
    }
    fn grad(d: &mut Grad, x: &Entry, _y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        spread.apply(d, g, x, true)
    }
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc + x
    }
    fn finish(acc: f64, count: usize) -> f64 {
        acc / count as f64
    }
}
struct Prod;
impl Reducer for Prod {
    const NAME: &'static str = "prod";
    const CUDA: Reduction = CUDA_PRODUCT;
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        product_grad(d, x, y, g, spread)
    }
    const INIT: f64 = 1.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc * x
    }
}
struct NanSum;
impl Reducer for NanSum {
    const NAME: &'static str = "nansum";
    const CUDA: Reduction = Reduction { step: "isnan(x) ? acc : acc + x", ..CUDA_SUM };
    fn grad(d: &mut Grad, x: &Entry, _y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        {
            let full = spread.apply(d, g, x, false)?;
            mask_nan(d, x, &full)
        }
    }
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        if x.is_nan() {
            acc
        } else {
            acc + x
        }
    }
    fn merge(a: f64, b: f64) -> f64 {
        a + b
    }
}
struct NanProd;
impl Reducer for NanProd {
    const NAME: &'static str = "nanprod";
    const CUDA: Reduction = Reduction { step: "isnan(x) ? acc : acc * x", ..CUDA_PRODUCT };
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        {
            let full = product_grad(d, x, y, g, spread)?;
            mask_nan(d, x, &full)
        }
    }
    const INIT: f64 = 1.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        if x.is_nan() {
            acc
        } else {
            acc * x
        }
    }
    fn merge(a: f64, b: f64) -> f64 {
        a * b
    }
}
struct Max;
impl Reducer for Max {
    const NAME: &'static str = "max";
    const CUDA: Reduction = Reduction {
        init: "-__longlong_as_double(0x7ff0000000000000LL)",
        step: "(x > acc || isnan(x)) ? x : acc",
        merge: "(b > a || isnan(b)) ? b : a",
        finish: "acc",
    };
    const EXACT_IN_F32: bool = true;
    #[inline(always)]
    fn step_f32(acc: f32, x: f32) -> f32 {
        if x > acc || x.is_nan() {
            x
        } else {
            acc
        }
    }
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        extreme_grad(d, x, y, g, spread)
    }
    const UNDEFINED_WHEN_EMPTY: Option<&'static str> = Some("max");
    const INIT: f64 = f64::NEG_INFINITY;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        if x > acc || x.is_nan() {
            x
        } else {
            acc
        }
    }
}
struct Min;
impl Reducer for Min {
    const NAME: &'static str = "min";
    const CUDA: Reduction = Reduction {
        init: "__longlong_as_double(0x7ff0000000000000LL)",
        step: "(x < acc || isnan(x)) ? x : acc",
        merge: "(b < a || isnan(b)) ? b : a",
        finish: "acc",
    };
    const EXACT_IN_F32: bool = true;
    #[inline(always)]
    fn step_f32(acc: f32, x: f32) -> f32 {
        if x < acc || x.is_nan() {
            x
        } else {
            acc
        }
    }
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        extreme_grad(d, x, y, g, spread)
    }
    const UNDEFINED_WHEN_EMPTY: Option<&'static str> = Some("min");
    const INIT: f64 = f64::INFINITY;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        if x < acc || x.is_nan() {
            x
        } else {
            acc
        }
    }
}

/// Sum of absolute values (the L1 norm).
struct L1Norm;
impl Reducer for L1Norm {
    const NAME: &'static str = "norm";
    const CUDA: Reduction = Reduction { step: "acc + fabs(x)", ..CUDA_SUM };
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc + x.abs()
    }
    fn merge(a: f64, b: f64) -> f64 {
        a + b
    }
    fn grad(d: &mut Grad, x: &Entry, _y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        let full = spread.apply(d, g, x, false)?;
        let sign = d.unary("sign", x)?;
        d.mul(&full, &sign)
    }
}

/// Square root of the sum of squares (the L2 norm).
struct L2Norm;
impl Reducer for L2Norm {
    const NAME: &'static str = "norm";
    const CUDA: Reduction = Reduction { step: "acc + x * x", finish: "sqrt(acc)", ..CUDA_SUM };
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc + x * x
    }
    fn merge(a: f64, b: f64) -> f64 {
        a + b
    }
    fn finish(acc: f64, _count: usize) -> f64 {
        acc.sqrt()
    }
    fn grad(d: &mut Grad, x: &Entry, y: &Entry, g: &Entry, spread: &Spread) -> Result<Entry> {
        let g_over_norm = d.div(g, y)?;
        let full = spread.apply(d, &g_over_norm, x, false)?;
        d.mul(&full, x)
    }
}

crate::op_params! {
    pub struct NormParams {
        /// Order of the norm: 1 or 2.
        ord: i64 = 2,
        /// The axis or axes to compute the norm over; by default all.
        axis: Option<Vec<i64>> = None,
        /// Output dtype (only the input's dtype is supported).
        out_dtype: Option<DType> = None,
        /// Keep the reduced axes with size one.
        keepdims: bool = false,
    }
}

crate::op_params! {
    pub struct MomentsParams {
        /// Axes to compute the moments over; by default all.
        axes: Option<Vec<i64>> = None,
        /// Keep the reduced axes with size one.
        keepdims: bool = false,
    }
}

/// moments(data): mean and variance over axes, the variance computed from deviations.
struct Moments {
    mean: Reduce<Mean>,
}

impl Operator for Moments {
    fn num_outputs(&self) -> usize {
        2
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let reduced = self.mean.infer_shape(inputs)?;
        let [s] = exactly("moments", "mean output", &reduced)?;
        Ok(vec![s.clone(), s.clone()])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "moments";
        let mean_only = args.outputs().get(..1).ok_or_else(|| crate::err!(Value, "{op}: 2 outputs expected, got none"))?;
        args.delegate(&self.mean, args.inputs(), mean_only, |mean_only| self.mean.forward(ctx, mean_only))?;
        let shape = args.input_shape(0)?;
        let mask = self.mean.mask(shape.ndim())?;
        let kept = Shape::new(shape.dims().iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect::<Vec<_>>());
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, mean, var) = (args.input::<T>(0)?, args.output::<T>(0)?, args.output::<T>(1)?);
            let mut deviations: Vec<T> = vec![T::default(); x.len()];
            broadcast_into(op, (&*mean, &kept), (&mut deviations, shape))?;
            deviations.iter_mut().zip(x).for_each(|(d, &v)| {
                let diff = v.to_f64() - d.to_f64();
                *d = T::from_f64(diff * diff);
            });
            reduce_into::<T, Mean>(op, &deviations, shape.dims(), &mask, var)
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, mean, g_mean, g_var) = (d.input(0), d.output(0), d.out_grad(0), d.out_grad(1));
        let spread = Spread::new(&self.mean.params);
        let from_mean = spread.apply(d, &g_mean, &x, true)?;
        let mean_full = spread.apply(d, &mean, &x, false)?;
        let centered = d.binary("elemwise_sub", &x, &mean_full)?;
        let g_var_full = spread.apply(d, &g_var, &x, true)?;
        let twice = d.scalar("_mul_scalar", &centered, 2.0)?;
        let from_var = d.mul(&g_var_full, &twice)?;
        Ok(vec![Some(d.binary("elemwise_add", &from_mean, &from_var)?)])
    }
}

crate::op_params! {
    pub struct ReduceParams {
        /// The axis or axes along which to reduce; the default reduces over all axes.
        axis: Option<Vec<i64>> = None,
        /// If true, the reduced axes are left in the result as dimensions of size one.
        keepdims: bool = false,
        /// Whether to reduce over all axes except those given in `axis`.
        exclude: bool = false,
    }
}

struct Reduce<R> {
    params: ReduceParams,
    _r: PhantomData<R>,
}

impl<R> Reduce<R> {
    /// Which input axes are reduced.
    fn mask(&self, ndim: usize) -> Result<Vec<bool>> {
        let mut mask = vec![false; ndim];
        match &self.params.axis {
            Some(axes) if !axes.is_empty() => {
                for &a in axes {
                    let a = normalize_axis(a, ndim)?;
                    match mask.get_mut(a) {
                        Some(reduced) if !*reduced => *reduced = true,
                        _ => crate::bail!(Value, "axis {a} is given more than once"),
                    }
                }
                if self.params.exclude {
                    mask.iter_mut().for_each(|m| *m = !*m);
                }
            }
            _ => mask.iter_mut().for_each(|m| *m = true),
        }
        Ok(mask)
    }
}

impl<R: Reducer> Operator for Reduce<R> {
    fn num_inputs(&self) -> usize {
        1
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [s] = exactly(R::NAME, "input", inputs)?;
        let mask = self.mask(s.ndim())?;
        let dims: Vec<usize> = if self.params.keepdims {
            s.dims().iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect()
        } else {
            s.dims().iter().zip(&mask).filter(|(_, &m)| !m).map(|(&d, _)| d).collect()
        };
        // MXNet 1.x represents a full reduction as shape (1,), not as a 0-d scalar.
        let out = if dims.is_empty() { Shape::new(vec![1]) } else { Shape::new(dims) };
        if let Some(name) = R::UNDEFINED_WHEN_EMPTY {
            let reduces_nothing = s.dims().iter().zip(&mask).any(|(&d, &m)| m && d == 0);
            if reduces_nothing && out.size() > 0 {
                crate::bail!(Value, "{name}: cannot reduce an empty axis of array {s}: the {name} of no elements is undefined");
            }
        }
        Ok(vec![out])
    }

    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.input_shape(0)?;
        let mask = self.mask(shape.ndim())?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => reduce_into::<T, R>(R::NAME, args.input::<T>(0)?, shape.dims(), &mask, args.output::<T>(0)?))
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([x], [y]) = (exactly(R::NAME, "input", inputs)?, exactly(R::NAME, "output", outputs)?);
        let mask = self.mask(x.shape.ndim())?;
        crate::backend::cuda::kernels::reduce(gpu, &R::CUDA, &mask, x, y)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, y, g) = (d.input(0), d.output(0), d.out_grad(0));
        Ok(vec![Some(R::grad(d, &x, &y, &g, &Spread::new(&self.params))?)])
    }
    fn reduction(&self) -> Option<Reduction> {
        Some(R::CUDA)
    }
}

/// The L1 or L2 norm, chosen by `ord` when the operator is created.
enum Norm {
    L1(Reduce<L1Norm>),
    L2(Reduce<L2Norm>),
}

impl Norm {
    fn inner(&self) -> &dyn Operator {
        match self {
            Norm::L1(r) => r,
            Norm::L2(r) => r,
        }
    }
}

impl Operator for Norm {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.inner().infer_shape(inputs)
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        self.inner().forward(ctx, args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        self.inner().forward_gpu(gpu, ctx, inputs, outputs)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        self.inner().gradient(d)
    }
    fn reduction(&self) -> Option<Reduction> {
        self.inner().reduction()
    }
}

/// `_reduce_sum_to_like(data, like)`: sums `data` over the axes along which `like` was
/// broadcast to reach it (the gradient of broadcasting).
struct SumToLike;

impl SumToLike {
    fn mask(data: &Shape, like: &Shape) -> Result<Vec<bool>> {
        if like.ndim() > data.ndim() {
            crate::bail!(Shape, "_reduce_sum_to_like: {like} has more dimensions than {data}");
        }
        let lead = data.ndim() - like.ndim();
        let aligned = std::iter::repeat_n(None, lead).chain(like.dims().iter().map(Some));
        data.dims()
            .iter()
            .zip(aligned)
            .map(|(&dd, ld)| match ld {
                None => Ok(true),
                Some(&ld) if dd == ld => Ok(false),
                Some(1) => Ok(true),
                Some(_) => crate::bail!(Shape, "_reduce_sum_to_like: {like} does not broadcast to {data}"),
            })
            .collect()
    }
}

impl Operator for SumToLike {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "like".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, like] = exactly("_reduce_sum_to_like", "input", inputs)?;
        SumToLike::mask(data, like)?;
        Ok(vec![like.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("_reduce_sum_to_like", "input", inputs)?;
        Ok(vec![data])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.input_shape(0)?;
        let mask = SumToLike::mask(shape, args.input_shape(1)?)?;
        if !mask.contains(&true) {
            return super::shape_ops::copy_args(args);
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            reduce_into::<T, Sum>("_reduce_sum_to_like", args.input::<T>(0)?, shape.dims(), &mask, args.output::<T>(0)?)
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let op = "_reduce_sum_to_like";
        let ([data, like], [out]) = (exactly(op, "input", inputs)?, exactly(op, "output", outputs)?);
        let mask = SumToLike::mask(&data.shape, &like.shape)?;
        crate::backend::cuda::kernels::reduce(gpu, &CUDA_SUM, &mask, data, out)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.binary("broadcast_like", &g, &x)?), None])
    }
}

crate::op_params! {
    pub struct SpreadParams {
        /// The reduction's axis or axes.
        axis: Option<Vec<i64>> = None,
        /// Whether the reduction kept the reduced axes.
        keepdims: bool = false,
        /// Whether the reduction was over all axes except `axis`.
        exclude: bool = false,
        /// Divide by the number of reduced elements (the gradient of mean).
        divide_by_count: bool = false,
    }
}

/// `_broadcast_reduced_like(reduced, like)`: the result of a reduction of `like`, broadcast back
/// to `like`'s shape (the gradient of a reduction).
struct BroadcastReducedLike {
    reduce: Reduce<Sum>,
    divide_by_count: bool,
}

impl Operator for BroadcastReducedLike {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "like".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, like] = exactly("_broadcast_reduced_like", "input", inputs)?;
        let reduced = self.reduce.infer_shape(std::slice::from_ref(like))?;
        let [reduced] = exactly("_broadcast_reduced_like", "reduction output", &reduced)?;
        if reduced.size() != data.size() {
            crate::bail!(Shape, "_broadcast_reduced_like: {data} is not the reduced shape {reduced} of {like}");
        }
        Ok(vec![like.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("_broadcast_reduced_like", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_broadcast_reduced_like";
        let (like, out_shape) = (args.input_shape(1)?, args.output_shape(0)?);
        let mask = self.reduce.mask(like.ndim())?;
        // The reduced input viewed with the reduced axes kept as size 1.
        let kept = Shape::new(like.dims().iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect::<Vec<_>>());
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (src, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if src.len() != kept.size() {
                crate::bail!(Runtime, "{op}: {} reduced elements for the reduced shape {kept}", src.len());
            }
            broadcast_into(op, (src, &kept), (&mut *out, out_shape))?;
            if self.divide_by_count {
                let count = like.size() / src.len().max(1);
                out.iter_mut().for_each(|v| *v = T::from_f64(v.to_f64() / count as f64));
            }
            Ok(())
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{scale, strided_copy, Strided};
        let op = "_broadcast_reduced_like";
        let ([reduced, like], [out]) = (exactly(op, "input", inputs)?, exactly(op, "output", outputs)?);
        let like = &like.shape;
        let mask = self.reduce.mask(like.ndim())?;
        let kept = Shape::new(like.dims().iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect::<Vec<_>>());
        // Each output element reads the reduced value of its kept coordinates: stride 0 along
        // the reduced axes.
        let source: Vec<isize> = kept.strides().iter().zip(&mask).map(|(&s, &m)| if m { 0 } else { s as isize }).collect();
        let target: Vec<isize> = out.shape.strides().iter().map(|&s| s as isize).collect();
        strided_copy(
            gpu,
            out.shape.dims(),
            Strided { tensor: reduced, base: 0, strides: &source },
            Strided { tensor: out, base: 0, strides: &target },
        )?;
        if self.divide_by_count {
            let count = like.size() / kept.size().max(1);
            scale(gpu, out, 1.0 / count as f64)?;
        }
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let p = &self.reduce.params;
        let axis = match &p.axis {
            Some(a) => tuple_attr(a),
            None => "None".to_string(),
        };
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let op = if self.divide_by_count { "mean" } else { "sum" };
        let reduced = d.op(op, &[("axis", axis), ("keepdims", flag(p.keepdims)), ("exclude", flag(p.exclude))], &[&g])?;
        let data = d.input(0);
        Ok(vec![Some(d.op("reshape_like", &[], &[&reduced, &data])?), None])
    }
}

/// Sum `x`, viewed with shape `view`, over the axes in `mask`, into `out` (the gradient of tile
/// and repeat, whose outputs are such views of repeated inputs, and of a bias).
pub(super) fn sum_view<T: Elem>(op: &str, x: &[T], view: &[usize], mask: &[bool], out: &mut [T]) -> Result<()> {
    reduce_into::<T, Sum>(op, x, view, mask, out)
}

/// Split `dims` into (outer, reduced, inner) if the reduced axes are adjacent (ignoring size-1 axes).
fn as_three_blocks(dims: &[usize], mask: &[bool]) -> Option<(usize, usize, usize)> {
    let significant: Vec<(usize, bool)> = dims.iter().zip(mask).filter(|(&d, _)| d != 1).map(|(&d, &m)| (d, m)).collect();
    let (Some(first), Some(last)) = (significant.iter().position(|&(_, m)| m), significant.iter().rposition(|&(_, m)| m)) else {
        return Some((significant.iter().map(|p| p.0).product(), 1, 1));
    };
    let (before, rest) = significant.split_at_checked(first)?;
    let (reduced, after) = rest.split_at_checked(last + 1 - first)?;
    if reduced.iter().any(|&(_, m)| !m) {
        return None;
    }
    let prod = |r: &[(usize, bool)]| r.iter().map(|p| p.0).product::<usize>();
    Some((prod(before), prod(reduced), prod(after)))
}

/// Reduce `x`, of shape `dims`, over the axes in `mask` into `out` (one element per index of the
/// kept axes, in order).
fn reduce_into<T: Elem, R: Reducer>(op: &str, x: &[T], dims: &[usize], mask: &[bool], out: &mut [T]) -> Result<()> {
    if mask.len() != dims.len() || dims.iter().product::<usize>() != x.len() {
        crate::bail!(Runtime, "{op}: reducing axes {mask:?} of {} elements viewed as {dims:?}", x.len());
    }
    if let Some((outer, r, inner)) = as_three_blocks(dims, mask) {
        return reduce_blocks::<T, R>(op, x, out, outer, r, inner);
    }
    // Move kept axes to the front, reduced axes to the back, then reduce contiguous rows.
    let axes = |reduced: bool| mask.iter().enumerate().filter(move |&(_, &m)| m == reduced).map(|(i, _)| i);
    let perm: Vec<usize> = axes(false).chain(axes(true)).collect();
    let mut tmp: Vec<T> = vec![T::default(); x.len()];
    transpose_into(op, x, dims, &perm, &mut tmp)?;
    let size = |reduced: bool| dims.iter().zip(mask).filter(|&(_, &m)| m == reduced).map(|(&d, _)| d).product::<usize>();
    reduce_blocks::<T, R>(op, &tmp, out, size(false), size(true), 1)
}

/// `x` as float32 values, when its elements are float32.
#[inline(always)]
fn as_f32<T: Elem>(x: &[T]) -> Option<&[f32]> {
    // SAFETY: an element type whose dtype is float32 is f32 itself, so this is the same slice.
    (T::DTYPE == DType::F32).then(|| unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len()) })
}

/// Sum float32 values in thirty-two float32 lanes (vectorizes at the CPU's widest vectors) over
/// blocks short enough that float32 accumulation stays accurate, adding each block's total in f64.
fn sum_f32_blocked(x: &[f32]) -> f64 {
    crate::backend::cpu::simd::vectorized(
        #[inline(always)]
        || sum_f32_blocked_portable(x),
    )
}

#[inline(always)]
fn sum_f32_blocked_portable(x: &[f32]) -> f64 {
    const LANES: usize = 32;
    let mut wide = [0f64; LANES];
    for block in x.chunks(F32_SUM_BLOCK) {
        let mut lanes = [0f32; LANES];
        let (chunks, tail) = block.as_chunks::<LANES>();
        for c in chunks {
            for (lane, &v) in lanes.iter_mut().zip(c) {
                *lane += v;
            }
        }
        for (w, &lane) in wide.iter_mut().zip(&lanes) {
            *w += lane as f64;
        }
        let [first, ..] = &mut wide;
        for &v in tail {
            *first += v as f64;
        }
    }
    wide.iter().sum()
}

/// Elements a float32 sum accumulates before its partial sums move to f64.
const F32_SUM_BLOCK: usize = 1024;

/// Reduce float32 values with `R::step_f32` in independent lanes, compiled for the CPU's widest
/// vectors (the crate itself targets baseline x86-64).
fn lanes_f32<R: Reducer>(x: &[f32], init: f32) -> f32 {
    crate::backend::cpu::simd::vectorized(
        #[inline(always)]
        || lanes_f32_portable::<R>(x, init),
    )
}

/// Thirty-two lanes: enough independent accumulators to hide the add latency at any width.
#[inline(always)]
fn lanes_f32_portable<R: Reducer>(x: &[f32], init: f32) -> f32 {
    const LANES: usize = 32;
    let mut lanes = [init; LANES];
    let (chunks, tail) = x.as_chunks::<LANES>();
    for c in chunks {
        for (lane, &v) in lanes.iter_mut().zip(c) {
            *lane = R::step_f32(*lane, v);
        }
    }
    let mut acc = init;
    for &l in &lanes {
        acc = R::step_f32(acc, l);
    }
    for &v in tail {
        acc = R::step_f32(acc, v);
    }
    acc
}

/// Column-wise reduction of float32 rows (`lines`, each of `width` values): one f64 per column,
/// accumulated in float32 (in blocks of rows for sums), at the CPU's widest vectors.
fn columns_f32<'a, R: Reducer>(lines: impl Iterator<Item = &'a [f32]>, width: usize) -> Vec<f64> {
    crate::backend::cpu::simd::vectorized(
        #[inline(always)]
        || columns_f32_portable::<R>(lines, width),
    )
}

#[inline(always)]
fn columns_f32_portable<'a, R: Reducer>(lines: impl Iterator<Item = &'a [f32]>, width: usize) -> Vec<f64> {
    let mut wide = vec![R::INIT; width];
    let mut narrow = vec![R::INIT as f32; width];
    let block = if R::PLAIN_SUM { F32_SUM_BLOCK / 4 } else { usize::MAX };
    for (k, row) in lines.enumerate() {
        for (a, &v) in narrow.iter_mut().zip(row) {
            *a = R::step_f32(*a, v);
        }
        if (k + 1) % block == 0 {
            for (w, n) in wide.iter_mut().zip(narrow.iter_mut()) {
                *w += *n as f64;
                *n = 0.0;
            }
        }
    }
    if R::PLAIN_SUM {
        wide.iter().zip(&narrow).map(|(&w, &n)| w + n as f64).collect()
    } else {
        narrow.iter().map(|&n| n as f64).collect()
    }
}

/// Reduce `r` contiguous elements into an accumulator with eight independent lanes.
#[inline]
fn reduce_run<T: Elem, R: Reducer>(x: &[T]) -> f64 {
    if let (Some(xs), true) = (as_f32(x), R::PLAIN_SUM || R::EXACT_IN_F32) {
        return if R::PLAIN_SUM { sum_f32_blocked(xs) } else { lanes_f32::<R>(xs, R::INIT as f32) as f64 };
    }
    let mut lanes = [R::INIT; 8];
    let (chunks, tail) = x.as_chunks::<8>();
    for c in chunks {
        for (lane, v) in lanes.iter_mut().zip(c) {
            *lane = R::step(*lane, v.to_f64());
        }
    }
    let mut acc = lanes.into_iter().fold(R::INIT, R::merge);
    for &v in tail {
        acc = R::step(acc, v.to_f64());
    }
    acc
}

/// Reduce `x`, viewed as (outer, r, inner) blocks, over r into `out` (outer x inner).
fn reduce_blocks<T: Elem, R: Reducer>(op: &str, x: &[T], out: &mut [T], outer: usize, r: usize, inner: usize) -> Result<()> {
    if x.len() != outer * r * inner || out.len() != outer * inner {
        crate::bail!(Runtime, "{op}: reducing ({outer}, {r}, {inner}) blocks of {} elements into {}", x.len(), out.len());
    }
    if out.is_empty() {
        return Ok(());
    }
    if r == 0 {
        // Every result reduces no elements.
        out.fill(T::from_f64(R::finish(reduce_run::<T, R>(&[]), 0)));
        return Ok(());
    }
    const GRAIN: usize = 1 << 15;
    let threads = crate::engine::parallel::threads();
    if inner == 1 {
        if outer == 1 || outer < threads {
            // Few long rows: split each row across threads and merge the partials.
            for (y, row) in out.iter_mut().zip(x.chunks_exact(r)) {
                let pieces = r.div_ceil(GRAIN).min(threads * 4).max(1);
                let step = r.div_ceil(pieces);
                let partials: Vec<f64> =
                    crate::engine::parallel::map(pieces, |p| reduce_run::<T, R>(row.get(p * step..((p + 1) * step).min(r)).unwrap_or_default()));
                let acc = partials.into_iter().fold(R::INIT, R::merge);
                *y = T::from_f64(R::finish(acc, r));
            }
            return Ok(());
        }
        return parallel_units(out, 1, (GRAIN / r).max(1), |first, piece| {
            for (y, row) in piece.iter_mut().zip(x.chunks_exact(r).skip(first)) {
                *y = T::from_f64(R::finish(reduce_run::<T, R>(row), r));
            }
            Ok(())
        });
    }
    // Reduce over the middle axis: accumulate whole inner rows, which vectorizes over `inner`.
    // `partial` gives the unfinished accumulators of rows `rows` for columns `cols` of block o
    // (ranges inside the block, which the sizes checked above keep inside `x`).
    let block = r * inner;
    let partial = |o: usize, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| -> Vec<f64> {
        let width = cols.len();
        let span = x.get(o * block + rows.start * inner..o * block + rows.end * inner).unwrap_or_default();
        let lines = span.chunks_exact(inner).map(move |line| line.get(cols.clone()).unwrap_or_default());
        if T::DTYPE == DType::F32 && (R::PLAIN_SUM || R::EXACT_IN_F32) {
            return columns_f32::<R>(lines.map(|line| as_f32(line).unwrap_or_default()), width);
        }
        let mut acc = vec![R::INIT; width];
        for row in lines {
            // Compiled for the CPU's vectors: a bfloat16 bias gradient's 128 x 1024 column sums
            // took 0.11 ms in baseline code, 8x float32's.
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a = R::step(*a, v.to_f64());
                    }
                },
            );
        }
        acc
    };
    let write = |y: &mut [T], acc: Vec<f64>| {
        for (v, a) in y.iter_mut().zip(acc) {
            *v = T::from_f64(R::finish(a, r));
        }
    };
    if outer >= threads {
        parallel_units(out, inner, (GRAIN / block).max(1), |first, piece| {
            for (o, y) in (first..).zip(piece.chunks_exact_mut(inner)) {
                write(y, partial(o, 0..r, 0..inner));
            }
            Ok(())
        })
    } else if r >= 8 * threads && inner <= 1 << 16 {
        // Few blocks of many rows: split the rows across threads (each streams whole rows), then
        // merge the per-thread accumulators.
        let pieces = threads * 2;
        let step = r.div_ceil(pieces);
        for (o, y) in out.chunks_exact_mut(inner).enumerate() {
            let parts: Vec<Vec<f64>> = crate::engine::parallel::map(pieces, |p| partial(o, (p * step).min(r)..((p + 1) * step).min(r), 0..inner));
            let merged = parts.into_iter().reduce(|a, b| a.into_iter().zip(b).map(|(x, y)| R::merge(x, y)).collect()).unwrap_or_default();
            write(y, merged);
        }
        Ok(())
    } else {
        for (o, y) in out.chunks_exact_mut(inner).enumerate() {
            parallel_units(y, 1, (GRAIN / r).max(64), |first, piece| {
                write(piece, partial(o, 0..r, first..first + piece.len()));
                Ok(())
            })?;
        }
        Ok(())
    }
}

crate::op_params! {
    pub struct ArgReduceParams {
        /// The axis along which to search; by default the input is flattened.
        axis: Option<i64> = None,
        /// If true, the reduced axis is left in the result with size one.
        keepdims: bool = false,
    }
}

/// The position of the first element of `row` equal to `target`. Blocks of 16 are compared
/// whole (a block compare vectorizes; a scalar search's early exit did not, and its speed
/// moved by a third between builds with the inlining around it), then the block that holds it
/// is searched.
fn first_equal(row: &[f32], target: f32) -> Option<usize> {
    const BLOCK: usize = 16;
    let blocks = row.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for (b, block) in blocks.enumerate() {
        if block.iter().fold(false, |hit, &v| hit | (v == target)) {
            return block.iter().position(|&v| v == target).map(|i| b * BLOCK + i);
        }
    }
    tail.iter().position(|&v| v == target).map(|i| row.len() - tail.len() + i)
}

/// argmax / argmin: the index (as a value of the input's dtype, as in MXNet) of the first extreme.
struct ArgReduce {
    axis: Option<i64>,
    keepdims: bool,
    max: bool,
}

impl ArgReduce {
    fn name(&self) -> &'static str {
        if self.max {
            "argmax"
        } else {
            "argmin"
        }
    }

    /// (outer, length along the axis, inner) and the output shape.
    fn layout(&self, s: &Shape) -> Result<((usize, usize, usize), Shape)> {
        match self.axis {
            None => Ok(((1, s.size(), 1), Shape::new(if self.keepdims { vec![1; s.ndim().max(1)] } else { vec![1] }))),
            Some(a) => {
                let a = normalize_axis(a, s.ndim())?;
                let Some((before, [len, after @ ..])) = s.dims().split_at_checked(a) else {
                    crate::bail!(Shape, "{}: axis {a} is outside {s}", self.name());
                };
                let kept: &[usize] = if self.keepdims { &[1] } else { &[] };
                let out = [before, kept, after].concat();
                let out = if out.is_empty() { vec![1] } else { out };
                Ok(((before.iter().product(), *len, after.iter().product()), Shape::new(out)))
            }
        }
    }
}

impl Operator for ArgReduce {
    fn num_inputs(&self) -> usize {
        1
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly(self.name(), "input", inputs)?;
        let ((_, r, _), out) = self.layout(x)?;
        if r == 0 {
            crate::bail!(Shape, "cannot take the {} of an empty axis of {x}", self.name());
        }
        Ok(vec![out])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        zero_gradient(d)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = self.name();
        let ((outer, r, inner), _) = self.layout(args.input_shape(0)?)?;
        let max = self.max;
        let check = |x: usize, y: usize| {
            if x != outer * r * inner || y != outer * inner {
                crate::bail!(Runtime, "{op}: ({outer}, {r}, {inner}) blocks of {x} elements searched into {y}");
            }
            Ok(())
        };
        if inner == 1 && args.input_dtype(0)? == DType::F32 {
            // Contiguous float32 rows: find the extreme with vector lanes, then its first position.
            let (x, y) = (args.input::<f32>(0)?, args.output::<f32>(0)?);
            check(x.len(), y.len())?;
            if r == 0 {
                y.fill(0.0);
                return Ok(());
            }
            return parallel_units(y, 1, ((1usize << 15) / r).max(1), |first, piece| {
                for (v, row) in piece.iter_mut().zip(x.chunks_exact(r).skip(first)) {
                    let best = if max { lanes_f32::<Max>(row, f32::NEG_INFINITY) } else { lanes_f32::<Min>(row, f32::INFINITY) };
                    let at = if best.is_nan() { row.iter().position(|v| v.is_nan()) } else { first_equal(row, best) }.unwrap_or(0);
                    *v = at as f32;
                }
                Ok(())
            });
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            check(x.len(), y.len())?;
            if r == 0 {
                y.fill(T::from_f64(0.0));
                return Ok(());
            }
            let block = r * inner;
            parallel_units(y, 1, (1 << 14) / r + 1, |first, piece| {
                for (cell, out) in (first..).zip(piece.iter_mut()) {
                    let (o, j) = (cell / inner, cell % inner);
                    // Column j of block o: its r elements, `inner` apart.
                    let column = x.get(o * block..(o + 1) * block).unwrap_or_default().iter().skip(j).step_by(inner);
                    let (mut best, mut best_k) = (f64::NAN, 0usize);
                    for (k, v) in column.enumerate() {
                        let v = v.to_f64();
                        let better = if max { v > best } else { v < best };
                        if k == 0 || better || (v.is_nan() && !best.is_nan()) {
                            best = v;
                            best_k = k;
                        }
                    }
                    *out = T::from_f64(best_k as f64);
                }
                Ok(())
            })
        })
    }
}

crate::op_params! {
    pub struct AllCloseParams {
        /// Relative tolerance.
        rtol: f64 = 1e-5,
        /// Absolute tolerance.
        atol: f64 = 1e-8,
        /// Whether NaNs in a and b at the same position count as equal.
        equal_nan: bool = true,
    }
}

/// allclose(a, b): 1 (uint8) when every `|a - b| <= atol + rtol * |b|`, else 0. As in NumPy,
/// an infinity is close only to an equal infinity, and NaN to NaN only with `equal_nan` (MXNet
/// 1.9.1 counted any finite value close to an infinity). Test suites compare large arrays
/// with it without copying them out and comparing them in NumPy, which for float16 is far slower
/// than the computation under test.
struct AllClose {
    params: AllCloseParams,
}

impl AllClose {
    /// Positions of `a` and `b` (equal lengths) that are not close, counted without an early
    /// exit so that the loop vectorizes.
    fn count_far<T: Elem>(&self, a: &[T], b: &[T]) -> usize {
        let AllCloseParams { rtol, atol, equal_nan } = self.params;
        let far = |(x, y): (&T, &T)| {
            let (x, y) = (x.to_f64(), y.to_f64());
            // As NumPy: an infinity is close only to itself (|1 - inf| <= rtol * inf would hold).
            let close = if x.is_finite() && y.is_finite() {
                (x - y).abs() <= atol + rtol * y.abs()
            } else {
                x == y || (equal_nan && x.is_nan() && y.is_nan())
            };
            usize::from(!close)
        };
        let pieces = a.len().div_ceil(PARALLEL_GRAIN).clamp(1, crate::engine::parallel::threads());
        let per_piece = a.len().div_ceil(pieces).max(1);
        let counts = crate::engine::parallel::map(pieces, |i| {
            let range = (i * per_piece).min(a.len())..((i + 1) * per_piece).min(a.len());
            let (a, b) = (a.get(range.clone()).unwrap_or_default(), b.get(range).unwrap_or_default());
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || a.iter().zip(b).map(far).sum::<usize>(),
            )
        });
        counts.into_iter().sum()
    }
}

impl Operator for AllClose {
    fn input_names(&self) -> Vec<String> {
        vec!["a".into(), "b".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b] = exactly("allclose", "input", inputs)?;
        if a != b {
            crate::bail!(Shape, "allclose: a {a} and b {b} must have the same shape");
        }
        Ok(vec![Shape::new(vec![1])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let [a, b] = exactly("allclose", "input", inputs)?;
        if a != b {
            crate::bail!(Type, "allclose: a is {a} and b {b}; they must share one dtype");
        }
        Ok(vec![DType::U8])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let far = crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (a, b) = (args.input::<T>(0)?, args.input::<T>(1)?);
            if a.len() != b.len() {
                crate::bail!(Runtime, "allclose: a has {} elements and b {}", a.len(), b.len());
            }
            self.count_far(a, b)
        });
        match args.output::<u8>(0)? {
            [out] => *out = u8::from(far == 0),
            other => crate::bail!(Runtime, "allclose: the output has {} elements, expected 1", other.len()),
        }
        Ok(())
    }
}

macro_rules! reductions {
    ($( $r:ident $name:literal [$($alias:literal),*] $doc:literal; )*) => {
        pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
            add(OpDef::new("argmax", &[], "Returns indices of the maximum values along an axis.",
                |p: ArgReduceParams| Ok(ArgReduce { axis: p.axis, keepdims: p.keepdims, max: true })));
            add(OpDef::new("argmin", &[], "Returns indices of the minimum values along an axis.",
                |p: ArgReduceParams| Ok(ArgReduce { axis: p.axis, keepdims: p.keepdims, max: false })));
            add(OpDef::new("argmax_channel", &[], "Returns the argmax along the last axis.",
                |_: NoParams| Ok(ArgReduce { axis: Some(-1), keepdims: false, max: true })));
            $(
                add(OpDef::new($name, &[$($alias),*], $doc,
                    |params: ReduceParams| Ok(Reduce::<$r> { params, _r: PhantomData })));
            )*
            add(OpDef::new("norm", &[], "Computes the L1 or L2 norm of the input over axes (all by default).", |p: NormParams| {
                if p.out_dtype.is_some() {
                    crate::bail!(Param, "norm: out_dtype is not supported; cast the result instead");
                }
                let params = ReduceParams { axis: p.axis, keepdims: p.keepdims, exclude: false };
                match p.ord {
                    1 => Ok(Norm::L1(Reduce { params, _r: PhantomData })),
                    2 => Ok(Norm::L2(Reduce { params, _r: PhantomData })),
                    other => crate::bail!(Param, "norm: ord must be 1 or 2, got {other}"),
                }
            }));
            add(OpDef::new("_contrib_allclose", &[], "Whether all elements of a and b are close: |a - b| <= atol + rtol * |b| (1 or 0, uint8).",
                |params: AllCloseParams| {
                    if params.rtol < 0.0 || params.atol < 0.0 {
                        crate::bail!(Param, "allclose: rtol ({}) and atol ({}) must not be negative", params.rtol, params.atol);
                    }
                    Ok(AllClose { params })
                }));
            add(OpDef::new("moments", &[], "Calculates the mean and variance of the input over axes.", |p: MomentsParams| {
                Ok(Moments { mean: Reduce { params: ReduceParams { axis: p.axes, keepdims: p.keepdims, exclude: false }, _r: PhantomData } })
            }));
            add(OpDef::new("_reduce_sum_to_like", &[], "Sums data over the axes along which like broadcasts to it.",
                |_: NoParams| Ok(SumToLike)));
            add(OpDef::new("_broadcast_reduced_like", &[], "Broadcasts the result of a reduction of like back to like's shape.",
                |p: SpreadParams| Ok(BroadcastReducedLike {
                    reduce: Reduce { params: ReduceParams { axis: p.axis, keepdims: p.keepdims, exclude: p.exclude }, _r: PhantomData },
                    divide_by_count: p.divide_by_count,
                })));
        }
    };
}

reductions! {
    Sum "sum" ["sum_axis"] "Computes the sum of array elements over given axes.";
    Mean "mean" [] "Computes the mean of array elements over given axes.";
    Prod "prod" [] "Computes the product of array elements over given axes.";
    NanSum "nansum" [] "Computes the sum of array elements over given axes, treating NaN as zero.";
    NanProd "nanprod" [] "Computes the product of array elements over given axes, treating NaN as one.";
    Max "max" ["max_axis"] "Computes the max of array elements over given axes.";
    Min "min" ["min_axis"] "Computes the min of array elements over given axes.";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_block_views() {
        assert_eq!(as_three_blocks(&[2, 3, 4], &[false, true, false]), Some((2, 3, 4)));
        assert_eq!(as_three_blocks(&[2, 3, 4], &[true, true, true]), Some((1, 24, 1)));
        assert_eq!(as_three_blocks(&[2, 1, 4], &[true, false, true]), Some((1, 8, 1)));
        assert_eq!(as_three_blocks(&[2, 3, 4], &[true, false, true]), None);
    }
}
