//! SequenceLast, SequenceMask and SequenceReverse: per-sequence operations on (time, batch, ...)
//! data (or (batch, time, ...) with axis=1), optionally limited by a (batch,) sequence_length
//! input. Mask and reverse are their own gradients; last scatters its gradient back.

use super::grad::{Grad, InputGrads};
use super::{ExecContext, OpDef, Operator};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct SequenceParams {
        /// Whether the second input holds each sequence's length (otherwise all are full).
        use_sequence_length: bool = false,
        /// The time axis: 0 for (time, batch, ...), 1 for (batch, time, ...).
        axis: i64 = 0,
        /// SequenceMask: the value written past each sequence's end.
        value: f64 = 0.0,
    }
}

/// Which of the three operations, with its parameters.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Last,
    Mask(f64),
    Reverse,
    /// `_backward_SequenceLast(grad, data[, sequence_length])`.
    LastBackward,
}

struct Sequence {
    kind: Kind,
    use_length: bool,
    time_axis: usize,
}

/// (time steps, batch, elements per step and sequence) of data, and the element offset of
/// (t, n) for the layout.
struct Layout {
    steps: usize,
    batch: usize,
    inner: usize,
    time_major: bool,
}

impl Layout {
    fn at(&self, t: usize, n: usize) -> usize {
        let row = if self.time_major { t * self.batch + n } else { n * self.steps + t };
        row * self.inner
    }
}

/// `inner` elements of `values` from `at`: one sequence's values at one time step.
fn step<'a, T>(op: &str, values: &'a [T], at: usize, inner: usize) -> Result<&'a [T]> {
    values.get(at..at + inner).ok_or_else(|| crate::err!(Runtime, "{op}: no {inner} elements at {at} in {}", values.len()))
}

/// [`step`], to write.
fn step_mut<'a, T>(op: &str, values: &'a mut [T], at: usize, inner: usize) -> Result<&'a mut [T]> {
    let len = values.len();
    values.get_mut(at..at + inner).ok_or_else(|| crate::err!(Runtime, "{op}: no {inner} elements at {at} in {len}"))
}

impl Sequence {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Last => "SequenceLast",
            Kind::Mask(_) => "SequenceMask",
            Kind::Reverse => "SequenceReverse",
            Kind::LastBackward => "_backward_SequenceLast",
        }
    }
    /// Index of the data input (the backward takes the gradient first).
    fn data_index(&self) -> usize {
        usize::from(self.kind == Kind::LastBackward)
    }
    fn layout(&self, data: &Shape) -> Result<Layout> {
        let &[first, second, ref rest @ ..] = data.dims() else {
            crate::bail!(Shape, "{}: data must have at least 2 dimensions (time and batch), got {data}", self.name());
        };
        let (steps, batch) = if self.time_axis == 0 { (first, second) } else { (second, first) };
        Ok(Layout { steps, batch, inner: rest.iter().product(), time_major: self.time_axis == 0 })
    }
    /// Each sequence's length, checked against the number of time steps.
    fn lengths(&self, args: &KernelArgs, layout: &Layout) -> Result<Vec<usize>> {
        if !self.use_length {
            return Ok(vec![layout.steps; layout.batch]);
        }
        args.input_f64(self.data_index() + 1)?
            .into_iter()
            .map(|v| {
                if !(v >= 0.0 && v <= layout.steps as f64) || v.fract() != 0.0 {
                    crate::bail!(Value, "{}: sequence_length {v} is not a whole number in [0, {}]", self.name(), layout.steps);
                }
                Ok(v as usize)
            })
            .collect()
    }
}

