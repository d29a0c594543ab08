//! Static memory planning: storage blocks for every value a graph run produces.
//!
//! Walking the operators in execution order, each output takes (1) its input's block when the
//! operator may write in place over that input and this is the input's last use, else (2) the
//! smallest free block that fits, else (3) a new block. A block returns to the free list when
//! the last value living in it has had its last use, so values whose lifetimes do not overlap
//! share memory. This is MXNet's plan (in-place + co-share); `MXNET_EXEC_ENABLE_INPLACE=0` turns
//! the in-place step off.

use std::sync::Arc;

use crate::base::Context;
use crate::graph::{node_key, AddressMap, AddressSet, Entry, EntryKey, Node};

/// Where each planned value lives.
#[derive(Debug, Default)]
pub struct MemoryPlan {
    /// Byte size of each storage block.
    pub blocks: Vec<usize>,
    /// The device of each block: values share a block only when their nodes run on one device.
    pub block_contexts: Vec<Context>,
    /// The block of each planned value.
    pub assignment: AddressMap<EntryKey, usize>,
}

impl MemoryPlan {
    /// Whether `block` holds `size` bytes on `ctx`.
    fn holds(&self, block: usize, size: usize, ctx: Context) -> bool {
        self.blocks.get(block).is_some_and(|&bytes| bytes >= size) && self.block_contexts.get(block) == Some(&ctx)
    }

    /// Bytes the plan allocates in all.
    pub fn total_bytes(&self) -> usize {
        self.blocks.iter().sum()
    }
}

/// What the planner needs to know about the run.
pub struct PlanRequest<'a> {
    /// Operator nodes in the order they run.
    pub steps: &'a [Arc<Node>],
    /// Byte size of a value; values without a size (unknown shape) are left unplanned.
    pub bytes: &'a dyn Fn(&Entry) -> Option<usize>,
    /// Values that must outlive the run (graph outputs): never freed, never overwritten.
    pub pinned: &'a AddressSet<EntryKey>,
    /// Values the caller provides storage for (written into gradient buffers): not planned.
    pub external: &'a AddressSet<EntryKey>,
    pub inplace: bool,
    /// The device each operator node runs on (its outputs live there).
    pub context: &'a dyn Fn(&Node) -> Context,
}

/// Whether in-place reuse is enabled (`MXNET_EXEC_ENABLE_INPLACE`, default on).
pub fn inplace_enabled() -> bool {
    std::env::var("MXNET_EXEC_ENABLE_INPLACE").map_or(true, |v| !matches!(v.trim(), "0" | "false" | "False"))
}

pub fn plan_memory(request: &PlanRequest<'_>) -> MemoryPlan {
    let steps = request.steps;
    // Last step reading each value; pinned values live forever.
    let mut last_use: AddressMap<EntryKey, usize> = AddressMap::default();
    for (step, node) in steps.iter().enumerate() {
        for input in &node.inputs {
            last_use.insert(input.key(), step);
        }
    }
    let forever = usize::MAX;
    for key in request.pinned {
        last_use.insert(*key, forever);
    }

    let mut plan = MemoryPlan::default();
    // Number of live values in each block; a block with none is free.
    let mut live: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let planned_here: AddressSet<usize> = steps.iter().map(node_key).collect();

    for (step, node) in steps.iter().enumerate() {
        let pairs = node.op.as_ref().map_or(&[][..], |o| o.operator.inplace_pairs());
        let ctx = (request.context)(node.as_ref());
        let mut donated: Vec<EntryKey> = Vec::new();
        for index in 0..node.num_outputs() {
            let out = Entry::new(node.clone(), index);
            if request.external.contains(&out.key()) {
                continue;
            }
            let Some(size) = (request.bytes)(&out) else { continue };
            let reuse = request
                .inplace
                .then(|| {
                    pairs.iter().filter(|&&(_, o)| o == index).find_map(|&(i, _)| {
                        let input = node.inputs.get(i)?;
                        let block = *plan.assignment.get(&input.key())?;
                        let ends_here = last_use.get(&input.key()) == Some(&step);
                        let only_reader = node.inputs.iter().filter(|e| e.key() == input.key()).count() == 1;
                        let fits = plan.holds(block, size, ctx) && !donated.contains(&input.key());
                        (ends_here && only_reader && fits && planned_here.contains(&node_key(&input.node))).then_some((input.key(), block))
                    })
                })
                .flatten();
            let block = match reuse {
                Some((input_key, block)) => {
                    donated.push(input_key);
                    block
                }
                None => take_free_block(&mut free, &plan, size, ctx).unwrap_or_else(|| {
                    plan.blocks.push(size);
                    plan.block_contexts.push(ctx);
                    live.push(0);
                    plan.blocks.len() - 1
                }),
            };
            if let Some(live) = live.get_mut(block) {
                *live += 1;
            }
            plan.assignment.insert(out.key(), block);
        }
        // Release what this step read for the last time (including donated inputs: their
        // block is still counted live through the output that took it over).
        let mut released: AddressSet<EntryKey> = AddressSet::default();
        for input in &node.inputs {
            if last_use.get(&input.key()) == Some(&step) && released.insert(input.key()) {
                release(&plan, &mut live, &mut free, &input.key());
            }
        }
        // Outputs nobody reads (a layer's unused statistics) die right away.
        for index in 0..node.num_outputs() {
            let key = Entry::new(node.clone(), index).key();
            if !last_use.contains_key(&key) {
                release(&plan, &mut live, &mut free, &key);
            }
        }
    }
    plan
}

