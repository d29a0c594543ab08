//! `CTCLoss` (aliases `ctc_loss`, `_contrib_CTCLoss`, `_contrib_ctc_loss`): Connectionist
//! Temporal Classification loss (Graves et al. 2006) of unnormalized activations
//! `data (seq_len, batch, alphabet)` against label sequences `label (batch, label_len)`, one
//! loss per batch element, and `_backward_ctc_loss`, its gradient with respect to `data`.
//!
//! Both run the forward-backward recursion over the label sequence with blanks interleaved
//! (`S = 2 L + 1` states) in log space and in f64, so that long sequences neither underflow nor
//! lose precision whatever the data dtype; batch elements are independent and run in parallel.
//! The forward op computes only the alphas; the backward op recomputes them and adds the betas,
//! which keeps inference cheap and the forward free of hidden outputs.
//!
//! MXNet's conventions are kept: `blank_label='first'` reserves channel 0 for the blank and pads
//! labels with 0, `'last'` reserves channel `alphabet - 1` and pads with -1; without
//! `label_lengths` a label ends at its first padding value. A label that cannot be aligned within
//! its sequence (`L + repeats > T`) has loss 0 and gradient 0, as MXNet's warp-ctc kernel gives.

use super::grad::{Grad, InputGrads};
use super::{ExecContext, OpDef, Operator};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

crate::op_params! {
    pub struct CtcLossParams {
        /// Whether the third input holds each sequence's length in time steps (otherwise every
        /// sequence is seq_len long).
        use_data_lengths: bool = false,
        /// Whether the last input holds each label sequence's length (otherwise a label ends at
        /// the first padding value: 0 with blank_label='first', -1 with 'last').
        use_label_lengths: bool = false,
        /// Channel reserved for the blank: 'first' (0) or 'last' (alphabet_size - 1).
        blank_label: String = "first".to_string(),
    }
}

/// What the forward and backward ops share: the parameters and how inputs are laid out.
#[derive(Clone, Copy)]
struct CtcSetup {
    use_data_lengths: bool,
    use_label_lengths: bool,
    blank_first: bool,
    /// `_backward_ctc_loss` takes the loss gradient before the forward inputs.
    backward: bool,
}

/// One batch element's problem: its length in time steps and its label sequence.
struct Sequence {
    steps: usize,
    labels: Vec<usize>,
}

/// (seq_len, batch, alphabet) of data, and label's label_len.
struct Dims {
    steps: usize,
    batch: usize,
    alphabet: usize,
    label_len: usize,
}

/// The inputs by role; `out_grad` only for `_backward_ctc_loss`.
struct Roles<'a, X> {
    out_grad: Option<&'a X>,
    data: &'a X,
    label: &'a X,
    data_lengths: Option<&'a X>,
    label_lengths: Option<&'a X>,
}

