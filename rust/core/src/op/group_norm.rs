//! Normalizations over groups of values within each instance: GroupNorm (channel groups, one
//! gamma/beta per group as in MXNet 1.x), InstanceNorm (one group per channel) and
//! L2Normalization (scale by the inverse L2 norm per instance, channel position or channel).

use super::grad::{Grad, InputGrads};
use super::normalization::{to_f64, write_f64};
use super::{ExecContext, OpDef, Operator};
use crate::base::{DType, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct GroupNormParams {
        /// Number of channel groups (the channel count must be a multiple).
        num_groups: usize = 1,
        /// Added to the variance to avoid dividing by zero.
        eps: f64 = 1e-5,
        /// Whether to also output the mean and standard deviation.
        output_mean_var: bool = false,
    }
}

crate::op_params! {
    pub struct InstanceNormParams {
        /// Added to the variance to avoid dividing by zero.
        eps: f64 = 1e-3,
    }
}

/// (batch, groups, values per group) of data (N, C, ...) split into `groups` channel groups.
fn group_layout(op: &str, data: &Shape, groups: usize) -> Result<(usize, usize, usize)> {
    let d = data.dims();
    if d.len() < 2 {
        crate::bail!(Shape, "{op}: data must be at least 2-D (batch, channels, ...), got {data}");
    }
    if op == "InstanceNorm" && d.len() < 3 {
        // Instance statistics are taken over spatial axes, which a 2-D input does not have.
        crate::bail!(Shape, "{op}: data must be at least 3-D (batch, channels, spatial...), got {data}");
    }
    if groups == 0 || !d[1].is_multiple_of(groups) {
        crate::bail!(Shape, "{op}: {} channels cannot be split into {groups} groups", d[1]);
    }
    let blocks = d[0] * groups;
    let per_block = data.size().checked_div(blocks).unwrap_or(0);
    if blocks > 0 && per_block == 0 {
        crate::bail!(Shape, "{op}: data {data} has no elements to normalize in each of its {blocks} (instance, group) blocks");
    }
    Ok((d[0], groups, per_block))
}

/// Normalization of each (instance, group) followed by a per-group scale and shift.
struct GroupNorm {
    name: &'static str,
    /// `None`: one group per channel (InstanceNorm).
    groups: Option<usize>,
    eps: f64,
    visible: usize,
}

impl GroupNorm {
    fn groups(&self, data: &Shape) -> usize {
        self.groups.unwrap_or_else(|| data.dims().get(1).copied().unwrap_or(1))
    }
}

impl Operator for GroupNorm {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "gamma".into(), "beta".into()]
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn num_visible_outputs(&self) -> usize {
        self.visible
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let Some(data) = inputs[0].clone() {
            let (_, groups, _) = group_layout(self.name, &data, self.groups(&data))?;
            for p in &mut inputs[1..] {
                p.get_or_insert_with(|| Shape::new(vec![groups]));
            }
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (n, groups, _) = group_layout(self.name, &inputs[0], self.groups(&inputs[0]))?;
        for (name, s) in ["gamma", "beta"].iter().zip(&inputs[1..]) {
            if s.size() != groups || s.ndim() != 1 {
                crate::bail!(Shape, "{}: {name} has shape {s}, expected ({groups},) for data {}", self.name, inputs[0]);
            }
        }
        let stats = Shape::new(vec![n, groups]);
        Ok(vec![inputs[0].clone(), stats.clone(), stats])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (n, groups, m) = group_layout(self.name, &inputs[0].shape, self.groups(&inputs[0].shape))?;
        if m == 0 {
            // No (instance, group) blocks: every output is empty.
            return Ok(());
        }
        let (x, gamma, beta) = (to_f64(&inputs[0]), to_f64(&inputs[1]), to_f64(&inputs[2]));
        let mut y = vec![0.0; x.len()];
        let (mut means, mut stds) = (vec![0.0; n * groups], vec![0.0; n * groups]);
        for (block, (xs, ys)) in x.chunks_exact(m).zip(y.chunks_exact_mut(m)).enumerate() {
            let g = block % groups;
            let mean = xs.iter().sum::<f64>() / m as f64;
            let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / m as f64;
            let std = (var + self.eps).sqrt();
            for (o, v) in ys.iter_mut().zip(xs) {
                *o = (v - mean) / std * gamma[g] + beta[g];
            }
            means[block] = mean;
            stds[block] = std;
        }
        write_f64(&outputs[0], &y);
        write_f64(&outputs[1], &means);
        write_f64(&outputs[2], &stds);
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x, gamma, mean, std) = (d.out_grad(0), d.input(0), d.input(1), d.output(1), d.output(2));
        let groups = self.groups.map_or("0".to_string(), |g| g.to_string());
        let grads = d.op_outputs("_backward_GroupNorm", &[("num_groups", groups)], &[&g, &x, &gamma, &mean, &std])?;
        Ok(grads.into_iter().map(Some).collect())
    }
}

