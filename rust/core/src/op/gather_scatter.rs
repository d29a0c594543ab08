//! Index-driven selection and placement: pick, batch_take, gather_nd, scatter_nd, slice_like and
//! diag, each with the scatter (or gather) that is its gradient.

use super::broadcast::copy_into;
use super::grad::{Grad, InputGrads};
use super::params::NoParams;
use super::shape_ops::{around_axis, contiguous, strided_copy};
use super::{exactly, parallel_units, ExecContext, InOut, OpDef, Operator, Tensor};
use crate::base::{merge_partial, normalize_axis, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// Index values of input `i` of a kernel call, whatever its dtype, as i64.
fn read_indices(args: &KernelArgs, i: usize) -> Result<Vec<i64>> {
    Ok(args.input_f64(i)?.into_iter().map(|v| v as i64).collect())
}

/// The values of an index array as i64, outside a kernel call (shape inference from values).
fn tensor_indices(index: &Tensor) -> Result<Vec<i64>> {
    // SAFETY: `infer_shape_from_values` is asked once the inputs are ready to read (the caller
    // waits for them), and nothing writes them while the output shape is worked out.
    let args = unsafe { KernelArgs::new(std::slice::from_ref(index), &[], &[], &[]) }?;
    read_indices(&args, 0)
}

/// Clip or wrap `i` into `0..n` (MXNet's index modes); `raise` reports an out-of-bounds index.
fn resolve_index(op: &str, i: i64, n: usize, mode: PickMode) -> Result<usize> {
    if n == 0 {
        // No mode can map an index into an empty axis (clip would give -1, wrap divides by 0).
        crate::bail!(Index, "{op}: index {i} cannot address an axis of size 0");
    }
    let n = n as i64;
    Ok(match mode {
        PickMode::Wrap => i.rem_euclid(n.max(1)),
        PickMode::Clip => i.clamp(0, (n - 1).max(0)),
    } as usize)
}

crate::param_choice! {
    /// What `pick` does with an index outside the axis.
    pub enum PickMode {
        /// Clamp it to the axis.
        Clip = "clip",
        /// Wrap it around (modulo the axis length).
        Wrap = "wrap",
    }
}

/// The zero of an element type.
fn zero<T: Elem>() -> T {
    T::from_f64(0.0)
}

crate::op_params! {
    pub struct PickParams {
        /// The axis to pick along; None flattens the input first.
        axis: Option<i64> = Some(-1),
        /// Keep the picked axis with size 1.
        keepdims: bool = false,
        /// How out-of-bound indices behave.
        mode: PickMode = PickMode::Clip,
    }
}

/// pick(data, index): along `axis`, the element that `index` names for each position.
struct Pick {
    p: PickParams,
}

impl Pick {
    /// (outer, axis length, inner) of the data and the output shape.
    fn layout(&self, data: &Shape) -> Result<((usize, usize, usize), Shape)> {
        let Some(axis) = self.p.axis else {
            let out = if self.p.keepdims { vec![1; data.ndim().max(1)] } else { vec![1] };
            return Ok(((1, data.size(), 1), Shape::new(out)));
        };
        let axis = normalize_axis(axis, data.ndim())?;
        let Some((before, [len, after @ ..])) = data.dims().split_at_checked(axis) else {
            crate::bail!(Shape, "pick: axis {axis} is outside data {data}");
        };
        let kept: &[usize] = if self.p.keepdims { &[1] } else { &[] };
        Ok(((before.iter().product(), *len, after.iter().product()), Shape::new([before, kept, after].concat())))
    }

    /// The parameters as attribute strings, shared by pick and its gradient.
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let axis = self.p.axis.map_or("None".to_string(), |a| a.to_string());
        vec![("axis", axis), ("keepdims", if self.p.keepdims { "True" } else { "False" }.to_string()), ("mode", self.p.mode.name().to_string())]
    }

    /// Whether indices wrap on a GPU (else they are clipped).
    #[cfg(feature = "cuda")]
    fn wraps_on_gpu(&self) -> bool {
        self.p.mode == PickMode::Wrap
    }

    /// The position along the axis (of length `n`) that each index picks, one per output cell.
    fn positions(&self, index: &[i64], n: usize, cells: usize) -> Result<Vec<usize>> {
        if index.len() != cells {
            crate::bail!(Shape, "pick: {} indices for {cells} picked elements", index.len());
        }
        index.iter().map(|&i| resolve_index("pick", i, n, self.p.mode)).collect()
    }
}

