//! The fused recurrent operator `RNN` as MXNet 1.x defines it (cuDNN's layout): stacked,
//! optionally bidirectional relu/tanh RNN, LSTM or GRU over (time, batch, input) data, with every
//! weight in one flat parameter vector (all i2h/h2h weights layer by layer and direction by
//! direction, then all biases in the same order; gates ordered i, f, g, o for LSTM and r, z, n
//! for GRU).
//!
//! With `projection_size` (LSTMP, cuDNN's and MXNet's form) an LSTM's hidden state is projected
//! to `projection_size` values by one more weight matrix per layer and direction (`h2r`, after
//! that direction's h2h weight in the flat vector): the projection is the output, the next
//! layer's input and the recurrent state, while the cell keeps `state_size` values.
//!
//! With `use_sequence_length` each sequence of the batch has its own length (an extra input):
//! time steps at or past it are skipped, as by cuDNN's padded layout. Their outputs are zero and
//! get no gradient, the final states are each sequence's state after its own last step, and the
//! backward direction starts at each sequence's own end from the initial state. (MXNet 1.9.1
//! offers lengths and projections only through cuDNN; its CPU kernel refuses both.)
//!
//! Each layer and direction projects the inputs of all time steps with one GEMM, then runs one
//! GEMM per step for the recurrence. A call that will be differentiated keeps the gate
//! activations of every step (and the inner layers' outputs) in a hidden `reserve` output,
//! cuDNN's and MXNet's reserve space, which the gradient kernel reads to backpropagate through
//! time; a call that will not gets an empty reserve and reuses one trace for every layer
//! (`Operator::backward_only_outputs`). Recomputing the forward pass in the gradient instead
//! cost a third of a training step (2-layer LSTM, hidden 512, 35 steps, batch 32: 108 ms
//! forward + backward, 31 ms of it the recomputation). Inter-layer dropout keeps its mask as a
//! hidden output so that both passes see the same mask.

use super::grad::{Grad, InputGrads};
use super::linalg::{matmul_into, Mat};
use super::{outside, part, part_mut, ExecContext, OpDef, Operator, SendPtr};
use crate::backend::cpu::fast_math::{sigmoid_f32, tanh_f32};
use crate::backend::cpu::packed_gemm::{Operand, PackedB};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;
use crate::op::KernelArgs;

/// The operator named in this module's errors.
const OP: &str = "RNN";

crate::op_params! {
    pub struct RnnParams {
        /// Hidden units per layer and direction.
        state_size: usize,
        /// Number of stacked layers.
        num_layers: usize,
        /// Whether each layer also runs backwards in time (outputs concatenated).
        bidirectional: bool = false,
        /// The recurrent cell.
        mode: RnnMode,
        /// Dropout probability applied to the outputs of every layer but the last while training.
        p: f64 = 0.0,
        /// Whether the final hidden (and LSTM cell) states are outputs too.
        state_outputs: bool = false,
        /// LSTM only: size of the projected hidden state (LSTMP); the cell keeps `state_size`.
        projection_size: Option<i64> = None,
        /// Lower bound of the LSTM cell state.
        lstm_state_clip_min: Option<f64> = None,
        /// Upper bound of the LSTM cell state.
        lstm_state_clip_max: Option<f64> = None,
        /// Whether a NaN cell state is clipped too (to the lower bound) instead of propagating.
        lstm_state_clip_nan: bool = false,
        /// Whether a (batch,) `sequence_length` input gives each sequence's number of valid steps.
        use_sequence_length: bool = false,
    }
}

crate::param_choice! {
    /// The RNN operator's recurrent cell.
    pub enum RnnMode { Relu = "rnn_relu", Tanh = "rnn_tanh", Lstm = "lstm", Gru = "gru" }
}

impl RnnMode {
    fn gates(self) -> usize {
        match self {
            RnnMode::Relu | RnnMode::Tanh => 1,
            RnnMode::Lstm => 4,
            RnnMode::Gru => 3,
        }
    }
}

/// Cell arithmetic in the tensor's own precision (fast vectorizable float32 transcendental
/// functions, std's for float64).
trait Real: Elem + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self> {
    const ZERO: Self;
    const ONE: Self;
    fn sigmoid(self) -> Self;
    fn tanh(self) -> Self;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    #[inline(always)]
    fn sigmoid(self) -> f32 {
        sigmoid_f32(self)
    }
    #[inline(always)]
    fn tanh(self) -> f32 {
        tanh_f32(self)
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn sigmoid(self) -> f64 {
        1.0 / (1.0 + (-self).exp())
    }
    fn tanh(self) -> f64 {
        f64::tanh(self)
    }
}

#[derive(Clone, Debug)]
struct Rnn {
    mode: RnnMode,
    hidden: usize,
    layers: usize,
    dirs: usize,
    dropout: f64,
    state_outputs: bool,
    /// LSTM cell clipping bounds and whether NaN is clipped too.
    clip: Option<(f64, f64, bool)>,
    /// LSTMP's projected state size.
    projection: Option<usize>,
    /// Whether per-sequence lengths come as the last input.
    use_lengths: bool,
}

/// Where one (layer, direction)'s parameter blocks start in the flat vector, and its input width.
struct Slots {
    w_ih: usize,
    w_hh: usize,
    /// LSTMP's projection weight (meaningful only with a projection).
    w_hr: usize,
    b_ih: usize,
    b_hh: usize,
    input: usize,
}

/// (time steps, batch, input width) of the data.
#[derive(Clone, Copy)]
struct Dims {
    steps: usize,
    batch: usize,
    input: usize,
}

impl Rnn {
    fn gate_width(&self) -> usize {
        self.mode.gates() * self.hidden
    }
    /// Width of the recurrent state and of each direction's output: the projection's with
    /// LSTMP, the hidden size otherwise.
    fn state_width(&self) -> usize {
        self.projection.unwrap_or(self.hidden)
    }
    fn projection_weights(&self) -> usize {
        self.projection.map_or(0, |p| p * self.hidden)
    }
    fn layer_input(&self, layer: usize, input: usize) -> usize {
        if layer == 0 {
            input
        } else {
            self.dirs * self.state_width()
        }
    }
    fn direction_weights(&self, layer: usize, input: usize) -> usize {
        self.gate_width() * (self.layer_input(layer, input) + self.state_width()) + self.projection_weights()
    }
    fn layer_weights(&self, layer: usize, input: usize) -> usize {
        self.dirs * self.direction_weights(layer, input)
    }
    fn param_count(&self, input: usize) -> usize {
        (0..self.layers).map(|l| self.layer_weights(l, input)).sum::<usize>() + self.layers * self.dirs * 2 * self.gate_width()
    }
    fn slots(&self, input: usize, layer: usize, dir: usize) -> Slots {
        let gh = self.gate_width();
        let layer_in = self.layer_input(layer, input);
        let w_ih = (0..layer).map(|l| self.layer_weights(l, input)).sum::<usize>() + dir * self.direction_weights(layer, input);
        let weights: usize = (0..self.layers).map(|l| self.layer_weights(l, input)).sum();
        let b_ih = weights + (layer * self.dirs + dir) * 2 * gh;
        let w_hh = w_ih + gh * layer_in;
        Slots { w_ih, w_hh, w_hr: w_hh + gh * self.state_width(), b_ih, b_hh: b_ih + gh, input: layer_in }
    }
    fn has_mask(&self) -> bool {
        self.dropout > 0.0 && self.layers > 1
    }
    fn num_states(&self) -> usize {
        if self.mode == RnnMode::Lstm {
            2
        } else {
            1
        }
    }
    fn num_visible(&self) -> usize {
        1 + if self.state_outputs { self.num_states() } else { 0 }
    }
    fn state_shape(&self, d: Dims) -> Shape {
        Shape::new(vec![self.layers * self.dirs, d.batch, self.state_width()])
    }
    fn cell_shape(&self, d: Dims) -> Shape {
        Shape::new(vec![self.layers * self.dirs, d.batch, self.hidden])
    }
    /// Shapes of the initial states: the hidden state, and for LSTM the cell.
    fn initial_state_shapes(&self, d: Dims) -> Vec<Shape> {
        let mut shapes = vec![self.state_shape(d)];
        if self.mode == RnnMode::Lstm {
            shapes.push(self.cell_shape(d));
        }
        shapes
    }
    /// Index of the `sequence_length` input.
    fn lengths_index(&self) -> usize {
        2 + self.num_states()
    }
    /// Each sequence's number of valid steps: the `sequence_length` input (of the call's inputs
    /// from `first` on), checked, or every step when lengths are not used.
    fn lengths(&self, args: &KernelArgs, first: usize, d: Dims) -> Result<Vec<usize>> {
        if !self.use_lengths {
            return Ok(vec![d.steps; d.batch]);
        }
        let values = args.input_f64(first + self.lengths_index())?;
        if values.len() != d.batch {
            crate::bail!(Shape, "RNN: sequence_length holds {} values for a batch of {}", values.len(), d.batch);
        }
        values
            .into_iter()
            .map(|v| {
                if !(v >= 0.0 && v <= d.steps as f64) || v.fract() != 0.0 {
                    crate::bail!(Value, "RNN: sequence_length {v} is not a whole number in [0, {}] (the data's time steps)", d.steps);
                }
                Ok(v as usize)
            })
            .collect()
    }
    fn dims(&self, data: &Shape) -> Result<Dims> {
        let &[steps, batch, input] = data.dims() else {
            crate::bail!(Shape, "RNN: data must be 3-D (time, batch, input), got {data}");
        };
        // `build` makes both positive; the kernels cut rows of these widths.
        if self.hidden == 0 || self.state_width() == 0 {
            crate::bail!(Param, "RNN: state_size and projection_size must be positive");
        }
        Ok(Dims { steps, batch, input })
    }
    /// Shapes of the visible outputs followed by the dropout mask's and the reserve's.
    fn output_shapes(&self, d: Dims) -> Vec<Shape> {
        let mut shapes = vec![Shape::new(vec![d.steps, d.batch, self.dirs * self.state_width()])];
        if self.state_outputs {
            shapes.extend(self.initial_state_shapes(d));
        }
        if self.has_mask() {
            shapes.push(Shape::new(vec![self.layers - 1, d.steps, d.batch, self.dirs * self.state_width()]));
        }
        shapes.push(Shape::new(vec![self.reserve_len(d)]));
        shapes
    }
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data".to_string(), "parameters".into(), "state".into()];
        if self.mode == RnnMode::Lstm {
            names.push("state_cell".into());
        }
        if self.use_lengths {
            names.push("sequence_length".into());
        }
        names
    }
    /// Checks data, parameters, states and lengths against each other.
    fn check_inputs(&self, inputs: &[Shape]) -> Result<Dims> {
        let missing = || crate::err!(Shape, "RNN: inputs {} expected, got {} input(s)", self.input_names().join(", "), inputs.len());
        let (Some(data), Some(params)) = (inputs.first(), inputs.get(1)) else {
            return Err(missing());
        };
        let d = self.dims(data)?;
        let count = self.param_count(d.input);
        if params.dims() != [count] {
            crate::bail!(
                Shape,
                "RNN: parameters has shape {params}, expected ({count},) for data {data} ({} layers, state_size {})",
                self.layers,
                self.hidden
            );
        }
        let states = inputs.get(2..2 + self.num_states()).ok_or_else(missing)?;
        for ((name, shape), expected) in ["state", "state_cell"].iter().zip(states).zip(self.initial_state_shapes(d)) {
            if *shape != expected {
                crate::bail!(Shape, "RNN: {name} has shape {shape}, expected {expected} for data {data}");
            }
        }
        if self.use_lengths {
            let lengths = inputs.get(self.lengths_index()).ok_or_else(missing)?;
            if lengths.dims() != [d.batch] {
                crate::bail!(Shape, "RNN: sequence_length has shape {lengths}, expected ({},) for data {data}", d.batch);
            }
        }
        Ok(d)
    }
}

