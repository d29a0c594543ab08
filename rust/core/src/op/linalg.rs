//! Matrix products: `dot` and `batch_dot`, on the `gemm` crate's blocked SIMD kernels (float32,
//! float64, float16; bfloat16 through float32 copies), with an f64-accumulating loop for the
//! other dtypes.

use crate::op::KernelArgs;
use half::{bf16, f16};

use super::grad::{Grad, InputGrads};
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, ExecContext, OpDef, Operator, SendPtr};
use crate::base::{merge_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::graph::Entry;

crate::op_params! {
    pub struct DotParams {
        /// If true then transpose the first input before dot.
        transpose_a: bool = false,
        /// If true then transpose the second input before dot.
        transpose_b: bool = false,
        /// Storage type of the output (only 'default' is supported).
        forward_stype: Option<String> = None,
    }
}

/// A row-major matrix operand: pointer, logical (rows, cols), and its (row, col) strides.
#[derive(Clone, Copy)]
pub(super) struct Mat {
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl Mat {
    /// A stored `rows x cols` matrix, read transposed when `t`.
    pub(super) fn stored(rows: usize, cols: usize, t: bool) -> Mat {
        if t {
            Mat { rows: cols, cols: rows, rs: 1, cs: cols as isize }
        } else {
            Mat { rows, cols, rs: cols as isize, cs: 1 }
        }
    }

    /// The elements its storage spans: one past the last element it addresses (saturating, so
    /// that an absurd extent fails the length checks rather than wrapping).
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return 0;
        }
        let along = |count: usize, stride: isize| (count - 1).checked_mul(stride.unsigned_abs());
        match (along(self.rows, self.rs), along(self.cols, self.cs)) {
            (Some(r), Some(c)) => r.saturating_add(c).saturating_add(1),
            _ => usize::MAX,
        }
    }

    /// Whether the matrix is read transposed from its storage.
    #[cfg(feature = "cuda")]
    fn transposed(&self) -> bool {
        self.rs == 1 && self.cs != 1
    }

    /// The cuBLAS product `self * other`, `batch` times over consecutive matrices.
    #[cfg(feature = "cuda")]
    fn gemm(&self, other: &Mat, batch: usize) -> crate::backend::cuda::blas::Gemm {
        crate::backend::cuda::blas::Gemm {
            m: self.rows,
            n: other.cols,
            k: self.cols,
            batch,
            transpose_a: self.transposed(),
            transpose_b: other.transposed(),
            alpha: 1.0,
            beta: 0.0,
            strides: None,
        }
    }
}

/// `dst (m x n) (+)= a (m x k) * b (k x n)` over checked slices: adds to dst when `accumulate`.
/// The operands' lengths are checked once against the matrices `am` and `bm` address and dst's
/// against the contiguous m x n product; a mismatch is an error of `op`.
pub(super) fn matmul_checked<T: Elem>(op: &str, dst: &mut [T], accumulate: bool, a: &[T], am: Mat, b: &[T], bm: Mat, threads: usize) -> Result<()> {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    let product = m.saturating_mul(n);
    if bm.rows != k || a.len() < am.extent() || b.len() < bm.extent() || dst.len() < product {
        crate::bail!(
            Runtime,
            "{op}: a ({m} x {k}) by ({} x {n}) product needs {} and {} operand elements and {product} outputs, got {}, {} and {}",
            bm.rows,
            am.extent(),
            bm.extent(),
            a.len(),
            b.len(),
            dst.len()
        );
    }
    // SAFETY: T is the element type of `T::DTYPE`; a and b hold every element am and bm address
    // (their extents, checked above) and dst the contiguous m x n product; dst is a unique
    // borrow, so it overlaps neither operand.
    unsafe { matmul_into(T::DTYPE, dst.as_mut_ptr().cast(), accumulate, a.as_ptr().cast(), am, b.as_ptr().cast(), bm, threads) };
    Ok(())
}

/// Item `i` of a batch of `len`-element items held in `x`, or an error of `op` naming `what`.
#[inline]
pub(super) fn batch_item<'a, T>(op: &str, what: &str, x: &'a [T], i: usize, len: usize) -> Result<&'a [T]> {
    x.get(i * len..(i + 1) * len).ok_or_else(|| crate::err!(Runtime, "{op}: {what} of {} elements has no batch item {i} of {len}", x.len()))
}

/// `dst (m x n) (+)= a (m x k) * b (k x n)`: adds to dst when `accumulate`.
///
/// # Safety
/// `dtype` is the operands' element type; a and b address every element `am` and `bm` reach
/// through their strides, dst holds the contiguous m x n product and overlaps neither operand.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul_into(dtype: DType, dst: *mut u8, accumulate: bool, a: *const u8, am: Mat, b: *const u8, bm: Mat, threads: usize) {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    if k == 0 {
        // An empty inner dimension: every output is an empty sum, zero. GEMM kernels may not
        // touch dst at all then, which would leave uninitialised memory in the result.
        if !accumulate {
            // SAFETY: dst holds the m x n product (contiguous, row stride n).
            std::ptr::write_bytes(dst, 0, m * n * dtype.size());
        }
        return;
    }
    // Both operands along k and few outputs (a convolution's weight gradient): dot products of
    // rows beat packing both operands for a blocked GEMM.
    if am.cs == 1 && bm.rs == 1 && am.rs > 0 && bm.cs > 0 {
        // SAFETY (both): a is m x k with row stride am.rs, b is n x k with row stride bm.cs
        // (read transposed), dst is m x n, all of `dtype`.
        let dotted = match dtype {
            DType::F32 => dot_rows::<f32>(dst, accumulate, a, am, b, bm, threads),
            DType::BF16 => dot_rows::<bf16>(dst, accumulate, a, am, b, bm, threads),
            _ => false,
        };
        if dotted {
            return;
        }
    }
    if dtype == DType::BF16 && m * n * k >= BF16_BLOCKED_FLOPS && bf16_product(dst, accumulate, a, am, b, bm, threads) {
        return;
    }
    // A large right operand read transposed (`x * W^T`, FullyConnected's form) goes to the
    // packing kernel: the gemm crate packs a transposed operand by gathering one element per
    // row (on Zen 5 256x1024x1024 ran at 341 GFLOP/s with the operand transposed into scratch
    // first, against 438 on a plain one; the packing kernel: 396-446). An operand of up to a MiB
    // gathers from cache, where the crate stays ahead (128x256x784: 217 against 204 on one core).
    #[cfg(target_arch = "x86_64")]
    if bm.rs == 1 && bm.cs != 1 && dtype == DType::F32 && n * k >= 1 << 18 && crate::backend::cpu::packed_gemm::available() {
        use crate::backend::cpu::packed_gemm::{sgemm, Operand};
        // SAFETY: the operands address m x k and k x n elements through their strides; dst holds
        // the contiguous m x n product; the CPU feature was checked just above.
        sgemm(
            m,
            n,
            k,
            Operand { ptr: a as *const f32, rs: am.rs, cs: am.cs },
            Operand { ptr: b as *const f32, rs: bm.rs, cs: bm.cs },
            dst as *mut f32,
            n,
            accumulate,
            threads,
        );
        return;
    }
    let parts = crate::engine::parallel::threads().min(threads.max(1));
    // Other dtypes run a reference loop that is parallel over rows itself.
    let blocked = matches!(dtype, DType::F32 | DType::F64 | DType::F16);
    let flops = m * n * k;
    if flops < 64 * 64 * 64 || parts <= 1 || !blocked {
        return matmul_part(dtype, dst, n, accumulate, a, am, b, bm, gemm::Parallelism::None);
    }
    let b_transposed = bm.rs == 1 && bm.cs != 1;
    // Each thread computes a band of dst with the gemm crate's single-threaded kernel, a band of
    // rows when there are enough (every band then packs all of b), else (and for a transposed b)
    // a band of columns. One fork-join region per product keeps the threads' hand-off at a few
    // microseconds, where the crate's rayon threading paid a sleeping thread's wake-up per
    // product (128x256x784: 204 against 281 GFLOP/s) and, beside the engine's spinning workers,
    // oversubscribed the cores: a lone 512^3 product ran at 110 GFLOP/s against 218 in bands,
    // and bands match it on larger ones (1024^3: 216 against 221, 2048^3: 212 against 217).
    let by_rows = m >= n.min(32 * parts) && !(b_transposed && n >= 32 * parts);
    let len = if by_rows { m } else { n };
    let width = (len.div_ceil(parts).div_ceil(16) * 16).max(16);
    let esize = dtype.size() as isize;
    let (dst, a, b) = (SendPtr(dst), SendPtr(a as *mut u8), SendPtr(b as *mut u8));
    crate::engine::parallel::run(len.div_ceil(width), &|p| {
        let (start, end) = (p * width, ((p + 1) * width).min(len));
        let s = start as isize;
        // Rows start..end of a and dst, or columns start..end of b and dst.
        let (a_at, am, b_at, bm, dst_at) = if by_rows {
            (s * am.rs, Mat { rows: end - start, ..am }, 0, bm, s * n as isize)
        } else {
            (0, am, s * bm.cs, Mat { cols: end - start, ..bm }, s)
        };
        // SAFETY: the band's rows (or columns) lie inside a (or b) and dst, whose strides are
        // am/bm and n; each task writes only its own band of dst.
        unsafe {
            let (a, b) = (a.get().offset(a_at * esize), b.get().offset(b_at * esize));
            matmul_part(dtype, dst.get().offset(dst_at * esize), n, accumulate, a, am, b, bm, gemm::Parallelism::None);
        }
    });
}

