//! Dense linear algebra on batches of matrices: MXNet's `_linalg_*` operators (`mx.nd.linalg`).
//!
//! Matrices are the trailing two axes of a tensor and every leading axis is a batch axis (gemm
//! and gemm2 may take their row axis elsewhere). The products (gemm, gemm2, trmm, syrk) run on
//! the GEMM kernels of `linalg.rs` in the input's dtype; the factorizations and solves
//! (Cholesky, triangular solves, LQ, symmetric eigendecomposition, LU for the inverse and the
//! determinants) compute in float64 for float32 inputs too, with one matrix per task over the
//! batch. As in MXNet, only float32 and float64 are supported. Gradients are graphs of these
//! same operators, so they serve autograd, symbols and higher-order gradients alike.

use crate::op::KernelArgs;
use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Mutex;

use super::grad::{Grad, InputGrads};
use super::linalg::{batch_item, matmul_checked, Mat};
use super::params::NoParams;
use super::{exactly, parallel_chunks, parallel_units, same_dtype, ExecContext, OpDef, Operator, SendPtr};
use crate::base::{DType, Elem, Shape};
use crate::error::{Error, Result};
use crate::graph::Entry;

crate::op_params! {
    pub struct GemmParams {
        /// Multiply with the transpose of the first input (A).
        transpose_a: bool = false,
        /// Multiply with the transpose of the second input (B).
        transpose_b: bool = false,
        /// Scalar factor of the product A*B.
        alpha: f64 = 1.0,
        /// Scalar factor of C.
        beta: f64 = 1.0,
        /// Axis of the matrix rows (the columns are the last axis).
        axis: i64 = -2,
    }
}

crate::op_params! {
    pub struct Gemm2Params {
        /// Multiply with the transpose of the first input (A).
        transpose_a: bool = false,
        /// Multiply with the transpose of the second input (B).
        transpose_b: bool = false,
        /// Scalar factor of the product A*B.
        alpha: f64 = 1.0,
        /// Axis of the matrix rows (the columns are the last axis).
        axis: i64 = -2,
    }
}

crate::op_params! {
    pub struct CholeskyParams {
        /// True if the triangular matrix is lower triangular, false if it is upper triangular.
        lower: bool = true,
    }
}

crate::op_params! {
    pub struct TriangularParams {
        /// Use the transpose of the triangular matrix.
        transpose: bool = false,
        /// Multiply (or solve) with the triangular matrix on the right of the other one.
        rightside: bool = false,
        /// True if the triangular matrix is lower triangular, false if it is upper triangular.
        lower: bool = true,
        /// Scalar factor applied to the result.
        alpha: f64 = 1.0,
    }
}

crate::op_params! {
    pub struct SyrkParams {
        /// Use the transpose of the input matrix (A^T A instead of A A^T).
        transpose: bool = false,
        /// Scalar factor applied to the result.
        alpha: f64 = 1.0,
    }
}

crate::op_params! {
    pub struct DiagParams {
        /// Offset of the diagonal from the main one: negative below it, positive above it.
        offset: i64 = 0,
    }
}

crate::op_params! {
    pub struct TrianParams {
        /// Offset of the diagonal from the main one: negative below it, positive above it.
        offset: i64 = 0,
        /// The lower triangle if true, else the upper one (only relevant when offset=0).
        lower: bool = true,
    }
}

// ---------------------------------------------------------------------------------------------
// Shapes, dtypes and batch execution shared by every operator.

/// (batch, rows, cols) of a shape of rank >= 2.
fn split_matrix(op: &str, what: &str, s: &Shape) -> Result<(usize, usize, usize)> {
    let &[ref batch @ .., rows, cols] = s.dims() else {
        crate::bail!(Shape, "{op}: {what} must have at least 2 dimensions (a batch of matrices), got shape {s}");
    };
    Ok((batch.iter().product(), rows, cols))
}

/// (batch, n) of a batch of square n x n matrices.
fn split_square(op: &str, what: &str, s: &Shape) -> Result<(usize, usize)> {
    let (batch, rows, cols) = split_matrix(op, what, s)?;
    if rows != cols {
        crate::bail!(Shape, "{op}: {what} must be a batch of square matrices, got shape {s}");
    }
    Ok((batch, rows))
}

/// The batch (leading) dimensions of a batch of matrices: all but the last two.
fn batch_dims(d: &[usize]) -> &[usize] {
    match d {
        [lead @ .., _, _] => lead,
        _ => &[],
    }
}

/// The shape of one scalar per matrix: the batch dimensions, or (1,) for a single matrix.
fn per_matrix_shape(s: &Shape) -> Shape {
    match batch_dims(s.dims()) {
        [] => Shape::new(vec![1]),
        lead => Shape::new(lead.to_vec()),
    }
}

/// One dtype for all inputs and outputs, float32 or float64 as MXNet's linalg operators demand.
fn real_dtype(op: &str, inputs: &[DType], outputs: usize) -> Result<Vec<DType>> {
    let types = same_dtype(inputs, outputs).map_err(|e| e.context(op))?;
    if let Some(other) = inputs.first().filter(|d| !matches!(d, DType::F32 | DType::F64)) {
        crate::bail!(Type, "{op}: supports float32 and float64 only, got {other}");
    }
    Ok(types)
}

/// Run `item` for every batch index, in parallel. When several items fail, the lowest index's
/// error is reported, so that the message does not depend on thread timing.
fn for_each_item(batch: usize, item: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    let first_error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    parallel_chunks(batch, 1, |range| {
        for i in range {
            if let Err(e) = item(i) {
                let mut slot = first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                    *slot = Some((i, e));
                }
                return;
            }
        }
    });
    match first_error.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// Float32 or float64, the dtypes of MXNet's linalg operators.
fn check_real(dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 => Ok(()),
        other => crate::bail!(Type, "linear algebra operators support float32 and float64 only, got {other}"),
    }
}

/// Input `i`'s values in float64, the precision the factorizations compute in.
fn input_f64(args: &KernelArgs, i: usize) -> Result<Vec<f64>> {
    check_real(args.input_dtype(i)?)?;
    args.input_f64(i)
}

/// Store float64 results into output `o`, rounding to its dtype.
fn output_from_f64(args: &KernelArgs, o: usize, values: &[f64]) -> Result<()> {
    check_real(args.output_dtype(o)?)?;
    args.output_from_f64(o, values)
}

/// A buffer cut into equal per-item chunks that parallel items fill, each its own.
struct ItemChunks<'a, T> {
    base: SendPtr<T>,
    /// Elements per item, and in the whole buffer.
    len: usize,
    total: usize,
    _buffer: PhantomData<&'a mut [T]>,
}

impl<'a, T> ItemChunks<'a, T> {
    fn new(buffer: &'a mut [T], len: usize) -> Self {
        ItemChunks { base: SendPtr(buffer.as_mut_ptr()), len, total: buffer.len(), _buffer: PhantomData }
    }
    /// Item `i`'s chunk; an error when the buffer does not hold it.
    ///
    /// # Safety
    /// Each index may be taken by one task only, once.
    #[allow(clippy::mut_from_ref)]
    unsafe fn item(&self, i: usize) -> Result<&'a mut [T]> {
        let end = (i + 1).checked_mul(self.len).filter(|&end| end <= self.total);
        let end =
            end.ok_or_else(|| crate::err!(Runtime, "linear algebra: item {i} of {} elements is outside a buffer of {}", self.len, self.total))?;
        // SAFETY: elements end - len..end lie inside the buffer (checked above), which this value
        // borrows mutably for 'a; the caller takes each index once, and the chunks of distinct
        // indexes are disjoint, so the chunk is lent once.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.get().add(end - self.len), self.len) })
    }
}

fn identity(n: usize) -> Vec<f64> {
    let mut m = vec![0.0; n * n];
    m.iter_mut().step_by(n + 1).for_each(|v| *v = 1.0);
    m
}

fn transposed(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; rows * cols];
    if rows == 0 || cols == 0 {
        return t;
    }
    // Row c of the transpose is column c of x.
    for (c, line) in t.chunks_exact_mut(rows).enumerate() {
        line.iter_mut().zip(x.iter().skip(c).step_by(cols)).for_each(|(t, x)| *t = *x);
    }
    t
}

/// `dst = alpha * dst (+ beta * addend)`; with beta = 0 the addend is not read (BLAS's rule, so
/// that NaN in an unused C does not leak into the result).
fn scale_add<T: Elem>(dst: &mut [T], alpha: f64, addend: Option<(f64, &[T])>) {
    match addend {
        Some((beta, c)) if beta != 0.0 => {
            for (d, c) in dst.iter_mut().zip(c) {
                *d = T::from_f64(alpha * d.to_f64() + beta * c.to_f64());
            }
        }
        _ if alpha != 1.0 => {
            for d in dst.iter_mut() {
                *d = T::from_f64(alpha * d.to_f64());
            }
        }
        _ => {}
    }
}

/// Threads each item's GEMM may use: many small products run one per thread, a few large ones
/// share the threads inside the GEMM. Returns (threads per item, minimum items per task).
fn product_threads(batch: usize) -> (usize, usize) {
    let threads = crate::engine::parallel::threads();
    if batch >= threads {
        (1, 1)
    } else {
        (threads, batch.max(1))
    }
}

// ---------------------------------------------------------------------------------------------
// Float64 kernels on one row-major matrix. Each takes its matrices at the sizes it is told (the
// callers cut them so); the rows are walked as slices, checked once per row.

