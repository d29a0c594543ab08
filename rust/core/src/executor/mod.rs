//! Running a graph: each node's operator is pushed onto the engine in dependency order, its
//! outputs written into the storage a static memory plan gives them (`plan`), so values whose
//! lifetimes do not overlap share memory (the engine orders a later writer after the earlier
//! readers of the same block).
// Graphs from programs and files run here: no unwrap and no unchecked indexing, so that bad
// input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod bound;
mod cached;
pub mod control_flow;
mod plan;

pub use bound::BoundExecutor;
pub use cached::{CachedOp, CachedOpFlags};
pub use plan::{Layout, LayoutRequest, Schedule, StepObserver};

use std::sync::Arc;

use crate::autograd;
use crate::base::Context;
use crate::error::Result;
use crate::graph::{address, node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::ndarray::NDArray;
use crate::op::Operator;
use crate::pass::infer::infer_shapes;
use crate::symbol::output_name;

/// How the runner obtains a node's values.
pub enum Source {
    /// Known values, one per output.
    Known(Vec<NDArray>),
    /// Compute the node from its inputs.
    Compute,
}

/// An array a monitor reports: MXNet's name for it and the operator of its node.
pub struct Monitored {
    pub name: String,
    pub op: String,
    pub array: NDArray,
}

/// What MXNet's monitors and op hooks report for one operator node run: with `with_inputs`,
/// each input as `<node>_<input name>` (`<node>_input<i>` for operators that declare no input
/// names), then each visible output under its symbol output name (`<node>_output`).
pub fn monitor_node(node: &Arc<Node>, inputs: &[NDArray], outputs: &[NDArray], with_inputs: bool, report: &mut Vec<Monitored>) {
    let Some(op) = &node.op else { return };
    if with_inputs {
        let names = if op.operator.declares_input_names() { op.operator.input_names() } else { Default::default() };
        for (i, array) in inputs.iter().enumerate() {
            let input = names.get(i).cloned().unwrap_or_else(|| format!("input{i}"));
            report.push(Monitored { name: format!("{}_{input}", node.name), op: op.name.clone(), array: array.clone() });
        }
    }
    for (i, array) in outputs.iter().take(op.operator.num_visible_outputs()).enumerate() {
        report.push(Monitored { name: output_name(&Entry::new(node.clone(), i)), op: op.name.clone(), array: array.clone() });
    }
}

/// A recorded graph (autograd's backward, a control-flow body) compiled for the shapes, dtypes
/// and devices of the values it starts from: its steps, with their output shapes fixed, and a
/// memory plan. It runs again on other values of the same signature (autograd keeps those of
/// repeated backward passes).
pub struct CompiledGraph {
    targets: Vec<Entry>,
    schedule: Schedule,
    /// The memory plan; `None` for a recording run (a backward with create_graph keeps every
    /// value it computes for the next differentiation: nothing may share memory then).
    layout: Option<Layout>,
    /// The device of each step.
    contexts: AddressMap<usize, Context>,
    ctx: Context,
}

/// Compile the graph computing `targets`. `resolve` says, once per node, whether its values are
/// known; nodes it asks to compute must have an operator. `destinations` are the targets the
/// caller provides storage for. Returns the compiled graph and the known values to run it on.
pub fn compile(
    targets: &[Entry],
    destinations: &AddressSet<EntryKey>,
    ctx: Context,
    mut resolve: impl FnMut(&Arc<Node>) -> Result<Source>,
) -> Result<(CompiledGraph, AddressMap<EntryKey, NDArray>)> {
    let mut values: AddressMap<EntryKey, NDArray> = AddressMap::default();
    let mut failure = None;
    let order = topo_order(targets, |node| match resolve(node) {
        Ok(Source::Known(arrays)) => {
            for (i, a) in arrays.into_iter().enumerate() {
                values.insert((node_key(node), i), a);
            }
            true
        }
        Ok(Source::Compute) => false,
        Err(e) => {
            failure.get_or_insert(e);
            true
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let computed = |node: &Arc<Node>| !values.contains_key(&(node_key(node), 0));
    let to_compute: Vec<&Arc<Node>> = order.iter().filter(|n| computed(n)).collect();
    if let Some(variable) = to_compute.iter().find(|n| n.op.is_none()) {
        crate::bail!(Value, "variable '{}' has no value", variable.name);
    }
    let mut schedule = Schedule::new(crate::pass::gradient::accumulate_early(to_compute.iter().map(|n| (*n).clone()).collect()));
    schedule.completed = complete_partial_operators(targets, &to_compute, &values)?;
    let inferred = schedule.infer_locally(&values, ctx);
    schedule.fix_outputs(&inferred.shapes, &inferred.types);
    let layout = (!autograd::is_recording()).then(|| {
        let pinned: AddressSet<EntryKey> = targets.iter().map(Entry::key).collect();
        let context_of = |n: &Node| inferred.contexts.get(&address(n)).copied().unwrap_or(ctx);
        Layout::plan(&LayoutRequest {
            steps: schedule.nodes(),
            shapes: &inferred.shapes,
            types: &inferred.types,
            pinned: &pinned,
            external: destinations,
            context: &context_of,
        })
    });
    let graph = CompiledGraph { targets: targets.to_vec(), schedule, layout, contexts: inferred.contexts, ctx };
    Ok((graph, values))
}

impl CompiledGraph {
    /// The targets' values, computed from `values` (the known values, by the keys of the nodes
    /// the graph was compiled with), writing the targets in `destinations` into those arrays.
    pub fn run(&self, mut values: AddressMap<EntryKey, NDArray>, destinations: &AddressMap<EntryKey, NDArray>) -> Result<Vec<NDArray>> {
        let mut storage = match &self.layout {
            Some(layout) => layout.storage(&layout.allocate(0..layout.block_count())?)?,
            None => AddressMap::default(),
        };
        storage.extend(destinations.iter().map(|(k, a)| (*k, a.clone())));
        let context_of = |n: &Node| self.contexts.get(&address(n)).copied().unwrap_or(self.ctx);
        self.schedule.run(&mut values, &storage, &context_of, None)?;
        self.targets.iter().map(|t| value_of(&values, t).cloned()).collect()
    }
}

/// The value a run computed for `entry`.
fn value_of<'a>(values: &'a AddressMap<EntryKey, NDArray>, entry: &Entry) -> Result<&'a NDArray> {
    values.get(&entry.key()).ok_or_else(|| crate::err!(Runtime, "graph output of node '{}' was not computed", entry.node.name))
}

/// Values of `targets`, compiled and planned for this one run (see [`compile`]).
pub fn run(
    targets: &[Entry],
    destinations: &AddressMap<EntryKey, NDArray>,
    ctx: Context,
    resolve: impl FnMut(&Arc<Node>) -> Result<Source>,
) -> Result<Vec<NDArray>> {
    let external: AddressSet<EntryKey> = destinations.keys().copied().collect();
    let (graph, values) = compile(targets, &external, ctx, resolve)?;
    graph.run(values, destinations)
}

/// Operators for the nodes whose output shapes have unknown dimensions (`zeros(shape=(2, 0, 8))`),
/// completed from the shapes the graph infers from the known values.
fn complete_partial_operators(
    targets: &[Entry],
    to_compute: &[&Arc<Node>],
    known: &AddressMap<EntryKey, NDArray>,
) -> Result<AddressMap<usize, Arc<dyn Operator>>> {
    let is_partial = |n: &Arc<Node>| n.op.as_ref().is_some_and(|op| op.operator.partial_output_shapes().is_some());
    if !to_compute.iter().any(|n| is_partial(n)) {
        return Ok(AddressMap::default());
    }
    let shapes = infer_shapes(targets, &|n: &Node| known.get(&(address(n), 0)).map(|a| a.shape().clone()))?;
    let mut partial = Schedule::new(to_compute.iter().filter(|n| is_partial(n)).map(|n| (*n).clone()).collect());
    partial.complete(&shapes)?;
    Ok(partial.completed)
}
