//! Reductions over axes: sum, mean, prod, max, min, nansum, nanprod.
//!
//! The input is viewed as (outer, reduced, inner) blocks without copying whenever the reduced axes
//! are adjacent; otherwise the kept axes are first transposed to the front. Contiguous runs are
//! accumulated in eight independent f64 lanes, which vectorizes and keeps float32 sums accurate.

use std::marker::PhantomData;

use super::shape_ops::transpose_into;
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor};
use crate::base::{normalize_axis, Elem, Shape};
use crate::error::Result;

pub trait Reducer: Send + Sync + 'static {
    const INIT: f64;
    fn step(acc: f64, x: f64) -> f64;
    /// Combine two partial accumulators (for most reducers, one more step).
    fn merge(a: f64, b: f64) -> f64 {
        Self::step(a, b)
    }
    fn finish(acc: f64, _count: usize) -> f64 {
        acc
    }
}

struct Sum;
impl Reducer for Sum {
    const INIT: f64 = 0.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc + x
    }
}
struct Mean;
impl Reducer for Mean {
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
    const INIT: f64 = 1.0;
    #[inline(always)]
    fn step(acc: f64, x: f64) -> f64 {
        acc * x
    }
}
struct NanSum;
impl Reducer for NanSum {
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
                    if mask[a] {
                        crate::bail!(Value, "axis {a} is given more than once");
                    }
                    mask[a] = true;
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
        let s = &inputs[0];
        let mask = self.mask(s.ndim())?;
        let dims: Vec<usize> = if self.params.keepdims {
            s.dims().iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect()
        } else {
            s.dims().iter().zip(&mask).filter(|(_, &m)| !m).map(|(&d, _)| d).collect()
        };
        // MXNet 1.x represents a full reduction as shape (1,), not as a 0-d scalar.
        Ok(vec![if dims.is_empty() { Shape::new(vec![1]) } else { Shape::new(dims) }])
    }

    fn forward(&self, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let x = &inputs[0];
        let mask = self.mask(x.shape.ndim())?;
        crate::dispatch_dtype!(x.dtype, T => reduce_tensor::<T, R>(x, &outputs[0], &mask));
        Ok(())
    }
}

/// Split `dims` into (outer, reduced, inner) if the reduced axes are adjacent (ignoring size-1 axes).
fn as_three_blocks(dims: &[usize], mask: &[bool]) -> Option<(usize, usize, usize)> {
    let significant: Vec<(usize, bool)> = dims.iter().zip(mask).filter(|(&d, _)| d != 1).map(|(&d, &m)| (d, m)).collect();
    let first = significant.iter().position(|&(_, m)| m);
    let Some(first) = first else {
        return Some((significant.iter().map(|p| p.0).product(), 1, 1));
    };
    let last = significant.iter().rposition(|&(_, m)| m).unwrap();
    if significant[first..=last].iter().any(|&(_, m)| !m) {
        return None;
    }
    let prod = |r: &[(usize, bool)]| r.iter().map(|p| p.0).product::<usize>();
    Some((prod(&significant[..first]), prod(&significant[first..=last]), prod(&significant[last + 1..])))
}

fn reduce_tensor<T: Elem, R: Reducer>(x: &Tensor, out: &Tensor, mask: &[bool]) {
    let dims = x.shape.dims();
    if let Some((outer, r, inner)) = as_three_blocks(dims, mask) {
        reduce_blocks::<T, R>(x.ptr::<T>(), out.ptr::<T>(), outer, r, inner);
        return;
    }
    // Move kept axes to the front, reduced axes to the back, then reduce contiguous rows.
    let perm: Vec<usize> = (0..dims.len()).filter(|&i| !mask[i]).chain((0..dims.len()).filter(|&i| mask[i])).collect();
    let mut tmp: Vec<T> = vec![T::default(); x.size()];
    // SAFETY: tmp holds x.size() elements of T, matching the permuted shape.
    let tmp_t = unsafe { Tensor::new(tmp.as_mut_ptr() as *mut u8, Shape::new(perm.iter().map(|&p| dims[p]).collect::<Vec<_>>()), x.dtype) };
    transpose_into::<T>(x, &tmp_t, &perm);
    let r: usize = (0..dims.len()).filter(|&i| mask[i]).map(|i| dims[i]).product();
    reduce_blocks::<T, R>(tmp.as_ptr(), out.ptr::<T>(), x.size() / r.max(1), r, 1);
}

/// Reduce `r` contiguous elements into an accumulator with eight independent lanes.
#[inline]
fn reduce_run<T: Elem, R: Reducer>(x: &[T]) -> f64 {
    let mut lanes = [R::INIT; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] = R::step(lanes[l], c[l].to_f64());
        }
    }
    let mut acc = lanes.into_iter().fold(R::INIT, R::merge);
    for &v in chunks.remainder() {
        acc = R::step(acc, v.to_f64());
    }
    acc
}

