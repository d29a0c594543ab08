//! `C (+)= A * B^T` for operands that both run along k (A is m x k, B is n x k, both
//! row-major) and a small product: every C element is a dot product of two contiguous rows.
//!
//! A convolution's weight gradient has exactly this form (filters x column rows, summed over
//! thousands of output positions), and a general GEMM spends most of its time there packing the
//! long operands, which it gains nothing from: on the project machine the gemm crate reaches
//! 40-80 GFLOP/s on 20x9216x25 and 50x512x500. Here 4x6 blocks of rows are multiplied straight
//! from memory in 24 AVX-512 accumulators, k in slices that keep the rows in cache.
//!
//! A FullyConnected layer at a small batch has the same form and is bound by streaming its
//! weight once, so bfloat16 rows (half the bytes) are read in place too, pairs of them
//! multiplied into float32 sums by `vdpbf16ps`: packing the weight for the blocked bfloat16
//! kernels cost more than the product itself (batch 1 ran at 0.31x the float32 layer).

use crate::op::SendPtr;
use half::bf16;

/// Rows of A and of B per register block: 24 accumulators, four A vectors and one B vector
/// fill 29 of the 32 vector registers.
const BLOCK_A: usize = 4;
const BLOCK_B: usize = 6;

/// An element type whose rows this kernel multiplies: float32 and bfloat16.
pub(crate) trait RowElem: Copy + Send + Sync + 'static {
    /// k elements per slice. float32: four A rows of a slice (16 KB) stay in L1 while B rows
    /// stream from L2. bfloat16 sums whole rows in registers: its C cannot hold float32
    /// partial sums between slices, and the few rows it takes fit in L2.
    const K_SLICE: usize;
    /// Whether this CPU runs the kernel for this type.
    fn available() -> bool;
    /// Whether a product of this size is better served here than by the blocked GEMM.
    fn suits(m: usize, n: usize, k: usize) -> bool;
    /// One register block; see [`block_f32`].
    ///
    /// # Safety
    /// As [`block_f32`], with [`RowElem::available`] true.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const MA: usize>(
        a: *const Self,
        lda: usize,
        mr: usize,
        b: *const Self,
        ldb: usize,
        nr: usize,
        kc: usize,
        c: *mut Self,
        ldc: usize,
        add: bool,
    );
}

#[cfg(target_arch = "x86_64")]
impl RowElem for f32 {
    const K_SLICE: usize = 1024;
    fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    /// Few outputs against a long k (measured on the shapes of convolution weight gradients),
    /// or one operand of at most 32 rows: a FullyConnected layer at a small batch, bound by
    /// streaming its weight, which the blocked kernel packs on every call (Intel Xeon host, 2
    /// threads, 4096x1024 and 8192x2048 weights: batch 24-32 at 101-165 GFLOP/s here against
    /// 71-113 blocked; level on a 1024x1024 weight).
    fn suits(m: usize, n: usize, k: usize) -> bool {
        k >= 256 && ((m * n <= 32 * 1024 && m.min(n) <= 64) || m.min(n) <= 32)
    }
    unsafe fn block<const MA: usize>(
        a: *const f32,
        lda: usize,
        mr: usize,
        b: *const f32,
        ldb: usize,
        nr: usize,
        kc: usize,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        // SAFETY: the caller's contract, which is this function's.
        unsafe { block_f32::<MA>(a, lda, mr, b, ldb, nr, kc, c, ldc, add) }
    }
}