/// `matmul_into` by dot products of rows in place, where the kernel suits the product's shape
/// and runs on this CPU; false (nothing done) otherwise.
///
/// # Safety
/// As `matmul_into` with `E` the operands' element type, a read as m x k rows `am.rs` apart and
/// b as n x k rows `bm.cs` apart.
unsafe fn dot_rows<E: crate::backend::cpu::row_dots::RowElem>(
    dst: *mut u8,
    accumulate: bool,
    a: *const u8,
    am: Mat,
    b: *const u8,
    bm: Mat,
    threads: usize,
) -> bool {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    if !(E::suits(m, n, k) && E::available()) {
        return false;
    }
    // SAFETY: the caller's contract; the kernel's CPU features were checked just above.
    unsafe {
        crate::backend::cpu::row_dots::row_dots::<E>(m, n, k, a.cast(), am.rs as usize, b.cast(), bm.cs as usize, dst.cast(), n, accumulate, threads)
    };
    true
}

/// Rows of `x` up to which `x * W^T` in bfloat16 reads W's rows in place on AMX tiles (the
/// largest batch measured; beyond it x's packed panels outgrow L2).
const WEIGHT_ROWS_MAX_BATCH: usize = 256;

/// bfloat16 products of at least this many multiply-adds run on the blocked kernels.
const BF16_BLOCKED_FLOPS: usize = 16 * 16 * 16;

