//! Float32 GEMM for AVX-512 CPUs: `C (+)= A * B` with any strides on A and B.
//!
//! The `gemm` crate serves the other dtypes and CPUs. This kernel exists for the operand layouts
//! it handles slowly: FullyConnected multiplies by the transposed weight (`x * W^T`), and the
//! crate packs an operand read across its rows by gathering one element at a time (on Zen 5,
//! 256x1024x1024 ran at 341 GFLOP/s with the weight transposed into scratch first and 438 on a
//! plain operand; a 32x2048x8192 product at 106 against 252). Here both operands are always
//! packed, in the standard blocked scheme: k in slices of `KC`, B in blocks of `NC` columns, A in
//! blocks of `MC` rows that stay in L2 while one B panel of `NR` columns stays in L1, and a 12x32
//! register block of C per micro-kernel call. Packing transposes 16x16 blocks in registers, so
//! a transposed operand costs about what a plain one does.
//!
//! On plain operands the crate stays ahead (it reads them in place, packing nothing): measured
//! on Zen 5, one thread, 1024^3 223 against 247 GFLOP/s, so only products with a transposed B
//! come here (see `linalg::matmul_into`).

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::SendPtr;

/// Rows of C per register block: 12 rows x 2 vectors = 24 accumulators, two B vectors and a
/// broadcast A element fill 27 of the 32 vector registers.
const MR: usize = 12;
/// 16-lane vectors per register block row.
const V: usize = 2;
/// Columns of C per register block.
const NR: usize = 16 * V;
/// k per slice: one packed B panel (KC x NR, 32 KB) stays in L1 while A panels stream past it.
const KC: usize = 256;
/// Rows of A per packed block: 288 x 256 floats (288 KB) stay in L2 for every B panel.
const MC: usize = 24 * MR;
/// Columns of B per packed block (KC x NC floats, 2 MB, in L3): A is packed once per block, so
/// square products up to 2048 pack it once (blocks of 512 packed a 2048^3 product's A four times,
/// 14% of its time).
const NC: usize = 2048;

/// A float32 matrix read through its row and column strides (in elements).
#[derive(Clone, Copy)]
pub(super) struct Operand {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

impl Operand {
    /// The address of element (r, c).
    ///
    /// # Safety
    /// (r, c) addresses an element inside the operand's allocation.
    unsafe fn at(&self, r: usize, c: usize) -> *const f32 {
        self.ptr.offset(r as isize * self.rs + c as isize * self.cs)
    }

    /// The operand starting at element (r, c).
    ///
    /// # Safety
    /// As [`Operand::at`].
    unsafe fn from(&self, r: usize, c: usize) -> Operand {
        Operand { ptr: self.at(r, c), ..*self }
    }
}

// SAFETY: an Operand only reads, and the op that owns the matrix keeps it alive and unwritten
// for the whole product, so bands on other threads may read it at once.
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}

/// Whether this CPU runs the kernel (it needs AVX-512F).
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Products below this many multiply-adds run on one thread: splitting costs more than it saves.
const PARALLEL_FLOPS: usize = 64 * 64 * 64;

/// `c (m x n, row stride ldc) (+)= a (m x k) * b (k x n)`, adding to c when `accumulate`, on up
/// to `threads` threads in bands of C columns (or rows).
///
/// # Safety
/// The operands address m x k and k x n elements inside their allocations, `c` holds the m x n
/// product with row stride ldc and overlaps neither operand, and [`available`] is true.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn sgemm(m: usize, n: usize, k: usize, a: Operand, b: Operand, c: *mut f32, ldc: usize, accumulate: bool, threads: usize) {
    if m == 0 || n == 0 {
        return;
    }
    let parts = if m * n * k < PARALLEL_FLOPS { 1 } else { threads.clamp(1, crate::engine::parallel::threads().max(1)) };
    // Every band packs all of the operand that is not split: split B's columns (each band then
    // packs all of A) when A is the smaller one, as in FullyConnected, and the bands stay whole
    // panels wide.
    let by_columns = (m <= n && n >= NR * parts) || m < MR * parts;
    let (len, unit) = if by_columns { (n, NR) } else { (m, MR) };
    let width = len.div_ceil(parts).div_ceil(unit) * unit;
    let c = SendPtr(c);
    crate::engine::parallel::run(len.div_ceil(width), &|band| {
        let (start, end) = (band * width, ((band + 1) * width).min(len));
        // SAFETY: the band's columns (or rows) lie inside b (or a) and c; each band writes only
        // its own part of c.
        unsafe {
            if by_columns {
                serial(m, end - start, k, a, b.from(0, start), c.get().add(start), ldc, accumulate);
            } else {
                serial(end - start, n, k, a.from(start, 0), b, c.get().add(start * ldc), ldc, accumulate);
            }
        }
    });
}