/// Solve `op(A) X = B` in place of B (n x m); op(A) is A or A^T, and only A's `lower` (else
/// upper) triangle is read.
fn solve_triangular_left(a: &[f64], n: usize, lower: bool, transpose: bool, b: &mut [f64], m: usize) {
    if n == 0 || m == 0 {
        return;
    }
    // Row i of op(A), gathered once per row (a column of A when transposed).
    let mut line = vec![0.0; n];
    // op(A) is lower triangular when exactly one of `lower` and `transpose` holds: then rows
    // are solved first to last, else last to first.
    let forward = lower != transpose;
    for step in 0..n {
        let i = if forward { step } else { n - 1 - step };
        if transpose {
            line.iter_mut().zip(a.iter().skip(i).step_by(n)).for_each(|(l, v)| *l = *v);
        } else if let Some(row) = a.get(i * n..(i + 1) * n) {
            line.copy_from_slice(row);
        }
        let Some((before, rest)) = b.split_at_mut_checked(i * m) else { return };
        let Some((row_i, after)) = rest.split_at_mut_checked(m) else { return };
        // The rows solved already, with their factors: 0..i going forward, i+1..n backward.
        let (solved, factors) = if forward { (&*before, line.get(..i)) } else { (&*after, line.get(i + 1..)) };
        for (row_j, &factor) in solved.chunks_exact(m).zip(factors.unwrap_or_default()) {
            if factor != 0.0 {
                row_i.iter_mut().zip(row_j).for_each(|(x, y)| *x -= factor * y);
            }
        }
        let pivot = line.get(i).copied().unwrap_or(f64::NAN);
        row_i.iter_mut().for_each(|x| *x /= pivot);
    }
}

/// Solve `op(A) X = B` (left) or `X op(A) = B` (right) in place of B, which is rows x cols.
fn solve_triangular(a: &[f64], n: usize, p: &TriangularParams, b: &mut [f64], rows: usize, cols: usize) {
    if !p.rightside {
        solve_triangular_left(a, n, p.lower, p.transpose, b, cols);
        return;
    }
    // X op(A) = B is op(A)^T X^T = B^T.
    let mut bt = transposed(b, rows, cols);
    solve_triangular_left(a, n, p.lower, !p.transpose, &mut bt, rows);
    b.iter_mut().zip(transposed(&bt, cols, rows)).for_each(|(x, v)| *x = v);
}

/// Cholesky factor of the symmetric matrix held in A's `lower` (else upper) triangle: lower L
/// with A = L L^T, or upper U with A = U^T U; the other triangle of `out` is zero.
/// Err(k) when the leading minor of order k is not positive (A is not positive definite).
fn cholesky(a: &[f64], n: usize, lower: bool, out: &mut [f64]) -> std::result::Result<(), usize> {
    if n == 0 {
        return Ok(());
    }
    // Element (i, j), i >= j, of the symmetric matrix, from the triangle that holds it.
    let sym = |i: usize, j: usize| if lower { a.get(i * n + j) } else { a.get(j * n + i) }.copied().unwrap_or(f64::NAN);
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        // Row j (solved up to column j) and the rows below it, which column j is solved for.
        let Some((head, below)) = l.split_at_mut_checked((j + 1) * n) else { return Err(j + 1) };
        let Some((row_j, diagonal_slot)) = head.get_mut(j * n..).and_then(|row| row.split_at_mut_checked(j)) else { return Err(j + 1) };
        let pivot = sym(j, j) - row_j.iter().map(|v| v * v).sum::<f64>();
        if pivot.is_nan() || pivot <= 0.0 {
            return Err(j + 1);
        }
        let diagonal = pivot.sqrt();
        if let Some(slot) = diagonal_slot.first_mut() {
            *slot = diagonal;
        }
        let row_j = &*row_j;
        for (i, row_i) in (j + 1..).zip(below.chunks_exact_mut(n)) {
            let Some((solved, rest)) = row_i.split_at_mut_checked(j) else { break };
            let dot: f64 = solved.iter().zip(row_j).map(|(x, y)| x * y).sum();
            if let Some(slot) = rest.first_mut() {
                *slot = (sym(i, j) - dot) / diagonal;
            }
        }
    }
    if lower {
        out.iter_mut().zip(&l).for_each(|(o, v)| *o = *v);
    } else {
        // U = L^T: row i of out is column i of L.
        for (i, line) in out.chunks_exact_mut(n).enumerate() {
            line.iter_mut().zip(l.iter().skip(i).step_by(n)).for_each(|(o, v)| *o = *v);
        }
    }
    Ok(())
}

/// The inverse of A from its Cholesky factor F: (F F^T)^-1 for a lower F, (F^T F)^-1 for an
/// upper one. Err(k) when F has a zero at diagonal position k.
fn cholesky_inverse(f: &[f64], n: usize, lower: bool, out: &mut [f64]) -> std::result::Result<(), usize> {
    if let Some(k) = f.iter().step_by(n + 1).take(n).position(|&v| v == 0.0) {
        return Err(k);
    }
    // W = F^-1 is triangular like F; the inverse is W^T W (lower) or W W^T (upper).
    let mut w = identity(n);
    solve_triangular_left(f, n, lower, false, &mut w, n);
    for i in 0..n {
        for j in 0..=i {
            // Both products only have terms k >= max(i, j) = i: columns i and j of W from row i
            // down (lower), or rows i and j of W from column i on (upper).
            let v: f64 = if lower {
                let column = |c: usize| w.iter().skip(i * n + c).step_by(n);
                column(i).zip(column(j)).map(|(x, y)| x * y).sum()
            } else {
                let row = |r: usize| w.get(r * n + i..(r + 1) * n).unwrap_or_default();
                row(i).iter().zip(row(j)).map(|(x, y)| x * y).sum()
            };
            for at in [i * n + j, j * n + i] {
                if let Some(slot) = out.get_mut(at) {
                    *slot = v;
                }
            }
        }
    }
    Ok(())
}

/// LQ factorization A = L Q of an m x n matrix (m <= n) by Householder reflections applied from
/// the right, with LAPACK's sign convention (gelqf + orglq), so that L and Q match MXNet's.
fn lq(a: &[f64], m: usize, n: usize, q: &mut [f64], l: &mut [f64]) {
    if m == 0 || n == 0 {
        return;
    }
    let mut r = a.to_vec();
    // Reflector i is H_i = I - tau v v^T, v over columns i..n with v[0] = 1.
    let mut reflectors: Vec<(Vec<f64>, f64)> = Vec::with_capacity(m);
    for i in 0..m {
        // Row i from its diagonal on: alpha, then the tail the reflector zeroes.
        let Some((&alpha, tail)) = r.get(i * n + i..(i + 1) * n).and_then(|row| row.split_first()) else { return };
        let tail_norm = tail.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut v = Vec::with_capacity(n - i);
        v.push(1.0);
        let (tau, beta) = if tail_norm == 0.0 {
            v.resize(n - i, 0.0);
            (0.0, alpha)
        } else {
            let norm = alpha.hypot(tail_norm);
            let beta = if alpha >= 0.0 { -norm } else { norm };
            v.extend(tail.iter().map(|x| x / (alpha - beta)));
            ((beta - alpha) / beta, beta)
        };
        if tau != 0.0 {
            for row in r.chunks_exact_mut(n).take(m).skip(i + 1) {
                if let Some(x) = row.get_mut(i..) {
                    reflect(x, &v, tau);
                }
            }
        }
        if let Some(slot) = r.get_mut(i * n + i) {
            *slot = beta;
        }
        reflectors.push((v, tau));
    }
    for (i, (l_row, r_row)) in l.chunks_exact_mut(m).zip(r.chunks_exact(n)).enumerate() {
        for (j, (x, y)) in l_row.iter_mut().zip(r_row).enumerate() {
            *x = if j <= i { *y } else { 0.0 };
        }
    }
    // A H_0 ... H_{m-1} = [L 0], so Q = [I 0] H_{m-1} ... H_0: apply the last reflector first.
    q.fill(0.0);
    for (i, row) in q.chunks_exact_mut(n).take(m).enumerate() {
        if let Some(x) = row.get_mut(i) {
            *x = 1.0;
        }
    }
    for (i, (v, tau)) in reflectors.iter().enumerate().rev() {
        if *tau != 0.0 {
            for row in q.chunks_exact_mut(n).take(m) {
                if let Some(x) = row.get_mut(i..) {
                    reflect(x, v, *tau);
                }
            }
        }
    }
}

/// `x = x (I - tau v v^T)` for one row x.
fn reflect(x: &mut [f64], v: &[f64], tau: f64) {
    let scale = tau * x.iter().zip(v).map(|(a, b)| a * b).sum::<f64>();
    for (xk, vk) in x.iter_mut().zip(v) {
        *xk -= scale * vk;
    }
}

/// Sweeps after which cyclic Jacobi gives up (it converges quadratically, in well under 20).
const JACOBI_MAX_SWEEPS: usize = 100;

/// `(x[p], x[q]) = (c x[p] - sn x[q], sn x[p] + c x[q])` for p < q: one row's two entries of a
/// Jacobi rotation.
#[inline]
fn rotate(x: &mut [f64], p: usize, q: usize, c: f64, sn: f64) {
    if let Some((head, tail)) = x.split_at_mut_checked(q) {
        if let (Some(xp), Some(xq)) = (head.get_mut(p), tail.first_mut()) {
            let (a, b) = (*xp, *xq);
            *xp = c * a - sn * b;
            *xq = sn * a + c * b;
        }
    }
}

/// Rows p < q of the n-column matrix s.
fn rows_pair(s: &mut [f64], n: usize, p: usize, q: usize) -> Option<(&mut [f64], &mut [f64])> {
    let (head, tail) = s.split_at_mut_checked(q * n)?;
    Some((head.get_mut(p * n..(p + 1) * n)?, tail.get_mut(..n)?))
}

