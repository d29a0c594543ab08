//! A whole graph as one operator (MXNet's CachedOp): what a hybridized Gluon block runs.
//!
//! Called imperatively it pushes the graph's operators through the shared runner; under autograd
//! it is recorded as ONE node. Its gradient is one node too: the graph's gradient, built once by
//! the gradient pass. The forward values that gradient reads leave the forward call as hidden
//! outputs of the recorded node, so backward does not recompute the forward pass. Calls that
//! are not recorded run the graph with element-wise chains fused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{monitor_node, run, Monitored, Observer, Source};
use crate::autograd::{self, FlagsGuard};
use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::graph::{address, node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::ndarray::NDArray;
use crate::op::grad::{Grad, InputGrads};
use crate::op::{Attrs, ExecContext, Operator, Tensor};
use crate::pass::fuse::{fuse_elementwise, fusion_enabled};
use crate::pass::gradient;
use crate::symbol::Symbol;

/// The graph's gradient with respect to each input, and the forward values it reads.
struct GradientPlan {
    /// One variable per visible output, standing for its head gradient.
    head_grads: Vec<Arc<Node>>,
    /// Per graph input: its gradient entry, `None` when no output depends on it.
    grads: Vec<Option<Entry>>,
    /// Forward entries the gradient graph reads, exported as hidden outputs.
    saved: Vec<Entry>,
}

/// Input shapes and dtypes: what a fused variant of the graph is specialized for.
type Signature = Vec<(Shape, DType)>;

/// Which graph inputs need a gradient (those that belong to a recorded graph).
type Needed = Vec<bool>;

struct Graph {
    symbol: Symbol,
    inputs: Vec<Arc<Node>>,
    /// Gradient plans per set of inputs needing gradients (a network's data input needs none,
    /// and its first layer then skips computing one).
    // Lock invariant: held only to look up or insert a plan, never while running one.
    plans: Mutex<HashMap<Needed, Arc<GradientPlan>>>,
    /// Outputs of the graph with element-wise chains fused, per input signature (calls that are
    /// not recorded need no intermediate values and run these).
    // Lock invariant: held only to look up or insert a variant, never while running one.
    fused: Mutex<HashMap<Signature, Arc<Vec<Entry>>>>,
}

/// A graph called like an operator; clones share the compiled graph.
#[derive(Clone)]
pub struct CachedOp {
    graph: Arc<Graph>,
}

impl CachedOp {
    /// Compile `symbol`: its inputs are [`Symbol::list_inputs`], in that order.
    pub fn new(symbol: Symbol) -> Result<CachedOp> {
        let inputs = symbol.input_nodes();
        let graph = Graph { symbol, inputs, plans: Mutex::new(HashMap::new()), fused: Mutex::new(HashMap::new()) };
        Ok(CachedOp { graph: Arc::new(graph) })
    }

    /// The gradient plan for the inputs in `needed`, built once per set.
    fn plan(&self, needed: &Needed) -> Result<Arc<GradientPlan>> {
        if let Some(plan) = self.graph.plans.lock().unwrap_or_else(|p| p.into_inner()).get(needed) {
            return Ok(plan.clone());
        }
        let symbol = &self.graph.symbol;
        let head_grads: Vec<Arc<Node>> =
            (0..symbol.outputs.len()).map(|i| Node::variable(format!("head_grad{i}"), Attrs::new())).collect();
        let head_entries: Vec<Entry> = head_grads.iter().map(|n| Entry::new(n.clone(), 0)).collect();
        let wanted: Vec<usize> = (0..needed.len()).filter(|&i| needed[i]).collect();
        let xs: Vec<Entry> = wanted.iter().map(|&i| Entry::new(self.graph.inputs[i].clone(), 0)).collect();
        let found = gradient::gradient(&symbol.outputs, &head_entries, &xs, &|_| None)?;
        let mut grads = vec![None; needed.len()];
        for (&i, g) in wanted.iter().zip(found) {
            grads[i] = g;
        }
        let forward: AddressSet<usize> = symbol.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
        let targets: Vec<Entry> = grads.iter().rev().flatten().cloned().collect();
        let saved = topo_order(&targets, |n| forward.contains(&node_key(n)))
            .into_iter()
            .filter(|n| forward.contains(&node_key(n)))
            .flat_map(|n| (0..n.num_outputs()).map(move |i| Entry::new(n.clone(), i)))
            .collect();
        let plan = Arc::new(GradientPlan { head_grads, grads, saved });
        self.graph.plans.lock().unwrap_or_else(|p| p.into_inner()).insert(needed.clone(), plan.clone());
        Ok(plan)
    }

    pub fn symbol(&self) -> &Symbol {
        &self.graph.symbol
    }


    /// The graph's outputs with element-wise chains fused for these inputs' shapes and dtypes.
    fn fused_outputs(&self, inputs: &[NDArray]) -> Result<Arc<Vec<Entry>>> {
        let signature: Signature = inputs.iter().map(|a| (a.shape().clone(), a.dtype())).collect();
        if let Some(found) = self.graph.fused.lock().unwrap_or_else(|p| p.into_inner()).get(&signature) {
            return Ok(found.clone());
        }
        let given: AddressMap<usize, (Shape, DType)> = self.graph.inputs.iter().map(node_key).zip(signature.iter().cloned()).collect();
        let outputs = &self.graph.symbol.outputs;
        let shapes = crate::pass::infer::infer_shapes(outputs, &|n: &Node| given.get(&address(n)).map(|g| g.0.clone()))?;
        let types = crate::pass::infer::infer_types(outputs, &|n: &Node| given.get(&address(n)).map(|g| g.1))?;
        let fused = Arc::new(fuse_elementwise(outputs, &shapes, &types));
        self.graph.fused.lock().unwrap_or_else(|p| p.into_inner()).insert(signature, fused.clone());
        Ok(fused)
    }

    fn compute(&self, inputs: &[NDArray], ctx: Context) -> Result<Vec<NDArray>> {
        let targets = if fusion_enabled() { self.fused_outputs(inputs)?.to_vec() } else { self.graph.symbol.outputs.clone() };
        self.graph.run(&targets, inputs, ctx, None)
    }

    /// Run the graph on `inputs`; when autograd records, the call becomes one recorded node.
    pub fn call(&self, inputs: &[NDArray], default_ctx: Context) -> Result<Vec<NDArray>> {
        self.call_observed(inputs, default_ctx, None)
    }

    /// [`CachedOp::call`] reporting, as each operator runs, its inputs (with `monitor_all`) and
    /// outputs under MXNet's names (Gluon's op hooks). Element-wise chains are not fused here,
    /// so that every node of the graph reports.
    pub fn call_monitored(&self, inputs: &[NDArray], default_ctx: Context, monitor_all: bool) -> Result<(Vec<NDArray>, Vec<Monitored>)> {
        let mut report = Vec::new();
        let outputs = {
            let mut observe = |node: &Arc<Node>, ins: &[NDArray], outs: &[NDArray]| monitor_node(node, ins, outs, monitor_all, &mut report);
            self.call_observed(inputs, default_ctx, Some(&mut observe as Observer<'_>))?
        };
        Ok((outputs, report))
    }

    fn call_observed(&self, inputs: &[NDArray], default_ctx: Context, observe: Option<Observer<'_>>) -> Result<Vec<NDArray>> {
        let _symbolic = crate::profiler::symbolic_section();
        self.graph.check_inputs(inputs)?;
        let ctx = inputs.first().map_or(default_ctx, NDArray::context);
        if !autograd::should_record(inputs) {
            return match observe {
                Some(observe) => self.graph.run(&self.graph.symbol.outputs, inputs, ctx, Some(observe)),
                None => self.compute(inputs, ctx),
            };
        }
        let needed: Needed = inputs.iter().map(|a| a.autograd_entry().is_some()).collect();
        let call = CachedCall { graph: self.graph.clone(), plan: self.plan(&needed)? };
        let outputs = call.compute(inputs, ctx, observe)?;
        let mut recorded = autograd::record("_CachedOp", Arc::new(call), &Attrs::new(), inputs, outputs);
        recorded.truncate(self.graph.symbol.outputs.len());
        Ok(recorded)
    }
}

impl Graph {
    fn check_inputs(&self, inputs: &[NDArray]) -> Result<()> {
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|n| n.name.as_str()).collect();
            crate::bail!(Value, "cached graph takes {} input(s) ({}), got {}", names.len(), names.join(", "), inputs.len());
        }
        Ok(())
    }

    /// Values of `targets` with the graph's inputs bound to `inputs`.
    fn run(&self, targets: &[Entry], inputs: &[NDArray], ctx: Context, observe: Option<Observer<'_>>) -> Result<Vec<NDArray>> {
        self.check_inputs(inputs)?;
        let bound: AddressMap<usize, NDArray> = self.inputs.iter().zip(inputs).map(|(n, a)| (node_key(n), a.detached())).collect();
        let _flags = FlagsGuard::set(false, autograd::is_training());
        run(targets, &AddressMap::default(), ctx, |node| match bound.get(&node_key(node)) {
            Some(a) => Ok(Source::Known(vec![a.clone()])),
            None if node.is_variable() => crate::bail!(Value, "graph input '{}' is not bound", node.name),
            None => Ok(Source::Compute),
        }, observe)
    }
}

/// One recorded call of a cached graph: the graph with the gradient plan for the inputs that
/// needed gradients when it was called. Its hidden outputs are the plan's saved values.
struct CachedCall {
    graph: Arc<Graph>,
    plan: Arc<GradientPlan>,
}

impl CachedCall {
    fn visible(&self) -> usize {
        self.graph.symbol.outputs.len()
    }

    fn targets(&self) -> Vec<Entry> {
        let mut targets = self.graph.symbol.outputs.clone();
        targets.extend(self.plan.saved.iter().cloned());
        targets
    }

    fn compute(&self, inputs: &[NDArray], ctx: Context, observe: Option<Observer<'_>>) -> Result<Vec<NDArray>> {
        self.graph.run(&self.targets(), inputs, ctx, observe)
    }
}

impl Operator for CachedCall {
    fn input_names(&self) -> Vec<String> {
        self.graph.inputs.iter().map(|n| n.name.clone()).collect()
    }
    fn num_outputs(&self) -> usize {
        self.visible() + self.plan.saved.len()
    }
    fn num_visible_outputs(&self) -> usize {
        self.visible()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        let given: AddressMap<usize, Shape> = self.graph.inputs.iter().zip(inputs).map(|(n, s)| (node_key(n), s.clone())).collect();
        let targets = self.targets();
        let shapes = crate::pass::infer::infer_shapes(&targets, &|n: &Node| given.get(&address(n)).cloned())?;
        targets
            .iter()
            .map(|e| shapes.get(&e.key()).cloned().ok_or_else(|| crate::err!(Shape, "cannot infer the shape of node '{}'", e.node.name)))
            .collect()
    }
    fn forward(&self, _ctx: &ExecContext, _inputs: &[Tensor], _outputs: &[Tensor]) -> Result<()> {
        crate::bail!(Runtime, "a cached graph runs its operators itself, not as one kernel")
    }
    fn run_on_host(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Option<Result<Vec<NDArray>>> {
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        Some(self.compute(inputs, ctx, None))
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let visible = self.visible();
        let mut node_inputs: Vec<Entry> = (0..d.num_inputs()).map(|i| d.input(i)).collect();
        node_inputs.extend((visible..d.num_outputs()).map(|i| d.output(i)));
        node_inputs.extend(d.out_grads()[..visible].iter().cloned());
        let backward = CachedBackward { graph: self.graph.clone(), plan: self.plan.clone() };
        let mut grads = d.instance_outputs("_backward_CachedOp", Arc::new(backward), &node_inputs).into_iter();
        Ok(self.plan.grads.iter().map(|g| g.as_ref().and_then(|_| grads.next())).collect())
    }
}

/// The gradient of a cached graph: inputs are the graph's inputs, its saved forward values and
/// the head gradients; outputs are the gradients of the inputs that have one.
struct CachedBackward {
    graph: Arc<Graph>,
    plan: Arc<GradientPlan>,
}

/// `into[i]` for each target i whose entry no other target shares (an array can take one value).
fn unique_destinations(targets: &[Entry], into: &[Option<NDArray>]) -> AddressMap<EntryKey, NDArray> {
    let mut claims: AddressMap<EntryKey, usize> = AddressMap::default();
    for t in targets {
        *claims.entry(t.key()).or_default() += 1;
    }
    targets.iter().zip(into).filter_map(|(t, dest)| dest.clone().filter(|_| claims[&t.key()] == 1).map(|d| (t.key(), d))).collect()
}

impl Operator for CachedBackward {
    fn input_names(&self) -> Vec<String> {
        let g = &self.graph;
        let mut names: Vec<String> = g.inputs.iter().map(|n| n.name.clone()).collect();
        names.extend((0..self.plan.saved.len()).map(|i| format!("saved{i}")));
        names.extend((0..self.plan.head_grads.len()).map(|i| format!("head_grad{i}")));
        names
    }
    fn num_outputs(&self) -> usize {
        self.plan.grads.iter().flatten().count()
    }
    fn infer_shape(&self, inputs: &[Shape]) -> Result<Vec<Shape>> {
        Ok(self.plan.grads.iter().zip(inputs).filter(|(grad, _)| grad.is_some()).map(|(_, s)| s.clone()).collect())
    }
    fn forward(&self, _ctx: &ExecContext, _inputs: &[Tensor], _outputs: &[Tensor]) -> Result<()> {
        crate::bail!(Runtime, "a cached graph's gradient runs its operators itself, not as one kernel")
    }
    fn run_on_host(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Option<Result<Vec<NDArray>>> {
        let g = &self.graph;
        let (graph_inputs, rest) = inputs.split_at(g.inputs.len());
        let (saved, head_grads) = rest.split_at(self.plan.saved.len());
        let mut known: AddressMap<usize, NDArray> =
            g.inputs.iter().zip(graph_inputs).map(|(n, a)| (node_key(n), a.detached())).collect();
        known.extend(self.plan.head_grads.iter().zip(head_grads).map(|(n, a)| (node_key(n), a.detached())));
        let mut saved_values: AddressMap<usize, Vec<Option<NDArray>>> = AddressMap::default();
        for (entry, value) in self.plan.saved.iter().zip(saved) {
            let slots = saved_values.entry(node_key(&entry.node)).or_insert_with(|| vec![None; entry.node.num_outputs()]);
            slots[entry.index] = Some(value.detached());
        }
        let targets: Vec<Entry> = self.plan.grads.iter().flatten().cloned().collect();
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        Some(run(&targets, &unique_destinations(&targets, into), ctx, |node| {
            if let Some(a) = known.get(&node_key(node)) {
                return Ok(Source::Known(vec![a.clone()]));
            }
            match saved_values.get(&node_key(node)) {
                Some(slots) => Ok(Source::Known(slots.iter().map(|s| s.clone().expect("every output of a saved node is saved")).collect())),
                None if node.is_variable() => crate::bail!(Value, "graph input '{}' is not bound", node.name),
                None => Ok(Source::Compute),
            }
        }, None))
    }
}