/// The float32 multiply-add throughput of `threads` cores at once in GFLOP/s: the micro-kernel
/// run on cached panels for about 0.1 s on each thread together, so the figure is the clock the
/// cores hold under this load, not a nominal one; the best of three runs, as a shared machine
/// may lend a run fewer cycles. The ceiling that GEMM benchmarks quote their
/// figures against. None without AVX-512.
pub fn peak_gflops(threads: usize) -> Option<f64> {
    if !available() {
        return None;
    }
    let threads = threads.clamp(1, crate::engine::parallel::threads().max(1));
    // SAFETY: the CPU feature was checked above.
    let run = || crate::engine::parallel::map(threads, |_| unsafe { kernel_rate(std::time::Duration::from_millis(100)) }).iter().sum::<f64>();
    Some((0..3).map(|_| run()).fold(0.0, f64::max))
}

/// GFLOP/s of the MR x NR kernel over KC on one thread, run for `duration`.
///
/// # Safety
/// [`available`] is true.
#[target_feature(enable = "avx512f")]
unsafe fn kernel_rate(duration: std::time::Duration) -> f64 {
    let mut buffers = PackBuffers::default();
    let (a, b) = (buffers.a.floats(KC * MR).as_ptr(), buffers.b.floats(KC * NR).as_ptr());
    let mut c = [0f32; MR * NR];
    let start = std::time::Instant::now();
    let mut calls = 0usize;
    while start.elapsed() < duration {
        for _ in 0..64 {
            // SAFETY: the panels hold KC x MR and KC x NR floats, c holds the MR x NR tile.
            unsafe { kernel::<MR>(KC, a, b, c.as_mut_ptr(), NR, MR, column_masks(NR), false) };
        }
        calls += 64;
    }
    std::hint::black_box(&c);
    (2 * KC * MR * NR * calls) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The packing buffers of one thread: an A block (MC x KC) and a B panel (KC x NR).
#[derive(Default)]
struct PackBuffers {
    a: AlignedBuffer,
    b: AlignedBuffer,
}

/// One cache line of floats: a buffer of these starts on a line boundary, so the kernel's vector
/// loads from a packed panel never straddle two lines (that cost a tenth of the speed).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([f32; 16]);

/// A growable float buffer that starts on a cache line.
#[derive(Default)]
struct AlignedBuffer(Vec<CacheLine>);

impl AlignedBuffer {
    /// The first `len` floats, growing the buffer if it is shorter.
    fn floats(&mut self, len: usize) -> &mut [f32] {
        let lines = len.div_ceil(16);
        if self.0.len() < lines {
            self.0.resize(lines, CacheLine([0.0; 16]));
        }
        // SAFETY: the vector holds at least `lines` lines of 16 floats, contiguous (repr(C), no
        // padding: 64 bytes of floats with 64-byte alignment).
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut f32, len) }
    }
}

thread_local! {
    /// Kept per thread across products: packing writes every element it reads back, so the
    /// buffers never need clearing, and allocating 300 KB per product would cost page faults.
    static PACK_BUFFERS: RefCell<PackBuffers> = RefCell::new(PackBuffers::default());
}

/// [`sgemm`] on the calling thread.
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn serial(m: usize, n: usize, k: usize, a: Operand, b: Operand, c: *mut f32, ldc: usize, accumulate: bool) {
    PACK_BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        // SAFETY: forwarded from the caller.
        Ok(mut buffers) => unsafe { blocked(m, n, k, a, b, c, ldc, accumulate, &mut buffers) },
        // Only if a product ever ran inside another on this thread: use buffers of its own.
        // SAFETY: forwarded from the caller.
        Err(_) => unsafe { blocked(m, n, k, a, b, c, ldc, accumulate, &mut PackBuffers::default()) },
    })
}