/// The position in an (outer, n, inner) array of output cell `cell` picking `pos` along n.
#[inline]
fn picked(cell: usize, pos: usize, n: usize, inner: usize) -> usize {
    ((cell / inner) * n + pos) * inner + cell % inner
}

impl Operator for Pick {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "index".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, index] = exactly("pick", "input", inputs)?;
        let ((_, n, _), out) = self.layout(data)?;
        if index.size() != out.size() {
            crate::bail!(Shape, "pick: index of shape {index} does not match the picked shape {out}");
        }
        if n == 0 && out.size() > 0 {
            crate::bail!(Index, "pick: cannot pick {} element(s) along an axis of size 0 of data {data}", out.size());
        }
        Ok(vec![out])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("pick", "input", inputs)?;
        Ok(vec![data])
    }
    /// Along an axis, the output is the data without it (length 1 with keepdims), its other
    /// dimensions known or not.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let (Some(axis), Some(Some(data))) = (self.p.axis, inputs.first()) else { return Ok(()) };
        let axis = normalize_axis(axis, data.ndim())?;
        let mut out = data.clone();
        if self.p.keepdims {
            if let Some(len) = out.0.get_mut(axis) {
                *len = Some(1);
            }
        } else {
            out.0.remove(axis);
        }
        let [slot] = outputs else {
            crate::bail!(Value, "pick: 1 output expected, got {}", outputs.len());
        };
        merge_partial(slot, &out).map(|_| ())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let ((_, n, inner), _) = self.layout(args.input_shape(0)?)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let pos = self.positions(&read_indices(args, 1)?, n, y.len())?;
            for (cell, (v, &p)) in y.iter_mut().zip(&pos).enumerate() {
                let at = picked(cell, p, n, inner);
                *v = *x.get(at).ok_or_else(|| crate::err!(Runtime, "pick: element {at} lies outside data of {} elements", x.len()))?;
            }
            Ok(())
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([data, index], [out]) = (exactly("pick", "input", inputs)?, exactly("pick", "output", outputs)?);
        let ((_, n, inner), _) = self.layout(&data.shape)?;
        crate::backend::cuda::kernels::pick(gpu, n, inner, self.wraps_on_gpu(), false, data, index, out)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, idx, g) = (d.input(0), d.input(1), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_pick", &self.attrs(), &[&g, &idx, &x])?), None])
    }
}

/// `batch_take(a, indices)`: `a[i, indices[i]]` for each row of a 2-D array (pick along the
/// last axis). MXNet registers no gradient for it, so differentiating through it is an error.
struct BatchTake(Pick);

