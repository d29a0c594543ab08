//! Loss operators: `smooth_l1` (element-wise Huber) and `softmax_cross_entropy` (summed
//! cross-entropy of softmax against integer labels), with their gradient kernels.

use super::broadcast::{map_args, zip_args};
use super::grad::{Grad, InputGrads};
use super::{exactly, ExecContext, OpDef, Operator};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    /// `is_int` is accepted for compatibility only.
    #[allow(dead_code)]
    pub struct SmoothL1Params {
        /// sigma: the quadratic part covers |x| < 1 / sigma^2.
        scalar: f64 = 1.0,
        /// Accepted for compatibility with MXNet's scalar operators.
        is_int: bool = true,
    }
}

/// smooth_l1(x) = 0.5 (sigma x)^2 where |x| < 1/sigma^2, |x| - 0.5/sigma^2 elsewhere.
struct SmoothL1 {
    sigma2: f64,
}

impl SmoothL1 {
    fn value(&self, x: f64) -> f64 {
        if x.abs() < 1.0 / self.sigma2 {
            0.5 * self.sigma2 * x * x
        } else {
            x.abs() - 0.5 / self.sigma2
        }
    }
    fn slope(&self, x: f64) -> f64 {
        if x.abs() < 1.0 / self.sigma2 {
            self.sigma2 * x
        } else {
            x.signum()
        }
    }
}

impl Operator for SmoothL1 {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("smooth_l1", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        crate::dispatch_dtype!(args.input_dtype(0)?, T => map_args(args, super::PARALLEL_GRAIN, |x: T| T::from_f64(self.value(x.to_f64()))))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x) = (d.out_grad(0), d.input(0));
        let sigma = self.sigma2.sqrt();
        Ok(vec![Some(d.op("_backward_smooth_l1", &[("scalar", format!("{sigma:?}"))], &[&g, &x])?)])
    }
}

/// `_backward_smooth_l1(out_grad, data)`: out_grad times smooth_l1's slope at data.
struct SmoothL1Backward(SmoothL1);

impl Operator for SmoothL1Backward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [out_grad, data] = exactly("_backward_smooth_l1", "input", inputs)?;
        super::check_out_grad("_backward_smooth_l1", out_grad, data)?;
        Ok(vec![data.clone()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        crate::dispatch_dtype!(args.input_dtype(1)?, T => {
            zip_args(args, |g: T, x: T| T::from_f64(g.to_f64() * self.0.slope(x.to_f64())))
        })
    }
}

/// softmax_cross_entropy(data (n, k), label (n,)) -> (1,): the sum over the batch of
/// -log softmax(data)[label].
struct SoftmaxCrossEntropy;

fn batch_layout(op: &str, data: &Shape, label: &Shape) -> Result<(usize, usize)> {
    let [n, k] = data.dims() else {
        crate::bail!(Shape, "{op}: data must be 2-D (batch, classes), got {data}");
    };
    if label.size() != *n {
        crate::bail!(Shape, "{op}: label {label} must hold one class index per row of data {data}");
    }
    if *k == 0 && *n > 0 {
        crate::bail!(Shape, "{op}: data {data} has no classes for its labels to name");
    }
    Ok((*n, *k))
}

/// Log-softmax of each row, in f64.
fn log_softmax_rows<T: Elem>(x: &[T], n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * k];
    for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(k)) {
        let max = row.iter().map(|v| v.to_f64()).fold(f64::NEG_INFINITY, f64::max);
        let log_sum = row.iter().map(|v| (v.to_f64() - max).exp()).sum::<f64>().ln() + max;
        for (o, v) in o.iter_mut().zip(row) {
            *o = v.to_f64() - log_sum;
        }
    }
    out
}

fn class_index(op: &str, label: f64, k: usize) -> Result<usize> {
    if !(label >= 0.0 && (label as usize) < k) {
        crate::bail!(Index, "{op}: label {label} is not a class index in [0, {k})");
    }
    Ok(label as usize)
}

