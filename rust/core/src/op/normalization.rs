//! Normalization layers: BatchNorm (batch statistics while training, moving statistics updated
//! in place; the moving ones at inference) and LayerNorm, with their gradients.

use std::ops::Range;

use super::grad::{Grad, InputGrads};
use super::{exactly, sum_lanes, ExecContext, OpDef, Operator};
use crate::backend::cpu::simd;
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
    let Some((before, [channels, after @ ..])) = s.dims().split_at_checked(a) else {
        crate::bail!(Shape, "axis {axis} is out of bounds for shape {s}");
    };
    Ok((before.iter().product(), *channels, after.iter().product()))
}

/// Shape check of a normalization gradient's inputs (grad, data, gamma, two statistics): grad
/// shaped like data, gamma with `params` elements and each statistic with `stats` elements, so
/// that the kernel reads and writes only what exists.
fn check_backward_inputs(op: &str, inputs: &[Shape], params: usize, stats: usize) -> Result<()> {
    let [grad, data, gamma, first, second] = exactly(op, "input", inputs)?;
    super::check_out_grad(op, grad, data)?;
    for (name, given, count) in [("gamma", gamma, params), ("first statistic", first, stats), ("second statistic", second, stats)] {
        if given.size() != count {
            crate::bail!(Shape, "{op}: {name} has shape {given}, expected {count} element(s) for data {data}");
        }
    }
    Ok(())
}

/// Channel ranges of one task each, as `parallel_chunks(channels, 1, ..)` splits them: one range
/// when there is a single channel or a single thread.
fn channel_ranges(channels: usize) -> Vec<Range<usize>> {
    let threads = crate::engine::parallel::threads();
    if channels <= 1 || threads <= 1 {
        return std::iter::once(0..channels).collect();
    }
    let chunk = channels.div_ceil(threads * 4).max(1);
    (0..channels).step_by(chunk).map(|start| start..(start + chunk).min(channels)).collect()
}

/// Blocks of fewer elements than this (the `inner` extent of an (outer, c, inner) array) are
/// visited row by row, all of a task's channels at a time, rather than channel by channel: a
/// channel's blocks are then too short to pay for a pass each, and rows are contiguous. Each
/// channel's sums still add its blocks in row order, so both orders give the same values.
const ROW_ORDER_BELOW: usize = 64;

/// `per_task(channels, rows)` over channel ranges of the non-empty (outer, c, inner) array
/// `out` (in parallel, as `parallel_chunks(c, 1, ..)` splits the channels), each task given its
/// channels' part of every row (`rows[o]`, `channels.len() * inner` elements); the per-channel
/// results of all tasks in channel order.
fn for_each_channel_range<T: Send, R: Send>(
    op: &str,
    out: &mut [T],
    (outer, c, inner): (usize, usize, usize),
    per_task: impl Fn(Range<usize>, &mut [&mut [T]]) -> Result<Vec<R>> + Sync,
) -> Result<Vec<R>> {
    let row_len = c * inner;
    if row_len == 0 || out.len() != outer * row_len {
        crate::bail!(Runtime, "{op}: {} elements for data of (outer, channels, inner) = ({outer}, {c}, {inner})", out.len());
    }
    // Each task's part of a row is contiguous, and disjoint from the other tasks' parts.
    let mut tasks: Vec<(Range<usize>, Vec<&mut [T]>)> = channel_ranges(c).into_iter().map(|r| (r, Vec::with_capacity(outer))).collect();
    for row in out.chunks_exact_mut(row_len) {
        let mut rest = row;
        for (channels, rows) in tasks.iter_mut() {
            let (part, tail) = std::mem::take(&mut rest)
                .split_at_mut_checked(channels.len() * inner)
                .ok_or_else(|| crate::err!(Runtime, "{op}: channels {channels:?} lie beyond the {c} channels"))?;
            rows.push(part);
            rest = tail;
        }
    }
    let results = crate::engine::parallel::map_owned(tasks, |_, (channels, mut rows)| per_task(channels, &mut rows));
    let mut all = Vec::with_capacity(c);
    for task in results {
        all.extend(task?);
    }
    Ok(all)
}

