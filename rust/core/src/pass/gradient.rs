//! The gradient pass: from a forward graph, build the graph of its gradients.
//!
//! Walking the forward nodes from the outputs back, each node's output gradients are summed
//! (one `add_n` when a value is used a few times, a chain of in-place adds when it is used many
//! times, as MXNet does), then its operator's gradient definition adds the nodes computing its
//! input gradients. Only nodes on a path to a requested variable are
//! differentiated. The result references forward entries, so whoever runs it supplies their
//! values: recorded ones (autograd) or those the executor computed (Symbol).

use std::sync::{Arc, OnceLock};

use crate::base::Shape;
use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::op::grad::Grad;
use crate::op::Attrs;

/// The annotation naming the device group a node runs in (`mx.AttrScope(ctx_group=...)`).
pub const CTX_GROUP: &str = "__ctx_group__";

/// Gradients of `heads` (weighted by `head_grads`) with respect to each of `xs`; `None` where a
/// variable does not influence the heads (its gradient is zero). `shapes` tells the shapes of
/// forward entries where they are known.
pub fn gradient(heads: &[Entry], head_grads: &[Entry], xs: &[Entry], shapes: &dyn Fn(&Entry) -> Option<Shape>) -> Result<Vec<Option<Entry>>> {
    Ok(gradient_by_node(heads, head_grads, xs, shapes)?.0)
}

/// A symbol's gradient graph as every executor runs it: the variables that stand for its
/// outputs' gradients, and each input's gradient entry in the graph.
pub struct SymbolGradient {
    /// One variable per output of the symbol (named `head_grad{i}`), bound to the output
    /// gradients when the graph runs.
    pub head_grads: Vec<Arc<Node>>,
    /// Per input: its gradient, `None` where it was not asked for or the outputs do not depend
    /// on it.
    pub grads: Vec<Option<Entry>>,
    /// The input gradients of every differentiated forward node, for monitors.
    pub by_node: Vec<NodeGradients>,
}

impl SymbolGradient {
    /// The gradients of `outputs` for the inputs `inputs[i]` with `wanted(i)`. With `mirror`,
    /// cheap forward values are recomputed in the backward pass rather than kept (see
    /// `pass::mirror`); `forward` holds the forward graph's operator nodes.
    pub fn new(
        outputs: &[Entry],
        inputs: &[Arc<Node>],
        wanted: impl Fn(usize) -> bool,
        (forward, mirror): (&AddressSet<usize>, bool),
        shapes: &dyn Fn(&Entry) -> Option<Shape>,
    ) -> Result<SymbolGradient> {
        let head_grads: Vec<Arc<Node>> = (0..outputs.len()).map(|i| Node::variable(format!("head_grad{i}"), Attrs::new())).collect();
        let head_entries: Vec<Entry> = head_grads.iter().map(|n| Entry::new(n.clone(), 0)).collect();
        let wanted: Vec<usize> = (0..inputs.len()).filter(|&i| wanted(i)).collect();
        let xs: Vec<Entry> = wanted.iter().filter_map(|&i| inputs.get(i)).map(|input| Entry::new(input.clone(), 0)).collect();
        let (found, by_node) = gradient_by_node(outputs, &head_entries, &xs, shapes)?;
        let mut grads = vec![None; inputs.len()];
        for (&i, g) in wanted.iter().zip(found) {
            if let Some(slot) = grads.get_mut(i) {
                *slot = g;
            }
        }
        if mirror {
            grads = super::mirror::mirror(&grads, forward);
        }
        Ok(SymbolGradient { head_grads, grads, by_node })
    }

    /// The gradients as targets, the last layer's first: visiting them in this order makes a
    /// schedule follow backpropagation, so each layer's temporaries die before the next layer's
    /// are made.
    pub fn targets(&self) -> Vec<Entry> {
        self.grads.iter().rev().flatten().cloned().collect()
    }

    /// Every output of the `forward` nodes that the gradient graph reads: the values a run
    /// must keep from its forward pass for the backward one.
    pub fn saved(&self, forward: &AddressSet<usize>) -> Vec<Entry> {
        topo_order(&self.targets(), |n| forward.contains(&node_key(n)))
            .into_iter()
            .filter(|n| forward.contains(&node_key(n)))
            .flat_map(|n| (0..n.num_outputs()).map(move |i| Entry::new(n.clone(), i)))
            .collect()
    }
}

