//! Loss output layers: SoftmaxOutput, LinearRegressionOutput, LogisticRegressionOutput,
//! MAERegressionOutput and MakeLoss. Their forward passes compute predictions; their gradients
//! are the loss gradients with respect to the data, whatever gradient arrives from above (as in
//! MXNet, where they end a network).

use super::grad::{Grad, InputGrads};
use super::{exactly, parallel_units, ExecContext, OpDef, Operator};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::param_choice! {
    /// What an output layer's gradient is divided by.
    pub enum GradNormalization {
        /// Nothing.
        Null = "null",
        /// The batch size.
        Batch = "batch",
        /// The number of valid (not ignored) labels, or values above `valid_thresh`.
        Valid = "valid",
    }
}

crate::op_params! {
    pub struct SoftmaxOutputParams {
        /// Scales the gradient.
        grad_scale: f64 = 1.0,
        /// Label whose rows take no gradient when use_ignore is set.
        ignore_label: f64 = -1.0,
        /// Softmax over axis 1 of (n, c, d1, ...) with labels (n, d1, ...).
        multi_output: bool = false,
        /// Whether rows labelled ignore_label are ignored.
        use_ignore: bool = false,
        /// Softmax over the last axis, keeping the input's shape.
        preserve_shape: bool = false,
        /// What the gradient is divided by.
        normalization: GradNormalization = GradNormalization::Null,
        /// Multiply the gradient by the incoming output gradient (accepted; must be False).
        out_grad: bool = false,
        /// Label smoothing: the target puts 1 - alpha on the label and spreads alpha.
        smooth_alpha: f64 = 0.0,
    }
}

/// How the softmax axis sits in the data: (outer, classes, inner); labels index (outer, inner).
fn softmax_output_layout(p: &SoftmaxOutputParams, s: &Shape) -> Result<(usize, usize, usize)> {
    let (Some(&first), Some(&last)) = (s.dims().first(), s.dims().last()) else {
        crate::bail!(Shape, "SoftmaxOutput: data must have at least one dimension");
    };
    Ok(if p.preserve_shape {
        (s.size() / last.max(1), last, 1)
    } else if p.multi_output {
        let &[batch, classes, ref rest @ ..] = s.dims() else {
            crate::bail!(Shape, "SoftmaxOutput: multi_output needs data of at least 2 dimensions, got {s}");
        };
        (batch, classes, rest.iter().product())
    } else {
        (first, s.size() / first.max(1), 1)
    })
}

struct SoftmaxOutput {
    p: SoftmaxOutputParams,
}

impl Operator for SoftmaxOutput {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "label".into()]
    }
    /// The probabilities may overwrite the scores (as MXNet's SoftmaxOutput): the classifier's
    /// last layer and its softmax then share one array in a memory plan.
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    /// The label has the data's shape without the class axis (one label per instance).
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let [Some(data), label @ None] = inputs {
            let dims = data.dims();
            let kept: Vec<usize> = if self.p.preserve_shape {
                dims.split_last().map(|(_, init)| init.to_vec()).unwrap_or_default()
            } else if self.p.multi_output && dims.len() > 1 {
                dims.iter().enumerate().filter(|&(axis, _)| axis != 1).map(|(_, &d)| d).collect()
            } else {
                dims.iter().take(1).copied().collect()
            };
            *label = Some(Shape::new(kept));
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, label] = exactly("SoftmaxOutput", "input", inputs)?;
        let (outer, _, inner) = softmax_output_layout(&self.p, data)?;
        if label.size() != outer * inner && label.size() != data.size() {
            crate::bail!(Shape, "SoftmaxOutput: label {label} does not match data {data} (expected {} labels)", outer * inner);
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("SoftmaxOutput", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [data, _] = exactly("SoftmaxOutput", "input", args.inputs())?;
        let [_] = exactly("SoftmaxOutput", "output", args.outputs())?;
        let layout = softmax_output_layout(&self.p, &data.shape)?;
        // In place over the data (the in-place pair) or disjoint from it: both are allowed.
        super::activation::softmax_lanes(args, layout, 1.0, super::activation::SoftmaxKind::Softmax)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (out, label) = (d.output(0), d.input(1));
        let p = &self.p;
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let attrs = [
            ("grad_scale", format!("{:?}", p.grad_scale)),
            ("ignore_label", format!("{:?}", p.ignore_label)),
            ("multi_output", flag(p.multi_output)),
            ("use_ignore", flag(p.use_ignore)),
            ("preserve_shape", flag(p.preserve_shape)),
            ("normalization", p.normalization.name().to_string()),
            ("smooth_alpha", format!("{:?}", p.smooth_alpha)),
        ];
        Ok(vec![Some(d.op("_backward_SoftmaxOutput", &attrs, &[&out, &label])?), None])
    }
}

/// `_backward_SoftmaxOutput(out, label)`: (softmax - target) * grad_scale / normalizer.
struct SoftmaxOutputBackward {
    p: SoftmaxOutputParams,
}

