//! Control flow operators that hold subgraphs (MXNet's `_foreach`, `_while_loop` and `_cond`,
//! what `mx.sym.contrib.foreach / while_loop / cond` build).
//!
//! Each subgraph is a [`Symbol`] whose input variables are bound anew for every iteration (or for
//! the branch taken) and run on the host through the graph runner, like a cached graph. The
//! gradient of a subgraph is built once, when the operator is made, by the gradient pass every
//! other graph uses. The forward values that gradient reads are kept per iteration as hidden
//! outputs of the node, stacked along a new first axis: backward then neither recomputes the
//! forward pass nor draws new random numbers (a dropout mask inside a loop body is the one the
//! forward pass used). The gradient node runs the subgraph's gradient once per iteration in
//! reverse, carrying the loop states' gradients from each iteration to the one before.
//!
//! Node inputs follow MXNet's conventions. `_foreach`: the data arrays (iterated over their
//! first axis), the initial states, then the remaining (free) inputs; `in_data_locs`,
//! `in_state_locs` and `remain_locs` say where each lands among the body's inputs.
//! `_while_loop` and `_cond`: one list of inputs that every subgraph picks from
//! (`cond_input_locs`, `func_input_locs`, `then_input_locs`, `else_input_locs`); the loop
//! variables of `_while_loop` are the node inputs its body's inputs `func_var_locs` read.
// Not yet under the executor's lint discipline (issue 23): its subgraph input positions are
// indexed directly, checked when the operator is built from its attributes.
#![cfg_attr(not(test), allow(clippy::unwrap_used, clippy::indexing_slicing))]

use std::sync::Arc;

use super::{run, Source};
use crate::autograd::{self, FlagsGuard};
use crate::base::{merge_partial, Context, DType, PartialShape, Shape};
use crate::error::Result;
use crate::graph::{address, node_key, AddressMap, AddressSet, Entry, Node};
use crate::imperative;
use crate::ndarray::NDArray;
use crate::op::grad::{Grad, InputGrads};
use crate::op::params::{check_known, parse_value};
use crate::op::{Attrs, GradientIdentity, Operator};
use crate::pass::gradient::SymbolGradient;
use crate::pass::infer;
use crate::symbol::Symbol;

/// The names of the operators this module defines.
pub fn is_control_flow(op_name: &str) -> bool {
    matches!(op_name, "_foreach" | "_while_loop" | "_cond")
}

/// The control flow operator `op_name` with its parameters and subgraphs.
pub fn instantiate(op_name: &str, attrs: &Attrs, subgraphs: Vec<Symbol>) -> Result<Arc<dyn Operator>> {
    let operator: Arc<dyn Operator> = match op_name {
        "_foreach" => Arc::new(Foreach::new(attrs, subgraphs)?),
        "_while_loop" => Arc::new(WhileLoop::new(attrs, subgraphs)?),
        "_cond" => Arc::new(Cond::new(attrs, subgraphs)?),
        other => crate::bail!(Param, "operator '{other}' does not take subgraphs"),
    };
    Ok(operator)
}

// ---- parameters ---------------------------------------------------------------------------------

fn count(op: &str, attrs: &Attrs, key: &str) -> Result<usize> {
    let Some(text) = attrs.get(key) else {
        crate::bail!(Param, "operator {op}: required parameter '{key}' is missing");
    };
    let value: i64 = parse_value(op, key, text)?;
    usize::try_from(value).map_err(|_| crate::err!(Param, "operator {op}: '{key}' must be non-negative, got {value}"))
}

fn locations(op: &str, attrs: &Attrs, key: &str) -> Result<Vec<usize>> {
    let Some(text) = attrs.get(key) else {
        crate::bail!(Param, "operator {op}: required parameter '{key}' is missing");
    };
    let values: Vec<i64> = parse_value(op, key, text)?;
    values.into_iter().map(|v| usize::try_from(v).map_err(|_| crate::err!(Param, "operator {op}: '{key}' holds a negative location {v}"))).collect()
}

/// The number of node inputs: MXNet's `num_args` counts the subgraphs as inputs too.
fn num_node_inputs(op: &str, attrs: &Attrs, num_subgraphs: usize) -> Result<usize> {
    let num_args = count(op, attrs, "num_args")?;
    num_args
        .checked_sub(num_subgraphs)
        .ok_or_else(|| crate::err!(Param, "operator {op}: num_args is {num_args}, but it counts the {num_subgraphs} subgraph(s) among the inputs"))
}

fn check_locations(op: &str, what: &str, locs: &[usize], bound: usize) -> Result<()> {
    if let Some(bad) = locs.iter().find(|&&l| l >= bound) {
        crate::bail!(Param, "operator {op}: {what} holds location {bad}, but there are only {bound}");
    }
    Ok(())
}

fn take_subgraphs<const N: usize>(op: &str, subgraphs: Vec<Symbol>) -> Result<[Symbol; N]> {
    let given = subgraphs.len();
    subgraphs.try_into().map_err(|_| crate::err!(Param, "operator {op} holds {N} subgraph(s), got {given}"))
}

// ---- one subgraph -------------------------------------------------------------------------------

/// A subgraph's gradient with respect to every input, and the forward values it reads.
struct SubgraphGradient {
    /// One variable per output, standing for its head gradient.
    head_grads: Vec<Arc<Node>>,
    /// Per input: its gradient entry, `None` when no output depends on it.
    grads: Vec<Option<Entry>>,
    /// Forward entries the gradient reads (every output of each such node).
    saved: Vec<Entry>,
}

/// A subgraph run with its inputs bound to arrays.
struct Subgraph {
    symbol: Symbol,
    inputs: Vec<Arc<Node>>,
    /// The gradient, or why there is none (not asked for, or an operator without gradient).
    gradient: std::result::Result<SubgraphGradient, String>,
}

impl Subgraph {
    fn new(symbol: Symbol, differentiable: bool) -> Subgraph {
        let inputs = symbol.input_nodes();
        let gradient = if differentiable {
            Self::build_gradient(&symbol, &inputs).map_err(|e| e.to_string())
        } else {
            Err("the subgraph is not differentiated".to_string())
        };
        Subgraph { symbol, inputs, gradient }
    }

    fn build_gradient(symbol: &Symbol, inputs: &[Arc<Node>]) -> Result<SubgraphGradient> {
        let forward: AddressSet<usize> = symbol.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
        let gradient = SymbolGradient::new(&symbol.outputs, inputs, |_| true, (&forward, false), &|_| None)?;
        let saved = gradient.saved(&forward);
        let SymbolGradient { head_grads, grads, .. } = gradient;
        Ok(SubgraphGradient { head_grads, grads, saved })
    }

