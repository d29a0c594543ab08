//! A convolution's epilogue: per-filter work done on its output while it is still in cache, and
//! the operator the inference graph pass makes of Convolution -> BatchNorm -> relu.
//!
//! At inference BatchNorm is `y = x * scale + shift` per channel (scale = gamma / sqrt(var +
//! eps), shift = beta - mean * scale), so after a convolution it and a following relu cost one
//! multiply-add and a select per output element, done chunk by chunk as the convolution writes
//! its output, instead of two more passes over memory (BatchNorm and Activation were 24% of
//! MobileNet's batch-32 inference time). The statistics are read at run time, never baked into
//! the weights: the parameters stay the caller's arrays.

use super::convolution::{convolve, Convolution, ConvolutionParams};
use super::normalization::{BatchNorm, BatchNormParams};
use super::{exactly, parallel_units, Attrs, ExecContext, Operator, Params, Scratch, Tensor};
use crate::backend::cpu::simd;
use crate::base::{normalize_axis, DType, Shape};
use crate::error::Result;
use crate::graph::NodeOp;
use crate::op::KernelArgs;
use std::sync::Arc;

/// What happens to each output plane of a float32 convolution after its products: times a
/// per-filter scale, plus a per-filter shift (the bias, and a folded BatchNorm's shift), then
/// relu (NaN stays NaN, as the relu operator).
#[derive(Default)]
pub(super) struct Epilogue {
    scale: Option<Vec<f32>>,
    shift: Option<Vec<f32>>,
    relu: bool,
}

impl Epilogue {
    /// Adds `bias` (one value per filter), if any.
    pub fn with_bias(bias: Option<&[f32]>) -> Epilogue {
        Epilogue { scale: None, shift: bias.map(<[f32]>::to_vec), relu: false }
    }

    pub fn is_identity(&self) -> bool {
        self.scale.is_none() && self.shift.is_none() && !self.relu
    }

    /// Applies it to `plane`, an output plane of `filter`.
    pub fn apply_plane(&self, filter: usize, plane: &mut [f32]) -> Result<()> {
        if self.is_identity() {
            return Ok(());
        }
        let per_filter = |values: &Option<Vec<f32>>, default: f32| match values {
            None => Ok(default),
            Some(values) => values
                .get(filter)
                .copied()
                .ok_or_else(|| crate::err!(Runtime, "convolution epilogue: no scale or shift for filter {filter} (it has {})", values.len())),
        };
        let (scale, shift) = (per_filter(&self.scale, 1.0)?, per_filter(&self.shift, 0.0)?);
        let relu = self.relu;
        simd::vectorized(
            #[inline(always)]
            || {
                for v in plane.iter_mut() {
                    let y = v.mul_add(scale, shift);
                    *v = if !relu || y > 0.0 || y.is_nan() { y } else { 0.0 };
                }
            },
        );
        Ok(())
    }

    /// Applies it to `images` (images x `filters` x `plane` values), its planes spread over the
    /// thread pool when `threads` > 1 (the images were computed one at a time with every thread
    /// in the products, so nothing else runs beside this).
    pub fn apply_images(&self, images: &mut [f32], filters: usize, plane: usize, threads: usize) -> Result<()> {
        if self.is_identity() || plane == 0 {
            return Ok(());
        }
        if filters == 0 {
            crate::bail!(Runtime, "convolution epilogue: {} values in planes of {plane} for no filters", images.len());
        }
        let apply = |first: usize, piece: &mut [f32]| -> Result<()> {
            for (p, values) in (first..).zip(piece.chunks_exact_mut(plane)) {
                self.apply_plane(p % filters, values)?;
            }
            Ok(())
        };
        if threads <= 1 {
            return apply(0, images);
        }
        parallel_units(images, plane, 1, apply)
    }
}

/// `Convolution` (with or without bias), then optionally `BatchNorm` over its channels, then
/// optionally relu, as one operator: the inference graph pass's rewrite of that chain (see
/// `pass::conv_epilogue`). Inputs: the convolution's (data, weight, bias if any), then the
/// BatchNorm's (gamma, beta, moving_mean, moving_var) if folded. float32 only.
struct ConvolutionWithEpilogue {
    /// The convolution, whose kernel the training path delegates to.
    convolution: Convolution,
    batch_norm: Option<BatchNormParams>,
    relu: bool,
}