/// What backpropagation needs of one (layer, direction)'s forward pass: `S` is a slice of the
/// reserve, read-write while the forward pass fills it, read-only for the gradient.
struct Trace<S> {
    /// (time, batch, gates x hidden): activated gates (LSTM i f g o, GRU r z n, RNN h).
    gates: S,
    /// LSTM: the (clipped) cell state of every step.
    cells: S,
    /// GRU: W_hn h + b_hn of every step (the part the reset gate scales).
    hidden_n: S,
    /// LSTMP: the hidden state before its projection, of every step.
    unprojected: S,
}

impl Rnn {
    /// Lengths of a trace's parts, in the order of [`Trace`]'s fields.
    fn trace_parts(&self, d: Dims) -> [usize; 4] {
        let rows = d.steps * d.batch;
        let per_step = |used: bool| if used { rows * self.hidden } else { 0 };
        [rows * self.gate_width(), per_step(self.mode == RnnMode::Lstm), per_step(self.mode == RnnMode::Gru), per_step(self.projection.is_some())]
    }
    fn trace_len(&self, d: Dims) -> usize {
        self.trace_parts(d).iter().sum()
    }
    /// Elements of one layer's output: (time, batch, directions x state width).
    fn layer_output_len(&self, d: Dims) -> usize {
        d.steps * d.batch * self.dirs * self.state_width()
    }
    /// Elements of the reserve: every (layer, direction)'s trace, then the outputs of every
    /// layer but the last (the last one's is the operator's output).
    fn reserve_len(&self, d: Dims) -> usize {
        self.layers * self.dirs * self.trace_len(d) + (self.layers - 1) * self.layer_output_len(d)
    }
    fn split_trace<'a, T>(&self, d: Dims, block: &'a mut [T]) -> Result<Trace<&'a mut [T]>> {
        let [gates, cells, hidden_n, _] = self.trace_parts(d);
        let total = block.len();
        let short = || crate::err!(Runtime, "RNN: a trace block of {total} elements is shorter than its parts {:?}", self.trace_parts(d));
        let (gates, rest) = block.split_at_mut_checked(gates).ok_or_else(short)?;
        let (cells, rest) = rest.split_at_mut_checked(cells).ok_or_else(short)?;
        let (hidden_n, unprojected) = rest.split_at_mut_checked(hidden_n).ok_or_else(short)?;
        Ok(Trace { gates, cells, hidden_n, unprojected })
    }
    fn view_trace<'a, T>(&self, d: Dims, block: &'a [T]) -> Result<Trace<&'a [T]>> {
        let [gates, cells, hidden_n, _] = self.trace_parts(d);
        let short = || crate::err!(Runtime, "RNN: a trace block of {} elements is shorter than its parts {:?}", block.len(), self.trace_parts(d));
        let (gates, rest) = block.split_at_checked(gates).ok_or_else(short)?;
        let (cells, rest) = rest.split_at_checked(cells).ok_or_else(short)?;
        let (hidden_n, unprojected) = rest.split_at_checked(hidden_n).ok_or_else(short)?;
        Ok(Trace { gates, cells, hidden_n, unprojected })
    }
    /// The output of layer `layer`: the operator's output `top` for the last layer, else its
    /// block of the reserve's `inner` layer outputs.
    fn layer_output<'a, T>(&self, d: Dims, layer: usize, top: &'a [T], inner: &'a [T]) -> Result<&'a [T]> {
        if layer + 1 == self.layers {
            return Ok(top);
        }
        let len = self.layer_output_len(d);
        part(OP, inner, layer * len, len, "an inner layer's output")
    }
}

/// The first `N` consecutive blocks of `len` elements of `values` (one row's gate blocks).
#[inline]
fn blocks<T, const N: usize>(values: &[T], len: usize) -> Result<[&[T]; N]> {
    let mut rest = values;
    let mut out: [&[T]; N] = [&[]; N];
    for (k, block) in out.iter_mut().enumerate() {
        let (head, tail) = rest.split_at_checked(len).ok_or_else(|| outside(OP, "a gate block", k * len, len, values.len()))?;
        (*block, rest) = (head, tail);
    }
    Ok(out)
}

/// [`blocks`], writable.
#[inline]
fn blocks_mut<T, const N: usize>(values: &mut [T], len: usize) -> Result<[&mut [T]; N]> {
    let total = values.len();
    let mut rest = values;
    let mut out: [&mut [T]; N] = std::array::from_fn(|_| Default::default());
    for (k, block) in out.iter_mut().enumerate() {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut_checked(len).ok_or_else(|| outside(OP, "a gate block", k * len, len, total))?;
        (*block, rest) = (head, tail);
    }
    Ok(out)
}

