//! The fused recurrent operator `RNN` as MXNet 1.x defines it (cuDNN's layout): stacked,
//! optionally bidirectional relu/tanh RNN, LSTM or GRU over (time, batch, input) data, with every
//! weight in one flat parameter vector (all i2h/h2h weights layer by layer and direction by
//! direction, then all biases in the same order; gates ordered i, f, g, o for LSTM and r, z, n
//! for GRU).
//!
//! Each layer and direction projects the inputs of all time steps with one GEMM, then runs one
//! GEMM per step for the recurrence. The gradient kernel recomputes the forward pass, keeping
//! the gate activations of every step, and backpropagates through time: no reserve space lives
//! between forward and backward. Inter-layer dropout keeps its mask as a hidden output so that
//! both passes see the same mask.

use super::fast_math::{sigmoid_f32, tanh_f32};
use super::grad::{Grad, InputGrads};
use super::linalg::{matmul_into, Mat};
use super::{ExecContext, OpDef, Operator, Tensor};
use crate::base::{DType, Elem, Shape};
use crate::error::Result;

crate::op_params! {
    pub struct RnnParams {
        /// Hidden units per layer and direction.
        state_size: usize,
        /// Number of stacked layers.
        num_layers: usize,
        /// Whether each layer also runs backwards in time (outputs concatenated).
        bidirectional: bool = false,
        /// 'rnn_relu', 'rnn_tanh', 'lstm' or 'gru'.
        mode: String,
        /// Dropout probability applied to the outputs of every layer but the last while training.
        p: f64 = 0.0,
        /// Whether the final hidden (and LSTM cell) states are outputs too.
        state_outputs: bool = false,
        /// LSTM projection size (not supported; rejected when given).
        projection_size: Option<i64> = None,
        /// Lower bound of the LSTM cell state.
        lstm_state_clip_min: Option<f64> = None,
        /// Upper bound of the LSTM cell state.
        lstm_state_clip_max: Option<f64> = None,
        /// Whether a NaN cell state is clipped too (to the lower bound) instead of propagating.
        lstm_state_clip_nan: bool = false,
        /// Per-sequence lengths as an extra input (not supported; rejected when true).
        use_sequence_length: bool = false,
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Relu,
    Tanh,
    Lstm,
    Gru,
}

impl Mode {
    fn gates(self) -> usize {
        match self {
            Mode::Relu | Mode::Tanh => 1,
            Mode::Lstm => 4,
            Mode::Gru => 3,
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
    fn sigmoid(self) -> f32 {
        sigmoid_f32(self)
    }
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
    mode: Mode,
    hidden: usize,
    layers: usize,
    dirs: usize,
    dropout: f64,
    state_outputs: bool,
    /// LSTM cell clipping bounds and whether NaN is clipped too.
    clip: Option<(f64, f64, bool)>,
}

/// Where one (layer, direction)'s parameter blocks start in the flat vector, and its input width.
struct Slots {
    w_ih: usize,
    w_hh: usize,
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
    fn layer_input(&self, layer: usize, input: usize) -> usize {
        if layer == 0 {
            input
        } else {
            self.dirs * self.hidden
        }
    }
    fn layer_weights(&self, layer: usize, input: usize) -> usize {
        self.dirs * self.gate_width() * (self.layer_input(layer, input) + self.hidden)
    }
    fn param_count(&self, input: usize) -> usize {
        (0..self.layers).map(|l| self.layer_weights(l, input)).sum::<usize>() + self.layers * self.dirs * 2 * self.gate_width()
    }
    fn slots(&self, input: usize, layer: usize, dir: usize) -> Slots {
        let gh = self.gate_width();
        let layer_in = self.layer_input(layer, input);
        let w_ih = (0..layer).map(|l| self.layer_weights(l, input)).sum::<usize>() + dir * gh * (layer_in + self.hidden);
        let weights: usize = (0..self.layers).map(|l| self.layer_weights(l, input)).sum();
        let b_ih = weights + (layer * self.dirs + dir) * 2 * gh;
        Slots { w_ih, w_hh: w_ih + gh * layer_in, b_ih, b_hh: b_ih + gh, input: layer_in }
    }
    fn has_mask(&self) -> bool {
        self.dropout > 0.0 && self.layers > 1
    }
    fn num_states(&self) -> usize {
        if self.mode == Mode::Lstm {
            2
        } else {
            1
        }
    }
    fn num_visible(&self) -> usize {
        1 + if self.state_outputs { self.num_states() } else { 0 }
    }
    fn state_shape(&self, d: Dims) -> Shape {
        Shape::new(vec![self.layers * self.dirs, d.batch, self.hidden])
    }
    fn dims(&self, data: &Shape) -> Result<Dims> {
        if data.ndim() != 3 {
            crate::bail!(Shape, "RNN: data must be 3-D (time, batch, input), got {data}");
        }
        Ok(Dims { steps: data[0], batch: data[1], input: data[2] })
    }
    /// Shapes of the visible outputs followed by the dropout mask's.
    fn output_shapes(&self, d: Dims) -> Vec<Shape> {
        let mut shapes = vec![Shape::new(vec![d.steps, d.batch, self.dirs * self.hidden])];
        if self.state_outputs {
            shapes.extend(std::iter::repeat_n(self.state_shape(d), self.num_states()));
        }
        if self.has_mask() {
            shapes.push(Shape::new(vec![self.layers - 1, d.steps, d.batch, self.dirs * self.hidden]));
        }
        shapes
    }
    fn input_names(&self) -> Vec<String> {
        let mut names = vec!["data".to_string(), "parameters".into(), "state".into()];
        if self.mode == Mode::Lstm {
            names.push("state_cell".into());
        }
        names
    }
    /// Checks data, parameters and states against each other.
    fn check_inputs(&self, inputs: &[Shape]) -> Result<Dims> {
        let d = self.dims(&inputs[0])?;
        let count = self.param_count(d.input);
        if inputs[1].dims() != [count] {
            crate::bail!(Shape, "RNN: parameters has shape {}, expected ({count},) for data {} ({} layers, state_size {})", inputs[1], inputs[0], self.layers, self.hidden);
        }
        let state = self.state_shape(d);
        for (name, shape) in ["state", "state_cell"].iter().zip(&inputs[2..2 + self.num_states()]) {
            if *shape != state {
                crate::bail!(Shape, "RNN: {name} has shape {shape}, expected {state} for data {}", inputs[0]);
            }
        }
        Ok(d)
    }
}

/// What backpropagation needs of one (layer, direction)'s forward pass.
struct Trace<T> {
    /// (time, batch, gates x hidden): activated gates (LSTM i f g o, GRU r z n, RNN h), then
    /// overwritten by their pre-activation gradients during backpropagation.
    gates: Vec<T>,
    /// LSTM: the (clipped) cell state of every step.
    cells: Vec<T>,
    /// GRU: W_hn h + b_hn of every step (the part the reset gate scales).
    hidden_n: Vec<T>,
}

impl<T: Real> Trace<T> {
    fn new(rnn: &Rnn, d: Dims) -> Trace<T> {
        let rows = d.steps * d.batch;
        let per_step = |used: bool| if used { vec![T::ZERO; rows * rnn.hidden] } else { Vec::new() };
        Trace { gates: vec![T::ZERO; rows * rnn.gate_width()], cells: per_step(rnn.mode == Mode::Lstm), hidden_n: per_step(rnn.mode == Mode::Gru) }
    }
}

/// One forward or backward computation over given parameters.
struct Pass<'a, T> {
    rnn: &'a Rnn,
    d: Dims,
    params: &'a [T],
    dtype: DType,
    threads: usize,
}

/// `dst (+)= a * b` for row-major operands given as (stored rows, stored cols, transposed).
///
/// # Safety
/// Every slice must hold the stored matrix it describes and `T` must be `dtype`'s element type.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T>(dtype: DType, dst: &mut [T], accumulate: bool, a: &[T], am: (usize, usize, bool), b: &[T], bm: (usize, usize, bool), threads: usize) {
    matmul_into(
        dtype,
        dst.as_mut_ptr() as *mut u8,
        accumulate,
        a.as_ptr() as *const u8,
        Mat::stored(am.0, am.1, am.2),
        b.as_ptr() as *const u8,
        Mat::stored(bm.0, bm.1, bm.2),
        threads,
    )
}

fn add_rows<T: Real>(values: &mut [T], row: &[T]) {
    for chunk in values.chunks_mut(row.len()) {
        chunk.iter_mut().zip(row).for_each(|(v, &b)| *v = *v + b);
    }
}

fn column_sums_into<T: Real>(sums: &mut [T], values: &[T]) {
    for chunk in values.chunks(sums.len()) {
        sums.iter_mut().zip(chunk).for_each(|(s, &v)| *s = *s + v);
    }
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
    fn clip_cell(&self, c: T) -> (T, bool) {
        match self.rnn.clip {
            Some((lo, hi, clip_nan)) => {
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
            None => (c, false),
        }
    }

    /// Runs one direction of one layer over `x` (steps x batch x layer input), writing its
    /// hidden states into its half of `out` (steps x batch x dirs*hidden) and its final states
    /// into `hy`/`cy`.
    #[allow(clippy::too_many_arguments)]
    fn direction_forward(&self, layer: usize, dir: usize, x: &[T], h0: &[T], c0: &[T], out: &mut [T], trace: &mut Trace<T>, hy: &mut [T], cy: &mut [T]) {
        let (rnn, d) = (self.rnn, self.d);
        let (h, gh, n, width) = (rnn.hidden, rnn.gate_width(), d.batch, rnn.dirs * rnn.hidden);
        let s = rnn.slots(d.input, layer, dir);
        let p = self.params;
        let (w_ih, w_hh) = (&p[s.w_ih..][..gh * s.input], &p[s.w_hh..][..gh * h]);
        let (b_ih, b_hh) = (&p[s.b_ih..][..gh], &p[s.b_hh..][..gh]);
        let rows = d.steps * n;
        // SAFETY: x is (rows, input), w_ih (gh, input) read transposed, gates (rows, gh).
        unsafe { gemm(self.dtype, &mut trace.gates, false, x, (rows, s.input, false), w_ih, (gh, s.input, true), self.threads) };
        add_rows(&mut trace.gates, b_ih);
        if rnn.mode != Mode::Gru {
            add_rows(&mut trace.gates, b_hh);
        }
        let mut h_prev = h0.to_vec();
        let mut c_prev = c0.to_vec();
        let mut recurrent = vec![T::ZERO; if rnn.mode == Mode::Gru { n * gh } else { 0 }];
        for step in 0..d.steps {
            let t = step_time(dir, d.steps, step);
            let gates = &mut trace.gates[t * n * gh..][..n * gh];
            // SAFETY: h_prev is (n, h), w_hh (gh, h) read transposed, the destination (n, gh).
            unsafe {
                if rnn.mode == Mode::Gru {
                    gemm(self.dtype, &mut recurrent, false, &h_prev, (n, h, false), w_hh, (gh, h, true), self.threads);
                    add_rows(&mut recurrent, b_hh);
                } else {
                    gemm(self.dtype, gates, true, &h_prev, (n, h, false), w_hh, (gh, h, true), self.threads);
                }
            }
            for b in 0..n {
                let g = &mut gates[b * gh..][..gh];
                let out_row = &mut out[(t * n + b) * width + dir * h..][..h];
                for j in 0..h {
                    let at = b * h + j;
                    let value = match rnn.mode {
                        Mode::Relu => {
                            g[j] = if g[j] > T::ZERO { g[j] } else { T::ZERO };
                            g[j]
                        }
                        Mode::Tanh => {
                            g[j] = g[j].tanh();
                            g[j]
                        }
                        Mode::Lstm => {
                            let (i, f, c_new, o) = (g[j].sigmoid(), g[h + j].sigmoid(), g[2 * h + j].tanh(), g[3 * h + j].sigmoid());
                            let (c, _) = self.clip_cell(f * c_prev[at] + i * c_new);
                            (g[j], g[h + j], g[2 * h + j], g[3 * h + j]) = (i, f, c_new, o);
                            trace.cells[t * n * h + at] = c;
                            c_prev[at] = c;
                            o * c.tanh()
                        }
                        Mode::Gru => {
                            let r = &recurrent[b * gh..];
                            let (reset, update) = ((g[j] + r[j]).sigmoid(), (g[h + j] + r[h + j]).sigmoid());
                            let hidden_n = r[2 * h + j];
                            let candidate = (g[2 * h + j] + reset * hidden_n).tanh();
                            (g[j], g[h + j], g[2 * h + j]) = (reset, update, candidate);
                            trace.hidden_n[t * n * h + at] = hidden_n;
                            (T::ONE - update) * candidate + update * h_prev[at]
                        }
                    };
                    out_row[j] = value;
                }
            }
            for b in 0..n {
                h_prev[b * h..][..h].copy_from_slice(&out[(t * n + b) * width + dir * h..][..h]);
            }
        }
        hy.copy_from_slice(&h_prev);
        if rnn.mode == Mode::Lstm {
            cy.copy_from_slice(&c_prev);
        }
    }

    /// Backpropagates one direction of one layer: `dout` is the gradient of the layer's output,
    /// `dh`/`dc` enter as the final states' gradients and leave as the initial states'. The
    /// data gradient is added to `dx` and the parameter gradients to `dparams`.
    #[allow(clippy::too_many_arguments)]
    fn direction_backward(
        &self,
        layer: usize,
        dir: usize,
        x: &[T],
        h0: &[T],
        c0: &[T],
        out: &[T],
        trace: &mut Trace<T>,
        dout: &[T],
        dh: &mut [T],
        dc: &mut [T],
        dx: &mut [T],
        dparams: &mut [T],
    ) {
        let (rnn, d) = (self.rnn, self.d);
        let (h, gh, n, width) = (rnn.hidden, rnn.gate_width(), d.batch, rnn.dirs * rnn.hidden);
        let s = rnn.slots(d.input, layer, dir);
        let p = self.params;
        let (w_ih, w_hh) = (&p[s.w_ih..][..gh * s.input], &p[s.w_hh..][..gh * h]);
        let mut h_prev = vec![T::ZERO; n * h];
        let mut recurrent_grad = vec![T::ZERO; if rnn.mode == Mode::Gru { n * gh } else { 0 }];
        let mut dh_next = vec![T::ZERO; n * h];
        for step in (0..d.steps).rev() {
            let t = step_time(dir, d.steps, step);
            let previous = (step > 0).then(|| step_time(dir, d.steps, step - 1));
            match previous {
                Some(tp) => (0..n).for_each(|b| h_prev[b * h..][..h].copy_from_slice(&out[(tp * n + b) * width + dir * h..][..h])),
                None => h_prev.copy_from_slice(h0),
            }
            let c_prev = |at: usize| match previous {
                Some(tp) => trace.cells[tp * n * h + at],
                None => c0[at],
            };
            let mut c_grads = vec![T::ZERO; if rnn.mode == Mode::Lstm { n * h } else { 0 }];
            for b in 0..n {
                for j in 0..h {
                    let at = b * h + j;
                    let grad = dh[at] + dout[(t * n + b) * width + dir * h + j];
                    let g = &mut trace.gates[(t * n + b) * gh..][..gh];
                    match rnn.mode {
                        Mode::Relu => g[j] = if g[j] > T::ZERO { grad } else { T::ZERO },
                        Mode::Tanh => g[j] = grad * (T::ONE - g[j] * g[j]),
                        Mode::Lstm => {
                            let (i, f, c_new, o) = (g[j], g[h + j], g[2 * h + j], g[3 * h + j]);
                            let c = trace.cells[t * n * h + at];
                            let tanh_c = c.tanh();
                            let (_, clipped) = self.clip_cell(f * c_prev(at) + i * c_new);
                            let through_c = dc[at] + grad * o * (T::ONE - tanh_c * tanh_c);
                            let dcell = if clipped { T::ZERO } else { through_c };
                            g[j] = dcell * c_new * i * (T::ONE - i);
                            g[h + j] = dcell * c_prev(at) * f * (T::ONE - f);
                            g[2 * h + j] = dcell * i * (T::ONE - c_new * c_new);
                            g[3 * h + j] = grad * tanh_c * o * (T::ONE - o);
                            c_grads[at] = dcell * f;
                        }
                        Mode::Gru => {
                            let (reset, update, candidate) = (g[j], g[h + j], g[2 * h + j]);
                            let hidden_n = trace.hidden_n[t * n * h + at];
                            let d_candidate = grad * (T::ONE - update) * (T::ONE - candidate * candidate);
                            let d_update = grad * (h_prev[at] - candidate) * update * (T::ONE - update);
                            let d_reset = d_candidate * hidden_n * reset * (T::ONE - reset);
                            (g[j], g[h + j], g[2 * h + j]) = (d_reset, d_update, d_candidate);
                            let r = &mut recurrent_grad[b * gh..];
                            (r[j], r[h + j], r[2 * h + j]) = (d_reset, d_update, d_candidate * reset);
                            dh_next[at] = grad * update;
                        }
                    }
                }
            }
            if rnn.mode == Mode::Lstm {
                dc.copy_from_slice(&c_grads);
            }
            let gates = &trace.gates[t * n * gh..][..n * gh];
            let recurrent = if rnn.mode == Mode::Gru { &recurrent_grad[..] } else { gates };
            let (w_hh_grad, b_hh_grad) = (s.w_hh, s.b_hh);
            // SAFETY: recurrent (n, gh) times w_hh (gh, h) into (n, h); recurrent read
            // transposed (gh, n) times h_prev (n, h) into the (gh, h) weight gradient.
            unsafe {
                gemm(self.dtype, &mut dh_next, rnn.mode == Mode::Gru, recurrent, (n, gh, false), w_hh, (gh, h, false), self.threads);
                gemm(self.dtype, &mut dparams[w_hh_grad..][..gh * h], true, recurrent, (n, gh, true), &h_prev, (n, h, false), self.threads);
            }
            column_sums_into(&mut dparams[b_hh_grad..][..gh], recurrent);
            dh.copy_from_slice(&dh_next);
        }
        let rows = d.steps * n;
        // SAFETY: gates (rows, gh) transposed times x (rows, input) into the (gh, input) weight
        // gradient; gates times w_ih (gh, input) into dx (rows, input).
        unsafe {
            gemm(self.dtype, &mut dparams[s.w_ih..][..gh * s.input], true, &trace.gates, (rows, gh, true), x, (rows, s.input, false), self.threads);
            gemm(self.dtype, dx, true, &trace.gates, (rows, gh, false), w_ih, (gh, s.input, false), self.threads);
        }
        column_sums_into(&mut dparams[s.b_ih..][..gh], &trace.gates);
    }

    /// Runs all layers: the last layer's output goes to `out`, final states to `hy`/`cy`. With
    /// `keep`, returns every layer's (masked) input, the outputs of all but the last layer and
    /// every direction's trace, for backpropagation.
    fn forward(&self, data: &[T], h0: &[T], c0: &[T], mask: Option<&[T]>, out: &mut [T], hy: &mut [T], cy: &mut [T], keep: bool) -> Kept<T> {
        let (rnn, d) = (self.rnn, self.d);
        let state = d.batch * rnn.hidden;
        let layer_out = d.steps * d.batch * rnn.dirs * rnn.hidden;
        let mut kept = Kept { inputs: Vec::new(), outputs: Vec::new(), traces: Vec::new() };
        let mut reusable = (!keep).then(|| Trace::new(rnn, d));
        let mut input: Vec<T> = Vec::new();
        for layer in 0..rnn.layers {
            let last = layer + 1 == rnn.layers;
            let mut below = if last { Vec::new() } else { vec![T::ZERO; layer_out] };
            let target: &mut [T] = if last { &mut *out } else { &mut below };
            let x: &[T] = if layer == 0 { data } else { &input };
            for dir in 0..rnn.dirs {
                let k = layer * rnn.dirs + dir;
                let mut fresh = keep.then(|| Trace::new(rnn, d));
                let trace = fresh.as_mut().or(reusable.as_mut()).expect("one of the traces exists");
                let cell = if rnn.mode == Mode::Lstm { &c0[k * state..][..state] } else { &[] };
                let cell_out: &mut [T] = if rnn.mode == Mode::Lstm { &mut cy[k * state..][..state] } else { &mut [] };
                self.direction_forward(layer, dir, x, &h0[k * state..][..state], cell, target, trace, &mut hy[k * state..][..state], cell_out);
                kept.traces.extend(fresh);
            }
            if keep && layer > 0 {
                kept.inputs.push(std::mem::take(&mut input));
            }
            if !last {
                input = match mask {
                    Some(m) => below.iter().zip(&m[layer * layer_out..][..layer_out]).map(|(&v, &k)| v * k).collect(),
                    None => below.clone(),
                };
                if keep {
                    kept.outputs.push(below);
                }
            }
        }
        kept
    }
}

/// Forward values kept for backpropagation: inputs of layers 1.., outputs of layers ..L-1, and
/// the traces of every (layer, direction).
struct Kept<T> {
    inputs: Vec<Vec<T>>,
    outputs: Vec<Vec<T>>,
    traces: Vec<Trace<T>>,
}

fn supported(dtype: DType) -> Result<()> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        crate::bail!(Type, "RNN: dtype {dtype} is not supported on CPU (float32 and float64 are)");
    }
    Ok(())
}

