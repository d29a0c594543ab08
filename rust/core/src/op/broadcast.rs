//! Element-wise kernels shared by the math operators: maps over one tensor and NumPy-style
//! broadcasting over two, without ever materializing a broadcast input.
//!
//! Dimensions are collapsed first (a `(64, 128)` add of equal shapes is one flat loop, a row
//! broadcast `(64, 128) + (128,)` is 64 rows of contiguous work), the innermost loop is specialised
//! on whether each input advances or stays put so that it vectorizes, and large outputs are split
//! across the engine's threads.

use std::mem::MaybeUninit;

use super::{parallel_chunks, SendPtr, Tensor, PARALLEL_GRAIN};

/// Elements per block that in-place loops copy out before overwriting: the compiler vectorizes
/// a loop only where it can tell its input and output apart (its run-time overlap check fails
/// on exactly aliased pointers and falls back to scalar code), so an aliased input is read
/// through a small local copy instead.
pub(super) const STAGE: usize = 256;
use crate::base::Shape;
use crate::error::Result;

/// NumPy broadcasting of two shapes (dims aligned on the right), as MXNet's broadcast ops do.
pub fn broadcast_shape(op: &str, a: &Shape, b: &Shape) -> Result<Shape> {
    let n = a.ndim().max(b.ndim());
    let mut out = crate::base::Dims::from_elem(0, n);
    for i in 0..n {
        let da = if i + a.ndim() >= n { a[i + a.ndim() - n] } else { 1 };
        let db = if i + b.ndim() >= n { b[i + b.ndim() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            crate::bail!(Shape, "{op}: operands could not be broadcast together with shapes {a} {b}");
        };
    }
    Ok(Shape(out))
}

/// 1 or 0 in a float type: MXNet's comparison and predicate ops return the input's dtype.
#[inline(always)]
pub fn truth<F: num_traits::Float>(c: bool) -> F {
    if c {
        F::one()
    } else {
        F::zero()
    }
}

/// Apply `f` to every element of `x`, writing `y` (which may alias `x`).
pub fn map1<A: Copy + Send + Sync, B: Copy + Send + Sync>(x: &Tensor, y: &Tensor, f: impl Fn(A) -> B + Sync) {
    map1_with_grain(x, y, PARALLEL_GRAIN, f)
}

/// [`map1`] splitting across threads in chunks of at least `grain` elements (a costlier `f`
/// repays the hand-off on fewer elements).
pub fn map1_with_grain<A: Copy + Send + Sync, B: Copy + Send + Sync>(x: &Tensor, y: &Tensor, grain: usize, f: impl Fn(A) -> B + Sync) {
    let n = y.size();
    let (xp, yp) = (SendPtr(x.ptr::<A>()), SendPtr(y.ptr::<B>()));
    let in_place = xp.get().addr() == yp.get().addr();
    parallel_chunks(n, grain, |r| {
        let (xp, yp) = (xp.get(), yp.get());
        if in_place {
            let mut staged = [MaybeUninit::<A>::uninit(); STAGE];
            for start in r.clone().step_by(STAGE) {
                let len = STAGE.min(r.end - start);
                // SAFETY: start..start + len lies in this task's range of both n-element tensors;
                // the block is copied out before any of it is overwritten, and `staged` is a
                // separate local array, so the map reads initialized, unaliased values.
                unsafe {
                    std::ptr::copy_nonoverlapping(xp.add(start), staged.as_mut_ptr() as *mut A, len);
                    let xs = std::slice::from_raw_parts(staged.as_ptr() as *const A, len);
                    map_slices(xs, std::slice::from_raw_parts_mut(yp.add(start), len), &f);
                }
            }
            return;
        }
        // SAFETY: distinct tensors never overlap (the runner stages partial overlaps through a
        // temporary), both hold n elements, and this task owns the output range r.
        let (xs, ys) = unsafe { (std::slice::from_raw_parts(xp.add(r.start), r.len()), std::slice::from_raw_parts_mut(yp.add(r.start), r.len())) };
        map_slices(xs, ys, &f);
    });
}

/// `ys[i] = f(xs[i])`, compiled for the CPU's widest vectors (`simd::vectorized`): math-heavy
/// maps (exp, tanh, sigmoid) then run sixteen lanes at a time instead of four.
pub(super) fn map_slices<A: Copy, B: Copy>(xs: &[A], ys: &mut [B], f: &impl Fn(A) -> B) {
    super::simd::vectorized(
        #[inline(always)]
        || {
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = f(x);
            }
        },
    )
}

