//! Indexing: `slice` (begin/end/step per axis, Python semantics), its assignment forms used by
//! `x[key] = value`, `slice_axis`, and `take`.

use super::grad::{Grad, InputGrads};
use super::shape_ops::{copy_bytes, strided_copy};
use super::{zero_gradient, ExecContext, OpDef, Operator, SendPtr, Tensor};
use crate::base::{merge_partial, normalize_axis, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct SliceParams {
        /// Starting indices for the slice operation, one per leading axis (None means the start).
        begin: Vec<Option<i64>>,
        /// Ending indices (exclusive), one per leading axis (None means the end).
        end: Vec<Option<i64>>,
        /// Step for each axis (None or omitted means 1).
        step: Vec<Option<i64>> = Vec::new(),
    }
}

/// A resolved slice: per axis the first index, the step and the number of elements taken.
struct Region {
    start: Vec<i64>,
    step: Vec<i64>,
    len: Vec<usize>,
}

/// Resolve one axis like Python's `slice.indices`.
fn resolve_axis(begin: Option<i64>, end: Option<i64>, step: Option<i64>, dim: usize) -> Result<(i64, i64, usize)> {
    let step = step.unwrap_or(1);
    if step == 0 {
        crate::bail!(Value, "slice step cannot be zero");
    }
    let n = dim as i64;
    let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
    let norm = |v: i64| if v < 0 { v + n } else { v };
    let (start, stop) = if step > 0 {
        (begin.map_or(0, |b| clamp(norm(b), 0, n)), end.map_or(n, |e| clamp(norm(e), 0, n)))
    } else {
        (begin.map_or(n - 1, |b| clamp(norm(b), -1, n - 1)), end.map_or(-1, |e| clamp(norm(e), -1, n - 1)))
    };
    let (span, stride) = if step > 0 { (stop - start, step) } else { (start - stop, -step) };
    let len = if span <= 0 { 0 } else { (span + stride - 1) / stride };
    Ok((start, step, len as usize))
}

impl SliceParams {
    fn region(&self, op: &str, s: &Shape) -> Result<Region> {
        if self.begin.len() != self.end.len() || (!self.step.is_empty() && self.step.len() != self.begin.len()) {
            crate::bail!(Param, "{op}: begin, end and step must have the same length");
        }
        if self.begin.len() > s.ndim() {
            crate::bail!(Shape, "{op}: {} axes given for an input of shape {s}", self.begin.len());
        }
        let mut r = Region { start: vec![], step: vec![], len: vec![] };
        for d in 0..s.ndim() {
            let (b, e, st) =
                if d < self.begin.len() { (self.begin[d], self.end[d], self.step.get(d).copied().flatten()) } else { (None, None, None) };
            let (start, step, len) = resolve_axis(b, e, st, s[d])?;
            r.start.push(start);
            r.step.push(step);
            r.len.push(len);
        }
        Ok(r)
    }
}

impl SliceParams {
    /// The region as MXNet attribute strings, for gradient nodes.
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let text = |v: &[Option<i64>]| {
            let items: Vec<String> = v.iter().map(|x| x.map_or("None".to_string(), |i| i.to_string())).collect();
            if items.len() == 1 {
                format!("({},)", items[0])
            } else {
                format!("({})", items.join(", "))
            }
        };
        vec![("begin", text(&self.begin)), ("end", text(&self.end)), ("step", text(&self.step))]
    }
}

impl Region {
    /// Base offset and per-axis strides of the region inside a contiguous array of shape `s`.
    fn strides_in(&self, s: &Shape) -> (isize, Vec<isize>) {
        let st = s.strides();
        let base = self.start.iter().zip(&st).map(|(&b, &t)| b as isize * t as isize).sum::<isize>();
        (base, self.step.iter().zip(&st).map(|(&k, &t)| k as isize * t as isize).collect())
    }
}

fn contiguous(s: &[usize]) -> Vec<isize> {
    Shape::new(s.to_vec()).strides().into_iter().map(|v| v as isize).collect()
}

struct Slice {
    p: SliceParams,
}

impl Operator for Slice {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![Shape::new(self.p.region("slice", &inputs[0])?.len)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let x = &inputs[0];
        let r = self.p.region("slice", &x.shape)?;
        let (base, ss) = r.strides_in(&x.shape);
        crate::dispatch_dtype!(x.dtype, T => strided_copy::<T>(&r.len, x.ptr::<T>(), base, &ss, outputs[0].ptr::<T>(), 0, &contiguous(&r.len)));
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let x = &inputs[0];
        let r = self.p.region("slice", &x.shape)?;
        let (base, ss) = r.strides_in(&x.shape);
        strided_copy(gpu, &r.len, Strided { tensor: x, base, strides: &ss }, Strided { tensor: &outputs[0], base: 0, strides: &contiguous(&r.len) })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        let zeros = d.unary("zeros_like", &x)?;
        Ok(vec![Some(d.op("_slice_assign", &self.p.attrs(), &[&zeros, &g])?)])
    }
}

