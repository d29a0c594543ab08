//! Shape and dtype inference over a graph, in both directions.
//!
//! Forward, each operator computes its output shapes once all its input shapes are known.
//! Backward, an operator fills in the shapes of unknown variables among its inputs from the ones
//! it knows (a FullyConnected weight from its data), which is how `simple_bind` needs only the
//! data shape. Shapes may also be partly known (MXNet's 0 or -1 dimensions: `var('a', shape=(0,
//! 10))`): operators refine such shapes in both directions, so `(0, 10) + (12, 0)` makes both
//! operands `(12, 10)`. The steps alternate until nothing changes. A creation op whose `shape`
//! has unknown (0) dimensions (`zeros(shape=(2, 0, 8))` for a begin state whose batch size comes
//! from the data) takes those dimensions from its consumer instead of computing them.

use crate::base::{merge_partial, DType, PartialShape, Shape};
use crate::error::Result;
use crate::graph::{topo_order, AddressMap, Entry, EntryKey, Node};

/// Inferred values by entry; entries that could not be inferred are absent.
pub type Inferred<T> = AddressMap<EntryKey, T>;

/// Shapes of every entry reachable from `outputs` that can be inferred from the variables'
/// shapes `given` (`None`: unknown). Only fully known shapes are kept.
pub fn infer_shapes(outputs: &[Entry], given: &dyn Fn(&Node) -> Option<Shape>) -> Result<Inferred<Shape>> {
    let partial = infer_partial_shapes(outputs, &|n: &Node| given(n).map(|s| PartialShape::from(&s)))?;
    Ok(partial.into_iter().filter_map(|(key, shape)| Some((key, shape.full()?))).collect())
}