/// The values of `channels` in a per-channel vector of `op`.
fn channel_values<'v>(op: &str, values: &'v [f64], channels: &Range<usize>) -> Result<&'v [f64]> {
    values.get(channels.clone()).ok_or_else(|| crate::err!(Runtime, "{op}: no values for channels {channels:?} among {}", values.len()))
}

/// Each row's elements from `lo` to `hi` (at most `row_len`, checked) of the (outer, row_len)
/// array `values`: a channel's block or a task's part of every row.
fn row_spans<'v, T>(op: &str, values: &'v [T], row_len: usize, (lo, hi): (usize, usize)) -> Result<impl Iterator<Item = &'v [T]> + Clone> {
    if lo > hi || hi > row_len || row_len == 0 {
        crate::bail!(Runtime, "{op}: elements {lo}..{hi} of rows of {row_len}");
    }
    // The check above lets the compiler drop the per-row one.
    Ok(values.chunks_exact(row_len).map(move |row| row.get(lo..hi).unwrap_or_default()))
}

/// Checks that each named per-channel vector of `op` holds `channels` values.
fn check_channels(op: &str, channels: usize, vectors: &[(&str, &[f64])]) -> Result<()> {
    if let Some((name, v)) = vectors.iter().find(|(_, v)| v.len() != channels) {
        crate::bail!(Shape, "{op}: {name} holds {} values, expected one per channel ({channels})", v.len());
    }
    Ok(())
}

