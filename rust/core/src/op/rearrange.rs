//! Operators that rearrange elements without arithmetic, each expressed as one strided copy over
//! a virtual index space: flip, swapaxes, broadcast_to / broadcast_axis / broadcast_like, tile,
//! repeat, stack and squeeze.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::shape_ops::strided_copy;
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, ExecContext, OpDef, Operator};
use crate::base::{normalize_axis, DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// A strided view of the input to copy into the contiguous output: the index space `dims`, the
/// input's base offset and its stride (in elements, possibly 0 or negative) along each dim.
struct Gather {
    dims: Vec<usize>,
    base: isize,
    strides: Vec<isize>,
}

fn input_strides(s: &Shape) -> Vec<isize> {
    s.strides().into_iter().map(|v| v as isize).collect()
}

type Plan = Box<dyn Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync>;
type GradFn = Box<dyn Fn(&mut Grad) -> Result<InputGrads> + Send + Sync>;

/// An operator fully described by its output shape and the gather that fills it.
struct Rearrange {
    name: &'static str,
    plan: Plan,
    grad: GradFn,
}

impl Operator for Rearrange {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly(self.name, "input", inputs)?;
        Ok(vec![(self.plan)(x).map_err(|e| e.context(self.name))?.0])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (_, g) = (self.plan)(args.input_shape(0)?)?;
        let dst_strides = input_strides(&Shape::new(g.dims.clone()));
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            strided_copy(self.name, &g.dims, (args.input::<T>(0)?, g.base, &g.strides), (args.output::<T>(0)?, 0, &dst_strides))
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let ([x], [y]) = (exactly(self.name, "input", inputs)?, exactly(self.name, "output", outputs)?);
        let (_, g) = (self.plan)(&x.shape)?;
        let dst_strides = input_strides(&Shape::new(g.dims.clone()));
        strided_copy(gpu, &g.dims, Strided { tensor: x, base: g.base, strides: &g.strides }, Strided { tensor: y, base: 0, strides: &dst_strides })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        (self.grad)(d)
    }
}

/// Broadcast `src` of shape `src_shape` into `out` of shape `out_shape` (the same rank; `src`
/// has size 1 where they differ), for operator `op`.
pub(super) fn broadcast_into<T: Elem>(op: &str, (src, src_shape): (&[T], &Shape), (out, out_shape): (&mut [T], &Shape)) -> Result<()> {
    let (_, g) = broadcast_gather(src_shape, out_shape.dims().to_vec()).map_err(|e| e.context(op))?;
    strided_copy(op, &g.dims, (src, g.base, &g.strides), (out, 0, &input_strides(out_shape)))
}

/// Gradient of a broadcast: sum back down to the input's shape.
fn unbroadcast_grad() -> GradFn {
    Box::new(|d| {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.sum_to_like(&g, &x)?)])
    })
}

/// Gradient of a permutation: the inverse permutation, `op` with `attrs`.
fn self_inverse_grad(op: &'static str, attrs: Vec<(&'static str, String)>) -> GradFn {
    Box::new(move |d| {
        let g = d.out_grad(0);
        Ok(vec![Some(d.op(op, &attrs, &[&g])?)])
    })
}

fn axes_list(axis: &[i64], ndim: usize) -> Result<Vec<usize>> {
    axis.iter().map(|&a| normalize_axis(a, ndim)).collect()
}

crate::op_params! {
    pub struct FlipParams {
        /// The axis or axes along which to reverse elements.
        axis: Vec<i64>,
    }
}

crate::op_params! {
    pub struct SwapAxesParams {
        /// The first axis to swap.
        dim1: i64 = 0,
        /// The second axis to swap.
        dim2: i64 = 0,
    }
}

crate::op_params! {
    pub struct BroadcastToParams {
        /// The target shape; 0 keeps the input's dimension.
        shape: Vec<i64>,
    }
}

crate::op_params! {
    pub struct BroadcastAxisParams {
        /// The axes to broadcast (each must have size 1).
        axis: Vec<i64> = Vec::new(),
        /// Target sizes of those axes.
        size: Vec<i64> = Vec::new(),
    }
}