impl ConvolutionWithEpilogue {
    fn conv_inputs(&self) -> usize {
        if self.convolution.p.no_bias {
            2
        } else {
            3
        }
    }

    /// The epilogue at inference: the bias, the BatchNorm's moving statistics folded into a
    /// scale and shift (in float64, as BatchNorm computes them), the relu.
    fn inference_epilogue(&self, args: &KernelArgs) -> Result<Epilogue> {
        let bias = (!self.convolution.p.no_bias).then(|| args.input::<f32>(2)).transpose()?;
        let mut epilogue = Epilogue::with_bias(bias);
        if let Some(bn) = &self.batch_norm {
            let n = self.conv_inputs();
            let read = |i: usize| args.input_f64(n + i);
            let (beta, mean, var) = (read(1)?, read(2)?, read(3)?);
            let gamma = if bn.fix_gamma { vec![1.0; beta.len()] } else { read(0)? };
            if [gamma.len(), mean.len(), var.len()].iter().any(|&len| len != beta.len()) {
                crate::bail!(
                    Shape,
                    "Convolution + BatchNorm: gamma, beta, moving_mean and moving_var hold {}, {}, {} and {} values, expected one per filter",
                    gamma.len(),
                    beta.len(),
                    mean.len(),
                    var.len()
                );
            }
            let bias: Vec<f64> = epilogue.shift.take().map_or_else(|| vec![0.0; beta.len()], |b| b.iter().map(|&v| v as f64).collect());
            let scale: Vec<f64> = gamma.iter().zip(&var).map(|(g, v)| g / (v + bn.eps).sqrt()).collect();
            let shift = bias.iter().zip(&mean).zip(&scale).zip(&beta).map(|(((b, m), s), beta)| ((b - m) * s + beta) as f32);
            epilogue.shift = Some(shift.collect());
            epilogue.scale = Some(scale.iter().map(|&s| s as f32).collect());
        }
        epilogue.relu = self.relu;
        Ok(epilogue)
    }

    /// Training with batch statistics: the convolution into a scratch array, then BatchNorm's
    /// own kernel (which updates the moving statistics) into the output, then relu.
    fn forward_training(&self, bn: &BatchNormParams, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [out] = exactly(OP, "output", args.outputs())?;
        let (conv_inputs, norm_params) = self.split_inputs(args.inputs())?;
        let [gamma, beta, moving_mean, moving_var] = exactly(OP, "BatchNorm input", norm_params)?;
        let [x, _, ..] = conv_inputs else {
            crate::bail!(Value, "{OP}: data and weight expected, got {} convolution inputs", conv_inputs.len());
        };
        let g = self.convolution.p.geometry("Convolution", &x.shape)?;
        let channels = Shape::new(vec![g.filters]);
        let (mut conv_out, mut mean, mut var) =
            (Scratch::<f32>::zeroed(out.size())?, Scratch::<f32>::zeroed(g.filters)?, Scratch::<f32>::zeroed(g.filters)?);
        // SAFETY: each tensor views a scratch buffer of its shape's size that lives until the
        // end of this function and is used by nothing else.
        let (conv_out, mean, var) = unsafe {
            (
                Tensor::new(conv_out.as_mut_slice().as_mut_ptr() as *mut u8, out.shape.clone(), DType::F32),
                Tensor::new(mean.as_mut_slice().as_mut_ptr() as *mut u8, channels.clone(), DType::F32),
                Tensor::new(var.as_mut_slice().as_mut_ptr() as *mut u8, channels, DType::F32),
            )
        };
        let convolution = &self.convolution;
        args.delegate(convolution, conv_inputs, std::slice::from_ref(&conv_out), |conv| convolution.forward(ctx, conv))?;
        let norm_inputs = [conv_out, gamma.clone(), beta.clone(), moving_mean.clone(), moving_var.clone()];
        let batch_norm = BatchNorm::new(bn.clone());
        args.delegate(&batch_norm, &norm_inputs, &[out.clone(), mean, var], |normalize| batch_norm.forward(ctx, normalize))?;
        let relu = Epilogue { relu: self.relu, ..Epilogue::default() };
        relu.apply_images(args.output::<f32>(0)?, g.filters, g.output_size(), crate::engine::parallel::threads())
    }

