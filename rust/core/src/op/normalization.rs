//! Normalization layers: BatchNorm (batch statistics while training, moving statistics updated
//! in place; the moving ones at inference) and LayerNorm, with their gradients.

use super::grad::{Grad, InputGrads};
use super::{parallel_chunks, simd, sum_lanes, ExecContext, OpDef, Operator, SendPtr, Tensor};
use crate::base::{normalize_axis, DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    /// cudnn_off and the calibration ranges only matter to MXNet's GPU and quantized paths.
    #[allow(dead_code)]
    pub struct BatchNormParams {
        /// Added to the variance for numerical stability.
        eps: f64 = 1e-3,
        /// Decay of the moving statistics.
        momentum: f64 = 0.9,
        /// Treat gamma as 1 (and give it no gradient).
        fix_gamma: bool = true,
        /// Use the moving statistics even while training.
        use_global_stats: bool = false,
        /// Also output the mean and variance used.
        output_mean_var: bool = false,
        /// The channel axis.
        axis: i64 = 1,
        /// Disable cuDNN (accepted for compatibility).
        cudnn_off: bool = false,
        /// Quantization calibration (accepted for compatibility).
        min_calib_range: Option<f64> = None,
        /// Quantization calibration (accepted for compatibility).
        max_calib_range: Option<f64> = None,
    }
}

/// (outer, channels, inner) around the channel axis.
fn channel_layout(s: &Shape, axis: i64) -> Result<(usize, usize, usize)> {
    let a = normalize_axis(axis, s.ndim())?;
    let d = s.dims();
    Ok((d[..a].iter().product(), d[a], d[a + 1..].iter().product()))
}

/// Shape check of a normalization gradient's inputs (grad, data, gamma, two statistics): grad
/// shaped like data, gamma with `params` elements and each statistic with `stats` elements, so
/// that the kernel reads and writes only what exists.
fn check_backward_inputs(op: &str, inputs: &[Shape], params: usize, stats: usize) -> Result<()> {
    let names = ["grad", "data", "gamma", "first statistic", "second statistic"];
    let data = &inputs[1];
    super::check_out_grad(op, &inputs[0], data)?;
    let wanted = [params, stats, stats];
    for ((name, given), &count) in names[2..].iter().zip(&inputs[2..]).zip(&wanted) {
        if given.size() != count {
            crate::bail!(Shape, "{op}: {name} has shape {given}, expected {count} element(s) for data {data}");
        }
    }
    Ok(())
}

