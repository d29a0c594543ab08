//! MXNet's Symbol JSON, both ways, including the legacy pre-1.0 layout.
//!
//! A graph is a list of nodes (`op` "null" for variables), each with its attribute strings and
//! `inputs` as `[node, output, version]` triples referring to earlier nodes, plus the `heads`
//! (outputs). Before MXNet 1.0 attributes lived under `attr` (and parameters under `param`);
//! both load. Saving writes MXNet 1.9's layout so that MXNet loads what oxnet saves.

use serde_json::{json, Map, Value};

use super::{node_attrs, Symbol};
use crate::error::Result;
use crate::executor::control_flow;
use crate::graph::{node_key, AddressMap, Entry, Node, NodeOp};
use crate::op::{self, params::is_annotation, Attrs};

/// The version MXNet 1.9.1 writes; MXNet upgrades files older than 1.0 when it reads them.
const MXNET_VERSION: i64 = 10901;

pub fn save(symbol: &Symbol, np_shape: bool) -> String {
    serde_json::to_string_pretty(&graph_value(symbol, np_shape)).expect("a JSON value always serializes")
}

/// One graph as MXNet's JSON object; a control flow node's subgraphs are graphs of their own
/// under its `subgraphs` key.
fn graph_value(symbol: &Symbol, np_shape: bool) -> Value {
    let nodes = symbol.nodes();
    let index: AddressMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
    // `nodes` holds every input of every node (a topological order), so the lookup finds it.
    let entry = |e: &Entry| index.get(&node_key(&e.node)).map_or(Value::Null, |&i| json!([i, e.index, 0]));
    let mut arg_nodes = Vec::new();
    let mut row_ptr = vec![0usize];
    let mut entries = 0usize;
    let mut json_nodes = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let mut object = Map::new();
        let op_name = match &node.op {
            None => {
                arg_nodes.push(i);
                "null".to_string()
            }
            Some(op) => op::lookup(&op.name).map_or_else(|_| op.name.clone(), |def| def.name.to_string()),
        };
        object.insert("op".into(), Value::String(op_name));
        object.insert("name".into(), Value::String(node.name.clone()));
        let attrs = node_attrs(node);
        if !attrs.is_empty() {
            object.insert("attrs".into(), Value::Object(attrs.into_iter().map(|(k, v)| (k, Value::String(v))).collect()));
        }
        object.insert("inputs".into(), Value::Array(node.inputs.iter().map(entry).collect()));
        let subgraphs = node.op.as_ref().map(|op| op.operator.subgraphs()).unwrap_or_default();
        if !subgraphs.is_empty() {
            object.insert("subgraphs".into(), Value::Array(subgraphs.iter().map(|g| graph_value(g, np_shape)).collect()));
        }
        json_nodes.push(Value::Object(object));
        entries += node.num_outputs();
        row_ptr.push(entries);
    }
    let mut graph_attrs = Map::new();
    graph_attrs.insert("mxnet_version".into(), json!(["int", MXNET_VERSION]));
    if np_shape {
        graph_attrs.insert("is_np_shape".into(), json!(["int", 1]));
    }
    json!({
        "nodes": json_nodes,
        "arg_nodes": arg_nodes,
        "node_row_ptr": row_ptr,
        "heads": symbol.outputs.iter().map(entry).collect::<Vec<_>>(),
        "attrs": graph_attrs,
    })
}

pub fn load(text: &str) -> Result<Symbol> {
    let graph: Value = serde_json::from_str(text).map_err(|e| crate::err!(Value, "symbol JSON is not valid JSON: {e}"))?;
    load_graph(&graph)
}

fn load_graph(graph: &Value) -> Result<Symbol> {
    let Some(json_nodes) = graph.get("nodes").and_then(Value::as_array) else {
        crate::bail!(Value, "symbol JSON has no 'nodes' list");
    };
    let mut nodes: Vec<std::sync::Arc<Node>> = Vec::with_capacity(json_nodes.len());
    for (i, json_node) in json_nodes.iter().enumerate() {
        let name = json_node.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let node = load_node(json_node, &name, &nodes).map_err(|e| e.context(format!("symbol JSON node {i} ('{name}')")))?;
        nodes.push(node);
    }
    let Some(heads) = graph.get("heads").and_then(Value::as_array) else {
        crate::bail!(Value, "symbol JSON has no 'heads' list");
    };
    let outputs = heads.iter().map(|h| entry(h, &nodes).map_err(|e| e.context("symbol JSON heads"))).collect::<Result<Vec<_>>>()?;
    Ok(Symbol { outputs })
}

