//! Depthwise convolution (one input channel per group, as in MobileNet's 3x3 layers), float32.
//! Each output plane is a small stencil over one input plane: there is no sum over channels for a
//! GEMM to block, and as one (1 x k) by (k x positions) GEMM per group (plus its im2col copy) the
//! layers of MobileNet 1.0 at batch 1 ran 5-9x slower than PyTorch's (0.43-0.93 ms against
//! 0.05-0.14 ms a layer).
//!
//! Each input plane is rewritten once into its zero-padded copy split by stride phase: padded
//! position `(z, y, x)` goes to phase volume `(z % sd, y % sh, x % sw)` at `(z / sd, y / sh,
//! x / sw)`. Numbering output positions the way a phase volume numbers its own, every kernel tap
//! then reads the input of output position q at `q + offset[tap]`, one constant per tap for the
//! whole plane, whatever the stride, dilation or padding. The plane's outputs are computed as one
//! run of vectors over q, each vector summing its taps in registers; the columns between output
//! rows (a phase row is a little longer than an output row) are computed and dropped when the
//! rows are copied out. Per-row bookkeeping cost more than the arithmetic on 7..14-wide planes.

use super::convolution::{copy_short, Geometry};
use super::{simd, Scratch, SendPtr};
use crate::error::Result;

/// Whether `g` is depthwise (every group one input channel) and so taken by this module.
pub(super) fn suits(g: &Geometry) -> bool {
    g.groups > 0 && g.channels == g.groups
}

/// Where a plane's phase volumes and outputs are, for one geometry.
struct PhaseLayout {
    /// Stride per axis: phase volumes per axis.
    phases: [usize; 3],
    /// Extents of one phase volume: padded extents divided by the stride, rounded up.
    lens: [usize; 3],
    /// Distance from an output position to its input, per kernel tap (in the weight's order).
    offsets: Vec<usize>,
    /// Output positions from the first to the last one, in phase-volume numbering.
    span: usize,
}

impl PhaseLayout {
    fn new(g: &Geometry) -> PhaseLayout {
        let phases = g.stride.map(|s| s.max(1));
        let lens: [usize; 3] = std::array::from_fn(|a| (g.input[a] + 2 * g.pad[a]).div_ceil(phases[a]));
        let volume = lens.iter().product::<usize>();
        let mut offsets = Vec::with_capacity(g.kernel_size());
        for kz in 0..g.kernel[0] {
            for ky in 0..g.kernel[1] {
                for kx in 0..g.kernel[2] {
                    let at = [kz * g.dilate[0], ky * g.dilate[1], kx * g.dilate[2]];
                    let phase = (at[0] % phases[0] * phases[1] + at[1] % phases[1]) * phases[2] + at[2] % phases[2];
                    let within = (at[0] / phases[0] * lens[1] + at[1] / phases[1]) * lens[2] + at[2] / phases[2];
                    offsets.push(phase * volume + within);
                }
            }
        }
        let [od, oh, ow] = g.output;
        let span = if g.output_size() == 0 { 0 } else { ((od - 1) * lens[1] + oh - 1) * lens[2] + ow };
        PhaseLayout { phases, lens, offsets, span }
    }

    /// Elements of all phase volumes.
    fn plane_len(&self) -> usize {
        self.phases.iter().product::<usize>() * self.lens.iter().product::<usize>()
    }

    /// Copies `plane` (one input channel of `g`) into `phased`, whose padding stays as it is
    /// (zero: every plane's interior lands at the same places).
    fn fill(&self, g: &Geometry, plane: &[f32], phased: &mut [f32]) {
        let ([sd, sh, sw], [_, lh, lw]) = (self.phases, self.lens);
        let (iw, pw, volume) = (g.input[2], g.pad[2], self.lens.iter().product::<usize>());
        if iw == 0 {
            return;
        }
        for (row, values) in plane.chunks_exact(iw).enumerate() {
            let (z, y) = (row / g.input[1] + g.pad[0], row % g.input[1] + g.pad[1]);
            let row_start = ((z % sd * sh + y % sh) * sw * volume) + (z / sd * lh + y / sh) * lw;
            // Phase p holds padded columns p, p + sw, ...: input columns from the first of them
            // at or after the padding.
            if sw == 1 {
                copy_short(&mut phased[row_start + pw..][..iw], values);
                continue;
            }
            if sw == 2 {
                // Pairs of columns: the first of each goes to phase pw % 2, the second to the
                // other, deinterleaved by plain loops the compiler vectorizes.
                let (first_at, second_at) = (row_start + pw % 2 * volume + pw / 2, row_start + (pw + 1) % 2 * volume + pw.div_ceil(2));
                let (low, high) = phased.split_at_mut(first_at.max(second_at));
                let (first, second) = if first_at < second_at { (&mut low[first_at..], high) } else { (high, &mut low[second_at..]) };
                let (pairs, tail) = values.as_chunks::<2>();
                for ((a, b), pair) in first.iter_mut().zip(second.iter_mut()).zip(pairs) {
                    (*a, *b) = (pair[0], pair[1]);
                }
                if let Some(&last) = tail.first() {
                    first[pairs.len()] = last;
                }
                continue;
            }
            for p in 0..sw {
                let skip = (p + sw - pw % sw) % sw;
                let dst = &mut phased[row_start + p * volume + (pw + skip) / sw..];
                for (d, &v) in dst.iter_mut().zip(values.iter().skip(skip).step_by(sw)) {
                    *d = v;
                }
            }
        }
    }
}