pub(super) fn to_f64(t: &Tensor) -> Vec<f64> {
    crate::dispatch_dtype!(t.dtype, T => {
        // SAFETY: read-only use of an input (or of an output this op already wrote).
        unsafe { t.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
    })
}

pub(super) fn write_f64(t: &Tensor, values: &[f64]) {
    crate::dispatch_dtype!(t.dtype, T => {
        // SAFETY: `t` is an output (or mutated input) this op owns while it runs.
        unsafe { t.slice_mut::<T>() }.iter_mut().zip(values).for_each(|(v, &x)| *v = T::from_f64(x));
    });
}

pub(super) struct BatchNorm {
    p: BatchNormParams,
}

impl BatchNorm {
    pub fn new(p: BatchNormParams) -> BatchNorm {
        BatchNorm { p }
    }
    fn batch_stats(&self, ctx: &ExecContext) -> bool {
        ctx.is_train && !self.p.use_global_stats
    }
}

/// Unknown per-channel parameters (gamma, beta, moving statistics) are vectors of `len`.
fn fill_vectors(params: &mut [Option<Shape>], len: usize) {
    for p in params.iter_mut() {
        p.get_or_insert_with(|| Shape::new(vec![len]));
    }
}

impl Operator for BatchNorm {
    fn input_names(&self) -> Vec<String> {
        ["data", "gamma", "beta", "moving_mean", "moving_var"].iter().map(|s| s.to_string()).collect()
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn num_visible_outputs(&self) -> usize {
        if self.p.output_mean_var {
            3
        } else {
            1
        }
    }
    fn mutated_inputs(&self) -> &[usize] {
        &[3, 4]
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let Some(data) = &inputs[0] {
            let (_, c, _) = channel_layout(data, self.p.axis)?;
            fill_vectors(&mut inputs[1..], c);
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (_, c, _) = channel_layout(&inputs[0], self.p.axis)?;
        for (name, s) in ["gamma", "beta", "moving_mean", "moving_var"].iter().zip(&inputs[1..]) {
            if s.size() != c || s.ndim() != 1 {
                crate::bail!(Shape, "BatchNorm: {name} has shape {s}, expected ({c},) for data {}", inputs[0]);
            }
        }
        let stats = Shape::new(vec![c]);
        Ok(vec![inputs[0].clone(), stats.clone(), stats])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0], inputs[1], inputs[1]])
    }
    /// Parameters and statistics of unknown dtype take the dtype the kernel accumulates the
    /// data's in, as in MXNet: float32 for float16, bfloat16 and float32 data (so AMP keeps
    /// them in float32), float64 for float64 data.
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        let param = match inputs[0] {
            Some(DType::F64) => DType::F64,
            Some(_) => DType::F32,
            None => inputs.iter().flatten().next().copied().unwrap_or(DType::F32),
        };
        for d in inputs.iter_mut().filter(|d| d.is_none()) {
            *d = Some(param);
        }
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (outer, c, inner) = channel_layout(&inputs[0].shape, self.p.axis)?;
        let gamma = if self.p.fix_gamma { vec![1.0; c] } else { to_f64(&inputs[1]) };
        let beta = to_f64(&inputs[2]);
        let batch_stats = self.batch_stats(ctx);
        let (mut mean, mut var) = (to_f64(&inputs[3]), to_f64(&inputs[4]));
        let eps = self.p.eps;
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (xp, op) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            let (mp, vp) = (SendPtr(mean.as_mut_ptr()), SendPtr(var.as_mut_ptr()));
            // One task per group of channels: each reads and writes only its channels' elements.
            parallel_chunks(c, 1, |channels| {
                for ch in channels {
                    // SAFETY (all accesses below): block o of channel ch spans `inner` elements of
                    // the (outer, c, inner) input and output; channel ch belongs to this task, and
                    // so do mean[ch] and var[ch].
                    let block = |o: usize| unsafe { std::slice::from_raw_parts(xp.get().add((o * c + ch) * inner), inner) };
                    let (m, v) = if batch_stats {
                        let count = (outer * inner).max(1) as f64;
                        let m = (0..outer).map(|o| simd::vectorized(#[inline(always)] || sum_lanes(block(o), block(o), |e, _| e))).sum::<f64>() / count;
                        let v = (0..outer).map(|o| simd::vectorized(#[inline(always)] || sum_lanes(block(o), block(o), |e, _| (e - m) * (e - m)))).sum::<f64>() / count;
                        unsafe {
                            *mp.get().add(ch) = m;
                            *vp.get().add(ch) = v;
                        }
                        (m, v)
                    } else {
                        unsafe { (*mp.get().add(ch), *vp.get().add(ch)) }
                    };
                    let scale = gamma[ch] / (v + eps).sqrt();
                    let shift = beta[ch] - m * scale;
                    for o in 0..outer {
                        let out = unsafe { std::slice::from_raw_parts_mut(op.get().add((o * c + ch) * inner), inner) };
                        simd::vectorized(#[inline(always)] || {
                            for (y, e) in out.iter_mut().zip(block(o)) {
                                *y = T::from_f64(e.to_f64() * scale + shift);
                            }
                        });
                    }
                }
            });
        });
        if batch_stats {
            let m = self.p.momentum;
            let moving_mean: Vec<f64> = to_f64(&inputs[3]).iter().zip(&mean).map(|(&old, &b)| m * old + (1.0 - m) * b).collect();
            let moving_var: Vec<f64> = to_f64(&inputs[4]).iter().zip(&var).map(|(&old, &b)| m * old + (1.0 - m) * b).collect();
            write_f64(&inputs[3], &moving_mean);
            write_f64(&inputs[4], &moving_var);
        }
        write_f64(&outputs[1], &mean);
        write_f64(&outputs[2], &var);
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, gamma, g, mean, var) = (d.input(0), d.input(1), d.out_grad(0), d.output(1), d.output(2));
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let attrs = [
            ("eps", format!("{:?}", self.p.eps)),
            ("fix_gamma", flag(self.p.fix_gamma)),
            ("use_global_stats", flag(self.p.use_global_stats)),
            ("axis", self.p.axis.to_string()),
        ];
        let grads = d.op_outputs("_backward_BatchNorm", &attrs, &[&g, &x, &gamma, &mean, &var])?;
        let mut out: InputGrads = grads.into_iter().map(Some).collect();
        out.extend([None, None]);
        Ok(out)
    }
}

/// `_backward_BatchNorm(grad, data, gamma, mean, var)`: gradients of data, gamma and beta. With
/// batch statistics (training) the statistics' own dependence on the data is included.
struct BatchNormBackward {
    p: BatchNormParams,
}

