//! Convolution (1-D, 2-D, 3-D; NCW/NCHW/NCDHW) as im2col + GEMM per image and group, and its
//! gradients: col2im of W^T g for the data, g col^T summed over the batch for the weight.
//! Stride-1 float32 layers with enough channels take conv_shifted's direct kernels instead, and
//! float32 depthwise layers (one channel per group) a stencil over stride-phased planes (stencil).
//!
//! Spatial work is done in three dimensions: 1-D and 2-D problems get leading axes of size one,
//! so one set of loops serves every rank.

use super::conv_epilogue::Epilogue;
use super::conv_shifted::{Shifted, ShiftedBuffers, ShiftedLayout, Uses};
use super::grad::{tuple_attr, Grad, InputGrads};
use super::linalg::matmul_checked;
use super::linalg::Mat;
use super::stencil;
use super::{exactly, outside, part, part_mut, sum_lanes, tail, tail_mut, ExecContext, OpDef, Operator, Scratch, SendPtr, Tensor};
use crate::backend::cpu::simd;
use crate::base::{merge_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;
use std::ops::Range;

crate::op_params! {
    /// workspace, cudnn_tune and cudnn_off only steer MXNet's GPU algorithms: accepted, unused.
    #[allow(dead_code)]
    pub struct ConvolutionParams {
        /// Kernel size: (w,), (h, w) or (d, h, w).
        kernel: Vec<i64>,
        /// Stride per spatial axis (default 1).
        stride: Vec<i64> = Vec::new(),
        /// Dilation per spatial axis (default 1).
        dilate: Vec<i64> = Vec::new(),
        /// Zero padding per spatial axis (default 0).
        pad: Vec<i64> = Vec::new(),
        /// Number of output channels.
        num_filter: usize,
        /// Number of groups the channels are split into.
        num_group: usize = 1,
        /// Maximum temporary workspace in MB (accepted for compatibility).
        workspace: i64 = 1024,
        /// Whether to disable the bias.
        no_bias: bool = false,
        /// cuDNN algorithm selection (accepted for compatibility).
        cudnn_tune: Option<String> = None,
        /// Disable cuDNN (accepted for compatibility).
        cudnn_off: bool = false,
        /// Data layout: None, 'NCW', 'NCHW' or 'NCDHW' (channels first).
        layout: Option<String> = None,
    }
}

crate::op_params! {
    pub struct ConvolutionBackwardParams {
        /// The forward convolution's parameters are passed through as well.
        kernel: Vec<i64>,
        /// Stride per spatial axis.
        stride: Vec<i64> = Vec::new(),
        /// Dilation per spatial axis.
        dilate: Vec<i64> = Vec::new(),
        /// Zero padding per spatial axis.
        pad: Vec<i64> = Vec::new(),
        /// Number of output channels.
        num_filter: usize,
        /// Number of groups.
        num_group: usize = 1,
        /// Whether the forward had no bias.
        no_bias: bool = false,
        /// Whether the data gradient is used (when not, it is left as zeros and not computed).
        data_grad: bool = true,
    }
}

/// A convolution's geometry in three spatial dimensions.
#[derive(Clone, Debug)]
pub(super) struct Geometry {
    pub batch: usize,
    pub channels: usize,
    pub filters: usize,
    pub groups: usize,
    pub input: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilate: [usize; 3],
    pub pad: [usize; 3],
    pub output: [usize; 3],
    /// Number of spatial axes the caller sees (1, 2 or 3).
    pub rank: usize,
}

impl Geometry {
    pub fn input_size(&self) -> usize {
        self.input.iter().product()
    }
    pub fn output_size(&self) -> usize {
        self.output.iter().product()
    }
    pub fn kernel_size(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Unit stride and dilation and no padding: output lines read contiguous input runs.
    pub fn is_dense(&self) -> bool {
        self.stride == [1; 3] && self.dilate == [1; 3] && self.pad == [0; 3]
    }
    /// Rows of the column matrix of one group: channels per group times kernel positions.
    pub fn col_rows(&self) -> usize {
        self.channels / self.groups * self.kernel_size()
    }
    pub fn weight_shape(&self) -> Shape {
        let mut dims = vec![self.filters, self.channels / self.groups];
        dims.extend(self.kernel.iter().skip(3usize.saturating_sub(self.rank)));
        Shape::new(dims)
    }
    pub fn output_shape(&self) -> Shape {
        let mut dims = vec![self.batch, self.filters];
        dims.extend(self.output.iter().skip(3usize.saturating_sub(self.rank)));
        Shape::new(dims)
    }
    /// Each spatial axis's stride, input and output sizes, dilation and padding.
    fn axes(&self) -> [Axis; 3] {
        let mut axes = [Axis::default(); 3];
        let per_axis = self.stride.iter().zip(&self.input).zip(&self.output).zip(self.dilate.iter().zip(&self.pad));
        for (axis, (((&stride, &input), &output), (&dilate, &pad))) in axes.iter_mut().zip(per_axis) {
            *axis = Axis { stride, input, output, dilate, pad };
        }
        axes
    }
}

/// One spatial axis of a [`Geometry`].
#[derive(Clone, Copy, Default)]
struct Axis {
    stride: usize,
    input: usize,
    output: usize,
    dilate: usize,
    pad: usize,
}

/// The operator named in the errors of the products below (Deconvolution runs them too).
const OP: &str = "Convolution";

/// A per-axis parameter padded to three axes (leading axes take `fill`).
pub(super) fn spatial(op: &str, name: &str, values: &[i64], rank: usize, default: usize, fill: usize) -> Result<[usize; 3]> {
    let mut out = [fill; 3];
    let Some(axes) = 3usize.checked_sub(rank).and_then(|first| out.get_mut(first..)) else {
        crate::bail!(Param, "{op}: a kernel has 1, 2 or 3 spatial axes, got {rank}");
    };
    if values.is_empty() {
        axes.iter_mut().for_each(|v| *v = default);
        return Ok(out);
    }
    if values.len() != rank {
        crate::bail!(Param, "{op}: {name} has {} values for a {rank}-D kernel", values.len());
    }
    for (slot, &v) in axes.iter_mut().zip(values) {
        if v < 0 {
            crate::bail!(Param, "{op}: {name} must be non-negative, got {values:?}");
        }
        *slot = v as usize;
    }
    Ok(out)
}

impl ConvolutionParams {
    pub(super) fn geometry(&self, op: &str, data: &Shape) -> Result<Geometry> {
        let rank = self.kernel.len();
        if !(1..=3).contains(&rank) {
            crate::bail!(Param, "{op}: kernel must have 1, 2 or 3 values, got {:?}", self.kernel);
        }
        if let Some(layout) = &self.layout {
            let expected = match rank {
                1 => "NCW",
                2 => "NCHW",
                _ => "NCDHW",
            };
            if layout != expected {
                crate::bail!(Param, "{op}: layout {layout} is not supported; use {expected} (channels first)");
            }
        }
        if data.ndim() != rank + 2 {
            crate::bail!(Shape, "{op}: a {rank}-D kernel needs {}-D data (batch, channel, spatial...), got {data}", rank + 2);
        }
        let kernel = spatial(op, "kernel", &self.kernel, rank, 1, 1)?;
        let stride = spatial(op, "stride", &self.stride, rank, 1, 1)?;
        let dilate = spatial(op, "dilate", &self.dilate, rank, 1, 1)?;
        let pad = spatial(op, "pad", &self.pad, rank, 0, 0)?;
        if kernel.contains(&0) || stride.contains(&0) || dilate.contains(&0) {
            crate::bail!(Param, "{op}: kernel, stride and dilate must be positive");
        }
        // data has rank + 2 axes (checked above): batch, channels, then the spatial axes.
        let [batch, channels, sizes @ ..] = data.dims() else {
            crate::bail!(Shape, "{op}: data {data} has no batch and channel axes");
        };
        let mut input = [1; 3];
        for (slot, &size) in input.iter_mut().skip(3 - rank).zip(sizes) {
            *slot = size;
        }
        let mut output = [1; 3];
        let per_axis = kernel.iter().zip(&stride).zip(dilate.iter().zip(&pad)).zip(&input);
        for (out, (((&kernel, &stride), (&dilate, &pad)), &input)) in output.iter_mut().zip(per_axis) {
            let extent = dilate * (kernel - 1) + 1;
            let padded = input + 2 * pad;
            if padded < extent {
                crate::bail!(Shape, "{op}: kernel {:?} (dilated) is larger than the padded input {data}", self.kernel);
            }
            *out = (padded - extent) / stride + 1;
        }
        let (batch, channels, groups) = (*batch, *channels, self.num_group);
        if groups == 0 || channels % groups != 0 || !self.num_filter.is_multiple_of(groups) {
            crate::bail!(Param, "{op}: channels ({channels}) and num_filter ({}) must divide by num_group ({groups})", self.num_filter);
        }
        Ok(Geometry { batch, channels, filters: self.num_filter, groups, input, kernel, stride, dilate, pad, output, rank })
    }

    pub(super) fn attrs(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let mut attrs = vec![
            ("kernel", tuple_attr(&self.kernel)),
            ("num_filter", self.num_filter.to_string()),
            ("num_group", self.num_group.to_string()),
            ("no_bias", flag(self.no_bias)),
        ];
        for (name, v) in [("stride", &self.stride), ("dilate", &self.dilate), ("pad", &self.pad)] {
            if !v.is_empty() {
                attrs.push((name, tuple_attr(v)));
            }
        }
        attrs
    }
}

/// For one kernel offset along an axis: the output positions whose input index lies inside the
/// input, as a range, and the input index of output position 0 (possibly negative).
#[inline]
fn valid_outputs(kernel_pos: usize, axis: Axis) -> (std::ops::Range<usize>, isize) {
    let (s, n) = (axis.stride as isize, axis.input as isize);
    let offset = (kernel_pos * axis.dilate) as isize - axis.pad as isize;
    // First o with o*s + offset >= 0, and one past the last with o*s + offset < n.
    let lo = if offset >= 0 { 0 } else { ((-offset) + s - 1) / s };
    let hi = if n - offset <= 0 { 0 } else { (n - offset + s - 1) / s };
    let out = axis.output as isize;
    (lo.clamp(0, out) as usize..hi.clamp(0, out).max(lo.clamp(0, out)) as usize, offset)
}

/// Visit every (row of the column matrix, output line) of channels `c0..c0+cs` of one image:
/// `visit(column_line, input_line_or_none, valid_width_range, w_offset)` where an output line is
/// the run of output positions along the last axis.
fn for_each_line(
    g: &Geometry,
    cs: usize,
    row_stride: usize,
    mut visit: impl FnMut(usize, usize, Option<usize>, std::ops::Range<usize>, isize) -> Result<()>,
) -> Result<()> {
    let [_, ih, iw] = g.input;
    let [od, oh, ow] = g.output;
    let [axis_d, axis_h, axis_w] = g.axes();
    let mut row = 0;
    for c in 0..cs {
        for kd in 0..g.kernel[0] {
            let (d_range, d_off) = valid_outputs(kd, axis_d);
            for kh in 0..g.kernel[1] {
                let (h_range, h_off) = valid_outputs(kh, axis_h);
                for kw in 0..g.kernel[2] {
                    let (w_range, w_off) = valid_outputs(kw, axis_w);
                    for o_d in 0..od {
                        for o_h in 0..oh {
                            let start = row * row_stride + (o_d * oh + o_h) * ow;
                            let inside = d_range.contains(&o_d) && h_range.contains(&o_h);
                            let src = inside.then(|| {
                                let d = (o_d as isize * g.stride[0] as isize + d_off) as usize;
                                let h = (o_h as isize * g.stride[1] as isize + h_off) as usize;
                                (c * g.input[0] + d) * ih * iw + h * iw
                            });
                            visit(start, c, src, w_range.clone(), w_off)?;
                        }
                    }
                    row += 1;
                }
            }
        }
    }
    Ok(())
}

/// [`for_each_line`] for dense geometries (unit stride and dilation, no padding), where every
/// output line reads one contiguous run of the input: `visit(column_line, input_line)`.
#[inline(always)]
fn for_each_dense_line(g: &Geometry, cs: usize, row_stride: usize, mut visit: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
    let [id, ih, iw] = g.input;
    let [od, oh, ow] = g.output;
    let mut row = 0;
    for c in 0..cs {
        for kd in 0..g.kernel[0] {
            for kh in 0..g.kernel[1] {
                for kw in 0..g.kernel[2] {
                    for o_d in 0..od {
                        let input_rows = (c * id + o_d + kd) * ih + kh;
                        for o_h in 0..oh {
                            visit(row * row_stride + (o_d * oh + o_h) * ow, (input_rows + o_h) * iw + kw)?;
                        }
                    }
                    row += 1;
                }
            }
        }
    }
    Ok(())
}

/// `apply(d, s)` over the pairs of two short lines (8 to 30 elements in small CNNs), in fixed
/// blocks of eight: copies compile to plain vector moves instead of a memmove call per line.
#[inline(always)]
fn zip_short<D, S: Copy>(dst: &mut [D], src: &[S], apply: impl Fn(&mut D, S)) {
    let (dst_blocks, dst_tail) = dst.as_chunks_mut::<8>();
    let (src_blocks, src_tail) = src.as_chunks::<8>();
    for (d, s) in dst_blocks.iter_mut().zip(src_blocks) {
        for (d, &s) in d.iter_mut().zip(s) {
            apply(d, s);
        }
    }
    for (d, &s) in dst_tail.iter_mut().zip(src_tail) {
        apply(d, s);
    }
}

pub(super) fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    zip_short(dst, src, |d, s| *d = s);
}

#[inline(always)]
fn add_short<T: Elem>(dst: &mut [T::Acc], src: &[T]) {
    zip_short(dst, src, |d, s| *d = *d + s.widen());
}

/// Where im2col reads its lines: a padded, stride-phased copy of the image's channels in the
/// stencils' phase layout, where every line of the column matrix (one kernel tap, one output
/// row) is one contiguous run, or the image itself where that layout is the image's own (no
/// padding, unit stride). Reading lines of a padded copy replaced a per-line walk that computed
/// each line's valid range and zero-filled around it: ResNet-18's batch-32 column matrices (512
/// channels at 7x7, the 7x7 stride-2 stem) took 3.9 and 7.7 ms that way, 1.5 and 4.6-5.0 this way.
struct ColumnSource {
    frame: stencil::Frame,
    phases: stencil::PhaseLayout,
    copy: LineCopy,
}

impl ColumnSource {
    fn new(g: &Geometry) -> ColumnSource {
        let frame = stencil::Frame::of_convolution(g);
        let phases = stencil::PhaseLayout::new(&frame);
        ColumnSource { frame, phases, copy: LineCopy::for_cpu() }
    }

    /// Whether lines are read from the image as it is.
    fn in_place(&self) -> bool {
        self.frame.pad == [0; 3] && self.frame.stride == [1; 3]
    }

    /// Scratch elements for the phased copies of `channels` channels (none when reading in place).
    fn phased_len(&self, channels: usize) -> usize {
        if self.in_place() {
            0
        } else {
            channels * self.phases.plane_len()
        }
    }

    /// im2col of one image's channels `c0..c0+cs` into the column matrix (rows = channel x
    /// kernel tap, columns = output positions, rows `row_stride` apart so that several images sit
    /// side by side). `phased` holds [`Self::phased_len`] elements whose padding is zero; each
    /// call rewrites the same interior places, so the padding stays zero from call to call.
    fn im2col<T: Elem>(&self, image: &[T], c0: usize, cs: usize, col: &mut [T], row_stride: usize, phased: &mut [T]) -> Result<()> {
        let ([od, oh, ow], [_, lh, lw]) = (self.frame.output, self.phases.lens);
        if od * oh * ow == 0 || cs == 0 {
            return Ok(());
        }
        let plane = self.frame.input.iter().product::<usize>();
        let channels = part(OP, image, c0 * plane, cs * plane, "an image's channels")?;
        let (source, channel_len) = if self.in_place() {
            (channels, plane)
        } else {
            let len = self.phases.plane_len();
            let copies = part_mut(OP, phased, 0, cs * len, "the phased copies")?;
            // An empty image is all padding: the copies stay zero.
            if plane > 0 && len > 0 {
                for (values, copy) in channels.chunks_exact(plane).zip(copies.chunks_exact_mut(len)) {
                    self.phases.fill(&self.frame, values, copy);
                }
            }
            (&*copies, len)
        };
        let taps = self.phases.offsets.len();
        for c in 0..cs {
            for (t, &offset) in self.phases.offsets.iter().enumerate() {
                let row = tail_mut(OP, col, (c * taps + t) * row_stride, "the column matrix")?;
                let from = tail(OP, source, c * channel_len + offset, "the column source")?;
                for o_d in 0..od {
                    let to = tail_mut(OP, row, o_d * oh * ow, "a column row")?;
                    self.copy.lines(to, ow, tail(OP, from, o_d * lh * lw, "a source plane")?, lw, oh, ow)?;
                }
            }
        }
        Ok(())
    }
}

/// Copies runs of elements; with AVX-512 (F, VL, DQ, BW, as `simd::f32_lanes` asks), runs of
/// 4-byte and 2-byte elements go by whole and masked vectors (7x7 outputs are lines of 7, which plain copies move
/// one element at a time; LeNet's second bfloat16 layer spent 12% of its backward pass copying
/// lines of 8 so).
#[derive(Clone, Copy)]
struct LineCopy {
    avx512: bool,
}

impl LineCopy {
    fn for_cpu() -> LineCopy {
        LineCopy { avx512: cfg!(target_arch = "x86_64") && simd::f32_lanes() == 16 }
    }

    /// Copies `lines` runs of `len` elements, `src_step` apart in `src`, to runs `dst_step`
    /// apart in `dst`; an error if a run would lie outside its slice.
    fn lines<T: Copy>(self, dst: &mut [T], dst_step: usize, src: &[T], src_step: usize, lines: usize, len: usize) -> Result<()> {
        if lines == 0 || len == 0 {
            return Ok(());
        }
        if (lines - 1) * dst_step + len > dst.len() || (lines - 1) * src_step + len > src.len() {
            crate::bail!(
                Runtime,
                "{OP}: {lines} lines of {len} elements, {src_step} and {dst_step} apart, from {} into {} elements",
                src.len(),
                dst.len()
            );
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx512 && std::mem::size_of::<T>() == 4 {
            // SAFETY: `avx512` is only set where the CPU has AVX-512 F; every run lies inside its
            // slice (checked above) and T is 4 bytes, so the runs are whole u32 elements.
            unsafe { copy_lines_avx512(dst.as_mut_ptr().cast(), dst_step, src.as_ptr().cast(), src_step, lines, len) };
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx512 && std::mem::size_of::<T>() == 2 {
            // SAFETY: `avx512` is only set where the CPU has AVX-512 F and BW (`f32_lanes`); every run lies
            // inside its slice (checked above) and T is 2 bytes, so the runs are whole u16 elements.
            unsafe { copy_lines_avx512bw(dst.as_mut_ptr().cast(), dst_step, src.as_ptr().cast(), src_step, lines, len) };
            return Ok(());
        }
        for l in 0..lines {
            copy_short(part_mut(OP, dst, l * dst_step, len, "a copied line")?, part(OP, src, l * src_step, len, "a source line")?);
        }
        Ok(())
    }
}

/// [`LineCopy::lines`] for 4-byte elements: whole vectors, then one masked vector per run.
///
/// # Safety
/// The CPU has AVX-512 F; run l reads `src[l * src_step..][..len]` and writes
/// `dst[l * dst_step..][..len]`, which lie inside their allocations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_lines_avx512(dst: *mut u32, dst_step: usize, src: *const u32, src_step: usize, lines: usize, len: usize) {
    use std::arch::x86_64::*;
    let (whole, rest) = (len / 16, len % 16);
    let mask = ((1u32 << rest) - 1) as __mmask16;
    for l in 0..lines {
        // SAFETY: per the contract, each vector's lanes (the masked ones excepted, which neither
        // load nor store) lie inside run l.
        unsafe {
            let (d, s) = (dst.add(l * dst_step), src.add(l * src_step));
            for v in 0..whole {
                _mm512_storeu_si512(d.add(16 * v).cast(), _mm512_loadu_si512(s.add(16 * v).cast()));
            }
            if rest > 0 {
                _mm512_mask_storeu_epi32(d.add(16 * whole).cast(), mask, _mm512_maskz_loadu_epi32(mask, s.add(16 * whole).cast()));
            }
        }
    }
}

/// [`LineCopy::lines`] for 2-byte elements: whole vectors of 32, then one masked vector per run.
///
/// # Safety
/// The CPU has AVX-512 F and BW; run l reads `src[l * src_step..][..len]` and writes
/// `dst[l * dst_step..][..len]`, which lie inside their allocations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn copy_lines_avx512bw(dst: *mut u16, dst_step: usize, src: *const u16, src_step: usize, lines: usize, len: usize) {
    use std::arch::x86_64::*;
    let (whole, rest) = (len / 32, len % 32);
    let mask = ((1u64 << rest) - 1) as __mmask32;
    for l in 0..lines {
        // SAFETY: per the contract, each vector's lanes (the masked ones excepted, which neither
        // load nor store) lie inside run l.
        unsafe {
            let (d, s) = (dst.add(l * dst_step), src.add(l * src_step));
            for v in 0..whole {
                _mm512_storeu_si512(d.add(32 * v).cast(), _mm512_loadu_si512(s.add(32 * v).cast()));
            }
            if rest > 0 {
                _mm512_mask_storeu_epi16(d.add(32 * whole).cast(), mask, _mm512_maskz_loadu_epi16(mask, s.add(32 * whole).cast()));
            }
        }
    }
}

/// col2im, accumulating the column matrix (rows `row_stride` apart) back into the sums of the
/// image's channels `c0..c0+cs` (in `T::Acc`: a 5x5 kernel adds up to 25 columns into each
/// element, which bfloat16 would round 25 times, through float64 conversions that took 56% of a
/// bfloat16 backward pass).
fn col2im<T: Elem>(col: &[T], g: &Geometry, c0: usize, cs: usize, image: &mut [T::Acc], row_stride: usize) -> Result<()> {
    let (plane, sw, ow) = (g.input_size(), g.stride[2], g.output[2]);
    let base = part_mut(OP, image, c0 * plane, cs * plane, "an image's channels")?;
    if g.is_dense() {
        #[cfg(target_arch = "x86_64")]
        if T::DTYPE == DType::BF16 && <T::Acc as Elem>::DTYPE == DType::F32 && simd::f32_lanes() == 16 {
            // SAFETY: T is bfloat16 (u16 bits) and T::Acc float32 (checked just above): same
            // sizes and alignments, every bit pattern valid as u16.
            let (col, base) = unsafe {
                (
                    std::slice::from_raw_parts(col.as_ptr().cast::<u16>(), col.len()),
                    std::slice::from_raw_parts_mut(base.as_mut_ptr().cast::<f32>(), base.len()),
                )
            };
            // SAFETY: 16 float32 lanes means AVX-512 F, VL and BW (`simd::f32_lanes`).
            return unsafe { col2im_dense_bf16(col, g, cs, row_stride, base) };
        }
        // Compiled for the CPU's vectors.
        return simd::vectorized(
            #[inline(always)]
            || {
                for_each_dense_line(
                    g,
                    cs,
                    row_stride,
                    #[inline(always)]
                    |line, dst| {
                        add_short(part_mut(OP, base, dst, ow, "an image line")?, part(OP, col, line, ow, "a column line")?);
                        Ok(())
                    },
                )
            },
        );
    }
    for_each_line(g, cs, row_stride, |start, _c, src, w, w_off| {
        // A tap that reaches no input along the width adds nothing (its clamped start may lie
        // left of the image); a non-empty range starts at the first output whose input is >= 0.
        let Some(src) = src.filter(|_| !w.is_empty()) else { return Ok(()) };
        let first = (w.start as isize * sw as isize + w_off) as usize + src;
        for (k, v) in part(OP, col, start + w.start, w.len(), "a column line")?.iter().enumerate() {
            let at = first + k * sw;
            let total = base.len();
            let slot = base.get_mut(at).ok_or_else(|| outside(OP, "an image element", at, 1, total))?;
            *slot = *slot + v.widen();
        }
        Ok(())
    })
}

/// [`col2im`] of dense geometries for bfloat16 columns into float32 sums, with intrinsics: the
/// generic loop stayed scalar for bfloat16 (LeNet's second layer, lines of 8: col2im was 36% of
/// its backward pass). Input rows of at most 16 elements keep their sums in one register while
/// each tap along the width adds its column line, shifted into place by its load's mask, and are
/// stored once: line by line, each tap reloaded the row the previous tap had just stored, and
/// stalled on store forwarding (the vector add took a third of the function's time). Wider rows
/// go line by line, 16 lanes at a time.
///
/// # Safety
/// The CPU has AVX-512 F, VL and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw")]
unsafe fn col2im_dense_bf16(col: &[u16], g: &Geometry, cs: usize, row_stride: usize, base: &mut [f32]) -> Result<()> {
    use std::arch::x86_64::*;
    let ([id, ih, iw], [od, oh, ow], taps) = (g.input, g.output, g.kernel[2]);
    if iw > 16 {
        return for_each_dense_line(
            g,
            cs,
            row_stride,
            #[inline(always)]
            |line, dst| {
                let (sums, cells) = (part_mut(OP, base, dst, ow, "an image line")?, part(OP, col, line, ow, "a column line")?);
                for (sums, cells) in sums.chunks_mut(16).zip(cells.chunks(16)) {
                    let mask = ((1u32 << sums.len().min(cells.len())) - 1) as __mmask16;
                    // SAFETY: the mask's lanes lie inside both chunks; the CPU has the features
                    // this function is compiled for (its contract).
                    unsafe {
                        let bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, cells.as_ptr().cast()));
                        let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, sums.as_ptr()), _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)));
                        _mm512_mask_storeu_ps(sums.as_mut_ptr(), mask, sum);
                    }
                }
                Ok(())
            },
        );
    }
    let col_rows = cs * g.kernel[0] * g.kernel[1] * taps;
    if col_rows == 0 || od * oh * ow == 0 {
        return Ok(());
    }
    // Everything the loop below addresses, checked once: column rows up to col_rows - 1 with
    // od * oh lines of ow each, and (dense: id = od + kd - 1, ih = oh + kh - 1) cs whole images.
    let col_needed = (col_rows - 1) * row_stride + od * oh * ow;
    if col.len() < col_needed || base.len() < cs * id * ih * iw || ow + taps - 1 > iw {
        crate::bail!(Runtime, "{OP}: col2im of {} columns into {} sums, {col_needed} and {} needed", col.len(), base.len(), cs * id * ih * iw);
    }
    let row_mask = ((1u32 << iw) - 1) as __mmask16;
    let line_mask = (1u32 << ow) - 1;
    let mut row = 0;
    for c in 0..cs {
        for kd in 0..g.kernel[0] {
            for kh in 0..g.kernel[1] {
                for o_d in 0..od {
                    let input_rows = (c * id + o_d + kd) * ih + kh;
                    for o_h in 0..oh {
                        let line = (o_d * oh + o_h) * ow;
                        // SAFETY: the input row (iw <= 16 sums) lies inside base and every tap's
                        // line inside col (checked above); tap k's load starts k lanes before its
                        // line and its mask (ow + k <= iw <= 16 lanes) reads the line alone, so
                        // masked-off lanes, which are never accessed, cover what lies before it.
                        unsafe {
                            let sums = base.as_mut_ptr().add((input_rows + o_h) * iw);
                            let mut acc = _mm512_maskz_loadu_ps(row_mask, sums);
                            for k in 0..taps {
                                let cells = col.as_ptr().add((row + k) * row_stride + line).wrapping_sub(k);
                                let bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((line_mask << k) as __mmask16, cells.cast()));
                                acc = _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)));
                            }
                            _mm512_mask_storeu_ps(sums, row_mask, acc);
                        }
                    }
                }
                row += taps;
            }
        }
    }
    Ok(())
}

