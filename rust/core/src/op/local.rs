//! Local operators on channels-first images: LRN (local response normalization across nearby
//! channels) and nearest-neighbour UpSampling.

use super::deconvolution::Deconvolution;
use super::grad::{Grad, InputGrads};
use super::{exactly, ExecContext, OpDef, Operator};
use crate::base::Shape;
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct LRNParams {
        /// Scale of the sum of squares.
        alpha: f64 = 1e-4,
        /// Exponent of the normalizer.
        beta: f64 = 0.75,
        /// Offset of the normalizer.
        knorm: f64 = 2.0,
        /// Number of channels summed over (odd).
        nsize: usize,
    }
}

/// out_c = x_c * (knorm + alpha / nsize * sum of x_j^2 over the nsize channels around c)^-beta.
#[derive(Clone, Copy)]
struct Lrn {
    alpha: f64,
    beta: f64,
    knorm: f64,
    nsize: usize,
}

impl Lrn {
    /// (outer, channels, inner) of data (N, C, ...).
    fn layout(data: &Shape) -> Result<(usize, usize, usize)> {
        let &[outer, channels, ref rest @ ..] = data.dims() else {
            crate::bail!(Shape, "LRN: data must be at least 3-D (batch, channels, ...), got {data}");
        };
        if rest.is_empty() {
            crate::bail!(Shape, "LRN: data must be at least 3-D (batch, channels, ...), got {data}");
        }
        Ok((outer, channels, rest.iter().product()))
    }

    /// The channels around `ch` (of `c`) whose squares make its normalizer.
    fn window(&self, ch: usize, c: usize) -> std::ops::Range<usize> {
        let half = self.nsize / 2;
        ch.saturating_sub(half)..(ch + half + 1).min(c)
    }

    /// The normalizer of every element.
    fn normalizers(&self, x: &[f64], (_, c, inner): (usize, usize, usize)) -> Vec<f64> {
        let mut norm = vec![0.0; x.len()];
        let block = (c * inner).max(1);
        for (xs, ns) in x.chunks(block).zip(norm.chunks_mut(block)) {
            for (k, n) in ns.iter_mut().enumerate() {
                let (ch, i) = (k / inner, k % inner);
                let squares: f64 = self.window(ch, c).filter_map(|j| xs.get(j * inner + i)).map(|v| v.powi(2)).sum();
                *n = self.knorm + self.alpha / self.nsize as f64 * squares;
            }
        }
        norm
    }
}

impl Operator for Lrn {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("LRN", "input", inputs)?;
        Lrn::layout(x)?;
        Ok(vec![x.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let layout = Lrn::layout(args.input_shape(0)?)?;
        let x = args.input_f64(0)?;
        let norm = self.normalizers(&x, layout);
        let y: Vec<f64> = x.iter().zip(&norm).map(|(v, n)| v * n.powf(-self.beta)).collect();
        args.output_from_f64(0, &y)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x) = (d.out_grad(0), d.input(0));
        let attrs = [
            ("alpha", format!("{:?}", self.alpha)),
            ("beta", format!("{:?}", self.beta)),
            ("knorm", format!("{:?}", self.knorm)),
            ("nsize", self.nsize.to_string()),
        ];
        Ok(vec![Some(d.op("_backward_LRN", &attrs, &[&g, &x])?)])
    }
}

/// `_backward_LRN(out_grad, data)`.
struct LrnBackward(Lrn);

impl Operator for LrnBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [out_grad, data] = exactly("_backward_LRN", "input", inputs)?;
        super::check_out_grad("_backward_LRN", out_grad, data)?;
        Ok(vec![data.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let lrn = self.0;
        let (outer, c, inner) = Lrn::layout(args.input_shape(1)?)?;
        let (gy, x) = (args.input_f64(0)?, args.input_f64(1)?);
        let norm = lrn.normalizers(&x, (outer, c, inner));
        // d out_j / d x_c = [j == c] n_j^-beta - 2 alpha beta / nsize x_j x_c n_j^(-beta-1) for c in
        // the window of j, so each x_c gathers from the channels whose windows contain it.
        let coupling: Vec<f64> = gy.iter().zip(&x).zip(&norm).map(|((g, v), n)| g * v * n.powf(-lrn.beta - 1.0)).collect();
        let scale = 2.0 * lrn.alpha * lrn.beta / lrn.nsize as f64;
        let block = (c * inner).max(1);
        let mut dx: Vec<f64> = gy.iter().zip(&norm).map(|(g, n)| g * n.powf(-lrn.beta)).collect();
        for ((dxs, couplings), xs) in dx.chunks_mut(block).zip(coupling.chunks(block)).zip(x.chunks(block)) {
            for (k, (d, v)) in dxs.iter_mut().zip(xs).enumerate() {
                let (ch, i) = (k / inner, k % inner);
                let gathered: f64 = lrn.window(ch, c).filter_map(|j| couplings.get(j * inner + i)).sum();
                *d -= scale * v * gathered;
            }
        }
        args.output_from_f64(0, &dx)
    }
}

