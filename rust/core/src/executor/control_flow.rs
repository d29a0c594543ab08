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

use std::fmt::Debug;
use std::slice::SliceIndex;
use std::sync::Arc;

use super::{run, Source};
use crate::autograd::{self, FlagsGuard};
use crate::base::{merge_partial, Context, DType, Elem, PartialShape, Shape};
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

// ---- positions ----------------------------------------------------------------------------------

// Subgraph input locations are checked when the operator is built, and every other position
// follows from the layout of its own inputs and outputs: these look-ups fail only for a graph that
// breaks that layout, which then gets an error naming the operator instead of a panic.

/// Item `i` of `items`; the error names the operator `op` and the kind of item, `what`.
fn at<'a, T>(items: &'a [T], i: usize, op: &str, what: &str) -> Result<&'a T> {
    items.get(i).ok_or_else(|| crate::err!(Value, "{op}: expected {what} {i}, but there are only {}", items.len()))
}

/// [`at`], mutable.
fn at_mut<'a, T>(items: &'a mut [T], i: usize, op: &str, what: &str) -> Result<&'a mut T> {
    let len = items.len();
    items.get_mut(i).ok_or_else(|| crate::err!(Value, "{op}: expected {what} {i}, but there are only {len}"))
}

/// Items `range` of `items`.
fn part<'a, T, R>(items: &'a [T], range: R, op: &str, what: &str) -> Result<&'a [T]>
where
    R: SliceIndex<[T], Output = [T]> + Clone + Debug,
{
    items.get(range.clone()).ok_or_else(|| crate::err!(Value, "{op}: expected {what} {range:?}, but there are only {}", items.len()))
}

/// `items` split after the first `mid`.
fn split<'a, T>(items: &'a [T], mid: usize, op: &str, what: &str) -> Result<(&'a [T], &'a [T])> {
    items.split_at_checked(mid).ok_or_else(|| crate::err!(Value, "{op}: expected at least {mid} {what}, but there are only {}", items.len()))
}

