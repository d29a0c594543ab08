//! Fused optimizer updates used by `mx.optimizer`: one pass over each weight that reads its
//! gradient, updates the optimizer states in place and writes the new weight (MXNet's update
//! rules and hyper-parameters: rescale_grad, clip_gradient, wd, lr). Multi-precision (`mp_`)
//! forms update a float32 master copy of a lower-precision weight; `multi_` forms update many
//! weights, each with its own lr and wd, in one operator call.

use super::broadcast::{map_into, zip_args, zip_into, Operand};
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, ExecContext, InOut, OpDef, Operator, PARALLEL_GRAIN};
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

/// Most states any rule keeps per element (rmspropalex: n, g, delta).
const MAX_STATES: usize = 3;

/// One element's optimizer states, as a rule reads and updates them (a rule with fewer states
/// leaves the rest alone).
type States = [f64; MAX_STATES];

/// The new weight (or, for LAMB's first phase, the update direction) from the weight, the raw
/// gradient and the states, updating the states. Monomorphized per rule so the element loop
/// inlines it.
trait Rule: Fn(&Hyper, f64, f64, &mut States) -> f64 + Send + Sync + 'static {}
impl<R: Fn(&Hyper, f64, f64, &mut States) -> f64 + Send + Sync + 'static> Rule for R {}

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
    /// The (weight, grad, states..., [master]) input groups of `items` (shapes, dtypes or
    /// tensors), one per weight.
    fn groups<'a, T>(&self, op: &str, items: &'a [T]) -> Result<std::slice::ChunksExact<'a, T>> {
        let per = self.per_weight();
        let groups = items
            .get(..per * self.weights)
            .ok_or_else(|| crate::err!(Value, "{op}: {} inputs expected ({} per weight), got {}", self.input_count(), per, items.len()))?;
        Ok(groups.chunks_exact(per))
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

    /// Updates weight `i`, whose group of inputs starts at `first`: weight and gradient of
    /// element type `W`, states and master copy of `S`, output of `O`.
    fn update_weight<W: Elem, S: Elem, O: Elem>(&self, args: &KernelArgs, i: usize, first: usize, h: &Hyper) -> Result<()> {
        if self.direction {
            return self.update_group::<W, S, O>(args, first, h, Some(args.input::<W>(first)?), args.output::<O>(i)?);
        }
        // The new weight is written over the weight (O is W here), usually in its own memory.
        match args.in_place::<W>(first, i)? {
            InOut::Separate(weight, out) => self.update_group::<W, S, W>(args, first, h, Some(weight), out),
            InOut::Same(weight) => self.update_group::<W, S, W>(args, first, h, None, weight),
        }
    }

    /// [`Update::update_weight`] once the weight (`None`: it is `out`'s memory) and the output
    /// are lent.
    fn update_group<W: Elem, S: Elem, O: Elem>(&self, args: &KernelArgs, first: usize, h: &Hyper, weight: Option<&[W]>, out: &mut [O]) -> Result<()> {
        // The state count is a constant inside the element loop, so that the loop vectorizes.
        match self.layout.states.len() {
            0 => self.update_with::<W, S, O, 0>(args, first, h, weight, out),
            1 => self.update_with::<W, S, O, 1>(args, first, h, weight, out),
            2 => self.update_with::<W, S, O, 2>(args, first, h, weight, out),
            3 => self.update_with::<W, S, O, 3>(args, first, h, weight, out),
            n => crate::bail!(Runtime, "{}: {n} states per weight, at most {MAX_STATES} supported", self.name),
        }
    }

    fn update_with<W: Elem, S: Elem, O: Elem, const N: usize>(
        &self,
        args: &KernelArgs,
        first: usize,
        h: &Hyper,
        weight: Option<&[W]>,
        out: &mut [O],
    ) -> Result<()> {
        let grad = args.input::<W>(first + 1)?;
        let mut states: [&mut [S]; N] = std::array::from_fn(|_| Default::default());
        for (k, state) in states.iter_mut().enumerate() {
            *state = args.mutated::<S>(first + 2 + k)?;
        }
        let master = if self.layout.master { Some(args.mutated::<S>(first + 2 + N)?) } else { None };
        let n = out.len();
        let mut lengths =
            [grad.len()].into_iter().chain(weight.map(<[W]>::len)).chain(states.iter().map(|s| s.len())).chain(master.as_ref().map(|m| m.len()));
        if let Some(bad) = lengths.find(|&len| len != n) {
            crate::bail!(Runtime, "{}: the weight's output holds {n} elements but one of its inputs {bad}", self.name);
        }
        let arrays = UpdateArrays { weight, grad, out, states, master };
        let write_master = !self.direction;
        let threads = crate::engine::parallel::threads();
        if n <= PARALLEL_GRAIN || threads <= 1 {
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || update_range(&self.rule, h, arrays, write_master),
            );
            return Ok(());
        }
        // Index ranges as `parallel_chunks(n, PARALLEL_GRAIN, ..)` splits them.
        let chunk = n.div_ceil(threads * 4).max(PARALLEL_GRAIN);
        crate::engine::parallel::map_owned(arrays.split(chunk), |_, piece| {
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || update_range(&self.rule, h, piece, write_master),
            )
        });
        Ok(())
    }
}