/// BatchNorm's kernel over (outer, c, inner) data: per channel, the mean and variance (the
/// batch's, or `moving` ones given), then `y = x * scale + shift` with `scale = gamma /
/// sqrt(var + eps)` and `shift = beta - mean * scale`. Returns each channel's (mean, variance).
fn batch_norm_forward<T: Elem>(
    x: &[T],
    y: &mut [T],
    layout: (usize, usize, usize),
    (gamma, beta): (&[f64], &[f64]),
    moving: Option<(&[f64], &[f64])>,
    eps: f64,
) -> Result<Vec<(f64, f64)>> {
    const OP: &str = "BatchNorm";
    let (outer, c, inner) = layout;
    if x.len() != y.len() {
        crate::bail!(Runtime, "{OP}: {} data elements, {} output elements", x.len(), y.len());
    }
    let count = (outer * inner).max(1) as f64;
    if x.is_empty() {
        // No elements: the batch statistics are sums of `outer` empty blocks.
        let zero = std::iter::repeat_n(0.0, outer).sum::<f64>() / count;
        return Ok(match moving {
            Some((mean, var)) => mean.iter().copied().zip(var.iter().copied()).collect(),
            None => vec![(zero, zero); c],
        });
    }
    let row_len = c * inner;
    // One task per group of channels: each reads its channels' blocks and writes theirs.
    for_each_channel_range(OP, y, layout, |channels, rows| {
        let (gamma, beta) = (channel_values(OP, gamma, &channels)?, channel_values(OP, beta, &channels)?);
        let moving = match moving {
            Some((mean, var)) => Some((channel_values(OP, mean, &channels)?, channel_values(OP, var, &channels)?)),
            None => None,
        };
        let affine = |g: f64, b: f64, m: f64, v: f64| {
            let scale = g / (v + eps).sqrt();
            (scale, b - m * scale)
        };
        if inner < ROW_ORDER_BELOW {
            let parts = row_spans(OP, x, row_len, (channels.start * inner, channels.end * inner))?;
            let (means, vars) = match moving {
                Some((mean, var)) => (mean.to_vec(), var.to_vec()),
                None => {
                    // Sums over the rows in order, each channel's as `Iterator::sum` adds them.
                    let mut means = vec![-0.0; channels.len()];
                    for part in parts.clone() {
                        simd::vectorized(
                            #[inline(always)]
                            || {
                                for (m, b) in means.iter_mut().zip(part.chunks_exact(inner)) {
                                    *m += sum_lanes(b, b, |e, _| e);
                                }
                            },
                        );
                    }
                    means.iter_mut().for_each(|m| *m /= count);
                    let mut vars = vec![-0.0; channels.len()];
                    for part in parts.clone() {
                        simd::vectorized(
                            #[inline(always)]
                            || {
                                for ((v, &m), b) in vars.iter_mut().zip(&means).zip(part.chunks_exact(inner)) {
                                    *v += sum_lanes(b, b, |e, _| (e - m) * (e - m));
                                }
                            },
                        );
                    }
                    vars.iter_mut().for_each(|v| *v /= count);
                    (means, vars)
                }
            };
            let params = gamma.iter().zip(beta).zip(means.iter().zip(&vars));
            let affines: Vec<(f64, f64)> = params.map(|((&g, &b), (&m, &v))| affine(g, b, m, v)).collect();
            for (out, part) in rows.iter_mut().zip(parts) {
                simd::vectorized(
                    #[inline(always)]
                    || {
                        for ((ys, xs), &(scale, shift)) in out.chunks_exact_mut(inner).zip(part.chunks_exact(inner)).zip(&affines) {
                            for (y, e) in ys.iter_mut().zip(xs) {
                                *y = T::from_f64(e.to_f64() * scale + shift);
                            }
                        }
                    },
                );
            }
            return Ok(means.into_iter().zip(vars).collect());
        }
        let mut stats = Vec::with_capacity(channels.len());
        for (k, ch) in channels.clone().enumerate() {
            // Channel ch's block of each row.
            let blocks = row_spans(OP, x, row_len, (ch * inner, (ch + 1) * inner))?;
            let params = gamma.get(k).zip(beta.get(k));
            let Some((&g, &b)) = params else { crate::bail!(Runtime, "{OP}: no gamma or beta for channel {ch}") };
            let (m, v) = match moving {
                None => {
                    let m = blocks
                        .clone()
                        .map(|b| {
                            simd::vectorized(
                                #[inline(always)]
                                || sum_lanes(b, b, |e, _| e),
                            )
                        })
                        .sum::<f64>()
                        / count;
                    let v = blocks
                        .clone()
                        .map(|b| {
                            simd::vectorized(
                                #[inline(always)]
                                || sum_lanes(b, b, |e, _| (e - m) * (e - m)),
                            )
                        })
                        .sum::<f64>()
                        / count;
                    (m, v)
                }
                Some((mean, var)) => match mean.get(k).zip(var.get(k)) {
                    Some((&m, &v)) => (m, v),
                    None => crate::bail!(Runtime, "{OP}: no moving statistics for channel {ch}"),
                },
            };
            let (scale, shift) = affine(g, b, m, v);
            for (row, block) in rows.iter_mut().zip(blocks) {
                let out = row
                    .get_mut(k * inner..(k + 1) * inner)
                    .ok_or_else(|| crate::err!(Runtime, "{OP}: channel {ch} lies beyond its task's part of a row"))?;
                simd::vectorized(
                    #[inline(always)]
                    || {
                        for (y, e) in out.iter_mut().zip(block) {
                            *y = T::from_f64(e.to_f64() * scale + shift);
                        }
                    },
                );
            }
            stats.push((m, v));
        }
        Ok(stats)
    })
}

