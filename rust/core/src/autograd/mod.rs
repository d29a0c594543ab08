//! Imperative differentiation (MXNet's `autograd`).
//!
//! While recording, every operator call whose inputs belong to a graph (marked variables or
//! results of recorded calls) adds a [`Node`] holding its outputs; the arrays it returns carry
//! entries naming that node. `backward` runs the gradient pass on the recorded graph and executes
//! the result with the graph runner, so gradients are computed by ordinary registered operators.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod compiled;

use std::cell::Cell;
use std::sync::Arc;

use crate::error::Result;
use crate::executor::{self, Source};
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, GradReq, Node, NodeOp, Recorded};
use crate::imperative;
use crate::ndarray::NDArray;
use crate::op::{Attrs, Operator};
use crate::pass::gradient;

thread_local! {
    // MXNet keeps both flags per thread.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    static TRAINING: Cell<bool> = const { Cell::new(false) };
}

pub fn is_recording() -> bool {
    RECORDING.with(Cell::get)
}
pub fn is_training() -> bool {
    TRAINING.with(Cell::get)
}
/// Set the recording flag; returns the previous value.
pub fn set_recording(on: bool) -> bool {
    RECORDING.with(|c| c.replace(on))
}
/// Set the training flag; returns the previous value.
pub fn set_training(on: bool) -> bool {
    TRAINING.with(|c| c.replace(on))
}

/// Restores both flags when dropped, so an error inside backward cannot leave them changed.
pub(crate) struct FlagsGuard {
    recording: bool,
    training: bool,
}

impl FlagsGuard {
    pub(crate) fn set(recording: bool, training: bool) -> FlagsGuard {
        FlagsGuard { recording: set_recording(recording), training: set_training(training) }
    }
}

impl Drop for FlagsGuard {
    fn drop(&mut self) {
        set_recording(self.recording);
        set_training(self.training);
    }
}

const NOT_IN_GRAPH: &str = "Cannot differentiate node because it is not in a computational graph. You need to set \
    is_recording to true or use autograd.record() to save computational graphs for backward. If you want to \
    differentiate the same graph twice, you need to pass retain_graph=True to backward.";

/// Whether this call must be recorded: recording is on and some input belongs to a graph.
pub fn should_record(inputs: &[NDArray]) -> bool {
    is_recording() && inputs.iter().any(|a| a.autograd_entry().is_some())
}

/// Record one operator call; returns its outputs carrying entries of the new node.
pub fn record(name: &str, operator: Arc<dyn Operator>, attrs: &Attrs, inputs: &[NDArray], outputs: Vec<NDArray>) -> Vec<NDArray> {
    let input_entries = inputs
        .iter()
        .map(|a| match a.autograd_entry() {
            Some(e) => e.clone(),
            // A constant: a leaf that keeps its value but takes no gradient.
            None => Entry::new(Node::leaf("", a.detached(), None, GradReq::Null), 0),
        })
        .collect();
    let saved = outputs.iter().map(NDArray::detached).collect();
    let op = NodeOp { name: name.to_string(), attrs: attrs.clone(), operator };
    let node = Node::with_operator(op, input_entries, name, Recorded::Outputs(saved));
    outputs.into_iter().enumerate().map(|(i, o)| o.with_entry(Entry::new(node.clone(), i))).collect()
}

/// Record a view (`reshape`, a first-axis slice) of `input` as the operator `op_name` with
/// `attrs` would compute it, when recording applies; the view keeps sharing `input`'s memory.
pub fn record_view(op_name: &str, attrs: &Attrs, input: &NDArray, view: NDArray) -> Result<NDArray> {
    if !should_record(std::slice::from_ref(input)) {
        return Ok(view);
    }
    let operator = crate::op::lookup(op_name)?.instantiate(op_name, attrs)?;
    Ok(record(op_name, operator, attrs, std::slice::from_ref(input), vec![view]).swap_remove(0))
}