/// The blocked loops: B blocks packed once per k slice, A blocks once per B block, a register
/// block of C per (A panel, B panel) pair, A panels innermost so that one B panel stays in L1.
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn blocked(m: usize, n: usize, k: usize, a: Operand, b: Operand, c: *mut f32, ldc: usize, accumulate: bool, buffers: &mut PackBuffers) {
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of c holds n elements.
                unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
            }
        }
        return;
    }
    let packed_a = buffers.a.floats(MC.min(m.div_ceil(MR) * MR) * KC.min(k));
    let packed_b = buffers.b.floats(KC.min(k) * NC.min(n.div_ceil(NR) * NR));
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            let add = accumulate || p0 > 0;
            for q0 in (0..nc).step_by(NR) {
                // SAFETY: rows p0..p0+kc and columns j0+q0.. of the block lie inside b.
                unsafe { pack_b(b.from(p0, j0 + q0), kc, NR.min(nc - q0), &mut packed_b[q0 * kc..]) };
            }
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                // SAFETY: rows i0..i0+mc and columns p0..p0+kc lie inside a.
                unsafe { pack_a(a.from(i0, p0), mc, kc, packed_a) };
                for q0 in (0..nc).step_by(NR) {
                    let masks = column_masks(NR.min(nc - q0));
                    let panel_b = packed_b[q0 * kc..].as_ptr();
                    for r0 in (0..mc).step_by(MR) {
                        let rows = MR.min(mc - r0);
                        let panel = packed_a[r0 * kc..].as_ptr();
                        // SAFETY: the packed panels hold MR x kc and kc x NR elements (zero
                        // past the block's rows and columns); C's block at (i0 + r0, j0 + q0)
                        // has `rows` rows, as wide as `masks` allow, inside c.
                        unsafe {
                            let tile = c.add((i0 + r0) * ldc + j0 + q0);
                            match rows {
                                1 => kernel::<1>(kc, panel, panel_b, tile, ldc, rows, masks, add),
                                2 => kernel::<2>(kc, panel, panel_b, tile, ldc, rows, masks, add),
                                3 | 4 => kernel::<4>(kc, panel, panel_b, tile, ldc, rows, masks, add),
                                5..=8 => kernel::<8>(kc, panel, panel_b, tile, ldc, rows, masks, add),
                                _ => kernel::<MR>(kc, panel, panel_b, tile, ldc, rows, masks, add),
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Lane masks of the two vectors of a register block `columns` (<= NR) wide.
fn column_masks(columns: usize) -> [__mmask16; V] {
    let mask = |lanes: usize| if lanes >= 16 { 0xffff } else { ((1u32 << lanes) - 1) as __mmask16 };
    std::array::from_fn(|h| mask(columns.saturating_sub(16 * h)))
}

/// Packs `rows` x `kc` of `a` into panels of MR rows, element (r, p) of a panel at `p * MR + r`;
/// rows past the end of the block are zeros.
///
/// # Safety
/// `a` addresses rows x kc elements.
#[target_feature(enable = "avx512f")]
unsafe fn pack_a(a: Operand, rows: usize, kc: usize, out: &mut [f32]) {
    for r0 in (0..rows).step_by(MR) {
        let panel = &mut out[r0 * kc..(r0 + MR) * kc];
        let valid = MR.min(rows - r0);
        if a.cs == 1 {
            // Rows run along k: transpose them in registers.
            let mut starts = [std::ptr::null(); MR];
            for (r, start) in starts.iter_mut().enumerate().take(valid) {
                // SAFETY: row r0 + r is inside the block.
                *start = unsafe { a.at(r0 + r, 0) };
            }
            // SAFETY: each of the `valid` rows holds kc elements; the panel holds kc x MR.
            unsafe { interleave(&starts[..valid], MR, kc, panel) };
        } else {
            for p in 0..kc {
                for r in 0..MR {
                    // SAFETY: (r0 + r, p) is inside the block for r < valid.
                    panel[p * MR + r] = if r < valid { unsafe { *a.at(r0 + r, p) } } else { 0.0 };
                }
            }
        }
    }
}

/// Packs `kc` x `columns` of `b` into one panel, element (p, j) at `p * NR + j`; columns past
/// the end are zeros.
///
/// # Safety
/// `b` addresses kc x columns elements.
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(b: Operand, kc: usize, columns: usize, out: &mut [f32]) {
    let out = &mut out[..kc * NR];
    if b.cs == 1 {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            // SAFETY: row p of the block holds `columns` elements from here.
            let src = unsafe { std::slice::from_raw_parts(b.at(p, 0), columns) };
            row[..columns].copy_from_slice(src);
            row[columns..].fill(0.0);
        }
    } else if b.rs == 1 {
        // Columns run along k (a transposed row-major matrix, as FullyConnected's weight):
        // transpose them in registers.
        let mut starts = [std::ptr::null(); NR];
        for (j, start) in starts.iter_mut().enumerate().take(columns) {
            // SAFETY: column j is inside the block.
            *start = unsafe { b.at(0, j) };
        }
        // SAFETY: each of the `columns` columns holds kc elements; the panel holds kc x NR.
        unsafe { interleave(&starts[..columns], NR, kc, out) };
    } else {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            for (j, slot) in row.iter_mut().enumerate() {
                // SAFETY: (p, j) is inside the block for j < columns.
                *slot = if j < columns { unsafe { *b.at(p, j) } } else { 0.0 };
            }
        }
    }
}

/// `out[p * width + r] = lines[r][p]` for p < kc, zeros for `lines.len() <= r < width`: lines
/// that run along p become a panel that runs across them, 16 x 16 blocks at a time transposed in
/// registers (a scalar copy here cost up to 70% of a skinny product's time).
///
/// # Safety
/// Every line holds kc elements; `lines.len() <= width`; `out` holds kc x width.
#[target_feature(enable = "avx512f")]
unsafe fn interleave(lines: &[*const f32], width: usize, kc: usize, out: &mut [f32]) {
    assert!(lines.len() <= width && out.len() >= kc * width);
    for g in (0..width).step_by(16) {
        let lanes = 16.min(width - g);
        let store_mask: __mmask16 = ((1u32 << lanes) - 1) as __mmask16;
        let group = &lines[g.min(lines.len())..(g + 16).min(lines.len())];
        for p0 in (0..kc).step_by(16) {
            let depth = 16.min(kc - p0);
            let load_mask: __mmask16 = ((1u32 << depth) - 1) as __mmask16;
            let mut block = [_mm512_setzero_ps(); 16];
            for (vector, &line) in block.iter_mut().zip(group) {
                // SAFETY: the line holds kc elements; lanes past `depth` are masked off.
                *vector = unsafe { _mm512_maskz_loadu_ps(load_mask, line.add(p0)) };
                // Sixteen lines at once are more streams than the hardware prefetcher follows:
                // ask for each line's data eight cache lines ahead (a 32x8192x2048 product with
                // its B read from memory: 85 -> 102 GFLOP/s on one Zen 5 core).
                _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(p0 + 128) as *const i8);
            }
            transpose16(&mut block);
            for (q, vector) in block.iter().enumerate().take(depth) {
                // SAFETY: (p0 + q) * width + g + lanes <= kc * width, inside out (checked above).
                unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add((p0 + q) * width + g), store_mask, *vector) };
            }
        }
    }
}

