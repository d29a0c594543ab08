//! UpSampling of channels-first images: nearest neighbour, or bilinear as a depthwise
//! deconvolution.

use super::deconvolution::Deconvolution;
use super::grad::{Grad, InputGrads};
use super::{exactly, ExecContext, OpDef, Operator};
use crate::base::Shape;
use crate::error::Result;
use crate::op::KernelArgs;

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
