//! A whole graph as one operator (MXNet's CachedOp): what a hybridized Gluon block runs.
//!
//! Each call runs a compiled run of the graph for its input shapes and dtypes: the operators in
//! order and a static memory plan, the same as an executor's ([`super::plan`]). Not recorded,
//! element-wise chains run fused and only the outputs are fresh arrays. Under autograd the call
//! is recorded as ONE node, and its gradient is one node too: the graph's gradient, built once
//! by the gradient pass and planned together with the forward, so that the gradient's
//! temporaries reuse the forward's blocks as an executor's do. The forward values the gradient
//! reads leave the call as hidden outputs of the recorded node (views into the call's blocks),
//! so backward does not recompute the forward pass. With `static_alloc` the blocks are kept
//! across calls instead of allocated per call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::plan::{Layout, LayoutRequest, Schedule, StepObserver};
use super::{monitor_node, Monitored};
use crate::autograd::{self, FlagsGuard};
use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::graph::{address, node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::ndarray::NDArray;
use crate::op::grad::{Grad, InputGrads};
use crate::op::{Attrs, GradientIdentity, Operator};
use crate::pass::fuse::fusion_enabled;
use crate::pass::gradient::{self, SymbolGradient};
use crate::pass::inference_graph;
use crate::pass::{cse, infer, mirror};
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

/// Input shapes and dtypes: what a compiled run is specialized for.
type Signature = Vec<(Shape, DType)>;

/// Which graph inputs need a gradient (those that belong to a recorded graph).
type Needed = Vec<bool>;

/// How a cached graph runs (the flags of MXNet's `hybridize`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CachedOpFlags {
    /// Keep each compiled run's storage blocks across calls (MXNet's `static_alloc`) instead
    /// of allocating them per call.
    pub static_alloc: bool,
    /// Recompute cheap forward values during backward instead of keeping them from forward
    /// (as `MXNET_BACKWARD_DO_MIRROR=1` does for every graph).
    pub mirror: bool,
}

/// What one compiled run is for.
#[derive(Clone, PartialEq, Eq, Hash)]
struct RunKey {
    signature: Signature,
    ctx: Context,
    /// For a recorded call, which inputs need gradients; `None` for a call that is not recorded.
    needed: Option<Needed>,
    /// Whether element-wise chains run fused (never when recorded or observed).
    fused: bool,
}

/// A call's storage blocks: the forward blocks of a [`CompiledRun`]'s layout and the views of
/// the values planned in them.
struct Allocation {
    blocks: Vec<NDArray>,
    storage: AddressMap<EntryKey, NDArray>,
}

/// The gradient half of a recorded run.
struct BackwardRun {
    /// Shapes and dtypes of the gradient's inputs (the graph's inputs, the saved values, the
    /// head gradients) that `steps` were compiled for.
    signature: Vec<(Shape, DType)>,
    steps: Schedule,
    /// The gradient entries, in the order of the graph inputs that have one.
    targets: Vec<Entry>,
    /// The layout over forward and backward where backward may overwrite the saved forward
    /// values after their last use: for a backward that releases the graph (no
    /// `retain_graph`, no `create_graph`). The forward part equals the run's `layout`.
    consuming: Layout,
}

/// One compiled run of the graph: its operators, the memory plan over them, and (when
/// recorded) its gradient.
struct CompiledRun {
    /// What the forward returns: the visible outputs, then (recorded) the saved values.
    targets: Vec<Entry>,
    forward: Schedule,
    /// The memory plan; for a recorded run it spans forward and backward with the saved values
    /// kept intact (they may be differentiated again).
    layout: Layout,
    /// How many of the layout's blocks the forward steps use (a prefix, allocated per call).
    forward_blocks: usize,
    /// Whether a saved value lives in the forward blocks (else a recorded call need not keep
    /// them: its gradient reads nothing there).
    saved_in_blocks: bool,
    backward: Option<BackwardRun>,
    /// With `static_alloc`, allocations kept for later calls; one is free for a call when this
    /// list holds its only reference.
    // Lock invariant: held only to take or add an allocation, never while running the graph.
    kept: Mutex<Vec<Arc<Allocation>>>,
    /// The blocks of the recorded calls whose gradient has not released them yet: the gradient
    /// finds its call's among them by the saved values they hold, so that a gradient graph
    /// holds nothing of one call and serves every call alike (autograd reuses it).
    // Lock invariant: held only to add, prune or search the list, never while running the graph.
    in_flight: Mutex<Vec<Weak<CallBlocks>>>,
}