    /// The convolution's inputs (data, weight, bias if any), then the BatchNorm's.
    fn split_inputs<'a, T>(&self, inputs: &'a [T]) -> Result<(&'a [T], &'a [T])> {
        let n = self.conv_inputs();
        inputs.split_at_checked(n).ok_or_else(|| crate::err!(Value, "{OP}: at least {n} inputs expected, got {}", inputs.len()))
    }
}

const OP: &str = "_ConvolutionWithEpilogue";

impl Operator for ConvolutionWithEpilogue {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data", "weight"];
        if !self.convolution.p.no_bias {
            names.push("bias");
        }
        if self.batch_norm.is_some() {
            names.extend(["gamma", "beta", "moving_mean", "moving_var"]);
        }
        names.into_iter().map(String::from).collect()
    }
    fn mutated_inputs(&self) -> &[usize] {
        match (&self.batch_norm, self.convolution.p.no_bias) {
            (None, _) => &[],
            (Some(_), true) => &[4, 5],
            (Some(_), false) => &[5, 6],
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (conv_inputs, norm_params) = self.split_inputs(inputs)?;
        let [data, _weight, ..] = conv_inputs else {
            crate::bail!(Value, "{OP}: data and weight expected, got {} convolution inputs", conv_inputs.len());
        };
        let g = self.convolution.p.geometry("Convolution", data)?;
        super::convolution::check_parameter_shapes(&g, conv_inputs)?;
        for (name, s) in ["gamma", "beta", "moving_mean", "moving_var"].iter().zip(norm_params) {
            if s.dims() != [g.filters] {
                crate::bail!(Shape, "Convolution + BatchNorm: {name} has shape {s}, expected ({},)", g.filters);
            }
        }
        Ok(vec![g.output_shape()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        match inputs.iter().find(|&&d| d != DType::F32) {
            Some(other) => crate::bail!(Type, "Convolution + BatchNorm + relu runs float32 only, got {other:?}"),
            None => Ok(vec![DType::F32]),
        }
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        match &self.batch_norm {
            Some(bn) if ctx.is_train && !bn.use_global_stats => self.forward_training(bn, ctx, args),
            _ => {
                let g = self.convolution.p.geometry("Convolution", args.input_shape(0)?)?;
                convolve(&g, args.input::<f32>(0)?, args.input::<f32>(1)?, args.output::<f32>(0)?, &self.inference_epilogue(args)?)
            }
        }
    }
}

/// The node operator computing `Convolution(conv)` followed by `BatchNorm(batch_norm)` (if
/// any) and relu (if `relu`), or `None` when the BatchNorm does not normalize the convolution's
/// channel axis.
pub(crate) fn convolution_with_epilogue(conv: &Attrs, batch_norm: Option<&Attrs>, relu: bool) -> Result<Option<NodeOp>> {
    let conv_params = ConvolutionParams::parse("Convolution", conv)?;
    let batch_norm = match batch_norm {
        Some(attrs) => {
            let p = BatchNormParams::parse("BatchNorm", attrs)?;
            let rank = conv_params.kernel.len() + 2;
            if normalize_axis(p.axis, rank).ok() != Some(1) {
                return Ok(None);
            }
            Some(p)
        }
        None => None,
    };
    let mut attrs = conv.clone();
    attrs.insert("with_batch_norm".into(), batch_norm.is_some().to_string());
    attrs.insert("with_relu".into(), relu.to_string());
    let operator = Arc::new(ConvolutionWithEpilogue { convolution: Convolution { p: conv_params }, batch_norm, relu });
    Ok(Some(NodeOp { name: "_ConvolutionWithEpilogue".into(), attrs, operator }))
}