struct SliceAssign {
    p: SliceParams,
}

impl Operator for SliceAssign {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let r = self.p.region("_slice_assign", &inputs[0])?;
        if inputs[1].dims() != r.len.as_slice() {
            crate::bail!(Shape, "_slice_assign: value of shape {} does not fit the region {} of {}", inputs[1], Shape::new(r.len), inputs[0]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (lhs, rhs, out) = (&inputs[0], &inputs[1], &outputs[0]);
        copy_bytes(lhs, out);
        let r = self.p.region("_slice_assign", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&r.len, rhs.ptr::<T>(), 0, &contiguous(&r.len), out.ptr::<T>(), base, &ds));
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{copy_bytes, strided_copy, Strided};
        let (lhs, rhs, out) = (&inputs[0], &inputs[1], &outputs[0]);
        copy_bytes(gpu, lhs, out)?;
        let r = self.p.region("_slice_assign", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        strided_copy(gpu, &r.len, Strided { tensor: rhs, base: 0, strides: &contiguous(&r.len) }, Strided { tensor: out, base, strides: &ds })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let mut cleared = self.p.attrs();
        cleared.push(("scalar", "0.0".to_string()));
        let lhs = d.op("_slice_assign_scalar", &cleared, &[&g])?;
        let rhs = d.op("slice", &self.p.attrs(), &[&g])?;
        Ok(vec![Some(lhs), Some(rhs)])
    }
}

crate::op_params! {
    pub struct SliceAssignScalarParams {
        /// The scalar value written to the region.
        scalar: f64 = 0.0,
        /// Starting indices for the slice operation.
        begin: Vec<Option<i64>>,
        /// Ending indices (exclusive).
        end: Vec<Option<i64>>,
        /// Steps per axis.
        step: Vec<Option<i64>> = Vec::new(),
    }
}

struct SliceAssignScalar {
    scalar: f64,
    p: SliceParams,
}

impl Operator for SliceAssignScalar {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.p.region("_slice_assign_scalar", &inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        copy_bytes(&inputs[0], out);
        let r = self.p.region("_slice_assign_scalar", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        crate::dispatch_dtype!(out.dtype, T => {
            let v = [T::from_f64(self.scalar)];
            strided_copy::<T>(&r.len, v.as_ptr(), 0, &vec![0; r.len.len()], out.ptr::<T>(), base, &ds)
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let mut cleared = self.p.attrs();
        cleared.push(("scalar", "0.0".to_string()));
        Ok(vec![Some(d.op("_slice_assign_scalar", &cleared, &[&g])?)])
    }
}

crate::op_params! {
    pub struct SliceAxisParams {
        /// Axis along which to be sliced.
        axis: i64,
        /// The beginning index along the axis.
        begin: i64,
        /// The ending index along the axis (None means the end).
        end: Option<i64>,
    }
}

crate::op_params! {
    pub struct TakeParams {
        /// The axis of the input array to be taken.
        axis: i64 = 0,
        /// How out-of-bound indices behave.
        mode: TakeMode = TakeMode::Clip,
    }
}

crate::param_choice! {
    /// What `take` does with an index outside the axis.
    pub enum TakeMode {
        /// Clamp it to the axis.
        Clip = "clip",
        /// Wrap it around (modulo the axis length).
        Wrap = "wrap",
        /// Raise an error (a negative index counts from the end).
        Raise = "raise",
    }
}

struct Take {
    axis: i64,
    mode: TakeMode,
}

impl Operator for Take {
    fn input_names(&self) -> Vec<String> {
        vec!["a".into(), "indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (a, idx) = (&inputs[0], &inputs[1]);
        let axis = normalize_axis(self.axis, a.ndim())?;
        if a[axis] == 0 && idx.size() > 0 {
            // Every mode maps an index into the axis; an empty axis has no element to map to.
            crate::bail!(Index, "take: cannot take indices {idx} from axis {axis} of size 0 of array {a}");
        }
        let mut dims = a.dims()[..axis].to_vec();
        dims.extend_from_slice(idx.dims());
        dims.extend_from_slice(&a.dims()[axis + 1..]);
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (a, idx, out) = (&inputs[0], &inputs[1], &outputs[0]);
        let axis = normalize_axis(self.axis, a.shape.ndim())?;
        let n = a.shape[axis] as i64;
        let rows = self.resolve_rows(idx, n, axis)?;
        let es = a.dtype.size();
        let outer: usize = a.shape.dims()[..axis].iter().product();
        let inner: usize = a.shape.dims()[axis + 1..].iter().product::<usize>() * es;
        let (ap, op) = (SendPtr(a.raw()), SendPtr(out.raw()));
        let k = rows.len();
        super::parallel_chunks(outer * k, ((1usize << 16) / inner.max(1)).max(1), |r| {
            for t in r {
                let (o, j) = (t / k, t % k);
                // SAFETY: rows[j] < n, so the source block is inside `a`; each t owns one output block.
                unsafe { std::ptr::copy_nonoverlapping(ap.get().add((o * n as usize + rows[j]) * inner), op.get().add(t * inner), inner) };
            }
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, idx, g) = (d.input(0), d.input(1), d.out_grad(0));
        let attrs = [("axis", self.axis.to_string()), ("mode", self.mode.name().to_string())];
        Ok(vec![Some(d.op("_backward_take", &attrs, &[&g, &idx, &a])?), None])
    }
}

impl Take {
    /// The row each index selects along `axis` of length `n`, under the out-of-bounds mode.
    fn resolve_rows(&self, idx: &Tensor, n: i64, axis: usize) -> Result<Vec<usize>> {
        let indices: Vec<i64> = crate::dispatch_dtype!(idx.dtype, I => {
            // SAFETY: idx is an input of this op and is not written by it.
            unsafe { idx.slice::<I>() }.iter().map(|v| v.to_f64() as i64).collect()
        });
        indices
            .into_iter()
            .map(|i| {
                Ok(match self.mode {
                    TakeMode::Wrap => i.rem_euclid(n.max(1)),
                    TakeMode::Raise if i < -n || i >= n => {
                        crate::bail!(Index, "take: index {i} is out of bounds for axis {axis} with size {n}")
                    }
                    TakeMode::Raise => i.rem_euclid(n.max(1)),
                    TakeMode::Clip => i.clamp(0, (n - 1).max(0)),
                } as usize)
            })
            .collect()
    }
}

/// `_backward_take(grad, indices, a)`: scatter-adds the gradient rows back to the rows of `a`
/// they were taken from.
struct TakeBackward {
    take: Take,
}

impl Operator for TakeBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "indices".into(), "a".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let taken = self.take.infer_shape(&[inputs[2].clone(), inputs[1].clone()])?;
        if taken[0] != inputs[0] {
            crate::bail!(Shape, "_backward_take: gradient {} does not match take's output {}", inputs[0], taken[0]);
        }
        Ok(vec![inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, idx, out) = (&inputs[0], &inputs[1], &outputs[0]);
        let axis = normalize_axis(self.take.axis, out.shape.ndim())?;
        let n = out.shape[axis];
        let rows = self.take.resolve_rows(idx, n as i64, axis)?;
        let outer: usize = out.shape.dims()[..axis].iter().product();
        let inner: usize = out.shape.dims()[axis + 1..].iter().product();
        let k = rows.len();
        crate::dispatch_dtype!(out.dtype, T => {
            // SAFETY: the output is this op's alone; the gradient is an input it does not write.
            let (o, gv) = unsafe { (out.slice_mut::<T>(), g.slice::<T>()) };
            let mut acc = vec![0f64; o.len()];
            // Parallel over the outer blocks: each owns its slice of the accumulator.
            let block = n * inner;
            let acc_ptr = SendPtr(acc.as_mut_ptr());
            super::parallel_chunks(outer, ((1usize << 15) / (k * inner).max(1)).max(1), |os| {
                for ob in os {
                    for (j, &row) in rows.iter().enumerate() {
                        for c in 0..inner {
                            // SAFETY: block `ob` of the accumulator belongs to this task alone.
                            unsafe { *acc_ptr.get().add(ob * block + row * inner + c) += gv[(ob * k + j) * inner + c].to_f64() };
                        }
                    }
                }
            });
            o.iter_mut().zip(&acc).for_each(|(v, &a)| *v = T::from_f64(a));
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (idx, g) = (d.input(1), d.out_grad(0));
        let attrs = [("axis", self.take.axis.to_string()), ("mode", self.take.mode.name().to_string())];
        Ok(vec![Some(d.op("take", &attrs, &[&g, &idx])?), None, None])
    }
}

crate::op_params! {
    pub struct OneHotParams {
        /// Depth of the one-hot dimension.
        depth: usize,
        /// Value at the index position.
        on_value: f64 = 1.0,
        /// Value elsewhere.
        off_value: f64 = 0.0,
        /// Output dtype.
        dtype: DType = DType::F32,
    }
}

struct OneHot {
    p: OneHotParams,
}

impl Operator for OneHot {
    fn input_names(&self) -> Vec<String> {
        vec!["indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let mut dims = inputs[0].dims().to_vec();
        dims.push(self.p.depth);
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![self.p.dtype])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        zero_gradient(d)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let idx = &inputs[0];
        let indices: Vec<i64> = crate::dispatch_dtype!(idx.dtype, I => {
            // SAFETY: the indices are an input this op does not write.
            unsafe { idx.slice::<I>() }.iter().map(|v| v.to_f64() as i64).collect()
        });
        let depth = self.p.depth;
        let (on, off) = (self.p.on_value, self.p.off_value);
        crate::dispatch_dtype!(outputs[0].dtype, T => {
            let (on, off) = (T::from_f64(on), T::from_f64(off));
            let op = SendPtr(outputs[0].ptr::<T>());
            super::parallel_chunks(indices.len(), (1 << 14) / depth.max(1) + 1, |rows| {
                for r in rows {
                    for c in 0..depth {
                        // SAFETY: row r of the (n, depth) output belongs to this task alone.
                        unsafe { *op.get().add(r * depth + c) = if indices[r] == c as i64 { on } else { off } };
                    }
                }
            })
        });
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "one_hot",
        &[],
        "Returns a one-hot array: the last axis of length depth holds on_value at each index, off_value elsewhere \
         (indices outside [0, depth) give a row of off_value).",
        |p: OneHotParams| Ok(OneHot { p }),
    ));
    add(OpDef::new(
        "slice",
        &["_slice", "crop"],
        "Slices a region of the array: begin/end/step per leading axis, with Python slice semantics.",
        |p: SliceParams| Ok(Slice { p }),
    ));
    add(OpDef::new(
        "_slice_assign",
        &["_crop_assign"],
        "Assigns rhs to the region of lhs given by begin/end/step; returns the updated lhs.",
        |p: SliceParams| Ok(SliceAssign { p }),
    ));
    add(OpDef::new(
        "_slice_assign_scalar",
        &["_crop_assign_scalar"],
        "Assigns a scalar to the region of the input given by begin/end/step.",
        |p: SliceAssignScalarParams| Ok(SliceAssignScalar { scalar: p.scalar, p: SliceParams { begin: p.begin, end: p.end, step: p.step } }),
    ));
    add(OpDef::new("slice_axis", &[], "Slices along a given axis: elements begin..end of that axis.", |p: SliceAxisParams| {
        Ok(SliceAxis { axis: p.axis, begin: p.begin, end: p.end })
    }));
    add(OpDef::new(
        "_backward_slice_axis",
        &[],
        "Gradient of slice_axis: zeros shaped like data with grad in the sliced region.",
        |p: SliceAxisParams| Ok(SliceAxisBackward { slice: SliceAxis { axis: p.axis, begin: p.begin, end: p.end } }),
    ));
    add(OpDef::new("take", &[], "Takes elements from an input array along the given axis, by integer indices.", |p: TakeParams| {
        Ok(Take { axis: p.axis, mode: p.mode })
    }));
    add(OpDef::new("Embedding", &[], "Maps integer indices to rows of a weight matrix (input_dim, output_dim).", |p: EmbeddingParams| {
        if p.input_dim == 0 || p.output_dim == 0 {
            crate::bail!(Param, "Embedding: input_dim and output_dim must be at least 1, got input_dim={} output_dim={}", p.input_dim, p.output_dim);
        }
        Ok(Embedding { take: Take { axis: 0, mode: TakeMode::Clip }, input_dim: p.input_dim, output_dim: p.output_dim })
    }));
    add(OpDef::new("_backward_take", &[], "Gradient of take: scatter-adds grad rows back to the rows they were taken from.", |p: TakeParams| {
        Ok(TakeBackward { take: Take { axis: p.axis, mode: p.mode } })
    }));
}

crate::op_params! {
    /// sparse_grad is accepted (gradients are dense here); dtype only names the weight's type.
    #[allow(dead_code)]
    pub struct EmbeddingParams {
        /// Vocabulary size: rows of the weight.
        input_dim: usize,
        /// Dimension of each embedding vector.
        output_dim: usize,
        /// Data type of the weight.
        dtype: DType = DType::F32,
        /// Compute a row-sparse weight gradient (accepted; the gradient is dense).
        sparse_grad: bool = false,
    }
}

/// Embedding(data, weight): the weight rows the indices in data name (take along axis 0).
struct Embedding {
    take: Take,
    input_dim: usize,
    output_dim: usize,
}

impl Operator for Embedding {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "weight".into()]
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        inputs[1].get_or_insert_with(|| Shape::new(vec![self.input_dim, self.output_dim]));
        Ok(())
    }
    /// The output is the data's shape with an axis of output_dim appended, known or not.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        merge_partial(&mut inputs[1], &PartialShape(vec![Some(self.input_dim), Some(self.output_dim)]))?;
        if let Some(data) = inputs[0].clone() {
            let mut out = data;
            out.0.push(Some(self.output_dim));
            merge_partial(&mut outputs[0], &out)?;
        }
        if let Some(out) = outputs[0].clone() {
            if out.ndim() == 0 {
                crate::bail!(Shape, "Embedding: the output needs at least one dimension, got {out}");
            }
            merge_partial(&mut inputs[0], &PartialShape(out.0[..out.ndim() - 1].to_vec()))?;
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let expected = Shape::new(vec![self.input_dim, self.output_dim]);
        if inputs[1] != expected {
            crate::bail!(Shape, "Embedding: weight has shape {}, expected {expected}", inputs[1]);
        }
        self.take.infer_shape(&[inputs[1].clone(), inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[1]])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        args.delegate(&self.take, &[inputs[1].clone(), inputs[0].clone()], outputs, |swapped| self.take.forward(ctx, swapped))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (data, weight, g) = (d.input(0), d.input(1), d.out_grad(0));
        let attrs = [("axis", "0".to_string()), ("mode", self.take.mode.name().to_string())];
        Ok(vec![None, Some(d.op("_backward_take", &attrs, &[&g, &data, &weight])?)])
    }
}

/// `slice_axis` is a `slice` whose leading axes before `axis` take everything.
struct SliceAxis {
    axis: i64,
    begin: i64,
    end: Option<i64>,
}

impl SliceAxis {
    fn as_slice(&self, s: &Shape) -> Result<SliceParams> {
        let axis = normalize_axis(self.axis, s.ndim())?;
        let mut begin = vec![None; axis + 1];
        let mut end = vec![None; axis + 1];
        begin[axis] = Some(self.begin);
        end[axis] = self.end;
        Ok(SliceParams { begin, end, step: Vec::new() })
    }
}

impl Operator for SliceAxis {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Slice { p: self.as_slice(&inputs[0])? }.infer_shape(inputs)
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        Slice { p: self.as_slice(&args.inputs()[0].shape)? }.forward(ctx, args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        Slice { p: self.as_slice(&inputs[0].shape)? }.forward_gpu(gpu, ctx, inputs, outputs)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        let attrs =
            [("axis", self.axis.to_string()), ("begin", self.begin.to_string()), ("end", self.end.map_or("None".to_string(), |e| e.to_string()))];
        Ok(vec![Some(d.op("_backward_slice_axis", &attrs, &[&g, &x])?)])
    }
}

/// `_backward_slice_axis(grad, data)`: zeros shaped like `data` with `grad` in the sliced region.
struct SliceAxisBackward {
    slice: SliceAxis,
}

impl Operator for SliceAxisBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let sliced = self.slice.infer_shape(&inputs[1..])?;
        if sliced[0] != inputs[0] {
            crate::bail!(Shape, "_backward_slice_axis: gradient {} does not match the slice {} of {}", inputs[0], sliced[0], inputs[1]);
        }
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, out) = (&inputs[0], &outputs[0]);
        // SAFETY: the output is this op's alone.
        unsafe { std::ptr::write_bytes(out.raw(), 0, out.size() * out.dtype.size()) };
        let r = self.slice.as_slice(&out.shape)?.region("_backward_slice_axis", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&r.len, g.ptr::<T>(), 0, &contiguous(&r.len), out.ptr::<T>(), base, &ds));
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{fill, strided_copy, Strided};
        let (g, out) = (&inputs[0], &outputs[0]);
        fill(gpu, out, 0.0)?;
        let r = self.slice.as_slice(&out.shape)?.region("_backward_slice_axis", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        strided_copy(gpu, &r.len, Strided { tensor: g, base: 0, strides: &contiguous(&r.len) }, Strided { tensor: out, base, strides: &ds })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let attrs = [
            ("axis", self.slice.axis.to_string()),
            ("begin", self.slice.begin.to_string()),
            ("end", self.slice.end.map_or("None".to_string(), |e| e.to_string())),
        ];
        Ok(vec![Some(d.op("slice_axis", &attrs, &[&g])?), None])
    }
}