crate::op_params! {
    pub struct TileParams {
        /// Number of repetitions along each axis (aligned on the right).
        reps: Vec<i64>,
    }
}

crate::op_params! {
    pub struct RepeatParams {
        /// Number of repetitions of each element.
        repeats: usize,
        /// Axis along which to repeat; by default the input is flattened first.
        axis: Option<i64> = None,
    }
}

crate::op_params! {
    pub struct SqueezeParams {
        /// Axes of size 1 to remove; by default every axis of size 1.
        axis: Option<Vec<i64>> = None,
    }
}

/// Broadcast `src` to `target` (same rank): stride 0 where the input has size 1.
fn broadcast_gather(src: &Shape, target: Vec<usize>) -> Result<(Shape, Gather)> {
    let fits = src.ndim() == target.len() && src.dims().iter().zip(&target).all(|(&d, &t)| d == t || d == 1);
    if !fits {
        crate::bail!(Shape, "cannot broadcast {src} to {}", Shape::new(target));
    }
    let strides = src.dims().iter().zip(&target).zip(input_strides(src)).map(|((&d, &t), stride)| if d == t { stride } else { 0 }).collect();
    Ok((Shape::new(target.clone()), Gather { dims: target, base: 0, strides }))
}

fn flip_plan(axis: Vec<i64>) -> impl Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync {
    move |s| {
        let axes = axes_list(&axis, s.ndim())?;
        let mut strides = input_strides(s);
        let mut base = 0isize;
        // Axes one by one, as given: an axis named twice is flipped back.
        for a in axes {
            let (Some(&len), Some(stride)) = (s.dims().get(a), strides.get_mut(a)) else {
                crate::bail!(Shape, "reverse: axis {a} is out of range for {s}");
            };
            if len > 0 {
                base += (len as isize - 1) * *stride;
            }
            *stride = -*stride;
        }
        Ok((s.clone(), Gather { dims: s.dims().to_vec(), base, strides }))
    }
}

fn tile_plan(reps: Vec<i64>) -> impl Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync {
    move |s| {
        if reps.iter().any(|&r| r < 0) {
            crate::bail!(Param, "reps must be >= 0, got {reps:?}");
        }
        // The shorter of the shape and reps is padded with leading ones.
        let n = s.ndim().max(reps.len());
        let ones = |len: usize| std::iter::repeat_n(1, n - len);
        let dims: Vec<usize> = ones(s.ndim()).chain(s.dims().iter().copied()).collect();
        let reps: Vec<usize> = ones(reps.len()).chain(reps.iter().map(|&r| r as usize)).collect();
        let st = input_strides(&Shape::new(dims.clone()));
        let (mut space, mut strides) = (Vec::new(), Vec::new());
        for ((&r, &d), &stride) in reps.iter().zip(&dims).zip(&st) {
            space.extend([r, d]);
            strides.extend([0, stride]);
        }
        let out: Vec<usize> = reps.iter().zip(&dims).map(|(r, d)| r * d).collect();
        Ok((Shape::new(out), Gather { dims: space, base: 0, strides }))
    }
}

fn repeat_plan(p: RepeatParams) -> impl Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync {
    move |s| {
        let (src, axis) = match p.axis {
            Some(a) => (s.clone(), normalize_axis(a, s.ndim())?),
            None => (Shape::new(vec![s.size()]), 0),
        };
        let st = input_strides(&src);
        let (mut space, mut strides) = (Vec::new(), Vec::new());
        for (i, (&len, &stride)) in src.dims().iter().zip(&st).enumerate() {
            space.push(len);
            strides.push(stride);
            if i == axis {
                space.push(p.repeats);
                strides.push(0);
            }
        }
        let mut out = src.dims().to_vec();
        if let Some(len) = out.get_mut(axis) {
            *len *= p.repeats;
        }
        Ok((Shape::new(out), Gather { dims: space, base: 0, strides }))
    }
}

crate::op_params! {
    pub struct BlockSizeParams {
        /// Side of the square blocks moved between depth and space.
        block_size: i64,
    }
}