/// `matmul_into` for bfloat16 operands, accumulating in float32 and rounding the product to
/// bfloat16 once at the end (as bfloat16 hardware does). Where the CPU has AVX512-BF16 the packed
/// kernel multiplies them directly (`vdpbf16ps`: twice the products of a float32 FMA per
/// instruction) and rounds each register block into dst as it leaves the last k slice, with
/// float32 partial sums only where the product has several k slices or adds to dst (a weight
/// gradient's 1024x128x1024 product ran at 331 GFLOP/s through a zeroed float32 copy and a
/// rounding pass). Elsewhere the operands are widened to float32 (exactly) for the float32
/// kernels (on the project machine a 64x256x128 product took 0.06 ms so, 4.6 ms in the
/// reference loop). False (nothing done) when the scratch memory cannot be had.
///
/// # Safety
/// As `matmul_into` with bfloat16 operands: dst holds the contiguous m x n product.
unsafe fn bf16_product(dst: *mut u8, accumulate: bool, a: *const u8, am: Mat, b: *const u8, bm: Mat, threads: usize) -> bool {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    let scratch = |len: usize| super::Scratch::<f32>::zeroed(len);
    // `x * W^T` (FullyConnected's form, W row-major) on AMX with W's rows read in place as A
    // tiles: Intel Xeon host, 2 threads, 1024x1024 to 8192x2048 weights, 1.3-4x the blocked
    // AMX kernel (which packs the weight per call) at every batch from 12 to 256.
    #[cfg(target_arch = "x86_64")]
    if bm.rs == 1 && bm.cs > 0 && m <= WEIGHT_ROWS_MAX_BATCH && crate::backend::cpu::amx::available() {
        use crate::backend::cpu::packed_gemm::Operand;
        let x = Operand { ptr: a as *const u16, rs: am.rs, cs: am.cs };
        // SAFETY: a addresses m x k elements through its strides, b is the n x k weight with rows
        // bm.cs apart read transposed, dst the contiguous m x n product; AMX was checked.
        let done = unsafe {
            crate::backend::cpu::amx::weight_rows_product(m, n, k, x, b as *const u16, bm.cs as usize, dst as *mut u16, n, accumulate, threads)
        };
        if done {
            return true;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::backend::cpu::packed_gemm::bf16_available() {
        use crate::backend::cpu::packed_gemm::{bf16_gemm, Operand, BF16_SLICE};
        let mut partial = None;
        if accumulate || k > BF16_SLICE {
            let Ok(mut sums) = scratch(m * n) else {
                return false;
            };
            if accumulate {
                widen_bf16(dst as *const bf16, Mat::stored(m, n, false), sums.as_mut_slice());
            }
            partial = Some(sums);
        }
        let sums = partial.as_mut().map_or(std::ptr::null_mut(), |sums| sums.as_mut_slice().as_mut_ptr());
        let operand = |ptr: *const u8, mat: Mat| Operand { ptr: ptr as *const u16, rs: mat.rs, cs: mat.cs };
        // SAFETY: the operands address m x k and k x n bfloat16 elements through their strides;
        // dst holds the m x n product and the partial sums (where needed) m x n floats; the CPU
        // features were checked just above.
        bf16_gemm(m, n, k, operand(a, am), operand(b, bm), sums, dst as *mut u16, n, accumulate, threads);
        return true;
    }
    let (Ok(mut d32), Ok(mut a32), Ok(mut b32)) = (scratch(m * n), scratch(m * k), scratch(k * n)) else {
        return false;
    };
    let product = d32.as_mut_slice();
    if accumulate {
        widen_bf16(dst as *const bf16, Mat::stored(m, n, false), product);
    }
    widen_bf16(a as *const bf16, am, a32.as_mut_slice());
    widen_bf16(b as *const bf16, bm, b32.as_mut_slice());
    let (a32, b32) = (a32.as_mut_slice().as_ptr() as *const u8, b32.as_mut_slice().as_ptr() as *const u8);
    matmul_into(DType::F32, product.as_mut_ptr() as *mut u8, accumulate, a32, Mat::stored(m, k, false), b32, Mat::stored(k, n, false), threads);
    let (dst, product) = (SendPtr(dst as *mut bf16), SendPtr(product.as_mut_ptr()));
    super::parallel_chunks(m * n, super::PARALLEL_GRAIN, |range| {
        for i in range {
            // SAFETY: i < m * n, inside both the float32 product and dst; each chunk writes its own range.
            unsafe { *dst.get().add(i) = bf16::from_f32(*product.get().add(i)) };
        }
    });
    true
}

/// The bfloat16 matrix `src` (read through `mat`'s strides) as a row-major float32 matrix.
///
/// # Safety
/// Every element `mat` addresses lies inside `src`'s allocation; `out` holds rows x cols.
unsafe fn widen_bf16(src: *const bf16, mat: Mat, out: &mut [f32]) {
    let (cols, src) = (mat.cols, SendPtr(src as *mut bf16));
    let out = SendPtr(out.as_mut_ptr());
    super::parallel_chunks(mat.rows, (super::PARALLEL_GRAIN / cols.max(1)).max(1), |rows| {
        if mat.cs == 1 {
            for r in rows {
                // SAFETY: row r holds cols elements from src + r * rs; row r of out belongs to
                // this chunk.
                let (from, to) = unsafe {
                    (
                        std::slice::from_raw_parts(src.get().offset(r as isize * mat.rs), cols),
                        std::slice::from_raw_parts_mut(out.get().add(r * cols), cols),
                    )
                };
                crate::backend::cpu::simd::vectorized(
                    #[inline(always)]
                    || to.iter_mut().zip(from).for_each(|(t, f)| *t = f.to_f32()),
                );
            }
            return;
        }
        for r in rows {
            for c in 0..cols {
                // SAFETY: (r, c) is inside the matrix; row r of out belongs to this chunk.
                unsafe { *out.get().add(r * cols + c) = (*src.get().offset(r as isize * mat.rs + c as isize * mat.cs)).to_f32() };
            }
        }
    });
}

/// `dst (m x n, row stride ldd) (+)= a * b` with the gemm crate (`par`: its own threading).
///
/// # Safety
/// As [`matmul_into`], with dst's rows `ldd` apart.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_part(
    dtype: DType,
    dst: *mut u8,
    ldd: usize,
    accumulate: bool,
    a: *const u8,
    am: Mat,
    b: *const u8,
    bm: Mat,
    par: gemm::Parallelism,
) {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    // The gemm crate's kernels run fastest with the long side of the product as their m, so a
    // short, wide product is handed over as its transpose (dst^T = b^T a^T): same memory, the
    // strides swapped.
    let transposed = m < n;
    macro_rules! fast {
        ($t:ty, $one:expr, $zero:expr) => {
            if transposed {
                gemm::gemm::<$t>(
                    n,
                    m,
                    k,
                    dst as *mut $t,
                    ldd as isize,
                    1,
                    accumulate,
                    b as *const $t,
                    bm.rs,
                    bm.cs,
                    a as *const $t,
                    am.rs,
                    am.cs,
                    if accumulate { $one } else { $zero },
                    $one,
                    false,
                    false,
                    false,
                    par,
                )
            } else {
                gemm::gemm::<$t>(
                    m,
                    n,
                    k,
                    dst as *mut $t,
                    1,
                    ldd as isize,
                    accumulate,
                    a as *const $t,
                    am.cs,
                    am.rs,
                    b as *const $t,
                    bm.cs,
                    bm.rs,
                    if accumulate { $one } else { $zero },
                    $one,
                    false,
                    false,
                    false,
                    par,
                )
            }
        };
    }
    match dtype {
        DType::F32 => fast!(f32, 1.0f32, 0.0f32),
        DType::F64 => fast!(f64, 1.0f64, 0.0f64),
        DType::F16 => fast!(f16, f16::ONE, f16::ZERO),
        other => crate::dispatch_dtype!(other, T => naive_matmul::<T>(dst as *mut T, ldd, accumulate, a as *const T, am, b as *const T, bm)),
    }
}

/// `dst (cols x rows) = src (rows x cols)^T`, parallel over bands of 32 destination rows; each
/// band moves 8x8 tiles through a local array (contiguous loads and stores on both sides, which
/// the compiler turns into register shuffles), edges element by element. Both slices hold at
/// least rows * cols values (the callers slice them to that); shorter ones are a caller's bug,
/// caught in debug builds, and leave dst untouched otherwise.
pub(super) fn transpose_f32(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const BAND: usize = 32;
    let len = rows * cols;
    debug_assert!(src.len() >= len && dst.len() >= len, "transpose of {rows} x {cols} over {} and {} values", src.len(), dst.len());
    let (Some(src), Some(dst)) = (src.get(..len), dst.get_mut(..len)) else { return };
    if len == 0 {
        return;
    }
    // Bands of whole destination rows, split as `parallel_chunks(cols.div_ceil(BAND), 4)` splits.
    let _infallible = super::parallel_units(dst, BAND * rows, 4, |first_band, piece| {
        for (band, dst) in (first_band..).zip(piece.chunks_mut(BAND * rows)) {
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || transpose_band(src, rows, cols, band * BAND, dst),
            );
        }
        Ok(())
    });
}

