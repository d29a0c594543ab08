//! Fused optimizer updates used by `mx.optimizer`: one pass over each weight that reads its
//! gradient, updates the optimizer states in place and writes the new weight (MXNet's update
//! rules and hyper-parameters: rescale_grad, clip_gradient, wd, lr). Multi-precision (`mp_`)
//! forms update a float32 master copy of a lower-precision weight; `multi_` forms update many
//! weights, each with its own lr and wd, in one operator call.

use super::broadcast::{map_into, zip_args, zip_into, Operand};
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor, PARALLEL_GRAIN};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// Hyper-parameters that vary per weight (`multi_` forms) or per call (a rescale array input).
#[derive(Clone, Copy, Debug)]
struct Hyper {
    lr: f64,
    wd: f64,
    rescale: f64,
    /// AdamW's learning-rate schedule multiplier (1 for the other rules).
    eta: f64,
}

/// The new weight (or, for LAMB's first phase, the update direction) from the weight, the raw
/// gradient and the states, updating the states. Monomorphized per rule so the element loop
/// inlines it.
trait Rule: Fn(&Hyper, f64, f64, &mut [f64]) -> f64 + Send + Sync + 'static {}
impl<R: Fn(&Hyper, f64, f64, &mut [f64]) -> f64 + Send + Sync + 'static> Rule for R {}

/// Most states any rule keeps per element (rmspropalex: n, g, delta).
const MAX_STATES: usize = 3;

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

/// How an update operator lays out its inputs: per weight, (weight, grad, states...,
/// [float32 master weight]), repeated for every weight, then [a rescale_grad array] or
/// [the lrs and wds arrays] (the `preloaded_` forms, whose rates are computed on the device).
#[derive(Clone, Debug)]
struct Layout {
    states: &'static [&'static str],
    master: bool,
    weights: usize,
    rescale_input: bool,
    preloaded_rates: bool,
}

impl Layout {
    fn per_weight(&self) -> usize {
        2 + self.states.len() + usize::from(self.master)
    }
    fn input_count(&self) -> usize {
        self.per_weight() * self.weights + usize::from(self.rescale_input) + 2 * usize::from(self.preloaded_rates)
    }
    fn input_names(&self) -> Vec<String> {
        let mut base: Vec<&str> = vec!["weight", "grad"];
        base.extend(self.states);
        if self.master {
            base.push("weight32");
        }
        let mut names: Vec<String> = if self.weights == 1 {
            base.iter().map(|s| s.to_string()).collect()
        } else {
            (0..self.weights).flat_map(|i| base.iter().map(move |s| format!("{s}_{i}"))).collect()
        };
        if self.rescale_input {
            names.push("rescale_grad".into());
        }
        if self.preloaded_rates {
            names.push("lrs".into());
            names.push("wds".into());
        }
        names
    }
    /// Every output is written over its weight; states and master weights are updated in place.
    fn inplace_pairs(&self) -> Vec<(usize, usize)> {
        (0..self.weights).map(|i| (i * self.per_weight(), i)).collect()
    }
    fn mutated(&self) -> Vec<usize> {
        (0..self.weights).flat_map(|i| (2..self.per_weight()).map(move |k| i * self.per_weight() + k)).collect()
    }
}