/// A recorded call's forward blocks, until a backward that releases the graph takes them.
type CallBlocks = Mutex<Option<Arc<Allocation>>>;

impl CompiledRun {
    /// Remember a recorded call's blocks for its gradient, forgetting calls that are gone.
    fn track(&self, blocks: &Arc<CallBlocks>) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.retain(|call| call.strong_count() > 0);
        in_flight.push(Arc::downgrade(blocks));
    }

    /// The blocks of the recorded call that computed `saved` (views into its blocks), if that
    /// call is still alive and its blocks not yet released.
    fn blocks_holding(&self, saved: &[NDArray]) -> Option<Arc<CallBlocks>> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.iter().filter_map(Weak::upgrade).find(|call| {
            let slot = call.lock().unwrap_or_else(|p| p.into_inner());
            slot.as_ref().is_some_and(|allocation| saved.iter().any(|value| allocation.blocks.iter().any(|block| block.same_chunk(value))))
        })
    }
}

struct Graph {
    symbol: Symbol,
    inputs: Vec<Arc<Node>>,
    flags: CachedOpFlags,
    /// Gradient plans per set of inputs needing gradients (a network's data input needs none,
    /// and its first layer then skips computing one).
    // Lock invariant: held only to look up or insert a plan, never while running one.
    plans: Mutex<HashMap<Needed, Arc<GradientPlan>>>,
    // Lock invariant: held only to look up or insert a run, never while running one.
    runs: Mutex<HashMap<RunKey, Arc<CompiledRun>>>,
    /// Planned bytes of the run used last, its backward's layout included (what `planned_bytes`
    /// reports).
    last_planned: AtomicUsize,
}

/// A graph called like an operator; clones share the compiled graph.
#[derive(Clone)]
pub struct CachedOp {
    graph: Arc<Graph>,
    _owner: Arc<Owner>,
}

/// Dropped with the last clone of a [`CachedOp`]: recorded calls and autograd's kept gradients
/// may still hold the graph, but nothing can call it again, so what is kept only for later
/// calls goes (the `static_alloc` blocks, the compiled gradients keyed by its runs).
struct Owner(Arc<Graph>);

impl Drop for Owner {
    fn drop(&mut self) {
        let runs: Vec<Arc<CompiledRun>> = self.0.runs.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for run in runs {
            run.kept.lock().unwrap_or_else(|p| p.into_inner()).clear();
            autograd::forget_gradients_of(GradientIdentity::Shared(Arc::as_ptr(&run) as usize));
        }
    }
}

impl CachedOp {
    /// Compile `symbol`: its inputs are [`Symbol::list_inputs`], in that order.
    pub fn new(symbol: Symbol) -> Result<CachedOp> {
        Self::with_flags(symbol, CachedOpFlags::default())
    }

    /// [`CachedOp::new`] with MXNet's hybridize flags.
    pub fn with_flags(symbol: Symbol, flags: CachedOpFlags) -> Result<CachedOp> {
        let inputs = symbol.input_nodes();
        // The graph the calls run, after the passes an executor applies at bind; the inputs
        // stay the caller's symbol's variables.
        let symbol = if cse::enabled() { Symbol { outputs: cse::eliminate_common_expr(&symbol.outputs)? } } else { symbol };
        let graph =
            Graph { symbol, inputs, flags, plans: Mutex::new(HashMap::new()), runs: Mutex::new(HashMap::new()), last_planned: AtomicUsize::new(0) };
        let graph = Arc::new(graph);
        Ok(CachedOp { graph: graph.clone(), _owner: Arc::new(Owner(graph)) })
    }

    pub fn symbol(&self) -> &Symbol {
        &self.graph.symbol
    }