/// Destination rows p0..p0 + dst.len() / rows (source columns) of the transpose of the
/// rows x cols `src` (both non-zero); `dst` starts at row p0.
#[inline(always)]
fn transpose_band(src: &[f32], rows: usize, cols: usize, p0: usize, dst: &mut [f32]) {
    const TILE: usize = 8;
    let p1 = p0 + dst.len() / rows;
    let full_p = p0 + (p1 - p0) / TILE * TILE;
    let full_j = rows / TILE * TILE;
    let shuffles = crate::backend::cpu::simd::f32_lanes() >= 8;
    // Source rows outer: each group of 8 source rows is read across the band's whole width (two
    // full cache lines per row for 32 columns), and the band's destination rows stay in L1 while
    // they fill. With the band's columns outer, every source line was fetched twice from L2 (a
    // 1024x1024 transpose ran at about 8 GB/s).
    for jt in (0..full_j).step_by(TILE) {
        for pt in (p0..full_p).step_by(TILE) {
            // The tile's 8 source rows `cols` apart and 8 destination rows `rows` apart, each
            // slice ending at the tile's last element (inside both: jt + 8 <= rows, pt + 8 <= p1).
            let from = src.get(jt * cols + pt..(jt + TILE - 1) * cols + pt + TILE);
            let to = dst.get_mut((pt - p0) * rows + jt..(pt + TILE - 1 - p0) * rows + jt + TILE);
            let (Some(from), Some(to)) = (from, to) else { continue };
            #[cfg(target_arch = "x86_64")]
            if shuffles {
                // SAFETY: the CPU has AVX (f32_lanes() >= 8 implies AVX2); `from` holds 8 rows of
                // 8 values `cols` apart and `to` 8 rows of 8 values `rows` apart (the slices above
                // end at the last tile element).
                unsafe { transpose_tile_avx(from.as_ptr(), cols, to.as_mut_ptr(), rows) };
                continue;
            }
            let mut tile = [[0f32; TILE]; TILE];
            for (line, source) in tile.iter_mut().zip(from.chunks(cols)) {
                line.iter_mut().zip(source).for_each(|(t, s)| *t = *s);
            }
            for (c, out) in to.chunks_mut(rows).enumerate() {
                for (v, line) in out.iter_mut().zip(&tile) {
                    *v = line.get(c).copied().unwrap_or_default();
                }
            }
        }
    }
    // Edges: the columns past the last whole tile, and the rows past it for the tiled columns.
    for (p, line) in (p0..p1).zip(dst.chunks_exact_mut(rows)) {
        let start = if p < full_p { full_j } else { 0 };
        // Skipped on each side (both skip in O(1)), not on the pair, which steps through them.
        let column = src.get(p..).unwrap_or_default().iter().step_by(cols).skip(start);
        for (d, s) in line.iter_mut().skip(start).zip(column) {
            *d = *s;
        }
    }
}

/// One 8x8 tile transposed in registers: rows interleaved in pairs, then in fours, then the
/// 128-bit halves exchanged (the compiler does not find these shuffles for the plain loop and
/// moves the tile one float at a time, several times slower).
///
/// # Safety
/// The CPU has AVX; `src` holds 8 rows of 8 floats `src_stride` apart, `dst` 8 rows of 8 floats
/// `dst_stride` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_tile_avx(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    use std::arch::x86_64::*;
    let row = |r: usize| _mm256_loadu_ps(src.add(r * src_stride));
    let (r0, r1, r2, r3, r4, r5, r6, r7) = (row(0), row(1), row(2), row(3), row(4), row(5), row(6), row(7));
    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
    let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
    // Columns c and c + 4 of rows 0-3 (s0..s3) and of rows 4-7 (s4..s7).
    let (s0, s1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
    let (s2, s3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
    let (s4, s5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
    let (s6, s7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
    let columns = [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ];
    for (c, column) in columns.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(c * dst_stride), column);
    }
}

/// Reference loop for dtypes the SIMD kernels do not cover (bfloat16 and integers).
///
/// # Safety
/// As [`matmul_into`], with dst's rows `ldd` apart.
unsafe fn naive_matmul<T: Elem>(dst: *mut T, ldd: usize, accumulate: bool, a: *const T, am: Mat, b: *const T, bm: Mat) {
    let (m, k, n) = (am.rows, am.cols, bm.cols);
    let dp = SendPtr(dst);
    let (ap, bp) = (SendPtr(a as *mut T), SendPtr(b as *mut T));
    super::parallel_chunks(m, (4096 / (n * k).max(1)).max(1), |rows| {
        let mut acc = vec![0f64; n];
        // SAFETY (the reads and writes below): (i, p) and (p, j) lie inside a and b through their
        // strides, (i, j) inside dst; rows i of dst belong to this chunk alone.
        for i in rows {
            acc.iter_mut().for_each(|v| *v = 0.0);
            for p in 0..k {
                let av = (*ap.get().offset(i as isize * am.rs + p as isize * am.cs)).to_f64();
                for (j, slot) in acc.iter_mut().enumerate() {
                    *slot += av * (*bp.get().offset(p as isize * bm.rs + j as isize * bm.cs)).to_f64();
                }
            }
            for (j, v) in acc.iter().enumerate() {
                let prior = if accumulate { (*dp.get().add(i * ldd + j)).to_f64() } else { 0.0 };
                *dp.get().add(i * ldd + j) = T::from_f64(prior + *v);
            }
        }
    });
}

struct Dot {
    p: DotParams,
}

impl Dot {
    /// MXNet's view of N-d operands as matrices: `a` is (prod(shape[:-1]), shape[-1]) unless
    /// transposed, in which case it is (shape[0], prod(shape[1:])) read transposed.
    fn operands(&self, a: &Shape, b: &Shape) -> Result<(Mat, Mat, Shape)> {
        // The products of the other axes, not size / axis: with a zero-length axis the division
        // would lose the other axes' extents.
        let split_last = |s: &Shape| -> (usize, usize) {
            match s.dims().split_last() {
                Some((&last, rest)) => (Shape::from(rest).size(), last),
                None => (1, 1),
            }
        };
        let split_first = |s: &Shape| -> (usize, usize) {
            match s.dims().split_first() {
                Some((&first, rest)) => (first, Shape::from(rest).size()),
                None => (1, 1),
            }
        };
        let (ta, tb) = (self.p.transpose_a, self.p.transpose_b);
        if let (&[len_a], &[len_b]) = (a.dims(), b.dims()) {
            if len_a != len_b {
                crate::bail!(Shape, "dot: shapes {a} and {b} are not aligned: {len_a} != {len_b}");
            }
            return Ok((Mat::stored(1, len_a, false), Mat::stored(len_b, 1, false), Shape::new(vec![1])));
        }
        let (ar, ac) = if ta { split_first(a) } else { split_last(a) };
        let am = Mat::stored(ar, ac, ta);
        let (br, bc) = if tb { split_last(b) } else { split_first(b) };
        let bm = Mat::stored(br, bc, tb);
        if am.cols != bm.rows {
            crate::bail!(Shape, "dot: shapes {a} and {b} are not aligned (transpose_a={ta}, transpose_b={tb}): {} != {}", am.cols, bm.rows);
        }
        let mut out: Vec<usize> = Vec::new();
        if a.ndim() > 1 {
            out.extend_from_slice(outer_axes(a.dims(), ta));
        }
        if b.ndim() > 1 {
            out.extend_from_slice(outer_axes(b.dims(), !tb));
        }
        if out.is_empty() {
            out.push(1);
        }
        Ok((am, bm, Shape::new(out)))
    }
}

/// The axes of a dot operand that the output keeps: all but the first when `drop_first`, else
/// all but the last (lhs: the first is dropped when transposed; rhs: when not transposed).
fn outer_axes<D>(dims: &[D], drop_first: bool) -> &[D] {
    let rest = if drop_first { dims.split_first() } else { dims.split_last() };
    rest.map_or(&[], |(_, rest)| rest)
}

impl Operator for Dot {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn num_inputs(&self) -> usize {
        2
    }
    /// With both ranks known, the output keeps the operands' outer dimensions, known or not.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let [Some(a), Some(b)] = exactly::<_, 2>("dot", "input", inputs)?.clone() else { return Ok(()) };
        if a.ndim() == 0 || b.ndim() == 0 {
            crate::bail!(Shape, "dot: inputs must have at least one dimension, got {a} and {b}");
        }
        let (ta, tb) = (self.p.transpose_a, self.p.transpose_b);
        // The first or the last axis; for two vectors (the inner product) both are the one axis.
        let end = |s: &PartialShape, first: bool| if first { s.0.first() } else { s.0.last() }.copied().flatten();
        let (inner_a, inner_b) = (end(&a, ta), end(&b, !tb));
        if let (Some(x), Some(y)) = (inner_a, inner_b) {
            if x != y {
                crate::bail!(Shape, "dot: shapes {a} and {b} are not aligned (transpose_a={ta}, transpose_b={tb}): {x} != {y}");
            }
        }
        let mut out: Vec<Option<usize>> = Vec::new();
        if a.ndim() > 1 {
            out.extend_from_slice(outer_axes(&a.0, ta));
        }
        if b.ndim() > 1 {
            out.extend_from_slice(outer_axes(&b.0, !tb));
        }
        if out.is_empty() {
            out.push(Some(1));
        }
        let [output] = outputs else { crate::bail!(Value, "dot: 1 output expected, got {}", outputs.len()) };
        merge_partial(output, &PartialShape(out)).map(|_| ())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b] = exactly("dot", "input", inputs)?;
        if a.ndim() == 0 || b.ndim() == 0 {
            crate::bail!(Shape, "dot: inputs must have at least one dimension, got {a} and {b}");
        }
        Ok(vec![self.operands(a, b)?.2])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (am, bm, _) = self.operands(args.input_shape(0)?, args.input_shape(1)?)?;
        let threads = crate::engine::parallel::threads();
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            matmul_checked("dot", args.output::<T>(0)?, false, args.input::<T>(0)?, am, args.input::<T>(1)?, bm, threads)
        })
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([a, b], [out]) = (exactly("dot", "input", inputs)?, exactly("dot", "output", outputs)?);
        let (am, bm, _) = self.operands(&a.shape, &b.shape)?;
        let gemm = am.gemm(&bm, 1);
        crate::backend::cuda::blas::gemm(gpu, &gemm, a, b, out)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (a, b) = (d.input(0), d.input(1));
        if matches!((d.shape_of(&a), d.shape_of(&b)), (Some(x), Some(y)) if x.ndim() == 1 && y.ndim() == 1) {
            // The inner product of two vectors (output shape (1,)): each operand's gradient is
            // the other operand scaled by g; the matrix formulas would pair (1,) with (n,).
            let g = d.out_grad(0);
            return Ok(vec![Some(d.binary("broadcast_mul", &g, &b)?), Some(d.binary("broadcast_mul", &g, &a)?)]);
        }
        product_gradient(d, "dot", self.p.transpose_a, self.p.transpose_b)
    }
}

