//! The computation graph shared by autograd, Symbol and the executor.
//!
//! A [`Node`] is a variable (no operator) or one operator applied to the outputs ([`Entry`]) of
//! earlier nodes. Nodes are immutable once built and shared through `Arc`, so a graph is simply
//! the set of nodes reachable from its output entries; autograd's recorded values hang off the
//! nodes that produced them.
// Programs' arguments and saved graphs arrive here: no unwrap and no unchecked indexing, so that
// bad input can only ever produce an error (issue 23's lint discipline, as in `io`).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod dot;

pub use dot::to_dot;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::ndarray::NDArray;
use crate::op::{self, Attrs, Operator};

/// How a variable's gradient is stored (MXNet's `grad_req`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradReq {
    Null,
    Write,
    Add,
}

impl GradReq {
    pub fn parse(text: &str) -> Result<GradReq> {
        match text {
            "null" => Ok(GradReq::Null),
            "write" | "inplace" => Ok(GradReq::Write),
            "add" => Ok(GradReq::Add),
            other => crate::bail!(Value, "grad_req must be 'write', 'add' or 'null', got '{other}'"),
        }
    }
}

/// An operator as a node applies it: the name it was called by, its attribute strings (kept for
/// Symbol JSON) and the parsed instance.
pub struct NodeOp {
    pub name: String,
    pub attrs: Attrs,
    pub operator: Arc<dyn Operator>,
}

/// Values autograd keeps on a node while its graph is alive.
pub enum Recorded {
    /// Nothing recorded (a symbolic node), or released after a backward pass without
    /// `retain_graph`.
    Nothing,
    /// The outputs an operator produced while recording, without their autograd entries (a node
    /// must not own entries pointing back at itself).
    Outputs(Vec<NDArray>),
    /// A leaf: its value, and where its gradient goes when it is a marked variable.
    Leaf { value: NDArray, grad: Option<NDArray>, req: GradReq },
}

pub struct Node {
    /// `None` for a variable.
    pub op: Option<NodeOp>,
    pub name: String,
    pub inputs: Vec<Entry>,
    /// Symbol attributes that are not operator parameters: a variable's `__shape__`,
    /// `__lr_mult__`, `ctx_group`, ... (MXNet keeps both kinds in one JSON `attrs` object).
    // Lock invariant: held only to read or update the map, never across another lock.
    annotations: Mutex<Attrs>,
    // Lock invariant: held only to read or replace the recorded values, never across a call
    // that could record (and so lock another node).
    recorded: Mutex<Recorded>,
}

impl Node {
    pub fn variable(name: impl Into<String>, annotations: Attrs) -> Arc<Node> {
        Arc::new(Node {
            op: None,
            name: name.into(),
            inputs: Vec::new(),
            annotations: Mutex::new(annotations),
            recorded: Mutex::new(Recorded::Nothing),
        })
    }

    pub fn leaf(name: impl Into<String>, value: NDArray, grad: Option<NDArray>, req: GradReq) -> Arc<Node> {
        Arc::new(Node {
            op: None,
            name: name.into(),
            inputs: Vec::new(),
            annotations: Mutex::new(Attrs::new()),
            recorded: Mutex::new(Recorded::Leaf { value, grad, req }),
        })
    }

    /// A node applying the operator registered as `op_name` with `attrs` to `inputs`.
    pub fn apply(op_name: &str, attrs: Attrs, inputs: Vec<Entry>, name: impl Into<String>) -> Result<Arc<Node>> {
        let operator = op::lookup(op_name)?.instantiate(op_name, &attrs)?;
        Ok(Node::with_operator(NodeOp { name: op_name.to_string(), attrs, operator }, inputs, name, Recorded::Nothing))
    }

    pub fn with_operator(op: NodeOp, inputs: Vec<Entry>, name: impl Into<String>, recorded: Recorded) -> Arc<Node> {
        Arc::new(Node { op: Some(op), name: name.into(), inputs, annotations: Mutex::new(Attrs::new()), recorded: Mutex::new(recorded) })
    }

