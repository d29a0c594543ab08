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
/// against a long k (measured on the shapes of convolution weight gradients).
pub(super) fn suits(m: usize, n: usize, k: usize) -> bool {
    k >= 256 && m * n <= 32 * 1024 && m.min(n) <= 64
}

/// `c (m x n, row stride ldc) (+)= a (m x k, row stride lda) * b (n x k, row stride ldb)^T`,
/// using up to `threads` threads over blocks of A rows.
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
    let row_blocks = m.div_ceil(BLOCK_A);
    let per_task = if threads > 1 { row_blocks.div_ceil(threads) } else { row_blocks };
    super::parallel_chunks(row_blocks, per_task.max(1), |blocks| {
        let rows = blocks.start * BLOCK_A..(blocks.end * BLOCK_A).min(m);
        for k0 in (0..k.max(1)).step_by(K_SLICE) {
            let kc = K_SLICE.min(k - k0);
            let add = accumulate || k0 > 0;
            for i0 in rows.clone().step_by(BLOCK_A) {
                for j0 in (0..n).step_by(BLOCK_B) {
                    // SAFETY: rows i0.., j0.. and k0..k0+kc lie inside the operands; this task
                    // alone writes C rows `rows`.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        block(
                            a.get().add(i0 * lda + k0),
                            lda,
                            (m - i0).min(BLOCK_A),
                            b.get().add(j0 * ldb + k0),
                            ldb,
                            (n - j0).min(BLOCK_B),
                            kc,
                            c.get().add(i0 * ldc + j0),
                            ldc,
                            add,
                        )
                    };
                }
            }
        }
    });
}

/// One block: up to 4 rows of A against up to 6 rows of B over `kc` elements. Short blocks
/// repeat their last row (its results are not stored), so every block runs the same code.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block(a: *const f32, lda: usize, mr: usize, b: *const f32, ldb: usize, nr: usize, kc: usize, c: *mut f32, ldc: usize, add: bool) {
    use std::arch::x86_64::*;
    // The 24 accumulators do not all stay in registers. A 64-byte-aligned local makes the
    // compiler realign this frame, so the spilled accumulators never straddle cache lines
    // (unaligned, a caller's stack depth could cost a quarter of the kernel's speed).
    #[repr(align(64))]
    #[allow(dead_code)] // only its alignment matters
    struct CacheLine([u8; 64]);
    std::hint::black_box(&mut CacheLine([0; 64]));
    let a_rows: [*const f32; BLOCK_A] = std::array::from_fn(|i| a.add(i.min(mr - 1) * lda));
    let b_rows: [*const f32; BLOCK_B] = std::array::from_fn(|j| b.add(j.min(nr - 1) * ldb));
    let mut acc = [[_mm512_setzero_ps(); BLOCK_A]; BLOCK_B];
    let mut p = 0;
    while p < kc {
        // The tail reads only its valid lanes; masked-off lanes load as zero.
        let mask: __mmask16 = if kc - p >= 16 { 0xffff } else { (1u32 << (kc - p)) as u16 - 1 };
        let av: [__m512; BLOCK_A] = std::array::from_fn(|i| _mm512_maskz_loadu_ps(mask, a_rows[i].add(p)));
        for j in 0..BLOCK_B {
            let bv = _mm512_maskz_loadu_ps(mask, b_rows[j].add(p));
            for i in 0..BLOCK_A {
                acc[j][i] = _mm512_fmadd_ps(av[i], bv, acc[j][i]);
            }
        }
        p += 16;
    }
    for i in 0..mr {
        for j in 0..nr {
            let out = c.add(i * ldc + j);
            let sum = _mm512_reduce_add_ps(acc[j][i]);
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
        for &(m, n, k, threads) in &[(1, 1, 1, 1), (5, 7, 17, 1), (20, 25, 2500, 2), (9, 3, 1031, 3), (4, 4, 16, 1)] {
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