/// Gradients of `y = op(A) op(B)` (op transposes when flagged), as products of the same kind:
/// dA = g op(B)^T and dB = op(A)^T g, each transposed back when its operand was read transposed.
fn product_gradient(d: &mut Grad, op: &str, ta: bool, tb: bool) -> Result<InputGrads> {
    let (a, b, g) = (d.input(0), d.input(1), d.out_grad(0));
    let flags = |x: bool, y: bool| {
        let text = |f: bool| if f { "True" } else { "False" }.to_string();
        [("transpose_a", text(x)), ("transpose_b", text(y))]
    };
    // dot views an N-d lhs as (rows, last axis); reading it transposed would split off the first
    // axis instead, so dB's product takes lhs and g as explicit matrices.
    let as_matrix = |d: &mut Grad, x: &crate::graph::Entry| -> Result<crate::graph::Entry> {
        if op != "dot" {
            return Ok(x.clone());
        }
        d.op("Reshape", &[("shape", "(-1, 0)".to_string()), ("reverse", "True".to_string())], &[x])
    };
    let (da, db) = match (ta, tb) {
        (false, false) => {
            let (a2, g2) = (as_matrix(d, &a)?, as_matrix(d, &g)?);
            (d.op(op, &flags(false, true), &[&g, &b])?, d.op(op, &flags(true, false), &[&a2, &g2])?)
        }
        (true, false) => (d.op(op, &flags(false, true), &[&b, &g])?, d.op(op, &flags(false, false), &[&a, &g])?),
        (false, true) => {
            let (a2, g2) = (as_matrix(d, &a)?, as_matrix(d, &g)?);
            (d.op(op, &flags(false, false), &[&g, &b])?, d.op(op, &flags(true, false), &[&g2, &a2])?)
        }
        (true, true) => (d.op(op, &flags(true, true), &[&b, &g])?, d.op(op, &flags(true, true), &[&g, &a])?),
    };
    // N-d operands are viewed as matrices; the products come back in matrix form.
    let da = d.binary("reshape_like", &da, &a)?;
    let db = d.binary("reshape_like", &db, &b)?;
    Ok(vec![Some(da), Some(db)])
}

struct BatchDot {
    p: DotParams,
}

impl BatchDot {
    fn operands(&self, a: &Shape, b: &Shape) -> Result<(usize, Mat, Mat)> {
        let (&[batch, a_rows, a_cols], &[b_batch, b_rows, b_cols]) = (a.dims(), b.dims()) else {
            crate::bail!(Shape, "batch_dot: both inputs must be 3-D (batch, rows, cols), got {a} and {b}");
        };
        if batch != b_batch {
            crate::bail!(Shape, "batch_dot: batch sizes differ: {a} and {b}");
        }
        let am = Mat::stored(a_rows, a_cols, self.p.transpose_a);
        let bm = Mat::stored(b_rows, b_cols, self.p.transpose_b);
        if am.cols != bm.rows {
            crate::bail!(
                Shape,
                "batch_dot: shapes {a} and {b} are not aligned (transpose_a={}, transpose_b={}): {} != {}",
                self.p.transpose_a,
                self.p.transpose_b,
                am.cols,
                bm.rows
            );
        }
        Ok((batch, am, bm))
    }

    /// The products, one per batch item: many small ones run one per thread, few large ones let
    /// GEMM use the threads.
    fn run<T: Elem>(&self, args: &KernelArgs, batch: usize, am: Mat, bm: Mat) -> Result<()> {
        let (a, b, out) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
        let (a_step, b_step, o_step) = (am.rows * am.cols, bm.rows * bm.cols, am.rows * bm.cols);
        if o_step == 0 {
            return Ok(());
        }
        let threads = crate::engine::parallel::threads();
        let inner_threads = if batch >= threads { 1 } else { threads };
        // Pieces of whole output matrices, split as `parallel_chunks` splits the batch.
        super::parallel_units(out, o_step, if inner_threads == 1 { 1 } else { batch }, |first, items| {
            for (i, dst) in (first..).zip(items.chunks_exact_mut(o_step)) {
                let (a, b) = (batch_item("batch_dot", "lhs", a, i, a_step)?, batch_item("batch_dot", "rhs", b, i, b_step)?);
                matmul_checked("batch_dot", dst, false, a, am, b, bm, inner_threads)?;
            }
            Ok(())
        })
    }
}