/// `dst = src` for a whole output, checked to be `src`'s length.
fn copy_output<T: Copy>(what: &str, dst: &mut [T], src: &[T]) -> Result<()> {
    if dst.len() != src.len() {
        crate::bail!(Shape, "RNN: {what} holds {} elements, expected {}", dst.len(), src.len());
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// One forward or backward computation over given parameters.
struct Pass<'a, T> {
    rnn: &'a Rnn,
    d: Dims,
    params: &'a [T],
    /// Valid steps of each sequence of the batch (one per batch row, checked by `Rnn::lengths`).
    lengths: &'a [usize],
    threads: usize,
}

/// `dst (+)= a * b` for row-major operands given as (stored rows, stored cols, transposed),
/// each checked to hold the matrix it describes.
fn gemm<T: Elem>(
    dst: &mut [T],
    accumulate: bool,
    a: &[T],
    am: (usize, usize, bool),
    b: &[T],
    bm: (usize, usize, bool),
    threads: usize,
) -> Result<()> {
    let read = |(rows, cols, transposed): (usize, usize, bool)| if transposed { (cols, rows) } else { (rows, cols) };
    let ((m, k), (kb, n)) = (read(am), read(bm));
    if k != kb || a.len() < am.0 * am.1 || b.len() < bm.0 * bm.1 || dst.len() < m * n {
        crate::bail!(
            Runtime,
            "RNN: a product of ({m} x {k}) from {} elements and ({kb} x {n}) from {} elements into {} elements",
            a.len(),
            b.len(),
            dst.len()
        );
    }
    // SAFETY: a and b hold their stored matrices and dst the m x n product (checked above), all
    // of element type T, whose dtype is passed; dst is a unique borrow, so it overlaps neither
    // operand.
    unsafe {
        matmul_into(
            T::DTYPE,
            dst.as_mut_ptr().cast::<u8>(),
            accumulate,
            a.as_ptr().cast::<u8>(),
            Mat::stored(am.0, am.1, am.2),
            b.as_ptr().cast::<u8>(),
            Mat::stored(bm.0, bm.1, bm.2),
            threads,
        )
    };
    Ok(())
}

/// A weight the recurrence multiplies by a few state rows at every time step: packed once for
/// the float32 kernel where the CPU has it (a step's product then packs only its state rows),
/// else read in place.
enum StepWeight<'a, T> {
    /// The packed weight and its product's (k, n).
    Packed(PackedB, (usize, usize)),
    Stored(&'a [T], (usize, usize, bool)),
}

impl<'a, T: Elem> StepWeight<'a, T> {
    /// `w` stored as (rows, cols, transposed), as [`gemm`]'s operands.
    fn new(w: &'a [T], (rows, cols, transposed): (usize, usize, bool)) -> Result<StepWeight<'a, T>> {
        if T::DTYPE != DType::F32 || !crate::backend::cpu::packed_gemm::available() {
            return Ok(StepWeight::Stored(w, (rows, cols, transposed)));
        }
        if w.len() < rows * cols {
            crate::bail!(Runtime, "RNN: a recurrent weight of {rows} x {cols} from {} elements", w.len());
        }
        // The product's right operand (k x n) read through strides of the stored matrix.
        let (k, n, rs, cs) = if transposed { (cols, rows, 1, cols as isize) } else { (rows, cols, cols as isize, 1) };
        // SAFETY: w holds rows x cols elements (checked above), float32 as T's dtype says; the
        // kernel's CPU feature was checked above.
        let packed = unsafe { PackedB::new(Operand { ptr: w.as_ptr().cast::<f32>(), rs, cs }, k, n) };
        Ok(StepWeight::Packed(packed, (k, n)))
    }

    /// `dst (+)= a * w` for `a` of (rows, k) stored row-major, on the calling thread.
    fn multiply(&self, dst: &mut [T], accumulate: bool, a: &[T], (rows, k): (usize, usize)) -> Result<()> {
        match self {
            StepWeight::Packed(packed, shape) => {
                let (packed_k, n) = *shape;
                if k != packed_k || a.len() < rows * k || dst.len() < rows * n {
                    crate::bail!(
                        Runtime,
                        "RNN: a recurrent product of ({rows} x {k}) from {} elements and ({packed_k} x {n}) into {} elements",
                        a.len(),
                        dst.len()
                    );
                }
                let a = Operand { ptr: a.as_ptr().cast::<f32>(), rs: k as isize, cs: 1 };
                // SAFETY: `new` packs float32 weights only, so T is f32; a holds rows x k floats
                // and dst the rows x n product with row stride n (checked above); dst is a unique
                // borrow, overlapping neither a nor the packed weight.
                unsafe { packed.multiply(rows, a, dst.as_mut_ptr().cast::<f32>(), n, accumulate) };
                Ok(())
            }
            StepWeight::Stored(w, stored) => gemm(dst, accumulate, a, (rows, k, false), w, *stored, 1),
        }
    }
}

fn add_rows<T: Real>(values: &mut [T], row: &[T]) {
    if row.is_empty() {
        return;
    }
    for chunk in values.chunks_mut(row.len()) {
        chunk.iter_mut().zip(row).for_each(|(v, &b)| *v = *v + b);
    }
}

fn column_sums_into<T: Real>(sums: &mut [T], values: &[T]) {
    if sums.is_empty() {
        return;
    }
    for chunk in values.chunks(sums.len()) {
        sums.iter_mut().zip(chunk).for_each(|(s, &v)| *s = *s + v);
    }
}

/// Cell clipping (`lstm_state_clip_min/max`): the clipped value and whether it was clipped;
/// NaN becomes the lower bound only with `lstm_state_clip_nan`.
fn clip_cell<T: Real>(c: T, clip: Option<(f64, f64, bool)>) -> (T, bool) {
    let Some((lo, hi, clip_nan)) = clip else { return (c, false) };
    let v = c.to_f64();
    if v.is_nan() && !clip_nan {
        (c, false)
    } else if v.is_nan() || v < lo {
        (T::from_f64(lo), true)
    } else if v > hi {
        (T::from_f64(hi), true)
    } else {
        (c, false)
    }
}

/// One batch row of an LSTM step: the pre-activation gates (blocks of `hidden`) become
/// activations, `cell` goes from c_(t-1) to c_t, `out` receives h_t.
struct LstmRow<'a, T> {
    input: &'a mut [T],
    forget: &'a mut [T],
    candidate: &'a mut [T],
    output: &'a mut [T],
    cell: &'a mut [T],
    out: &'a mut [T],
}

/// The same row in backpropagation: the `d_` blocks receive the gates' pre-activation gradients
/// from their activations, and `prev_cell_grad` the gradient of c_(t-1); `h_grad` is the whole
/// gradient of h_t.
struct LstmGradRow<'a, T> {
    input: &'a [T],
    forget: &'a [T],
    candidate: &'a [T],
    output: &'a [T],
    d_input: &'a mut [T],
    d_forget: &'a mut [T],
    d_candidate: &'a mut [T],
    d_output: &'a mut [T],
    cell: &'a [T],
    prev_cell: &'a [T],
    h_grad: &'a [T],
    cell_grad: &'a [T],
    prev_cell_grad: &'a mut [T],
}

/// Runs `body` compiled for the CPU's widest vectors: the cell loops below are written as
/// straight slice loops over the fast transcendental functions so that they vectorize.
macro_rules! vectorized_row {
    ($name:ident, $row:ident, $body:ident) => {
        fn $name<T: Real>(row: $row<'_, T>, clip: Option<(f64, f64, bool)>) {
            crate::backend::cpu::simd::vectorized(
                #[inline(always)]
                || $body(row, clip),
            )
        }
    };
}

vectorized_row!(lstm_forward_row, LstmRow, lstm_forward_body);
vectorized_row!(lstm_backward_row, LstmGradRow, lstm_backward_body);

#[inline(always)]
fn lstm_forward_body<T: Real>(row: LstmRow<'_, T>, clip: Option<(f64, f64, bool)>) {
    let LstmRow { input, forget, candidate, output, cell, out } = row;
    // Separate loops (not one chained iterator) so that each vectorizes.
    for gate in [&mut *input, &mut *forget, &mut *output] {
        for v in gate.iter_mut() {
            *v = v.sigmoid();
        }
    }
    for v in candidate.iter_mut() {
        *v = v.tanh();
    }
    for (((c, &f), &i), &g) in cell.iter_mut().zip(&*forget).zip(&*input).zip(&*candidate) {
        *c = f * *c + i * g;
    }
    if clip.is_some() {
        for c in cell.iter_mut() {
            *c = clip_cell(*c, clip).0;
        }
    }
    for ((out, &c), &o) in out.iter_mut().zip(&*cell).zip(&*output) {
        *out = o * c.tanh();
    }
}

#[inline(always)]
fn lstm_backward_body<T: Real>(row: LstmGradRow<'_, T>, clip: Option<(f64, f64, bool)>) {
    if clip.is_none() {
        return lstm_backward_cells(row, |_| false);
    }
    // A clipped cell passes no gradient to its gates or to c_(t-1).
    let clipped: Vec<bool> =
        row.forget.iter().zip(row.prev_cell).zip(row.input).zip(row.candidate).map(|(((&f, &c), &i), &g)| clip_cell(f * c + i * g, clip).1).collect();
    lstm_backward_cells(row, |j| clipped.get(j).copied().unwrap_or(false))
}

#[inline(always)]
fn lstm_backward_cells<T: Real>(row: LstmGradRow<'_, T>, clipped: impl Fn(usize) -> bool) {
    let LstmGradRow {
        input,
        forget,
        candidate,
        output,
        d_input,
        d_forget,
        d_candidate,
        d_output,
        cell,
        prev_cell,
        h_grad,
        cell_grad,
        prev_cell_grad,
    } = row;
    let gates = input.iter().zip(forget).zip(candidate).zip(output);
    let states = h_grad.iter().zip(cell).zip(cell_grad).zip(prev_cell);
    let grads = d_input.iter_mut().zip(d_forget.iter_mut()).zip(d_candidate.iter_mut()).zip(d_output.iter_mut()).zip(prev_cell_grad.iter_mut());
    for (j, ((gate, state), grads)) in gates.zip(states).zip(grads).enumerate() {
        let (((&i, &f), &g), &o) = gate;
        let (((&grad, &c), &c_grad), &prev) = state;
        let ((((d_i, d_f), d_g), d_o), d_prev) = grads;
        let tanh_c = c.tanh();
        let through = c_grad + grad * o * (T::ONE - tanh_c * tanh_c);
        let cell_grad = if clipped(j) { T::ZERO } else { through };
        *d_i = cell_grad * g * i * (T::ONE - i);
        *d_f = cell_grad * prev * f * (T::ONE - f);
        *d_g = cell_grad * i * (T::ONE - g * g);
        *d_o = grad * tanh_c * o * (T::ONE - o);
        *d_prev = cell_grad * f;
    }
}

/// A buffer that concurrent batch-range sweeps share; each touches only its own rows.
struct Shared<T> {
    ptr: SendPtr<T>,
    len: usize,
}

impl<T> Shared<T> {
    fn new(values: &mut [T]) -> Shared<T> {
        Shared { ptr: SendPtr(values.as_mut_ptr()), len: values.len() }
    }

    /// The `len` elements from `start`, or an error where they pass the buffer's end.
    ///
    /// # Safety
    /// No other live slice from this buffer overlaps them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows(&self, start: usize, len: usize) -> Result<&mut [T]> {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            crate::bail!(Runtime, "RNN: rows [{start}, +{len}) outside a shared buffer of {} elements", self.len);
        }
        // SAFETY: start + len <= len (checked above) keeps the slice inside the buffer `new`
        // took, which outlives the sweeps; the caller guarantees that nothing else overlaps it.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.get().add(start), len) })
    }
}

// SAFETY: the pointer is only turned into slices of disjoint rows by the sweeps (see `rows`),
// and the buffer outlives the scope in which the sweeps run.
unsafe impl<T: Send> Sync for Shared<T> {}