/// The three products that Convolution and Deconvolution (a convolution's data gradient) are
/// built from, over a chunk of images at a time: the chunk's column matrices sit side by side
/// so that each group needs one GEMM per chunk rather than one per image. `image` is the
/// convolution's input side (batch x channels x input positions), `response` its output side
/// (batch x filters x output positions), both whole-batch arrays; `weight` is the (filters,
/// channels/groups, k...) weight. Callers parallelize over chunks or hand `threads` to GEMM.
pub(super) struct ImageProducts<'a> {
    pub g: &'a Geometry,
    pub dtype: DType,
    pub weight: *const u8,
    pub threads: usize,
    /// Stride-1 geometries with enough channels skip the column matrix (see conv_shifted).
    shifted: Option<ShiftedLayout>,
    /// Where the column matrix is read from (unused by the shifted strategy).
    source: ColumnSource,
}

// SAFETY: the weight pointer is only read, and the weight stays alive and unwritten for the whole
// operator call that owns this value.
unsafe impl Sync for ImageProducts<'_> {}

/// Column-matrix elements per chunk: enough output columns to amortize GEMM packing, few enough
/// that the chunk's columns stay in cache.
const CHUNK_ELEMENTS: usize = 1 << 18;
/// Fewest output columns per chunk where the batch allows, whatever the column matrix's size:
/// every GEMM packs the whole weight, which small outputs cannot amortize. ResNet-18's 3x3
/// 512-channel layer at 7x7 (49 columns an image, a 9.4 MB weight), batch 32, 2 threads: 21.1 ms
/// with one image a chunk, 18.5-19.1 with two or three.
const MIN_CHUNK_COLUMNS: usize = 128;

