//! Shape and dtype inference over a graph, in both directions.
//!
//! Forward, each operator computes its output shapes once all its input shapes are known.
//! Backward, an operator fills in the shapes of unknown variables among its inputs from the ones
//! it knows (a FullyConnected weight from its data), which is how `simple_bind` needs only the
//! data shape. The two alternate until nothing changes. A creation op whose `shape` has unknown
//! (0) dimensions, as MXNet 1.x symbols allow (`zeros(shape=(2, 0, 8))` for a begin state whose
//! batch size comes from the data), takes its shape from its consumer instead of computing it.

use crate::base::{DType, Shape};
use crate::error::Result;
use crate::graph::{topo_order, AddressMap, Entry, EntryKey, Node};

/// Inferred values by entry; entries that could not be inferred are absent.
pub type Inferred<T> = AddressMap<EntryKey, T>;

/// Shapes of every entry reachable from `outputs` that can be inferred from the variables'
/// shapes `given` (`None`: unknown).
pub fn infer_shapes(outputs: &[Entry], given: &dyn Fn(&Node) -> Option<Shape>) -> Result<Inferred<Shape>> {
    infer(
        outputs,
        given,
        |node, inputs| {
            let op = node.op.as_ref().expect("operator node");
            op.operator.complete_input_shapes(inputs).map_err(|e| in_node(e, node))
        },
        |node, inputs| {
            let op = node.op.as_ref().expect("operator node");
            op.operator.infer_shape(inputs).map_err(|e| in_node(e, node).context(describe_shapes(inputs)))
        },
        |node| node.op.as_ref().and_then(|op| op.operator.partial_output_shapes()),
    )
}

/// Dtypes of every entry reachable from `outputs`; variables without a given dtype take the
/// dtype their consumers expect (float32 by default).
pub fn infer_types(outputs: &[Entry], given: &dyn Fn(&Node) -> Option<DType>) -> Result<Inferred<DType>> {
    infer(
        outputs,
        given,
        |node, inputs| {
            node.op.as_ref().expect("operator node").operator.complete_input_types(inputs);
            Ok(())
        },
        |node, inputs| node.op.as_ref().expect("operator node").operator.infer_type(inputs).map_err(|e| in_node(e, node)),
        |_| None,
    )
}

fn in_node(e: crate::Error, node: &Node) -> crate::Error {
    let op = node.op.as_ref().map_or("variable", |o| o.name.as_str());
    e.context(format!("inferring node '{}' (operator {op})", node.name))
}

fn describe_shapes(shapes: &[Shape]) -> String {
    format!("input shapes: {}", shapes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "))
}

fn infer<T: Clone + PartialEq>(
    outputs: &[Entry],
    given: &dyn Fn(&Node) -> Option<T>,
    complete_inputs: impl Fn(&Node, &mut [Option<T>]) -> Result<()>,
    forward: impl Fn(&Node, &[T]) -> Result<Vec<T>>,
    partial_outputs: impl Fn(&Node) -> Option<Vec<T>>,
) -> Result<Inferred<T>>
where
    T: Fits,
{
    let order = topo_order(outputs, |_| false);
    let mut known: Inferred<T> = AddressMap::default();
    for node in order.iter().filter(|n| n.is_variable()) {
        if let Some(v) = given(node) {
            known.insert(Entry::new(node.clone(), 0).key(), v);
        }
    }
    loop {
        let mut changed = false;
        for node in order.iter().filter(|n| !n.is_variable()) {
            let out_keys: Vec<EntryKey> = (0..node.num_outputs()).map(|i| Entry::new(node.clone(), i).key()).collect();
            if out_keys.iter().all(|k| known.contains_key(k)) {
                continue;
            }
            let mut inputs: Vec<Option<T>> = node.inputs.iter().map(|e| known.get(&e.key()).cloned()).collect();
            if inputs.iter().any(Option::is_none) {
                complete_inputs(node, &mut inputs)?;
                for (entry, value) in node.inputs.iter().zip(&inputs) {
                    let Some(v) = value else { continue };
                    if known.contains_key(&entry.key()) {
                        continue;
                    }
                    let completes_partial = || partial_outputs(&entry.node).is_some_and(|p| p[entry.index].fits_into(v));
                    if entry.node.is_variable() || completes_partial() {
                        known.insert(entry.key(), v.clone());
                        changed = true;
                    }
                }
            }
            if partial_outputs(node).is_some() {
                continue;
            }
            let inputs: Vec<T> = node.inputs.iter().filter_map(|e| known.get(&e.key()).cloned()).collect();
            if inputs.len() == node.inputs.len() {
                for (key, value) in out_keys.into_iter().zip(forward(node, &inputs)?) {
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

/// Whether a value a consumer expects can complete a partially known one.
trait Fits {
    fn fits_into(&self, complete: &Self) -> bool;
}

/// Same rank, and every known (non-zero) dimension agrees.
impl Fits for Shape {
    fn fits_into(&self, complete: &Shape) -> bool {
        self.ndim() == complete.ndim() && self.dims().iter().zip(complete.dims()).all(|(&p, &d)| p == 0 || p == d)
    }
}

impl Fits for DType {
    fn fits_into(&self, complete: &DType) -> bool {
        self == complete
    }
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
        let fc = Symbol::create("FullyConnected", attrs(&[("num_hidden", "7")]), "fc", &[data.clone()], &[]).unwrap();
        let partial = infer_shapes(&fc.outputs, &|_| None).unwrap();
        assert!(!partial.contains_key(&fc.outputs[0].key()));
        let other = Symbol::variable("other", Attrs::new());
        let sum = Symbol::create("elemwise_add", Attrs::new(), "plus", &[data, other], &[]).unwrap();
        let err = infer_shapes(&sum.outputs, &|n| Some(Shape::from(if n.name == "data" { vec![2, 3] } else { vec![3, 2] })))
            .err()
            .unwrap();
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