/// depth_to_space on NCHW: (N, C, H, W) -> (N, C/b^2, H*b, W*b), MXNet's DCR element order.
fn depth_to_space_plan(b: usize) -> impl Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync {
    move |s| {
        let [n, channels, h, w] = match *s.dims() {
            [n, c, h, w] if b > 0 && c % (b * b) == 0 => [n, c, h, w],
            _ => crate::bail!(Shape, "depth_to_space: needs a 4-D NCHW input whose channels divide by block_size^2 = {}, got {s}", b * b),
        };
        let c = channels / (b * b);
        let plane = (h * w) as isize;
        let dims = vec![n, c, h, b, w, b];
        let strides = vec![(channels * h * w) as isize, plane, w as isize, (b * c) as isize * plane, 1, c as isize * plane];
        Ok((Shape::new(vec![n, c, h * b, w * b]), Gather { dims, base: 0, strides }))
    }
}

/// space_to_depth on NCHW: (N, C, H, W) -> (N, C*b^2, H/b, W/b), the inverse of depth_to_space.
fn space_to_depth_plan(b: usize) -> impl Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync {
    move |s| {
        let [n, c, height, width] = match *s.dims() {
            [n, c, h, w] if b > 0 && h % b == 0 && w % b == 0 => [n, c, h, w],
            _ => crate::bail!(Shape, "space_to_depth: needs a 4-D NCHW input whose height and width divide by block_size {b}, got {s}"),
        };
        let (h, w) = (height / b, width / b);
        let dims = vec![n, b, b, c, h, w];
        let strides = vec![(c * height * width) as isize, width as isize, 1, (height * width) as isize, (b * width) as isize, b as isize];
        Ok((Shape::new(vec![n, c * b * b, h, w]), Gather { dims, base: 0, strides }))
    }
}

fn block_size(op: &str, b: i64) -> Result<usize> {
    if b < 1 {
        crate::bail!(Param, "{op}: block_size must be >= 1, got {b}");
    }
    Ok(b as usize)
}

crate::op_params! {
    pub struct StackParams {
        /// The axis in the result along which the inputs are stacked.
        axis: i64 = 0,
        /// Number of inputs.
        num_args: usize,
    }
}

struct Stack {
    axis: i64,
    num_args: usize,
}

impl Operator for Stack {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_args).map(|i| format!("arg{i}")).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let first = super::first_input("stack", inputs)?;
        if let Some(bad) = inputs.iter().find(|s| *s != first) {
            crate::bail!(Shape, "stack: all inputs must have the same shape, got {first} and {bad}");
        }
        let axis = normalize_axis(self.axis, first.ndim() + 1)?;
        let mut dims = first.dims().to_vec();
        dims.insert(axis, inputs.len());
        Ok(vec![Shape::new(dims)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let out_dims = args.output_shape(0)?.dims();
        let axis = normalize_axis(self.axis, out_dims.len())?;
        let outer: usize = out_dims.iter().take(axis).product();
        let inner: usize = out_dims.iter().skip(axis + 1).product();
        let n = args.inputs().len();
        let (dims, src_strides, dst_strides) = ([outer, inner], [inner as isize, 1], [(n * inner) as isize, 1]);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let out = args.output::<T>(0)?;
            for k in 0..n {
                strided_copy("stack", &dims, (args.input::<T>(k)?, 0, &src_strides), (&mut *out, (k * inner) as isize, &dst_strides))?;
            }
            Ok(())
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let attrs = [("axis", self.axis.to_string()), ("num_outputs", self.num_args.to_string()), ("squeeze_axis", flag(true))];
        Ok(d.op_outputs("SliceChannel", &attrs, &[&g])?.into_iter().map(Some).collect())
    }
}

/// Same elements, new shape (squeeze).
struct Squeeze {
    axis: Option<Vec<i64>>,
}

