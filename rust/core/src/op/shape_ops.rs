//! Operators that move data without arithmetic: transpose, reshape, flatten, expand_dims, concat,
//! split and cast. They share one strided-copy kernel that tiles 2-D transposes so that both the
//! reads and the writes stay in cache.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::{parallel_chunks, zero_gradient, ExecContext, OpDef, Operator, SendPtr, Tensor, PARALLEL_GRAIN};
use crate::base::{merge_partial, normalize_axis, unify_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// Copy an N-d block: element `idx` of `dims` goes from `src[sb + idx·ss]` to `dst[db + idx·ds]`.
pub(crate) fn strided_copy<T: Copy + Send + Sync>(dims: &[usize], src: *const T, sb: isize, ss: &[isize], dst: *mut T, db: isize, ds: &[isize]) {
    let nd = dims.len();
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let (sp, dp) = (SendPtr(src as *mut T), SendPtr(dst));
    if nd == 0 {
        // SAFETY: a 0-d block is the single element at the bases.
        unsafe { *dst.offset(db) = *src.offset(sb) };
        return;
    }
    let offsets = |mut row: usize, upto: usize| -> (isize, isize) {
        let (mut so, mut dof) = (sb, db);
        for d in (0..upto).rev() {
            let i = (row % dims[d]) as isize;
            row /= dims[d];
            so += i * ss[d];
            dof += i * ds[d];
        }
        (so, dof)
    };
    const TILE: usize = 32;
    let transposing = nd >= 2 && ss[nd - 1] != 1 && ds[nd - 1] == 1 && dims[nd - 1] >= TILE && dims[nd - 2] >= TILE;
    if transposing {
        let (r, c) = (dims[nd - 2], dims[nd - 1]);
        let batches: usize = dims[..nd - 2].iter().product();
        // Whole contiguous matrices of 4-byte values: the register-tiled transpose of the GEMM
        // code moves them (1024x1024: 1.46 -> 0.3 ms); it only moves bits, so any 4-byte type.
        let whole = ss[nd - 2] == 1 && ss[nd - 1] == r as isize && ds[nd - 2] == c as isize;
        if whole && std::mem::size_of::<T>() == 4 {
            for b in 0..batches {
                let (so, dof) = offsets(b, nd - 2);
                // SAFETY: batch b's source is a contiguous c x r block and its destination a
                // contiguous r x c block (the strides checked above), distinct tensors, and T has
                // f32's size and alignment.
                let (src, dst) = unsafe {
                    (
                        std::slice::from_raw_parts(sp.get().offset(so) as *const f32, r * c),
                        std::slice::from_raw_parts_mut(dp.get().offset(dof) as *mut f32, r * c),
                    )
                };
                super::linalg::transpose_f32(src, c, r, dst);
            }
            return;
        }
        let row_tiles = r.div_ceil(TILE);
        parallel_chunks(batches * row_tiles, 1, |tiles| {
            for t in tiles {
                let (b, rt) = (t / row_tiles, t % row_tiles);
                let (so, dof) = offsets(b, nd - 2);
                let r0 = rt * TILE;
                for c0 in (0..c).step_by(TILE) {
                    for i in r0..(r0 + TILE).min(r) {
                        for j in c0..(c0 + TILE).min(c) {
                            // SAFETY: (b, i, j) is an in-range index of dims; strides map it into
                            // the source and destination the caller described.
                            unsafe {
                                *dp.get().offset(dof + i as isize * ds[nd - 2] + j as isize) =
                                    *sp.get().offset(so + i as isize * ss[nd - 2] + j as isize * ss[nd - 1])
                            };
                        }
                    }
                }
            }
        });
        return;
    }
    let inner = dims[nd - 1];
    let rows = total / inner;
    let (si, di) = (ss[nd - 1], ds[nd - 1]);
    parallel_chunks(rows, (super::PARALLEL_GRAIN / inner).max(1), |rs| {
        for row in rs {
            let (so, dof) = offsets(row, nd - 1);
            // SAFETY: as above, every (row, j) is in range of dims; a row's destination is written
            // by this task only and never overlaps the source (callers pass distinct tensors).
            unsafe {
                if si == 1 && di == 1 {
                    std::ptr::copy_nonoverlapping(sp.get().offset(so), dp.get().offset(dof), inner);
                } else if si == 0 && di == 1 {
                    // A value broadcast along the row (a reduction's gradient): a vectorized fill.
                    let value = *sp.get().offset(so);
                    std::slice::from_raw_parts_mut(dp.get().offset(dof), inner).fill(value);
                } else {
                    for j in 0..inner as isize {
                        *dp.get().offset(dof + j * di) = *sp.get().offset(so + j * si);
                    }
                }
            }
        }
    });
}

fn contiguous_strides(s: &Shape) -> Vec<isize> {
    s.strides().into_iter().map(|v| v as isize).collect()
}

/// `y = x.transpose(perm)`.
pub(crate) fn transpose_into<T: Copy + Send + Sync>(x: &Tensor, y: &Tensor, perm: &[usize]) {
    let xs = contiguous_strides(&x.shape);
    let ss: Vec<isize> = perm.iter().map(|&p| xs[p]).collect();
    strided_copy::<T>(y.shape.dims(), x.ptr::<T>(), 0, &ss, y.ptr::<T>(), 0, &contiguous_strides(&y.shape));
}

/// Output 0 of a kernel call as a copy of input 0 (same dtype and element count; a reshape):
/// nothing to do when the call computes it in place.
pub(crate) fn copy_args(args: &KernelArgs) -> Result<()> {
    if args.shares_memory(0, 0) {
        return Ok(());
    }
    crate::dispatch_dtype!(args.input_dtype(0)?, T => super::broadcast::copy_into(args.input::<T>(0)?, args.output::<T>(0)?))
}

/// Copy the bytes of one tensor into another of equal byte size.
pub(crate) fn copy_bytes(x: &Tensor, y: &Tensor) {
    let n = y.size() * y.dtype.size();
    if x.raw() == y.raw() || n == 0 {
        return;
    }
    let (xp, yp) = (SendPtr(x.raw()), SendPtr(y.raw()));
    parallel_chunks(n, 1 << 20, |r| {
        // SAFETY: r lies in both buffers; distinct tensors of one op never overlap partially.
        unsafe { std::ptr::copy_nonoverlapping(xp.get().add(r.start), yp.get().add(r.start), r.len()) }
    });
}

crate::op_params! {
    pub struct TransposeParams {
        /// Target axis order; by default the axes are reversed.
        axes: Vec<i64> = Vec::new(),
    }
}

struct Transpose {
    axes: Vec<i64>,
}

impl Transpose {
    fn perm(&self, ndim: usize) -> Result<Vec<usize>> {
        if self.axes.is_empty() {
            return Ok((0..ndim).rev().collect());
        }
        if self.axes.len() != ndim {
            crate::bail!(Shape, "transpose: axes {:?} do not match an input of {ndim} dimensions", self.axes);
        }
        let perm: Vec<usize> = self.axes.iter().map(|&a| normalize_axis(a, ndim)).collect::<Result<_>>()?;
        let mut seen = vec![false; ndim];
        for &p in &perm {
            if std::mem::replace(&mut seen[p], true) {
                crate::bail!(Value, "transpose: axes {:?} repeat an axis", self.axes);
            }
        }
        Ok(perm)
    }
}

impl Operator for Transpose {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let perm = self.perm(inputs[0].ndim())?;
        Ok(vec![Shape::new(perm.iter().map(|&p| inputs[0][p]).collect::<Vec<_>>())])
    }
    /// Dimensions move with their axes, known or not, in both directions.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let Some(ndim) = inputs[0].as_ref().or(outputs[0].as_ref()).map(PartialShape::ndim) else { return Ok(()) };
        let perm = self.perm(ndim)?;
        if let Some(x) = inputs[0].clone() {
            merge_partial(&mut outputs[0], &PartialShape(perm.iter().map(|&p| x.0[p]).collect()))?;
        }
        if let Some(y) = outputs[0].clone() {
            let mut x = PartialShape::unknown(ndim);
            for (i, &p) in perm.iter().enumerate() {
                x.0[p] = y.0[i];
            }
            merge_partial(&mut inputs[0], &x)?;
        }
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let perm = self.perm(inputs[0].shape.ndim())?;
        crate::dispatch_dtype!(inputs[0].dtype, T => transpose_into::<T>(&inputs[0], &outputs[0], &perm));
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let perm = self.perm(inputs[0].shape.ndim())?;
        let xs = contiguous_strides(&inputs[0].shape);
        let source: Vec<isize> = perm.iter().map(|&p| xs[p]).collect();
        let (x, y) = (&inputs[0], &outputs[0]);
        strided_copy(
            gpu,
            y.shape.dims(),
            Strided { tensor: x, base: 0, strides: &source },
            Strided { tensor: y, base: 0, strides: &contiguous_strides(&y.shape) },
        )
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        if self.axes.is_empty() {
            return Ok(vec![Some(d.unary("transpose", &g)?)]);
        }
        // The inverse permutation; negative axes are resolved against the (equal) rank.
        let n = self.axes.len() as i64;
        let mut inverse = vec![0i64; self.axes.len()];
        for (i, &a) in self.axes.iter().enumerate() {
            inverse[(a.rem_euclid(n)) as usize] = i as i64;
        }
        Ok(vec![Some(d.op("transpose", &[("axes", tuple_attr(&inverse))], &[&g])?)])
    }
}