impl CtcSetup {
    fn name(&self) -> &'static str {
        if self.backward {
            "_backward_ctc_loss"
        } else {
            "CTCLoss"
        }
    }
    fn blank(&self, alphabet: usize) -> usize {
        if self.blank_first {
            0
        } else {
            alphabet - 1
        }
    }
    /// `inputs` (shapes, dtypes, positions) sorted by role, checked to be as many as the
    /// parameters call for.
    fn roles<'a, X>(&self, inputs: &'a [X]) -> Result<Roles<'a, X>> {
        let (out_grad, forward_inputs) = match inputs {
            [out_grad, rest @ ..] if self.backward => (Some(out_grad), rest),
            _ => (None, inputs),
        };
        let (data_lengths, label_lengths, data, label) = match (self.use_data_lengths, self.use_label_lengths, forward_inputs) {
            (false, false, [data, label]) => (None, None, data, label),
            (true, false, [data, label, lengths]) => (Some(lengths), None, data, label),
            (false, true, [data, label, lengths]) => (None, Some(lengths), data, label),
            (true, true, [data, label, data_lengths, label_lengths]) => (Some(data_lengths), Some(label_lengths), data, label),
            _ => {
                let names = self.input_names();
                crate::bail!(Value, "{}: {} inputs expected ({}), got {}", self.name(), names.len(), names.join(", "), inputs.len());
            }
        };
        Ok(Roles { out_grad, data, label, data_lengths, label_lengths })
    }
    fn dims(&self, data: &Shape, label: &Shape) -> Result<Dims> {
        let op = self.name();
        let &[steps, batch, alphabet] = data.dims() else {
            crate::bail!(Shape, "{op}: data must be 3-D (sequence_length, batch, alphabet_size), got {data}");
        };
        let &[label_batch, label_len] = label.dims() else {
            crate::bail!(Shape, "{op}: label must be 2-D (batch, label_sequence_length), got {label}");
        };
        if label_batch != batch {
            crate::bail!(Shape, "{op}: label {label} and data {data} must have the same batch size");
        }
        if label_len > steps {
            crate::bail!(Shape, "{op}: label {label} holds more labels per sequence than data {data} has time steps");
        }
        if alphabet == 0 {
            crate::bail!(Shape, "{op}: data {data} has an empty alphabet (it must include the blank)");
        }
        Ok(Dims { steps, batch, alphabet, label_len })
    }
    fn check_lengths_shape(&self, what: &str, lengths: &Shape, batch: usize) -> Result<()> {
        if lengths.dims() != [batch] {
            crate::bail!(Shape, "{}: {what} has shape {lengths}, expected ({batch},): one length per batch element", self.name());
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Dims> {
        let roles = self.roles(inputs)?;
        let dims = self.dims(roles.data, roles.label)?;
        if let Some(lengths) = roles.data_lengths {
            self.check_lengths_shape("data_lengths", lengths, dims.batch)?;
        }
        if let Some(lengths) = roles.label_lengths {
            self.check_lengths_shape("label_lengths", lengths, dims.batch)?;
        }
        if let Some(out_grad) = roles.out_grad {
            if out_grad.dims() != [dims.batch] {
                crate::bail!(Shape, "{}: out_grad has shape {out_grad}, expected ({},)", self.name(), dims.batch);
            }
        }
        Ok(dims)
    }
    /// The call's dimensions, from its input shapes.
    fn call_dims(&self, args: &KernelArgs) -> Result<Dims> {
        self.infer_shape(&args.inputs().iter().map(|t| t.shape.clone()).collect::<Vec<_>>())
    }
    fn input_names(&self) -> Vec<String> {
        let mut names: Vec<String> = if self.backward { vec!["out_grad".into()] } else { Vec::new() };
        names.extend(["data".to_string(), "label".to_string()]);
        if self.use_data_lengths {
            names.push("data_lengths".into());
        }
        if self.use_label_lengths {
            names.push("label_lengths".into());
        }
        names
    }
    fn check_data_dtype(&self, data: DType) -> Result<()> {
        if !data.is_float() {
            crate::bail!(Type, "{}: data must hold floating-point activations, got {data}", self.name());
        }
        Ok(())
    }
    /// Every batch element's length and labels, validated before any kernel work starts.
    fn sequences(&self, args: &KernelArgs, dims: &Dims) -> Result<Vec<Sequence>> {
        let op = self.name();
        let positions: Vec<usize> = (0..args.inputs().len()).collect();
        let roles = self.roles(&positions)?;
        let labels = args.input_f64(*roles.label)?;
        let data_lengths = roles.data_lengths.map(|&i| args.input_f64(i)).transpose()?;
        let label_lengths = roles.label_lengths.map(|&i| args.input_f64(i)).transpose()?;
        let padding = if self.blank_first { 0 } else { -1 };
        let whole_length = |what: &str, lengths: &[f64], b: usize, limit: usize| -> Result<usize> {
            let Some(&value) = lengths.get(b) else {
                crate::bail!(Shape, "{op}: {what}s hold {} values, fewer than the batch of {}", lengths.len(), dims.batch);
            };
            if !(value >= 0.0 && value <= limit as f64) || value.fract() != 0.0 {
                crate::bail!(Value, "{op}: {what} {value} is not a whole number in [0, {limit}]");
            }
            Ok(value as usize)
        };
        let label_len = dims.label_len;
        (0..dims.batch)
            .map(|b| {
                let steps = match &data_lengths {
                    Some(lengths) => whole_length("data length", lengths, b, dims.steps)?,
                    None => dims.steps,
                };
                let Some(row) = labels.get(b * label_len..(b + 1) * label_len) else {
                    crate::bail!(Shape, "{op}: label holds {} values, fewer than batch {} x {label_len}", labels.len(), dims.batch);
                };
                // Labels are indices: MXNet converts them to integers by truncation.
                let row: Vec<i64> = row.iter().map(|&v| v as i64).collect();
                let len = match &label_lengths {
                    Some(lengths) => whole_length("label length", lengths, b, label_len)?,
                    None => row.iter().position(|&v| v == padding).unwrap_or(label_len),
                };
                let labels = row
                    .iter()
                    .take(len)
                    .map(|&v| {
                        if v < 0 || v as usize >= dims.alphabet {
                            crate::bail!(Index, "{op}: label {v} of batch element {b} is not a channel index in [0, {})", dims.alphabet);
                        }
                        Ok(v as usize)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Sequence { steps, labels })
            })
            .collect()
    }
}

/// log(exp(a) + exp(b)) without overflow, exact when either is -inf.
#[inline]
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}

/// What state s sees of state s + `offset` in `row`: log 0 past the last state, which leaves
/// [`log_add`] exact.
fn ahead(row: &[f64], offset: usize) -> impl Iterator<Item = f64> + '_ {
    row.iter().skip(offset).copied().chain(std::iter::repeat(f64::NEG_INFINITY))
}