/// `block[q] = bias + sum over taps of weight[tap] * phased[q + offset[tap]]` for q over the
/// block, tiles of PV vectors of W positions at a time, the tile's sums in registers (PV
/// accumulators keep both FMA pipes busy across the FMA latency).
#[inline(always)]
fn stencil<const W: usize, const PV: usize, const FUSED: bool>(phased: &[f32], offsets: &[usize], weights: &[f32], bias: f32, block: &mut [f32]) {
    let max_offset = offsets.iter().copied().max().unwrap_or(0);
    // What the unchecked loads below rely on: every tile's runs lie inside `phased`.
    assert!(block.len().is_multiple_of(PV * W) && phased.len() >= block.len() + max_offset, "depthwise buffers sized for another tile");
    for (t, dst) in block.chunks_exact_mut(PV * W).enumerate() {
        let mut acc = [[bias; W]; PV];
        let tile = phased.as_ptr().wrapping_add(t * PV * W);
        for (&offset, &w) in offsets.iter().zip(weights) {
            // SAFETY: tile start + offset + PV * W <= block.len() + max_offset <= phased.len()
            // (asserted above).
            for (v, acc_vec) in acc.iter_mut().enumerate() {
                let x_vec: [f32; W] = unsafe { std::ptr::read_unaligned(tile.add(offset + v * W) as *const [f32; W]) };
                for (a, &xv) in acc_vec.iter_mut().zip(&x_vec) {
                    *a = if FUSED { w.mul_add(xv, *a) } else { *a + w * xv };
                }
            }
        }
        for (d, a) in dst.chunks_exact_mut(W).zip(&acc) {
            d.copy_from_slice(a);
        }
    }
}

/// Vectors per tile of [`stencil`] on this CPU (its PV): eight accumulators where there are
/// registers for them.
fn tile_vectors() -> usize {
    match simd::f32_lanes() {
        4 => 4,
        _ => 8,
    }
}

/// The output planes of one input plane's filters (`multiplier` of them, weights `w` and biases
/// side by side) from its phased copy, through `block` (the span rounded up to vectors).
#[inline(always)]
fn correlate_plane<const W: usize, const PV: usize, const FUSED: bool>(
    g: &Geometry,
    layout: &PhaseLayout,
    phased: &[f32],
    (w, bias): (&[f32], Option<&[f32]>),
    block: &mut [f32],
    out: &mut [f32],
) {
    let (ks, [_, oh, ow], [_, lh, lw]) = (g.kernel_size(), g.output, layout.lens);
    for (m, out_plane) in out.chunks_exact_mut(g.output_size()).enumerate() {
        stencil::<W, PV, FUSED>(phased, &layout.offsets, &w[m * ks..][..ks], bias.map_or(0.0, |b| b[m]), block);
        for (r, out_row) in out_plane.chunks_exact_mut(ow).enumerate() {
            copy_short(out_row, &block[(r / oh * lh + r % oh) * lw..][..ow]);
        }
    }
}

/// `response = W * image (+ bias)` for the whole batch: `image` is (batch, channels, input
/// positions), `weight` (filters, 1, kernel), `response` (batch, filters, output positions).
/// Planes are spread over the thread pool in contiguous runs, each with buffers of its own.
pub(super) fn correlate(g: &Geometry, image: &[f32], weight: &[f32], bias: Option<&[f32]>, response: &mut [f32]) -> Result<()> {
    let (planes, multiplier) = (g.batch * g.channels, g.filters / g.groups.max(1));
    let (ins, ks, lanes) = (g.input_size(), g.kernel_size(), simd::f32_lanes());
    let block_len = multiplier * g.output_size();
    if planes == 0 || block_len == 0 {
        return Ok(());
    }
    let layout = PhaseLayout::new(g);
    let parts = if response.len() * ks < super::PARALLEL_GRAIN { 1 } else { crate::engine::parallel::threads().min(planes) };
    let response_ptr = SendPtr(response.as_mut_ptr());
    let results = crate::engine::parallel::map(parts, |part| -> Result<()> {
        // The span rounded up to whole tiles, and as much slack after the phase volumes for the
        // last, partly junk, tile's reads.
        let tile = lanes * tile_vectors();
        let mut phased = Scratch::<f32>::zeroed(layout.plane_len() + tile)?;
        let mut block = Scratch::<f32>::zeroed(layout.span.div_ceil(tile) * tile)?;
        for p in part * planes / parts..(part + 1) * planes / parts {
            let c = p % g.channels;
            layout.fill(g, &image[p * ins..][..ins], phased.as_mut_slice());
            // SAFETY: output block p (the `multiplier` planes of image p / channels, channel c) is
            // written by the task that owns plane p alone; blocks are disjoint and lie inside
            // `response`, which holds planes * block_len elements.
            let out = unsafe { std::slice::from_raw_parts_mut(response_ptr.get().add(p * block_len), block_len) };
            let filters = (&weight[c * multiplier * ks..][..multiplier * ks], bias.map(|b| &b[c * multiplier..][..multiplier]));
            let (phased, block) = (phased.as_slice(), block.as_mut_slice());
            simd::vectorized(
                #[inline(always)]
                || match lanes {
                    16 => correlate_plane::<16, 8, true>(g, &layout, phased, filters, block, out),
                    8 => correlate_plane::<8, 8, true>(g, &layout, phased, filters, block, out),
                    _ => correlate_plane::<4, 4, false>(g, &layout, phased, filters, block, out),
                },
            );
        }
        Ok(())
    });
    results.into_iter().collect()
}