impl Operator for BatchTake {
    fn input_names(&self) -> Vec<String> {
        vec!["a".into(), "indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.0.infer_shape(inputs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        self.0.infer_type(inputs)
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        self.0.forward(ctx, args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        self.0.forward_gpu(gpu, ctx, inputs, outputs)
    }
}

/// `_backward_pick(grad, index, data)`: zeros shaped like data, with each gradient value placed
/// where pick took it from.
struct PickBackward {
    pick: Pick,
}

impl Operator for PickBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "index".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, index, data] = exactly("_backward_pick", "input", inputs)?;
        let (_, picked) = self.pick.layout(data)?;
        if grad.size() != picked.size() || index.size() != picked.size() {
            crate::bail!(Shape, "_backward_pick: gradient {grad} and index {index} must match the picked shape {picked} of data {data}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _, _] = exactly("_backward_pick", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let ((_, n, inner), _) = self.pick.layout(args.output_shape(0)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let pos = self.pick.positions(&read_indices(args, 1)?, n, g.len())?;
            y.fill(zero());
            for (cell, (&v, &p)) in g.iter().zip(&pos).enumerate() {
                let at = picked(cell, p, n, inner);
                let len = y.len();
                *y.get_mut(at).ok_or_else(|| crate::err!(Runtime, "_backward_pick: element {at} lies outside data of {len} elements"))? = v;
            }
            Ok(())
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([grad, index, _], [out]) = (exactly("_backward_pick", "input", inputs)?, exactly("_backward_pick", "output", outputs)?);
        let ((_, n, inner), _) = self.pick.layout(&out.shape)?;
        crate::backend::cuda::kernels::fill(gpu, out, 0.0)?;
        crate::backend::cuda::kernels::pick(gpu, n, inner, self.pick.wraps_on_gpu(), true, grad, index, out)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (idx, g) = (d.input(1), d.out_grad(0));
        let picked = d.op("pick", &self.pick.attrs(), &[&g, &idx])?;
        Ok(vec![Some(picked), None, None])
    }
}

/// gather_nd(data, indices): indices of shape (M, ...) address the first M axes of data.
struct GatherNd;

/// Row offsets (in units of the trailing block) that each index column addresses, with the block
/// length: data's first M axes are indexed, the rest form the copied block.
fn nd_offsets(op: &str, data: &Shape, idx_shape: &Shape, idx: &[i64]) -> Result<(Vec<usize>, usize)> {
    let m = idx_shape.dims().first().copied().unwrap_or(0);
    let (Some((lead, rest)), false) = (data.dims().split_at_checked(m), m == 0) else {
        crate::bail!(Shape, "{op}: indices {idx_shape} must have a first axis of length 1..={} for data {data}", data.ndim());
    };
    let count = idx_shape.size() / m;
    if idx.len() != count * m {
        crate::bail!(Shape, "{op}: indices {idx_shape} hold {} values", idx.len());
    }
    let block: usize = rest.iter().product();
    let mut offsets = Vec::with_capacity(count);
    for c in 0..count {
        let mut off = 0usize;
        for (axis, (&len, &given)) in lead.iter().zip(idx.iter().skip(c).step_by(count)).enumerate() {
            let n = len as i64;
            // MXNet's gather_nd wraps negative indices; anything else out of range is an error.
            let i = if given < 0 { given + n } else { given };
            if i < 0 || i >= n {
                crate::bail!(Index, "{op}: index {given} is out of bounds for axis {axis} of size {n}");
            }
            off = off * len + i as usize;
        }
        offsets.push(off);
    }
    Ok((offsets, block))
}

fn gathered_shape(data: &Shape, idx: &Shape) -> Shape {
    let m = idx.dims().first().copied().unwrap_or(0).min(data.ndim());
    let mut dims = idx.dims().get(1..).unwrap_or_default().to_vec();
    dims.extend_from_slice(data.dims().get(m..).unwrap_or_default());
    Shape::new(if dims.is_empty() { vec![1] } else { dims })
}

impl Operator for GatherNd {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, indices] = exactly("gather_nd", "input", inputs)?;
        let m = indices.dims().first().copied().unwrap_or(0);
        if m == 0 || m > data.ndim() {
            crate::bail!(Shape, "gather_nd: indices {indices} must have a first axis of length 1..={} for data {data}", data.ndim());
        }
        Ok(vec![gathered_shape(data, indices)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("gather_nd", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "gather_nd";
        let (offsets, block) = nd_offsets(op, args.input_shape(0)?, args.input_shape(1)?, &read_indices(args, 1)?)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if y.len() != offsets.len() * block {
                crate::bail!(Runtime, "gather_nd: {} rows of {block} elements into an output of {}", offsets.len(), y.len());
            }
            if block == 0 {
                return Ok(());
            }
            let min_rows = ((1usize << 16) / (block * std::mem::size_of::<T>())).max(1);
            parallel_units(y, block, min_rows, |first, piece| {
                for (dst, &off) in piece.chunks_exact_mut(block).zip(offsets.get(first..).unwrap_or_default()) {
                    let src = x.get(off * block..(off + 1) * block).ok_or_else(|| {
                        crate::err!(Runtime, "{op}: row {off} of {block} elements lies outside data of {} elements", x.len())
                    })?;
                    dst.copy_from_slice(src);
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, idx, g) = (d.input(0), d.input(1), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_gather_nd", &[], &[&g, &idx, &x])?), None])
    }
}

crate::op_params! {
    pub struct ScatterNdParams {
        /// Shape of the output.
        shape: Vec<i64>,
    }
}

/// scatter_nd(data, indices, shape) and `_backward_gather_nd(grad, indices, like)`: place (or,
/// for the gradient, accumulate) rows of data at the addressed positions of a zero array.
struct ScatterNd {
    shape: Option<Shape>,
    accumulate: bool,
}

impl ScatterNd {
    fn name(&self) -> &'static str {
        if self.shape.is_some() {
            "scatter_nd"
        } else {
            "_backward_gather_nd"
        }
    }
}

impl Operator for ScatterNd {
    fn input_names(&self) -> Vec<String> {
        if self.shape.is_some() {
            vec!["data".into(), "indices".into()]
        } else {
            vec!["grad".into(), "indices".into(), "like".into()]
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (data, indices, target) = match (&self.shape, inputs) {
            (Some(shape), [data, indices]) => (data, indices, shape),
            (None, [grad, indices, like]) => (grad, indices, like),
            _ => crate::bail!(Value, "{}: {} inputs expected, got {}", self.name(), self.input_names().len(), inputs.len()),
        };
        let expected = gathered_shape(target, indices);
        if expected.size() != data.size() {
            crate::bail!(Shape, "scatter_nd: data {data} does not fit indices {indices} into shape {target} (expected {expected})");
        }
        Ok(vec![target.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&data) = inputs.first() else {
            crate::bail!(Value, "{}: {} inputs expected, got none", self.name(), self.input_names().len());
        };
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (offsets, block) = nd_offsets("scatter_nd", args.output_shape(0)?, args.input_shape(1)?, &read_indices(args, 1)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if x.len() != offsets.len() * block {
                crate::bail!(Runtime, "{}: data of {} elements for {} rows of {block}", self.name(), x.len(), offsets.len());
            }
            y.fill(zero());
            if block == 0 {
                return Ok(());
            }
            for (&off, src) in offsets.iter().zip(x.chunks_exact(block)) {
                let len = y.len();
                let dst = y.get_mut(off * block..(off + 1) * block).ok_or_else(|| {
                    crate::err!(Runtime, "{}: row {off} of {block} elements lies outside an output of {len}", self.name())
                })?;
                if self.accumulate {
                    dst.iter_mut().zip(src).for_each(|(a, &b)| *a = T::from_f64(a.to_f64() + b.to_f64()));
                } else {
                    dst.copy_from_slice(src);
                }
            }
            Ok(())
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (idx, g) = (d.input(1), d.out_grad(0));
        let gathered = d.op("gather_nd", &[], &[&g, &idx])?;
        Ok(if self.shape.is_some() { vec![Some(gathered), None] } else { vec![Some(gathered), None, None] })
    }
}

/// `_scatter_set_nd(lhs, rhs, indices, shape)`: lhs with the rows of rhs written at the N-d
/// positions given by indices (the advanced-indexing assignment `x[idx] = v`, run in place on
/// lhs). Like MXNet, it has no gradient.
struct ScatterSetNd {
    shape: Shape,
}

impl Operator for ScatterSetNd {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into(), "indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [lhs, rhs, indices] = exactly("_scatter_set_nd", "input", inputs)?;
        if *lhs != self.shape {
            crate::bail!(Shape, "_scatter_set_nd: lhs {lhs} differs from shape {}", self.shape);
        }
        let expected = gathered_shape(&self.shape, indices);
        if expected.size() != rhs.size() {
            crate::bail!(Shape, "_scatter_set_nd: rhs {rhs} does not fit indices {indices} into shape {} (expected {expected})", self.shape);
        }
        Ok(vec![self.shape.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[lhs, rhs, _] = exactly("_scatter_set_nd", "input", inputs)?;
        if lhs != rhs {
            crate::bail!(Type, "_scatter_set_nd: lhs has dtype {lhs} but rhs has dtype {rhs}");
        }
        Ok(vec![lhs])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_scatter_set_nd";
        let (offsets, block) = nd_offsets(op, args.output_shape(0)?, args.input_shape(2)?, &read_indices(args, 2)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let out = match args.in_place::<T>(0, 0)? {
                InOut::Separate(lhs, out) => {
                    copy_into(lhs, out)?;
                    out
                }
                InOut::Same(out) => out,
            };
            let rhs = args.input::<T>(1)?;
            if rhs.len() != offsets.len() * block {
                crate::bail!(Runtime, "{op}: rhs of {} elements for {} rows of {block}", rhs.len(), offsets.len());
            }
            if block == 0 {
                return Ok(());
            }
            for (&off, src) in offsets.iter().zip(rhs.chunks_exact(block)) {
                let len = out.len();
                let dst = out
                    .get_mut(off * block..(off + 1) * block)
                    .ok_or_else(|| crate::err!(Runtime, "{op}: row {off} of {block} elements lies outside an output of {len}"))?;
                dst.copy_from_slice(src);
            }
            Ok(())
        })
    }
}

crate::op_params! {
    pub struct SliceLikeParams {
        /// Axes to slice; empty slices every axis of shape_like.
        axes: Vec<i64> = Vec::new(),
    }
}

/// slice_like(data, shape_like): the leading corner of data with shape_like's extent on `axes`.
struct SliceLike {
    axes: Vec<i64>,
}

impl SliceLike {
    fn extent(&self, data: &Shape, like: &Shape) -> Result<Vec<usize>> {
        let mut dims = data.dims().to_vec();
        let axes: Vec<usize> = if self.axes.is_empty() {
            if like.ndim() > data.ndim() {
                crate::bail!(Shape, "slice_like: shape_like {like} has more axes than data {data}");
            }
            (0..like.ndim()).collect()
        } else {
            self.axes.iter().map(|&a| normalize_axis(a, data.ndim())).collect::<Result<_>>()?
        };
        for a in axes {
            match (like.dims().get(a), dims.get_mut(a)) {
                (Some(&len), Some(dim)) if len <= *dim => *dim = len,
                _ => crate::bail!(Shape, "slice_like: cannot slice axis {a} of {data} to the extent of {like}"),
            }
        }
        Ok(dims)
    }
}

impl Operator for SliceLike {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "shape_like".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, like] = exactly("slice_like", "input", inputs)?;
        Ok(vec![Shape::new(self.extent(data, like)?)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("slice_like", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        // The leading corner of data: the output's index space over data's strides.
        let (data, corner) = (args.input_shape(0)?.dims(), args.output_shape(0)?.dims());
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            strided_copy("slice_like", corner, (args.input::<T>(0)?, 0, &contiguous(data)), (args.output::<T>(0)?, 0, &contiguous(corner)))
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_slice_like", &[], &[&g, &x])?), None])
    }
}

/// `_backward_slice_like(grad, data)`: zeros shaped like data with grad in the leading corner.
struct SliceLikeBackward;

impl Operator for SliceLikeBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_slice_like", "input", inputs)?;
        if grad.ndim() != data.ndim() || grad.dims().iter().zip(data.dims()).any(|(g, x)| g > x) {
            crate::bail!(Shape, "_backward_slice_like: gradient {grad} does not fit inside {data}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _] = exactly("_backward_slice_like", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (corner, data) = (args.input_shape(0)?.dims(), args.output_shape(0)?.dims());
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            out.fill(zero());
            strided_copy("_backward_slice_like", corner, (g, 0, &contiguous(corner)), (out, 0, &contiguous(data)))
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g_in, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.op("slice_like", &[], &[&g, &g_in])?), None])
    }
}

crate::op_params! {
    pub struct DiagParams {
        /// Diagonal offset: 0 is the main diagonal, positive above, negative below.
        k: i64 = 0,
        /// First axis of the 2-D planes whose diagonals are taken.
        axis1: i64 = 0,
        /// Second axis of those planes.
        axis2: i64 = 1,
    }
}

/// diag: a 1-D input becomes a matrix with it on diagonal k; an N-d input gives the diagonals of
/// its (axis1, axis2) planes, on a new last axis.
struct Diag {
    p: DiagParams,
}

/// Where the diagonal of an N-d array lives: the gather over (kept axes..., diagonal index).
struct DiagPlan {
    out: Shape,
    dims: Vec<usize>,
    base: isize,
    strides: Vec<isize>,
}

impl Diag {
    fn plan(&self, s: &Shape) -> Result<DiagPlan> {
        let (a1, a2) = (normalize_axis(self.p.axis1, s.ndim())?, normalize_axis(self.p.axis2, s.ndim())?);
        if a1 == a2 {
            crate::bail!(Value, "diag: axis1 and axis2 must differ, both are {a1}");
        }
        let st: Vec<isize> = s.strides().into_iter().map(|v| v as isize).collect();
        let (Some(&n1), Some(&n2), Some(&st1), Some(&st2)) = (s.dims().get(a1), s.dims().get(a2), st.get(a1), st.get(a2)) else {
            crate::bail!(Shape, "diag: axes {a1} and {a2} must lie inside {s}");
        };
        let k = self.p.k;
        let (n1, n2) = (n1 as i64, n2 as i64);
        let len = if k >= 0 { n1.min(n2 - k) } else { (n1 + k).min(n2) }.max(0) as usize;
        let base = if k >= 0 { k as isize * st2 } else { -k as isize * st1 };
        let (mut dims, mut strides): (Vec<usize>, Vec<isize>) =
            s.dims().iter().zip(&st).enumerate().filter(|&(i, _)| i != a1 && i != a2).map(|(_, (&len, &stride))| (len, stride)).unzip();
        dims.push(len);
        strides.push(st1 + st2);
        Ok(DiagPlan { out: Shape::new(dims.clone()), dims, base, strides })
    }

    fn matrix_shape(&self, n: usize) -> Shape {
        let m = n + self.p.k.unsigned_abs() as usize;
        Shape::new(vec![m, m])
    }
}

impl Operator for Diag {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("diag", "input", inputs)?;
        match x.dims() {
            [] => crate::bail!(Shape, "diag: the input must have at least one dimension"),
            &[n] => Ok(vec![self.matrix_shape(n)]),
            _ => Ok(vec![self.plan(x)?.out]),
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (x_shape, out_shape) = (args.input_shape(0)?, args.output_shape(0)?);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (x, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if x_shape.ndim() == 1 {
                out.fill(zero());
                let plan = self.plan(out_shape)?;
                return strided_copy("diag", &plan.dims, (x, 0, &[1]), (out, plan.base, &plan.strides));
            }
            let plan = self.plan(x_shape)?;
            strided_copy("diag", &plan.dims, (x, plan.base, &plan.strides), (out, 0, &contiguous(plan.out.dims())))
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        let attrs = [("k", self.p.k.to_string()), ("axis1", self.p.axis1.to_string()), ("axis2", self.p.axis2.to_string())];
        Ok(vec![Some(d.op("_backward_diag", &attrs, &[&g, &x])?)])
    }
}

/// `_backward_diag(grad, data)`: the gradient of diag, shaped like data.
struct DiagBackward {
    diag: Diag,
}

impl Operator for DiagBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_diag", "input", inputs)?;
        let diagonal = self.diag.infer_shape(std::slice::from_ref(data))?;
        let [diagonal] = exactly("_backward_diag", "diag output", &diagonal)?;
        super::check_out_grad("_backward_diag", grad, diagonal)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _] = exactly("_backward_diag", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_diag";
        let (g_shape, out_shape) = (args.input_shape(0)?, args.output_shape(0)?);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if out_shape.ndim() == 1 {
                // The input was the diagonal of the gradient matrix.
                let plan = self.diag.plan(g_shape)?;
                return strided_copy(op, &plan.dims, (g, plan.base, &plan.strides), (out, 0, &[1]));
            }
            out.fill(zero());
            let plan = self.diag.plan(out_shape)?;
            strided_copy(op, &plan.dims, (g, 0, &contiguous(plan.out.dims())), (out, plan.base, &plan.strides))
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let p = &self.diag.p;
        let attrs = [("k", p.k.to_string()), ("axis1", p.axis1.to_string()), ("axis2", p.axis2.to_string())];
        Ok(vec![Some(d.op("diag", &attrs, &[&g])?), None])
    }
}

crate::op_params! {
    pub struct BooleanMaskParams {
        /// The axis along which rows are kept or dropped.
        axis: i64 = 0,
    }
}

/// boolean_mask(data, index): the rows of data (along `axis`) where index is non-zero. The
/// output's length depends on the mask's values.
struct BooleanMask {
    axis: i64,
}

impl BooleanMask {
    /// (outer, axis length, inner) of data and the kept rows, from the index's shape and values.
    fn kept(&self, data: &Shape, index_shape: &Shape, index: &[i64]) -> Result<((usize, usize, usize), Vec<usize>)> {
        let axis = normalize_axis(self.axis, data.ndim())?;
        let (outer, len, inner) = around_axis("boolean_mask", data.dims(), axis)?;
        if index_shape.dims() != [len] {
            crate::bail!(Shape, "boolean_mask: index must be 1-D of length {len} (axis {axis} of {data}), got {index_shape}");
        }
        let rows = index.iter().enumerate().filter(|(_, &v)| v != 0).map(|(i, _)| i).collect();
        Ok(((outer, len, inner), rows))
    }
}

/// Whether a move of `k` kept rows between a full (outer, n, inner) array of `full` elements and
/// a packed (outer, k, inner) one of `packed` elements has anything to move; an error when the
/// arrays do not have those sizes.
fn rows_to_move(op: &str, (outer, n, inner): (usize, usize, usize), k: usize, full: usize, packed: usize) -> Result<bool> {
    if full != outer * n * inner || packed != outer * k * inner {
        crate::bail!(Runtime, "{op}: {k} of {n} rows of {outer} x {inner} elements moved between arrays of {full} and {packed} elements");
    }
    Ok(k > 0 && inner > 0)
}

/// The kept `rows` of a full (outer, n, inner) array, packed as (outer, rows.len(), inner).
fn gather_rows<T: Copy>(op: &str, layout: (usize, usize, usize), rows: &[usize], full: &[T], packed: &mut [T]) -> Result<()> {
    let (_, n, inner) = layout;
    if !rows_to_move(op, layout, rows.len(), full.len(), packed.len())? {
        return Ok(());
    }
    for (full, packed) in full.chunks_exact(n * inner).zip(packed.chunks_exact_mut(rows.len() * inner)) {
        for (&r, packed) in rows.iter().zip(packed.chunks_exact_mut(inner)) {
            let full = full.get(r * inner..(r + 1) * inner).ok_or_else(|| crate::err!(Runtime, "{op}: row {r} lies outside an axis of {n}"))?;
            packed.copy_from_slice(full);
        }
    }
    Ok(())
}

/// The packed rows of `packed` put back in place as the kept `rows` of a full array: the
/// inverse of [`gather_rows`].
fn scatter_rows<T: Copy>(op: &str, layout: (usize, usize, usize), rows: &[usize], packed: &[T], full: &mut [T]) -> Result<()> {
    let (_, n, inner) = layout;
    if !rows_to_move(op, layout, rows.len(), full.len(), packed.len())? {
        return Ok(());
    }
    for (full, packed) in full.chunks_exact_mut(n * inner).zip(packed.chunks_exact(rows.len() * inner)) {
        for (&r, packed) in rows.iter().zip(packed.chunks_exact(inner)) {
            let full = full.get_mut(r * inner..(r + 1) * inner).ok_or_else(|| crate::err!(Runtime, "{op}: row {r} lies outside an axis of {n}"))?;
            full.copy_from_slice(packed);
        }
    }
    Ok(())
}

impl Operator for BooleanMask {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "index".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, _] = exactly("boolean_mask", "input", inputs)?;
        normalize_axis(self.axis, data.ndim())?;
        Ok(vec![data.clone()])
    }
    fn shape_depends_on_values(&self) -> bool {
        true
    }
    fn infer_shape_from_values(&self, inputs: &[Tensor]) -> Result<Vec<Shape>> {
        let [data, index] = exactly("boolean_mask", "input", inputs)?;
        let (_, rows) = self.kept(&data.shape, &index.shape, &tensor_indices(index)?)?;
        let axis = normalize_axis(self.axis, data.shape.ndim())?;
        let mut dims = data.shape.dims().to_vec();
        if let Some(len) = dims.get_mut(axis) {
            *len = rows.len();
        }
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("boolean_mask", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (layout, rows) = self.kept(args.input_shape(0)?, args.input_shape(1)?, &read_indices(args, 1)?)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => gather_rows("boolean_mask", layout, &rows, args.input::<T>(0)?, args.output::<T>(0)?))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, idx, g) = (d.input(0), d.input(1), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_boolean_mask", &[("axis", self.axis.to_string())], &[&g, &idx, &x])?), None])
    }
}

/// `_backward_boolean_mask(grad, index, data)`: zeros like data with grad's rows put back.
struct BooleanMaskBackward {
    mask: BooleanMask,
}

impl Operator for BooleanMaskBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "index".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [_, _, data] = exactly("_backward_boolean_mask", "input", inputs)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _, _] = exactly("_backward_boolean_mask", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_boolean_mask";
        let (layout, rows) = self.mask.kept(args.output_shape(0)?, args.input_shape(1)?, &read_indices(args, 1)?)?;
        let grad = args.input_shape(0)?;
        if rows.len() * layout.0 * layout.2 != grad.size() {
            crate::bail!(Shape, "{op}: gradient {grad} does not match the {} kept rows", rows.len());
        }
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            out.fill(zero());
            scatter_rows(op, layout, &rows, g, out)
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (idx, g) = (d.input(1), d.out_grad(0));
        Ok(vec![Some(d.op("boolean_mask", &[("axis", self.mask.axis.to_string())], &[&g, &idx])?), None, None])
    }
}