/// The input gradients one forward operator node contributes (MXNet's backward node of it).
pub struct NodeGradients {
    pub node: Arc<Node>,
    /// One per input of the node: `None` where its gradient is zero or not needed.
    pub input_grads: Vec<Option<Entry>>,
}

/// [`gradient`], and the input gradients of every differentiated forward node in the order they
/// were built (from the outputs back), for monitors. Nodes the pass creates for a forward node
/// that carries a `__ctx_group__` annotation carry it too, so that an executor placing groups
/// on devices runs a node's gradient where the node runs.
pub fn gradient_by_node(
    heads: &[Entry],
    head_grads: &[Entry],
    xs: &[Entry],
    shapes: &dyn Fn(&Entry) -> Option<Shape>,
) -> Result<(Vec<Option<Entry>>, Vec<NodeGradients>)> {
    let order = topo_order(heads, |_| false);
    let mut by_node = Vec::new();
    let mut known: AddressSet<usize> = order.iter().map(node_key).collect();
    known.extend(head_grads.iter().map(|g| node_key(&g.node)));
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
        mark_created(&out_grads, node, &mut known);
        let needed = node.inputs.iter().map(|e| leads_to_x.contains(&node_key(&e.node))).collect();
        let mut g = Grad::new(&node.inputs, &outputs, &out_grads, &node.name, shapes).with_needed(needed);
        let input_grads = op.operator.gradient(&mut g).map_err(|e| e.context(format!("gradient of operator {} (node '{}')", op.name, node.name)))?;
        if input_grads.len() != node.inputs.len() {
            crate::bail!(
                Runtime,
                "gradient of operator {} returned {} input gradient(s) for {} input(s)",
                op.name,
                input_grads.len(),
                node.inputs.len()
            );
        }
        mark_created(input_grads.iter().flatten(), node, &mut known);
        by_node.push(NodeGradients { node: node.clone(), input_grads: input_grads.clone() });
        for (input, grad) in node.inputs.iter().zip(input_grads) {
            if let Some(grad) = grad {
                if leads_to_x.contains(&node_key(&input.node)) {
                    contributions.entry(input.key()).or_default().push(grad);
                }
            }
        }
    }
    let grads = xs
        .iter()
        .map(|x| {
            let total = contributions.remove(&x.key()).map(|parts| sum(parts, &x.node.name)).transpose()?;
            mark_created(total.iter(), &x.node, &mut known);
            Ok(total)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((grads, by_node))
}

/// Give the nodes behind `entries` that are not `known` yet (those just built for `owner`) the
/// owner's `__ctx_group__`, and make them known.
fn mark_created<'a>(entries: impl IntoIterator<Item = &'a Entry>, owner: &Node, known: &mut AddressSet<usize>) {
    let group = owner.annotations().get(CTX_GROUP).cloned();
    let mut pending: Vec<Arc<Node>> = entries.into_iter().map(|e| e.node.clone()).collect();
    while let Some(node) = pending.pop() {
        if !known.insert(node_key(&node)) {
            continue;
        }
        if let Some(group) = &group {
            node.annotations().insert(CTX_GROUP.to_string(), group.clone());
        }
        pending.extend(node.inputs.iter().map(|e| e.node.clone()));
    }
}

/// From this many contributions on, a gradient is summed by a chain of in-place adds rather than
/// one `add_n` (MXNet's `MXNET_EXEC_INPLACE_GRAD_SUM_CAP`, default 8): `add_n` keeps every
/// contribution alive until the last one exists, which for a weight shared by the steps of an
/// unrolled RNN is one weight-sized array per step; the chain adds each one as it is made.
fn inplace_sum_cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| std::env::var("MXNET_EXEC_INPLACE_GRAD_SUM_CAP").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(8))
}

