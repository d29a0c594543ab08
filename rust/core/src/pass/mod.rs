//! Graph passes: each takes a graph (its output entries) and returns a new graph or facts about it.
// Graphs from programs and files pass through here: no unwrap and no unchecked indexing, so
// that bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

pub mod conv_epilogue;
pub mod cse;
pub mod fuse;
pub mod gradient;
pub mod infer;
pub mod mirror;
pub mod plan_memory;

use std::sync::Arc;

use crate::base::{DType, Shape};
use crate::error::Result;
use crate::graph::{address, node_key, AddressMap, Entry, Node, NodeOp};
use infer::Inferred;

/// The graph a run that records no gradient executes, given the original graph's shapes and
/// dtypes: convolution chains folded (where `fold_convolutions`: the folded operator runs on
/// host devices only), then element-wise chains fused.
pub(crate) fn inference_graph(outputs: &[Entry], shapes: &Inferred<Shape>, types: &Inferred<DType>, fold_convolutions: bool) -> Result<Vec<Entry>> {
    if !fold_convolutions {
        return Ok(fuse::fuse_elementwise(outputs, shapes, types));
    }
    let folded = conv_epilogue::fold_into_convolutions(outputs, types)?;
    // The folded nodes' values are new entries; the variables keep their shapes and dtypes.
    let shapes = infer::infer_shapes(&folded, &|n: &Node| shapes.get(&(address(n), 0)).cloned())?;
    let types = infer::infer_types(&folded, &|n: &Node| types.get(&(address(n), 0)).copied())?;
    Ok(fuse::fuse_elementwise(&folded, &shapes, &types))
}

/// What a rewriting pass does with one node of the graph.
pub(crate) enum Rewrite {
    /// Keep it (copied only if one of its inputs changed).
    Keep,
    /// Drop it: it became part of a replacement, and nothing else reads it.
    Skip,
    /// Replace it by this node, whose outputs stand for its outputs index by index.
    Replace(Arc<Node>),
}

/// The graph computing `outputs` after `decide` has been asked about each node of `order` (the
/// graph's topological order), given the function mapping an old entry to the new one. Nodes
/// the rewrite does not change stay shared with the original graph.
pub(crate) fn rewrite(outputs: &[Entry], order: &[Arc<Node>], mut decide: impl FnMut(&Arc<Node>, &dyn Fn(&Entry) -> Entry) -> Rewrite) -> Vec<Entry> {
    let mut rebuilt: AddressMap<usize, Arc<Node>> = AddressMap::default();
    let map = |rebuilt: &AddressMap<usize, Arc<Node>>, e: &Entry| match rebuilt.get(&node_key(&e.node)) {
        Some(n) => Entry::new(n.clone(), e.index),
        None => e.clone(),
    };
    for node in order {
        let decision = decide(node, &|e| map(&rebuilt, e));
        match decision {
            Rewrite::Replace(new) => {
                rebuilt.insert(node_key(node), new);
            }
            Rewrite::Skip => {}
            Rewrite::Keep => {
                if let (Some(op), true) = (&node.op, node.inputs.iter().any(|e| rebuilt.contains_key(&node_key(&e.node)))) {
                    let copy = NodeOp { name: op.name.clone(), attrs: op.attrs.clone(), operator: op.operator.clone() };
                    let inputs = node.inputs.iter().map(|e| map(&rebuilt, e)).collect();
                    rebuilt.insert(node_key(node), Node::annotated(copy, inputs, node.name.clone(), node.annotations().clone()));
                }
            }
        }
    }
    outputs.iter().map(|e| map(&rebuilt, e)).collect()
}
