//! Inference rewrite: `Convolution -> BatchNorm -> relu` chains (either of the last two may be
//! missing) become one node whose convolution applies BatchNorm and relu to each chunk of its
//! output while it is still in cache (MXNet's oneDNN backend does the same with its
//! `_sg_mkldnn_conv` subgraphs). A chain is folded only where nothing else reads the values it
//! skips, and only in float32. The folded node keeps BatchNorm's exact semantics when run in
//! training mode (batch statistics, moving statistics updated), so a graph compiled for
//! inference stays correct whatever mode it runs in.

use std::sync::Arc;

use super::{rewrite, Rewrite};
use crate::base::DType;
use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node, NodeOp};
use crate::op::convolution_with_epilogue;
use crate::pass::infer::Inferred;

/// Whether `node` is a relu (`relu`, or `Activation` with `act_type='relu'`).
fn is_relu(node: &Node) -> bool {
    node.op.as_ref().is_some_and(|op| op.name == "relu" || (op.name == "Activation" && op.attrs.get("act_type").map(String::as_str) == Some("relu")))
}

fn op_name(node: &Node) -> &str {
    node.op.as_ref().map_or("", |op| op.name.as_str())
}

/// The graph computing `outputs` with each foldable convolution chain one node, given every
/// entry's dtype. Returns the new output entries.
pub fn fold_into_convolutions(outputs: &[Entry], types: &Inferred<DType>) -> Result<Vec<Entry>> {
    let order = topo_order(outputs, |_| false);
    let mut readers: AddressMap<EntryKey, Vec<Arc<Node>>> = AddressMap::default();
    for node in &order {
        for input in &node.inputs {
            readers.entry(input.key()).or_default().push(node.clone());
        }
    }
    let pinned: AddressSet<EntryKey> = outputs.iter().map(Entry::key).collect();
    let unread = |key: EntryKey| !readers.contains_key(&key) && !pinned.contains(&key);
    // The one node reading `value`, when nothing else (not even the graph's caller) does.
    let sole_reader = |value: EntryKey| -> Option<&Arc<Node>> {
        match readers.get(&value).map(Vec::as_slice) {
            Some([reader]) if !pinned.contains(&value) => Some(reader),
            _ => None,
        }
    };
    let float32 = |node: &Node| node.inputs.iter().all(|e| types.get(&e.key()) == Some(&DType::F32));

    // Folded chains by the key of their last node: the convolution, the BatchNorm, the operator.
    let mut chains: AddressMap<usize, (Arc<Node>, Option<Arc<Node>>, NodeOp)> = AddressMap::default();
    let mut inside: AddressSet<usize> = AddressSet::default();
    for conv in order.iter().filter(|n| op_name(n) == "Convolution" && float32(n)) {
        let mut last = conv.clone();
        let batch_norm = sole_reader((node_key(conv), 0)).filter(|bn| {
            op_name(bn) == "BatchNorm"
                && bn.inputs.first().map(Entry::key) == Some((node_key(conv), 0))
                && float32(bn)
                && unread((node_key(bn), 1))
                && unread((node_key(bn), 2))
        });
        if let Some(bn) = batch_norm {
            last = bn.clone();
        }
        let relu = sole_reader((node_key(&last), 0)).filter(|r| is_relu(r)).cloned();
        if let Some(relu) = &relu {
            last = relu.clone();
        }
        if batch_norm.is_none() && relu.is_none() {
            continue;
        }
        let attrs_of = |n: &Arc<Node>| n.op.as_ref().map(|op| op.attrs.clone()).unwrap_or_default();
        let Some(op) = convolution_with_epilogue(&attrs_of(conv), batch_norm.map(attrs_of).as_ref(), relu.is_some())? else { continue };
        inside.insert(node_key(conv));
        inside.extend(batch_norm.map(node_key));
        chains.insert(node_key(&last), (conv.clone(), batch_norm.cloned(), op));
    }

    Ok(rewrite(outputs, &order, |node, map| {
        let key = node_key(node);
        let Some((conv, batch_norm, op)) = chains.get(&key) else {
            return if inside.contains(&key) { Rewrite::Skip } else { Rewrite::Keep };
        };
        let mut inputs: Vec<Entry> = conv.inputs.iter().map(map).collect();
        if let Some(bn) = batch_norm {
            inputs.extend(bn.inputs.iter().skip(1).map(map));
        }
        let op = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
        Rewrite::Replace(Node::annotated(op, inputs, conv.name.clone(), conv.annotations().clone()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Attrs;
    use crate::pass::infer::infer_types;
    use crate::symbol::Symbol;

    fn attrs(pairs: &[(&str, &str)]) -> Attrs {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn folded_ops(outputs: &[Entry]) -> Vec<String> {
        let types = infer_types(outputs, &|_| Some(DType::F32)).unwrap();
        let folded = fold_into_convolutions(outputs, &types).unwrap();
        topo_order(&folded, |_| false).iter().filter_map(|n| n.op.as_ref().map(|o| o.name.clone())).collect()
    }

    fn conv_bn(bn_attrs: &[(&str, &str)]) -> (Symbol, Symbol) {
        let data = Symbol::variable("data", Attrs::new());
        let conv = Symbol::create("Convolution", attrs(&[("kernel", "(3, 3)"), ("num_filter", "4")]), "conv", &[data], &[]).unwrap();
        let bn = Symbol::create("BatchNorm", attrs(bn_attrs), "bn", std::slice::from_ref(&conv), &[]).unwrap();
        (conv, bn)
    }

    #[test]
    fn convolution_batch_norm_relu_become_one_node() {
        let (_, bn) = conv_bn(&[]);
        let relu = Symbol::create("Activation", attrs(&[("act_type", "relu")]), "relu", &[bn], &[]).unwrap();
        assert_eq!(folded_ops(&relu.outputs), ["_ConvolutionWithEpilogue"]);
    }

    #[test]
    fn values_read_elsewhere_or_other_axes_stay() {
        // The convolution's output is also a graph output: nothing folds.
        let (conv, bn) = conv_bn(&[]);
        assert_eq!(folded_ops(&Symbol::group(&[conv, bn]).outputs), ["Convolution", "BatchNorm"]);
        // BatchNorm over another axis than the channels.
        let (_, bn) = conv_bn(&[("axis", "2")]);
        assert_eq!(folded_ops(&bn.outputs), ["Convolution", "BatchNorm"]);
        // A sigmoid is no relu; BatchNorm still folds.
        let (_, bn) = conv_bn(&[]);
        let sigmoid = Symbol::create("Activation", attrs(&[("act_type", "sigmoid")]), "s", &[bn], &[]).unwrap();
        assert_eq!(folded_ops(&sigmoid.outputs), ["_ConvolutionWithEpilogue", "Activation"]);
    }
}
