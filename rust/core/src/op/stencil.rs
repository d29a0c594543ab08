//! Per-plane stencils over stride-phased planes, float32: depthwise convolution (one input
//! channel per group, as in MobileNet's 3x3 layers) and max pooling with overlapping windows
//! (ResNet's 3x3 stride-2 stem pooling).
//!
//! Each output plane is a small stencil over one input plane. As one (1 x k) by (k x positions)
//! GEMM per group (plus its im2col copy), the depthwise layers of MobileNet 1.0 at batch 1 ran
//! 5-9x slower than PyTorch's (0.43-0.93 ms against 0.05-0.14 ms a layer); window-by-window
//! pooling, 0.74 ms for the 64 x 112 x 112 stem pooling.
//!
//! Each input plane is rewritten once into its padded copy split by stride phase: padded
//! position `(z, y, x)` goes to phase volume `(z % sd, y % sh, x % sw)` at `(z / sd, y / sh,
//! x / sw)`. Numbering output positions the way a phase volume numbers its own, every kernel tap
//! then reads the input of output position q at `q + offset[tap]`, one constant per tap for the
//! whole plane, whatever the stride, dilation or padding. The plane's outputs are computed as one
//! run of vectors over q, each vector combining its taps in registers; the columns between output
//! rows (a phase row is a little longer than an output row) are computed and dropped when the
//! rows are copied out. Per-row bookkeeping cost more than the arithmetic on 7..14-wide planes.

use super::conv_epilogue::Epilogue;
use super::convolution::{copy_short, Geometry};
use super::Scratch;
use crate::backend::cpu::simd;
use crate::error::Result;

/// The geometry of a per-plane stencil in three spatial dimensions (leading axes of size one
/// for 1-D and 2-D problems).
pub(super) struct Frame {
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilate: [usize; 3],
    pub pad: [usize; 3],
    pub output: [usize; 3],
}

impl Frame {
    pub(super) fn of_convolution(g: &Geometry) -> Frame {
        Frame { input: g.input, kernel: g.kernel, stride: g.stride, dilate: g.dilate, pad: g.pad, output: g.output }
    }

    /// Whether every window lies inside the padded input (pooling's 'full' and 'same'
    /// conventions can reach past it).
    pub fn windows_inside(&self) -> bool {
        let mut axes = self.output.iter().zip(&self.stride).zip(self.kernel.iter().zip(&self.dilate)).zip(self.input.iter().zip(&self.pad));
        axes.all(|(((&output, &stride), (&kernel, &dilate)), (&input, &pad))| {
            output == 0 || (output - 1) * stride + (kernel - 1) * dilate < input + 2 * pad
        })
    }
}

/// Whether convolution `g` is depthwise (every group one input channel): [`depthwise_correlate`].
pub(super) fn suits_depthwise(g: &Geometry) -> bool {
    g.groups > 0 && g.channels == g.groups
}

/// Where a plane's phase volumes and outputs are, for one frame. im2col reads its lines from
/// the same layout (convolution).
pub(super) struct PhaseLayout {
    /// Stride per axis: phase volumes per axis.
    phases: [usize; 3],
    /// Extents of one phase volume: padded extents divided by the stride, rounded up.
    pub lens: [usize; 3],
    /// Distance from an output position to its input, per kernel tap (row-major kernel order).
    pub offsets: Vec<usize>,
    /// Output positions from the first to the last one, in phase-volume numbering.
    span: usize,
}

