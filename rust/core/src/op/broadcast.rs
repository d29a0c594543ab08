//! Element-wise kernels shared by the math operators: maps over one tensor and NumPy-style
//! broadcasting over two, without ever materializing a broadcast input.
//!
//! Dimensions are collapsed first (a `(64, 128)` add of equal shapes is one flat loop, a row
//! broadcast `(64, 128) + (128,)` is 64 rows of contiguous work), the innermost loop is specialised
//! on whether each input advances or stays put so that it vectorizes, and large outputs are split
//! across the engine's threads.

use super::{parallel_units, InOut, KernelArgs, PARALLEL_GRAIN};
use crate::base::{Elem, Shape};
use crate::error::Result;

/// NumPy broadcasting of two shapes (dims aligned on the right), as MXNet's broadcast ops do.
pub fn broadcast_shape(op: &str, a: &Shape, b: &Shape) -> Result<Shape> {
    let mut out = crate::base::Dims::from_elem(0, a.ndim().max(b.ndim()));
    // Walked from the last axis: the shorter shape reads as 1 past its first axis.
    let from_last = |s: &Shape, k: usize| s.dims().iter().rev().nth(k).copied().unwrap_or(1);
    for (k, dim) in out.iter_mut().rev().enumerate() {
        let (da, db) = (from_last(a, k), from_last(b, k));
        *dim = if da == db || db == 1 {
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

/// `ys[i] = f(xs[i])` over separate slices of one length, split across threads in pieces of at
/// least `grain` elements (a costlier `f` repays the hand-off on fewer elements).
pub fn map_into<A: Copy + Sync, B: Copy + Send>(xs: &[A], ys: &mut [B], grain: usize, f: impl Fn(A) -> B + Sync) -> Result<()> {
    if xs.len() != ys.len() {
        crate::bail!(Runtime, "element-wise map: {} input elements for {} outputs", xs.len(), ys.len());
    }
    parallel_units(ys, 1, grain, |start, piece| {
        let source = xs.get(start..start + piece.len()).unwrap_or_default();
        map_slices(source, piece, &f);
        Ok(())
    })
}

/// `ys = xs` over slices of one length, split across threads in pieces of at least 1 MiB.
pub fn copy_into<T: Copy + Send + Sync>(xs: &[T], ys: &mut [T]) -> Result<()> {
    if xs.len() != ys.len() {
        crate::bail!(Runtime, "copy: {} elements into {}", xs.len(), ys.len());
    }
    let grain = (1 << 20) / std::mem::size_of::<T>().max(1);
    parallel_units(ys, 1, grain, |start, piece| {
        piece.copy_from_slice(xs.get(start..start + piece.len()).unwrap_or_default());
        Ok(())
    })
}

/// `ys[i] = f(ys[i])`, split across threads as [`map_into`] splits.
pub fn update_in_place<T: Copy + Send>(ys: &mut [T], grain: usize, f: impl Fn(T) -> T + Sync) -> Result<()> {
    parallel_units(ys, 1, grain, |_, piece| {
        crate::backend::cpu::simd::vectorized(
            #[inline(always)]
            || piece.iter_mut().for_each(|y| *y = f(*y)),
        );
        Ok(())
    })
}

/// Output 0 as `f` of input 0, element for element; the output may be the input's memory.
pub fn map_args<T: Elem>(args: &KernelArgs, grain: usize, f: impl Fn(T) -> T + Sync) -> Result<()> {
    match args.in_place::<T>(0, 0)? {
        InOut::Separate(xs, ys) => map_into(xs, ys, grain, f),
        InOut::Same(ys) => update_in_place(ys, grain, f),
    }
}

/// `ys[i] = f(xs[i])`, compiled for the CPU's widest vectors (`simd::vectorized`): math-heavy
/// maps (exp, tanh, sigmoid) then run sixteen lanes at a time instead of four.
pub(super) fn map_slices<A: Copy, B: Copy>(xs: &[A], ys: &mut [B], f: &impl Fn(A) -> B) {
    crate::backend::cpu::simd::vectorized(
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
    let mut strides = vec![0; out.ndim().saturating_sub(t.ndim())];
    strides.extend(t.dims().iter().zip(t.strides()).map(|(&d, s)| if d == 1 { 0 } else { s }));
    strides
}

/// Merge adjacent dims that every operand walks contiguously; returns (dims, strides per operand).
fn collapse(dims: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let stride = |s: &[usize]| s.get(i).copied().unwrap_or(0);
        let merged = match out_dims.last_mut() {
            Some(last) if strides.iter().zip(&out_strides).all(|(s, os)| os.last() == Some(&(stride(s) * d))) => {
                *last *= d;
                true
            }
            _ => false,
        };
        if !merged {
            out_dims.push(d);
        }
        for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
            match os.last_mut() {
                Some(last) if merged => *last = stride(s),
                _ => os.push(stride(s)),
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

/// One operand of [`zip_into`].
#[derive(Clone, Copy)]
pub enum Operand<'a, T> {
    /// Its own elements, of its own shape.
    Values(&'a [T], &'a Shape),
    /// The output's memory, read before it is overwritten (an operand of the output's shape
    /// computed in place).
    Output,
}

impl<'a, T> Operand<'a, T> {
    /// The operand's shape: its own, or `output`'s when it is the output.
    fn shape_or<'s>(&self, output: &'s Shape) -> &'s Shape
    where
        'a: 's,
    {
        match self {
            Operand::Values(_, shape) => shape,
            Operand::Output => output,
        }
    }
}

/// The part of one operand that one output row reads.
#[derive(Clone, Copy)]
enum Lane<'a, T> {
    Run(&'a [T]),
    Repeat(T),
    Output,
}

impl<'a, T: Copy> Lane<'a, T> {
    /// `len` elements from `offset` at `stride`: a run, or one value repeated. After `collapse`
    /// an operand's innermost stride is 1 or 0 (a broadcast axis): a C-contiguous last axis
    /// either moves by one or is broadcast.
    fn of(operand: Operand<'a, T>, offset: usize, stride: usize, len: usize) -> Result<Self> {
        let Operand::Values(values, _) = operand else {
            return Ok(Lane::Output);
        };
        let lane = match stride {
            0 => values.get(offset).copied().map(Lane::Repeat),
            1 => values.get(offset..offset + len).map(Lane::Run),
            _ => None,
        };
        lane.ok_or_else(|| crate::err!(Runtime, "broadcast: no {len} elements at {offset} (stride {stride}) in an operand of {}", values.len()))
    }
}

/// `out[i] = f(a[i], b[i])` for one row, each operand as its lane reads it.
#[inline(always)]
fn zip_lane<T: Copy>(a: Lane<T>, b: Lane<T>, out: &mut [T], f: &impl Fn(T, T) -> T) {
    use Lane::{Output, Repeat, Run};
    match (a, b) {
        (Run(a), Run(b)) => out.iter_mut().zip(a).zip(b).for_each(|((o, &x), &y)| *o = f(x, y)),
        (Run(a), Repeat(y)) => out.iter_mut().zip(a).for_each(|(o, &x)| *o = f(x, y)),
        (Repeat(x), Run(b)) => out.iter_mut().zip(b).for_each(|(o, &y)| *o = f(x, y)),
        (Repeat(x), Repeat(y)) => out.fill(f(x, y)),
        (Output, Run(b)) => out.iter_mut().zip(b).for_each(|(o, &y)| *o = f(*o, y)),
        (Output, Repeat(y)) => out.iter_mut().for_each(|o| *o = f(*o, y)),
        (Run(a), Output) => out.iter_mut().zip(a).for_each(|(o, &x)| *o = f(x, *o)),
        (Repeat(x), Output) => out.iter_mut().for_each(|o| *o = f(x, *o)),
        (Output, Output) => out.iter_mut().for_each(|o| *o = f(*o, *o)),
    }
}

/// `out = f(a, b)` with NumPy broadcasting; `out` has the broadcast shape `out_shape`.
pub fn zip_into<T: Copy + Send + Sync>(a: Operand<T>, b: Operand<T>, out: &mut [T], out_shape: &Shape, f: impl Fn(T, T) -> T + Sync) -> Result<()> {
    let (shape_a, shape_b) = (a.shape_or(out_shape), b.shape_or(out_shape));
    if shape_a == out_shape && shape_b == out_shape {
        // The usual case needs no strides worked out (that costs as much as adding 2x2 arrays).
        return zip_flat(a, b, out, (1, 1), &f);
    }
    let (dims, strides) = collapse(out_shape.dims(), &[broadcast_strides(shape_a, out_shape), broadcast_strides(shape_b, out_shape)]);
    let inner_stride = |operand: usize| strides.get(operand).and_then(|s| s.last()).copied().unwrap_or(0);
    let (ia, ib) = (inner_stride(0), inner_stride(1));
    let (Some((&inner, outer_dims)), false) = (dims.split_last(), out.is_empty()) else {
        return Ok(());
    };
    if outer_dims.is_empty() {
        return zip_flat(a, b, out, (ia, ib), &f);
    }
    // The offsets where each operand's part of output row `row` starts.
    let row_offsets = |row: usize| {
        let (mut rest, mut offsets) = (row, [0usize; 2]);
        for (d, &extent) in outer_dims.iter().enumerate().rev() {
            let index = rest % extent;
            rest /= extent;
            for (offset, operand_strides) in offsets.iter_mut().zip(&strides) {
                *offset += index * operand_strides.get(d).copied().unwrap_or(0);
            }
        }
        offsets
    };
    parallel_units(out, inner, (PARALLEL_GRAIN / inner.max(1)).max(1), |first_row, piece| {
        crate::backend::cpu::simd::vectorized(
            #[inline(always)]
            || -> Result<()> {
                for (row, values) in (first_row..).zip(piece.chunks_mut(inner)) {
                    let [oa, ob] = row_offsets(row);
                    zip_lane(Lane::of(a, oa, ia, inner)?, Lane::of(b, ob, ib, inner)?, values, &f);
                }
                Ok(())
            },
        )
    })
}

/// [`zip_into`] where the output is one row, each operand read at a stride of 1 or 0.
fn zip_flat<T: Copy + Send + Sync>(
    a: Operand<T>,
    b: Operand<T>,
    out: &mut [T],
    (ia, ib): (usize, usize),
    f: &(impl Fn(T, T) -> T + Sync),
) -> Result<()> {
    parallel_units(out, 1, PARALLEL_GRAIN, |first, piece| {
        let lanes = (Lane::of(a, first * ia, ia, piece.len())?, Lane::of(b, first * ib, ib, piece.len())?);
        crate::backend::cpu::simd::vectorized(
            #[inline(always)]
            || zip_lane(lanes.0, lanes.1, piece, f),
        );
        Ok(())
    })
}

/// Output 0 as `f` of inputs 0 and 1 broadcast together; an input of the output's shape may be
/// the output's memory.
pub fn zip_args<T: Elem>(args: &KernelArgs, f: impl Fn(T, T) -> T + Sync) -> Result<()> {
    let operand = |i: usize| -> Result<Operand<'_, T>> {
        if args.shares_memory(i, 0) {
            return Ok(Operand::Output);
        }
        Ok(Operand::Values(args.input::<T>(i)?, args.input_shape(i)?))
    };
    let (a, b) = (operand(0)?, operand(1)?);
    zip_into(a, b, args.output::<T>(0)?, args.output_shape(0)?, f)
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
    fn zips_broadcast_and_read_the_output_in_place() {
        let s = |v: &[usize]| Shape::new(v.to_vec());
        let (rows, row) = ([1f32, 2.0, 3.0, 4.0, 5.0, 6.0], [10f32, 20.0, 30.0]);
        let mut out = [0f32; 6];
        zip_into(Operand::Values(&rows, &s(&[2, 3])), Operand::Values(&row, &s(&[3])), &mut out, &s(&[2, 3]), |a, b| a + b).unwrap();
        assert_eq!(out, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        let column = [100f32, 200.0];
        zip_into(Operand::Values(&column, &s(&[2, 1])), Operand::Output, &mut out, &s(&[2, 3]), |a, b| b - a).unwrap();
        assert_eq!(out, [-89.0, -78.0, -67.0, -186.0, -175.0, -164.0]);
        zip_into(Operand::Output, Operand::Output, &mut out, &s(&[2, 3]), |a, b| a * b).unwrap();
        assert_eq!(out[0], 89.0 * 89.0);
        let short = [1f32];
        let refused = zip_into(Operand::Values(&short, &s(&[2, 3])), Operand::Output, &mut out, &s(&[2, 3]), |a, b| a + b);
        assert!(refused.is_err(), "an operand shorter than its shape is an error, not a read past it");
    }

    #[test]
    fn maps_split_across_threads_match_the_sequential_map() {
        let xs: Vec<f32> = (0..200_000).map(|i| i as f32).collect();
        let mut ys = vec![0f32; xs.len()];
        map_into(&xs, &mut ys, 1024, |x| x * 2.0 + 1.0).unwrap();
        assert!(xs.iter().zip(&ys).all(|(x, y)| *y == x * 2.0 + 1.0));
        update_in_place(&mut ys, 1024, |y| y - 1.0).unwrap();
        assert!(xs.iter().zip(&ys).all(|(x, y)| *y == x * 2.0));
        assert!(map_into(&xs[1..], &mut ys, 1024, |x| x).is_err());
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