impl Squeeze {
    fn shape(&self, s: &Shape) -> Result<Shape> {
        let dims: Vec<usize> = match &self.axis {
            None => s.dims().iter().copied().filter(|&d| d != 1).collect(),
            Some(axes) => {
                let axes = axes_list(axes, s.ndim())?;
                if let Some((a, len)) = s.dims().iter().enumerate().find(|&(a, &len)| len != 1 && axes.contains(&a)) {
                    crate::bail!(Shape, "squeeze: axis {a} of {s} has size {len}, not 1");
                }
                s.dims().iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, &len)| len).collect()
            }
        };
        // MXNet 1.x keeps at least one dimension.
        Ok(Shape::new(if dims.is_empty() { vec![1] } else { dims }))
    }
}

impl Operator for Squeeze {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("squeeze", "input", inputs)?;
        Ok(vec![self.shape(x)?])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.binary("reshape_like", &g, &x)?)])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        super::shape_ops::copy_args(args)
    }
}

crate::op_params! {
    pub struct BroadcastLikeParams {
        /// Axes of lhs to broadcast (all axes when omitted).
        lhs_axes: Option<Vec<i64>> = None,
        /// Axes of rhs whose sizes the lhs_axes take, pairwise.
        rhs_axes: Option<Vec<i64>> = None,
    }
}

/// broadcast_like: the second input only lends its shape (or, with lhs_axes/rhs_axes, the
/// sizes of some of its axes).
struct BroadcastLike {
    p: BroadcastLikeParams,
}

impl BroadcastLike {
    /// The shape lhs is broadcast to.
    fn target(&self, lhs: &Shape, rhs: &Shape) -> Result<Shape> {
        let (lhs_axes, rhs_axes) = match (&self.p.lhs_axes, &self.p.rhs_axes) {
            (None, None) => return Ok(rhs.clone()),
            (Some(l), _) | (_, Some(l)) if l.is_empty() => {
                crate::bail!(Param, "broadcast_like: empty lhs_axes/rhs_axes are not allowed; omit both to take rhs's whole shape")
            }
            (Some(l), Some(r)) if l.len() == r.len() => (l, r),
            _ => crate::bail!(
                Param,
                "broadcast_like: lhs_axes {:?} and rhs_axes {:?} must be given together, pairwise",
                self.p.lhs_axes,
                self.p.rhs_axes
            ),
        };
        let mut dims = lhs.dims().to_vec();
        for (&to, &from) in lhs_axes.iter().zip(rhs_axes) {
            let (to, from) = (normalize_axis(to, lhs.ndim())?, normalize_axis(from, rhs.ndim())?);
            let (Some(&len), Some(&size), Some(slot)) = (lhs.dims().get(to), rhs.dims().get(from), dims.get_mut(to)) else {
                crate::bail!(Shape, "broadcast_like: axis {to} of {lhs} or axis {from} of {rhs} is out of range");
            };
            if len != 1 && len != size {
                crate::bail!(Shape, "broadcast_like: axis {to} of {lhs} has size {len}, so it cannot take size {size} from {rhs}");
            }
            *slot = size;
        }
        Ok(Shape::new(dims))
    }
}

impl Operator for BroadcastLike {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [lhs, rhs] = exactly("broadcast_like", "input", inputs)?;
        Ok(vec![like_plan(lhs, &self.target(lhs, rhs)?)?.0])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[lhs, _] = exactly("broadcast_like", "input", inputs)?;
        Ok(vec![lhs])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [lhs, rhs] = exactly("broadcast_like", "input", args.inputs())?;
        let target = self.target(&lhs.shape, &rhs.shape)?;
        let rearrange = Rearrange { name: "broadcast_like", plan: Box::new(move |s| like_plan(s, &target)), grad: unbroadcast_grad() };
        args.delegate(&rearrange, std::slice::from_ref(lhs), args.outputs(), |data_only| rearrange.forward(ctx, data_only))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.sum_to_like(&g, &x)?), None])
    }
}

/// Broadcast to `target`; a lower-rank `src` is aligned on the right, as NumPy does.
fn like_plan(src: &Shape, target: &Shape) -> Result<(Shape, Gather)> {
    if src.ndim() > target.ndim() {
        crate::bail!(Shape, "broadcast_like: {src} has more dimensions than {target}");
    }
    let mut padded = vec![1; target.ndim() - src.ndim()];
    padded.extend_from_slice(src.dims());
    broadcast_gather(&Shape::new(padded), target.dims().to_vec())
}

