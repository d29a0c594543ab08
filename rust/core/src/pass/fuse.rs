//! Element-wise fusion: chains of float32 element-wise operators become one [`FusedOp`] node.
//!
//! A group grows from an operator towards its inputs through operators that are element-wise
//! over same-shape float32 values and whose output nobody else reads (and which is not a graph
//! output): its intermediates then never need memory. The rewritten graph shares every node it
//! does not change with the original.

use std::sync::Arc;

use crate::base::{DType, Shape};
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, Node, NodeOp};
use crate::op::fused::{FusedStep, Operand};
use crate::op::{Attrs, FusedOp};
use crate::pass::infer::Inferred;
use crate::pass::Rewrite;

/// Whether fusion is enabled (`MXNET_USE_FUSION`, default on).
pub fn fusion_enabled() -> bool {
    std::env::var("MXNET_USE_FUSION").map_or(true, |v| !matches!(v.trim(), "0" | "false" | "False"))
}

/// The graph computing `outputs` with element-wise chains fused, given every entry's shape and
/// dtype. Returns the new output entries.
pub fn fuse_elementwise(outputs: &[Entry], shapes: &Inferred<Shape>, types: &Inferred<DType>) -> Vec<Entry> {
    let order = topo_order(outputs, |_| false);
    let mut uses: AddressMap<usize, usize> = AddressMap::default();
    for node in &order {
        for input in &node.inputs {
            *uses.entry(node_key(&input.node)).or_default() += 1;
        }
    }
    let pinned: AddressSet<usize> = outputs.iter().map(|e| node_key(&e.node)).collect();
    let fusible = |node: &Arc<Node>| -> bool {
        let Some(op) = &node.op else { return false };
        let out = Entry::new(node.clone(), 0).key();
        node.num_outputs() == 1
            && node.inputs.len() <= FusedOp::MAX_OPERANDS
            && op.operator.elementwise().is_some()
            && types.get(&out) == Some(&DType::F32)
            && node.inputs.iter().all(|e| types.get(&e.key()) == Some(&DType::F32) && shapes.get(&e.key()) == shapes.get(&out))
            && shapes.contains_key(&out)
    };

    // Group membership: node -> its group's root.
    let mut root_of: AddressMap<usize, usize> = AddressMap::default();
    let mut groups: AddressMap<usize, usize> = AddressMap::default();
    for node in order.iter().rev() {
        if root_of.contains_key(&node_key(node)) || !fusible(node) {
            continue;
        }
        let root = node_key(node);
        root_of.insert(root, root);
        let mut size = 1;
        let mut frontier = vec![node.clone()];
        while let Some(member) = frontier.pop() {
            for input in &member.inputs {
                let k = node_key(&input.node);
                if !root_of.contains_key(&k) && uses.get(&k) == Some(&1) && !pinned.contains(&k) && fusible(&input.node) {
                    root_of.insert(k, root);
                    size += 1;
                    frontier.push(input.node.clone());
                }
            }
        }
        groups.insert(root, size);
    }

    super::rewrite(outputs, &order, |node, map| {
        let key = node_key(node);
        match root_of.get(&key).filter(|&&root| groups.get(&root).is_some_and(|&size| size > 1)) {
            Some(&root) if root == key => {
                let fused = build_fused(node, &root_of, root);
                let inputs = fused.1.iter().map(map).collect();
                let attrs: Attrs = [("expr".to_string(), fused.0.cuda_expr.clone())].into_iter().collect();
                let op = NodeOp { name: "_FusedOp".into(), attrs, operator: Arc::new(fused.0) };
                Rewrite::Replace(Node::with_operator(op, inputs, node.name.clone(), crate::graph::Recorded::Nothing))
            }
            Some(_) => Rewrite::Skip,
            None => Rewrite::Keep,
        }
    })
}