macro_rules! dispatch_real {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F64 => {
                type $T = f64;
                $body
            }
            _ => {
                type $T = f32;
                $body
            }
        }
    };
}

impl Operator for Rnn {
    fn input_names(&self) -> Vec<String> {
        Rnn::input_names(self)
    }
    fn num_outputs(&self) -> usize {
        self.num_visible() + usize::from(self.has_mask())
    }
    fn num_visible_outputs(&self) -> usize {
        self.num_visible()
    }
    fn complete_input_shapes(&self, inputs: &mut [Option<Shape>]) -> Result<()> {
        if let Some(data) = &inputs[0] {
            let d = self.dims(data)?;
            inputs[1].get_or_insert_with(|| Shape::new(vec![self.param_count(d.input)]));
            for state in inputs[2..].iter_mut() {
                state.get_or_insert_with(|| self.state_shape(d));
            }
        }
        Ok(())
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let d = self.check_inputs(inputs)?;
        Ok(self.output_shapes(d))
    }
    fn needs_rng(&self) -> bool {
        self.has_mask()
    }
    fn forward(&self, ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        supported(inputs[0].dtype)?;
        let d = self.dims(&inputs[0].shape)?;
        let states = d.batch * self.hidden * self.layers * self.dirs;
        dispatch_real!(inputs[0].dtype, T => {
            // SAFETY: inputs are only read; each output is this op's alone and aliases no input.
            let (data, params, h0) = unsafe { (inputs[0].slice::<T>(), inputs[1].slice::<T>(), inputs[2].slice::<T>()) };
            let c0 = if self.mode == Mode::Lstm { unsafe { inputs[3].slice::<T>() } } else { &[] };
            let mut mask = self.has_mask().then(|| unsafe { outputs[self.num_visible()].slice_mut::<T>() });
            if let Some(mask) = mask.as_mut() {
                let keep_scale = 1.0 / (1.0 - self.dropout);
                for (i, m) in mask.iter_mut().enumerate() {
                    let kept = !ctx.is_train || crate::random::uniform(ctx.seed, i as u64) >= self.dropout;
                    *m = T::from_f64(if !ctx.is_train { 1.0 } else if kept { keep_scale } else { 0.0 });
                }
            }
            let mut hy = vec![T::ZERO; states];
            let mut cy = vec![T::ZERO; if self.mode == Mode::Lstm { states } else { 0 }];
            let pass = Pass { rnn: self, d, params, dtype: inputs[0].dtype, threads: rayon::current_num_threads() };
            let out = unsafe { outputs[0].slice_mut::<T>() };
            pass.forward(data, h0, c0, mask.as_deref(), out, &mut hy, &mut cy, false);
            if self.state_outputs {
                unsafe { outputs[1].slice_mut::<T>() }.copy_from_slice(&hy);
                if self.mode == Mode::Lstm {
                    unsafe { outputs[2].slice_mut::<T>() }.copy_from_slice(&cy);
                }
            }
        });
        Ok(())
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        let mut inputs: Vec<_> = (0..self.num_visible()).map(|i| g.out_grad(i)).collect();
        inputs.extend((0..g.num_inputs()).map(|i| g.input(i)));
        if self.has_mask() {
            inputs.push(g.output(self.num_visible()));
        }
        let refs: Vec<_> = inputs.iter().collect();
        let grads = g.op_outputs("_backward_RNN", &self.attrs(), &refs)?;
        Ok(grads.into_iter().map(Some).collect())
    }
}