/// Strides of `t` as seen through the output shape `out`: broadcast dims advance by zero.
fn broadcast_strides(t: &Shape, out: &Shape) -> Vec<usize> {
    let offset = out.ndim() - t.ndim();
    let own = t.strides();
    (0..out.ndim()).map(|i| if i < offset || t[i - offset] == 1 { 0 } else { own[i - offset] }).collect()
}

/// Merge adjacent dims that every operand walks contiguously; returns (dims, strides per operand).
fn collapse(dims: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = !out_dims.is_empty() && strides.iter().zip(&out_strides).all(|(s, os)| *os.last().unwrap() == s[i] * d);
        if mergeable {
            *out_dims.last_mut().unwrap() *= d;
            for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                *os.last_mut().unwrap() = s[i];
            }
        } else {
            out_dims.push(d);
            for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                os.push(s[i]);
            }
        }
    }
    if out_dims.is_empty() {
        out_dims.push(1);
        for os in out_strides.iter_mut() {
            os.push(0);
        }
    }
    (out_dims, out_strides)
}

#[inline(always)]
unsafe fn inner_loop<A: Copy, O: Copy>(n: usize, a: *const A, sa: usize, b: *const A, sb: usize, o: *mut O, f: &impl Fn(A, A) -> O) {
    let a_aliased = sa == 1 && a.addr() == o.addr();
    if a_aliased || (sb == 1 && b.addr() == o.addr()) {
        let mut staged = [MaybeUninit::<A>::uninit(); STAGE];
        for start in (0..n).step_by(STAGE) {
            let len = STAGE.min(n - start);
            let source = if a_aliased { a } else { b };
            // SAFETY (for the caller, as below): the block is copied out before the output
            // overwrites it; `staged` is a separate local array holding len initialized values.
            std::ptr::copy_nonoverlapping(source.add(start), staged.as_mut_ptr() as *mut A, len);
            let copy = staged.as_ptr() as *const A;
            let (a_block, b_block) = if a_aliased { (copy, b.add(start * sb)) } else { (a.add(start * sa), copy) };
            strided_loop(len, a_block, sa, b_block, sb, o.add(start), f);
        }
        return;
    }
    strided_loop(n, a, sa, b, sb, o, f)
}

#[inline(always)]
unsafe fn strided_loop<A: Copy, O: Copy>(n: usize, a: *const A, sa: usize, b: *const A, sb: usize, o: *mut O, f: &impl Fn(A, A) -> O) {
    // SAFETY (for the caller): a/b/o are valid for n steps of their strides.
    match (sa, sb) {
        (1, 1) => {
            for i in 0..n {
                *o.add(i) = f(*a.add(i), *b.add(i));
            }
        }
        (1, 0) => {
            let bv = *b;
            for i in 0..n {
                *o.add(i) = f(*a.add(i), bv);
            }
        }
        (0, 1) => {
            let av = *a;
            for i in 0..n {
                *o.add(i) = f(av, *b.add(i));
            }
        }
        _ => {
            for i in 0..n {
                *o.add(i) = f(*a.add(i * sa), *b.add(i * sb));
            }
        }
    }
}

