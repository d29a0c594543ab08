//! Dropout: zeroes elements with probability p while training (scaling the rest by 1/(1-p)),
//! identity at inference. The mask is a hidden second output that the gradient multiplies by.

use super::broadcast::{zip_into, Operand};
use super::grad::{Grad, InputGrads};
use super::rearrange::broadcast_into;
#[cfg(feature = "cuda")]
use super::Tensor;
use super::{exactly, ExecContext, InOut, OpDef, Operator};
use crate::base::{normalize_axis, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::param_choice! {
    /// When Dropout drops.
    pub enum DropoutMode {
        /// Only while training.
        Training = "training",
        /// At inference too.
        Always = "always",
    }
}

crate::op_params! {
    /// Some parameters are accepted for compatibility only (see their docs).
    #[allow(dead_code)]
    pub struct DropoutParams {
        /// Fraction of the input that gets dropped out during training.
        p: f64 = 0.5,
        /// When dropout is active.
        mode: DropoutMode = DropoutMode::Training,
        /// Axes along which one mask value is shared (variational dropout).
        axes: Vec<i64> = Vec::new(),
        /// Accepted for compatibility (there is no cuDNN path on CPU).
        cudnn_off: Option<bool> = None,
    }
}

struct Dropout {
    p: f64,
    always: bool,
    axes: Vec<i64>,
}

impl Dropout {
    /// The shape of the drawn mask: the input's, with 1 along each of `axes` (one draw shared
    /// along them).
    fn mask_shape(&self, x: &Shape) -> Result<Shape> {
        let mut shared = x.dims().to_vec();
        for &a in &self.axes {
            if let Some(dim) = shared.get_mut(normalize_axis(a, x.ndim())?) {
                *dim = 1;
            }
        }
        Ok(Shape::new(shared))
    }
}

impl Operator for Dropout {
    fn num_outputs(&self) -> usize {
        2
    }
    fn num_visible_outputs(&self) -> usize {
        1
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("Dropout", "input", inputs)?;
        self.mask_shape(x)?;
        Ok(vec![x.clone(), x.clone()])
    }
    fn needs_rng(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let [x] = exactly("Dropout", "input", args.inputs())?;
        let [out, mask] = exactly("Dropout", "output", args.outputs())?;
        let out_shape = out.shape.clone();
        let active = (ctx.is_train || self.always) && self.p > 0.0;
        let shared = self.mask_shape(&x.shape)?;
        let keep_scale = if self.p >= 1.0 { 0.0 } else { 1.0 / (1.0 - self.p) };
        let (p, seed) = (self.p, ctx.seed);
        crate::dispatch_dtype!(x.dtype, T => {
            let draws: Vec<T> = (0..shared.size())
                .map(|i| {
                    let keep = !active || crate::random::uniform(seed, i as u64) >= p;
                    T::from_f64(if !active { 1.0 } else if keep { keep_scale } else { 0.0 })
                })
                .collect();
            let mask_values = args.output::<T>(1)?;
            broadcast_into("Dropout", (&draws, &shared), (&mut *mask_values, &mask.shape))?;
            let mask: &[T] = mask_values;
            let scaled = |a: T, m: T| T::from_f64(a.to_f64() * m.to_f64());
            match args.in_place::<T>(0, 0)? {
                InOut::Separate(x_values, out) => zip_into(Operand::Values(x_values, &x.shape), Operand::Values(mask, &x.shape), out, &out_shape, scaled),
                InOut::Same(out) => zip_into(Operand::Output, Operand::Values(mask, &x.shape), out, &out_shape, scaled),
            }
        })
    }
    /// The same draws as on the host (the generator is counter-based), made on the device.
    #[cfg(feature = "cuda")]
    fn forward_gpu(&self, gpu: &crate::backend::cuda::Gpu, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        use crate::backend::cuda::kernels;
        let [x] = exactly("Dropout", "input", inputs)?;
        let [out, mask] = exactly("Dropout", "output", outputs)?;
        if !((ctx.is_train || self.always) && self.p > 0.0) {
            kernels::fill(gpu, mask, 1.0)?;
            return kernels::copy_bytes(gpu, x, out);
        }
        let keep_scale = if self.p >= 1.0 { 0.0 } else { 1.0 / (1.0 - self.p) };
        kernels::dropout(gpu, ctx.seed, self.p, keep_scale, &self.mask_shape(&x.shape)?, x, out, mask)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (g, mask) = (d.out_grad(0), d.output(1));
        Ok(vec![Some(d.mul(&g, &mask)?)])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("Dropout", &[], "Applies dropout while training (or always, with mode='always'); identity otherwise.", |p: DropoutParams| {
        if !(0.0..=1.0).contains(&p.p) {
            crate::bail!(Param, "Dropout: p must be in [0, 1], got {}", p.p);
        }
        let always = p.mode == DropoutMode::Always;
        Ok(Dropout { p: p.p, always, axes: p.axes })
    }));
}