impl Operator for Sequence {
    fn input_names(&self) -> Vec<String> {
        let mut names = if self.kind == Kind::LastBackward { vec!["grad".to_string(), "data".into()] } else { vec!["data".to_string()] };
        if self.use_length {
            names.push("sequence_length".into());
        }
        names
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let data = inputs.get(self.data_index()).ok_or_else(|| crate::err!(Shape, "{}: the data input is missing", self.name()))?;
        let layout = self.layout(data)?;
        if let Some(lengths) = inputs.get(self.data_index() + 1) {
            if lengths.dims() != [layout.batch] {
                crate::bail!(Shape, "{}: sequence_length has shape {lengths}, expected ({},) for data {data}", self.name(), layout.batch);
            }
        }
        if matches!(self.kind, Kind::Last | Kind::LastBackward) && layout.steps == 0 && layout.batch * layout.inner > 0 {
            crate::bail!(Shape, "{}: data {data} has no time steps to take the last of", self.name());
        }
        if self.kind == Kind::LastBackward {
            let mut last = data.dims().to_vec();
            last.remove(self.time_axis);
            let grad = inputs.first().ok_or_else(|| crate::err!(Shape, "_backward_SequenceLast: the gradient input is missing"))?;
            super::check_out_grad("_backward_SequenceLast", grad, &Shape::new(last))?;
        }
        Ok(vec![match self.kind {
            Kind::Last => {
                let mut dims = data.dims().to_vec();
                dims.remove(self.time_axis);
                Shape::new(dims)
            }
            _ => data.clone(),
        }])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let data = inputs.get(self.data_index()).ok_or_else(|| crate::err!(Type, "{}: the data input is missing", self.name()))?;
        Ok(vec![*data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (op, data) = (self.name(), self.data_index());
        let layout = self.layout(args.input_shape(data)?)?;
        let lengths = self.lengths(args, &layout)?;
        let inner = layout.inner;
        crate::dispatch_dtype!(args.input_dtype(data)?, T => {
            let y = args.output::<T>(0)?;
            match self.kind {
                Kind::Last => {
                    let x = args.input::<T>(data)?;
                    for ((n, &len), last) in lengths.iter().enumerate().zip(y.chunks_mut(inner.max(1))) {
                        last.copy_from_slice(step(op, x, layout.at(len.max(1) - 1, n), inner)?);
                    }
                }
                Kind::LastBackward => {
                    let g = args.input::<T>(0)?;
                    y.fill(T::default());
                    for ((n, &len), grad) in lengths.iter().enumerate().zip(g.chunks(inner.max(1))) {
                        step_mut(op, y, layout.at(len.max(1) - 1, n), inner)?.copy_from_slice(grad);
                    }
                }
                Kind::Mask(value) => {
                    let (x, fill) = (args.input::<T>(data)?, T::from_f64(value));
                    for (n, &len) in lengths.iter().enumerate() {
                        for t in 0..layout.steps {
                            let at = layout.at(t, n);
                            let out = step_mut(op, y, at, inner)?;
                            if t < len {
                                out.copy_from_slice(step(op, x, at, inner)?);
                            } else {
                                out.fill(fill);
                            }
                        }
                    }
                }
                Kind::Reverse => {
                    let x = args.input::<T>(data)?;
                    for (n, &len) in lengths.iter().enumerate() {
                        for t in 0..layout.steps {
                            let from = if t < len { len - 1 - t } else { t };
                            step_mut(op, y, layout.at(t, n), inner)?.copy_from_slice(step(op, x, layout.at(from, n), inner)?);
                        }
                    }
                }
            }
        });
        Ok(())
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let g = d.out_grad(0);
        let mut attrs =
            vec![("use_sequence_length", if self.use_length { "True" } else { "False" }.to_string()), ("axis", self.time_axis.to_string())];
        let mut inputs = vec![g];
        let data_grad = match self.kind {
            Kind::Last => {
                inputs.push(d.input(0));
                if self.use_length {
                    inputs.push(d.input(1));
                }
                let refs: Vec<_> = inputs.iter().collect();
                d.op("_backward_SequenceLast", &attrs, &refs)?
            }
            Kind::Mask(_) | Kind::Reverse => {
                if self.use_length {
                    inputs.push(d.input(1));
                }
                let name = if self.kind == Kind::Reverse { "SequenceReverse" } else { "SequenceMask" };
                attrs.push(("value", "0".to_string()));
                let refs: Vec<_> = inputs.iter().collect();
                d.op(name, &attrs, &refs)?
            }
            Kind::LastBackward => crate::bail!(Value, "_backward_SequenceLast has no gradient"),
        };
        let mut grads = vec![Some(data_grad)];
        if self.use_length {
            grads.push(None);
        }
        Ok(grads)
    }
}

fn build(kind: Kind) -> impl Fn(SequenceParams) -> Result<Sequence> {
    move |p: SequenceParams| {
        let kind = if let Kind::Mask(_) = kind { Kind::Mask(p.value) } else { kind };
        let allowed: &[i64] = if kind == Kind::Reverse { &[0] } else { &[0, 1] };
        if !allowed.contains(&p.axis) {
            crate::bail!(Param, "axis must be {}, got {}", if allowed.len() == 1 { "0" } else { "0 or 1" }, p.axis);
        }
        Ok(Sequence { kind, use_length: p.use_sequence_length, time_axis: p.axis as usize })
    }
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("SequenceLast", &[], "Takes the last valid time step of each sequence.", build(Kind::Last)));
    add(OpDef::new("SequenceMask", &[], "Sets the time steps past each sequence's length to `value`.", build(Kind::Mask(0.0))));
    add(OpDef::new("SequenceReverse", &[], "Reverses the valid time steps of each sequence (time axis 0).", build(Kind::Reverse)));
    add(OpDef::new(
        "_backward_SequenceLast",
        &[],
        "Gradient of SequenceLast: the gradient placed at each sequence's last step.",
        build(Kind::LastBackward),
    ));
}
