//! Deconvolution (transposed convolution, 1-D/2-D/3-D, channels first): the data gradient of the
//! convolution that maps its output back to its input. Forward scatters (W^T x, col2im); the
//! data gradient correlates (im2col, W g); the weight gradient is the convolution's own formula
//! with the roles of image and response swapped.

use super::conv_shifted::Uses;
use super::convolution::{add_channel_bias, channel_sums, spatial, weight_grad_over_chunks, Geometry, ImageProducts};
use super::grad::{tuple_attr, Grad, InputGrads};
use super::{exactly, ExecContext, OpDef, Operator, SendPtr};
use crate::base::{DType, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    /// workspace, cudnn_tune and cudnn_off only steer MXNet's GPU algorithms: accepted, unused.
    #[allow(dead_code)]
    pub struct DeconvolutionParams {
        /// Kernel size: (w,), (h, w) or (d, h, w).
        kernel: Vec<i64>,
        /// Stride per spatial axis (default 1).
        stride: Vec<i64> = Vec::new(),
        /// Dilation per spatial axis (default 1).
        dilate: Vec<i64> = Vec::new(),
        /// Padding removed from each side of the output per spatial axis (default 0).
        pad: Vec<i64> = Vec::new(),
        /// Extra output positions at the end of each spatial axis (default 0; below the stride).
        adj: Vec<i64> = Vec::new(),
        /// Output spatial shape; when given (any non-zero value), pad and adj are derived from it.
        target_shape: Vec<i64> = Vec::new(),
        /// Number of output channels.
        num_filter: usize,
        /// Number of groups the channels are split into.
        num_group: usize = 1,
        /// Maximum temporary workspace in MB (accepted for compatibility).
        workspace: i64 = 512,
        /// Whether to disable the bias (MXNet's default: no bias).
        no_bias: bool = true,
        /// cuDNN algorithm selection (accepted for compatibility).
        cudnn_tune: Option<String> = None,
        /// Disable cuDNN (accepted for compatibility).
        cudnn_off: bool = false,
        /// Data layout: None, 'NCW', 'NCHW' or 'NCDHW' (channels first).
        layout: Option<String> = None,
    }
}

