//! Stride-1 float32 convolution without a column matrix. In a zero-padded copy of the image, the
//! input that output position q reads through kernel offset k sits a fixed distance `offset[k]`
//! after q once both are numbered in padded coordinates:
//! `response[f, q] = sum_k sum_c W[f, c, k] * padded[c, q + offset[k]]`.
//! A register-tiled kernel computes that sum directly from the padded image (no im2col copy, no
//! GEMM packing of the image): each tile keeps FB filters x PV vectors of consecutive positions in
//! registers, loading PV input vectors and broadcasting FB weights per (offset, channel) step.
//! Where output lines are whole vectors long, each vector reads its own place in the padded image
//! and is written straight into the output; otherwise the positions run on through the padding
//! columns between output lines ("junk" that is computed and dropped, `span / output_size - 1`
//! extra work) into a block that is copied out. The data gradient is the same kernel on the
//! response with the offsets mirrored and the weight transposed. The weight gradient sums over
//! positions: a second kernel broadcasts padded-image values against filter vectors of the
//! response transposed to (position, filter), filters zero-padded to whole vectors.
//!
//! Measured on the ResNet-style 3x3 64-channel 16x16 layer, batch 16, 2 threads: forward 2.06 ->
//! 1.15 ms, data + weight gradient 5.0 -> 2.95 ms against im2col + GEMM.

use super::convolution::{copy_short, Geometry};
use super::linalg::transpose_f32;
use super::{outside, part, part_mut, tail, tail_mut, Scratch};
use crate::backend::cpu::simd;
use crate::base::DType;
use crate::error::Result;
use std::ops::Range;

/// The operator named in this module's errors.
const OP: &str = "Convolution (shifted)";

/// Fewest channels per group worth it: below, the per-offset sums are too short and im2col's
/// single long GEMM wins.
const MIN_CHANNELS: usize = 16;
/// Most computed positions per output position (junk columns and a last tile's idle spans
/// included): 7x7 outputs, 61 positions in 96 computed at batch 1, ran 3.3 ms against im2col's 1.0
/// (512 channels, 3x3) and at batch 32, 4 images a chunk, 35 ms against 22.5.
const MAX_SPAN_RATIO: f64 = 1.3;
/// Fewest output positions for which the shifted kernel, its filters split over the threads,
/// beats im2col + a GEMM on all threads when a chunk holds one image; and it never does for 1x1
/// kernels. Measured at batch 1, 2 threads (ms, shifted / im2col): 3x3 64 channels 56x56 0.72 /
/// 0.80, 128 channels 28x28 0.73 / 0.75, 256 channels 14x14 1.01 / 0.73; 1x1 512 channels 14x14
/// 0.89 / 0.30, 128 channels 56x56 0.76 / 0.61.
const MIN_SPLIT_OUTPUTS: usize = 28 * 28;
/// Positions a chunk aims for: small images are laid side by side up to this.
const TARGET_POSITIONS: usize = 256;
/// Every kernel shape's tile width (PV x W positions) divides this; padded rows are rounded up to
/// it so that the last tile of a row reads and writes inside the buffers.
const TILE_QUANTUM: usize = 48;

fn round_up(n: usize) -> usize {
    n.div_ceil(TILE_QUANTUM) * TILE_QUANTUM
}

/// Where a chunk's positions live in padded coordinates.
#[derive(Clone, Debug)]
pub(super) struct ShiftedLayout {
    /// Padded extents (depth, height, width).
    padded: [usize; 3],
    /// Elements of one padded image plane (the distance between images side by side).
    plane: usize,
    /// Positions from the first output to the last one of an image, in padded coordinates.
    span: usize,
    /// Distance from an output position to the input it reads, per kernel offset (in the weight's
    /// kernel order).
    offsets: Vec<usize>,
    /// Images per chunk, side by side `plane` apart.
    pub images: usize,
}

impl ShiftedLayout {
    /// The layout for `g`, or None where im2col is the better (or the only) strategy.
    pub fn for_geometry(g: &Geometry, dtype: DType) -> Option<ShiftedLayout> {
        if dtype != DType::F32 || g.stride != [1; 3] || g.channels / g.groups < MIN_CHANNELS || g.output_size() == 0 {
            return None;
        }
        let ([id, ih, iw], [pd, ph, pw]) = (g.input, g.pad);
        let padded = [id + 2 * pd, ih + 2 * ph, iw + 2 * pw];
        let plane = padded.iter().product::<usize>();
        let [_, hp, wp] = padded;
        let [od, oh, ow] = g.output;
        let span = (od - 1) * hp * wp + (oh - 1) * wp + ow;
        let ([kd, kh, kw], [dd, dh, dw]) = (g.kernel, g.dilate);
        let mut offsets = Vec::with_capacity(g.kernel_size());
        for a in 0..kd {
            for b in 0..kh {
                for c in 0..kw {
                    offsets.push((a * dd * hp + b * dh) * wp + c * dw);
                }
            }
        }
        let lanes = simd::f32_lanes();
        let one_image = g.batch < crate::engine::parallel::threads();
        if one_image && (g.kernel_size() == 1 || g.output_size() < MIN_SPLIT_OUTPUTS) {
            return None;
        }
        let images = if one_image {
            // The chunks run in turn, each splitting its filters over the threads (see
            // `correlate_rows_split`), which needs one image a chunk.
            1
        } else {
            // Where output lines are whole vectors, a chunk's images give whole tiles of spans
            // (vectors of output lines; see `Shifted::correlate`) if their count is right: 16x16
            // outputs are 16 spans an image, and one image a chunk left a third of its last tile
            // idle.
            let mut images = TARGET_POSITIONS.div_ceil(plane);
            if correlates_in_place(g) {
                let spans_per_image = od * oh * (ow / lanes);
                images = (images..images + tile_spans()).find(|k| (k * spans_per_image).is_multiple_of(tile_spans())).unwrap_or(images);
            }
            images.clamp(1, g.batch.max(1))
        };
        // Positions computed for a chunk: its spans rounded up to whole tiles, and where output
        // lines are not whole vectors, the padding columns between them.
        let vectors = if correlates_in_place(g) { images * od * oh * (ow / lanes) } else { ((images - 1) * plane + span).div_ceil(lanes) };
        let computed = vectors.div_ceil(tile_spans()) * tile_spans() * lanes;
        if computed as f64 > MAX_SPAN_RATIO * (images * g.output_size()) as f64 {
            return None;
        }
        Some(ShiftedLayout { padded, plane, span, offsets, images })
    }

