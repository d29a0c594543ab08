//! Normalizations over groups of values within each instance: GroupNorm (channel groups, one
//! gamma/beta per group as in MXNet 1.x), InstanceNorm (one group per channel),
//! L2Normalization (scale by the inverse L2 norm per instance, channel position or channel) and
//! LRN (local response normalization across nearby channels).

use super::grad::{Grad, InputGrads};
use super::{exactly, ExecContext, OpDef, Operator};
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
    let &[batch, channels, ref spatial @ ..] = data.dims() else {
        crate::bail!(Shape, "{op}: data must be at least 2-D (batch, channels, ...), got {data}");
    };
    if op == "InstanceNorm" && spatial.is_empty() {
        // Instance statistics are taken over spatial axes, which a 2-D input does not have.
        crate::bail!(Shape, "{op}: data must be at least 3-D (batch, channels, spatial...), got {data}");
    }
    if groups == 0 || !channels.is_multiple_of(groups) {
        crate::bail!(Shape, "{op}: {channels} channels cannot be split into {groups} groups");
    }
    let blocks = batch * groups;
    let per_block = data.size().checked_div(blocks).unwrap_or(0);
    if blocks > 0 && per_block == 0 {
        crate::bail!(Shape, "{op}: data {data} has no elements to normalize in each of its {blocks} (instance, group) blocks");
    }
    Ok((batch, groups, per_block))
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
        if let Some((Some(data), params)) = inputs.split_first_mut() {
            let (_, groups, _) = group_layout(self.name, data, self.groups(data))?;
            for p in params {
                p.get_or_insert_with(|| Shape::new(vec![groups]));
            }
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, gamma, beta] = exactly(self.name, "input", inputs)?;
        let (n, groups, _) = group_layout(self.name, data, self.groups(data))?;
        for (name, s) in [("gamma", gamma), ("beta", beta)] {
            if s.size() != groups || s.ndim() != 1 {
                crate::bail!(Shape, "{}: {name} has shape {s}, expected ({groups},) for data {data}", self.name);
            }
        }
        let stats = Shape::new(vec![n, groups]);
        Ok(vec![data.clone(), stats.clone(), stats])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _, _] = exactly(self.name, "input", inputs)?;
        Ok(vec![data; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let data = args.input_shape(0)?;
        let (n, groups, m) = group_layout(self.name, data, self.groups(data))?;
        if m == 0 {
            // No (instance, group) blocks: every output is empty.
            return Ok(());
        }
        let (x, gamma, beta) = (args.input_f64(0)?, args.input_f64(1)?, args.input_f64(2)?);
        let mut y = vec![0.0; x.len()];
        let (mut means, mut stds) = (vec![0.0; n * groups], vec![0.0; n * groups]);
        // Blocks run (instance, group) in order, so the groups' parameters repeat per instance.
        let blocks = x.chunks_exact(m).zip(y.chunks_exact_mut(m)).zip(gamma.iter().zip(&beta).cycle()).zip(means.iter_mut().zip(stds.iter_mut()));
        for (((xs, ys), (&scale, &shift)), (mean_out, std_out)) in blocks {
            let mean = xs.iter().sum::<f64>() / m as f64;
            let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / m as f64;
            let std = (var + self.eps).sqrt();
            for (o, v) in ys.iter_mut().zip(xs) {
                *o = (v - mean) / std * scale + shift;
            }
            (*mean_out, *std_out) = (mean, std);
        }
        args.output_from_f64(0, &y)?;
        args.output_from_f64(1, &means)?;
        args.output_from_f64(2, &stds)
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
        let [_, data, gamma, _, _] = exactly("_backward_GroupNorm", "input", inputs)?;
        let groups = self.groups.unwrap_or_else(|| data.dims().get(1).copied().unwrap_or(1));
        let (n, groups, _) = group_layout("_backward_GroupNorm", data, groups)?;
        let expected = [data.clone(), data.clone(), Shape::new(vec![groups]), Shape::new(vec![n, groups]), Shape::new(vec![n, groups])];
        for ((name, given), wanted) in self.input_names().iter().zip(inputs).zip(&expected) {
            if given.size() != wanted.size() {
                crate::bail!(Shape, "_backward_GroupNorm: {name} has shape {given}, expected {wanted} for data {data}");
            }
        }
        Ok(vec![data.clone(), gamma.clone(), gamma.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, data, _, _, _] = exactly("_backward_GroupNorm", "input", inputs)?;
        Ok(vec![data; 3])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let shape = args.input_shape(1)?;
        let groups = self.groups.unwrap_or_else(|| shape.dims().get(1).copied().unwrap_or(1));
        let (_, groups, m) = group_layout("_backward_GroupNorm", shape, groups)?;
        if m == 0 {
            // No elements: the data gradient is empty, gamma's and beta's are empty sums.
            args.output_from_f64(1, &vec![0.0; groups])?;
            return args.output_from_f64(2, &vec![0.0; groups]);
        }
        let (gy, x, gamma, mean, std) = (args.input_f64(0)?, args.input_f64(1)?, args.input_f64(2)?, args.input_f64(3)?, args.input_f64(4)?);
        let mut dx = vec![0.0; x.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; groups], vec![0.0; groups]);
        let blocks = gy.chunks_exact(m).zip(x.chunks_exact(m)).zip(dx.chunks_exact_mut(m)).zip(mean.iter().zip(&std));
        for (block, (((gs, xs), dxs), (&mu, &sigma))) in blocks.enumerate() {
            let grp = block % groups;
            let scale = gamma.get(grp).copied().unwrap_or(0.0);
            let (mut sum_dy, mut sum_dy_xhat, mut block_dgamma, mut block_dbeta) = (0.0, 0.0, 0.0, 0.0);
            for (&g, &v) in gs.iter().zip(xs) {
                let xhat = (v - mu) / sigma;
                block_dgamma += g * xhat;
                block_dbeta += g;
                sum_dy += g * scale;
                sum_dy_xhat += g * scale * xhat;
            }
            if let (Some(dg), Some(db)) = (dgamma.get_mut(grp), dbeta.get_mut(grp)) {
                *dg += block_dgamma;
                *db += block_dbeta;
            }
            let (mean_dy, mean_dy_xhat) = (sum_dy / m as f64, sum_dy_xhat / m as f64);
            for ((o, &g), &v) in dxs.iter_mut().zip(gs).zip(xs) {
                let xhat = (v - mu) / sigma;
                *o = (g * scale - mean_dy - xhat * mean_dy_xhat) / sigma;
            }
        }
        args.output_from_f64(0, &dx)?;
        args.output_from_f64(1, &dgamma)?;
        args.output_from_f64(2, &dbeta)
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
            if let Some(sum) = sums.get_mut(g) {
                *sum += v * v;
            }
        }
        sums.iter().map(|s| s.sqrt()).collect()
    }
}