    fn num_outputs(&self) -> usize {
        self.symbol.outputs.len()
    }

    fn saved(&self) -> &[Entry] {
        self.gradient.as_ref().map_or(&[], |g| g.saved.as_slice())
    }

    fn gradient(&self, op: &str) -> Result<&SubgraphGradient> {
        self.gradient.as_ref().map_err(|why| crate::err!(Value, "{op}: its subgraph has no gradient: {why}"))
    }

    /// The outputs followed by the saved entries: what a forward run computes.
    fn targets(&self) -> Vec<Entry> {
        let mut targets = self.symbol.outputs.clone();
        targets.extend(self.saved().iter().cloned());
        targets
    }

    fn check_arity(&self, what: &str, given: usize, expected: usize) -> Result<()> {
        if given != expected {
            crate::bail!(Value, "subgraph: {given} {what} given, expected {expected}");
        }
        Ok(())
    }

    /// Shapes of the outputs and saved entries (in [`Subgraph::targets`] order) from partly known
    /// input shapes, with the input shapes completed from what the subgraph tells of them.
    fn partial_shapes(&self, inputs: &[Option<PartialShape>]) -> Result<(Vec<Option<PartialShape>>, Vec<Option<PartialShape>>)> {
        self.check_arity("input shape(s)", inputs.len(), self.inputs.len())?;
        let given: AddressMap<usize, PartialShape> = self.inputs.iter().zip(inputs).filter_map(|(n, s)| Some((node_key(n), s.clone()?))).collect();
        let targets = self.targets();
        let inferred = infer::infer_partial_shapes(&targets, &|n: &Node| given.get(&address(n)).cloned())?;
        let of = |e: Entry| inferred.get(&e.key()).cloned();
        let refined = self.inputs.iter().map(|n| of(Entry::new(n.clone(), 0))).collect();
        Ok((refined, targets.into_iter().map(of).collect()))
    }

    /// Dtypes of the outputs and saved entries, with the input dtypes completed.
    fn types(&self, inputs: &[Option<DType>]) -> Result<(Vec<Option<DType>>, Vec<Option<DType>>)> {
        self.check_arity("input dtype(s)", inputs.len(), self.inputs.len())?;
        let given: AddressMap<usize, DType> = self.inputs.iter().zip(inputs).filter_map(|(n, d)| Some((node_key(n), (*d)?))).collect();
        let targets = self.targets();
        let inferred = infer::infer_types(&targets, &|n: &Node| given.get(&address(n)).copied())?;
        let of = |e: Entry| inferred.get(&e.key()).copied();
        let refined = self.inputs.iter().map(|n| of(Entry::new(n.clone(), 0))).collect();
        Ok((refined, targets.into_iter().map(of).collect()))
    }

    /// The outputs and saved values for these inputs.
    fn forward(&self, inputs: &[NDArray], ctx: Context) -> Result<Vec<NDArray>> {
        self.check_arity("input(s)", inputs.len(), self.inputs.len())?;
        let bound: AddressMap<usize, NDArray> = self.inputs.iter().zip(inputs).map(|(n, a)| (node_key(n), a.detached())).collect();
        let _flags = FlagsGuard::set(false, autograd::is_training());
        run(&self.targets(), &AddressMap::default(), ctx, |node| match bound.get(&node_key(node)) {
            Some(a) => Ok(Source::Known(vec![a.clone()])),
            None if node.is_variable() => crate::bail!(Value, "subgraph input '{}' is not bound", node.name),
            None => Ok(Source::Compute),
        })
    }

    /// Gradients of the inputs (`None`: zero) from the inputs, the saved values of the forward
    /// run and the outputs' head gradients.
    fn backward(&self, op: &str, inputs: &[NDArray], saved: &[NDArray], head_grads: &[NDArray], ctx: Context) -> Result<Vec<Option<NDArray>>> {
        let plan = self.gradient(op)?;
        self.check_arity("input(s)", inputs.len(), self.inputs.len())?;
        self.check_arity("saved value(s)", saved.len(), plan.saved.len())?;
        self.check_arity("head gradient(s)", head_grads.len(), plan.head_grads.len())?;
        let mut known: AddressMap<usize, NDArray> = self.inputs.iter().zip(inputs).map(|(n, a)| (node_key(n), a.detached())).collect();
        known.extend(plan.head_grads.iter().zip(head_grads).map(|(n, a)| (node_key(n), a.detached())));
        let mut saved_values: AddressMap<usize, Vec<Option<NDArray>>> = AddressMap::default();
        for (entry, value) in plan.saved.iter().zip(saved) {
            let slots = saved_values.entry(node_key(&entry.node)).or_insert_with(|| vec![None; entry.node.num_outputs()]);
            slots[entry.index] = Some(value.detached());
        }
        let targets: Vec<Entry> = plan.grads.iter().flatten().cloned().collect();
        let _flags = FlagsGuard::set(false, autograd::is_training());
        let mut values = run(&targets, &AddressMap::default(), ctx, |node| {
            if let Some(a) = known.get(&node_key(node)) {
                return Ok(Source::Known(vec![a.clone()]));
            }
            match saved_values.get(&node_key(node)) {
                Some(slots) => Ok(Source::Known(slots.iter().map(|s| s.clone().expect("every output of a saved node is saved")).collect())),
                None if node.is_variable() => crate::bail!(Value, "subgraph input '{}' is not bound", node.name),
                None => Ok(Source::Compute),
            }
        })?
        .into_iter();
        Ok(plan.grads.iter().map(|g| g.as_ref().and_then(|_| values.next())).collect())
    }
}

// ---- array helpers ------------------------------------------------------------------------------

fn zeros(shape: &Shape, dtype: DType, ctx: Context) -> Result<NDArray> {
    let attrs: Attrs = [("shape".to_string(), shape_attr(shape)), ("dtype".to_string(), dtype.name().to_string())].into_iter().collect();
    Ok(imperative::invoke("_zeros", &[], &attrs, None, ctx, None)?.swap_remove(0))
}

fn shape_attr(shape: &Shape) -> String {
    crate::op::grad::tuple_attr(&shape.dims().iter().map(|&d| d as i64).collect::<Vec<_>>())
}

fn zeros_like(a: &NDArray) -> Result<NDArray> {
    zeros(a.shape(), a.dtype(), a.context())
}

fn copy_of(a: &NDArray) -> Result<NDArray> {
    let out = NDArray::empty(a.shape().clone(), a.dtype(), a.context())?;
    imperative::copy(a, &out, None)?;
    Ok(out)
}

fn add(a: &NDArray, b: &NDArray) -> Result<NDArray> {
    Ok(imperative::invoke("elemwise_add", &[a.clone(), b.clone()], &Attrs::new(), None, a.context(), None)?.swap_remove(0))
}

