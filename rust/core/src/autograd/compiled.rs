//! Compiled gradients of recorded graphs, kept for recordings that repeat.
//!
//! A training loop records the same graph every step: the same operators with the same
//! attributes, wired the same way, on arrays of the same shapes. Building that graph's gradient
//! and compiling it (schedule, inferred shapes, memory plan) cost as much as running a small
//! one, so the compiled gradient is kept, built over placeholder copies of the recorded nodes,
//! and run again on the values a later recording with the same signature holds (MXNet's cached
//! ops key their compiled graphs by input signature the same way).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::executor::{self, CompiledGraph, Source};
use crate::graph::{node_key, AddressMap, AddressSet, Entry, EntryKey, GradReq, Node, NodeOp, Recorded};
use crate::ndarray::NDArray;
use crate::op::{Attrs, GradientIdentity};
use crate::pass::gradient;

/// How many compiled gradients are kept (the oldest goes first): a bucketing loop needs one per
/// bucket shape.
const KEPT: usize = 64;

/// Recordings of more nodes are differentiated afresh each time: a training step records a few
/// hundred operators, while a kept gradient of a long imperative loop (a million recorded
/// additions) would hold a copy of the whole graph.
const MAX_NODES: usize = 4096;

/// Compiled gradients, newest last.
// Lock invariant: held only to search, add or evict an entry, never while compiling or running.
static COMPILED: Mutex<Vec<Arc<CompiledBackward>>> = Mutex::new(Vec::new());

/// A recorded value as the gradient sees it.
#[derive(PartialEq)]
struct ValueSignature {
    shape: Shape,
    dtype: DType,
    ctx: Context,
}

impl ValueSignature {
    fn of(array: &NDArray) -> ValueSignature {
        ValueSignature { shape: array.shape().clone(), dtype: array.dtype(), ctx: array.context() }
    }

    fn matches(&self, array: &NDArray) -> bool {
        self.shape == *array.shape() && self.dtype == array.dtype() && self.ctx == array.context()
    }

    fn hash_array(array: &NDArray, state: &mut DefaultHasher) {
        array.shape().dims().hash(state);
        array.dtype().hash(state);
        array.context().hash(state);
    }
}

/// One recorded node, in the order of the graph's topological walk.
enum NodeSignature {
    /// A leaf: its value, and its gradient request when it is a marked variable.
    Leaf { value: ValueSignature, request: Option<GradReq> },
    /// An operator call: what defines its gradient, its inputs (position of the node in the
    /// walk, output index) and its outputs.
    Call { name: String, attrs: Attrs, identity: GradientIdentity, inputs: Vec<(usize, usize)>, outputs: Vec<ValueSignature> },
}

/// A leaf's gradient request: that of a marked variable with a gradient buffer.
fn request_of(recorded: &Recorded) -> Option<GradReq> {
    match recorded {
        Recorded::Leaf { grad: Some(_), req, .. } => Some(*req),
        _ => None,
    }
}

/// What a backward pass is over.
pub(super) struct Recording<'a> {
    /// The recorded nodes the heads depend on, in topological order.
    pub forward: &'a [Arc<Node>],
    pub heads: &'a [Entry],
    /// One gradient per head: the caller's, or ones.
    pub head_grads: &'a [NDArray],
    /// Per head, whether the caller gave its gradient.
    pub head_grads_given: &'a [bool],
    pub train_mode: bool,
}

