//! Image operators: MXNet's `_image_*` family, which Python exposes as `mx.nd.image.*` and
//! `mx.sym.image.*` and Gluon's vision transforms call.
//!
//! Images are (height, width, channels) arrays, batches (N, height, width, channels); `to_tensor`
//! turns them into (channels, height, width) tensors scaled to [0, 1], which `normalize` takes.
//! Every kernel computes in f64 and stores with rounding and saturation for integer dtypes, so a
//! uint8 image stays a valid uint8 image.
//!
//! `resize` reproduces OpenCV's `cv::resize` (which MXNet calls) as separable per-axis tap tables:
//! nearest (0), bilinear (1), area (2), bicubic (3) and Lanczos (4), with OpenCV's pixel-centre
//! conventions and replicated borders.
//!
//! The random augmentations draw their factors from the op's seed, one set per image of a batch.
//! Like MXNet, their gradient passes the output gradient through unchanged (they are data
//! augmentations, not layers).

use super::grad::{tuple_attr, Grad, InputGrads};
use super::params::NoParams;
use super::{exactly, parallel_units, ExecContext, OpDef, Operator};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;
use crate::random;

/// The geometry of an image or image batch in (N, height, width, channels) layout.
#[derive(Clone, Copy, Debug)]
struct Layout {
    batch: usize,
    height: usize,
    width: usize,
    channels: usize,
    /// Whether the array has the batch axis (4-D) or is a single (H, W, C) image.
    batched: bool,
}

impl Layout {
    fn of(op: &str, shape: &Shape) -> Result<Layout> {
        match *shape.dims() {
            [height, width, channels] => Ok(Layout { batch: 1, height, width, channels, batched: false }),
            [batch, height, width, channels] => Ok(Layout { batch, height, width, channels, batched: true }),
            _ => crate::bail!(
                Shape,
                "{op}: expected an image of shape (height, width, channels) or a batch of shape (N, height, width, \
                 channels), got {shape}"
            ),
        }
    }
    /// Like [`Layout::of`], for operators that treat pixels as gray (1 channel) or RGB (3).
    fn of_color(op: &str, shape: &Shape) -> Result<Layout> {
        let layout = Layout::of(op, shape)?;
        if layout.channels != 1 && layout.channels != 3 {
            crate::bail!(Shape, "{op}: the last axis of {shape} must hold 1 (gray) or 3 (RGB) channels, got {}", layout.channels);
        }
        Ok(layout)
    }
    fn image_size(&self) -> usize {
        self.height * self.width * self.channels
    }
    fn with_size(&self, height: usize, width: usize) -> Shape {
        if self.batched {
            Shape::new(vec![self.batch, height, width, self.channels])
        } else {
            Shape::new(vec![height, width, self.channels])
        }
    }
}

/// `value` as an element of `T`: integer dtypes round to nearest (ties to even, as OpenCV's
/// `saturate_cast`) and saturate at their range.
#[inline(always)]
fn store<T: Elem>(value: f64) -> T {
    if T::DTYPE.is_float() {
        T::from_f64(value)
    } else {
        T::from_f64(value.round_ties_even())
    }
}