/// What the forward sweeps write: gates, LSTM cells, GRU's W_hn h + b_hn, LSTMP's unprojected
/// hidden states, outputs, states.
struct SweepBuffers<T> {
    gates: Shared<T>,
    cells: Shared<T>,
    hidden_n: Shared<T>,
    unprojected: Shared<T>,
    out: Shared<T>,
    hy: Shared<T>,
    cy: Shared<T>,
}

/// What the backward sweeps write: gate gradients, GRU's recurrent gradients, LSTMP's gradients
/// of the projected states, state gradients.
struct GradBuffers<T> {
    gates: Shared<T>,
    recurrent: Shared<T>,
    projected: Shared<T>,
    dh: Shared<T>,
    dc: Shared<T>,
}

/// Time step processed at position `s` of a direction's sweep.
fn step_time(dir: usize, steps: usize, s: usize) -> usize {
    if dir == 1 {
        steps - 1 - s
    } else {
        s
    }
}

impl<T: Real> Pass<'_, T> {
    /// Whether batch row `row` has a valid step at time `t`.
    fn active(&self, row: usize, t: usize) -> bool {
        self.lengths.get(row).is_some_and(|&length| t < length)
    }

    /// The time step that row `row` processed just before position `step` of direction `dir`'s
    /// sweep; `None` at the row's first step, which reads the initial state.
    fn previous_step(&self, dir: usize, step: usize, row: usize) -> Option<usize> {
        (step > 0).then(|| step_time(dir, self.d.steps, step - 1)).filter(|&tp| self.active(row, tp))
    }

    /// Runs one direction of one layer over `x` (steps x batch x layer input), writing its
    /// states into its part of `out` (steps x batch x dirs*state width) and its final states
    /// into `hy`/`cy`. The input projection of all steps is one GEMM; the recurrence then runs
    /// on disjoint ranges of batch rows concurrently (rows never interact), each with
    /// single-threaded per-step GEMMs, so no step waits for the other threads.
    #[allow(clippy::too_many_arguments)]
    fn direction_forward(
        &self,
        layer: usize,
        dir: usize,
        x: &[T],
        h0: &[T],
        c0: &[T],
        out: &mut [T],
        trace: Trace<&mut [T]>,
        hy: &mut [T],
        cy: &mut [T],
    ) -> Result<()> {
        let (rnn, d) = (self.rnn, self.d);
        let gh = rnn.gate_width();
        let s = rnn.slots(d.input, layer, dir);
        let p = self.params;
        let w_ih = part(OP, p, s.w_ih, gh * s.input, "the i2h weight")?;
        let (b_ih, b_hh) = (part(OP, p, s.b_ih, gh, "the i2h bias")?, part(OP, p, s.b_hh, gh, "the h2h bias")?);
        let rows = d.steps * d.batch;
        // x is (rows, input), w_ih (gh, input) read transposed, gates (rows, gh).
        gemm(trace.gates, false, x, (rows, s.input, false), w_ih, (gh, s.input, true), self.threads)?;
        add_rows(trace.gates, b_ih);
        if rnn.mode != RnnMode::Gru {
            add_rows(trace.gates, b_hh);
        }
        let shared = SweepBuffers {
            gates: Shared::new(trace.gates),
            cells: Shared::new(trace.cells),
            hidden_n: Shared::new(trace.hidden_n),
            unprojected: Shared::new(trace.unprojected),
            out: Shared::new(out),
            hy: Shared::new(hy),
            cy: Shared::new(cy),
        };
        let w_hh = StepWeight::new(part(OP, p, s.w_hh, gh * rnn.state_width(), "the h2h weight")?, (gh, rnn.state_width(), true))?;
        self.over_batch_ranges(1, |range| {
            // SAFETY: each range touches only its own batch rows of the shared buffers.
            unsafe { self.sweep_forward(layer, dir, range, h0, c0, &w_hh, &shared) }
        })
    }

    /// Splits the batch into one range per thread (ranges of at least a few rows, each worth
    /// handing to another thread) and runs `sweep` on each concurrently. `passes`: products per
    /// step and row, in units of the recurrent one (the backward sweep makes two).
    fn over_batch_ranges(&self, passes: usize, sweep: impl Fn(std::ops::Range<usize>) -> Result<()> + Sync) -> Result<()> {
        const MIN_ROWS: usize = 4;
        let n = self.d.batch;
        let rnn = self.rnn;
        let flops = passes * 2 * self.d.steps * n * rnn.gate_width() * rnn.state_width();
        let tasks = crate::engine::parallel::tasks_for(flops, self.threads.min(n / MIN_ROWS));
        let per = n.div_ceil(tasks).max(1);
        // Ranges of `per` rows: with many threads ceil(n / threads) rows each can cover the
        // batch in fewer ranges than threads (100 rows, 16 threads: 15 ranges of 7).
        crate::engine::parallel::map(n.div_ceil(per), |r| sweep(r * per..((r + 1) * per).min(n))).into_iter().collect()
    }

    /// The recurrence of one direction for batch rows `range`. Rows at a padding step (past
    /// their sequence's length) output zeros and keep their state, so the forward direction
    /// ends with each sequence's state after its last step and the backward direction starts
    /// at each sequence's own end from the initial state.
    ///
    /// # Safety
    /// No other thread accesses the rows `range` of the shared buffers meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sweep_forward(
        &self,
        layer: usize,
        dir: usize,
        range: std::ops::Range<usize>,
        h0: &[T],
        c0: &[T],
        w_hh: &StepWeight<'_, T>,
        buf: &SweepBuffers<T>,
    ) -> Result<()> {
        let (rnn, d) = (self.rnn, self.d);
        let (h, sw, gh, n) = (rnn.hidden, rnn.state_width(), rnn.gate_width(), d.batch);
        let width = rnn.dirs * sw;
        let projecting = rnn.projection.is_some();
        let s = rnn.slots(d.input, layer, dir);
        let b_hh = part(OP, self.params, s.b_hh, gh, "the h2h bias")?;
        let w_hr = part(OP, self.params, s.w_hr, rnn.projection_weights(), "the projection weight")?;
        let (first, nb) = (range.start, range.len());
        let lengths = part(OP, self.lengths, first, nb, "the sequence lengths")?;
        let mut h_prev = part(OP, h0, first * sw, nb * sw, "the initial state")?.to_vec();
        let mut c_prev = if rnn.mode == RnnMode::Lstm { part(OP, c0, first * h, nb * h, "the initial cell state")?.to_vec() } else { Vec::new() };
        let mut recurrent = vec![T::ZERO; if rnn.mode == RnnMode::Gru { nb * gh } else { 0 }];
        let mut projected = vec![T::ZERO; if projecting { nb * sw } else { 0 }];
        // SAFETY (every `rows` below): the rows lie in this range's batch rows of their step,
        // which the caller leaves to this sweep alone.
        for step in 0..d.steps {
            let t = step_time(dir, d.steps, step);
            let gates = buf.gates.rows((t * n + first) * gh, nb * gh)?;
            // h_prev is (nb, sw), w_hh (gh, sw) read transposed, the destination (nb, gh).
            if rnn.mode == RnnMode::Gru {
                w_hh.multiply(&mut recurrent, false, &h_prev, (nb, sw))?;
                add_rows(&mut recurrent, b_hh);
            } else {
                w_hh.multiply(gates, true, &h_prev, (nb, sw))?;
            }
            let unprojected: &mut [T] = if projecting { buf.unprojected.rows((t * n + first) * h, nb * h)? } else { &mut [] };
            for (b, ((g, state), &length)) in gates.chunks_exact_mut(gh).zip(h_prev.chunks_exact_mut(sw)).zip(lengths).enumerate() {
                let row = first + b;
                let out_row = buf.out.rows((t * n + row) * width + dir * sw, sw)?;
                if t >= length {
                    out_row.fill(T::ZERO);
                    if projecting {
                        // The projection weight's gradient multiplies every row of the trace
                        // (padding rows by zero gradients), and the reserve is not zeroed:
                        // garbage there could be NaN, and 0 * NaN is NaN.
                        part_mut(OP, unprojected, b * h, h, "an unprojected state")?.fill(T::ZERO);
                    }
                    continue;
                }
                match rnn.mode {
                    RnnMode::Lstm => {
                        let cell = part_mut(OP, &mut c_prev, b * h, h, "a cell state")?;
                        let hidden: &mut [T] = if projecting { part_mut(OP, unprojected, b * h, h, "an unprojected state")? } else { &mut *out_row };
                        let [input, forget, candidate, output] = blocks_mut::<_, 4>(g, h)?;
                        lstm_forward_row(LstmRow { input, forget, candidate, output, cell: &mut *cell, out: hidden }, rnn.clip);
                        buf.cells.rows((t * n + row) * h, h)?.copy_from_slice(cell);
                    }
                    // Vectorized like the LSTM rows: the fast tanh and sigmoid use FMA, which
                    // baseline x86-64 code would call through libm.
                    RnnMode::Relu | RnnMode::Tanh => crate::backend::cpu::simd::vectorized(
                        #[inline(always)]
                        || {
                            for (o, v) in out_row.iter_mut().zip(g.iter_mut()) {
                                *v = if rnn.mode == RnnMode::Relu {
                                    if *v > T::ZERO {
                                        *v
                                    } else {
                                        T::ZERO
                                    }
                                } else {
                                    v.tanh()
                                };
                                *o = *v;
                            }
                        },
                    ),
                    RnnMode::Gru => {
                        let [r_reset, r_update, r_candidate] = blocks::<_, 3>(part(OP, &recurrent, b * gh, gh, "a recurrent product")?, h)?;
                        let hidden_n = buf.hidden_n.rows((t * n + row) * h, h)?;
                        let [g_reset, g_update, g_candidate] = blocks_mut::<_, 3>(g, h)?;
                        crate::backend::cpu::simd::vectorized(
                            #[inline(always)]
                            || {
                                let gates = g_reset.iter_mut().zip(g_update.iter_mut()).zip(g_candidate.iter_mut());
                                let recurrent = r_reset.iter().zip(r_update).zip(r_candidate);
                                let targets = hidden_n.iter_mut().zip(out_row.iter_mut()).zip(state.iter());
                                for (((g_r, g_z), g_n), (((&r_r, &r_z), &r_n), ((hn, o), &prev))) in gates.zip(recurrent.zip(targets)) {
                                    let (reset, update) = ((*g_r + r_r).sigmoid(), (*g_z + r_z).sigmoid());
                                    let candidate = (*g_n + reset * r_n).tanh();
                                    (*g_r, *g_z, *g_n) = (reset, update, candidate);
                                    *hn = r_n;
                                    *o = (T::ONE - update) * candidate + update * prev;
                                }
                            },
                        )
                    }
                }
                if !projecting {
                    state.copy_from_slice(out_row);
                }
            }
            if projecting {
                // unprojected (nb, h) times w_hr (sw, h) read transposed into (nb, sw).
                gemm(&mut projected, false, unprojected, (nb, h, false), w_hr, (sw, h, true), 1)?;
                for (b, ((value, state), &length)) in projected.chunks_exact(sw).zip(h_prev.chunks_exact_mut(sw)).zip(lengths).enumerate() {
                    if t < length {
                        buf.out.rows((t * n + first + b) * width + dir * sw, sw)?.copy_from_slice(value);
                        state.copy_from_slice(value);
                    }
                }
            }
        }
        buf.hy.rows(first * sw, nb * sw)?.copy_from_slice(&h_prev);
        if rnn.mode == RnnMode::Lstm {
            buf.cy.rows(first * h, nb * h)?.copy_from_slice(&c_prev);
        }
        Ok(())
    }

    /// Backpropagates one direction of one layer: `dout` is the gradient of the layer's output,
    /// `dh`/`dc` enter as the final states' gradients and leave as the initial states'. The
    /// data gradient is added to `dx` and the parameter gradients to `dparams`; `gate_grads`
    /// (time x batch x gates) is scratch for the gates' pre-activation gradients. The recurrence
    /// runs on batch ranges concurrently as in the forward; the weight gradients of all steps
    /// are then single large GEMMs (padding steps have zero gate gradients, so they add nothing).
    #[allow(clippy::too_many_arguments)]
    fn direction_backward(
        &self,
        layer: usize,
        dir: usize,
        x: &[T],
        h0: &[T],
        c0: &[T],
        out: &[T],
        trace: Trace<&[T]>,
        gate_grads: &mut [T],
        dout: &[T],
        dh: &mut [T],
        dc: &mut [T],
        dx: &mut [T],
        dparams: &mut [T],
    ) -> Result<()> {
        let (rnn, d) = (self.rnn, self.d);
        let (h, sw, gh, n) = (rnn.hidden, rnn.state_width(), rnn.gate_width(), d.batch);
        let width = rnn.dirs * sw;
        let s = rnn.slots(d.input, layer, dir);
        let w_ih = part(OP, self.params, s.w_ih, gh * s.input, "the i2h weight")?;
        let rows = d.steps * n;
        // GRU's recurrent pre-activation gradients differ from its gate gradients (the reset gate
        // scales W_hn h + b_hn); for the other modes they are the gate gradients themselves.
        let mut recurrent_grads = vec![T::ZERO; if rnn.mode == RnnMode::Gru { rows * gh } else { 0 }];
        let mut projected_grads = vec![T::ZERO; if rnn.projection.is_some() { rows * sw } else { 0 }];
        let shared = GradBuffers {
            gates: Shared::new(gate_grads),
            recurrent: Shared::new(&mut recurrent_grads),
            projected: Shared::new(&mut projected_grads),
            dh: Shared::new(dh),
            dc: Shared::new(dc),
        };
        let w_hh = StepWeight::new(part(OP, self.params, s.w_hh, gh * sw, "the h2h weight")?, (gh, sw, false))?;
        self.over_batch_ranges(2, |range| {
            // SAFETY: each range touches only its own batch rows of the shared buffers.
            unsafe { self.sweep_backward(layer, dir, range, h0, c0, out, &trace, dout, &w_hh, &shared) }
        })?;
        // The state each step read: its row's previous output, or h0 at the row's first step.
        let mut h_prev = vec![T::ZERO; rows * sw];
        for step in 0..d.steps {
            let t = step_time(dir, d.steps, step);
            for (b, state) in part_mut(OP, &mut h_prev, t * n * sw, n * sw, "a step's states")?.chunks_exact_mut(sw).enumerate() {
                let read = match self.previous_step(dir, step, b) {
                    Some(tp) => part(OP, out, (tp * n + b) * width + dir * sw, sw, "a previous output")?,
                    None => part(OP, h0, b * sw, sw, "the initial state")?,
                };
                state.copy_from_slice(read);
            }
        }
        let gate_grads = &*gate_grads;
        let recurrent = if rnn.mode == RnnMode::Gru { recurrent_grads.as_slice() } else { gate_grads };
        // recurrent (rows, gh) read transposed times h_prev (rows, sw) into the (gh, sw) weight
        // gradient; gates (rows, gh) transposed times x (rows, input) into the (gh, input) weight
        // gradient; gates times w_ih (gh, input) into dx (rows, input); projected gradients
        // (rows, sw) transposed times the unprojected states (rows, h) into the (sw, h)
        // projection weight gradient.
        let dw_hh = part_mut(OP, dparams, s.w_hh, gh * sw, "the h2h weight gradient")?;
        gemm(dw_hh, true, recurrent, (rows, gh, true), &h_prev, (rows, sw, false), self.threads)?;
        let dw_ih = part_mut(OP, dparams, s.w_ih, gh * s.input, "the i2h weight gradient")?;
        gemm(dw_ih, true, gate_grads, (rows, gh, true), x, (rows, s.input, false), self.threads)?;
        gemm(dx, true, gate_grads, (rows, gh, false), w_ih, (gh, s.input, false), self.threads)?;
        if rnn.projection.is_some() {
            let dw_hr = part_mut(OP, dparams, s.w_hr, sw * h, "the projection weight gradient")?;
            gemm(dw_hr, true, &projected_grads, (rows, sw, true), trace.unprojected, (rows, h, false), self.threads)?;
        }
        column_sums_into(part_mut(OP, dparams, s.b_hh, gh, "the h2h bias gradient")?, recurrent);
        column_sums_into(part_mut(OP, dparams, s.b_ih, gh, "the i2h bias gradient")?, gate_grads);
        Ok(())
    }

    /// Writes into `dst` (rows `first..` of one step, state width each) the gradient of each
    /// row's output state at time `t`: the output's own gradient plus the one later steps sent
    /// back in `dh`; zero at padding steps, whose outputs are constant.
    fn output_state_grads(&self, dir: usize, t: usize, first: usize, dout: &[T], dh: &[T], dst: &mut [T]) -> Result<()> {
        let (n, sw) = (self.d.batch, self.rnn.state_width());
        let width = self.rnn.dirs * sw;
        let lengths = self.lengths.get(first..).unwrap_or_default();
        for (b, ((grads, later), &length)) in dst.chunks_exact_mut(sw).zip(dh.chunks_exact(sw)).zip(lengths).enumerate() {
            if t < length {
                let own = part(OP, dout, (t * n + first + b) * width + dir * sw, sw, "an output gradient")?;
                grads.iter_mut().zip(own).zip(later).for_each(|((g, &o), &l)| *g = o + l);
            } else {
                grads.fill(T::ZERO);
            }
        }
        Ok(())
    }

    /// Backpropagation through time for batch rows `range`: writes the gates' pre-activation
    /// gradients (and GRU's recurrent gradients) from the rows' traced activations, and turns
    /// their `dh`/`dc` from final-state into initial-state gradients. Padding steps pass the
    /// state gradients through.
    ///
    /// # Safety
    /// No other thread accesses the rows `range` of the shared buffers meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sweep_backward(
        &self,
        layer: usize,
        dir: usize,
        range: std::ops::Range<usize>,
        h0: &[T],
        c0: &[T],
        out: &[T],
        trace: &Trace<&[T]>,
        dout: &[T],
        w_hh: &StepWeight<'_, T>,
        buf: &GradBuffers<T>,
    ) -> Result<()> {
        let (rnn, d) = (self.rnn, self.d);
        let (h, sw, gh, n) = (rnn.hidden, rnn.state_width(), rnn.gate_width(), d.batch);
        let width = rnn.dirs * sw;
        let lstm = rnn.mode == RnnMode::Lstm;
        let (cells, hidden_n) = (trace.cells, trace.hidden_n);
        let s = rnn.slots(d.input, layer, dir);
        let w_hr = part(OP, self.params, s.w_hr, rnn.projection_weights(), "the projection weight")?;
        let (first, nb) = (range.start, range.len());
        let lengths = part(OP, self.lengths, first, nb, "the sequence lengths")?;
        // SAFETY (every `rows` below): the rows lie in this range's batch rows (of the states,
        // or of their step), which the caller leaves to this sweep alone.
        let dh = buf.dh.rows(first * sw, nb * sw)?;
        let dc = if lstm { buf.dc.rows(first * h, nb * h)? } else { &mut [] };
        let mut dh_next = vec![T::ZERO; nb * sw];
        let mut c_grads = vec![T::ZERO; if lstm { nb * h } else { 0 }];
        // Each row's gradient of its hidden state at the current step (before LSTMP's projection).
        let mut h_grads = vec![T::ZERO; nb * h];
        for step in (0..d.steps).rev() {
            let t = step_time(dir, d.steps, step);
            if rnn.projection.is_some() {
                let projected = buf.projected.rows((t * n + first) * sw, nb * sw)?;
                self.output_state_grads(dir, t, first, dout, dh, projected)?;
                // projected gradients (nb, sw) times w_hr (sw, h) into (nb, h).
                gemm(&mut h_grads, false, projected, (nb, sw, false), w_hr, (sw, h, false), 1)?;
            } else {
                self.output_state_grads(dir, t, first, dout, dh, &mut h_grads)?;
            }
            let grads = buf.gates.rows((t * n + first) * gh, nb * gh)?;
            let step_gates = part(OP, trace.gates, (t * n + first) * gh, nb * gh, "a step's gates")?;
            let row_grads = step_gates.chunks_exact(gh).zip(grads.chunks_exact_mut(gh)).zip(h_grads.chunks_exact(h));
            let row_states = dh_next.chunks_exact_mut(sw).zip(dh.chunks_exact(sw)).zip(lengths);
            for (b, (((g, dg), grad), ((next, later), &length))) in row_grads.zip(row_states).enumerate() {
                let row = first + b;
                if t >= length {
                    dg.fill(T::ZERO);
                    if rnn.mode == RnnMode::Gru {
                        buf.recurrent.rows((t * n + row) * gh, gh)?.fill(T::ZERO);
                    }
                    next.copy_from_slice(later);
                    if lstm {
                        part_mut(OP, &mut c_grads, b * h, h, "a cell gradient")?.copy_from_slice(part(OP, dc, b * h, h, "a cell gradient")?);
                    }
                    continue;
                }
                let previous = self.previous_step(dir, step, row);
                next.fill(T::ZERO);
                match rnn.mode {
                    RnnMode::Lstm => {
                        let prev_cell = match previous {
                            Some(tp) => part(OP, cells, (tp * n + row) * h, h, "a traced cell state")?,
                            None => part(OP, c0, row * h, h, "the initial cell state")?,
                        };
                        let [input, forget, candidate, output] = blocks::<_, 4>(g, h)?;
                        let [d_input, d_forget, d_candidate, d_output] = blocks_mut::<_, 4>(dg, h)?;
                        let row_grads = LstmGradRow {
                            input,
                            forget,
                            candidate,
                            output,
                            d_input,
                            d_forget,
                            d_candidate,
                            d_output,
                            cell: part(OP, cells, (t * n + row) * h, h, "a traced cell state")?,
                            prev_cell,
                            h_grad: grad,
                            cell_grad: part(OP, dc, b * h, h, "a cell gradient")?,
                            prev_cell_grad: part_mut(OP, &mut c_grads, b * h, h, "a cell gradient")?,
                        };
                        lstm_backward_row(row_grads, rnn.clip);
                    }
                    RnnMode::Relu | RnnMode::Tanh => {
                        for ((d_g, &gv), &grad) in dg.iter_mut().zip(g).zip(grad) {
                            *d_g = match rnn.mode {
                                RnnMode::Relu => {
                                    if gv > T::ZERO {
                                        grad
                                    } else {
                                        T::ZERO
                                    }
                                }
                                _ => grad * (T::ONE - gv * gv),
                            };
                        }
                    }
                    RnnMode::Gru => {
                        let prev_h = match previous {
                            Some(tp) => part(OP, out, (tp * n + row) * width + dir * h, h, "a previous output")?,
                            None => part(OP, h0, row * h, h, "the initial state")?,
                        };
                        let hn = part(OP, hidden_n, (t * n + row) * h, h, "a traced W_hn h + b_hn")?;
                        let [reset, update, candidate] = blocks::<_, 3>(g, h)?;
                        let [d_reset, d_update, d_candidate] = blocks_mut::<_, 3>(dg, h)?;
                        let [r_reset, r_update, r_candidate] = blocks_mut::<_, 3>(buf.recurrent.rows((t * n + row) * gh, gh)?, h)?;
                        let gates = reset.iter().zip(update).zip(candidate);
                        let inputs = grad.iter().zip(prev_h).zip(hn);
                        let gate_grads = d_reset.iter_mut().zip(d_update.iter_mut()).zip(d_candidate.iter_mut());
                        let recurrent_grads = r_reset.iter_mut().zip(r_update.iter_mut()).zip(r_candidate.iter_mut());
                        let targets = gate_grads.zip(recurrent_grads).zip(next.iter_mut());
                        for ((((&reset, &update), &candidate), ((&grad, &prev_h), &hn)), ((((d_r, d_z), d_n), ((r_r, r_z), r_n)), d_h)) in
                            gates.zip(inputs).zip(targets)
                        {
                            let d_candidate = grad * (T::ONE - update) * (T::ONE - candidate * candidate);
                            let d_update = grad * (prev_h - candidate) * update * (T::ONE - update);
                            let d_reset = d_candidate * hn * reset * (T::ONE - reset);
                            (*d_r, *d_z, *d_n) = (d_reset, d_update, d_candidate);
                            (*r_r, *r_z, *r_n) = (d_reset, d_update, d_candidate * reset);
                            *d_h = grad * update;
                        }
                    }
                }
            }
            if lstm {
                dc.copy_from_slice(&c_grads);
            }
            let recurrent: &[T] = if rnn.mode == RnnMode::Gru { buf.recurrent.rows((t * n + first) * gh, nb * gh)? } else { grads };
            // recurrent (nb, gh) times w_hh (gh, sw) added to (nb, sw).
            w_hh.multiply(&mut dh_next, true, recurrent, (nb, gh))?;
            dh.copy_from_slice(&dh_next);
        }
        Ok(())
    }

    /// Runs all layers: the last layer's output goes to `out`, final states to `hy`/`cy`. A
    /// `reserve` of [`Rnn::reserve_len`] elements receives every (layer, direction)'s trace and
    /// the outputs of the inner layers, for backpropagation; without one (empty) the layers
    /// reuse one trace and two output buffers.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        data: &[T],
        h0: &[T],
        c0: &[T],
        mask: Option<&[T]>,
        out: &mut [T],
        hy: &mut [T],
        cy: &mut [T],
        reserve: &mut [T],
    ) -> Result<()> {
        let (rnn, d) = (self.rnn, self.d);
        let (state, cell_state) = (d.batch * rnn.state_width(), d.batch * rnn.hidden);
        let (trace_len, layer_out) = (rnn.trace_len(d), rnn.layer_output_len(d));
        let keep = !reserve.is_empty();
        let mut scratch: Vec<T>;
        let reserve = if keep {
            reserve
        } else {
            scratch = vec![T::ZERO; trace_len + (rnn.layers - 1).min(2) * layer_out];
            scratch.as_mut_slice()
        };
        let reserve_len = reserve.len();
        let (traces, outputs) = reserve
            .split_at_mut_checked(if keep { rnn.layers * rnn.dirs * trace_len } else { trace_len })
            .ok_or_else(|| crate::err!(Runtime, "RNN: a reserve of {reserve_len} elements holds no traces of {trace_len}"))?;
        let slots = outputs.len().checked_div(layer_out).unwrap_or(0).max(1);
        let mut masked: Vec<T> = Vec::new();
        for layer in 0..rnn.layers {
            let last = layer + 1 == rnn.layers;
            // Layer `l` writes output slot `l % slots` and reads the slot before; two slots at
            // least whenever a layer does both, so they never coincide.
            let (below, target): (&[T], &mut [T]) = match (layer, last) {
                (0, true) => (data, &mut *out),
                (0, false) => (data, part_mut(OP, outputs, 0, layer_out, "a layer's output")?),
                (_, true) => (part(OP, outputs, ((layer - 1) % slots) * layer_out, layer_out, "a layer's output")?, &mut *out),
                (_, false) => {
                    let (read, write) = ((layer - 1) % slots, layer % slots);
                    let total = outputs.len();
                    let (low, high) = outputs
                        .split_at_mut_checked(read.max(write) * layer_out)
                        .ok_or_else(|| crate::err!(Runtime, "RNN: {total} elements hold no output slots {read} and {write} of {layer_out}"))?;
                    if read < write {
                        (part(OP, low, read * layer_out, layer_out, "a layer's output")?, part_mut(OP, high, 0, layer_out, "a layer's output")?)
                    } else {
                        (part(OP, high, 0, layer_out, "a layer's output")?, part_mut(OP, low, write * layer_out, layer_out, "a layer's output")?)
                    }
                }
            };
            let x: &[T] = match (layer, mask) {
                (0, _) | (_, None) => below,
                (_, Some(m)) => {
                    masked.clear();
                    masked.extend(below.iter().zip(part(OP, m, (layer - 1) * layer_out, layer_out, "the dropout mask")?).map(|(&v, &k)| v * k));
                    &masked
                }
            };
            for dir in 0..rnn.dirs {
                let k = layer * rnn.dirs + dir;
                let block = if keep { part_mut(OP, traces, k * trace_len, trace_len, "a trace")? } else { &mut *traces };
                let cell = if rnn.mode == RnnMode::Lstm { part(OP, c0, k * cell_state, cell_state, "the initial cell state")? } else { &[] };
                let cell_out: &mut [T] =
                    if rnn.mode == RnnMode::Lstm { part_mut(OP, cy, k * cell_state, cell_state, "the final cell state")? } else { &mut [] };
                let trace = rnn.split_trace(d, block)?;
                let (h0, hy) = (part(OP, h0, k * state, state, "the initial state")?, part_mut(OP, hy, k * state, state, "the final state")?);
                self.direction_forward(layer, dir, x, h0, cell, target, trace, hy, cell_out)?;
            }
        }
        Ok(())
    }
}