/// `sum` plus `term`, where a missing sum is zero.
fn accumulate(sum: &mut Option<NDArray>, term: NDArray) -> Result<()> {
    *sum = Some(match sum.take() {
        Some(s) => add(&s, &term)?,
        None => term,
    });
    Ok(())
}

/// Write `value` into row `row` of `stack`.
fn put_row(stack: &NDArray, row: usize, value: &NDArray) -> Result<()> {
    put(&stack.at_view(row)?, value)
}

/// Write `value` into `dest` (a view of a loop's output).
fn put(dest: &NDArray, value: &NDArray) -> Result<()> {
    if dest.shape() != value.shape() || dest.dtype() != value.dtype() {
        crate::bail!(
            Shape,
            "an iteration produced a {} {} value where {} {} was inferred (every iteration must give the same shapes and dtypes)",
            value.shape(),
            value.dtype(),
            dest.shape(),
            dest.dtype()
        );
    }
    imperative::copy(value, dest, None)
}

/// Whether a one-element array is non-zero (a loop condition or branch predicate).
fn truth(op: &str, a: &NDArray) -> Result<bool> {
    if a.size() != 1 {
        crate::bail!(Value, "{op}: the condition must be a scalar (one element), got shape {}", a.shape());
    }
    let attrs: Attrs = [("dtype".to_string(), "float64".to_string())].into_iter().collect();
    let as_f64 = imperative::invoke("Cast", std::slice::from_ref(a), &attrs, None, a.context(), None)?.swap_remove(0);
    Ok(as_f64.to_vec::<f64>()?[0] != 0.0)
}

fn context_of(inputs: &[NDArray]) -> Context {
    inputs.first().map_or(Context::cpu(0), NDArray::context)
}

/// `shape` with `len` prepended (a stack of per-iteration values).
fn stacked(len: Option<usize>, shape: &Option<PartialShape>) -> Option<PartialShape> {
    let shape = shape.as_ref()?;
    Some(PartialShape(std::iter::once(len).chain(shape.dims().iter().copied()).collect()))
}

/// The shape of one iteration's slice of data of shape `shape`, and the number of slices. As
/// MXNet's `NDArray::At`, a slice of 1-d data keeps one axis: shape (1,).
fn unstacked(shape: &Option<PartialShape>) -> (Option<PartialShape>, Option<usize>) {
    match shape {
        Some(s) if s.ndim() == 1 => (Some(PartialShape(vec![Some(1)])), s.dims()[0]),
        Some(s) if s.ndim() > 1 => (Some(PartialShape(s.dims()[1..].to_vec())), s.dims()[0]),
        _ => (None, None),
    }
}

/// Slice `t` of loop data along its first axis (see [`unstacked`]), as a view.
fn data_slice(data: &NDArray, t: usize) -> Result<NDArray> {
    if data.shape().ndim() == 1 {
        data.slice_view(t, t + 1)
    } else {
        data.at_view(t)
    }
}

fn merge_into(slot: &mut Option<PartialShape>, value: &Option<PartialShape>) -> Result<()> {
    if let Some(v) = value {
        merge_partial(slot, v)?;
    }
    Ok(())
}

fn full_shapes(op: &str, shapes: Vec<Option<PartialShape>>) -> Result<Vec<Shape>> {
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_ref().and_then(PartialShape::full).ok_or_else(|| crate::err!(Shape, "{op}: cannot infer the shape of output {i} from its inputs"))
        })
        .collect()
}

fn full_types(op: &str, types: Vec<Option<DType>>) -> Result<Vec<DType>> {
    types
        .into_iter()
        .enumerate()
        .map(|(i, d)| d.ok_or_else(|| crate::err!(Type, "{op}: cannot infer the dtype of output {i} from its inputs")))
        .collect()
}

fn partial_inputs(inputs: &[Shape]) -> Vec<Option<PartialShape>> {
    inputs.iter().map(|s| Some(PartialShape::from(s))).collect()
}

/// The gradient node of a control flow operator: it reads the node's inputs, the gradients of its
/// visible outputs and its hidden outputs, and gives the gradients of the node's inputs.
fn gradient_node(g: &mut Grad, name: &str, visible: usize, backward: Arc<dyn Operator>) -> InputGrads {
    let mut inputs: Vec<Entry> = (0..g.num_inputs()).map(|i| g.input(i)).collect();
    inputs.extend(g.out_grads()[..visible].iter().cloned());
    inputs.extend((visible..g.num_outputs()).map(|i| g.output(i)));
    let grads = g.instance_outputs(name, backward, &inputs);
    grads.into_iter().enumerate().map(|(i, e)| g.input_needed(i).then_some(e)).collect()
}

// ---- _foreach -----------------------------------------------------------------------------------

/// `_foreach`: the body once per slice of the data along its first axis, states carried over.
///
/// Outputs: each per-iteration output stacked, then the final states; hidden after them, the
/// states each iteration started from and the body's saved values, stacked per iteration.
#[derive(Clone)]
struct Foreach {
    body: Arc<Subgraph>,
    num_out_data: usize,
    num_states: usize,
    /// Body input position of each node input (data, states, then the remaining inputs).
    body_locs: Vec<usize>,
    num_data: usize,
}

impl Foreach {
    const NAME: &'static str = "_foreach";

    fn new(attrs: &Attrs, subgraphs: Vec<Symbol>) -> Result<Foreach> {
        let op = Self::NAME;
        check_known(op, attrs, &["num_args", "num_outputs", "num_out_data", "in_state_locs", "in_data_locs", "remain_locs"])?;
        let [body] = take_subgraphs::<1>(op, subgraphs)?;
        let num_inputs = num_node_inputs(op, attrs, 1)?;
        let num_outputs = count(op, attrs, "num_outputs")?;
        let num_out_data = count(op, attrs, "num_out_data")?;
        let data_locs = locations(op, attrs, "in_data_locs")?;
        let state_locs = locations(op, attrs, "in_state_locs")?;
        let remain_locs = if attrs.contains_key("remain_locs") { locations(op, attrs, "remain_locs")? } else { Vec::new() };
        if num_out_data > num_outputs {
            crate::bail!(Param, "operator {op}: num_out_data ({num_out_data}) exceeds num_outputs ({num_outputs})");
        }
        if data_locs.is_empty() {
            crate::bail!(Param, "operator {op}: at least one data array is needed (in_data_locs is empty)");
        }
        let num_states = num_outputs - num_out_data;
        if state_locs.len() != num_states {
            crate::bail!(Param, "operator {op}: {} state location(s) for {num_states} state output(s)", state_locs.len());
        }
        let body = Subgraph::new(body, true);
        if body.num_outputs() != num_outputs {
            crate::bail!(Param, "operator {op}: num_outputs is {num_outputs}, the body has {} output(s)", body.num_outputs());
        }
        let num_data = data_locs.len();
        let body_locs: Vec<usize> = data_locs.into_iter().chain(state_locs).chain(remain_locs).collect();
        if body_locs.len() != num_inputs || body.inputs.len() != num_inputs {
            crate::bail!(
                Param,
                "operator {op}: {num_inputs} input(s), {} location(s) and {} body input(s) must agree",
                body_locs.len(),
                body.inputs.len()
            );
        }
        check_locations(op, "the locations", &body_locs, num_inputs)?;
        if body_locs.iter().collect::<AddressSet<_>>().len() != num_inputs {
            crate::bail!(Param, "operator {op}: two inputs share one body location");
        }
        Ok(Foreach { body: Arc::new(body), num_out_data, num_states, body_locs, num_data })
    }