crate::param_choice! {
    /// How UpSampling makes new pixels.
    pub enum SampleType {
        /// Each pixel repeated scale x scale times.
        Nearest = "nearest",
        /// A depthwise deconvolution with a bilinear-interpolation weight input.
        Bilinear = "bilinear",
    }
}

crate::param_choice! {
    /// How UpSampling combines several inputs.
    pub enum MultiInputMode { Concat = "concat", Sum = "sum" }
}

crate::op_params! {
    /// Parameters of several inputs are accepted so that MXNet graphs parse; nearest mode with
    /// several inputs is rejected at creation.
    #[allow(dead_code)]
    pub struct UpSamplingParams {
        /// Integer factor by which height and width grow.
        scale: usize,
        /// Filters of the bilinear mode's deconvolution.
        num_filter: usize = 0,
        /// How new pixels are made.
        sample_type: SampleType,
        /// How several inputs combine.
        multi_input_mode: MultiInputMode = MultiInputMode::Concat,
        /// Number of inputs.
        num_args: usize = 1,
        /// Accepted for compatibility.
        workspace: usize = 512,
    }
}

/// Nearest-neighbour upsampling of (N, C, H, W) by an integer factor.
struct NearestUpSampling {
    scale: usize,
}

fn image_dims(op: &str, s: &Shape) -> Result<(usize, usize, usize)> {
    let &[batch, channels, height, width] = s.dims() else {
        crate::bail!(Shape, "{op}: data must be 4-D (batch, channels, height, width), got {s}");
    };
    Ok((batch * channels, height, width))
}

impl Operator for NearestUpSampling {
    fn input_names(&self) -> Vec<String> {
        vec!["arg0".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("UpSampling", "input", inputs)?;
        let &[batch, channels, height, width] = x.dims() else {
            crate::bail!(Shape, "UpSampling: data must be 4-D (batch, channels, height, width), got {x}");
        };
        Ok(vec![Shape::new(vec![batch, channels, height * self.scale, width * self.scale])])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (_, h, w) = image_dims("UpSampling", args.input_shape(0)?)?;
        let s = self.scale;
        if h * w * s == 0 {
            return Ok(()); // an empty image, or scale 0 (refused when the operator is made)
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            for (src, dst) in x.chunks_exact(h * w).zip(y.chunks_exact_mut(h * w * s * s)) {
                // Output row r repeats input row r / s, each value s times.
                for (row, from) in dst.chunks_exact_mut(w * s).zip(src.chunks_exact(w).flat_map(|line| std::iter::repeat_n(line, s))) {
                    for (out, &v) in row.chunks_exact_mut(s).zip(from) {
                        out.fill(v);
                    }
                }
            }
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let s = self.scale.to_string();
        let attrs = [("kernel", format!("({s}, {s})")), ("stride", format!("({s}, {s})")), ("pool_type", "sum".to_string())];
        Ok(vec![Some(d.op("Pooling", &attrs, &[&g])?)])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("LRN", &[], "Local response normalization across nearby channels.", |p: LRNParams| {
        if p.nsize == 0 || p.nsize.is_multiple_of(2) {
            crate::bail!(Param, "LRN: nsize must be a positive odd number, got {}", p.nsize);
        }
        Ok(Lrn { alpha: p.alpha, beta: p.beta, knorm: p.knorm, nsize: p.nsize })
    }));
    add(OpDef::new("_backward_LRN", &[], "Gradient of LRN.", |p: LRNParams| {
        Ok(LrnBackward(Lrn { alpha: p.alpha, beta: p.beta, knorm: p.knorm, nsize: p.nsize }))
    }));
    add(OpDef::new(
        "UpSampling",
        &[],
        "Upsamples (N, C, H, W) images by an integer scale: nearest neighbour, or bilinear as a depthwise deconvolution with a weight input.",
        |p: UpSamplingParams| {
            if p.scale == 0 {
                crate::bail!(Param, "UpSampling: scale must be positive");
            }
            match p.sample_type {
                SampleType::Nearest if p.num_args == 1 => Ok(UpSampling::Nearest(NearestUpSampling { scale: p.scale })),
                SampleType::Nearest => {
                    crate::bail!(Param, "UpSampling: {} inputs given; nearest mode with several inputs is not implemented", p.num_args)
                }
                SampleType::Bilinear if p.num_filter == 0 => {
                    crate::bail!(Param, "UpSampling: bilinear mode needs num_filter (the number of channels)")
                }
                SampleType::Bilinear => Ok(UpSampling::Bilinear(Deconvolution::bilinear_upsampling(p.scale, p.num_filter))),
            }
        },
    )
    .variadic());
}

/// The two sampling modes behind one registered name.
// One value per operator instance: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum UpSampling {
    Nearest(NearestUpSampling),
    Bilinear(Deconvolution),
}

impl UpSampling {
    fn mode(&self) -> &dyn Operator {
        match self {
            UpSampling::Nearest(op) => op,
            UpSampling::Bilinear(op) => op,
        }
    }
}

impl Operator for UpSampling {
    fn input_names(&self) -> Vec<String> {
        self.mode().input_names()
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        self.mode().complete_input_shapes(inputs)
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.mode().infer_shape(inputs)
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        self.mode().forward(ctx, args)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        self.mode().gradient(d)
    }
}