impl DeconvolutionParams {
    /// The geometry of the convolution this deconvolution transposes: its input is the
    /// deconvolution's output and its output the deconvolution's data.
    fn geometry(&self, data: &Shape) -> Result<Geometry> {
        const OP: &str = "Deconvolution";
        let rank = self.kernel.len();
        if !(1..=3).contains(&rank) {
            crate::bail!(Param, "{OP}: kernel must have 1, 2 or 3 values, got {:?}", self.kernel);
        }
        if let Some(layout) = &self.layout {
            let expected = match rank {
                1 => "NCW",
                2 => "NCHW",
                _ => "NCDHW",
            };
            if layout != expected {
                crate::bail!(Param, "{OP}: layout {layout} is not supported; use {expected} (channels first)");
            }
        }
        let &[batch, channels, ref spatial_dims @ ..] = data.dims() else {
            crate::bail!(Shape, "{OP}: a {rank}-D kernel needs {}-D data (batch, channel, spatial...), got {data}", rank + 2);
        };
        if spatial_dims.len() != rank {
            crate::bail!(Shape, "{OP}: a {rank}-D kernel needs {}-D data (batch, channel, spatial...), got {data}", rank + 2);
        }
        let kernel = spatial(OP, "kernel", &self.kernel, rank, 1, 1)?;
        let stride = spatial(OP, "stride", &self.stride, rank, 1, 1)?;
        let dilate = spatial(OP, "dilate", &self.dilate, rank, 1, 1)?;
        let mut pad = spatial(OP, "pad", &self.pad, rank, 0, 0)?;
        let mut adj = spatial(OP, "adj", &self.adj, rank, 0, 0)?;
        let target = spatial(OP, "target_shape", &self.target_shape, rank, 0, 0)?;
        if kernel.contains(&0) || stride.contains(&0) || dilate.contains(&0) {
            crate::bail!(Param, "{OP}: kernel, stride and dilate must be positive");
        }
        let use_target = target.iter().any(|&t| t != 0);
        // Spatial axes are right-aligned in the three slots, unused leading ones 1.
        let mut input = [1; 3];
        for (slot, &d) in input.iter_mut().rev().zip(spatial_dims.iter().rev()) {
            *slot = d;
        }
        let mut output = [1; 3];
        let sizes = input.into_iter().zip(kernel).zip(stride.into_iter().zip(dilate)).zip(target);
        let derived = pad.iter_mut().zip(adj.iter_mut()).zip(output.iter_mut());
        for ((((input, kernel), (stride, dilate)), target), ((pad, adj), output)) in sizes.zip(derived).skip(3 - rank) {
            if input == 0 {
                crate::bail!(Shape, "{OP}: data {data} has an empty spatial axis");
            }
            let full = stride * (input - 1) + dilate * (kernel - 1) + 1;
            if use_target {
                if full < target {
                    crate::bail!(Shape, "{OP}: target_shape {:?} is larger than the {full} positions data {data} can reach", self.target_shape);
                }
                let excess = full - target;
                *adj = excess % 2;
                *pad = excess.div_ceil(2);
            } else if *adj >= stride {
                crate::bail!(Param, "{OP}: adj {:?} must be smaller than stride {:?}", self.adj, self.stride);
            }
            if full + *adj <= 2 * *pad {
                crate::bail!(Shape, "{OP}: pad {:?} leaves no output for data {data}", self.pad);
            }
            *output = full + *adj - 2 * *pad;
        }
        let groups = self.num_group;
        if groups == 0 || channels % groups != 0 || !self.num_filter.is_multiple_of(groups) {
            crate::bail!(Param, "{OP}: channels ({channels}) and num_filter ({}) must divide by num_group ({groups})", self.num_filter);
        }
        Ok(Geometry { batch, channels: self.num_filter, filters: channels, groups, input: output, kernel, stride, dilate, pad, output: input, rank })
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let mut attrs = vec![
            ("kernel", tuple_attr(&self.kernel)),
            ("num_filter", self.num_filter.to_string()),
            ("num_group", self.num_group.to_string()),
            ("no_bias", flag(self.no_bias)),
        ];
        for (name, v) in
            [("stride", &self.stride), ("dilate", &self.dilate), ("pad", &self.pad), ("adj", &self.adj), ("target_shape", &self.target_shape)]
        {
            if !v.is_empty() {
                attrs.push((name, tuple_attr(v)));
            }
        }
        attrs
    }
}

/// The deconvolution's output shape and (data channels, num_filter/groups, k...) weight shape.
fn shapes(g: &Geometry) -> (Shape, Shape) {
    let mut out = vec![g.batch, g.channels];
    out.extend(g.input.iter().skip(3 - g.rank));
    (Shape::new(out), g.weight_shape())
}

/// Checks that an array the products reach through a pointer holds the whole batch they address.
fn check_len(what: &str, len: usize, expected: usize) -> Result<()> {
    if len != expected {
        crate::bail!(Shape, "Deconvolution: the {what} holds {len} elements, expected {expected}");
    }
    Ok(())
}

pub(super) struct Deconvolution {
    p: DeconvolutionParams,
}

impl Deconvolution {
    /// MXNet's bilinear UpSampling: a depthwise deconvolution by `scale` whose (num_filter, 1,
    /// k, k) weight input holds the bilinear filters (initialized by `mx.init.Bilinear`).
    pub(super) fn bilinear_upsampling(scale: usize, num_filter: usize) -> Deconvolution {
        let s = scale as i64;
        let kernel = 2 * s - s % 2;
        let p = DeconvolutionParams {
            kernel: vec![kernel, kernel],
            stride: vec![s, s],
            dilate: Vec::new(),
            pad: vec![s / 2, s / 2],
            adj: Vec::new(),
            target_shape: Vec::new(),
            num_filter,
            num_group: num_filter,
            workspace: 512,
            no_bias: true,
            cudnn_tune: None,
            cudnn_off: false,
            layout: None,
        };
        Deconvolution { p }
    }
}