/// `_backward_BatchNorm`'s kernel over (outer, c, inner) data: writes the data gradient `dx` and
/// returns each channel's (gamma gradient, beta gradient). With `batch_stats` the statistics'
/// own dependence on the data is included.
fn batch_norm_backward<T: Elem>(
    g: &[T],
    x: &[T],
    dx: &mut [T],
    layout: (usize, usize, usize),
    (gamma, mean, var): (&[f64], &[f64], &[f64]),
    batch_stats: bool,
    eps: f64,
) -> Result<Vec<(f64, f64)>> {
    const OP: &str = "_backward_BatchNorm";
    let (outer, c, inner) = layout;
    if g.len() != x.len() || dx.len() != x.len() {
        crate::bail!(Runtime, "{OP}: {} gradient, {} data and {} data gradient elements", g.len(), x.len(), dx.len());
    }
    if x.is_empty() {
        return Ok(vec![(0.0, 0.0); c]);
    }
    let count = (outer * inner).max(1) as f64;
    let row_len = c * inner;
    for_each_channel_range(OP, dx, layout, |channels, rows| {
        let (gamma, mean, var) = (channel_values(OP, gamma, &channels)?, channel_values(OP, mean, &channels)?, channel_values(OP, var, &channels)?);
        let invstds: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        if inner < ROW_ORDER_BELOW {
            let span = (channels.start * inner, channels.end * inner);
            let (gs, xs) = (row_spans(OP, g, row_len, span)?, row_spans(OP, x, row_len, span)?);
            let (mut sum_g, mut sum_gx) = (vec![0.0; channels.len()], vec![0.0; channels.len()]);
            for (gp, xp) in gs.clone().zip(xs.clone()) {
                simd::vectorized(
                    #[inline(always)]
                    || {
                        let per_channel = sum_g.iter_mut().zip(sum_gx.iter_mut()).zip(mean.iter().zip(&invstds));
                        for (((sg, sgx), (&m, &invstd)), (g, x)) in per_channel.zip(gp.chunks_exact(inner).zip(xp.chunks_exact(inner))) {
                            *sg += sum_lanes(g, x, |g, _| g);
                            *sgx += sum_lanes(g, x, |g, x| g * (x - m)) * invstd;
                        }
                    },
                );
            }
            let params: Vec<_> = gamma
                .iter()
                .zip(mean)
                .zip(&invstds)
                .zip(sum_g.iter().zip(&sum_gx))
                .map(|(((&gm, &m), &invstd), (&sg, &sgx))| (m, invstd, gm * invstd, sg / count, sgx))
                .collect();
            for (out, (gp, xp)) in rows.iter_mut().zip(gs.zip(xs)) {
                simd::vectorized(
                    #[inline(always)]
                    || {
                        for ((ds, (gb, xb)), &p) in out.chunks_exact_mut(inner).zip(gp.chunks_exact(inner).zip(xp.chunks_exact(inner))).zip(&params) {
                            data_gradient(ds, gb, xb, p, count, batch_stats);
                        }
                    },
                );
            }
            return Ok(sum_gx.into_iter().zip(sum_g).collect());
        }
        let mut grads = Vec::with_capacity(channels.len());
        for (k, ch) in channels.clone().enumerate() {
            let span = (ch * inner, (ch + 1) * inner);
            let blocks = row_spans(OP, g, row_len, span)?.zip(row_spans(OP, x, row_len, span)?);
            let params = gamma.get(k).zip(mean.get(k)).zip(invstds.get(k));
            let Some(((&gm, &m), &invstd)) = params else { crate::bail!(Runtime, "{OP}: no gamma or statistics for channel {ch}") };
            let (mut sum_g, mut sum_gx) = (0.0, 0.0);
            for (g, x) in blocks.clone() {
                sum_g += simd::vectorized(
                    #[inline(always)]
                    || sum_lanes(g, x, |g, _| g),
                );
                sum_gx += simd::vectorized(
                    #[inline(always)]
                    || sum_lanes(g, x, |g, x| g * (x - m)),
                ) * invstd;
            }
            let p = (m, invstd, gm * invstd, sum_g / count, sum_gx);
            for (row, (gb, xb)) in rows.iter_mut().zip(blocks) {
                let d = row
                    .get_mut(k * inner..(k + 1) * inner)
                    .ok_or_else(|| crate::err!(Runtime, "{OP}: channel {ch} lies beyond its task's part of a row"))?;
                simd::vectorized(
                    #[inline(always)]
                    || {
                        data_gradient(d, gb, xb, p, count, batch_stats);
                    },
                );
            }
            grads.push((sum_gx, sum_g));
        }
        Ok(grads)
    })
}