    /// The largest offset: the zero margin in front of a response row that lets the data gradient
    /// read `q - offset[k]` as `q + (margin - offset[k])`.
    fn margin(&self) -> usize {
        self.offsets.iter().copied().max().unwrap_or(0)
    }

    /// Distance between channel rows of the padded images: `images` planes, rounded up to tiles.
    fn positions(&self, images: usize) -> usize {
        round_up(images * self.plane)
    }

    /// Computed positions for `images` side by side (from the first output to the last).
    fn columns(&self, images: usize) -> usize {
        images.saturating_sub(1) * self.plane + self.span
    }

    /// Distance between filter rows of the response block: the margin, then every position.
    fn response_row(&self, images: usize) -> usize {
        self.margin() + self.positions(images)
    }

    /// Scratch for the products in `uses` (each buffer is zeroed, so an unused one is left
    /// empty rather than cleared for nothing).
    pub fn buffers(&self, g: &Geometry, uses: Uses) -> Result<ShiftedBuffers> {
        let (cpg, fpg) = (g.channels / g.groups, g.filters / g.groups);
        let sized = |needed: bool, len: usize| Scratch::zeroed(if needed { len } else { 0 });
        // One tile of slack: the last channel row's last tile reads up to a tile past its row.
        let padded_len = cpg * self.positions(self.images) + TILE_QUANTUM;
        let (correlate_block, scatter_block) = (uses.correlate && !correlates_in_place(g), uses.scatter && !scatters_in_place(g));
        let stride = filter_stride(fpg);
        Ok(ShiftedBuffers {
            padded: sized(uses.correlate || uses.weight_grad, padded_len)?,
            padded_grad: sized(scatter_block, padded_len)?,
            response: sized(correlate_block || uses.scatter, fpg * self.response_row(self.images) + TILE_QUANTUM)?,
            weight_grad: sized(uses.weight_grad, g.groups * self.offsets.len() * cpg * stride)?,
            response_t: sized(uses.weight_grad, self.images * g.output_size() * stride)?,
            staging_t: sized(uses.weight_grad && stride != fpg, g.output_size() * fpg)?,
            chunk_weight_grad: sized(uses.weight_grad, self.offsets.len() * cpg * stride)?,
            packed: None,
            packed_transposed: None,
        })
    }

    /// Every input line of one image: (line start in the image plane, line start in the padded
    /// plane); lines are `g.input[2]` long.
    fn input_lines(&self, g: &Geometry) -> impl Iterator<Item = (usize, usize)> + Clone {
        let ([id, ih, iw], [pd, ph, pw]) = (g.input, g.pad);
        let [_, hp, wp] = self.padded;
        (0..id).flat_map(move |d| (0..ih).map(move |h| ((d * ih + h) * iw, ((d + pd) * hp + h + ph) * wp + pw)))
    }

    /// Every output line: (line start in the output plane, line start in padded coordinates);
    /// lines are `g.output[2]` long.
    fn output_lines(&self, g: &Geometry) -> impl Iterator<Item = (usize, usize)> + Clone {
        let [od, oh, ow] = g.output;
        let [_, hp, wp] = self.padded;
        (0..od).flat_map(move |d| (0..oh).map(move |h| ((d * oh + h) * ow, (d * hp + h) * wp)))
    }
}

/// Which of the three products a chunk's buffers serve.
#[derive(Clone, Copy, Debug)]
pub(super) struct Uses {
    pub correlate: bool,
    pub scatter: bool,
    pub weight_grad: bool,
}

/// Whether [`Shifted::correlate`] writes output lines straight into the response (they are
/// whole vectors long).
fn correlates_in_place(g: &Geometry) -> bool {
    let [_, _, ow] = g.output;
    ow.is_multiple_of(simd::f32_lanes())
}

/// Whether [`Shifted::scatter`] adds input lines straight into the image gradient.
fn scatters_in_place(g: &Geometry) -> bool {
    let [_, _, iw] = g.input;
    iw.is_multiple_of(simd::f32_lanes())
}

/// Per-chunk scratch of the shifted strategy (one task's, for one operator call).
pub(super) struct ShiftedBuffers {
    /// Padded images of one group, channel rows `positions` apart: the borders stay zero.
    padded: Scratch<f32>,
    /// The padded image gradient of one group.
    padded_grad: Scratch<f32>,
    /// One group's response rows in padded coordinates after a zero margin (junk is zero when
    /// the response is an input).
    response: Scratch<f32>,
    /// The task's running weight gradient by kernel offset: (group, offset, channel, filter).
    weight_grad: Scratch<f32>,
    /// One group's response, output positions major (image, output position, filter).
    response_t: Scratch<f32>,
    /// One image's group of response planes, transposed.
    staging_t: Scratch<f32>,
    /// One chunk's and group's weight gradient, laid out like the running sum's groups.
    chunk_weight_grad: Scratch<f32>,
    /// The weight packed for the forward kernel, every group (packed on first use).
    packed: Option<PackedWeight>,
    /// The transposed weight packed for the data-gradient kernel.
    packed_transposed: Option<PackedWeight>,
}