/// Make `arrays` variables whose gradients go to `grads` (MXNet's `mark_variables`); returns the
/// arrays carrying their new entries.
pub fn mark_variables(arrays: &[NDArray], grads: &[NDArray], reqs: &[GradReq]) -> Result<Vec<NDArray>> {
    if arrays.len() != grads.len() || arrays.len() != reqs.len() {
        crate::bail!(Value, "mark_variables: {} variables, {} gradients and {} grad_reqs given", arrays.len(), grads.len(), reqs.len());
    }
    arrays
        .iter()
        .zip(grads)
        .zip(reqs)
        .map(|((a, g), &req)| {
            if a.shape() != g.shape() {
                crate::bail!(Shape, "mark_variables: gradient shape {} differs from variable shape {}", g.shape(), a.shape());
            }
            let node = Node::leaf("var", a.detached(), Some(g.detached()), req);
            Ok(a.with_entry(Entry::new(node, 0)))
        })
        .collect()
}

/// Whether `array` is a variable marked for differentiation (writing into it while recording
/// would invalidate the graph).
pub fn is_marked_variable(array: &NDArray) -> bool {
    array.autograd_entry().is_some_and(|e| matches!(&*e.node.recorded(), Recorded::Leaf { grad: Some(_), .. }))
}

/// The gradient buffer of a marked variable.
pub fn grad_of(array: &NDArray) -> Option<NDArray> {
    let entry = array.autograd_entry()?;
    match &*entry.node.recorded() {
        Recorded::Leaf { grad: Some(g), req, .. } if *req != GradReq::Null => Some(g.clone()),
        _ => None,
    }
}

/// What `backward` differentiates with respect to.
pub enum Wrt<'a> {
    /// Every marked variable in the graph; gradients are stored into their buffers.
    MarkedVariables,
    /// These arrays; gradients are returned (MXNet's `autograd.grad`).
    Arrays(&'a [NDArray]),
}

pub struct BackwardOptions {
    pub retain_graph: bool,
    pub create_graph: bool,
    pub train_mode: bool,
}

/// The head gradient used for `head`. MXNet 1.9.1 never checks a head gradient's shape in
/// imperative backward: the head's producer reads what it expects from the buffer, so a gradient
/// with extra leading rows (e.g. several heads' gradients concatenated along axis 0) works there,
/// its first rows being this head's, while a smaller one reads past the buffer. oxnet keeps the
/// meaningful case, extra rows along axis 0 with every other dimension equal, as a view of the
/// leading rows, and refuses every other mismatch instead of reading unrelated memory.
fn head_gradient_rows(grad: &NDArray, head: &NDArray) -> Result<NDArray> {
    let (grad_dims, head_dims) = (grad.shape().dims(), head.shape().dims());
    if grad_dims == head_dims {
        return Ok(grad.clone());
    }
    let leading_rows = match (grad_dims.split_first(), head_dims.split_first()) {
        (Some((&grad_rows, grad_rest)), Some((&head_rows, head_rest))) if grad_rest == head_rest && grad_rows > head_rows => Some(head_rows),
        _ => None,
    };
    let Some(head_rows) = leading_rows else {
        crate::bail!(
            Shape,
            "backward: head gradient of shape {} for a head of shape {}: expected the head's shape (or more rows along axis 0, of which the leading ones are used)",
            grad.shape(),
            head.shape()
        );
    };
    grad.detached().slice_view(0, head_rows)
}

