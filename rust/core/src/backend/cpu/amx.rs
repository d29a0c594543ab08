//! bfloat16 GEMM on Intel AMX tiles: the blocked loops of `packed_gemm` with a 32 x 32 block
//! of C per call held in four 16 x 16 float32 tiles, each k step of 32 two A tiles times two B
//! tiles (`tdpbf16ps`: a 16 x 16 x 32 product per instruction, 16 times the multiply-adds of
//! `vdpbf16ps`).
//!
//! B panels are `packed_gemm`'s bfloat16 panels as they are (a unit row holds two k neighbours
//! per column, the pairing `tdpbf16ps` reads), padded with zero rows to whole k steps. A panels
//! hold 32 rows step by step: the two A tiles of a k step are 2 KB of consecutive memory. Rust has no stable AMX intrinsics: the instructions are written as inline
//! assembly with fixed tile registers, which nothing else in the program uses.
//!
//! Linux hands the tile registers only to a process that asks for them (`arch_prctl`), once;
//! each thread loads the tile configuration before its products and releases it after them.
//! `OXNET_AMX=0` turns the kernel off (the AVX512-BF16 kernel then runs), for comparisons.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::op::SendPtr;

use super::packed_gemm::{pack_b_bf16, pair, store, transpose16, Begun, Operand, Precision, Tile, NR, V};

/// Rows of A per packed panel and per block of C: two tiles of 16.
pub(crate) const MR: usize = 32;
/// Units (k pairs) per k step: one tile row of 64 bytes.
const STEP: usize = 16;
/// Rows of a tile.
const TILE_ROWS: usize = 16;

/// Whether this CPU and OS run the AMX kernel: AMX-TILE and AMX-BF16, the AVX512-BF16 kernel's
/// features for packing and rounding, and the kernel's permission to use tile data. Asked once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let disabled = std::env::var("OXNET_AMX").is_ok_and(|v| v.trim() == "0");
        !disabled && super::packed_gemm::bf16_available() && cpu_has_amx_bf16() && tile_data_granted()
    })
}

/// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
fn cpu_has_amx_bf16() -> bool {
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is asked only where the CPU has it.
    #[allow(unused_unsafe)]
    let (max_leaf, features) = unsafe {
        let max_leaf = __cpuid(0).eax;
        (max_leaf, if max_leaf >= 7 { __cpuid_count(7, 0).edx } else { 0 })
    };
    max_leaf >= 7 && features & (1 << 22) != 0 && features & (1 << 24) != 0
}

/// Asks Linux for the tile data state for this process (`ARCH_REQ_XCOMP_PERM` for
/// `XFEATURE_XTILEDATA`); without it the first tile instruction ends the process.
#[cfg(target_os = "linux")]
fn tile_data_granted() -> bool {
    use std::ffi::c_long;
    extern "C" {
        fn syscall(number: c_long, ...) -> c_long;
    }
    const SYS_ARCH_PRCTL: c_long = 158;
    const ARCH_REQ_XCOMP_PERM: c_long = 0x1023;
    const XFEATURE_XTILEDATA: c_long = 18;
    // SAFETY: arch_prctl with this request only changes which state components the process may
    // use; it reads and writes no memory of ours.
    unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn tile_data_granted() -> bool {
    false
}

/// The tile configuration (palette 1): tiles 0-3 hold C (16 rows of 16 floats), 4-5 A (16 rows
/// of one k step), 6-7 B (16 unit rows of 16 columns); all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

// Indexing in a constant is checked when the crate builds: an index out of range fails the build.
#[allow(clippy::indexing_slicing)]
const CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut tile = 0;
    while tile < 8 {
        bytes[16 + 2 * tile] = 64;
        bytes[48 + tile] = TILE_ROWS as u8;
        tile += 1;
    }
    TileConfig(bytes)
};

