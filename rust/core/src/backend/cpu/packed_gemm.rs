//! GEMM for AVX-512 CPUs: `C (+)= A * B` with any strides on A and B, float32, or bfloat16
//! operands with float32 accumulation where the CPU has AVX512-BF16.
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
//!
//! bfloat16 runs the same loops with the same 32-bit packed slots, each holding two neighbours
//! along k: `vdpbf16ps` multiplies both pairs and adds them to a float32 lane, twice the
//! multiply-adds of a float32 FMA per instruction. Where the operands run along k (FullyConnected's
//! `x * W^T`), a pair is one 32-bit word of the source, so packing is the float32 transpose.

use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows of C per register block: 12 rows x 2 vectors = 24 accumulators, two B vectors and a
/// broadcast A element fill 27 of the 32 vector registers.
const MR: usize = 12;
/// 16-lane vectors per register block row.
pub(crate) const V: usize = 2;
/// Columns of C per register block.
pub(crate) const NR: usize = 16 * V;
/// k per slice: one packed B panel (KC x NR, 32 KB) stays in L1 while A panels stream past it.
const KC: usize = 256;
/// Rows of A per packed block: 288 x 256 floats (288 KB) stay in L2 for every B panel.
const MC: usize = 24 * MR;
const _: () = assert!(MC.is_multiple_of(super::amx::MR), "A blocks hold whole AMX panels");
/// Columns of B per packed block (KC x NC floats, 2 MB, in L3): A is packed once per block, so
/// square products up to 2048 pack it once (blocks of 512 packed a 2048^3 product's A four times,
/// 14% of its time).
const NC: usize = 2048;

/// A matrix of float32 (or, with `T = u16`, bfloat16 bits) read through its row and column
/// strides (in elements).
#[derive(Clone, Copy)]
pub(crate) struct Operand<T = f32> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

impl<T> Operand<T> {
    /// The address of element (r, c).
    ///
    /// # Safety
    /// (r, c) addresses an element inside the operand's allocation.
    pub(crate) unsafe fn at(&self, r: usize, c: usize) -> *const T {
        self.ptr.offset(r as isize * self.rs + c as isize * self.cs)
    }

    /// The operand starting at element (r, c).
    ///
    /// # Safety
    /// As [`Operand::at`].
    pub(crate) unsafe fn from(&self, r: usize, c: usize) -> Operand<T> {
        Operand { ptr: self.at(r, c), rs: self.rs, cs: self.cs }
    }
}

// SAFETY: an Operand only reads, and the op that owns the matrix keeps it alive and unwritten
// for the whole product, so bands on other threads may read it at once.
unsafe impl<T> Send for Operand<T> {}
unsafe impl<T> Sync for Operand<T> {}

/// Whether this CPU runs the float32 kernel (it needs AVX-512F).
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Whether this CPU runs the bfloat16 kernel (AVX512-BF16, and AVX512-BW and VL for packing).
pub(crate) fn bf16_available() -> bool {
    available()
        && std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Products below this many multiply-adds run on one thread: splitting costs more than it saves.
const PARALLEL_FLOPS: usize = 64 * 64 * 64;

/// `c (m x n, row stride ldc) (+)= a (m x k) * b (k x n)` in float32, adding to c when
/// `accumulate`, on up to `threads` threads in bands of C columns (or rows).
///
/// # Safety
/// The operands address m x k and k x n elements inside their allocations, `c` holds the m x n
/// product with row stride ldc and overlaps neither operand, and [`available`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(m: usize, n: usize, k: usize, a: Operand, b: Operand, c: *mut f32, ldc: usize, accumulate: bool, threads: usize) {
    gemm::<F32>(m, n, k, a, b, Dest { partial: c, out: std::ptr::null_mut(), ldc }, accumulate, threads)
}

/// k elements of bfloat16 operands per slice: a product with at most this many needs no
/// float32 partial sums (see [`bf16_gemm`]).
pub(crate) const BF16_SLICE: usize = KC * 2;

/// `out (m x n bfloat16, row stride ldc) = a * b (+ partial when accumulate)` for bfloat16
/// operands (their bits as u16), summed in float32 and rounded to bfloat16 once, as each
/// register block leaves the last k slice. `partial` (m x n float32, row stride ldc) holds the
/// sums between k slices; it may be null when k <= [`BF16_SLICE`] and not `accumulate`. With
/// `accumulate` it must hold the float32 values to add to (out widened, say).
///
/// # Safety
/// As [`sgemm`] for `out` and `partial` (where not null), with [`bf16_available`] true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn bf16_gemm(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<u16>,
    b: Operand<u16>,
    partial: *mut f32,
    out: *mut u16,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    let dest = Dest { partial, out, ldc };
    if super::amx::available() {
        gemm::<super::amx::AmxBf16>(m, n, k, a, b, dest, accumulate, threads)
    } else {
        gemm::<Bf16>(m, n, k, a, b, dest, accumulate, threads)
    }
}

/// Where a product goes: float32 C (`partial`, `out` null), or bfloat16 `out` with the float32
/// sums between k slices in `partial` (null when a product has one k slice and adds to
/// nothing). Both have row stride `ldc`.
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    partial: *mut f32,
    out: *mut u16,
    ldc: usize,
}

// SAFETY: bands on different threads write disjoint blocks of the destination.
unsafe impl Send for Dest {}
unsafe impl Sync for Dest {}

impl Dest {
    /// The destination from element (r, c) on (wrapping: a null `partial` stays unused).
    fn from(self, r: usize, c: usize) -> Dest {
        let at = r * self.ldc + c;
        Dest { partial: self.partial.wrapping_add(at), out: if self.out.is_null() { self.out } else { self.out.wrapping_add(at) }, ldc: self.ldc }
    }
}