/// Per-chunk buffers of the strategy in use.
// One value per chunk being computed: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum ChunkBuffers<T: Elem> {
    /// The side-by-side column matrices, one group's response block and the phased copy of an
    /// image's group of channels that the column matrix is read from.
    Columns {
        col: Scratch<T>,
        staging: Scratch<T>,
        phased: Scratch<T>,
        /// The chunk's images as col2im sums them, where `T` does not sum in itself.
        sums: Scratch<T::Acc>,
    },
    Shifted(ShiftedBuffers),
}

impl<'a> ImageProducts<'a> {
    /// The products for `g` with the plan that spreads its batch over the thread pool (GEMM gets
    /// the threads the plan leaves it).
    pub fn planned(g: &'a Geometry, dtype: DType, weight: *const u8) -> (Self, ChunkPlan) {
        let mut products =
            ImageProducts { g, dtype, weight, threads: 1, shifted: ShiftedLayout::for_geometry(g, dtype), source: ColumnSource::new(g) };
        let plan = ChunkPlan::new(g.batch, products.chunk());
        products.threads = plan.gemm_threads;
        (products, plan)
    }

    /// Images per chunk.
    pub fn chunk(&self) -> usize {
        if let Some(layout) = &self.shifted {
            return layout.images;
        }
        let per_image = (self.g.col_rows() * self.g.output_size()).max(1);
        (CHUNK_ELEMENTS / per_image).max(MIN_CHUNK_COLUMNS.div_ceil(self.g.output_size().max(1))).clamp(1, self.g.batch.max(1))
    }
    /// Scratch for one task running the products in `uses`.
    pub fn buffers<T: Elem>(&self, uses: Uses) -> Result<ChunkBuffers<T>> {
        if let Some(layout) = &self.shifted {
            return Ok(ChunkBuffers::Shifted(layout.buffers(self.g, uses)?));
        }
        let columns = self.chunk() * self.g.output_size();
        let fpg = self.g.filters / self.g.groups;
        // Single-image chunks multiply straight into the response; the backward products use
        // the staging block whatever the chunk.
        let forward_only = self.chunk() == 1 && !uses.scatter && !uses.weight_grad;
        let staging = if forward_only { 0 } else { fpg * columns };
        let col = if forward_only && self.reads_image_as_columns() { 0 } else { self.g.col_rows() * columns };
        let phased = if col == 0 { 0 } else { self.source.phased_len(self.g.channels / self.g.groups) };
        let sums_in_place = T::DTYPE == <T::Acc as Elem>::DTYPE;
        let sums = if uses.scatter && !sums_in_place { self.chunk() * self.g.channels * self.g.input_size() } else { 0 };
        Ok(ChunkBuffers::Columns {
            col: Scratch::zeroed(col)?,
            staging: Scratch::zeroed(staging)?,
            phased: Scratch::zeroed(phased)?,
            sums: Scratch::zeroed(sums)?,
        })
    }

