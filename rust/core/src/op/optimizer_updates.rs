//! Fused optimizer updates used by `mx.optimizer`: one pass over each weight that reads its
//! gradient, updates the optimizer states in place and writes the new weight (MXNet's update
//! rules and hyper-parameters: rescale_grad, clip_gradient, wd, lr).

use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor, PARALLEL_GRAIN};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;

/// The new weight from the weight, the (raw) gradient and the states, updating the states.
type Rule = Box<dyn Fn(f64, f64, &mut [f64]) -> f64 + Send + Sync>;

/// Rescale, then clip when `clip >= 0` (MXNet's clip_gradient convention).
#[inline(always)]
fn rescaled(grad: f64, rescale: f64, clip: f64) -> f64 {
    let g = grad * rescale;
    if clip >= 0.0 {
        g.clamp(-clip, clip)
    } else {
        g
    }
}

/// One weight's update: inputs (weight, grad, states...), states updated in place.
struct Update {
    name: &'static str,
    states: &'static [&'static str],
    rule: Rule,
}

/// Apply `rule` to one (weight, grad, states) group, writing the new weight into `out`.
fn apply_rule(name: &str, rule: &Rule, weight: &Tensor, grad: &Tensor, states: &[Tensor], out: &Tensor) -> Result<()> {
    if let Some(bad) = std::iter::once(grad).chain(states).chain(std::iter::once(out)).find(|t| t.size() != weight.size()) {
        crate::bail!(Shape, "{name}: every array must have the weight's {} elements, got {}", weight.shape, bad.shape);
    }
    let n = weight.size();
    crate::dispatch_dtype!(weight.dtype, T => {
        let (wp, gp, op) = (SendPtr(weight.ptr::<T>()), SendPtr(grad.ptr::<T>()), SendPtr(out.ptr::<T>()));
        let sp: Vec<SendPtr<T>> = states.iter().map(|s| SendPtr(s.ptr::<T>())).collect();
        parallel_chunks(n, PARALLEL_GRAIN, |range| {
            let mut buf = vec![0f64; sp.len()];
            for i in range {
                // SAFETY: i < n for every array (checked above); states and the output are
                // mutated in place by this op alone, each index by exactly one task.
                unsafe {
                    for (b, s) in buf.iter_mut().zip(&sp) {
                        *b = (*s.get().add(i)).to_f64();
                    }
                    let w = rule((*wp.get().add(i)).to_f64(), (*gp.get().add(i)).to_f64(), &mut buf);
                    for (b, s) in buf.iter().zip(&sp) {
                        *s.get().add(i) = T::from_f64(*b);
                    }
                    *op.get().add(i) = T::from_f64(w);
                }
            }
        });
    });
    Ok(())
}

impl Operator for Update {
    fn input_names(&self) -> Vec<String> {
        ["weight", "grad"].iter().chain(self.states).map(|s| s.to_string()).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if let Some(bad) = inputs.iter().find(|s| s.size() != inputs[0].size()) {
            crate::bail!(Shape, "{}: weight {}, gradient and states must have one shape, got {bad}", self.name, inputs[0]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        super::same_dtype(inputs, 1)
    }
    fn inplace_pairs(&self) -> &'static [(usize, usize)] {
        &[(0, 0)]
    }
    fn mutated_inputs(&self) -> &'static [usize] {
        &[2, 3, 4, 5][..self.states.len()]
    }
    fn forward(&self, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        apply_rule(self.name, &self.rule, &inputs[0], &inputs[1], &inputs[2..], &outputs[0])
    }
}

crate::op_params! {
    /// Some parameters are accepted for compatibility only (see their docs).
    #[allow(dead_code)]
    pub struct SgdParams {
        /// Learning rate.
        lr: f64,
        /// Weight decay.
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the rescaled gradient to [-clip_gradient, clip_gradient]; negative disables.
        clip_gradient: f64 = -1.0,
        /// Update only rows with gradients for sparse gradients (accepted; dense here).
        lazy_update: bool = true,
    }
}

crate::op_params! {
    /// Some parameters are accepted for compatibility only (see their docs).
    #[allow(dead_code)]
    pub struct SgdMomParams {
        /// Learning rate.
        lr: f64,
        /// Momentum.
        momentum: f64 = 0.0,
        /// Weight decay.
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the rescaled gradient; negative disables.
        clip_gradient: f64 = -1.0,
        /// Accepted for compatibility (dense updates).
        lazy_update: bool = true,
    }
}

crate::op_params! {
    /// lazy_update is accepted for compatibility only (updates are dense).
    #[allow(dead_code)]
    pub struct AdamParams {
        /// Learning rate (bias correction is folded into it by the optimizer).
        lr: f64,
        /// Decay rate of the first moment.
        beta1: f64 = 0.9,
        /// Decay rate of the second moment.
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Weight decay (added to the gradient).
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradient; negative disables.
        clip_gradient: f64 = -1.0,
        /// Accepted for compatibility (dense updates).
        lazy_update: bool = true,
    }
}