fn load_node(json_node: &Value, name: &str, earlier: &[std::sync::Arc<Node>]) -> Result<std::sync::Arc<Node>> {
    let op_name = json_node.get("op").and_then(Value::as_str).ok_or_else(|| crate::err!(Value, "node has no 'op'"))?;
    // MXNet >= 1.0 writes `attrs`; older files `attr` (annotations) and `param` (parameters).
    let mut attrs = Attrs::new();
    for key in ["param", "attr", "attrs"] {
        if let Some(object) = json_node.get(key).and_then(Value::as_object) {
            for (k, v) in object {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                attrs.insert(k.clone(), text);
            }
        }
    }
    let inputs = match json_node.get("inputs") {
        None => Vec::new(),
        Some(Value::Array(list)) => list.iter().map(|e| entry(e, earlier)).collect::<Result<Vec<_>>>()?,
        Some(_) => crate::bail!(Value, "'inputs' must be a list of [node, output, version] entries"),
    };
    if op_name == "null" {
        if !inputs.is_empty() {
            crate::bail!(Value, "a variable (op 'null') cannot have inputs");
        }
        return Ok(Node::variable(name, attrs));
    }
    let (params, annotations): (Attrs, Attrs) = attrs.into_iter().partition(|(k, _)| !is_annotation(k));
    let operator = match json_node.get("subgraphs") {
        Some(Value::Array(graphs)) if control_flow::is_control_flow(op_name) => {
            let subgraphs =
                graphs.iter().enumerate().map(|(i, g)| load_graph(g).map_err(|e| e.context(format!("subgraph {i}")))).collect::<Result<Vec<_>>>()?;
            control_flow::instantiate(op_name, &params, subgraphs)?
        }
        Some(_) => crate::bail!(Value, "operator {op_name} does not take subgraphs (or 'subgraphs' is not a list)"),
        None => op::lookup(op_name)?.instantiate(op_name, &params)?,
    };
    if operator.num_inputs() != inputs.len() {
        crate::bail!(
            Value,
            "operator {op_name} takes {} input(s) ({}), the node lists {}",
            operator.num_inputs(),
            operator.input_names().join(", "),
            inputs.len()
        );
    }
    Ok(Node::annotated(NodeOp { name: op_name.to_string(), attrs: params, operator }, inputs, name, annotations))
}

/// One `[node, output]` or `[node, output, version]` reference to an earlier node.
fn entry(value: &Value, earlier: &[std::sync::Arc<Node>]) -> Result<Entry> {
    // Every part must be a non-negative integer: dropping the others (a -1 node index) would
    // shift the remaining parts into the wrong roles.
    let parts: Option<Vec<u64>> = value.as_array().and_then(|a| a.iter().map(Value::as_u64).collect());
    let (node, index) = match parts.as_deref() {
        Some([node, index] | [node, index, _]) => (*node as usize, *index as usize),
        _ => crate::bail!(Value, "entry {value} is not [node, output, version] of non-negative integers"),
    };
    let Some(producer) = earlier.get(node) else {
        crate::bail!(Value, "entry {value} refers to node {node}, which does not come before it");
    };
    if index >= producer.num_outputs() {
        crate::bail!(Value, "entry {value} asks for output {index} of node '{}', which has {}", producer.name, producer.num_outputs());
    }
    Ok(Entry::new(producer.clone(), index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_structure_and_attributes() {
        let data = Symbol::variable("data", [("__shape__".to_string(), "(2, 3)".to_string())].into_iter().collect());
        let attrs: Attrs = [("num_hidden".to_string(), "4".to_string()), ("__lr_mult__".to_string(), "2".to_string())].into_iter().collect();
        let fc = Symbol::create("FullyConnected", attrs, "fc", &[data], &[]).unwrap();
        let text = fc.to_json(false);
        let back = load(&text).unwrap();
        assert_eq!(back.list_arguments(), fc.list_arguments());
        assert_eq!(back.attr("num_hidden").as_deref(), Some("4"));
        assert_eq!(back.attr("__lr_mult__").as_deref(), Some("2"));
        assert_eq!(back.to_json(false), text);
        assert!(fc.to_json(true).contains("is_np_shape"));
    }

    #[test]
    fn bad_json_names_the_problem() {
        assert!(load("{").err().unwrap().to_string().contains("not valid JSON"));
        let unknown = r#"{"nodes":[{"op":"null","name":"x","inputs":[]},{"op":"Frobnicate","name":"f","inputs":[[0,0,0]]}],"heads":[[1,0,0]]}"#;
        let err = load(unknown).err().unwrap().to_string();
        assert!(err.contains("Frobnicate") && err.contains("'f'"), "{err}");
        let forward_ref = r#"{"nodes":[{"op":"sin","name":"s","inputs":[[1,0,0]]},{"op":"null","name":"x","inputs":[]}],"heads":[[0,0,0]]}"#;
        assert!(load(forward_ref).err().unwrap().to_string().contains("does not come before"));
    }
}
