//! Loss output layers: SoftmaxOutput, LinearRegressionOutput, LogisticRegressionOutput,
//! MAERegressionOutput and MakeLoss. Their forward passes compute predictions; their gradients
//! are the loss gradients with respect to the data, whatever gradient arrives from above (as in
//! MXNet, where they end a network).

use super::grad::{Grad, InputGrads};
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr};
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
    let d = s.dims();
    if d.is_empty() {
        crate::bail!(Shape, "SoftmaxOutput: data must have at least one dimension");
    }
    Ok(if p.preserve_shape {
        let c = d[d.len() - 1];
        (s.size() / c.max(1), c, 1)
    } else if p.multi_output {
        if d.len() < 2 {
            crate::bail!(Shape, "SoftmaxOutput: multi_output needs data of at least 2 dimensions, got {s}");
        }
        (d[0], d[1], d[2..].iter().product())
    } else {
        (d[0], s.size() / d[0].max(1), 1)
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
        if let (Some(data), None) = (&inputs[0], &inputs[1]) {
            let dims = data.dims();
            let label = if self.p.preserve_shape {
                dims[..dims.len().saturating_sub(1)].to_vec()
            } else if self.p.multi_output && dims.len() > 1 {
                [&dims[..1], &dims[2..]].concat()
            } else {
                dims[..dims.len().min(1)].to_vec()
            };
            inputs[1] = Some(Shape::new(label));
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let (outer, _, inner) = softmax_output_layout(&self.p, &inputs[0])?;
        if inputs[1].size() != outer * inner && inputs[1].size() != inputs[0].size() {
            crate::bail!(Shape, "SoftmaxOutput: label {} does not match data {} (expected {} labels)", inputs[1], inputs[0], outer * inner);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let layout = softmax_output_layout(&self.p, &inputs[0].shape)?;
        // In place over the data (the in-place pair) or disjoint from it: both are allowed.
        super::activation::softmax_lanes(&inputs[0], &outputs[0], layout, 1.0, super::activation::SoftmaxKind::Softmax);
        Ok(())
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
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (outer, c, inner) = softmax_output_layout(&self.p, &inputs[0].shape)?;
        let labels: Vec<f64> = crate::dispatch_dtype!(inputs[1].dtype, L => {
            args.input::<L>(1)?.iter().map(|v| v.to_f64()).collect()
        });
        if labels.len() == inputs[0].size() {
            crate::bail!(Value, "SoftmaxOutput: probability labels (one per class) are not supported yet; give class indices");
        }
        if labels.len() != outer * inner {
            crate::bail!(Shape, "_backward_SoftmaxOutput: {} labels for output {} (expected {})", labels.len(), inputs[0].shape, outer * inner);
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
        let block = c * inner;
        if inputs[0].dtype == DType::F32 && inner == 1 {
            // Class rows (the common case): one vectorizable pass per row, then its label's entry.
            let (yp, dxp) = (SendPtr(inputs[0].ptr::<f32>()), SendPtr(outputs[0].ptr::<f32>()));
            let (scale, off_target) = (scale as f32, off_target as f32);
            parallel_chunks(outer, ((1usize << 14) / c.max(1)).max(1), |rows| {
                for (o, &label) in rows.clone().zip(&labels[rows]) {
                    // SAFETY: row o (c elements) lies inside both arrays; out is only read, and
                    // this task alone writes row o of the gradient (no in-place pair).
                    let (y, dx) =
                        unsafe { (std::slice::from_raw_parts(yp.get().add(o * c), c), std::slice::from_raw_parts_mut(dxp.get().add(o * c), c)) };
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
            });
            return Ok(());
        }
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let (yp, dxp) = (SendPtr(inputs[0].ptr::<T>()), SendPtr(outputs[0].ptr::<T>()));
            parallel_chunks(outer, ((1usize << 14) / block.max(1)).max(1), |blocks| {
                for o in blocks {
                    // SAFETY: block o (c * inner elements) lies inside both arrays; out is only
                    // read, and this task alone writes block o of the gradient (no in-place pair).
                    let (y, dx) = unsafe {
                        (std::slice::from_raw_parts(yp.get().add(o * block), block), std::slice::from_raw_parts_mut(dxp.get().add(o * block), block))
                    };
                    for (j, &label) in labels[o * inner..(o + 1) * inner].iter().enumerate() {
                        for k in 0..c {
                            let value = if ignored(label) {
                                0.0
                            } else {
                                let target = if k as f64 == label { 1.0 - alpha } else { off_target };
                                (y[k * inner + j].to_f64() - target) * scale
                            };
                            dx[k * inner + j] = T::from_f64(value);
                        }
                    }
                }
            });
        });
        Ok(())
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
        if let (Some(data), None) = (inputs[0].clone(), &inputs[1]) {
            inputs[1] = Some(data);
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if inputs[1].size() != inputs[0].size() {
            crate::bail!(Shape, "{}RegressionOutput: label {} must have as many elements as data {}", self.kind.name(), inputs[1], inputs[0]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
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
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (out, label) = (&inputs[0], &inputs[1]);
        let rows = out.shape.dims().first().copied().unwrap_or(1).max(1);
        let scale = self.grad_scale / (out.size() / rows).max(1) as f64;
        let labels: Vec<f64> = crate::dispatch_dtype!(label.dtype, L => {
            // SAFETY: labels are an input this op does not write.
            unsafe { label.slice::<L>() }.iter().map(|v| v.to_f64()).collect()
        });
        let mae = self.kind == Regression::Mae;
        crate::dispatch_dtype!(out.dtype, T => {
            // SAFETY: out is read-only here; the gradient output is this op's alone.
            let (y, dx) = unsafe { (out.slice::<T>(), outputs[0].slice_mut::<T>()) };
            for (i, (d, &v)) in dx.iter_mut().zip(y).enumerate() {
                let diff = v.to_f64() - labels[i];
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
        Ok(vec![inputs[0].clone()])
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
        Ok(vec![inputs[0].clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let x = &inputs[0];
        let values: Vec<f64> = crate::dispatch_dtype!(x.dtype, T => {
            // SAFETY: data is an input this op does not write.
            unsafe { x.slice::<T>() }.iter().map(|v| v.to_f64()).collect()
        });
        let normalizer = match self.p.normalization {
            GradNormalization::Batch => x.shape.dims().first().copied().unwrap_or(1).max(1) as f64,
            GradNormalization::Valid => values.iter().filter(|&&v| v > self.p.valid_thresh).count().max(1) as f64,
            GradNormalization::Null => 1.0,
        };
        let value = self.p.grad_scale / normalizer;
        crate::dispatch_dtype!(outputs[0].dtype, T => {
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