    /// The shifted strategy's products; only called with buffers from [`Self::buffers`], which
    /// are shifted exactly when the layout is.
    fn shifted_products(&self) -> Result<Shifted<'_>> {
        let layout = self.shifted.as_ref().ok_or_else(|| crate::err!(Runtime, "{OP}: shifted buffers for products without a shifted layout"))?;
        Ok(Shifted { g: self.g, layout, threads: self.threads })
    }

    /// Whether a column matrix would copy the image unchanged (1x1 kernel, unit stride, no
    /// padding), so that a single image's forward product reads the image itself.
    fn reads_image_as_columns(&self) -> bool {
        self.g.kernel_size() == 1 && self.g.is_dense()
    }

    /// Fills the side-by-side column matrix of group `grp` for `images`.
    fn columns<T: Elem>(&self, images: &Range<usize>, grp: usize, image: &[T], col: &mut [T], phased: &mut [T]) -> Result<()> {
        let g = self.g;
        let (plane, outs, cpg) = (g.channels * g.input_size(), g.output_size(), g.channels / g.groups);
        let stride = images.len() * outs;
        if self.threads > 1 && images.len() == 1 && cpg > 1 {
            // One image (chunks run in turn): its channels' rows are filled by the threads, in
            // contiguous runs. The 3-channel 7x7 stride-2 stem of ResNet spent 1.1 of its 1.7 ms
            // here on one thread.
            let image = part(OP, image, images.start * plane, plane, "an image")?;
            let parts = self.threads.min(cpg);
            let (row_len, copy_len) = (g.kernel_size() * stride, self.source.phased_len(1));
            let col = part_mut(OP, col, 0, cpg * row_len, "the column matrix")?;
            let phased = part_mut(OP, phased, 0, cpg * copy_len, "the phased copies")?;
            let rows = crate::engine::parallel::split_runs(col, row_len, cpg, parts);
            let copies = crate::engine::parallel::split_runs(phased, copy_len, cpg, parts);
            let runs = rows.into_iter().zip(copies).map(|((channels, rows), (_, copies))| (channels, rows, copies)).collect();
            return crate::engine::parallel::map_owned(runs, |_, (channels, rows, copies): (Range<usize>, &mut [T], &mut [T])| {
                self.source.im2col(image, grp * cpg + channels.start, channels.len(), rows, stride, copies)
            })
            .into_iter()
            .collect();
        }
        for (k, n) in images.clone().enumerate() {
            let image = part(OP, image, n * plane, plane, "an image")?;
            self.source.im2col(image, grp * cpg, cpg, tail_mut(OP, col, k * outs, "the column matrix")?, stride, phased)?;
        }
        Ok(())
    }

    /// The whole weight, of element type `T`.
    ///
    /// # Safety
    /// `self.weight` holds the whole weight (filters x channels/groups x kernel) of element type
    /// `T`, alive and unwritten for the call.
    unsafe fn weight<T: Elem>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            crate::bail!(Runtime, "{OP}: products of {} asked for as {}", self.dtype, T::DTYPE);
        }
        // SAFETY: as the caller guarantees; T is the products' dtype (checked above).
        Ok(unsafe { std::slice::from_raw_parts(self.weight.cast::<T>(), self.g.filters * self.g.col_rows()) })
    }

    /// response = W * im2col(image) for `images`, every group (response is overwritten).
    ///
    /// # Safety
    /// `response` points to the whole-batch response array of element type `T` (`self.dtype`),
    /// whose blocks for `images` nobody else touches during the call; `self.weight` holds the
    /// whole weight of element type `T`.
    pub unsafe fn correlate<T: Elem>(&self, images: Range<usize>, image: &[T], response: *mut T, buf: &mut ChunkBuffers<T>) -> Result<()> {
        let g = self.g;
        let (outs, rows) = (g.output_size(), g.col_rows());
        let fpg = g.filters / g.groups;
        let columns = images.len() * outs;
        let (col, staging, phased) = match buf {
            // SAFETY: forwarded from the caller.
            ChunkBuffers::Shifted(b) => {
                return unsafe { self.shifted_products()?.correlate(images, as_f32(image)?, self.weight, response as *mut f32, b) }
            }
            ChunkBuffers::Columns { col, staging, phased, .. } => (col.as_mut_slice(), staging.as_mut_slice(), phased.as_mut_slice()),
        };
        // SAFETY: forwarded from the caller.
        let weight = unsafe { self.weight::<T>() }?;
        // SAFETY: the caller guarantees that `response` is the whole-batch array, whose blocks
        // for `images` (these elements) are this call's alone.
        let chunk = unsafe { std::slice::from_raw_parts_mut(response.add(images.start * g.filters * outs), images.len() * g.filters * outs) };
        let single = images.len() == 1;
        for grp in 0..g.groups {
            let group_weight = tail(OP, weight, grp * fpg * rows, "a group's weight")?;
            // One image's column matrix of a dense 1x1 convolution is its group of channels.
            let col: &[T] = if single && self.reads_image_as_columns() {
                tail(OP, image, (images.start * g.channels + grp * g.col_rows()) * outs, "an image's group")?
            } else {
                self.columns(&images, grp, image, col, phased)?;
                col
            };
            // One image's block of a group is laid out as the staging block: the product goes
            // straight into the response.
            let product = if single { tail_mut(OP, chunk, grp * fpg * outs, "the response")? } else { &mut *staging };
            matmul_checked(OP, product, false, group_weight, Mat::stored(fpg, rows, false), col, Mat::stored(rows, columns, false), self.threads)?;
            if single {
                continue;
            }
            for k in 0..images.len() {
                for f in 0..fpg {
                    let dst = part_mut(OP, chunk, (k * g.filters + grp * fpg + f) * outs, outs, "a response plane")?;
                    dst.copy_from_slice(part(OP, staging, f * columns + k * outs, outs, "the staging block")?);
                }
            }
        }
        Ok(())
    }

    /// One group's response block for `images`, gathered side by side.
    fn gather<T: Elem>(&self, images: &Range<usize>, grp: usize, response: &[T], staging: &mut [T]) -> Result<()> {
        let g = self.g;
        let (outs, fpg) = (g.output_size(), g.filters / g.groups);
        let columns = images.len() * outs;
        for (k, n) in images.clone().enumerate() {
            for f in 0..fpg {
                let src = part(OP, response, (n * g.filters + grp * fpg + f) * outs, outs, "a response plane")?;
                part_mut(OP, staging, f * columns + k * outs, outs, "the staging block")?.copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// image = col2im(W^T * response) for `images`, every group (overwritten).
    ///
    /// # Safety
    /// As [`Self::correlate`], for the whole-batch `image` array.
    pub unsafe fn scatter<T: Elem>(&self, images: Range<usize>, response: &[T], image: *mut T, buf: &mut ChunkBuffers<T>) -> Result<()> {
        let plane = self.g.channels * self.g.input_size();
        let (col, staging, sums) = match buf {
            // SAFETY: forwarded from the caller.
            ChunkBuffers::Shifted(b) => {
                return unsafe { self.shifted_products()?.scatter(images, as_f32(response)?, self.weight, image as *mut f32, b) }
            }
            ChunkBuffers::Columns { col, staging, sums, .. } => (col.as_mut_slice(), staging.as_mut_slice(), sums.as_mut_slice()),
        };
        // SAFETY: forwarded from the caller.
        let weight = unsafe { self.weight::<T>() }?;
        // SAFETY: the caller guarantees that `image` is the whole-batch array, whose images in
        // `images` (these elements) are this call's alone.
        let chunk = unsafe { std::slice::from_raw_parts_mut(image.add(images.start * plane), images.len() * plane) };
        if let Some(sums) = crate::base::as_acc_mut(chunk) {
            return self.image_sums(&images, response, weight, col, staging, sums);
        }
        let sums = part_mut(OP, sums, 0, images.len() * plane, "the image sums")?;
        self.image_sums(&images, response, weight, col, staging, sums)?;
        simd::vectorized(
            #[inline(always)]
            || chunk.iter_mut().zip(sums.iter()).for_each(|(v, &sum)| *v = T::narrow(sum)),
        );
        Ok(())
    }

    /// `sums` (the chunk's images) = col2im(W^T * response), every group.
    fn image_sums<T: Elem>(
        &self,
        images: &Range<usize>,
        response: &[T],
        weight: &[T],
        col: &mut [T],
        staging: &mut [T],
        sums: &mut [T::Acc],
    ) -> Result<()> {
        let g = self.g;
        let (outs, rows) = (g.output_size(), g.col_rows());
        let (fpg, cpg, plane) = (g.filters / g.groups, g.channels / g.groups, g.channels * g.input_size());
        let columns = images.len() * outs;
        // col2im adds, so the sums start from zero.
        sums.fill(Default::default());
        for grp in 0..g.groups {
            self.gather(images, grp, response, staging)?;
            let group_weight = tail(OP, weight, grp * fpg * rows, "a group's weight")?;
            matmul_checked(OP, col, false, group_weight, Mat::stored(fpg, rows, true), staging, Mat::stored(fpg, columns, false), self.threads)?;
            for k in 0..images.len() {
                let target = part_mut(OP, sums, k * plane, plane, "an image")?;
                col2im(tail(OP, col, k * outs, "the column matrix")?, g, grp * cpg, cpg, target, columns)?;
            }
        }
        Ok(())
    }

    /// weight_grad += response * im2col(image)^T over `images`, every group (the shifted
    /// strategy keeps the sum in `buf` until [`Self::finish_weight_grad`]); `weight_grad` is
    /// shaped like the weight.
    pub fn accumulate_weight_grad<T: Elem>(
        &self,
        images: Range<usize>,
        image: &[T],
        response: &[T],
        weight_grad: &mut [T],
        buf: &mut ChunkBuffers<T>,
    ) -> Result<()> {
        let g = self.g;
        let (outs, rows) = (g.output_size(), g.col_rows());
        let fpg = g.filters / g.groups;
        let columns = images.len() * outs;
        let (col, staging, phased) = match buf {
            ChunkBuffers::Shifted(b) => return self.shifted_products()?.accumulate_weight_grad(images, as_f32(image)?, as_f32(response)?, b),
            ChunkBuffers::Columns { col, staging, phased, .. } => (col.as_mut_slice(), staging.as_mut_slice(), phased.as_mut_slice()),
        };
        for grp in 0..g.groups {
            self.columns(&images, grp, image, col, phased)?;
            self.gather(&images, grp, response, staging)?;
            let group_grad = tail_mut(OP, weight_grad, grp * fpg * rows, "a group's weight gradient")?;
            matmul_checked(OP, group_grad, true, staging, Mat::stored(fpg, columns, false), col, Mat::stored(rows, columns, true), self.threads)?;
        }
        Ok(())
    }
}

impl ImageProducts<'_> {
    /// Adds to `weight_grad` what a task's chunks left in its buffers rather than in the
    /// gradient itself (the shifted strategy sums in its own layout and folds once per task).
    pub fn finish_weight_grad<T: Elem>(&self, buf: &mut ChunkBuffers<T>, weight_grad: &mut [T]) -> Result<()> {
        if let ChunkBuffers::Shifted(b) = buf {
            return self.shifted_products()?.finish_weight_grad(b, as_f32_mut(weight_grad)?);
        }
        Ok(())
    }
}

/// As [`as_f32`], writable.
fn as_f32_mut<T: Elem>(values: &mut [T]) -> Result<&mut [f32]> {
    if T::DTYPE != DType::F32 {
        crate::bail!(Runtime, "{OP}: a float32 kernel was given {} values", T::DTYPE);
    }
    // SAFETY: T is f32 (checked above): same size and alignment.
    Ok(unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr() as *mut f32, values.len()) })
}