impl Operator for Deconvolution {
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data".to_string(), "weight".to_string()];
        if !self.p.no_bias {
            names.push("bias".into());
        }
        names
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let [Some(data), weight, rest @ ..] = inputs {
            let g = self.p.geometry(data)?;
            weight.get_or_insert_with(|| g.weight_shape());
            if let Some(bias) = rest.first_mut() {
                bias.get_or_insert_with(|| Shape::new(vec![g.channels]));
            }
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (data, weight, bias) = match inputs {
            [data, weight] => (data, weight, None),
            [data, weight, bias] => (data, weight, Some(bias)),
            _ => crate::bail!(Value, "Deconvolution: 2 or 3 inputs expected (data, weight[, bias]), got {}", inputs.len()),
        };
        let g = self.p.geometry(data)?;
        let (out, expected_weight) = shapes(&g);
        if *weight != expected_weight {
            crate::bail!(Shape, "Deconvolution: weight has shape {weight}, expected {expected_weight} for data {data}");
        }
        if let Some(bias) = bias {
            if bias.dims() != [g.channels] {
                crate::bail!(Shape, "Deconvolution: bias has shape {bias}, expected ({},)", g.channels);
            }
        }
        Ok(vec![out])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let g = self.p.geometry(args.input_shape(0)?)?;
        let dtype = args.input_dtype(0)?;
        let plane = g.input_size();
        crate::dispatch_dtype!(dtype, T => {
            let (x, weight) = (args.input::<T>(0)?, args.input::<T>(1)?);
            let bias = (args.inputs().len() > 2).then(|| args.input::<T>(2)).transpose()?;
            let out = args.output::<T>(0)?;
            check_len("weight", weight.len(), g.weight_shape().size())?;
            check_len("output", out.len(), g.batch * g.channels * plane)?;
            let (products, plan) = ImageProducts::planned(&g, dtype, weight.as_ptr().cast());
            // The products write the whole-batch output through a pointer; tasks own disjoint
            // chunks of images.
            let out = SendPtr(out.as_mut_ptr());
            plan.run(|mine| {
                let mut buf = products.buffers::<T>(Uses { correlate: false, scatter: true, weight_grad: false })?;
                for images in mine.iter().cloned() {
                    let block = images.len() * g.channels * plane;
                    // SAFETY: the output holds the whole batch (checked above) and this chunk's
                    // images of it are written by this task alone.
                    let region = unsafe {
                        products.scatter(images.clone(), x, out.get(), &mut buf)?;
                        std::slice::from_raw_parts_mut(out.get().add(images.start * g.channels * plane), block)
                    };
                    if let Some(bias) = bias {
                        add_channel_bias(region, bias, plane);
                    }
                }
                Ok(())
            })?;
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, w, g) = (d.input(0), d.input(1), d.out_grad(0));
        let mut attrs = self.p.attrs();
        attrs.push(("data_grad", if d.input_needed(0) { "True" } else { "False" }.to_string()));
        let grads = d.op_outputs("_backward_Deconvolution", &attrs, &[&g, &x, &w])?;
        let mut out: InputGrads = grads.into_iter().map(Some).collect();
        if self.p.no_bias {
            out.truncate(2);
        }
        Ok(out)
    }
}

crate::op_params! {
    pub struct DeconvolutionBackwardParams {
        /// The forward's geometry parameters are passed through.
        kernel: Vec<i64>,
        /// Stride per spatial axis.
        stride: Vec<i64> = Vec::new(),
        /// Dilation per spatial axis.
        dilate: Vec<i64> = Vec::new(),
        /// Output padding per spatial axis.
        pad: Vec<i64> = Vec::new(),
        /// Extra output positions per spatial axis.
        adj: Vec<i64> = Vec::new(),
        /// Output spatial shape (overrides pad and adj).
        target_shape: Vec<i64> = Vec::new(),
        /// Number of output channels.
        num_filter: usize,
        /// Number of groups.
        num_group: usize = 1,
        /// Whether the forward had no bias.
        no_bias: bool = true,
        /// Whether the data gradient is used (when not, it is left as zeros and not computed).
        data_grad: bool = true,
    }
}

/// `_backward_Deconvolution(grad, data, weight)`: gradients of data, weight and bias.
struct DeconvolutionBackward {
    p: DeconvolutionParams,
    data_grad: bool,
}

impl Operator for DeconvolutionBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into(), "weight".into()]
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [_, data, weight] = exactly("_backward_Deconvolution", "input", inputs)?;
        Ok(vec![data.clone(), weight.clone(), Shape::new(vec![self.p.num_filter])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _, _] = exactly("_backward_Deconvolution", "input", inputs)?;
        Ok(vec![grad; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let g = self.p.geometry(args.input_shape(1)?)?;
        let dtype = args.input_dtype(1)?;
        crate::dispatch_dtype!(dtype, T => {
            let (gv, xv, weight) = (args.input::<T>(0)?, args.input::<T>(1)?, args.input::<T>(2)?);
            let (dxv, dwv, dbv) = (args.output::<T>(0)?, args.output::<T>(1)?, args.output::<T>(2)?);
            check_len("weight", weight.len(), g.weight_shape().size())?;
            check_len("weight gradient", dwv.len(), g.weight_shape().size())?;
            check_len("data gradient", dxv.len(), g.batch * g.filters * g.output_size())?;
            let (products, plan) = ImageProducts::planned(&g, dtype, weight.as_ptr().cast());
            // The products write the whole-batch data gradient through a pointer; tasks own
            // disjoint chunks of images.
            let dx_ptr = SendPtr(dxv.as_mut_ptr());
            let uses = Uses { correlate: self.data_grad, scatter: false, weight_grad: true };
            weight_grad_over_chunks(&plan, &products, uses, dwv, |images, buf, partial| {
                // SAFETY: the partial is shaped like the weight; dx holds the whole batch (checked
                // above) and each chunk's images of it are written by the task running that chunk
                // alone.
                unsafe {
                    products.accumulate_weight_grad(images.clone(), gv, xv, partial, buf)?;
                    if self.data_grad {
                        products.correlate(images, gv, dx_ptr.get(), buf)?;
                    }
                }
                Ok(())
            })?;
            if !self.data_grad {
                dxv.fill(T::default());
            }
            channel_sums(gv, g.channels, g.input_size(), dbv);
        });
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "Deconvolution",
        &[],
        "Computes 1-D, 2-D or 3-D transposed convolution (channels-first layouts), GEMM + col2im.",
        |p: DeconvolutionParams| {
            if p.num_filter == 0 {
                crate::bail!(Param, "Deconvolution: num_filter must be at least 1, got 0");
            }
            Ok(Deconvolution { p })
        },
    ));
    add(OpDef::new("_backward_Deconvolution", &[], "Gradients of Deconvolution for data, weight and bias.", |p: DeconvolutionBackwardParams| {
        let forward = DeconvolutionParams {
            kernel: p.kernel,
            stride: p.stride,
            dilate: p.dilate,
            pad: p.pad,
            adj: p.adj,
            target_shape: p.target_shape,
            num_filter: p.num_filter,
            num_group: p.num_group,
            workspace: 512,
            no_bias: p.no_bias,
            cudnn_tune: None,
            cudnn_off: false,
            layout: None,
        };
        Ok(DeconvolutionBackward { p: forward, data_grad: p.data_grad })
    }));
}