/// One block's data gradient from its channel's (mean, 1 / std, gamma / std, mean of g, sum of
/// g * (x - mean) / std over the `count` elements): with `batch_stats` it includes the
/// statistics' dependence on the data.
#[inline(always)]
fn data_gradient<T: Elem>(d: &mut [T], g: &[T], x: &[T], (m, invstd, k, mean_g, sum_gx): (f64, f64, f64, f64, f64), count: f64, batch_stats: bool) {
    if batch_stats {
        for ((d, g), x) in d.iter_mut().zip(g).zip(x) {
            let xhat = (x.to_f64() - m) * invstd;
            *d = T::from_f64(k * (g.to_f64() - mean_g - xhat * sum_gx / count));
        }
    } else {
        for (d, g) in d.iter_mut().zip(g) {
            *d = T::from_f64(g.to_f64() * k);
        }
    }
}

/// Moves the statistic held in updated input `i` toward `batch`: `old * momentum + batch * (1 -
/// momentum)`, computed in f64 and stored in the input's dtype.
fn update_moving(args: &KernelArgs, i: usize, batch: &[f64], momentum: f64) -> Result<()> {
    crate::dispatch_dtype!(args.input_dtype(i)?, T => {
        let moving = args.mutated::<T>(i)?;
        if moving.len() != batch.len() {
            crate::bail!(Shape, "BatchNorm: moving statistic {i} holds {} values, expected one per channel ({})", moving.len(), batch.len());
        }
        for (old, &b) in moving.iter_mut().zip(batch) {
            *old = T::from_f64(momentum * old.to_f64() + (1.0 - momentum) * b);
        }
    });
    Ok(())
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
        if let Some((Some(data), params)) = inputs.split_first_mut() {
            let (_, c, _) = channel_layout(data, self.p.axis)?;
            fill_vectors(params, c);
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, gamma, beta, moving_mean, moving_var] = exactly("BatchNorm", "input", inputs)?;
        let (_, c, _) = channel_layout(data, self.p.axis)?;
        for (name, s) in [("gamma", gamma), ("beta", beta), ("moving_mean", moving_mean), ("moving_var", moving_var)] {
            if s.size() != c || s.ndim() != 1 {
                crate::bail!(Shape, "BatchNorm: {name} has shape {s}, expected ({c},) for data {data}");
            }
        }
        let stats = Shape::new(vec![c]);
        Ok(vec![data.clone(), stats.clone(), stats])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, gamma, ..] = inputs else {
            crate::bail!(Type, "BatchNorm: data and gamma dtypes expected, got {} dtype(s)", inputs.len());
        };
        Ok(vec![data, gamma, gamma])
    }
    /// Parameters and statistics of unknown dtype take the dtype the kernel accumulates the
    /// data's in, as in MXNet: float32 for float16, bfloat16 and float32 data (so AMP keeps
    /// them in float32), float64 for float64 data.
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        let param = match inputs.first().copied().flatten() {
            Some(DType::F64) => DType::F64,
            Some(_) => DType::F32,
            None => inputs.iter().flatten().next().copied().unwrap_or(DType::F32),
        };
        for d in inputs.iter_mut().filter(|d| d.is_none()) {
            *d = Some(param);
        }
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let layout = channel_layout(args.input_shape(0)?, self.p.axis)?;
        let c = layout.1;
        let gamma = if self.p.fix_gamma { vec![1.0; c] } else { args.input_f64(1)? };
        let beta = args.input_f64(2)?;
        let batch_stats = self.batch_stats(ctx);
        // The moving statistics are read here only when they are used as they are; with batch
        // statistics they are updated (lent for writing) after the kernel.
        let moving = if batch_stats { None } else { Some((args.input_f64(3)?, args.input_f64(4)?)) };
        let moving = moving.as_ref().map(|(mean, var)| (mean.as_slice(), var.as_slice()));
        let mut vectors = vec![("gamma", gamma.as_slice()), ("beta", beta.as_slice())];
        if let Some((mean, var)) = moving {
            vectors.extend([("moving_mean", mean), ("moving_var", var)]);
        }
        check_channels("BatchNorm", c, &vectors)?;
        let stats = crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            batch_norm_forward(args.input::<T>(0)?, args.output::<T>(0)?, layout, (gamma.as_slice(), beta.as_slice()), moving, self.p.eps)
        })?;
        let (mean, var): (Vec<f64>, Vec<f64>) = stats.into_iter().unzip();
        if batch_stats {
            update_moving(args, 3, &mean, self.p.momentum)?;
            update_moving(args, 4, &var, self.p.momentum)?;
        }
        args.output_from_f64(1, &mean)?;
        args.output_from_f64(2, &var)
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
        let [_, data, gamma, _, _] = exactly("_backward_BatchNorm", "input", inputs)?;
        let (_, channels, _) = channel_layout(data, self.p.axis)?;
        check_backward_inputs("_backward_BatchNorm", inputs, channels, channels)?;
        Ok(vec![data.clone(), gamma.clone(), gamma.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, data, gamma, ..] = inputs else {
            crate::bail!(Type, "_backward_BatchNorm: grad, data and gamma dtypes expected, got {} dtype(s)", inputs.len());
        };
        Ok(vec![data, gamma, gamma])
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        const OP: &str = "_backward_BatchNorm";
        let layout = channel_layout(args.input_shape(1)?, self.p.axis)?;
        let c = layout.1;
        let gamma = if self.p.fix_gamma { vec![1.0; c] } else { args.input_f64(2)? };
        let (mean, var) = (args.input_f64(3)?, args.input_f64(4)?);
        check_channels(OP, c, &[("gamma", gamma.as_slice()), ("mean", mean.as_slice()), ("var", var.as_slice())])?;
        let batch_stats = ctx.is_train && !self.p.use_global_stats;
        let grads = crate::dispatch_dtype!(args.input_dtype(1)?, T => {
            let (g, x, dx) = (args.input::<T>(0)?, args.input::<T>(1)?, args.output::<T>(0)?);
            batch_norm_backward(g, x, dx, layout, (gamma.as_slice(), mean.as_slice(), var.as_slice()), batch_stats, self.p.eps)
        })?;
        let (mut dgamma, dbeta): (Vec<f64>, Vec<f64>) = grads.into_iter().unzip();
        if self.p.fix_gamma {
            dgamma.iter_mut().for_each(|v| *v = 0.0);
        }
        args.output_from_f64(1, &dgamma)?;
        args.output_from_f64(2, &dbeta)
    }
}

