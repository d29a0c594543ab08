//! Local operators on channels-first images: LRN (local response normalization across nearby
//! channels) and nearest-neighbour UpSampling.

use super::deconvolution::Deconvolution;
use super::grad::{Grad, InputGrads};
use super::normalization::{to_f64, write_f64};
use super::{ExecContext, OpDef, Operator};
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
        let d = data.dims();
        if d.len() < 3 {
            crate::bail!(Shape, "LRN: data must be at least 3-D (batch, channels, ...), got {data}");
        }
        Ok((d[0], d[1], d[2..].iter().product()))
    }

    /// The normalizer of every element.
    fn normalizers(&self, x: &[f64], (outer, c, inner): (usize, usize, usize)) -> Vec<f64> {
        let half = self.nsize / 2;
        let mut norm = vec![0.0; x.len()];
        for o in 0..outer {
            for ch in 0..c {
                for i in 0..inner {
                    let window = ch.saturating_sub(half)..(ch + half + 1).min(c);
                    let squares: f64 = window.map(|j| x[(o * c + j) * inner + i].powi(2)).sum();
                    norm[(o * c + ch) * inner + i] = self.knorm + self.alpha / self.nsize as f64 * squares;
                }
            }
        }
        norm
    }
}

impl Operator for Lrn {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Lrn::layout(&inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let layout = Lrn::layout(&inputs[0].shape)?;
        let x = to_f64(&inputs[0]);
        let norm = self.normalizers(&x, layout);
        let y: Vec<f64> = x.iter().zip(&norm).map(|(v, n)| v * n.powf(-self.beta)).collect();
        write_f64(&outputs[0], &y);
        Ok(())
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
        Ok(vec![inputs[1].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let lrn = self.0;
        let (outer, c, inner) = Lrn::layout(&inputs[1].shape)?;
        let (gy, x) = (to_f64(&inputs[0]), to_f64(&inputs[1]));
        let norm = lrn.normalizers(&x, (outer, c, inner));
        // d out_j / d x_c = [j == c] n_j^-beta - 2 alpha beta / nsize x_j x_c n_j^(-beta-1) for c in
        // the window of j, so each x_c gathers from the channels whose windows contain it.
        let coupling: Vec<f64> = gy.iter().zip(&x).zip(&norm).map(|((g, v), n)| g * v * n.powf(-lrn.beta - 1.0)).collect();
        let half = lrn.nsize / 2;
        let scale = 2.0 * lrn.alpha * lrn.beta / lrn.nsize as f64;
        let mut dx = vec![0.0; x.len()];
        for o in 0..outer {
            for ch in 0..c {
                for i in 0..inner {
                    let at = |j: usize| (o * c + j) * inner + i;
                    let window = ch.saturating_sub(half)..(ch + half + 1).min(c);
                    let gathered: f64 = window.map(|j| coupling[at(j)]).sum();
                    dx[at(ch)] = gy[at(ch)] * norm[at(ch)].powf(-lrn.beta) - scale * x[at(ch)] * gathered;
                }
            }
        }
        write_f64(&outputs[0], &dx);
        Ok(())
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
    let d = s.dims();
    if d.len() != 4 {
        crate::bail!(Shape, "{op}: data must be 4-D (batch, channels, height, width), got {s}");
    }
    Ok((d[0] * d[1], d[2], d[3]))
}

impl Operator for NearestUpSampling {
    fn input_names(&self) -> Vec<String> {
        vec!["arg0".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        image_dims("UpSampling", &inputs[0])?;
        let d = inputs[0].dims();
        Ok(vec![Shape::new(vec![d[0], d[1], d[2] * self.scale, d[3] * self.scale])])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let (_, h, w) = image_dims("UpSampling", &inputs[0].shape)?;
        let s = self.scale;
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (x, y) = (args.input::<T>(0)?, args.output::<T>(0)?);
            for (src, dst) in x.chunks_exact(h * w).zip(y.chunks_exact_mut(h * w * s * s)) {
                for (r, row) in dst.chunks_exact_mut(w * s).enumerate() {
                    let from = &src[(r / s) * w..(r / s + 1) * w];
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = from[c / s];
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