/// Eigendecomposition of the symmetric matrix held in A's lower triangle by cyclic Jacobi
/// rotations (accurate to the last bits, also for small eigenvalues): the rows of `u` are the
/// eigenvectors of the eigenvalues `w` in ascending order, and each row's largest-magnitude
/// entry (the first one on ties) is positive, MXNet's rule for a deterministic sign.
fn symmetric_eigen(a: &[f64], n: usize, u: &mut [f64], w: &mut [f64]) {
    if n == 0 {
        return;
    }
    // The whole symmetric matrix, from A's lower triangle.
    let mut s = vec![0.0; n * n];
    for (i, row) in s.chunks_exact_mut(n).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            let (r, c) = if j <= i { (i, j) } else { (j, i) };
            *x = a.get(r * n + c).copied().unwrap_or(0.0);
        }
    }
    let at = |s: &[f64], i: usize, j: usize| s.get(i * n + j).copied().unwrap_or(0.0);
    let zero_pair = |s: &mut [f64], p: usize, q: usize| {
        for at in [p * n + q, q * n + p] {
            if let Some(x) = s.get_mut(at) {
                *x = 0.0;
            }
        }
    };
    let mut v = identity(n);
    for sweep in 0..JACOBI_MAX_SWEEPS {
        if s.chunks_exact(n).enumerate().all(|(i, row)| row.iter().take(i).all(|&x| x == 0.0)) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = at(&s, p, q);
                if apq == 0.0 {
                    continue;
                }
                let (app, aqq) = (at(&s, p, p), at(&s, q, q));
                // After a few sweeps an element below the diagonal's rounding is set to zero
                // instead of rotated: this is what lets the sweeps end.
                let negligible = 100.0 * apq.abs();
                if sweep > 3 && app.abs() + negligible == app.abs() && aqq.abs() + negligible == aqq.abs() {
                    zero_pair(&mut s, p, q);
                    continue;
                }
                // The rotation's tangent t is the smaller root of t^2 + 2 theta t - 1 = 0.
                let theta = (aqq - app) / (2.0 * apq);
                let t = if theta.abs() > 1e150 { 0.5 / theta } else { theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt()) };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let sn = t * c;
                // Columns p and q, then rows p and q.
                s.chunks_exact_mut(n).for_each(|row| rotate(row, p, q, c, sn));
                if let Some((row_p, row_q)) = rows_pair(&mut s, n, p, q) {
                    for (x, y) in row_p.iter_mut().zip(row_q) {
                        let (spk, sqk) = (*x, *y);
                        *x = c * spk - sn * sqk;
                        *y = sn * spk + c * sqk;
                    }
                }
                zero_pair(&mut s, p, q);
                v.chunks_exact_mut(n).for_each(|row| rotate(row, p, q, c, sn));
            }
        }
    }
    // (column, eigenvalue) in ascending order of the eigenvalues (a stable sort, as before).
    let mut order: Vec<(usize, f64)> = s.iter().step_by(n + 1).copied().enumerate().collect();
    order.sort_by(|x, y| x.1.total_cmp(&y.1));
    for ((value, eigenvector), &(col, eigenvalue)) in w.iter_mut().zip(u.chunks_exact_mut(n)).zip(&order) {
        *value = eigenvalue;
        eigenvector.iter_mut().zip(v.iter().skip(col).step_by(n)).for_each(|(e, x)| *e = *x);
        let mut largest = (0, eigenvector.first().map_or(0.0, |x| x.abs()));
        for (k, x) in eigenvector.iter().enumerate().skip(1) {
            if x.abs() > largest.1 {
                largest = (k, x.abs());
            }
        }
        if eigenvector.get(largest.0).is_some_and(|&x| x < 0.0) {
            eigenvector.iter_mut().for_each(|x| *x = -*x);
        }
    }
}

/// LU factorization with partial pivoting, in place: P A = L U with a unit lower L stored below
/// the diagonal and U on and above it. Returns the row order (row i of P A is row `perm[i]` of
/// A) and the number of row exchanges. A column without a nonzero pivot is skipped, leaving a
/// zero on U's diagonal (A is singular), as LAPACK's getrf does.
fn lu_in_place(a: &mut [f64], n: usize) -> (Vec<usize>, usize) {
    let mut perm: Vec<usize> = (0..n).collect();
    let mut swaps = 0;
    for k in 0..n {
        // The pivot row: the largest magnitude in column k from row k down (the first on ties).
        let mut column = (k..).zip(a.iter().skip(k * n + k).step_by(n));
        let Some((_, &first)) = column.next() else { break };
        let (mut p, mut largest, mut value) = (k, first.abs(), first);
        for (i, &x) in column {
            if x.abs() > largest {
                (p, largest, value) = (i, x.abs(), x);
            }
        }
        if value == 0.0 {
            continue;
        }
        if p != k {
            if let Some((head, tail)) = a.split_at_mut_checked(p * n) {
                if let (Some(row_k), Some(row_p)) = (head.get_mut(k * n..(k + 1) * n), tail.get_mut(..n)) {
                    row_k.swap_with_slice(row_p);
                }
            }
            perm.swap(p, k);
            swaps += 1;
        }
        // Eliminate column k below the pivot: row i -= (a[i][k] / pivot) row k, from column k + 1.
        let Some((head, below)) = a.split_at_mut_checked((k + 1) * n) else { break };
        let Some((&pivot, pivot_tail)) = head.get(k * n + k..).and_then(|row| row.split_first()) else { break };
        for row_i in below.chunks_exact_mut(n) {
            let Some((left, right)) = row_i.split_at_mut_checked(k + 1) else { break };
            let Some(entry) = left.last_mut() else { break };
            let factor = *entry / pivot;
            *entry = factor;
            if factor != 0.0 {
                right.iter_mut().zip(pivot_tail).for_each(|(x, y)| *x -= factor * y);
            }
        }
    }
    (perm, swaps)
}

/// A^-1 from A's LU factors (see [`lu_in_place`]); Err(k) when U has a zero at position k.
fn inverse_from_lu(lu: &[f64], perm: &[usize], n: usize, out: &mut [f64]) -> std::result::Result<(), usize> {
    if let Some(k) = lu.iter().step_by(n + 1).take(n).position(|&v| v == 0.0) {
        return Err(k);
    }
    if n == 0 {
        return Ok(());
    }
    // Solve L U X = P: row i of P has its one in column perm[i].
    out.fill(0.0);
    for (row, &p) in out.chunks_exact_mut(n).zip(perm) {
        if let Some(x) = row.get_mut(p) {
            *x = 1.0;
        }
    }
    for i in 0..n {
        let Some((before, rest)) = out.split_at_mut_checked(i * n) else { break };
        let Some(row_i) = rest.get_mut(..n) else { break };
        let factors = lu.get(i * n..i * n + i).unwrap_or_default();
        for (row_j, &factor) in before.chunks_exact(n).zip(factors) {
            if factor != 0.0 {
                row_i.iter_mut().zip(row_j).for_each(|(x, y)| *x -= factor * y);
            }
        }
    }
    solve_triangular_left(lu, n, false, false, out, n);
    Ok(())
}

/// (sign, log |det|, det) from A's LU factors: sign 0, log -inf and det 0 for a singular A.
fn determinant_from_lu(lu: &[f64], swaps: usize, n: usize) -> (f64, f64, f64) {
    let mut sign = if swaps % 2 == 1 { -1.0 } else { 1.0 };
    let (mut log_abs, mut product) = (0.0, sign);
    for &d in lu.iter().step_by(n + 1).take(n) {
        sign *= if d > 0.0 {
            1.0
        } else if d < 0.0 {
            -1.0
        } else {
            0.0
        };
        log_abs += d.abs().ln();
        product *= d;
    }
    if sign == 0.0 {
        // A singular matrix: +0 for both, not the -0 an odd number of row exchanges leaves.
        return (0.0, log_abs, 0.0);
    }
    (sign, log_abs, product)
}

// ---------------------------------------------------------------------------------------------
// gemm and gemm2.

/// `_linalg_gemm` (`beta` set: alpha op(A) op(B) + beta C) and `_linalg_gemm2` (alpha op(A) op(B)).
struct Gemm {
    name: &'static str,
    transpose_a: bool,
    transpose_b: bool,
    alpha: f64,
    beta: Option<f64>,
    axis: i64,
}

/// Where the matrices of a gemm lie: each tensor is viewed as (outer, rows, inner, cols), with
/// rows the `axis` and cols the last axis, and holds outer * inner matrices.
struct GemmLayout {
    outer: usize,
    inner: usize,
    /// Stored (rows, cols) of A, B and the output.
    a: (usize, usize),
    b: (usize, usize),
    out: (usize, usize),
    /// The length of the products' sums.
    k: usize,
    out_shape: Shape,
}