fn supported(dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        crate::bail!(Type, "RNN: dtype {dtype} is not supported on CPU (float32 and float64 are)");
    }
    Ok(())
}

impl Operator for Rnn {
    fn input_names(&self) -> Vec<String> {
        Rnn::input_names(self)
    }
    fn num_outputs(&self) -> usize {
        self.num_visible() + usize::from(self.has_mask()) + 1
    }
    fn num_visible_outputs(&self) -> usize {
        self.num_visible()
    }
    fn backward_only_outputs(&self) -> usize {
        1
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        let Some(Some(data)) = inputs.first() else {
            return Ok(());
        };
        let d = self.dims(data)?;
        if let Some(params) = inputs.get_mut(1) {
            params.get_or_insert_with(|| Shape::new(vec![self.param_count(d.input)]));
        }
        for (state, shape) in inputs.iter_mut().skip(2).zip(self.initial_state_shapes(d)) {
            state.get_or_insert(shape);
        }
        if self.use_lengths {
            if let Some(lengths) = inputs.get_mut(self.lengths_index()) {
                lengths.get_or_insert_with(|| Shape::new(vec![d.batch]));
            }
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let d = self.check_inputs(inputs)?;
        Ok(self.output_shapes(d))
    }
    /// Data, parameters, states and outputs share one dtype; the lengths may have any.
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(typed) = inputs.get(..self.lengths_index()) else {
            crate::bail!(Type, "RNN: inputs {} expected, got {} input(s)", self.input_names().join(", "), inputs.len());
        };
        super::same_dtype(typed, self.num_outputs())
    }
    fn needs_rng(&self) -> bool {
        self.has_mask()
    }
    fn forward(&self, ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let dtype = args.input_dtype(0)?;
        supported(dtype)?;
        let d = self.dims(args.input_shape(0)?)?;
        let lengths = self.lengths(args, 0, d)?;
        let directions = self.layers * self.dirs;
        let reserve_index = args.outputs().len().checked_sub(1).ok_or_else(|| crate::err!(Runtime, "RNN: called without outputs"))?;
        crate::dispatch_dtype!(dtype, [F32, F64], T => {
            let (data, params, h0) = (args.input::<T>(0)?, args.input::<T>(1)?, args.input::<T>(2)?);
            let c0 = if self.mode == RnnMode::Lstm { args.input::<T>(3)? } else { &[] };
            let mut mask = self.has_mask().then(|| args.output::<T>(self.num_visible())).transpose()?;
            if let Some(mask) = mask.as_mut() {
                let keep_scale = 1.0 / (1.0 - self.dropout);
                for (i, m) in mask.iter_mut().enumerate() {
                    let kept = !ctx.is_train || crate::random::uniform(ctx.seed, i as u64) >= self.dropout;
                    *m = T::from_f64(if !ctx.is_train { 1.0 } else if kept { keep_scale } else { 0.0 });
                }
            }
            let mut hy = vec![T::ZERO; directions * d.batch * self.state_width()];
            let mut cy = vec![T::ZERO; if self.mode == RnnMode::Lstm { directions * d.batch * self.hidden } else { 0 }];
            let pass = Pass { rnn: self, d, params, lengths: &lengths, threads: crate::engine::parallel::threads() };
            let out = args.output::<T>(0)?;
            let reserve = args.output::<T>(reserve_index)?;
            if !reserve.is_empty() && reserve.len() != self.reserve_len(d) {
                crate::bail!(Shape, "RNN: reserve holds {} elements, expected {} or none", reserve.len(), self.reserve_len(d));
            }
            pass.forward(data, h0, c0, mask.as_deref(), out, &mut hy, &mut cy, reserve)?;
            if self.state_outputs {
                copy_output("the final state", args.output::<T>(1)?, &hy)?;
                if self.mode == RnnMode::Lstm {
                    copy_output("the final cell state", args.output::<T>(2)?, &cy)?;
                }
            }
        }, other => crate::bail!(Type, "RNN supports float32 and float64, got {other}"));
        Ok(())
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        let mut inputs: Vec<_> = (0..self.num_visible()).map(|i| g.out_grad(i)).collect();
        inputs.extend((0..g.num_inputs()).map(|i| g.input(i)));
        if self.has_mask() {
            inputs.push(g.output(self.num_visible()));
        }
        inputs.push(g.output(0));
        inputs.push(g.output(self.num_outputs() - 1));
        let refs: Vec<_> = inputs.iter().collect();
        let grads = g.op_outputs("_backward_RNN", &self.attrs(), &refs)?;
        // The lengths are not differentiable.
        let lengths = self.use_lengths.then_some(None);
        Ok(grads.into_iter().map(Some).chain(lengths).collect())
    }
}