impl Recording<'_> {
    /// Node positions in `forward`.
    fn positions(&self) -> AddressMap<usize, usize> {
        self.forward.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect()
    }

    /// Whether the recording can reuse a compiled gradient: every operator is defined by what
    /// the signature records, and every value is still held.
    fn reusable(&self) -> bool {
        self.forward.len() <= MAX_NODES
            && self.forward.iter().all(|node| match (&node.op, &*node.recorded()) {
                (Some(op), Recorded::Outputs(_)) => op.operator.gradient_identity() != GradientIdentity::Unique,
                (None, Recorded::Leaf { .. }) => true,
                _ => false,
            })
    }

    fn fingerprint(&self, positions: &AddressMap<usize, usize>) -> u64 {
        let mut state = DefaultHasher::new();
        self.train_mode.hash(&mut state);
        for node in self.forward {
            let recorded = node.recorded();
            match (&node.op, &*recorded) {
                (Some(op), Recorded::Outputs(outputs)) => {
                    op.name.hash(&mut state);
                    op.attrs.hash(&mut state);
                    op.operator.gradient_identity().hash(&mut state);
                    for input in &node.inputs {
                        (positions.get(&node_key(&input.node)), input.index).hash(&mut state);
                    }
                    outputs.iter().for_each(|a| ValueSignature::hash_array(a, &mut state));
                }
                (None, Recorded::Leaf { value, .. }) => {
                    ValueSignature::hash_array(value, &mut state);
                    request_of(&recorded).map(|r| r as u8).hash(&mut state);
                }
                _ => 0u8.hash(&mut state),
            }
        }
        for (head, (grad, given)) in self.heads.iter().zip(self.head_grads.iter().zip(self.head_grads_given)) {
            (positions.get(&node_key(&head.node)), head.index, given).hash(&mut state);
            ValueSignature::hash_array(grad, &mut state);
        }
        state.finish()
    }

    fn signature(&self, positions: &AddressMap<usize, usize>) -> Option<Vec<NodeSignature>> {
        self.forward
            .iter()
            .map(|node| {
                let recorded = node.recorded();
                match (&node.op, &*recorded) {
                    (Some(op), Recorded::Outputs(outputs)) => Some(NodeSignature::Call {
                        name: op.name.clone(),
                        attrs: op.attrs.clone(),
                        identity: op.operator.gradient_identity(),
                        inputs: node.inputs.iter().map(|e| Some((*positions.get(&node_key(&e.node))?, e.index))).collect::<Option<_>>()?,
                        outputs: outputs.iter().map(ValueSignature::of).collect(),
                    }),
                    (None, Recorded::Leaf { value, .. }) => {
                        Some(NodeSignature::Leaf { value: ValueSignature::of(value), request: request_of(&recorded) })
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

/// A recorded graph's gradient compiled over placeholder copies of its nodes.
pub(super) struct CompiledBackward {
    fingerprint: u64,
    train_mode: bool,
    nodes: Vec<NodeSignature>,
    /// (position, output index, given) per head, and each head gradient's value.
    heads: Vec<(usize, usize, bool, ValueSignature)>,
    /// Per recorded node, its placeholder.
    placeholders: Vec<Arc<Node>>,
    /// Per head, the variable standing for its gradient.
    head_grad_nodes: Vec<Arc<Node>>,
    /// Positions of the recorded nodes whose values the gradient reads.
    reads: Vec<usize>,
    /// Per marked variable (in walk order), its gradient's entry (`None`: the heads do not
    /// depend on it through anything differentiable).
    grads: Vec<Option<Entry>>,
    /// Gradient entries computed straight into the variable's buffer (request `write`, the
    /// entry no other variable's): (entry, index of the variable among the marked ones).
    written: Vec<(EntryKey, usize)>,
    graph: CompiledGraph,
}

impl CompiledBackward {
    /// Whether `recording` has this signature, node for node.
    fn matches(&self, recording: &Recording<'_>, positions: &AddressMap<usize, usize>) -> bool {
        if self.train_mode != recording.train_mode || self.nodes.len() != recording.forward.len() || self.heads.len() != recording.heads.len() {
            return false;
        }
        let heads_match = self.heads.iter().zip(recording.heads.iter().zip(recording.head_grads.iter().zip(recording.head_grads_given))).all(
            |((position, index, given, value), (head, (grad, head_given)))| {
                positions.get(&node_key(&head.node)) == Some(position) && head.index == *index && given == head_given && value.matches(grad)
            },
        );
        heads_match
            && self.nodes.iter().zip(recording.forward).all(|(signature, node)| {
                let recorded = node.recorded();
                match (signature, &node.op, &*recorded) {
                    (NodeSignature::Call { name, attrs, identity, inputs, outputs }, Some(op), Recorded::Outputs(values)) => {
                        *name == op.name
                            && *attrs == op.attrs
                            && *identity == op.operator.gradient_identity()
                            && inputs.len() == node.inputs.len()
                            && inputs
                                .iter()
                                .zip(&node.inputs)
                                .all(|(&(position, index), e)| positions.get(&node_key(&e.node)) == Some(&position) && e.index == index)
                            && outputs.len() == values.len()
                            && outputs.iter().zip(values).all(|(s, a)| s.matches(a))
                    }
                    (NodeSignature::Leaf { value, request }, None, Recorded::Leaf { value: array, .. }) => {
                        value.matches(array) && *request == request_of(&recorded)
                    }
                    _ => false,
                }
            })
    }

    /// The gradients of the marked variables of `recording` (walk order; `None` where there is
    /// none), computed by this compiled gradient, written into the buffers of `write` requests
    /// where it can.
    fn run(&self, recording: &Recording<'_>, buffers: &[NDArray]) -> Result<Vec<Option<NDArray>>> {
        let mut values: AddressMap<EntryKey, NDArray> = AddressMap::default();
        for &position in &self.reads {
            let (Some(node), Some(placeholder)) = (recording.forward.get(position), self.placeholders.get(position)) else {
                crate::bail!(Runtime, "internal error: a compiled gradient reads a node the recording lacks");
            };
            match &*node.recorded() {
                Recorded::Outputs(outputs) => values.extend(outputs.iter().enumerate().map(|(i, a)| ((node_key(placeholder), i), a.clone()))),
                Recorded::Leaf { value, .. } => {
                    values.insert((node_key(placeholder), 0), value.clone());
                }
                Recorded::Nothing => crate::bail!(Value, "{}", super::NOT_IN_GRAPH),
            }
        }
        values.extend(self.head_grad_nodes.iter().zip(recording.head_grads).map(|(n, g)| ((node_key(n), 0), g.clone())));
        let destinations: AddressMap<EntryKey, NDArray> =
            self.written.iter().filter_map(|(key, variable)| Some((*key, buffers.get(*variable)?.clone()))).collect();
        let mut computed = self.graph.run(values, &destinations)?.into_iter();
        Ok(self.grads.iter().map(|g| g.as_ref().and_then(|_| computed.next())).collect())
    }
}

/// The compiled gradient for `recording`, from the kept ones or compiled now (and kept);
/// `None` when the recording cannot reuse one. `buffers` are the marked variables' gradient
/// buffers with their requests, in walk order.
pub(super) fn gradients(recording: &Recording<'_>, buffers: &[(NDArray, GradReq)], ctx: Context) -> Result<Option<Vec<Option<NDArray>>>> {
    if !recording.reusable() {
        return Ok(None);
    }
    let positions = recording.positions();
    let fingerprint = recording.fingerprint(&positions);
    let found = {
        let kept = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().rev().find(|c| c.fingerprint == fingerprint && c.matches(recording, &positions)).cloned()
    };
    let arrays: Vec<NDArray> = buffers.iter().map(|(b, _)| b.clone()).collect();
    if let Some(compiled) = found {
        return compiled.run(recording, &arrays).map(Some);
    }
    let Some(compiled) = compile(recording, &positions, buffers, fingerprint, ctx)? else {
        return Ok(None);
    };
    let compiled = Arc::new(compiled);
    let result = compiled.run(recording, &arrays)?;
    let mut kept = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if kept.len() >= KEPT {
        kept.remove(0);
    }
    kept.push(compiled);
    Ok(Some(result))
}

/// Drop the kept gradients of recordings that called an operator with `identity` (its owner
/// is gone: no later recording can match them, and they would keep what it held alive).
pub(crate) fn forget(identity: GradientIdentity) {
    let mut kept = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|compiled| !compiled.nodes.iter().any(|node| matches!(node, NodeSignature::Call { identity: i, .. } if *i == identity)));
}

/// Build the gradient of `recording` over placeholders of its nodes and compile it.
fn compile(
    recording: &Recording<'_>,
    positions: &AddressMap<usize, usize>,
    buffers: &[(NDArray, GradReq)],
    fingerprint: u64,
    ctx: Context,
) -> Result<Option<CompiledBackward>> {
    let Some(nodes) = recording.signature(positions) else {
        return Ok(None);
    };
    // Placeholders: the recorded operators without their values, leaves as variables.
    let mut placeholders: Vec<Arc<Node>> = Vec::with_capacity(recording.forward.len());
    for node in recording.forward {
        let copy = match &node.op {
            None => Node::variable(node.name.clone(), Attrs::new()),
            Some(op) => {
                let inputs = node
                    .inputs
                    .iter()
                    .map(|e| positions.get(&node_key(&e.node)).and_then(|&p| placeholders.get(p)).map(|n| Entry::new(n.clone(), e.index)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| crate::err!(Runtime, "internal error: a recorded node's input comes after it"))?;
                let op = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
                Node::with_operator(op, inputs, node.name.clone(), Recorded::Nothing)
            }
        };
        placeholders.push(copy);
    }
    let placeholder_of = |e: &Entry| positions.get(&node_key(&e.node)).and_then(|&p| placeholders.get(p)).map(|n| Entry::new(n.clone(), e.index));
    let heads = recording
        .heads
        .iter()
        .map(placeholder_of)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| crate::err!(Runtime, "internal error: a head is not in its graph"))?;
    let head_grad_nodes: Vec<Arc<Node>> = (0..heads.len()).map(|i| Node::variable(format!("head_grad{i}"), Attrs::new())).collect();
    let head_grad_entries: Vec<Entry> = head_grad_nodes.iter().map(|n| Entry::new(n.clone(), 0)).collect();
    let variables: Vec<usize> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| matches!(n, NodeSignature::Leaf { request: Some(r), .. } if *r != GradReq::Null).then_some(i))
        .collect();
    let xs = variables.iter().map(|&p| placeholders.get(p).map(|n| Entry::new(n.clone(), 0))).collect::<Option<Vec<_>>>().unwrap_or_default();
    // Shapes of the placeholders' values: those of the recorded nodes they stand for.
    let position_of: AddressMap<usize, usize> = placeholders.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
    let shape_of = |e: &Entry| -> Option<Shape> {
        let node = recording.forward.get(*position_of.get(&node_key(&e.node))?)?;
        super::recorded_shape(&Entry::new(node.clone(), e.index))
    };
    let grads = gradient::gradient(&heads, &head_grad_entries, &xs, &shape_of)?;

    let mut claims: AddressMap<EntryKey, usize> = AddressMap::default();
    for grad in grads.iter().flatten() {
        *claims.entry(grad.key()).or_default() += 1;
    }
    let written: Vec<(EntryKey, usize)> = grads
        .iter()
        .zip(buffers)
        .enumerate()
        .filter_map(|(i, (grad, (_, req)))| {
            grad.as_ref().filter(|g| *req == GradReq::Write && claims.get(&g.key()) == Some(&1)).map(|g| (g.key(), i))
        })
        .collect();
    let targets: Vec<Entry> = grads.iter().flatten().cloned().collect();
    let external: AddressSet<EntryKey> = written.iter().map(|(key, _)| *key).collect();
    let head_positions: AddressMap<usize, usize> = head_grad_nodes.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
    let resolve = |node: &Arc<Node>| -> Result<Source> {
        if let Some(&i) = head_positions.get(&node_key(node)) {
            let grad = recording.head_grads.get(i).ok_or_else(|| crate::err!(Runtime, "internal error: a head gradient is missing"))?;
            return Ok(Source::Known(vec![grad.clone()]));
        }
        let Some(node) = position_of.get(&node_key(node)).and_then(|&p| recording.forward.get(p)) else {
            return Ok(Source::Compute);
        };
        let known = match &*node.recorded() {
            Recorded::Outputs(outputs) => outputs.clone(),
            Recorded::Leaf { value, .. } => vec![value.clone()],
            Recorded::Nothing => crate::bail!(Value, "{}", super::NOT_IN_GRAPH),
        };
        Ok(Source::Known(known))
    };
    let (graph, values) = executor::compile(&targets, &external, ctx, resolve)?;
    let mut reads: Vec<usize> = values.keys().filter_map(|(node, _)| position_of.get(node).copied()).collect();
    reads.sort_unstable();
    reads.dedup();
    let heads_signature = recording
        .heads
        .iter()
        .zip(recording.head_grads.iter().zip(recording.head_grads_given))
        .map(|(h, (g, &given))| Some((*positions.get(&node_key(&h.node))?, h.index, given, ValueSignature::of(g))))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| crate::err!(Runtime, "internal error: a head is not in its graph"))?;
    Ok(Some(CompiledBackward {
        fingerprint,
        train_mode: recording.train_mode,
        nodes,
        heads: heads_signature,
        placeholders,
        head_grad_nodes,
        reads,
        grads,
        written,
        graph,
    }))
}
