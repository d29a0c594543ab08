//! Element-wise selection: clip and where.

use super::broadcast::map_args;
use super::grad::{Grad, InputGrads};
use super::{exactly, parallel_units, same_dtype, ExecContext, OpDef, Operator, PARALLEL_GRAIN};
use crate::base::{unify_partial, DType, Elem, PartialShape, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct ClipParams {
        /// Minimum value.
        a_min: f64,
        /// Maximum value.
        a_max: f64,
    }
}

struct Clip {
    lo: f64,
    hi: f64,
}

impl Operator for Clip {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("clip", "input", inputs)?;
        Ok(vec![x.clone()])
    }
    fn inplace_pairs(&self) -> &[(usize, usize)] {
        &[(0, 0)]
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (lo, hi) = (T::from_f64(self.lo), T::from_f64(self.hi));
            map_args(args, super::PARALLEL_GRAIN, |v: T| if v < lo { lo } else if v > hi { hi } else { v })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        let above = d.scalar("_greater_equal_scalar", &x, self.lo)?;
        let below = d.scalar("_lesser_equal_scalar", &x, self.hi)?;
        let inside = d.mul(&above, &below)?;
        Ok(vec![Some(d.mul(&g, &inside)?)])
    }
}

/// where(condition, x, y): x where condition is non-zero, else y. The condition has the shape of
/// x, or is 1-D selecting whole rows along the first axis.
struct Where;

impl Operator for Where {
    fn input_names(&self) -> Vec<String> {
        vec!["condition".into(), "x".into(), "y".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [c, x, y] = exactly("where", "input", inputs)?;
        if x != y {
            crate::bail!(Shape, "where: x {x} and y {y} must have the same shape");
        }
        let rows = c.ndim() == 1 && x.ndim() >= 1 && c.dims().first() == x.dims().first();
        if c != x && !rows {
            crate::bail!(Shape, "where: condition {c} must have the shape of x {x}, or be 1-D of length {}", x.dims().first().unwrap_or(&0));
        }
        Ok(vec![x.clone()])
    }
    /// x, y and the output share one shape; a condition of their rank has it too (a 1-D
    /// condition selecting rows tells nothing more). This is how a zoneout cell's
    /// `where(mask, new, zeros((0, 0)))` learns the shape of its zeros.
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        let (condition, values) = inputs.split_at_mut(1);
        unify_partial(values, outputs)?;
        let condition_has_value_rank = matches!((condition.first(), outputs.first()), (Some(Some(c)), Some(Some(out))) if c.ndim() == out.ndim());
        if condition_has_value_rank {
            unify_partial(condition, outputs)?;
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        same_dtype(inputs.get(1..).unwrap_or_default(), 1)
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let mask: Vec<bool> = crate::dispatch_dtype!(args.input_dtype(0)?, C => {
            args.input::<C>(0)?.iter().map(|v| v.to_f64() != 0.0).collect()
        });
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (xs, ys, out) = (args.input::<T>(1)?, args.input::<T>(2)?, args.output::<T>(0)?);
            if xs.len() != out.len() || ys.len() != out.len() {
                crate::bail!(Runtime, "where: x ({}) and y ({}) must hold the output's {} elements", xs.len(), ys.len(), out.len());
            }
            // A condition of the values' shape selects each element; a 1-D one, whole rows.
            let per_mask = (out.len() / mask.len().max(1)).max(1);
            parallel_units(out, 1, PARALLEL_GRAIN, |start, piece| {
                let values = xs.iter().zip(ys).enumerate().skip(start);
                for (o, (i, (&x, &y))) in piece.iter_mut().zip(values) {
                    *o = if mask.get(i / per_mask).copied().unwrap_or(false) { x } else { y };
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (c, g) = (d.input(0), d.out_grad(0));
        let zeros = d.unary("zeros_like", &g)?;
        let gx = d.op("where", &[], &[&c, &g, &zeros])?;
        let gy = d.op("where", &[], &[&c, &zeros, &g])?;
        Ok(vec![None, Some(gx), Some(gy)])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("clip", &[], "Clips (limits) the values in an array to [a_min, a_max].", |p: ClipParams| {
        if p.a_min > p.a_max {
            crate::bail!(Param, "clip: a_min ({}) must not exceed a_max ({})", p.a_min, p.a_max);
        }
        Ok(Clip { lo: p.a_min, hi: p.a_max })
    }));
    add(OpDef::new("where", &[], "Returns elements chosen from x or y depending on condition.", |_: super::params::NoParams| Ok(Where)));
}