impl Gemm {
    fn layout(&self, a: &Shape, b: &Shape) -> Result<GemmLayout> {
        let name = self.name;
        if a.ndim() < 2 || a.ndim() != b.ndim() {
            crate::bail!(Shape, "{name}: A and B must have the same number of dimensions, at least 2, got {a} and {b}");
        }
        let ndim = a.ndim();
        let axis = if self.axis < 0 { self.axis + ndim as i64 } else { self.axis };
        if axis < 0 || axis >= ndim as i64 - 1 {
            crate::bail!(Shape, "{name}: invalid row axis {} for {ndim}-dimensional inputs: it must come before the last axis", self.axis);
        }
        let (axis, last) = (axis as usize, ndim - 1);
        let (ad, bd) = (a.dims(), b.dims());
        if ad.iter().zip(bd).take(last).enumerate().any(|(i, (x, y))| i != axis && x != y) {
            crate::bail!(Shape, "{name}: A {a} and B {b} must have the same shape except on the row axis ({axis}) and the last axis");
        }
        // Both axes exist: axis < last < ndim, checked above.
        let dim = |d: &[usize], i: usize| d.get(i).copied().unwrap_or(0);
        let (stored_a, stored_b) = ((dim(ad, axis), dim(ad, last)), (dim(bd, axis), dim(bd, last)));
        let op_a = if self.transpose_a { (stored_a.1, stored_a.0) } else { stored_a };
        let op_b = if self.transpose_b { (stored_b.1, stored_b.0) } else { stored_b };
        if op_a.1 != op_b.0 {
            crate::bail!(
                Shape,
                "{name}: incompatible matrix dimensions: A {a} (transpose_a={}) and B {b} (transpose_b={}): {} != {}",
                flag(self.transpose_a),
                flag(self.transpose_b),
                op_a.1,
                op_b.0
            );
        }
        let mut out = ad.to_vec();
        if let Some(rows) = out.get_mut(axis) {
            *rows = op_a.0;
        }
        if let Some(cols) = out.last_mut() {
            *cols = op_b.1;
        }
        Ok(GemmLayout {
            outer: ad.get(..axis).map_or(1, |d| d.iter().product()),
            inner: ad.get(axis + 1..last).map_or(1, |d| d.iter().product()),
            a: stored_a,
            b: stored_b,
            out: (op_a.0, op_b.1),
            k: op_a.1,
            out_shape: Shape::new(out),
        })
    }

    fn run<T: Elem>(&self, l: &GemmLayout, args: &KernelArgs) -> Result<()> {
        let name = self.name;
        let (outer, inner) = (l.outer, l.inner);
        let (m, n) = l.out;
        if m == 0 || n == 0 || outer * inner == 0 {
            return Ok(());
        }
        let out = args.output::<T>(0)?;
        let a = rows_axis_as_matrices(name, args.input::<T>(0)?, outer, l.a.0, inner, l.a.1)?;
        let b = rows_axis_as_matrices(name, args.input::<T>(1)?, outer, l.b.0, inner, l.b.1)?;
        let c = if args.inputs().len() > 2 { Some(rows_axis_as_matrices(name, args.input::<T>(2)?, outer, m, inner, n)?) } else { None };
        // With the rows on another axis the products land in scratch and are scattered after.
        let mut products = (inner > 1).then(|| vec![T::default(); out.len()]);
        let dst: &mut [T] = match &mut products {
            Some(p) => p,
            None => &mut *out,
        };
        let (a_step, b_step, o_step) = (l.a.0 * l.a.1, l.b.0 * l.b.1, m * n);
        let (am, bm) = (Mat::stored(l.a.0, l.a.1, self.transpose_a), Mat::stored(l.b.0, l.b.1, self.transpose_b));
        let (threads, min_items) = product_threads(outer * inner);
        let beta = self.beta.unwrap_or(0.0);
        // Pieces of whole output matrices (o_step > 0), split as `parallel_chunks` splits the batch.
        parallel_units(dst, o_step, min_items, |first, items| {
            for (i, item) in (first..).zip(items.chunks_exact_mut(o_step)) {
                if l.k == 0 {
                    item.fill(T::default());
                } else {
                    let (a, b) = (batch_item(name, "A", &a, i, a_step)?, batch_item(name, "B", &b, i, b_step)?);
                    matmul_checked(name, item, false, a, am, b, bm, threads)?;
                }
                let c_item = c.as_deref().map(|c| batch_item(name, "C", c, i, o_step)).transpose()?;
                scale_add(item, self.alpha, c_item.map(|c| (beta, c)));
            }
            Ok(())
        })?;
        if let Some(p) = &products {
            matrices_as_rows_axis(name, p, outer, m, inner, n, out)?;
        }
        Ok(())
    }
}

/// `x` viewed as (outer, rows, inner, cols), reordered to a batch (outer, inner) of contiguous
/// rows x cols matrices; borrowed when it is one already (inner == 1).
fn rows_axis_as_matrices<'a, T: Elem>(op: &str, x: &'a [T], outer: usize, rows: usize, inner: usize, cols: usize) -> Result<Cow<'a, [T]>> {
    if inner == 1 {
        return Ok(Cow::Borrowed(x));
    }
    let mut out = Vec::with_capacity(x.len());
    for o in 0..outer {
        for i in 0..inner {
            for r in 0..rows {
                let start = ((o * rows + r) * inner + i) * cols;
                let line = x
                    .get(start..start + cols)
                    .ok_or_else(|| crate::err!(Runtime, "{op}: {} elements do not hold ({outer}, {rows}, {inner}, {cols})", x.len()))?;
                out.extend_from_slice(line);
            }
        }
    }
    Ok(Cow::Owned(out))
}

/// The inverse of [`rows_axis_as_matrices`]: write a batch of matrices into `x`.
fn matrices_as_rows_axis<T: Elem>(op: &str, matrices: &[T], outer: usize, rows: usize, inner: usize, cols: usize, x: &mut [T]) -> Result<()> {
    if cols == 0 {
        return Ok(());
    }
    let mut lines = matrices.chunks_exact(cols);
    for o in 0..outer {
        for i in 0..inner {
            for r in 0..rows {
                let start = ((o * rows + r) * inner + i) * cols;
                let (Some(to), Some(from)) = (x.get_mut(start..start + cols), lines.next()) else {
                    crate::bail!(Runtime, "{op}: {} and {} elements do not hold ({outer}, {rows}, {inner}, {cols})", matrices.len(), x.len());
                };
                to.copy_from_slice(from);
            }
        }
    }
    Ok(())
}

impl Operator for Gemm {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["A".to_string(), "B".to_string()];
        if self.beta.is_some() {
            names.push("C".to_string());
        }
        names
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b, c @ ..] = inputs else {
            crate::bail!(Value, "{}: inputs A and B expected, got {} input(s)", self.name, inputs.len());
        };
        let l = self.layout(a, b)?;
        if let Some(c) = c.first() {
            if *c != l.out_shape {
                crate::bail!(Shape, "{}: C has shape {c}, expected {} for A {a} and B {b}", self.name, l.out_shape);
            }
        }
        Ok(vec![l.out_shape])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(self.name, inputs, 1)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = self.layout(args.input_shape(0)?, args.input_shape(1)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, [F32, F64], T => self.run::<T>(&l, args), other => check_real(other))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, b, g) = (d.input(0), d.input(1), d.out_grad(0));
        let (ta, tb, alpha, axis) = (self.transpose_a, self.transpose_b, self.alpha, self.axis);
        let da = if ta { gemm2(d, &b, &g, tb, true, alpha, axis)? } else { gemm2(d, &g, &b, false, !tb, alpha, axis)? };
        let db = if tb { gemm2(d, &g, &a, true, ta, alpha, axis)? } else { gemm2(d, &a, &g, !ta, false, alpha, axis)? };
        let mut grads = vec![Some(da), Some(db)];
        if let Some(beta) = self.beta {
            grads.push(Some(d.scalar("_mul_scalar", &g, beta)?));
        }
        Ok(grads)
    }
}

// ---------------------------------------------------------------------------------------------
// trmm and trsm: products with and solves for a triangular matrix.

struct Triangular {
    name: &'static str,
    /// trsm (solve op(A) X = alpha B) rather than trmm (alpha op(A) B).
    solve: bool,
    p: TriangularParams,
}

impl Triangular {
    /// (batch, n, rows, cols): A is n x n, B (and the output) rows x cols.
    fn dims(&self, a: &Shape, b: &Shape) -> Result<(usize, usize, usize, usize)> {
        let (batch, n) = split_square(self.name, "A", a)?;
        let (_, rows, cols) = split_matrix(self.name, "B", b)?;
        if a.ndim() != b.ndim() || batch_dims(a.dims()) != batch_dims(b.dims()) {
            crate::bail!(Shape, "{}: A {a} and B {b} must have the same leading (batch) dimensions", self.name);
        }
        let shared = if self.p.rightside { cols } else { rows };
        if shared != n {
            crate::bail!(
                Shape,
                "{}: incompatible matrix dimensions: A {a} and B {b} (rightside={}): B's {} must be {n}",
                self.name,
                flag(self.p.rightside),
                if self.p.rightside { "columns" } else { "rows" }
            );
        }
        Ok((batch, n, rows, cols))
    }

    fn multiply<T: Elem>(&self, args: &KernelArgs, (batch, n, rows, cols): (usize, usize, usize, usize)) -> Result<()> {
        let (a, b, out) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
        // An empty output (n == 0 makes B's rows or columns 0) has nothing to compute.
        let o_step = rows * cols;
        if out.is_empty() || o_step == 0 || n == 0 {
            return Ok(());
        }
        let (threads, min_items) = product_threads(batch);
        let (p, name) = (&self.p, self.name);
        // Pieces of whole output matrices, split as `parallel_chunks` splits the batch.
        parallel_units(out, o_step, min_items, |first, items| {
            let mut triangle = vec![T::default(); n * n];
            for (i, item) in (first..).zip(items.chunks_exact_mut(o_step)) {
                let a_item = batch_item(name, "A", a, i, n * n)?;
                for (r, (t_row, a_row)) in triangle.chunks_exact_mut(n).zip(a_item.chunks_exact(n)).enumerate() {
                    for (c, (t, &x)) in t_row.iter_mut().zip(a_row).enumerate() {
                        let kept = if p.lower { c <= r } else { c >= r };
                        *t = if kept { x } else { T::default() };
                    }
                }
                let tri = (triangle.as_slice(), Mat::stored(n, n, p.transpose));
                let plain = (batch_item(name, "B", b, i, o_step)?, Mat::stored(rows, cols, false));
                let ((x, xm), (y, ym)) = if p.rightside { (plain, tri) } else { (tri, plain) };
                matmul_checked(name, item, false, x, xm, y, ym, threads)?;
                scale_add(item, p.alpha, None);
            }
            Ok(())
        })
    }

