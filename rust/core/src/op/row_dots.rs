//! `C (+)= A * B^T` for float32 operands that both run along k (A is m x k, B is n x k, both
//! row-major) and a small product: every C element is a dot product of two contiguous rows.
//!
//! A convolution's weight gradient has exactly this form (filters x column rows, summed over
//! thousands of output positions), and a general GEMM spends most of its time there packing the
//! long operands, which it gains nothing from: on the project machine the gemm crate reaches
//! 40-80 GFLOP/s on 20x9216x25 and 50x512x500. Here 4x6 blocks of rows are multiplied straight
//! from memory in 24 AVX-512 accumulators, k in slices that keep the rows in cache.

use super::SendPtr;

/// k elements per slice: four A rows of a slice (16 KB) stay in L1 while B rows stream from L2.
const K_SLICE: usize = 1024;
/// Rows of A and of B per register block: 24 accumulators, four A vectors and one B vector
/// fill 29 of the 32 vector registers.
const BLOCK_A: usize = 4;
const BLOCK_B: usize = 6;

/// Whether this CPU runs the kernel (it needs AVX-512F).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether a product of this size is better served here than by the blocked GEMM: few outputs
/// against a long k (measured on the shapes of convolution weight gradients), or one operand of
/// at most 16 rows (a FullyConnected layer at a small batch, bound by streaming its weight).
pub(super) fn suits(m: usize, n: usize, k: usize) -> bool {
    k >= 256 && ((m * n <= 32 * 1024 && m.min(n) <= 64) || m.min(n) <= 16)
}

/// `c (m x n, row stride ldc) (+)= a (m x k, row stride lda) * b (n x k, row stride ldb)^T`,
/// using up to `threads` threads.
///
/// # Safety
/// The pointers cover the stated matrices, `c` overlaps neither input, and [`available`] is true.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn row_dots(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    let (a, b, c) = (SendPtr(a as *mut f32), SendPtr(b as *mut f32), SendPtr(c));
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
            for k0 in (0..k.max(1)).step_by(K_SLICE) {
                let kc = K_SLICE.min(k - k0);
                let add = accumulate || k0 > 0;
                let inner = if b_streams { (0..m).step_by(BLOCK_A) } else { (0..n).step_by(BLOCK_B) };
                for q0 in inner {
                    let (i0, j0) = if b_streams { (q0, o0) } else { (o0, q0) };
                    // SAFETY: rows i0.., j0.. and k0..k0+kc lie inside the operands; bands are
                    // whole blocks, so this task alone writes C's rows (or columns) of its band.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        let (a, mr) = (a.get().add(i0 * lda + k0), (m - i0).min(BLOCK_A));
                        let (b, nr) = (b.get().add(j0 * ldb + k0), (n - j0).min(BLOCK_B));
                        let c = c.get().add(i0 * ldc + j0);
                        match mr {
                            1 => block::<1>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                            2 => block::<2>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                            _ => block::<BLOCK_A>(a, lda, mr, b, ldb, nr, kc, c, ldc, add),
                        }
                    };
                }
            }
        }
    });
}

/// One block: up to `MA` (<= 4) rows of A against up to 6 rows of B over `kc` elements. Short
/// blocks repeat their last row (its results are not stored), so every block runs the same code.
/// One- and two-row blocks have kernels of their own: at batch 1 the four-row kernel spent
/// three quarters of its multiply-adds on repeated rows and could not keep up with memory.
///
/// # Safety
/// `1 <= mr <= MA` and `1 <= nr <= 6`; `a` holds `mr` rows of `kc` elements `lda` apart, `b`
/// holds `nr` rows of `kc` elements `ldb` apart, `c` an `mr x nr` block of rows `ldc` apart that
/// overlaps neither and that nothing else reads or writes meanwhile; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
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
    use std::arch::x86_64::*;
    // The 24 accumulators do not all stay in registers. A 64-byte-aligned local makes the
    // compiler realign this frame, so the spilled accumulators never straddle cache lines
    // (unaligned, a caller's stack depth could cost a quarter of the kernel's speed).
    #[repr(align(64))]
    #[allow(dead_code)] // only its alignment matters
    struct CacheLine([u8; 64]);
    std::hint::black_box(&mut CacheLine([0; 64]));
    let a_rows: [*const f32; MA] = std::array::from_fn(|i| a.add(i.min(mr - 1) * lda));
    let b_rows: [*const f32; BLOCK_B] = std::array::from_fn(|j| b.add(j.min(nr - 1) * ldb));
    let mut acc = [[_mm512_setzero_ps(); MA]; BLOCK_B];
    let mut p = 0;
    while p < kc {
        // The tail reads only its valid lanes; masked-off lanes load as zero.
        let mask: __mmask16 = if kc - p >= 16 { 0xffff } else { (1u32 << (kc - p)) as u16 - 1 };
        let av: [__m512; MA] = a_rows.map(|row| _mm512_maskz_loadu_ps(mask, row.add(p)));
        for (&row, acc_row) in b_rows.iter().zip(acc.iter_mut()) {
            // The first block of a band reads its B rows from memory: ask for them a kilobyte
            // ahead (six streams per core outrun the hardware prefetcher).
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(p + 256) as *const i8);
            let bv = _mm512_maskz_loadu_ps(mask, row.add(p));
            for (sum, &a_vec) in acc_row.iter_mut().zip(&av) {
                *sum = _mm512_fmadd_ps(a_vec, bv, *sum);
            }
        }
        p += 16;
    }
    for (j, acc_row) in acc.iter().enumerate().take(nr) {
        for (i, &sum) in acc_row.iter().enumerate().take(mr) {
            let out = c.add(i * ldc + j);
            let sum = _mm512_reduce_add_ps(sum);
            *out = if add { *out + sum } else { sum };
        }
    }
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

    #[test]
    fn matches_the_reference_on_ragged_shapes() {
        if !available() {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        for &(m, n, k, threads) in
            &[(1, 1, 1, 1), (5, 7, 17, 1), (20, 25, 2500, 2), (9, 3, 1031, 3), (4, 4, 16, 1), (1, 50, 300, 2), (2, 13, 2100, 4)]
        {
            let a: Vec<f32> = (0..m * k).map(|v| ((v * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let b: Vec<f32> = (0..n * k).map(|v| ((v * 5 % 11) as f32 - 5.0) / 4.0).collect();
            let expected = reference(m, n, k, &a, &b);
            for accumulate in [false, true] {
                let mut c = vec![1f32; m * n];
                // SAFETY: the buffers have the stated shapes and the CPU has AVX-512F.
                unsafe { row_dots(m, n, k, a.as_ptr(), k, b.as_ptr(), k, c.as_mut_ptr(), n, accumulate, threads) };
                for (got, want) in c.iter().zip(&expected) {
                    let want = want + if accumulate { 1.0 } else { 0.0 };
                    assert!((*got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0), "{m}x{n}x{k}: {got} vs {want}");
                }
            }
        }
    }
}
