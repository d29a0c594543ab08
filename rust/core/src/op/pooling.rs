//! Pooling (max, avg, sum, lp; 1-D to 3-D, channels first or last; valid/full/same conventions;
//! global), parallel over (image, channel) planes, and its gradient. Channels-last planes are
//! strided: each is gathered into a contiguous buffer, pooled, and its result scattered back.
//! Float32 max pooling with overlapping windows runs as a stencil over stride-phased planes.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::stencil::{self, Frame};
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor};
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
    if values.is_empty() {
        out[3 - rank..].iter_mut().for_each(|v| *v = default);
        return Ok(out);
    }
    if values.len() != rank || values.iter().any(|&v| v < 0) {
        crate::bail!(Param, "Pooling: {values:?} must hold {rank} non-negative values");
    }
    for (slot, &v) in out[3 - rank..].iter_mut().zip(values) {
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
        let (batch, channels, spatial) =
            if channels_last { (data[0], data[data.ndim() - 1], &data.dims()[1..data.ndim() - 1]) } else { (data[0], data[1], &data.dims()[2..]) };
        let mut input = [1; 3];
        input[3 - rank..].copy_from_slice(spatial);
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
        for a in 0..3 {
            let padded = input[a] + 2 * pad[a];
            if padded < kernel[a] && self.p.pooling_convention != PoolingConvention::Same {
                crate::bail!(Shape, "Pooling: kernel {:?} is larger than the padded input {data}", self.p.kernel);
            }
            output[a] = match self.p.pooling_convention {
                PoolingConvention::Full => (padded - kernel[a]).div_ceil(stride[a]) + 1,
                PoolingConvention::Same => input[a].div_ceil(stride[a]),
                PoolingConvention::Valid => (padded - kernel[a]) / stride[a] + 1,
            };
        }
        let mut dims = vec![batch];
        if channels_last {
            dims.extend_from_slice(&output[3 - rank..]);
            dims.push(channels);
        } else {
            dims.push(channels);
            dims.extend_from_slice(&output[3 - rank..]);
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

/// The window of output position `o` on one axis: its clipped [start, end) and the size of the
/// part inside the padded input (what avg pooling divides by when padding counts).
#[inline]
fn span(o: usize, a: usize, w: &Window) -> (usize, usize, usize) {
    let start = (o * w.stride[a]) as isize - w.pad[a] as isize;
    let end = (start + w.kernel[a] as isize).min((w.input[a] + w.pad[a]) as isize);
    let padded_len = (end - start).max(0) as usize;
    let (s, e) = (start.max(0) as usize, end.clamp(0, w.input[a] as isize) as usize);
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
    #[inline(always)]
    fn for_each(&self, mut f: impl FnMut(usize)) {
        for d in self.d.clone() {
            for h in self.h.clone() {
                let row = (d * self.ih + h) * self.iw;
                for x in self.w.clone() {
                    f(row + x);
                }
            }
        }
    }
    #[inline(always)]
    fn find(&self, mut hit: impl FnMut(usize) -> bool) -> Option<usize> {
        for d in self.d.clone() {
            for h in self.h.clone() {
                let row = (d * self.ih + h) * self.iw;
                if let Some(x) = self.w.clone().find(|&x| hit(row + x)) {
                    return Some(row + x);
                }
            }
        }
        None
    }
    fn count(&self) -> usize {
        self.d.len() * self.h.len() * self.w.len()
    }
}

/// Visit each output position of one plane with its window's cells and pad-inclusive size.
#[inline(always)]
fn for_each_window(w: &Window, mut visit: impl FnMut(usize, &Cells, usize)) {
    let [_, ih, iw] = w.input;
    let mut o = 0;
    for od in 0..w.output[0] {
        let (d0, d1, dn) = span(od, 0, w);
        for oh in 0..w.output[1] {
            let (h0, h1, hn) = span(oh, 1, w);
            for ow in 0..w.output[2] {
                let (w0, w1, wn) = span(ow, 2, w);
                visit(o, &Cells { d: d0..d1, h: h0..h1, w: w0..w1, ih, iw }, dn * hn * wn);
                o += 1;
            }
        }
    }
}

/// Copies plane `plane` (image `plane / channels`, channel `plane % channels`) of a channels-last
/// array whose images hold `len` positions into `dst`.
///
/// # Safety
/// `src` must hold the whole image of that plane (`len * channels` elements from its start).
unsafe fn gather_plane<T: Elem>(src: *const T, plane: usize, len: usize, channels: usize, dst: &mut [T]) {
    let base = src.add((plane / channels) * len * channels + plane % channels);
    for (s, d) in dst.iter_mut().enumerate() {
        *d = *base.add(s * channels);
    }
}

/// Writes `src` as plane `plane` of a channels-last array (the inverse of [`gather_plane`]).
///
/// # Safety
/// As for [`gather_plane`]; no other thread may write this plane's elements (other planes
/// interleave with it, element by element, which is sound through raw pointers).
unsafe fn scatter_plane<T: Elem>(src: &[T], dst: *mut T, plane: usize, len: usize, channels: usize) {
    let base = dst.add((plane / channels) * len * channels + plane % channels);
    for (s, &v) in src.iter().enumerate() {
        base.add(s * channels).write(v);
    }
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

impl Window {
    /// Max pooling whose windows tile the input exactly (stride = kernel, no padding, every
    /// window inside the input; 2x2 stride 2 is the common case). Those planes run as row-wise
    /// vector loops instead of window by window.
    fn tiles(&self) -> bool {
        self.kernel == self.stride && self.pad == [0; 3] && (0..3).all(|a| self.output[a] * self.kernel[a] <= self.input[a])
    }
}

/// Tiled max pooling of one plane: the maximum over a window's rows first (row against row),
/// then over each window's columns.
fn tiled_max_forward<T: Elem>(w: &Window, x: &[T], y: &mut [T], rows: &mut Vec<f64>) {
    let ([_, ih, iw], [kd, kh, kw], [od, oh, ow]) = (w.input, w.kernel, w.output);
    rows.resize(ow * kw, 0.0);
    for (d_out, h_out) in (0..od).flat_map(|d| (0..oh).map(move |h| (d, h))) {
        if kw == 2 {
            let starts = (d_out * kd..(d_out + 1) * kd).flat_map(|d| (h_out * kh..(h_out + 1) * kh).map(move |h| (d * ih + h) * iw));
            pair_windows_forward(x, starts, &mut y[(d_out * oh + h_out) * ow..][..ow]);
            continue;
        }
        rows.fill(f64::NEG_INFINITY);
        for d in d_out * kd..(d_out + 1) * kd {
            for h in h_out * kh..(h_out + 1) * kh {
                let line = &x[(d * ih + h) * iw..][..ow * kw];
                rows.iter_mut().zip(line).for_each(|(m, v)| *m = nan_max(*m, v.to_f64()));
            }
        }
        let out = &mut y[(d_out * oh + h_out) * ow..][..ow];
        for (o, window) in out.iter_mut().zip(rows.chunks_exact(kw)) {
            *o = T::from_f64(window.iter().fold(f64::NEG_INFINITY, |m, &v| nan_max(m, v)));
        }
    }
}

/// Its gradient: each window's first cell (row-major) equal to the window's maximum `y`
/// receives the output gradient, every other cell zero. Windows do not overlap, so every cell
/// is written exactly once, by its own window, with branch-free selects.
fn tiled_max_backward<T: Elem>(w: &Window, x: &[T], y: &[T], g: &[T], dx: &mut [T], starts: &mut Vec<usize>, taken: &mut Vec<bool>) {
    let ([_, ih, iw], [kd, kh, kw], [od, oh, ow]) = (w.input, w.kernel, w.output);
    let width = ow * kw;
    // Cells right of or below the last window belong to none.
    if width < iw || oh * kh < ih || od * kd < w.input[0] {
        dx.fill(T::default());
    }
    for (d_out, h_out) in (0..od).flat_map(|d| (0..oh).map(move |h| (d, h))) {
        starts.clear();
        starts.extend((d_out * kd..(d_out + 1) * kd).flat_map(|d| (h_out * kh..(h_out + 1) * kh).map(move |h| (d * ih + h) * iw)));
        let first = (d_out * oh + h_out) * ow;
        if kw == 2 {
            pair_windows_backward(x, &y[first..][..ow], &g[first..][..ow], dx, starts, taken);
            continue;
        }
        for o in 0..ow {
            let (m, grad) = (y[first + o].to_f64(), g[first + o]);
            let mut taken = false;
            for &start in starts.iter() {
                let cells = start + o * kw..start + (o + 1) * kw;
                for (v, d) in x[cells.clone()].iter().zip(&mut dx[cells]) {
                    let v = v.to_f64();
                    let hit = !taken & ((v == m) | (v.is_nan() & m.is_nan()));
                    *d = if hit { grad } else { T::default() };
                    taken |= hit;
                }
            }
        }
    }
}

/// Maxima of one output row of windows two cells wide, whose rows start at `starts`: pairs of
/// cells reduce side by side, so the loop over windows vectorizes.
#[inline(always)]
fn pair_windows_forward<T: Elem>(x: &[T], mut starts: impl Iterator<Item = usize>, maxima: &mut [T]) {
    let ow = maxima.len();
    let pairs = |start: usize| x[start..][..2 * ow].as_chunks::<2>().0;
    let Some(first) = starts.next() else { return };
    for (m, pair) in maxima.iter_mut().zip(pairs(first)) {
        *m = T::from_f64(nan_max(pair[0].to_f64(), pair[1].to_f64()));
    }
    for start in starts {
        for (m, pair) in maxima.iter_mut().zip(pairs(start)) {
            *m = T::from_f64(nan_max(m.to_f64(), nan_max(pair[0].to_f64(), pair[1].to_f64())));
        }
    }
}

/// One output row of windows two cells wide (2x2 pooling): window rows in order, the two cells
/// of each window side by side, so that the loop over windows vectorizes (pairs de-interleave).
#[inline(always)]
fn pair_windows_backward<T: Elem>(x: &[T], maxima: &[T], grads: &[T], dx: &mut [T], starts: &[usize], taken: &mut Vec<bool>) {
    let ow = maxima.len();
    taken.clear();
    taken.resize(ow, false);
    for &start in starts {
        let (cells, out) = (&x[start..][..2 * ow], &mut dx[start..][..2 * ow]);
        let windows = cells.chunks_exact(2).zip(out.chunks_exact_mut(2)).zip(maxima.iter().zip(grads)).zip(taken.iter_mut());
        for (((pair, dpair), (m, &grad)), taken) in windows {
            let (a, b, m) = (pair[0].to_f64(), pair[1].to_f64(), m.to_f64());
            let equal = |v: f64| (v == m) | (v.is_nan() & m.is_nan());
            let hit_a = !*taken & equal(a);
            let hit_b = !*taken & !hit_a & equal(b);
            dpair[0] = if hit_a { grad } else { T::default() };
            dpair[1] = if hit_b { grad } else { T::default() };
            *taken |= hit_a | hit_b;
        }
    }
}

impl Operator for Pooling {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![self.window(&inputs[0])?.out_shape])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let w = self.window(&inputs[0].shape)?;
        let (plane, outs) = (w.input.iter().product::<usize>(), w.output.iter().product::<usize>());
        let (kind, include_pad) = (self.kind, self.include_pad());
        let tiled_max = kind == PoolType::Max && w.tiles();
        if kind == PoolType::Max && !tiled_max && w.channels_last.is_none() && inputs[0].dtype == DType::F32 {
            let frame = Frame { input: w.input, kernel: w.kernel, stride: w.stride, dilate: [1; 3], pad: w.pad, output: w.output };
            if frame.windows_inside() {
                let (x, y) = (args.input::<f32>(0)?, args.output::<f32>(0)?);
                return stencil::max_pool(&frame, x, y);
            }
        }
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (xp, op) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            parallel_chunks(w.planes, ((1usize << 14) / plane.max(1)).max(1), |planes| {
                let mut rows = Vec::new();
                let staged = w.channels_last.is_some();
                let (mut x_staged, mut y_staged) = if staged { (vec![T::default(); plane], vec![T::default(); outs]) } else { (Vec::new(), Vec::new()) };
                for pl in planes {
                    // SAFETY: plane pl of the input and of the output belong to this task.
                    let (x, y): (&[T], &mut [T]) = match w.channels_last {
                        Some(channels) => {
                            unsafe { gather_plane(xp.get(), pl, plane, channels, &mut x_staged) };
                            (&x_staged, &mut y_staged)
                        }
                        None => unsafe {
                            (std::slice::from_raw_parts(xp.get().add(pl * plane), plane), std::slice::from_raw_parts_mut(op.get().add(pl * outs), outs))
                        },
                    };
                    if tiled_max {
                        tiled_max_forward(&w, x, y, &mut rows);
                    } else {
                        pool_plane(&w, kind, include_pad, x, y);
                    }
                    if let Some(channels) = w.channels_last {
                        // SAFETY: this task alone writes plane pl of the output.
                        unsafe { scatter_plane(&y_staged, op.get(), pl, outs, channels) };
                    }
                }
            });
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let (geometry, kind) = self.on_gpu(&inputs[0].shape)?;
        crate::backend::cuda::kernels::pool(gpu, &geometry, kind, &inputs[0], &outputs[0])
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, y, g) = (d.input(0), d.output(0), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_Pooling", &self.attrs(), &[&g, &x, &y])?)])
    }
}

/// Pools one contiguous plane `x` into `y`, window by window.
fn pool_plane<T: Elem>(w: &Window, kind: PoolType, include_pad: bool, x: &[T], y: &mut [T]) {
    for_each_window(w, |o, cells, padded| {
        let value = match kind {
            PoolType::Max => {
                let mut best = f64::NEG_INFINITY;
                cells.for_each(|i| {
                    let v = x[i].to_f64();
                    if v > best || v.is_nan() {
                        best = v;
                    }
                });
                best
            }
            PoolType::Sum | PoolType::Avg => {
                let mut sum = 0.0;
                cells.for_each(|i| sum += x[i].to_f64());
                if kind == PoolType::Avg {
                    sum / (if include_pad { padded } else { cells.count() }).max(1) as f64
                } else {
                    sum
                }
            }
            PoolType::Lp(p) => {
                let mut sum = 0.0;
                cells.for_each(|i| sum += x[i].to_f64().abs().powi(p));
                sum.powf(1.0 / p as f64)
            }
        };
        y[o] = T::from_f64(value);
    });
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
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let w = self.pool.window(&inputs[1].shape)?;
        let (plane, outs) = (w.input.iter().product::<usize>(), w.output.iter().product::<usize>());
        let (kind, include_pad) = (self.pool.kind, self.pool.include_pad());
        let tiled_max = kind == PoolType::Max && w.tiles();
        crate::dispatch_dtype!(inputs[1].dtype, T => {
            let (gp, xp, yp, dp) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(inputs[1].ptr::<T>()), SendPtr(inputs[2].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            parallel_chunks(w.planes, ((1usize << 14) / plane.max(1)).max(1), |planes| {
                let mut acc = vec![0f64; if tiled_max { 0 } else { plane }];
                let (mut starts, mut taken) = (Vec::new(), Vec::new());
                let staged = w.channels_last.is_some();
                let [mut g_staged, mut x_staged, mut y_staged, mut dx_staged] =
                    [outs, plane, outs, plane].map(|len| vec![T::default(); if staged { len } else { 0 }]);
                for pl in planes {
                    // SAFETY: plane pl of every array belongs to this task; inputs are read-only.
                    let (g, x, y, dx): (&[T], &[T], &[T], &mut [T]) = match w.channels_last {
                        Some(channels) => {
                            unsafe {
                                gather_plane(gp.get(), pl, outs, channels, &mut g_staged);
                                gather_plane(xp.get(), pl, plane, channels, &mut x_staged);
                                gather_plane(yp.get(), pl, outs, channels, &mut y_staged);
                            }
                            (&g_staged, &x_staged, &y_staged, &mut dx_staged)
                        }
                        None => unsafe {
                            (
                                std::slice::from_raw_parts(gp.get().add(pl * outs), outs),
                                std::slice::from_raw_parts(xp.get().add(pl * plane), plane),
                                std::slice::from_raw_parts(yp.get().add(pl * outs), outs),
                                std::slice::from_raw_parts_mut(dp.get().add(pl * plane), plane),
                            )
                        },
                    };
                    if tiled_max {
                        tiled_max_backward(&w, x, y, g, dx, &mut starts, &mut taken);
                    } else {
                        unpool_plane(&w, kind, include_pad, g, x, y, dx, &mut acc);
                    }
                    if let Some(channels) = w.channels_last {
                        // SAFETY: this task alone writes plane pl of the input gradient.
                        unsafe { scatter_plane(&dx_staged, dp.get(), pl, plane, channels) };
                    }
                }
            });
        });
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let (geometry, kind) = self.pool.on_gpu(&inputs[1].shape)?;
        crate::backend::cuda::kernels::pool_backward(gpu, &geometry, kind, &inputs[0], &inputs[1], &inputs[2], &outputs[0])
    }
}

/// Routes the output gradient `g` of one contiguous plane back through its windows into `dx`
/// (`acc`, one f64 per input cell, accumulates overlapping windows).
#[allow(clippy::too_many_arguments)]
fn unpool_plane<T: Elem>(w: &Window, kind: PoolType, include_pad: bool, g: &[T], x: &[T], y: &[T], dx: &mut [T], acc: &mut [f64]) {
    acc.iter_mut().for_each(|v| *v = 0.0);
    for_each_window(w, |o, cells, padded| {
        let (go, yo) = (g[o].to_f64(), y[o].to_f64());
        match kind {
            PoolType::Max => {
                // The first element equal to the maximum takes the gradient.
                if let Some(i) = cells.find(|i| x[i].to_f64() == yo || (yo.is_nan() && x[i].to_f64().is_nan())) {
                    acc[i] += go;
                }
            }
            PoolType::Sum => cells.for_each(|i| acc[i] += go),
            PoolType::Avg => {
                let share = go / if include_pad { padded } else { cells.count() }.max(1) as f64;
                cells.for_each(|i| acc[i] += share);
            }
            PoolType::Lp(p) => cells.for_each(|i| {
                let xi = x[i].to_f64();
                if yo != 0.0 {
                    acc[i] += go * (xi.abs() / yo).powi(p - 1) * xi.signum();
                }
            }),
        }
    });
    dx.iter_mut().zip(acc.iter()).for_each(|(v, &a)| *v = T::from_f64(a));
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
