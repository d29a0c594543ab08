//! Sorting along an axis: sort, argsort and topk (all of MXNet's ret_typ values).

use super::{exactly, parallel_units, ExecContext, OpDef, Operator};
use crate::base::{normalize_axis, DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct SortParams {
        /// Axis along which to sort; None sorts the flattened array.
        axis: Option<i64> = Some(-1),
        /// Ascending (True) or descending (False) order.
        is_ascend: bool = true,
    }
}

crate::op_params! {
    pub struct ArgsortParams {
        /// Axis along which to sort; None sorts the flattened array.
        axis: Option<i64> = Some(-1),
        /// Ascending (True) or descending (False) order.
        is_ascend: bool = true,
        /// Data type of the returned indices.
        dtype: DType = DType::F32,
    }
}

crate::op_params! {
    pub struct TopkParams {
        /// Axis along which to search; None searches the flattened array.
        axis: Option<i64> = Some(-1),
        /// Number of elements to keep.
        k: i64 = 1,
        /// What to return.
        ret_typ: TopkReturn = TopkReturn::Indices,
        /// Whether the k smallest (True) or the k largest (False) are returned.
        is_ascend: bool = false,
        /// Data type of the returned indices.
        dtype: DType = DType::F32,
    }
}

crate::param_choice! {
    /// What topk returns.
    pub enum TopkReturn {
        Values = "value",
        Indices = "indices",
        /// Ones where the top k are, zeros elsewhere.
        Mask = "mask",
        /// Values and indices.
        Both = "both",
    }
}

/// sort, argsort and topk are one operator: order each lane, keep the first `k`, return a view.
struct Order {
    axis: Option<i64>,
    ascending: bool,
    k: Option<i64>,
    returns: TopkReturn,
    index_dtype: DType,
}

impl Order {
    /// (outer, lane length, inner), the number kept, and the output shape of values/indices.
    fn layout(&self, s: &Shape) -> Result<((usize, usize, usize), usize, Shape)> {
        let (blocks, mut dims, axis) = match self.axis {
            None => ((1, s.size(), 1), vec![s.size()], 0),
            Some(a) => {
                let a = normalize_axis(a, s.ndim())?;
                let (before, rest) = s.dims().split_at_checked(a).unwrap_or_default();
                let Some((&len, after)) = rest.split_first() else {
                    crate::bail!(Value, "topk: axis {a} is out of range for {s}");
                };
                ((before.iter().product(), len, after.iter().product()), s.dims().to_vec(), a)
            }
        };
        let r = blocks.1 as i64;
        let keep = match self.k {
            None => r,
            Some(k) if k <= 0 => r,
            Some(k) if k > r => crate::bail!(Value, "topk: k={k} exceeds the axis length {r} of {s}"),
            Some(k) => k,
        } as usize;
        if let Some(len) = dims.get_mut(axis) {
            *len = keep;
        }
        Ok((blocks, keep, Shape::new(dims)))
    }
}