/// [`sgemm`] in precision P.
///
/// # Safety
/// As [`sgemm`], with P's CPU features present.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<P: Precision>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<P::Elem>,
    b: Operand<P::Elem>,
    dest: Dest,
    accumulate: bool,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let parts = if m * n * k < PARALLEL_FLOPS { 1 } else { threads.clamp(1, crate::engine::parallel::threads().max(1)) };
    // Every band packs all of the operand that is not split: split B's columns (each band then
    // packs all of A) when A is the smaller one, as in FullyConnected, and the bands stay whole
    // panels wide.
    let by_columns = (m <= n && n >= NR * parts) || m < P::MR * parts;
    let (len, unit) = if by_columns { (n, NR) } else { (m, P::MR) };
    let width = len.div_ceil(parts).div_ceil(unit) * unit;
    crate::engine::parallel::run(len.div_ceil(width), &|band| {
        let (start, end) = (band * width, ((band + 1) * width).min(len));
        // SAFETY: the band's columns (or rows) lie inside b (or a) and the destination; each
        // band writes only its own part of it.
        unsafe {
            if by_columns {
                serial::<P>(m, end - start, k, a, b.from(0, start), dest.from(0, start), accumulate);
            } else {
                serial::<P>(end - start, n, k, a.from(start, 0), b, dest.from(start, 0), accumulate);
            }
        }
    });
}

/// The multiply-add throughput of `threads` cores at once in GFLOP/s, float32 (or bfloat16
/// when `bf16`): the micro-kernel run on cached panels for about 0.1 s on each thread together,
/// so the figure is the clock the cores hold under this load, not a nominal one; the best of
/// three runs, as a shared machine may lend a run fewer cycles. The ceiling that GEMM
/// benchmarks quote their figures against. None without the kernel's CPU features.
pub fn peak_gflops(threads: usize, bf16: bool) -> Option<f64> {
    if !(if bf16 { bf16_available() } else { available() }) {
        return None;
    }
    let amx = bf16 && super::amx::available();
    let threads = threads.clamp(1, crate::engine::parallel::threads().max(1));
    let period = std::time::Duration::from_millis(100);
    let run = || {
        let rates = crate::engine::parallel::map(threads, |_| {
            // SAFETY: the CPU features were checked above.
            unsafe {
                if amx {
                    kernel_rate::<super::amx::AmxBf16>(period)
                } else if bf16 {
                    kernel_rate::<Bf16>(period)
                } else {
                    kernel_rate::<F32>(period)
                }
            }
        });
        rates.iter().sum::<f64>()
    };
    Some((0..3).map(|_| run()).fold(0.0, f64::max))
}

/// GFLOP/s of P's MR x NR register block over KC units on one thread, run for `duration`.
///
/// # Safety
/// P's CPU features are present.
unsafe fn kernel_rate<P: Precision>(duration: std::time::Duration) -> f64 {
    let mut buffers = PackBuffers::default();
    let (a, b) = (buffers.a.floats(KC * P::MR).as_ptr(), buffers.b.floats(KC * NR).as_ptr());
    let mut c = vec![0f32; P::MR * NR];
    let start = std::time::Instant::now();
    let mut calls = 0usize;
    // SAFETY: P's CPU features are present (the caller's contract).
    let kernel = unsafe { Begun::<P>::new() };
    while start.elapsed() < duration {
        for _ in 0..64 {
            let tile = Tile { c: c.as_mut_ptr(), narrow: std::ptr::null_mut(), ldc: NR, rows: P::MR, masks: column_masks(NR), add: false };
            // SAFETY: the panels hold KC x MR and KC x NR units, c holds the MR x NR tile.
            unsafe { P::block(P::MR, KC, a, b, tile) };
        }
        calls += 64;
    }
    drop(kernel);
    std::hint::black_box(&c);
    (2 * KC * P::PER_UNIT * P::MR * NR * calls) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The packing buffers of one thread: an A block (MC x KC) and a B block (KC x NC).
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

    /// Every float the buffer holds.
    fn all(&self) -> &[f32] {
        // SAFETY: as in `floats`: the vector's lines are contiguous floats.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const f32, self.0.len() * 16) }
    }
}

thread_local! {
    /// Kept per thread across products: packing writes every element it reads back, so the
    /// buffers never need clearing, and allocating up to 2.3 MB per product would cost page faults
    /// (the price: that much memory stays with every thread that ran a product).
    static PACK_BUFFERS: RefCell<PackBuffers> = RefCell::new(PackBuffers::default());
}

/// [`sgemm`] on the calling thread.
///
/// # Safety
/// As [`sgemm`].
unsafe fn serial<P: Precision>(m: usize, n: usize, k: usize, a: Operand<P::Elem>, b: Operand<P::Elem>, dest: Dest, accumulate: bool) {
    // SAFETY: P's CPU features are present (the caller's contract).
    let _kernel = unsafe { Begun::<P>::new() };
    PACK_BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        // SAFETY: forwarded from the caller.
        Ok(mut buffers) => unsafe { blocked::<P>(m, n, k, a, b, dest, accumulate, &mut buffers) },
        // Only if a product ever ran inside another on this thread: use buffers of its own.
        // SAFETY: forwarded from the caller.
        Err(_) => unsafe { blocked::<P>(m, n, k, a, b, dest, accumulate, &mut PackBuffers::default()) },
    });
}

/// [`Precision::begin`] until dropped (on a panic too), then [`Precision::end`].
pub(crate) struct Begun<P: Precision>(std::marker::PhantomData<P>);

impl<P: Precision> Begun<P> {
    /// # Safety
    /// P's CPU features are present.
    pub(crate) unsafe fn new() -> Self {
        // SAFETY: the caller's contract; `drop` ends it on this thread.
        unsafe { P::begin() };
        Begun(std::marker::PhantomData)
    }
}

impl<P: Precision> Drop for Begun<P> {
    fn drop(&mut self) {
        // SAFETY: paired with the `begin` of `new` on this thread: a guard lives in the frame of
        // the function that made it and is dropped there.
        unsafe { P::end() };
    }
}