impl Operator for SoftmaxOutputBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out".into(), "label".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [out, _] = exactly("_backward_SoftmaxOutput", "input", inputs)?;
        Ok(vec![out.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[out, _] = exactly("_backward_SoftmaxOutput", "input", inputs)?;
        Ok(vec![out])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let out_shape = args.input_shape(0)?;
        let (outer, c, inner) = softmax_output_layout(&self.p, out_shape)?;
        let labels = args.input_f64(1)?;
        if labels.len() == out_shape.size() {
            crate::bail!(Value, "SoftmaxOutput: probability labels (one per class) are not supported yet; give class indices");
        }
        if labels.len() != outer * inner {
            crate::bail!(Shape, "_backward_SoftmaxOutput: {} labels for output {out_shape} (expected {})", labels.len(), outer * inner);
        }
        let ignored = |l: f64| self.p.use_ignore && l == self.p.ignore_label;
        let valid = labels.iter().filter(|&&l| !ignored(l)).count();
        let normalizer = match self.p.normalization {
            GradNormalization::Batch => outer as f64,
            GradNormalization::Valid => valid.max(1) as f64,
            GradNormalization::Null => 1.0,
        };
        let scale = self.p.grad_scale / normalizer;
        let alpha = self.p.smooth_alpha;
        let off_target = if c > 1 { alpha / (c - 1) as f64 } else { 0.0 };
        // One block of c * inner values per outer index; parallel pieces hold whole blocks.
        let block = (c * inner).max(1);
        let min_blocks = ((1usize << 14) / block).max(1);
        if args.input_dtype(0)? == DType::F32 && inner == 1 {
            // Class rows (the common case): one vectorizable pass per row, then its label's entry.
            let (ys, dxs) = (args.input::<f32>(0)?, args.output::<f32>(0)?);
            let (scale, off_target) = (scale as f32, off_target as f32);
            return parallel_units(dxs, block, min_blocks, |first, piece| {
                for ((dx, y), &label) in piece.chunks_mut(block).zip(ys.chunks(block).skip(first)).zip(labels.iter().skip(first)) {
                    if ignored(label) {
                        dx.fill(0.0);
                        continue;
                    }
                    dx.iter_mut().zip(y).for_each(|(d, &v)| *d = (v - off_target) * scale);
                    let target = label as usize;
                    if target as f64 == label {
                        if let (Some(d), Some(&v)) = (dx.get_mut(target), y.get(target)) {
                            *d = (v - (1.0 - alpha) as f32) * scale;
                        }
                    }
                }
                Ok(())
            });
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (ys, dxs) = (args.input::<T>(0)?, args.output::<T>(0)?);
            parallel_units(dxs, block, min_blocks, |first, piece| {
                let blocks = piece.chunks_mut(block).zip(ys.chunks(block).skip(first)).zip(labels.chunks(inner.max(1)).skip(first));
                for ((dx, y), block_labels) in blocks {
                    // Position j of the block's inner axis: class k at k * inner + j.
                    for (j, &label) in block_labels.iter().enumerate() {
                        let lane = dx.iter_mut().skip(j).step_by(inner.max(1)).zip(y.iter().skip(j).step_by(inner.max(1)));
                        for (k, (d, v)) in lane.enumerate() {
                            let value = if ignored(label) {
                                0.0
                            } else {
                                let target = if k as f64 == label { 1.0 - alpha } else { off_target };
                                (v.to_f64() - target) * scale
                            };
                            *d = T::from_f64(value);
                        }
                    }
                }
                Ok(())
            })
        })
    }
}

crate::op_params! {
    pub struct RegressionOutputParams {
        /// Scales the gradient.
        grad_scale: f64 = 1.0,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Regression {
    Linear,
    Logistic,
    Mae,
}

impl Regression {
    fn parse(name: &str) -> Result<Regression> {
        Ok(match name {
            "linear" => Regression::Linear,
            "logistic" => Regression::Logistic,
            "mae" => Regression::Mae,
            other => crate::bail!(Param, "unknown regression output '{other}'"),
        })
    }
    fn name(self) -> &'static str {
        match self {
            Regression::Linear => "linear",
            Regression::Logistic => "logistic",
            Regression::Mae => "mae",
        }
    }
}

struct RegressionOutput {
    kind: Regression,
    grad_scale: f64,
}

impl Operator for RegressionOutput {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "label".into()]
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let [Some(data), label @ None] = inputs {
            *label = Some(data.clone());
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, label] = exactly("RegressionOutput", "input", inputs)?;
        if label.size() != data.size() {
            crate::bail!(Shape, "{}RegressionOutput: label {label} must have as many elements as data {data}", self.kind.name());
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("RegressionOutput", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let logistic = self.kind == Regression::Logistic;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => super::broadcast::map_args(args, super::PARALLEL_GRAIN, |v: T| {
            if logistic { T::from_f64(1.0 / (1.0 + (-v.to_f64()).exp())) } else { v }
        }))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (out, label) = (d.output(0), d.input(1));
        let attrs = [("kind", self.kind.name().to_string()), ("grad_scale", format!("{:?}", self.grad_scale))];
        Ok(vec![Some(d.op("_backward_RegressionOutput", &attrs, &[&out, &label])?), None])
    }
}