    /// A node applying `op` with symbol annotations.
    pub fn annotated(op: NodeOp, inputs: Vec<Entry>, name: impl Into<String>, annotations: Attrs) -> Arc<Node> {
        Arc::new(Node { op: Some(op), name: name.into(), inputs, annotations: Mutex::new(annotations), recorded: Mutex::new(Recorded::Nothing) })
    }

    pub fn annotations(&self) -> MutexGuard<'_, Attrs> {
        // As for `recorded`: a poisoned map is still a valid map.
        self.annotations.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_variable(&self) -> bool {
        self.op.is_none()
    }

    pub fn num_outputs(&self) -> usize {
        self.op.as_ref().map_or(1, |o| o.operator.num_outputs())
    }

    pub fn recorded(&self) -> MutexGuard<'_, Recorded> {
        // A poisoned lock only means a panic elsewhere while it was held; the data is a plain
        // enum that is always in a valid state.
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A recorded chain of a million ops would recurse a million frames deep if each node
        // dropped its inputs in turn: unlink the nodes this one solely owns iteratively.
        let mut orphans: Vec<Arc<Node>> = self.inputs.drain(..).map(|e| e.node).collect();
        while let Some(node) = orphans.pop() {
            if let Ok(mut owned) = Arc::try_unwrap(node) {
                orphans.extend(owned.inputs.drain(..).map(|e| e.node));
            }
        }
    }
}

/// Hashes node addresses and entry keys: they are already well distributed, so one multiply per
/// word suffices (the default SipHash costs more than the graph walk around it).
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply leaves the entropy of aligned addresses in the high bits; tables index
        // buckets with the low bits, so fold the high half down.
        self.0 ^ (self.0 >> 32)
    }
}

pub type AddressMap<K, V> = HashMap<K, V, BuildHasherDefault<AddressHasher>>;
pub type AddressSet<K> = HashSet<K, BuildHasherDefault<AddressHasher>>;

/// One output of a node.
#[derive(Clone)]
pub struct Entry {
    pub node: Arc<Node>,
    pub index: usize,
}

impl Entry {
    pub fn new(node: Arc<Node>, index: usize) -> Entry {
        Entry { node, index }
    }
    /// Identity of the value this entry names (node address and output index).
    pub fn key(&self) -> EntryKey {
        (Arc::as_ptr(&self.node) as usize, self.index)
    }
}

pub type EntryKey = (usize, usize);

pub fn node_key(node: &Arc<Node>) -> usize {
    address(node)
}

/// The identity [`node_key`] gives, from a plain reference (inference callbacks get `&Node`).
pub fn address(node: &Node) -> usize {
    node as *const Node as usize
}

/// Every node reachable from `outputs`, inputs before the nodes that use them. `stop` is asked
/// once per node whether to leave its inputs unvisited (their values are known).
pub fn topo_order(outputs: &[Entry], mut stop: impl FnMut(&Arc<Node>) -> bool) -> Vec<Arc<Node>> {
    let mut order = Vec::new();
    let mut seen = AddressSet::default();
    // Iterative post-order DFS: deep recorded chains must not overflow the stack.
    let mut stack: Vec<(Arc<Node>, usize, bool)> = Vec::new();
    for out in outputs {
        if !seen.insert(node_key(&out.node)) {
            continue;
        }
        let follow = !stop(&out.node);
        stack.push((out.node.clone(), 0, follow));
        while let Some((node, next, follow)) = stack.pop() {
            if let Some(input) = node.inputs.get(next).filter(|_| follow) {
                let child = input.node.clone();
                stack.push((node, next + 1, follow));
                if seen.insert(node_key(&child)) {
                    let child_follow = !stop(&child);
                    stack.push((child, 0, child_follow));
                }
            } else {
                order.push(node);
            }
        }
    }
    order
}