/// The blocked loops: B blocks packed once per k slice, A blocks once per B block, a register
/// block of C per (A panel, B panel) pair, A panels innermost so that one B panel stays in L1.
/// Panels hold 32-bit units, KC of them per k slice (P::PER_UNIT k elements each).
///
/// # Safety
/// As [`sgemm`], with P's CPU features present.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked<P: Precision>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<P::Elem>,
    b: Operand<P::Elem>,
    dest: Dest,
    accumulate: bool,
    buffers: &mut PackBuffers,
) {
    if k == 0 {
        for i in 0..m {
            let row = dest.from(i, 0);
            // SAFETY: row i of the destination holds n elements; a bfloat16 product adding to
            // its partial sums rounds them into `out` (the partial sums stay as they were).
            unsafe {
                if row.out.is_null() {
                    if !accumulate {
                        std::ptr::write_bytes(row.partial, 0, n);
                    }
                } else {
                    for j in 0..n {
                        let value = if accumulate { *row.partial.add(j) } else { 0.0 };
                        *row.out.add(j) = half::bf16::from_f32(value).to_bits();
                    }
                }
            }
        }
        return;
    }
    let slice = KC * P::PER_UNIT;
    let units = P::units;
    let PackBuffers { a: buffer_a, b: buffer_b } = buffers;
    let packed_a = buffer_a.floats(MC.min(m.div_ceil(P::MR) * P::MR) * units(slice.min(k)));
    let packed_b = buffer_b.floats(units(slice.min(k)) * NC.min(n.div_ceil(NR) * NR));
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for p0 in (0..k).step_by(slice) {
            let kc = slice.min(k - p0);
            // kc >= 1 (p0 < k): every panel is units(kc) x NR, and the buffer holds
            // nc.div_ceil(NR) of them (sized above for the largest block), so the zip below packs
            // every panel of the block.
            for (q0, panel) in (0..nc).step_by(NR).zip(packed_b.chunks_exact_mut(units(kc) * NR)) {
                // SAFETY: rows p0..p0+kc and columns j0+q0.. of the block lie inside b; the panel
                // holds units(kc) x NR.
                unsafe { P::pack_b(b.from(p0, j0 + q0), kc, NR.min(nc - q0), panel) };
            }
            // SAFETY: forwarded from the caller; the block was packed just above.
            unsafe { multiply_block::<P>(m, k, a, (j0, nc, p0, kc), packed_b, packed_a, dest, accumulate) };
        }
    }
}

/// `dest[:, j0..j0+nc] (+)= a[:, p0..p0+kc] * (the packed B block)`: A packed by MC row blocks,
/// a register block of C per (A panel, B panel) pair, A panels innermost so that one B panel
/// stays in L1. The product of the first k slice (p0 == 0) stores unless `accumulate`; the last
/// one rounds a bfloat16 product into `dest.out`.
///
/// # Safety
/// As [`sgemm`] for a (m x k) and dest, with P's CPU features present; `packed_b` holds the
/// block's panels as `P::pack_b` writes them (NR columns each, units(kc) units apart) and
/// `packed_a` room for MC rows (rounded up to MR) x units(kc).
#[allow(clippy::too_many_arguments)]
unsafe fn multiply_block<P: Precision>(
    m: usize,
    k: usize,
    a: Operand<P::Elem>,
    (j0, nc, p0, kc): (usize, usize, usize, usize),
    packed_b: &[f32],
    packed_a: &mut [f32],
    dest: Dest,
    accumulate: bool,
) {
    let ku = P::units(kc);
    if ku == 0 {
        return;
    }
    let add = accumulate || p0 > 0;
    // The last k slice rounds a bfloat16 product into `out` (null otherwise).
    let narrow = if p0 + kc == k { dest.out } else { std::ptr::null_mut() };
    for i0 in (0..m).step_by(MC) {
        let mc = MC.min(m - i0);
        // SAFETY: rows i0..i0+mc and columns p0..p0+kc lie inside a.
        unsafe { P::pack_a(a.from(i0, p0), mc, kc, packed_a) };
        // The caller's buffers hold every panel (see the safety contract), so neither zip below
        // stops early: B panels are ku x NR, A panels MR x ku, one per NR columns and MR rows.
        for (q0, panel_b) in (0..nc).step_by(NR).zip(packed_b.chunks_exact(ku * NR)) {
            let masks = column_masks(NR.min(nc - q0));
            let panel_b = panel_b.as_ptr();
            for (r0, panel) in (0..mc).step_by(P::MR).zip(packed_a.chunks_exact(P::MR * ku)) {
                let rows = P::MR.min(mc - r0);
                let panel = panel.as_ptr();
                // SAFETY: the packed panels hold MR x ku and ku x NR units (zero past the
                // block's rows, columns and k); C's block at (i0 + r0, j0 + q0) has `rows`
                // rows, as wide as `masks` allow, inside c.
                unsafe {
                    let at = dest.from(i0 + r0, j0 + q0);
                    let narrow = if narrow.is_null() { narrow } else { at.out };
                    let tile = Tile { c: at.partial, narrow, ldc: dest.ldc, rows, masks, add };
                    P::block(rows, ku, panel, panel_b, tile);
                }
            }
        }
    }
}

/// A float32 right operand (k x n) packed once into the kernel's panels, for products that
/// reuse it: an RNN multiplies its recurrent weight by a few state rows at every time step, and
/// packing the 4 MB weight each time cost as much as the product (16 x 512 by 512 x 2048 on one
/// core: 129 GFLOP/s through row dots, 161 through the gemm crate, which packs per call).
pub(crate) struct PackedB {
    panels: AlignedBuffer,
    k: usize,
    n: usize,
}