/// Transposes the 16 x 16 matrix whose rows are the 16 vectors: afterwards vector j holds what
/// was column j. Three rounds of in-lane unpacks and 128-bit lane shuffles, 64 shuffles in all.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(v: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    // Pairs of rows interleaved by element, then by element pairs: afterwards vector 4i + j holds,
    // in each 128-bit lane L, rows 4i..4i+4 at column 4L + j.
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for i in 0..4 {
        let pd = |x: __m512| _mm512_castps_pd(x);
        let (t0, t1, t2, t3) = (pd(t[4 * i]), pd(t[4 * i + 1]), pd(t[4 * i + 2]), pd(t[4 * i + 3]));
        v[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        v[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        v[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        v[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    // 128-bit lanes: even lanes (0x88) and odd lanes (0xdd) of row groups 0-1 and 2-3, then of
    // those results, leave every column whole in one vector.
    for j in 0..4 {
        t[j] = _mm512_shuffle_f32x4::<0x88>(v[j], v[j + 4]);
        t[j + 4] = _mm512_shuffle_f32x4::<0xdd>(v[j], v[j + 4]);
        t[j + 8] = _mm512_shuffle_f32x4::<0x88>(v[j + 8], v[j + 12]);
        t[j + 12] = _mm512_shuffle_f32x4::<0xdd>(v[j + 8], v[j + 12]);
    }
    for j in 0..8 {
        v[j] = _mm512_shuffle_f32x4::<0x88>(t[j], t[j + 8]);
        v[j + 8] = _mm512_shuffle_f32x4::<0xdd>(t[j], t[j + 8]);
    }
}

/// One register block: `R` packed A rows (panel stride MR; rows past the block are zeros)
/// times a packed B panel over kc, stored to (or added to, when `add`) the first `rows` rows of
/// the C tile, masked to its columns. Alone on cached panels it runs at the core's peak (258
/// GFLOP/s on one Zen 5 core): 24 accumulators, two B loads and 12 broadcasts per k step.
///
/// # Safety
/// `a` holds kc x MR and `b` kc x NR packed elements; the tile has `rows` <= R rows of row stride
/// ldc, each as wide as `masks` allow.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const R: usize>(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, rows: usize, masks: [__mmask16; V], add: bool) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for p in 0..kc {
        let bv: [__m512; V] = std::array::from_fn(|h| _mm512_loadu_ps(b.add(p * NR + 16 * h)));
        for (i, row) in acc.iter_mut().enumerate() {
            let broadcast = _mm512_set1_ps(*a.add(p * MR + i));
            for (lane_block, &b_vector) in row.iter_mut().zip(&bv) {
                *lane_block = _mm512_fmadd_ps(broadcast, b_vector, *lane_block);
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(rows) {
        for (half, &mask) in masks.iter().enumerate() {
            let dst = c.add(i * ldc + 16 * half);
            let value = if add { _mm512_add_ps(row[half], _mm512_maskz_loadu_ps(mask, dst)) } else { row[half] };
            _mm512_mask_storeu_ps(dst, mask, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major (rows x cols) values stored as given (`transposed`: the storage is cols x rows).
    fn operand(values: &[f32], rows: usize, cols: usize, transposed: bool) -> Operand {
        let (rs, cs) = if transposed { (1, rows as isize) } else { (cols as isize, 1) };
        Operand { ptr: values.as_ptr(), rs, cs }
    }

    #[test]
    fn matches_a_float64_reference_on_ragged_shapes_and_layouts() {
        if !available() {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        let shapes = [(1, 1, 1), (1, 37, 300), (13, 33, 257), (29, 65, 5), (300, 70, 520), (50, 700, 40), (7, 2, 3), (3, 2100, 17)];
        for &(m, n, k) in &shapes {
            let a: Vec<f32> = (0..m * k).map(|v| ((v * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let b: Vec<f32> = (0..k * n).map(|v| ((v * 5 % 11) as f32 - 5.0) / 4.0).collect();
            for (ta, tb, threads) in [(false, false, 1), (false, true, 2), (true, false, 2), (true, true, 3)] {
                let (oa, ob) = (operand(&a, m, k, ta), operand(&b, k, n, tb));
                let read = |o: &Operand, r: usize, c: usize| unsafe { *o.at(r, c) } as f64;
                for accumulate in [false, true] {
                    let ldc = n + 3;
                    let mut c = vec![1f32; m * ldc];
                    // SAFETY: the operands address m x k and k x n elements of their vectors; c
                    // holds m rows of stride ldc.
                    unsafe { sgemm(m, n, k, oa, ob, c.as_mut_ptr(), ldc, accumulate, threads) };
                    for i in 0..m {
                        for j in 0..ldc {
                            let got = c[i * ldc + j] as f64;
                            let want = if j >= n {
                                1.0
                            } else {
                                (0..k).map(|p| read(&oa, i, p) * read(&ob, p, j)).sum::<f64>() + if accumulate { 1.0 } else { 0.0 }
                            };
                            assert!(
                                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                                "{m}x{n}x{k} ta={ta} tb={tb}: c[{i}][{j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
