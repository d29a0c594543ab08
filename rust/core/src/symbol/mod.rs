//! Symbols: declarative graphs built from the same [`Node`]s autograd records.
//!
//! A [`Symbol`] is a list of output entries. Composing an operator with symbols adds one node;
//! inputs that are not given become variables named `<node>_<input>` (`fc1_weight`), as in
//! MXNet. Variables that some operator updates in place (BatchNorm's moving statistics) are the
//! auxiliary states; the other variables are the arguments.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod json;

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::{DType, PartialShape};
use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, Node, NodeOp};
use crate::op::{self, params::is_annotation, Attrs};
use crate::pass::infer;

#[derive(Clone)]
pub struct Symbol {
    pub outputs: Vec<Entry>,
}

/// Which variables an inference result describes, with what it found (`None`: not inferred).
pub struct InferResult<T> {
    pub arguments: Vec<Option<T>>,
    pub outputs: Vec<Option<T>>,
    pub auxiliary_states: Vec<Option<T>>,
}

impl Symbol {
    pub fn variable(name: &str, annotations: Attrs) -> Symbol {
        Symbol { outputs: vec![Entry::new(Node::variable(name, annotations), 0)] }
    }

    /// Several symbols' outputs as one symbol.
    pub fn group(symbols: &[Symbol]) -> Symbol {
        Symbol { outputs: symbols.iter().flat_map(|s| s.outputs.iter().cloned()).collect() }
    }

    /// Apply the operator registered as `op_name` to `positional` inputs (in order) and
    /// `keyword` inputs (by input name). `attrs` holds its parameters and any `__annotations__`.
    pub fn create(op_name: &str, attrs: Attrs, name: &str, positional: &[Symbol], keyword: &[(String, Symbol)]) -> Result<Symbol> {
        let fail = |e: crate::Error| e.context(format!("composing node '{name}' (operator {op_name})"));
        let def = op::lookup(op_name).map_err(fail)?;
        let (mut params, annotations): (Attrs, Attrs) = attrs.into_iter().partition(|(k, _)| !is_annotation(k));
        params.remove("name");
        if def.variadic && !params.contains_key("num_args") {
            params.insert("num_args".into(), (positional.len() + keyword.len()).to_string());
        }
        let operator = def.instantiate(op_name, &params).map_err(fail)?;
        let input_names = operator.input_names();
        if positional.len() > input_names.len() {
            return Err(fail(crate::err!(
                Value,
                "{} positional input(s) given, but the operator takes {} ({})",
                positional.len(),
                input_names.len(),
                input_names.join(", ")
            )));
        }
        let mut inputs: Vec<Option<Entry>> = vec![None; input_names.len()];
        let single = |s: &Symbol, what: &str| -> Result<Entry> {
            match s.outputs.as_slice() {
                [one] => Ok(one.clone()),
                many => Err(fail(crate::err!(
                    Value,
                    "input '{what}' is a symbol with {} outputs; compose with one output (index the symbol first)",
                    many.len()
                ))),
            }
        };
        for (slot, (s, input)) in inputs.iter_mut().zip(positional.iter().zip(&input_names)) {
            *slot = Some(single(s, input)?);
        }
        for (key, s) in keyword {
            let Some(slot) = input_names.iter().position(|n| n == key).and_then(|pos| inputs.get_mut(pos)) else {
                return Err(fail(crate::err!(Param, "unknown input '{key}'; inputs are: {}", input_names.join(", "))));
            };
            if slot.is_some() {
                return Err(fail(crate::err!(Param, "input '{key}' given twice")));
            }
            *slot = Some(single(s, key)?);
        }
        // As in MXNet, a variable made for an input not given inherits the node's attributes
        // (an `lr_mult` or `__init__` given to a layer then applies to its weights).
        let inherited: Attrs = params.iter().chain(&annotations).map(|(k, v)| (k.clone(), v.clone())).collect();
        let inputs = inputs
            .into_iter()
            .zip(&input_names)
            .map(|(given, input)| given.unwrap_or_else(|| Entry::new(Node::variable(format!("{name}_{input}"), inherited.clone()), 0)))
            .collect();
        let visible = operator.num_visible_outputs();
        let node = Node::annotated(NodeOp { name: op_name.to_string(), attrs: params, operator }, inputs, name, annotations);
        Ok(Symbol { outputs: (0..visible).map(|i| Entry::new(node.clone(), i)).collect() })
    }