impl PackedB {
    /// Packs `b` (k x n, read through its strides) block by block in the order the product reads
    /// the blocks: NC columns, then KC rows.
    ///
    /// # Safety
    /// `b` addresses k x n floats; [`available`] is true.
    pub(crate) unsafe fn new(b: Operand, k: usize, n: usize) -> PackedB {
        let mut panels = AlignedBuffer::default();
        // The blocks' sizes (kc x nc rounded up to NR) add up to the buffer's length, so every
        // block is split off whole.
        let mut rest = panels.floats(k * n.div_ceil(NR) * NR);
        for j0 in (0..n).step_by(NC) {
            let nc = NC.min(n - j0);
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                let Some((block, after)) = std::mem::take(&mut rest).split_at_mut_checked(kc * nc.div_ceil(NR) * NR) else {
                    break;
                };
                rest = after;
                // kc >= 1 (p0 < k): the block's panels are kc x NR each, nc.div_ceil(NR) of them.
                for (q0, panel) in (0..nc).step_by(NR).zip(block.chunks_exact_mut(kc * NR)) {
                    // SAFETY: rows p0..p0+kc and columns j0+q0.. lie inside b; the panel holds
                    // kc x NR.
                    unsafe { F32::pack_b(b.from(p0, j0 + q0), kc, NR.min(nc - q0), panel) };
                }
            }
        }
        PackedB { panels, k, n }
    }

    /// `c (m x n, row stride ldc) (+)= a * B` on the calling thread.
    ///
    /// # Safety
    /// `a` addresses m x k floats; c holds the m x n product with row stride ldc and overlaps
    /// neither operand.
    pub(crate) unsafe fn multiply(&self, m: usize, a: Operand, c: *mut f32, ldc: usize, accumulate: bool) {
        let (k, n) = (self.k, self.n);
        if m == 0 || n == 0 || k == 0 {
            if !accumulate && k == 0 {
                for i in 0..m {
                    // SAFETY: row i of c holds n floats.
                    unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
                }
            }
            return;
        }
        let dest = Dest { partial: c, out: std::ptr::null_mut(), ldc };
        let packed = self.panels.all();
        PACK_BUFFERS.with(|buffers| {
            let mut own = PackBuffers::default();
            let mut borrowed = buffers.try_borrow_mut();
            let buffers = match borrowed.as_mut() {
                Ok(buffers) => &mut **buffers,
                // Only if a product ever ran inside another on this thread: use buffers of its own.
                Err(_) => &mut own,
            };
            let packed_a = buffers.a.floats(MC.min(m.div_ceil(MR) * MR) * KC.min(k));
            let mut rest = packed;
            for j0 in (0..n).step_by(NC) {
                let nc = NC.min(n - j0);
                for p0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - p0);
                    // As `new` split them: the blocks are consecutive, kc x nc rounded up to NR.
                    let Some((block, after)) = rest.split_at_checked(kc * nc.div_ceil(NR) * NR) else {
                        return;
                    };
                    rest = after;
                    // SAFETY: the block holds its panels as `new` packed them; a and c as the
                    // caller guarantees.
                    unsafe { multiply_block::<F32>(m, k, a, (j0, nc, p0, kc), block, packed_a, dest, accumulate) };
                }
            }
        });
    }
}

/// Where a register block goes: its first `rows` rows of C from `c` (row stride ldc), as wide as
/// `masks` allow, stored or (when `add`) added to what is there; rounded to bfloat16 and stored
/// from `narrow` instead where that is not null (only in bfloat16 products, whose CPU features
/// the rounding store needs).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub(crate) c: *mut f32,
    pub(crate) narrow: *mut u16,
    pub(crate) ldc: usize,
    pub(crate) rows: usize,
    pub(crate) masks: [__mmask16; V],
    pub(crate) add: bool,
}

/// What the blocked loops multiply: the packing of each operand into 32-bit units and the
/// micro-kernel over them.
pub(crate) trait Precision {
    /// The operands' element type.
    type Elem: Copy;
    /// k elements per packed unit.
    const PER_UNIT: usize;
    /// Rows of A per packed panel and register block.
    const MR: usize = MR;
    /// Packed units (rows of a B panel) per `kc` elements of k: `kc / PER_UNIT` rounded up, and
    /// further for kernels that step over units in fixed groups (zeros fill the rest).
    fn units(kc: usize) -> usize {
        kc.div_ceil(Self::PER_UNIT)
    }
    /// Makes this thread ready to run the kernel (AMX loads its tile configuration); every call
    /// is paired with an [`Precision::end`] on the same thread once its products are done.
    ///
    /// # Safety
    /// The kernel's CPU features are present.
    unsafe fn begin() {}
    /// Undoes [`Precision::begin`].
    ///
    /// # Safety
    /// Paired with a `begin` on this thread.
    unsafe fn end() {}
    /// Packs `rows` x `kc` of `a` into panels of MR rows, unit (r, u) of a panel at `u * MR + r`
    /// (AMX: k steps of 16 units, each MR rows of them); rows and k past the end of the block are zeros.
    ///
    /// # Safety
    /// `a` addresses rows x kc elements; `out` holds rows (rounded up to MR) x units(kc).
    unsafe fn pack_a(a: Operand<Self::Elem>, rows: usize, kc: usize, out: &mut [f32]);
    /// Packs `kc` x `columns` of `b` into one panel, unit (u, j) at `u * NR + j`; columns and k
    /// past the end are zeros.
    ///
    /// # Safety
    /// `b` addresses kc x columns elements; `out` holds units(kc) x NR.
    unsafe fn pack_b(b: Operand<Self::Elem>, kc: usize, columns: usize, out: &mut [f32]);
    /// One register block of `rows` (<= MR) rows over `units` packed units.
    ///
    /// # Safety
    /// `a` holds units x MR and `b` units x NR packed units; the tile lies inside C, `rows <= MR`;
    /// for kernels with a `begin`, this thread is between `begin` and `end`.
    unsafe fn block(rows: usize, units: usize, a: *const f32, b: *const f32, tile: Tile);
}

