//! Pooling (max, avg, sum, lp; 1-D to 3-D, channels first or last; valid/full/same conventions;
//! global), parallel over (image, channel) planes, and its gradient. Channels-last planes are
//! strided: each is gathered into a contiguous buffer, pooled, and its result scattered back.
//! Float32 max pooling with overlapping windows runs as a stencil over stride-phased planes.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::stencil::{self, Frame};
use super::{exactly, parallel_units, ExecContext, OpDef, Operator, SendPtr};
use crate::backend::cpu::simd;
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::param_choice! {
    /// What a pooling window computes.
    pub enum PoolingType { Max = "max", Avg = "avg", Sum = "sum", Lp = "lp" }
}

crate::param_choice! {
    /// How the output size is rounded: 'valid' floors, 'full' ceils, 'same' keeps
    /// ceil(input / stride).
    pub enum PoolingConvention { Valid = "valid", Full = "full", Same = "same" }
}

crate::op_params! {
    /// cudnn_off only steers MXNet's GPU path: accepted, unused.
    #[allow(dead_code)]
    pub struct PoolingParams {
        /// Pooling window: (w,), (h, w) or (d, h, w); ignored with global_pool.
        kernel: Vec<i64> = Vec::new(),
        /// What each window computes.
        pool_type: PoolingType = PoolingType::Max,
        /// Pool over the whole spatial extent.
        global_pool: bool = false,
        /// Disable cuDNN (accepted for compatibility).
        cudnn_off: bool = false,
        /// Output size rounding: 'valid' (floor), 'full' (ceil) or 'same'.
        pooling_convention: PoolingConvention = PoolingConvention::Valid,
        /// Stride per spatial axis (default 1).
        stride: Vec<i64> = Vec::new(),
        /// Padding per spatial axis (default 0).
        pad: Vec<i64> = Vec::new(),
        /// The p of lp pooling.
        p_value: Option<i64> = None,
        /// Whether avg pooling counts padded positions.
        count_include_pad: Option<bool> = None,
        /// Data layout: None (channels first), 'NCW', 'NCHW', 'NCDHW', 'NWC', 'NHWC' or 'NDHWC'.
        layout: Option<String> = None,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum PoolType {
    Max,
    Avg,
    Sum,
    Lp(i32),
}

/// One pooling problem in three spatial dimensions.
struct Window {
    planes: usize,
    /// Channels per image when the channels are the last axis (planes are then strided).
    channels_last: Option<usize>,
    input: [usize; 3],
    kernel: [usize; 3],
    stride: [usize; 3],
    pad: [usize; 3],
    output: [usize; 3],
    out_shape: Shape,
}

struct Pooling {
    p: PoolingParams,
    kind: PoolType,
}

fn three(values: &[i64], rank: usize, default: usize) -> Result<[usize; 3]> {
    let mut out = [if default == 0 { 0 } else { 1 }; 3];
    // The spatial axes are the last `rank` (at most 3) of the three.
    let leading = 3usize.saturating_sub(rank);
    if values.is_empty() {
        out.iter_mut().skip(leading).for_each(|v| *v = default);
        return Ok(out);
    }
    if values.len() != rank || values.iter().any(|&v| v < 0) {
        crate::bail!(Param, "Pooling: {values:?} must hold {rank} non-negative values");
    }
    for (slot, &v) in out.iter_mut().skip(leading).zip(values) {
        *slot = v as usize;
    }
    Ok(out)
}

impl Pooling {
    fn channels_last(&self) -> bool {
        matches!(self.p.layout.as_deref(), Some("NWC" | "NHWC" | "NDHWC"))
    }

    fn window(&self, data: &Shape) -> Result<Window> {
        let rank = data
            .ndim()
            .checked_sub(2)
            .filter(|r| (1..=3).contains(r))
            .ok_or_else(|| crate::err!(Shape, "Pooling: data must be 3-D, 4-D or 5-D (batch, channel, spatial...), got {data}"))?;
        if let Some(layout) = &self.p.layout {
            if layout.len() != data.ndim() {
                crate::bail!(Shape, "Pooling: layout {layout} does not fit {}-D data {data}", data.ndim());
            }
        }
        let channels_last = self.channels_last();
        // (batch, channel) and the spatial extents, whichever axis holds the channels.
        let (batch, channels, spatial) = match (channels_last, data.dims()) {
            (true, [batch, spatial @ .., channels]) | (false, [batch, channels, spatial @ ..]) => (*batch, *channels, spatial),
            _ => crate::bail!(Shape, "Pooling: data must be 3-D, 4-D or 5-D (batch, channel, spatial...), got {data}"),
        };
        let mut input = [1; 3];
        for (extent, &given) in input.iter_mut().rev().zip(spatial.iter().rev()) {
            *extent = given;
        }
        let (kernel, stride, pad) = if self.p.global_pool {
            (input, [1; 3], [0; 3])
        } else {
            if self.p.kernel.len() != rank {
                crate::bail!(Param, "Pooling: kernel {:?} must have {rank} values for data {data}", self.p.kernel);
            }
            (three(&self.p.kernel, rank, 1)?, three(&self.p.stride, rank, 1)?, three(&self.p.pad, rank, 0)?)
        };
        if kernel.contains(&0) || stride.contains(&0) {
            crate::bail!(Param, "Pooling: kernel and stride must be positive");
        }
        if !self.p.global_pool && pad.iter().zip(&kernel).any(|(p, k)| p >= k) {
            // A window starting in the padding would then cover no input element at all.
            crate::bail!(Param, "Pooling: pad {:?} must be smaller than kernel {:?} in every dimension (data {data})", self.p.pad, self.p.kernel);
        }
        let mut output = [1; 3];
        for ((extent, &input), ((&kernel, &stride), &pad)) in output.iter_mut().zip(&input).zip(kernel.iter().zip(&stride).zip(&pad)) {
            let padded = input + 2 * pad;
            if padded < kernel && self.p.pooling_convention != PoolingConvention::Same {
                crate::bail!(Shape, "Pooling: kernel {:?} is larger than the padded input {data}", self.p.kernel);
            }
            *extent = match self.p.pooling_convention {
                PoolingConvention::Full => (padded - kernel).div_ceil(stride) + 1,
                PoolingConvention::Same => input.div_ceil(stride),
                PoolingConvention::Valid => (padded - kernel) / stride + 1,
            };
        }
        let spatial_out = output.iter().skip(3 - rank);
        let mut dims = vec![batch];
        if channels_last {
            dims.extend(spatial_out);
            dims.push(channels);
        } else {
            dims.push(channels);
            dims.extend(spatial_out);
        }
        Ok(Window {
            planes: batch * channels,
            channels_last: channels_last.then_some(channels),
            input,
            kernel,
            stride,
            pad,
            output,
            out_shape: Shape::new(dims),
        })
    }

    fn include_pad(&self) -> bool {
        self.p.count_include_pad.unwrap_or(true)
    }
}

/// The window of output position `o` on one axis of (stride, kernel, pad, input): its clipped
/// [start, end) and the size of the part inside the padded input (what avg pooling divides by
/// when padding counts).
#[inline]
fn span(o: usize, (stride, kernel, pad, input): (usize, usize, usize, usize)) -> (usize, usize, usize) {
    let start = (o * stride) as isize - pad as isize;
    let end = (start + kernel as isize).min((input + pad) as isize);
    let padded_len = (end - start).max(0) as usize;
    let (s, e) = (start.max(0) as usize, end.clamp(0, input as isize) as usize);
    (s, e.max(s), padded_len)
}

/// The input elements of one window (clipped to the input), as nested ranges.
struct Cells {
    d: std::ops::Range<usize>,
    h: std::ops::Range<usize>,
    w: std::ops::Range<usize>,
    ih: usize,
    iw: usize,
}

impl Cells {
    /// `f` of each of the window's rows of cells, in order, as a range of the plane's elements.
    #[inline(always)]
    fn for_each_row(&self, mut f: impl FnMut(std::ops::Range<usize>) -> Result<()>) -> Result<()> {
        for d in self.d.clone() {
            for h in self.h.clone() {
                let row = (d * self.ih + h) * self.iw;
                f(row + self.w.start..row + self.w.end)?;
            }
        }
        Ok(())
    }
    /// The first cell (row-major) of `plane` where `hit` holds.
    #[inline(always)]
    fn find<T>(&self, plane: &[T], hit: impl Fn(&T) -> bool) -> Result<Option<usize>> {
        for d in self.d.clone() {
            for h in self.h.clone() {
                let row = (d * self.ih + h) * self.iw;
                let cells = row + self.w.start..row + self.w.end;
                if let Some(x) = cells_of(plane, cells.clone())?.iter().position(&hit) {
                    return Ok(Some(cells.start + x));
                }
            }
        }
        Ok(None)
    }
    fn count(&self) -> usize {
        self.d.len() * self.h.len() * self.w.len()
    }
}

/// The cells `cells` of a plane of `values`.
#[inline(always)]
fn cells_of<T>(values: &[T], cells: std::ops::Range<usize>) -> Result<&[T]> {
    let len = values.len();
    values.get(cells.clone()).ok_or_else(|| crate::err!(Runtime, "Pooling: cells {cells:?} lie past a plane of {len}"))
}

#[inline(always)]
fn cells_of_mut<T>(values: &mut [T], cells: std::ops::Range<usize>) -> Result<&mut [T]> {
    let len = values.len();
    values.get_mut(cells.clone()).ok_or_else(|| crate::err!(Runtime, "Pooling: cells {cells:?} lie past a plane of {len}"))
}

/// Visit the output positions of one plane in order, each with its window's cells and
/// pad-inclusive size.
#[inline(always)]
fn for_each_window(w: &Window, mut visit: impl FnMut(&Cells, usize) -> Result<()>) -> Result<()> {
    let ([id, ih, iw], [kd, kh, kw], [sd, sh, sw], [pd, ph, pw], [od, oh, ow]) = (w.input, w.kernel, w.stride, w.pad, w.output);
    for o_d in 0..od {
        let (d0, d1, dn) = span(o_d, (sd, kd, pd, id));
        for o_h in 0..oh {
            let (h0, h1, hn) = span(o_h, (sh, kh, ph, ih));
            for o_w in 0..ow {
                let (w0, w1, wn) = span(o_w, (sw, kw, pw, iw));
                visit(&Cells { d: d0..d1, h: h0..h1, w: w0..w1, ih, iw }, dn * hn * wn)?;
            }
        }
    }
    Ok(())
}

/// Copies plane `plane` (image `plane / channels`, channel `plane % channels`) of a channels-last
/// array `src` whose images hold `len` positions into `dst` (`len` elements).
fn gather_plane<T: Elem>(src: &[T], plane: usize, len: usize, channels: usize, dst: &mut [T]) -> Result<()> {
    let channels = channels.max(1);
    let image = plane / channels;
    let values = src
        .get(image * len * channels..(image + 1) * len * channels)
        .ok_or_else(|| crate::err!(Runtime, "Pooling: image {image} lies past the {} channels-last values", src.len()))?;
    for (d, &s) in dst.iter_mut().zip(values.iter().skip(plane % channels).step_by(channels)) {
        *d = s;
    }
    Ok(())
}

/// Writes `src` (at most `len` elements) as plane `plane` of a channels-last array of `dst_len`
/// elements at `dst` (the inverse of [`gather_plane`]).
///
/// # Safety
/// `dst` points at `dst_len` writable elements, and no other thread reads or writes this plane's
/// elements meanwhile (other planes interleave with it, element by element, which is sound
/// through raw pointers).
unsafe fn scatter_plane<T: Elem>(src: &[T], dst: SendPtr<T>, dst_len: usize, plane: usize, len: usize, channels: usize) -> Result<()> {
    let channels = channels.max(1);
    let image = plane / channels;
    if src.len() > len || (image + 1) * len * channels > dst_len {
        crate::bail!(Runtime, "Pooling: plane {plane} of {} values lies past the {dst_len} channels-last values", src.len());
    }
    let base = image * len * channels + plane % channels;
    for (s, &v) in src.iter().enumerate() {
        // SAFETY: s < src.len() <= len, so base + s * channels < (image + 1) * len * channels <=
        // dst_len (checked above): inside `dst`, in this plane, which the caller lends us alone.
        unsafe { dst.get().add(base + s * channels).write(v) };
    }
    Ok(())
}

/// `f` over `0..n` in the ranges [`super::parallel_chunks`] makes, in parallel when it does;
/// the first error is returned.
fn parallel_ranges(n: usize, min_chunk: usize, f: impl Fn(std::ops::Range<usize>) -> Result<()> + Sync) -> Result<()> {
    let threads = crate::engine::parallel::threads();
    if n <= min_chunk || threads <= 1 {
        return f(0..n);
    }
    let chunk = (n.div_ceil(threads * 4)).max(min_chunk);
    crate::engine::parallel::map(n.div_ceil(chunk), |p| f(p * chunk..((p + 1) * chunk).min(n))).into_iter().collect()
}

/// NaN-propagating maximum as a select (vectorizes).
#[inline(always)]
fn nan_max(a: f64, b: f64) -> f64 {
    if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

/// The larger of two elements, NaN-propagating, compared in their accumulator type (exact) and
/// returned unconverted: a select that vectorizes, where a round trip through f64 kept
/// bfloat16's 2x2 max pooling at 6x float32's time.
#[inline(always)]
fn max_of<T: Elem>(a: T, b: T) -> T {
    let (wa, wb) = (a.widen(), b.widen());
    // `wb != wb` holds for NaN alone.
    #[allow(clippy::eq_op)]
    let b_is_nan = wb != wb;
    if wb > wa || b_is_nan {
        b
    } else {
        a
    }
}

/// Whether a window's cell is its maximum `m` (both NaN counts as equal), compared in the
/// accumulator type.
#[inline(always)]
fn is_maximum<T: Elem>(cell: T::Acc, m: T::Acc) -> bool {
    #[allow(clippy::eq_op)]
    let both_nan = (cell != cell) & (m != m);
    (cell == m) | both_nan
}

impl Window {
    /// Max pooling whose windows tile the input exactly (stride = kernel, no padding, every
    /// window inside the input; 2x2 stride 2 is the common case). Those planes run as row-wise
    /// vector loops instead of window by window.
    fn tiles(&self) -> bool {
        self.kernel == self.stride
            && self.pad == [0; 3]
            && self.output.iter().zip(&self.kernel).zip(&self.input).all(|((&output, &kernel), &input)| output * kernel <= input)
    }
}

/// Tiled max pooling of one plane: the maximum over a window's rows first (row against row),
/// then over each window's columns. Compiled for the CPU's vectors: 2x2 max pooling of 24x24
/// bfloat16 planes ran at 2.2x float32's time in baseline SSE code, and float32 at 1.5x.
fn tiled_max_forward<T: Elem>(w: &Window, x: &[T], y: &mut [T], rows: &mut Vec<f64>) -> Result<()> {
    simd::vectorized(
        #[inline(always)]
        || tiled_max_forward_plane(w, x, y, rows),
    )
}

#[inline(always)]
fn tiled_max_forward_plane<T: Elem>(w: &Window, x: &[T], y: &mut [T], rows: &mut Vec<f64>) -> Result<()> {
    let ([_, ih, iw], [kd, kh, kw], [od, oh, ow]) = (w.input, w.kernel, w.output);
    if ow == 0 || oh == 0 {
        return Ok(());
    }
    if y.len() < od * oh * ow {
        crate::bail!(Runtime, "Pooling: {} outputs for a plane of {od} x {oh} x {ow}", y.len());
    }
    rows.resize(ow * kw, 0.0);
    for (dh, out) in y.chunks_exact_mut(ow).take(od * oh).enumerate() {
        let (d_out, h_out) = (dh / oh, dh % oh);
        if kw == 2 {
            let starts = (d_out * kd..(d_out + 1) * kd).flat_map(|d| (h_out * kh..(h_out + 1) * kh).map(move |h| (d * ih + h) * iw));
            pair_windows_forward(x, starts, out)?;
            continue;
        }
        rows.fill(f64::NEG_INFINITY);
        for d in d_out * kd..(d_out + 1) * kd {
            for h in h_out * kh..(h_out + 1) * kh {
                let start = (d * ih + h) * iw;
                let line = cells_of(x, start..start + ow * kw)?;
                rows.iter_mut().zip(line).for_each(|(m, v)| *m = nan_max(*m, v.to_f64()));
            }
        }
        for (o, window) in out.iter_mut().zip(rows.chunks_exact(kw.max(1))) {
            *o = T::from_f64(window.iter().fold(f64::NEG_INFINITY, |m, &v| nan_max(m, v)));
        }
    }
    Ok(())
}

/// Its gradient: each window's first cell (row-major) equal to the window's maximum `y`
/// receives the output gradient, every other cell zero. Windows do not overlap, so every cell
/// is written exactly once, by its own window, with branch-free selects; compiled for the CPU's
/// vectors as the forward pass is.
fn tiled_max_backward<T: Elem>(w: &Window, x: &[T], y: &[T], g: &[T], dx: &mut [T], starts: &mut Vec<usize>, taken: &mut Vec<bool>) -> Result<()> {
    simd::vectorized(
        #[inline(always)]
        || tiled_max_backward_plane(w, x, y, g, dx, starts, taken),
    )
}

#[inline(always)]
fn tiled_max_backward_plane<T: Elem>(
    w: &Window,
    x: &[T],
    y: &[T],
    g: &[T],
    dx: &mut [T],
    starts: &mut Vec<usize>,
    taken: &mut Vec<bool>,
) -> Result<()> {
    let ([id, ih, iw], [kd, kh, kw], [od, oh, ow]) = (w.input, w.kernel, w.output);
    let width = ow * kw;
    // Cells right of or below the last window belong to none.
    if width < iw || oh * kh < ih || od * kd < id {
        dx.fill(T::default());
    }
    if ow == 0 || oh == 0 {
        return Ok(());
    }
    if y.len() < od * oh * ow || g.len() < od * oh * ow {
        crate::bail!(Runtime, "Pooling gradient: {} outputs and {} output gradients for a plane of {od} x {oh} x {ow}", y.len(), g.len());
    }
    for (dh, (maxima, grads)) in y.chunks_exact(ow).zip(g.chunks_exact(ow)).take(od * oh).enumerate() {
        let (d_out, h_out) = (dh / oh, dh % oh);
        starts.clear();
        starts.extend((d_out * kd..(d_out + 1) * kd).flat_map(|d| (h_out * kh..(h_out + 1) * kh).map(move |h| (d * ih + h) * iw)));
        if kw == 2 {
            pair_windows_backward(x, maxima, grads, dx, starts, taken)?;
            continue;
        }
        // Window rows in order, the windows of each row side by side: every window still meets
        // its cells in row-major order, which decides the one that takes the gradient.
        taken.clear();
        taken.resize(ow, false);
        for &start in starts.iter() {
            let (cells, out) = (cells_of(x, start..start + width)?, cells_of_mut(dx, start..start + width)?);
            let windows = cells.chunks_exact(kw.max(1)).zip(out.chunks_exact_mut(kw.max(1))).zip(maxima.iter().zip(grads)).zip(taken.iter_mut());
            for (((window, dwindow), (m, &grad)), taken) in windows {
                let m = m.widen();
                for (v, d) in window.iter().zip(dwindow) {
                    let hit = !*taken & is_maximum::<T>(v.widen(), m);
                    *d = if hit { grad } else { T::default() };
                    *taken |= hit;
                }
            }
        }
    }
    Ok(())
}

/// Maxima of one output row of windows two cells wide, whose rows start at `starts`: pairs of
/// cells reduce side by side, so the loop over windows vectorizes.
#[inline(always)]
fn pair_windows_forward<T: Elem>(x: &[T], mut starts: impl Iterator<Item = usize>, maxima: &mut [T]) -> Result<()> {
    let ow = maxima.len();
    let pairs = |start: usize| cells_of(x, start..start + 2 * ow).map(|cells| cells.as_chunks::<2>().0);
    let Some(first) = starts.next() else { return Ok(()) };
    for (m, &[a, b]) in maxima.iter_mut().zip(pairs(first)?) {
        *m = max_of(a, b);
    }
    for start in starts {
        for (m, &[a, b]) in maxima.iter_mut().zip(pairs(start)?) {
            *m = max_of(*m, max_of(a, b));
        }
    }
    Ok(())
}

/// One output row of windows two cells wide (2x2 pooling): window rows in order, the two cells
/// of each window side by side, so that the loop over windows vectorizes (pairs de-interleave).
#[inline(always)]
fn pair_windows_backward<T: Elem>(x: &[T], maxima: &[T], grads: &[T], dx: &mut [T], starts: &[usize], taken: &mut Vec<bool>) -> Result<()> {
    let ow = maxima.len();
    taken.clear();
    taken.resize(ow, false);
    for &start in starts {
        let (cells, out) = (cells_of(x, start..start + 2 * ow)?, cells_of_mut(dx, start..start + 2 * ow)?);
        let windows = cells.as_chunks::<2>().0.iter().zip(out.as_chunks_mut::<2>().0).zip(maxima.iter().zip(grads)).zip(taken.iter_mut());
        for (((&[a, b], [da, db]), (m, &grad)), taken) in windows {
            let m = m.widen();
            let hit_a = !*taken & is_maximum::<T>(a.widen(), m);
            let hit_b = !*taken & !hit_a & is_maximum::<T>(b.widen(), m);
            *da = if hit_a { grad } else { T::default() };
            *db = if hit_b { grad } else { T::default() };
            *taken |= hit_a | hit_b;
        }
    }
    Ok(())
}

impl Operator for Pooling {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data] = exactly("Pooling", "input", inputs)?;
        Ok(vec![self.window(data)?.out_shape])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (w, dtype) = (self.window(args.input_shape(0)?)?, args.input_dtype(0)?);
        let (plane, outs) = (w.input.iter().product::<usize>(), w.output.iter().product::<usize>());
        let (kind, include_pad) = (self.kind, self.include_pad());
        let tiled_max = kind == PoolType::Max && w.tiles();
        if kind == PoolType::Max && !tiled_max && w.channels_last.is_none() && dtype == DType::F32 {
            let frame = Frame { input: w.input, kernel: w.kernel, stride: w.stride, dilate: [1; 3], pad: w.pad, output: w.output };
            if frame.windows_inside() {
                let (x, y) = (args.input::<f32>(0)?, args.output::<f32>(0)?);
                return stencil::max_pool(&frame, x, y);
            }
        }
        if w.planes == 0 || outs == 0 {
            return Ok(());
        }
        let grain = ((1usize << 14) / plane.max(1)).max(1);
        crate::dispatch_dtype!(dtype, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if x.len() < w.planes * plane || y.len() < w.planes * outs {
                crate::bail!(Runtime, "Pooling: {} inputs and {} outputs for {} planes of {plane} and {outs}", x.len(), y.len(), w.planes);
            }
            let pool = |x: &[T], y: &mut [T], rows: &mut Vec<f64>| if tiled_max { tiled_max_forward(&w, x, y, rows) } else { pool_plane(&w, kind, include_pad, x, y) };
            match w.channels_last {
                None => {
                    parallel_units(cells_of_mut(y, 0..w.planes * outs)?, outs, grain, |first, planes| {
                        let mut rows = Vec::new();
                        for (pl, y) in (first..).zip(planes.chunks_exact_mut(outs)) {
                            pool(cells_of(x, pl * plane..(pl + 1) * plane)?, y, &mut rows)?;
                        }
                        Ok(())
                    })?;
                }
                Some(channels) => {
                    // Planes interleave element by element: each is pooled from a gathered copy
                    // and its result scattered back through a pointer into the output.
                    let (out, out_len) = (SendPtr(y.as_mut_ptr()), y.len());
                    parallel_ranges(w.planes, grain, |planes| {
                        let (mut rows, mut x_staged, mut y_staged) = (Vec::new(), vec![T::default(); plane], vec![T::default(); outs]);
                        for pl in planes {
                            gather_plane(x, pl, plane, channels, &mut x_staged)?;
                            pool(&x_staged, &mut y_staged, &mut rows)?;
                            // SAFETY: `out` is the output's `out_len` elements, borrowed for this
                            // whole call; plane pl belongs to this task alone.
                            unsafe { scatter_plane(&y_staged, out, out_len, pl, outs, channels)? };
                        }
                        Ok(())
                    })?;
                }
            }
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[super::Tensor], outputs: &[super::Tensor]) -> Result<()> {
        let ([x], [y]) = (exactly("Pooling", "input", inputs)?, exactly("Pooling", "output", outputs)?);
        let (geometry, kind) = self.on_gpu(&x.shape)?;
        crate::backend::cuda::kernels::pool(gpu, &geometry, kind, x, y)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, y, g) = (d.input(0), d.output(0), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_Pooling", &self.attrs(), &[&g, &x, &y])?)])
    }
}

/// Pools one contiguous plane `x` into `y`, window by window.
fn pool_plane<T: Elem>(w: &Window, kind: PoolType, include_pad: bool, x: &[T], y: &mut [T]) -> Result<()> {
    let available = y.len();
    let mut outputs = y.iter_mut();
    for_each_window(w, |cells, padded| {
        let value = match kind {
            PoolType::Max => {
                let mut best = f64::NEG_INFINITY;
                cells.for_each_row(|row| {
                    for v in cells_of(x, row)? {
                        let v = v.to_f64();
                        if v > best || v.is_nan() {
                            best = v;
                        }
                    }
                    Ok(())
                })?;
                best
            }
            PoolType::Sum | PoolType::Avg => {
                let mut sum = 0.0;
                cells.for_each_row(|row| {
                    for v in cells_of(x, row)? {
                        sum += v.to_f64();
                    }
                    Ok(())
                })?;
                if kind == PoolType::Avg {
                    sum / (if include_pad { padded } else { cells.count() }).max(1) as f64
                } else {
                    sum
                }
            }
            PoolType::Lp(p) => {
                let mut sum = 0.0;
                cells.for_each_row(|row| {
                    for v in cells_of(x, row)? {
                        sum += v.to_f64().abs().powi(p);
                    }
                    Ok(())
                })?;
                sum.powf(1.0 / p as f64)
            }
        };
        let out = outputs.next().ok_or_else(|| crate::err!(Runtime, "Pooling: more windows than the {available} outputs of a plane"))?;
        *out = T::from_f64(value);
        Ok(())
    })
}

impl Pooling {
    /// The window and reduction as the GPU kernels take them (channels-first layouts only).
    #[cfg(feature = "cuda")]
    fn on_gpu(&self, data: &Shape) -> Result<(crate::backend::cuda::kernels::PoolGeometry, crate::backend::cuda::kernels::PoolKind)> {
        use crate::backend::cuda::kernels::{PoolGeometry, PoolKind};
        let w = self.window(data)?;
        if w.channels_last.is_some() {
            crate::bail!(Device, "Pooling: channels-last layouts have no GPU kernel yet (use NCHW-style layouts on GPUs)");
        }
        let kind = match self.kind {
            PoolType::Max => PoolKind::Max,
            PoolType::Avg => PoolKind::Avg { include_pad: self.include_pad() },
            PoolType::Sum => PoolKind::Sum,
            PoolType::Lp(p) => PoolKind::Lp(p),
        };
        Ok((PoolGeometry { input: w.input, kernel: w.kernel, stride: w.stride, pad: w.pad, output: w.output }, kind))
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let p = &self.p;
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let mut attrs = vec![
            ("pool_type", p.pool_type.name().to_string()),
            ("global_pool", flag(p.global_pool)),
            ("pooling_convention", p.pooling_convention.name().to_string()),
        ];
        for (name, v) in [("kernel", &p.kernel), ("stride", &p.stride), ("pad", &p.pad)] {
            if !v.is_empty() {
                attrs.push((name, tuple_attr(v)));
            }
        }
        if let Some(pv) = p.p_value {
            attrs.push(("p_value", pv.to_string()));
        }
        if let Some(c) = p.count_include_pad {
            attrs.push(("count_include_pad", flag(c)));
        }
        if let Some(layout) = &p.layout {
            attrs.push(("layout", layout.clone()));
        }
        attrs
    }
}

/// `_backward_Pooling(grad, data, out)`: routes each output gradient back through its window.
struct PoolingBackward {
    pool: Pooling,
}

impl Operator for PoolingBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into(), "out".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [_, data, _] = exactly("_backward_Pooling", "input", inputs)?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&grad) = inputs.first() else {
            crate::bail!(Type, "_backward_Pooling: the output gradient is missing");
        };
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (w, dtype) = (self.pool.window(args.input_shape(1)?)?, args.input_dtype(1)?);
        let (plane, outs) = (w.input.iter().product::<usize>(), w.output.iter().product::<usize>());
        let (kind, include_pad) = (self.pool.kind, self.pool.include_pad());
        let tiled_max = kind == PoolType::Max && w.tiles();
        if w.planes == 0 || plane == 0 {
            return Ok(());
        }
        let grain = ((1usize << 14) / plane).max(1);
        crate::dispatch_dtype!(dtype, T => {
            let (g, x, y, dx) = (args.input::<T>(0)?, args.input::<T>(1)?, args.input::<T>(2)?, args.output::<T>(0)?);
            if g.len() < w.planes * outs || x.len() < w.planes * plane || y.len() < w.planes * outs || dx.len() < w.planes * plane {
                crate::bail!(
                    Runtime,
                    "_backward_Pooling: {}, {}, {} and {} values for {} planes of {plane} inputs and {outs} outputs",
                    g.len(),
                    x.len(),
                    y.len(),
                    dx.len(),
                    w.planes
                );
            }
            let unpool = |(g, x, y): (&[T], &[T], &[T]), dx: &mut [T], acc: &mut Vec<f64>, starts: &mut Vec<usize>, taken: &mut Vec<bool>| {
                if tiled_max {
                    tiled_max_backward(&w, x, y, g, dx, starts, taken)
                } else {
                    acc.resize(plane, 0.0);
                    unpool_plane(&w, kind, include_pad, g, x, y, dx, acc)
                }
            };
            match w.channels_last {
                None => {
                    parallel_units(cells_of_mut(dx, 0..w.planes * plane)?, plane, grain, |first, planes| {
                        let (mut acc, mut starts, mut taken) = (Vec::new(), Vec::new(), Vec::new());
                        for (pl, dx) in (first..).zip(planes.chunks_exact_mut(plane)) {
                            let (of_outputs, of_inputs) = (pl * outs..(pl + 1) * outs, pl * plane..(pl + 1) * plane);
                            let inputs = (cells_of(g, of_outputs.clone())?, cells_of(x, of_inputs)?, cells_of(y, of_outputs)?);
                            unpool(inputs, dx, &mut acc, &mut starts, &mut taken)?;
                        }
                        Ok(())
                    })?;
                }
                Some(channels) => {
                    // Planes interleave element by element: each is computed from gathered
                    // copies and scattered back through a pointer into the input gradient.
                    let (out, out_len) = (SendPtr(dx.as_mut_ptr()), dx.len());
                    parallel_ranges(w.planes, grain, |planes| {
                        let (mut acc, mut starts, mut taken) = (Vec::new(), Vec::new(), Vec::new());
                        let [mut g_staged, mut x_staged, mut y_staged, mut dx_staged] = [outs, plane, outs, plane].map(|len| vec![T::default(); len]);
                        for pl in planes {
                            gather_plane(g, pl, outs, channels, &mut g_staged)?;
                            gather_plane(x, pl, plane, channels, &mut x_staged)?;
                            gather_plane(y, pl, outs, channels, &mut y_staged)?;
                            unpool((&g_staged, &x_staged, &y_staged), &mut dx_staged, &mut acc, &mut starts, &mut taken)?;
                            // SAFETY: `out` is the input gradient's `out_len` elements, borrowed
                            // for this whole call; plane pl belongs to this task alone.
                            unsafe { scatter_plane(&dx_staged, out, out_len, pl, plane, channels)? };
                        }
                        Ok(())
                    })?;
                }
            }
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[super::Tensor], outputs: &[super::Tensor]) -> Result<()> {
        let ([g, x, y], [dx]) = (exactly("_backward_Pooling", "input", inputs)?, exactly("_backward_Pooling", "output", outputs)?);
        let (geometry, kind) = self.pool.on_gpu(&x.shape)?;
        crate::backend::cuda::kernels::pool_backward(gpu, &geometry, kind, g, x, y, dx)
    }
}

/// Routes the output gradient `g` of one contiguous plane back through its windows into `dx`
/// (`acc`, one f64 per input cell, accumulates overlapping windows).
#[allow(clippy::too_many_arguments)]
fn unpool_plane<T: Elem>(w: &Window, kind: PoolType, include_pad: bool, g: &[T], x: &[T], y: &[T], dx: &mut [T], acc: &mut [f64]) -> Result<()> {
    acc.iter_mut().for_each(|v| *v = 0.0);
    let available = g.len().min(y.len());
    let mut outputs = g.iter().zip(y);
    for_each_window(w, |cells, padded| {
        let (go, yo) = outputs
            .next()
            .map(|(g, y)| (g.to_f64(), y.to_f64()))
            .ok_or_else(|| crate::err!(Runtime, "Pooling gradient: more windows than the {available} outputs of a plane"))?;
        match kind {
            PoolType::Max => {
                // The first element equal to the maximum takes the gradient.
                if let Some(i) = cells.find(x, |v| v.to_f64() == yo || (yo.is_nan() && v.to_f64().is_nan()))? {
                    cells_of_mut(acc, i..i + 1)?.iter_mut().for_each(|a| *a += go);
                }
            }
            PoolType::Sum => cells.for_each_row(|row| {
                cells_of_mut(acc, row)?.iter_mut().for_each(|a| *a += go);
                Ok(())
            })?,
            PoolType::Avg => {
                let share = go / if include_pad { padded } else { cells.count() }.max(1) as f64;
                cells.for_each_row(|row| {
                    cells_of_mut(acc, row)?.iter_mut().for_each(|a| *a += share);
                    Ok(())
                })?;
            }
            PoolType::Lp(p) => cells.for_each_row(|row| {
                for (a, xi) in cells_of_mut(acc, row.clone())?.iter_mut().zip(cells_of(x, row)?) {
                    let xi = xi.to_f64();
                    if yo != 0.0 {
                        *a += go * (xi.abs() / yo).powi(p - 1) * xi.signum();
                    }
                }
                Ok(())
            })?,
        }
        Ok(())
    })?;
    dx.iter_mut().zip(acc.iter()).for_each(|(v, &a)| *v = T::from_f64(a));
    Ok(())
}

fn build(p: PoolingParams) -> Result<Pooling> {
    let kind = match p.pool_type {
        PoolingType::Max => PoolType::Max,
        PoolingType::Avg => PoolType::Avg,
        PoolingType::Sum => PoolType::Sum,
        PoolingType::Lp => match p.p_value {
            Some(v) if v >= 1 => PoolType::Lp(v as i32),
            _ => crate::bail!(Param, "Pooling: lp pooling needs p_value >= 1, got {:?}", p.p_value),
        },
    };
    if let Some(layout) = &p.layout {
        if !matches!(layout.as_str(), "NCW" | "NCHW" | "NCDHW" | "NWC" | "NHWC" | "NDHWC") {
            crate::bail!(Param, "Pooling: layout must be one of NCW, NCHW, NCDHW, NWC, NHWC, NDHWC, got {layout}");
        }
    }
    if !p.global_pool && p.kernel.is_empty() {
        crate::bail!(Param, "Pooling: kernel is required unless global_pool=True");
    }
    Ok(Pooling { p, kind })
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("Pooling", &[], "Performs max, average, sum or Lp pooling over 1-D, 2-D or 3-D windows.", |p: PoolingParams| build(p)));
    add(OpDef::new("_backward_Pooling", &[], "Gradient of Pooling.", |p: PoolingParams| Ok(PoolingBackward { pool: build(p)? })));
}