#[cfg(target_arch = "x86_64")]
impl RowElem for bf16 {
    const K_SLICE: usize = usize::MAX;
    fn available() -> bool {
        super::packed_gemm::bf16_available()
    }
    /// Where the CPU has AMX: at most 3 rows. Here the products run at about the float32
    /// kernel's rate (100 GFLOP/s on 2 threads of the Intel Xeon host) on half the bytes; AMX
    /// with the weight's rows read in place (`amx::weight_rows_product`) computes a block of 32
    /// columns whatever the batch, so it overtakes from about 4 rows (at 12 it ran 264-406
    /// GFLOP/s). Without AMX the blocked bfloat16 kernel multiplies at the float32 kernel's
    /// rate, so the float32 rule applies.
    fn suits(m: usize, n: usize, k: usize) -> bool {
        if !super::amx::available() {
            return f32::suits(m, n, k);
        }
        k >= 256 && m.min(n) <= 3
    }
    unsafe fn block<const MA: usize>(
        a: *const bf16,
        lda: usize,
        mr: usize,
        b: *const bf16,
        ldb: usize,
        nr: usize,
        kc: usize,
        c: *mut bf16,
        ldc: usize,
        add: bool,
    ) {
        // SAFETY: the caller's contract, which is this function's.
        unsafe { block_bf16::<MA>(a, lda, mr, b, ldb, nr, kc, c, ldc, add) }
    }
}

/// `c (m x n, row stride ldc) (+)= a (m x k, row stride lda) * b (n x k, row stride ldb)^T`,
/// using up to `threads` threads.
///
/// # Safety
/// The pointers cover the stated matrices, `c` overlaps neither input, and
/// [`RowElem::available`] is true for `E`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn row_dots<E: RowElem>(
    m: usize,
    n: usize,
    k: usize,
    a: *const E,
    lda: usize,
    b: *const E,
    ldb: usize,
    c: *mut E,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    let (a, b, c) = (SendPtr(a as *mut E), SendPtr(b as *mut E), SendPtr(c));
    let threads = threads.clamp(1, crate::engine::parallel::threads().max(1));
    // The larger operand streams through once, split into one band of rows per task; the
    // smaller one stays in cache and every task reads all of it. Splitting the smaller one
    // instead made each task stream all of the larger (a FullyConnected layer at batch 8 read
    // its 64 MB weight twice: 3.7 ms against 1.8 at batch 1).
    let b_streams = n >= m;
    let (outer_len, outer_block) = if b_streams { (n, BLOCK_B) } else { (m, BLOCK_A) };
    let outer_blocks = outer_len.div_ceil(outer_block);
    let bands = threads.min(outer_blocks);
    let per_band = outer_blocks.div_ceil(bands) * outer_block;
    crate::engine::parallel::run(bands, &|band| {
        for o0 in (band * per_band..((band + 1) * per_band).min(outer_len)).step_by(outer_block) {
            for k0 in (0..k.max(1)).step_by(E::K_SLICE) {
                let kc = E::K_SLICE.min(k - k0);
                let add = accumulate || k0 > 0;
                let inner = if b_streams { (0..m).step_by(BLOCK_A) } else { (0..n).step_by(BLOCK_B) };
                for q0 in inner {
                    let (i0, j0) = if b_streams { (q0, o0) } else { (o0, q0) };
                    // SAFETY: rows i0.., j0.. and k0..k0+kc lie inside the operands; bands are
                    // whole blocks, so this task alone writes C's rows (or columns) of its band;
                    // the caller checked `E::available`.
                    unsafe {
                        let (a, mr) = (a.get().add(i0 * lda + k0), (m - i0).min(BLOCK_A));
                        let (b, nr) = (b.get().add(j0 * ldb + k0), (n - j0).min(BLOCK_B));
                        let c = c.get().add(i0 * ldc + j0);
                        match mr {
                            1 => E::block::<1>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                            2 => E::block::<2>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                            _ => E::block::<BLOCK_A>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                        }
                    };
                }
            }
        }
    });
}