thread_local! {
    /// How many products of this thread are between `begin` and `end`.
    static CONFIGURED_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// bfloat16 operands on AMX tiles.
pub(crate) struct AmxBf16;

impl Precision for AmxBf16 {
    type Elem = u16;
    const PER_UNIT: usize = 2;
    const MR: usize = MR;
    fn units(kc: usize) -> usize {
        kc.div_ceil(2).div_ceil(STEP) * STEP
    }
    unsafe fn begin() {
        // Only the outermost product of this thread configures (and its end releases): a product
        // nested in another must not release the tiles the outer one still uses.
        if CONFIGURED_DEPTH.replace(CONFIGURED_DEPTH.get() + 1) == 0 {
            // SAFETY: the CPU has AMX and the process may use tile data (`available`); the
            // configuration is 64 readable bytes.
            unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
        }
    }
    unsafe fn end() {
        let depth = CONFIGURED_DEPTH.get().saturating_sub(1);
        CONFIGURED_DEPTH.set(depth);
        if depth == 0 {
            // SAFETY: as in `begin`; releasing returns the tiles to their initial state.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }
    unsafe fn pack_a(a: Operand<u16>, rows: usize, kc: usize, out: &mut [f32]) {
        pack_a(a, rows, kc, out)
    }
    unsafe fn pack_b(b: Operand<u16>, kc: usize, columns: usize, out: &mut [f32]) {
        let filled = kc.div_ceil(2) * NR;
        // SAFETY: forwarded; the panel holds units(kc) >= kc.div_ceil(2) unit rows.
        unsafe { pack_b_bf16(b, kc, columns, out) };
        if let Some(padding) = out.get_mut(filled..Self::units(kc) * NR) {
            padding.fill(0.0);
        }
    }
    unsafe fn block(rows: usize, units: usize, a: *const f32, b: *const f32, tile: Tile) {
        block(rows, units, a, b, tile)
    }
}

/// Where unit (r, u) of an A panel lies: k steps one after the other, each 32 rows of 16 units
/// (2 KB), so that each tile a step loads is 1 KB of consecutive memory, read in order.
fn unit_index(r: usize, u: usize) -> usize {
    (u / STEP) * MR * STEP + r * STEP + u % STEP
}

/// Packs `rows` x `kc` of `a` into panels of MR rows laid out by [`unit_index`] (`units` =
/// `AmxBf16::units(kc)` per row); rows and k past the end of the block are zeros.
///
/// # Safety
/// `a` addresses rows x kc elements; `out` holds rows (rounded up to MR) x units; the CPU has
/// AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_a(a: Operand<u16>, rows: usize, kc: usize, out: &mut [f32]) {
    let units = AmxBf16::units(kc);
    if units == 0 {
        return;
    }
    for (r0, panel) in (0..rows).step_by(MR).zip(out.chunks_exact_mut(MR * units)) {
        let valid = MR.min(rows - r0);
        if a.cs == 1 {
            // Rows run along k: a unit is one 32-bit word of the row, so a row's part of a step
            // (32 elements) packs as a copy.
            for (step, block) in panel.chunks_exact_mut(MR * STEP).enumerate() {
                let (p0, depth) = (step * 2 * STEP, (2 * STEP).min(kc.saturating_sub(step * 2 * STEP)));
                for (r, line) in block.chunks_exact_mut(STEP).enumerate() {
                    // SAFETY: the line holds 16 floats, 32 halves.
                    let halves = unsafe { std::slice::from_raw_parts_mut(line.as_mut_ptr() as *mut u16, 2 * STEP) };
                    let (head, tail) = halves.split_at_mut(if r < valid { depth } else { 0 });
                    if r < valid {
                        // SAFETY: row r0 + r < rows of the block holds kc >= p0 + depth elements.
                        head.copy_from_slice(unsafe { std::slice::from_raw_parts(a.at(r0 + r, p0), depth) });
                    }
                    tail.fill(0);
                }
            }
        } else if a.rs == 1 {
            // Columns run along the rows (a transposed operand: a weight gradient's dY^T): 16
            // rows x 16 units at a time, each unit row built from two columns, then transposed.
            for rb in (0..MR).step_by(TILE_ROWS) {
                let lanes = valid.saturating_sub(rb).min(TILE_ROWS);
                let mask = ((1u32 << lanes) - 1) as __mmask16;
                let column = |p: usize| {
                    if p < kc && lanes > 0 {
                        // SAFETY: column p holds rows r0 + rb .. + lanes of the block; masked-off
                        // lanes are not read.
                        unsafe { _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, a.at(r0 + rb, p) as *const i16)) }
                    } else {
                        _mm512_setzero_si512()
                    }
                };
                for u0 in (0..units).step_by(STEP) {
                    let mut block: [__m512; 16] = std::array::from_fn(|i| {
                        let u = u0 + i;
                        _mm512_castsi512_ps(_mm512_or_si512(column(2 * u), _mm512_slli_epi32::<16>(column(2 * u + 1))))
                    });
                    transpose16(&mut block);
                    for (i, vector) in block.iter().enumerate() {
                        let at = unit_index(rb + i, u0);
                        if let Some(line) = panel.get_mut(at..at + STEP) {
                            // SAFETY: the line holds 16 floats.
                            unsafe { _mm512_storeu_ps(line.as_mut_ptr(), *vector) };
                        }
                    }
                }
            }
        } else {
            for r in 0..MR {
                // SAFETY (every read): (r0 + r, p) lies inside the block for r < valid, p < kc.
                let element = |p: usize| if r < valid && p < kc { unsafe { *a.at(r0 + r, p) } } else { 0 };
                for u in 0..units {
                    if let Some(slot) = panel.get_mut(unit_index(r, u)) {
                        *slot = pair(element(2 * u), element(2 * u + 1));
                    }
                }
            }
        }
    }
}