impl Rnn {
    fn attrs(&self) -> Vec<(&'static str, String)> {
        let flag = |b: bool| if b { "True" } else { "False" }.to_string();
        let mode = match self.mode {
            Mode::Relu => "rnn_relu",
            Mode::Tanh => "rnn_tanh",
            Mode::Lstm => "lstm",
            Mode::Gru => "gru",
        };
        let mut attrs = vec![
            ("state_size", self.hidden.to_string()),
            ("num_layers", self.layers.to_string()),
            ("bidirectional", flag(self.dirs == 2)),
            ("mode", mode.to_string()),
            ("p", format!("{:?}", self.dropout)),
            ("state_outputs", flag(self.state_outputs)),
        ];
        if let Some((lo, hi, nan)) = self.clip {
            attrs.extend([("lstm_state_clip_min", format!("{lo:?}")), ("lstm_state_clip_max", format!("{hi:?}")), ("lstm_state_clip_nan", flag(nan))]);
        }
        attrs
    }
}

/// `_backward_RNN(out grads..., data, parameters, state[, state_cell][, mask])`: gradients of
/// data, parameters and the initial states.
struct RnnBackward(Rnn);

impl Operator for RnnBackward {
    fn input_names(&self) -> Vec<String> {
        let rnn = &self.0;
        let mut names: Vec<String> = ["grad", "grad_state", "grad_state_cell"][..rnn.num_visible()].iter().map(|s| s.to_string()).collect();
        names.extend(rnn.input_names());
        if rnn.has_mask() {
            names.push("mask".into());
        }
        names
    }
    fn num_outputs(&self) -> usize {
        2 + self.0.num_states()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let first = self.0.num_visible();
        self.0.check_inputs(&inputs[first..])?;
        Ok(inputs[first..first + 2 + self.0.num_states()].to_vec())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        Ok(vec![inputs[0]; self.num_outputs()])
    }
    fn forward(&self, _ctx: &ExecContext, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        let rnn = &self.0;
        let first = rnn.num_visible();
        supported(inputs[first].dtype)?;
        let d = rnn.dims(&inputs[first].shape)?;
        let state = d.batch * rnn.hidden;
        let lstm = rnn.mode == Mode::Lstm;
        dispatch_real!(inputs[first].dtype, T => {
            // SAFETY: inputs are only read; each output is this op's alone and aliases no input.
            let read = |i: usize| unsafe { inputs[i].slice::<T>() };
            let (dout, data, params, h0) = (read(0), read(first), read(first + 1), read(first + 2));
            let c0 = if lstm { read(first + 3) } else { &[] };
            let mask = rnn.has_mask().then(|| read(inputs.len() - 1));
            let pass = Pass { rnn, d, params, dtype: inputs[first].dtype, threads: rayon::current_num_threads() };
            let mut top = vec![T::ZERO; d.steps * d.batch * rnn.dirs * rnn.hidden];
            let mut hy = vec![T::ZERO; h0.len()];
            let mut cy = vec![T::ZERO; c0.len()];
            let mut kept = pass.forward(data, h0, c0, mask, &mut top, &mut hy, &mut cy, true);
            // The final states' gradients (zero unless they are outputs).
            let mut dh = if rnn.state_outputs { read(1).to_vec() } else { vec![T::ZERO; h0.len()] };
            let mut dc = if rnn.state_outputs && lstm { read(2).to_vec() } else { vec![T::ZERO; c0.len()] };
            let dparams = unsafe { outputs[1].slice_mut::<T>() };
            dparams.fill(T::ZERO);
            let mut d_layer_out = dout.to_vec();
            for layer in (0..rnn.layers).rev() {
                let x: &[T] = if layer == 0 { data } else { &kept.inputs[layer - 1] };
                let out: &[T] = if layer + 1 == rnn.layers { &top } else { &kept.outputs[layer] };
                let mut dx = vec![T::ZERO; x.len()];
                for dir in 0..rnn.dirs {
                    let k = layer * rnn.dirs + dir;
                    let cell = if lstm { &c0[k * state..][..state] } else { &[] };
                    let dcell: &mut [T] = if lstm { &mut dc[k * state..][..state] } else { &mut [] };
                    pass.direction_backward(layer, dir, x, &h0[k * state..][..state], cell, out, &mut kept.traces[k], &d_layer_out, &mut dh[k * state..][..state], dcell, &mut dx, dparams);
                }
                d_layer_out = match (layer, mask) {
                    (0, _) => dx,
                    (_, Some(m)) => dx.iter().zip(&m[(layer - 1) * x.len()..][..x.len()]).map(|(&v, &k)| v * k).collect(),
                    (_, None) => dx,
                };
            }
            unsafe { outputs[0].slice_mut::<T>() }.copy_from_slice(&d_layer_out);
            unsafe { outputs[2].slice_mut::<T>() }.copy_from_slice(&dh);
            if lstm {
                unsafe { outputs[3].slice_mut::<T>() }.copy_from_slice(&dc);
            }
        });
        Ok(())
    }
}

