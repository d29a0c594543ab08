//! pad: constant, edge and reflect padding, and its gradient.
//!
//! Each axis gets a map from output coordinate to input coordinate (or none, for constant
//! padding); the forward pass gathers through the maps and the gradient scatter-adds through
//! them, so edge and reflect padding send every padded gradient back to its source element.

use super::grad::{tuple_attr, Grad, InputGrads};
use super::{exactly, parallel_units, ExecContext, OpDef, Operator};
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
        let widths = p.pad_width.chunks_exact(2).map(|pair| match *pair {
            [before, after] => (before as usize, after as usize),
            _ => (0, 0), // chunks_exact(2) gives pairs only
        });
        let widths = widths.collect();
        Ok(Pad { mode, widths, value: p.constant_value, params: p })
    }

    fn out_shape(&self, s: &Shape) -> Result<Shape> {
        if self.widths.len() != s.ndim() {
            crate::bail!(Shape, "pad: pad_width has {} pairs for an input of {} dimensions ({s})", self.widths.len(), s.ndim());
        }
        for (axis, (&(before, after), &len)) in self.widths.iter().zip(s.dims()).enumerate() {
            if self.mode == PadMode::Reflect && (before >= len || after >= len) {
                crate::bail!(Shape, "pad: reflect padding of {before}/{after} needs axis {axis} of {s} to be longer");
            }
            if self.mode == PadMode::Edge && len == 0 && before + after > 0 {
                crate::bail!(Shape, "pad: edge padding of an empty axis {axis} of {s}");
            }
        }
        Ok(Shape::new(s.dims().iter().zip(&self.widths).map(|(&d, &(b, a))| d + b + a).collect::<Vec<_>>()))
    }

    /// Per axis, the input coordinate each output coordinate reads (None: the constant).
    fn maps(&self, s: &Shape) -> Vec<Vec<Option<usize>>> {
        self.widths
            .iter()
            .zip(s.dims())
            .map(|(&(before, after), &len)| {
                let n = len as i64;
                (0..(len + before + after) as i64)
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
    let mut offsets: Vec<Option<usize>> = vec![Some(0)];
    for (map, stride) in maps.iter().zip(in_shape.strides()) {
        let mut next = Vec::with_capacity(offsets.len() * map.len());
        for &base in &offsets {
            for &m in map {
                next.push(match (base, m) {
                    (Some(b), Some(i)) => Some(b + i * stride),
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
        let [x] = exactly("pad", "input", inputs)?;
        Ok(vec![self.out_shape(x)?])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let x_shape = args.input_shape(0)?;
        let offsets = source_offsets(&self.maps(x_shape), x_shape);
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let fill = T::from_f64(self.value);
            let (xs, ys) = (args.input::<T>(0)?, args.output::<T>(0)?);
            if offsets.len() != ys.len() {
                crate::bail!(Runtime, "pad: {} output elements for a padded shape of {}", ys.len(), offsets.len());
            }
            parallel_units(ys, 1, super::PARALLEL_GRAIN, |start, piece| {
                for (y, offset) in piece.iter_mut().zip(offsets.iter().skip(start)) {
                    *y = offset.and_then(|o| xs.get(o)).copied().unwrap_or(fill);
                }
                Ok(())
            })
        })
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
        let [grad, data] = exactly("_backward_pad", "input", inputs)?;
        let padded = self.pad.out_shape(data)?;
        if &padded != grad {
            crate::bail!(Shape, "_backward_pad: gradient {grad} does not match the padded shape {padded}");
        }
        Ok(vec![data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let [grad, _] = exactly("_backward_pad", "input", inputs)?;
        Ok(vec![*grad])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let out_shape = args.output_shape(0)?;
        let offsets = source_offsets(&self.pad.maps(out_shape), out_shape);
        crate::dispatch_dtype!(args.output_dtype(0)?, T => {
            let (gs, ys) = (args.input::<T>(0)?, args.output::<T>(0)?);
            let mut sums = vec![0f64; ys.len()];
            for (offset, &g) in offsets.iter().zip(gs) {
                if let Some(sum) = offset.and_then(|o| sums.get_mut(o)) {
                    *sum += g.to_f64();
                }
            }
            ys.iter_mut().zip(&sums).for_each(|(y, &sum)| *y = T::from_f64(sum));
            Ok(())
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        // The padded values themselves carry no gradient: pad the gradient with zeros for
        // constant mode, and with the same rule otherwise.
        let attrs: Vec<_> = self.pad.attrs().into_iter().map(|(k, v)| if k == "constant_value" { (k, "0.0".to_string()) } else { (k, v) }).collect();
        Ok(vec![Some(d.op("pad", &attrs, &[&g])?), None])
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("pad", &["Pad"], "Pads an array: constant value, edge values or reflection, per axis.", |p: PadParams| Pad::new(p)));
    add(OpDef::new("_backward_pad", &[], "Gradient of pad: sums padded gradients into their sources.", |p: PadParams| {
        Ok(PadBackward { pad: Pad::new(p)? })
    }));
}