impl PhaseLayout {
    pub(super) fn new(f: &Frame) -> PhaseLayout {
        let phases = f.stride.map(|s| s.max(1));
        let mut lens = [0; 3];
        for ((len, &phase), (&input, &pad)) in lens.iter_mut().zip(&phases).zip(f.input.iter().zip(&f.pad)) {
            *len = (input + 2 * pad).div_ceil(phase);
        }
        let volume = lens.iter().product::<usize>();
        let mut offsets = Vec::with_capacity(f.kernel.iter().product());
        for kz in 0..f.kernel[0] {
            for ky in 0..f.kernel[1] {
                for kx in 0..f.kernel[2] {
                    let at = [kz * f.dilate[0], ky * f.dilate[1], kx * f.dilate[2]];
                    let phase = (at[0] % phases[0] * phases[1] + at[1] % phases[1]) * phases[2] + at[2] % phases[2];
                    let within = (at[0] / phases[0] * lens[1] + at[1] / phases[1]) * lens[2] + at[2] / phases[2];
                    offsets.push(phase * volume + within);
                }
            }
        }
        let [od, oh, ow] = f.output;
        let span = if od * oh * ow == 0 { 0 } else { ((od - 1) * lens[1] + oh - 1) * lens[2] + ow };
        PhaseLayout { phases, lens, offsets, span }
    }

    /// Elements of all phase volumes.
    pub(super) fn plane_len(&self) -> usize {
        self.phases.iter().product::<usize>() * self.lens.iter().product::<usize>()
    }

    /// Copies `plane` (one input plane of `f`) into `phased`, whose padding stays as it is
    /// (every plane's interior lands at the same places). `phased` holds [`Self::plane_len`]
    /// elements (or more); a row that would fall past a shorter one is left out, and so is
    /// everything after it.
    pub(super) fn fill<T: Copy>(&self, f: &Frame, plane: &[T], phased: &mut [T]) {
        let (iw, pw, sw, volume) = (f.input[2], f.pad[2], self.phases[2], self.lens.iter().product::<usize>());
        if iw == 0 {
            return;
        }
        for (row, values) in plane.chunks_exact(iw).enumerate() {
            if self.fill_row(f, row, values, phased, (iw, pw, sw, volume)).is_none() {
                return;
            }
        }
    }

    /// One input row of [`Self::fill`]; None where it does not fit in `phased`.
    #[inline(always)]
    fn fill_row<T: Copy>(
        &self,
        f: &Frame,
        row: usize,
        values: &[T],
        phased: &mut [T],
        (iw, pw, sw, volume): (usize, usize, usize, usize),
    ) -> Option<()> {
        let row_start = self.row_start(f, row);
        if sw == 1 {
            copy_short(phased.get_mut(row_start + pw..row_start + pw + iw)?, values);
            return Some(());
        }
        if sw == 2 {
            // Pairs of columns: the first of each goes to phase pw % 2, the second to the
            // other, deinterleaved by plain loops the compiler vectorizes.
            let (first_at, second_at) = (row_start + pw % 2 * volume + pw / 2, row_start + (pw + 1) % 2 * volume + pw.div_ceil(2));
            let (low, high) = phased.split_at_mut_checked(first_at.max(second_at))?;
            let (first, second) = if first_at < second_at { (low.get_mut(first_at..)?, high) } else { (high, low.get_mut(second_at..)?) };
            let (pairs, tail) = values.as_chunks::<2>();
            for ((a, b), pair) in first.iter_mut().zip(second.iter_mut()).zip(pairs) {
                (*a, *b) = (pair[0], pair[1]);
            }
            if let Some(&last) = tail.first() {
                *first.get_mut(pairs.len())? = last;
            }
            return Some(());
        }
        // Phase p holds padded columns p, p + sw, ...: input columns from the first of them
        // at or after the padding.
        for p in 0..sw {
            let skip = (p + sw - pw % sw) % sw;
            let dst = phased.get_mut(row_start + p * volume + (pw + skip) / sw..)?;
            for (d, &v) in dst.iter_mut().zip(values.iter().skip(skip).step_by(sw)) {
                *d = v;
            }
        }
        Some(())
    }

    /// Where input row `row` (depth-major) starts in its phase volumes: the place of its padded
    /// column 0 in phase 0's row.
    fn row_start(&self, f: &Frame, row: usize) -> usize {
        let ([sd, sh, sw], [_, lh, lw]) = (self.phases, self.lens);
        let (z, y) = (row / f.input[1] + f.pad[0], row % f.input[1] + f.pad[1]);
        (z % sd * sh + y % sh) * sw * self.lens.iter().product::<usize>() + (z / sd * lh + y / sh) * lw
    }