/// A float32 array seen as such: the float32-only strategies (shifted, depthwise) are chosen by
/// dtype, so they only meet arrays of element type f32 (anything else is an error).
fn as_f32<T: Elem>(values: &[T]) -> Result<&[f32]> {
    if T::DTYPE != DType::F32 {
        crate::bail!(Runtime, "{OP}: a float32 kernel was given {} values", T::DTYPE);
    }
    // SAFETY: T is f32 (checked above): same size and alignment.
    Ok(unsafe { std::slice::from_raw_parts(values.as_ptr() as *const f32, values.len()) })
}

/// `images` cut into chunks of at most `chunk` images, all of them `chunk` long but the last.
fn chunks(images: Range<usize>, chunk: usize) -> Vec<Range<usize>> {
    images.clone().step_by(chunk).map(|start| start..(start + chunk).min(images.end)).collect()
}

/// Adds `bias[c]` to every element of channel c of `images` (batch x channels x plane).
pub(super) fn add_channel_bias<T: Elem>(images: &mut [T], bias: &[T], plane: usize) {
    if plane == 0 {
        return;
    }
    simd::vectorized(
        #[inline(always)]
        || {
            for (values, &b) in images.chunks_mut(plane).zip(bias.iter().cycle()) {
                let b = b.widen();
                values.iter_mut().for_each(|v| *v = T::narrow(v.widen() + b));
            }
        },
    );
}