    fn num_visible(&self) -> usize {
        self.num_out_data + self.num_states
    }

    fn state_locs(&self) -> &[usize] {
        &self.body_locs[self.num_data..self.num_data + self.num_states]
    }

    /// Node input shapes refined and every output's shape, from partly known input shapes.
    fn shapes(&self, inputs: &mut [Option<PartialShape>]) -> Result<Vec<Option<PartialShape>>> {
        let mut len = None;
        let mut body_in = vec![None; self.body_locs.len()];
        // 1-d data stays 1-d: its (1,) slices stack back to (len,), not (len, 1).
        let one_dimensional: Vec<bool> = inputs[..self.num_data].iter().map(|s| s.as_ref().is_some_and(|s| s.ndim() == 1)).collect();
        for (i, &loc) in self.body_locs.iter().enumerate() {
            if i < self.num_data {
                let (slice, rows) = unstacked(&inputs[i]);
                body_in[loc] = slice;
                len = len.or(rows);
            } else {
                body_in[loc] = inputs[i].clone();
            }
        }
        let (refined, mut targets) = self.body.partial_shapes(&body_in)?;
        // A state keeps its shape from one iteration to the next.
        for (s, &loc) in self.state_locs().iter().enumerate() {
            let (input_side, output_side) = (refined[loc].clone(), targets[self.num_out_data + s].clone());
            merge_into(&mut targets[self.num_out_data + s], &input_side)?;
            merge_into(&mut inputs[self.num_data + s], &output_side)?;
        }
        for (i, &loc) in self.body_locs.iter().enumerate() {
            let value = match i {
                i if i < self.num_data && one_dimensional[i] => Some(PartialShape(vec![len])),
                i if i < self.num_data => stacked(len, &refined[loc]),
                _ => refined[loc].clone(),
            };
            merge_into(&mut inputs[i], &value)?;
        }
        let visible = self.num_visible();
        let mut outputs: Vec<Option<PartialShape>> = targets[..self.num_out_data].iter().map(|s| stacked(len, s)).collect();
        outputs.extend(targets[self.num_out_data..visible].iter().cloned());
        outputs.extend((0..self.num_states).map(|s| stacked(len, &inputs[self.num_data + s])));
        outputs.extend(targets[visible..].iter().map(|s| stacked(len, s)));
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let mut body_in = vec![None; self.body_locs.len()];
        for (i, &loc) in self.body_locs.iter().enumerate() {
            body_in[loc] = inputs[i];
        }
        let (refined, targets) = self.body.types(&body_in)?;
        for (i, &loc) in self.body_locs.iter().enumerate() {
            inputs[i] = inputs[i].or(refined[loc]);
        }
        let visible = self.num_visible();
        let mut outputs = targets[..visible].to_vec();
        outputs.extend((0..self.num_states).map(|s| inputs[self.num_data + s]));
        outputs.extend(targets[visible..].iter().copied());
        Ok(outputs)
    }

    /// The body's inputs for iteration `t`.
    fn body_inputs(&self, inputs: &[NDArray], states: &[NDArray], t: usize) -> Result<Vec<NDArray>> {
        let mut body_in: Vec<Option<NDArray>> = vec![None; self.body_locs.len()];
        for (i, &loc) in self.body_locs.iter().enumerate() {
            body_in[loc] = Some(if i < self.num_data {
                data_slice(&inputs[i], t)?
            } else if i < self.num_data + self.num_states {
                states[i - self.num_data].clone()
            } else {
                inputs[i].clone()
            });
        }
        Ok(body_in.into_iter().map(|a| a.expect("the locations are a permutation")).collect())
    }

    fn iterations(&self, inputs: &[NDArray]) -> Result<usize> {
        let len = inputs[0].shape().dims().first().copied().ok_or_else(|| crate::err!(Shape, "{}: data must have at least one axis", Self::NAME))?;
        for (i, data) in inputs[..self.num_data].iter().enumerate() {
            if data.shape().dims().first() != Some(&len) {
                crate::bail!(Shape, "{}: data {i} has shape {}, but every data array must have {len} rows (the first's)", Self::NAME, data.shape());
            }
        }
        Ok(len)
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        if inputs.len() != self.body_locs.len() {
            crate::bail!(Value, "{}: {} input(s) given, expected {}", Self::NAME, inputs.len(), self.body_locs.len());
        }
        let ctx = context_of(inputs);
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        let outputs = shapes.iter().zip(&types).map(|(s, &d)| NDArray::empty(s.clone(), d, ctx)).collect::<Result<Vec<_>>>()?;
        let len = self.iterations(inputs)?;
        let visible = self.num_visible();
        let mut states: Vec<NDArray> = inputs[self.num_data..self.num_data + self.num_states].to_vec();
        for t in 0..len {
            let values = self.body.forward(&self.body_inputs(inputs, &states, t)?, ctx)?;
            for k in 0..self.num_out_data {
                put_row(&outputs[k], t, &values[k])?;
            }
            for (s, state) in states.iter().enumerate() {
                put_row(&outputs[visible + s], t, state)?;
            }
            for (i, saved) in values[visible..].iter().enumerate() {
                put_row(&outputs[visible + self.num_states + i], t, saved)?;
            }
            states = values[self.num_out_data..visible].to_vec();
        }
        for (s, state) in states.iter().enumerate() {
            imperative::copy(state, &outputs[self.num_out_data + s], None)?;
        }
        Ok(outputs)
    }
}