/// The body of one register block: up to `MA` (<= 4) rows of A against up to 6 rows of B
/// over `kc` elements, `$step` elements of each row per vector. Short blocks repeat their last
/// row (its results are not stored), so every block runs the same code. One- and two-row
/// blocks have kernels of their own: at batch 1 the four-row kernel spent three quarters of
/// its multiply-adds on repeated rows and could not keep up with memory. `$load(row, p, left)`
/// reads a vector of a row from element p, `left` elements remaining (masked-off lanes load as
/// zero); `$madd(sum, a, b)` adds the lanes' products; `$finish(out, sum, add)` writes a C
/// element, adding to it where `add`.
macro_rules! row_block {
    ($a:ident, $lda:ident, $mr:ident, $b:ident, $ldb:ident, $nr:ident, $kc:ident, $c:ident, $ldc:ident, $add:ident,
     $step:expr, $load:expr, $madd:expr, $finish:expr) => {{
        // The 24 accumulators do not all stay in registers. A 64-byte-aligned local makes the
        // compiler realign this frame, so the spilled accumulators never straddle cache lines
        // (unaligned, a caller's stack depth could cost a quarter of the kernel's speed).
        #[repr(align(64))]
        #[allow(dead_code)] // only its alignment matters
        struct CacheLine([u8; 64]);
        std::hint::black_box(&mut CacheLine([0; 64]));
        let a_rows: [_; MA] = std::array::from_fn(|i| $a.add(i.min($mr - 1) * $lda));
        let b_rows: [_; BLOCK_B] = std::array::from_fn(|j| $b.add(j.min($nr - 1) * $ldb));
        let mut acc = [[_mm512_setzero_ps(); MA]; BLOCK_B];
        let mut p = 0;
        while p < $kc {
            let left = $kc - p;
            let mut av = [_mm512_setzero_ps(); MA];
            for (vector, &row) in av.iter_mut().zip(&a_rows) {
                *vector = $load(row, p, left);
            }
            for (&row, acc_row) in b_rows.iter().zip(acc.iter_mut()) {
                // The first block of a band reads its B rows from memory: ask for them a
                // kilobyte ahead (six streams per core outrun the hardware prefetcher).
                _mm_prefetch::<_MM_HINT_T0>((row.wrapping_add(p) as *const i8).wrapping_add(1024));
                let bv = $load(row, p, left);
                for (sum, &a_vec) in acc_row.iter_mut().zip(&av) {
                    *sum = $madd(*sum, a_vec, bv);
                }
            }
            p += $step;
        }
        for (j, acc_row) in acc.iter().enumerate().take($nr) {
            for (i, &sum) in acc_row.iter().enumerate().take($mr) {
                $finish($c.add(i * $ldc + j), _mm512_reduce_add_ps(sum), $add);
            }
        }
    }};
}

/// One float32 block (see [`row_block`]).
///
/// # Safety
/// `1 <= mr <= MA` and `1 <= nr <= 6`; `a` holds `mr` rows of `kc` elements `lda` apart, `b`
/// holds `nr` rows of `kc` elements `ldb` apart, `c` an `mr x nr` block of rows `ldc` apart that
/// overlaps neither and that nothing else reads or writes meanwhile; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_f32<const MA: usize>(
    a: *const f32,
    lda: usize,
    mr: usize,
    b: *const f32,
    ldb: usize,
    nr: usize,
    kc: usize,
    c: *mut f32,
    ldc: usize,
    add: bool,
) {
    use std::arch::x86_64::*;
    row_block!(a, lda, mr, b, ldb, nr, kc, c, ldc, add, 16, load_f32, madd_f32, finish_f32);
}

/// One bfloat16 block (see [`row_block`]): 32 elements per vector, adjacent pairs multiplied
/// and added into float32 lanes by `vdpbf16ps`; each sum is rounded to bfloat16 once (to
/// nearest even), after adding C's value where `add`, as the blocked bfloat16 kernels do.
///
/// # Safety
/// As [`block_f32`], with AVX512-BF16 and AVX512-BW present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_bf16<const MA: usize>(
    a: *const bf16,
    lda: usize,
    mr: usize,
    b: *const bf16,
    ldb: usize,
    nr: usize,
    kc: usize,
    c: *mut bf16,
    ldc: usize,
    add: bool,
) {
    use std::arch::x86_64::*;
    row_block!(a, lda, mr, b, ldb, nr, kc, c, ldc, add, 32, load_bf16, madd_bf16, finish_bf16);
}

/// A float32 row's vector from element `p`, `left` elements remaining (the rest load as zero).
///
/// # Safety
/// The row holds `p + min(left, 16)` elements; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_f32(row: *const f32, p: usize, left: usize) -> std::arch::x86_64::__m512 {
    let mask = if left >= 16 { u16::MAX } else { (1u32 << left) as u16 - 1 };
    std::arch::x86_64::_mm512_maskz_loadu_ps(mask, row.add(p))
}