    fn solve(&self, args: &KernelArgs, (_, n, rows, cols): (usize, usize, usize, usize)) -> Result<()> {
        let a = input_f64(args, 0)?;
        let mut x: Vec<f64> = input_f64(args, 1)?.into_iter().map(|v| v * self.p.alpha).collect();
        let size = rows * cols;
        if size > 0 {
            // One matrix per item, split as `parallel_chunks(batch, 1)` splits the batch.
            parallel_units(&mut x, size, 1, |first, items| {
                for (i, item) in (first..).zip(items.chunks_exact_mut(size)) {
                    solve_triangular(batch_item(self.name, "A", &a, i, n * n)?, n, &self.p, item, rows, cols);
                }
                Ok(())
            })?;
        }
        output_from_f64(args, 0, &x)
    }
}

impl Operator for Triangular {
    fn input_names(&self) -> Vec<String> {
        vec!["A".into(), "B".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b] = exactly(self.name, "input", inputs)?;
        self.dims(a, b)?;
        Ok(vec![b.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(self.name, inputs, 1)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dims = self.dims(args.input_shape(0)?, args.input_shape(1)?)?;
        if self.solve {
            self.solve(args, dims)
        } else {
            crate::dispatch_dtype!(args.output_dtype(0)?, [F32, F64], T => self.multiply::<T>(args, dims), other => check_real(other))
        }
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, b, g) = (d.input(0), d.input(1), d.out_grad(0));
        let p = &self.p;
        // For C = alpha op(A) B (trmm) or op(A) C = alpha B (trsm): dB applies the same
        // triangular operation with op(A) transposed, and dA is a product of dC or dB with B
        // or C, restricted to A's triangle.
        let db = triangular(d, self.name, &a, &g, !p.transpose, p.rightside, p.lower, p.alpha)?;
        let (x, y, scale) = if self.solve { (db.clone(), d.output(0), -1.0 / p.alpha) } else { (g, b, p.alpha) };
        let da = if p.rightside == p.transpose {
            gemm2(d, &x, &y, p.transpose, !p.transpose, scale, -2)?
        } else {
            gemm2(d, &y, &x, !p.transpose, p.transpose, scale, -2)?
        };
        Ok(vec![Some(keep_triangle(d, &da, p.lower)?), Some(db)])
    }
}

// ---------------------------------------------------------------------------------------------
// syrk: alpha A A^T or alpha A^T A.

struct Syrk {
    p: SyrkParams,
}

impl Syrk {
    fn run<T: Elem>(&self, args: &KernelArgs) -> Result<()> {
        let (batch, rows, cols) = split_matrix(SYRK, "A", args.input_shape(0)?)?;
        let n = if self.p.transpose { cols } else { rows };
        let (a, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
        if out.is_empty() || n == 0 {
            return Ok(());
        }
        let (threads, min_items) = product_threads(batch);
        let (t, alpha, a_step) = (self.p.transpose, self.p.alpha, rows * cols);
        // Pieces of whole output matrices, split as `parallel_chunks` splits the batch.
        parallel_units(out, n * n, min_items, |first, items| {
            for (i, item) in (first..).zip(items.chunks_exact_mut(n * n)) {
                if a_step == 0 {
                    item.fill(T::default());
                    continue;
                }
                let a_item = batch_item(SYRK, "A", a, i, a_step)?;
                matmul_checked(SYRK, item, false, a_item, Mat::stored(rows, cols, t), a_item, Mat::stored(rows, cols, !t), threads)?;
                // The GEMM's blocked sums may round the two triangles differently: the result is
                // made exactly symmetric, from its lower triangle as MXNet's (row r right of the
                // diagonal from column r below it).
                for r in 0..n {
                    let Some((head, below)) = item.split_at_mut_checked((r + 1) * n) else { break };
                    let Some(right) = head.get_mut(r * n + r + 1..) else { break };
                    for (x, lower_row) in right.iter_mut().zip(below.chunks_exact(n)) {
                        if let Some(&v) = lower_row.get(r) {
                            *x = v;
                        }
                    }
                }
                scale_add(item, alpha, None);
            }
            Ok(())
        })
    }
}

const SYRK: &str = "_linalg_syrk";

impl Operator for Syrk {
    fn input_names(&self) -> Vec<String> {
        vec!["A".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a] = exactly(SYRK, "input", inputs)?;
        let (_, rows, cols) = split_matrix(SYRK, "A", a)?;
        let n = if self.p.transpose { cols } else { rows };
        let mut dims = a.dims().to_vec();
        if let [.., r, c] = dims.as_mut_slice() {
            (*r, *c) = (n, n);
        }
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(SYRK, inputs, 1)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        crate::dispatch_dtype!(args.output_dtype(0)?, [F32, F64], T => self.run::<T>(args), other => check_real(other))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, g) = (d.input(0), d.out_grad(0));
        let alpha = self.p.alpha;
        // B = alpha A A^T: dA = alpha (dB + dB^T) A; B = alpha A^T A: dA = alpha A (dB + dB^T).
        let (x, y) = if self.p.transpose {
            (gemm2(d, &a, &g, false, false, alpha, -2)?, gemm2(d, &a, &g, false, true, alpha, -2)?)
        } else {
            (gemm2(d, &g, &a, false, false, alpha, -2)?, gemm2(d, &g, &a, true, false, alpha, -2)?)
        };
        Ok(vec![Some(d.binary("elemwise_add", &x, &y)?)])
    }
}

// ---------------------------------------------------------------------------------------------
// Operators of one square-matrix input computed in float64, one matrix per task.

/// Run `kernel(i, matrix_i, outputs_i)` over the batch of input 0's n x n matrices, output k
/// holding `out_sizes[k]` values per matrix, and store the outputs.
fn per_matrix(
    op: &str,
    args: &KernelArgs,
    (batch, n): (usize, usize),
    out_sizes: &[usize],
    kernel: impl Fn(usize, &[f64], &mut [&mut [f64]]) -> Result<()> + Sync,
) -> Result<()> {
    let values = input_f64(args, 0)?;
    let mut results: Vec<Vec<f64>> = out_sizes.iter().map(|&len| vec![0.0; batch * len]).collect();
    let chunks: Vec<ItemChunks<f64>> = results.iter_mut().zip(out_sizes).map(|(r, &len)| ItemChunks::new(r, len)).collect();
    for_each_item(batch, |i| {
        // SAFETY: `for_each_item` runs each index once, so each result's item i is taken once.
        let mut items = chunks.iter().map(|c| unsafe { c.item(i) }).collect::<Result<Vec<&mut [f64]>>>()?;
        kernel(i, batch_item(op, "A", &values, i, n * n)?, &mut items)
    })?;
    for (o, values) in results.iter().enumerate() {
        output_from_f64(args, o, values)?;
    }
    Ok(())
}

/// What an operator of one batch of square matrices computes.
#[derive(Clone, Copy, PartialEq)]
enum SquareKind {
    /// Cholesky factor (`_linalg_potrf`).
    Cholesky { lower: bool },
    /// Inverse from a Cholesky factor (`_linalg_potri`).
    CholeskyInverse { lower: bool },
    /// Sum of the logarithms of the diagonal (`_linalg_sumlogdiag`).
    SumLogDiag,
    /// (U, L): eigenvectors as rows and ascending eigenvalues (`_linalg_syevd`).
    SymmetricEigen,
    /// `_linalg_inverse`.
    Inverse,
    /// `_linalg_det`.
    Det,
    /// (sign, log |det|) (`_linalg_slogdet`).
    SlogDet,
}

struct Square {
    name: &'static str,
    kind: SquareKind,
}

impl Square {
    fn output_shapes(&self, a: &Shape) -> Result<Vec<Shape>> {
        split_square(self.name, "A", a)?;
        let eigenvalues = Shape::new(a.dims().split_last().map_or(&[][..], |(_, lead)| lead).to_vec());
        Ok(match self.kind {
            SquareKind::Cholesky { .. } | SquareKind::CholeskyInverse { .. } | SquareKind::Inverse => vec![a.clone()],
            SquareKind::SumLogDiag | SquareKind::Det => vec![per_matrix_shape(a)],
            SquareKind::SlogDet => vec![per_matrix_shape(a); 2],
            SquareKind::SymmetricEigen => vec![a.clone(), eigenvalues],
        })
    }
}

impl Operator for Square {
    fn input_names(&self) -> Vec<String> {
        vec!["A".into()]
    }
    fn num_outputs(&self) -> usize {
        match self.kind {
            SquareKind::SlogDet | SquareKind::SymmetricEigen => 2,
            _ => 1,
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a] = exactly(self.name, "input", inputs)?;
        self.output_shapes(a)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(self.name, inputs, self.num_outputs())
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dims = split_square(self.name, "A", args.input_shape(0)?)?;
        let n = dims.1;
        let name = self.name;
        // The kernels' outputs, as many as `out_sizes` asks for.
        let outputs_error = |count: usize| crate::err!(Runtime, "{name}: {count} per-matrix output(s) expected");
        match self.kind {
            SquareKind::Cholesky { lower } => per_matrix(name, args, dims, &[n * n], |i, m, out| {
                let [l] = out else { return Err(outputs_error(1)) };
                cholesky(m, n, lower, l).map_err(|order| {
                    crate::err!(
                        Value,
                        "{name}: matrix {i} of the batch is not symmetric positive definite (its leading minor of order {order} is not positive)"
                    )
                })
            }),
            SquareKind::CholeskyInverse { lower } => per_matrix(name, args, dims, &[n * n], |i, m, out| {
                let [inverse] = out else { return Err(outputs_error(1)) };
                cholesky_inverse(m, n, lower, inverse)
                    .map_err(|k| crate::err!(Value, "{name}: matrix {i} of the batch is not a Cholesky factor: its diagonal element {k} is zero"))
            }),
            SquareKind::SumLogDiag => per_matrix(name, args, dims, &[1], |_, m, out| {
                let [[sum]] = out else { return Err(outputs_error(1)) };
                *sum = m.iter().step_by(n + 1).take(n).map(|v| v.ln()).sum();
                Ok(())
            }),
            SquareKind::SymmetricEigen => per_matrix(name, args, dims, &[n * n, n], |_, m, out| {
                let [u, w] = out else { return Err(outputs_error(2)) };
                symmetric_eigen(m, n, u, w);
                Ok(())
            }),
            SquareKind::Inverse => per_matrix(name, args, dims, &[n * n], |i, m, out| {
                let [inverse] = out else { return Err(outputs_error(1)) };
                let mut lu = m.to_vec();
                let (perm, _) = lu_in_place(&mut lu, n);
                inverse_from_lu(&lu, &perm, n, inverse)
                    .map_err(|_| crate::err!(Value, "{name}: matrix {i} of the batch is singular (not invertible)"))
            }),
            SquareKind::Det | SquareKind::SlogDet => {
                let slog = self.kind == SquareKind::SlogDet;
                let sizes: &[usize] = if slog { &[1, 1] } else { &[1] };
                per_matrix(name, args, dims, sizes, |_, m, out| {
                    let mut lu = m.to_vec();
                    let (_, swaps) = lu_in_place(&mut lu, n);
                    let (sign, log_abs, det) = determinant_from_lu(&lu, swaps, n);
                    match out {
                        [[sign_out], [log_out]] if slog => (*sign_out, *log_out) = (sign, log_abs),
                        [[det_out]] if !slog => *det_out = det,
                        _ => return Err(outputs_error(sizes.len())),
                    }
                    Ok(())
                })
            }
        }
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let a = d.input(0);
        let grad = match self.kind {
            SquareKind::Cholesky { lower } => {
                // For A = L L^T: dA = 1/2 L^-T sym(L^T dL) L^-1, sym() mirroring the lower
                // triangle (for an upper factor, everything transposed).
                let (l, g) = (d.output(0), d.out_grad(0));
                let m = triangular(d, "_linalg_trmm", &l, &g, true, !lower, lower, 1.0)?;
                let s = symmetric_from_triangle(d, &m, lower)?;
                let x = triangular(d, "_linalg_trsm", &l, &s, lower, false, lower, 1.0)?;
                triangular(d, "_linalg_trsm", &l, &x, !lower, true, lower, 0.5)?
            }
            SquareKind::CholeskyInverse { lower } => {
                // For X = (L L^T)^-1: dL = -tril(X (dX + dX^T) L^-T) (upper: transposed).
                let (x, g) = (d.output(0), d.out_grad(0));
                let (p, q) = if lower {
                    (gemm2(d, &x, &g, false, false, 1.0, -2)?, gemm2(d, &x, &g, false, true, 1.0, -2)?)
                } else {
                    (gemm2(d, &g, &x, false, false, 1.0, -2)?, gemm2(d, &g, &x, true, false, 1.0, -2)?)
                };
                let sum = d.binary("elemwise_add", &p, &q)?;
                let y = triangular(d, "_linalg_trsm", &a, &sum, true, lower, lower, -1.0)?;
                keep_triangle(d, &y, lower)?
            }
            SquareKind::SumLogDiag => {
                // d/dA sum(log(diag(A))) = diag(1 / diag(A)).
                let g = d.out_grad(0);
                let diagonal = d.op("_linalg_extractdiag", &[], &[&a])?;
                let g = d.op("expand_dims", &[("axis", "-1".to_string())], &[&g])?;
                let scaled = d.binary("broadcast_div", &g, &diagonal)?;
                let full = d.op("_linalg_makediag", &[], &[&scaled])?;
                d.binary("reshape_like", &full, &a)?
            }
            SquareKind::SymmetricEigen => symmetric_eigen_gradient(d)?,
            SquareKind::Inverse => {
                // For X = A^-1: dA = -X^T dX X^T.
                let (x, g) = (d.output(0), d.out_grad(0));
                let right = gemm2(d, &g, &x, false, true, 1.0, -2)?;
                gemm2(d, &x, &right, true, false, -1.0, -2)?
            }
            SquareKind::Det => {
                // Jacobi's formula: d det(A) / dA = det(A) A^-T; zero for a singular A.
                let (det, g) = (d.output(0), d.out_grad(0));
                let singular = d.scalar("_equal_scalar", &det, 0.0)?;
                let scale = d.mul(&g, &det)?;
                scaled_inverse_transpose(d, &a, &singular, &scale)?
            }
            SquareKind::SlogDet => {
                // d log|det(A)| / dA = A^-T; the sign has no gradient, nor has a singular A.
                let (sign, g) = (d.output(0), d.out_grad(1));
                let singular = d.scalar("_equal_scalar", &sign, 0.0)?;
                let invertible = d.scalar("_rminus_scalar", &singular, 1.0)?;
                let scale = d.mul(&g, &invertible)?;
                scaled_inverse_transpose(d, &a, &singular, &scale)?
            }
        };
        Ok(vec![Some(grad)])
    }
}

/// `scale * A^-T` per matrix, where `scale` and `singular` (1 for a singular matrix) hold one
/// value per matrix. A singular matrix is replaced by the identity before inverting (its scale
/// must be zero), so that the gradient graph never fails on one.
fn scaled_inverse_transpose(d: &mut Grad, a: &Entry, singular: &Entry, scale: &Entry) -> Result<Entry> {
    let diagonal = d.op("_linalg_extractdiag", &[], &[a])?;
    let ones = d.unary("ones_like", &diagonal)?;
    let eye = d.op("_linalg_makediag", &[], &[&ones])?;
    let towards_eye = d.binary("elemwise_sub", &eye, a)?;
    let singular = per_matrix_to_broadcast(d, singular)?;
    let shift = d.binary("broadcast_mul", &singular, &towards_eye)?;
    let safe = d.binary("broadcast_add", a, &shift)?;
    let safe = d.binary("reshape_like", &safe, a)?;
    let inverse = d.unary("_linalg_inverse", &safe)?;
    let inverse_t = swap_last_two(d, &inverse)?;
    let scale = per_matrix_to_broadcast(d, scale)?;
    let grad = d.binary("broadcast_mul", &scale, &inverse_t)?;
    d.binary("reshape_like", &grad, a)
}

/// One value per matrix, shaped (..., 1, 1) to broadcast against the matrices (a single
/// matrix's (1,) becomes (1, 1, 1): the caller reshapes the broadcast result like A).
fn per_matrix_to_broadcast(d: &mut Grad, x: &Entry) -> Result<Entry> {
    let axis = [("axis", "-1".to_string())];
    let x = d.op("expand_dims", &axis, &[x])?;
    d.op("expand_dims", &axis, &[&x])
}

/// For (U, L) = syevd(A), U's rows the eigenvectors: dA = U^T (F o sym-part + diag(dL)) U with
/// F_ij = (X_ij - X_ji) / (2 (L_i - L_j)) for X = dU U^T (MXNet's formula; undefined for equal
/// eigenvalues, where it is set to zero instead of dividing by a tiny difference).
fn symmetric_eigen_gradient(d: &mut Grad) -> Result<Entry> {
    let (u, l, du, dl) = (d.output(0), d.output(1), d.out_grad(0), d.out_grad(1));
    let x = gemm2(d, &du, &u, false, true, 1.0, -2)?;
    let x_t = swap_last_two(d, &x)?;
    let antisymmetric = d.binary("elemwise_sub", &x, &x_t)?;
    // (L_i - L_j) / (2 max((L_i - L_j)^2, tiny)) = 1 / (2 (L_i - L_j)), and 0 where L_i = L_j.
    let column = d.op("expand_dims", &[("axis", "-1".to_string())], &[&l])?;
    let row = d.op("expand_dims", &[("axis", "-2".to_string())], &[&l])?;
    let gaps = d.binary("broadcast_sub", &column, &row)?;
    let squared = d.unary("square", &gaps)?;
    // The smallest normal float32 rounded up: representable in both dtypes.
    let squared = d.scalar("_maximum_scalar", &squared, 1.2e-38)?;
    let squared = d.scalar("_mul_scalar", &squared, 2.0)?;
    let factor = d.div(&gaps, &squared)?;
    let off_diagonal = d.mul(&antisymmetric, &factor)?;
    let diagonal = d.op("_linalg_makediag", &[], &[&dl])?;
    let inner = d.binary("elemwise_add", &off_diagonal, &diagonal)?;
    let right = gemm2(d, &inner, &u, false, false, 1.0, -2)?;
    gemm2(d, &u, &right, true, false, 1.0, -2)
}

// ---------------------------------------------------------------------------------------------
// gelqf: A = L Q.

struct Gelqf;

const GELQF: &str = "_linalg_gelqf";

impl Operator for Gelqf {
    fn input_names(&self) -> Vec<String> {
        vec!["A".into()]
    }
    fn num_outputs(&self) -> usize {
        2
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a] = exactly(GELQF, "input", inputs)?;
        let (_, m, n) = split_matrix(GELQF, "A", a)?;
        if m > n {
            crate::bail!(Shape, "{GELQF}: A must have at most as many rows as columns (shape (..., x, y) with x <= y), got {a}");
        }
        let mut l = a.dims().to_vec();
        if let Some(cols) = l.last_mut() {
            *cols = m;
        }
        Ok(vec![a.clone(), Shape::new(l)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(GELQF, inputs, 2)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (batch, m, n) = split_matrix(GELQF, "A", args.input_shape(0)?)?;
        let a = input_f64(args, 0)?;
        let (mut q, mut l) = (vec![0.0; batch * m * n], vec![0.0; batch * m * m]);
        let (q_items, l_items) = (ItemChunks::new(&mut q, m * n), ItemChunks::new(&mut l, m * m));
        for_each_item(batch, |i| {
            // SAFETY: `for_each_item` runs each index once, so item i of q and l is taken once.
            let (q_item, l_item) = unsafe { (q_items.item(i)?, l_items.item(i)?) };
            lq(batch_item(GELQF, "A", &a, i, m * n)?, m, n, q_item, l_item);
            Ok(())
        })?;
        output_from_f64(args, 0, &q)?;
        output_from_f64(args, 1, &l)
    }
    /// dA = L^-T (dQ + sym(L^T dL - dQ Q^T) Q), sym() mirroring the lower triangle.
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (q, l, dq, dl) = (d.output(0), d.output(1), d.out_grad(0), d.out_grad(1));
        let from_l = triangular(d, "_linalg_trmm", &l, &dl, true, false, true, 1.0)?;
        let from_q = gemm2(d, &dq, &q, false, true, 1.0, -2)?;
        let m = d.binary("elemwise_sub", &from_l, &from_q)?;
        let s = symmetric_from_triangle(d, &m, true)?;
        let sq = gemm2(d, &s, &q, false, false, 1.0, -2)?;
        let sum = d.binary("elemwise_add", &dq, &sq)?;
        Ok(vec![Some(triangular(d, "_linalg_trsm", &l, &sum, true, false, true, 1.0)?)])
    }
}

// ---------------------------------------------------------------------------------------------
// Diagonals and triangles of square matrices to and from vectors.

/// `_linalg_extractdiag` / `_linalg_makediag` (no triangle) and `_linalg_extracttrian` /
/// `_linalg_maketrian`: a matrix's diagonal or triangle as a vector and back.
struct Packing {
    name: &'static str,
    /// The triangle (else the diagonal).
    triangle: bool,
    /// Matrix to vector (else vector to matrix).
    extract: bool,
    offset: i64,
    lower: bool,
}

impl Packing {
    /// (n, m): the matrices are n x n and the vectors hold m values.
    fn sizes(&self, input: &Shape) -> Result<(usize, usize)> {
        let name = self.name;
        let k = self.offset.unsigned_abs() as usize;
        if self.extract {
            let (_, n) = split_square(name, "A", input)?;
            if n <= k {
                crate::bail!(Shape, "{name}: offset {} is out of range for {n} x {n} matrices (input {input})", self.offset);
            }
            let side = n - k;
            Ok((n, if self.triangle { side * (side + 1) / 2 } else { side }))
        } else {
            let Some(&m) = input.dims().last() else {
                crate::bail!(Shape, "{name}: A must have at least one dimension");
            };
            let side = if self.triangle {
                // The side of the triangle with m entries: side (side + 1) / 2 = m.
                let side = (((8 * m + 1) as f64).sqrt() as usize).saturating_sub(1) / 2;
                if side * (side + 1) / 2 != m {
                    crate::bail!(Shape, "{name}: the last axis of A ({m}) is not a triangular number n(n+1)/2 (input {input})");
                }
                side
            } else {
                m
            };
            Ok((side + k, m))
        }
    }