/// The three convolution products over a chunk of images. Arguments are as in `ImageProducts`:
/// `image` the input side, `response` the output side, whole-batch arrays; `weight` the weight.
pub(super) struct Shifted<'a> {
    pub g: &'a Geometry,
    pub layout: &'a ShiftedLayout,
    /// Threads each product may split its rows over (all of them when chunks run in turn).
    pub threads: usize,
}

impl Shifted<'_> {
    /// Copies group `grp` of `images` into the padded buffer (their interiors; borders are zero).
    fn pad_images(&self, images: &Range<usize>, grp: usize, image: &[f32], padded: &mut [f32]) -> Result<()> {
        let g = self.g;
        let (cpg, plane_in, plane) = (g.channels / g.groups, g.input_size(), self.layout.plane);
        let [_, _, iw] = g.input;
        let row = self.layout.positions(images.len());
        for (k, n) in images.clone().enumerate() {
            for c in 0..cpg {
                let src = part(OP, image, (n * g.channels + grp * cpg + c) * plane_in, plane_in, "an image channel")?;
                let dst = part_mut(OP, padded, c * row + k * plane, plane, "a padded channel")?;
                for (from, to) in self.layout.input_lines(g) {
                    copy_short(part_mut(OP, dst, to, iw, "a padded line")?, part(OP, src, from, iw, "an image line")?);
                }
            }
        }
        Ok(())
    }

    /// Gathers group `grp` of `response` for `images` into the response block (after each row's
    /// margin), zero everywhere else.
    fn gather(&self, images: &Range<usize>, grp: usize, response: &[f32], block: &mut [f32]) -> Result<()> {
        let g = self.g;
        let (fpg, outs) = (g.filters / g.groups, g.output_size());
        let [_, _, ow] = g.output;
        let (row, margin) = (self.layout.response_row(images.len()), self.layout.margin());
        part_mut(OP, block, 0, fpg * row, "the response block")?.fill(0.0);
        for (k, n) in images.clone().enumerate() {
            for f in 0..fpg {
                let src = part(OP, response, (n * g.filters + grp * fpg + f) * outs, outs, "a response plane")?;
                let dst = tail_mut(OP, block, f * row + margin + k * self.layout.plane, "the response block")?;
                for (from, to) in self.layout.output_lines(g) {
                    copy_short(part_mut(OP, dst, to, ow, "a response block line")?, part(OP, src, from, ow, "a response line")?);
                }
            }
        }
        Ok(())
    }

    /// response = W * image for `images`, every group.
    ///
    /// # Safety
    /// `weight` holds the whole float32 weight; `response` the whole-batch response array, whose
    /// blocks for `images` nobody else touches during the call.
    pub unsafe fn correlate(
        &self,
        images: Range<usize>,
        image: &[f32],
        weight: *const u8,
        response: *mut f32,
        buf: &mut ShiftedBuffers,
    ) -> Result<()> {
        let g = self.g;
        let (fpg, cpg, outs) = (g.filters / g.groups, g.channels / g.groups, g.output_size());
        let [_, _, ow] = g.output;
        let (row, margin) = (self.layout.response_row(images.len()), self.layout.margin());
        // SAFETY: the caller guarantees that `weight` holds the whole float32 weight.
        let weight = unsafe { std::slice::from_raw_parts(weight.cast::<f32>(), g.filters * cpg * g.kernel_size()) };
        let packed: &PackedWeight = match &mut buf.packed {
            Some(packed) => packed,
            empty => empty.insert(PackedWeight::new(weight, g.groups, fpg, cpg, g.kernel_size(), false, tile_rows())?),
        };
        // Whole output lines of vectors are computed straight into the response; otherwise the
        // positions run on through the padding columns into a block, and the lines are copied out.
        let direct = correlates_in_place(g);
        let spans = if direct {
            self.line_spans(&images, self.layout.output_lines(g), ow, g.filters * outs)
        } else {
            contiguous_spans(self.layout.columns(images.len()))
        };
        // SAFETY: the caller guarantees that `response` is the whole-batch response array and
        // that this chunk's images of it are this call's alone.
        let chunk = unsafe { std::slice::from_raw_parts_mut(response.add(images.start * g.filters * outs), images.len() * g.filters * outs) };
        let (padded, block) = (buf.padded.as_mut_slice(), buf.response.as_mut_slice());
        for grp in 0..g.groups {
            self.pad_images(&images, grp, image, padded)?;
            let source = Rows { data: padded, stride: self.layout.positions(images.len()), count: cpg };
            if direct {
                let target = RowsMut { data: tail_mut(OP, chunk, grp * fpg * outs, "the response")?, stride: outs, count: fpg };
                correlate_rows_split(source, &self.layout.offsets, packed.group(grp)?, target, &spans, self.threads)?;
                continue;
            }
            let target = RowsMut { data: tail_mut(OP, block, margin, "the response block")?, stride: row, count: fpg };
            correlate_rows_split(source, &self.layout.offsets, packed.group(grp)?, target, &spans, self.threads)?;
            for k in 0..images.len() {
                for f in 0..fpg {
                    let dst = part_mut(OP, chunk, (k * g.filters + grp * fpg + f) * outs, outs, "a response plane")?;
                    let src = tail(OP, block, f * row + margin + k * self.layout.plane, "the response block")?;
                    for (to, from) in self.layout.output_lines(g) {
                        copy_short(part_mut(OP, dst, to, ow, "a response line")?, part(OP, src, from, ow, "a response block line")?);
                    }
                }
            }
        }
        Ok(())
    }

    /// One span per vector of each line of `images` (lines of `width`, a whole number of vectors,
    /// given by `lines` as (start in the image's plane, start in padded coordinates)): reading
    /// at the line's padded position, writing at its place in the chunk's array, whose images are
    /// `image_stride` apart.
    fn line_spans(&self, images: &Range<usize>, lines: impl Iterator<Item = (usize, usize)> + Clone, width: usize, image_stride: usize) -> Vec<Span> {
        let lanes = simd::f32_lanes();
        let mut spans = Vec::new();
        for k in 0..images.len() {
            for (in_plane, in_padded) in lines.clone() {
                for w0 in (0..width).step_by(lanes) {
                    spans.push(Span { src: k * self.layout.plane + in_padded + w0, dst: k * image_stride + in_plane + w0 });
                }
            }
        }
        spans
    }

    /// image = W^T * response for `images`, every group (overwritten).
    ///
    /// # Safety
    /// As [`Self::correlate`], for the whole-batch `image` array.
    pub unsafe fn scatter(&self, images: Range<usize>, response: &[f32], weight: *const u8, image: *mut f32, buf: &mut ShiftedBuffers) -> Result<()> {
        let g = self.g;
        let (fpg, cpg, plane_in) = (g.filters / g.groups, g.channels / g.groups, g.input_size());
        let [_, _, iw] = g.input;
        let positions = self.layout.positions(images.len());
        // SAFETY: the caller guarantees that `weight` holds the whole float32 weight.
        let weight = unsafe { std::slice::from_raw_parts(weight.cast::<f32>(), g.filters * cpg * g.kernel_size()) };
        let packed: &PackedWeight = match &mut buf.packed_transposed {
            Some(packed) => packed,
            empty => empty.insert(PackedWeight::new(weight, g.groups, fpg, cpg, g.kernel_size(), true, tile_rows())?),
        };
        let margin = self.layout.margin();
        let mirrored: Vec<usize> = self.layout.offsets.iter().map(|&o| margin - o).collect();
        // As in `correlate`: whole input lines of vectors are written straight into the image;
        // otherwise every padded position is computed into a buffer and the lines copied from it.
        let direct = scatters_in_place(g);
        let spans = if direct {
            self.line_spans(&images, self.layout.input_lines(g), iw, g.channels * plane_in)
        } else {
            contiguous_spans(images.len() * self.layout.plane)
        };
        // SAFETY: the caller guarantees that `image` is the whole-batch image array and that this
        // chunk's images of it are this call's alone.
        let chunk = unsafe { std::slice::from_raw_parts_mut(image.add(images.start * g.channels * plane_in), images.len() * g.channels * plane_in) };
        let (padded_grad, block) = (buf.padded_grad.as_mut_slice(), buf.response.as_mut_slice());
        for grp in 0..g.groups {
            self.gather(&images, grp, response, block)?;
            let source = Rows { data: block, stride: self.layout.response_row(images.len()), count: fpg };
            if direct {
                let target = RowsMut { data: tail_mut(OP, chunk, grp * cpg * plane_in, "the image")?, stride: plane_in, count: cpg };
                correlate_rows_split(source, &mirrored, packed.group(grp)?, target, &spans, self.threads)?;
                continue;
            }
            let target = RowsMut { data: padded_grad, stride: positions, count: cpg };
            correlate_rows_split(source, &mirrored, packed.group(grp)?, target, &spans, self.threads)?;
            for k in 0..images.len() {
                for c in 0..cpg {
                    let dst = part_mut(OP, chunk, (k * g.channels + grp * cpg + c) * plane_in, plane_in, "an image channel")?;
                    let src = tail(OP, padded_grad, c * positions + k * self.layout.plane, "the padded image gradient")?;
                    for (to, from) in self.layout.input_lines(g) {
                        copy_short(part_mut(OP, dst, to, iw, "an image line")?, part(OP, src, from, iw, "a padded line")?);
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds the gradient of the weight over `images`, every group, to the buffers' running sum;
    /// [`Self::finish_weight_grad`] moves the sum into the weight's layout.
    pub fn accumulate_weight_grad(&self, images: Range<usize>, image: &[f32], response: &[f32], buf: &mut ShiftedBuffers) -> Result<()> {
        let g = self.g;
        let (fpg, cpg, kernel) = (g.filters / g.groups, g.channels / g.groups, g.kernel_size());
        let (outs, positions, stride) = (g.output_size(), self.layout.positions(images.len()), filter_stride(fpg));
        let [od, oh, ow] = g.output;
        // Output lines: where each starts in the padded images and in the transposed response.
        let mut lines = Vec::with_capacity(images.len() * od * oh);
        for k in 0..images.len() {
            let plane = self.layout.plane;
            lines.extend(self.layout.output_lines(g).map(|(in_plane, in_padded)| Line { src: k * plane + in_padded, row: k * outs + in_plane }));
        }
        let per_group = kernel * cpg * stride;
        for grp in 0..g.groups {
            let padded = buf.padded.as_mut_slice();
            self.pad_images(&images, grp, image, padded)?;
            let source = Rows { data: padded, stride: positions, count: cpg };
            let transposed = buf.response_t.as_mut_slice();
            self.gather_transposed(&images, grp, response, transposed, buf.staging_t.as_mut_slice())?;
            // The kernel overwrites (adding inside it spills its accumulators), so it fills the
            // chunk's sum, which is then added to the running one.
            let chunk_sum = buf.chunk_weight_grad.as_mut_slice();
            let transposed = part(OP, transposed, 0, images.len() * outs * stride, "the transposed response")?;
            weight_grad_rows(&source, &self.layout.offsets, transposed, stride, &lines, ow, chunk_sum)?;
            let by_offset = part_mut(OP, buf.weight_grad.as_mut_slice(), grp * per_group, per_group, "the weight gradient sums")?;
            by_offset.iter_mut().zip(chunk_sum.iter()).for_each(|(total, v)| *total += v);
        }
        Ok(())
    }

    /// Adds the running sum of [`Self::accumulate_weight_grad`] to `weight_grad` (shaped like the
    /// weight).
    pub fn finish_weight_grad(&self, buf: &mut ShiftedBuffers, weight_grad: &mut [f32]) -> Result<()> {
        let g = self.g;
        let (fpg, cpg, kernel) = (g.filters / g.groups, g.channels / g.groups, g.kernel_size());
        if fpg == 0 || cpg == 0 || kernel == 0 {
            // An empty weight: nothing to add.
            return Ok(());
        }
        let stride = filter_stride(fpg);
        let by_offset = buf.weight_grad.as_slice();
        for grp in 0..g.groups {
            let sums = part(OP, by_offset, grp * kernel * cpg * stride, kernel * cpg * stride, "the weight gradient sums")?;
            let total = part_mut(OP, weight_grad, grp * fpg * cpg * kernel, fpg * cpg * kernel, "the weight gradient")?;
            for (fc, taps) in total.chunks_exact_mut(kernel).enumerate() {
                let (f, c) = (fc / cpg, fc % cpg);
                // Offset k's sum for (c, f) is at (k * cpg + c) * stride + f.
                for (tap, sum) in taps.iter_mut().zip(sums.iter().skip(c * stride + f).step_by(cpg * stride)) {
                    *tap += sum;
                }
            }
        }
        Ok(())
    }

    /// Group `grp` of `response` for `images`, output positions major: `transposed[(k * outputs +
    /// p) * stride + f]` for image k, output position p, filter f, with `stride` = [`filter_stride`]
    /// (zero past the last filter).
    fn gather_transposed(&self, images: &Range<usize>, grp: usize, response: &[f32], transposed: &mut [f32], staging: &mut [f32]) -> Result<()> {
        let g = self.g;
        let (fpg, outs) = (g.filters / g.groups, g.output_size());
        let stride = filter_stride(fpg);
        for (k, n) in images.clone().enumerate() {
            let planes = part(OP, response, (n * g.filters + grp * fpg) * outs, fpg * outs, "a group's response planes")?;
            let rows = part_mut(OP, transposed, k * outs * stride, outs * stride, "the transposed response")?;
            if stride == fpg {
                transpose_f32(planes, fpg, outs, rows);
                continue;
            }
            // Here 0 < fpg < stride (an empty group has stride == fpg).
            let staging = part_mut(OP, staging, 0, outs * fpg, "the transposing buffer")?;
            transpose_f32(planes, fpg, outs, staging);
            for (row, position) in rows.chunks_exact_mut(stride).zip(staging.chunks_exact(fpg)) {
                let (filters, padding) = row.split_at_mut_checked(fpg).ok_or_else(|| outside(OP, "a transposed row", 0, fpg, stride))?;
                filters.copy_from_slice(position);
                padding.fill(0.0);
            }
        }
        Ok(())
    }
}

/// Filters per position in the transposed response and in the weight-gradient sums: the count
/// rounded up to whole vectors, the padding zero.
fn filter_stride(fpg: usize) -> usize {
    fpg.next_multiple_of(simd::f32_lanes())
}

/// One output line of the weight gradient's sum: its first position in the padded source rows
/// and its first row of the transposed response.
#[derive(Clone, Copy, Debug)]
struct Line {
    src: usize,
    row: usize,
}

/// `out[k][c][f] = sum over lines, x < len: source[c][src + x + offsets[k]] * transposed[row +
/// x][f]` (the transposed response's rows `stride` filters long, a multiple of the vector width)
/// with a register-tiled kernel. Only output positions are visited, never the padding between
/// lines and images.
fn weight_grad_rows(source: &Rows, offsets: &[usize], transposed: &[f32], stride: usize, lines: &[Line], len: usize, out: &mut [f32]) -> Result<()> {
    if !stride.is_multiple_of(simd::f32_lanes()) {
        crate::bail!(Runtime, "Convolution (shifted): filter stride {stride} is not whole vectors");
    }
    simd::vectorized(
        #[inline(always)]
        || match simd::f32_lanes() {
            16 if stride.is_multiple_of(64) => weight_grad_tiles::<16, 4, 6, true>(source, offsets, transposed, stride, lines, len, out),
            16 if stride.is_multiple_of(32) => weight_grad_tiles::<16, 2, 6, true>(source, offsets, transposed, stride, lines, len, out),
            16 => weight_grad_tiles::<16, 1, 8, true>(source, offsets, transposed, stride, lines, len, out),
            8 if stride.is_multiple_of(16) => weight_grad_tiles::<8, 2, 6, true>(source, offsets, transposed, stride, lines, len, out),
            8 => weight_grad_tiles::<8, 1, 6, true>(source, offsets, transposed, stride, lines, len, out),
            _ => weight_grad_tiles::<4, 1, 4, false>(source, offsets, transposed, stride, lines, len, out),
        },
    )
}

/// [`weight_grad_rows`] with tiles of NC channels by FV vectors of W filters: each step loads one
/// position's FV filter vectors and broadcasts NC input values against them.
#[inline(always)]
fn weight_grad_tiles<const W: usize, const FV: usize, const NC: usize, const FUSED: bool>(
    source: &Rows,
    offsets: &[usize],
    transposed: &[f32],
    fpg: usize,
    lines: &[Line],
    len: usize,
    out: &mut [f32],
) -> Result<()> {
    let (channels, fb) = (source.count, FV * W);
    let max_offset = offsets.iter().max().copied().unwrap_or(0);
    let (max_src, max_row) = lines.iter().fold((0, 0), |(s, r), line| (s.max(line.src), r.max(line.row)));
    // These bounds are what the unchecked loads below rely on: every channel row reads up to the
    // last line's end plus the largest offset, the transposed rows up to the last line's end,
    // and a tile's filters stay inside a row.
    let source_fits = lines.is_empty() || channels == 0 || source.data.len() >= (channels - 1) * source.stride + max_src + len + max_offset;
    let transposed_fits = lines.is_empty() || transposed.len() >= (max_row + len) * fpg;
    if !fpg.is_multiple_of(fb) || !source_fits || !transposed_fits || out.len() < offsets.len() * channels * fpg {
        crate::bail!(
            Runtime,
            "Convolution (shifted): weight gradient of {channels} channels x {fpg} filters over {} lines of {len} from {} source and {} response elements into {}",
            lines.len(),
            source.data.len(),
            transposed.len(),
            out.len()
        );
    }
    for (k, &offset) in offsets.iter().enumerate() {
        for c0 in (0..channels).step_by(NC) {
            // Rows past the last channel repeat it; their sums are dropped.
            let starts: [usize; NC] = std::array::from_fn(|j| (c0 + j).min(channels - 1) * source.stride + offset);
            for f0 in (0..fpg).step_by(fb) {
                let mut acc = [[[0f32; W]; FV]; NC];
                for line in lines {
                    for x in 0..len {
                        // SAFETY: checked above: rows up to the last line's end lie inside
                        // `transposed`, and f0 + fb <= fpg, the row length.
                        let w: [[f32; W]; FV] =
                            unsafe { std::ptr::read_unaligned(transposed.as_ptr().add((line.row + x) * fpg + f0) as *const [[f32; W]; FV]) };
                        for (acc_row, &start) in acc.iter_mut().zip(&starts) {
                            // SAFETY: checked above: every row reads up to the last line's end
                            // plus the largest offset inside `source.data`.
                            let xv = unsafe { *source.data.get_unchecked(start + line.src + x) };
                            for (acc_vec, w_vec) in acc_row.iter_mut().zip(&w) {
                                for (a, &wv) in acc_vec.iter_mut().zip(w_vec) {
                                    *a = if FUSED { xv.mul_add(wv, *a) } else { *a + xv * wv };
                                }
                            }
                        }
                    }
                }
                for (j, acc_row) in acc.iter().enumerate().take(channels - c0) {
                    let dst = part_mut(OP, out, (k * channels + c0 + j) * fpg + f0, fb, "the weight gradient")?;
                    for (d, v) in dst.chunks_exact_mut(W).zip(acc_row) {
                        d.copy_from_slice(v);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Read-only rows of a strided 2-D buffer.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    stride: usize,
    count: usize,
}

/// Writable rows of a strided 2-D buffer.
struct RowsMut<'a> {
    data: &'a mut [f32],
    stride: usize,
    count: usize,
}

/// A weight rearranged for [`correlate_rows`]: per group, per block of FB output rows, per input
/// row, per kernel offset, the block's FB weights side by side (zero past the last output row).
/// `transposed` packs W^T (output rows are the weight's channels), for the data gradient.
struct PackedWeight {
    data: Vec<f32>,
    per_group: usize,
    block: usize,
}

impl PackedWeight {
    fn new(weight: &[f32], groups: usize, fpg: usize, cpg: usize, kernel: usize, transposed: bool, block: usize) -> Result<PackedWeight> {
        let (outputs, inputs) = if transposed { (cpg, fpg) } else { (fpg, cpg) };
        let blocks = outputs.div_ceil(block.max(1));
        let per_group = blocks * kernel * inputs * block;
        let mut data = vec![0f32; groups * per_group];
        if weight.len() < groups * fpg * cpg * kernel {
            crate::bail!(Runtime, "Convolution (shifted): a weight of {} elements for {groups} groups of {fpg} x {cpg} x {kernel}", weight.len());
        }
        if per_group == 0 {
            // No filters, channels or taps: nothing to pack.
            return Ok(PackedWeight { data, per_group, block });
        }
        // Here fpg, cpg, kernel and block are all positive.
        for (packed, filters) in data.chunks_exact_mut(per_group).zip(weight.chunks_exact(fpg * cpg * kernel)) {
            for o in 0..outputs {
                for i in 0..inputs {
                    let (f, c) = if transposed { (i, o) } else { (o, i) };
                    let taps = part(OP, filters, (f * cpg + c) * kernel, kernel, "a weight's taps")?;
                    // Tap k of (o, i) goes to ((o / block * inputs + i) * kernel + k) * block + o % block.
                    let first = (o / block * inputs + i) * kernel * block + o % block;
                    for (slot, &w) in packed.iter_mut().skip(first).step_by(block).zip(taps) {
                        *slot = w;
                    }
                }
            }
        }
        Ok(PackedWeight { data, per_group, block })
    }

    fn group(&self, grp: usize) -> Result<(&[f32], usize)> {
        Ok((part(OP, &self.data, grp * self.per_group, self.per_group, "a group's packed weight")?, self.block))
    }
}

/// Spans per register tile of [`correlate_rows`] on this CPU (its PV).
fn tile_spans() -> usize {
    match simd::f32_lanes() {
        16 => 3,
        _ => 2,
    }
}

/// Output rows per register tile of [`correlate_rows`] on this CPU (its FB).
fn tile_rows() -> usize {
    match simd::f32_lanes() {
        16 => 8,
        8 => 6,
        _ => 4,
    }
}

/// Where one vector of positions is read and written: `src` is its first position in every source
/// row (before the kernel offset), `dst` in every target row.
#[derive(Clone, Copy, Debug)]
struct Span {
    src: usize,
    dst: usize,
}

/// Spans covering positions `0..columns` rounded up to whole vectors (the buffers are long enough
/// for it), read and written at the same place.
fn contiguous_spans(columns: usize) -> Vec<Span> {
    (0..columns).step_by(simd::f32_lanes()).map(|q| Span { src: q, dst: q }).collect()
}

/// [`correlate_rows`] with the target's rows cut into runs of whole tiles that up to `threads`
/// tasks compute in parallel, when every span lies inside its row (so that the runs are disjoint
/// slices); else on this thread. At batch 1, a 3x3 64-channel 56x56 layer ran 1.06 ms on one
/// thread with im2col + a two-thread GEMM at 1.12.
fn correlate_rows_split(
    source: Rows,
    offsets: &[usize],
    (packed, block): (&[f32], usize),
    target: RowsMut,
    spans: &[Span],
    threads: usize,
) -> Result<()> {
    if block == 0 {
        crate::bail!(Runtime, "Convolution (shifted): a weight packed in blocks of no rows");
    }
    let tiles = target.count.div_ceil(block);
    let parts = threads.min(tiles);
    if parts <= 1 || spans.iter().any(|span| span.dst + simd::f32_lanes() > target.stride) {
        return correlate_rows(source, offsets, (packed, block), target, spans);
    }
    let per_tile = packed.len() / tiles;
    let (mut rows_left, mut weights_left) = (target.data, packed);
    let mut pieces = Vec::with_capacity(parts);
    for part in 0..parts {
        let (first, end) = (part * tiles / parts, (part + 1) * tiles / parts);
        let count = (end * block).min(target.count) - first * block;
        let (rows, rest) = if part + 1 == parts {
            (rows_left, <&mut [f32]>::default())
        } else {
            let total = rows_left.len();
            rows_left
                .split_at_mut_checked(count * target.stride)
                .ok_or_else(|| outside(OP, "a run of target rows", 0, count * target.stride, total))?
        };
        let weights_len = weights_left.len();
        let (weights, weights_rest) = weights_left
            .split_at_checked((end - first) * per_tile)
            .ok_or_else(|| outside(OP, "a run of packed weights", 0, (end - first) * per_tile, weights_len))?;
        pieces.push((RowsMut { data: rows, stride: target.stride, count }, weights));
        (rows_left, weights_left) = (rest, weights_rest);
    }
    crate::engine::parallel::map_owned(pieces, |_, (rows, weights)| correlate_rows(source, offsets, (weights, block), rows, spans))
        .into_iter()
        .collect()
}

/// For every target row o and span: `target[o][dst + j] = sum_k sum_i packed(o, i, k) *
/// source[i][src + j + offsets[k]]` for the span's vector of positions j.
fn correlate_rows(source: Rows, offsets: &[usize], (packed, block): (&[f32], usize), target: RowsMut, spans: &[Span]) -> Result<()> {
    if block != tile_rows() {
        crate::bail!(Runtime, "Convolution (shifted): a weight packed in blocks of {block} rows for tiles of {}", tile_rows());
    }
    simd::vectorized(
        #[inline(always)]
        || match simd::f32_lanes() {
            16 => correlate_tiles::<16, 3, 8, true>(&source, offsets, packed, target, spans),
            8 => correlate_tiles::<8, 2, 6, true>(&source, offsets, packed, target, spans),
            _ => correlate_tiles::<4, 2, 4, false>(&source, offsets, packed, target, spans),
        },
    )
}

/// [`correlate_rows`] with tiles of FB rows by PV spans of W positions; FMA when `FUSED`.
///
/// The loops are shaped for the code generator: loops over a tile run a trip count known at
/// compile time (a last short tile computes its last span again in the missing places and stores
/// only its own), and the store of the accumulators reads them at constant indices. Variants that
/// zipped with the tile's run-time length or split whole tiles from a remainder kept the
/// accumulators in memory, stored (or reloaded) around every FMA: 3-5x slower.
#[inline(always)]
fn correlate_tiles<const W: usize, const PV: usize, const FB: usize, const FUSED: bool>(
    source: &Rows,
    offsets: &[usize],
    packed: &[f32],
    target: RowsMut,
    spans: &[Span],
) -> Result<()> {
    let per_block = offsets.len() * source.count * FB;
    let blocks = target.count.div_ceil(FB);
    let max_offset = offsets.iter().max().copied().unwrap_or(0);
    let (max_src, max_dst) = spans.iter().fold((0, 0), |(s, d), span| (s.max(span.src), d.max(span.dst)));
    // These bounds are what the unchecked loads below rely on: every source row holds every
    // span's vector at every offset.
    let source_fits = spans.is_empty() || source.count == 0 || source.data.len() >= (source.count - 1) * source.stride + max_src + max_offset + W;
    let target_fits = spans.is_empty() || target.count == 0 || target.data.len() >= (target.count - 1) * target.stride + max_dst + W;
    if per_block == 0 || !packed.len().is_multiple_of(per_block) || packed.len() < blocks * per_block || !source_fits || !target_fits {
        crate::bail!(
            Runtime,
            "Convolution (shifted): {} rows of {} from {} source rows of {} ({} elements) and {} packed weights over {} offsets into {} elements",
            target.count,
            target.stride,
            source.count,
            source.stride,
            source.data.len(),
            packed.len(),
            offsets.len(),
            target.data.len()
        );
    }
    let out = target.data;
    let out_len = out.len();
    for (b, weights) in packed.chunks_exact(per_block).take(blocks).enumerate() {
        let rows = FB.min(target.count - b * FB);
        for tile in spans.chunks(PV) {
            let Some(&last) = tile.last() else { continue };
            let picked: [Span; PV] = std::array::from_fn(|v| tile.get(v).copied().unwrap_or(last));
            let mut acc = [[[0f32; W]; PV]; FB];
            // Input row outer, offsets inner: the row's few cache lines under this tile serve
            // every offset while they are in L1.
            for (i, taps) in weights.chunks_exact(offsets.len() * FB).enumerate() {
                let row = source.data.as_ptr().wrapping_add(i * source.stride);
                for (&offset, w) in offsets.iter().zip(taps.chunks_exact(FB)) {
                    // SAFETY: checked above: every source row i < count holds src + max offset +
                    // W elements for every span.
                    let x: [[f32; W]; PV] = picked.map(|span| unsafe { std::ptr::read_unaligned(row.add(span.src + offset) as *const [f32; W]) });
                    for (acc_row, &wf) in acc.iter_mut().zip(w) {
                        for (acc_vec, x_vec) in acc_row.iter_mut().zip(&x) {
                            for (a, &xv) in acc_vec.iter_mut().zip(x_vec) {
                                *a = if FUSED { wf.mul_add(xv, *a) } else { *a + wf * xv };
                            }
                        }
                    }
                }
            }
            for (r, acc_row) in acc.iter().enumerate().take(rows) {
                let row_start = (b * FB + r) * target.stride;
                for (acc_vec, span) in acc_row.iter().zip(&picked).take(tile.len()) {
                    // Inside by the check above (a span lies inside its row).
                    let dst = out
                        .get_mut(row_start + span.dst..)
                        .and_then(|s| s.first_chunk_mut::<W>())
                        .ok_or_else(|| outside(OP, "a target vector", row_start + span.dst, W, out_len))?;
                    *dst = *acc_vec;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile shape (whichever this CPU would pick) against the direct sum, with a partial
    /// last block of output rows, a partial last tile of spans, spans with gaps between them and
    /// placed elsewhere in the target than in the source; positions outside the spans untouched.
    #[test]
    fn every_tile_shape_matches_the_direct_sum() {
        let (inputs, outputs, offsets) = (3, 11, [0usize, 1, 7, 9]);
        type Kernel = fn(&Rows, &[usize], &[f32], RowsMut, &[Span]) -> Result<()>;
        let shapes: [(usize, usize, Kernel); 4] = [
            (16, 8, correlate_tiles::<16, 3, 8, true>),
            (8, 6, correlate_tiles::<8, 2, 6, true>),
            (4, 4, correlate_tiles::<4, 2, 4, false>),
            (simd::f32_lanes(), tile_rows(), |s, o, p, t, sp| correlate_rows(Rows { ..*s }, o, (p, tile_rows()), t, sp)),
        ];
        for (lanes, block, kernel) in shapes {
            // Seven spans: pairs of vectors 3 apart in the source, packed tightly in the target
            // after a one-vector hole.
            let spans: Vec<Span> = (0..7).map(|v| Span { src: (v / 2) * (2 * lanes + 3) + (v % 2) * lanes, dst: (v + 1) * lanes }).collect();
            let stride = spans[6].src + lanes + 9;
            let source: Vec<f32> = (0..inputs * stride).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let weight: Vec<f32> = (0..outputs * inputs * offsets.len()).map(|i| ((i * 53 % 89) as f32 - 44.0) / 30.0).collect();
            let packed = PackedWeight::new(&weight, 1, outputs, inputs, offsets.len(), false, block).unwrap();
            let out_stride = 8 * lanes + 5;
            let mut out = vec![1.5f32; outputs * out_stride];
            let source = Rows { data: &source, stride, count: inputs };
            kernel(&source, &offsets, packed.group(0).unwrap().0, RowsMut { data: &mut out, stride: out_stride, count: outputs }, &spans).unwrap();
            for o in 0..outputs {
                for q in 0..out_stride {
                    let span = spans.iter().find(|s| (s.dst..s.dst + lanes).contains(&q));
                    let want = span.map_or(1.5, |s| {
                        (0..inputs)
                            .flat_map(|i| offsets.iter().enumerate().map(move |(k, &off)| (i, k, off)))
                            .map(|(i, k, off)| weight[(o * inputs + i) * offsets.len() + k] * source.data[i * stride + s.src + (q - s.dst) + off])
                            .sum()
                    });
                    let got = out[o * out_stride + q];
                    assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{lanes} lanes: row {o} position {q}: {got} vs {want}");
                }
            }
        }
    }

    /// Every weight-gradient tile shape against the direct sum, with a partial last block of
    /// channels and lines that skip source positions and transposed rows between them.
    #[test]
    fn every_weight_grad_tile_shape_matches_the_direct_sum() {
        let (channels, fpg, offsets, len) = (7, 64, [0usize, 2, 5], 6);
        let lines: Vec<Line> = (0..4).map(|l| Line { src: l * (len + 3), row: l * (len + 1) + 2 }).collect();
        let stride = 4 * (len + 3) + 5;
        let rows = 4 * (len + 1) + 2;
        let source: Vec<f32> = (0..channels * stride).map(|i| ((i * 41 % 97) as f32 - 48.0) / 20.0).collect();
        let transposed: Vec<f32> = (0..rows * fpg).map(|i| ((i * 29 % 83) as f32 - 41.0) / 30.0).collect();
        let source = Rows { data: &source, stride, count: channels };
        type Kernel = fn(&Rows, &[usize], &[f32], usize, &[Line], usize, &mut [f32]) -> Result<()>;
        let shapes: [Kernel; 7] = [
            weight_grad_tiles::<16, 4, 6, true>,
            weight_grad_tiles::<16, 2, 6, true>,
            weight_grad_tiles::<16, 1, 8, true>,
            weight_grad_tiles::<8, 2, 6, true>,
            weight_grad_tiles::<8, 1, 6, true>,
            weight_grad_tiles::<4, 1, 4, false>,
            weight_grad_rows,
        ];
        for (shape, kernel) in shapes.iter().enumerate() {
            let mut out = vec![f32::NAN; offsets.len() * channels * fpg];
            kernel(&source, &offsets, &transposed, fpg, &lines, len, &mut out).unwrap();
            for (k, &offset) in offsets.iter().enumerate() {
                for c in 0..channels {
                    for f in 0..fpg {
                        let want: f32 = lines
                            .iter()
                            .flat_map(|line| (0..len).map(move |x| (line.src + x, line.row + x)))
                            .map(|(q, row)| source.data[c * stride + q + offset] * transposed[row * fpg + f])
                            .sum();
                        let got = out[(k * channels + c) * fpg + f];
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "shape {shape}: offset {k} channel {c} filter {f}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