    /// Bytes of the memory plan of the last call, forward and (when the call was recorded and
    /// differentiated) the backward that ran together: what an executor's `planned_bytes` is
    /// for a bound graph.
    pub fn planned_bytes(&self) -> usize {
        self.graph.last_planned.load(Ordering::Relaxed)
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
            let mut observe = |node: &Arc<Node>, ins: &[NDArray], outs: &[NDArray]| {
                monitor_node(node, ins, outs, monitor_all, &mut report);
                Ok(())
            };
            self.call_observed(inputs, default_ctx, Some(&mut observe))?
        };
        Ok((outputs, report))
    }

    fn call_observed(&self, inputs: &[NDArray], default_ctx: Context, observe: Option<StepObserver<'_>>) -> Result<Vec<NDArray>> {
        let graph = &self.graph;
        graph.check_inputs(inputs)?;
        let ctx = inputs.first().map_or(default_ctx, NDArray::context);
        let signature: Signature = inputs.iter().map(|a| (a.shape().clone(), a.dtype())).collect();
        if !autograd::should_record(inputs) {
            let key = RunKey { signature, ctx, needed: None, fused: observe.is_none() && fusion_enabled() };
            let run = graph.compiled(key, None)?;
            let allocation = graph.allocation(&run)?;
            return graph.forward(&run, &allocation, inputs, ctx, observe);
        }
        let needed: Needed = inputs.iter().map(|a| a.autograd_entry().is_some()).collect();
        let plan = graph.plan(&needed)?;
        let run = graph.compiled(RunKey { signature, ctx, needed: Some(needed), fused: false }, Some(&plan))?;
        let allocation = graph.allocation(&run)?;
        let outputs = graph.forward(&run, &allocation, inputs, ctx, observe)?;
        let blocks = Arc::new(Mutex::new(run.saved_in_blocks.then_some(allocation)));
        if run.saved_in_blocks {
            run.track(&blocks);
        }
        let call = CachedCall { graph: graph.clone(), plan, run, _blocks: blocks };
        let mut recorded = autograd::record("_CachedOp", Arc::new(call), &Attrs::new(), inputs, outputs);
        recorded.truncate(graph.symbol.outputs.len());
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

    /// The gradient plan for the inputs in `needed`, built once per set.
    fn plan(&self, needed: &Needed) -> Result<Arc<GradientPlan>> {
        if let Some(plan) = self.plans.lock().unwrap_or_else(|p| p.into_inner()).get(needed) {
            return Ok(plan.clone());
        }
        let symbol = &self.symbol;
        let forward: AddressSet<usize> = symbol.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
        let mirror = self.flags.mirror || mirror::enabled();
        let gradient =
            SymbolGradient::new(&symbol.outputs, &self.inputs, |i| needed.get(i).copied().unwrap_or(false), (&forward, mirror), &|_| None)?;
        let saved = gradient.saved(&forward);
        let SymbolGradient { head_grads, grads, .. } = gradient;
        let plan = Arc::new(GradientPlan { head_grads, grads, saved });
        self.plans.lock().unwrap_or_else(|p| p.into_inner()).insert(needed.clone(), plan.clone());
        Ok(plan)
    }

    /// The compiled run for `key`, compiled on first use (`plan`: the gradient, when recorded).
    fn compiled(&self, key: RunKey, plan: Option<&GradientPlan>) -> Result<Arc<CompiledRun>> {
        let found = self.runs.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let run = match found {
            Some(run) => run,
            None => {
                let run = Arc::new(self.compile(&key, plan)?);
                self.runs.lock().unwrap_or_else(|p| p.into_inner()).insert(key, run.clone());
                run
            }
        };
        self.last_planned.store(run.layout.total_bytes(), Ordering::Relaxed);
        Ok(run)
    }

    fn compile(&self, key: &RunKey, plan: Option<&GradientPlan>) -> Result<CompiledRun> {
        let given: AddressMap<usize, (Shape, DType)> = self.inputs.iter().map(node_key).zip(key.signature.iter().cloned()).collect();
        let outputs = &self.symbol.outputs;
        let forward_shapes = infer::infer_shapes(outputs, &|n: &Node| given.get(&address(n)).map(|g| g.0.clone()))?;
        let forward_types = infer::infer_types(outputs, &|n: &Node| given.get(&address(n)).map(|g| g.1))?;
        let mut targets = if key.fused { inference_graph(outputs, &forward_shapes, &forward_types, key.ctx.is_host())? } else { outputs.clone() };
        let visible: AddressSet<EntryKey> = targets.iter().map(Entry::key).collect();
        let forward_nodes: Vec<Arc<Node>> = topo_order(&targets, |_| false).into_iter().filter(|n| !n.is_variable()).collect();

        // Shapes and dtypes of every value, the gradient's included (head gradients are shaped
        // as their outputs).
        let mut given_shapes: AddressMap<usize, Shape> = given.iter().map(|(k, g)| (*k, g.0.clone())).collect();
        let mut given_types: AddressMap<usize, DType> = given.iter().map(|(k, g)| (*k, g.1)).collect();
        let mut all_targets = targets.clone();
        let mut backward_nodes = Vec::new();
        let mut gradient_targets = Vec::new();
        if let Some(plan) = plan {
            for (node, out) in plan.head_grads.iter().zip(outputs) {
                let (Some(shape), Some(&dtype)) = (forward_shapes.get(&out.key()), forward_types.get(&out.key())) else {
                    crate::bail!(Shape, "cannot infer the shape of output '{}' of the cached graph", out.node.name);
                };
                given_shapes.insert(node_key(node), shape.clone());
                given_types.insert(node_key(node), dtype);
            }
            targets.extend(plan.saved.iter().cloned());
            gradient_targets = plan.grads.iter().flatten().cloned().collect();
            let forward: AddressSet<usize> = forward_nodes.iter().map(node_key).collect();
            // The last layer's gradients first: each layer's temporaries die before the next
            // layer's are made.
            let reversed: Vec<Entry> = gradient_targets.iter().rev().cloned().collect();
            backward_nodes = gradient::backward_schedule(&reversed, &forward);
            all_targets.extend(gradient_targets.iter().cloned());
        }
        let shapes = infer::infer_shapes(&all_targets, &|n: &Node| given_shapes.get(&address(n)).cloned())?;
        let types = infer::infer_types(&all_targets, &|n: &Node| given_types.get(&address(n)).copied())?;

        // Outputs and gradients leave the call as fresh arrays; saved values live in the
        // blocks (which the recorded call holds until its gradient has run).
        let mut external: AddressSet<EntryKey> = visible;
        external.extend(gradient_targets.iter().map(Entry::key));
        let saved: AddressSet<EntryKey> = plan.map(|p| p.saved.iter().map(Entry::key).collect()).unwrap_or_default();
        let steps: Vec<Arc<Node>> = forward_nodes.iter().chain(&backward_nodes).cloned().collect();
        let ctx = key.ctx;
        let context_of = move |_: &Node| ctx;
        let request = |pinned| LayoutRequest { steps: &steps, shapes: &shapes, types: &types, pinned, external: &external, context: &context_of };
        let layout = Layout::plan(&request(&saved));
        let forward_keys: Vec<EntryKey> = forward_nodes.iter().flat_map(|n| (0..n.num_outputs()).map(move |i| (node_key(n), i))).collect();
        let forward_blocks = layout.blocks_needed_by(&forward_keys);
        let saved_in_blocks = layout.blocks_needed_by(&saved) > 0;
        let backward = match plan {
            Some(plan) => {
                let mut steps = Schedule::new(backward_nodes);
                steps.complete(&shapes)?;
                steps.fix_outputs(&shapes, &types);
                // The graph's inputs, the saved values, the head gradients (shaped as the outputs,
                // whether or not the gradient reads them).
                let saved_values = plan.saved.iter().map(|e| match (shapes.get(&e.key()), types.get(&e.key())) {
                    (Some(shape), Some(&dtype)) => Ok((shape.clone(), dtype)),
                    _ => Err(crate::err!(Shape, "cannot infer the shape of '{}', which the cached graph's gradient reads", e.node.name)),
                });
                let heads = plan.head_grads.iter().map(|n| match (given_shapes.get(&node_key(n)), given_types.get(&node_key(n))) {
                    (Some(shape), Some(&dtype)) => Ok((shape.clone(), dtype)),
                    _ => Err(crate::err!(Shape, "cannot infer the shape of the cached graph's output gradient '{}'", n.name)),
                });
                let signature = key.signature.iter().cloned().map(Ok).chain(saved_values).chain(heads).collect::<Result<Vec<_>>>()?;
                // Saved values nothing reads (a layer's unused statistics) stay pinned, as in
                // `layout`: the two layouts must agree on the forward steps, whose blocks the
                // call has already filled when its backward picks one.
                let read: AddressSet<EntryKey> = steps.nodes().iter().flat_map(|n| n.inputs.iter().map(Entry::key)).collect();
                let unread: AddressSet<EntryKey> = saved.iter().filter(|key| !read.contains(key)).copied().collect();
                let consuming = Layout::plan(&request(&unread));
                if !consuming.places_alike(&layout, &forward_keys) {
                    crate::bail!(Runtime, "internal error: the memory plans of a cached graph's backward disagree on its forward values");
                }
                Some(BackwardRun { signature, steps, targets: gradient_targets, consuming })
            }
            None => None,
        };
        let mut forward = Schedule::new(forward_nodes);
        forward.complete(&shapes)?;
        forward.fix_outputs(&shapes, &types);
        Ok(CompiledRun {
            targets,
            forward,
            layout,
            forward_blocks,
            saved_in_blocks,
            backward,
            kept: Mutex::new(Vec::new()),
            in_flight: Mutex::new(Vec::new()),
        })
    }

    /// Storage for one call of `run`: a kept allocation no other call holds (`static_alloc`),
    /// else new blocks (kept for later calls with `static_alloc`).
    fn allocation(&self, run: &CompiledRun) -> Result<Arc<Allocation>> {
        if self.flags.static_alloc {
            let kept = run.kept.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(free) = kept.iter().find(|a| Arc::strong_count(a) == 1) {
                return Ok(free.clone());
            }
        }
        let blocks = run.layout.allocate(0..run.forward_blocks)?;
        let storage = run.layout.storage(&blocks)?;
        let allocation = Arc::new(Allocation { blocks, storage });
        if self.flags.static_alloc {
            run.kept.lock().unwrap_or_else(|p| p.into_inner()).push(allocation.clone());
        }
        Ok(allocation)
    }

    /// Push the forward steps of `run` on `inputs` into `allocation`; the values of its targets.
    fn forward(
        &self,
        run: &CompiledRun,
        allocation: &Allocation,
        inputs: &[NDArray],
        ctx: Context,
        observe: Option<StepObserver<'_>>,
    ) -> Result<Vec<NDArray>> {
        let _symbolic = crate::profiler::symbolic_section();
        let _flags = FlagsGuard::set(false, autograd::is_training());
        let mut values: AddressMap<EntryKey, NDArray> = self.inputs.iter().zip(inputs).map(|(n, a)| ((node_key(n), 0), a.detached())).collect();
        run.forward.run(&mut values, &allocation.storage, &|_| ctx, observe)?;
        run.targets
            .iter()
            .map(|t| values.get(&t.key()).cloned().ok_or_else(|| crate::err!(Runtime, "graph output of node '{}' was not computed", t.node.name)))
            .collect()
    }
}