    /// For each vector entry, its flat position in the n x n matrix.
    fn positions(&self, n: usize) -> Vec<usize> {
        let k = self.offset.unsigned_abs() as usize;
        let side = n - k;
        if !self.triangle {
            let (row0, col0) = if self.offset < 0 { (k, 0) } else { (0, k) };
            return (0..side).map(|i| (row0 + i) * n + col0 + i).collect();
        }
        let upper = self.offset > 0 || (self.offset == 0 && !self.lower);
        let mut at = Vec::with_capacity(side * (side + 1) / 2);
        // The lower triangle row by row, or the upper one column by column (MXNet's order).
        for r in 0..side {
            for c in 0..=r {
                at.push(if upper { c * n + r + k } else { (r + k) * n + c });
            }
        }
        at
    }

    fn run<T: Elem>(&self, args: &KernelArgs) -> Result<()> {
        let (n, m) = self.sizes(args.input_shape(0)?)?;
        let positions = self.positions(n);
        let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
        if n == 0 || m == 0 {
            // Empty matrices or vectors (chunks of zero length are not allowed): a made matrix
            // is all zeros, an extracted vector has no entries.
            y.fill(T::default());
            return Ok(());
        }
        if self.extract {
            for (vector, matrix) in y.chunks_exact_mut(m).zip(x.chunks_exact(n * n)) {
                for (v, &at) in vector.iter_mut().zip(&positions) {
                    if let Some(&value) = matrix.get(at) {
                        *v = value;
                    }
                }
            }
        } else {
            y.fill(T::default());
            for (matrix, vector) in y.chunks_exact_mut(n * n).zip(x.chunks_exact(m)) {
                for (v, &at) in vector.iter().zip(&positions) {
                    if let Some(slot) = matrix.get_mut(at) {
                        *slot = *v;
                    }
                }
            }
        }
        Ok(())
    }