impl Operator for Order {
    fn num_outputs(&self) -> usize {
        if self.returns == TopkReturn::Both {
            2
        } else {
            1
        }
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [x] = exactly("topk", "input", inputs)?;
        let (_, _, out) = self.layout(x)?;
        Ok(match self.returns {
            TopkReturn::Mask => vec![x.clone()],
            TopkReturn::Both => vec![out.clone(), out],
            _ => vec![out],
        })
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[x] = exactly("topk", "input", inputs)?;
        Ok(match self.returns {
            TopkReturn::Values | TopkReturn::Mask => vec![x],
            TopkReturn::Indices => vec![self.index_dtype],
            TopkReturn::Both => vec![x, self.index_dtype],
        })
    }
    fn gradient(&self, d: &mut super::grad::Grad) -> Result<super::grad::InputGrads> {
        if matches!(self.returns, TopkReturn::Indices | TopkReturn::Mask) {
            return super::zero_gradient(d);
        }
        let (x, g) = (d.input(0), d.out_grad(0));
        let axis = self.axis.map_or("None".to_string(), |a| a.to_string());
        let indices = if self.returns == TopkReturn::Both {
            d.output(1)
        } else {
            let attrs = [
                ("axis", axis.clone()),
                ("k", self.k.unwrap_or(0).to_string()),
                ("ret_typ", "indices".to_string()),
                ("is_ascend", if self.ascending { "True" } else { "False" }.to_string()),
            ];
            d.op("topk", &attrs, &[&x])?
        };
        Ok(vec![Some(d.op("_backward_order", &[("axis", axis)], &[&g, &indices, &x])?)])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let ((outer, r, inner), keep, _) = self.layout(args.input_shape(0)?)?;
        // One lane per (outer, inner) cell: the axis' r values with their positions, sorted and cut
        // to the kept ones.
        let lanes: Vec<Vec<(f64, usize)>> = crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let data = args.input::<T>(0)?;
            let ascending = self.ascending;
            let mut lanes = vec![Vec::new(); outer * inner];
            parallel_units(&mut lanes, 1, (1 << 12) / r.max(1) + 1, |first, piece| {
                for (cell, slot) in (first..).zip(piece.iter_mut()) {
                    let start = cell / inner * r * inner + cell % inner;
                    let mut lane: Vec<(f64, usize)> = data.iter().skip(start).step_by(inner.max(1)).take(r).enumerate().map(|(k, v)| (v.to_f64(), k)).collect();
                    // Stable, with NaN last in either direction, like NumPy's sort.
                    lane.sort_by(|a, b| {
                        let ord = a.0.partial_cmp(&b.0).unwrap_or_else(|| a.0.is_nan().cmp(&b.0.is_nan()));
                        if ascending || a.0.is_nan() || b.0.is_nan() { ord } else { ord.reverse() }
                    });
                    lane.truncate(keep);
                    *slot = lane;
                }
                Ok(())
            })?;
            lanes
        });
        // Output `o` (an (outer, len, inner) layout) zeroed, then `value` of each lane's entry at
        // row `row` of its entry.
        let write = |o: usize, len: usize, row: &dyn Fn(usize, &(f64, usize)) -> usize, value: &dyn Fn(&(f64, usize)) -> f64| -> Result<()> {
            crate::dispatch_dtype!(args.output_dtype(o)?, T => {
                let out = args.output::<T>(o)?;
                let size = out.len();
                out.fill(T::from_f64(0.0));
                for (cell, lane) in lanes.iter().enumerate() {
                    let (oi, j) = (cell / inner, cell % inner);
                    for (pos, entry) in lane.iter().enumerate() {
                        let at = (oi * len + row(pos, entry)) * inner + j;
                        *out.get_mut(at).ok_or_else(|| crate::err!(Runtime, "topk: output position {at} is past its {size} elements"))? = T::from_f64(value(entry));
                    }
                }
            });
            Ok(())
        };
        let kept = |pos: usize, _: &(f64, usize)| pos;
        match self.returns {
            TopkReturn::Values => write(0, keep, &kept, &|e| e.0),
            TopkReturn::Indices => write(0, keep, &kept, &|e| e.1 as f64),
            TopkReturn::Both => {
                write(0, keep, &kept, &|e| e.0)?;
                write(1, keep, &kept, &|e| e.1 as f64)
            }
            TopkReturn::Mask => write(0, r, &|_, e| e.1, &|_| 1.0),
        }
    }
}

crate::op_params! {
    pub struct OrderBackwardParams {
        /// The axis that was sorted; None for the flattened array.
        axis: Option<i64> = Some(-1),
    }
}

/// `_backward_order(grad, indices, data)`: zeros like data with each gradient value put back at
/// the position its sorted element came from (the gradient of sort and topk values).
struct OrderBackward {
    axis: Option<i64>,
}

impl Operator for OrderBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "indices".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let [grad, indices, data] = exactly("_backward_order", "input", inputs)?;
        if grad != indices {
            crate::bail!(Shape, "_backward_order: grad {grad} and indices {indices} must have one shape");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &[grad, _, _] = exactly("_backward_order", "input", inputs)?;
        Ok(vec![grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let order = Order { axis: self.axis, ascending: true, k: None, returns: TopkReturn::Values, index_dtype: DType::F32 };
        let ((outer, r, inner), _, _) = order.layout(args.output_shape(0)?)?;
        let positions = args.input_f64(1)?;
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (grads, out) = (args.input::<T>(0)?, args.output::<T>(0)?);
            // The gradient has the sorted layout (outer, keep, inner), the output (outer, r, inner).
            let kept_block = (grads.len() / (outer * inner).max(1)) * inner;
            out.fill(T::from_f64(0.0));
            for (at, (&g, &k)) in grads.iter().zip(&positions).enumerate() {
                let k = k as usize;
                if k >= r {
                    crate::bail!(Index, "_backward_order: index {k} is out of bounds for an axis of size {r}");
                }
                let (oi, j) = (at / kept_block.max(1), at % inner.max(1));
                if let Some(slot) = out.get_mut((oi * r + k) * inner + j) {
                    *slot = g;
                }
            }
        });
        Ok(())
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "_backward_order",
        &[],
        "Gradient of sort and topk values: puts grad back where each value came from.",
        |p: OrderBackwardParams| Ok(OrderBackward { axis: p.axis }),
    ));
    add(OpDef::new("sort", &[], "Returns a sorted copy of the input along an axis.", |p: SortParams| {
        Ok(Order { axis: p.axis, ascending: p.is_ascend, k: None, returns: TopkReturn::Values, index_dtype: DType::F32 })
    }));
    add(OpDef::new("argsort", &[], "Returns the indices that would sort the input along an axis.", |p: ArgsortParams| {
        Ok(Order { axis: p.axis, ascending: p.is_ascend, k: None, returns: TopkReturn::Indices, index_dtype: p.dtype })
    }));
    add(OpDef::new(
        "topk",
        &[],
        "Returns the top k elements along an axis: their values, indices, a mask, or both values and indices.",
        |p: TopkParams| Ok(Order { axis: p.axis, ascending: p.is_ascend, k: Some(p.k), returns: p.ret_typ, index_dtype: p.dtype }),
    ));
}
