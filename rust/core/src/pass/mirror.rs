//! Mirroring (`MXNET_BACKWARD_DO_MIRROR=1`): the backward graph's reads of cheap forward values
//! are redirected to copies of their nodes that recompute them during backward, so those values
//! die right after their forward consumers instead of living until backward, trading compute for
//! memory. A chain of cheap nodes is recomputed as a chain from its first expensive input.

use std::sync::Arc;

use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, Node, NodeOp, Recorded};

/// Whether `MXNET_BACKWARD_DO_MIRROR=1` asks for mirroring.
pub fn enabled() -> bool {
    std::env::var("MXNET_BACKWARD_DO_MIRROR").is_ok_and(|v| v.trim() == "1")
}

/// A forward node cheap and pure enough to recompute: an element-wise operator or activation
/// without randomness, hidden outputs or state updates. (MXNet exempts FullyConnected,
/// Convolution, Concat, SoftmaxOutput and Dropout; none of those qualifies here either, nor does
/// BatchNorm, which updates its running statistics in the forward pass.)
fn recomputable(node: &Node) -> bool {
    let Some(op) = &node.op else { return false };
    let o = &op.operator;
    let cheap = o.elementwise().is_some() || matches!(op.name.as_str(), "Activation" | "LeakyReLU" | "softmax" | "log_softmax");
    cheap && !o.needs_rng() && o.mutated_inputs().is_empty() && o.num_outputs() == o.num_visible_outputs()
}

/// Rewrites gradient entries (which read forward values of the nodes in `forward`) so that
/// reads of recomputable forward nodes go to mirrored copies evaluated in backward.
pub fn mirror(grads: &[Option<Entry>], forward: &AddressSet<usize>) -> Vec<Option<Entry>> {
    let targets: Vec<Entry> = grads.iter().flatten().cloned().collect();
    let order = topo_order(&targets, |n| forward.contains(&node_key(n)));
    let mut copies: AddressMap<usize, Arc<Node>> = AddressMap::default();
    let mut rebuilt: AddressMap<usize, Arc<Node>> = AddressMap::default();
    for node in &order {
        if node.is_variable() || forward.contains(&node_key(node)) {
            continue;
        }
        let inputs: Vec<Entry> = node
            .inputs
            .iter()
            .map(|e| {
                let key = node_key(&e.node);
                if forward.contains(&key) {
                    Entry::new(mirror_node(&e.node, forward, &mut copies), e.index)
                } else if let Some(r) = rebuilt.get(&key) {
                    Entry::new(r.clone(), e.index)
                } else {
                    e.clone()
                }
            })
            .collect();
        if inputs.iter().zip(&node.inputs).any(|(a, b)| !Arc::ptr_eq(&a.node, &b.node)) {
            rebuilt.insert(node_key(node), copy_with_inputs(node, inputs, node.name.clone()));
        }
    }
    grads
        .iter()
        .map(|g| {
            g.as_ref().map(|e| match rebuilt.get(&node_key(&e.node)) {
                Some(r) => Entry::new(r.clone(), e.index),
                None => e.clone(),
            })
        })
        .collect()
}

/// The recomputing copy of a forward node (itself when it is not recomputable), memoized so that
/// every backward reader shares one copy.
fn mirror_node(node: &Arc<Node>, forward: &AddressSet<usize>, copies: &mut AddressMap<usize, Arc<Node>>) -> Arc<Node> {
    if !recomputable(node) {
        return node.clone();
    }
    if let Some(copy) = copies.get(&node_key(node)) {
        return copy.clone();
    }
    let inputs = node
        .inputs
        .iter()
        .map(|e| if forward.contains(&node_key(&e.node)) { Entry::new(mirror_node(&e.node, forward, copies), e.index) } else { e.clone() })
        .collect();
    let copy = copy_with_inputs(node, inputs, format!("{}_mirror", node.name));
    copies.insert(node_key(node), copy.clone());
    copy
}

fn copy_with_inputs(node: &Node, inputs: Vec<Entry>, name: String) -> Arc<Node> {
    let op = node.op.as_ref().expect("only operator nodes are copied");
    let op = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
    Node::with_operator(op, inputs, name, Recorded::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Attrs;

    fn apply(op: &str, inputs: Vec<Entry>, name: &str) -> Entry {
        Entry::new(Node::apply(op, Attrs::new(), inputs, name).unwrap(), 0)
    }

    #[test]
    fn backward_reads_of_cheap_nodes_move_to_copies() {
        let x = Entry::new(Node::variable("x", Attrs::new()), 0);
        let s = apply("sigmoid", vec![x.clone()], "s");
        let y = apply("elemwise_mul", vec![x.clone(), s.clone()], "y");
        let expensive = apply("dot", vec![y.clone(), y.clone()], "d");
        // A stand-in backward node reading the forward values s and d.
        let grad = apply("elemwise_add", vec![s.clone(), expensive.clone()], "g");
        let forward: AddressSet<usize> = [&s, &y, &expensive].iter().map(|e| node_key(&e.node)).collect();
        let out = mirror(&[Some(grad.clone()), None], &forward);
        let rewritten = out[0].clone().unwrap();
        assert!(!Arc::ptr_eq(&rewritten.node, &grad.node));
        assert_eq!(rewritten.node.inputs[0].node.name, "s_mirror");
        assert!(Arc::ptr_eq(&rewritten.node.inputs[0].node.inputs[0].node, &x.node));
        // The expensive dot is read as computed in the forward pass.
        assert!(Arc::ptr_eq(&rewritten.node.inputs[1].node, &expensive.node));
        assert!(out[1].is_none());
    }
}