fn release(plan: &MemoryPlan, live: &mut [usize], free: &mut Vec<usize>, key: &EntryKey) {
    if let Some((block, count)) = plan.assignment.get(key).and_then(|&block| Some((block, live.get_mut(block)?))) {
        *count -= 1;
        if *count == 0 {
            free.push(block);
        }
    }
}

/// The smallest free block on `ctx` that holds `size` bytes.
fn take_free_block(free: &mut Vec<usize>, plan: &MemoryPlan, size: usize, ctx: Context) -> Option<usize> {
    let best = free.iter().enumerate().filter(|(_, &b)| plan.holds(b, size, ctx)).min_by_key(|(_, &b)| plan.blocks.get(b)).map(|(i, _)| i);
    best.map(|i| free.swap_remove(i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::Shape;
    use crate::op::Attrs;
    use crate::pass::infer::infer_shapes;
    use crate::symbol::Symbol;

    fn deep_mlp(layers: usize) -> Symbol {
        let mut h = Symbol::variable("data", Attrs::new());
        for i in 0..layers {
            let attrs: Attrs = [("num_hidden".to_string(), "256".to_string())].into_iter().collect();
            h = Symbol::create("FullyConnected", attrs, &format!("fc{i}"), &[h], &[]).unwrap();
            let attrs: Attrs = [("act_type".to_string(), "relu".to_string())].into_iter().collect();
            h = Symbol::create("Activation", attrs, &format!("relu{i}"), &[h], &[]).unwrap();
        }
        h
    }

    fn plan(symbol: &Symbol, inplace: bool) -> MemoryPlan {
        let shapes = infer_shapes(&symbol.outputs, &|n| (n.name == "data").then(|| Shape::new(vec![64, 256]))).unwrap();
        let steps: Vec<_> = symbol.nodes().into_iter().filter(|n| !n.is_variable()).collect();
        let pinned: AddressSet<EntryKey> = symbol.outputs.iter().map(Entry::key).collect();
        let bytes = |e: &Entry| shapes.get(&e.key()).map(|s| s.size() * 4);
        plan_memory(&PlanRequest {
            steps: &steps,
            bytes: &bytes,
            pinned: &pinned,
            external: &AddressSet::default(),
            inplace,
            context: &|_| Context::cpu(0),
        })
    }

    #[test]
    fn a_chain_ping_pongs_between_two_blocks() {
        let layer = 64 * 256 * 4;
        let with_inplace = plan(&deep_mlp(10), true);
        assert_eq!(with_inplace.total_bytes(), 2 * layer, "{:?}", with_inplace.blocks);
        // Without in-place, each activation still co-shares with a value that has died.
        let without = plan(&deep_mlp(10), false);
        assert!(without.total_bytes() <= 3 * layer, "{:?}", without.blocks);
        assert!(without.total_bytes() < 20 * layer);
    }

    #[test]
    fn values_alive_at_once_never_share_a_block() {
        let symbol = deep_mlp(4);
        let p = plan(&symbol, true);
        // fc_i's output and relu_i's output may share (in place); fc_{i+1} reads relu_i while it
        // writes its own output, so those two must differ.
        let nodes = symbol.nodes();
        let find = |name: &str| Entry::new(nodes.iter().find(|n| n.name == name).unwrap().clone(), 0).key();
        assert_eq!(p.assignment[&find("fc1")], p.assignment[&find("relu1")]);
        assert_ne!(p.assignment[&find("relu1")], p.assignment[&find("fc2")]);
    }
}