/// What state s sees of state s - `offset` in `row`: log 0 before the first state.
fn behind(row: &[f64], offset: usize) -> impl Iterator<Item = f64> + '_ {
    std::iter::repeat_n(f64::NEG_INFINITY, offset).chain(row.iter().copied())
}

/// One sequence's forward-backward problem in log space.
struct Lattice {
    /// log softmax of the activations, (steps, alphabet).
    log_probs: Vec<f64>,
    /// The label sequence with blanks around and between its labels (S = 2 L + 1 states).
    states: Vec<usize>,
    /// Whether state s may be entered from s - 2 (skipping the blank between two different labels).
    skip_into: Vec<bool>,
    /// Never 0, so that the rows of `log_probs` are whole.
    alphabet: usize,
}

impl Lattice {
    /// `None` when the labels cannot be aligned within the sequence (MXNet's loss 0 case).
    fn new<T: Elem>(data: &[T], dims: &Dims, b: usize, seq: &Sequence, blank: usize) -> Option<Lattice> {
        let repeats = seq.labels.iter().zip(seq.labels.iter().skip(1)).filter(|(label, next)| label == next).count();
        let c = dims.alphabet;
        if seq.labels.len() + repeats > seq.steps || seq.steps == 0 || c == 0 {
            return None;
        }
        let mut log_probs = vec![0.0; seq.steps * c];
        // Step t of batch element b is data's row t * batch + b.
        let rows = data.chunks_exact(c).skip(b).step_by(dims.batch.max(1));
        for (out, row) in log_probs.chunks_exact_mut(c).zip(rows) {
            let max = row.iter().map(|v| v.to_f64()).fold(f64::NEG_INFINITY, f64::max);
            let log_sum = row.iter().map(|v| (v.to_f64() - max).exp()).sum::<f64>().ln() + max;
            for (o, v) in out.iter_mut().zip(row) {
                *o = v.to_f64() - log_sum;
            }
        }
        let mut states = vec![blank; 2 * seq.labels.len() + 1];
        for (state, &l) in states.iter_mut().skip(1).step_by(2).zip(&seq.labels) {
            *state = l;
        }
        let skip_into = states
            .iter()
            .enumerate()
            .map(|(s, &state)| state != blank && s.checked_sub(2).and_then(|from| states.get(from)).is_some_and(|&from| from != state))
            .collect();
        Some(Lattice { log_probs, states, skip_into, alphabet: c })
    }

    fn steps(&self) -> usize {
        self.log_probs.len() / self.alphabet
    }

    /// log y(state) for every state, from one step's log probabilities (log 0 for a channel
    /// outside the row, which validated labels never are).
    fn emissions<'a>(&'a self, log_probs: &'a [f64]) -> impl Iterator<Item = f64> + 'a {
        self.states.iter().map(|&k| log_probs.get(k).copied().unwrap_or(f64::NEG_INFINITY))
    }

    /// log alpha (steps, S): the log probability of emitting steps 0..=t and being in state s at
    /// t; and the log likelihood of the whole label sequence.
    fn alphas(&self) -> (Vec<f64>, f64) {
        let n = self.states.len();
        let mut alpha = vec![f64::NEG_INFINITY; self.steps() * n];
        let mut probs = self.log_probs.chunks_exact(self.alphabet);
        let mut rows = alpha.chunks_exact_mut(n);
        let log_likelihood = match (rows.next(), probs.next()) {
            (Some(first), Some(first_probs)) => {
                // A path starts in the leading blank or the first label.
                for (a, e) in first.iter_mut().zip(self.emissions(first_probs)).take(2) {
                    *a = e;
                }
                let mut prev: &[f64] = first;
                for (now, step_probs) in rows.zip(probs) {
                    let predecessors = prev.iter().zip(behind(prev, 1)).zip(behind(prev, 2));
                    for (((a, e), &skip), ((&stay, advance), skipped)) in
                        now.iter_mut().zip(self.emissions(step_probs)).zip(&self.skip_into).zip(predecessors)
                    {
                        let mut sum = log_add(stay, advance);
                        if skip {
                            sum = log_add(sum, skipped);
                        }
                        *a = sum + e;
                    }
                    prev = now;
                }
                // A path ends in the last label or the trailing blank.
                match prev {
                    [.., second_last, last] => log_add(*last, *second_last),
                    [only] => *only,
                    [] => f64::NEG_INFINITY,
                }
            }
            _ => f64::NEG_INFINITY,
        };
        (alpha, log_likelihood)
    }