/// Per-channel sums of `images` (batch x channels x plane), accumulated in f64.
pub(super) fn channel_sums<T: Elem>(images: &[T], channels: usize, plane: usize, sums: &mut [T]) {
    let mut acc = vec![0f64; channels];
    if plane > 0 && channels > 0 {
        for (values, total) in images.chunks(plane).zip((0..channels).cycle()) {
            if let Some(total) = acc.get_mut(total) {
                *total += simd::vectorized(
                    #[inline(always)]
                    || sum_lanes(values, values, |v, _| v),
                );
            }
        }
    }
    sums.iter_mut().zip(&acc).for_each(|(v, &a)| *v = T::from_f64(a));
}

/// `Convolution`'s parameters' shapes for data of geometry `g`: (data, weight, bias if any).
pub(super) fn check_parameter_shapes(g: &Geometry, inputs: &[Shape]) -> Result<()> {
    let (data, weight, bias) = match inputs {
        [data, weight] => (data, weight, None),
        [data, weight, bias] => (data, weight, Some(bias)),
        _ => crate::bail!(Value, "Convolution: 2 or 3 inputs expected (data, weight[, bias]), got {}", inputs.len()),
    };
    let expected = g.weight_shape();
    if *weight != expected {
        crate::bail!(Shape, "Convolution: weight has shape {weight}, expected {expected} for data {data}");
    }
    if let Some(bias) = bias {
        if bias.dims() != [g.filters] {
            crate::bail!(Shape, "Convolution: bias has shape {bias}, expected ({},)", g.filters);
        }
    }
    Ok(())
}

/// `out = weight * x` for geometry `g`, with `epilogue` applied to each chunk of images as it
/// is done (float32 only; any other dtype takes the identity).
pub(super) fn convolve<T: Elem>(g: &Geometry, x: &[T], weight: &[T], out: &mut [T], epilogue: &Epilogue) -> Result<()> {
    if T::DTYPE != DType::F32 && !epilogue.is_identity() {
        crate::bail!(Type, "Convolution: a fused epilogue needs float32 data, got {}", T::DTYPE);
    }
    let outs = g.output_size();
    let sizes = [
        (x.len(), g.batch * g.channels * g.input_size(), "data"),
        (weight.len(), g.weight_shape().size(), "weight"),
        (out.len(), g.batch * g.filters * outs, "output"),
    ];
    for (len, size, name) in sizes {
        if len != size {
            crate::bail!(Runtime, "{OP}: {name} of {len} elements, expected {size}");
        }
    }
    if T::DTYPE == DType::F32 && stencil::suits_depthwise(g) {
        return stencil::depthwise_correlate(g, as_f32(x)?, as_f32(weight)?, epilogue, as_f32_mut(out)?);
    }
    let (products, plan) = ImageProducts::planned(g, T::DTYPE, weight.as_ptr().cast());
    let response = SendPtr(out.as_mut_ptr());
    plan.run(|mine| {
        let mut buf = products.buffers::<T>(Uses { correlate: true, scatter: false, weight_grad: false })?;
        for images in mine.iter().cloned() {
            let response = response.get();
            // SAFETY: the output holds the whole batch and the weight the whole weight (checked
            // above); this chunk's images of the output are written by this task alone.
            unsafe { products.correlate(images.clone(), x, response, &mut buf) }?;
            if T::DTYPE == DType::F32 {
                let block = images.len() * g.filters * outs;
                // SAFETY: as above; T is f32.
                let region = unsafe { std::slice::from_raw_parts_mut(response.add(images.start * g.filters * outs).cast::<f32>(), block) };
                epilogue.apply_images(region, g.filters, outs, products.threads)?;
            }
        }
        Ok(())
    })?;
    Ok(())
}

pub(super) struct Convolution {
    pub(super) p: ConvolutionParams,
}