/// reshape_like: the second input only lends its shape.
struct ReshapeLike;

impl Operator for ReshapeLike {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if inputs[0].size() != inputs[1].size() {
            crate::bail!(Shape, "reshape_like: {} and {} have different sizes", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        crate::backend::cuda::kernels::copy_bytes(gpu, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        Ok(vec![Some(reshape_back(d)?), None])
    }
}

/// `_identity_with_attr_like_rhs(lhs, rhs)`: lhs unchanged, while shape inference requires it
/// to have rhs's shape. A graph states a value's shape this way, so that inference can pass it
/// back to where it is unknown (rhs gets no gradient).
struct IdentityLikeRhs;

impl Operator for IdentityLikeRhs {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if inputs[0] != inputs[1] {
            crate::bail!(Shape, "_identity_with_attr_like_rhs: lhs {} must have the shape of rhs {}", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        unify_partial(inputs, outputs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        crate::backend::cuda::kernels::copy_bytes(gpu, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        Ok(vec![Some(d.out_grad(0)), None])
    }
}

/// The output gradient in the shape of the first input (gradient of every relayout).
fn reshape_back(d: &mut Grad) -> Result<crate::graph::Entry> {
    let (x, g) = (d.input(0), d.out_grad(0));
    d.binary("reshape_like", &g, &x)
}

/// MXNet's reshape codes: 0 copies a dim, -1 infers one, -2 copies the rest, -3 merges two,
/// -4 splits one into the next two values; `reverse` applies them from the right.
pub fn infer_reshape(src: &Shape, spec: &[i64], reverse: bool) -> Result<Shape> {
    let fail = |why: String| crate::err!(Shape, "reshape: cannot reshape {src} into {spec:?}: {why}");
    let (src_dims, spec_v): (Vec<usize>, Vec<i64>) =
        if reverse { (src.dims().iter().rev().copied().collect(), reverse_spec(spec)) } else { (src.dims().to_vec(), spec.to_vec()) };
    let mut out: Vec<usize> = Vec::new();
    let mut inferred: Option<usize> = None;
    let (mut si, mut i) = (0usize, 0usize);
    let take = |si: usize| src_dims.get(si).copied().ok_or_else(|| fail("the codes use more dimensions than the input has".into()));
    while i < spec_v.len() {
        match spec_v[i] {
            p if p > 0 => {
                out.push(p as usize);
                si += 1;
            }
            0 => {
                out.push(take(si)?);
                si += 1;
            }
            -1 => {
                if inferred.replace(out.len()).is_some() {
                    return Err(fail("more than one -1".into()));
                }
                out.push(1);
                si += 1;
            }
            -2 => {
                out.extend_from_slice(src_dims.get(si..).unwrap_or(&[]));
                si = src_dims.len();
            }
            -3 => {
                out.push(take(si)? * take(si + 1)?);
                si += 2;
            }
            -4 => {
                let (a, b) = match (spec_v.get(i + 1), spec_v.get(i + 2)) {
                    (Some(&a), Some(&b)) => (a, b),
                    _ => return Err(fail("-4 must be followed by two values".into())),
                };
                let d = take(si)? as i64;
                si += 1;
                let (a, b) = match (a, b) {
                    (-1, b) if b > 0 => (d / b, b),
                    (a, -1) if a > 0 => (a, d / a),
                    (a, b) => (a, b),
                };
                if a * b != d || a <= 0 || b <= 0 {
                    return Err(fail(format!("-4 cannot split {d} into ({a}, {b})")));
                }
                out.push(a as usize);
                out.push(b as usize);
                i += 2;
            }
            p => return Err(fail(format!("invalid code {p}"))),
        }
        i += 1;
    }
    if let Some(k) = inferred {
        let known: usize = out.iter().enumerate().filter(|&(j, _)| j != k).map(|(_, &d)| d).product();
        if known == 0 || !src.size().is_multiple_of(known) {
            return Err(fail("the -1 dimension cannot be inferred".into()));
        }
        out[k] = src.size() / known;
    }
    if reverse {
        out.reverse();
    }
    let out = Shape::new(out);
    if out.size() != src.size() {
        return Err(fail(format!("{} elements cannot become {}", src.size(), out.size())));
    }
    Ok(out)
}

/// Reverse a code list keeping each `-4, a, b` group's operands in order relative to the split.
fn reverse_spec(spec: &[i64]) -> Vec<i64> {
    let mut groups: Vec<Vec<i64>> = Vec::new();
    let mut i = 0;
    while i < spec.len() {
        if spec[i] == -4 && i + 2 < spec.len() {
            groups.push(vec![-4, spec[i + 2], spec[i + 1]]);
            i += 3;
        } else {
            groups.push(vec![spec[i]]);
            i += 1;
        }
    }
    groups.into_iter().rev().flatten().collect()
}

crate::op_params! {
    pub struct ReshapeParams {
        /// The target shape, with MXNet's special codes 0, -1, -2, -3, -4.
        shape: Vec<i64> = Vec::new(),
        /// Apply the special codes from right to left.
        reverse: bool = false,
        /// (Deprecated) target shape.
        target_shape: Vec<i64> = Vec::new(),
        /// (Deprecated) keep the highest dimension.
        keep_highest: bool = false,
    }
}

/// A copy into a new shape with the same element count (reshape, flatten, expand_dims).
struct Relayout {
    shape_of: Box<dyn Fn(&Shape) -> Result<Shape> + Send + Sync>,
}

impl Operator for Relayout {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![(self.shape_of)(&inputs[0])?])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        crate::backend::cuda::kernels::copy_bytes(gpu, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        Ok(vec![Some(reshape_back(d)?)])
    }
}

crate::op_params! {
    pub struct ExpandDimsParams {
        /// Position of the new axis; negative counts from the end of the output.
        axis: i64,
    }
}

crate::op_params! {
    pub struct ConcatParams {
        /// Number of inputs to concatenate.
        num_args: usize,
        /// The dimension to be concatenated.
        dim: i64 = 1,
    }
}

struct Concat {
    num_args: usize,
    dim: i64,
}

impl Operator for Concat {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_args).map(|i| format!("arg{i}")).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let first = super::first_input("Concat", inputs)?;
        let axis = normalize_axis(self.dim, first.ndim())?;
        let mut out = first.dims().to_vec();
        out[axis] = 0;
        for s in inputs {
            let same_rest = s.ndim() == first.ndim() && (0..s.ndim()).all(|d| d == axis || s[d] == first[d]);
            if !same_rest {
                crate::bail!(Shape, "Concat: input shapes {} must agree except on dim {}", list(inputs), self.dim);
            }
            out[axis] += s[axis];
        }
        Ok(vec![Shape::new(out)])
    }
    /// Operands and output agree except on the concatenated axis, whose output length is the
    /// sum of the operands' lengths once they are all known.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let Some(ndim) = inputs.iter().chain(outputs.iter()).flatten().map(PartialShape::ndim).next() else {
            return Ok(());
        };
        let axis = normalize_axis(self.dim, ndim)?;
        let mut common = PartialShape::unknown(ndim);
        for shape in inputs.iter().chain(outputs.iter()).flatten() {
            if shape.ndim() != ndim {
                crate::bail!(Shape, "Concat: operands {} must have the same number of dimensions", list_partial(inputs));
            }
            let mut rest = shape.clone();
            rest.0[axis] = None;
            common.merge(&rest).map_err(|e| e.context(format!("Concat: operands {} must agree except on dim {}", list_partial(inputs), self.dim)))?;
        }
        for slot in inputs.iter_mut() {
            merge_partial(slot, &common)?;
        }
        let mut out = common;
        out.0[axis] = inputs.iter().map(|s| s.as_ref().and_then(|s| s.0[axis])).sum();
        merge_partial(&mut outputs[0], &out)?;
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let out = &outputs[0];
        let axis = normalize_axis(self.dim, out.shape.ndim())?;
        let es = out.dtype.size();
        let outer: usize = out.shape.dims()[..axis].iter().product();
        let inner: usize = out.shape.dims()[axis + 1..].iter().product::<usize>() * es;
        let out_block = out.shape[axis] * inner;
        let mut offset = 0;
        for x in inputs {
            let block = x.shape[axis] * inner;
            copy_blocks(x.raw(), block, out.raw(), out_block, offset, outer);
            offset += block;
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let out = &outputs[0];
        let axis = normalize_axis(self.dim, out.shape.ndim())?;
        let outer: usize = out.shape.dims()[..axis].iter().product();
        let inner: usize = out.shape.dims()[axis + 1..].iter().product();
        let out_row = (out.shape[axis] * inner) as isize;
        let mut offset = 0;
        for x in inputs {
            let row = x.shape[axis] * inner;
            let dims = [outer, row];
            strided_copy(
                gpu,
                &dims,
                Strided { tensor: x, base: 0, strides: &[row as isize, 1] },
                Strided { tensor: out, base: offset, strides: &[out_row, 1] },
            )?;
            offset += row as isize;
        }
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let inputs: Vec<crate::graph::Entry> = (0..d.num_inputs()).map(|i| d.input(i)).collect();
        let mut args = vec![&g];
        args.extend(inputs.iter());
        let attrs = [("num_args", self.num_args.to_string()), ("dim", self.dim.to_string())];
        Ok(d.op_outputs("_backward_Concat", &attrs, &args)?.into_iter().map(Some).collect())
    }
}

/// `_backward_Concat(grad, arg0, ...)`: splits the gradient of a concatenation into parts shaped
/// like the concatenated inputs.
struct ConcatBackward {
    num_args: usize,
    dim: i64,
}

impl Operator for ConcatBackward {
    fn input_names(&self) -> Vec<String> {
        std::iter::once("grad".to_string()).chain((0..self.num_args).map(|i| format!("arg{i}"))).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_args
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let concatenated = Concat { num_args: self.num_args, dim: self.dim }.infer_shape(&inputs[1..])?;
        if concatenated[0] != inputs[0] {
            crate::bail!(Shape, "_backward_Concat: gradient {} does not match the concatenation {}", inputs[0], concatenated[0]);
        }
        Ok(inputs[1..].to_vec())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]; self.num_args])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let g = &inputs[0];
        let axis = normalize_axis(self.dim, g.shape.ndim())?;
        let es = g.dtype.size();
        let outer: usize = g.shape.dims()[..axis].iter().product();
        let inner: usize = g.shape.dims()[axis + 1..].iter().product::<usize>() * es;
        let row = g.shape[axis] * inner;
        let mut offset = 0;
        for y in outputs {
            let part = y.shape[axis] * inner;
            let (sp, dp) = (SendPtr(g.raw()), SendPtr(y.raw()));
            parallel_chunks(outer, ((1usize << 17) / part.max(1)).max(1), |rows| {
                for o in rows {
                    // SAFETY: this part of row o lies inside the gradient row; output row o is ours.
                    unsafe { std::ptr::copy_nonoverlapping(sp.get().add(o * row + offset), dp.get().add(o * part), part) };
                }
            });
            offset += part;
        }
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let grads: Vec<crate::graph::Entry> = (0..self.num_args).map(|i| d.out_grad(i)).collect();
        let refs: Vec<&crate::graph::Entry> = grads.iter().collect();
        let joined = d.op("Concat", &[("num_args", self.num_args.to_string()), ("dim", self.dim.to_string())], &refs)?;
        Ok(std::iter::once(Some(joined)).chain((0..self.num_args).map(|_| None)).collect())
    }
}