/// One 32 x 32 block of C: `rows` (<= 32) rows of the A panel (32 rows of `units` units, see
/// [`unit_index`]) times the B panel (`units` x NR), `units` a whole number of k steps, into
/// the tile. A block of at most 16 rows runs half the tiles.
///
/// # Safety
/// As [`Precision::block`]: the panels hold what they should, the tile lies inside C, and this
/// thread loaded the tile configuration (`AmxBf16::begin`).
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn block(rows: usize, units: usize, a: *const f32, b: *const f32, tile: Tile) {
    let (a_stride, b_stride) = (STEP * 4, NR * 4);
    let two_row_tiles = rows > TILE_ROWS;
    if tile.add {
        // The sums to add to are C's rows in memory (between k slices, the whole product's
        // partial sums): ask for them now, so that they have arrived when the block is done.
        for r in 0..rows.min(MR) {
            let row = tile.c.wrapping_add(r * tile.ldc);
            _mm_prefetch::<_MM_HINT_T0>(row as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(16) as *const i8);
        }
    }
    // SAFETY (every asm block below): the tiles are configured (the caller's contract); each
    // load reads 16 rows of 64 bytes at its stride, inside the panels: rows 0-15 (and 16-31) of
    // step s / 16 of the A panel, B unit rows s..s+16 of columns 0-15 and 16-31 of a panel NR
    // wide, s + 16 <= units.
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in (0..units).step_by(STEP) {
            let (a0, b0) = (a.add(unit_index(0, s)), b.add(s * NR));
            if two_row_tiles {
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0,
                    a1 = in(reg) a0.add(TILE_ROWS * STEP),
                    b0 = in(reg) b0,
                    b1 = in(reg) b0.add(16),
                    sa = in(reg) a_stride,
                    sb = in(reg) b_stride,
                    options(nostack, readonly),
                );
            } else {
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    a0 = in(reg) a0,
                    b0 = in(reg) b0,
                    b1 = in(reg) b0.add(16),
                    sa = in(reg) a_stride,
                    sb = in(reg) b_stride,
                    options(nostack, readonly),
                );
            }
        }
    }
    let mut sums = Sums([[0.0; NR]; MR]);
    // SAFETY: the caller's contract: the tiles are configured and hold this block's sums.
    unsafe { store_sums(&mut sums) };
    let mut acc = [[_mm512_setzero_ps(); V]; MR];
    for (row, sums_row) in acc.iter_mut().zip(&sums.0) {
        for (vector, lanes) in row.iter_mut().zip(sums_row.chunks_exact(16)) {
            // SAFETY: the chunk holds 16 floats.
            *vector = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
        }
    }
    // SAFETY: the tile lies inside C (the caller's contract), `rows` <= MR.
    unsafe { store(&acc, tile) };
}