/// [`Precision::block`] through a kernel compiled for a fixed number of rows: the fewest of 1,
/// 2, 4, 8 and MR that hold `rows`.
macro_rules! by_rows {
    ($kernel:ident, $rows:expr, $($arg:expr),*) => {
        match $rows {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 | 4 => $kernel::<4>($($arg),*),
            5..=8 => $kernel::<8>($($arg),*),
            _ => $kernel::<MR>($($arg),*),
        }
    };
}

/// float32 operands.
struct F32;

impl Precision for F32 {
    type Elem = f32;
    const PER_UNIT: usize = 1;
    unsafe fn pack_a(a: Operand, rows: usize, kc: usize, out: &mut [f32]) {
        pack_a(a, rows, kc, out)
    }
    unsafe fn pack_b(b: Operand, kc: usize, columns: usize, out: &mut [f32]) {
        pack_b(b, kc, columns, out)
    }
    unsafe fn block(rows: usize, units: usize, a: *const f32, b: *const f32, tile: Tile) {
        by_rows!(kernel, rows, units, a, b, tile)
    }
}

/// bfloat16 operands, two neighbours along k per unit (the lower address in the low half, as
/// `vdpbf16ps` pairs them).
struct Bf16;

impl Precision for Bf16 {
    type Elem = u16;
    const PER_UNIT: usize = 2;
    unsafe fn pack_a(a: Operand<u16>, rows: usize, kc: usize, out: &mut [f32]) {
        pack_a_bf16(a, rows, kc, out)
    }
    unsafe fn pack_b(b: Operand<u16>, kc: usize, columns: usize, out: &mut [f32]) {
        pack_b_bf16(b, kc, columns, out)
    }
    unsafe fn block(rows: usize, units: usize, a: *const f32, b: *const f32, tile: Tile) {
        by_rows!(kernel_bf16, rows, units, a, b, tile)
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
    if kc == 0 {
        return;
    }
    // `out` holds rows.div_ceil(MR) panels of MR x kc (the contract), one per step of r0.
    for (r0, panel) in (0..rows).step_by(MR).zip(out.chunks_exact_mut(MR * kc)) {
        let valid = MR.min(rows - r0);
        if a.cs == 1 {
            // Rows run along k: transpose them in registers.
            let mut starts = [std::ptr::null(); MR];
            for (r, start) in starts.iter_mut().enumerate().take(valid) {
                // SAFETY: row r0 + r is inside the block.
                *start = unsafe { a.at(r0 + r, 0) };
            }
            // SAFETY: each of the `valid` (<= MR) rows holds kc elements; the panel holds kc x MR.
            unsafe { interleave(starts.get(..valid).unwrap_or_default(), MR, kc, panel) };
        } else {
            for (p, unit) in panel.chunks_exact_mut(MR).enumerate() {
                for (r, slot) in unit.iter_mut().enumerate() {
                    // SAFETY: (r0 + r, p) is inside the block for r < valid (p < kc: the panel
                    // holds kc units).
                    *slot = if r < valid { unsafe { *a.at(r0 + r, p) } } else { 0.0 };
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
    let columns = columns.min(NR);
    let Some(out) = out.get_mut(..kc * NR) else {
        return;
    };
    if b.cs == 1 {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            // SAFETY: row p of the block holds `columns` elements from here.
            let src = unsafe { std::slice::from_raw_parts(b.at(p, 0), columns) };
            // columns <= NR, the row's length.
            if let Some((head, tail)) = row.split_at_mut_checked(columns) {
                head.copy_from_slice(src);
                tail.fill(0.0);
            }
        }
    } else if b.rs == 1 {
        // Columns run along k (a transposed row-major matrix, as FullyConnected's weight):
        // transpose them in registers.
        let mut starts = [std::ptr::null(); NR];
        for (j, start) in starts.iter_mut().enumerate().take(columns) {
            // SAFETY: column j is inside the block.
            *start = unsafe { b.at(0, j) };
        }
        // SAFETY: each of the `columns` (<= NR) columns holds kc elements; the panel holds kc x NR.
        unsafe { interleave(starts.get(..columns).unwrap_or_default(), NR, kc, out) };
    } else {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            for (j, slot) in row.iter_mut().enumerate() {
                // SAFETY: (p, j) is inside the block for j < columns.
                *slot = if j < columns { unsafe { *b.at(p, j) } } else { 0.0 };
            }
        }
    }
}

/// A packed bfloat16 unit: `low` (the element at the lower k) and `high`, as float32 bits.
pub(crate) fn pair(low: u16, high: u16) -> f32 {
    f32::from_bits(low as u32 | (high as u32) << 16)
}

/// Packs `lines` bfloat16 lines that run along k (rows of A, columns of B; line i starts at
/// `start(i)`) into units `width` wide, unit (u, i) at `u * width + i`: each unit is one 32-bit
/// word of a line, so the float32 transpose packs the even part; an odd k leaves a last unit
/// with a zero high half. Lines past `lines` are zeros.
///
/// # Safety
/// Each of the `lines` (<= NR) lines holds kc elements; `out` holds kc.div_ceil(2) x width.
#[target_feature(enable = "avx512f")]
unsafe fn interleave_pairs(lines: usize, start: impl Fn(usize) -> *const u16, width: usize, kc: usize, out: &mut [f32]) {
    let lines = lines.min(NR);
    let mut words = [std::ptr::null(); NR];
    for (i, word) in words.iter_mut().enumerate().take(lines) {
        *word = start(i) as *const f32;
    }
    // SAFETY: each line holds kc / 2 whole words; out holds at least that many units.
    unsafe { interleave(words.get(..lines).unwrap_or_default(), width, kc / 2, out) };
    if kc % 2 == 1 {
        // The last unit row, kc / 2 (out holds kc.div_ceil(2) of them).
        if let Some(last) = out.chunks_exact_mut(width.max(1)).nth(kc / 2) {
            for (i, slot) in last.iter_mut().enumerate() {
                // SAFETY: element kc - 1 is the last of line i < lines.
                let low = if i < lines { unsafe { *start(i).add(kc - 1) } } else { 0 };
                *slot = pair(low, 0);
            }
        }
    }
}

/// [`Precision::pack_a`] for bfloat16.
///
/// # Safety
/// As [`Precision::pack_a`], with AVX512-BW present.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pack_a_bf16(a: Operand<u16>, rows: usize, kc: usize, out: &mut [f32]) {
    let units = kc.div_ceil(2);
    if units == 0 {
        return;
    }
    // `out` holds rows.div_ceil(MR) panels of MR x units (the contract), one per step of r0.
    for (r0, panel) in (0..rows).step_by(MR).zip(out.chunks_exact_mut(MR * units)) {
        let valid = MR.min(rows - r0);
        // SAFETY (every read below): (r0 + r, p) lies inside the block for r < valid, p < kc.
        let element = |r: usize, p: usize| if r < valid && p < kc { unsafe { *a.at(r0 + r, p) } } else { 0 };
        if a.cs == 1 {
            // SAFETY: each of the `valid` rows holds kc elements; the panel holds units x MR.
            unsafe { interleave_pairs(valid, |r| a.at(r0 + r, 0), MR, kc, panel) };
        } else if a.rs == 1 {
            // Columns run along the rows (a transposed operand: the weight gradient's dY^T).
            // Columns 2u and 2u + 1 widen into the low and high halves of the panel's unit row
            // u (element by element, this packing took half of a 1024x128x1024 product's time).
            let rows_mask = ((1u32 << valid) - 1) as __mmask16;
            let column = |p: usize| {
                if p < kc {
                    // SAFETY: column p holds `valid` elements from row r0; masked-off lanes
                    // are not read.
                    unsafe { _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(rows_mask, a.at(r0, p) as *const i16)) }
                } else {
                    _mm512_setzero_si512()
                }
            };
            for (u, unit) in panel.chunks_exact_mut(MR).enumerate() {
                let unit_row = _mm512_or_si512(column(2 * u), _mm512_slli_epi32::<16>(column(2 * u + 1)));
                // SAFETY: the unit row holds MR floats, the lanes the mask stores.
                unsafe { _mm512_mask_storeu_epi32(unit.as_mut_ptr() as *mut i32, ((1u32 << MR) - 1) as __mmask16, unit_row) };
            }
        } else {
            for (u, unit) in panel.chunks_exact_mut(MR).enumerate() {
                for (r, slot) in unit.iter_mut().enumerate() {
                    *slot = pair(element(r, 2 * u), element(r, 2 * u + 1));
                }
            }
        }
    }
}

/// [`Precision::pack_b`] for bfloat16.
///
/// # Safety
/// As [`Precision::pack_b`], with AVX512-BW present.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_b_bf16(b: Operand<u16>, kc: usize, columns: usize, out: &mut [f32]) {
    let units = kc.div_ceil(2);
    let columns = columns.min(NR);
    let Some(out) = out.get_mut(..units * NR) else {
        return;
    };
    // SAFETY (every read below): (p, j) lies inside the block for p < kc, j < columns.
    let element = |p: usize, j: usize| if p < kc && j < columns { unsafe { *b.at(p, j) } } else { 0 };
    if b.rs == 1 {
        // Columns run along k (a transposed row-major weight).
        // SAFETY: each of the `columns` columns holds kc elements; out holds units x NR.
        unsafe { interleave_pairs(columns, |j| b.at(0, j), NR, kc, out) };
    } else if b.cs == 1 {
        // Rows run along n: interleave the 16-bit elements of rows 2u and 2u + 1. The unpacks
        // work within 128-bit lanes (columns 0-3 and 4-7 of each eight in `low` and `high`); the
        // permutes put the lanes back in column order.
        let mask: __mmask32 = if columns >= 32 { !0 } else { (1u32 << columns) - 1 };
        let first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        let second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        for (u, unit) in out.chunks_exact_mut(NR).enumerate() {
            // SAFETY: rows 2u (and 2u + 1 when inside the block) hold `columns` elements, the
            // masked-off lanes are not read; the unit row holds NR floats, two vectors.
            unsafe {
                let even = _mm512_maskz_loadu_epi16(mask, b.at(2 * u, 0) as *const i16);
                let odd = if 2 * u + 1 < kc { _mm512_maskz_loadu_epi16(mask, b.at(2 * u + 1, 0) as *const i16) } else { _mm512_setzero_si512() };
                let (low, high) = (_mm512_unpacklo_epi16(even, odd), _mm512_unpackhi_epi16(even, odd));
                let dst = unit.as_mut_ptr() as *mut __m512i;
                _mm512_storeu_si512(dst, _mm512_permutex2var_epi64(low, first, high));
                _mm512_storeu_si512(dst.add(1), _mm512_permutex2var_epi64(low, second, high));
            }
        }
    } else {
        for (u, unit) in out.chunks_exact_mut(NR).enumerate() {
            for (j, slot) in unit.iter_mut().enumerate() {
                *slot = pair(element(2 * u, j), element(2 * u + 1, j));
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
    // Group g / 16 of the lines (empty past the last line).
    let mut groups = lines.chunks(16);
    for g in (0..width).step_by(16) {
        let lanes = 16.min(width - g);
        let store_mask: __mmask16 = ((1u32 << lanes) - 1) as __mmask16;
        let group = groups.next().unwrap_or_default();
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
pub(crate) fn transpose16(v: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    // Pairs of rows interleaved by element, then by element pairs: afterwards vector 4i + j holds,
    // in each 128-bit lane L, rows 4i..4i+4 at column 4L + j.
    for (&[even, odd], out) in v.as_chunks::<2>().0.iter().zip(t.as_chunks_mut::<2>().0) {
        *out = [_mm512_unpacklo_ps(even, odd), _mm512_unpackhi_ps(even, odd)];
    }
    for (&quad, out) in t.as_chunks::<4>().0.iter().zip(v.as_chunks_mut::<4>().0) {
        let [t0, t1, t2, t3] = quad.map(|x| _mm512_castps_pd(x));
        *out = [
            _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2)),
            _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3)),
        ];
    }
    // 128-bit lanes: even lanes (0x88) and odd lanes (0xdd) of row groups 0-1 and 2-3 (vectors
    // j and j + 4 of each half), then of those results (vectors j and j + 8), leave every column
    // whole in one vector.
    for (&[first, second], [even, odd]) in v.as_chunks::<4>().0.as_chunks::<2>().0.iter().zip(t.as_chunks_mut::<4>().0.as_chunks_mut::<2>().0) {
        for (((&x, &y), e), o) in first.iter().zip(&second).zip(even.iter_mut()).zip(odd.iter_mut()) {
            *e = _mm512_shuffle_f32x4::<0x88>(x, y);
            *o = _mm512_shuffle_f32x4::<0xdd>(x, y);
        }
    }
    if let ([low, high], []) = t.as_chunks::<8>() {
        if let ([even, odd], []) = v.as_chunks_mut::<8>() {
            for (((&x, &y), e), o) in low.iter().zip(high).zip(even.iter_mut()).zip(odd.iter_mut()) {
                *e = _mm512_shuffle_f32x4::<0x88>(x, y);
                *o = _mm512_shuffle_f32x4::<0xdd>(x, y);
            }
        }
    }
}

/// One register block: `R` packed A rows (panel stride MR; rows past the block are zeros)
/// times a packed B panel over kc, into the tile. Alone on cached panels it runs at the core's
/// peak (258 GFLOP/s on one Zen 5 core): 24 accumulators, two B loads and 12 broadcasts per k
/// step.
///
/// # Safety
/// `a` holds kc x MR and `b` kc x NR packed elements; the tile lies inside C, `rows <= R`.
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const R: usize>(kc: usize, a: *const f32, b: *const f32, tile: Tile) {
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
    store(&acc, tile);
}

/// [`kernel`] for bfloat16 pairs: each unit of A (two k neighbours of one row) broadcast against
/// the B panel's pairs, `vdpbf16ps` adding both products into the float32 accumulators.
///
/// # Safety
/// As [`kernel`], over `units` packed pairs, with AVX512-BF16 present.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_bf16<const R: usize>(units: usize, a: *const f32, b: *const f32, tile: Tile) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for u in 0..units {
        // SAFETY (both transmutes): __m512 and __m512bh are the same 64 bytes; the bits pass
        // through unchanged (a broadcast and a load do no arithmetic).
        let bv: [__m512bh; V] = std::array::from_fn(|h| unsafe { std::mem::transmute(_mm512_loadu_ps(b.add(u * NR + 16 * h))) });
        for (i, row) in acc.iter_mut().enumerate() {
            let pair: __m512bh = unsafe { std::mem::transmute(_mm512_set1_ps(*a.add(u * MR + i))) };
            for (lane_block, &b_pairs) in row.iter_mut().zip(&bv) {
                *lane_block = _mm512_dpbf16_ps(*lane_block, pair, b_pairs);
            }
        }
    }
    store(&acc, tile);
}