/// For each of `outer` rows copy `block` bytes from a packed source to `dst + row*dst_row + offset`.
fn copy_blocks(src: *const u8, block: usize, dst: *mut u8, dst_row: usize, offset: usize, outer: usize) {
    let (sp, dp) = (SendPtr(src as *mut u8), SendPtr(dst));
    parallel_chunks(outer, ((1usize << 17) / block.max(1)).max(1), |rows| {
        for o in rows {
            // SAFETY: row o of the source is [o*block, (o+1)*block); its slot in the destination
            // lies inside row o of the destination, disjoint from other inputs' slots.
            unsafe { std::ptr::copy_nonoverlapping(sp.get().add(o * block), dp.get().add(o * dst_row + offset), block) };
        }
    });
}

fn list(shapes: &[Shape]) -> String {
    shapes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

fn list_partial(shapes: &[Option<PartialShape>]) -> String {
    shapes.iter().map(|s| s.as_ref().map_or_else(|| "unknown".to_string(), |s| s.to_string())).collect::<Vec<_>>().join(", ")
}

crate::op_params! {
    pub struct SliceChannelParams {
        /// Number of splits; the axis length must be divisible by it.
        num_outputs: usize,
        /// Axis along which to split.
        axis: i64 = 1,
        /// Remove the split axis from the outputs (its length must then be 1 per output).
        squeeze_axis: bool = false,
    }
}

struct SliceChannel {
    p: SliceChannelParams,
}

impl Operator for SliceChannel {
    fn num_outputs(&self) -> usize {
        self.p.num_outputs
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let s = &inputs[0];
        let axis = normalize_axis(self.p.axis, s.ndim())?;
        let n = self.p.num_outputs;
        if n == 0 || !s[axis].is_multiple_of(n) {
            crate::bail!(Shape, "SliceChannel: axis {axis} of {s} (length {}) cannot be split into {n} equal parts", s[axis]);
        }
        let mut dims = s.dims().to_vec();
        dims[axis] /= n;
        if self.p.squeeze_axis {
            if dims[axis] != 1 {
                crate::bail!(Shape, "SliceChannel: squeeze_axis needs parts of length 1, but {s} split {n} ways gives {}", dims[axis]);
            }
            dims.remove(axis);
        }
        Ok(vec![Shape::new(dims); n])
    }
    /// Every part has one shape: the input's with the split axis divided (or removed when
    /// squeezed); what is known of any part fills in the others and the input.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let Some(data) = inputs[0].clone() else { return Ok(()) };
        let axis = normalize_axis(self.p.axis, data.ndim())?;
        let n = self.p.num_outputs;
        let mut part = data;
        if let Some(len) = part.0[axis] {
            if n == 0 || len % n != 0 {
                crate::bail!(Shape, "SliceChannel: axis {axis} of length {len} cannot be split into {n} equal parts");
            }
            part.0[axis] = Some(len / n);
        }
        if self.p.squeeze_axis {
            if part.0[axis].is_some_and(|len| len != 1) {
                crate::bail!(Shape, "SliceChannel: squeeze_axis needs parts of length 1, got {part}");
            }
            part.0.remove(axis);
        }
        for shape in outputs.iter().flatten() {
            part.merge(shape).map_err(|e| e.context("SliceChannel: the parts must have one shape"))?;
        }
        for slot in outputs.iter_mut() {
            merge_partial(slot, &part)?;
        }
        let mut whole = part;
        if self.p.squeeze_axis {
            whole.0.insert(axis, Some(n));
        } else {
            whole.0[axis] = whole.0[axis].map(|len| len * n);
        }
        merge_partial(&mut inputs[0], &whole)?;
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let x = &inputs[0];
        let axis = normalize_axis(self.p.axis, x.shape.ndim())?;
        let es = x.dtype.size();
        let outer: usize = x.shape.dims()[..axis].iter().product();
        let inner: usize = x.shape.dims()[axis + 1..].iter().product::<usize>() * es;
        let part = x.shape[axis] / self.p.num_outputs * inner;
        let row = x.shape[axis] * inner;
        for (k, y) in outputs.iter().enumerate() {
            let (sp, dp) = (SendPtr(x.raw()), SendPtr(y.raw()));
            parallel_chunks(outer, ((1usize << 17) / part.max(1)).max(1), |rows| {
                for o in rows {
                    // SAFETY: part k of row o lies inside the input row; output row o is ours.
                    unsafe { std::ptr::copy_nonoverlapping(sp.get().add(o * row + k * part), dp.get().add(o * part), part) };
                }
            });
        }
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let x = d.input(0);
        let mut parts = Vec::with_capacity(self.p.num_outputs);
        for k in 0..self.p.num_outputs {
            let g = d.out_grad(k);
            parts.push(if self.p.squeeze_axis { d.op("expand_dims", &[("axis", self.p.axis.to_string())], &[&g])? } else { g });
        }
        let refs: Vec<&crate::graph::Entry> = parts.iter().collect();
        let joined = d.op("Concat", &[("num_args", parts.len().to_string()), ("dim", self.p.axis.to_string())], &refs)?;
        Ok(vec![Some(d.binary("reshape_like", &joined, &x)?)])
    }
}

