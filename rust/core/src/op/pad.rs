//! pad: constant, edge and reflect padding, and its gradient.
//!
//! Each axis gets a map from output coordinate to input coordinate (or none, for constant
//! padding); the forward pass gathers through the maps and the gradient scatter-adds through
//! them, so edge and reflect padding send every padded gradient back to its source element.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::{parallel_chunks, ExecContext, OpDef, Operator, SendPtr};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct PadParams {
        /// How the padding is filled.
        mode: PadMode = PadMode::Constant,
        /// Widths (before, after) for every axis, flattened: 2 * ndim values.
        pad_width: Vec<i64>,
        /// The value of constant padding.
        constant_value: f64 = 0.0,
    }
}

crate::param_choice! {
    /// How Pad fills the padding.
    pub enum PadMode {
        /// `constant_value`.
        Constant = "constant",
        /// The edge value repeated.
        Edge = "edge",
        /// The values mirrored about the edge (the edge itself not repeated).
        Reflect = "reflect",
    }
}

struct Pad {
    mode: PadMode,
    widths: Vec<(usize, usize)>,
    value: f64,
    params: PadParams,
}

impl Pad {
    fn new(p: PadParams) -> Result<Pad> {
        let mode = p.mode;
        if !p.pad_width.len().is_multiple_of(2) || p.pad_width.iter().any(|&w| w < 0) {
            crate::bail!(Param, "pad: pad_width must hold non-negative (before, after) pairs, got {:?}", p.pad_width);
        }
        let widths = p.pad_width.chunks(2).map(|c| (c[0] as usize, c[1] as usize)).collect();
        Ok(Pad { mode, widths, value: p.constant_value, params: p })
    }

    fn out_shape(&self, s: &Shape) -> Result<Shape> {
        if self.widths.len() != s.ndim() {
            crate::bail!(Shape, "pad: pad_width has {} pairs for an input of {} dimensions ({s})", self.widths.len(), s.ndim());
        }
        for (axis, &(before, after)) in self.widths.iter().enumerate() {
            if self.mode == PadMode::Reflect && (before >= s[axis] || after >= s[axis]) {
                crate::bail!(Shape, "pad: reflect padding of {before}/{after} needs axis {axis} of {s} to be longer");
            }
            if self.mode == PadMode::Edge && s[axis] == 0 && before + after > 0 {
                crate::bail!(Shape, "pad: edge padding of an empty axis {axis} of {s}");
            }
        }
        Ok(Shape::new(s.dims().iter().zip(&self.widths).map(|(&d, &(b, a))| d + b + a).collect::<Vec<_>>()))
    }

    /// Per axis, the input coordinate each output coordinate reads (None: the constant).
    fn maps(&self, s: &Shape) -> Vec<Vec<Option<usize>>> {
        self.widths
            .iter()
            .enumerate()
            .map(|(axis, &(before, after))| {
                let n = s[axis] as i64;
                (0..(s[axis] + before + after) as i64)
                    .map(|o| {
                        let i = o - before as i64;
                        if (0..n).contains(&i) {
                            return Some(i as usize);
                        }
                        match self.mode {
                            PadMode::Constant => None,
                            PadMode::Edge => Some(i.clamp(0, n - 1) as usize),
                            PadMode::Reflect => Some(if i < 0 { -i } else { 2 * (n - 1) - i } as usize),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn attrs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("mode", self.params.mode.name().to_string()),
            ("pad_width", tuple_attr(&self.params.pad_width)),
            ("constant_value", format!("{:?}", self.params.constant_value)),
        ]
    }
}

/// Input element offset for each output element (None where constant), in output order.
fn source_offsets(maps: &[Vec<Option<usize>>], in_shape: &Shape) -> Vec<Option<usize>> {
    let strides = in_shape.strides();
    let mut offsets: Vec<Option<usize>> = vec![Some(0)];
    for (axis, map) in maps.iter().enumerate() {
        let mut next = Vec::with_capacity(offsets.len() * map.len());
        for &base in &offsets {
            for &m in map {
                next.push(match (base, m) {
                    (Some(b), Some(i)) => Some(b + i * strides[axis]),
                    _ => None,
                });
            }
        }
        offsets = next;
    }
    offsets
}

impl Operator for Pad {
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(vec![self.out_shape(&inputs[0])?])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (x, out) = (&inputs[0], &outputs[0]);
        let offsets = source_offsets(&self.maps(&x.shape), &x.shape);
        crate::dispatch_dtype!(x.dtype, T => {
            let fill = T::from_f64(self.value);
            let (xp, op) = (SendPtr(x.ptr::<T>()), SendPtr(out.ptr::<T>()));
            parallel_chunks(offsets.len(), super::PARALLEL_GRAIN, |range| {
                for i in range {
                    // SAFETY: offsets address elements of x; output element i is ours alone.
                    unsafe { *op.get().add(i) = offsets[i].map_or(fill, |o| *xp.get().add(o)) };
                }
            });
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let (x, g) = (d.input(0), d.out_grad(0));
        Ok(vec![Some(d.op("_backward_pad", &self.attrs(), &[&g, &x])?)])
    }
}

/// `_backward_pad(grad, data)`: sums the gradient of every padded element into its source.
struct PadBackward {
    pad: Pad,
}

impl Operator for PadBackward {
    fn input_names(&self) -> Vec<String> {
        vec!["grad".into(), "data".into()]
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let padded = self.pad.out_shape(&inputs[1])?;
        if padded != inputs[0] {
            crate::bail!(Shape, "_backward_pad: gradient {} does not match the padded shape {padded}", inputs[0]);
        }
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let (g, out) = (&inputs[0], &outputs[0]);
        let offsets = source_offsets(&self.pad.maps(&out.shape), &out.shape);
        crate::dispatch_dtype!(out.dtype, T => {
            let mut acc = vec![0f64; out.size()];
            // SAFETY: grad is read-only here.
            let gv = unsafe { g.slice::<T>() };
            for (o, &v) in offsets.iter().zip(gv) {
                if let Some(o) = *o {
                    acc[o] += v.to_f64();
                }
            }
            // SAFETY: the output is this op's alone.
            let y = unsafe { out.slice_mut::<T>() };
            y.iter_mut().zip(&acc).for_each(|(v, &a)| *v = T::from_f64(a));
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let mut attrs = self.pad.attrs();
        // The padded values themselves carry no gradient: pad the gradient with zeros for
        // constant mode, and with the same rule otherwise.
        attrs[2] = ("constant_value", "0.0".to_string());
        Ok(vec![Some(d.op("pad", &attrs, &[&g])?), None])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("pad", &["Pad"], "Pads an array: constant value, edge values or reflection, per axis.", |p: PadParams| Pad::new(p)));
    add(OpDef::new("_backward_pad", &[], "Gradient of pad: sums padded gradients into their sources.", |p: PadParams| {
        Ok(PadBackward { pad: Pad::new(p)? })
    }));
}