impl Operator for BatchNormBackward {
    fn input_names(&self) -> Vec<String> {
        ["grad", "data", "gamma", "mean", "var"].iter().map(|s| s.to_string()).collect()
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (_, channels, _) = channel_layout(&inputs[1], self.p.axis)?;
        check_backward_inputs("_backward_BatchNorm", inputs, channels, channels)?;
        Ok(vec![inputs[1].clone(), inputs[2].clone(), inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[1], inputs[2], inputs[2]])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (outer, c, inner) = channel_layout(&inputs[1].shape, self.p.axis)?;
        let gamma = if self.p.fix_gamma { vec![1.0; c] } else { to_f64(&inputs[2]) };
        let (mean, var) = (to_f64(&inputs[3]), to_f64(&inputs[4]));
        let (mut dgamma, mut dbeta) = (vec![0.0; c], vec![0.0; c]);
        let count = (outer * inner).max(1) as f64;
        let batch_stats = ctx.is_train && !self.p.use_global_stats;
        let eps = self.p.eps;
        crate::dispatch_dtype!(inputs[1].dtype, T => {
            let (gp, xp, dp) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(inputs[1].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            let (dgp, dbp) = (SendPtr(dgamma.as_mut_ptr()), SendPtr(dbeta.as_mut_ptr()));
            parallel_chunks(c, 1, |channels| {
                for ch in channels {
                    // SAFETY (all accesses below): channel ch's blocks of grad, data and the data
                    // gradient, and dgamma[ch]/dbeta[ch], belong to this task.
                    let at = |p: SendPtr<T>, o: usize| unsafe { std::slice::from_raw_parts(p.get().add((o * c + ch) * inner), inner) };
                    let invstd = 1.0 / (var[ch] + eps).sqrt();
                    let (mut sum_g, mut sum_gx) = (0.0, 0.0);
                    let m = mean[ch];
                    for o in 0..outer {
                        let (g, x) = (at(gp, o), at(xp, o));
                        sum_g += simd::vectorized(#[inline(always)] || sum_lanes(g, x, |g, _| g));
                        sum_gx += simd::vectorized(#[inline(always)] || sum_lanes(g, x, |g, x| g * (x - m))) * invstd;
                    }
                    unsafe {
                        *dgp.get().add(ch) = sum_gx;
                        *dbp.get().add(ch) = sum_g;
                    }
                    let k = gamma[ch] * invstd;
                    for o in 0..outer {
                        let dx = unsafe { std::slice::from_raw_parts_mut(dp.get().add((o * c + ch) * inner), inner) };
                        simd::vectorized(#[inline(always)] || {
                            for ((d, g), x) in dx.iter_mut().zip(at(gp, o)).zip(at(xp, o)) {
                                let g = g.to_f64();
                                *d = T::from_f64(if batch_stats {
                                    let xhat = (x.to_f64() - m) * invstd;
                                    k * (g - sum_g / count - xhat * sum_gx / count)
                                } else {
                                    g * k
                                });
                            }
                        });
                    }
                }
            });
        });
        if self.p.fix_gamma {
            dgamma.iter_mut().for_each(|v| *v = 0.0);
        }
        write_f64(&outputs[1], &dgamma);
        write_f64(&outputs[2], &dbeta);
        Ok(())
    }
}

crate::op_params! {
    pub struct LayerNormParams {
        /// The axis normalized over.
        axis: i64 = -1,
        /// Added to the variance for numerical stability.
        eps: f64 = 1e-5,
        /// Also output the mean and standard deviation.
        output_mean_var: bool = false,
    }
}

/// LayerNorm: normalize each lane along `axis`, then scale by gamma and shift by beta.
struct LayerNorm {
    p: LayerNormParams,
}

impl LayerNorm {
    /// (outer, n, inner) around the normalized axis.
    fn layout(&self, s: &Shape) -> Result<(usize, usize, usize)> {
        channel_layout(s, self.p.axis)
    }
}

impl Operator for LayerNorm {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "gamma".into(), "beta".into()]
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn num_visible_outputs(&self) -> usize {
        if self.p.output_mean_var {
            3
        } else {
            1
        }
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let Some(data) = &inputs[0] {
            let (_, n, _) = self.layout(data)?;
            fill_vectors(&mut inputs[1..], n);
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (_, n, _) = self.layout(&inputs[0])?;
        for (name, s) in ["gamma", "beta"].iter().zip(&inputs[1..]) {
            if s.size() != n || s.ndim() != 1 {
                crate::bail!(Shape, "LayerNorm: {name} has shape {s}, expected ({n},) for data {}", inputs[0]);
            }
        }
        let axis = normalize_axis(self.p.axis, inputs[0].ndim())?;
        let mut stats = inputs[0].dims().to_vec();
        stats[axis] = 1;
        Ok(vec![inputs[0].clone(), Shape::new(stats.clone()), Shape::new(stats)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (outer, n, inner) = self.layout(&inputs[0].shape)?;
        let (x, gamma, beta) = (to_f64(&inputs[0]), to_f64(&inputs[1]), to_f64(&inputs[2]));
        let mut y = vec![0.0; x.len()];
        let mut means = vec![0.0; outer * inner];
        let mut stds = vec![0.0; outer * inner];
        for o in 0..outer {
            for j in 0..inner {
                let at = |k: usize| (o * n + k) * inner + j;
                let mean = (0..n).map(|k| x[at(k)]).sum::<f64>() / n as f64;
                let var = (0..n).map(|k| (x[at(k)] - mean).powi(2)).sum::<f64>() / n as f64;
                let std = (var + self.p.eps).sqrt();
                for k in 0..n {
                    y[at(k)] = (x[at(k)] - mean) / std * gamma[k] + beta[k];
                }
                means[o * inner + j] = mean;
                stds[o * inner + j] = std;
            }
        }
        write_f64(&outputs[0], &y);
        write_f64(&outputs[1], &means);
        write_f64(&outputs[2], &stds);
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, gamma, g, mean, std) = (d.input(0), d.input(1), d.out_grad(0), d.output(1), d.output(2));
        let attrs = [("axis", self.p.axis.to_string()), ("eps", format!("{:?}", self.p.eps))];
        Ok(d.op_outputs("_backward_LayerNorm", &attrs, &[&g, &x, &gamma, &mean, &std])?.into_iter().map(Some).collect())
    }
}

/// `_backward_LayerNorm(grad, data, gamma, mean, std)`: gradients of data, gamma and beta.
struct LayerNormBackward {
    norm: LayerNorm,
}

impl Operator for LayerNormBackward {
    fn input_names(&self) -> Vec<String> {
        ["grad", "data", "gamma", "mean", "std"].iter().map(|s| s.to_string()).collect()
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (outer, n, inner) = self.norm.layout(&inputs[1])?;
        check_backward_inputs("_backward_LayerNorm", inputs, n, outer * inner)?;
        Ok(vec![inputs[1].clone(), inputs[2].clone(), inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[1], inputs[2], inputs[2]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (outer, n, inner) = self.norm.layout(&inputs[1].shape)?;
        let (g, x, gamma) = (to_f64(&inputs[0]), to_f64(&inputs[1]), to_f64(&inputs[2]));
        let (means, stds) = (to_f64(&inputs[3]), to_f64(&inputs[4]));
        let mut dx = vec![0.0; x.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; n], vec![0.0; n]);
        for o in 0..outer {
            for j in 0..inner {
                let at = |k: usize| (o * n + k) * inner + j;
                let (mean, std) = (means[o * inner + j], stds[o * inner + j]);
                let xhat = |k: usize| (x[at(k)] - mean) / std;
                let mut sum_dxhat = 0.0;
                let mut sum_dxhat_xhat = 0.0;
                for k in 0..n {
                    let dxhat = g[at(k)] * gamma[k];
                    sum_dxhat += dxhat;
                    sum_dxhat_xhat += dxhat * xhat(k);
                    dgamma[k] += g[at(k)] * xhat(k);
                    dbeta[k] += g[at(k)];
                }
                for k in 0..n {
                    let dxhat = g[at(k)] * gamma[k];
                    dx[at(k)] = (dxhat - sum_dxhat / n as f64 - xhat(k) * sum_dxhat_xhat / n as f64) / std;
                }
            }
        }
        write_f64(&outputs[0], &dx);
        write_f64(&outputs[1], &dgamma);
        write_f64(&outputs[2], &dbeta);
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "BatchNorm",
        &[],
        "Batch normalization: batch statistics while training (updating moving_mean/moving_var in place), the moving ones otherwise.",
        |p: BatchNormParams| Ok(BatchNorm { p }),
    ));
    add(OpDef::new("_backward_BatchNorm", &[], "Gradient of BatchNorm.", |p: BatchNormParams| Ok(BatchNormBackward { p })));
    add(OpDef::new("LayerNorm", &[], "Layer normalization over one axis, then gamma scale and beta shift.", |p: LayerNormParams| {
        Ok(LayerNorm { p })
    }));
    add(OpDef::new("_backward_LayerNorm", &[], "Gradient of LayerNorm.", |p: LayerNormParams| Ok(LayerNormBackward { norm: LayerNorm { p } })));
}