/// A 32 x 32 block of float32 sums, aligned as tile stores want.
#[repr(C, align(64))]
struct Sums([[f32; NR]; MR]);

/// Stores the four C tiles (tmm0-3) into `sums` as one 32 x 32 block: tile 0 at (0, 0), 1 at
/// (0, 16), 2 at (16, 0), 3 at (16, 16).
///
/// # Safety
/// This thread loaded the tile configuration.
#[inline]
unsafe fn store_sums(sums: &mut Sums) {
    let base = sums.0.as_mut_ptr() as *mut f32;
    // SAFETY: each store writes 16 rows of 64 bytes, 128 bytes apart, inside `sums` (32 rows of
    // 32 floats); the tiles are configured (the caller's contract).
    unsafe {
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) base,
            c1 = in(reg) base.add(16),
            c2 = in(reg) base.add(TILE_ROWS * NR),
            c3 = in(reg) base.add(TILE_ROWS * NR + 16),
            s = in(reg) NR * 4,
            options(nostack),
        );
    }
}

/// `c (m x n bfloat16, row stride ldc) (+)= x (m x k) * w^T` with `w` a row-major n x k weight
/// (row stride `ldw`) read in place: the form of a FullyConnected layer at a small batch. The
/// blocked loops pack the weight (their right operand) on every call and read it three times,
/// where the product itself needs it once; here its rows are the left operand, loaded into A
/// tiles straight from memory (16 rows of 32 k values each, the A tile layout), against x
/// packed once as B panels (a few rows: cheap). Each block of 32 weight rows by 32 columns of x
/// is then C's transpose: its tiles are stored, transposed by vectors and rounded into C.
/// Rows and k past the weight's edge go through a zeroed staging tile, never read past it.
/// Bands of weight rows run on up to `threads` threads. False (nothing done) when the memory
/// for x's panels cannot be had.
///
/// # Safety
/// `x` addresses m x k elements, `w` n rows of k elements `ldw` apart, `c` m rows of n
/// elements `ldc` apart that overlap neither; [`available`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weight_rows_product(
    m: usize,
    n: usize,
    k: usize,
    x: Operand<u16>,
    w: *const u16,
    ldw: usize,
    c: *mut u16,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    let units = AmxBf16::units(k);
    let panels = m.div_ceil(NR);
    // x^T (k x m) packed as B panels of NR columns, every k step of each whole.
    let mut packed = Vec::new();
    if packed.try_reserve_exact(panels * units * NR).is_err() {
        return false;
    }
    packed.resize(panels * units * NR, 0f32);
    for (panel, out) in packed.chunks_exact_mut(units * NR).enumerate() {
        let j0 = panel * NR;
        // SAFETY: columns j0.. of x^T are rows j0.. of x, each holding k elements.
        unsafe {
            let columns = Operand { ptr: x.ptr, rs: x.cs, cs: x.rs }.from(0, j0);
            AmxBf16::pack_b(columns, k, NR.min(m - j0), out);
        }
    }
    let blocks = n.div_ceil(MR);
    let bands = threads.clamp(1, crate::engine::parallel::threads().max(1)).min(blocks);
    let per_band = blocks.div_ceil(bands);
    let (w, c) = (SendPtr(w.cast_mut()), SendPtr(c));
    let packed = &packed;
    crate::engine::parallel::run(bands, &|band| {
        // SAFETY: the CPU has AMX (the caller's contract); the guard ends it on this thread.
        let _tiles = unsafe { Begun::<AmxBf16>::new() };
        for block in band * per_band..((band + 1) * per_band).min(blocks) {
            let n0 = block * MR;
            for (panel, b) in packed.chunks_exact(units * NR).enumerate() {
                let j0 = panel * NR;
                // SAFETY: rows n0.. of w and columns n0.. of c's rows j0.. lie inside them (the
                // caller's contract); each band writes its own columns of c.
                unsafe {
                    weight_block(n0, MR.min(n - n0), k, w.get(), ldw, b.as_ptr(), units, c.get().add(j0 * ldc), ldc, NR.min(m - j0), accumulate)
                };
            }
        }
    });
    true
}