/// The items at `locs` (a subgraph's inputs, picked from the node's).
fn gather<T: Clone>(items: &[T], locs: &[usize], op: &str, what: &str) -> Result<Vec<T>> {
    locs.iter().map(|&i| at(items, i, op, what).cloned()).collect()
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
            *at_mut(slots, entry.index, op, "output of a saved node")? = Some(value.detached());
        }
        let targets: Vec<Entry> = plan.grads.iter().flatten().cloned().collect();
        let _flags = FlagsGuard::set(false, autograd::is_training());
        let mut values = run(&targets, &AddressMap::default(), ctx, |node| {
            if let Some(a) = known.get(&node_key(node)) {
                return Ok(Source::Known(vec![a.clone()]));
            }
            match saved_values.get(&node_key(node)) {
                Some(slots) => {
                    let unsaved = || crate::err!(Value, "{op}: an output of saved node '{}' was not saved", node.name);
                    slots.iter().map(|s| s.clone().ok_or_else(unsaved)).collect::<Result<_>>().map(Source::Known)
                }
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
    Ok(first_element::<f64>(op, &as_f64, "the condition")? != 0.0)
}

/// The first element of `a`, a one-element array (a condition, a flag or a count).
fn first_element<T: Elem>(op: &str, a: &NDArray, what: &str) -> Result<T> {
    a.to_vec::<T>()?.first().copied().ok_or_else(|| crate::err!(Value, "{op}: {what} has no element"))
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
    match shape.as_ref().and_then(|s| s.dims().split_first()) {
        Some((&rows, [])) => (Some(PartialShape(vec![Some(1)])), rows),
        Some((&rows, slice)) => (Some(PartialShape(slice.to_vec())), rows),
        None => (None, None),
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
fn gradient_node(g: &mut Grad, name: &str, visible: usize, backward: Arc<dyn Operator>) -> Result<InputGrads> {
    let mut inputs: Vec<Entry> = (0..g.num_inputs()).map(|i| g.input(i)).collect();
    inputs.extend_from_slice(part(g.out_grads(), ..visible, name, "output gradients")?);
    inputs.extend((visible..g.num_outputs()).map(|i| g.output(i)));
    let grads = g.instance_outputs(name, backward, &inputs);
    Ok(grads.into_iter().enumerate().map(|(i, e)| g.input_needed(i).then_some(e)).collect())
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

    /// Body input position of each state.
    fn state_locs(&self) -> impl Iterator<Item = &usize> {
        self.body_locs.iter().skip(self.num_data).take(self.num_states)
    }

    /// Node input positions of the initial states.
    fn state_inputs(&self) -> std::ops::Range<usize> {
        self.num_data..self.num_data + self.num_states
    }

    /// Node input shapes refined and every output's shape, from partly known input shapes.
    fn shapes(&self, inputs: &mut [Option<PartialShape>]) -> Result<Vec<Option<PartialShape>>> {
        let op = Self::NAME;
        let mut len = None;
        let mut body_in = vec![None; self.body_locs.len()];
        // 1-d data stays 1-d: its (1,) slices stack back to (len,), not (len, 1).
        let data = part(inputs, ..self.num_data, op, "data shapes")?;
        let one_dimensional: Vec<bool> = data.iter().map(|s| s.as_ref().is_some_and(|s| s.ndim() == 1)).collect();
        for (i, &loc) in self.body_locs.iter().enumerate() {
            let input = at(inputs, i, op, "input shape")?;
            let slot = at_mut(&mut body_in, loc, op, "body input")?;
            if i < self.num_data {
                let (slice, rows) = unstacked(input);
                *slot = slice;
                len = len.or(rows);
            } else {
                *slot = input.clone();
            }
        }
        let (refined, mut targets) = self.body.partial_shapes(&body_in)?;
        // A state keeps its shape from one iteration to the next.
        for (s, &loc) in self.state_locs().enumerate() {
            let input_side = at(&refined, loc, op, "body input")?.clone();
            let output = at_mut(&mut targets, self.num_out_data + s, op, "body output")?;
            let output_side = output.clone();
            merge_into(output, &input_side)?;
            merge_into(at_mut(inputs, self.num_data + s, op, "input shape")?, &output_side)?;
        }
        for (i, &loc) in self.body_locs.iter().enumerate() {
            let body_shape = at(&refined, loc, op, "body input")?;
            let value = if i >= self.num_data {
                body_shape.clone()
            } else if one_dimensional.get(i) == Some(&true) {
                Some(PartialShape(vec![len]))
            } else {
                stacked(len, body_shape)
            };
            merge_into(at_mut(inputs, i, op, "input shape")?, &value)?;
        }
        let (out_data, rest) = split(&targets, self.num_out_data, op, "body outputs")?;
        let (states, saved) = split(rest, self.num_states, op, "body outputs")?;
        let mut outputs: Vec<Option<PartialShape>> = out_data.iter().map(|s| stacked(len, s)).collect();
        outputs.extend_from_slice(states);
        outputs.extend(part(inputs, self.state_inputs(), op, "input shapes")?.iter().map(|s| stacked(len, s)));
        outputs.extend(saved.iter().map(|s| stacked(len, s)));
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let op = Self::NAME;
        let mut body_in = vec![None; self.body_locs.len()];
        for (i, &loc) in self.body_locs.iter().enumerate() {
            *at_mut(&mut body_in, loc, op, "body input")? = *at(inputs, i, op, "input dtype")?;
        }
        let (refined, targets) = self.body.types(&body_in)?;
        for (i, &loc) in self.body_locs.iter().enumerate() {
            let dtype = at_mut(inputs, i, op, "input dtype")?;
            *dtype = dtype.or(*at(&refined, loc, op, "body input")?);
        }
        let (visible, saved) = split(&targets, self.num_visible(), op, "body outputs")?;
        let mut outputs = visible.to_vec();
        outputs.extend_from_slice(part(inputs, self.state_inputs(), op, "input dtypes")?);
        outputs.extend_from_slice(saved);
        Ok(outputs)
    }

    /// The body's inputs for iteration `t`.
    fn body_inputs(&self, inputs: &[NDArray], states: &[NDArray], t: usize) -> Result<Vec<NDArray>> {
        let op = Self::NAME;
        let mut body_in: Vec<Option<NDArray>> = vec![None; self.body_locs.len()];
        for (i, &loc) in self.body_locs.iter().enumerate() {
            let value = if i < self.num_data {
                data_slice(at(inputs, i, op, "input")?, t)?
            } else if i < self.num_data + self.num_states {
                at(states, i - self.num_data, op, "state")?.clone()
            } else {
                at(inputs, i, op, "input")?.clone()
            };
            *at_mut(&mut body_in, loc, op, "body input")? = Some(value);
        }
        // The locations are a permutation (checked when the operator is built): each is bound.
        body_in.into_iter().enumerate().map(|(loc, a)| a.ok_or_else(|| crate::err!(Value, "{op}: no input is bound to body input {loc}"))).collect()
    }

    fn iterations(&self, inputs: &[NDArray]) -> Result<usize> {
        let op = Self::NAME;
        let data = part(inputs, ..self.num_data, op, "inputs")?;
        let first = at(data, 0, op, "data array")?;
        let len = first.shape().dims().first().copied().ok_or_else(|| crate::err!(Shape, "{op}: data must have at least one axis"))?;
        for (i, data) in data.iter().enumerate() {
            if data.shape().dims().first() != Some(&len) {
                crate::bail!(Shape, "{op}: data {i} has shape {}, but every data array must have {len} rows (the first's)", data.shape());
            }
        }
        Ok(len)
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let op = Self::NAME;
        if inputs.len() != self.body_locs.len() {
            crate::bail!(Value, "{op}: {} input(s) given, expected {}", inputs.len(), self.body_locs.len());
        }
        let ctx = context_of(inputs);
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        let outputs = shapes.iter().zip(&types).map(|(s, &d)| NDArray::empty(s.clone(), d, ctx)).collect::<Result<Vec<_>>>()?;
        let (out_stacks, rest) = split(&outputs, self.num_out_data, op, "outputs")?;
        let (final_states, rest) = split(rest, self.num_states, op, "outputs")?;
        let (state_stacks, saved_stacks) = split(rest, self.num_states, op, "outputs")?;
        let len = self.iterations(inputs)?;
        let mut states: Vec<NDArray> = part(inputs, self.state_inputs(), op, "inputs")?.to_vec();
        for t in 0..len {
            let values = self.body.forward(&self.body_inputs(inputs, &states, t)?, ctx)?;
            let (out_values, rest) = split(&values, self.num_out_data, op, "body outputs")?;
            let (new_states, saved) = split(rest, self.num_states, op, "body outputs")?;
            for (stack, value) in out_stacks.iter().zip(out_values) {
                put_row(stack, t, value)?;
            }
            for (stack, state) in state_stacks.iter().zip(&states) {
                put_row(stack, t, state)?;
            }
            for (stack, value) in saved_stacks.iter().zip(saved) {
                put_row(stack, t, value)?;
            }
            states = new_states.to_vec();
        }
        for (dest, state) in final_states.iter().zip(&states) {
            imperative::copy(state, dest, None)?;
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
        gradient_node(g, ForeachBackward::NAME, self.num_visible(), Arc::new(backward))
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
    const NAME: &'static str = "_backward_foreach";

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let op = Self::NAME;
        let f = &self.forward;
        let num_in = f.body_locs.len();
        let visible = f.num_visible();
        let expected = num_in + visible + f.num_states + f.body.saved().len();
        if inputs.len() != expected {
            crate::bail!(Value, "{op}: {} input(s) given, expected {expected}", inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = split(inputs, num_in, op, "inputs")?;
        let (out_grads, hidden) = split(rest, visible, op, "inputs")?;
        let (state_stacks, saved_stacks) = split(hidden, f.num_states, op, "inputs")?;
        let (data_out_grads, state_out_grads) = split(out_grads, f.num_out_data, op, "output gradients")?;
        let (data, rest) = split(node_inputs, f.num_data, op, "inputs")?;
        let (_, remain) = split(rest, f.num_states, op, "inputs")?;
        let len = f.iterations(node_inputs)?;
        let data_grads = data.iter().map(zeros_like).collect::<Result<Vec<_>>>()?;
        let mut remain_grads: Vec<Option<NDArray>> = vec![None; remain.len()];
        let mut carried: Vec<NDArray> = state_out_grads.to_vec();
        for t in (0..len).rev() {
            let states = state_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let body_in = f.body_inputs(node_inputs, &states, t)?;
            let saved = saved_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let mut heads = data_out_grads.iter().map(|g| g.at_view(t)).collect::<Result<Vec<_>>>()?;
            heads.extend(carried.iter().cloned());
            let grads = f.body.backward(op, &body_in, &saved, &heads, ctx)?;
            for (i, &loc) in f.body_locs.iter().enumerate() {
                let Some(grad) = at(&grads, loc, op, "body input gradient")? else { continue };
                if i < f.num_data {
                    put(&data_slice(at(&data_grads, i, op, "data gradient")?, t)?, grad)?;
                } else if i >= f.num_data + f.num_states {
                    accumulate(at_mut(&mut remain_grads, i - f.num_data - f.num_states, op, "input gradient")?, grad.clone())?;
                }
            }
            carried = f
                .state_locs()
                .zip(&states)
                .map(|(&loc, s)| at(&grads, loc, op, "body input gradient")?.clone().map_or_else(|| zeros_like(s), Ok))
                .collect::<Result<_>>()?;
        }
        let mut result = data_grads;
        result.extend(carried.iter().map(copy_of).collect::<Result<Vec<_>>>()?);
        for (grad, input) in remain_grads.into_iter().zip(remain) {
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
        let var_slots = gather(&func_locs, &var_func_pos, op, "func_input_locs entry")?;
        for (j, p) in func_locs.iter().enumerate() {
            if let Some(k) = var_slots.iter().position(|s| s == p) {
                if var_func_pos.get(k) != Some(&j) {
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
        let op = Self::NAME;
        let cond_in = gather(inputs, &self.cond_locs, op, "input shape")?;
        let (cond_refined, _) = self.cond.partial_shapes(&cond_in)?;
        for (&p, shape) in self.cond_locs.iter().zip(&cond_refined) {
            merge_into(at_mut(inputs, p, op, "input shape")?, shape)?;
        }
        let func_in = gather(inputs, &self.func_locs, op, "input shape")?;
        let (refined, mut targets) = self.func.partial_shapes(&func_in)?;
        for (&p, shape) in self.func_locs.iter().zip(&refined) {
            merge_into(at_mut(inputs, p, op, "input shape")?, shape)?;
        }
        // A loop variable keeps its shape from one iteration to the next.
        for (k, &slot) in self.var_slots.iter().enumerate() {
            let input = at_mut(inputs, slot, op, "input shape")?;
            let output = at_mut(&mut targets, self.num_out_data + k, op, "body output")?;
            let (input_side, output_side) = (input.clone(), output.clone());
            merge_into(output, &input_side)?;
            merge_into(input, &output_side)?;
        }
        let rows = Some(self.max_iterations);
        let (out_data, rest) = split(&targets, self.num_out_data, op, "body outputs")?;
        let (vars, saved) = split(rest, self.num_vars(), op, "body outputs")?;
        let mut outputs: Vec<Option<PartialShape>> = out_data.iter().map(|s| stacked(rows, s)).collect();
        outputs.extend_from_slice(vars);
        for &slot in &self.var_slots {
            outputs.push(stacked(rows, at(inputs, slot, op, "input shape")?));
        }
        outputs.extend(saved.iter().map(|s| stacked(rows, s)));
        outputs.push(Some(PartialShape(vec![Some(1)])));
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let op = Self::NAME;
        let func_in = gather(inputs, &self.func_locs, op, "input dtype")?;
        let (refined, targets) = self.func.types(&func_in)?;
        for (&p, dtype) in self.func_locs.iter().zip(refined) {
            let input = at_mut(inputs, p, op, "input dtype")?;
            *input = input.or(dtype);
        }
        let cond_in = gather(inputs, &self.cond_locs, op, "input dtype")?;
        let (cond_refined, _) = self.cond.types(&cond_in)?;
        for (&p, dtype) in self.cond_locs.iter().zip(cond_refined) {
            let input = at_mut(inputs, p, op, "input dtype")?;
            *input = input.or(dtype);
        }
        let (visible, saved) = split(&targets, self.num_visible(), op, "body outputs")?;
        let mut outputs = visible.to_vec();
        outputs.extend(gather(inputs, &self.var_slots, op, "input dtype")?);
        outputs.extend_from_slice(saved);
        outputs.push(Some(DType::I64));
        Ok(outputs)
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let op = Self::NAME;
        if inputs.len() != self.num_inputs {
            crate::bail!(Value, "{op}: {} input(s) given, expected {}", inputs.len(), self.num_inputs);
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
        let (count, stacks) = outputs.split_last_mut().ok_or_else(|| crate::err!(Value, "{op}: no output for the iteration count"))?;
        let (out_stacks, rest) = split(stacks, self.num_out_data, op, "outputs")?;
        let (final_values, rest) = split(rest, self.num_vars(), op, "outputs")?;
        let (var_stacks, saved_stacks) = split(rest, self.num_vars(), op, "outputs")?;
        let mut current = inputs.to_vec();
        let mut steps = 0;
        while steps < self.max_iterations {
            let cond_out = self.cond.forward(&gather(&current, &self.cond_locs, op, "input")?, ctx)?;
            if !truth(op, at(&cond_out, 0, op, "condition output")?)? {
                break;
            }
            let values = self.func.forward(&gather(&current, &self.func_locs, op, "input")?, ctx)?;
            let (out_values, rest) = split(&values, self.num_out_data, op, "body outputs")?;
            let (new_vars, saved) = split(rest, self.num_vars(), op, "body outputs")?;
            for (stack, value) in out_stacks.iter().zip(out_values) {
                put_row(stack, steps, value)?;
            }
            for (stack, &slot) in var_stacks.iter().zip(&self.var_slots) {
                put_row(stack, steps, at(&current, slot, op, "input")?)?;
            }
            for (stack, value) in saved_stacks.iter().zip(saved) {
                put_row(stack, steps, value)?;
            }
            for (&slot, value) in self.var_slots.iter().zip(new_vars) {
                *at_mut(&mut current, slot, op, "input")? = value.clone();
            }
            steps += 1;
        }
        for (dest, &slot) in final_values.iter().zip(&self.var_slots) {
            imperative::copy(at(&current, slot, op, "input")?, dest, None)?;
        }
        *count = NDArray::from_vec::<i64>(Shape::new(vec![1]), &[steps as i64], ctx)?;
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
        gradient_node(g, WhileLoopBackward::NAME, self.num_visible(), Arc::new(WhileLoopBackward { forward: self.clone() }))
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
        let op = Self::NAME;
        let f = &self.forward;
        let visible = f.num_visible();
        let expected = f.num_inputs + f.num_outputs();
        if inputs.len() != expected {
            crate::bail!(Value, "{op}: {} input(s) given, expected {expected}", inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = split(inputs, f.num_inputs, op, "inputs")?;
        let (out_grads, hidden) = split(rest, visible, op, "inputs")?;
        let (var_stacks, rest) = split(hidden, f.num_vars(), op, "inputs")?;
        let (steps, saved_stacks) = rest.split_last().ok_or_else(|| crate::err!(Value, "{op}: no input holds the iteration count"))?;
        let steps = usize::try_from(first_element::<i64>(op, steps, "the iteration count")?)
            .map_err(|_| crate::err!(Value, "{op}: negative iteration count"))?;
        let (data_out_grads, var_out_grads) = split(out_grads, f.num_out_data, op, "output gradients")?;
        let mut carried: Vec<NDArray> = var_out_grads.to_vec();
        let mut free: Vec<Option<NDArray>> = vec![None; f.num_inputs];
        for t in (0..steps).rev() {
            let vars = var_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let func_in = f
                .func_locs
                .iter()
                .map(|p| match f.var_slots.iter().position(|s| s == p) {
                    Some(k) => at(&vars, k, op, "loop variable").cloned(),
                    None => at(node_inputs, *p, op, "input").cloned(),
                })
                .collect::<Result<Vec<_>>>()?;
            let saved = saved_stacks.iter().map(|s| s.at_view(t)).collect::<Result<Vec<_>>>()?;
            let mut heads = data_out_grads.iter().map(|g| g.at_view(t)).collect::<Result<Vec<_>>>()?;
            heads.extend(carried.iter().cloned());
            let grads = f.func.backward(op, &func_in, &saved, &heads, ctx)?;
            for (j, &p) in f.func_locs.iter().enumerate() {
                if let (Some(grad), false) = (at(&grads, j, op, "body input gradient")?, f.var_slots.contains(&p)) {
                    accumulate(at_mut(&mut free, p, op, "input gradient")?, grad.clone())?;
                }
            }
            carried = f
                .var_func_pos
                .iter()
                .zip(&vars)
                .map(|(&j, v)| at(&grads, j, op, "body input gradient")?.clone().map_or_else(|| zeros_like(v), Ok))
                .collect::<Result<_>>()?;
        }
        free.into_iter()
            .zip(node_inputs)
            .enumerate()
            .map(|(p, (grad, input))| match f.var_slots.iter().position(|&s| s == p) {
                Some(k) => copy_of(at(&carried, k, op, "loop variable gradient")?),
                None => grad.map_or_else(|| zeros_like(input), Ok),
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
        let op = Self::NAME;
        let pred_in = gather(inputs, &self.pred_locs, op, "input shape")?;
        let (pred_refined, _) = self.pred.partial_shapes(&pred_in)?;
        for (&p, shape) in self.pred_locs.iter().zip(&pred_refined) {
            merge_into(at_mut(inputs, p, op, "input shape")?, shape)?;
        }
        let mut outputs: Vec<Option<PartialShape>> = vec![None; self.num_outputs];
        let mut saved = Vec::new();
        for (branch, locs) in self.branches.iter().zip(&self.branch_locs) {
            let branch_in = gather(inputs, locs, op, "input shape")?;
            let (refined, targets) = branch.partial_shapes(&branch_in)?;
            for (&p, shape) in locs.iter().zip(&refined) {
                merge_into(at_mut(inputs, p, op, "input shape")?, shape)?;
            }
            let (branch_outputs, branch_saved) = split(&targets, self.num_outputs, op, "branch outputs")?;
            for (slot, shape) in outputs.iter_mut().zip(branch_outputs) {
                merge_into(slot, shape).map_err(|e| e.context(format!("{op}: the two branches' outputs must have the same shapes")))?;
            }
            saved.extend_from_slice(branch_saved);
        }
        outputs.push(Some(PartialShape(vec![Some(1)])));
        outputs.extend(saved);
        Ok(outputs)
    }

    fn types(&self, inputs: &mut [Option<DType>]) -> Result<Vec<Option<DType>>> {
        let op = Self::NAME;
        let mut outputs: Vec<Option<DType>> = vec![None; self.num_outputs];
        let mut saved = Vec::new();
        for (branch, locs) in self.branches.iter().zip(&self.branch_locs) {
            let branch_in = gather(inputs, locs, op, "input dtype")?;
            let (refined, targets) = branch.types(&branch_in)?;
            for (&p, dtype) in locs.iter().zip(refined) {
                let input = at_mut(inputs, p, op, "input dtype")?;
                *input = input.or(dtype);
            }
            let (branch_outputs, branch_saved) = split(&targets, self.num_outputs, op, "branch outputs")?;
            for (slot, dtype) in outputs.iter_mut().zip(branch_outputs) {
                *slot = slot.or(*dtype);
            }
            saved.extend_from_slice(branch_saved);
        }
        let pred_in = gather(inputs, &self.pred_locs, op, "input dtype")?;
        let (pred_refined, _) = self.pred.types(&pred_in)?;
        for (&p, dtype) in self.pred_locs.iter().zip(pred_refined) {
            let input = at_mut(inputs, p, op, "input dtype")?;
            *input = input.or(dtype);
        }
        outputs.push(Some(DType::I64));
        outputs.extend(saved);
        Ok(outputs)
    }

    /// Position among the outputs of the first saved value of branch `b` (0: then, 1: else).
    fn saved_offset(&self, b: usize) -> usize {
        self.num_outputs + 1 + if b == 0 { 0 } else { self.branches[0].saved().len() }
    }

    /// Branch `b` (0: then, 1: else) and the node inputs its subgraph reads.
    fn branch(&self, b: usize) -> Result<(&Subgraph, &[usize])> {
        let subgraph: &Subgraph = at(&self.branches, b, Self::NAME, "branch")?;
        let locs: &[usize] = at(&self.branch_locs, b, Self::NAME, "branch")?;
        Ok((subgraph, locs))
    }

    fn run(&self, inputs: &[NDArray]) -> Result<Vec<NDArray>> {
        let op = Self::NAME;
        if inputs.len() != self.num_inputs {
            crate::bail!(Value, "{op}: {} input(s) given, expected {}", inputs.len(), self.num_inputs);
        }
        let ctx = context_of(inputs);
        let pred_out = self.pred.forward(&gather(inputs, &self.pred_locs, op, "input")?, ctx)?;
        let taken = if truth(op, at(&pred_out, 0, op, "predicate output")?)? { 0 } else { 1 };
        let (branch, locs) = self.branch(taken)?;
        let values = branch.forward(&gather(inputs, locs, op, "input")?, ctx)?;
        let (branch_outputs, branch_saved) = split(&values, self.num_outputs, op, "branch outputs")?;
        let mut outputs = branch_outputs.iter().map(copy_of).collect::<Result<Vec<_>>>()?;
        outputs.push(NDArray::from_vec::<i64>(Shape::new(vec![1]), &[(taken == 0) as i64], ctx)?);
        // The saved values of the branch not taken are never read; zeros keep the layout.
        let shapes = self.infer_shape(&inputs.iter().map(|a| a.shape().clone()).collect::<Vec<_>>())?;
        let types = self.infer_type(&inputs.iter().map(NDArray::dtype).collect::<Vec<_>>())?;
        for (b, branch) in self.branches.iter().enumerate() {
            for i in 0..branch.saved().len() {
                let position = self.saved_offset(b) + i;
                outputs.push(if b == taken {
                    at(branch_saved, i, op, "saved value")?.clone()
                } else {
                    zeros(at(&shapes, position, op, "output shape")?, *at(&types, position, op, "output dtype")?, ctx)?
                });
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
        gradient_node(g, CondBackward::NAME, self.num_outputs, Arc::new(CondBackward { forward: self.clone() }))
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
        let op = Self::NAME;
        let f = &self.forward;
        let expected = f.num_inputs + f.num_outputs();
        if inputs.len() != expected {
            crate::bail!(Value, "{op}: {} input(s) given, expected {expected}", inputs.len());
        }
        let ctx = context_of(inputs);
        let (node_inputs, rest) = split(inputs, f.num_inputs, op, "inputs")?;
        let (out_grads, hidden) = split(rest, f.num_outputs, op, "inputs")?;
        let flag = at(hidden, 0, op, "hidden output")?;
        let taken = if first_element::<i64>(op, flag, "the flag of the branch taken")? != 0 { 0 } else { 1 };
        let (branch, locs) = f.branch(taken)?;
        let start = f.saved_offset(taken) - f.num_outputs;
        let saved = part(hidden, start..start + branch.saved().len(), op, "hidden outputs")?;
        let branch_in = gather(node_inputs, locs, op, "input")?;
        let grads = branch.backward(op, &branch_in, saved, out_grads, ctx)?;
        let mut result: Vec<Option<NDArray>> = vec![None; f.num_inputs];
        for (&p, grad) in locs.iter().zip(grads) {
            if let Some(grad) = grad {
                accumulate(at_mut(&mut result, p, op, "input gradient")?, grad)?;
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
