//! Operators that move data without arithmetic: transpose, reshape, flatten, expand_dims, concat,
//! split and cast. They share one strided-copy kernel that tiles 2-D transposes so that both the
//! reads and the writes stay in cache.

use smallvec::SmallVec;

use super::grad::{tuple_attr, Grad, InputGrads};
use super::{exactly, parallel_chunks, parallel_units, zero_gradient, ExecContext, OpDef, Operator, SendPtr, Tensor, PARALLEL_GRAIN};
use crate::base::{merge_partial, normalize_axis, unify_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// The lowest and highest position `base + idx·strides` takes over the index space `dims`; None
/// for an empty space, which reaches nothing.
fn reach(dims: &[usize], base: isize, strides: &[isize]) -> Option<(isize, isize)> {
    if dims.contains(&0) {
        return None;
    }
    Some(dims.iter().zip(strides).fold((base, base), |(low, high), (&len, &stride)| {
        let step = (len as isize - 1).saturating_mul(stride);
        (low.saturating_add(step.min(0)), high.saturating_add(step.max(0)))
    }))
}

/// Whether distinct indexes of `dims` reach distinct positions under `strides`: taken by
/// increasing stride, each axis (of more than one element) must step past all that the axes
/// before it span. This suffices rather than being necessary; it holds for every layout a
/// kernel writes (a contiguous array, a region of one, its diagonals).
fn distinct_positions(dims: &[usize], strides: &[isize]) -> bool {
    let mut axes: SmallVec<[(usize, usize); 8]> =
        dims.iter().zip(strides).filter(|&(&len, _)| len > 1).map(|(&len, &stride)| (stride.unsigned_abs(), len - 1)).collect();
    axes.sort_unstable();
    let mut span = 0usize;
    for (stride, steps) in axes {
        if stride <= span {
            return false;
        }
        match stride.checked_mul(steps).and_then(|s| s.checked_add(span)) {
            Some(s) => span = s,
            None => return false,
        }
    }
    true
}

/// Copy an N-d block: element `idx` of `dims` goes from `src[base + idx·strides]` to
/// `dst[base + idx·strides]`, each side given as (array, position of index 0, stride along each
/// dimension, in elements; a source stride may be 0 or negative). Before anything is copied,
/// every position either side reaches is checked to lie inside its array, and distinct indexes
/// to reach distinct destination elements (the copy writes in parallel); an error naming `op`
/// otherwise.
pub(crate) fn strided_copy<T: Elem>(op: &str, dims: &[usize], src: (&[T], isize, &[isize]), dst: (&mut [T], isize, &[isize])) -> Result<()> {
    let ((src, src_base, src_strides), (dst, dst_base, dst_strides)) = (src, dst);
    let inside = |len: usize, base: isize, strides: &[isize]| {
        strides.len() == dims.len() && reach(dims, base, strides).is_none_or(|(low, high)| low >= 0 && high < len as isize)
    };
    if !inside(src.len(), src_base, src_strides) || !inside(dst.len(), dst_base, dst_strides) {
        crate::bail!(
            Runtime,
            "{op}: a strided copy over {dims:?} (strides {src_strides:?} from {src_base}, {dst_strides:?} from {dst_base}) reaches past its input of {} or output of {} elements",
            src.len(),
            dst.len()
        );
    }
    if !dims.contains(&0) && !distinct_positions(dims, dst_strides) {
        crate::bail!(Runtime, "{op}: a strided copy over {dims:?} writes output elements more than once (strides {dst_strides:?})");
    }
    // SAFETY: the checks above are `strided_copy_unchecked`'s contract: every position either
    // side reaches lies in its slice, distinct indexes write distinct elements, and a shared and
    // a unique borrow never overlap.
    unsafe { strided_copy_unchecked(dims, src.as_ptr(), src_base, src_strides, dst.as_mut_ptr(), dst_base, dst_strides) };
    Ok(())
}

/// [`strided_copy`] without its checks: element `idx` of `dims` goes from `src[sb + idx·ss]` to
/// `dst[db + idx·ds]`.
///
/// # Safety
/// `ss` and `ds` have one stride per dimension of `dims`; over the index space `dims`, every
/// position `sb + idx·ss` is an element of the source allocation and every `db + idx·ds` one of
/// the destination allocation, valid for reads and for writes respectively and reached by nothing
/// else while the copy runs; distinct indexes reach distinct destination positions (the copy
/// writes from several threads); the source and the destination do not overlap.
unsafe fn strided_copy_unchecked<T: Elem>(dims: &[usize], src: *const T, sb: isize, ss: &[isize], dst: *mut T, db: isize, ds: &[isize]) {
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let (sp, dp) = (SendPtr(src as *mut T), SendPtr(dst));
    let (Some((&inner, outer)), Some((&si, ss_outer)), Some((&di, ds_outer))) = (dims.split_last(), ss.split_last(), ds.split_last()) else {
        // SAFETY: a 0-d block is the single element at the bases, inside both arrays.
        unsafe { *dst.offset(db) = *src.offset(sb) };
        return;
    };
    // The positions of index `row` of the leading dimensions `lens` (strides `s` and `d`).
    let offsets = |mut row: usize, lens: &[usize], s: &[isize], d: &[isize]| -> (isize, isize) {
        let (mut so, mut dof) = (sb, db);
        for ((&len, &s), &d) in lens.iter().zip(s).zip(d).rev() {
            let i = (row % len) as isize;
            row /= len;
            so += i * s;
            dof += i * d;
        }
        (so, dof)
    };
    const TILE: usize = 32;
    if let (Some((&r, batch)), Some((&ss_row, ss_batch)), Some((&ds_row, ds_batch))) =
        (outer.split_last(), ss_outer.split_last(), ds_outer.split_last())
    {
        let c = inner;
        if si != 1 && di == 1 && c >= TILE && r >= TILE {
            let batches: usize = batch.iter().product();
            // Whole contiguous matrices of 4-byte values: the register-tiled transpose of the GEMM
            // code moves them (1024x1024: 1.46 -> 0.3 ms); it only moves bits, so any 4-byte type.
            let whole = ss_row == 1 && si == r as isize && ds_row == c as isize;
            if whole && std::mem::size_of::<T>() == 4 && std::mem::align_of::<T>() == std::mem::align_of::<f32>() {
                for b in 0..batches {
                    let (so, dof) = offsets(b, batch, ss_batch, ds_batch);
                    // SAFETY: batch b's source is a contiguous c x r block and its destination a
                    // contiguous r x c block (the strides checked above), each inside its array
                    // (the contract), distinct tensors; T has f32's size and alignment, and as an
                    // element type it is a plain number (no padding), so its bits move as f32's.
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
                    let (so, dof) = offsets(b, batch, ss_batch, ds_batch);
                    let r0 = rt * TILE;
                    for c0 in (0..c).step_by(TILE) {
                        for i in r0..(r0 + TILE).min(r) {
                            for j in c0..(c0 + TILE).min(c) {
                                // SAFETY: (b, i, j) is an in-range index of dims; strides map it into
                                // the source and destination the caller described, and no other
                                // task writes its destination element.
                                unsafe {
                                    *dp.get().offset(dof + i as isize * ds_row + j as isize) =
                                        *sp.get().offset(so + i as isize * ss_row + j as isize * si)
                                };
                            }
                        }
                    }
                }
            });
            return;
        }
    }
    let rows = total / inner;
    parallel_chunks(rows, (super::PARALLEL_GRAIN / inner).max(1), |rs| {
        for row in rs {
            let (so, dof) = offsets(row, outer, ss_outer, ds_outer);
            // SAFETY: as above, every (row, j) is in range of dims; a row's destination is written
            // by this task only and never overlaps the source (the contract).
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

/// Strides of a contiguous (row-major) array of `dims`.
pub(crate) fn contiguous(dims: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; dims.len()];
    let mut step = 1isize;
    for (stride, &len) in strides.iter_mut().zip(dims).rev() {
        *stride = step;
        step = step.saturating_mul(len as isize);
    }
    strides
}

#[cfg(feature = "cuda")]
fn contiguous_strides(s: &Shape) -> Vec<isize> {
    contiguous(s.dims())
}

/// `dims` permuted: element `i` is `dims[perm[i]]`.
fn permuted<V: Copy>(op: &str, dims: &[V], perm: &[usize]) -> Result<Vec<V>> {
    perm.iter().map(|&p| dims.get(p).copied().ok_or_else(|| crate::err!(Shape, "{op}: axis {p} is outside {} dimensions", dims.len()))).collect()
}

/// `y = x.transpose(perm)`, `x` of shape `x_dims`.
pub(crate) fn transpose_into<T: Elem>(op: &str, x: &[T], x_dims: &[usize], perm: &[usize], y: &mut [T]) -> Result<()> {
    let (y_dims, ss) = (permuted(op, x_dims, perm)?, permuted(op, &contiguous(x_dims), perm)?);
    strided_copy(op, &y_dims, (x, 0, &ss), (y, 0, &contiguous(&y_dims)))
}

/// Output 0 of a kernel call as a copy of input 0 (same dtype and element count; a reshape):
/// nothing to do when the call computes it in place.
pub(crate) fn copy_args(args: &KernelArgs) -> Result<()> {
    if args.shares_memory(0, 0) {
        return Ok(());
    }
    crate::dispatch_dtype!(args.input_dtype(0)?, T => super::broadcast::copy_into(args.input::<T>(0)?, args.output::<T>(0)?))
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
            if seen.get_mut(p).is_none_or(|seen| std::mem::replace(seen, true)) {
                crate::bail!(Value, "transpose: axes {:?} repeat an axis", self.axes);
            }
        }
        Ok(perm)
    }
}

impl Operator for Transpose {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("transpose", "input", inputs)?;
        let perm = self.perm(x.ndim())?;
        Ok(vec![Shape::new(permuted("transpose", x.dims(), &perm)?)])
    }
    /// Dimensions move with their axes, known or not, in both directions.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let counts = (inputs.len(), outputs.len());
        let ([x_slot], [y_slot]) = (inputs, outputs) else {
            crate::bail!(Value, "transpose: 1 input and 1 output expected, got {} and {}", counts.0, counts.1);
        };
        let Some(ndim) = x_slot.as_ref().or(y_slot.as_ref()).map(PartialShape::ndim) else { return Ok(()) };
        let perm = self.perm(ndim)?;
        if let Some(x) = x_slot.clone() {
            merge_partial(y_slot, &PartialShape(permuted("transpose", &x.0, &perm)?))?;
        }
        if let Some(y) = y_slot.clone() {
            let mut x = PartialShape::unknown(ndim);
            for (&p, &len) in perm.iter().zip(&y.0) {
                if let Some(slot) = x.0.get_mut(p) {
                    *slot = len;
                }
            }
            merge_partial(x_slot, &x)?;
        }
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dims = args.input_shape(0)?.dims();
        let perm = self.perm(dims.len())?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => transpose_into::<T>("transpose", args.input::<T>(0)?, dims, &perm, args.output::<T>(0)?))
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let ([x], [y]) = (exactly("transpose", "input", inputs)?, exactly("transpose", "output", outputs)?);
        let perm = self.perm(x.shape.ndim())?;
        let source = permuted("transpose", &contiguous_strides(&x.shape), &perm)?;
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
            if let Some(slot) = inverse.get_mut(a.rem_euclid(n) as usize) {
                *slot = i as i64;
            }
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
        let [lhs, rhs] = exactly("reshape_like", "input", inputs)?;
        if lhs.size() != rhs.size() {
            crate::bail!(Shape, "reshape_like: {lhs} and {rhs} have different sizes");
        }
        Ok(vec![rhs.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[lhs, _] = exactly("reshape_like", "input", inputs)?;
        Ok(vec![lhs])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        copy_first_gpu("reshape_like", gpu, inputs, outputs)
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
        let [lhs, rhs] = exactly("_identity_with_attr_like_rhs", "input", inputs)?;
        if lhs != rhs {
            crate::bail!(Shape, "_identity_with_attr_like_rhs: lhs {lhs} must have the shape of rhs {rhs}");
        }
        Ok(vec![lhs.clone()])
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        unify_partial(inputs, outputs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[lhs, _] = exactly("_identity_with_attr_like_rhs", "input", inputs)?;
        Ok(vec![lhs])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        copy_first_gpu("_identity_with_attr_like_rhs", gpu, inputs, outputs)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        Ok(vec![Some(d.out_grad(0)), None])
    }
}

/// Input 0 and the one output of a call on a GPU.
#[cfg(feature = "cuda")]
fn first_and_output<'a>(op: &str, inputs: &'a [Tensor], outputs: &'a [Tensor]) -> Result<(&'a Tensor, &'a Tensor)> {
    match (inputs.first(), outputs) {
        (Some(x), [y]) => Ok((x, y)),
        _ => crate::bail!(Value, "{op}: an input and one output expected, got {} and {}", inputs.len(), outputs.len()),
    }
}