impl Operator for Convolution {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data".to_string(), "weight".to_string()];
        if !self.p.no_bias {
            names.push("bias".into());
        }
        names
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        let [Some(data), weight, rest @ ..] = inputs else {
            return Ok(());
        };
        let g = self.p.geometry("Convolution", data)?;
        weight.get_or_insert_with(|| g.weight_shape());
        if let Some(bias) = rest.first_mut() {
            bias.get_or_insert_with(|| Shape::new(vec![g.filters]));
        }
        Ok(())
    }
    /// Needs the data's rank, as MXNet does. The weight takes the data's channels (when known),
    /// the output the batch and the spatial sizes the data determines; back from the output,
    /// the data takes the batch, and its spatial sizes where the stride is 1.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let Some(data) = inputs.first().cloned().flatten() else { return Ok(()) };
        let op = "Convolution";
        let rank = self.p.kernel.len();
        if !(1..=3).contains(&rank) || data.ndim() != rank + 2 {
            crate::bail!(
                Shape,
                "{op}: a kernel of {:?} needs data of {} dimensions (batch, channel, spatial...), got {data}",
                self.p.kernel,
                rank + 2
            );
        }
        let first = 3 - rank;
        let (kernel, stride) = (spatial(op, "kernel", &self.p.kernel, rank, 1, 1)?, spatial(op, "stride", &self.p.stride, rank, 1, 1)?);
        let (dilate, pad) = (spatial(op, "dilate", &self.p.dilate, rank, 1, 1)?, spatial(op, "pad", &self.p.pad, rank, 0, 0)?);
        let groups = self.p.num_group.max(1);
        let filters = Some(self.p.num_filter);
        // Per spatial axis: (kernel, stride, pad, dilated kernel extent).
        let axes: Vec<(usize, usize, usize, usize)> = kernel
            .iter()
            .zip(&stride)
            .zip(dilate.iter().zip(&pad))
            .skip(first)
            .map(|((&k, &s), (&d, &p))| (k, s, p, d * (k.max(1) - 1) + 1))
            .collect();
        // data has rank + 2 axes (checked above).
        let [batch, channels, sizes @ ..] = data.0.as_slice() else {
            crate::bail!(Shape, "{op}: data {data} has no batch and channel axes");
        };
        let [data_slot, weight_slot, rest @ ..] = inputs else {
            crate::bail!(Value, "{op}: data and weight expected, got {} inputs", inputs.len());
        };
        let [out_slot] = outputs else {
            crate::bail!(Value, "{op}: one output expected, got {}", outputs.len());
        };

        let mut weight = vec![filters, channels.map(|c| c / groups)];
        weight.extend(axes.iter().map(|&(k, ..)| Some(k)));
        merge_partial(weight_slot, &PartialShape(weight))?;
        if let Some(bias) = rest.first_mut() {
            merge_partial(bias, &PartialShape(vec![filters]))?;
        }
        let mut out = vec![*batch, filters];
        for (&size, &(_, stride, pad, extent)) in sizes.iter().zip(&axes) {
            out.push(match size {
                Some(size) if size + 2 * pad < extent => {
                    crate::bail!(Shape, "{op}: kernel {:?} (dilated) is larger than the padded input {data}", self.p.kernel)
                }
                Some(size) => Some((size + 2 * pad - extent) / stride.max(1) + 1),
                None => None,
            });
        }
        merge_partial(out_slot, &PartialShape(out))?;
        let Some(out) = out_slot.clone() else {
            crate::bail!(Shape, "{op}: the output shape is unknown after merging");
        };
        let mut back = PartialShape::unknown(data.ndim());
        if let ([back_batch, _, back_sizes @ ..], [out_batch, _, out_sizes @ ..]) = (back.0.as_mut_slice(), out.0.as_slice()) {
            *back_batch = *out_batch;
            for ((slot, &size), &(_, stride, pad, extent)) in back_sizes.iter_mut().zip(out_sizes).zip(&axes) {
                if stride == 1 {
                    *slot = size.and_then(|o| (o + extent - 1).checked_sub(2 * pad));
                }
            }
        }
        merge_partial(data_slot, &back)?;
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let Some(data) = inputs.first() else {
            crate::bail!(Value, "Convolution: data and weight expected, got no inputs");
        };
        let g = self.p.geometry("Convolution", data)?;
        check_parameter_shapes(&g, inputs)?;
        Ok(vec![g.output_shape()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let has_bias = match args.inputs().len() {
            2 => false,
            3 => true,
            n => crate::bail!(Value, "{OP}: 2 or 3 inputs expected (data, weight[, bias]), got {n}"),
        };
        let g = self.p.geometry("Convolution", args.input_shape(0)?)?;
        if args.input_dtype(0)? == DType::F32 {
            let epilogue = Epilogue::with_bias(has_bias.then(|| args.input::<f32>(2)).transpose()?);
            return convolve(&g, args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(0)?, &epilogue);
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let out = args.output::<T>(0)?;
            convolve(&g, args.input::<T>(0)?, args.input::<T>(1)?, out, &Epilogue::default())?;
            if has_bias {
                let (bias, plane) = (args.input::<T>(2)?, g.output_size());
                super::parallel_units(out, g.filters * plane, 1, |_, images| {
                    add_channel_bias(images, bias, plane);
                    Ok(())
                })?;
            }
        });
        Ok(())
    }
    /// im2col of a chunk of images per group, then one strided-batched GEMM per group and
    /// chunk (the group's weight shared by the batch), then the bias.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels::{add_bias, columns, elements_from, Columns};
        let ([x, w, ..], [out]) = (inputs, outputs) else {
            crate::bail!(Value, "{OP}: data, weight and one output expected, got {} inputs and {} outputs", inputs.len(), outputs.len());
        };
        let g = self.p.geometry("Convolution", &x.shape)?;
        let gpu_geometry = g.on_gpu();
        let columns_buffer = GpuColumns::new(gpu, &g, x.dtype)?;
        let (fg, rows, outs) = (g.filters / g.groups, g.col_rows(), g.output_size());
        for images in columns_buffer.chunks(g.batch) {
            // SAFETY (the views below): offsets of whole images and groups inside x, w and out.
            let first = unsafe { elements_from(x, images.start * g.channels * g.input_size()) };
            for group in 0..g.groups {
                columns(gpu, Columns::FromImages, &gpu_geometry, group * g.channels / g.groups, images.len(), &first, &columns_buffer.tensor)?;
                let product = crate::backend::cuda::blas::Gemm {
                    m: fg,
                    n: outs,
                    k: rows,
                    batch: images.len(),
                    transpose_a: false,
                    transpose_b: false,
                    alpha: 1.0,
                    beta: 0.0,
                    strides: Some([0, rows * outs, g.filters * outs]),
                };
                let (weight, response) =
                    unsafe { (elements_from(w, group * fg * rows), elements_from(out, (images.start * g.filters + group * fg) * outs)) };
                crate::backend::cuda::blas::gemm(gpu, &product, &weight, &columns_buffer.tensor, &response)?;
            }
        }
        match inputs.get(2) {
            Some(bias) => add_bias(gpu, bias, out, g.filters, outs),
            None => Ok(()),
        }
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, w, g) = (d.input(0), d.input(1), d.out_grad(0));
        let mut attrs = self.p.attrs();
        attrs.push(("data_grad", if d.input_needed(0) { "True" } else { "False" }.to_string()));
        let grads = d.op_outputs("_backward_Convolution", &attrs, &[&g, &x, &w])?;
        let mut out: InputGrads = grads.into_iter().map(Some).collect();
        if self.p.no_bias {
            out.truncate(2);
        }
        Ok(out)
    }
}

/// How a batch is cut into chunks of images and spread over the thread pool.
pub(super) struct ChunkPlan {
    /// Each task's chunks, in batch order; the tasks run concurrently.
    runs: Vec<Vec<Range<usize>>>,
    /// Threads each GEMM may use: all of them when the chunks run one after another.
    pub gemm_threads: usize,
}

impl ChunkPlan {
    /// One task per thread, each with a contiguous share of the batch that differs from the
    /// others' by at most one image, cut into chunks of at most `chunk` images; with fewer images
    /// than threads the chunks run in turn and GEMM gets the threads.
    pub fn new(batch: usize, chunk: usize) -> ChunkPlan {
        let threads = crate::engine::parallel::threads();
        let chunk = chunk.max(1);
        if batch < threads {
            return ChunkPlan { runs: vec![chunks(0..batch, chunk)], gemm_threads: threads };
        }
        let runs = (0..threads).map(|t| chunks(t * batch / threads..(t + 1) * batch / threads, chunk)).collect();
        ChunkPlan { runs, gemm_threads: 1 }
    }

    /// Runs `work` on each task's run of chunks on the thread pool; returns the tasks' results in
    /// chunk order.
    pub fn run<R: Send>(&self, work: impl Fn(&[Range<usize>]) -> Result<R> + Sync) -> Result<Vec<R>> {
        if self.runs.len() <= 1 {
            return self.runs.iter().map(|run| work(run)).collect();
        }
        crate::engine::parallel::map(self.runs.len(), |i| work(self.runs.get(i).map(Vec::as_slice).unwrap_or_default())).into_iter().collect()
    }
}