/// Shapes of every entry reachable from `outputs`, as far as the variables' partly known shapes
/// `given` determine them: entries of unknown rank are absent, unknown dimensions are `None`.
///
/// Each operator node is visited until nothing changes. With every input shape known it computes
/// its outputs; otherwise it first fills in unknown variable inputs it can derive (a weight
/// from its data), then refines inputs and outputs from each other
/// ([`Operator::infer_partial_shapes`](crate::op::Operator::infer_partial_shapes)): what a consumer needs flows back to its producers.
pub fn infer_partial_shapes(outputs: &[Entry], given: &dyn Fn(&Node) -> Option<PartialShape>) -> Result<Inferred<PartialShape>> {
    let order = topo_order(outputs, |_| false);
    let mut known: Inferred<PartialShape> = AddressMap::default();
    for node in order.iter().filter(|n| n.is_variable()) {
        if let Some(shape) = given(node) {
            known.insert(Entry::new(node.clone(), 0).key(), shape);
        }
    }
    loop {
        let mut changed = false;
        for node in order.iter().filter(|n| !n.is_variable()) {
            let op = node.op.as_ref().expect("operator node");
            let out_entries: Vec<Entry> = (0..node.num_outputs()).map(|i| Entry::new(node.clone(), i)).collect();
            let mut inputs: Vec<Option<PartialShape>> = node.inputs.iter().map(|e| known.get(&e.key()).cloned()).collect();
            let mut outs: Vec<Option<PartialShape>> = out_entries.iter().map(|e| known.get(&e.key()).cloned()).collect();
            let all_full = |shapes: &[Option<PartialShape>]| shapes.iter().all(|s| s.as_ref().is_some_and(PartialShape::is_full));
            if all_full(&inputs) && all_full(&outs) {
                continue;
            }
            let (inputs_before, outs_before) = (inputs.clone(), outs.clone());
            refine_node(node, &mut inputs, &mut outs).map_err(|e| in_node(e, node))?;
            if let Some(creation) = op.operator.partial_output_shapes() {
                // A creation op with unknown (0) dimensions: its consumers complete them.
                for (slot, shape) in outs.iter_mut().zip(&creation) {
                    let declared = PartialShape(shape.dims().iter().map(|&d| (d > 0).then_some(d)).collect());
                    merge_partial(slot, &declared).map_err(|e| in_node(e, node))?;
                }
            } else if all_full(&inputs) {
                let full: Vec<Shape> = inputs.iter().map(|s| s.as_ref().and_then(PartialShape::full).expect("all inputs known")).collect();
                let computed = op.operator.infer_shape(&full).map_err(|e| in_node(e, node).context(describe_shapes(&full)))?;
                for (slot, shape) in outs.iter_mut().zip(&computed) {
                    merge_partial(slot, &PartialShape::from(shape))
                        .map_err(|e| in_node(e, node).context("the shape computed from the inputs disagrees with the shape its consumers need"))?;
                }
            }
            for (entry, (after, before)) in
                node.inputs.iter().chain(&out_entries).zip(inputs.into_iter().chain(outs).zip(inputs_before.iter().chain(&outs_before)))
            {
                if after != *before {
                    if let Some(shape) = after {
                        known.insert(entry.key(), shape);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            return Ok(known);
        }
    }
}

/// One node's inference step while some input is not fully known: the operator's completion of
/// unknown variable inputs (in full), then its two-way partial inference.
fn refine_node(node: &Node, inputs: &mut [Option<PartialShape>], outputs: &mut [Option<PartialShape>]) -> Result<()> {
    let op = node.op.as_ref().expect("operator node");
    if inputs.iter().any(|s| !s.as_ref().is_some_and(PartialShape::is_full)) {
        let mut full: Vec<Option<Shape>> = inputs.iter().map(|s| s.as_ref().and_then(PartialShape::full)).collect();
        op.operator.complete_input_shapes(&mut full)?;
        for ((slot, completed), entry) in inputs.iter_mut().zip(&full).zip(&node.inputs) {
            let Some(completed) = completed else { continue };
            let completed = PartialShape::from(completed);
            // A variable takes what its consumer needs; another operator's output only where
            // it agrees with what is known of it (its producer has the last word).
            if entry.node.is_variable() || slot.as_ref().is_some_and(|known| known.clone().merge(&completed).is_ok()) {
                merge_partial(slot, &completed)?;
            }
        }
        op.operator.infer_partial_shapes(inputs, outputs)?;
    }
    Ok(())
}

/// Dtypes of every entry reachable from `outputs`; variables without a given dtype take the
/// dtype their consumers expect (float32 by default).
pub fn infer_types(outputs: &[Entry], given: &dyn Fn(&Node) -> Option<DType>) -> Result<Inferred<DType>> {
    let order = topo_order(outputs, |_| false);
    let mut known: Inferred<DType> = AddressMap::default();
    for node in order.iter().filter(|n| n.is_variable()) {
        if let Some(v) = given(node) {
            known.insert(Entry::new(node.clone(), 0).key(), v);
        }
    }
    loop {
        let mut changed = false;
        for node in order.iter().filter(|n| !n.is_variable()) {
            let op = node.op.as_ref().expect("operator node");
            let out_keys: Vec<EntryKey> = (0..node.num_outputs()).map(|i| Entry::new(node.clone(), i).key()).collect();
            if out_keys.iter().all(|k| known.contains_key(k)) {
                continue;
            }
            let mut inputs: Vec<Option<DType>> = node.inputs.iter().map(|e| known.get(&e.key()).copied()).collect();
            if inputs.iter().any(Option::is_none) {
                op.operator.complete_input_types(&mut inputs);
                for (entry, value) in node.inputs.iter().zip(&inputs) {
                    if let Some(v) = value {
                        if entry.node.is_variable() && !known.contains_key(&entry.key()) {
                            known.insert(entry.key(), *v);
                            changed = true;
                        }
                    }
                }
            }
            let inputs: Vec<DType> = node.inputs.iter().filter_map(|e| known.get(&e.key()).copied()).collect();
            if inputs.len() < node.inputs.len() {
                if let Some(fixed) = op.operator.fixed_output_types() {
                    for (key, value) in out_keys.into_iter().zip(fixed) {
                        known.insert(key, value);
                    }
                    changed = true;
                }
            } else {
                let computed = op.operator.infer_type(&inputs).map_err(|e| in_node(e, node))?;
                for (key, value) in out_keys.into_iter().zip(computed) {
                    known.insert(key, value);
                }
                changed = true;
            }
        }
        if !changed {
            return Ok(known);
        }
    }
}

fn in_node(e: crate::Error, node: &Node) -> crate::Error {
    let op = node.op.as_ref().map_or("variable", |o| o.name.as_str());
    e.context(format!("inferring node '{}' (operator {op})", node.name))
}

fn describe_shapes(shapes: &[Shape]) -> String {
    format!("input shapes: {}", shapes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Attrs;
    use crate::symbol::Symbol;

    fn attrs(pairs: &[(&str, &str)]) -> Attrs {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn weights_are_inferred_from_data() {
        let data = Symbol::variable("data", Attrs::new());
        let fc = Symbol::create("FullyConnected", attrs(&[("num_hidden", "7")]), "fc", &[data], &[]).unwrap();
        let shapes = infer_shapes(&fc.outputs, &|n| (n.name == "data").then(|| Shape::from(vec![3, 5]))).unwrap();
        let args = fc.list_arguments();
        assert_eq!(args, ["data", "fc_weight", "fc_bias"]);
        let by_name = |name: &str| {
            let node = fc.input_nodes().into_iter().find(|n| n.name == name).unwrap();
            shapes[&Entry::new(node, 0).key()].clone()
        };
        assert_eq!(by_name("fc_weight"), Shape::from(vec![7, 5]));
        assert_eq!(by_name("fc_bias"), Shape::from(vec![7]));
        assert_eq!(shapes[&fc.outputs[0].key()], Shape::from(vec![3, 7]));
    }

    #[test]
    fn unknown_shapes_stay_unknown_and_errors_name_the_node() {
        let data = Symbol::variable("data", Attrs::new());
        let fc = Symbol::create("FullyConnected", attrs(&[("num_hidden", "7")]), "fc", std::slice::from_ref(&data), &[]).unwrap();
        let partial = infer_shapes(&fc.outputs, &|_| None).unwrap();
        assert!(!partial.contains_key(&fc.outputs[0].key()));
        let other = Symbol::variable("other", Attrs::new());
        let sum = Symbol::create("elemwise_add", Attrs::new(), "plus", &[data, other], &[]).unwrap();
        let err = infer_shapes(&sum.outputs, &|n| Some(Shape::from(if n.name == "data" { vec![2, 3] } else { vec![3, 2] }))).err().unwrap();
        assert!(err.to_string().contains("'plus'"), "{err}");
    }

    #[test]
    fn partial_creation_shapes_are_completed_by_their_consumer() {
        let data = Symbol::variable("data", Attrs::new());
        let params = Symbol::variable("params", Attrs::new());
        let state = Symbol::create("_zeros", attrs(&[("shape", "(1, 0, 6)")]), "h0", &[], &[]).unwrap();
        let rnn_attrs = attrs(&[("mode", "rnn_tanh"), ("state_size", "6"), ("num_layers", "1")]);
        let rnn = Symbol::create("RNN", rnn_attrs, "rnn", &[data, params, state.clone()], &[]).unwrap();
        let shapes = infer_shapes(&rnn.outputs, &|n| (n.name == "data").then(|| Shape::from(vec![5, 3, 4]))).unwrap();
        assert_eq!(shapes[&state.outputs[0].key()], Shape::from(vec![1, 3, 6]));
        assert_eq!(shapes[&rnn.outputs[0].key()], Shape::from(vec![5, 3, 6]));
        let unknown = infer_shapes(&state.outputs, &|_| None).unwrap();
        assert!(!unknown.contains_key(&state.outputs[0].key()));
    }

    #[test]
    fn dtypes_default_to_float32_and_follow_known_inputs() {
        let data = Symbol::variable("data", Attrs::new());
        let fc = Symbol::create("FullyConnected", attrs(&[("num_hidden", "2")]), "fc", &[data], &[]).unwrap();
        let types = infer_types(&fc.outputs, &|n| (n.name == "data").then_some(DType::F64)).unwrap();
        assert_eq!(types[&fc.outputs[0].key()], DType::F64);
        let types = infer_types(&fc.outputs, &|_| None).unwrap();
        assert_eq!(types[&fc.outputs[0].key()], DType::F32);
    }
}