/// The fused operator of the group rooted at `root_node`, and its external input entries.
fn build_fused(root_node: &Arc<Node>, root_of: &AddressMap<usize, usize>, root: usize) -> (FusedOp, Vec<Entry>) {
    struct Builder<'a> {
        root_of: &'a AddressMap<usize, usize>,
        root: usize,
        steps: Vec<FusedStep>,
        inputs: Vec<Entry>,
    }
    impl Builder<'_> {
        /// Emit the steps computing `node`; returns its operand and C expression.
        fn emit(&mut self, node: &Arc<Node>) -> (Operand, String) {
            let op = node.op.as_ref().expect("a fused node is an operator");
            let elementwise = op.operator.elementwise().expect("fusible operators are element-wise");
            let mut operands = Vec::new();
            let mut args = Vec::new();
            for input in &node.inputs {
                let inside = self.root_of.get(&node_key(&input.node)) == Some(&self.root) && !input.node.is_variable();
                let (operand, text) = if inside {
                    self.emit(&input.node)
                } else {
                    let index = self.inputs.iter().position(|e| e.key() == input.key()).unwrap_or_else(|| {
                        self.inputs.push(input.clone());
                        self.inputs.len() - 1
                    });
                    (Operand::Input(index), format!("in{index}"))
                };
                operands.push(operand);
                args.push(text);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // The CPU kernel applies the scalar in float32; so does the GPU's.
            let scalar = elementwise.scalar.map(|s| format!("(float){}", crate::op::cuda_double_literal(s as f32 as f64)));
            // Every step yields float32, as on the CPU: comparisons (bool) and integer-valued
            // expressions such as sign's would otherwise reach the next step in another type.
            let expr = format!("(float)({})", elementwise.cuda_expr_of(&args, scalar.as_deref().unwrap_or("")));
            self.steps.push(FusedStep { kernel: elementwise.kernel, operands });
            (Operand::Step(self.steps.len() - 1), expr)
        }
    }
    let mut builder = Builder { root_of, root, steps: Vec::new(), inputs: Vec::new() };
    let (_, cuda_expr) = builder.emit(root_node);
    let num_inputs = builder.inputs.len();
    (FusedOp { steps: builder.steps, num_inputs, cuda_expr }, builder.inputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::infer::{infer_shapes, infer_types};
    use crate::symbol::Symbol;

    #[test]
    fn relu_of_mul_plus_one_becomes_one_node() {
        let a = Symbol::variable("a", Attrs::new());
        let b = Symbol::variable("b", Attrs::new());
        let mul = Symbol::create("elemwise_mul", Attrs::new(), "mul", &[a, b], &[]).unwrap();
        let scalar: Attrs = [("scalar".to_string(), "1".to_string())].into_iter().collect();
        let plus = Symbol::create("_plus_scalar", scalar, "plus", &[mul], &[]).unwrap();
        let relu = Symbol::create("relu", Attrs::new(), "relu", &[plus], &[]).unwrap();
        let shapes = infer_shapes(&relu.outputs, &|_| Some(Shape::new(vec![4, 5]))).unwrap();
        let types = infer_types(&relu.outputs, &|_| Some(DType::F32)).unwrap();
        let fused = fuse_elementwise(&relu.outputs, &shapes, &types);
        let nodes = topo_order(&fused, |_| false);
        let ops: Vec<&str> = nodes.iter().filter_map(|n| n.op.as_ref().map(|o| o.name.as_str())).collect();
        assert_eq!(ops, ["_FusedOp"]);
        let expr = &nodes.last().unwrap().op.as_ref().unwrap().attrs["expr"];
        assert_eq!(
            expr,
            "(float)((((float)(((float)(in0 * in1)) + ((float)1e0))) > 0 || ((float)(((float)(in0 * in1)) + ((float)1e0))) != ((float)(((float)(in0 * in1)) + ((float)1e0)))) ? ((float)(((float)(in0 * in1)) + ((float)1e0))) : 0)"
        );
    }

    #[test]
    fn values_read_elsewhere_or_of_other_shapes_stay() {
        let a = Symbol::variable("a", Attrs::new());
        let e = Symbol::create("exp", Attrs::new(), "e", &[a], &[]).unwrap();
        let s = Symbol::create("sum", Attrs::new(), "s", std::slice::from_ref(&e), &[]).unwrap();
        let t = Symbol::create("tanh", Attrs::new(), "t", &[e], &[]).unwrap();
        let both = Symbol::group(&[s, t]);
        let shapes = infer_shapes(&both.outputs, &|_| Some(Shape::new(vec![3]))).unwrap();
        let types = infer_types(&both.outputs, &|_| Some(DType::F32)).unwrap();
        let fused = fuse_elementwise(&both.outputs, &shapes, &types);
        let ops: Vec<String> = topo_order(&fused, |_| false).iter().filter_map(|n| n.op.as_ref().map(|o| o.name.clone())).collect();
        assert!(!ops.contains(&"_FusedOp".to_string()), "{ops:?}");
    }
}