impl Operator for L2Normalization {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("L2Normalization", "input", inputs)?;
        self.group_of(x)?;
        Ok(vec![x.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (groups, index) = self.group_of(args.input_shape(0)?)?;
        let x = args.input_f64(0)?;
        let norms = self.norms(&x, groups, &index);
        let norm_of = |g: usize| norms.get(g).copied().unwrap_or(1.0);
        let y: Vec<f64> = x.iter().zip(&index).map(|(v, &g)| v / norm_of(g)).collect();
        args.output_from_f64(0, &y)
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
        let [out_grad, data] = exactly("_backward_L2Normalization", "input", inputs)?;
        super::check_out_grad("_backward_L2Normalization", out_grad, data)?;
        Ok(vec![data.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (groups, index) = self.0.group_of(args.input_shape(1)?)?;
        let (gy, x) = (args.input_f64(0)?, args.input_f64(1)?);
        let norms = self.0.norms(&x, groups, &index);
        let norm_of = |k: usize| norms.get(k).copied().unwrap_or(1.0);
        let mut dots = vec![0.0; groups];
        for ((&g, &v), &k) in gy.iter().zip(&x).zip(&index) {
            if let Some(dot) = dots.get_mut(k) {
                *dot += g * v / norm_of(k);
            }
        }
        let dot_of = |k: usize| dots.get(k).copied().unwrap_or(0.0);
        let dx: Vec<f64> = gy.iter().zip(&x).zip(&index).map(|((&g, &v), &k)| (g - v / norm_of(k) * dot_of(k)) / norm_of(k)).collect();
        args.output_from_f64(0, &dx)
    }
}

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