impl Rnn {
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let mut attrs = vec![
            ("state_size", self.hidden.to_string()),
            ("num_layers", self.layers.to_string()),
            ("bidirectional", flag(self.dirs == 2)),
            ("mode", self.mode.name().to_string()),
            ("p", format!("{:?}", self.dropout)),
            ("state_outputs", flag(self.state_outputs)),
        ];
        if let Some((lo, hi, nan)) = self.clip {
            attrs.extend([
                ("lstm_state_clip_min", format!("{lo:?}")),
                ("lstm_state_clip_max", format!("{hi:?}")),
                ("lstm_state_clip_nan", flag(nan)),
            ]);
        }
        if let Some(size) = self.projection {
            attrs.push(("projection_size", size.to_string()));
        }
        if self.use_lengths {
            attrs.push(("use_sequence_length", flag(true)));
        }
        attrs
    }
}

/// `_backward_RNN(out grads..., data, parameters, state[, state_cell][, sequence_length][, mask],
/// output, reserve)`: gradients of data, parameters and the initial states. An empty reserve (a
/// forward call made without recording, whose values a graph run differentiates) is recomputed.
struct RnnBackward(Rnn);

impl Operator for RnnBackward {
    fn input_names(&self) -> Vec<String> {
        let rnn = &self.0;
        let mut names: Vec<String> = ["grad", "grad_state", "grad_state_cell"].iter().take(rnn.num_visible()).map(|s| s.to_string()).collect();
        names.extend(rnn.input_names());
        if rnn.has_mask() {
            names.push("mask".into());
        }
        names.extend(["output".into(), "reserve".into()]);
        names
    }
    fn num_outputs(&self) -> usize {
        2 + self.0.num_states()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let forward_inputs = inputs.get(self.0.num_visible()..).unwrap_or_default();
        self.0.check_inputs(forward_inputs)?;
        let differentiable = forward_inputs
            .get(..2 + self.0.num_states())
            .ok_or_else(|| crate::err!(Shape, "_backward_RNN: inputs {} expected, got {} input(s)", self.input_names().join(", "), inputs.len()))?;
        Ok(differentiable.to_vec())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        let Some(&dtype) = inputs.first() else {
            crate::bail!(Type, "_backward_RNN: inputs {} expected, got none", self.input_names().join(", "));
        };
        Ok(vec![dtype; self.num_outputs()])
    }
    fn forward(&self, _ctx: &ExecContext, args: &KernelArgs) -> Result<()> {
        let rnn = &self.0;
        let first = rnn.num_visible();
        let dtype = args.input_dtype(first)?;
        supported(dtype)?;
        let d = rnn.dims(args.input_shape(first)?)?;
        let lengths = rnn.lengths(args, first, d)?;
        let (state, cell_state) = (d.batch * rnn.state_width(), d.batch * rnn.hidden);
        let lstm = rnn.mode == RnnMode::Lstm;
        let count = args.inputs().len();
        let from_end = |back: usize| count.checked_sub(back).ok_or_else(|| crate::err!(Value, "_backward_RNN: {count} inputs are too few"));
        crate::dispatch_dtype!(dtype, [F32, F64], T => {
            let (dout, data, params, h0) = (args.input::<T>(0)?, args.input::<T>(first)?, args.input::<T>(first + 1)?, args.input::<T>(first + 2)?);
            let c0 = if lstm { args.input::<T>(first + 3)? } else { &[] };
            let mask = if rnn.has_mask() { Some(args.input::<T>(from_end(3)?)?) } else { None };
            let (top, given_reserve) = (args.input::<T>(from_end(2)?)?, args.input::<T>(from_end(1)?)?);
            let pass = Pass { rnn, d, params, lengths: &lengths, threads: crate::engine::parallel::threads() };
            let recomputed: Vec<T>;
            let reserve: &[T] = if given_reserve.is_empty() && rnn.reserve_len(d) > 0 {
                let mut values = vec![T::ZERO; rnn.reserve_len(d)];
                let (mut out, mut hy, mut cy) = (vec![T::ZERO; top.len()], vec![T::ZERO; h0.len()], vec![T::ZERO; c0.len()]);
                pass.forward(data, h0, c0, mask, &mut out, &mut hy, &mut cy, &mut values)?;
                recomputed = values;
                &recomputed
            } else if given_reserve.len() == rnn.reserve_len(d) {
                given_reserve
            } else {
                crate::bail!(Shape, "_backward_RNN: reserve holds {} elements, expected {} or none", given_reserve.len(), rnn.reserve_len(d));
            };
            let trace_len = rnn.trace_len(d);
            let (traces, layer_outputs) = reserve
                .split_at_checked(rnn.layers * rnn.dirs * trace_len)
                .ok_or_else(|| crate::err!(Runtime, "_backward_RNN: a reserve of {} elements holds no traces of {trace_len}", reserve.len()))?;
            let mut gate_grads = vec![T::ZERO; d.steps * d.batch * rnn.gate_width()];
            let mut masked = Vec::new();
            // The final states' gradients (zero unless they are outputs).
            let mut dh = if rnn.state_outputs { args.input::<T>(1)?.to_vec() } else { vec![T::ZERO; h0.len()] };
            let mut dc = if rnn.state_outputs && lstm { args.input::<T>(2)?.to_vec() } else { vec![T::ZERO; c0.len()] };
            let dparams = args.output::<T>(1)?;
            dparams.fill(T::ZERO);
            let mut d_layer_out = dout.to_vec();
            for layer in (0..rnn.layers).rev() {
                let x: &[T] = match (layer, mask) {
                    (0, _) => data,
                    (_, None) => rnn.layer_output(d, layer - 1, top, layer_outputs)?,
                    (_, Some(m)) => {
                        let below = rnn.layer_output(d, layer - 1, top, layer_outputs)?;
                        masked.clear();
                        masked.extend(below.iter().zip(part(OP, m, (layer - 1) * below.len(), below.len(), "the dropout mask")?).map(|(&v, &k)| v * k));
                        &masked
                    }
                };
                let mut dx = vec![T::ZERO; x.len()];
                for dir in 0..rnn.dirs {
                    let k = layer * rnn.dirs + dir;
                    let cell = if lstm { part(OP, c0, k * cell_state, cell_state, "the initial cell state")? } else { &[] };
                    let dcell: &mut [T] = if lstm { part_mut(OP, &mut dc, k * cell_state, cell_state, "the cell state gradient")? } else { &mut [] };
                    let trace = rnn.view_trace(d, part(OP, traces, k * trace_len, trace_len, "a trace")?)?;
                    let out = rnn.layer_output(d, layer, top, layer_outputs)?;
                    let (h0, dh) = (part(OP, h0, k * state, state, "the initial state")?, part_mut(OP, &mut dh, k * state, state, "the state gradient")?);
                    pass.direction_backward(layer, dir, x, h0, cell, out, trace, &mut gate_grads, &d_layer_out, dh, dcell, &mut dx, dparams)?;
                }
                d_layer_out = match (layer, mask) {
                    (0, _) | (_, None) => dx,
                    (_, Some(m)) => dx.iter().zip(part(OP, m, (layer - 1) * x.len(), x.len(), "the dropout mask")?).map(|(&v, &k)| v * k).collect(),
                };
            }
            copy_output("the data gradient", args.output::<T>(0)?, &d_layer_out)?;
            copy_output("the state gradient", args.output::<T>(2)?, &dh)?;
            if lstm {
                copy_output("the cell state gradient", args.output::<T>(3)?, &dc)?;
            }
        }, other => crate::bail!(Type, "RNN supports float32 and float64, got {other}"));
        Ok(())
    }
}