crate::op_params! {
    pub struct CastParams {
        /// Output data type.
        dtype: DType,
    }
}

struct Cast {
    dtype: DType,
}

#[inline(always)]
fn convert<A: Elem, B: Elem>(v: A) -> B {
    if A::DTYPE.is_float() || B::DTYPE.is_float() {
        B::from_f64(v.to_f64())
    } else {
        B::from_i64(v.to_i64())
    }
}

/// Output `o` of a kernel call as its input `i` converted to the output's dtype.
pub(crate) fn cast_args(args: &KernelArgs, i: usize, o: usize) -> Result<()> {
    use super::broadcast::{copy_into, map_into};
    use half::{bf16, f16};
    let (from, to) = (args.input_dtype(i)?, args.output_dtype(o)?);
    if args.shares_memory(i, o) {
        return Ok(());
    }
    if from == to {
        return crate::dispatch_dtype!(from, T => copy_into(args.input::<T>(i)?, args.output::<T>(o)?));
    }
    // Between float32 and the 16-bit floats, through float32 rather than float64: the same values
    // (float32 holds every 16-bit float exactly, and rounding a float32 to 16 bits directly
    // equals rounding it through float64), with conversions that vectorize. AMP casts every
    // weight and gradient each step; float32 -> bfloat16 of 1M elements took 0.44 ms through f64.
    match (from, to) {
        (DType::F32, DType::BF16) => map_into(args.input::<f32>(i)?, args.output::<bf16>(o)?, PARALLEL_GRAIN, bf16::from_f32),
        (DType::BF16, DType::F32) => map_into(args.input::<bf16>(i)?, args.output::<f32>(o)?, PARALLEL_GRAIN, bf16::to_f32),
        (DType::F32, DType::F16) => map_into(args.input::<f32>(i)?, args.output::<f16>(o)?, PARALLEL_GRAIN, f16::from_f32),
        (DType::F16, DType::F32) => map_into(args.input::<f16>(i)?, args.output::<f32>(o)?, PARALLEL_GRAIN, f16::to_f32),
        _ => {
            crate::dispatch_dtype!(from, A => crate::dispatch_dtype!(to, B => map_into(args.input::<A>(i)?, args.output::<B>(o)?, PARALLEL_GRAIN, convert::<A, B>)))
        }
    }
}