    /// The operator that undoes this one, with the same parameters.
    fn inverse_name(&self) -> &'static str {
        match (self.triangle, self.extract) {
            (false, true) => "_linalg_makediag",
            (false, false) => "_linalg_extractdiag",
            (true, true) => "_linalg_maketrian",
            (true, false) => "_linalg_extracttrian",
        }
    }
}

impl Operator for Packing {
    fn input_names(&self) -> Vec<String> {
        vec!["A".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a] = exactly(self.name, "input", inputs)?;
        let (n, m) = self.sizes(a)?;
        let mut dims = a.dims().to_vec();
        dims.pop();
        if self.extract {
            dims.pop();
            dims.push(m);
        } else {
            dims.extend([n, n]);
        }
        Ok(vec![Shape::new(dims)])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        real_dtype(self.name, inputs, 1)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        crate::dispatch_dtype!(args.output_dtype(0)?, [F32, F64], T => self.run::<T>(args), other => check_real(other))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let mut attrs = vec![("offset", self.offset.to_string())];
        if self.triangle {
            attrs.push(("lower", flag(self.lower)));
        }
        Ok(vec![Some(d.op(self.inverse_name(), &attrs, &[&g])?)])
    }
}

// ---------------------------------------------------------------------------------------------
// Gradient graph helpers.

fn flag(value: bool) -> String {
    if value { "True" } else { "False" }.to_string()
}

fn gemm2(d: &mut Grad, a: &Entry, b: &Entry, transpose_a: bool, transpose_b: bool, alpha: f64, axis: i64) -> Result<Entry> {
    let attrs = [("transpose_a", flag(transpose_a)), ("transpose_b", flag(transpose_b)), ("alpha", format!("{alpha:?}")), ("axis", axis.to_string())];
    d.op("_linalg_gemm2", &attrs, &[a, b])
}

/// `_linalg_trmm` or `_linalg_trsm` of the triangular `a` with `b`.
#[allow(clippy::too_many_arguments)]
fn triangular(d: &mut Grad, name: &str, a: &Entry, b: &Entry, transpose: bool, rightside: bool, lower: bool, alpha: f64) -> Result<Entry> {
    let attrs = [("transpose", flag(transpose)), ("rightside", flag(rightside)), ("lower", flag(lower)), ("alpha", format!("{alpha:?}"))];
    d.op(name, &attrs, &[a, b])
}

/// The lower (else upper) triangle of each matrix, diagonal included, zeros elsewhere.
fn keep_triangle(d: &mut Grad, x: &Entry, lower: bool) -> Result<Entry> {
    let attrs = [("offset", "0".to_string()), ("lower", flag(lower))];
    let packed = d.op("_linalg_extracttrian", &attrs, &[x])?;
    d.op("_linalg_maketrian", &attrs, &[&packed])
}

/// The symmetric matrices equal to each matrix on its lower (else upper) triangle.
fn symmetric_from_triangle(d: &mut Grad, x: &Entry, lower: bool) -> Result<Entry> {
    let triangle = keep_triangle(d, x, lower)?;
    let mirrored = swap_last_two(d, &triangle)?;
    let twice_diagonal = d.binary("elemwise_add", &triangle, &mirrored)?;
    let diagonal = d.op("_linalg_extractdiag", &[], &[x])?;
    let diagonal = d.op("_linalg_makediag", &[], &[&diagonal])?;
    d.binary("elemwise_sub", &twice_diagonal, &diagonal)
}

fn swap_last_two(d: &mut Grad, x: &Entry) -> Result<Entry> {
    d.op("SwapAxis", &[("dim1", "-1".to_string()), ("dim2", "-2".to_string())], &[x])
}