fn build(p: RnnParams) -> Result<Rnn> {
    let mode = p.mode;
    if p.state_size == 0 || p.num_layers == 0 {
        crate::bail!(Param, "RNN: state_size and num_layers must be positive");
    }
    if !(0.0..1.0).contains(&p.p) {
        crate::bail!(Param, "RNN: dropout p must be in [0, 1), got {}", p.p);
    }
    let projection = match p.projection_size {
        None => None,
        Some(size) if size > 0 && mode == RnnMode::Lstm => Some(size as usize),
        Some(size) if size > 0 => crate::bail!(Param, "RNN: projection_size applies to mode 'lstm' only, got mode '{}'", p.mode.name()),
        Some(size) => crate::bail!(Param, "RNN: projection_size must be positive, got {size}"),
    };
    let clip = match (p.lstm_state_clip_min, p.lstm_state_clip_max) {
        (Some(lo), Some(hi)) if lo <= hi => Some((lo, hi, p.lstm_state_clip_nan)),
        (None, None) => None,
        _ => crate::bail!(Param, "RNN: lstm_state_clip_min and lstm_state_clip_max must be given together, min <= max"),
    };
    if clip.is_some() && mode != RnnMode::Lstm {
        crate::bail!(Param, "RNN: state clipping applies to mode 'lstm' only");
    }
    Ok(Rnn {
        mode,
        hidden: p.state_size,
        layers: p.num_layers,
        dirs: if p.bidirectional { 2 } else { 1 },
        dropout: p.p,
        state_outputs: p.state_outputs,
        clip,
        projection,
        use_lengths: p.use_sequence_length,
    })
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new(
        "RNN",
        &[],
        "Applies a stacked (bidirectional) relu/tanh RNN, LSTM or GRU to (time, batch, input) data with all weights in one parameter vector.",
        build,
    ));
    add(OpDef::new(
        "_backward_RNN",
        &[],
        "Gradients of RNN for data, parameters and initial states (recomputes the forward pass).",
        |p: RnnParams| Ok(RnnBackward(build(p)?)),
    ));
}