fn rearrange<P: super::Params + 'static, F: Fn(&Shape) -> Result<(Shape, Gather)> + Send + Sync + 'static>(
    name: &'static str,
    aliases: &'static [&'static str],
    doc: &'static str,
    plan: impl Fn(P) -> Result<(F, GradFn)> + Send + Sync + 'static,
) -> OpDef {
    OpDef::new(name, aliases, doc, move |p: P| {
        let (plan, grad) = plan(p)?;
        Ok(Rearrange { name, plan: Box::new(plan), grad })
    })
}

fn flag(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

/// `_backward_tile(grad, data)`: sums the tiled copies of each element.
struct TileBackward {
    reps: Vec<i64>,
}

impl Operator for TileBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_tile", "input", inputs)?;
        let (tiled, _) = tile_plan(self.reps.clone())(data)?;
        super::check_out_grad("_backward_tile", grad, &tiled)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _] = exactly("_backward_tile", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        // The tile gather's index space is (rep0, dim0, rep1, dim1, ...): sum over the reps.
        let (_, gather) = tile_plan(self.reps.clone())(args.input_shape(1)?)?;
        let mask: Vec<bool> = (0..gather.dims.len()).map(|i| i % 2 == 0).collect();
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            super::reduce::sum_view("_backward_tile", args.input::<T>(0)?, &gather.dims, &mask, args.output::<T>(0)?)
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        Ok(vec![Some(d.op("tile", &[("reps", tuple_attr(&self.reps))], &[&g])?), None])
    }
}

/// `_backward_repeat(grad, data)`: sums the repeated copies of each element.
struct RepeatBackward {
    params: RepeatParams,
}