// ---------------------------------------------------------------------------------------------

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "_linalg_gemm",
        &["linalg_gemm"],
        "General matrix multiply-add on batches of matrices: out = alpha * op(A) * op(B) + beta * C, op() the \
         identity or the transpose (transpose_a, transpose_b). The rows are on `axis`, the columns on the last axis; \
         every other axis is a batch axis. float32 and float64.",
        |p: GemmParams| {
            Ok(Gemm {
                name: "_linalg_gemm",
                transpose_a: p.transpose_a,
                transpose_b: p.transpose_b,
                alpha: p.alpha,
                beta: Some(p.beta),
                axis: p.axis,
            })
        },
    ));
    add(OpDef::new(
        "_linalg_gemm2",
        &["linalg_gemm2"],
        "General matrix multiply on batches of matrices: out = alpha * op(A) * op(B), op() the identity or the \
         transpose (transpose_a, transpose_b). The rows are on `axis`, the columns on the last axis; every other axis \
         is a batch axis. float32 and float64.",
        |p: Gemm2Params| {
            Ok(Gemm { name: "_linalg_gemm2", transpose_a: p.transpose_a, transpose_b: p.transpose_b, alpha: p.alpha, beta: None, axis: p.axis })
        },
    ));
    add(OpDef::new(
        "_linalg_potrf",
        &["linalg_potrf"],
        "Cholesky factorization of symmetric positive-definite matrices (the trailing two axes; leading axes are a \
         batch): A = B * B^T with B lower triangular (lower=True), or A = B^T * B with B upper triangular. Only the \
         `lower` (else upper) triangle of A is read. float32 and float64.",
        |p: CholeskyParams| Ok(Square { name: "_linalg_potrf", kind: SquareKind::Cholesky { lower: p.lower } }),
    ));
    add(OpDef::new(
        "_linalg_potri",
        &["linalg_potri"],
        "Inverse of a symmetric positive-definite matrix from its Cholesky factor A (see potrf): \
         out = A^-T * A^-1 (lower=True) or A^-1 * A^-T (lower=False). Batched over leading axes; float32 and float64.",
        |p: CholeskyParams| Ok(Square { name: "_linalg_potri", kind: SquareKind::CholeskyInverse { lower: p.lower } }),
    ));
    add(OpDef::new(
        "_linalg_trmm",
        &["linalg_trmm"],
        "Multiplication with a triangular matrix A: out = alpha * op(A) * B, or alpha * B * op(A) with \
         rightside=True; op() the identity or the transpose, and only A's `lower` (else upper) triangle read. \
         Batched over leading axes; float32 and float64.",
        |p: TriangularParams| Ok(Triangular { name: "_linalg_trmm", solve: false, p }),
    ));
    add(OpDef::new(
        "_linalg_trsm",
        &["linalg_trsm"],
        "Solves op(A) * out = alpha * B (or out * op(A) = alpha * B with rightside=True) for a triangular A, op() \
         the identity or the transpose, only A's `lower` (else upper) triangle read. Batched over leading axes; \
         float32 and float64.",
        |p: TriangularParams| Ok(Triangular { name: "_linalg_trsm", solve: true, p }),
    ));
    add(OpDef::new(
        "_linalg_sumlogdiag",
        &["linalg_sumlogdiag"],
        "Sum of the natural logarithms of the diagonal of square matrices: one value per matrix (shape (1,) for a \
         single matrix). float32 and float64.",
        |_: NoParams| Ok(Square { name: "_linalg_sumlogdiag", kind: SquareKind::SumLogDiag }),
    ));
    add(OpDef::new(
        "_linalg_extractdiag",
        &["linalg_extractdiag"],
        "The diagonal (offset from the main one: negative below, positive above) of square matrices as vectors. \
         float32 and float64.",
        |p: DiagParams| Ok(Packing { name: "_linalg_extractdiag", triangle: false, extract: true, offset: p.offset, lower: true }),
    ));
    add(OpDef::new(
        "_linalg_makediag",
        &["linalg_makediag"],
        "Square matrices with the input vectors on their diagonal (offset from the main one: negative below, \
         positive above) and zeros elsewhere. float32 and float64.",
        |p: DiagParams| Ok(Packing { name: "_linalg_makediag", triangle: false, extract: false, offset: p.offset, lower: true }),
    ));
    add(OpDef::new(
        "_linalg_extracttrian",
        &["linalg_extracttrian"],
        "A triangle of square matrices as vectors: the lower (lower=True) or upper triangle for offset=0, the \
         triangle above the offset-th diagonal for offset > 0, below it for offset < 0. The lower triangle is read \
         row by row, the upper one column by column. float32 and float64.",
        |p: TrianParams| Ok(Packing { name: "_linalg_extracttrian", triangle: true, extract: true, offset: p.offset, lower: p.lower }),
    ));
    add(OpDef::new(
        "_linalg_maketrian",
        &["linalg_maketrian"],
        "Square matrices from packed triangles (the inverse of extracttrian, same offset and lower), zeros \
         elsewhere. float32 and float64.",
        |p: TrianParams| Ok(Packing { name: "_linalg_maketrian", triangle: true, extract: false, offset: p.offset, lower: p.lower }),
    ));
    add(OpDef::new(
        "_linalg_syrk",
        &["linalg_syrk"],
        "Multiplication of matrices with their transpose: out = alpha * A * A^T, or alpha * A^T * A with \
         transpose=True. Batched over leading axes; float32 and float64.",
        |p: SyrkParams| Ok(Syrk { p }),
    ));
    add(OpDef::new(
        "_linalg_gelqf",
        &["linalg_gelqf"],
        "LQ factorization of full-rank matrices A of shape (x, y), x <= y: returns (Q, L) with A = L * Q, L lower \
         triangular (x, x) and Q (x, y) with orthonormal rows (LAPACK's signs). Batched over leading axes; float32 \
         and float64.",
        |_: NoParams| Ok(Gelqf),
    ));
    add(OpDef::new(
        "_linalg_syevd",
        &[],
        "Eigendecomposition of symmetric matrices (only the lower triangle is read): returns (U, L) with U * A = \
         diag(L) * U, U orthonormal with the eigenvectors as rows (each one's largest-magnitude entry positive) and \
         L the eigenvalues in ascending order. Batched over leading axes; float32 and float64. The gradient needs \
         distinct eigenvalues.",
        |_: NoParams| Ok(Square { name: "_linalg_syevd", kind: SquareKind::SymmetricEigen }),
    ));
    add(OpDef::new(
        "_linalg_inverse",
        &["linalg_inverse"],
        "Inverse of square matrices (LU with partial pivoting); a singular matrix is an error. Batched over leading \
         axes; float32 and float64.",
        |_: NoParams| Ok(Square { name: "_linalg_inverse", kind: SquareKind::Inverse }),
    ));
    add(OpDef::new(
        "_linalg_det",
        &["linalg_det"],
        "Determinant of square matrices: one value per matrix (shape (1,) for a single matrix). The gradient of a \
         singular matrix is zero. float32 and float64.",
        |_: NoParams| Ok(Square { name: "_linalg_det", kind: SquareKind::Det }),
    ));
    add(OpDef::new(
        "_linalg_slogdet",
        &["linalg_slogdet"],
        "Sign and natural logarithm of the absolute value of the determinant of square matrices: returns (sign, \
         logabsdet), one value per matrix each; sign 0 and logabsdet -inf for a singular matrix. Only logabsdet has \
         a gradient (zero for a singular matrix). float32 and float64.",
        |_: NoParams| Ok(Square { name: "_linalg_slogdet", kind: SquareKind::SlogDet }),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        (0..m * n).map(|at| (0..k).map(|p| a[at / n * k + p] * b[p * n + at % n]).sum()).collect()
    }

    fn assert_close(got: &[f64], expected: &[f64]) {
        for (g, e) in got.iter().zip(expected) {
            assert!((g - e).abs() < 1e-10, "{got:?} != {expected:?}");
        }
    }

    #[test]
    fn cholesky_rebuilds_the_matrix_and_rejects_indefinite_ones() {
        let a = [4.0, 1.0, 1.0, 4.25];
        let mut l = [0.0; 4];
        cholesky(&a, 2, true, &mut l).unwrap();
        assert_close(&l, &[2.0, 0.0, 0.5, 2.0]);
        cholesky(&a, 2, false, &mut l).unwrap();
        assert_close(&l, &[2.0, 0.5, 0.0, 2.0]);
        assert_eq!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2, true, &mut l), Err(2));
    }

    #[test]
    fn lq_matches_lapack_signs_and_rebuilds_the_matrix() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (mut q, mut l) = ([0.0; 6], [0.0; 4]);
        lq(&a, 2, 3, &mut q, &mut l);
        assert!((l[0] + 3.741_657_386_773_941).abs() < 1e-12 && (l[3] - 1.963_961_012_123_931).abs() < 1e-12);
        assert_close(&product(&l, &q, 2, 2, 3), &a);
    }

    #[test]
    fn jacobi_eigenvectors_are_sorted_and_signed() {
        let (mut u, mut w) = ([0.0; 4], [0.0; 2]);
        symmetric_eigen(&[1.0, 0.0, 2.0, 4.0], 2, &mut u, &mut w);
        assert_close(&w, &[0.0, 5.0]);
        let s = 5f64.sqrt();
        assert_close(&u, &[2.0 / s, -1.0 / s, 1.0 / s, 2.0 / s]);
    }

    #[test]
    fn lu_gives_inverse_and_determinant() {
        let mut lu = vec![1.0, 4.0, 2.0, 3.0];
        let (perm, swaps) = lu_in_place(&mut lu, 2);
        let mut inv = [0.0; 4];
        inverse_from_lu(&lu, &perm, 2, &mut inv).unwrap();
        assert_close(&inv, &[-0.6, 0.8, 0.4, -0.2]);
        let (sign, log_abs, det) = determinant_from_lu(&lu, swaps, 2);
        assert_close(&[sign, log_abs, det], &[-1.0, 5f64.ln(), -5.0]);
    }
}