/// A fused update: `rule` applied to every weight of the layout.
struct Update<R> {
    name: &'static str,
    layout: Layout,
    hyper: Vec<Hyper>,
    rule: R,
    pairs: Vec<(usize, usize)>,
    mutated: Vec<usize>,
    /// The output is an update direction, not the new weight: the master weight is only read,
    /// and a multi-precision direction is float32.
    direction: bool,
    /// The rule as CUDA C with its constants, for the GPU kernel (rules without one run on cpu
    /// contexts only).
    gpu_rule: Option<(&'static str, [f64; 4])>,
}

impl<R: Rule> Update<R> {
    fn new(name: &'static str, layout: Layout, hyper: Vec<Hyper>, rule: R) -> Update<R> {
        let (pairs, mutated) = (layout.inplace_pairs(), layout.mutated());
        Update { name, layout, hyper, rule, pairs, mutated, direction: false, gpu_rule: None }
    }
    /// The same rule as CUDA C (see `kernel_source::update_kernel`), `constants` as `c0..c3`.
    fn on_gpu(mut self, rule: &'static str, constants: [f64; 4]) -> Self {
        self.gpu_rule = Some((rule, constants));
        self
    }
    /// An update whose output is a new array rather than the weight (LAMB's first phase
    /// returns the update direction and leaves the weight alone).
    fn not_in_place(mut self) -> Self {
        self.pairs.clear();
        self.direction = true;
        self
    }
}

/// Apply `rule` to one weight's (weight, grad, states, master) group, writing `out` (element
/// type `O`). `write_master`: the result is the new weight, stored into the master copy too.
#[allow(clippy::too_many_arguments)]
fn apply_rule<W: Elem, S: Elem, O: Elem>(
    rule: &impl Rule,
    h: &Hyper,
    weight: &Tensor,
    grad: &Tensor,
    states: &[Tensor],
    master: Option<&Tensor>,
    write_master: bool,
    out: &Tensor,
) {
    // The state count is a constant inside the element loop, so that the loop vectorizes.
    match states.len() {
        0 => apply_rule_with::<W, S, O, 0>(rule, h, weight, grad, states, master, write_master, out),
        1 => apply_rule_with::<W, S, O, 1>(rule, h, weight, grad, states, master, write_master, out),
        2 => apply_rule_with::<W, S, O, 2>(rule, h, weight, grad, states, master, write_master, out),
        _ => apply_rule_with::<W, S, O, MAX_STATES>(rule, h, weight, grad, states, master, write_master, out),
    }
}

/// The arrays of one update, as pointers shared by the tasks that each update one index range.
struct UpdateArrays<W, S, O, const N: usize> {
    weight: SendPtr<W>,
    grad: SendPtr<W>,
    out: SendPtr<O>,
    states: [SendPtr<S>; N],
    master: Option<SendPtr<S>>,
    write_master: bool,
}

#[allow(clippy::too_many_arguments)]
fn apply_rule_with<W: Elem, S: Elem, O: Elem, const N: usize>(
    rule: &impl Rule,
    h: &Hyper,
    weight: &Tensor,
    grad: &Tensor,
    states: &[Tensor],
    master: Option<&Tensor>,
    write_master: bool,
    out: &Tensor,
) {
    let arrays = UpdateArrays::<W, S, O, N> {
        weight: SendPtr(weight.ptr::<W>()),
        grad: SendPtr(grad.ptr::<W>()),
        out: SendPtr(out.ptr::<O>()),
        states: std::array::from_fn(|k| SendPtr(states[k].ptr::<S>())),
        master: master.map(|m| SendPtr(m.ptr::<S>())),
        write_master,
    };
    parallel_chunks(weight.size(), PARALLEL_GRAIN, |range| {
        // SAFETY: see `update_range`.
        super::simd::vectorized(
            #[inline(always)]
            || unsafe { update_range(rule, h, &arrays, range) },
        )
    });
}

/// Updates the indices `range`.
///
/// # Safety
/// Every array holds `range.end` elements or more (checked by infer_shape and `check`); the
/// states, master and output are written by this op alone, each index by exactly one task, and an
/// output aliasing the weight (or the master copy) is written only after its block was loaded.
#[inline(always)]
unsafe fn update_range<W: Elem, S: Elem, O: Elem, const N: usize>(
    rule: &impl Rule,
    h: &Hyper,
    a: &UpdateArrays<W, S, O, N>,
    range: std::ops::Range<usize>,
) {
    // Each block is staged through local arrays: loaded from the operands, updated, stored back.
    // The output is usually the weight itself and the states are written too, so computing
    // through the raw pointers would make every store a possible alias of every later load and
    // keep the loop scalar (4.5x slower on a 784x256 sgd_update); local arrays cannot alias. The
    // hyper-parameters are copied for the same reason.
    const STAGE: usize = 256;
    let hyper = *h;
    let h = &hyper;
    let (mut weights, mut grads, mut news) = ([0f64; STAGE], [0f64; STAGE], [0f64; STAGE]);
    let mut states = [[0f64; STAGE]; N];
    for start in range.clone().step_by(STAGE) {
        let len = STAGE.min(range.end - start);
        let load = |dst: &mut [f64; STAGE], src: *const W| {
            for (o, d) in dst[..len].iter_mut().enumerate() {
                *d = (*src.add(start + o)).to_f64();
            }
        };
        match a.master {
            // Multi-precision updates read the float32 master copy of the weight.
            Some(m) => {
                for (o, d) in weights[..len].iter_mut().enumerate() {
                    *d = (*m.get().add(start + o)).to_f64();
                }
            }
            None => load(&mut weights, a.weight.get()),
        }
        load(&mut grads, a.grad.get());
        for k in 0..N {
            for (o, d) in states[k][..len].iter_mut().enumerate() {
                *d = (*a.states[k].get().add(start + o)).to_f64();
            }
        }
        for o in 0..len {
            let mut state = [0f64; N];
            for k in 0..N {
                state[k] = states[k][o];
            }
            news[o] = rule(h, weights[o], grads[o], &mut state);
            for k in 0..N {
                states[k][o] = state[k];
            }
        }
        for k in 0..N {
            for (o, &v) in states[k][..len].iter().enumerate() {
                *a.states[k].get().add(start + o) = S::from_f64(v);
            }
        }
        if let (Some(m), true) = (a.master, a.write_master) {
            for (o, &v) in news[..len].iter().enumerate() {
                *m.get().add(start + o) = S::from_f64(v);
            }
        }
        for (o, &v) in news[..len].iter().enumerate() {
            *a.out.get().add(start + o) = O::from_f64(v);
        }
    }
}

impl<R: Rule> Operator for Update<R> {
    fn input_names(&self) -> Vec<String> {
        self.layout.input_names()
    }
    // Counted rather than taken from input_names: every call checks it, and a multi-weight
    // update has dozens of generated names.
    fn num_inputs(&self) -> usize {
        self.layout.input_count()
    }
    fn num_outputs(&self) -> usize {
        self.layout.weights
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let per = self.layout.per_weight();
        let mut outs = Vec::with_capacity(self.layout.weights);
        for group in inputs[..per * self.layout.weights].chunks(per) {
            if let Some(bad) = group.iter().find(|s| s.size() != group[0].size()) {
                crate::bail!(Shape, "{}: weight {}, gradient and states must have one shape, got {bad}", self.name, group[0]);
            }
            outs.push(group[0].clone());
        }
        if self.layout.rescale_input && inputs[inputs.len() - 1].size() != 1 {
            crate::bail!(Shape, "{}: rescale_grad must hold one value, got shape {}", self.name, inputs[inputs.len() - 1]);
        }
        if self.layout.preloaded_rates {
            for (name, shape) in ["lrs", "wds"].iter().zip(&inputs[inputs.len() - 2..]) {
                if shape.size() != self.layout.weights {
                    crate::bail!(Shape, "{}: {name} must hold one value per weight ({}), got shape {shape}", self.name, self.layout.weights);
                }
            }
        }
        Ok(outs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let per = self.layout.per_weight();
        let mut outs = Vec::with_capacity(self.layout.weights);
        for group in inputs[..per * self.layout.weights].chunks(per) {
            let weight = group[0];
            let state = if self.layout.master { DType::F32 } else { weight };
            if group[1] != weight {
                crate::bail!(Type, "{}: gradient is {} but the weight is {weight}", self.name, group[1]);
            }
            if let Some(bad) = group[2..].iter().find(|&&d| d != state) {
                crate::bail!(Type, "{}: states{} must be {state}, got {bad}", self.name, if self.layout.master { " and weight32" } else { "" });
            }
            outs.push(if self.direction { state } else { weight });
        }
        Ok(outs)
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &self.pairs
    }
    fn mutated_inputs(&self) -> &[usize] {
        &self.mutated
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let per = self.layout.per_weight();
        let rescale = if self.layout.rescale_input {
            let t = &inputs[inputs.len() - 1];
            let value = super::normalization::to_f64(t)[0];
            if value == 0.0 || !value.is_finite() {
                // MXNet skips the step (a dynamic loss scaler found an overflow).
                for (i, out) in outputs.iter().enumerate() {
                    if !std::ptr::eq(out.raw(), inputs[i * per].raw()) {
                        // SAFETY: this kernel holds the weight for reading and its output for
                        // writing, separate memory (checked just above), and touches neither
                        // while the cast runs.
                        unsafe { super::shape_ops::cast_into(&inputs[i * per], out) }?;
                    }
                }
                return Ok(());
            }
            Some(value)
        } else {
            None
        };
        let preloaded = if self.layout.preloaded_rates {
            Some((super::normalization::to_f64(&inputs[inputs.len() - 2]), super::normalization::to_f64(&inputs[inputs.len() - 1])))
        } else {
            None
        };
        let write_master = !self.direction;
        for (i, out) in outputs.iter().enumerate() {
            let group = &inputs[i * per..(i + 1) * per];
            let (states, master) = if self.layout.master { (&group[2..per - 1], Some(&group[per - 1])) } else { (&group[2..], None) };
            let mut h = self.hyper[i];
            if let Some(r) = rescale {
                h.rescale = r;
            }
            if let Some((lrs, wds)) = &preloaded {
                h.lr = lrs[i];
                h.wd = wds[i];
            }
            crate::dispatch_dtype!(group[0].dtype, [F32, F64, F16, BF16], W => {
                match (self.layout.master, self.direction) {
                    (true, true) => apply_rule::<W, f32, f32>(&self.rule, &h, &group[0], &group[1], states, master, write_master, out),
                    (true, false) => apply_rule::<W, f32, W>(&self.rule, &h, &group[0], &group[1], states, master, write_master, out),
                    (false, _) => apply_rule::<W, W, W>(&self.rule, &h, &group[0], &group[1], states, master, write_master, out),
                }
            }, other => crate::bail!(Type, "optimizer updates need floating-point weights, got {other}"));
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let Some((rule, constants)) = self.gpu_rule else {
            crate::bail!(Device, "{} has no GPU kernel yet (it runs on cpu contexts)", self.name);
        };
        if self.layout.rescale_input || self.layout.preloaded_rates {
            crate::bail!(Device, "{}: rates or rescale factors held in arrays are not supported on GPUs yet", self.name);
        }
        if let Some(bad) = inputs.iter().find(|t| !t.dtype.is_float()) {
            crate::bail!(Type, "optimizer updates need floating-point weights, got {}", bad.dtype);
        }
        let per = self.layout.per_weight();
        for (i, out) in outputs.iter().enumerate() {
            let group = &inputs[i * per..(i + 1) * per];
            let (states, master) = if self.layout.master { (&group[2..per - 1], Some(&group[per - 1])) } else { (&group[2..], None) };
            let h = self.hyper[i];
            let arrays = crate::backend::cuda::kernels::UpdateArrays {
                weight: &group[0],
                grad: &group[1],
                states,
                master,
                out,
                lr: h.lr,
                wd: h.wd,
                rescale: h.rescale,
            };
            crate::backend::cuda::kernels::update(gpu, rule, constants, arrays, !self.direction)?;
        }
        Ok(())
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

crate::op_params! {
    pub struct AdamWParams {
        /// Learning rate.
        lr: f64,
        /// Decay rate of the first moment.
        beta1: f64 = 0.9,
        /// Decay rate of the second moment.
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Decoupled weight decay.
        wd: f64 = 0.0,
        /// Learning-rate schedule multiplier.
        eta: f64,
        /// Clip the rescaled gradient; negative disables.
        clip_gradient: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct LambPhase1Params {
        /// Decay rate of the first moment.
        beta1: f64 = 0.9,
        /// Decay rate of the second moment.
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-6,
        /// Number of updates so far (bias correction).
        t: usize,
        /// Whether the moments are bias-corrected.
        bias_correction: bool = true,
        /// Weight decay.
        wd: f64,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the rescaled gradient; negative disables.
        clip_gradient: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct LambPhase2Params {
        /// Learning rate.
        lr: f64,
        /// Lower limit of the weight norm r1 (not applied when <= 0).
        lower_bound: f64 = -1.0,
        /// Upper limit of the weight norm r1 (not applied when <= 0).
        upper_bound: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct MultiSgdParams {
        /// Learning rate of every weight.
        lrs: Vec<f64>,
        /// Weight decay of every weight.
        wds: Vec<f64>,
        /// Momentum (the `_mom_` forms).
        momentum: f64 = 0.0,
        /// Factor the gradients are multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the rescaled gradients; negative disables.
        clip_gradient: f64 = -1.0,
        /// Number of weights updated.
        num_weights: usize = 1,
    }
}

crate::op_params! {
    pub struct MultiAdamParams {
        /// Learning rate of every weight (bias correction folded in by the optimizer).
        lrs: Vec<f64>,
        /// Weight decay of every weight (added to the gradient).
        wds: Vec<f64>,
        /// Decay rate of the first moment.
        beta1: f64 = 0.9,
        /// Decay rate of the second moment.
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Factor the gradients are multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradients; negative disables.
        clip_gradient: f64 = -1.0,
        /// Number of weights updated.
        num_weights: usize = 1,
    }
}

crate::op_params! {
    pub struct MultiAdamWParams {
        /// Learning rate of every weight.
        lrs: Vec<f64>,
        /// Decoupled weight decay of every weight.
        wds: Vec<f64>,
        /// Learning-rate schedule multiplier of every weight.
        etas: Vec<f64>,
        /// Decay rate of the first moment.
        beta1: f64 = 0.9,
        /// Decay rate of the second moment.
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Clip the rescaled gradients; negative disables.
        clip_gradient: f64 = -1.0,
        /// Number of weights updated.
        num_weights: usize = 1,
    }
}

crate::op_params! {
    pub struct PreloadedMultiSgdParams {
        /// Momentum (the `_mom_` forms).
        momentum: f64 = 0.0,
        /// Factor the gradients are multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the rescaled gradients; negative disables.
        clip_gradient: f64 = -1.0,
        /// Number of weights updated.
        num_weights: usize = 1,
    }
}

crate::op_params! {
    pub struct FtmlParams {
        /// Learning rate.
        lr: f64,
        /// Decay rate of the first moment (z).
        beta1: f64 = 0.6,
        /// Decay rate of the second moment (v).
        beta2: f64 = 0.999,
        /// Small constant for numerical stability.
        epsilon: f64 = 1e-8,
        /// Number of updates so far (bias correction).
        t: usize,
        /// Weight decay (added to the gradient).
        wd: f64 = 0.0,
        /// Factor the gradient is multiplied by first.
        rescale_grad: f64 = 1.0,
        /// Clip the gradient (after weight decay); negative disables.
        clip_grad: f64 = -1.0,
    }
}

crate::op_params! {
    pub struct MultiSumSqParams {
        /// Number of input arrays.
        num_arrays: usize,
    }
}

crate::op_params! {
    pub struct MultiLarsParams {
        /// LARS coefficient.
        eta: f64,
        /// Added to the denominator.
        eps: f64,
        /// Factor the gradients were to be multiplied by (scales the gradient norms).
        rescale_grad: f64 = 1.0,
    }
}

fn single(states: &'static [&'static str], master: bool) -> Layout {
    Layout { states, master, weights: 1, rescale_input: false, preloaded_rates: false }
}

fn hyper(lr: f64, wd: f64, rescale: f64) -> Vec<Hyper> {
    vec![Hyper { lr, wd, rescale, eta: 1.0 }]
}

/// [`sgd_rule`] in CUDA C; c0 is the clip bound.
const SGD_CUDA: &str = "w_new = w - lr * (ox_rescaled(g, rescale, c0) + wd * w);";
/// [`sgd_mom_rule`] in CUDA C; c0 is the momentum, c1 the clip bound.
const SGD_MOM_CUDA: &str = "s0 = c0 * s0 - lr * wd * w - lr * ox_rescaled(g, rescale, c1); w_new = w + s0;";
/// [`nag_mom_rule`] in CUDA C; c0 is the momentum, c1 the clip bound.
const NAG_MOM_CUDA: &str = "double step = lr * (ox_rescaled(g, rescale, c1) + wd * w); s0 = c0 * s0 - step; w_new = w + c0 * s0 - step;";
/// adam_update's rule in CUDA C; c0..c3 are beta1, beta2, epsilon and the clip bound.
const ADAM_CUDA: &str = "double gr = g * rescale + wd * w; if (c3 >= 0) gr = fmin(fmax(gr, -c3), c3); \
                         s0 = c0 * s0 + (1 - c0) * gr; s1 = c1 * s1 + (1 - c1) * gr * gr; w_new = w - lr * s0 / (sqrt(s1) + c2);";

fn sgd_rule(clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, _: &mut [f64]| w - h.lr * (rescaled(g, h.rescale, clip) + h.wd * w)
}

fn sgd_mom_rule(momentum: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
        s[0] = momentum * s[0] - h.lr * h.wd * w - h.lr * rescaled(g, h.rescale, clip);
        w + s[0]
    }
}

/// MXNet's kernel form: the momentum holds lr-scaled steps (as sgd_mom_update's does), and the
/// weight moves by the look-ahead momentum * mom - lr * g.
fn nag_mom_rule(momentum: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
        let step = h.lr * (rescaled(g, h.rescale, clip) + h.wd * w);
        s[0] = momentum * s[0] - step;
        w + momentum * s[0] - step
    }
}

/// adam_update's rule: the weight decay joins the gradient before clipping.
fn adam_rule(beta1: f64, beta2: f64, epsilon: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
        let g = {
            let g = g * h.rescale + h.wd * w;
            if clip >= 0.0 {
                g.clamp(-clip, clip)
            } else {
                g
            }
        };
        s[0] = beta1 * s[0] + (1.0 - beta1) * g;
        s[1] = beta2 * s[1] + (1.0 - beta2) * g * g;
        w - h.lr * s[0] / (s[1].sqrt() + epsilon)
    }
}

/// AdamW's rule (decoupled weight decay), with `eta` per weight in [`Hyper`].
fn adamw_rule(beta1: f64, beta2: f64, epsilon: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
        let g = rescaled(g, h.rescale, clip);
        s[0] = beta1 * s[0] + (1.0 - beta1) * g;
        s[1] = beta2 * s[1] + (1.0 - beta2) * g * g;
        w - h.eta * (h.lr * s[0] / (s[1].sqrt() + epsilon) + h.wd * w)
    }
}

/// One [`Hyper`] per weight of a `multi_` form, from its per-weight lrs and wds.
fn per_weight(name: &str, n: usize, lrs: &[f64], wds: &[f64], rescale: f64) -> Result<Vec<Hyper>> {
    if n == 0 || lrs.len() != n || wds.len() != n {
        crate::bail!(Param, "{name}: lrs ({}) and wds ({}) need one value per weight (num_weights = {n})", lrs.len(), wds.len());
    }
    Ok(lrs.iter().zip(wds).map(|(&lr, &wd)| Hyper { lr, wd, rescale, eta: 1.0 }).collect())
}

/// The `multi_` forms: `states` per weight, lrs and wds per weight.
fn multi(name: &'static str, p: &MultiSgdParams, states: &'static [&'static str], master: bool) -> Result<(Layout, Vec<Hyper>)> {
    let n = p.num_weights;
    let hyper = per_weight(name, n, &p.lrs, &p.wds, p.rescale_grad)?;
    Ok((Layout { states, master, weights: n, rescale_input: false, preloaded_rates: false }, hyper))
}

/// The `multi_` Adam forms: (weight, grad, mean, var[, weight32]) per weight.
fn multi_adam(name: &'static str, p: &MultiAdamParams, master: bool) -> Result<Update<impl Rule>> {
    let n = p.num_weights;
    let hyper = per_weight(name, n, &p.lrs, &p.wds, p.rescale_grad)?;
    let layout = Layout { states: &["mean", "var"], master, weights: n, rescale_input: false, preloaded_rates: false };
    Ok(Update::new(name, layout, hyper, adam_rule(p.beta1, p.beta2, p.epsilon, p.clip_gradient))
        .on_gpu(ADAM_CUDA, [p.beta1, p.beta2, p.epsilon, p.clip_gradient]))
}

/// MXNet's `_multi_adamw_update` forms: lrs, wds and etas per weight, the rescale factor as the
/// last input array.
fn multi_adamw(name: &'static str, p: &MultiAdamWParams, master: bool) -> Result<Update<impl Rule>> {
    let n = p.num_weights;
    if p.etas.len() != n {
        crate::bail!(Param, "{name}: etas ({}) needs one value per weight (num_weights = {n})", p.etas.len());
    }
    let mut hyper = per_weight(name, n, &p.lrs, &p.wds, 1.0)?;
    for (h, &eta) in hyper.iter_mut().zip(&p.etas) {
        h.eta = eta;
    }
    let layout = Layout { states: &["mean", "var"], master, weights: n, rescale_input: true, preloaded_rates: false };
    Ok(Update::new(name, layout, hyper, adamw_rule(p.beta1, p.beta2, p.epsilon, p.clip_gradient)))
}

/// The `preloaded_multi_` forms: lrs and wds come as the last two input arrays.
fn preloaded(p: &PreloadedMultiSgdParams, states: &'static [&'static str], master: bool) -> (Layout, Vec<Hyper>) {
    let hyper = vec![Hyper { lr: 0.0, wd: 0.0, rescale: p.rescale_grad, eta: 1.0 }; p.num_weights];
    (Layout { states, master, weights: p.num_weights, rescale_input: false, preloaded_rates: true }, hyper)
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("sgd_update", &[], "SGD: weight = weight - lr * (rescale_grad * grad (clipped) + wd * weight).", |p: SgdParams| {
        Ok(Update::new("sgd_update", single(&[], false), hyper(p.lr, p.wd, p.rescale_grad), sgd_rule(p.clip_gradient))
            .on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
    }));
    add(OpDef::new("mp_sgd_update", &[], "sgd_update on a float32 master copy (weight32) of a lower-precision weight.", |p: SgdParams| {
        Ok(Update::new("mp_sgd_update", single(&[], true), hyper(p.lr, p.wd, p.rescale_grad), sgd_rule(p.clip_gradient))
            .on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
    }));
    add(OpDef::new(
        "sgd_mom_update",
        &[],
        "SGD with momentum: mom = momentum * mom - lr * (grad + wd * weight); weight += mom.",
        |p: SgdMomParams| {
            Ok(Update::new("sgd_mom_update", single(&["mom"], false), hyper(p.lr, p.wd, p.rescale_grad), sgd_mom_rule(p.momentum, p.clip_gradient))
                .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
        },
    ));
    add(OpDef::new(
        "mp_sgd_mom_update",
        &[],
        "sgd_mom_update on a float32 master copy (weight32) of a lower-precision weight.",
        |p: SgdMomParams| {
            Ok(Update::new("mp_sgd_mom_update", single(&["mom"], true), hyper(p.lr, p.wd, p.rescale_grad), sgd_mom_rule(p.momentum, p.clip_gradient))
                .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
        },
    ));
    add(OpDef::new("nag_mom_update", &[], "Nesterov accelerated gradient with momentum.", |p: SgdMomParams| {
        Ok(Update::new("nag_mom_update", single(&["mom"], false), hyper(p.lr, p.wd, p.rescale_grad), nag_mom_rule(p.momentum, p.clip_gradient))
            .on_gpu(NAG_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
    }));
    add(OpDef::new(
        "mp_nag_mom_update",
        &[],
        "nag_mom_update on a float32 master copy (weight32) of a lower-precision weight.",
        |p: SgdMomParams| {
            Ok(Update::new("mp_nag_mom_update", single(&["mom"], true), hyper(p.lr, p.wd, p.rescale_grad), nag_mom_rule(p.momentum, p.clip_gradient))
                .on_gpu(NAG_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
        },
    ));
    add(OpDef::new("multi_sgd_update", &[], "sgd_update of num_weights (weight, grad) pairs, each with its own lr and wd.", |p: MultiSgdParams| {
        let (layout, hyper) = multi("multi_sgd_update", &p, &[], false)?;
        Ok(Update::new("multi_sgd_update", layout, hyper, sgd_rule(p.clip_gradient)).on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
    }));
    add(OpDef::new("multi_mp_sgd_update", &[], "mp_sgd_update of num_weights (weight, grad, weight32) groups.", |p: MultiSgdParams| {
        let (layout, hyper) = multi("multi_mp_sgd_update", &p, &[], true)?;
        Ok(Update::new("multi_mp_sgd_update", layout, hyper, sgd_rule(p.clip_gradient)).on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
    }));
    add(OpDef::new("multi_sgd_mom_update", &[], "sgd_mom_update of num_weights (weight, grad, mom) groups.", |p: MultiSgdParams| {
        let (layout, hyper) = multi("multi_sgd_mom_update", &p, &["mom"], false)?;
        Ok(Update::new("multi_sgd_mom_update", layout, hyper, sgd_mom_rule(p.momentum, p.clip_gradient))
            .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
    }));
    add(OpDef::new("multi_mp_sgd_mom_update", &[], "mp_sgd_mom_update of num_weights (weight, grad, mom, weight32) groups.", |p: MultiSgdParams| {
        let (layout, hyper) = multi("multi_mp_sgd_mom_update", &p, &["mom"], true)?;
        Ok(Update::new("multi_mp_sgd_mom_update", layout, hyper, sgd_mom_rule(p.momentum, p.clip_gradient))
            .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
    }));
    add(OpDef::new("adam_update", &[], "Adam: moving first and second moments; weight -= lr * mean / (sqrt(var) + epsilon).", |p: AdamParams| {
        let (beta1, beta2, epsilon, clip) = (p.beta1, p.beta2, p.epsilon, p.clip_gradient);
        Ok(Update::new("adam_update", single(&["mean", "var"], false), hyper(p.lr, p.wd, p.rescale_grad), adam_rule(beta1, beta2, epsilon, clip))
            .on_gpu(ADAM_CUDA, [beta1, beta2, epsilon, clip]))
    }));
    add(OpDef::new(
        "multi_adam_update",
        &[],
        "adam_update of num_weights (weight, grad, mean, var) groups, each with its own lr and wd (oxnet's: MXNet 1.x updates Adam's weights one by one).",
        |p: MultiAdamParams| multi_adam("multi_adam_update", &p, false),
    ));
    add(OpDef::new(
        "multi_mp_adam_update",
        &[],
        "multi_adam_update on float32 master copies: num_weights (weight, grad, mean, var, weight32) groups.",
        |p: MultiAdamParams| multi_adam("multi_mp_adam_update", &p, true),
    ));
    add(OpDef::new(
        "_multi_adamw_update",
        &[],
        "AdamW of num_weights (weight, grad, mean, var) groups with their own lrs, wds and etas; skipped when the rescale_grad input is 0, NaN or Inf.",
        |p: MultiAdamWParams| multi_adamw("_multi_adamw_update", &p, false),
    ));
    add(OpDef::new(
        "_multi_mp_adamw_update",
        &[],
        "_multi_adamw_update on float32 master copies: num_weights (weight, grad, mean, var, weight32) groups.",
        |p: MultiAdamWParams| multi_adamw("_multi_mp_adamw_update", &p, true),
    ));
    add(OpDef::new(
        "_contrib_adamw_update",
        &[],
        "AdamW: Adam with weight decay decoupled from the gradient; skipped when the rescale_grad input is 0, NaN or Inf.",
        |p: AdamWParams| {
            let layout = Layout { states: &["mean", "var"], master: false, weights: 1, rescale_input: true, preloaded_rates: false };
            let hyper = vec![Hyper { lr: p.lr, wd: p.wd, rescale: 1.0, eta: p.eta }];
            Ok(Update::new("_contrib_adamw_update", layout, hyper, adamw_rule(p.beta1, p.beta2, p.epsilon, p.clip_gradient)))
        },
    ));
    add(OpDef::new("_contrib_mp_adamw_update", &[], "AdamW on a float32 master copy (weight32) of a lower-precision weight.", |p: AdamWParams| {
        let layout = Layout { states: &["mean", "var"], master: true, weights: 1, rescale_input: true, preloaded_rates: false };
        let hyper = vec![Hyper { lr: p.lr, wd: p.wd, rescale: 1.0, eta: p.eta }];
        Ok(Update::new("_contrib_mp_adamw_update", layout, hyper, adamw_rule(p.beta1, p.beta2, p.epsilon, p.clip_gradient)))
    }));
    add(OpDef::new(
        "lamb_update_phase1",
        &[],
        "LAMB phase 1: updates the moments and returns the direction g = mean_hat / (sqrt(var_hat) + epsilon) + wd * weight.",
        |p: LambPhase1Params| {
            Ok(Update::new("lamb_update_phase1", single(&["mean", "var"], false), hyper(0.0, p.wd, p.rescale_grad), lamb_phase1_rule(&p))
                .not_in_place())
        },
    ));
    add(OpDef::new(
        "mp_lamb_update_phase1",
        &[],
        "lamb_update_phase1 on a float32 master copy (weight32) of a lower-precision weight; the direction is float32.",
        |p: LambPhase1Params| {
            Ok(Update::new("mp_lamb_update_phase1", single(&["mean", "var"], true), hyper(0.0, p.wd, p.rescale_grad), lamb_phase1_rule(&p))
                .not_in_place())
        },
    ));
    add(OpDef::new(
        "lamb_update_phase2",
        &[],
        "LAMB phase 2: weight -= lr * (r1 / r2) * g with r1 the (bounded) weight norm and r2 the norm of g.",
        |p: LambPhase2Params| Ok(LambPhase2 { p, master: false }),
    ));
    add(OpDef::new(
        "mp_lamb_update_phase2",
        &[],
        "lamb_update_phase2 on the float32 master copy (weight32), which is updated in place; the weight receives its cast.",
        |p: LambPhase2Params| Ok(LambPhase2 { p, master: true }),
    ));
    add(OpDef::new("ftml_update", &[], "FTML (Follow the Moving Leader): d, v and z states; weight = -z / d_t.", |p: FtmlParams| {
        let (beta1, beta2, epsilon, clip) = (p.beta1, p.beta2, p.epsilon, p.clip_grad);
        if p.lr == 0.0 {
            crate::bail!(Param, "ftml_update: lr must be nonzero (the update divides by it)");
        }
        let t = p.t as i32;
        // d_t = (1 - beta1^t) / lr * (sqrt(v / (1 - beta2^t)) + epsilon)
        let (d_scale, v_correction) = ((1.0 - beta1.powi(t)) / p.lr, 1.0 - beta2.powi(t));
        Ok(Update::new(
            "ftml_update",
            single(&["d", "v", "z"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
                let g = {
                    let g = g * h.rescale + h.wd * w;
                    if clip >= 0.0 {
                        g.clamp(-clip, clip)
                    } else {
                        g
                    }
                };
                s[1] = beta2 * s[1] + (1.0 - beta2) * g * g;
                let d_t = d_scale * ((s[1] / v_correction).sqrt() + epsilon);
                s[2] = beta1 * s[2] + (1.0 - beta1) * g - (d_t - beta1 * s[0]) * w;
                s[0] = d_t;
                -s[2] / d_t
            },
        ))
    }));
    add(OpDef::new(
        "preloaded_multi_sgd_update",
        &[],
        "multi_sgd_update with the lrs and wds given as the last two input arrays.",
        |p: PreloadedMultiSgdParams| {
            let (layout, hyper) = preloaded(&p, &[], false);
            Ok(Update::new("preloaded_multi_sgd_update", layout, hyper, sgd_rule(p.clip_gradient)).on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
        },
    ));
    add(OpDef::new(
        "preloaded_multi_mp_sgd_update",
        &[],
        "multi_mp_sgd_update with the lrs and wds given as the last two input arrays.",
        |p: PreloadedMultiSgdParams| {
            let (layout, hyper) = preloaded(&p, &[], true);
            Ok(Update::new("preloaded_multi_mp_sgd_update", layout, hyper, sgd_rule(p.clip_gradient))
                .on_gpu(SGD_CUDA, [p.clip_gradient, 0.0, 0.0, 0.0]))
        },
    ));
    add(OpDef::new(
        "preloaded_multi_sgd_mom_update",
        &[],
        "multi_sgd_mom_update with the lrs and wds given as the last two input arrays.",
        |p: PreloadedMultiSgdParams| {
            let (layout, hyper) = preloaded(&p, &["mom"], false);
            Ok(Update::new("preloaded_multi_sgd_mom_update", layout, hyper, sgd_mom_rule(p.momentum, p.clip_gradient))
                .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
        },
    ));
    add(OpDef::new(
        "preloaded_multi_mp_sgd_mom_update",
        &[],
        "multi_mp_sgd_mom_update with the lrs and wds given as the last two input arrays.",
        |p: PreloadedMultiSgdParams| {
            let (layout, hyper) = preloaded(&p, &["mom"], true);
            Ok(Update::new("preloaded_multi_mp_sgd_mom_update", layout, hyper, sgd_mom_rule(p.momentum, p.clip_gradient))
                .on_gpu(SGD_MOM_CUDA, [p.momentum, p.clip_gradient, 0.0, 0.0]))
        },
    ));
    add(OpDef::new(
        "multi_sum_sq",
        &[],
        "Sum of squares of each of num_arrays arrays, as a float32 array of num_arrays values.",
        |p: MultiSumSqParams| {
            if p.num_arrays == 0 {
                crate::bail!(Param, "multi_sum_sq: num_arrays must be at least 1");
            }
            Ok(MultiSumSq { num_arrays: p.num_arrays })
        },
    ));
    add(OpDef::new(
        "multi_lars",
        &[],
        "LARS learning rates: lrs * eta * |w| / (|g| * rescale_grad + wds * |w| + eps) where both norms are positive, else lrs.",
        |p: MultiLarsParams| Ok(MultiLars { p }),
    ));
    add(OpDef::new("rmsprop_update", &[], "RMSProp (Tieleman and Hinton).", |p: RmspropParams| {
        let (gamma1, epsilon, clip, clip_weights) = (p.gamma1, p.epsilon, p.clip_gradient, p.clip_weights);
        Ok(Update::new(
            "rmsprop_update",
            single(&["n"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
                let g = {
                    let g = g * h.rescale + h.wd * w;
                    if clip >= 0.0 {
                        g.clamp(-clip, clip)
                    } else {
                        g
                    }
                };
                s[0] = (1.0 - gamma1) * g * g + gamma1 * s[0];
                clip_weight(w - h.lr * g / (s[0] + epsilon).sqrt(), clip_weights)
            },
        ))
    }));
    add(OpDef::new("rmspropalex_update", &[], "RMSProp with momentum (Graves).", |p: RmspropParams| {
        let (gamma1, gamma2, epsilon, clip, clip_weights) = (p.gamma1, p.gamma2, p.epsilon, p.clip_gradient, p.clip_weights);
        Ok(Update::new(
            "rmspropalex_update",
            single(&["n", "g", "delta"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
                let g = {
                    let g = g * h.rescale + h.wd * w;
                    if clip >= 0.0 {
                        g.clamp(-clip, clip)
                    } else {
                        g
                    }
                };
                s[0] = (1.0 - gamma1) * g * g + gamma1 * s[0];
                s[1] = (1.0 - gamma1) * g + gamma1 * s[1];
                s[2] = gamma2 * s[2] - h.lr * g / (s[0] - s[1] * s[1] + epsilon).sqrt();
                clip_weight(w + s[2], clip_weights)
            },
        ))
    }));
    add(OpDef::new("ftrl_update", &[], "Follow the regularized leader (FTRL-proximal).", |p: FtrlParams| {
        let (lamda1, beta, clip) = (p.lamda1, p.beta, p.clip_gradient);
        Ok(Update::new(
            "ftrl_update",
            single(&["z", "n"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
                let g = rescaled(g, h.rescale, clip);
                s[0] += g - ((s[1] + g * g).sqrt() - s[1].sqrt()) * w / h.lr;
                s[1] += g * g;
                if s[0].abs() > lamda1 {
                    (s[0].signum() * lamda1 - s[0]) / ((beta + s[1].sqrt()) / h.lr + h.wd)
                } else {
                    0.0
                }
            },
        ))
    }));
    add(OpDef::new("signsgd_update", &[], "signSGD: weight = (1 - lr * wd) * weight - lr * sign(grad).", |p: SgdParams| {
        let clip = p.clip_gradient;
        Ok(Update::new("signsgd_update", single(&[], false), hyper(p.lr, p.wd, p.rescale_grad), move |h: &Hyper, w: f64, g: f64, _: &mut [f64]| {
            (1.0 - h.lr * h.wd) * w - h.lr * rescaled(g, h.rescale, clip).signum() * (g != 0.0) as i32 as f64
        }))
    }));
    add(OpDef::new("signum_update", &[], "Signum: SGD on the sign of the momentum.", |p: SignumParams| {
        let (momentum, clip, wd_lh) = (p.momentum, p.clip_gradient, p.wd_lh);
        Ok(Update::new(
            "signum_update",
            single(&["mom"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
                s[0] = momentum * s[0] - (1.0 - momentum) * (h.wd * w + rescaled(g, h.rescale, clip));
                let sign = if s[0] > 0.0 {
                    1.0
                } else if s[0] < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                (1.0 - h.lr * wd_lh) * w + h.lr * sign
            },
        ))
    }));
}

fn lamb_phase1_rule(p: &LambPhase1Params) -> impl Rule {
    let (beta1, beta2, epsilon, clip) = (p.beta1, p.beta2, p.epsilon, p.clip_gradient);
    let (c1, c2) = if p.bias_correction { (1.0 - beta1.powi(p.t as i32), 1.0 - beta2.powi(p.t as i32)) } else { (1.0, 1.0) };
    move |h: &Hyper, w: f64, g: f64, s: &mut [f64]| {
        let g = rescaled(g, h.rescale, clip);
        s[0] = beta1 * s[0] + (1.0 - beta1) * g;
        s[1] = beta2 * s[1] + (1.0 - beta2) * g * g;
        (s[0] / c1) / ((s[1] / c2).sqrt() + epsilon) + h.wd * w
    }
}

/// `lamb_update_phase2(weight, g, r1, r2)`: r1 and r2 are one-element norms. The `mp_` form
/// takes a float32 master weight (weight32) last, steps it and writes its cast to the weight.
struct LambPhase2 {
    p: LambPhase2Params,
    master: bool,
}

impl Operator for LambPhase2 {
    fn input_names(&self) -> Vec<String> {
        let names: &[&str] = if self.master { &["weight", "g", "r1", "r2", "weight32"] } else { &["weight", "g", "r1", "r2"] };
        names.iter().map(|s| s.to_string()).collect()
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if self.master {
            if let Some(bad) = [inputs[1], inputs[4]].into_iter().find(|&d| d != DType::F32) {
                crate::bail!(Type, "mp_lamb_update_phase2: g and weight32 must be float32, got {bad}");
            }
            Ok(vec![inputs[0]])
        } else {
            super::same_dtype(inputs, 1)
        }
    }
    fn mutated_inputs(&self) -> &[usize] {
        if self.master {
            &[4]
        } else {
            &[]
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if inputs[1] != inputs[0] {
            crate::bail!(Shape, "lamb_update_phase2: g has shape {}, the weight {}", inputs[1], inputs[0]);
        }
        if inputs[2].size() != 1 || inputs[3].size() != 1 {
            crate::bail!(Shape, "lamb_update_phase2: r1 and r2 must hold one value each, got {} and {}", inputs[2], inputs[3]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let (mut r1, r2) = (super::normalization::to_f64(&inputs[2])[0], super::normalization::to_f64(&inputs[3])[0]);
        if self.p.lower_bound > 0.0 {
            r1 = r1.max(self.p.lower_bound);
        }
        if self.p.upper_bound > 0.0 {
            r1 = r1.min(self.p.upper_bound);
        }
        let ratio = if r1 == 0.0 || r2 == 0.0 { 1.0 } else { r1 / r2 };
        let step = self.p.lr * ratio;
        if self.master {
            let (gradient, shape) = (args.input::<f32>(1)?, args.input_shape(1)?);
            let weight32 = args.mutated::<f32>(4)?;
            zip_into(Operand::Output, Operand::Values(gradient, shape), weight32, shape, |w: f32, g: f32| (w as f64 - step * g as f64) as f32)?;
            return crate::dispatch_dtype!(args.output_dtype(0)?, [F32, F64, F16, BF16], T => {
                map_into(weight32, args.output::<T>(0)?, PARALLEL_GRAIN, |w: f32| T::from_f64(w as f64))
            }, other => crate::bail!(Type, "optimizer updates need floating-point weights, got {other}"));
        }
        crate::dispatch_dtype!(args.input_dtype(0)?, [F32, F64, F16, BF16], T => {
            zip_args(args, |w: T, g: T| T::from_f64(w.to_f64() - step * g.to_f64()))
        }, other => crate::bail!(Type, "optimizer updates need floating-point weights, got {other}"))
    }
}

/// `multi_sum_sq(array_0, ..., array_{n-1})`: the sum of squares of each array (float32).
struct MultiSumSq {
    num_arrays: usize,
}

impl Operator for MultiSumSq {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_arrays).map(|i| format!("array_{i}")).collect()
    }
    fn infer_shape(&self, _inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![Shape::new(vec![self.num_arrays])])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if let Some(bad) = inputs.iter().find(|d| !d.is_float()) {
            crate::bail!(Type, "multi_sum_sq: arrays must be floating point, got {bad}");
        }
        Ok(vec![DType::F32])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let sums: Vec<f64> = inputs.iter().map(|t| super::normalization::to_f64(t).iter().map(|v| v * v).sum()).collect();
        super::normalization::write_f64(&outputs[0], &sums);
        Ok(())
    }
}

/// `multi_lars(lrs, weights_sum_sq, grads_sum_sq, wds)`: per-layer LARS learning rates.
struct MultiLars {
    p: MultiLarsParams,
}

impl Operator for MultiLars {
    fn input_names(&self) -> Vec<String> {
        ["lrs", "weights_sum_sq", "grads_sum_sq", "wds"].iter().map(|s| s.to_string()).collect()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        if let Some(bad) = inputs.iter().find(|s| s.size() != inputs[0].size()) {
            crate::bail!(Shape, "multi_lars: lrs {}, weights_sum_sq, grads_sum_sq and wds must have one size, got {bad}", inputs[0]);
        }
        Ok(vec![inputs[0].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        if let Some(bad) = inputs.iter().find(|&&d| d != DType::F32) {
            crate::bail!(Type, "multi_lars: inputs must be float32, got {bad}");
        }
        Ok(vec![DType::F32])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let [lrs, w_sq, g_sq, wds] = [0, 1, 2, 3].map(|i| super::normalization::to_f64(&inputs[i]));
        let rates: Vec<f64> = (0..lrs.len())
            .map(|i| {
                let (w_norm, g_norm) = (w_sq[i].sqrt(), g_sq[i].sqrt() * self.p.rescale_grad);
                if w_norm > 0.0 && g_norm > 0.0 {
                    lrs[i] * self.p.eta * w_norm / (g_norm + wds[i] * w_norm + self.p.eps)
                } else {
                    lrs[i]
                }
            })
            .collect();
        super::normalization::write_f64(&outputs[0], &rates);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_counts_the_inputs_it_names() {
        for states in [&[][..], &["mom"][..], &["mean", "var"][..]] {
            for (master, weights, rescale_input, preloaded_rates) in
                [(false, 1, false, false), (true, 3, false, false), (false, 2, true, false), (true, 4, false, true)]
            {
                let layout = Layout { states, master, weights, rescale_input, preloaded_rates };
                assert_eq!(layout.input_count(), layout.input_names().len(), "{layout:?}");
            }
        }
    }
}

#[cfg(all(test, feature = "cuda"))]
mod gpu_rules {
    use super::*;
    use crate::backend::cuda::kernel_source::{update_kernel, UpdateTypes, PRELUDE};
    use crate::backend::cuda::nvrtc;

    /// Every rule's CUDA form, in plain and multi-precision layouts, compiles with NVRTC.
    #[test]
    fn every_gpu_rule_compiles() {
        if let Err(e) = nvrtc::available() {
            eprintln!("skipped, NVRTC not loadable here: {e}");
            return;
        }
        let plain = UpdateTypes { weight: DType::F32, state: DType::F32, out: DType::F32 };
        let mixed = UpdateTypes { weight: DType::F16, state: DType::F32, out: DType::F16 };
        for (k, (rule, states)) in [(SGD_CUDA, 0), (SGD_MOM_CUDA, 1), (NAG_MOM_CUDA, 1), (ADAM_CUDA, 2)].into_iter().enumerate() {
            for (types, master) in [(plain, false), (mixed, true)] {
                let name = format!("ox_rule_{k}_{master}");
                let source = format!("{PRELUDE}{}", update_kernel(&name, rule, types, states, master, true));
                let ptx = nvrtc::compile_uncached(&name, &source).unwrap_or_else(|e| panic!("{e}"));
                assert!(ptx.to_src().contains(&format!(".entry {name}(")));
            }
        }
    }
}