/// `sum + x * y`, lane by lane.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn madd_f32(sum: std::arch::x86_64::__m512, x: std::arch::x86_64::__m512, y: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    std::arch::x86_64::_mm512_fmadd_ps(x, y, sum)
}

/// # Safety
/// `out` is a C element that only this call reaches.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn finish_f32(out: *mut f32, sum: f32, add: bool) {
    *out = if add { *out + sum } else { sum };
}

/// A bfloat16 row's 32 elements from `p`, `left` remaining (the rest load as zero), as the
/// float32 vector holding their bits.
///
/// # Safety
/// The row holds `p + min(left, 32)` elements; the CPU has AVX512-BW.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_bf16(row: *const bf16, p: usize, left: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let mask = if left >= 32 { u32::MAX } else { (1u64 << left) as u32 - 1 };
    _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, row.add(p) as *const i16))
}

/// `sum` plus the products of the bfloat16 pairs held in `x`'s and `y`'s bits.
///
/// # Safety
/// The CPU has AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn madd_bf16(sum: std::arch::x86_64::__m512, x: std::arch::x86_64::__m512, y: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY (both transmutes): __m512 and __m512bh are the same 64 bytes; the bits pass
    // through unchanged into the instruction that reads them as bfloat16 pairs.
    unsafe { _mm512_dpbf16_ps(sum, std::mem::transmute::<__m512, __m512bh>(x), std::mem::transmute::<__m512, __m512bh>(y)) }
}

/// # Safety
/// `out` is a C element that only this call reaches.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn finish_bf16(out: *mut bf16, sum: f32, add: bool) {
    *out = bf16::from_f32(if add { (*out).to_f32() + sum } else { sum });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * b[j * k + p] as f64).sum();
            }
        }
        c
    }

    /// Both element types against a float64 reference on ragged shapes, 1-4 threads, with and
    /// without adding to C. The operands are small multiples of powers of two, exact in
    /// bfloat16, so the products' sums are exact in float32 and only the final rounding to
    /// `E` (relative error `tolerance`) separates a result from the reference.
    fn check<E: RowElem>(narrow: fn(f32) -> E, widen: fn(E) -> f64, tolerance: f64) {
        if !E::available() {
            eprintln!("skipped: this CPU lacks the kernel's features");
            return;
        }
        for &(m, n, k, threads) in
            &[(1, 1, 1, 1), (5, 7, 17, 1), (20, 25, 2500, 2), (9, 3, 1031, 3), (4, 4, 16, 1), (1, 50, 300, 2), (2, 13, 2100, 4), (3, 8, 33, 2)]
        {
            let a: Vec<f32> = (0..m * k).map(|v| ((v * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let b: Vec<f32> = (0..n * k).map(|v| ((v * 5 % 11) as f32 - 5.0) / 4.0).collect();
            let expected = reference(m, n, k, &a, &b);
            let (a, b): (Vec<E>, Vec<E>) = (a.into_iter().map(narrow).collect(), b.into_iter().map(narrow).collect());
            for accumulate in [false, true] {
                let mut c = vec![narrow(1.0); m * n];
                // SAFETY: the buffers have the stated shapes and the CPU has the kernel's features.
                unsafe { row_dots(m, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), n, accumulate, threads) };
                for (got, want) in c.iter().zip(&expected) {
                    let (got, want) = (widen(*got), want + if accumulate { 1.0 } else { 0.0 });
                    assert!((got - want).abs() <= tolerance * want.abs().max(1.0), "{m}x{n}x{k}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn float32_matches_the_reference_on_ragged_shapes() {
        check::<f32>(|v| v, |v| v as f64, 1e-6);
    }

    #[test]
    fn bfloat16_matches_the_reference_on_ragged_shapes() {
        check::<bf16>(bf16::from_f32, |v| v.to_f64(), 1.0 / 256.0);
    }
}