/// [`cast_args`] from `x` into `y`, for a caller holding tensors.
///
/// # Safety
/// As for [`KernelArgs::new`]: the caller holds `x` for reading and `y` for writing, and nothing
/// else reaches them while the cast runs.
pub(crate) unsafe fn cast_into(x: &Tensor, y: &Tensor) -> Result<()> {
    cast_args(&KernelArgs::new(std::slice::from_ref(x), std::slice::from_ref(y), &[], &[])?, 0, 0)
}

impl Operator for Cast {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![inputs[0].clone()])
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        unify_partial(inputs, outputs)
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![self.dtype])
    }
    /// Any input dtype casts: the output's dtype tells nothing about the input's.
    fn complete_input_types(&self, _inputs: &mut [Option<DType>]) {}
    fn fixed_output_types(&self) -> Option<Vec<DType>> {
        Some(vec![self.dtype])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        cast_args(args, 0, 0)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        crate::backend::cuda::kernels::cast(gpu, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.binary("_cast_like", &g, &x)?)])
    }
}

/// `_cast_like(data, like)`: `data` cast to the dtype of `like` (the gradient of Cast).
struct CastLike;

impl Operator for CastLike {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "like".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[1]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        cast_args(args, 0, 0)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        crate::backend::cuda::kernels::cast(gpu, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.binary("_cast_like", &g, &x)?), None])
    }
}