crate::op_params! {
    pub struct GroupNormBackwardParams {
        /// Channel groups of the forward op (0: one per channel).
        num_groups: usize = 0,
    }
}

/// `_backward_GroupNorm(out_grad, data, gamma, mean, std)` -> (data, gamma, beta gradients).
struct GroupNormBackward {
    groups: Option<usize>,
}

impl Operator for GroupNormBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into(), "gamma".into(), "mean".into(), "std".into()]
    }
    fn num_outputs(&self) -> usize {
        3
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let data = &inputs[1];
        let groups = self.groups.unwrap_or_else(|| data.dims().get(1).copied().unwrap_or(1));
        let (n, groups, _) = group_layout("_backward_GroupNorm", data, groups)?;
        let expected = [data.clone(), data.clone(), Shape::new(vec![groups]), Shape::new(vec![n, groups]), Shape::new(vec![n, groups])];
        for ((name, given), wanted) in self.input_names().iter().zip(inputs).zip(&expected) {
            if given.size() != wanted.size() {
                crate::bail!(Shape, "_backward_GroupNorm: {name} has shape {given}, expected {wanted} for data {data}");
            }
        }
        Ok(vec![inputs[1].clone(), inputs[2].clone(), inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[1]; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let shape = &inputs[1].shape;
        let groups = self.groups.unwrap_or_else(|| shape.dims().get(1).copied().unwrap_or(1));
        let (_, groups, m) = group_layout("_backward_GroupNorm", shape, groups)?;
        if m == 0 {
            // No elements: the data gradient is empty, gamma's and beta's are empty sums.
            write_f64(&outputs[1], &vec![0.0; groups]);
            write_f64(&outputs[2], &vec![0.0; groups]);
            return Ok(());
        }
        let (gy, x, gamma, mean, std) = (to_f64(&inputs[0]), to_f64(&inputs[1]), to_f64(&inputs[2]), to_f64(&inputs[3]), to_f64(&inputs[4]));
        let mut dx = vec![0.0; x.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; groups], vec![0.0; groups]);
        for (block, ((gs, xs), dxs)) in gy.chunks_exact(m).zip(x.chunks_exact(m)).zip(dx.chunks_exact_mut(m)).enumerate() {
            let grp = block % groups;
            let (mu, sigma) = (mean[block], std[block]);
            let (mut sum_dy, mut sum_dy_xhat) = (0.0, 0.0);
            for (&g, &v) in gs.iter().zip(xs) {
                let xhat = (v - mu) / sigma;
                dgamma[grp] += g * xhat;
                dbeta[grp] += g;
                sum_dy += g * gamma[grp];
                sum_dy_xhat += g * gamma[grp] * xhat;
            }
            let (mean_dy, mean_dy_xhat) = (sum_dy / m as f64, sum_dy_xhat / m as f64);
            for ((o, &g), &v) in dxs.iter_mut().zip(gs).zip(xs) {
                let xhat = (v - mu) / sigma;
                *o = (g * gamma[grp] - mean_dy - xhat * mean_dy_xhat) / sigma;
            }
        }
        write_f64(&outputs[0], &dx);
        write_f64(&outputs[1], &dgamma);
        write_f64(&outputs[2], &dbeta);
        Ok(())
    }
}

crate::op_params! {
    pub struct L2NormalizationParams {
        /// Added to the sum of squares to avoid dividing by zero.
        eps: f64 = 1e-10,
        /// What is normalized together.
        mode: L2Mode = L2Mode::Instance,
    }
}

crate::param_choice! {
    /// What L2Normalization normalizes together.
    pub enum L2Mode {
        /// All values of an instance.
        Instance = "instance",
        /// Across channels at each position.
        Channel = "channel",
        /// Across positions within each channel.
        Spatial = "spatial",
    }
}

/// out = data / sqrt(sum(data^2) + eps) over the values `mode` groups together.
#[derive(Clone, Copy)]
struct L2Normalization {
    mode: L2Mode,
    eps: f64,
}

