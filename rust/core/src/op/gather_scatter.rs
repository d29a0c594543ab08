//! Index-driven selection and placement: pick, batch_take, gather_nd, scatter_nd, slice_like and
//! diag, each with the scatter (or gather) that is its gradient.

use super::grad::{Grad, InputGrads};
use super::params::NoParams;
use super::shape_ops::strided_copy;
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor};
use crate::base::{merge_partial, normalize_axis, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// Index values of an integer- or float-typed index tensor, as i64.
fn read_indices(idx: &Tensor) -> Vec<i64> {
    crate::dispatch_dtype!(idx.dtype, I => {
        // SAFETY: index tensors are inputs the running op does not write.
        unsafe { idx.slice::<I>() }.iter().map(|v| v.to_f64() as i64).collect()
    })
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

fn zero_fill(out: &Tensor) {
    // SAFETY: the output is the running op's alone.
    unsafe { std::ptr::write_bytes(out.raw(), 0, out.size() * out.dtype.size()) };
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
        let d = data.dims();
        let mut out = d.to_vec();
        if self.p.keepdims {
            out[axis] = 1;
        } else {
            out.remove(axis);
        }
        Ok(((d[..axis].iter().product(), d[axis], d[axis + 1..].iter().product()), Shape::new(out)))
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

    fn positions(&self, index: &Tensor, n: usize) -> Result<Vec<usize>> {
        read_indices(index).into_iter().map(|i| resolve_index("pick", i, n, self.p.mode)).collect()
    }
}

impl Operator for Pick {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "index".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let ((_, n, _), out) = self.layout(&inputs[0])?;
        if inputs[1].size() != out.size() {
            crate::bail!(Shape, "pick: index of shape {} does not match the picked shape {out}", inputs[1]);
        }
        if n == 0 && out.size() > 0 {
            crate::bail!(Index, "pick: cannot pick {} element(s) along an axis of size 0 of data {}", out.size(), inputs[0]);
        }
        Ok(vec![out])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    /// Along an axis, the output is the data without it (length 1 with keepdims), its other
    /// dimensions known or not.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let (Some(axis), Some(data)) = (self.p.axis, inputs[0].clone()) else { return Ok(()) };
        let axis = normalize_axis(axis, data.ndim())?;
        let mut out = data;
        if self.p.keepdims {
            out.0[axis] = Some(1);
        } else {
            out.0.remove(axis);
        }
        merge_partial(&mut outputs[0], &out).map(|_| ())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let ((_, n, inner), _) = self.layout(&inputs[0].shape)?;
        let pos = self.positions(&inputs[1], n)?;
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            for (cell, v) in y.iter_mut().enumerate() {
                let (o, j) = (cell / inner, cell % inner);
                *v = x[(o * n + pos[cell]) * inner + j];
            }
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ((_, n, inner), _) = self.layout(&inputs[0].shape)?;
        crate::backend::cuda::kernels::pick(gpu, n, inner, self.wraps_on_gpu(), false, &inputs[0], &inputs[1], &outputs[0])
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
        let (_, picked) = self.pick.layout(&inputs[2])?;
        if inputs[0].size() != picked.size() || inputs[1].size() != picked.size() {
            crate::bail!(
                Shape,
                "_backward_pick: gradient {} and index {} must match the picked shape {picked} of data {}",
                inputs[0],
                inputs[1],
                inputs[2]
            );
        }
        Ok(vec![inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        let ((_, n, inner), _) = self.pick.layout(&out.shape)?;
        let pos = self.pick.positions(&inputs[1], n)?;
        zero_fill(out);
        crate::dispatch_dtype!(out.dtype, T => {
            // SAFETY: grad is read-only here; the output is this op's alone.
            let (g, y) = unsafe { (inputs[0].slice::<T>(), out.slice_mut::<T>()) };
            for (cell, &v) in g.iter().enumerate() {
                let (o, j) = (cell / inner, cell % inner);
                y[(o * n + pos[cell]) * inner + j] = v;
            }
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let out = &outputs[0];
        let ((_, n, inner), _) = self.pick.layout(&out.shape)?;
        crate::backend::cuda::kernels::fill(gpu, out, 0.0)?;
        crate::backend::cuda::kernels::pick(gpu, n, inner, self.pick.wraps_on_gpu(), true, &inputs[0], &inputs[1], out)
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
    if m == 0 || m > data.ndim() {
        crate::bail!(Shape, "{op}: indices {idx_shape} must have a first axis of length 1..={} for data {data}", data.ndim());
    }
    let count = idx_shape.size() / m;
    let block: usize = data.dims()[m..].iter().product();
    let mut offsets = Vec::with_capacity(count);
    for c in 0..count {
        let mut off = 0usize;
        for axis in 0..m {
            let i = idx[axis * count + c];
            let n = data[axis] as i64;
            // MXNet's gather_nd wraps negative indices; anything else out of range is an error.
            let i = if i < 0 { i + n } else { i };
            if i < 0 || i >= n {
                crate::bail!(Index, "{op}: index {} is out of bounds for axis {axis} of size {n}", idx[axis * count + c]);
            }
            off = off * data[axis] + i as usize;
        }
        offsets.push(off);
    }
    Ok((offsets, block))
}

fn gathered_shape(data: &Shape, idx: &Shape) -> Shape {
    let m = idx.dims().first().copied().unwrap_or(0).min(data.ndim());
    let mut dims = idx.dims()[1..].to_vec();
    dims.extend_from_slice(&data.dims()[m..]);
    Shape::new(if dims.is_empty() { vec![1] } else { dims })
}

impl Operator for GatherNd {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "indices".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let m = inputs[1].dims().first().copied().unwrap_or(0);
        if m == 0 || m > inputs[0].ndim() {
            crate::bail!(Shape, "gather_nd: indices {} must have a first axis of length 1..={} for data {}", inputs[1], inputs[0].ndim(), inputs[0]);
        }
        Ok(vec![gathered_shape(&inputs[0], &inputs[1])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (offsets, block) = nd_offsets("gather_nd", &inputs[0].shape, &inputs[1].shape, &read_indices(&inputs[1]))?;
        let es = inputs[0].dtype.size();
        let (xp, yp) = (SendPtr(inputs[0].raw()), SendPtr(outputs[0].raw()));
        parallel_chunks(offsets.len(), ((1usize << 16) / (block * es).max(1)).max(1), |rows| {
            for r in rows {
                // SAFETY: offsets were bounds-checked against data; output row r is ours alone.
                unsafe { std::ptr::copy_nonoverlapping(xp.get().add(offsets[r] * block * es), yp.get().add(r * block * es), block * es) };
            }
        });
        Ok(())
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

impl Operator for ScatterNd {
    fn input_names(&self) -> Vec<String> {
        if self.shape.is_some() {
            vec!["data".into(), "indices".into()]
        } else {
            vec!["grad".into(), "indices".into(), "like".into()]
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let target = match &self.shape {
            Some(s) => s.clone(),
            None => inputs[2].clone(),
        };
        let expected = gathered_shape(&target, &inputs[1]);
        if expected.size() != inputs[0].size() {
            crate::bail!(Shape, "scatter_nd: data {} does not fit indices {} into shape {target} (expected {expected})", inputs[0], inputs[1]);
        }
        Ok(vec![target])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        let (offsets, block) = nd_offsets("scatter_nd", &out.shape, &inputs[1].shape, &read_indices(&inputs[1]))?;
        zero_fill(out);
        crate::dispatch_dtype!(out.dtype, T => {
            // SAFETY: data is read-only here; the output is this op's alone.
            let (x, y) = unsafe { (inputs[0].slice::<T>(), out.slice_mut::<T>()) };
            for (r, &off) in offsets.iter().enumerate() {
                let (src, dst) = (&x[r * block..(r + 1) * block], &mut y[off * block..(off + 1) * block]);
                if self.accumulate {
                    dst.iter_mut().zip(src).for_each(|(a, &b)| *a = T::from_f64(a.to_f64() + b.to_f64()));
                } else {
                    dst.copy_from_slice(src);
                }
            }
        });
        Ok(())
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
        if inputs[0] != self.shape {
            crate::bail!(Shape, "_scatter_set_nd: lhs {} differs from shape {}", inputs[0], self.shape);
        }
        let expected = gathered_shape(&self.shape, &inputs[2]);
        if expected.size() != inputs[1].size() {
            crate::bail!(
                Shape,
                "_scatter_set_nd: rhs {} does not fit indices {} into shape {} (expected {expected})",
                inputs[1],
                inputs[2],
                self.shape
            );
        }
        Ok(vec![self.shape.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if inputs[0] != inputs[1] {
            crate::bail!(Type, "_scatter_set_nd: lhs has dtype {} but rhs has dtype {}", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[0]])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        let (offsets, block) = nd_offsets("_scatter_set_nd", &out.shape, &inputs[2].shape, &read_indices(&inputs[2]))?;
        let row_bytes = block * out.dtype.size();
        if inputs[0].raw() != out.raw() {
            // SAFETY: lhs and the output are distinct buffers of the same size (shapes checked).
            unsafe { std::ptr::copy_nonoverlapping(inputs[0].raw(), out.raw(), out.size() * out.dtype.size()) };
        }
        for (r, &off) in offsets.iter().enumerate() {
            // SAFETY: offsets were bounds-checked against the output; rhs holds offsets.len() rows.
            unsafe { std::ptr::copy_nonoverlapping(inputs[1].raw().add(r * row_bytes), out.raw().add(off * row_bytes), row_bytes) };
        }
        Ok(())
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
            if a >= like.ndim() || like[a] > data[a] {
                crate::bail!(Shape, "slice_like: cannot slice axis {a} of {data} to the extent of {like}");
            }
            dims[a] = like[a];
        }
        Ok(dims)
    }
}

/// Copy the leading-corner region `dims` between a packed array and a larger array of `big`.
fn corner_copy(dtype: DType, dims: &[usize], big: &Shape, big_ptr: *mut u8, small_ptr: *mut u8, into_big: bool) {
    let big_strides: Vec<isize> = big.strides().into_iter().map(|s| s as isize).collect();
    let small_strides: Vec<isize> = Shape::new(dims.to_vec()).strides().into_iter().map(|s| s as isize).collect();
    crate::dispatch_dtype!(dtype, T => {
        if into_big {
            strided_copy::<T>(dims, small_ptr as *const T, 0, &small_strides, big_ptr as *mut T, 0, &big_strides)
        } else {
            strided_copy::<T>(dims, big_ptr as *const T, 0, &big_strides, small_ptr as *mut T, 0, &small_strides)
        }
    });
}

impl Operator for SliceLike {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "shape_like".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![Shape::new(self.extent(&inputs[0], &inputs[1])?)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        corner_copy(out.dtype, out.shape.dims(), &inputs[0].shape, inputs[0].raw(), out.raw(), false);
        Ok(())
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
        if inputs[0].ndim() != inputs[1].ndim() || inputs[0].dims().iter().zip(inputs[1].dims()).any(|(g, x)| g > x) {
            crate::bail!(Shape, "_backward_slice_like: gradient {} does not fit inside {}", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        zero_fill(out);
        corner_copy(out.dtype, inputs[0].shape.dims(), &out.shape, out.raw(), inputs[0].raw(), true);
        Ok(())
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
        let k = self.p.k;
        let (n1, n2) = (s[a1] as i64, s[a2] as i64);
        let len = if k >= 0 { n1.min(n2 - k) } else { (n1 + k).min(n2) }.max(0) as usize;
        let st: Vec<isize> = s.strides().into_iter().map(|v| v as isize).collect();
        let base = if k >= 0 { k as isize * st[a2] } else { -k as isize * st[a1] };
        let mut dims = Vec::new();
        let mut strides = Vec::new();
        for i in 0..s.ndim() {
            if i != a1 && i != a2 {
                dims.push(s[i]);
                strides.push(st[i]);
            }
        }
        dims.push(len);
        strides.push(st[a1] + st[a2]);
        Ok(DiagPlan { out: Shape::new(dims.clone()), dims, base, strides })
    }

    fn matrix_shape(&self, n: usize) -> Shape {
        let m = n + self.p.k.unsigned_abs() as usize;
        Shape::new(vec![m, m])
    }
}

impl Operator for Diag {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        match inputs[0].ndim() {
            0 => crate::bail!(Shape, "diag: the input must have at least one dimension"),
            1 => Ok(vec![self.matrix_shape(inputs[0][0])]),
            _ => Ok(vec![self.plan(&inputs[0])?.out]),
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (x, out) = (&inputs[0], &outputs[0]);
        if x.shape.ndim() == 1 {
            zero_fill(out);
            let plan = self.plan(&out.shape)?;
            crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&plan.dims, x.ptr::<T>(), 0, &[1], out.ptr::<T>(), plan.base, &plan.strides));
            return Ok(());
        }
        let plan = self.plan(&x.shape)?;
        let dst: Vec<isize> = plan.out.strides().into_iter().map(|v| v as isize).collect();
        crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&plan.dims, x.ptr::<T>(), plan.base, &plan.strides, out.ptr::<T>(), 0, &dst));
        Ok(())
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
        let diagonal = self.diag.infer_shape(&inputs[1..])?;
        super::check_out_grad("_backward_diag", &inputs[0], &diagonal[0])?;
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, out) = (&inputs[0], &outputs[0]);
        if out.shape.ndim() == 1 {
            // The input was the diagonal of the gradient matrix.
            let plan = self.diag.plan(&g.shape)?;
            crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&plan.dims, g.ptr::<T>(), plan.base, &plan.strides, out.ptr::<T>(), 0, &[1]));
            return Ok(());
        }
        zero_fill(out);
        let plan = self.diag.plan(&out.shape)?;
        let src: Vec<isize> = plan.out.strides().into_iter().map(|v| v as isize).collect();
        crate::dispatch_dtype!(out.dtype, T => strided_copy::<T>(&plan.dims, g.ptr::<T>(), 0, &src, out.ptr::<T>(), plan.base, &plan.strides));
        Ok(())
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
    /// (outer, axis length, inner) of data and the kept rows.
    fn kept(&self, data: &Shape, index: &Tensor) -> Result<((usize, usize, usize), Vec<usize>)> {
        let axis = normalize_axis(self.axis, data.ndim())?;
        let d = data.dims();
        if index.shape.ndim() != 1 || index.shape[0] != d[axis] {
            crate::bail!(Shape, "boolean_mask: index must be 1-D of length {} (axis {axis} of {data}), got {}", d[axis], index.shape);
        }
        let rows = read_indices(index).iter().enumerate().filter(|(_, &v)| v != 0).map(|(i, _)| i).collect();
        Ok(((d[..axis].iter().product(), d[axis], d[axis + 1..].iter().product()), rows))
    }
}

/// Copy (or, for the gradient, place) the kept rows between packed and full layouts.
fn move_rows(t: DType, (outer, n, inner): (usize, usize, usize), rows: &[usize], full: *mut u8, packed: *mut u8, into_full: bool) {
    let es = t.size();
    let k = rows.len();
    for o in 0..outer {
        for (j, &r) in rows.iter().enumerate() {
            // SAFETY: r < n and j < k, so both blocks lie inside their (outer, n|k, inner) arrays.
            unsafe {
                let f = full.add((o * n + r) * inner * es);
                let p = packed.add((o * k + j) * inner * es);
                if into_full {
                    std::ptr::copy_nonoverlapping(p, f, inner * es);
                } else {
                    std::ptr::copy_nonoverlapping(f, p, inner * es);
                }
            }
        }
    }
}

impl Operator for BooleanMask {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "index".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        normalize_axis(self.axis, inputs[0].ndim())?;
        Ok(vec![inputs[0].clone()])
    }
    fn shape_depends_on_values(&self) -> bool {
        true
    }
    fn infer_shape_from_values(&self, inputs: &[Tensor]) -> Result<Vec<Shape>> {
        let (_, rows) = self.kept(&inputs[0].shape, &inputs[1])?;
        let axis = normalize_axis(self.axis, inputs[0].shape.ndim())?;
        let mut dims = inputs[0].shape.dims().to_vec();
        dims[axis] = rows.len();
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (layout, rows) = self.kept(&inputs[0].shape, &inputs[1])?;
        move_rows(inputs[0].dtype, layout, &rows, inputs[0].raw(), outputs[0].raw(), false);
        Ok(())
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
        Ok(vec![inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        let (layout, rows) = self.mask.kept(&out.shape, &inputs[1])?;
        if rows.len() * layout.0 * layout.2 != inputs[0].size() {
            crate::bail!(Shape, "_backward_boolean_mask: gradient {} does not match the {} kept rows", inputs[0].shape, rows.len());
        }
        zero_fill(out);
        move_rows(out.dtype, layout, &rows, out.raw(), inputs[0].raw(), true);
        Ok(())
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
