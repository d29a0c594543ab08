//! The gradient pass: from a forward graph, build the graph of its gradients.
//!
//! Walking the forward nodes from the outputs back, each node's output gradients are summed
//! (one `add_n` when a value is used several times), then its operator's gradient definition adds
//! the nodes computing its input gradients. Only nodes on a path to a requested variable are
//! differentiated. The result references forward entries, so whoever runs it supplies their
//! values: recorded ones (autograd) or those the executor computed (Symbol).


use crate::base::Shape;
use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::op::grad::Grad;
use crate::op::Attrs;

/// Gradients of `heads` (weighted by `head_grads`) with respect to each of `xs`; `None` where a
/// variable does not influence the heads (its gradient is zero). `shapes` tells the shapes of
/// forward entries where they are known.
pub fn gradient(
    heads: &[Entry],
    head_grads: &[Entry],
    xs: &[Entry],
    shapes: &dyn Fn(&Entry) -> Option<Shape>,
) -> Result<Vec<Option<Entry>>> {
    let order = topo_order(heads, |_| false);
    let wanted: AddressSet<usize> = xs.iter().map(|x| node_key(&x.node)).collect();
    let mut leads_to_x: AddressSet<usize> = AddressSet::default();
    for node in &order {
        let key = node_key(node);
        if wanted.contains(&key) || node.inputs.iter().any(|e| leads_to_x.contains(&node_key(&e.node))) {
            leads_to_x.insert(key);
        }
    }

    let mut contributions: AddressMap<EntryKey, Vec<Entry>> = AddressMap::default();
    for (head, grad) in heads.iter().zip(head_grads) {
        contributions.entry(head.key()).or_default().push(grad.clone());
    }
    for node in order.iter().rev() {
        let Some(op) = &node.op else { continue };
        if !leads_to_x.contains(&node_key(node)) {
            continue;
        }
        let outputs: Vec<Entry> = (0..node.num_outputs()).map(|i| Entry::new(node.clone(), i)).collect();
        if !outputs.iter().any(|o| contributions.contains_key(&o.key())) {
            continue;
        }
        let out_grads = outputs
            .iter()
            .map(|o| match contributions.remove(&o.key()) {
                Some(parts) => sum(parts, &node.name),
                None => zeros_like(o, &node.name),
            })
            .collect::<Result<Vec<_>>>()?;
        let needed = node.inputs.iter().map(|e| leads_to_x.contains(&node_key(&e.node))).collect();
        let mut g = Grad::new(&node.inputs, &outputs, &out_grads, &node.name, shapes).with_needed(needed);
        let input_grads = op
            .operator
            .gradient(&mut g)
            .map_err(|e| e.context(format!("gradient of operator {} (node '{}')", op.name, node.name)))?;
        if input_grads.len() != node.inputs.len() {
            crate::bail!(
                Runtime,
                "gradient of operator {} returned {} input gradient(s) for {} input(s)",
                op.name,
                input_grads.len(),
                node.inputs.len()
            );
        }
        for (input, grad) in node.inputs.iter().zip(input_grads) {
            if let Some(grad) = grad {
                if leads_to_x.contains(&node_key(&input.node)) {
                    contributions.entry(input.key()).or_default().push(grad);
                }
            }
        }
    }
    xs.iter().map(|x| contributions.remove(&x.key()).map(|parts| sum(parts, &x.node.name)).transpose()).collect()
}

/// One entry for the sum of several gradient contributions.
fn sum(mut parts: Vec<Entry>, name: &str) -> Result<Entry> {
    if parts.len() == 1 {
        return Ok(parts.swap_remove(0));
    }
    let attrs: Attrs = [("num_args".to_string(), parts.len().to_string())].into_iter().collect();
    Ok(Entry::new(Node::apply("add_n", attrs, parts, format!("{name}_grad_sum"))?, 0))
}

fn zeros_like(entry: &Entry, name: &str) -> Result<Entry> {
    Ok(Entry::new(Node::apply("zeros_like", Attrs::new(), vec![entry.clone()], format!("{name}_zero_grad"))?, 0))
}