impl Operator for SoftmaxCrossEntropy {
    fn input_names(&self) -> Vec<String> {
        vec!["data".into(), "label".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [data, label] = exactly("softmax_cross_entropy", "input", inputs)?;
        batch_layout("softmax_cross_entropy", data, label)?;
        Ok(vec![Shape::new(vec![1])])
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let [Some(data), label @ None] = inputs {
            *label = Some(Shape::new(vec![data.dims().first().copied().unwrap_or(1)]));
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[data, _] = exactly("softmax_cross_entropy", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "softmax_cross_entropy";
        let (n, k) = batch_layout(op, args.input_shape(0)?, args.input_shape(1)?)?;
        let labels = args.input_f64(1)?;
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let x = args.input::<T>(0)?;
            let [y] = args.output::<T>(0)? else {
                crate::bail!(Runtime, "{op}: the output must hold one value");
            };
            let logp = log_softmax_rows(x, n, k);
            let mut total = 0.0;
            for (row, &l) in logp.chunks_exact(k.max(1)).zip(&labels) {
                total -= row.get(class_index(op, l, k)?).copied().unwrap_or(0.0);
            }
            *y = T::from_f64(total);
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, x, label) = (d.out_grad(0), d.input(0), d.input(1));
        Ok(vec![Some(d.op("_backward_softmax_cross_entropy", &[], &[&g, &x, &label])?), None])
    }
}

/// `_backward_softmax_cross_entropy(out_grad, data, label)`: out_grad (softmax(data) - onehot).
struct SoftmaxCrossEntropyBackward;

impl Operator for SoftmaxCrossEntropyBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["out_grad".into(), "data".into(), "label".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let op = "_backward_softmax_cross_entropy";
        let [out_grad, data, label] = exactly(op, "input", inputs)?;
        batch_layout(op, data, label)?;
        super::check_out_grad(op, out_grad, &Shape::new(vec![1]))?;
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[_, data, _] = exactly("_backward_softmax_cross_entropy", "input", inputs)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let op = "_backward_softmax_cross_entropy";
        let (n, k) = batch_layout(op, args.input_shape(1)?, args.input_shape(2)?)?;
        let labels = args.input_f64(2)?;
        crate::dispatch_dtype!(args.input_dtype(1)?, T => {
            let (x, dx) = (args.input::<T>(1)?, args.output::<T>(0)?);
            let [g] = args.input::<T>(0)? else {
                crate::bail!(Runtime, "{op}: the output gradient must hold one value");
            };
            let scale = g.to_f64();
            let logp = log_softmax_rows(x, n, k);
            for (row, (lp, &l)) in dx.chunks_exact_mut(k.max(1)).zip(logp.chunks_exact(k.max(1)).zip(&labels)) {
                for (o, lp) in row.iter_mut().zip(lp) {
                    *o = T::from_f64(scale * lp.exp());
                }
                if let Some(o) = row.get_mut(class_index(op, l, k)?) {
                    *o = T::from_f64(o.to_f64() - scale);
                }
            }
        });
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "smooth_l1",
        &[],
        "Smooth L1 (Huber) loss element-wise: 0.5 (sigma x)^2 near zero, |x| - 0.5/sigma^2 beyond.",
        |p: SmoothL1Params| {
            if p.scalar <= 0.0 {
                crate::bail!(Param, "smooth_l1: scalar (sigma) must be positive, got {}", p.scalar);
            }
            Ok(SmoothL1 { sigma2: p.scalar * p.scalar })
        },
    ));
    add(OpDef::new("_backward_smooth_l1", &[], "Gradient of smooth_l1.", |p: SmoothL1Params| {
        Ok(SmoothL1Backward(SmoothL1 { sigma2: p.scalar * p.scalar }))
    }));
    add(OpDef::new(
        "softmax_cross_entropy",
        &[],
        "Sum over the batch of the cross-entropy of softmax(data) against integer labels.",
        |_: super::params::NoParams| Ok(SoftmaxCrossEntropy),
    ));
    add(OpDef::new("_backward_softmax_cross_entropy", &[], "Gradient of softmax_cross_entropy.", |_: super::params::NoParams| {
        Ok(SoftmaxCrossEntropyBackward)
    }));
}