impl Operator for BatchDot {
    fn input_names(&self) -> Vec<String> {
        vec!["lhs".into(), "rhs".into()]
    }
    fn num_inputs(&self) -> usize {
        2
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [a, b] = exactly("batch_dot", "input", inputs)?;
        let (batch, am, bm) = self.operands(a, b)?;
        Ok(vec![Shape::new(vec![batch, am.rows, bm.cols])])
    }
    /// Needs both operands' inner dimensions (as MXNet does); the batch and the outer
    /// dimensions may be unknown.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let [Some(a), Some(b)] = exactly::<_, 2>("batch_dot", "input", inputs)?.clone() else { return Ok(()) };
        let (&[a_batch, a1, a2], &[b_batch, b1, b2]) = (a.0.as_slice(), b.0.as_slice()) else {
            crate::bail!(Shape, "batch_dot: both inputs must be 3-D (batch, rows, cols), got {a} and {b}");
        };
        let (ta, tb) = (self.p.transpose_a, self.p.transpose_b);
        let (rows, inner_a) = if ta { (a2, a1) } else { (a1, a2) };
        let (inner_b, cols) = if tb { (b2, b1) } else { (b1, b2) };
        let mut batch = PartialShape(vec![a_batch]);
        batch.merge(&PartialShape(vec![b_batch])).map_err(|e| e.context("batch_dot: batch sizes differ"))?;
        let [output] = outputs else { crate::bail!(Value, "batch_dot: 1 output expected, got {}", outputs.len()) };
        match (inner_a, inner_b) {
            (Some(x), Some(y)) if x == y => merge_partial(output, &PartialShape(vec![batch.0.first().copied().flatten(), rows, cols])).map(|_| ()),
            (Some(x), Some(y)) => crate::bail!(Shape, "batch_dot: shapes {a} and {b} are not aligned: {x} != {y}"),
            _ => Ok(()),
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (batch, am, bm) = self.operands(args.input_shape(0)?, args.input_shape(1)?)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => self.run::<T>(args, batch, am, bm))
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([a, b], [out]) = (exactly("batch_dot", "input", inputs)?, exactly("batch_dot", "output", outputs)?);
        let (batch, am, bm) = self.operands(&a.shape, &b.shape)?;
        crate::backend::cuda::blas::gemm(gpu, &am.gemm(&bm, batch), a, b, out)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        product_gradient(d, "batch_dot", self.p.transpose_a, self.p.transpose_b)
    }
}

crate::op_params! {
    pub struct FullyConnectedParams {
        /// Number of hidden units (output features).
        num_hidden: usize,
        /// Whether to disable the bias.
        no_bias: bool = false,
        /// Whether to collapse all but the first axis of the input into one feature axis.
        flatten: bool = true,
    }
}

/// FullyConnected: `out = data . weight^T + bias`, weight (num_hidden, features).
struct FullyConnected {
    p: FullyConnectedParams,
}

impl FullyConnected {
    /// `out = data . weight^T (+ bias)` over (rows, features) data.
    fn run<T: Elem>(&self, args: &KernelArgs, rows: usize, features: usize) -> Result<()> {
        let hidden = self.p.num_hidden;
        let (data, weight, out) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
        let accumulate = args.inputs().len() > 2;
        if accumulate {
            // Every output row starts as the bias; the product is added on top.
            let bias = args.input::<T>(2)?;
            if bias.len() != hidden || out.len() != rows * hidden {
                crate::bail!(Runtime, "FullyConnected: a bias of {} elements for {rows} x {hidden} outputs held in {}", bias.len(), out.len());
            }
            out.chunks_exact_mut(hidden.max(1)).for_each(|row| row.copy_from_slice(bias));
        }
        let threads = crate::engine::parallel::threads();
        // Data (rows, features), weight (hidden, features) read transposed.
        let (xm, wm) = (Mat::stored(rows, features, false), Mat::stored(hidden, features, true));
        matmul_checked("FullyConnected", out, accumulate, data, xm, weight, wm, threads)
    }

    /// (rows, features) of the input as a matrix, and the output shape.
    fn layout(&self, data: &Shape) -> Result<((usize, usize), Shape)> {
        let (Some((&first, rest)), Some((&last, leading))) = (data.dims().split_first(), data.dims().split_last()) else {
            crate::bail!(Shape, "FullyConnected: data must have at least one dimension");
        };
        let (rows, features, mut out) = if self.p.flatten {
            (first, rest.iter().product(), vec![first])
        } else {
            // Rows as the product of the leading axes: size / features loses them when
            // features is 0, and the zero-filled output would then not be written at all.
            (Shape::from(leading).size(), last, leading.to_vec())
        };
        out.push(self.p.num_hidden);
        Ok(((rows, features), Shape::new(out)))
    }
}