/// Run `per_image(index, input image, output image)` over a batch of `in_size`-element images
/// into one of `out_size`-element images, images in parallel.
fn for_each_image<A: Sync, B: Send>(
    src: &[A],
    dst: &mut [B],
    in_size: usize,
    out_size: usize,
    per_image: impl Fn(usize, &[A], &mut [B]) -> Result<()> + Sync,
) -> Result<()> {
    // Chunk sizes of at least one: an empty image leaves nothing to compute.
    let (in_size, out_size) = (in_size.max(1), out_size.max(1));
    parallel_units(dst, out_size, 1, |first, images| {
        for ((n, out), image) in (first..).zip(images.chunks_exact_mut(out_size)).zip(src.chunks_exact(in_size).skip(first)) {
            per_image(n, image, out)?;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// to_tensor

/// `_image_to_tensor`: (H, W, C) in [0, 255] to a float32 (C, H, W) tensor in [0, 1].
struct ToTensor;

impl ToTensor {
    /// The (C, H, W) tensor shape, or (N, C, H, W), of an image shape.
    fn tensor_shape(image: &Shape) -> Result<Shape> {
        let l = Layout::of("_image_to_tensor", image)?;
        Ok(Shape::new(if l.batched { vec![l.batch, l.channels, l.height, l.width] } else { vec![l.channels, l.height, l.width] }))
    }
}

impl Operator for ToTensor {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [image] = exactly("_image_to_tensor", "input", inputs)?;
        Ok(vec![Self::tensor_shape(image)?])
    }
    fn infer_type(&self, _inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![DType::F32])
    }
    fn fixed_output_types(&self) -> Option<Vec<DType>> {
        Some(vec![DType::F32])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = Layout::of("_image_to_tensor", args.input_shape(0)?)?;
        let (pixels, channels, size) = (l.height * l.width, l.channels, l.image_size());
        let out = args.output::<f32>(0)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            for_each_image(args.input::<T>(0)?, out, size, size, |_, src, dst| {
                for (c, plane) in dst.chunks_exact_mut(pixels.max(1)).enumerate() {
                    for (y, v) in plane.iter_mut().zip(src.iter().skip(c).step_by(channels.max(1))) {
                        *y = (v.to_f64() / 255.0) as f32;
                    }
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x) = (d.out_grad(0), d.input(0));
        Ok(vec![Some(d.op("_backward_image_to_tensor", &[], &[&g, &x])?)])
    }
}

/// `_backward_image_to_tensor(grad, data)`: the (C, H, W) gradient back in the image's layout
/// and dtype, divided by 255.
struct ToTensorBackward;

impl Operator for ToTensorBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_image_to_tensor", "input", inputs)?;
        let expected = ToTensor::tensor_shape(data)?;
        if *grad != expected {
            crate::bail!(Shape, "_backward_image_to_tensor: gradient {grad} does not match the tensor shape {expected}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, data] = exactly("_backward_image_to_tensor", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = Layout::of("_backward_image_to_tensor", args.output_shape(0)?)?;
        let (pixels, channels) = (l.height * l.width, l.channels);
        crate::dispatch_dtype!(args.input_dtype(0)?, G => {
            let gv = args.input::<G>(0)?;
            crate::dispatch_dtype!(args.output_dtype(0)?, T => {
                let y = args.output::<T>(0)?;
                let size = l.image_size().max(1);
                for (dst, src) in y.chunks_mut(size).zip(gv.chunks(size)) {
                    for (c, plane) in src.chunks(pixels.max(1)).enumerate() {
                        for (out, v) in dst.iter_mut().skip(c).step_by(channels.max(1)).zip(plane) {
                            *out = store(v.to_f64() / 255.0);
                        }
                    }
                }
            });
        });
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// normalize

crate::op_params! {
    pub struct NormalizeParams {
        /// Per-channel means: one value for every channel, or one per channel.
        mean: Vec<f64> = vec![0.0],
        /// Per-channel standard deviations: one value for every channel, or one per channel.
        std: Vec<f64> = vec![1.0],
    }
}

/// `_image_normalize`: `(x - mean[c]) / std[c]` over a (C, H, W) tensor or (N, C, H, W) batch.
struct Normalize {
    params: NormalizeParams,
    name: &'static str,
}

impl Normalize {
    /// (channels, pixels per channel) of a valid input.
    fn geometry(&self, shape: &Shape) -> Result<(usize, usize)> {
        let (channels, pixels) = match *shape.dims() {
            [c, h, w] | [_, c, h, w] => (c, h * w),
            _ => crate::bail!(
                Shape,
                "{}: expected a tensor of shape (channels, height, width) or (N, channels, height, width), got {shape}",
                self.name
            ),
        };
        for (what, values) in [("mean", &self.params.mean), ("std", &self.params.std)] {
            if values.len() != 1 && values.len() != channels {
                crate::bail!(
                    Shape,
                    "{}: {what} has {} values for an input of {channels} channels ({shape}): give 1 or {channels}",
                    self.name,
                    values.len()
                );
            }
        }
        Ok((channels, pixels))
    }
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let text = |v: &[f64]| format!("({})", v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "));
        vec![("mean", text(&self.params.mean)), ("std", text(&self.params.std))]
    }
}

impl Operator for Normalize {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly(self.name, "input", inputs)?;
        self.geometry(x)?;
        Ok(vec![x.clone()])
    }
    /// `out = (x - mean[c]) / std[c]` over channel planes; the backward op shares the kernel, its
    /// gradient being the output gradient over std.
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (channels, pixels) = self.geometry(args.input_shape(0)?)?;
        let subtract_mean = self.name == "_image_normalize";
        // (mean, 1 / std) of each channel: `geometry` checked that a list holds one value for
        // every channel or one per channel.
        let per_channel = |values: &[f64]| values.iter().cycle().take(channels).copied().collect::<Vec<_>>();
        let factors: Vec<(f64, f64)> = per_channel(&self.params.mean)
            .into_iter()
            .zip(per_channel(&self.params.std))
            .map(|(mean, std)| (if subtract_mean { mean } else { 0.0 }, 1.0 / std))
            .collect();
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (src, dst) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let plane = pixels.max(1);
            for ((d, s), &(mean, inv_std)) in dst.chunks_mut(plane).zip(src.chunks(plane)).zip(factors.iter().cycle()) {
                for (o, &v) in d.iter_mut().zip(s) {
                    *o = store((v.to_f64() - mean) * inv_std);
                }
            }
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        // Both the forward and the backward op are linear with slope 1 / std per channel.
        let g = d.out_grad(0);
        Ok(vec![Some(d.op("_backward_image_normalize", &self.attrs(), &[&g])?)])
    }
}

// ---------------------------------------------------------------------------------------------
// resize

crate::op_params! {
    pub struct ResizeParams {
        /// New size: (width, height), or one value (see keep_ratio).
        size: Vec<i64> = Vec::new(),
        /// With a single size: resize the short edge to it keeping the aspect ratio (True), or
        /// both edges to it (False).
        keep_ratio: bool = false,
        /// Interpolation: 0 nearest, 1 bilinear, 2 area, 3 bicubic, 4 Lanczos (OpenCV's codes).
        interp: i64 = 1,
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Interp {
    Nearest,
    Linear,
    Area,
    Cubic,
    Lanczos,
}

impl Interp {
    fn from_code(op: &str, code: i64) -> Result<Interp> {
        Ok(match code {
            0 => Interp::Nearest,
            1 => Interp::Linear,
            2 => Interp::Area,
            3 => Interp::Cubic,
            4 => Interp::Lanczos,
            _ => crate::bail!(Param, "{op}: interp must be 0 (nearest), 1 (bilinear), 2 (area), 3 (bicubic) or 4 (Lanczos), got {code}"),
        })
    }
}

/// For every output coordinate along one axis: the source coordinates and weights it mixes.
type Taps = Vec<Vec<(usize, f64)>>;

/// OpenCV's per-axis resampling taps from `src` to `dst` samples. `area_shrinks` says that area
/// interpolation shrinks along both axes, where OpenCV averages source cells; otherwise area
/// interpolation uses OpenCV's bilinear variant with its own fractional weights.
fn axis_taps(interp: Interp, src: usize, dst: usize, area_shrinks: bool) -> Taps {
    let scale = src as f64 / dst as f64;
    let last = src as i64 - 1;
    let clamp = |i: f64| (i as i64).clamp(0, last) as usize;
    let centre = |d: usize| (d as f64 + 0.5) * scale - 0.5;
    (0..dst)
        .map(|d| match interp {
            Interp::Nearest => vec![(((d as f64 * scale).floor() as usize).min(src - 1), 1.0)],
            Interp::Linear => {
                let f = centre(d);
                let s = f.floor();
                let t = f - s;
                vec![(clamp(s), 1.0 - t), (clamp(s + 1.0), t)]
            }
            Interp::Area if area_shrinks => {
                let start = d as f64 * scale;
                let end = start + scale;
                let cell = scale.min(src as f64 - start);
                let last_whole = end.floor().min(last as f64);
                let first_whole = start.ceil().min(last_whole);
                let mut taps = Vec::new();
                if first_whole - start > 1e-3 {
                    taps.push((first_whole as usize - 1, (first_whole - start) / cell));
                }
                let mut s = first_whole as usize;
                while (s as f64) < last_whole {
                    taps.push((s, 1.0 / cell));
                    s += 1;
                }
                if end - last_whole > 1e-3 {
                    taps.push((last_whole as usize, (end - last_whole).min(1.0).min(cell) / cell));
                }
                taps
            }
            Interp::Area => {
                let s = (d as f64 * scale).floor();
                let t = (d + 1) as f64 - (s + 1.0) / scale;
                let t = if t <= 0.0 { 0.0 } else { t - t.floor() };
                vec![(clamp(s), 1.0 - t), (clamp(s + 1.0), t)]
            }
            Interp::Cubic => {
                const A: f64 = -0.75;
                let f = centre(d);
                let s = f.floor();
                let x = f - s;
                let w0 = ((A * (x + 1.0) - 5.0 * A) * (x + 1.0) + 8.0 * A) * (x + 1.0) - 4.0 * A;
                let w1 = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
                let w2 = ((A + 2.0) * (1.0 - x) - (A + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0;
                let w3 = 1.0 - w0 - w1 - w2;
                [w0, w1, w2, w3].iter().enumerate().map(|(k, &w)| (clamp(s - 1.0 + k as f64), w)).collect()
            }
            Interp::Lanczos => {
                let f = centre(d);
                let s = f.floor();
                let x = f - s;
                if x < f64::from(f32::EPSILON) {
                    return vec![(clamp(s), 1.0)];
                }
                // sinc(t) * sinc(t / 4) over the 8 nearest source samples, normalized.
                let sinc = |t: f64| {
                    let p = std::f64::consts::PI * t;
                    p.sin() / p
                };
                let raw: Vec<f64> = (0..8).map(|k| x + 3.0 - k as f64).map(|t| sinc(t) * sinc(t / 4.0)).collect();
                let total: f64 = raw.iter().sum();
                raw.iter().enumerate().map(|(k, &w)| (clamp(s - 3.0 + k as f64), w / total)).collect()
            }
        })
        .collect()
}

/// Resample one (H, W, C) image into `dst` (h, w, C) through per-axis taps: rows first, then
/// columns, in f64. Each sample adds its weighted taps in order starting from -0.0, as
/// `Iterator::sum` does, a whole source pixel or line at a time.
fn resample<T: Elem>(src: &[T], dst: &mut [T], src_w: usize, channels: usize, rows: &Taps, cols: &Taps) -> Result<()> {
    let channels = channels.max(1);
    let (src_row, dst_row) = ((src_w * channels).max(1), (cols.len() * channels).max(1));
    let mut horizontal = vec![0f64; src.len() / src_row * dst_row];
    for (line, src_line) in horizontal.chunks_exact_mut(dst_row).zip(src.chunks_exact(src_row)) {
        for (pixel, taps) in line.chunks_exact_mut(channels).zip(cols) {
            pixel.fill(-0.0);
            for &(s, w) in taps {
                let source = src_line
                    .get(s * channels..(s + 1) * channels)
                    .ok_or_else(|| crate::err!(Runtime, "_image_resize: column {s} is past the image's {src_w} columns"))?;
                pixel.iter_mut().zip(source).for_each(|(sum, v)| *sum += w * v.to_f64());
            }
        }
    }
    let mut sums = vec![0f64; dst_row];
    for (out_line, taps) in dst.chunks_exact_mut(dst_row).zip(rows) {
        sums.fill(-0.0);
        for &(s, w) in taps {
            let line = horizontal
                .get(s * dst_row..(s + 1) * dst_row)
                .ok_or_else(|| crate::err!(Runtime, "_image_resize: row {s} is past the image's {} rows", src.len() / src_row))?;
            sums.iter_mut().zip(line).for_each(|(sum, v)| *sum += w * v);
        }
        out_line.iter_mut().zip(&sums).for_each(|(o, &v)| *o = store(v));
    }
    Ok(())
}

/// `_image_resize`: OpenCV-compatible resize of an image or batch.
struct Resize {
    params: ResizeParams,
    interp: Interp,
}

impl Resize {
    /// (height, width) of the output for an input of `height` x `width`, as MXNet computes it.
    fn target(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        let size = &self.params.size;
        if size.iter().any(|&s| s <= 0) {
            crate::bail!(Param, "_image_resize: size must be positive, got {}", tuple_attr(size));
        }
        match *size.as_slice() {
            [edge] if self.params.keep_ratio => {
                let edge = edge as usize;
                if height == 0 || width == 0 {
                    crate::bail!(Shape, "_image_resize: cannot keep the aspect ratio of an empty {height}x{width} image");
                }
                Ok(if height > width { (height * edge / width, edge) } else { (edge, width * edge / height) })
            }
            [edge] => Ok((edge as usize, edge as usize)),
            [w, h] => Ok((h as usize, w as usize)),
            _ => crate::bail!(Param, "_image_resize: size must be (width, height) or one value, got {}", tuple_attr(size)),
        }
    }
}

impl Operator for Resize {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [image] = exactly("_image_resize", "input", inputs)?;
        let l = Layout::of("_image_resize", image)?;
        let (h, w) = self.target(l.height, l.width)?;
        Ok(vec![l.with_size(h, w)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = Layout::of("_image_resize", args.input_shape(0)?)?;
        let (h, w) = self.target(l.height, l.width)?;
        if l.height == 0 || l.width == 0 {
            if args.output_shape(0)?.size() > 0 {
                crate::bail!(Shape, "_image_resize: cannot resize an empty {}x{} image to {h}x{w}", l.height, l.width);
            }
            return Ok(());
        }
        let area_shrinks = h <= l.height && w <= l.width;
        let rows = axis_taps(self.interp, l.height, h, area_shrinks);
        let cols = axis_taps(self.interp, l.width, w, area_shrinks);
        let out_size = h * w * l.channels;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            for_each_image(args.input::<T>(0)?, args.output::<T>(0)?, l.image_size(), out_size, |_, src, dst| {
                resample(src, dst, l.width, l.channels, &rows, &cols)
            })
        })
    }
}

// ---------------------------------------------------------------------------------------------
// crop

crate::op_params! {
    pub struct CropParams {
        /// Left edge of the crop.
        x: i64,
        /// Top edge of the crop.
        y: i64,
        /// Width of the crop.
        width: i64,
        /// Height of the crop.
        height: i64,
    }
}

/// `_image_crop`: the `width` x `height` window at (`x`, `y`) of an image or of every image of
/// a batch.
struct Crop {
    params: CropParams,
}

impl Crop {
    fn check(&self, op: &str, shape: &Shape) -> Result<Layout> {
        let l = Layout::of(op, shape)?;
        let p = &self.params;
        if p.width <= 0 || p.height <= 0 {
            crate::bail!(Param, "{op}: width and height must be positive, got {}x{}", p.width, p.height);
        }
        if p.x < 0 || p.y < 0 || p.x + p.width > l.width as i64 || p.y + p.height > l.height as i64 {
            crate::bail!(
                Shape,
                "{op}: the {}x{} window at x={}, y={} does not fit in the {}x{} (width x height) image {shape}",
                p.width,
                p.height,
                p.x,
                p.y,
                l.width,
                l.height
            );
        }
        Ok(l)
    }
    /// The shape of the window cut out of `shape`.
    fn window_shape(&self, shape: &Shape) -> Result<Shape> {
        let l = self.check("_image_crop", shape)?;
        Ok(l.with_size(self.params.height as usize, self.params.width as usize))
    }
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let p = &self.params;
        vec![("x", p.x.to_string()), ("y", p.y.to_string()), ("width", p.width.to_string()), ("height", p.height.to_string())]
    }
    /// For each row of the window: its element range in the image and in the window.
    fn window_rows(&self, l: &Layout) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> {
        let p = &self.params;
        let (x0, y0) = (p.x as usize, p.y as usize);
        let (row, channels, width) = (p.width as usize * l.channels, l.channels, l.width);
        (0..p.height as usize).map(move |r| {
            let start = ((y0 + r) * width + x0) * channels;
            (start..start + row, r * row..(r + 1) * row)
        })
    }
}

impl Operator for Crop {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [image] = exactly("_image_crop", "input", inputs)?;
        Ok(vec![self.window_shape(image)?])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = self.check("_image_crop", args.input_shape(0)?)?;
        let window = (self.params.width * self.params.height) as usize * l.channels;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            for_each_image(args.input::<T>(0)?, args.output::<T>(0)?, l.image_size(), window, |_, src, dst| {
                for (image_rows, window_rows) in self.window_rows(&l) {
                    let (Some(to), Some(from)) = (dst.get_mut(window_rows), src.get(image_rows)) else {
                        crate::bail!(Runtime, "_image_crop: a window row lies outside the {}x{} image or its window", l.width, l.height);
                    };
                    to.copy_from_slice(from);
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x) = (d.out_grad(0), d.input(0));
        Ok(vec![Some(d.op("_backward_image_crop", &self.attrs(), &[&g, &x])?)])
    }
}

/// `_backward_image_crop(grad, data)`: the window's gradient placed in a zero image.
struct CropBackward {
    crop: Crop,
}

impl Operator for CropBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, data] = exactly("_backward_image_crop", "input", inputs)?;
        let window = self.crop.window_shape(data)?;
        if *grad != window {
            crate::bail!(Shape, "_backward_image_crop: gradient {grad} does not match the crop shape {window}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _] = exactly("_backward_image_crop", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = self.crop.check("_backward_image_crop", args.output_shape(0)?)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let grad = args.input::<T>(0)?;
            let window = grad.len() / l.batch.max(1);
            for_each_image(grad, args.output::<T>(0)?, window, l.image_size(), |_, src, dst| {
                dst.fill(T::default());
                for (image_rows, window_rows) in self.crop.window_rows(&l) {
                    let (Some(to), Some(from)) = (dst.get_mut(image_rows), src.get(window_rows)) else {
                        crate::bail!(Runtime, "_backward_image_crop: a window row lies outside the {}x{} image or its window", l.width, l.height);
                    };
                    to.copy_from_slice(from);
                }
                Ok(())
            })
        })
    }
}

// ---------------------------------------------------------------------------------------------
// flips

#[derive(Clone, Copy, PartialEq)]
enum FlipAxis {
    /// Mirror the columns (left-right).
    Width,
    /// Mirror the rows (top-bottom).
    Height,
}

/// Mirror one (H, W, C) image.
fn flip_image<T: Copy>(src: &[T], dst: &mut [T], l: &Layout, axis: FlipAxis) {
    let channels = l.channels.max(1);
    let row = l.width * channels;
    let (src_rows, dst_rows) = (src.chunks_exact(row.max(1)), dst.chunks_exact_mut(row.max(1)));
    match axis {
        FlipAxis::Height => dst_rows.zip(src_rows.rev()).for_each(|(d, s)| d.copy_from_slice(s)),
        FlipAxis::Width => {
            for (d, s) in dst_rows.zip(src_rows) {
                d.chunks_exact_mut(channels).zip(s.chunks_exact(channels).rev()).for_each(|(to, from)| to.copy_from_slice(from));
            }
        }
    }
}

/// `_image_flip_*` and `_image_random_flip_*` (each image flipped with probability 1/2).
struct Flip {
    axis: FlipAxis,
    random: bool,
    name: &'static str,
}

impl Operator for Flip {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [image] = exactly(self.name, "input", inputs)?;
        Layout::of(self.name, image)?;
        Ok(vec![image.clone()])
    }
    fn needs_rng(&self) -> bool {
        self.random
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = Layout::of(self.name, args.input_shape(0)?)?;
        let size = l.image_size();
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            for_each_image(args.input::<T>(0)?, args.output::<T>(0)?, size, size, |n, src, dst| {
                if !self.random || random::uniform(ctx.seed, n as u64) < 0.5 {
                    flip_image(src, dst, &l, self.axis);
                } else {
                    dst.copy_from_slice(src);
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        if self.random {
            // As MXNet: the augmentation passes the gradient through.
            return Ok(vec![Some(g)]);
        }
        Ok(vec![Some(d.unary(self.name, &g)?)])
    }
}

// ---------------------------------------------------------------------------------------------
// color augmentations

crate::op_params! {
    pub struct RandomEnhanceParams {
        /// Smallest factor drawn.
        min_factor: f64,
        /// Largest factor drawn.
        max_factor: f64,
    }
}

crate::op_params! {
    pub struct ColorJitterParams {
        /// How much to jitter brightness: its factor is drawn from [1 - b, 1 + b].
        brightness: f64,
        /// How much to jitter contrast: its factor is drawn from [1 - c, 1 + c].
        contrast: f64,
        /// How much to jitter saturation: its factor is drawn from [1 - s, 1 + s].
        saturation: f64,
        /// How much to jitter hue: the hue turns by a fraction drawn from [-h, h] of a full turn.
        hue: f64,
    }
}

crate::op_params! {
    pub struct AdjustLightingParams {
        /// The lighting alphas of the R, G and B principal components.
        alpha: Vec<f64>,
    }
}

crate::op_params! {
    pub struct RandomLightingParams {
        /// Standard deviation of the lighting alphas.
        alpha_std: f64 = 0.05,
    }
}

/// Luma weights of R, G and B (ITU-R BT.601), as MXNet's contrast and saturation use.
const LUMA: [f64; 3] = [0.299, 0.587, 0.114];

/// One colour adjustment of one image, with its factor.
#[derive(Clone, Copy, Debug)]
enum Adjust {
    /// Scale every value.
    Brightness(f64),
    /// Blend with the image's mean gray level.
    Contrast(f64),
    /// Blend every pixel with its own gray level.
    Saturation(f64),
    /// Turn the hue by a fraction of a full turn.
    Hue(f64),
    /// Add the ImageNet PCA lighting noise for the given per-component alphas.
    Lighting([f64; 3]),
}

/// The ImageNet RGB covariance's eigenvectors scaled by their eigenvalues (AlexNet's lighting
/// noise), as MXNet's lighting operators use them.
const EIGEN: [[f64; 3]; 3] = [
    [55.46 * -0.5675, 4.794 * 0.7192, 1.148 * 0.4009],
    [55.46 * -0.5808, 4.794 * -0.0045, 1.148 * -0.8140],
    [55.46 * -0.5836, 4.794 * -0.6948, 1.148 * 0.4203],
];

/// RGB in [0, 255] to (hue in degrees, lightness, saturation) in OpenCV's HLS convention.
fn rgb_to_hls(r: f64, g: f64, b: f64) -> (f64, f64, f64) {
    let (r, g, b) = (r / 255.0, g / 255.0, b / 255.0);
    let vmax = r.max(g).max(b);
    let vmin = r.min(g).min(b);
    let diff = vmax - vmin;
    let l = (vmax + vmin) * 0.5;
    if diff <= f64::from(f32::EPSILON) {
        return (0.0, l, 0.0);
    }
    let s = if l < 0.5 { diff / (vmax + vmin) } else { diff / (2.0 - vmax - vmin) };
    let k = 60.0 / diff;
    let mut h = if vmax == r {
        (g - b) * k
    } else if vmax == g {
        (b - r) * k + 120.0
    } else {
        (r - g) * k + 240.0
    };
    if h < 0.0 {
        h += 360.0;
    }
    (h, l, s)
}

/// The inverse of [`rgb_to_hls`]; any hue angle is accepted.
fn hls_to_rgb(h: f64, l: f64, s: f64) -> (f64, f64, f64) {
    if s == 0.0 {
        return (l * 255.0, l * 255.0, l * 255.0);
    }
    let p2 = if l <= 0.5 { l * (1.0 + s) } else { l + s - l * s };
    let p1 = 2.0 * l - p2;
    let h = (h / 60.0).rem_euclid(6.0);
    let sector = (h as usize).min(5);
    let frac = h - sector as f64;
    let (falling, rising) = (p1 + (p2 - p1) * (1.0 - frac), p1 + (p2 - p1) * frac);
    let (r, g, b) = match sector {
        0 => (p2, rising, p1),
        1 => (falling, p2, p1),
        2 => (p1, p2, rising),
        3 => (p1, falling, p2),
        4 => (rising, p1, p2),
        _ => (p2, p1, falling),
    };
    (r * 255.0, g * 255.0, b * 255.0)
}

/// The gray level of an RGB pixel.
fn luma(&[r, g, b]: &[f64; 3]) -> f64 {
    let [wr, wg, wb] = LUMA;
    r * wr + g * wg + b * wb
}

/// Apply `adjust` to one (H, W, C) image held as f64, C being 1 or 3.
fn adjust_image(values: &mut [f64], channels: usize, adjust: Adjust) {
    let pixels = values.len() / channels.max(1);
    match adjust {
        Adjust::Brightness(alpha) => values.iter_mut().for_each(|v| *v *= alpha),
        Adjust::Contrast(alpha) => {
            let gray_sum: f64 = if channels == 3 { values.as_chunks::<3>().0.iter().map(luma).sum() } else { values.iter().sum() };
            let beta = (1.0 - alpha) * gray_sum / pixels.max(1) as f64;
            values.iter_mut().for_each(|v| *v = *v * alpha + beta);
        }
        Adjust::Saturation(alpha) if channels == 3 => {
            for p in values.as_chunks_mut::<3>().0 {
                let gray = luma(p) * (1.0 - alpha);
                p.iter_mut().for_each(|v| *v = gray + *v * alpha);
            }
        }
        Adjust::Hue(turn) if channels == 3 => {
            for p in values.as_chunks_mut::<3>().0 {
                let [r, g, b] = *p;
                let (h, l, s) = rgb_to_hls(r, g, b);
                let (r, g, b) = hls_to_rgb(h + turn * 360.0, l, s);
                *p = [r, g, b];
            }
        }
        Adjust::Lighting(alpha) if channels == 3 => {
            let shift: Vec<f64> = EIGEN.iter().map(|row| row.iter().zip(&alpha).map(|(e, a)| e * a).sum()).collect();
            for p in values.chunks_mut(3) {
                p.iter_mut().zip(&shift).for_each(|(v, s)| *v += s);
            }
        }
        // Gray images have no saturation, hue or colour lighting to change.
        Adjust::Saturation(_) | Adjust::Hue(_) | Adjust::Lighting(_) => {}
    }
}

/// What a colour operator does to each image.
#[derive(Clone, Debug)]
enum ColorOp {
    RandomBrightness(f64, f64),
    RandomContrast(f64, f64),
    RandomSaturation(f64, f64),
    RandomHue(f64, f64),
    RandomColorJitter { brightness: f64, contrast: f64, saturation: f64, hue: f64 },
    AdjustLighting([f64; 3]),
    RandomLighting(f64),
}

/// Draws per image: 16 uniform variates are enough for every operator.
const DRAWS_PER_IMAGE: u64 = 16;

impl ColorOp {
    /// The adjustments for image `n`, drawn from `seed`.
    fn adjustments(&self, seed: u64, n: usize) -> Vec<Adjust> {
        let base = n as u64 * DRAWS_PER_IMAGE;
        let uniform = |k: u64, lo: f64, hi: f64| lo + (hi - lo) * random::uniform(seed, base + k);
        match *self {
            ColorOp::RandomBrightness(lo, hi) => vec![Adjust::Brightness(uniform(0, lo, hi))],
            ColorOp::RandomContrast(lo, hi) => vec![Adjust::Contrast(uniform(0, lo, hi))],
            ColorOp::RandomSaturation(lo, hi) => vec![Adjust::Saturation(uniform(0, lo, hi))],
            ColorOp::RandomHue(lo, hi) => vec![Adjust::Hue(uniform(0, lo, hi))],
            ColorOp::RandomColorJitter { brightness, contrast, saturation, hue } => {
                // A random order of the four adjustments (Fisher-Yates), each applied when its
                // jitter is positive.
                let mut order = [0usize, 1, 2, 3];
                for i in (1..4).rev() {
                    let j = ((random::uniform(seed, base + 4 + i as u64) * (i + 1) as f64) as usize).min(i);
                    order.swap(i, j);
                }
                order
                    .iter()
                    .filter_map(|&k| match k {
                        0 if brightness > 0.0 => Some(Adjust::Brightness(1.0 + uniform(0, -brightness, brightness))),
                        1 if contrast > 0.0 => Some(Adjust::Contrast(1.0 + uniform(1, -contrast, contrast))),
                        2 if saturation > 0.0 => Some(Adjust::Saturation(1.0 + uniform(2, -saturation, saturation))),
                        3 if hue > 0.0 => Some(Adjust::Hue(uniform(3, -hue, hue))),
                        _ => None,
                    })
                    .collect()
            }
            ColorOp::AdjustLighting(alpha) => vec![Adjust::Lighting(alpha)],
            ColorOp::RandomLighting(std) => {
                let alpha = [0, 1, 2].map(|k| std * random::normal(seed, base + k));
                vec![Adjust::Lighting(alpha)]
            }
        }
    }
}

/// The colour operators: brightness, contrast, saturation, hue, their random combination and
/// PCA lighting noise, on gray or RGB images.
struct Color {
    op: ColorOp,
    name: &'static str,
}

impl Operator for Color {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [image] = exactly(self.name, "input", inputs)?;
        Layout::of_color(self.name, image)?;
        Ok(vec![image.clone()])
    }
    fn needs_rng(&self) -> bool {
        !matches!(self.op, ColorOp::AdjustLighting(_))
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let l = Layout::of_color(self.name, args.input_shape(0)?)?;
        let size = l.image_size();
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            for_each_image(args.input::<T>(0)?, args.output::<T>(0)?, size, size, |n, src, dst| {
                let mut values: Vec<f64> = src.iter().map(|v| v.to_f64()).collect();
                for adjust in self.op.adjustments(ctx.seed, n) {
                    adjust_image(&mut values, l.channels, adjust);
                    // Each step lands in the image's dtype, as it would applied one at a time.
                    values.iter_mut().for_each(|v| *v = store::<T>(*v).to_f64());
                }
                dst.iter_mut().zip(&values).for_each(|(o, &v)| *o = store(v));
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        // As MXNet: the augmentation passes the gradient through.
        Ok(vec![Some(d.out_grad(0))])
    }
}

fn check_factors(op: &str, lo: f64, hi: f64) -> Result<()> {
    if !(lo >= 0.0 && hi >= lo) {
        crate::bail!(Param, "{op}: need 0 <= min_factor <= max_factor, got min_factor={lo}, max_factor={hi}");
    }
    Ok(())
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "_image_to_tensor",
        &[],
        "Converts an image (H, W, C) or batch (N, H, W, C) with values in [0, 255] to a float32 tensor (C, H, W) \
         or (N, C, H, W) with values in [0, 1].",
        |_: NoParams| Ok(ToTensor),
    ));
    add(OpDef::new("_backward_image_to_tensor", &[], "Gradient of _image_to_tensor.", |_: NoParams| Ok(ToTensorBackward)));
    add(OpDef::new(
        "_image_normalize",
        &[],
        "Normalizes a tensor (C, H, W) or batch (N, C, H, W) per channel: (x - mean[c]) / std[c].",
        |params: NormalizeParams| Ok(Normalize { params, name: "_image_normalize" }),
    ));
    add(OpDef::new("_backward_image_normalize", &[], "Gradient of _image_normalize: the output gradient over std.", |params: NormalizeParams| {
        Ok(Normalize { params, name: "_backward_image_normalize" })
    }));
    add(OpDef::new(
        "_image_resize",
        &[],
        "Resizes an image (H, W, C) or batch (N, H, W, C) to size (width, height) with OpenCV's interpolation \
         methods.",
        |params: ResizeParams| {
            let interp = Interp::from_code("_image_resize", params.interp)?;
            Ok(Resize { params, interp })
        },
    ));
    add(OpDef::new(
        "_image_crop",
        &[],
        "Crops the width x height window at (x, y) out of an image (H, W, C) or every image of a batch (N, H, W, C).",
        |params: CropParams| Ok(Crop { params }),
    ));
    add(OpDef::new("_backward_image_crop", &[], "Gradient of _image_crop.", |params: CropParams| Ok(CropBackward { crop: Crop { params } })));
    for (name, axis, random, doc) in [
        ("_image_flip_left_right", FlipAxis::Width, false, "Mirrors an image (H, W, C) or batch left to right."),
        ("_image_flip_top_bottom", FlipAxis::Height, false, "Mirrors an image (H, W, C) or batch top to bottom."),
        ("_image_random_flip_left_right", FlipAxis::Width, true, "Mirrors each image left to right with probability 1/2."),
        ("_image_random_flip_top_bottom", FlipAxis::Height, true, "Mirrors each image top to bottom with probability 1/2."),
    ] {
        add(OpDef::new(name, &[], doc, move |_: NoParams| Ok(Flip { axis, random, name })));
    }
    type MakeEnhance = fn(f64, f64) -> ColorOp;
    let enhancers: [(&'static str, MakeEnhance, &'static str); 4] = [
        ("_image_random_brightness", ColorOp::RandomBrightness, "Scales each image by a factor drawn from [min_factor, max_factor]."),
        (
            "_image_random_contrast",
            ColorOp::RandomContrast,
            "Blends each image with its mean gray level by a factor drawn from [min_factor, max_factor].",
        ),
        (
            "_image_random_saturation",
            ColorOp::RandomSaturation,
            "Blends each pixel with its gray level by a factor drawn from [min_factor, max_factor].",
        ),
        ("_image_random_hue", ColorOp::RandomHue, "Turns each image's hue by a fraction of a turn drawn from [min_factor, max_factor]."),
    ];
    for (name, make, doc) in enhancers {
        add(OpDef::new(name, &[], doc, move |p: RandomEnhanceParams| {
            check_factors(name, p.min_factor, p.max_factor)?;
            Ok(Color { op: make(p.min_factor, p.max_factor), name })
        }));
    }
    add(OpDef::new(
        "_image_random_color_jitter",
        &[],
        "Randomly jitters brightness, contrast, saturation and hue of each image, in a random order.",
        |p: ColorJitterParams| {
            if [p.brightness, p.contrast, p.saturation, p.hue].iter().any(|&v| !(v >= 0.0)) {
                crate::bail!(Param, "_image_random_color_jitter: the jitter amounts must be non-negative, got {p:?}");
            }
            let op = ColorOp::RandomColorJitter { brightness: p.brightness, contrast: p.contrast, saturation: p.saturation, hue: p.hue };
            Ok(Color { op, name: "_image_random_color_jitter" })
        },
    ));
    add(OpDef::new(
        "_image_adjust_lighting",
        &[],
        "Adds AlexNet-style PCA lighting noise with the given alphas to each RGB image.",
        |p: AdjustLightingParams| {
            let alpha: [f64; 3] = p
                .alpha
                .as_slice()
                .try_into()
                .map_err(|_| crate::err!(Param, "_image_adjust_lighting: alpha must hold 3 values (R, G, B), got {:?}", p.alpha))?;
            Ok(Color { op: ColorOp::AdjustLighting(alpha), name: "_image_adjust_lighting" })
        },
    ));
    add(OpDef::new(
        "_image_random_lighting",
        &[],
        "Adds AlexNet-style PCA lighting noise with alphas drawn from N(0, alpha_std) to each RGB image.",
        |p: RandomLightingParams| {
            if !(p.alpha_std >= 0.0) {
                crate::bail!(Param, "_image_random_lighting: alpha_std must be non-negative, got {}", p.alpha_std);
            }
            Ok(Color { op: ColorOp::RandomLighting(p.alpha_std), name: "_image_random_lighting" })
        },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_of_every_method_sum_to_one() {
        for interp in [Interp::Nearest, Interp::Linear, Interp::Area, Interp::Cubic, Interp::Lanczos] {
            for (src, dst) in [(10, 4), (4, 10), (7, 7), (300, 200)] {
                for taps in axis_taps(interp, src, dst, src >= dst) {
                    let total: f64 = taps.iter().map(|t| t.1).sum();
                    assert!((total - 1.0).abs() < 1e-9, "{interp:?} {src}->{dst}: {total}");
                    assert!(taps.iter().all(|t| t.0 < src));
                }
            }
        }
    }

    #[test]
    fn area_shrink_by_two_averages_pairs() {
        let taps = axis_taps(Interp::Area, 4, 2, true);
        assert_eq!(taps, vec![vec![(0, 0.5), (1, 0.5)], vec![(2, 0.5), (3, 0.5)]]);
    }

    #[test]
    fn hls_round_trip_restores_rgb() {
        for rgb in [(255.0, 0.0, 0.0), (12.0, 200.0, 77.0), (128.0, 128.0, 128.0), (3.0, 9.0, 250.0)] {
            let (h, l, s) = rgb_to_hls(rgb.0, rgb.1, rgb.2);
            let back = hls_to_rgb(h, l, s);
            assert!((back.0 - rgb.0).abs() < 1e-6 && (back.1 - rgb.1).abs() < 1e-6 && (back.2 - rgb.2).abs() < 1e-6, "{rgb:?} {back:?}");
        }
    }
}