    /// The inverse of [`Self::fill`]: the input plane's values read back out of `phased` (the
    /// padding left behind).
    fn unfill(&self, f: &Frame, phased: &[f32], plane: &mut [f32]) -> Result<()> {
        let (iw, pw, sw, volume) = (f.input[2], f.pad[2], self.phases[2], self.lens.iter().product::<usize>());
        if iw == 0 {
            return Ok(());
        }
        for (row, values) in plane.chunks_exact_mut(iw).enumerate() {
            let row_start = self.row_start(f, row);
            for p in 0..sw {
                let skip = (p + sw - pw % sw) % sw;
                let at = row_start + p * volume + (pw + skip) / sw;
                let src =
                    phased.get(at..).ok_or_else(|| crate::err!(Runtime, "stencil: input row {row} lies past the {} phased values", phased.len()))?;
                for (v, &s) in values.iter_mut().skip(skip).step_by(sw).zip(src) {
                    *v = s;
                }
            }
        }
        Ok(())
    }

    /// Copies the output rows of one plane out of `block` (positions in phase numbering).
    fn copy_out(&self, f: &Frame, block: &[f32], out_plane: &mut [f32]) -> Result<()> {
        let ([_, oh, ow], [_, lh, lw]) = (f.output, self.lens);
        if oh == 0 || ow == 0 {
            return Ok(());
        }
        for (r, out_row) in out_plane.chunks_exact_mut(ow).enumerate() {
            let at = (r / oh * lh + r % oh) * lw;
            let row = block.get(at..at + ow).ok_or_else(|| crate::err!(Runtime, "stencil: output row {r} lies past the block of {}", block.len()))?;
            copy_short(out_row, row);
        }
        Ok(())
    }
}

/// Vectors per tile of the stencils on this CPU: eight accumulators (both FMA pipes busy across
/// the FMA latency) where there are registers for them.
fn tile_vectors() -> usize {
    match simd::f32_lanes() {
        4 => 4,
        _ => 8,
    }
}