fn build(p: RnnParams) -> Result<Rnn> {
    let mode = match p.mode.as_str() {
        "rnn_relu" => Mode::Relu,
        "rnn_tanh" => Mode::Tanh,
        "lstm" => Mode::Lstm,
        "gru" => Mode::Gru,
        other => crate::bail!(Param, "RNN: mode must be 'rnn_relu', 'rnn_tanh', 'lstm' or 'gru', got '{other}'"),
    };
    if p.state_size == 0 || p.num_layers == 0 {
        crate::bail!(Param, "RNN: state_size and num_layers must be positive");
    }
    if !(0.0..1.0).contains(&p.p) {
        crate::bail!(Param, "RNN: dropout p must be in [0, 1), got {}", p.p);
    }
    if p.projection_size.is_some() {
        crate::bail!(Param, "RNN: projection_size is not supported");
    }
    if p.use_sequence_length {
        crate::bail!(Param, "RNN: use_sequence_length is not supported; pad the sequences and mask the outputs with SequenceMask");
    }
    let clip = match (p.lstm_state_clip_min, p.lstm_state_clip_max) {
        (Some(lo), Some(hi)) if lo <= hi => Some((lo, hi, p.lstm_state_clip_nan)),
        (None, None) => None,
        _ => crate::bail!(Param, "RNN: lstm_state_clip_min and lstm_state_clip_max must be given together, min <= max"),
    };
    if clip.is_some() && mode != Mode::Lstm {
        crate::bail!(Param, "RNN: state clipping applies to mode 'lstm' only");
    }
    Ok(Rnn { mode, hidden: p.state_size, layers: p.num_layers, dirs: if p.bidirectional { 2 } else { 1 }, dropout: p.p, state_outputs: p.state_outputs, clip })
}

pub(super) fn register(add: &mut dyn FnMut(OpDef)) {
    add(OpDef::new("RNN", &[], "Applies a stacked (bidirectional) relu/tanh RNN, LSTM or GRU to (time, batch, input) data with all weights in one parameter vector.", build));
    add(OpDef::new("_backward_RNN", &[], "Gradients of RNN for data, parameters and initial states (recomputes the forward pass).", |p: RnnParams| {
        Ok(RnnBackward(build(p)?))
    }));
}