    /// Apply a control flow operator (`_foreach`, `_while_loop`, `_cond`) holding `subgraphs` to
    /// `inputs`; `attrs` holds its parameters and any `__annotations__`.
    pub fn create_with_subgraphs(op_name: &str, attrs: Attrs, name: &str, subgraphs: Vec<Symbol>, inputs: &[Symbol]) -> Result<Symbol> {
        let fail = |e: crate::Error| e.context(format!("composing node '{name}' (operator {op_name})"));
        let (mut params, annotations): (Attrs, Attrs) = attrs.into_iter().partition(|(k, _)| !is_annotation(k));
        params.remove("name");
        params.entry("num_args".into()).or_insert_with(|| (inputs.len() + subgraphs.len()).to_string());
        let operator = crate::executor::control_flow::instantiate(op_name, &params, subgraphs).map_err(fail)?;
        let entries = inputs
            .iter()
            .map(|s| match s.outputs.as_slice() {
                [one] => Ok(one.clone()),
                many => Err(fail(crate::err!(Value, "an input is a symbol with {} outputs; compose with one output", many.len()))),
            })
            .collect::<Result<Vec<_>>>()?;
        if entries.len() != operator.num_inputs() {
            return Err(fail(crate::err!(Value, "{} input(s) given, the operator takes {}", entries.len(), operator.num_inputs())));
        }
        let visible = operator.num_visible_outputs();
        let node = Node::annotated(NodeOp { name: op_name.to_string(), attrs: params, operator }, entries, name, annotations);
        Ok(Symbol { outputs: (0..visible).map(|i| Entry::new(node.clone(), i)).collect() })
    }

    /// The part of the graph built inside the subgraph scope `scope` (nodes whose
    /// `__subgraph_name__` is `scope`), cut from the rest: each value an inside node reads from
    /// outside becomes a new variable named as that value's output. Returns the cut graph and,
    /// per new variable, the variable and the outside value it stands for (MXNet's
    /// `MXSymbolCutSubgraph`, without changing this graph).
    pub fn cut_subgraph(&self, scope: &str) -> (Symbol, Vec<(Entry, Entry)>) {
        let inside = |n: &Arc<Node>| n.annotations().get("__subgraph_name__").is_some_and(|s| s == scope);
        let mut rebuilt: AddressMap<usize, Arc<Node>> = AddressMap::default();
        let mut cut: AddressMap<crate::graph::EntryKey, Entry> = AddressMap::default();
        let mut pairs = Vec::new();
        for node in topo_order(&self.outputs, |n| !inside(n)) {
            let Some(op) = node.op.as_ref().filter(|_| inside(&node)) else { continue };
            let mut changed = false;
            let inputs: Vec<Entry> = node
                .inputs
                .iter()
                .map(|e| {
                    if !inside(&e.node) {
                        changed = true;
                        return cut
                            .entry(e.key())
                            .or_insert_with(|| {
                                let var = Entry::new(Node::variable(output_name(e), Attrs::new()), 0);
                                pairs.push((var.clone(), e.clone()));
                                var
                            })
                            .clone();
                    }
                    match rebuilt.get(&node_key(&e.node)) {
                        Some(r) => {
                            changed = true;
                            Entry::new(r.clone(), e.index)
                        }
                        None => e.clone(),
                    }
                })
                .collect();
            if changed {
                let copy = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
                rebuilt.insert(node_key(&node), Node::annotated(copy, inputs, node.name.clone(), node.annotations().clone()));
            }
        }
        let outputs =
            self.outputs.iter().map(|e| rebuilt.get(&node_key(&e.node)).map_or_else(|| e.clone(), |r| Entry::new(r.clone(), e.index))).collect();
        (Symbol { outputs }, pairs)
    }