/// One recorded call of a cached graph: the graph with the gradient plan for the inputs that
/// needed gradients when it was called. Its hidden outputs are the plan's saved values.
struct CachedCall {
    graph: Arc<Graph>,
    plan: Arc<GradientPlan>,
    run: Arc<CompiledRun>,
    /// Keeps the call's forward blocks (which hold the saved values, and which its gradient's
    /// temporaries reuse) alive while the call is recorded: the gradient finds them through
    /// `run`, and a backward that releases the graph takes them out.
    // Lock invariant: the slot's lock is held only to clone or take the allocation.
    _blocks: Arc<CallBlocks>,
}

impl CachedCall {
    fn visible(&self) -> usize {
        self.graph.symbol.outputs.len()
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
        let targets = &self.run.targets;
        let shapes = infer::infer_shapes(targets, &|n: &Node| given.get(&address(n)).cloned())?;
        targets
            .iter()
            .map(|e| shapes.get(&e.key()).cloned().ok_or_else(|| crate::err!(Shape, "cannot infer the shape of node '{}'", e.node.name)))
            .collect()
    }
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], _into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        // A recorded graph re-run as one node (a recorded backward differentiating it again).
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        self.graph.allocation(&self.run).and_then(|allocation| self.graph.forward(&self.run, &allocation, inputs, ctx, None))
    }
    /// The compiled run (graph, input signature, gradient plan); the gradient holds nothing of
    /// this call (it finds the call's blocks by its saved values).
    fn gradient_identity(&self) -> GradientIdentity {
        GradientIdentity::Shared(Arc::as_ptr(&self.run) as usize)
    }
    fn gradient(&self, d: &mut Grad) -> Result<InputGrads> {
        let visible = self.visible();
        let mut node_inputs: Vec<Entry> = (0..d.num_inputs()).map(|i| d.input(i)).collect();
        node_inputs.extend((visible..d.num_outputs()).map(|i| d.output(i)));
        node_inputs.extend(d.out_grads().iter().take(visible).cloned());
        let backward = CachedBackward { graph: self.graph.clone(), plan: self.plan.clone(), run: self.run.clone() };
        let mut grads = d.instance_outputs("_backward_CachedOp", Arc::new(backward), &node_inputs).into_iter();
        Ok(self.plan.grads.iter().map(|g| g.as_ref().and_then(|_| grads.next())).collect())
    }
}