crate::op_params! {
    pub struct BackwardPickParams {
        /// The axis picked along; None flattens the input first.
        axis: Option<i64> = Some(-1),
        /// Whether the picked axis was kept with size 1.
        keepdims: bool = false,
        /// How out-of-bound indices behave.
        mode: PickMode = PickMode::Clip,
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    // MXNet's legacy `choose_element_0index(lhs, rhs)` is pick along the last axis.
    add(OpDef::new(
        "pick",
        &["choose_element_0index"],
        "Picks elements from an input array along an axis, by the indices in `index`.",
        |p: PickParams| Ok(Pick { p }),
    ));
    add(OpDef::new("_backward_pick", &[], "Gradient of pick: places grad where pick took its values.", |p: BackwardPickParams| {
        Ok(PickBackward { pick: Pick { p: PickParams { axis: p.axis, keepdims: p.keepdims, mode: p.mode } } })
    }));
    add(OpDef::new("batch_take", &[], "Takes a[i, indices[i]] for each row i of a 2-D array.", |_: NoParams| {
        Ok(BatchTake(Pick { p: PickParams { axis: Some(-1), keepdims: false, mode: PickMode::Clip } }))
    }));
    add(OpDef::new("gather_nd", &[], "Gathers elements or slices of data at the N-d positions given by indices (M, ...).", |_: NoParams| {
        Ok(GatherNd)
    }));
    add(OpDef::new(
        "scatter_nd",
        &[],
        "Scatters data into a new zero array of `shape` at the N-d positions given by indices.",
        |p: ScatterNdParams| {
            let dims = p
                .shape
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| crate::err!(Param, "scatter_nd: negative dimension in shape {:?}", p.shape)))
                .collect::<Result<Vec<_>>>()?;
            Ok(ScatterNd { shape: Some(Shape::new(dims)), accumulate: false })
        },
    ));
    add(OpDef::new(
        "_scatter_set_nd",
        &[],
        "Writes rhs into lhs at the N-d positions given by indices (in place: x[idx] = v).",
        |p: ScatterNdParams| {
            let dims = p
                .shape
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| crate::err!(Param, "_scatter_set_nd: negative dimension in shape {:?}", p.shape)))
                .collect::<Result<Vec<_>>>()?;
            Ok(ScatterSetNd { shape: Shape::new(dims) })
        },
    ));
    add(OpDef::new(
        "_backward_gather_nd",
        &[],
        "Gradient of gather_nd: accumulates grad at the gathered positions of a zero array like `like`.",
        |_: NoParams| Ok(ScatterNd { shape: None, accumulate: true }),
    ));
    add(OpDef::new("slice_like", &[], "Slices data to the shape of shape_like along the given axes (all by default).", |p: SliceLikeParams| {
        Ok(SliceLike { axes: p.axes })
    }));
    add(OpDef::new("_backward_slice_like", &[], "Gradient of slice_like: zeros like data with grad in the leading corner.", |_: NoParams| {
        Ok(SliceLikeBackward)
    }));
    add(OpDef::new(
        "boolean_mask",
        &["_contrib_boolean_mask"],
        "Keeps the rows of data (along axis) where index is non-zero.",
        |p: BooleanMaskParams| Ok(BooleanMask { axis: p.axis }),
    ));
    add(OpDef::new("_backward_boolean_mask", &[], "Gradient of boolean_mask: puts grad's rows back in place.", |p: BooleanMaskParams| {
        Ok(BooleanMaskBackward { mask: BooleanMask { axis: p.axis } })
    }));
    add(OpDef::new("diag", &[], "Extracts a diagonal (N-d input) or builds a diagonal matrix (1-D input).", |p: DiagParams| Ok(Diag { p })));
    add(OpDef::new("_backward_diag", &[], "Gradient of diag.", |p: DiagParams| Ok(DiagBackward { diag: Diag { p } })));
}