    /// Every node of the graph, inputs before their consumers.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        topo_order(&self.outputs, |_| false)
    }

    /// Variables, in MXNet's order (depth first from the outputs, inputs in order).
    pub fn input_nodes(&self) -> Vec<Arc<Node>> {
        self.nodes().into_iter().filter(|n| n.is_variable()).collect()
    }

    fn auxiliary_keys(&self) -> AddressSet<usize> {
        let mut aux = AddressSet::default();
        for node in self.nodes() {
            if let Some(op) = &node.op {
                for &i in op.operator.mutated_inputs() {
                    if let Some(input) = node.inputs.get(i).filter(|e| e.node.is_variable()) {
                        aux.insert(node_key(&input.node));
                    }
                }
            }
        }
        aux
    }

    pub fn argument_nodes(&self) -> Vec<Arc<Node>> {
        let aux = self.auxiliary_keys();
        self.input_nodes().into_iter().filter(|n| !aux.contains(&node_key(n))).collect()
    }

    pub fn auxiliary_nodes(&self) -> Vec<Arc<Node>> {
        let aux = self.auxiliary_keys();
        self.input_nodes().into_iter().filter(|n| aux.contains(&node_key(n))).collect()
    }

    pub fn list_arguments(&self) -> Vec<String> {
        self.argument_nodes().iter().map(|n| n.name.clone()).collect()
    }

    pub fn list_auxiliary_states(&self) -> Vec<String> {
        self.auxiliary_nodes().iter().map(|n| n.name.clone()).collect()
    }

    pub fn list_inputs(&self) -> Vec<String> {
        self.input_nodes().iter().map(|n| n.name.clone()).collect()
    }

    pub fn list_outputs(&self) -> Vec<String> {
        self.outputs.iter().map(output_name).collect()
    }

    /// One output as its own symbol.
    pub fn output(&self, index: usize) -> Result<Symbol> {
        match self.outputs.get(index) {
            Some(e) => Ok(Symbol { outputs: vec![e.clone()] }),
            None => crate::bail!(Index, "output index {index} is out of range for a symbol with {} output(s)", self.outputs.len()),
        }
    }

    /// Every visible output of every node, as one grouped symbol (MXNet's `get_internals`).
    pub fn internals(&self) -> Symbol {
        let outputs = self
            .nodes()
            .into_iter()
            .flat_map(|n| {
                let visible = n.op.as_ref().map_or(1, |o| o.operator.num_visible_outputs());
                (0..visible).map(move |i| Entry::new(n.clone(), i))
            })
            .collect();
        Symbol { outputs }
    }

    /// The inputs of the nodes behind this symbol's outputs (each node once, in output order);
    /// `None` when there are none (variables).
    pub fn children(&self) -> Option<Symbol> {
        let mut seen = AddressSet::default();
        let outputs: Vec<Entry> =
            self.outputs.iter().filter(|e| seen.insert(node_key(&e.node))).flat_map(|e| e.node.inputs.iter().cloned()).collect();
        (!outputs.is_empty()).then_some(Symbol { outputs })
    }

    /// The graph with variables replaced by other symbols' outputs (calling a symbol in MXNet),
    /// its first output's node renamed to `rename` when given.
    pub fn substitute(&self, replacements: &HashMap<String, Symbol>, rename: Option<&str>) -> Result<Symbol> {
        let mut by_variable: HashMap<&str, Entry> = HashMap::new();
        for (name, s) in replacements {
            let [entry] = s.outputs.as_slice() else {
                crate::bail!(Value, "cannot bind argument '{name}' to a symbol with {} outputs", s.outputs.len());
            };
            by_variable.insert(name.as_str(), entry.clone());
        }
        let known: Vec<String> = self.list_inputs();
        if let Some(unknown) = replacements.keys().find(|k| !known.contains(k)) {
            crate::bail!(Value, "cannot compose: '{unknown}' is not an input of the symbol (inputs: {})", known.join(", "));
        }
        let mut rebuilt: AddressMap<usize, Entry> = AddressMap::default();
        let mapped = |rebuilt: &AddressMap<usize, Entry>, e: &Entry| match rebuilt.get(&node_key(&e.node)) {
            Some(r) if e.node.is_variable() => r.clone(),
            Some(r) => Entry::new(r.node.clone(), e.index),
            None => e.clone(),
        };
        for node in self.nodes() {
            if node.is_variable() {
                if let Some(entry) = by_variable.get(node.name.as_str()) {
                    rebuilt.insert(node_key(&node), entry.clone());
                }
                continue;
            }
            let Some(op) = node.op.as_ref().filter(|_| node.inputs.iter().any(|e| rebuilt.contains_key(&node_key(&e.node)))) else {
                continue;
            };
            let inputs = node.inputs.iter().map(|e| mapped(&rebuilt, e)).collect();
            let copy = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
            let new_node = Node::annotated(copy, inputs, node.name.clone(), node.annotations().clone());
            rebuilt.insert(node_key(&node), Entry::new(new_node, 0));
        }
        let mut outputs: Vec<Entry> = self.outputs.iter().map(|e| mapped(&rebuilt, e)).collect();
        if let (Some(new_name), Some(head)) = (rename, outputs.first().cloned()) {
            let node = &head.node;
            let renamed = match &node.op {
                None => Node::variable(new_name, node.annotations().clone()),
                Some(op) => {
                    let copy = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
                    Node::annotated(copy, node.inputs.clone(), new_name, node.annotations().clone())
                }
            };
            for e in outputs.iter_mut().filter(|e| node_key(&e.node) == node_key(node)) {
                *e = Entry::new(renamed.clone(), e.index);
            }
        }
        Ok(Symbol { outputs })
    }

    /// A symbol attribute: an annotation such as `__lr_mult__`, or an operator parameter.
    pub fn attr(&self, key: &str) -> Option<String> {
        let [head] = self.outputs.as_slice() else { return None };
        let node = &head.node;
        let annotated = node.annotations().get(key).cloned();
        annotated.or_else(|| node.op.as_ref().and_then(|o| o.attrs.get(key).cloned()))
    }

    pub fn set_attr(&self, key: &str, value: &str) -> Result<()> {
        let [head] = self.outputs.as_slice() else {
            crate::bail!(Value, "attributes can only be set on a symbol with one output");
        };
        head.node.annotations().insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// Every node's attributes (parameters and annotations) by node name, for `attr_dict`.
    pub fn attr_dict(&self) -> Vec<(String, Attrs)> {
        self.nodes()
            .into_iter()
            .filter_map(|n| {
                let attrs = node_attrs(&n);
                (!attrs.is_empty()).then(|| (n.name.clone(), attrs))
            })
            .collect()
    }

    /// Shapes of arguments, outputs and auxiliary states from the variables' shapes given by
    /// name (plus `__shape__` annotations), any of them partly known: as far as they can be
    /// inferred (`None`: not even the rank is known).
    pub fn infer_shape(&self, given: &HashMap<String, PartialShape>) -> Result<InferResult<PartialShape>> {
        let shape_of = |n: &Node| given.get(&n.name).cloned().or_else(|| annotated_shape(n));
        let inferred = infer::infer_partial_shapes(&self.outputs, &shape_of)?;
        Ok(self.collect(&inferred))
    }

    pub fn infer_type(&self, given: &HashMap<String, DType>) -> Result<InferResult<DType>> {
        let dtype_of = |n: &Node| given.get(&n.name).copied().or_else(|| annotated_dtype(n));
        let inferred = infer::infer_types(&self.outputs, &dtype_of)?;
        Ok(self.collect(&inferred))
    }

    fn collect<T: Clone>(&self, inferred: &infer::Inferred<T>) -> InferResult<T> {
        let of_nodes = |nodes: Vec<Arc<Node>>| nodes.into_iter().map(|n| inferred.get(&Entry::new(n, 0).key()).cloned()).collect();
        InferResult {
            arguments: of_nodes(self.argument_nodes()),
            outputs: self.outputs.iter().map(|e| inferred.get(&e.key()).cloned()).collect(),
            auxiliary_states: of_nodes(self.auxiliary_nodes()),
        }
    }

    /// The graph autograd recorded for `heads` as a symbol (MXNet's `autograd.get_symbol`):
    /// recorded arrays' leaves become variables `var0`, `var1`, ... and operator nodes are
    /// named `<operator><count>`, so the symbol lists, saves and binds like a built one.
    pub fn from_recorded(heads: &[Entry]) -> Result<Symbol> {
        let mut rebuilt: AddressMap<usize, Arc<Node>> = AddressMap::default();
        let mut variables = 0;
        let mut counts: HashMap<String, usize> = HashMap::new();
        for node in topo_order(heads, |_| false) {
            let copy = match &node.op {
                None => {
                    variables += 1;
                    Node::variable(format!("var{}", variables - 1), Attrs::new())
                }
                Some(op) => {
                    let count = counts.entry(op.name.to_lowercase()).or_default();
                    let name = format!("{}{}", op.name.to_lowercase(), count);
                    *count += 1;
                    let inputs = node.inputs.iter().map(|e| recorded_entry(&rebuilt, e)).collect::<Result<_>>()?;
                    let op = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
                    Node::annotated(op, inputs, name, Attrs::new())
                }
            };
            rebuilt.insert(node_key(&node), copy);
        }
        Ok(Symbol { outputs: heads.iter().map(|e| recorded_entry(&rebuilt, e)).collect::<Result<_>>()? })
    }

    /// MXNet JSON text of the graph; `np_shape` records that its shapes follow NumPy semantics
    /// (-1 for an unknown dimension), as MXNet does with `is_np_shape` in the graph attributes.
    pub fn to_json(&self, np_shape: bool) -> String {
        json::save(self, np_shape)
    }

    pub fn from_json(text: &str) -> Result<Symbol> {
        json::load(text)
    }

    /// Graphviz DOT text of the graph.
    pub fn to_dot(&self, title: &str) -> String {
        crate::graph::to_dot(&self.outputs, title)
    }
}