/// The gradient of a cached graph: inputs are the graph's inputs, its saved forward values and
/// the head gradients; outputs are the gradients of the inputs that have one.
struct CachedBackward {
    graph: Arc<Graph>,
    plan: Arc<GradientPlan>,
    run: Arc<CompiledRun>,
}

/// `into[i]` for each target i whose entry no other target shares (an array can take one value).
fn unique_destinations(targets: &[Entry], into: &[Option<NDArray>]) -> AddressMap<EntryKey, NDArray> {
    let mut claims: AddressMap<EntryKey, usize> = AddressMap::default();
    for t in targets {
        *claims.entry(t.key()).or_default() += 1;
    }
    targets.iter().zip(into).filter_map(|(t, dest)| dest.clone().filter(|_| claims.get(&t.key()) == Some(&1)).map(|d| (t.key(), d))).collect()
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
    fn compute(&self) -> crate::op::Compute {
        crate::op::Compute::Graph
    }
    fn compute_arrays(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        self.differentiate(inputs, into)
    }
}

impl CachedBackward {
    fn differentiate(&self, inputs: &[NDArray], into: &[Option<NDArray>]) -> Result<Vec<NDArray>> {
        let g = &self.graph;
        let backward =
            self.run.backward.as_ref().ok_or_else(|| crate::err!(Runtime, "a cached graph's gradient was compiled without its backward run"))?;
        // The steps' output shapes were fixed for these input shapes: a head gradient of another
        // shape must not reach them.
        if let Some((i, (a, (shape, dtype)))) =
            inputs.iter().zip(&backward.signature).enumerate().find(|(_, (a, (shape, dtype)))| a.shape() != shape || a.dtype() != *dtype)
        {
            let names = self.input_names();
            let name = names.get(i).map_or("input", String::as_str);
            crate::bail!(Shape, "_backward_CachedOp: {name} has shape {} and dtype {}, expected {shape} and {dtype}", a.shape(), a.dtype());
        }
        if inputs.len() != backward.signature.len() {
            crate::bail!(Value, "_backward_CachedOp: expects {} inputs, got {}", backward.signature.len(), inputs.len());
        }
        let (graph_inputs, rest) = inputs.split_at(g.inputs.len());
        let (saved, head_grads) = rest.split_at(self.plan.saved.len());
        let mut values: AddressMap<EntryKey, NDArray> = g.inputs.iter().zip(graph_inputs).map(|(n, a)| ((node_key(n), 0), a.detached())).collect();
        values.extend(self.plan.head_grads.iter().zip(head_grads).map(|(n, a)| ((node_key(n), 0), a.detached())));
        values.extend(self.plan.saved.iter().zip(saved).map(|(e, a)| (e.key(), a.detached())));
        // A backward that releases the graph may overwrite the saved values after their last
        // use (and frees the call's blocks after it); one that keeps the graph may not.
        let releases = autograd::backward_releases_graph();
        // The call's own blocks, found by the saved values they hold (none when every saved
        // value is an output of the call, or a backward released them already: then new ones).
        let forward_blocks = self.run.blocks_holding(saved).and_then(|call| {
            let mut slot = call.lock().unwrap_or_else(|p| p.into_inner());
            if releases {
                slot.take()
            } else {
                slot.clone()
            }
        });
        let layout = if releases { &backward.consuming } else { &self.run.layout };
        g.last_planned.store(layout.total_bytes(), Ordering::Relaxed);
        let mut blocks = match &forward_blocks {
            Some(allocation) => allocation.blocks.clone(),
            None => self.run.layout.allocate(0..self.run.forward_blocks)?,
        };
        blocks.extend(layout.allocate(blocks.len()..layout.block_count())?);
        let mut storage = layout.storage(&blocks)?;
        storage.extend(unique_destinations(&backward.targets, into));
        let ctx = inputs.first().map_or(Context::cpu(0), NDArray::context);
        let _symbolic = crate::profiler::symbolic_section();
        backward.steps.run(&mut values, &storage, &|_| ctx, None)?;
        backward
            .targets
            .iter()
            .map(|t| values.get(&t.key()).cloned().ok_or_else(|| crate::err!(Runtime, "gradient of node '{}' was not computed", t.node.name)))
            .collect()
    }
}