/// `out = f(a, b)` with broadcasting; `out` has the broadcast shape and may alias `a` or `b` when
/// that operand has the output's shape.
pub fn zip2<A: Copy + Send + Sync, O: Copy + Send + Sync>(a: &Tensor, b: &Tensor, out: &Tensor, f: impl Fn(A, A) -> O + Sync) {
    let (ap, bp, op) = (SendPtr(a.ptr::<A>()), SendPtr(b.ptr::<A>()), SendPtr(out.ptr::<O>()));
    if out.size() == 0 {
        return;
    }
    if a.shape == out.shape && b.shape == out.shape {
        // The usual case needs no strides worked out (that costs as much as adding 2x2 arrays).
        return zip_run(out.size(), (ap, 1), (bp, 1), op, &f);
    }
    let sa = broadcast_strides(&a.shape, &out.shape);
    let sb = broadcast_strides(&b.shape, &out.shape);
    let (dims, strides) = collapse(out.shape.dims(), &[sa, sb]);
    let nd = dims.len();
    let inner = dims[nd - 1];
    let (ia, ib) = (strides[0][nd - 1], strides[1][nd - 1]);
    let rows: usize = dims[..nd - 1].iter().product();
    if rows == 1 {
        return zip_run(inner, (ap, ia), (bp, ib), op, &f);
    }
    let outer_dims = &dims[..nd - 1];
    let rows_per_chunk = (PARALLEL_GRAIN / inner.max(1)).max(1);
    parallel_chunks(rows, rows_per_chunk, |r| {
        super::simd::vectorized(
            #[inline(always)]
            || {
                for row in r {
                    let (mut rem, mut oa, mut ob) = (row, 0usize, 0usize);
                    for d in (0..outer_dims.len()).rev() {
                        let idx = rem % outer_dims[d];
                        rem /= outer_dims[d];
                        oa += idx * strides[0][d];
                        ob += idx * strides[1][d];
                    }
                    // SAFETY: offsets come from in-range indices of the output shape mapped through each
                    // operand's (broadcast) strides.
                    unsafe { inner_loop(inner, ap.get().add(oa), ia, bp.get().add(ob), ib, op.get().add(row * inner), &f) }
                }
            },
        )
    });
}

/// `out[i] = f(a[i * ia], b[i * ib])` for `i` in `0..len`, `out` contiguous.
fn zip_run<A: Copy + Send + Sync, O: Copy + Send + Sync>(
    len: usize,
    (ap, ia): (SendPtr<A>, usize),
    (bp, ib): (SendPtr<A>, usize),
    op: SendPtr<O>,
    f: &(impl Fn(A, A) -> O + Sync),
) {
    parallel_chunks(len, PARALLEL_GRAIN, |r| {
        // SAFETY: r lies in 0..len, and each operand spans len elements at its stride (the
        // caller's contract: these are the operands' extents along one collapsed dim).
        super::simd::vectorized(
            #[inline(always)]
            || unsafe { inner_loop(r.len(), ap.get().add(r.start * ia), ia, bp.get().add(r.start * ib), ib, op.get().add(r.start), f) },
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes_follow_numpy() {
        let s = |v: &[usize]| Shape::new(v.to_vec());
        assert_eq!(broadcast_shape("t", &s(&[2, 3]), &s(&[3])).unwrap(), s(&[2, 3]));
        assert_eq!(broadcast_shape("t", &s(&[4, 1, 5]), &s(&[3, 1])).unwrap(), s(&[4, 3, 5]));
        assert_eq!(broadcast_shape("t", &s(&[0, 3]), &s(&[1, 3])).unwrap(), s(&[0, 3]));
        let e = broadcast_shape("broadcast_add", &s(&[2, 3]), &s(&[4])).unwrap_err();
        assert!(e.message.contains("(2, 3) (4,)"), "{}", e.message);
    }

    #[test]
    fn collapse_merges_contiguous_and_broadcast_runs() {
        let (d, s) = collapse(&[2, 3, 4], &[vec![12, 4, 1], vec![0, 0, 1]]);
        assert_eq!(d, vec![6, 4]);
        assert_eq!(s, vec![vec![4, 1], vec![0, 1]]);
        let (d, _) = collapse(&[2, 3, 4], &[vec![12, 4, 1], vec![12, 4, 1]]);
        assert_eq!(d, vec![24]);
    }
}
