//! Running a graph: each node's operator is pushed onto the engine in dependency order, and
//! every intermediate value is released right after its last consumer has been pushed (the
//! engine keeps what a pending kernel still reads alive until it has run).

mod bound;
mod cached;
pub mod control_flow;
mod plan;

pub use bound::BoundExecutor;
pub use cached::{CachedOp, CachedOpFlags};
pub use plan::{Layout, LayoutRequest, Schedule, StepObserver};

use std::sync::Arc;

use crate::base::Context;
use crate::error::Result;
use crate::graph::{address, node_key, topo_order, AddressMap, Entry, EntryKey, Node};
use crate::imperative;
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

/// Values of `targets`. `resolve` says, once per node, whether its values are known; nodes it
/// asks to compute must have an operator. This is the runner of recorded (imperative) graphs,
/// which run once; compiled graphs run a [`Schedule`] over a [`Layout`].
pub fn run(
    targets: &[Entry],
    destinations: &AddressMap<EntryKey, NDArray>,
    ctx: Context,
    mut resolve: impl FnMut(&Arc<Node>) -> Result<Source>,
) -> Result<Vec<NDArray>> {
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

    let mut uses: AddressMap<EntryKey, usize> = AddressMap::default();
    for node in &to_compute {
        for input in &node.inputs {
            *uses.entry(input.key()).or_default() += 1;
        }
    }
    for t in targets {
        *uses.entry(t.key()).or_default() += 1;
    }

    let completed = complete_partial_operators(targets, &to_compute, &values)?;
    for node in to_compute {
        let Some(op) = &node.op else {
            crate::bail!(Value, "variable '{}' has no value", node.name);
        };
        let inputs = node
            .inputs
            .iter()
            .map(|e| values.get(&e.key()).cloned().ok_or_else(|| crate::err!(Runtime, "value of an input of node '{}' is missing", node.name)))
            .collect::<Result<Vec<_>>>()?;
        let operator = completed.get(&node_key(node)).unwrap_or(&op.operator);
        let written: Vec<Option<NDArray>> = if destinations.is_empty() {
            Vec::new()
        } else {
            (0..node.num_outputs()).map(|i| destinations.get(&(node_key(node), i)).cloned()).collect()
        };
        let outputs = match operator.run_on_host(&inputs, &written) {
            Some(result) => result.map_err(|e| e.context(format!("node '{}' ({})", node.name, op.name)))?,
            None if written.iter().any(Option::is_some) => {
                imperative::invoke_operator_into(&op.name, operator.clone(), &op.attrs, &inputs, written, ctx)
                    .map_err(|e| e.context(format!("node '{}'", node.name)))?
            }
            None => imperative::invoke_operator(&op.name, operator.clone(), &op.attrs, &inputs, None, ctx, None)
                .map_err(|e| e.context(format!("node '{}'", node.name)))?,
        };
        for input in &node.inputs {
            let key = input.key();
            if let Some(n) = uses.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    values.remove(&key);
                }
            }
        }
        for (i, out) in outputs.into_iter().enumerate() {
            let key = (node_key(node), i);
            if uses.get(&key).is_some_and(|&n| n > 0) {
                values.insert(key, out);
            }
        }
    }
    targets
        .iter()
        .map(|t| values.get(&t.key()).cloned().ok_or_else(|| crate::err!(Runtime, "graph output of node '{}' was not computed", t.node.name)))
        .collect()
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