/// MXNet's output naming: a variable is its name, an operator output `<node>_output` (or
/// `<node>_output<i>` when the operator shows several).
pub(crate) fn output_name(e: &Entry) -> String {
    match &e.node.op {
        None => e.node.name.clone(),
        Some(op) if op.operator.num_visible_outputs() == 1 => format!("{}_output", e.node.name),
        Some(_) => format!("{}_output{}", e.node.name, e.index),
    }
}

/// A node's parameters and annotations together, as MXNet's JSON `attrs` holds them.
pub(crate) fn node_attrs(node: &Node) -> Attrs {
    let mut attrs = node.op.as_ref().map(|o| o.attrs.clone()).unwrap_or_default();
    attrs.extend(node.annotations().iter().map(|(k, v)| (k.clone(), v.clone())));
    attrs
}

/// The shape a variable declares with `__shape__` (`mx.sym.var('x', shape=(0, 3))`): MXNet
/// writes an unknown dimension as 0 (or -1 under NumPy shape semantics).
fn annotated_shape(node: &Node) -> Option<PartialShape> {
    let text = node.annotations().get("__shape__")?.clone();
    let dims: Vec<i64> = op::params::parse_value::<Vec<i64>>("var", "__shape__", &text).ok()?;
    Some(PartialShape(dims.iter().map(|&d| usize::try_from(d).ok().filter(|&d| d > 0)).collect()))
}