impl Operator for FullyConnected {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data".to_string(), "weight".to_string()];
        if !self.p.no_bias {
            names.push("bias".to_string());
        }
        names
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        let [Some(data), weight, bias @ ..] = inputs else { return Ok(()) };
        let ((_, features), _) = self.layout(data)?;
        weight.get_or_insert_with(|| Shape::new(vec![self.p.num_hidden, features]));
        if let Some(bias) = bias.first_mut() {
            bias.get_or_insert_with(|| Shape::new(vec![self.p.num_hidden]));
        }
        Ok(())
    }
    /// Needs the data's rank (as MXNet does): then the weight and bias shapes follow as far as
    /// the features are known, and the output's leading dimensions are the data's.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let [data_slot, weight, bias @ ..] = inputs else {
            crate::bail!(Value, "FullyConnected: data and weight inputs expected, got {} input(s)", inputs.len());
        };
        let Some(data) = data_slot.clone() else { return Ok(()) };
        let Some((&last_dim, leading_dims)) = data.0.split_last() else {
            crate::bail!(Shape, "FullyConnected: data must have at least one dimension");
        };
        let hidden = Some(self.p.num_hidden);
        // The leading dimensions data and output share: the batch, or all but the last axis.
        let (features, leading) =
            if self.p.flatten { (data.known_product(1), data.0.get(..1).unwrap_or_default()) } else { (last_dim, leading_dims) };
        merge_partial(weight, &PartialShape(vec![hidden, features]))?;
        if let Some(bias) = bias.first_mut() {
            merge_partial(bias, &PartialShape(vec![hidden]))?;
        }
        let mut out = PartialShape(leading.to_vec());
        out.0.push(hidden);
        let [output] = outputs else { crate::bail!(Value, "FullyConnected: 1 output expected, got {}", outputs.len()) };
        merge_partial(output, &out)?;
        // The output's leading dimensions (as merged) back onto the data's.
        let mut back = PartialShape::unknown(data.ndim());
        if let Some(merged) = output.as_ref() {
            back.0.iter_mut().zip(&merged.0).take(leading.len()).for_each(|(b, m)| *b = *m);
        }
        merge_partial(data_slot, &back)?;
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, weight, bias @ ..] = inputs else {
            crate::bail!(Value, "FullyConnected: data and weight inputs expected, got {} input(s)", inputs.len());
        };
        let ((_, features), out) = self.layout(data)?;
        let expected = Shape::new(vec![self.p.num_hidden, features]);
        if *weight != expected {
            crate::bail!(
                Shape,
                "FullyConnected: weight has shape {weight}, expected {expected} for data {data} and num_hidden={}",
                self.p.num_hidden
            );
        }
        if let Some(bias) = bias.first() {
            if bias.size() != self.p.num_hidden || bias.ndim() != 1 {
                crate::bail!(Shape, "FullyConnected: bias has shape {bias}, expected ({},)", self.p.num_hidden);
            }
        }
        Ok(vec![out])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let ((rows, features), _) = self.layout(args.input_shape(0)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => self.run::<T>(args, rows, features))
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let ([data, weight, bias @ ..], [out]) = (inputs, exactly("FullyConnected", "output", outputs)?) else {
            crate::bail!(Value, "FullyConnected: data and weight inputs expected, got {} input(s)", inputs.len());
        };
        let ((rows, features), _) = self.layout(&data.shape)?;
        let hidden = self.p.num_hidden;
        let gemm = Mat::stored(rows, features, false).gemm(&Mat::stored(hidden, features, true), 1);
        crate::backend::cuda::blas::gemm(gpu, &gemm, data, weight, out)?;
        match bias.first() {
            Some(bias) => crate::backend::cuda::kernels::add_bias(gpu, bias, out, hidden, 1),
            None => Ok(()),
        }
    }
    /// One `_backward_FullyConnected` node: two GEMMs and a column sum, reading the input as
    /// a matrix in place (no flattened copy), and skipping the data gradient when no one needs it.
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, w, g) = (d.input(0), d.input(1), d.out_grad(0));
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let attrs = [
            ("num_hidden", self.p.num_hidden.to_string()),
            ("no_bias", flag(self.p.no_bias)),
            ("flatten", flag(self.p.flatten)),
            ("data_grad", flag(d.input_needed(0))),
        ];
        let data_needed = d.input_needed(0);
        let grads = d.op_outputs("_backward_FullyConnected", &attrs, &[&g, &x, &w])?;
        Ok(grads.into_iter().enumerate().map(|(i, grad)| (i != 0 || data_needed).then_some(grad)).collect())
    }
}

fn check_dense(p: &DotParams) -> Result<()> {
    match p.forward_stype.as_deref() {
        None | Some("default") => Ok(()),
        Some(other) => crate::bail!(Param, "forward_stype '{other}' is not supported; only dense ('default') outputs are"),
    }
}

crate::op_params! {
    pub struct FullyConnectedBackwardParams {
        /// Number of hidden units of the forward layer.
        num_hidden: usize,
        /// Whether the forward layer had no bias.
        no_bias: bool = false,
        /// Whether the forward layer flattened its input.
        flatten: bool = true,
        /// Whether to compute the data gradient (zeros otherwise).
        data_grad: bool = true,
    }
}

/// `_backward_FullyConnected(out_grad, data, weight)` -> (data grad, weight grad[, bias grad]).
struct FullyConnectedBackward {
    forward: FullyConnected,
    data_grad: bool,
}

const BACKWARD: &str = "_backward_FullyConnected";

impl FullyConnectedBackward {
    /// dx = g . W (zeros without `data_grad`), dW = g^T . x and db = column sums of g, for the
    /// out_grad g (rows, hidden), data x (rows, features) and weight W (hidden, features).
    fn run<T: Elem>(&self, args: &KernelArgs, rows: usize, features: usize) -> Result<()> {
        let hidden = self.forward.p.num_hidden;
        let (g, x, w) = (args.input::<T>(0)?, args.input::<T>(1)?, args.input::<T>(2)?);
        let threads = crate::engine::parallel::threads();
        let dx = args.output::<T>(0)?;
        if self.data_grad {
            matmul_checked(BACKWARD, dx, false, g, Mat::stored(rows, hidden, false), w, Mat::stored(hidden, features, false), threads)?;
        } else {
            dx.fill(T::default());
        }
        matmul_checked(BACKWARD, args.output::<T>(1)?, false, g, Mat::stored(rows, hidden, true), x, Mat::stored(rows, features, false), threads)?;
        if args.outputs().len() > 2 {
            super::reduce::sum_view(BACKWARD, g, &[rows, hidden], &[true, false], args.output::<T>(2)?)?;
        }
        Ok(())
    }
}