/// Runs `plane_task(p, phased, block, out)` for every input plane p of `image` (planes of
/// `ins` elements), with `phased` holding its phased copy (padding `pad_value`) and `out` its
/// `out_len` elements of `response`; `block` is scratch for the span rounded up to whole tiles.
/// Planes are spread over the thread pool in contiguous runs, each with buffers of its own.
fn over_planes(
    f: &Frame,
    layout: &PhaseLayout,
    pad_value: f32,
    (image, ins): (&[f32], usize),
    (response, out_len): (&mut [f32], usize),
    taps: usize,
    plane_task: impl Fn(usize, &[f32], &mut [f32], &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    let planes = image.len().checked_div(ins).unwrap_or_else(|| response.len() / out_len.max(1));
    if planes == 0 || out_len == 0 {
        return Ok(());
    }
    if response.len() < planes * out_len {
        crate::bail!(Runtime, "stencil: {} output values for {planes} planes of {out_len}", response.len());
    }
    let parts = if response.len() * taps < super::PARALLEL_GRAIN { 1 } else { crate::engine::parallel::threads().min(planes) };
    let runs = crate::engine::parallel::split_runs(response, out_len, planes, parts);
    let results = crate::engine::parallel::map_owned(runs, |_, (run, outputs)| -> Result<()> {
        // The span rounded up to whole tiles, and as much slack after the phase volumes for the
        // last, partly junk, tile's reads.
        let tile = simd::f32_lanes() * tile_vectors();
        let mut phased = Scratch::<f32>::zeroed(layout.plane_len() + tile)?;
        if pad_value != 0.0 {
            phased.as_mut_slice().fill(pad_value);
        }
        let mut block = Scratch::<f32>::zeroed(layout.span.div_ceil(tile) * tile)?;
        for (p, out) in run.zip(outputs.chunks_exact_mut(out_len)) {
            let plane = image
                .get(p * ins..(p + 1) * ins)
                .ok_or_else(|| crate::err!(Runtime, "stencil: input plane {p} lies past the {} input values", image.len()))?;
            layout.fill(f, plane, phased.as_mut_slice());
            plane_task(p, phased.as_slice(), block.as_mut_slice(), out)?;
        }
        Ok(())
    });
    results.into_iter().collect()
}

/// Every tile of PV vectors of W positions q of `block`: from `start`, `acc = combine(weight,
/// phased[q + offset], acc)` over the (offset, weight) taps, the tile's values in registers.
/// Callers mark `combine` `#[inline(always)]`: a closure does not take on the target features
/// its caller is compiled for, and one left out of line (mul_add then a libm call) ran the
/// depthwise stencil at half speed.
#[inline(always)]
fn tiles<const W: usize, const PV: usize>(
    phased: &[f32],
    (offsets, weights): (&[usize], &[f32]),
    block: &mut [f32],
    start: f32,
    combine: impl Fn(f32, f32, f32) -> f32,
) -> Result<()> {
    let max_offset = offsets.iter().copied().max().unwrap_or(0);
    // What the unchecked loads below rely on: every tile's runs lie inside `phased`.
    if !block.len().is_multiple_of(PV * W) || phased.len() < block.len() + max_offset {
        crate::bail!(Runtime, "stencil: buffers of {} and {} values sized for another tile (offsets up to {max_offset})", phased.len(), block.len());
    }
    for (t, dst) in block.chunks_exact_mut(PV * W).enumerate() {
        let mut acc = [[start; W]; PV];
        let tile = phased.as_ptr().wrapping_add(t * PV * W);
        for (&offset, &weight) in offsets.iter().zip(weights) {
            // One load per vector inside the loop over vectors: loading the tile's vectors into
            // an array first made the compiler vectorize across them with gathers (15x slower).
            for (v, acc_vec) in acc.iter_mut().enumerate() {
                // SAFETY: tile start + offset + PV * W <= block.len() + max_offset <= phased.len()
                // (checked above, before the loop).
                let x_vec: [f32; W] = unsafe { std::ptr::read_unaligned(tile.add(offset + v * W) as *const [f32; W]) };
                for (a, &x) in acc_vec.iter_mut().zip(&x_vec) {
                    *a = combine(weight, x, *a);
                }
            }
        }
        for (d, a) in dst.chunks_exact_mut(W).zip(&acc) {
            d.copy_from_slice(a);
        }
    }
    Ok(())
}

/// Runs `body::<W, PV, FUSED>()` compiled for this CPU's vectors.
macro_rules! vectorized_tiles {
    (|$w:ident, $pv:ident, $fused:ident| $body:expr) => {
        simd::vectorized(
            #[inline(always)]
            || match simd::f32_lanes() {
                16 => {
                    const $w: usize = 16;
                    const $pv: usize = 8;
                    const $fused: bool = true;
                    $body
                }
                8 => {
                    const $w: usize = 8;
                    const $pv: usize = 8;
                    const $fused: bool = true;
                    $body
                }
                _ => {
                    const $w: usize = 4;
                    const $pv: usize = 4;
                    const $fused: bool = false;
                    $body
                }
            },
        )
    };
}

/// `response = W * image`, then `epilogue`, for a depthwise convolution over the whole batch:
/// `image` is (batch, channels, input positions), `weight` (filters, 1, kernel), `response`
/// (batch, filters, output positions); each input plane serves its channel's `filters /
/// channels` filters.
pub(super) fn depthwise_correlate(g: &Geometry, image: &[f32], weight: &[f32], epilogue: &Epilogue, response: &mut [f32]) -> Result<()> {
    let (frame, multiplier, ks) = (Frame::of_convolution(g), g.filters / g.groups.max(1), g.kernel_size());
    let layout = PhaseLayout::new(&frame);
    let (layout, frame) = (&layout, &frame);
    over_planes(frame, layout, 0.0, (image, g.input_size()), (response, multiplier * g.output_size()), ks, |p, phased, block, out| {
        let c = p % g.channels.max(1);
        for (m, out_plane) in out.chunks_exact_mut(g.output_size().max(1)).enumerate() {
            let filter = c * multiplier + m;
            let w = weight
                .get(filter * ks..(filter + 1) * ks)
                .ok_or_else(|| crate::err!(Runtime, "depthwise convolution: no weights for filter {filter} in {} values", weight.len()))?;
            vectorized_tiles!(|W, PV, FUSED| tiles::<W, PV>(
                phased,
                (&layout.offsets, w),
                block,
                0.0,
                #[inline(always)]
                |w, x, a| if FUSED { w.mul_add(x, a) } else { a + w * x }
            ))?;
            layout.copy_out(frame, block, out_plane)?;
            epilogue.apply_plane(filter, out_plane)?;
        }
        Ok(())
    })
}

/// Max pooling of `planes` (each `frame.input` positions) into `pooled` (each `frame.output`),
/// padding never the maximum; a NaN in a window is its maximum, as window-by-window pooling.
/// Every window must lie inside the padded input ([`Frame::windows_inside`]).
pub(super) fn max_pool(frame: &Frame, planes: &[f32], pooled: &mut [f32]) -> Result<()> {
    let layout = PhaseLayout::new(frame);
    let (ins, outs) = (frame.input.iter().product(), frame.output.iter().product());
    // Max pooling weighs nothing: the taps' weights are unused.
    let (layout, unweighted) = (&layout, vec![0.0; layout.offsets.len()]);
    over_planes(frame, layout, f32::NEG_INFINITY, (planes, ins), (pooled, outs), layout.offsets.len(), |_, phased, block, out| {
        vectorized_tiles!(|W, PV, _FUSED| tiles::<W, PV>(
            phased,
            (&layout.offsets, &unweighted),
            block,
            f32::NEG_INFINITY,
            #[inline(always)]
            |_, x, best| if x > best || x.is_nan() { x } else { best }
        ))?;
        layout.copy_out(frame, block, out)
    })
}

/// Whether the gradients of depthwise convolution `g` are taken by [`depthwise_backward`]: one
/// filter per channel.
pub(super) fn suits_depthwise_backward(g: &Geometry) -> bool {
    suits_depthwise(g) && g.filters == g.channels
}

/// The data gradient `dx` (when asked for) and weight gradient `dw` of a depthwise convolution
/// with one filter per channel, from the output gradient `dy`. Per plane: `dy` is laid out in
/// phase numbering (zeros between output rows) behind a margin of the largest tap offset. As the
/// forward pass reads `phased[q + offset[t]]` for output q, its adjoint adds `w[t] * dy[q]` to
/// `phased_grad[q + offset[t]]`: the phased data gradient is a stencil over the laid-out `dy`
/// with the offsets mirrored (`margin - offset`), read back out of its phases like the input was
/// written into them; the weight gradient of tap t is the dot product of the laid-out `dy` with
/// the phased input shifted by `offset[t]`. Tasks own runs of planes; their weight gradients
/// are added in task order, so the sum does not depend on thread timing.
pub(super) fn depthwise_backward(g: &Geometry, x: &[f32], weight: &[f32], dy: &[f32], dx: Option<&mut [f32]>, dw: &mut [f32]) -> Result<()> {
    let frame = Frame::of_convolution(g);
    let layout = PhaseLayout::new(&frame);
    let (ins, outs, ks, channels) = (g.input_size(), g.output_size(), g.kernel_size(), g.channels);
    let planes = g.batch * channels;
    let margin = layout.offsets.iter().copied().max().unwrap_or(0);
    let mirrored: Vec<usize> = layout.offsets.iter().map(|&o| margin - o).collect();
    let tile = simd::f32_lanes() * tile_vectors();
    let phased_len = layout.plane_len().div_ceil(tile) * tile;
    let parts = if planes * (ins + outs) * ks < super::PARALLEL_GRAIN { 1 } else { crate::engine::parallel::threads().min(planes.max(1)) };
    let dx_len = dx.as_deref().map_or(planes * ins, <[f32]>::len);
    if x.len() < planes * ins || dy.len() < planes * outs || weight.len() < channels * ks || dx_len < planes * ins {
        crate::bail!(
            Runtime,
            "depthwise convolution gradient: {} data, {} output gradient, {} weight and {dx_len} data gradient values for {planes} planes of {ins} inputs, {outs} outputs and {ks} taps",
            x.len(),
            dy.len(),
            weight.len()
        );
    }
    // Each task's planes of dx, or none when the data gradient is not asked for.
    let runs: Vec<(std::ops::Range<usize>, Option<&mut [f32]>)> = match dx {
        Some(dx) => crate::engine::parallel::split_runs(dx, ins, planes, parts).into_iter().map(|(run, d)| (run, Some(d))).collect(),
        None => (0..parts).map(|part| (part * planes / parts..(part + 1) * planes / parts, None)).collect(),
    };
    let partials = crate::engine::parallel::map_owned(runs, |_, (run, mut dx_run)| -> Result<Scratch<f32>> {
        let mut partial = Scratch::<f32>::zeroed(channels * ks)?;
        let mut phased = Scratch::<f32>::zeroed(phased_len + margin + tile)?;
        // dy behind its margin, then the phased data gradient's reads run up to a tile past it.
        let mut dy_laid = Scratch::<f32>::zeroed(margin + phased_len + margin + tile)?;
        let mut grad = Scratch::<f32>::zeroed(phased_len)?;
        let ([_, oh, ow], [_, lh, lw]) = (g.output, layout.lens);
        let short = |what: &str, p: usize| crate::err!(Runtime, "depthwise convolution gradient: {what} of plane {p} lies past its buffer");
        for p in run.clone() {
            let c = p % channels.max(1);
            let x_plane = x.get(p * ins..(p + 1) * ins).ok_or_else(|| short("the data", p))?;
            layout.fill(&frame, x_plane, phased.as_mut_slice());
            let laid = dy_laid.as_mut_slice();
            let dy_plane = dy.get(p * outs..(p + 1) * outs).ok_or_else(|| short("the output gradient", p))?;
            for (r, row) in dy_plane.chunks_exact(ow.max(1)).enumerate() {
                let at = margin + (r / oh.max(1) * lh + r % oh.max(1)) * lw;
                copy_short(laid.get_mut(at..at + ow).ok_or_else(|| short("an output gradient row", p))?, row);
            }
            let (laid, phased_x) = (dy_laid.as_slice(), phased.as_slice());
            let taps = partial.as_mut_slice().get_mut(c * ks..(c + 1) * ks).ok_or_else(|| short("the weight gradient", p))?;
            let span = laid.get(margin..margin + layout.span).ok_or_else(|| short("the laid-out output gradient", p))?;
            for (sum, &offset) in taps.iter_mut().zip(&layout.offsets) {
                let shifted = phased_x.get(offset..offset + layout.span).ok_or_else(|| short("a shifted input", p))?;
                *sum += simd::vectorized(
                    #[inline(always)]
                    || dot(span, shifted),
                );
            }
            let Some(dx_run) = dx_run.as_deref_mut() else { continue };
            let w = weight.get(c * ks..(c + 1) * ks).ok_or_else(|| short("the weights", p))?;
            let block = grad.as_mut_slice();
            vectorized_tiles!(|W, PV, FUSED| tiles::<W, PV>(
                laid,
                (&mirrored, w),
                block,
                0.0,
                #[inline(always)]
                |w, v, a| if FUSED { w.mul_add(v, a) } else { a + w * v }
            ))?;
            let at = (p - run.start) * ins;
            layout.unfill(&frame, block, dx_run.get_mut(at..at + ins).ok_or_else(|| short("the data gradient", p))?)?;
        }
        Ok(partial)
    });
    dw.fill(0.0);
    for partial in partials {
        for (total, &v) in dw.iter_mut().zip(partial?.as_slice()) {
            *total += v;
        }
    }
    Ok(())
}

/// The dot product of two equally long runs, summed in 16 lanes (a vector's worth that the
/// compiler keeps in registers; one running sum would serialize on the add latency).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (a_blocks, a_tail) = a.as_chunks::<16>();
    let (b_blocks, b_tail) = b.as_chunks::<16>();
    for (x, y) in a_blocks.iter().zip(b_blocks) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}