/// One entry for the sum of several gradient contributions, given in the order backpropagation
/// makes them.
fn sum(parts: Vec<Entry>, name: &str) -> Result<Entry> {
    let mut parts = scale_repeated(parts, name)?;
    if parts.len() == 1 {
        return Ok(parts.swap_remove(0));
    }
    if parts.len() < inplace_sum_cap() {
        let attrs: Attrs = [("num_args".to_string(), parts.len().to_string())].into_iter().collect();
        return Ok(Entry::new(Node::apply("add_n", attrs, parts, format!("{name}_grad_sum"))?, 0));
    }
    let mut parts = parts.into_iter();
    let first = parts.next().ok_or_else(|| crate::err!(Runtime, "internal error: a gradient sum of no contributions"))?;
    parts.enumerate().try_fold(first, |total, (i, part)| {
        Ok(Entry::new(Node::apply("_grad_add", Attrs::new(), vec![total, part], format!("{name}_grad_sum{}", i + 1))?, 0))
    })
}

/// `parts` with each contribution that appears several times given once, multiplied by its
/// count, in the order of first appearance. A value passed on unchanged to many uses (the
/// gradient of `x = x + b` repeated n times reaches `b` n times as one array) is then one
/// product instead of n - 1 additions; the sum is the same up to rounding (one rounding of
/// `n * g` instead of n - 1 of repeated addition).
fn scale_repeated(parts: Vec<Entry>, name: &str) -> Result<Vec<Entry>> {
    let mut counts: AddressMap<EntryKey, usize> = AddressMap::default();
    for part in &parts {
        *counts.entry(part.key()).or_default() += 1;
    }
    if counts.len() == parts.len() {
        return Ok(parts);
    }
    let mut distinct = Vec::with_capacity(counts.len());
    for part in parts {
        match counts.remove(&part.key()) {
            Some(1) => distinct.push(part),
            Some(count) => {
                let attrs: Attrs = [("scalar".to_string(), format!("{:?}", count as f64))].into_iter().collect();
                distinct.push(Entry::new(Node::apply("_mul_scalar", attrs, vec![part], format!("{name}_grad_x{count}"))?, 0));
            }
            None => {}
        }
    }
    Ok(distinct)
}

/// The operator nodes computing gradient `targets` (visited in the order given; the caller lists
/// the last layer's gradients first, so that each layer's temporaries die before the next
/// layer's are made), stopping at the nodes of `forward`, whose values the forward run keeps;
/// accumulations run early (see [`accumulate_early`]).
pub fn backward_schedule(targets: &[Entry], forward: &AddressSet<usize>) -> Vec<Arc<Node>> {
    accumulate_early(
        topo_order(targets, |n| forward.contains(&node_key(n))).into_iter().filter(|n| !n.is_variable() && !forward.contains(&node_key(n))).collect(),
    )
}

/// `steps` (operator nodes in a valid run order) with every step that is the only reader of
/// each of its inputs, all made by earlier steps, and that may write its output over one of them
/// (an accumulation of gradient contributions) moved to run as soon as those inputs exist: that
/// frees the inputs early and never keeps more memory alive. The other steps keep their order.
pub fn accumulate_early(steps: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
    let index: AddressMap<usize, usize> = steps.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
    let mut readers: AddressMap<EntryKey, usize> = AddressMap::default();
    for input in steps.iter().flat_map(|n| n.inputs.iter()) {
        *readers.entry(input.key()).or_default() += 1;
    }
    let eager = |node: &Arc<Node>| {
        node.op.as_ref().is_some_and(|op| !op.operator.inplace_pairs().is_empty() && op.operator.deterministic())
            && !node.inputs.is_empty()
            && node.inputs.iter().all(|e| index.contains_key(&node_key(&e.node)) && readers.get(&e.key()) == Some(&1))
    };
    // For each eager step, how many of its producing steps have yet to run, and the eager steps
    // waiting on each producer.
    let mut waiting = vec![0usize; steps.len()];
    let mut waiters: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for ((i, node), waiting) in steps.iter().enumerate().zip(waiting.iter_mut()) {
        if !eager(node) {
            continue;
        }
        let mut producers: Vec<usize> = node.inputs.iter().filter_map(|e| index.get(&node_key(&e.node)).copied()).collect();
        producers.sort_unstable();
        producers.dedup();
        *waiting = producers.len();
        for p in producers {
            if let Some(waiters) = waiters.get_mut(p) {
                waiters.push(i);
            }
        }
    }
    let mut placed = vec![false; steps.len()];
    let mut order = Vec::with_capacity(steps.len());
    for start in 0..steps.len() {
        // An eager step is placed by its last producer (all producers come before it).
        if placed.get(start) != Some(&false) || waiting.get(start) != Some(&0) {
            continue;
        }
        let mut ready = vec![start];
        while let Some(i) = ready.pop() {
            let (Some(placed), Some(step)) = (placed.get_mut(i), steps.get(i)) else { continue };
            *placed = true;
            order.push(step.clone());
            for &w in waiters.get(i).into_iter().flatten() {
                if let Some(count) = waiting.get_mut(w) {
                    *count -= 1;
                    if *count == 0 {
                        ready.push(w);
                    }
                }
            }
        }
    }
    order
}