    /// d(-log likelihood) / d activations, scaled by `scale`, into `rows` (one row of the
    /// alphabet per step): softmax minus the posterior probability of emitting k at t.
    fn gradient<T: Elem>(&self, scale: f64, rows: &mut [&mut [T]]) {
        let (alpha, log_likelihood) = self.alphas();
        let (steps, n, c) = (self.steps(), self.states.len(), self.alphabet);
        // log beta of step t: the log probability of emitting steps t+1.. from state s at t.
        let mut beta = vec![f64::NEG_INFINITY; n];
        // A path ends in the last label or the trailing blank.
        beta.iter_mut().rev().take(2).for_each(|b| *b = 0.0);
        let mut next = vec![f64::NEG_INFINITY; n];
        let mut entered = vec![f64::NEG_INFINITY; n];
        let mut occupancy = vec![f64::NEG_INFINITY; c];
        let mut later_probs: Option<&[f64]> = None;
        let steps_back = alpha.rchunks_exact(n).zip(self.log_probs.rchunks_exact(c)).zip(rows.iter_mut().take(steps).rev());
        for ((alpha_row, probs), out) in steps_back {
            if let Some(later_probs) = later_probs {
                // beta_t(s) = sum over the successors s' of s of beta_{t+1}(s') y_{t+1}(s').
                for (e, (b, y)) in entered.iter_mut().zip(next.iter().zip(self.emissions(later_probs))) {
                    *e = b + y;
                }
                let successors = entered.iter().zip(ahead(&entered, 1)).zip(ahead(&entered, 2));
                let skips = self.skip_into.iter().skip(2).copied().chain(std::iter::repeat(false));
                for ((b, ((&stay, advance), skipped)), skip) in beta.iter_mut().zip(successors).zip(skips) {
                    let mut sum = log_add(stay, advance);
                    if skip {
                        sum = log_add(sum, skipped);
                    }
                    *b = sum;
                }
            }
            occupancy.fill(f64::NEG_INFINITY);
            for ((&k, &a), &b) in self.states.iter().zip(alpha_row).zip(&beta) {
                if let Some(o) = occupancy.get_mut(k) {
                    *o = log_add(*o, a + b);
                }
            }
            for ((o, &log_prob), &occupied) in out.iter_mut().zip(probs).zip(&occupancy) {
                let posterior = (occupied - log_likelihood).exp();
                *o = T::from_f64(scale * (log_prob.exp() - posterior));
            }
            std::mem::swap(&mut beta, &mut next);
            later_probs = Some(probs);
        }
    }
}

/// Batch elements per parallel task, so that a task's work pays for its thread.
fn min_sequences_per_task(dims: &Dims, states: usize) -> usize {
    let work_per_sequence = dims.steps * (dims.alphabet + states).max(1);
    (super::PARALLEL_GRAIN / work_per_sequence.max(1)).max(1)
}

fn max_states(sequences: &[Sequence]) -> usize {
    sequences.iter().map(|s| 2 * s.labels.len() + 1).max().unwrap_or(1)
}

struct CtcLoss(CtcSetup);