#[cfg(test)]
mod tests {
    use crate::base::{Context, DType, Shape};
    use crate::imperative::invoke;
    use crate::ndarray::NDArray;
    use crate::op::Attrs;

    fn array(shape: &[usize], seed: usize) -> NDArray {
        let len: usize = shape.iter().product();
        let values: Vec<f64> = (0..len).map(|i| ((i * 7919 + seed * 104_729) % 1000) as f64 / 1000.0 - 0.5).collect();
        NDArray::from_vec(Shape::new(shape.to_vec()), &values, Context::cpu(0)).unwrap()
    }

    /// The gradient kernel reads the forward pass's reserve, or recomputes it when the reserve is
    /// empty (a forward call that was not recorded): both give the same gradients, for stacked,
    /// bidirectional, projected, length-limited and dropout-masked layers in every mode.
    #[test]
    fn backward_from_the_reserve_equals_backward_recomputing_the_forward() {
        let (steps, batch, input, hidden) = (5, 6, 3, 4);
        let cases = [
            ("lstm", 3, true, 0.4, None, false),
            ("gru", 2, false, 0.0, None, true),
            ("lstm", 2, false, 0.0, Some(3), true),
            ("rnn_tanh", 1, true, 0.0, None, false),
        ];
        let was_training = crate::autograd::set_training(true);
        for (mode, layers, bidirectional, p, projection, lengths) in cases {
            let mut attrs: Attrs =
                [("mode", mode.to_string()), ("state_size", hidden.to_string()), ("num_layers", layers.to_string()), ("p", p.to_string())]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect();
            attrs.insert("bidirectional".into(), bidirectional.to_string());
            if let Some(size) = projection {
                attrs.insert("projection_size".into(), size.to_string());
            }
            if lengths {
                attrs.insert("use_sequence_length".into(), "True".into());
            }
            let rnn = super::build(crate::op::params::Params::parse("RNN", &attrs).unwrap()).unwrap();
            let d = super::Dims { steps, batch, input };
            let states = layers * rnn.dirs;
            let mut inputs =
                vec![array(&[steps, batch, input], 1), array(&[rnn.param_count(input)], 2), array(&[states, batch, rnn.state_width()], 3)];
            if mode == "lstm" {
                inputs.push(array(&[states, batch, hidden], 4));
            }
            if lengths {
                inputs.push(NDArray::from_vec(Shape::new(vec![batch]), &[5.0, 1.0, 3.0, 0.0, 5.0, 2.0], Context::cpu(0)).unwrap());
            }
            // The reserve starts as NaN (pooled memory is not zeroed): what the gradient reads of
            // it must all have been written by the forward pass.
            let cpu = Context::cpu(0);
            let mut given = vec![NDArray::empty(Shape::new(vec![steps, batch, rnn.dirs * rnn.state_width()]), DType::F64, cpu).unwrap()];
            if rnn.has_mask() {
                given.push(NDArray::empty(Shape::new(vec![layers - 1, steps, batch, rnn.dirs * rnn.state_width()]), DType::F64, cpu).unwrap());
            }
            given.push(NDArray::from_vec(Shape::new(vec![rnn.reserve_len(d)]), &vec![f64::NAN; rnn.reserve_len(d)], cpu).unwrap());
            let outputs = invoke("RNN", &inputs, &attrs, Some(given), cpu, None).unwrap();
            let reserve = outputs.last().unwrap().clone();
            let empty = NDArray::empty(Shape::new(vec![0]), DType::F64, Context::cpu(0)).unwrap();
            let grads = |reserve: &NDArray| {
                let mut args = vec![array(outputs[0].shape().dims(), 5)];
                args.extend(inputs.iter().cloned());
                args.extend(outputs[1..outputs.len() - 1].iter().cloned());
                args.extend([outputs[0].clone(), reserve.clone()]);
                let grads = invoke("_backward_RNN", &args, &attrs, None, Context::cpu(0), None).unwrap();
                grads.iter().map(|g| g.to_vec::<f64>().unwrap()).collect::<Vec<_>>()
            };
            assert_eq!(grads(&reserve), grads(&empty), "{mode}, {layers} layers");
        }
        crate::autograd::set_training(was_training);
    }
}
