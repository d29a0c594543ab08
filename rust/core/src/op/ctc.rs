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
use super::normalization::to_f64;
use super::{ExecContext, OpDef, Operator, SendPtr, Tensor};
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

/// (seq_len, batch, alphabet) of data.
struct Dims {
    steps: usize,
    batch: usize,
    alphabet: usize,
}

impl CtcSetup {
    fn name(&self) -> &'static str {
        if self.backward {
            "_backward_ctc_loss"
        } else {
            "CTCLoss"
        }
    }
    fn data_index(&self) -> usize {
        usize::from(self.backward)
    }
    fn blank(&self, alphabet: usize) -> usize {
        if self.blank_first {
            0
        } else {
            alphabet - 1
        }
    }
    fn dims(&self, data: &Shape, label: &Shape) -> Result<Dims> {
        let op = self.name();
        let [steps, batch, alphabet] = data.dims() else {
            crate::bail!(Shape, "{op}: data must be 3-D (sequence_length, batch, alphabet_size), got {data}");
        };
        let [label_batch, label_len] = label.dims() else {
            crate::bail!(Shape, "{op}: label must be 2-D (batch, label_sequence_length), got {label}");
        };
        if label_batch != batch {
            crate::bail!(Shape, "{op}: label {label} and data {data} must have the same batch size");
        }
        if label_len > steps {
            crate::bail!(Shape, "{op}: label {label} holds more labels per sequence than data {data} has time steps");
        }
        if *alphabet == 0 {
            crate::bail!(Shape, "{op}: data {data} has an empty alphabet (it must include the blank)");
        }
        Ok(Dims { steps: *steps, batch: *batch, alphabet: *alphabet })
    }
    fn check_lengths_shape(&self, what: &str, lengths: &Shape, batch: usize) -> Result<()> {
        if lengths.dims() != [batch] {
            crate::bail!(Shape, "{}: {what} has shape {lengths}, expected ({batch},): one length per batch element", self.name());
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Dims> {
        let at = self.data_index();
        let dims = self.dims(&inputs[at], &inputs[at + 1])?;
        let mut next = at + 2;
        if self.use_data_lengths {
            self.check_lengths_shape("data_lengths", &inputs[next], dims.batch)?;
            next += 1;
        }
        if self.use_label_lengths {
            self.check_lengths_shape("label_lengths", &inputs[next], dims.batch)?;
        }
        Ok(dims)
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
    fn sequences(&self, inputs: &[Tensor], dims: &Dims) -> Result<Vec<Sequence>> {
        let op = self.name();
        let at = self.data_index();
        let label_len = inputs[at + 1].shape.dims()[1];
        let labels = to_f64(&inputs[at + 1]);
        let mut next = at + 2;
        let data_lengths = if self.use_data_lengths {
            next += 1;
            Some(to_f64(&inputs[next - 1]))
        } else {
            None
        };
        let label_lengths = self.use_label_lengths.then(|| to_f64(&inputs[next]));
        let padding = if self.blank_first { 0 } else { -1 };
        let whole_length = |what: &str, value: f64, limit: usize| -> Result<usize> {
            if !(value >= 0.0 && value <= limit as f64) || value.fract() != 0.0 {
                crate::bail!(Value, "{op}: {what} {value} is not a whole number in [0, {limit}]");
            }
            Ok(value as usize)
        };
        (0..dims.batch)
            .map(|b| {
                let steps = match &data_lengths {
                    Some(lengths) => whole_length("data length", lengths[b], dims.steps)?,
                    None => dims.steps,
                };
                // Labels are indices: MXNet converts them to integers by truncation.
                let row: Vec<i64> = labels[b * label_len..(b + 1) * label_len].iter().map(|&v| v as i64).collect();
                let len = match &label_lengths {
                    Some(lengths) => whole_length("label length", lengths[b], label_len)?,
                    None => row.iter().position(|&v| v == padding).unwrap_or(label_len),
                };
                let labels = row[..len]
                    .iter()
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

/// One sequence's forward-backward problem in log space.
struct Lattice {
    /// log softmax of the activations, (steps, alphabet).
    log_probs: Vec<f64>,
    /// The label sequence with blanks around and between its labels (S = 2 L + 1 states).
    states: Vec<usize>,
    /// Whether state s may be entered from s - 2 (skipping the blank between two different labels).
    skip_into: Vec<bool>,
    alphabet: usize,
}

impl Lattice {
    /// `None` when the labels cannot be aligned within the sequence (MXNet's loss 0 case).
    fn new<T: Elem>(data: &[T], dims: &Dims, b: usize, seq: &Sequence, blank: usize) -> Option<Lattice> {
        let repeats = seq.labels.windows(2).filter(|w| w[0] == w[1]).count();
        if seq.labels.len() + repeats > seq.steps || seq.steps == 0 {
            return None;
        }
        let c = dims.alphabet;
        let mut log_probs = vec![0.0; seq.steps * c];
        for (t, out) in log_probs.chunks_exact_mut(c).enumerate() {
            let row = &data[(t * dims.batch + b) * c..][..c];
            let max = row.iter().map(|v| v.to_f64()).fold(f64::NEG_INFINITY, f64::max);
            let log_sum = row.iter().map(|v| (v.to_f64() - max).exp()).sum::<f64>().ln() + max;
            for (o, v) in out.iter_mut().zip(row) {
                *o = v.to_f64() - log_sum;
            }
        }
        let mut states = vec![blank; 2 * seq.labels.len() + 1];
        for (i, &l) in seq.labels.iter().enumerate() {
            states[2 * i + 1] = l;
        }
        let skip_into = (0..states.len()).map(|s| s >= 2 && states[s] != blank && states[s] != states[s - 2]).collect();
        Some(Lattice { log_probs, states, skip_into, alphabet: c })
    }

    fn steps(&self) -> usize {
        self.log_probs.len() / self.alphabet
    }

    fn emit(&self, t: usize, s: usize) -> f64 {
        self.log_probs[t * self.alphabet + self.states[s]]
    }

    /// log alpha (steps, S): the log probability of emitting steps 0..=t and being in state s at
    /// t; and the log likelihood of the whole label sequence.
    fn alphas(&self) -> (Vec<f64>, f64) {
        let (steps, n) = (self.steps(), self.states.len());
        let mut alpha = vec![f64::NEG_INFINITY; steps * n];
        alpha[0] = self.emit(0, 0);
        if n > 1 {
            alpha[1] = self.emit(0, 1);
        }
        for t in 1..steps {
            let (before, now) = alpha.split_at_mut(t * n);
            let prev = &before[(t - 1) * n..];
            for s in 0..n {
                let mut sum = prev[s];
                if s >= 1 {
                    sum = log_add(sum, prev[s - 1]);
                }
                if self.skip_into[s] {
                    sum = log_add(sum, prev[s - 2]);
                }
                now[s] = sum + self.emit(t, s);
            }
        }
        let last = &alpha[(steps - 1) * n..];
        let log_likelihood = if n > 1 { log_add(last[n - 1], last[n - 2]) } else { last[0] };
        (alpha, log_likelihood)
    }

    /// d(-log likelihood) / d activations (steps, alphabet), scaled by `scale`, written through
    /// `write(t, k, value)`: softmax minus the posterior probability of emitting k at t.
    fn gradient(&self, scale: f64, mut write: impl FnMut(usize, usize, f64)) {
        let (alpha, log_likelihood) = self.alphas();
        let (steps, n, c) = (self.steps(), self.states.len(), self.alphabet);
        // log beta of step t: the log probability of emitting steps t+1.. from state s at t.
        let mut beta = vec![f64::NEG_INFINITY; n];
        beta[n - 1] = 0.0;
        if n > 1 {
            beta[n - 2] = 0.0;
        }
        let mut next = vec![f64::NEG_INFINITY; n];
        let mut occupancy = vec![f64::NEG_INFINITY; c];
        for t in (0..steps).rev() {
            if t + 1 < steps {
                // beta_t(s) = sum over the successors s' of s of beta_{t+1}(s') y_{t+1}(s').
                let entered: Vec<f64> = (0..n).map(|s| next[s] + self.emit(t + 1, s)).collect();
                for s in 0..n {
                    let mut sum = entered[s];
                    if s + 1 < n {
                        sum = log_add(sum, entered[s + 1]);
                    }
                    if s + 2 < n && self.skip_into[s + 2] {
                        sum = log_add(sum, entered[s + 2]);
                    }
                    beta[s] = sum;
                }
            }
            occupancy.fill(f64::NEG_INFINITY);
            for s in 0..n {
                let k = self.states[s];
                occupancy[k] = log_add(occupancy[k], alpha[t * n + s] + beta[s]);
            }
            for k in 0..c {
                let softmax = self.log_probs[t * c + k].exp();
                let posterior = (occupancy[k] - log_likelihood).exp();
                write(t, k, scale * (softmax - posterior));
            }
            std::mem::swap(&mut beta, &mut next);
        }
    }
}

/// Run `task(b)` for every batch element, in parallel when the work pays for the threads.
fn for_each_sequence(dims: &Dims, states: usize, task: impl Fn(usize) + Sync) {
    let work_per_sequence = dims.steps * (dims.alphabet + states).max(1);
    let min_chunk = (super::PARALLEL_GRAIN / work_per_sequence.max(1)).max(1);
    super::parallel_chunks(dims.batch, min_chunk, |range| range.for_each(&task));
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
        if let Some(&[_, batch, _]) = inputs[0].as_ref().map(|s| s.dims()) {
            for lengths in inputs.iter_mut().skip(2).filter(|s| s.is_none()) {
                *lengths = Some(Shape::new(vec![batch]));
            }
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        self.0.check_data_dtype(inputs[0])?;
        Ok(vec![inputs[0]])
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        for d in inputs.iter_mut().filter(|d| d.is_none()) {
            *d = Some(DType::F32);
        }
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let (inputs, outputs) = (args.inputs(), args.outputs());
        let dims = self.0.infer_shape(&inputs.iter().map(|t| t.shape.clone()).collect::<Vec<_>>())?;
        let sequences = self.0.sequences(inputs, &dims)?;
        let blank = self.0.blank(dims.alphabet);
        let max_states = sequences.iter().map(|s| 2 * s.labels.len() + 1).max().unwrap_or(1);
        crate::dispatch_dtype!(inputs[0].dtype, T => {
            let data = args.input::<T>(0)?;
            let losses = SendPtr(outputs[0].ptr::<T>());
            for_each_sequence(&dims, max_states, |b| {
                let loss = Lattice::new(data, &dims, b, &sequences[b], blank).map_or(0.0, |lattice| -lattice.alphas().1);
                // SAFETY: b < batch, the output's length; no other task writes element b.
                unsafe { *losses.get().add(b) = T::from_f64(loss) };
            });
        });
        Ok(())
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
        let dims = self.0.infer_shape(inputs)?;
        if inputs[0].dims() != [dims.batch] {
            crate::bail!(Shape, "_backward_ctc_loss: out_grad has shape {}, expected ({},)", inputs[0], dims.batch);
        }
        Ok(vec![inputs[1].clone()])
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        self.0.check_data_dtype(inputs[1])?;
        Ok(vec![inputs[1]])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let inputs = args.inputs();
        let dims = self.0.infer_shape(&inputs.iter().map(|t| t.shape.clone()).collect::<Vec<_>>())?;
        let sequences = self.0.sequences(inputs, &dims)?;
        let blank = self.0.blank(dims.alphabet);
        let scales = to_f64(&inputs[0]);
        let max_states = sequences.iter().map(|s| 2 * s.labels.len() + 1).max().unwrap_or(1);
        crate::dispatch_dtype!(inputs[1].dtype, T => {
            let (data, dx) = (args.input::<T>(1)?, args.output::<T>(0)?);
            dx.fill(T::from_f64(0.0));
            let dx = SendPtr(dx.as_mut_ptr());
            let c = dims.alphabet;
            for_each_sequence(&dims, max_states, |b| {
                if let Some(lattice) = Lattice::new(data, &dims, b, &sequences[b], blank) {
                    lattice.gradient(scales[b], |t, k, value| {
                        // SAFETY: (t, b, k) lies inside dx; only this task writes batch element b.
                        unsafe { *dx.get().add((t * dims.batch + b) * c + k) = T::from_f64(value) };
                    });
                }
            });
        });
        Ok(())
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