/// LayerNorm over the non-empty (outer, n, inner) data `x` (rows of n * inner), normalized along n: `y`, and each
/// lane's mean and standard deviation (`means`, `stds`: outer * inner values). The lengths are
/// the caller's to check.
fn layer_norm_forward(
    (x, gamma, beta): (&[f64], &[f64], &[f64]),
    (n, inner): (usize, usize),
    eps: f64,
    (y, means, stds): (&mut [f64], &mut [f64], &mut [f64]),
) {
    let nf = n as f64;
    let rows = x.chunks_exact(n * inner).zip(y.chunks_exact_mut(n * inner));
    if inner == 1 {
        // Each row is one lane.
        for ((xs, ys), (mean, std)) in rows.zip(means.iter_mut().zip(stds.iter_mut())) {
            let m = xs.iter().sum::<f64>() / nf;
            let var = xs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / nf;
            let s = (var + eps).sqrt();
            for ((y, v), (g, b)) in ys.iter_mut().zip(xs).zip(gamma.iter().zip(beta)) {
                *y = (v - m) / s * g + b;
            }
            (*mean, *std) = (m, s);
        }
        return;
    }
    // Each row (o) holds n blocks of inner values; lane j of the row is the j-th value of every
    // block. The lanes' sums run block by block, so each lane adds its values in order k = 0..n
    // (from -0.0, as `Iterator::sum` does), and `means`/`stds` hold the sums until they become
    // the statistics.
    for ((xs, ys), (ms, ss)) in rows.zip(means.chunks_exact_mut(inner).zip(stds.chunks_exact_mut(inner))) {
        ms.fill(-0.0);
        for block in xs.chunks_exact(inner) {
            ms.iter_mut().zip(block).for_each(|(m, v)| *m += v);
        }
        ms.iter_mut().for_each(|m| *m /= nf);
        ss.fill(-0.0);
        for block in xs.chunks_exact(inner) {
            ss.iter_mut().zip(block).zip(ms.iter()).for_each(|((s, v), m)| *s += (v - m).powi(2));
        }
        ss.iter_mut().for_each(|s| *s = (*s / nf + eps).sqrt());
        for ((ys, xs), (g, b)) in ys.chunks_exact_mut(inner).zip(xs.chunks_exact(inner)).zip(gamma.iter().zip(beta)) {
            for (((y, v), m), s) in ys.iter_mut().zip(xs).zip(ms.iter()).zip(ss.iter()) {
                *y = (v - m) / s * g + b;
            }
        }
    }
}