impl Operator for Foreach {
    fn input_names(&self) -> Vec<String> {
        (0..self.body_locs.len()).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_visible() + self.num_states + self.body.saved().len()
    }
    fn num_visible_outputs(&self) -> usize {
        self.num_visible()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        full_shapes(Self::NAME, self.shapes(&mut partial_inputs(inputs))?)
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        for (slot, value) in outputs.iter_mut().zip(self.shapes(inputs)?) {
            merge_into(slot, &value)?;
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        full_types(Self::NAME, self.types(&mut inputs.iter().copied().map(Some).collect::<Vec<_>>())?)
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        if self.types(inputs).is_err() {
            let fill = inputs.iter().flatten().next().copied().unwrap_or(DType::F32);
            inputs.iter_mut().filter(|d| d.is_none()).for_each(|d| *d = Some(fill));
        }
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
    /// The gradient runs the subgraphs this instance holds.
    fn gradient_identity(&self) -> GradientIdentity {
        GradientIdentity::Unique
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        self.body.gradient(Self::NAME)?;
        let backward = ForeachBackward { forward: self.clone() };
        Ok(gradient_node(g, "_backward_foreach", self.num_visible(), Arc::new(backward)))
    }
    fn subgraphs(&self) -> Vec<Symbol> {
        vec![self.body.symbol.clone()]
    }
}

/// The gradient of `_foreach`: inputs are the forward node's inputs, its visible outputs'
/// gradients and its hidden outputs; outputs the gradients of the forward inputs.
struct ForeachBackward {
    forward: Foreach,
}

impl ForeachBackward {
    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let f = &self.forward;
        let num_in = f.body_locs.len();
        let visible = f.num_visible();
        let expected = num_in + visible + f.num_states + f.body.saved().len();
        if inputs.len() != expected {
            crate::bail!(Value, "_backward_foreach: {} input(s) given, expected {expected}", inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = inputs.split_at(num_in);
        let (out_grads, hidden) = rest.split_at(visible);
        let (state_stacks, saved_stacks) = hidden.split_at(f.num_states);
        let len = f.iterations(node_inputs)?;
        let data_grads = node_inputs[..f.num_data].iter().map(zeros_like).collect::<Result<Vec<_>>>()?;
        let mut remain_grads: Vec<Option<NDArray>> = vec![None; num_in - f.num_data - f.num_states];
        let mut carried: Vec<NDArray> = out_grads[f.num_out_data..].to_vec();
        for t in (0..len).rev() {
            let states = state_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let body_in = f.body_inputs(node_inputs, &states, t)?;
            let saved = saved_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let mut heads = out_grads[..f.num_out_data].iter().map(|g| g.at_view(t)).collect::<Result<Vec<_>>>()?;
            heads.extend(carried.iter().cloned());
            let grads = f.body.backward("_backward_foreach", &body_in, &saved, &heads, ctx)?;
            for (i, &loc) in f.body_locs.iter().enumerate() {
                let Some(grad) = &grads[loc] else { continue };
                if i < f.num_data {
                    put(&data_slice(&data_grads[i], t)?, grad)?;
                } else if i >= f.num_data + f.num_states {
                    accumulate(&mut remain_grads[i - f.num_data - f.num_states], grad.clone())?;
                }
            }
            carried =
                f.state_locs().iter().zip(&states).map(|(&loc, s)| grads[loc].clone().map_or_else(|| zeros_like(s), Ok)).collect::<Result<_>>()?;
        }
        let mut result = data_grads;
        result.extend(carried.iter().map(copy_of).collect::<Result<Vec<_>>>()?);
        for (grad, input) in remain_grads.into_iter().zip(&node_inputs[f.num_data + f.num_states..]) {
            result.push(grad.map_or_else(|| zeros_like(input), Ok)?);
        }
        Ok(result)
    }
}

/// The shapes and dtypes of a gradient node's outputs: those of the forward node's inputs, which
/// come first among its inputs.
fn forward_input_attrs<T: Clone>(op: &str, inputs: &[T], num: usize) -> Result<Vec<T>> {
    inputs.get(..num).map(<[T]>::to_vec).ok_or_else(|| crate::err!(Value, "{op}: {} input(s) given, expected at least {num}", inputs.len()))
}

impl Operator for ForeachBackward {
    fn input_names(&self) -> Vec<String> {
        (0..self.forward.body_locs.len() + self.forward.num_outputs()).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.forward.body_locs.len()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        forward_input_attrs("_backward_foreach", inputs, self.num_outputs())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        forward_input_attrs("_backward_foreach", inputs, self.num_outputs())
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
}

// ---- _while_loop --------------------------------------------------------------------------------

/// `_while_loop`: the body while the condition holds, at most `max_iterations` times.
///
/// Outputs: each per-iteration output stacked and padded with zeros to `max_iterations` rows,
/// then the loop variables' final values; hidden after them, the loop variables each iteration
/// started from and the body's saved values (stacked, `max_iterations` rows), and the number of
/// iterations run.
#[derive(Clone)]
struct WhileLoop {
    cond: Arc<Subgraph>,
    func: Arc<Subgraph>,
    max_iterations: usize,
    num_inputs: usize,
    num_out_data: usize,
    /// Node input read by each input of the condition and of the body.
    cond_locs: Vec<usize>,
    func_locs: Vec<usize>,
    /// Per loop variable: the body input it is, and the node input holding its value.
    var_func_pos: Vec<usize>,
    var_slots: Vec<usize>,
}

impl WhileLoop {
    const NAME: &'static str = "_while_loop";

    fn new(attrs: &Attrs, subgraphs: Vec<Symbol>) -> Result<WhileLoop> {
        let op = Self::NAME;
        check_known(
            op,
            attrs,
            &["num_args", "num_outputs", "num_out_data", "max_iterations", "cond_input_locs", "func_input_locs", "func_var_locs"],
        )?;
        let [cond, func] = take_subgraphs::<2>(op, subgraphs)?;
        let num_inputs = num_node_inputs(op, attrs, 2)?;
        let num_outputs = count(op, attrs, "num_outputs")?;
        let num_out_data = count(op, attrs, "num_out_data")?;
        let max_iterations = count(op, attrs, "max_iterations")?;
        let cond_locs = locations(op, attrs, "cond_input_locs")?;
        let func_locs = locations(op, attrs, "func_input_locs")?;
        let var_func_pos = locations(op, attrs, "func_var_locs")?;
        check_locations(op, "cond_input_locs", &cond_locs, num_inputs)?;
        check_locations(op, "func_input_locs", &func_locs, num_inputs)?;
        check_locations(op, "func_var_locs", &var_func_pos, func_locs.len())?;
        if num_out_data > num_outputs || num_outputs - num_out_data != var_func_pos.len() {
            crate::bail!(
                Param,
                "operator {op}: num_outputs ({num_outputs}) must be num_out_data ({num_out_data}) plus one per loop variable ({})",
                var_func_pos.len()
            );
        }
        let cond = Subgraph::new(cond, false);
        let func = Subgraph::new(func, true);
        if cond.num_outputs() != 1 || cond.inputs.len() != cond_locs.len() {
            crate::bail!(Param, "operator {op}: the condition must have one output and {} input(s)", cond_locs.len());
        }
        if func.num_outputs() != num_outputs || func.inputs.len() != func_locs.len() {
            crate::bail!(Param, "operator {op}: the body must have {num_outputs} output(s) and {} input(s)", func_locs.len());
        }
        let var_slots: Vec<usize> = var_func_pos.iter().map(|&j| func_locs[j]).collect();
        for (j, p) in func_locs.iter().enumerate() {
            if let Some(k) = var_slots.iter().position(|s| s == p) {
                if var_func_pos[k] != j {
                    crate::bail!(Param, "operator {op}: node input {p} is both loop variable {k} and another body input");
                }
            }
        }
        Ok(WhileLoop {
            cond: Arc::new(cond),
            func: Arc::new(func),
            max_iterations,
            num_inputs,
            num_out_data,
            cond_locs,
            func_locs,
            var_func_pos,
            var_slots,
        })
    }

    fn num_vars(&self) -> usize {
        self.var_slots.len()
    }

    fn num_visible(&self) -> usize {
        self.num_out_data + self.num_vars()
    }

    fn shapes(&self, inputs: &mut [Option<PartialShape>]) -> Result<Vec<Option<PartialShape>>> {
        let cond_in: Vec<_> = self.cond_locs.iter().map(|&p| inputs[p].clone()).collect();
        let (cond_refined, _) = self.cond.partial_shapes(&cond_in)?;
        for (&p, shape) in self.cond_locs.iter().zip(&cond_refined) {
            merge_into(&mut inputs[p], shape)?;
        }
        let func_in: Vec<_> = self.func_locs.iter().map(|&p| inputs[p].clone()).collect();
        let (refined, mut targets) = self.func.partial_shapes(&func_in)?;
        for (&p, shape) in self.func_locs.iter().zip(&refined) {
            merge_into(&mut inputs[p], shape)?;
        }
        // A loop variable keeps its shape from one iteration to the next.
        for (k, &slot) in self.var_slots.iter().enumerate() {
            let (input_side, output_side) = (inputs[slot].clone(), targets[self.num_out_data + k].clone());
            merge_into(&mut targets[self.num_out_data + k], &input_side)?;
            merge_into(&mut inputs[slot], &output_side)?;
        }
        let rows = Some(self.max_iterations);
        let visible = self.num_visible();
        let mut outputs: Vec<Option<PartialShape>> = targets[..self.num_out_data].iter().map(|s| stacked(rows, s)).collect();
        outputs.extend(targets[self.num_out_data..visible].iter().cloned());
        outputs.extend(self.var_slots.iter().map(|&slot| stacked(rows, &inputs[slot])));
        outputs.extend(targets[visible..].iter().map(|s| stacked(rows, s)));
        outputs.push(Some(PartialShape(vec![Some(1)])));
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let func_in: Vec<_> = self.func_locs.iter().map(|&p| inputs[p]).collect();
        let (refined, targets) = self.func.types(&func_in)?;
        for (&p, dtype) in self.func_locs.iter().zip(refined) {
            inputs[p] = inputs[p].or(dtype);
        }
        let cond_in: Vec<_> = self.cond_locs.iter().map(|&p| inputs[p]).collect();
        let (cond_refined, _) = self.cond.types(&cond_in)?;
        for (&p, dtype) in self.cond_locs.iter().zip(cond_refined) {
            inputs[p] = inputs[p].or(dtype);
        }
        let visible = self.num_visible();
        let mut outputs = targets[..visible].to_vec();
        outputs.extend(self.var_slots.iter().map(|&slot| inputs[slot]));
        outputs.extend(targets[visible..].iter().copied());
        outputs.push(Some(DType::I64));
        Ok(outputs)
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        if inputs.len() != self.num_inputs {
            crate::bail!(Value, "{}: {} input(s) given, expected {}", Self::NAME, inputs.len(), self.num_inputs);
        }
        let ctx = context_of(inputs);
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        let visible = self.num_visible();
        let final_vars = self.num_out_data..visible;
        // Stacked outputs start as zeros: the rows of iterations that do not run stay zero.
        let mut outputs = shapes
            .iter()
            .zip(&types)
            .enumerate()
            .map(|(i, (s, &d))| if final_vars.contains(&i) { NDArray::empty(s.clone(), d, ctx) } else { zeros(s, d, ctx) })
            .collect::<Result<Vec<_>>>()?;
        let mut current = inputs.to_vec();
        let mut steps = 0;
        while steps < self.max_iterations {
            let cond_in: Vec<NDArray> = self.cond_locs.iter().map(|&p| current[p].clone()).collect();
            if !truth(Self::NAME, &self.cond.forward(&cond_in, ctx)?[0])? {
                break;
            }
            let func_in: Vec<NDArray> = self.func_locs.iter().map(|&p| current[p].clone()).collect();
            let values = self.func.forward(&func_in, ctx)?;
            for k in 0..self.num_out_data {
                put_row(&outputs[k], steps, &values[k])?;
            }
            for (k, &slot) in self.var_slots.iter().enumerate() {
                put_row(&outputs[visible + k], steps, &current[slot])?;
            }
            for (i, saved) in values[visible..].iter().enumerate() {
                put_row(&outputs[visible + self.num_vars() + i], steps, saved)?;
            }
            for (k, &slot) in self.var_slots.iter().enumerate() {
                current[slot] = values[self.num_out_data + k].clone();
            }
            steps += 1;
        }
        for (k, &slot) in self.var_slots.iter().enumerate() {
            imperative::copy(&current[slot], &outputs[self.num_out_data + k], None)?;
        }
        let last = outputs.len() - 1;
        outputs[last] = NDArray::from_vec::<i64>(Shape::new(vec![1]), &[steps as i64], ctx)?;
        Ok(outputs)
    }
}

impl Operator for WhileLoop {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_inputs).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_visible() + self.num_vars() + self.func.saved().len() + 1
    }
    fn num_visible_outputs(&self) -> usize {
        self.num_visible()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        full_shapes(Self::NAME, self.shapes(&mut partial_inputs(inputs))?)
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        for (slot, value) in outputs.iter_mut().zip(self.shapes(inputs)?) {
            merge_into(slot, &value)?;
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        full_types(Self::NAME, self.types(&mut inputs.iter().copied().map(Some).collect::<Vec<_>>())?)
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        if self.types(inputs).is_err() {
            let fill = inputs.iter().flatten().next().copied().unwrap_or(DType::F32);
            inputs.iter_mut().filter(|d| d.is_none()).for_each(|d| *d = Some(fill));
        }
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
    /// The gradient runs the subgraphs this instance holds.
    fn gradient_identity(&self) -> GradientIdentity {
        GradientIdentity::Unique
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        self.func.gradient(Self::NAME)?;
        Ok(gradient_node(g, "_backward_while_loop", self.num_visible(), Arc::new(WhileLoopBackward { forward: self.clone() })))
    }
    fn subgraphs(&self) -> Vec<Symbol> {
        vec![self.cond.symbol.clone(), self.func.symbol.clone()]
    }
}

/// The gradient of `_while_loop` (inputs and outputs as for [`ForeachBackward`]).
struct WhileLoopBackward {
    forward: WhileLoop,
}

impl WhileLoopBackward {
    const NAME: &'static str = "_backward_while_loop";

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let f = &self.forward;
        let visible = f.num_visible();
        let expected = f.num_inputs + f.num_outputs();
        if inputs.len() != expected {
            crate::bail!(Value, "{}: {} input(s) given, expected {expected}", Self::NAME, inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = inputs.split_at(f.num_inputs);
        let (out_grads, hidden) = rest.split_at(visible);
        let (var_stacks, rest) = hidden.split_at(f.num_vars());
        let (saved_stacks, steps) = rest.split_at(rest.len() - 1);
        let steps = usize::try_from(steps[0].to_vec::<i64>()?[0]).map_err(|_| crate::err!(Value, "{}: negative iteration count", Self::NAME))?;
        let mut carried: Vec<NDArray> = out_grads[f.num_out_data..].to_vec();
        let mut free: Vec<Option<NDArray>> = vec![None; f.num_inputs];
        for t in (0..steps).rev() {
            let vars = var_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let func_in: Vec<NDArray> = f
                .func_locs
                .iter()
                .map(|p| match f.var_slots.iter().position(|s| s == p) {
                    Some(k) => vars[k].clone(),
                    None => node_inputs[*p].clone(),
                })
                .collect();
            let saved = saved_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let mut heads = out_grads[..f.num_out_data].iter().map(|g| g.at_view(t)).collect::<Result<Vec<_>>>()?;
            heads.extend(carried.iter().cloned());
            let grads = f.func.backward(Self::NAME, &func_in, &saved, &heads, ctx)?;
            for (j, &p) in f.func_locs.iter().enumerate() {
                if let (Some(grad), false) = (&grads[j], f.var_slots.contains(&p)) {
                    accumulate(&mut free[p], grad.clone())?;
                }
            }
            carried = f.var_func_pos.iter().zip(&vars).map(|(&j, v)| grads[j].clone().map_or_else(|| zeros_like(v), Ok)).collect::<Result<_>>()?;
        }
        (0..f.num_inputs)
            .map(|p| match f.var_slots.iter().position(|&s| s == p) {
                Some(k) => copy_of(&carried[k]),
                None => free[p].take().map_or_else(|| zeros_like(&node_inputs[p]), Ok),
            })
            .collect()
    }
}

impl Operator for WhileLoopBackward {
    fn input_names(&self) -> Vec<String> {
        (0..self.forward.num_inputs + self.forward.num_outputs()).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.forward.num_inputs
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        forward_input_attrs(Self::NAME, inputs, self.num_outputs())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        forward_input_attrs(Self::NAME, inputs, self.num_outputs())
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
}

// ---- _cond --------------------------------------------------------------------------------------

/// `_cond`: the `then` or the `else` subgraph, as the predicate subgraph says.
///
/// Outputs: the branch's outputs; hidden after them, which branch ran (1 for `then`) and each
/// branch's saved values (zeros for the branch that did not run).
#[derive(Clone)]
struct Cond {
    pred: Arc<Subgraph>,
    branches: [Arc<Subgraph>; 2],
    pred_locs: Vec<usize>,
    /// Node input read by each input of the `then` and `else` subgraphs.
    branch_locs: [Vec<usize>; 2],
    num_inputs: usize,
    num_outputs: usize,
}

impl Cond {
    const NAME: &'static str = "_cond";

    fn new(attrs: &Attrs, subgraphs: Vec<Symbol>) -> Result<Cond> {
        let op = Self::NAME;
        check_known(op, attrs, &["num_args", "num_outputs", "cond_input_locs", "then_input_locs", "else_input_locs"])?;
        let [pred, then_graph, else_graph] = take_subgraphs::<3>(op, subgraphs)?;
        let num_inputs = num_node_inputs(op, attrs, 3)?;
        let num_outputs = count(op, attrs, "num_outputs")?;
        let pred_locs = locations(op, attrs, "cond_input_locs")?;
        let branch_locs = [locations(op, attrs, "then_input_locs")?, locations(op, attrs, "else_input_locs")?];
        for (what, locs) in [("cond_input_locs", &pred_locs), ("then_input_locs", &branch_locs[0]), ("else_input_locs", &branch_locs[1])] {
            check_locations(op, what, locs, num_inputs)?;
        }
        let pred = Subgraph::new(pred, false);
        let branches = [Subgraph::new(then_graph, true), Subgraph::new(else_graph, true)];
        if pred.num_outputs() != 1 || pred.inputs.len() != pred_locs.len() {
            crate::bail!(Param, "operator {op}: the predicate must have one output and {} input(s)", pred_locs.len());
        }
        for ((branch, locs), which) in branches.iter().zip(&branch_locs).zip(["then", "else"]) {
            if branch.num_outputs() != num_outputs || branch.inputs.len() != locs.len() {
                crate::bail!(Param, "operator {op}: the {which} branch must have {num_outputs} output(s) and {} input(s)", locs.len());
            }
        }
        let [then_graph, else_graph] = branches;
        Ok(Cond { pred: Arc::new(pred), branches: [Arc::new(then_graph), Arc::new(else_graph)], pred_locs, branch_locs, num_inputs, num_outputs })
    }

    fn shapes(&self, inputs: &mut [Option<PartialShape>]) -> Result<Vec<Option<PartialShape>>> {
        let pred_in: Vec<_> = self.pred_locs.iter().map(|&p| inputs[p].clone()).collect();
        let (pred_refined, _) = self.pred.partial_shapes(&pred_in)?;
        for (&p, shape) in self.pred_locs.iter().zip(&pred_refined) {
            merge_into(&mut inputs[p], shape)?;
        }
        let mut outputs: Vec<Option<PartialShape>> = vec![None; self.num_outputs];
        let mut saved = Vec::new();
        for (branch, locs) in self.branches.iter().zip(&self.branch_locs) {
            let branch_in: Vec<_> = locs.iter().map(|&p| inputs[p].clone()).collect();
            let (refined, targets) = branch.partial_shapes(&branch_in)?;
            for (&p, shape) in locs.iter().zip(&refined) {
                merge_into(&mut inputs[p], shape)?;
            }
            for (slot, shape) in outputs.iter_mut().zip(&targets[..self.num_outputs]) {
                merge_into(slot, shape).map_err(|e| e.context(format!("{}: the two branches' outputs must have the same shapes", Self::NAME)))?;
            }
            saved.extend(targets[self.num_outputs..].iter().cloned());
        }
        outputs.push(Some(PartialShape(vec![Some(1)])));
        outputs.extend(saved);
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let mut outputs: Vec<Option<DType>> = vec![None; self.num_outputs];
        let mut saved = Vec::new();
        for (branch, locs) in self.branches.iter().zip(&self.branch_locs) {
            let branch_in: Vec<_> = locs.iter().map(|&p| inputs[p]).collect();
            let (refined, targets) = branch.types(&branch_in)?;
            for (&p, dtype) in locs.iter().zip(refined) {
                inputs[p] = inputs[p].or(dtype);
            }
            for (slot, dtype) in outputs.iter_mut().zip(&targets[..self.num_outputs]) {
                *slot = slot.or(*dtype);
            }
            saved.extend(targets[self.num_outputs..].iter().copied());
        }
        let pred_in: Vec<_> = self.pred_locs.iter().map(|&p| inputs[p]).collect();
        let (pred_refined, _) = self.pred.types(&pred_in)?;
        for (&p, dtype) in self.pred_locs.iter().zip(pred_refined) {
            inputs[p] = inputs[p].or(dtype);
        }
        outputs.push(Some(DType::I64));
        outputs.extend(saved);
        Ok(outputs)
    }

    /// Position among the outputs of the first saved value of branch `b` (0: then, 1: else).
    fn saved_offset(&self, b: usize) -> usize {
        self.num_outputs + 1 + if b == 0 { 0 } else { self.branches[0].saved().len() }
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        if inputs.len() != self.num_inputs {
            crate::bail!(Value, "{}: {} input(s) given, expected {}", Self::NAME, inputs.len(), self.num_inputs);
        }
        let ctx = context_of(inputs);
        let pred_in: Vec<NDArray> = self.pred_locs.iter().map(|&p| inputs[p].clone()).collect();
        let taken = if truth(Self::NAME, &self.pred.forward(&pred_in, ctx)?[0])? { 0 } else { 1 };
        let branch_in: Vec<NDArray> = self.branch_locs[taken].iter().map(|&p| inputs[p].clone()).collect();
        let values = self.branches[taken].forward(&branch_in, ctx)?;
        let mut outputs = values[..self.num_outputs].iter().map(copy_of).collect::<Result<Vec<_>>>()?;
        outputs.push(NDArray::from_vec::<i64>(Shape::new(vec![1]), &[(taken == 0) as i64], ctx)?);
        // The saved values of the branch not taken are never read; zeros keep the layout.
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        for b in 0..2 {
            for i in 0..self.branches[b].saved().len() {
                let at = self.saved_offset(b) + i;
                outputs.push(if b == taken { values[self.num_outputs + i].clone() } else { zeros(&shapes[at], types[at], ctx)? });
            }
        }
        Ok(outputs)
    }
}

impl Operator for Cond {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_inputs).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_outputs + 1 + self.branches.iter().map(|b| b.saved().len()).sum::<usize>()
    }
    fn num_visible_outputs(&self) -> usize {
        self.num_outputs
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        full_shapes(Self::NAME, self.shapes(&mut partial_inputs(inputs))?)
    }
    fn infer_partial_shapes(&self, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
        for (slot, value) in outputs.iter_mut().zip(self.shapes(inputs)?) {
            merge_into(slot, &value)?;
        }
        Ok(())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        full_types(Self::NAME, self.types(&mut inputs.iter().copied().map(Some).collect::<Vec<_>>())?)
    }
    fn complete_input_types(&self, inputs: &mut [Option<DType>]) {
        if self.types(inputs).is_err() {
            let fill = inputs.iter().flatten().next().copied().unwrap_or(DType::F32);
            inputs.iter_mut().filter(|d| d.is_none()).for_each(|d| *d = Some(fill));
        }
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
    /// The gradient runs the subgraphs this instance holds.
    fn gradient_identity(&self) -> GradientIdentity {
        GradientIdentity::Unique
    }
    fn gradient(&self, g: &mut Grad) -> Result<InputGrads> {
        for branch in &self.branches {
            branch.gradient(Self::NAME)?;
        }
        Ok(gradient_node(g, "_backward_cond", self.num_outputs, Arc::new(CondBackward { forward: self.clone() })))
    }
    fn subgraphs(&self) -> Vec<Symbol> {
        vec![self.pred.symbol.clone(), self.branches[0].symbol.clone(), self.branches[1].symbol.clone()]
    }
}

/// The gradient of `_cond` (inputs and outputs as for [`ForeachBackward`]).
struct CondBackward {
    forward: Cond,
}

impl CondBackward {
    const NAME: &'static str = "_backward_cond";

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let f = &self.forward;
        let expected = f.num_inputs + f.num_outputs();
        if inputs.len() != expected {
            crate::bail!(Value, "{}: {} input(s) given, expected {expected}", Self::NAME, inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = inputs.split_at(f.num_inputs);
        let (out_grads, hidden) = rest.split_at(f.num_outputs);
        let taken = if hidden[0].to_vec::<i64>()?[0] != 0 { 0 } else { 1 };
        let start = f.saved_offset(taken) - f.num_outputs;
        let saved = &hidden[start..start + f.branches[taken].saved().len()];
        let branch_in: Vec<NDArray> = f.branch_locs[taken].iter().map(|&p| node_inputs[p].clone()).collect();
        let grads = f.branches[taken].backward(Self::NAME, &branch_in, saved, out_grads, ctx)?;
        let mut result: Vec<Option<NDArray>> = vec![None; f.num_inputs];
        for (&p, grad) in f.branch_locs[taken].iter().zip(grads) {
            if let Some(grad) = grad {
                accumulate(&mut result[p], grad)?;
            }
        }
        result.into_iter().zip(node_inputs).map(|(g, input)| g.map_or_else(|| zeros_like(input), Ok)).collect()
    }
}

impl Operator for CondBackward {
    fn input_names(&self) -> Vec<String> {
        (0..self.forward.num_inputs + self.forward.num_outputs()).map(|i| format!("data{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.forward.num_inputs
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        forward_input_attrs(Self::NAME, inputs, self.num_outputs())
    }
    fn infer_type(&self, inputs: &[DType]) -> Result<Vec<DType>> {
        forward_input_attrs(Self::NAME, inputs, self.num_outputs())
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.run(inputs)
    }
}