/// Output 0 as a copy of input 0 on a GPU (a reshape).
#[cfg(feature = "cuda")]
fn copy_first_gpu(op: &str, gpu: &crate::backend::cuda::Gpu, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
    let (x, y) = first_and_output(op, inputs, outputs)?;
    crate::backend::cuda::kernels::copy_bytes(gpu, x, y)
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
    while let Some(&code) = spec_v.get(i) {
        match code {
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
        if let Some(slot) = out.get_mut(k) {
            *slot = src.size() / known;
        }
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
    let mut rest = spec;
    while let Some((&code, tail)) = rest.split_first() {
        if let (-4, [a, b, after @ ..]) = (code, tail) {
            groups.push(vec![-4, *b, *a]);
            rest = after;
        } else {
            groups.push(vec![code]);
            rest = tail;
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
    name: &'static str,
    shape_of: Box<dyn Fn(&Shape) -> Result<Shape> + Send + Sync>,
}

impl Operator for Relayout {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly(self.name, "input", inputs)?;
        Ok(vec![(self.shape_of)(x)?])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        copy_args(args)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        copy_first_gpu(self.name, gpu, inputs, outputs)
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

/// The product of the dimensions before `axis`, its length and the product of those after it.
pub(crate) fn around_axis(op: &str, dims: &[usize], axis: usize) -> Result<(usize, usize, usize)> {
    match dims.split_at_checked(axis) {
        Some((before, [len, after @ ..])) => Ok((before.iter().product(), *len, after.iter().product())),
        _ => crate::bail!(Shape, "{op}: axis {axis} is outside a shape of {} dimensions", dims.len()),
    }
}

/// The length of `axis` of `shape`.
fn axis_len(op: &str, shape: &Shape, axis: usize) -> Result<usize> {
    shape.dims().get(axis).copied().ok_or_else(|| crate::err!(Shape, "{op}: axis {axis} is outside {shape}"))
}

/// Rows of a copy between blocks of `block` elements below which it stays on one thread.
fn min_rows<T>(block: usize) -> usize {
    ((1usize << 17) / (block * std::mem::size_of::<T>()).max(1)).max(1)
}

/// For every row: `block` elements from column `from` of a row of `src` (rows of `src_row`
/// elements) to column `to` of the same row of `dst` (rows of `dst_row`). The copies that join
/// arrays along an axis and split them apart, split across threads by rows.
fn copy_rows<T: Copy + Send + Sync>(
    op: &str,
    block: usize,
    (src, src_row, from): (&[T], usize, usize),
    (dst, dst_row, to): (&mut [T], usize, usize),
) -> Result<()> {
    if block == 0 {
        return Ok(());
    }
    let rows = dst.len().checked_div(dst_row).unwrap_or(0);
    if src.len() != rows * src_row || dst.len() != rows * dst_row || from + block > src_row || to + block > dst_row {
        crate::bail!(
            Runtime,
            "{op}: blocks of {block} elements at {from} of rows of {src_row} and at {to} of rows of {dst_row} do not fit arrays of {} and {} elements",
            src.len(),
            dst.len()
        );
    }
    parallel_units(dst, dst_row, min_rows::<T>(block), |first, piece| {
        for (d, s) in piece.chunks_exact_mut(dst_row).zip(src.chunks_exact(src_row).skip(first)) {
            let (Some(d), Some(s)) = (d.get_mut(to..to + block), s.get(from..from + block)) else {
                crate::bail!(Runtime, "{op}: a block of {block} elements lies outside its row");
            };
            d.copy_from_slice(s);
        }
        Ok(())
    })
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
        let mut total = 0;
        for s in inputs {
            let same_rest = s.ndim() == first.ndim() && s.dims().iter().zip(first.dims()).enumerate().all(|(d, (a, b))| d == axis || a == b);
            if !same_rest {
                crate::bail!(Shape, "Concat: input shapes {} must agree except on dim {}", list(inputs), self.dim);
            }
            total += axis_len("Concat", s, axis)?;
        }
        let mut out = first.dims().to_vec();
        if let Some(len) = out.get_mut(axis) {
            *len = total;
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
            if let Some(len) = rest.0.get_mut(axis) {
                *len = None;
            }
            common.merge(&rest).map_err(|e| e.context(format!("Concat: operands {} must agree except on dim {}", list_partial(inputs), self.dim)))?;
        }
        for slot in inputs.iter_mut() {
            merge_partial(slot, &common)?;
        }
        let mut out = common;
        if let Some(len) = out.0.get_mut(axis) {
            *len = inputs.iter().map(|s| s.as_ref().and_then(|s| s.0.get(axis).copied().flatten())).sum();
        }
        let [y_slot] = outputs else {
            crate::bail!(Value, "Concat: 1 output expected, got {}", outputs.len());
        };
        merge_partial(y_slot, &out)?;
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.output_shape(0)?;
        let axis = normalize_axis(self.dim, shape.ndim())?;
        let (_, len, inner) = around_axis("Concat", shape.dims(), axis)?;
        let out_row = len * inner;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let out = args.output::<T>(0)?;
            let mut offset = 0;
            for k in 0..args.inputs().len() {
                let block = axis_len("Concat", args.input_shape(k)?, axis)? * inner;
                copy_rows("Concat", block, (args.input::<T>(k)?, block, 0), (&mut *out, out_row, offset))?;
                offset += block;
            }
            Ok(())
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{strided_copy, Strided};
        let [out] = exactly("Concat", "output", outputs)?;
        let axis = normalize_axis(self.dim, out.shape.ndim())?;
        let (outer, len, inner) = around_axis("Concat", out.shape.dims(), axis)?;
        let out_row = (len * inner) as isize;
        let mut offset = 0;
        for x in inputs {
            let row = axis_len("Concat", &x.shape, axis)? * inner;
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
        let Some((grad, parts)) = inputs.split_first() else {
            crate::bail!(Value, "_backward_Concat: the gradient and the concatenated inputs are needed, got no input");
        };
        let concatenated = Concat { num_args: self.num_args, dim: self.dim }.infer_shape(parts)?;
        let [concatenated] = exactly("_backward_Concat", "concatenation", &concatenated)?;
        if concatenated != grad {
            crate::bail!(Shape, "_backward_Concat: gradient {grad} does not match the concatenation {concatenated}");
        }
        Ok(parts.to_vec())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&grad) = inputs.first() else {
            crate::bail!(Value, "_backward_Concat: the gradient and the concatenated inputs are needed, got no input");
        };
        Ok(vec![grad; self.num_args])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_Concat";
        let shape = args.input_shape(0)?;
        let axis = normalize_axis(self.dim, shape.ndim())?;
        let (_, len, inner) = around_axis(op, shape.dims(), axis)?;
        let row = len * inner;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let g = args.input::<T>(0)?;
            let mut offset = 0;
            for o in 0..args.outputs().len() {
                let part = axis_len(op, args.output_shape(o)?, axis)? * inner;
                copy_rows(op, part, (g, row, offset), (args.output::<T>(o)?, part, 0))?;
                offset += part;
            }
            Ok(())
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let grads: Vec<crate::graph::Entry> = (0..self.num_args).map(|i| d.out_grad(i)).collect();
        let refs: Vec<&crate::graph::Entry> = grads.iter().collect();
        let joined = d.op("Concat", &[("num_args", self.num_args.to_string()), ("dim", self.dim.to_string())], &refs)?;
        Ok(std::iter::once(Some(joined)).chain((0..self.num_args).map(|_| None)).collect())
    }
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
        let [s] = exactly("SliceChannel", "input", inputs)?;
        let axis = normalize_axis(self.p.axis, s.ndim())?;
        let n = self.p.num_outputs;
        let Some((before, [len, after @ ..])) = s.dims().split_at_checked(axis) else {
            crate::bail!(Shape, "SliceChannel: axis {axis} is outside {s}");
        };
        let len = *len;
        if n == 0 || !len.is_multiple_of(n) {
            crate::bail!(Shape, "SliceChannel: axis {axis} of {s} (length {len}) cannot be split into {n} equal parts");
        }
        let part = len / n;
        if self.p.squeeze_axis && part != 1 {
            crate::bail!(Shape, "SliceChannel: squeeze_axis needs parts of length 1, but {s} split {n} ways gives {part}");
        }
        let kept: &[usize] = if self.p.squeeze_axis { &[] } else { &[part] };
        Ok(vec![Shape::new([before, kept, after].concat()); n])
    }
    /// Every part has one shape: the input's with the split axis divided (or removed when
    /// squeezed); what is known of any part fills in the others and the input.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let [x_slot] = inputs else {
            crate::bail!(Value, "SliceChannel: 1 input expected, got {}", inputs.len());
        };
        let Some(data) = x_slot.clone() else { return Ok(()) };
        let axis = normalize_axis(self.p.axis, data.ndim())?;
        let n = self.p.num_outputs;
        let mut part = data;
        let Some(slot) = part.0.get_mut(axis) else {
            crate::bail!(Shape, "SliceChannel: axis {axis} is outside {part}");
        };
        if let Some(len) = *slot {
            if n == 0 || len % n != 0 {
                crate::bail!(Shape, "SliceChannel: axis {axis} of length {len} cannot be split into {n} equal parts");
            }
            *slot = Some(len / n);
        }
        if self.p.squeeze_axis {
            if slot.is_some_and(|len| len != 1) {
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
        } else if let Some(len) = whole.0.get_mut(axis) {
            *len = len.map(|len| len * n);
        }
        merge_partial(x_slot, &whole)?;
        Ok(())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "SliceChannel";
        let shape = args.input_shape(0)?;
        let axis = normalize_axis(self.p.axis, shape.ndim())?;
        let (_, len, inner) = around_axis(op, shape.dims(), axis)?;
        let part = len.checked_div(self.p.num_outputs).unwrap_or(0) * inner;
        let row = len * inner;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let x = args.input::<T>(0)?;
            for k in 0..args.outputs().len() {
                copy_rows(op, part, (x, row, k * part), (args.output::<T>(k)?, part, 0))?;
            }
            Ok(())
        })
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
        (DType::F32, DType::BF16) => map_into(args.input::<f32>(i)?, args.output::<bf16>(o)?, PARALLEL_GRAIN, bf16::narrow),
        (DType::BF16, DType::F32) => map_into(args.input::<bf16>(i)?, args.output::<f32>(o)?, PARALLEL_GRAIN, bf16::widen),
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
    if x.dtype == y.dtype {
        // SAFETY: this function's own contract.
        return unsafe { super::kernel_args::copy_tensor(x, y) };
    }
    cast_args(&KernelArgs::new(std::slice::from_ref(x), std::slice::from_ref(y), &[], &[])?, 0, 0)
}

impl Operator for Cast {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("Cast", "input", inputs)?;
        Ok(vec![x.clone()])
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
        let (x, y) = first_and_output("Cast", inputs, outputs)?;
        crate::backend::cuda::kernels::cast(gpu, x, y)
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
        let [data, _] = exactly("_cast_like", "input", inputs)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, like] = exactly("_cast_like", "input", inputs)?;
        Ok(vec![like])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        cast_args(args, 0, 0)
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let (x, y) = first_and_output("_cast_like", inputs, outputs)?;
        crate::backend::cuda::kernels::cast(gpu, x, y)
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

impl ShapeInfo {
    fn name(&self) -> &'static str {
        if self.size_only {
            "size_array"
        } else {
            "shape_array"
        }
    }
}