/// Writes a register block's first `tile.rows` rows to C, masked to its columns.
///
/// # Safety
/// The tile lies inside C.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn store<const R: usize>(acc: &[[__m512; V]; R], tile: Tile) {
    if !tile.narrow.is_null() {
        // SAFETY: `narrow` is set only in bfloat16 products, which run where the CPU has
        // AVX512-BF16, BW and VL; the tile lies inside both destinations.
        return unsafe { store_narrowed(acc, tile) };
    }
    for (i, row) in acc.iter().enumerate().take(tile.rows) {
        for (half, (&mask, &sums)) in tile.masks.iter().zip(row).enumerate() {
            let dst = tile.c.add(i * tile.ldc + 16 * half);
            let value = if tile.add { _mm512_add_ps(sums, _mm512_maskz_loadu_ps(mask, dst)) } else { sums };
            _mm512_mask_storeu_ps(dst, mask, value);
        }
    }
}

/// [`store`] rounding to bfloat16 (to nearest even, as `half::bf16::from_f32`) into `narrow`.
///
/// # Safety
/// The tile lies inside `narrow` (and inside `c` when `add`); the CPU has the features enabled.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn store_narrowed<const R: usize>(acc: &[[__m512; V]; R], tile: Tile) {
    for (i, row) in acc.iter().enumerate().take(tile.rows) {
        for (half, (&mask, &sums)) in tile.masks.iter().zip(row).enumerate() {
            let at = i * tile.ldc + 16 * half;
            let value = if tile.add { _mm512_add_ps(sums, _mm512_maskz_loadu_ps(mask, tile.c.add(at))) } else { sums };
            // SAFETY: __m256bh and __m256i are the same 32 bytes; the store moves the bits.
            let rounded: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(value));
            _mm256_mask_storeu_epi16(tile.narrow.add(at) as *mut i16, mask, rounded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a test operand (rows x cols) lies in its storage.
    #[derive(Clone, Copy, Debug)]
    enum Layout {
        RowMajor,
        /// The storage is cols x rows.
        Transposed,
        /// Row-major with a gap after every element: neither stride is 1.
        Spread,
    }

    /// The storage of `values` in `layout` (as given, or with a zero after each value).
    fn stored(values: &[f32], layout: Layout) -> Vec<f32> {
        match layout {
            Layout::Spread => values.iter().flat_map(|&v| [v, 0.0]).collect(),
            _ => values.to_vec(),
        }
    }

    /// The operand of `storage` made by [`stored`].
    fn operand(storage: &[f32], rows: usize, cols: usize, layout: Layout) -> Operand {
        let (rs, cs) = match layout {
            Layout::RowMajor => (cols as isize, 1),
            Layout::Transposed => (1, rows as isize),
            Layout::Spread => (2 * cols as isize, 2),
        };
        Operand { ptr: storage.as_ptr(), rs, cs }
    }

    /// Values exact in bfloat16 (eighths up to +-6), so both precisions have one exact answer.
    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|v| ((v * seed % 13) as f32 - 6.0) / 8.0).collect()
    }

    /// Runs `product` on every layout, thread count and accumulate flag over ragged shapes (k
    /// across slices, m across A blocks, n across B blocks, odd k) and checks C, and that C's
    /// padding columns stay untouched, against a float64 reference.
    fn check_layouts(tolerance: f64, product: impl Fn(usize, usize, usize, (Layout, Layout), &[f32], &[f32], &mut [f32], usize, bool, usize)) {
        use Layout::*;
        let shapes = [(1, 1, 1), (1, 37, 300), (13, 33, 257), (29, 65, 5), (300, 70, 520), (50, 700, 40), (7, 2, 3), (3, 2100, 17), (5, 40, 1023)];
        let layouts =
            [(RowMajor, RowMajor, 1), (RowMajor, Transposed, 2), (Transposed, RowMajor, 2), (Transposed, Transposed, 3), (Spread, Spread, 2)];
        for &(m, n, k) in &shapes {
            for (ta, tb, threads) in layouts {
                let (a, b) = (stored(&values(m * k, 7), ta), stored(&values(k * n, 5), tb));
                let (oa, ob) = (operand(&a, m, k, ta), operand(&b, k, n, tb));
                let read = |o: &Operand, r: usize, c: usize| unsafe { *o.at(r, c) } as f64;
                for accumulate in [false, true] {
                    let ldc = n + 3;
                    let mut c = vec![1f32; m * ldc];
                    product(m, n, k, (ta, tb), &a, &b, &mut c, ldc, accumulate, threads);
                    for i in 0..m {
                        for j in 0..ldc {
                            let got = c[i * ldc + j] as f64;
                            let want = if j >= n {
                                1.0
                            } else {
                                (0..k).map(|p| read(&oa, i, p) * read(&ob, p, j)).sum::<f64>() + if accumulate { 1.0 } else { 0.0 }
                            };
                            assert!(
                                (got - want).abs() <= tolerance * want.abs().max(1.0),
                                "{m}x{n}x{k} {ta:?} x {tb:?}: c[{i}][{j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matches_a_float64_reference_on_ragged_shapes_and_layouts() {
        if !available() {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        check_layouts(1e-4, |m, n, k, (ta, tb), a, b, c, ldc, accumulate, threads| {
            // SAFETY: the operands address m x k and k x n elements of their vectors; c holds m
            // rows of stride ldc; the CPU has AVX-512F.
            unsafe { sgemm(m, n, k, operand(a, m, k, ta), operand(b, k, n, tb), c.as_mut_ptr(), ldc, accumulate, threads) }
        });
    }

    #[test]
    fn a_packed_right_operand_gives_the_float64_reference_product() {
        if !available() {
            eprintln!("skipped: no AVX-512F on this CPU");
            return;
        }
        check_layouts(1e-4, |m, n, k, (ta, tb), a, b, c, ldc, accumulate, _threads| {
            // SAFETY: as for sgemm above; the packed operand is used twice to show that a
            // product leaves it as it was.
            unsafe {
                let packed = PackedB::new(operand(b, k, n, tb), k, n);
                let mut first = c.to_vec();
                packed.multiply(m, operand(a, m, k, ta), first.as_mut_ptr(), ldc, accumulate);
                packed.multiply(m, operand(a, m, k, ta), c.as_mut_ptr(), ldc, accumulate);
                assert_eq!(first, c, "a second product with the same packed operand differs");
            }
        });
    }

    #[test]
    fn bfloat16_matches_the_float64_reference_on_ragged_shapes_and_layouts() {
        if !bf16_available() {
            eprintln!("skipped: no AVX512-BF16 on this CPU");
            return;
        }
        check_bf16_products::<Bf16>();
    }

    #[test]
    fn bfloat16_on_amx_tiles_matches_the_float64_reference_on_ragged_shapes_and_layouts() {
        if !super::super::amx::available() {
            eprintln!("skipped: no AMX-BF16 on this CPU (or OXNET_AMX=0)");
            return;
        }
        check_bf16_products::<super::super::amx::AmxBf16>();
    }

    /// [`check_layouts`] for bfloat16 products by the kernel P.
    fn check_bf16_products<P: Precision<Elem = u16>>() {
        let bits = |values: &[f32]| values.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect::<Vec<u16>>();
        // The product is rounded to bfloat16 once: within half a unit in the last of its 8 bits.
        check_layouts(1.0 / 256.0, |m, n, k, (ta, tb), a, b, c, ldc, accumulate, threads| {
            let (a16, b16) = (bits(a), bits(b));
            let as16 = |o: Operand, values: &[u16]| Operand { ptr: values.as_ptr(), rs: o.rs, cs: o.cs };
            let (oa, ob) = (as16(operand(a, m, k, ta), &a16), as16(operand(b, k, n, tb), &b16));
            // C's values go in as the bfloat16 output (and as the float32 sums to add to); the
            // partial sums are left out where the product allows it.
            let mut out = bits(c);
            let partial = if accumulate || k > BF16_SLICE { c.as_mut_ptr() } else { std::ptr::null_mut() };
            // SAFETY: as above, on the bfloat16 copies; out (and partial where not null) hold m
            // rows of stride ldc; the CPU has P's features (checked by the callers).
            unsafe { gemm::<P>(m, n, k, oa, ob, Dest { partial, out: out.as_mut_ptr(), ldc }, accumulate, threads) };
            for (value, &rounded) in c.iter_mut().zip(&out) {
                *value = half::bf16::from_bits(rounded).to_f32();
            }
        });
    }
}