/// The arrays of one weight's update (or of one index range of it, for one task): all of one
/// length.
struct UpdateArrays<'a, W, S, O, const N: usize> {
    /// `None`: the weight is `out`'s memory, read before it is written.
    weight: Option<&'a [W]>,
    grad: &'a [W],
    out: &'a mut [O],
    states: [&'a mut [S]; N],
    master: Option<&'a mut [S]>,
}

impl<'a, W, S, O, const N: usize> UpdateArrays<'a, W, S, O, N> {
    /// The arrays cut into index ranges of `chunk` elements (the last possibly shorter).
    fn split(self, chunk: usize) -> Vec<Self> {
        let chunk = chunk.max(1);
        let UpdateArrays { weight, grad, out, states, master } = self;
        let mut weights = weight.map(|w| w.chunks(chunk));
        let mut states = states.map(|s| s.chunks_mut(chunk));
        let mut masters = master.map(|m| m.chunks_mut(chunk));
        grad.chunks(chunk)
            .zip(out.chunks_mut(chunk))
            .map(|(grad, out)| UpdateArrays {
                weight: weights.as_mut().and_then(Iterator::next),
                grad,
                out,
                states: states.each_mut().map(|s| s.next().unwrap_or_default()),
                master: masters.as_mut().and_then(Iterator::next),
            })
            .collect()
    }
}

/// Elements staged per block in [`update_range`].
const STAGE: usize = 256;

/// `dst[i] = src[i]` as f64 over the shorter of the two.
#[inline(always)]
fn load<T: Elem>(dst: &mut [f64; STAGE], src: &[T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f64();
    }
}

/// `dst[i] = src[i]` converted to `T`, over the shorter of the two.
#[inline(always)]
fn store<T: Elem>(dst: &mut [T], src: &[f64; STAGE]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(s);
    }
}

/// Applies the rule to every element of `a`. `write_master`: the result is the new weight,
/// stored into the master copy too.
#[inline(always)]
fn update_range<W: Elem, S: Elem, O: Elem, const N: usize>(rule: &impl Rule, h: &Hyper, a: UpdateArrays<W, S, O, N>, write_master: bool) {
    // Each block is staged through local arrays: loaded from the operands, updated, stored back.
    // The element loop then works on arrays that cannot alias each other or the operands (the
    // output is usually the weight's memory, read whole before it is written), which keeps it
    // vectorized: computed through possibly-aliasing operands it stayed scalar (4.5x slower on a
    // 784x256 sgd_update). The hyper-parameters are copied for the same reason.
    let hyper = *h;
    let h = &hyper;
    let (mut weights, mut grads, mut news) = ([0f64; STAGE], [0f64; STAGE], [0f64; STAGE]);
    let mut staged = [[0f64; STAGE]; N];
    let UpdateArrays { weight, grad, out, states, master } = a;
    let mut weight_blocks = weight.map(|w| w.chunks(STAGE));
    let mut state_blocks = states.map(|s| s.chunks_mut(STAGE));
    let mut master_blocks = master.map(|m| m.chunks_mut(STAGE));
    for (grad, out) in grad.chunks(STAGE).zip(out.chunks_mut(STAGE)) {
        let states: [&mut [S]; N] = state_blocks.each_mut().map(|b| b.next().unwrap_or_default());
        let master = master_blocks.as_mut().and_then(Iterator::next);
        // Multi-precision updates read the float32 master copy of the weight.
        match (&master, weight_blocks.as_mut().and_then(Iterator::next)) {
            (Some(m), _) => load(&mut weights, m),
            (None, Some(w)) => load(&mut weights, w),
            (None, None) => load(&mut weights, out),
        }
        load(&mut grads, grad);
        for (column, state) in staged.iter_mut().zip(&states) {
            load(column, state);
        }
        let len = grad.len();
        if let (Some(weights), Some(grads), Some(news)) = (weights.get(..len), grads.get(..len), news.get_mut(..len)) {
            apply(rule, h, weights, grads, news, &mut staged);
        }
        for (state, column) in states.into_iter().zip(&staged) {
            store(state, column);
        }
        if let (Some(m), true) = (master, write_master) {
            store(m, &news);
        }
        store(out, &news);
    }
}