fn zeros_like(entry: &Entry, name: &str) -> Result<Entry> {
    Ok(Entry::new(Node::apply("zeros_like", Attrs::new(), vec![entry.clone()], format!("{name}_zero_grad"))?, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::symbol::Symbol;

    fn attrs(pairs: &[(&str, &str)]) -> Attrs {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// `add_n` of `uses` products of one shared weight: the weight's gradient has `uses` parts.
    fn shared_weight(uses: usize) -> (Symbol, Arc<Node>) {
        let weight = Symbol::variable("w", Attrs::new());
        let parts: Vec<Symbol> = (0..uses)
            .map(|i| {
                let x = Symbol::variable(&format!("x{i}"), Attrs::new());
                let fc = attrs(&[("num_hidden", "4"), ("no_bias", "True")]);
                Symbol::create("FullyConnected", fc, &format!("fc{i}"), &[x, weight.clone()], &[]).unwrap()
            })
            .collect();
        let sum = Symbol::create("add_n", attrs(&[("num_args", &uses.to_string())]), "sum", &parts, &[]).unwrap();
        let w = weight.outputs[0].node.clone();
        (sum, w)
    }

    fn weight_gradient_schedule(uses: usize) -> Vec<Arc<Node>> {
        let (symbol, weight) = shared_weight(uses);
        let forward: AddressSet<usize> = symbol.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
        let gradient = SymbolGradient::new(&symbol.outputs, &[weight], |_| true, (&forward, false), &|_| None).unwrap();
        backward_schedule(&gradient.targets(), &forward)
    }

    fn op_name(node: &Node) -> &str {
        node.op.as_ref().map_or("", |op| op.name.as_str())
    }

    #[test]
    fn many_parts_are_added_in_place_as_each_is_made() {
        let steps = weight_gradient_schedule(12);
        let position: AddressMap<usize, usize> = steps.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
        let adds: Vec<&Arc<Node>> = steps.iter().filter(|n| op_name(n) == "_grad_add").collect();
        assert_eq!(adds.len(), 11, "a chain of 11 adds sums 12 parts");
        for add in adds {
            let last_input = add.inputs.iter().map(|e| position[&node_key(&e.node)]).max().unwrap();
            assert_eq!(position[&node_key(add)], last_input + 1, "'{}' runs right after its last input is made", add.name);
        }
        assert!(steps.iter().all(|n| op_name(n) != "add_n"));
    }

    #[test]
    fn a_contribution_repeated_n_times_is_multiplied_by_n() {
        // y = x + b + b + ... (12 additions): every addition passes y's gradient on unchanged,
        // so b receives that one array 12 times.
        let x = Symbol::variable("x", Attrs::new());
        let b = Symbol::variable("b", Attrs::new());
        let y = (0..12).fold(x, |acc, i| Symbol::create("elemwise_add", Attrs::new(), &format!("add{i}"), &[acc, b.clone()], &[]).unwrap());
        let forward: AddressSet<usize> = y.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
        let b_node = b.outputs[0].node.clone();
        let gradient = SymbolGradient::new(&y.outputs, &[b_node], |_| true, (&forward, false), &|_| None).unwrap();
        let steps = backward_schedule(&gradient.targets(), &forward);
        let names: Vec<&str> = steps.iter().map(|n| op_name(n)).collect();
        assert_eq!(names, ["_mul_scalar"], "one product, no sum");
        assert_eq!(steps[0].op.as_ref().unwrap().attrs.get("scalar").map(String::as_str), Some("12.0"));
    }

    #[test]
    fn few_parts_are_summed_by_one_add_n() {
        let steps = weight_gradient_schedule(3);
        assert_eq!(steps.iter().filter(|n| op_name(n) == "add_n").count(), 1);
        assert!(steps.iter().all(|n| op_name(n) != "_grad_add"));
    }
}