impl Operator for FullyConnectedBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into(), "weight".into()]
    }
    fn num_outputs(&self) -> usize {
        if self.forward.p.no_bias {
            2
        } else {
            3
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [out_grad, data, weight] = exactly(BACKWARD, "input", inputs)?;
        let mut forward_inputs = vec![data.clone(), weight.clone()];
        if !self.forward.p.no_bias {
            forward_inputs.push(Shape::new(vec![self.forward.p.num_hidden]));
        }
        let forward_output = self.forward.infer_shape(&forward_inputs)?;
        let [forward_output] = exactly(BACKWARD, "forward output", &forward_output)?;
        super::check_out_grad(BACKWARD, out_grad, forward_output)?;
        let mut shapes = vec![data.clone(), weight.clone()];
        if !self.forward.p.no_bias {
            shapes.push(Shape::new(vec![self.forward.p.num_hidden]));
        }
        Ok(shapes)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let [_, data, _] = exactly(BACKWARD, "input", inputs)?;
        Ok(vec![*data; self.num_outputs()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let ((rows, features), _) = self.forward.layout(args.input_shape(1)?)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => self.run::<T>(args, rows, features))
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::{blas, kernels};
        let [g, x, w] = exactly(BACKWARD, "input", inputs)?;
        let [dx, dw, db @ ..] = outputs else {
            crate::bail!(Value, "{BACKWARD}: data and weight gradient outputs expected, got {} output(s)", outputs.len());
        };
        let ((rows, features), _) = self.forward.layout(&x.shape)?;
        let hidden = self.forward.p.num_hidden;
        if self.data_grad {
            blas::gemm(gpu, &Mat::stored(rows, hidden, false).gemm(&Mat::stored(hidden, features, false), 1), g, w, dx)?;
        } else {
            kernels::fill(gpu, dx, 0.0)?;
        }
        blas::gemm(gpu, &Mat::stored(rows, hidden, true).gemm(&Mat::stored(rows, features, false), 1), g, x, dw)?;
        match db.first() {
            // SAFETY: g's rows x hidden elements viewed as that matrix (the layout it has).
            Some(db) => kernels::reduce(
                gpu,
                &super::reduce::CUDA_SUM,
                &[true, false],
                &unsafe { Tensor::new(g.raw(), Shape::new(vec![rows, hidden]), g.dtype) },
                db,
            ),
            None => Ok(()),
        }
    }
    /// The backward pass is linear in each input: dx = g . W, dW = g^T . x, db = column sums of
    /// g (x and g as the matrices the forward layout gives). With heads hx, hW, hb on those, the
    /// out_grad input gets hx . W^T + x . hW^T + hb (FullyConnected's own forms), x gets g . hW
    /// and W gets g^T . hx. MXNet 1.9.1's `_backward_backward_FullyConnected` computes the last
    /// two and leaves the out_grad input's gradient zero; here it is the full derivative, which
    /// a loss on a gradient whose output gradient depends on the inputs needs.
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x, w) = (d.input(0), d.input(1), d.input(2));
        let p = &self.forward.p;
        // A data gradient written as zeros (data_grad=False) depends on nothing.
        let hx = (self.data_grad && !d.out_grad_is_zero(0)).then(|| d.out_grad(0));
        let hw = (!d.out_grad_is_zero(1)).then(|| d.out_grad(1));
        let hb = (!p.no_bias && !d.out_grad_is_zero(2)).then(|| d.out_grad(2));
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();

        let out_grad_grad = if d.input_needed(0) {
            let products: Vec<(&Entry, &Entry)> = [hx.as_ref().map(|hx| (hx, &w)), hw.as_ref().map(|hw| (&x, hw))].into_iter().flatten().collect();
            let mut bias = hb;
            let mut total: Option<Entry> = None;
            for (data, weight) in products {
                // The bias head rides on the first product as its bias.
                let head_bias = bias.take();
                let attrs = [("num_hidden", p.num_hidden.to_string()), ("no_bias", flag(head_bias.is_none())), ("flatten", flag(p.flatten))];
                let operands: Vec<&Entry> = [data, weight].into_iter().chain(head_bias.as_ref()).collect();
                let term = d.op("FullyConnected", &attrs, &operands)?;
                total = Some(match total {
                    Some(sum) => d.binary("elemwise_add", &sum, &term)?,
                    None => term,
                });
            }
            match bias {
                Some(hb) => {
                    let zeros = d.unary("zeros_like", &g)?;
                    Some(d.binary("broadcast_add", &zeros, &hb)?)
                }
                None => total,
            }
        } else {
            None
        };

        let data_grad = match &hw {
            Some(hw) if d.input_needed(1) => {
                // dot keeps g's leading axes: x's own shape without flattening, (batch, features)
                // with it.
                let product = d.op("dot", &[], &[&g, hw])?;
                let already_shaped = !p.flatten || d.shape_of(&x).is_some_and(|s| s.ndim() == 2);
                Some(if already_shaped { product } else { d.binary("reshape_like", &product, &x)? })
            }
            _ => None,
        };

        let weight_grad = match &hx {
            Some(hx) if d.input_needed(2) => {
                let (g2, hx2) = if p.flatten {
                    (g.clone(), d.unary("Flatten", hx)?)
                } else {
                    let rows = [("shape", "(-1, 0)".to_string()), ("reverse", "True".to_string())];
                    (d.op("Reshape", &rows, &[&g])?, d.op("Reshape", &rows, &[hx])?)
                };
                Some(d.op("dot", &[("transpose_a", "True".to_string())], &[&g2, &hx2])?)
            }
            _ => None,
        };
        Ok(vec![out_grad_grad, data_grad, weight_grad])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("_backward_FullyConnected", &[], "Gradients of FullyConnected for data, weight and bias.", |p: FullyConnectedBackwardParams| {
        let forward = FullyConnected { p: FullyConnectedParams { num_hidden: p.num_hidden, no_bias: p.no_bias, flatten: p.flatten } };
        Ok(FullyConnectedBackward { forward, data_grad: p.data_grad })
    }));
    add(OpDef::new(
        "FullyConnected",
        &[],
        "Applies a linear transformation: out = data . weight^T + bias (data flattened to 2-D unless flatten=False).",
        |p: FullyConnectedParams| {
            if p.num_hidden == 0 {
                crate::bail!(Param, "FullyConnected: num_hidden must be at least 1, got 0");
            }
            Ok(FullyConnected { p })
        },
    ));
    add(OpDef::new(
        "dot",
        &[],
        "Dot product of two arrays. 1-D x 1-D is the inner product; N-D operands are flattened to matrices \
         (all but the last axis of lhs, all but the first axis of rhs), honouring transpose_a/transpose_b.",
        |p: DotParams| {
            check_dense(&p)?;
            Ok(Dot { p })
        },
    ));
    add(OpDef::new("batch_dot", &[], "Batchwise dot product of two 3-D arrays: out[i] = dot(lhs[i], rhs[i]).", |p: DotParams| {
        check_dense(&p)?;
        Ok(BatchDot { p })
    }));
}

#[cfg(test)]
mod tests {
    use super::{matmul_into, transpose_f32, Mat};
    use crate::base::DType;
    use half::bf16;

    #[test]
    fn bfloat16_products_match_the_definition() {
        // a (m x k) times b (read transposed from its stored n x k), written and then
        // accumulated onto: every value is on the bfloat16 grid, so only the final rounding of
        // each result to bfloat16 differs from the exact sums. The shapes reach each kernel the
        // CPU has: rows dotted in place (a FullyConnected layer at batch 1 and 3, a long k), AMX
        // with the weight's rows in place (a staged k tail, a partial row tile), the blocked
        // AVX512-BF16 kernel without AMX, and the widening path elsewhere.
        for (m, k, n) in [(40, 30, 20), (1, 700, 37), (3, 300, 50), (37, 300, 3), (40, 600, 70), (5, 600, 300)] {
            let value = |i: usize| bf16::from_f32(((i * 7919 % 61) as f32 - 30.0) / 16.0);
            let a: Vec<bf16> = (0..m * k).map(value).collect();
            let b_stored: Vec<bf16> = (0..n * k).map(|i| value(i + 5)).collect();
            let exact = |i: usize, j: usize| (0..k).map(|p| a[i * k + p].to_f64() * b_stored[j * k + p].to_f64()).sum::<f64>();
            let mut dst = vec![bf16::ZERO; m * n];
            for (accumulate, times) in [(false, 1.0), (true, 2.0)] {
                // SAFETY: a is m x k, b_stored is n x k read as its k x n transpose, dst is m x n.
                unsafe {
                    let (a_ptr, b_ptr) = (a.as_ptr() as *const u8, b_stored.as_ptr() as *const u8);
                    let (am, bm) = (Mat::stored(m, k, false), Mat::stored(n, k, true));
                    matmul_into(DType::BF16, dst.as_mut_ptr() as *mut u8, accumulate, a_ptr, am, b_ptr, bm, 2);
                }
                for i in 0..m {
                    for j in 0..n {
                        let expected = times * exact(i, j);
                        let got = dst[i * n + j].to_f64();
                        assert!((got - expected).abs() <= expected.abs() / 64.0 + 1e-6, "{m}x{k}x{n} ({i}, {j}): {got} vs {expected}");
                    }
                }
            }
        }
    }

    #[test]
    fn transpose_matches_the_definition_on_tiles_and_edges() {
        for (rows, cols) in [(1, 1), (8, 8), (16, 24), (13, 29), (64, 7), (3, 100)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let mut dst = vec![-1f32; rows * cols];
            transpose_f32(&src, rows, cols, &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[c * rows + r], src[r * cols + c], "{rows}x{cols} at ({r}, {c})");
                }
            }
        }
    }
}