impl L2Normalization {
    /// Group index of each flat position of `shape`.
    fn group_of(&self, shape: &Shape) -> Result<(usize, Vec<usize>)> {
        let d = shape.dims();
        if d.len() < 2 && self.mode != L2Mode::Instance {
            crate::bail!(Shape, "L2Normalization: mode channel/spatial needs at least 2-D data, got {shape}");
        }
        let n = d.first().copied().unwrap_or(1);
        let c = d.get(1).copied().unwrap_or(1);
        let spatial: usize = d.iter().skip(2).product();
        let groups = match self.mode {
            L2Mode::Instance => n,
            L2Mode::Channel => n * spatial,
            L2Mode::Spatial => n * c,
        };
        let index = (0..shape.size())
            .map(|i| {
                let (b, rest) = (i / (c * spatial), i % (c * spatial));
                match self.mode {
                    L2Mode::Instance => b,
                    L2Mode::Channel => b * spatial + rest % spatial,
                    L2Mode::Spatial => b * c + rest / spatial,
                }
            })
            .collect();
        Ok((groups, index))
    }

    fn norms(&self, x: &[f64], groups: usize, index: &[usize]) -> Vec<f64> {
        let mut sums = vec![self.eps; groups];
        for (&v, &g) in x.iter().zip(index) {
            sums[g] += v * v;
        }
        sums.iter().map(|s| s.sqrt()).collect()
    }
}

impl Operator for L2Normalization {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.group_of(&inputs[0])?;
        Ok(vec![inputs[0].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (groups, index) = self.group_of(&inputs[0].shape)?;
        let x = to_f64(&inputs[0]);
        let norms = self.norms(&x, groups, &index);
        let y: Vec<f64> = x.iter().zip(&index).map(|(v, &g)| v / norms[g]).collect();
        write_f64(&outputs[0], &y);
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x) = (d.out_grad(0), d.input(0));
        let attrs = [("eps", format!("{:?}", self.eps)), ("mode", self.mode.name().to_string())];
        Ok(vec![Some(d.op("_backward_L2Normalization", &attrs, &[&g, &x])?)])
    }
}

/// `_backward_L2Normalization(out_grad, data)`: (g - y sum(g y)) / norm per group.
struct L2NormalizationBackward(L2Normalization);

impl Operator for L2NormalizationBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        super::check_out_grad("_backward_L2Normalization", &inputs[0], &inputs[1])?;
        Ok(vec![inputs[1].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (groups, index) = self.0.group_of(&inputs[1].shape)?;
        let (gy, x) = (to_f64(&inputs[0]), to_f64(&inputs[1]));
        let norms = self.0.norms(&x, groups, &index);
        let mut dots = vec![0.0; groups];
        for ((&g, &v), &k) in gy.iter().zip(&x).zip(&index) {
            dots[k] += g * v / norms[k];
        }
        let dx: Vec<f64> = gy.iter().zip(&x).zip(&index).map(|((&g, &v), &k)| (g - v / norms[k] * dots[k]) / norms[k]).collect();
        write_f64(&outputs[0], &dx);
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "GroupNorm",
        &[],
        "Group normalization: statistics per instance and channel group, gamma/beta per group.",
        |p: GroupNormParams| {
            if p.num_groups == 0 {
                crate::bail!(Param, "GroupNorm: num_groups must be positive");
            }
            Ok(GroupNorm { name: "GroupNorm", groups: Some(p.num_groups), eps: p.eps, visible: if p.output_mean_var { 3 } else { 1 } })
        },
    ));
    add(OpDef::new(
        "InstanceNorm",
        &[],
        "Instance normalization: statistics per instance and channel, gamma/beta per channel.",
        |p: InstanceNormParams| Ok(GroupNorm { name: "InstanceNorm", groups: None, eps: p.eps, visible: 1 }),
    ));
    add(OpDef::new("_backward_GroupNorm", &[], "Gradient of GroupNorm and InstanceNorm.", |p: GroupNormBackwardParams| {
        Ok(GroupNormBackward { groups: (p.num_groups > 0).then_some(p.num_groups) })
    }));
    add(OpDef::new(
        "L2Normalization",
        &[],
        "Scales the input by its inverse L2 norm per instance, channel position or channel.",
        |p: L2NormalizationParams| Ok(L2Normalization { mode: p.mode, eps: p.eps }),
    ));
    add(OpDef::new("_backward_L2Normalization", &[], "Gradient of L2Normalization.", |p: L2NormalizationParams| {
        Ok(L2NormalizationBackward(L2Normalization { mode: p.mode, eps: p.eps }))
    }));
}