/// One block of [`weight_rows_product`]: weight rows n0..n0+rows (<= 32) against one B panel
/// of `columns` (<= 32) columns of x, into C's rows 0..columns (from `c`), columns n0.. .
///
/// # Safety
/// As [`weight_rows_product`]; `b` is a packed panel of `units` unit rows; `c` points at the
/// first of `columns` rows of C; this thread loaded the tile configuration.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn weight_block(
    n0: usize,
    rows: usize,
    k: usize,
    w: *const u16,
    ldw: usize,
    b: *const f32,
    units: usize,
    c: *mut u16,
    ldc: usize,
    columns: usize,
    accumulate: bool,
) {
    #[repr(C, align(64))]
    struct Staging([u16; TILE_ROWS * 2 * STEP]);
    let (mut first, mut second) = (Staging([0; TILE_ROWS * 2 * STEP]), Staging([0; TILE_ROWS * 2 * STEP]));
    let whole_steps = k / (2 * STEP);
    let two_row_tiles = rows > TILE_ROWS;
    // The A tile of weight rows r0..r0+16 at k step s: in place where all 16 rows and 32 k
    // values exist, else a zero-padded copy of what does.
    let mut a_tile = |half: usize, s: usize| -> (*const u16, usize) {
        let r0 = n0 + half * TILE_ROWS;
        let valid_rows = rows.saturating_sub(half * TILE_ROWS).min(TILE_ROWS);
        if valid_rows == TILE_ROWS && s < whole_steps {
            // SAFETY: 16 rows of 32 elements from (r0, 32 s) lie inside w.
            return (unsafe { w.add(r0 * ldw + s * 2 * STEP) }, ldw * 2);
        }
        let (p0, depth) = (s * 2 * STEP, (2 * STEP).min(k.saturating_sub(s * 2 * STEP)));
        let tile = if half == 0 { &mut first.0 } else { &mut second.0 };
        tile.fill(0);
        for (r, line) in tile.chunks_exact_mut(2 * STEP).take(valid_rows).enumerate() {
            if let Some(head) = line.get_mut(..depth) {
                // SAFETY: row r0 + r < n0 + rows holds k >= p0 + depth elements.
                head.copy_from_slice(unsafe { std::slice::from_raw_parts(w.add((r0 + r) * ldw + p0), depth) });
            }
        }
        (tile.as_ptr(), 4 * STEP)
    };
    // SAFETY (every asm block): the tiles are configured (the caller's contract); each load reads
    // 16 rows of 64 bytes at its stride inside w, a staging tile or the B panel (unit rows
    // 16 s .. 16 s + 16 of columns 0-15 and 16-31, 16 s + 16 <= units).
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        for s in 0..units / STEP {
            let b0 = b.add(s * STEP * NR);
            let (a0, sa0) = a_tile(0, s);
            asm!(
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                a0 = in(reg) a0,
                sa = in(reg) sa0,
                b0 = in(reg) b0,
                b1 = in(reg) b0.add(16),
                sb = in(reg) NR * 4,
                options(nostack, readonly),
            );
            if two_row_tiles {
                let (a1, sa1) = a_tile(1, s);
                asm!(
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a1 = in(reg) a1,
                    sa = in(reg) sa1,
                    options(nostack, readonly),
                );
            }
        }
    }
    let mut sums = Sums([[0.0; NR]; MR]);
    // SAFETY: the caller's contract: the tiles are configured and hold this block's sums.
    unsafe { store_sums(&mut sums) };
    let base = sums.0.as_ptr() as *const f32;
    // sums[i][j] is C's (j, n0 + i): transpose each 16 x 16 quarter, then round 16 weight rows
    // at a time into one row of C.
    for half in 0..rows.div_ceil(TILE_ROWS) {
        let valid = (rows - half * TILE_ROWS).min(TILE_ROWS);
        let mask = ((1u32 << valid) - 1) as __mmask16;
        for quarter in 0..columns.div_ceil(16) {
            // SAFETY: rows 16 half + i < 32 of `sums`, 16 floats from column 16 quarter < 32.
            let mut v: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(base.add((half * TILE_ROWS + i) * NR + 16 * quarter)) });
            transpose16(&mut v);
            for (q, &row_sums) in v.iter().enumerate().take(columns - 16 * quarter) {
                // SAFETY: row 16 quarter + q < columns of C, its columns n0 + 16 half .. + valid.
                let at = unsafe { c.add((16 * quarter + q) * ldc + n0 + half * TILE_ROWS) };
                let value = if accumulate {
                    let old = _mm256_maskz_loadu_epi16(mask, at as *const i16);
                    _mm512_add_ps(row_sums, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(old))))
                } else {
                    row_sums
                };
                // SAFETY: __m256bh and __m256i are the same 32 bytes; the store moves the bits.
                let rounded: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(value));
                _mm256_mask_storeu_epi16(at as *mut i16, mask, rounded);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_configuration_is_palette_one_with_sixteen_rows_of_64_bytes() {
        assert_eq!(CONFIG.0[0], 1);
        assert!((0..8).all(|t| CONFIG.0[16 + 2 * t] == 64 && CONFIG.0[48 + t] == 16));
        assert_eq!(AmxBf16::units(1), 16);
        assert_eq!(AmxBf16::units(32), 16);
        assert_eq!(AmxBf16::units(33), 32);
        assert_eq!(AmxBf16::units(0), 0);
        assert_eq!(
            (unit_index(0, 0), unit_index(1, 0), unit_index(0, 15), unit_index(0, 16), unit_index(31, 17)),
            (0, 16, 15, 512, 512 + 31 * 16 + 1)
        );
    }

    #[test]
    fn weight_rows_in_place_match_the_float64_reference() {
        if !available() {
            eprintln!("skipped: no AMX on this CPU (or tile data refused)");
            return;
        }
        // x (m x k) times w^T for w n x k with a row stride past k: ragged in every direction
        // (rows past a tile, k past a step, columns past a panel), written and then added to.
        for &(m, n, k, threads) in &[(1, 1, 1, 1), (1, 37, 70, 2), (5, 33, 64, 1), (16, 48, 100, 2), (33, 70, 65, 3), (40, 17, 300, 2)] {
            let ldw = k + 3;
            let value = |i: usize| half::bf16::from_f32(((i * 7919 % 61) as f32 - 30.0) / 16.0).to_bits();
            let x: Vec<u16> = (0..m * k).map(value).collect();
            let w: Vec<u16> = (0..n * ldw).map(|i| value(i + 11)).collect();
            let widen = |bits: u16| half::bf16::from_bits(bits).to_f64();
            let exact = |i: usize, j: usize| (0..k).map(|p| widen(x[i * k + p]) * widen(w[j * ldw + p])).sum::<f64>();
            let mut c = vec![0u16; m * n];
            for (accumulate, times) in [(false, 1.0), (true, 2.0)] {
                let operand = Operand { ptr: x.as_ptr(), rs: k as isize, cs: 1 };
                // SAFETY: x is m x k, w n rows of ldw >= k, c m x n; AMX is available.
                assert!(unsafe { weight_rows_product(m, n, k, operand, w.as_ptr(), ldw, c.as_mut_ptr(), n, accumulate, threads) });
                for i in 0..m {
                    for j in 0..n {
                        let (got, want) = (widen(c[i * n + j]), times * exact(i, j));
                        assert!((got - want).abs() <= want.abs() / 64.0 + 1e-6, "{m}x{n}x{k} ({i}, {j}): {got} vs {want}");
                    }
                }
            }
        }
    }
}