crate::op_params! {
    pub struct RegressionBackwardParams {
        /// 'linear', 'logistic' or 'mae'.
        kind: String,
        /// Scales the gradient.
        grad_scale: f64 = 1.0,
    }
}

/// `_backward_RegressionOutput(out, label)`: (out - label), or its sign for MAE, times
/// grad_scale divided by the number of outputs per example.
struct RegressionBackward {
    kind: Regression,
    grad_scale: f64,
}

impl Operator for RegressionBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out".into(), "label".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [out, _] = exactly("_backward_RegressionOutput", "input", inputs)?;
        Ok(vec![out.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[out, _] = exactly("_backward_RegressionOutput", "input", inputs)?;
        Ok(vec![out])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let out_shape = args.input_shape(0)?;
        let rows = out_shape.dims().first().copied().unwrap_or(1).max(1);
        let scale = self.grad_scale / (out_shape.size() / rows).max(1) as f64;
        let labels = args.input_f64(1)?;
        let mae = self.kind == Regression::Mae;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (y, dx) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if labels.len() != y.len() {
                crate::bail!(Shape, "_backward_RegressionOutput: {} labels for {} outputs", labels.len(), y.len());
            }
            for ((d, &v), &label) in dx.iter_mut().zip(y).zip(&labels) {
                let diff = v.to_f64() - label;
                *d = T::from_f64(scale * if mae { diff.signum() * (diff != 0.0) as i32 as f64 } else { diff });
            }
        });
        Ok(())
    }
}

crate::op_params! {
    pub struct MakeLossParams {
        /// Scales the gradient.
        grad_scale: f64 = 1.0,
        /// Elements at or below this count as invalid for 'valid' normalization.
        valid_thresh: f64 = 0.0,
        /// What the gradient is divided by.
        normalization: GradNormalization = GradNormalization::Null,
    }
}

/// MakeLoss: the data is the loss; its gradient is grad_scale (normalized) everywhere.
struct MakeLoss {
    p: MakeLossParams,
}

impl Operator for MakeLoss {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("MakeLoss", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        super::shape_ops::copy_args(args)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let x = d.input(0);
        let attrs = [
            ("grad_scale", format!("{:?}", self.p.grad_scale)),
            ("valid_thresh", format!("{:?}", self.p.valid_thresh)),
            ("normalization", self.p.normalization.name().to_string()),
        ];
        Ok(vec![Some(d.op("_backward_MakeLoss", &attrs, &[&x])?)])
    }
}

/// `_backward_MakeLoss(data)`: grad_scale divided by the normalizer, shaped like data.
struct MakeLossBackward {
    p: MakeLossParams,
}

impl Operator for MakeLossBackward {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("_backward_MakeLoss", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let values = args.input_f64(0)?;
        let normalizer = match self.p.normalization {
            GradNormalization::Batch => args.input_shape(0)?.dims().first().copied().unwrap_or(1).max(1) as f64,
            GradNormalization::Valid => values.iter().filter(|&&v| v > self.p.valid_thresh).count().max(1) as f64,
            GradNormalization::Null => 1.0,
        };
        let value = self.p.grad_scale / normalizer;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            args.output::<T>(0)?.iter_mut().for_each(|v| *v = T::from_f64(value));
        });
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "SoftmaxOutput",
        &["Softmax"],
        "Softmax with a cross-entropy gradient against integer labels (a network's output layer).",
        |p: SoftmaxOutputParams| {
            if p.out_grad {
                crate::bail!(Param, "SoftmaxOutput: out_grad=True is not supported");
            }
            Ok(SoftmaxOutput { p })
        },
    ));
    add(OpDef::new("_backward_SoftmaxOutput", &[], "Gradient of SoftmaxOutput.", |p: SoftmaxOutputParams| Ok(SoftmaxOutputBackward { p })));
    for (name, kind, doc) in [
        ("LinearRegressionOutput", Regression::Linear, "Identity output with a squared-error gradient (out - label)."),
        ("LogisticRegressionOutput", Regression::Logistic, "Sigmoid output with a logistic-loss gradient (out - label)."),
        ("MAERegressionOutput", Regression::Mae, "Identity output with an absolute-error gradient sign(out - label)."),
    ] {
        add(OpDef::new(name, &[], doc, move |p: RegressionOutputParams| Ok(RegressionOutput { kind, grad_scale: p.grad_scale })));
    }
    add(OpDef::new("_backward_RegressionOutput", &[], "Gradient of the regression output layers.", |p: RegressionBackwardParams| {
        Ok(RegressionBackward { kind: Regression::parse(&p.kind)?, grad_scale: p.grad_scale })
    }));
    add(OpDef::new("MakeLoss", &["make_loss"], "Marks its input as a loss: the gradient is grad_scale, normalized.", |p: MakeLossParams| {
        Ok(MakeLoss { p })
    }));
    add(OpDef::new("_backward_MakeLoss", &[], "Gradient of MakeLoss.", |p: MakeLossParams| Ok(MakeLossBackward { p })));
}