impl Operator for ShapeInfo {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly(self.name(), "input", inputs)?;
        Ok(vec![Shape::new(vec![if self.size_only { 1 } else { x.ndim() }])])
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![DType::I64])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let s = args.input_shape(0)?;
        let values: Vec<i64> = if self.size_only { vec![s.size() as i64] } else { s.dims().iter().map(|&d| d as i64).collect() };
        super::broadcast::copy_into(&values, args.output::<i64>(0)?)
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
            Ok(Relayout { name: "Reshape", shape_of: Box::new(move |s| infer_reshape(s, &spec, reverse)) })
        },
    ));
    add(OpDef::new(
        "Flatten",
        &["flatten"],
        "Flattens the input array into a 2-D array, collapsing the higher dimensions.",
        |_: super::params::NoParams| {
            Ok(Relayout {
                name: "Flatten",
                shape_of: Box::new(|s| {
                    let first = s.dims().first().copied().unwrap_or(1);
                    Ok(Shape::new(vec![first, s.size().checked_div(first).unwrap_or(0)]))
                }),
            })
        },
    ));
    add(OpDef::new("expand_dims", &[], "Inserts a new axis of size 1 into the array shape.", |p: ExpandDimsParams| {
        Ok(Relayout {
            name: "expand_dims",
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

    #[test]
    fn strided_copy_checks_what_it_reaches() {
        let src: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let mut dst = vec![0f32; 6];
        // A 2 x 3 array transposed into 3 x 2.
        strided_copy("t", &[3, 2], (&src, 0, &[1, 3]), (&mut dst, 0, &[2, 1])).unwrap();
        assert_eq!(dst, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(strided_copy("t", &[3, 2], (&src, 1, &[1, 3]), (&mut dst, 0, &[2, 1])).is_err(), "reads past the source");
        assert!(strided_copy("t", &[3, 2], (&src, 0, &[1, 3]), (&mut dst, 1, &[2, 1])).is_err(), "writes past the output");
        assert!(strided_copy("t", &[3, 2], (&src, 0, &[1, 3]), (&mut dst, 0, &[1, 1])).is_err(), "writes an element twice");
        assert!(strided_copy("t", &[3, 2], (&src, 0, &[1]), (&mut dst, 0, &[2, 1])).is_err(), "a stride per dimension");
        assert!(strided_copy("t", &[3, 0], (&src, 100, &[1, 3]), (&mut dst, 100, &[2, 1])).is_ok(), "an empty copy reaches nothing");
        // One value broadcast over the output (stride 0 on the source side only).
        strided_copy("t", &[2, 3], (&[7f32], 0, &[0, 0]), (&mut dst, 0, &[3, 1])).unwrap();
        assert_eq!(dst, vec![7.0; 6]);
    }

    #[test]
    fn transposes_match_the_definition() {
        // Large enough for the tiled paths: whole 4-byte matrices, and the generic tiles.
        let (r, c) = (40, 33);
        let x: Vec<f32> = (0..r * c).map(|v| v as f32).collect();
        let mut y = vec![0f32; r * c];
        transpose_into("t", &x, &[r, c], &[1, 0], &mut y).unwrap();
        let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let mut y64 = vec![0f64; r * c];
        transpose_into("t", &x64, &[r, c], &[1, 0], &mut y64).unwrap();
        for i in 0..c {
            for j in 0..r {
                assert_eq!(y[i * r + j], x[j * c + i]);
                assert_eq!(y64[i * r + j], x64[j * c + i]);
            }
        }
        assert!(transpose_into("t", &x, &[r, c], &[1, 0], &mut y[1..]).is_err(), "an output too short");
        assert!(transpose_into("t", &x, &[r, c], &[2, 0], &mut y).is_err(), "an axis outside the input");
    }
}