impl Operator for RepeatBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_repeat", "input", inputs)?;
        let (repeated, _) = repeat_plan(self.params.clone())(data)?;
        super::check_out_grad("_backward_repeat", grad, &repeated)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _] = exactly("_backward_repeat", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        // The repeat gather's index space has a repeats axis right after the repeated one.
        let data = args.input_shape(1)?;
        let (_, gather) = repeat_plan(self.params.clone())(data)?;
        let axis = match self.params.axis {
            Some(a) => normalize_axis(a, data.ndim())?,
            None => 0,
        };
        let mask: Vec<bool> = (0..gather.dims.len()).map(|i| i == axis + 1).collect();
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            super::reduce::sum_view("_backward_repeat", args.input::<T>(0)?, &gather.dims, &mask, args.output::<T>(0)?)
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let axis = self.params.axis.map_or("None".to_string(), |a| a.to_string());
        let repeated = d.op("repeat", &[("repeats", self.params.repeats.to_string()), ("axis", axis)], &[&g])?;
        let grad = d.input(0);
        Ok(vec![Some(d.binary("reshape_like", &repeated, &grad)?), None])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(rearrange("reverse", &["flip"], "Reverses the order of elements along the given axes.", |p: FlipParams| {
        let grad = self_inverse_grad("reverse", vec![("axis", tuple_attr(&p.axis))]);
        Ok((flip_plan(p.axis), grad))
    }));
    add(rearrange("SwapAxis", &["swapaxes"], "Interchanges two axes of an array.", |p: SwapAxesParams| {
        let grad = self_inverse_grad("SwapAxis", vec![("dim1", p.dim1.to_string()), ("dim2", p.dim2.to_string())]);
        let plan = move |s: &Shape| {
            let (a, b) = (normalize_axis(p.dim1, s.ndim())?, normalize_axis(p.dim2, s.ndim())?);
            let mut dims = s.dims().to_vec();
            let mut strides = input_strides(s);
            dims.swap(a, b);
            strides.swap(a, b);
            Ok((Shape::new(dims.clone()), Gather { dims, base: 0, strides }))
        };
        Ok((plan, grad))
    }));
    add(rearrange("broadcast_to", &[], "Broadcasts the input to a new shape (0 keeps a dimension).", |p: BroadcastToParams| {
        let plan = move |s: &Shape| {
            if p.shape.len() != s.ndim() {
                crate::bail!(Shape, "broadcast_to: target {:?} must have the same number of dimensions as {s}", p.shape);
            }
            let target = p.shape.iter().zip(s.dims()).map(|(&t, &d)| if t == 0 { d } else { t.max(0) as usize }).collect();
            broadcast_gather(s, target)
        };
        Ok((plan, unbroadcast_grad()))
    }));
    add(rearrange("broadcast_axis", &["broadcast_axes"], "Broadcasts the input along axes of size 1.", |p: BroadcastAxisParams| {
        if p.axis.len() != p.size.len() {
            crate::bail!(Param, "broadcast_axis: axis {:?} and size {:?} must have the same length", p.axis, p.size);
        }
        let plan = move |s: &Shape| {
            let mut target = s.dims().to_vec();
            for (&a, &n) in p.axis.iter().zip(&p.size) {
                let a = normalize_axis(a, s.ndim())?;
                match target.get_mut(a) {
                    Some(len) if s.dims().get(a) == Some(&1) => *len = n.max(0) as usize,
                    _ => crate::bail!(Shape, "broadcast_axis: axis {a} of {s} must have size 1"),
                }
            }
            broadcast_gather(s, target)
        };
        Ok((plan, unbroadcast_grad()))
    }));
    add(rearrange("tile", &[], "Repeats the whole array `reps` times along each axis.", |p: TileParams| {
        let attrs = vec![("reps", tuple_attr(&p.reps))];
        let grad: GradFn = Box::new(move |d| {
            let (x, g) = (d.input(0), d.out_grad(0));
            Ok(vec![Some(d.op("_backward_tile", &attrs, &[&g, &x])?)])
        });
        Ok((tile_plan(p.reps), grad))
    }));
    add(rearrange("repeat", &[], "Repeats each element `repeats` times along an axis (flattened by default).", |p: RepeatParams| {
        let axis = p.axis.map_or("None".to_string(), |a| a.to_string());
        let attrs = vec![("repeats", p.repeats.to_string()), ("axis", axis)];
        let grad: GradFn = Box::new(move |d| {
            let (x, g) = (d.input(0), d.out_grad(0));
            Ok(vec![Some(d.op("_backward_repeat", &attrs, &[&g, &x])?)])
        });
        Ok((repeat_plan(p), grad))
    }));
    add(rearrange("depth_to_space", &[], "Moves blocks of channel data into spatial blocks (NCHW).", |p: BlockSizeParams| {
        let b = block_size("depth_to_space", p.block_size)?;
        Ok((depth_to_space_plan(b), self_inverse_grad("space_to_depth", vec![("block_size", b.to_string())])))
    }));
    add(rearrange("space_to_depth", &[], "Moves spatial blocks into the channel dimension (NCHW).", |p: BlockSizeParams| {
        let b = block_size("space_to_depth", p.block_size)?;
        Ok((space_to_depth_plan(b), self_inverse_grad("depth_to_space", vec![("block_size", b.to_string())])))
    }));
    add(OpDef::new("_backward_tile", &[], "Gradient of tile: sums the tiled copies.", |p: TileParams| Ok(TileBackward { reps: p.reps })));
    add(OpDef::new("_backward_repeat", &[], "Gradient of repeat: sums the repeated copies.", |params: RepeatParams| Ok(RepeatBackward { params })));
    add(OpDef::new(
        "broadcast_like",
        &[],
        "Broadcasts lhs to the shape of rhs (or some of its axes to the sizes of rhs's axes).",
        |p: BroadcastLikeParams| Ok(BroadcastLike { p }),
    ));
    add(OpDef::new("stack", &[], "Joins arrays of equal shape along a new axis.", |p: StackParams| Ok(Stack { axis: p.axis, num_args: p.num_args }))
        .variadic());
    add(OpDef::new("squeeze", &[], "Removes axes of size one.", |p: SqueezeParams| Ok(Squeeze { axis: p.axis })));
}