/// Differentiate `heads` (with `head_grads`, ones where `None`). Returns the gradients for
/// [`Wrt::Arrays`], nothing for [`Wrt::MarkedVariables`].
pub fn backward(heads: &[NDArray], head_grads: &[Option<NDArray>], wrt: Wrt<'_>, options: BackwardOptions) -> Result<Vec<NDArray>> {
    let Some(first_head) = heads.first() else {
        crate::bail!(Value, "backward: no heads given");
    };
    if head_grads.len() != heads.len() {
        crate::bail!(Value, "backward: {} heads but {} head gradients", heads.len(), head_grads.len());
    }
    let _flags = FlagsGuard::set(false, options.train_mode);
    let mut head_entries = Vec::with_capacity(heads.len());
    let mut grad_arrays = Vec::with_capacity(heads.len());
    for (head, grad) in heads.iter().zip(head_grads) {
        let Some(entry) = head.autograd_entry() else { crate::bail!(Value, "{NOT_IN_GRAPH}") };
        // A graph already differentiated without retain_graph has released its values.
        if entry.node.op.is_some() && matches!(&*entry.node.recorded(), Recorded::Nothing) {
            crate::bail!(Value, "{NOT_IN_GRAPH}");
        }
        let grad = match grad {
            Some(g) => head_gradient_rows(g, head)?,
            None => imperative::invoke("ones_like", &[head.detached()], &Attrs::new(), None, head.context(), None)?.swap_remove(0),
        };
        head_entries.push(entry.clone());
        grad_arrays.push(grad);
    }
    let forward = topo_order(&head_entries, |_| false);
    let forward_keys: AddressSet<usize> = forward.iter().map(node_key).collect();
    let marked_variables = matches!(wrt, Wrt::MarkedVariables);

    let (xs, stored): (Vec<Entry>, Vec<(NDArray, GradReq)>) = match wrt {
        Wrt::Arrays(arrays) => {
            let xs = arrays
                .iter()
                .map(|a| {
                    a.autograd_entry().cloned().ok_or_else(|| {
                        crate::err!(Value, "cannot differentiate with respect to an array that is not a marked variable or recorded result; call attach_grad() on it before recording")
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            // MXNet's check: a variable the heads do not depend on at all is a mistake (usually
            // the wrong array), not a zero gradient. Reachable ones without a gradient path
            // (through stop_gradient, say) do get zeros below.
            if let Some(i) = xs.iter().position(|x| !forward_keys.contains(&node_key(&x.node))) {
                crate::bail!(Value, "Cannot differentiate with respect to the {}-th variable because it is unreachable from the outputs", i + 1);
            }
            (xs, Vec::new())
        }
        Wrt::MarkedVariables => forward
            .iter()
            .filter_map(|n| match &*n.recorded() {
                Recorded::Leaf { grad: Some(g), req, .. } if *req != GradReq::Null => Some((Entry::new(n.clone(), 0), (g.clone(), *req))),
                _ => None,
            })
            .unzip(),
    };
    let ctx = first_head.context();
    // A training loop's recording repeats: its compiled gradient is kept and run again. (Not
    // for a backward that keeps the graph: a kept gradient's placeholders share the recorded
    // operators, and a cached graph's call keeps its blocks until a backward releases them.)
    let reused = if marked_variables && !options.create_graph && !options.retain_graph {
        let given: Vec<bool> = head_grads.iter().map(Option::is_some).collect();
        let recording = compiled::Recording {
            forward: &forward,
            heads: &head_entries,
            head_grads: &grad_arrays,
            head_grads_given: &given,
            train_mode: options.train_mode,
        };
        let _releasing = ReleasingGuard::set(true);
        compiled::gradients(&recording, &stored, ctx)?
    } else {
        None
    };
    let computed = match reused {
        Some(computed) => computed,
        None => differentiate(&head_entries, grad_arrays, &xs, &stored, ctx, &forward_keys, &options)?,
    };
    let mut results = Vec::with_capacity(xs.len());
    for (x, grad) in xs.iter().zip(computed) {
        let value = match grad {
            Some(value) => value,
            None => {
                let x_value = leaf_or_output(x)?;
                imperative::invoke("zeros_like", &[x_value], &Attrs::new(), None, ctx, None)?.swap_remove(0)
            }
        };
        results.push(value);
    }

    if !options.retain_graph {
        for node in &forward {
            if node.op.is_some() {
                *node.recorded() = Recorded::Nothing;
            }
        }
    }
    if stored.is_empty() {
        return Ok(if options.create_graph { results } else { results.iter().map(NDArray::detached).collect() });
    }
    for (value, (buffer, req)) in results.iter().zip(&stored) {
        buffer.set_fresh_grad(*req != GradReq::Null);
        match req {
            GradReq::Write => imperative::copy(value, buffer, None)?,
            GradReq::Add => {
                imperative::invoke("elemwise_add", &[buffer.clone(), value.detached()], &Attrs::new(), Some(vec![buffer.clone()]), ctx, None)?;
            }
            GradReq::Null => {}
        }
    }
    Ok(Vec::new())
}

/// The gradients of `heads` (weighted by `head_grads`) for each of `xs` (`None` where the heads
/// do not depend on it), built and run for this one backward pass.
fn differentiate(
    heads: &[Entry],
    head_grads: Vec<NDArray>,
    xs: &[Entry],
    stored: &[(NDArray, GradReq)],
    ctx: crate::base::Context,
    forward_keys: &AddressSet<usize>,
    options: &BackwardOptions,
) -> Result<Vec<Option<NDArray>>> {
    let grad_entries: Vec<Entry> = head_grads.into_iter().map(|grad| Entry::new(Node::leaf("head_grad", grad, None, GradReq::Null), 0)).collect();
    let grads = gradient::gradient(heads, &grad_entries, xs, &recorded_shape)?;
    let targets: Vec<Entry> = grads.iter().flatten().cloned().collect();
    // A gradient computed for exactly one 'write' buffer is computed into it (MXNet's kWriteTo)
    // instead of into a fresh array copied over afterwards.
    let mut destinations: AddressMap<EntryKey, NDArray> = AddressMap::default();
    if !options.create_graph {
        let mut claims: AddressMap<EntryKey, usize> = AddressMap::default();
        for grad in grads.iter().flatten() {
            *claims.entry(grad.key()).or_default() += 1;
        }
        for (grad, (buffer, req)) in grads.iter().zip(stored) {
            if let Some(grad) = grad.as_ref().filter(|g| *req == GradReq::Write && claims.get(&g.key()) == Some(&1)) {
                destinations.insert(grad.key(), buffer.clone());
            }
        }
    }
    let values = {
        let _recording = FlagsGuard::set(options.create_graph, options.train_mode);
        let _releasing = ReleasingGuard::set(!options.retain_graph && !options.create_graph);
        let create_graph = options.create_graph;
        executor::run(&targets, &destinations, ctx, |node| resolve(node, forward_keys, create_graph))?
    };
    let mut values = values.into_iter();
    Ok(grads.iter().map(|g| g.as_ref().and_then(|_| values.next())).collect())
}

/// Forget the gradients kept for recordings that called an operator with `identity` (a cached
/// graph's run whose graph can no longer be called).
pub(crate) fn forget_gradients_of(identity: crate::op::GradientIdentity) {
    compiled::forget(identity);
}

thread_local! {
    /// Whether the backward pass running on this thread releases the graph's values when done.
    static RELEASING_GRAPH: Cell<bool> = const { Cell::new(false) };
}

/// Whether the backward pass running on this thread releases the recorded graph when done (no
/// `retain_graph`, no `create_graph`): its gradient nodes read the forward values for the last
/// time and may overwrite them after their last use (a cached graph's gradient then reuses the
/// memory of the forward values it has read, as an executor's backward does).
pub fn backward_releases_graph() -> bool {
    RELEASING_GRAPH.with(Cell::get)
}

/// Sets [`backward_releases_graph`] for a scope, restoring the previous value on drop.
struct ReleasingGuard(bool);

impl ReleasingGuard {
    fn set(releasing: bool) -> ReleasingGuard {
        ReleasingGuard(RELEASING_GRAPH.with(|flag| flag.replace(releasing)))
    }
}

impl Drop for ReleasingGuard {
    fn drop(&mut self) {
        RELEASING_GRAPH.with(|flag| flag.set(self.0));
    }
}

/// Where the graph runner finds a node's values: recorded outputs and leaves are known (with
/// their entries re-attached when the backward pass is itself recorded); gradient nodes are
/// computed; a forward node whose values were released is the MXNet error.
fn resolve(node: &Arc<Node>, forward: &AddressSet<usize>, create_graph: bool) -> Result<Source> {
    let attach = |arrays: Vec<NDArray>| -> Vec<NDArray> {
        if !create_graph {
            return arrays;
        }
        arrays.into_iter().enumerate().map(|(i, a)| a.with_entry(Entry::new(node.clone(), i))).collect()
    };
    let known = match &*node.recorded() {
        Recorded::Outputs(outputs) => Some(outputs.clone()),
        Recorded::Leaf { value, .. } => Some(vec![value.clone()]),
        Recorded::Nothing => None,
    };
    match known {
        Some(arrays) => Ok(Source::Known(attach(arrays))),
        None if forward.contains(&node_key(node)) => crate::bail!(Value, "{NOT_IN_GRAPH}"),
        None => Ok(Source::Compute),
    }
}

/// The shape of a recorded value, if it is still held.
fn recorded_shape(entry: &Entry) -> Option<crate::base::Shape> {
    match &*entry.node.recorded() {
        Recorded::Outputs(outputs) => outputs.get(entry.index).map(|a| a.shape().clone()),
        Recorded::Leaf { value, .. } => Some(value.shape().clone()),
        Recorded::Nothing => None,
    }
}

fn leaf_or_output(entry: &Entry) -> Result<NDArray> {
    match &*entry.node.recorded() {
        Recorded::Outputs(outputs) => {
            outputs.get(entry.index).cloned().ok_or_else(|| crate::err!(Runtime, "node '{}' recorded no output {}", entry.node.name, entry.index))
        }
        Recorded::Leaf { value, .. } => Ok(value.clone()),
        Recorded::Nothing => crate::bail!(Value, "{NOT_IN_GRAPH}"),
    }
}

/// The backward of an `autograd.Function`, supplied by the host language: input gradients from
/// output gradients.
pub type HostBackward = Arc<dyn Fn(&[NDArray]) -> Result<Vec<NDArray>> + Send + Sync>;

/// A recorded `autograd.Function` call: its outputs were computed by the host, its gradient
/// calls the host's backward.
struct HostFunction {
    num_inputs: usize,
    num_outputs: usize,
    backward: HostBackward,
}

impl Operator for HostFunction {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_inputs).map(|i| format!("arg{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_outputs
    }
    fn infer_shape(&self, _inputs: &[crate::base::Shape]) -> Result<Vec<crate::base::Shape>> {
        crate::bail!(Value, "an autograd.Function node has no shape inference: it only exists in recorded graphs")
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Host
    }
    fn compute_arrays(&self, _inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        crate::bail!(Value, "an autograd.Function is computed by its Python forward, not by the engine")
    }
    fn gradient_identity(&self) -> crate::op::GradientIdentity {
        crate::op::GradientIdentity::Unique
    }
    fn gradient(&self, d: &mut crate::op::grad::Grad) -> Result<crate::op::grad::InputGrads> {
        let backward = Arc::new(HostFunctionBackward { num_inputs: self.num_inputs, num_outputs: self.num_outputs, backward: self.backward.clone() });
        let out_grads = d.out_grads().to_vec();
        Ok(d.instance_outputs("_backward_Function", backward, &out_grads).into_iter().map(Some).collect())
    }
}

/// The gradient node of a [`HostFunction`]: runs the host's backward on whole arrays.
struct HostFunctionBackward {
    num_inputs: usize,
    num_outputs: usize,
    backward: HostBackward,
}

impl Operator for HostFunctionBackward {
    fn input_names(&self) -> Vec<String> {
        (0..self.num_outputs).map(|i| format!("out_grad{i}")).collect()
    }
    fn num_outputs(&self) -> usize {
        self.num_inputs
    }
    fn infer_shape(&self, _inputs: &[crate::base::Shape]) -> Result<Vec<crate::base::Shape>> {
        crate::bail!(Value, "the backward of an autograd.Function has no shape inference")
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Host
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        let grads = inputs.iter().map(NDArray::detached).collect::<Vec<_>>();
        let g = (self.backward)(&grads)?;
        if g.len() != self.num_inputs {
            crate::bail!(Value, "autograd.Function backward returned {} gradient(s) for {} input(s)", g.len(), self.num_inputs);
        }
        Ok(g.iter().map(NDArray::detached).collect())
    }
}

/// Record an `autograd.Function` call whose `outputs` the host computed from `inputs`; returns
/// the outputs carrying entries of the new node (unchanged when nothing is recorded).
pub fn record_function(inputs: &[NDArray], outputs: Vec<NDArray>, backward: HostBackward) -> Vec<NDArray> {
    if !should_record(inputs) {
        return outputs;
    }
    let operator = Arc::new(HostFunction { num_inputs: inputs.len(), num_outputs: outputs.len(), backward });
    record("Function", operator, &Attrs::new(), inputs, outputs)
}