fn annotated_dtype(node: &Node) -> Option<DType> {
    let text = node.annotations().get("__dtype__")?.clone();
    text.parse::<i32>().ok().and_then(|flag| DType::from_flag(flag).ok()).or_else(|| DType::from_name(&text).ok())
}

/// `e` in the graph rebuilt from a recording: its node's copy (made before its readers, in
/// topological order).
fn recorded_entry(rebuilt: &AddressMap<usize, Arc<Node>>, e: &Entry) -> Result<Entry> {
    let node =
        rebuilt.get(&node_key(&e.node)).ok_or_else(|| crate::err!(Runtime, "recorded node '{}' was not copied before its reader", e.node.name))?;
    Ok(Entry::new(node.clone(), e.index))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> Attrs {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn mlp() -> Symbol {
        let data = Symbol::variable("data", Attrs::new());
        let fc1 = Symbol::create("FullyConnected", attrs(&[("num_hidden", "4")]), "fc1", &[data], &[]).unwrap();
        let act = Symbol::create("Activation", attrs(&[("act_type", "relu")]), "relu1", &[fc1], &[]).unwrap();
        let bn = Symbol::create("BatchNorm", Attrs::new(), "bn", &[act], &[]).unwrap();
        Symbol::create("SoftmaxOutput", Attrs::new(), "softmax", &[bn], &[]).unwrap()
    }

    #[test]
    fn listing_follows_mxnet_names_and_order() {
        let net = mlp();
        assert_eq!(net.list_arguments(), ["data", "fc1_weight", "fc1_bias", "bn_gamma", "bn_beta", "softmax_label"]);
        assert_eq!(net.list_auxiliary_states(), ["bn_moving_mean", "bn_moving_var"]);
        assert_eq!(net.list_outputs(), ["softmax_output"]);
        let internals = net.internals();
        assert!(internals.list_outputs().contains(&"relu1_output".to_string()));
        let children = net.children().unwrap();
        assert_eq!(children.list_outputs(), ["bn_output", "softmax_label"]);
    }

    #[test]
    fn composing_replaces_variables() {
        let net = mlp();
        let x = Symbol::variable("x", Attrs::new());
        let pre = Symbol::create("Activation", attrs(&[("act_type", "tanh")]), "pre", &[x], &[]).unwrap();
        let composed = net.substitute(&[("data".to_string(), pre)].into_iter().collect(), Some("net")).unwrap();
        assert_eq!(composed.output(0).unwrap().list_outputs(), ["net_output"]);
        assert_eq!(composed.list_arguments()[0], "x");
        assert_eq!(net.list_arguments()[0], "data", "the original is unchanged");
        assert!(net.substitute(&[("nope".to_string(), net.clone())].into_iter().collect(), None).is_err());
    }

    #[test]
    fn composition_errors_name_the_node() {
        let data = Symbol::variable("data", Attrs::new());
        let err = Symbol::create("FullyConnected", Attrs::new(), "fc9", std::slice::from_ref(&data), &[]).err().unwrap();
        assert!(err.to_string().contains("fc9") && err.to_string().contains("num_hidden"), "{err}");
        let err = Symbol::create("no_such_op", Attrs::new(), "x", &[data], &[]).err().unwrap();
        assert!(err.to_string().contains("no_such_op"), "{err}");
    }
}