fn reduce_blocks<T: Elem, R: Reducer>(x: *const T, out: *mut T, outer: usize, r: usize, inner: usize) {
    let (xp, op) = (SendPtr(x as *mut T), SendPtr(out));
    const GRAIN: usize = 1 << 15;
    if inner == 1 {
        if outer == 1 || outer < rayon::current_num_threads() {
            // Few long rows: split each row across threads and merge the partials.
            for o in 0..outer {
                let pieces = r.div_ceil(GRAIN).min(rayon::current_num_threads() * 4).max(1);
                let step = r.div_ceil(pieces);
                let partials: Vec<f64> = {
                    use rayon::prelude::*;
                    (0..pieces)
                        .into_par_iter()
                        .map(|p| {
                            let (s, e) = (p * step, ((p + 1) * step).min(r));
                            // SAFETY: [s, e) lies inside row o of the input.
                            let row = unsafe { std::slice::from_raw_parts(xp.get().add(o * r + s), e.saturating_sub(s)) };
                            reduce_run::<T, R>(row)
                        })
                        .collect()
                };
                let acc = partials.into_iter().fold(R::INIT, R::merge);
                // SAFETY: o < outer = number of output elements.
                unsafe { *op.get().add(o) = T::from_f64(R::finish(acc, r)) };
            }
            return;
        }
        parallel_chunks(outer, (GRAIN / r.max(1)).max(1), |rows| {
            for o in rows {
                // SAFETY: row o spans [o*r, (o+1)*r) of the input; output o is ours alone.
                unsafe {
                    let row = std::slice::from_raw_parts(xp.get().add(o * r), r);
                    *op.get().add(o) = T::from_f64(R::finish(reduce_run::<T, R>(row), r));
                }
            }
        });
        return;
    }
    // Reduce over the middle axis: accumulate whole inner rows, which vectorizes over `inner`.
    let reduce_columns = |o: usize, cols: std::ops::Range<usize>| {
        let mut acc = vec![R::INIT; cols.len()];
        for k in 0..r {
            // SAFETY: (o, k, cols) indexes inside the (outer, r, inner) input.
            let row = unsafe { std::slice::from_raw_parts(xp.get().add((o * r + k) * inner + cols.start), cols.len()) };
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = R::step(*a, v.to_f64());
            }
        }
        for (j, a) in cols.clone().zip(acc) {
            // SAFETY: output (o, j) is written by this task only.
            unsafe { *op.get().add(o * inner + j) = T::from_f64(R::finish(a, r)) };
        }
    };
    if outer >= rayon::current_num_threads() {
        parallel_chunks(outer, (GRAIN / (r * inner).max(1)).max(1), |os| os.for_each(|o| reduce_columns(o, 0..inner)));
    } else {
        for o in 0..outer {
            parallel_chunks(inner, (GRAIN / r.max(1)).max(64), |cols| reduce_columns(o, cols));
        }
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

/// argmax / argmin: the index (as a value of the input's dtype, as in MXNet) of the first extreme.
struct ArgReduce {
    axis: Option<i64>,
    keepdims: bool,
    max: bool,
}

impl ArgReduce {
    /// (outer, length along the axis, inner) and the output shape.
    fn layout(&self, s: &Shape) -> Result<((usize, usize, usize), Shape)> {
        match self.axis {
            None => Ok(((1, s.size(), 1), Shape::new(if self.keepdims { vec![1; s.ndim().max(1)] } else { vec![1] }))),
            Some(a) => {
                let a = normalize_axis(a, s.ndim())?;
                let d = s.dims();
                let mut out = d.to_vec();
                if self.keepdims {
                    out[a] = 1;
                } else {
                    out.remove(a);
                }
                let out = if out.is_empty() { vec![1] } else { out };
                Ok(((d[..a].iter().product(), d[a], d[a + 1..].iter().product()), Shape::new(out)))
            }
        }
    }
}

impl Operator for ArgReduce {
    fn num_inputs(&self) -> usize {
        1
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let ((_, r, _), out) = self.layout(&inputs[0])?;
        if r == 0 {
            crate::bail!(Shape, "cannot take the arg{} of an empty axis of {}", if self.max { "max" } else { "min" }, inputs[0]);
        }
        Ok(vec![out])
    }
    fn forward(&self, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ((outer, r, inner), _) = self.layout(&inputs[0].shape)?;
        let max = self.max;
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (xp, op) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            parallel_chunks(outer * inner, (1 << 14) / r.max(1) + 1, |cells| {
                for cell in cells {
                    let (o, j) = (cell / inner, cell % inner);
                    let (mut best, mut best_k) = (f64::NAN, 0usize);
                    for k in 0..r {
                        // SAFETY: (o, k, j) indexes inside the (outer, r, inner) input.
                        let v = unsafe { *xp.get().add((o * r + k) * inner + j) }.to_f64();
                        let better = if max { v > best } else { v < best };
                        if k == 0 || better || (v.is_nan() && !best.is_nan()) {
                            best = v;
                            best_k = k;
                        }
                    }
                    // SAFETY: output cell is written by this task only.
                    unsafe { *op.get().add(cell) = T::from_f64(best_k as f64) };
                }
            })
        });
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
                |_: super::params::NoParams| Ok(ArgReduce { axis: Some(-1), keepdims: false, max: true })));
            $(
                add(OpDef::new($name, &[$($alias),*], $doc,
                    |params: ReduceParams| Ok(Reduce::<$r> { params, _r: PhantomData })));
            )*
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