/// shape_array / size_array: int64 arrays describing the input's shape.
struct ShapeInfo {
    size_only: bool,
}

impl Operator for ShapeInfo {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![Shape::new(vec![if self.size_only { 1 } else { inputs[0].ndim() }])])
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![DType::I64])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let s = &inputs[0].shape;
        let values: Vec<i64> = if self.size_only { vec![s.size() as i64] } else { s.dims().iter().map(|&d| d as i64).collect() };
        args.output::<i64>(0)?.copy_from_slice(&values);
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        zero_gradient(d)
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("shape_array", &[], "Returns a 1-D int64 array holding the shape of the input.", |_: super::params::NoParams| {
        Ok(ShapeInfo { size_only: false })
    }));
    add(OpDef::new("size_array", &[], "Returns a 1-element int64 array holding the size of the input.", |_: super::params::NoParams| {
        Ok(ShapeInfo { size_only: true })
    }));
    add(OpDef::new("reshape_like", &[], "Reshapes lhs to the shape of rhs (same number of elements).", |_: super::params::NoParams| Ok(ReshapeLike)));
    add(OpDef::new(
        "_identity_with_attr_like_rhs",
        &[],
        "Returns lhs unchanged; shape inference requires it to have the shape of rhs.",
        |_: super::params::NoParams| Ok(IdentityLikeRhs),
    ));
    add(OpDef::new("transpose", &[], "Permutes the dimensions of an array; by default reverses them.", |p: TransposeParams| {
        Ok(Transpose { axes: p.axes })
    }));
    add(OpDef::new(
        "Reshape",
        &["reshape"],
        "Reshapes the input array. Codes: 0 copies a dimension, -1 infers one, -2 copies the rest, \
         -3 merges two consecutive dimensions, -4 splits one into the two values that follow.",
        |p: ReshapeParams| {
            if p.keep_highest {
                crate::bail!(Param, "Reshape: the deprecated keep_highest is not supported; use shape codes (0, -1, ...)");
            }
            let spec = if p.shape.is_empty() { p.target_shape } else { p.shape };
            let reverse = p.reverse;
            Ok(Relayout { shape_of: Box::new(move |s| infer_reshape(s, &spec, reverse)) })
        },
    ));
    add(OpDef::new(
        "Flatten",
        &["flatten"],
        "Flattens the input array into a 2-D array, collapsing the higher dimensions.",
        |_: super::params::NoParams| {
            Ok(Relayout {
                shape_of: Box::new(|s| {
                    let first = s.dims().first().copied().unwrap_or(1);
                    Ok(Shape::new(vec![first, s.size().checked_div(first).unwrap_or(0)]))
                }),
            })
        },
    ));
    add(OpDef::new("expand_dims", &[], "Inserts a new axis of size 1 into the array shape.", |p: ExpandDimsParams| {
        Ok(Relayout {
            shape_of: Box::new(move |s| {
                let axis = normalize_axis(p.axis, s.ndim() + 1)?;
                let mut dims = s.dims().to_vec();
                dims.insert(axis, 1);
                Ok(Shape::new(dims))
            }),
        })
    }));
    add(OpDef::new(
        "Concat",
        &["concat", "_rnn_param_concat"],
        "Joins input arrays along a given axis; all other dimensions must agree.",
        |p: ConcatParams| Ok(Concat { num_args: p.num_args, dim: p.dim }),
    )
    .variadic());
    add(OpDef::new(
        "SliceChannel",
        &["split"],
        "Splits an array along a particular axis into multiple sub-arrays of equal length.",
        |p: SliceChannelParams| Ok(SliceChannel { p }),
    ));
    add(OpDef::new("Cast", &["cast"], "Casts all elements of the input to a new type.", |p: CastParams| Ok(Cast { dtype: p.dtype })));
    add(OpDef::new("_cast_like", &[], "Casts data to the dtype of like.", |_: super::params::NoParams| Ok(CastLike)));
    add(OpDef::new("_backward_Concat", &[], "Gradient of Concat: splits the gradient into parts shaped like the inputs.", |p: ConcatParams| {
        Ok(ConcatBackward { num_args: p.num_args, dim: p.dim })
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(src: &[usize], spec: &[i64], rev: bool) -> Result<Vec<usize>> {
        infer_reshape(&Shape::new(src.to_vec()), spec, rev).map(|s| s.0.to_vec())
    }

    #[test]
    fn reshape_codes_match_mxnet_docs() {
        assert_eq!(r(&[2, 3, 4], &[4, 0, 2], false).unwrap(), vec![4, 3, 2]);
        assert_eq!(r(&[2, 3, 4], &[6, 1, -1], false).unwrap(), vec![6, 1, 4]);
        assert_eq!(r(&[2, 3, 4], &[-2], false).unwrap(), vec![2, 3, 4]);
        assert_eq!(r(&[2, 3, 4], &[2, -2], false).unwrap(), vec![2, 3, 4]);
        assert_eq!(r(&[2, 3, 4, 5], &[-3, -3], false).unwrap(), vec![6, 20]);
        assert_eq!(r(&[2, 3, 4], &[-4, 1, 2, -2], false).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(r(&[2, 3, 4], &[2, -4, -1, 3, -2], false).unwrap(), vec![2, 1, 3, 4]);
        assert_eq!(r(&[10, 5, 4], &[-1, 0], false).unwrap(), vec![40, 5]);
        assert_eq!(r(&[10, 5, 4], &[-1, 0], true).unwrap(), vec![50, 4]);
        assert!(r(&[2, 3], &[4, -1, -1], false).is_err());
        assert!(r(&[2, 3], &[5], false).is_err());
    }
}
