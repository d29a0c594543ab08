//! Indexing: `slice` (begin/end/step per axis, Python semantics), its assignment forms used by
//! `x[key] = value`, `slice_axis`, and `take`.

use super::broadcast::copy_into;
use super::grad::{Grad, InputGrads};
use super::shape_ops::strided_copy;
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, zero_gradient, ExecContext, OpDef, Operator};
use crate::base::{merge_partial, normalize_axis, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::{InOut, KernelArgs};

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
        for (d, &dim) in s.dims().iter().enumerate() {
            let (b, e, st) = match (self.begin.get(d), self.end.get(d)) {
                (Some(&b), Some(&e)) => (b, e, self.step.get(d).copied().flatten()),
                _ => (None, None, None),
            };
            let (start, step, len) = resolve_axis(b, e, st, dim)?;
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
            if let [only] = items.as_slice() {
                format!("({only},)")
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

/// The dims before `axis`, its length and the dims after it.
fn split_axis<'a>(op: &str, dims: &'a [usize], axis: usize) -> Result<(&'a [usize], usize, &'a [usize])> {
    match dims.split_at_checked(axis) {
        Some((before, [len, after @ ..])) => Ok((before, *len, after)),
        _ => crate::bail!(Shape, "{op}: axis {axis} is outside a shape of {} dimensions", dims.len()),
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
        let [x] = exactly("slice", "input", inputs)?;
        Ok(vec![Shape::new(self.p.region("slice", x)?.len)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.input_shape(0)?;
        let r = self.p.region("slice", shape)?;
        let (base, ss) = r.strides_in(shape);
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            strided_copy("slice", &r.len, (args.input::<T>(0)?, base, &ss), (args.output::<T>(0)?, 0, &contiguous(&r.len)))
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let ([x], [out]) = (exactly("slice", "input", inputs)?, exactly("slice", "output", outputs)?);
        let r = self.p.region("slice", &x.shape)?;
        let (base, ss) = r.strides_in(&x.shape);
        strided_copy(gpu, &r.len, Strided { tensor: x, base, strides: &ss }, Strided { tensor: out, base: 0, strides: &contiguous(&r.len) })
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
        let [lhs, rhs] = exactly("_slice_assign", "input", inputs)?;
        let r = self.p.region("_slice_assign", lhs)?;
        if rhs.dims() != r.len.as_slice() {
            crate::bail!(Shape, "_slice_assign: value of shape {rhs} does not fit the region {} of {lhs}", Shape::new(r.len));
        }
        Ok(vec![lhs.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [out] = exactly("_slice_assign", "output", args.outputs())?;
        let r = self.p.region("_slice_assign", &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        crate::dispatch_dtype!(out.dtype, T => {
            let assigned = match args.in_place::<T>(0, 0)? {
                InOut::Separate(lhs, assigned) => {
                    copy_into(lhs, assigned)?;
                    assigned
                }
                InOut::Same(assigned) => assigned,
            };
            strided_copy("_slice_assign", &r.len, (args.input::<T>(1)?, 0, &contiguous(&r.len)), (assigned, base, &ds))
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{copy_bytes, strided_copy, Strided};
        let ([lhs, rhs], [out]) = (exactly("_slice_assign", "input", inputs)?, exactly("_slice_assign", "output", outputs)?);
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
        let [x] = exactly("_slice_assign_scalar", "input", inputs)?;
        self.p.region("_slice_assign_scalar", x)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_slice_assign_scalar";
        let [out] = exactly(op, "output", args.outputs())?;
        let r = self.p.region(op, &out.shape)?;
        let (base, ds) = r.strides_in(&out.shape);
        crate::dispatch_dtype!(out.dtype, T => {
            let assigned = match args.in_place::<T>(0, 0)? {
                InOut::Separate(x, assigned) => {
                    copy_into(x, assigned)?;
                    assigned
                }
                InOut::Same(assigned) => assigned,
            };
            let v = [T::from_f64(self.scalar)];
            strided_copy(op, &r.len, (&v, 0, &vec![0; r.len.len()]), (assigned, base, &ds))
        })
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
        let [a, idx] = exactly("take", "input", inputs)?;
        let axis = normalize_axis(self.axis, a.ndim())?;
        let (before, len, after) = split_axis("take", a.dims(), axis)?;
        if len == 0 && idx.size() > 0 {
            // Every mode maps an index into the axis; an empty axis has no element to map to.
            crate::bail!(Index, "take: cannot take indices {idx} from axis {axis} of size 0 of array {a}");
        }
        Ok(vec![Shape::new([before, idx.dims(), after].concat())])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[a, _] = exactly("take", "input", inputs)?;
        Ok(vec![a])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.input_shape(0)?;
        let axis = normalize_axis(self.axis, shape.ndim())?;
        let (_, n, after) = split_axis("take", shape.dims(), axis)?;
        let rows = self.resolve_rows(&args.input_f64(1)?, n as i64, axis)?;
        let inner: usize = after.iter().product();
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (a, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let k = rows.len();
            // An empty output: nothing to copy (and `chunks` needs a nonzero length).
            if inner == 0 || k == 0 {
                return Ok(());
            }
            let min_blocks = ((1usize << 16) / (inner * std::mem::size_of::<T>())).max(1);
            super::parallel_units(out, inner, min_blocks, |first_block, piece| {
                let blocks = (first_block..).zip(piece.chunks_mut(inner));
                for ((t, block), &row) in blocks.zip(rows.iter().cycle().skip(first_block % k)) {
                    let start = (t / k * n + row) * inner;
                    let src = a.get(start..start + block.len()).ok_or_else(|| {
                        crate::err!(Runtime, "take: row {row} of block {} lies outside the input of {} elements", t / k, a.len())
                    })?;
                    block.copy_from_slice(src);
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, idx, g) = (d.input(0), d.input(1), d.out_grad(0));
        let attrs = [("axis", self.axis.to_string()), ("mode", self.mode.name().to_string())];
        Ok(vec![Some(d.op("_backward_take", &attrs, &[&g, &idx, &a])?), None])
    }
}

impl Take {
    /// The row each index selects along `axis` of length `n`, under the out-of-bounds mode.
    fn resolve_rows(&self, indices: &[f64], n: i64, axis: usize) -> Result<Vec<usize>> {
        indices
            .iter()
            .map(|&v| {
                let i = v as i64;
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
        let [g, idx, a] = exactly("_backward_take", "input", inputs)?;
        let taken = self.take.infer_shape(&[a.clone(), idx.clone()])?;
        let [taken] = exactly("_backward_take", "take output", &taken)?;
        if taken != g {
            crate::bail!(Shape, "_backward_take: gradient {g} does not match take's output {taken}");
        }
        Ok(vec![a.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[g, _, _] = exactly("_backward_take", "input", inputs)?;
        Ok(vec![g])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.output_shape(0)?;
        let axis = normalize_axis(self.take.axis, shape.ndim())?;
        let (_, n, after) = split_axis("_backward_take", shape.dims(), axis)?;
        let rows = self.take.resolve_rows(&args.input_f64(1)?, n as i64, axis)?;
        let inner: usize = after.iter().product();
        let k = rows.len();
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let mut acc = vec![0f64; out.len()];
            let block = n * inner;
            // An empty block leaves nothing to accumulate (and `chunks` needs a nonzero length).
            if block > 0 {
                // Parallel over the outer blocks: each owns its slice of the accumulator.
                super::parallel_units(&mut acc, block, ((1usize << 15) / (k * inner).max(1)).max(1), |first_block, piece| {
                    for (ob, acc_block) in (first_block..).zip(piece.chunks_mut(block)) {
                        let grad_block = g.get(ob * k * inner..(ob + 1) * k * inner).ok_or_else(|| {
                            crate::err!(Runtime, "_backward_take: gradient of {} elements has no block {ob} of {k} rows of {inner}", g.len())
                        })?;
                        for (&row, grad_row) in rows.iter().zip(grad_block.chunks_exact(inner)) {
                            let dst = acc_block.get_mut(row * inner..(row + 1) * inner).ok_or_else(|| {
                                crate::err!(Runtime, "_backward_take: row {row} lies outside the axis of length {n}")
                            })?;
                            dst.iter_mut().zip(grad_row).for_each(|(sum, &v)| *sum += v.to_f64());
                        }
                    }
                    Ok(())
                })?;
            }
            out.iter_mut().zip(&acc).for_each(|(v, &a)| *v = T::from_f64(a));
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
        let [indices] = exactly("one_hot", "input", inputs)?;
        let mut dims = indices.dims().to_vec();
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
        let indices = args.input_f64(0)?;
        let depth = self.p.depth;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (on, off) = (T::from_f64(self.p.on_value), T::from_f64(self.p.off_value));
            let out = args.output::<T>(0)?;
            if out.len() != indices.len() * depth {
                crate::bail!(Runtime, "one_hot: output of {} elements for {} indices of depth {depth}", out.len(), indices.len());
            }
            // Depth 0 leaves an empty output (and `chunks` needs a nonzero length).
            if depth == 0 {
                return Ok(());
            }
            super::parallel_units(out, depth, (1 << 14) / depth + 1, |first_row, piece| {
                let piece_indices = indices.get(first_row..).unwrap_or_default();
                for (row, &index) in piece.chunks_mut(depth).zip(piece_indices) {
                    row.fill(off);
                    // An index outside [0, depth) leaves the whole row off.
                    if let Some(hot) = usize::try_from(index as i64).ok().and_then(|i| row.get_mut(i)) {
                        *hot = on;
                    }
                }
                Ok(())
            })
        })
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
        let [_, weight] = inputs else {
            crate::bail!(Shape, "Embedding: 2 inputs (data, weight) expected, got {}", inputs.len());
        };
        weight.get_or_insert_with(|| Shape::new(vec![self.input_dim, self.output_dim]));
        Ok(())
    }
    /// The output is the data's shape with an axis of output_dim appended, known or not.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let counts = (inputs.len(), outputs.len());
        let ([data, weight], [output]) = (inputs, outputs) else {
            crate::bail!(Shape, "Embedding: 2 inputs and 1 output expected, got {} and {}", counts.0, counts.1);
        };
        merge_partial(weight, &PartialShape(vec![Some(self.input_dim), Some(self.output_dim)]))?;
        if let Some(mut out) = data.clone() {
            out.0.push(Some(self.output_dim));
            merge_partial(output, &out)?;
        }
        if let Some(out) = output.as_ref() {
            let Some((_, leading)) = out.0.split_last() else {
                crate::bail!(Shape, "Embedding: the output needs at least one dimension, got {out}");
            };
            merge_partial(data, &PartialShape(leading.to_vec()))?;
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, weight] = exactly("Embedding", "input", inputs)?;
        let expected = Shape::new(vec![self.input_dim, self.output_dim]);
        if *weight != expected {
            crate::bail!(Shape, "Embedding: weight has shape {weight}, expected {expected}");
        }
        self.take.infer_shape(&[weight.clone(), data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, weight] = exactly("Embedding", "input", inputs)?;
        Ok(vec![weight])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [data, weight] = exactly("Embedding", "input", args.inputs())?;
        args.delegate(&self.take, &[weight.clone(), data.clone()], args.outputs(), |swapped| self.take.forward(ctx, swapped))
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
        let (mut begin, mut end) = (vec![None; axis], vec![None; axis]);
        begin.push(Some(self.begin));
        end.push(self.end);
        Ok(SliceParams { begin, end, step: Vec::new() })
    }
}

impl Operator for SliceAxis {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("slice_axis", "input", inputs)?;
        Slice { p: self.as_slice(x)? }.infer_shape(inputs)
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        Slice { p: self.as_slice(args.input_shape(0)?)? }.forward(ctx, args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let [x] = exactly("slice_axis", "input", inputs)?;
        Slice { p: self.as_slice(&x.shape)? }.forward_gpu(gpu, ctx, inputs, outputs)
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
        let [g, data] = exactly("_backward_slice_axis", "input", inputs)?;
        let sliced = self.slice.infer_shape(std::slice::from_ref(data))?;
        let [sliced] = exactly("_backward_slice_axis", "slice output", &sliced)?;
        if sliced != g {
            crate::bail!(Shape, "_backward_slice_axis: gradient {g} does not match the slice {sliced} of {data}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[g, _] = exactly("_backward_slice_axis", "input", inputs)?;
        Ok(vec![g])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_slice_axis";
        let shape = args.output_shape(0)?;
        let r = self.slice.as_slice(shape)?.region(op, shape)?;
        let (base, ds) = r.strides_in(shape);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (g, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            out.fill(T::from_f64(0.0));
            strided_copy(op, &r.len, (g, 0, &contiguous(&r.len)), (out, base, &ds))
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{fill, strided_copy, Strided};
        let op = "_backward_slice_axis";
        let ([g, _], [out]) = (exactly(op, "input", inputs)?, exactly(op, "output", outputs)?);
        fill(gpu, out, 0.0)?;
        let r = self.slice.as_slice(&out.shape)?.region(op, &out.shape)?;
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
