//! A convolution's epilogue: per-filter work done on its output while it is still in cache, and
//! the operator the inference graph pass makes of Convolution -> BatchNorm -> relu.
//!
//! At inference BatchNorm is `y = x * scale + shift` per channel (scale = gamma / sqrt(var +
//! eps), shift = beta - mean * scale), so after a convolution it and a following relu cost one
//! multiply-add and a select per output element, done chunk by chunk as the convolution writes
//! its output, instead of two more passes over memory (BatchNorm and Activation were 24% of
//! MobileNet's batch-32 inference time). The statistics are read at run time, never baked into
//! the weights: the parameters stay the caller's arrays.

use super::convolution::{convolve, ConvolutionParams};
use super::normalization::{BatchNorm, BatchNormParams};
use super::{parallel_chunks, simd, Attrs, ExecContext, Operator, Params, Scratch, SendPtr, Tensor};
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
    pub fn with_bias(bias: Option<&Tensor>) -> Epilogue {
        let shift = bias.map(|b| super::normalization::to_f64(b).into_iter().map(|v| v as f32).collect());
        Epilogue { scale: None, shift, relu: false }
    }

    pub fn is_identity(&self) -> bool {
        self.scale.is_none() && self.shift.is_none() && !self.relu
    }

    /// Applies it to `plane`, an output plane of `filter`.
    pub fn apply_plane(&self, filter: usize, plane: &mut [f32]) {
        if self.is_identity() {
            return;
        }
        let scale = self.scale.as_ref().map_or(1.0, |s| s[filter]);
        let shift = self.shift.as_ref().map_or(0.0, |t| t[filter]);
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
    }

    /// Applies it to `images` (images x `filters` x `plane` values), its planes spread over the
    /// thread pool when `threads` > 1 (the images were computed one at a time with every thread
    /// in the products, so nothing else runs beside this).
    pub fn apply_images(&self, images: &mut [f32], filters: usize, plane: usize, threads: usize) {
        if self.is_identity() || plane == 0 {
            return;
        }
        let planes = images.len() / plane;
        if threads <= 1 {
            for (p, values) in images.chunks_exact_mut(plane).enumerate() {
                self.apply_plane(p % filters, values);
            }
            return;
        }
        let base = SendPtr(images.as_mut_ptr());
        parallel_chunks(planes, 1, |range| {
            for p in range {
                // SAFETY: plane p lies inside `images` (p < planes) and belongs to this task
                // alone; `images` is borrowed mutably for the whole call.
                let values = unsafe { std::slice::from_raw_parts_mut(base.get().add(p * plane), plane) };
                self.apply_plane(p % filters, values);
            }
        });
    }
}

/// `Convolution` (with or without bias), then optionally `BatchNorm` over its channels, then
/// optionally relu, as one operator: the inference graph pass's rewrite of that chain (see
/// `pass::conv_epilogue`). Inputs: the convolution's (data, weight, bias if any), then the
/// BatchNorm's (gamma, beta, moving_mean, moving_var) if folded. float32 only.
struct ConvolutionWithEpilogue {
    conv: ConvolutionParams,
    batch_norm: Option<BatchNormParams>,
    relu: bool,
}

impl ConvolutionWithEpilogue {
    fn conv_inputs(&self) -> usize {
        if self.conv.no_bias {
            2
        } else {
            3
        }
    }

    /// The epilogue at inference: the bias, the BatchNorm's moving statistics folded into a
    /// scale and shift (in float64, as BatchNorm computes them), the relu.
    fn inference_epilogue(&self, inputs: &[Tensor]) -> Epilogue {
        let mut epilogue = Epilogue::with_bias(inputs.get(2).filter(|_| !self.conv.no_bias));
        if let Some(bn) = &self.batch_norm {
            let n = self.conv_inputs();
            let read = |i: usize| super::normalization::to_f64(&inputs[n + i]);
            let (beta, mean, var) = (read(1), read(2), read(3));
            let gamma = if bn.fix_gamma { vec![1.0; beta.len()] } else { read(0) };
            let bias: Vec<f64> = epilogue.shift.take().map_or_else(|| vec![0.0; beta.len()], |b| b.iter().map(|&v| v as f64).collect());
            let scale: Vec<f64> = gamma.iter().zip(&var).map(|(g, v)| g / (v + bn.eps).sqrt()).collect();
            epilogue.shift = Some((0..scale.len()).map(|c| ((bias[c] - mean[c]) * scale[c] + beta[c]) as f32).collect());
            epilogue.scale = Some(scale.iter().map(|&s| s as f32).collect());
        }
        epilogue.relu = self.relu;
        epilogue
    }

    /// Training with batch statistics: the convolution into a scratch array, then BatchNorm's
    /// own kernel (which updates the moving statistics) into the output, then relu.
    fn forward_training(&self, bn: &BatchNormParams, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, out) = (args.inputs(), &args.outputs()[0]);
        let n = self.conv_inputs();
        let g = self.conv.geometry("Convolution", &inputs[0].shape)?;
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
        convolve(&g, &inputs[0], &inputs[1], &conv_out, &Epilogue::with_bias(inputs.get(2).filter(|_| !self.conv.no_bias)))?;
        let norm_inputs = [conv_out, inputs[n].clone(), inputs[n + 1].clone(), inputs[n + 2].clone(), inputs[n + 3].clone()];
        let batch_norm = BatchNorm::new(bn.clone());
        args.delegate(&batch_norm, &norm_inputs, &[out.clone(), mean, var], |normalize| batch_norm.forward(ctx, normalize))?;
        let relu = Epilogue { relu: self.relu, ..Epilogue::default() };
        // SAFETY: the output is this operator's alone while it runs.
        relu.apply_images(unsafe { out.slice_mut::<f32>() }, g.filters, g.output_size(), crate::engine::parallel::threads());
        Ok(())
    }
}

impl Operator for ConvolutionWithEpilogue {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data", "weight"];
        if !self.conv.no_bias {
            names.push("bias");
        }
        if self.batch_norm.is_some() {
            names.extend(["gamma", "beta", "moving_mean", "moving_var"]);
        }
        names.into_iter().map(String::from).collect()
    }
    fn mutated_inputs(&self) -> &[usize] {
        match (&self.batch_norm, self.conv.no_bias) {
            (None, _) => &[],
            (Some(_), true) => &[4, 5],
            (Some(_), false) => &[5, 6],
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let n = self.conv_inputs();
        let g = self.conv.geometry("Convolution", &inputs[0])?;
        super::convolution::check_parameter_shapes(&g, &inputs[..n])?;
        for (name, s) in ["gamma", "beta", "moving_mean", "moving_var"].iter().zip(&inputs[n..]) {
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
        let (inputs, outputs) = (args.inputs(), args.outputs());
        match &self.batch_norm {
            Some(bn) if ctx.is_train && !bn.use_global_stats => self.forward_training(bn, ctx, args),
            _ => {
                let g = self.conv.geometry("Convolution", &inputs[0].shape)?;
                convolve(&g, &inputs[0], &inputs[1], &outputs[0], &self.inference_epilogue(inputs))
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
    let operator = Arc::new(ConvolutionWithEpilogue { conv: conv_params, batch_norm, relu });
    Ok(Some(NodeOp { name: "_ConvolutionWithEpilogue".into(), attrs, operator }))
}