crate::op_params! {
    pub struct RmspropParams {
        /// Learning rate.
        lr: f64,
        /// Decay rate of the squared-gradient average.
        gamma1: f64 = 0.95,
        /// Momentum of the update (rmspropalex only).
        gamma2: f64 = 0.9,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Weight decay.
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradient; negative disables.
        clip_gradient: f64 = -1.0,
        /// Clip the weights to [-clip_weights, clip_weights]; negative disables.
        clip_weights: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct FtrlParams {
        /// Learning rate.
        lr: f64,
        /// L1 regularization strength.
        lamda1: f64 = 0.01,
        /// Per-coordinate learning-rate parameter.
        beta: f64 = 1.0,
        /// Weight decay (L2).
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradient; negative disables.
        clip_gradient: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct SignumParams {
        /// Learning rate.
        lr: f64,
        /// Momentum.
        momentum: f64 = 0.0,
        /// Weight decay.
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradient; negative disables.
        clip_gradient: f64 = -1.0,
        /// Decoupled weight decay applied to the weight directly.
        wd_lh: f64 = 0.0,
    }
}

fn clip_weight(w: f64, clip: f64) -> f64 {
    if clip >= 0.0 {
        w.clamp(-clip, clip)
    } else {
        w
    }
}

fn update(name: &'static str, states: &'static [&'static str], rule: impl Fn(f64, f64, &mut [f64]) -> f64 + Send + Sync + 'static) -> Update {
    Update { name, states, rule: Box::new(rule) }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("sgd_update", &[], "SGD: weight = weight - lr * (rescale_grad * grad (clipped) + wd * weight).", |p: SgdParams| {
        Ok(update("sgd_update", &[], move |w, g, _| w - p.lr * (rescaled(g, p.rescale_grad, p.clip_gradient) + p.wd * w)))
    }));
    add(OpDef::new("sgd_mom_update", &[], "SGD with momentum: mom = momentum * mom - lr * (grad + wd * weight); weight += mom.", |p: SgdMomParams| {
        Ok(update("sgd_mom_update", &["mom"], move |w, g, s| {
            s[0] = p.momentum * s[0] - p.lr * p.wd * w - p.lr * rescaled(g, p.rescale_grad, p.clip_gradient);
            w + s[0]
        }))
    }));
    add(OpDef::new("nag_mom_update", &[], "Nesterov accelerated gradient with momentum.", |p: SgdMomParams| {
        Ok(update("nag_mom_update", &["mom"], move |w, g, s| {
            let g = rescaled(g, p.rescale_grad, p.clip_gradient) + p.wd * w;
            s[0] = p.momentum * s[0] + g;
            w - p.lr * (g + p.momentum * s[0])
        }))
    }));
    add(OpDef::new("adam_update", &[], "Adam: moving first and second moments; weight -= lr * mean / (sqrt(var) + epsilon).", |p: AdamParams| {
        Ok(update("adam_update", &["mean", "var"], move |w, g, s| {
            let g = {
                let g = g * p.rescale_grad + p.wd * w;
                if p.clip_gradient >= 0.0 { g.clamp(-p.clip_gradient, p.clip_gradient) } else { g }
            };
            s[0] = p.beta1 * s[0] + (1.0 - p.beta1) * g;
            s[1] = p.beta2 * s[1] + (1.0 - p.beta2) * g * g;
            w - p.lr * s[0] / (s[1].sqrt() + p.epsilon)
        }))
    }));
    add(OpDef::new("rmsprop_update", &[], "RMSProp (Tieleman and Hinton).", |p: RmspropParams| {
        Ok(update("rmsprop_update", &["n"], move |w, g, s| {
            let g = {
                let g = g * p.rescale_grad + p.wd * w;
                if p.clip_gradient >= 0.0 { g.clamp(-p.clip_gradient, p.clip_gradient) } else { g }
            };
            s[0] = (1.0 - p.gamma1) * g * g + p.gamma1 * s[0];
            clip_weight(w - p.lr * g / (s[0] + p.epsilon).sqrt(), p.clip_weights)
        }))
    }));
    add(OpDef::new("rmspropalex_update", &[], "RMSProp with momentum (Graves).", |p: RmspropParams| {
        Ok(update("rmspropalex_update", &["n", "g", "delta"], move |w, g, s| {
            let g = {
                let g = g * p.rescale_grad + p.wd * w;
                if p.clip_gradient >= 0.0 { g.clamp(-p.clip_gradient, p.clip_gradient) } else { g }
            };
            s[0] = (1.0 - p.gamma1) * g * g + p.gamma1 * s[0];
            s[1] = (1.0 - p.gamma1) * g + p.gamma1 * s[1];
            s[2] = p.gamma2 * s[2] - p.lr * g / (s[0] - s[1] * s[1] + p.epsilon).sqrt();
            clip_weight(w + s[2], p.clip_weights)
        }))
    }));
    add(OpDef::new("ftrl_update", &[], "Follow the regularized leader (FTRL-proximal).", |p: FtrlParams| {
        Ok(update("ftrl_update", &["z", "n"], move |w, g, s| {
            let g = rescaled(g, p.rescale_grad, p.clip_gradient);
            s[0] += g - ((s[1] + g * g).sqrt() - s[1].sqrt()) * w / p.lr;
            s[1] += g * g;
            if s[0].abs() > p.lamda1 {
                (s[0].signum() * p.lamda1 - s[0]) / ((p.beta + s[1].sqrt()) / p.lr + p.wd)
            } else {
                0.0
            }
        }))
    }));
    add(OpDef::new("signsgd_update", &[], "signSGD: weight = (1 - lr * wd) * weight - lr * sign(grad).", |p: SgdParams| {
        Ok(update("signsgd_update", &[], move |w, g, _| (1.0 - p.lr * p.wd) * w - p.lr * rescaled(g, p.rescale_grad, p.clip_gradient).signum() * (g != 0.0) as i32 as f64))
    }));
    add(OpDef::new("signum_update", &[], "Signum: SGD on the sign of the momentum.", |p: SignumParams| {
        Ok(update("signum_update", &["mom"], move |w, g, s| {
            s[0] = p.momentum * s[0] - (1.0 - p.momentum) * (p.wd * w + rescaled(g, p.rescale_grad, p.clip_gradient));
            let sign = if s[0] > 0.0 { 1.0 } else if s[0] < 0.0 { -1.0 } else { 0.0 };
            (1.0 - p.lr * p.wd_lh) * w + p.lr * sign
        }))
    }));
}