/// The weight gradient accumulated over every chunk of `plan`: each task sums its chunks into a
/// partial of its own (`accumulate(images, buffers, partial)`), and the partials are added in
/// task order, so the result does not depend on thread timing.
pub(super) fn weight_grad_over_chunks<T: Elem>(
    plan: &ChunkPlan,
    products: &ImageProducts,
    uses: Uses,
    weight_grad: &mut [T],
    accumulate: impl Fn(Range<usize>, &mut ChunkBuffers<T>, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let partials = plan.run(|mine| {
        let mut buf = products.buffers::<T>(uses)?;
        let mut partial = Scratch::<T>::zeroed(weight_grad.len())?;
        for images in mine {
            accumulate(images.clone(), &mut buf, partial.as_mut_slice())?;
        }
        products.finish_weight_grad(&mut buf, partial.as_mut_slice())?;
        Ok(partial)
    })?;
    let mut partials = partials.into_iter();
    if let Some(mut first) = partials.next() {
        weight_grad.copy_from_slice(first.as_mut_slice());
    }
    for mut partial in partials {
        for (total, &p) in weight_grad.iter_mut().zip(partial.as_mut_slice().iter()) {
            *total = T::narrow(total.widen() + p.widen());
        }
    }
    Ok(())
}

/// `_backward_Convolution(grad, data, weight)`: gradients of data, weight and bias.
struct ConvolutionBackward {
    p: ConvolutionParams,
    data_grad: bool,
}

impl Operator for ConvolutionBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into(), "weight".into()]
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [_, data, weight] = exactly("_backward_Convolution", "input", inputs)?;
        Ok(vec![data.clone(), weight.clone(), Shape::new(vec![self.p.num_filter])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _, _] = exactly("_backward_Convolution", "input", inputs)?;
        Ok(vec![grad; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_Convolution";
        exactly::<_, 3>(op, "input", args.inputs())?;
        exactly::<_, 3>(op, "output", args.outputs())?;
        let g = self.p.geometry("Convolution", args.input_shape(1)?)?;
        let dtype = args.input_dtype(1)?;
        if dtype == DType::F32 && stencil::suits_depthwise_backward(&g) {
            let (gv, xv, wv) = (args.input::<f32>(0)?, args.input::<f32>(1)?, args.input::<f32>(2)?);
            let (dxv, dwv, dbv) = (args.output::<f32>(0)?, args.output::<f32>(1)?, args.output::<f32>(2)?);
            if !self.data_grad {
                dxv.fill(0.0);
            }
            stencil::depthwise_backward(&g, xv, wv, gv, self.data_grad.then_some(dxv), dwv)?;
            channel_sums(gv, g.filters, g.output_size(), dbv);
            return Ok(());
        }
        crate::dispatch_dtype!(dtype, T => {
            let (gv, xv, wv) = (args.input::<T>(0)?, args.input::<T>(1)?, args.input::<T>(2)?);
            let (dxv, dwv, dbv) = (args.output::<T>(0)?, args.output::<T>(1)?, args.output::<T>(2)?);
            let weight_size = g.weight_shape().size();
            let sizes = [
                (gv.len(), g.batch * g.filters * g.output_size(), "output gradient"),
                (xv.len(), g.batch * g.channels * g.input_size(), "data"),
                (wv.len(), weight_size, "weight"),
                (dxv.len(), g.batch * g.channels * g.input_size(), "data gradient"),
                (dwv.len(), weight_size, "weight gradient"),
            ];
            for (len, size, name) in sizes {
                if len != size {
                    crate::bail!(Runtime, "{op}: {name} of {len} elements, expected {size}");
                }
            }
            let (products, plan) = ImageProducts::planned(&g, dtype, wv.as_ptr().cast());
            let dx_ptr = SendPtr(dxv.as_mut_ptr());
            let uses = Uses { correlate: false, scatter: self.data_grad, weight_grad: true };
            weight_grad_over_chunks(&plan, &products, uses, dwv, |images, buf, partial| {
                products.accumulate_weight_grad(images.clone(), xv, gv, partial, buf)?;
                if self.data_grad {
                    // SAFETY: dx holds the whole batch and the weight the whole weight, of T
                    // (checked above); each chunk's images of dx are written by the task running
                    // that chunk alone.
                    unsafe { products.scatter(images, gv, dx_ptr.get(), buf)? };
                }
                Ok(())
            })?;
            if !self.data_grad {
                dxv.fill(T::default());
            }
            channel_sums(gv, g.filters, g.output_size(), dbv);
        });
        Ok(())
    }
    /// Per chunk and group: im2col of x, the weight gradient image by image (accumulated by
    /// cuBLAS with beta = 1), then the column gradient W^T dy as one batched GEMM and its
    /// adjoint im2col into dx. The bias gradient is a reduction of dy.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::blas::{gemm, Gemm};
        use crate::backend::cuda::kernels::{columns, elements_from, fill, reduce, Columns};
        let ([dy, x, w], [dx, dw, db]) = (inputs, outputs) else {
            crate::bail!(Value, "_backward_Convolution: 3 inputs and 3 outputs expected, got {} and {}", inputs.len(), outputs.len());
        };
        let g = self.p.geometry("Convolution", &x.shape)?;
        let gpu_geometry = g.on_gpu();
        let buffer = GpuColumns::new(gpu, &g, x.dtype)?;
        let (fg, rows, outs) = (g.filters / g.groups, g.col_rows(), g.output_size());
        if g.batch == 0 {
            fill(gpu, dw, 0.0)?;
        }
        if !self.data_grad {
            fill(gpu, dx, 0.0)?;
        }
        let plain = Gemm { m: 0, n: 0, k: 0, batch: 1, transpose_a: false, transpose_b: false, alpha: 1.0, beta: 0.0, strides: None };
        for images in buffer.chunks(g.batch) {
            // SAFETY (the views below): offsets of whole images, groups and matrices inside x,
            // dx, dy, w, dw and the column buffer.
            let (x_first, dx_first) = unsafe {
                (elements_from(x, images.start * g.channels * g.input_size()), elements_from(dx, images.start * g.channels * g.input_size()))
            };
            for group in 0..g.groups {
                let first_channel = group * g.channels / g.groups;
                columns(gpu, Columns::FromImages, &gpu_geometry, first_channel, images.len(), &x_first, &buffer.tensor)?;
                let weight_grad = unsafe { elements_from(dw, group * fg * rows) };
                for (i, image) in images.clone().enumerate() {
                    let product = Gemm { m: fg, n: rows, k: outs, transpose_b: true, beta: if image == 0 { 0.0 } else { 1.0 }, ..plain };
                    let (grad, col) =
                        unsafe { (elements_from(dy, (image * g.filters + group * fg) * outs), elements_from(&buffer.tensor, i * rows * outs)) };
                    gemm(gpu, &product, &grad, &col, &weight_grad)?;
                }
                if self.data_grad {
                    let product = Gemm {
                        m: rows,
                        n: outs,
                        k: fg,
                        batch: images.len(),
                        transpose_a: true,
                        strides: Some([0, g.filters * outs, rows * outs]),
                        ..plain
                    };
                    let (weight, grad) =
                        unsafe { (elements_from(w, group * fg * rows), elements_from(dy, (images.start * g.filters + group * fg) * outs)) };
                    gemm(gpu, &product, &weight, &grad, &buffer.tensor)?;
                    columns(gpu, Columns::IntoImages, &gpu_geometry, first_channel, images.len(), &dx_first, &buffer.tensor)?;
                }
            }
        }
        // SAFETY: dy viewed as (batch, filters, outputs), the layout it has.
        let grad = unsafe { Tensor::new(dy.raw(), Shape::new(vec![g.batch, g.filters, outs]), dy.dtype) };
        reduce(gpu, &super::reduce::CUDA_SUM, &[true, false, true], &grad, db)
    }
}

/// The column matrices of a chunk of images in device memory, sized to stay within a budget.
#[cfg(feature = "cuda")]
struct GpuColumns {
    /// Kept alive while the stream may still use it: the pool reuses a block only for work
    /// enqueued later on the same stream, so dropping it after enqueueing is safe.
    _block: crate::storage::Buffer,
    tensor: Tensor,
    images_per_chunk: usize,
}

#[cfg(feature = "cuda")]
impl GpuColumns {
    /// Column memory of at most this many bytes (or one image's, if larger).
    const BUDGET_BYTES: usize = 256 << 20;

    fn new(gpu: &crate::backend::cuda::Gpu, g: &Geometry, dtype: DType) -> Result<GpuColumns> {
        let per_image = (g.col_rows() * g.output_size()).max(1);
        let images_per_chunk = (Self::BUDGET_BYTES / (per_image * dtype.size())).clamp(1, g.batch.max(1));
        let elements = per_image * images_per_chunk;
        let block = crate::storage::alloc(gpu.context(), elements * dtype.size())?;
        // SAFETY: the block holds `elements` elements of dtype and lives as long as the tensor.
        let tensor = unsafe { Tensor::new(block.as_ptr(), Shape::new(vec![elements]), dtype) };
        Ok(GpuColumns { _block: block, tensor, images_per_chunk })
    }

    fn chunks(&self, batch: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        (0..batch).step_by(self.images_per_chunk).map(move |start| start..(start + self.images_per_chunk).min(batch))
    }
}

#[cfg(feature = "cuda")]
impl Geometry {
    fn on_gpu(&self) -> crate::backend::cuda::kernels::ConvGeometry {
        crate::backend::cuda::kernels::ConvGeometry {
            input: self.input,
            kernel: self.kernel,
            stride: self.stride,
            dilate: self.dilate,
            pad: self.pad,
            output: self.output,
            channels: self.channels,
            group_channels: self.channels / self.groups,
        }
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("Convolution", &[], "Computes 1-D, 2-D or 3-D convolution (channels-first layouts), im2col + GEMM.", |p: ConvolutionParams| {
        if p.num_filter == 0 {
            crate::bail!(Param, "Convolution: num_filter must be at least 1, got 0");
        }
        Ok(Convolution { p })
    }));
    add(OpDef::new("_backward_Convolution", &[], "Gradients of Convolution for data, weight and bias.", |p: ConvolutionBackwardParams| {
        let forward = ConvolutionParams {
            kernel: p.kernel,
            stride: p.stride,
            dilate: p.dilate,
            pad: p.pad,
            num_filter: p.num_filter,
            num_group: p.num_group,
            workspace: 1024,
            no_bias: p.no_bias,
            cudnn_tune: None,
            cudnn_off: false,
            layout: None,
        };
        Ok(ConvolutionBackward { p: forward, data_grad: p.data_grad })
    }));
}