/// `_backward_LayerNorm` over the non-empty (outer, n, inner) data (rows of n * inner): the data gradient `dx`, and
/// gamma's and beta's accumulated into `dgamma`/`dbeta`. The lengths are the caller's to check.
fn layer_norm_backward(
    (g, x, gamma, means, stds): (&[f64], &[f64], &[f64], &[f64], &[f64]),
    (n, inner): (usize, usize),
    (dx, dgamma, dbeta): (&mut [f64], &mut [f64], &mut [f64]),
) {
    let nf = n as f64;
    let rows = g.chunks_exact(n * inner).zip(x.chunks_exact(n * inner)).zip(dx.chunks_exact_mut(n * inner));
    if inner == 1 {
        // Each row is one lane.
        for (((gs, xs), dxs), (&mean, &std)) in rows.zip(means.iter().zip(stds)) {
            let (mut sum_dxhat, mut sum_dxhat_xhat) = (0.0, 0.0);
            for (((g, v), gk), (dg, db)) in gs.iter().zip(xs).zip(gamma).zip(dgamma.iter_mut().zip(dbeta.iter_mut())) {
                let xhat = (v - mean) / std;
                let dxhat = g * gk;
                sum_dxhat += dxhat;
                sum_dxhat_xhat += dxhat * xhat;
                *dg += g * xhat;
                *db += g;
            }
            for (((g, v), gk), d) in gs.iter().zip(xs).zip(gamma).zip(dxs.iter_mut()) {
                let xhat = (v - mean) / std;
                let dxhat = g * gk;
                *d = (dxhat - sum_dxhat / nf - xhat * sum_dxhat_xhat / nf) / std;
            }
        }
        return;
    }
    // As in the forward pass, lane j of a row is the j-th value of each of its n blocks; the
    // lanes' sums and the parameters' gradients accumulate block by block, each in the order
    // (row, lane, k) of one lane at a time.
    let (mut sum_dxhat, mut sum_dxhat_xhat) = (vec![0.0; inner], vec![0.0; inner]);
    for (((gs, xs), dxs), (ms, ss)) in rows.zip(means.chunks_exact(inner).zip(stds.chunks_exact(inner))) {
        sum_dxhat.fill(0.0);
        sum_dxhat_xhat.fill(0.0);
        let blocks = gs.chunks_exact(inner).zip(xs.chunks_exact(inner));
        for (((gb, xb), gk), (dg, db)) in blocks.zip(gamma).zip(dgamma.iter_mut().zip(dbeta.iter_mut())) {
            let lanes = gb.iter().zip(xb).zip(ms.iter().zip(ss)).zip(sum_dxhat.iter_mut().zip(sum_dxhat_xhat.iter_mut()));
            for (((g, v), (mean, std)), (sd, sdx)) in lanes {
                let xhat = (v - mean) / std;
                let dxhat = g * gk;
                *sd += dxhat;
                *sdx += dxhat * xhat;
                *dg += g * xhat;
                *db += g;
            }
        }
        let blocks = gs.chunks_exact(inner).zip(xs.chunks_exact(inner)).zip(dxs.chunks_exact_mut(inner));
        for (((gb, xb), dxb), gk) in blocks.zip(gamma) {
            let lanes = gb.iter().zip(xb).zip(ms.iter().zip(ss)).zip(sum_dxhat.iter().zip(&sum_dxhat_xhat)).zip(dxb.iter_mut());
            for ((((g, v), (mean, std)), (sd, sdx)), d) in lanes {
                let xhat = (v - mean) / std;
                let dxhat = g * gk;
                *d = (dxhat - sd / nf - xhat * sdx / nf) / std;
            }
        }
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
        if let Some((Some(data), params)) = inputs.split_first_mut() {
            let (_, n, _) = self.layout(data)?;
            fill_vectors(params, n);
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, gamma, beta] = exactly("LayerNorm", "input", inputs)?;
        let (_, n, _) = self.layout(data)?;
        for (name, s) in [("gamma", gamma), ("beta", beta)] {
            if s.size() != n || s.ndim() != 1 {
                crate::bail!(Shape, "LayerNorm: {name} has shape {s}, expected ({n},) for data {data}");
            }
        }
        let axis = normalize_axis(self.p.axis, data.ndim())?;
        let mut stats = data.dims().to_vec();
        if let Some(d) = stats.get_mut(axis) {
            *d = 1;
        }
        Ok(vec![data.clone(), Shape::new(stats.clone()), Shape::new(stats)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        const OP: &str = "LayerNorm";
        let (outer, n, inner) = self.layout(args.input_shape(0)?)?;
        let (x, gamma, beta) = (args.input_f64(0)?, args.input_f64(1)?, args.input_f64(2)?);
        check_channels(OP, n, &[("gamma", gamma.as_slice()), ("beta", beta.as_slice())])?;
        if x.len() != outer * n * inner {
            crate::bail!(Runtime, "{OP}: {} data elements for (outer, n, inner) = ({outer}, {n}, {inner})", x.len());
        }
        if x.is_empty() {
            // Nothing to normalize; lanes of no values (n = 0) have the mean and deviation 0/0.
            let nan = vec![f64::NAN; outer * inner];
            args.output_from_f64(1, &nan)?;
            return args.output_from_f64(2, &nan);
        }
        let mut y = vec![0.0; x.len()];
        let (mut means, mut stds) = (vec![0.0; outer * inner], vec![0.0; outer * inner]);
        layer_norm_forward((&x, &gamma, &beta), (n, inner), self.p.eps, (&mut y, &mut means, &mut stds));
        args.output_from_f64(0, &y)?;
        args.output_from_f64(1, &means)?;
        args.output_from_f64(2, &stds)
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
        let [_, data, gamma, _, _] = exactly("_backward_LayerNorm", "input", inputs)?;
        let (outer, n, inner) = self.norm.layout(data)?;
        check_backward_inputs("_backward_LayerNorm", inputs, n, outer * inner)?;
        Ok(vec![data.clone(), gamma.clone(), gamma.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, data, gamma, ..] = inputs else {
            crate::bail!(Type, "_backward_LayerNorm: grad, data and gamma dtypes expected, got {} dtype(s)", inputs.len());
        };
        Ok(vec![data, gamma, gamma])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        const OP: &str = "_backward_LayerNorm";
        let (outer, n, inner) = self.norm.layout(args.input_shape(1)?)?;
        let (g, x, gamma) = (args.input_f64(0)?, args.input_f64(1)?, args.input_f64(2)?);
        let (means, stds) = (args.input_f64(3)?, args.input_f64(4)?);
        check_channels(OP, n, &[("gamma", gamma.as_slice())])?;
        check_channels(OP, outer * inner, &[("mean", means.as_slice()), ("std", stds.as_slice())])?;
        if x.len() != outer * n * inner || g.len() != x.len() {
            crate::bail!(Runtime, "{OP}: {} gradient and {} data elements for (outer, n, inner) = ({outer}, {n}, {inner})", g.len(), x.len());
        }
        let mut dx = vec![0.0; x.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; n], vec![0.0; n]);
        if !x.is_empty() {
            layer_norm_backward((&g, &x, &gamma, &means, &stds), (n, inner), (&mut dx, &mut dgamma, &mut dbeta));
        }
        args.output_from_f64(0, &dx)?;
        args.output_from_f64(1, &dgamma)?;
        args.output_from_f64(2, &dbeta)
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
