//! Sorting along an axis: sort, argsort and topk (all of MXNet's ret_typ values).

use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr, Tensor};
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
                let d = s.dims();
                ((d[..a].iter().product(), d[a], d[a + 1..].iter().product()), d.to_vec(), a)
            }
        };
        let r = blocks.1 as i64;
        let keep = match self.k {
            None => r,
            Some(k) if k <= 0 => r,
            Some(k) if k > r => crate::bail!(Value, "topk: k={k} exceeds the axis length {r} of {s}"),
            Some(k) => k,
        } as usize;
        dims[axis] = keep;
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
        let (_, _, out) = self.layout(&inputs[0])?;
        Ok(match self.returns {
            TopkReturn::Mask => vec![inputs[0].clone()],
            TopkReturn::Both => vec![out.clone(), out],
            _ => vec![out],
        })
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(match self.returns {
            TopkReturn::Values | TopkReturn::Mask => vec![inputs[0]],
            TopkReturn::Indices => vec![self.index_dtype],
            TopkReturn::Both => vec![inputs[0], self.index_dtype],
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
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let ((outer, r, inner), keep, _) = self.layout(&inputs[0].shape)?;
        let x = &inputs[0];
        let lanes: Vec<Vec<(f64, usize)>> = crate::dispatch_dtype!(x.dtype, T => {
            // SAFETY: x is an input this op does not write.
            let data = unsafe { x.slice::<T>() };
            let ascending = self.ascending;
            let mut lanes = vec![Vec::new(); outer * inner];
            let lp = SendPtr(lanes.as_mut_ptr());
            parallel_chunks(outer * inner, (1 << 12) / r.max(1) + 1, |cells| {
                for cell in cells {
                    let (o, j) = (cell / inner, cell % inner);
                    let mut lane: Vec<(f64, usize)> = (0..r).map(|k| (data[(o * r + k) * inner + j].to_f64(), k)).collect();
                    // Stable, with NaN last in either direction, like NumPy's sort.
                    lane.sort_by(|a, b| {
                        let ord = a.0.partial_cmp(&b.0).unwrap_or_else(|| a.0.is_nan().cmp(&b.0.is_nan()));
                        if ascending || a.0.is_nan() || b.0.is_nan() { ord } else { ord.reverse() }
                    });
                    lane.truncate(keep);
                    // SAFETY: each cell's lane slot is written by exactly one task.
                    unsafe { *lp.get().add(cell) = lane };
                }
            });
            lanes
        });
        let write = |out: &Tensor, value: &dyn Fn(&(f64, usize)) -> f64| {
            crate::dispatch_dtype!(out.dtype, T => {
                // SAFETY: the op owns its outputs; the (outer, keep, inner) layout matches their shape.
                let o = unsafe { out.slice_mut::<T>() };
                for (cell, lane) in lanes.iter().enumerate() {
                    let (oi, j) = (cell / inner, cell % inner);
                    for (pos, entry) in lane.iter().enumerate() {
                        o[(oi * keep + pos) * inner + j] = T::from_f64(value(entry));
                    }
                }
            })
        };
        match self.returns {
            TopkReturn::Values => write(&outputs[0], &|e| e.0),
            TopkReturn::Indices => write(&outputs[0], &|e| e.1 as f64),
            TopkReturn::Both => {
                write(&outputs[0], &|e| e.0);
                write(&outputs[1], &|e| e.1 as f64);
            }
            TopkReturn::Mask => {
                let out = &outputs[0];
                crate::dispatch_dtype!(out.dtype, T => {
                    // SAFETY: the op owns its output, which has the input's (outer, r, inner) layout.
                    let o = unsafe { out.slice_mut::<T>() };
                    o.iter_mut().for_each(|v| *v = T::from_f64(0.0));
                    for (cell, lane) in lanes.iter().enumerate() {
                        let (oi, j) = (cell / inner, cell % inner);
                        for entry in lane {
                            o[(oi * r + entry.1) * inner + j] = T::from_f64(1.0);
                        }
                    }
                })
            }
        }
        Ok(())
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
        if inputs[0] != inputs[1] {
            crate::bail!(Shape, "_backward_order: grad {} and indices {} must have one shape", inputs[0], inputs[1]);
        }
        Ok(vec![inputs[2].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, idx, out) = (&inputs[0], &inputs[1], &outputs[0]);
        let order = Order { axis: self.axis, ascending: true, k: None, returns: TopkReturn::Values, index_dtype: DType::F32 };
        let ((outer, r, inner), _, _) = order.layout(&out.shape)?;
        let keep = g.size() / (outer * inner).max(1);
        let positions: Vec<usize> = crate::dispatch_dtype!(idx.dtype, I => {
            // SAFETY: indices are an input this op does not write.
            unsafe { idx.slice::<I>() }.iter().map(|v| v.to_f64() as usize).collect()
        });
        crate::dispatch_dtype!(out.dtype, T => {
            // SAFETY: grad is read-only here; the output is this op's alone.
            let (gv, o) = unsafe { (g.slice::<T>(), out.slice_mut::<T>()) };
            o.iter_mut().for_each(|v| *v = T::from_f64(0.0));
            for oi in 0..outer {
                for p in 0..keep {
                    for j in 0..inner {
                        let at = (oi * keep + p) * inner + j;
                        let k = positions[at];
                        if k >= r {
                            crate::bail!(Index, "_backward_order: index {k} is out of bounds for an axis of size {r}");
                        }
                        o[(oi * r + k) * inner + j] = gv[at];
                    }
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