/// `news[i] = rule(weights[i], grads[i], states)` with element i's states taken from and
/// written back to the staged columns.
#[inline(always)]
fn apply<const N: usize>(rule: &impl Rule, h: &Hyper, weights: &[f64], grads: &[f64], news: &mut [f64], staged: &mut [[f64; STAGE]; N]) {
    let elements = news.iter_mut().zip(weights).zip(grads);
    match staged.as_mut_slice() {
        [] => {
            for ((new, &w), &g) in elements {
                *new = rule(h, w, g, &mut [0.0; MAX_STATES]);
            }
        }
        [s0] => {
            for (((new, &w), &g), s0) in elements.zip(s0.iter_mut()) {
                let mut s = [*s0, 0.0, 0.0];
                *new = rule(h, w, g, &mut s);
                *s0 = s[0];
            }
        }
        [s0, s1] => {
            for (((new, &w), &g), (s0, s1)) in elements.zip(s0.iter_mut().zip(s1.iter_mut())) {
                let mut s = [*s0, *s1, 0.0];
                *new = rule(h, w, g, &mut s);
                (*s0, *s1) = (s[0], s[1]);
            }
        }
        [s0, s1, s2, ..] => {
            for (((new, &w), &g), ((s0, s1), s2)) in elements.zip(s0.iter_mut().zip(s1.iter_mut()).zip(s2.iter_mut())) {
                let mut s = [*s0, *s1, *s2];
                *new = rule(h, w, g, &mut s);
                (*s0, *s1, *s2) = (s[0], s[1], s[2]);
            }
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
        let mut outs = Vec::with_capacity(self.layout.weights);
        for group in self.layout.groups(self.name, inputs)? {
            let Some(weight) = group.first() else { continue };
            if let Some(bad) = group.iter().find(|s| s.size() != weight.size()) {
                crate::bail!(Shape, "{}: weight {weight}, gradient and states must have one shape, got {bad}", self.name);
            }
            outs.push(weight.clone());
        }
        if self.layout.rescale_input {
            let rescale = inputs.last().ok_or_else(|| crate::err!(Shape, "{}: a rescale_grad input expected, got no inputs", self.name))?;
            if rescale.size() != 1 {
                crate::bail!(Shape, "{}: rescale_grad must hold one value, got shape {rescale}", self.name);
            }
        }
        if self.layout.preloaded_rates {
            let Some((_, rates)) = inputs.split_last_chunk::<2>() else {
                crate::bail!(Shape, "{}: lrs and wds inputs expected, got {} input(s)", self.name, inputs.len());
            };
            for (name, shape) in ["lrs", "wds"].iter().zip(rates) {
                if shape.size() != self.layout.weights {
                    crate::bail!(Shape, "{}: {name} must hold one value per weight ({}), got shape {shape}", self.name, self.layout.weights);
                }
            }
        }
        Ok(outs)
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let mut outs = Vec::with_capacity(self.layout.weights);
        for group in self.layout.groups(self.name, inputs)? {
            let &[weight, grad, ref states @ ..] = group else { continue };
            let state = if self.layout.master { DType::F32 } else { weight };
            if grad != weight {
                crate::bail!(Type, "{}: gradient is {grad} but the weight is {weight}", self.name);
            }
            if let Some(bad) = states.iter().find(|&&d| d != state) {
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
        let per = self.layout.per_weight();
        let count = args.inputs().len();
        let from_end = |back: usize| count.checked_sub(back).ok_or_else(|| crate::err!(Runtime, "{}: {count} input(s), too few", self.name));
        let rescale = if self.layout.rescale_input {
            let value =
                args.input_f64(from_end(1)?)?.first().copied().ok_or_else(|| crate::err!(Runtime, "{}: rescale_grad holds no value", self.name))?;
            if value == 0.0 || !value.is_finite() {
                // MXNet skips the step (a dynamic loss scaler found an overflow): each output
                // not in its weight's memory receives the weight.
                for i in 0..self.layout.weights {
                    if !args.shares_memory(i * per, i) {
                        args.output_from_f64(i, &args.input_f64(i * per)?)?;
                    }
                }
                return Ok(());
            }
            Some(value)
        } else {
            None
        };
        let preloaded = if self.layout.preloaded_rates { Some((args.input_f64(from_end(2)?)?, args.input_f64(from_end(1)?)?)) } else { None };
        for i in 0..self.layout.weights {
            let first = i * per;
            let mut h = self.hyper.get(i).copied().ok_or_else(|| crate::err!(Runtime, "{}: no hyper-parameters for weight {i}", self.name))?;
            if let Some(r) = rescale {
                h.rescale = r;
            }
            if let Some((lrs, wds)) = &preloaded {
                let rate = |rates: &[f64], name: &str| {
                    rates
                        .get(i)
                        .copied()
                        .ok_or_else(|| crate::err!(Runtime, "{}: {name} holds {} values, none for weight {i}", self.name, rates.len()))
                };
                h.lr = rate(lrs, "lrs")?;
                h.wd = rate(wds, "wds")?;
            }
            crate::dispatch_dtype!(args.input_dtype(first)?, [F32, F64, F16, BF16], W => {
                match (self.layout.master, self.direction) {
                    (true, true) => self.update_weight::<W, f32, f32>(args, i, first, &h),
                    (true, false) => self.update_weight::<W, f32, W>(args, i, first, &h),
                    (false, _) => self.update_weight::<W, W, W>(args, i, first, &h),
                }
            }, other => crate::bail!(Type, "optimizer updates need floating-point weights, got {other}"))?;
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
        let groups = self.layout.groups(self.name, inputs)?;
        for ((out, group), h) in outputs.iter().zip(groups).zip(&self.hyper) {
            let [weight, grad, rest @ ..] = group else {
                crate::bail!(Runtime, "{}: a weight's group lacks its weight or gradient", self.name);
            };
            let (states, master) = match (self.layout.master, rest.split_last()) {
                (true, Some((master, states))) => (states, Some(master)),
                (true, None) => crate::bail!(Runtime, "{}: a weight's group lacks its weight32", self.name),
                (false, _) => (rest, None),
            };
            let arrays = crate::backend::cuda::kernels::UpdateArrays { weight, grad, states, master, out, lr: h.lr, wd: h.wd, rescale: h.rescale };
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
    move |h: &Hyper, w: f64, g: f64, _: &mut States| w - h.lr * (rescaled(g, h.rescale, clip) + h.wd * w)
}

fn sgd_mom_rule(momentum: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut States| {
        s[0] = momentum * s[0] - h.lr * h.wd * w - h.lr * rescaled(g, h.rescale, clip);
        w + s[0]
    }
}

/// MXNet's kernel form: the momentum holds lr-scaled steps (as sgd_mom_update's does), and the
/// weight moves by the look-ahead momentum * mom - lr * g.
fn nag_mom_rule(momentum: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut States| {
        let step = h.lr * (rescaled(g, h.rescale, clip) + h.wd * w);
        s[0] = momentum * s[0] - step;
        w + momentum * s[0] - step
    }
}

/// adam_update's rule: the weight decay joins the gradient before clipping.
fn adam_rule(beta1: f64, beta2: f64, epsilon: f64, clip: f64) -> impl Rule {
    move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
    move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
            move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
            move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
            move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
            move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
        Ok(Update::new("signsgd_update", single(&[], false), hyper(p.lr, p.wd, p.rescale_grad), move |h: &Hyper, w: f64, g: f64, _: &mut States| {
            (1.0 - h.lr * h.wd) * w - h.lr * rescaled(g, h.rescale, clip).signum() * (g != 0.0) as i32 as f64
        }))
    }));
    add(OpDef::new("signum_update", &[], "Signum: SGD on the sign of the momentum.", |p: SignumParams| {
        let (momentum, clip, wd_lh) = (p.momentum, p.clip_gradient, p.wd_lh);
        Ok(Update::new(
            "signum_update",
            single(&["mom"], false),
            hyper(p.lr, p.wd, p.rescale_grad),
            move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
    move |h: &Hyper, w: f64, g: f64, s: &mut States| {
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
            let &[weight, g, _, _, weight32] = exactly("mp_lamb_update_phase2", "input", inputs)?;
            if let Some(bad) = [g, weight32].into_iter().find(|&d| d != DType::F32) {
                crate::bail!(Type, "mp_lamb_update_phase2: g and weight32 must be float32, got {bad}");
            }
            Ok(vec![weight])
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
        let [weight, g, r1, r2, ..] = inputs else {
            crate::bail!(Shape, "lamb_update_phase2: weight, g, r1 and r2 expected, got {} input(s)", inputs.len());
        };
        if g != weight {
            crate::bail!(Shape, "lamb_update_phase2: g has shape {g}, the weight {weight}");
        }
        if r1.size() != 1 || r2.size() != 1 {
            crate::bail!(Shape, "lamb_update_phase2: r1 and r2 must hold one value each, got {r1} and {r2}");
        }
        Ok(vec![weight.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let norm = |i: usize| -> Result<f64> {
            args.input_f64(i)?.first().copied().ok_or_else(|| crate::err!(Runtime, "lamb_update_phase2: r{} holds no value", i - 1))
        };
        let (mut r1, r2) = (norm(2)?, norm(3)?);
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
        let sums = (0..args.inputs().len())
            .map(|i| {
                crate::dispatch_dtype!(args.input_dtype(i)?, T => Ok(args.input::<T>(i)?.iter().map(|v| {
                    let v = v.to_f64();
                    v * v
                }).sum::<f64>()))
            })
            .collect::<Result<Vec<f64>>>()?;
        args.output_from_f64(0, &sums)
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
        let [lrs, ..] = inputs else {
            crate::bail!(Shape, "multi_lars: lrs, weights_sum_sq, grads_sum_sq and wds expected, got no inputs");
        };
        if let Some(bad) = inputs.iter().find(|s| s.size() != lrs.size()) {
            crate::bail!(Shape, "multi_lars: lrs {lrs}, weights_sum_sq, grads_sum_sq and wds must have one size, got {bad}");
        }
        Ok(vec![lrs.clone()])
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
        let (w_sq, g_sq, wds) = (args.input_f64(1)?, args.input_f64(2)?, args.input_f64(3)?);
        let rate = |lr: f32, (&w_sq, (&g_sq, &wd)): (&f64, (&f64, &f64))| {
            let lr = lr.to_f64();
            let (w_norm, g_norm) = (w_sq.sqrt(), g_sq.sqrt() * self.p.rescale_grad);
            let rate = if w_norm > 0.0 && g_norm > 0.0 { lr * self.p.eta * w_norm / (g_norm + wd * w_norm + self.p.eps) } else { lr };
            f32::from_f64(rate)
        };
        let (lrs, count) = (args.input_shape(0)?.size(), args.output_shape(0)?.size());
        if [lrs, w_sq.len(), g_sq.len(), wds.len()].iter().any(|&len| len != count) {
            crate::bail!(
                Runtime,
                "multi_lars: lrs ({lrs}), weights_sum_sq ({}), grads_sum_sq ({}) and wds ({}) must hold one value per rate ({count})",
                w_sq.len(),
                g_sq.len(),
                wds.len()
            );
        }
        let norms = w_sq.iter().zip(g_sq.iter().zip(&wds));
        // The rates are written over the lrs (a declared in-place pair) or into their own array.
        match args.in_place::<f32>(0, 0)? {
            InOut::Separate(lrs, out) => out.iter_mut().zip(lrs).zip(norms).for_each(|((o, &lr), norm)| *o = rate(lr, norm)),
            InOut::Same(lrs) => lrs.iter_mut().zip(norms).for_each(|(lr, norm)| *lr = rate(*lr, norm)),
        }
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
