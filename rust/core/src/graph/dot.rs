//! Graphviz DOT text of a graph, for drawing recorded and symbolic graphs.

use std::fmt::Write;

use super::{node_key, topo_order, AddressMap, Entry};

/// The graph reachable from `outputs` in DOT: variables as ellipses, operators as boxes labelled
/// with their operator, edges from producer to consumer (labelled with the output index when an
/// operator has several outputs).
pub fn to_dot(outputs: &[Entry], title: &str) -> String {
    let order = topo_order(outputs, |_| false);
    let ids: AddressMap<usize, usize> = order.iter().enumerate().map(|(i, n)| (node_key(n), i)).collect();
    let mut dot = String::new();
    let _ = writeln!(dot, "digraph \"{}\" {{", escape(title));
    let _ = writeln!(dot, "  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=11];");
    for (i, node) in order.iter().enumerate() {
        match &node.op {
            None => {
                let label = if node.name.is_empty() { "constant" } else { node.name.as_str() };
                let _ = writeln!(dot, "  n{i} [label=\"{}\", shape=ellipse, style=filled, fillcolor=\"#8dd3c7\"];", escape(label));
            }
            Some(op) => {
                let _ = writeln!(dot, "  n{i} [label=\"{}\", shape=box, style=\"rounded,filled\", fillcolor=\"#fdb462\"];", escape(&op.name));
            }
        }
        // Every input comes before its reader in `order`, so it has an id.
        for (input, from) in node.inputs.iter().filter_map(|input| Some((input, ids.get(&node_key(&input.node))?))) {
            if input.node.num_outputs() > 1 {
                let _ = writeln!(dot, "  n{from} -> n{i} [label=\"{}\"];", input.index);
            } else {
                let _ = writeln!(dot, "  n{from} -> n{i};");
            }
        }
    }
    for (k, out) in outputs.iter().enumerate() {
        if let Some(id) = ids.get(&node_key(&out.node)) {
            let _ = writeln!(dot, "  out{k} [label=\"output {k}\", shape=plaintext];\n  n{id} -> out{k};");
        }
    }
    dot.push_str("}\n");
    dot
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}