impl Operator for CtcLoss {
    fn input_names(&self) -> Vec<String> {
        self.0.input_names()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let dims = self.0.infer_shape(inputs)?;
        Ok(vec![Shape::new(vec![dims.batch])])
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        // The length inputs hold one value per batch element, the batch being data's axis 1.
        if let Some(&[_, batch, _]) = inputs.first().and_then(Option::as_ref).map(|s| s.dims()) {
            for lengths in inputs.iter_mut().skip(2).filter(|s| s.is_none()) {
                *lengths = Some(Shape::new(vec![batch]));
            }
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &data = self.0.roles(inputs)?.data;
        self.0.check_data_dtype(data)?;
        Ok(vec![data])
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        for d in inputs.iter_mut().filter(|d| d.is_none()) {
            *d = Some(DType::F32);
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dims = self.0.call_dims(args)?;
        let sequences = self.0.sequences(args, &dims)?;
        let blank = self.0.blank(dims.alphabet);
        let min_sequences = min_sequences_per_task(&dims, max_states(&sequences));
        crate::dispatch_dtype!(args.input_dtype(0)?, T => {
            let (data, losses) = (args.input::<T>(0)?, args.output::<T>(0)?);
            super::parallel_units(losses, 1, min_sequences, |first, piece| {
                for ((b, loss), seq) in (first..).zip(piece).zip(sequences.iter().skip(first)) {
                    let value = Lattice::new(data, &dims, b, seq, blank).map_or(0.0, |lattice| -lattice.alphas().1);
                    *loss = T::from_f64(value);
                }
                Ok(())
            })
        })
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let mut inputs = vec![d.out_grad(0)];
        inputs.extend((0..d.num_inputs()).map(|i| d.input(i)));
        let refs: Vec<_> = inputs.iter().collect();
        let data_grad = d.op("_backward_ctc_loss", &setup_attrs(&self.0), &refs)?;
        let mut grads = vec![Some(data_grad)];
        grads.resize(d.num_inputs(), None);
        Ok(grads)
    }
}

fn setup_attrs(setup: &CtcSetup) -> Vec<(&'static str, String)> {
    let flag = |on: bool| if on { "True" } else { "False" }.to_string();
    vec![
        ("use_data_lengths", flag(setup.use_data_lengths)),
        ("use_label_lengths", flag(setup.use_label_lengths)),
        ("blank_label", if setup.blank_first { "first" } else { "last" }.to_string()),
    ]
}

/// `_backward_ctc_loss(out_grad, data, label[, data_lengths][, label_lengths])`: the gradient of
/// each batch element's loss with respect to its activations, times that element's out_grad;
/// zero past each sequence's length.
struct CtcLossBackward(CtcSetup);

impl Operator for CtcLossBackward {
    fn input_names(&self) -> Vec<String> {
        self.0.input_names()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        self.0.infer_shape(inputs)?;
        Ok(vec![self.0.roles(inputs)?.data.clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let &data = self.0.roles(inputs)?.data;
        self.0.check_data_dtype(data)?;
        Ok(vec![data])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dims = self.0.call_dims(args)?;
        let sequences = self.0.sequences(args, &dims)?;
        let blank = self.0.blank(dims.alphabet);
        let scales = args.input_f64(0)?;
        let min_sequences = min_sequences_per_task(&dims, max_states(&sequences));
        crate::dispatch_dtype!(args.input_dtype(1)?, T => {
            let (data, dx) = (args.input::<T>(1)?, args.output::<T>(0)?);
            dx.fill(T::from_f64(0.0));
            // dx is (steps, batch, alphabet): batch element b owns rows b, b + batch, ..., handed
            // to it as one list so that parallel tasks write disjoint rows.
            let mut rows_of_sequence: Vec<Vec<&mut [T]>> = (0..dims.batch).map(|_| Vec::with_capacity(dims.steps)).collect();
            for step in dx.chunks_exact_mut((dims.batch * dims.alphabet).max(1)) {
                for (row, rows) in step.chunks_exact_mut(dims.alphabet.max(1)).zip(&mut rows_of_sequence) {
                    rows.push(row);
                }
            }
            super::parallel_units(&mut rows_of_sequence, 1, min_sequences, |first, piece| {
                for ((b, rows), (seq, &scale)) in (first..).zip(piece).zip(sequences.iter().zip(&scales).skip(first)) {
                    if let Some(lattice) = Lattice::new(data, &dims, b, seq, blank) {
                        lattice.gradient(scale, rows);
                    }
                }
                Ok(())
            })
        })
    }
}

fn setup(p: CtcLossParams, backward: bool) -> Result<CtcSetup> {
    let blank_first = match p.blank_label.as_str() {
        "first" => true,
        "last" => false,
        other => crate::bail!(Param, "blank_label must be 'first' or 'last', got '{other}'"),
    };
    Ok(CtcSetup { use_data_lengths: p.use_data_lengths, use_label_lengths: p.use_label_lengths, blank_first, backward })
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "CTCLoss",
        &["ctc_loss", "_contrib_CTCLoss", "_contrib_ctc_loss"],
        "Connectionist Temporal Classification loss of activations data (sequence_length, batch, alphabet_size), \
         softmax applied inside, against label (batch, label_sequence_length): one loss per batch element. \
         blank_label 'first' reserves channel 0 for the blank and pads labels with 0; 'last' reserves \
         channel alphabet_size-1 and pads with -1.",
        |p: CtcLossParams| Ok(CtcLoss(setup(p, false)?)),
    ));
    add(OpDef::new("_backward_ctc_loss", &[], "Gradient of CTCLoss with respect to data.", |p: CtcLossParams| Ok(CtcLossBackward(setup(p, true)?))));
}
