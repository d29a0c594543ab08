//! Common subexpression elimination: operator nodes that compute the same thing (same operator,
//! attributes and inputs) become one node, as MXNet's `EliminateCommonExpr` pass does when an
//! executor is bound (`MXNET_ELIMINATE_COMMON_EXPR`, default on).
//!
//! Nodes that draw random numbers, run user code or update inputs in place are never merged:
//! two of them are two computations. Graph outputs that end up as one value are kept apart by `_copy` nodes, so
//! that each output still has storage of its own.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, Node, NodeOp};
use crate::op::Attrs;

/// Whether the pass runs at bind time (`MXNET_ELIMINATE_COMMON_EXPR`, default on).
pub fn enabled() -> bool {
    std::env::var("MXNET_ELIMINATE_COMMON_EXPR").map_or(true, |v| !matches!(v.trim(), "0" | "false" | "False"))
}

/// What makes two nodes compute the same values: operator, attributes (parameters and
/// annotations) and input entries (by producer node and output index).
type Signature = (String, Vec<(String, String)>, Vec<(usize, usize)>);

/// The graph computing `outputs` with common subexpressions merged. Nodes the pass does not
/// change are shared with the original graph.
pub fn eliminate_common_expr(outputs: &[Entry]) -> Result<Vec<Entry>> {
    // Each node of the original graph -> the node that computes its values in the new one.
    let mut replacement: AddressMap<usize, Arc<Node>> = AddressMap::default();
    let mut by_signature: HashMap<Signature, Arc<Node>> = HashMap::new();
    let current = |replacement: &AddressMap<usize, Arc<Node>>, e: &Entry| {
        Entry::new(replacement.get(&node_key(&e.node)).cloned().unwrap_or_else(|| e.node.clone()), e.index)
    };
    for node in topo_order(outputs, |_| false) {
        let Some(op) = &node.op else { continue };
        let inputs: Vec<Entry> = node.inputs.iter().map(|e| current(&replacement, e)).collect();
        let inputs_changed = inputs.iter().zip(&node.inputs).any(|(new, old)| node_key(&new.node) != node_key(&old.node));
        let rebuilt = if inputs_changed {
            let copy = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
            Node::annotated(copy, inputs.clone(), node.name.clone(), node.annotations().clone())
        } else {
            node.clone()
        };
        let mergeable = op.operator.deterministic() && op.operator.mutated_inputs().is_empty();
        if mergeable {
            let mut attrs: Vec<(String, String)> = op.attrs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            attrs.extend(node.annotations().iter().map(|(k, v)| (format!("annotation:{k}"), v.clone())));
            let signature = (op.name.clone(), attrs, inputs.iter().map(|e| (node_key(&e.node), e.index)).collect());
            if let Some(same) = by_signature.get(&signature) {
                replacement.insert(node_key(&node), same.clone());
                continue;
            }
            by_signature.insert(signature, rebuilt.clone());
        }
        if inputs_changed {
            replacement.insert(node_key(&node), rebuilt);
        }
    }
    let mut seen = AddressSet::default();
    outputs
        .iter()
        .map(|e| {
            let entry = current(&replacement, e);
            if seen.insert(entry.key()) {
                return Ok(entry);
            }
            let name = format!("{}_copy{}", entry.node.name, seen.len());
            Ok(Entry::new(Node::apply("_copy", Attrs::new(), vec![entry], name)?, 0))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbol::Symbol;

    fn add(a: &Symbol, b: &Symbol, name: &str) -> Symbol {
        Symbol::create("elemwise_add", Attrs::new(), name, &[a.clone(), b.clone()], &[]).unwrap()
    }

    #[test]
    fn equal_computations_merge_and_duplicate_outputs_get_copies() {
        let (a, b) = (Symbol::variable("a", Attrs::new()), Symbol::variable("b", Attrs::new()));
        let twice = add(&add(&a, &b, "p"), &add(&a, &b, "q"), "sum");
        let merged = Symbol { outputs: eliminate_common_expr(&twice.outputs).unwrap() };
        assert_eq!(merged.internals().outputs.len() + 1, twice.internals().outputs.len());
        let pair = Symbol::group(&[add(&a, &b, "x"), add(&a, &b, "y")]);
        let merged = Symbol { outputs: eliminate_common_expr(&pair.outputs).unwrap() };
        assert_ne!(merged.outputs[0].key(), merged.outputs[1].key());
        assert_eq!(merged.internals().outputs.len(), pair.internals().outputs.len());
    }
}
