//! A symbol bound to arrays (MXNet's `Executor`): forward fills the outputs, backward the
//! gradient arrays.
//!
//! Binding compiles the run once: the gradient graph (the same pass autograd uses), the order of
//! forward and backward operators, and a static memory plan over both, so every intermediate
//! lives in a block allocated at bind time and blocks are shared by values whose lifetimes do not
//! overlap (in place where an operator allows it). Gradients for `grad_req='write'` are written
//! straight into the gradient arrays. Inference-only executors run element-wise chains fused.

use std::sync::Arc;

use super::plan::{Layout, LayoutRequest, Schedule};
use crate::autograd::FlagsGuard;
use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::graph::{address, node_key, topo_order, AddressMap, AddressSet, Entry, EntryKey, GradReq, Node};
use crate::imperative;
use crate::ndarray::NDArray;
use crate::op::Attrs;
use crate::pass::fuse::fusion_enabled;
use crate::pass::gradient::{self, SymbolGradient};
use crate::pass::inference_graph;
use crate::pass::{cse, infer, mirror};
use crate::symbol::Symbol;

/// The gradient graph of a bound symbol.
struct BackwardPlan {
    /// One variable per symbol output, standing for that output's head gradient.
    head_grads: Vec<Arc<Node>>,
    /// Per output: whether the gradient graph reads its head gradient at all (a loss layer's
    /// gradient, SoftmaxOutput's, ignores it, so no all-ones array is made for it).
    head_read: Vec<bool>,
    /// For each argument: its gradient entry (`None`: no gradient wanted, or zero).
    grads: Vec<Option<Entry>>,
    /// Gradient operators in execution order.
    steps: Schedule,
    /// Arguments whose gradient node writes straight into the gradient array.
    direct: Vec<bool>,
    /// The input gradients of each differentiated forward node, for monitors.
    by_node: Vec<gradient::NodeGradients>,
}

/// One input gradient of a forward node as a monitor reports it after backward.
struct MonitoredGradient {
    /// MXNet's name for it: `<node>_backward_output<i>` (`<node>_backward_output` when the
    /// node has one input).
    name: String,
    /// `None` where the gradient pass computes none (not needed, or zero).
    entry: Option<Entry>,
    /// Shape, dtype and device of the zeros reported where there is no entry.
    zeros: Option<(Shape, DType, Context)>,
}

pub struct BoundExecutor {
    symbol: Symbol,
    ctx: Context,
    arg_nodes: Vec<Arc<Node>>,
    aux_nodes: Vec<Arc<Node>>,
    pub args: Vec<NDArray>,
    pub grads: Vec<Option<NDArray>>,
    pub grad_reqs: Vec<GradReq>,
    pub aux: Vec<NDArray>,
    pub outputs: Vec<NDArray>,
    /// The entries the forward pass computes as outputs (of the fused graph when fused).
    forward_outputs: Vec<Entry>,
    forward_steps: Schedule,
    plan: Option<BackwardPlan>,
    /// Planned storage of every intermediate value (views into the blocks).
    storage: AddressMap<EntryKey, NDArray>,
    planned_bytes: usize,
    /// The storage blocks of the plan, which an executor bound with this one as `shared` reuses.
    blocks: Vec<NDArray>,
    /// Values of the last forward pass, which backward reads.
    values: AddressMap<EntryKey, NDArray>,
    /// Whether a forward pass has run (backward reads its values).
    forwarded: bool,
    /// The device of each operator node (its `__ctx_group__`'s in `group2ctx`, else `ctx`).
    contexts: AddressMap<usize, Context>,
    monitored: Vec<MonitoredGradient>,
    /// All-ones head gradients, one per output whose head gradient the gradient graph reads,
    /// filled at bind and never written again: `backward` without head gradients reads them.
    /// An executor bound with a `shared` one views that executor's where they are large enough
    /// (ones are ones at any shape), so buckets and reshaped executors hold one such array per
    /// output between them, as MXNet does.
    head_ones: Vec<Option<NDArray>>,
}

impl BoundExecutor {
    /// Bind `symbol` to argument arrays (in `list_arguments` order), their gradient buffers and
    /// requests, and auxiliary state arrays (in `list_auxiliary_states` order). With `shared`,
    /// the planned storage reuses that executor's blocks where they are large enough (MXNet's
    /// `shared_exec`, how `Executor.reshape` and bucketing share memory), so the two must not
    /// run at the same time.
    ///
    /// `group2ctx` places the nodes annotated with a `__ctx_group__` (and the gradient nodes
    /// built for them) on that group's device; the others run on `ctx`. Values crossing devices
    /// are copied, and arrays may then be bound on any device (MXNet's model parallelism).
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        symbol: Symbol,
        ctx: Context,
        args: Vec<NDArray>,
        grads: Vec<Option<NDArray>>,
        grad_reqs: Vec<GradReq>,
        aux: Vec<NDArray>,
        group2ctx: &[(String, Context)],
        shared: Option<&BoundExecutor>,
    ) -> Result<BoundExecutor> {
        let arg_nodes = symbol.argument_nodes();
        let aux_nodes = symbol.auxiliary_nodes();
        check_arrays(&arg_nodes, &aux_nodes, &args, &grads, &grad_reqs, &aux, ctx, !group2ctx.is_empty())?;
        // The graph the executor runs (the variables stay the caller's symbol's nodes).
        let symbol = if cse::enabled() { Symbol { outputs: cse::eliminate_common_expr(&symbol.outputs)? } } else { symbol };

        let bound = value_map(&arg_nodes, &args, &aux_nodes, &aux);
        let forward_shapes = infer::infer_shapes(&symbol.outputs, &|n: &Node| bound.get(&address(n)).map(|a| a.shape().clone()))?;
        let forward_types = infer::infer_types(&symbol.outputs, &|n: &Node| bound.get(&address(n)).map(NDArray::dtype))?;
        for (e, name) in symbol.outputs.iter().zip(symbol.list_outputs()) {
            if !forward_shapes.contains_key(&e.key()) {
                crate::bail!(Shape, "bind: the shape of output '{name}' cannot be inferred from the arguments' shapes");
            }
        }

        let mut plan = if grad_reqs.iter().any(|r| *r != GradReq::Null) {
            let forward_steps: Vec<Arc<Node>> = symbol.nodes().into_iter().filter(|n| !n.is_variable()).collect();
            Some(plan_backward(&symbol, &forward_steps, &arg_nodes, &grad_reqs, &forward_shapes)?)
        } else {
            None
        };
        // An inference-only executor runs convolution and element-wise chains fused (a training
        // one keeps the chains' values, which its gradients read); convolutions fold only where
        // every node runs on the host.
        let fold_convolutions = ctx.is_host() && group2ctx.is_empty();
        let forward_outputs = match &plan {
            None if fusion_enabled() => inference_graph(&symbol.outputs, &forward_shapes, &forward_types, fold_convolutions)?,
            _ => symbol.outputs.clone(),
        };
        let forward_steps: Vec<Arc<Node>> = topo_order(&forward_outputs, |_| false).into_iter().filter(|n| !n.is_variable()).collect();

        // Shapes and dtypes of every value of the run, backward included.
        let mut targets = forward_outputs.clone();
        let mut given_shapes: AddressMap<usize, Shape> = bound.iter().map(|(k, a)| (*k, a.shape().clone())).collect();
        let mut given_types: AddressMap<usize, DType> = bound.iter().map(|(k, a)| (*k, a.dtype())).collect();
        if let Some(plan) = &plan {
            targets.extend(plan.grads.iter().flatten().cloned());
            for (node, out) in plan.head_grads.iter().zip(&symbol.outputs) {
                let (Some(shape), Some(&dtype)) = (forward_shapes.get(&out.key()), forward_types.get(&out.key())) else {
                    crate::bail!(Shape, "cannot bind: the shape of output '{}' is unknown", out.node.name);
                };
                given_shapes.insert(node_key(node), shape.clone());
                given_types.insert(node_key(node), dtype);
            }
        }
        let shapes = infer::infer_shapes(&targets, &|n: &Node| given_shapes.get(&address(n)).cloned())?;
        let types = infer::infer_types(&targets, &|n: &Node| given_types.get(&address(n)).copied())?;

        let mut steps = forward_steps.clone();
        if let Some(plan) = &plan {
            steps.extend(plan.steps.nodes().iter().cloned());
        }
        let contexts: AddressMap<usize, Context> = steps
            .iter()
            .map(|n| {
                let group = n.annotations().get(gradient::CTX_GROUP).cloned();
                let placed = group.and_then(|g| group2ctx.iter().find(|(name, _)| *name == g).map(|(_, c)| *c));
                (node_key(n), placed.unwrap_or(ctx))
            })
            .collect();
        let context_of = |n: &Node| node_context(&contexts, ctx, n);
        if let Some(plan) = &mut plan {
            // A gradient is written straight into its buffer only when they share a device.
            for ((direct, grad), buffer) in plan.direct.iter_mut().zip(&plan.grads).zip(&grads) {
                if let (true, Some(g), Some(buffer)) = (*direct, grad, buffer) {
                    *direct = context_of(g.node.as_ref()) == buffer.context();
                }
            }
        }
        let mut external = AddressSet::default();
        if let Some(plan) = &plan {
            for (grad, direct) in plan.grads.iter().zip(&plan.direct) {
                if let (Some(g), true) = (grad, direct) {
                    external.insert(g.key());
                }
            }
        }
        let mut pinned: AddressSet<EntryKey> = forward_outputs.iter().map(Entry::key).collect();
        if let Some(plan) = &plan {
            // A gradient not computed straight into its buffer is copied or added there after
            // the last backward step: no later step may reuse its memory.
            for (grad, direct) in plan.grads.iter().zip(&plan.direct) {
                if let (Some(g), false) = (grad, direct) {
                    pinned.insert(g.key());
                }
            }
        }
        let layout = Layout::plan(&LayoutRequest {
            steps: &steps,
            shapes: &shapes,
            types: &types,
            pinned: &pinned,
            external: &external,
            context: &context_of,
        });
        let blocks = layout.allocate_sharing(shared.map(|s| s.blocks.as_slice()).unwrap_or_default())?;
        let mut storage = layout.storage(&blocks)?;
        let mut forward_steps = Schedule::new(forward_steps);
        forward_steps.complete(&shapes)?;
        // The bound arrays keep their shapes and dtypes (head gradients are checked against the
        // outputs'): every step's outputs are fixed once.
        forward_steps.fix_outputs(&shapes, &types);
        if let Some(plan) = &mut plan {
            plan.steps.complete(&shapes)?;
            plan.steps.fix_outputs(&shapes, &types);
        }
        if let Some(plan) = &plan {
            for ((grad, direct), buffer) in plan.grads.iter().zip(&plan.direct).zip(&grads) {
                if let (Some(g), true, Some(buffer)) = (grad, direct, buffer) {
                    storage.insert(g.key(), buffer.clone());
                }
            }
        }
        let outputs = forward_outputs
            .iter()
            .map(|e| match (storage.get(&e.key()), shapes.get(&e.key()), types.get(&e.key())) {
                (Some(view), _, _) => Ok(view.clone()),
                (None, Some(shape), Some(&dtype)) => {
                    NDArray::empty(shape.clone(), dtype, if e.node.is_variable() { ctx } else { context_of(e.node.as_ref()) })
                }
                _ => crate::bail!(Shape, "bind: the shape or dtype of output '{}' of the graph to run cannot be inferred", e.node.name),
            })
            .collect::<Result<Vec<_>>>()?;
        let head_ones = match &plan {
            Some(plan) => outputs
                .iter()
                .zip(&plan.head_read)
                .enumerate()
                .map(|(i, (output, &read))| {
                    read.then(|| head_ones_for(output, shared.and_then(|s| s.head_ones.get(i).cloned().flatten()))).transpose()
                })
                .collect::<Result<Vec<_>>>()?,
            None => vec![None; outputs.len()],
        };
        let aux_keys: AddressSet<usize> = aux_nodes.iter().map(node_key).collect();
        let monitored = plan.as_ref().map_or_else(Vec::new, |plan| {
            monitored_gradients(&plan.by_node, &aux_keys, &|e: &Entry| {
                Some((shapes.get(&e.key())?.clone(), *types.get(&e.key())?, context_of(e.node.as_ref())))
            })
        });

        Ok(BoundExecutor {
            symbol,
            ctx,
            arg_nodes,
            aux_nodes,
            args,
            grads,
            grad_reqs,
            aux,
            outputs,
            forward_outputs,
            forward_steps,
            plan,
            storage,
            planned_bytes: layout.total_bytes(),
            blocks,
            values: AddressMap::default(),
            forwarded: false,
            contexts,
            monitored,
            head_ones,
        })
    }

    /// The graph the executor runs: the bound symbol after graph passes such as common
    /// subexpression elimination (MXNet's `get_optimized_symbol`).
    pub fn symbol(&self) -> &Symbol {
        &self.symbol
    }

    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Bytes of the planned storage for intermediate values (outputs and gradients included,
    /// parameters and gradient arrays not): MXNet's "Total N MB allocated".
    pub fn planned_bytes(&self) -> usize {
        self.planned_bytes
    }

    /// Run the graph; with `is_train` operators such as Dropout and BatchNorm behave as in
    /// training. Backward may follow either way (it reads the values this pass computed).
    pub fn forward(&mut self, is_train: bool) -> Result<()> {
        let _flags = FlagsGuard::set(false, is_train);
        let mut values: AddressMap<EntryKey, NDArray> =
            value_map(&self.arg_nodes, &self.args, &self.aux_nodes, &self.aux).into_iter().map(|(k, a)| ((k, 0), a)).collect();
        let context_of = |n: &Node| node_context(&self.contexts, self.ctx, n);
        self.forward_steps.run(&mut values, &self.storage, &context_of, None)?;
        for (e, output) in self.forward_outputs.iter().zip(&self.outputs) {
            let value = super::value_of(&values, e)?;
            if !value.same_data(output) {
                imperative::copy(value, output, None)?;
            }
        }
        self.values = values;
        self.forwarded = true;
        Ok(())
    }

    /// Gradients of the outputs, weighted by `head_grads` (ones where `None`), into the gradient
    /// arrays according to each argument's request.
    pub fn backward(&mut self, head_grads: &[Option<NDArray>]) -> Result<()> {
        self.run_backward(head_grads, None)
    }

    /// [`BoundExecutor::backward`], also returning the input gradients of every differentiated
    /// forward node under MXNet's monitor names (`fc_backward_output1`), in the order the pass
    /// built them. Each is a copy taken when it is computed (later steps may reuse its memory);
    /// a gradient the pass does not compute (not requested, zero, or recomputed by mirroring)
    /// is reported as zeros.
    pub fn backward_monitored(&mut self, head_grads: &[Option<NDArray>]) -> Result<Vec<(String, NDArray)>> {
        let mut taken: Vec<Option<NDArray>> = vec![None; self.monitored.len()];
        self.run_backward(head_grads, Some(&mut taken))?;
        let mut report = Vec::with_capacity(taken.len());
        for (watched, value) in self.monitored.iter().zip(taken) {
            let value = match (value, &watched.zeros) {
                (Some(v), _) => v,
                (None, Some((shape, dtype, ctx))) => {
                    let zeros = NDArray::empty(shape.clone(), *dtype, *ctx)?;
                    imperative::invoke("zeros_like", std::slice::from_ref(&zeros), &Attrs::new(), Some(vec![zeros.clone()]), *ctx, None)?;
                    zeros
                }
                (None, None) => continue,
            };
            report.push((watched.name.clone(), value));
        }
        Ok(report)
    }

    fn run_backward(&mut self, head_grads: &[Option<NDArray>], mut taken: Option<&mut Vec<Option<NDArray>>>) -> Result<()> {
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        if !self.forwarded {
            crate::bail!(Value, "backward needs a preceding forward pass: the gradients read its values");
        }
        if !head_grads.is_empty() && head_grads.len() != self.outputs.len() {
            crate::bail!(Value, "backward: {} head gradient(s) for {} output(s)", head_grads.len(), self.outputs.len());
        }
        for (i, ((node, output), ones)) in plan.head_grads.iter().zip(&self.outputs).zip(&self.head_ones).enumerate() {
            let grad = match (head_grads.get(i).cloned().flatten(), ones) {
                (Some(g), _) if g.shape() != output.shape() || g.dtype() != output.dtype() => crate::bail!(
                    Shape,
                    "backward: head gradient {i} has shape {} and dtype {}, the output {} and {}",
                    g.shape(),
                    g.dtype(),
                    output.shape(),
                    output.dtype()
                ),
                (Some(g), _) => g,
                (None, Some(ones)) => ones.clone(),
                // Nothing reads this head gradient.
                (None, None) => continue,
            };
            self.values.insert((node_key(node), 0), grad);
        }
        let _flags = FlagsGuard::set(false, true);
        let context_of = |n: &Node| node_context(&self.contexts, self.ctx, n);
        // Monitored gradients by entry: those already known (head gradients) are copied now,
        // the others as the step computing them is pushed.
        let mut watched: AddressMap<EntryKey, Vec<usize>> = AddressMap::default();
        if let Some(taken) = taken.as_deref_mut() {
            for (slot, m) in self.monitored.iter().enumerate() {
                let Some(entry) = &m.entry else { continue };
                match self.values.get(&entry.key()) {
                    Some(value) => {
                        if let Some(taken) = taken.get_mut(slot) {
                            *taken = Some(snapshot(value)?);
                        }
                    }
                    None => watched.entry(entry.key()).or_default().push(slot),
                }
            }
        }
        let mut observe = |node: &Arc<Node>, _inputs: &[NDArray], outputs: &[NDArray]| -> Result<()> {
            let Some(taken) = taken.as_deref_mut() else { return Ok(()) };
            for (i, value) in outputs.iter().enumerate() {
                for &slot in watched.get(&(node_key(node), i)).into_iter().flatten() {
                    if let Some(taken) = taken.get_mut(slot) {
                        *taken = Some(snapshot(value)?);
                    }
                }
            }
            Ok(())
        };
        plan.steps.run(&mut self.values, &self.storage, &context_of, Some(&mut observe))?;
        for ((grad, buffer), req) in plan.grads.iter().zip(&self.grads).zip(&self.grad_reqs) {
            let (Some(buffer), true) = (buffer, *req != GradReq::Null) else { continue };
            match (grad, req) {
                (Some(g), GradReq::Write) => {
                    let value = super::value_of(&self.values, g)?;
                    if !value.same_data(buffer) {
                        imperative::copy(value, buffer, None)?;
                    }
                }
                (Some(g), _) => {
                    let mut value = super::value_of(&self.values, g)?.clone();
                    if value.context() != buffer.context() {
                        let moved = NDArray::empty(value.shape().clone(), value.dtype(), buffer.context())?;
                        imperative::copy(&value, &moved, None)?;
                        value = moved;
                    }
                    imperative::invoke("elemwise_add", &[buffer.clone(), value], &Attrs::new(), Some(vec![buffer.clone()]), buffer.context(), None)?;
                }
                (None, GradReq::Write) => {
                    imperative::invoke(
                        "zeros_like",
                        std::slice::from_ref(buffer),
                        &Attrs::new(),
                        Some(vec![buffer.clone()]),
                        buffer.context(),
                        None,
                    )?;
                }
                (None, _) => {}
            }
        }
        Ok(())
    }
}

fn check_arrays(
    arg_nodes: &[Arc<Node>],
    aux_nodes: &[Arc<Node>],
    args: &[NDArray],
    grads: &[Option<NDArray>],
    grad_reqs: &[GradReq],
    aux: &[NDArray],
    ctx: Context,
    placed_by_groups: bool,
) -> Result<()> {
    let names = |nodes: &[Arc<Node>]| nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>().join(", ");
    if args.len() != arg_nodes.len() {
        crate::bail!(Value, "bind: {} argument array(s) given, the symbol has {} ({})", args.len(), arg_nodes.len(), names(arg_nodes));
    }
    if aux.len() != aux_nodes.len() {
        crate::bail!(Value, "bind: {} auxiliary array(s) given, the symbol has {} ({})", aux.len(), aux_nodes.len(), names(aux_nodes));
    }
    if grads.len() != args.len() || grad_reqs.len() != args.len() {
        crate::bail!(Value, "bind: need one gradient array and request per argument ({})", args.len());
    }
    // As MXNet: without group2ctx every array lives on the executor's device; with it, arrays
    // may live anywhere (their values are copied to the devices that read them).
    for (node, array) in arg_nodes.iter().chain(aux_nodes).zip(args.iter().chain(aux)) {
        if array.context() != ctx && !placed_by_groups {
            crate::bail!(
                Device,
                "bind: array for '{}' lives on {}, the executor on {ctx}; all arguments must be on the executor's device \
                 unless group2ctx places parts of the graph elsewhere",
                node.name,
                array.context()
            );
        }
    }
    for (((node, grad), req), arg) in arg_nodes.iter().zip(grads).zip(grad_reqs).zip(args) {
        match grad {
            None if *req != GradReq::Null => {
                crate::bail!(Value, "bind: argument '{}' has grad_req {req:?} but no gradient array", node.name)
            }
            Some(g) if g.shape() != arg.shape() => {
                crate::bail!(Shape, "bind: gradient array for '{}' has shape {}, the argument {}", node.name, g.shape(), arg.shape())
            }
            _ => {}
        }
    }
    Ok(())
}

/// An all-ones array shaped as `output`: a view of `shared` (another executor's ones) when that
/// is large enough and of the same dtype and device, else a new one.
fn head_ones_for(output: &NDArray, shared: Option<NDArray>) -> Result<NDArray> {
    if let Some(ones) = shared {
        let fits = ones.dtype() == output.dtype() && ones.context() == output.context() && ones.nbytes() >= output.nbytes();
        if fits {
            if let Ok(view) = ones.reinterpret(output.shape().clone(), output.dtype()) {
                return Ok(view);
            }
        }
    }
    Ok(imperative::invoke("ones_like", std::slice::from_ref(output), &Attrs::new(), None, output.context(), None)?.swap_remove(0))
}

fn node_context(contexts: &AddressMap<usize, Context>, default: Context, node: &Node) -> Context {
    contexts.get(&address(node)).copied().unwrap_or(default)
}

/// A copy of `value` (pushed now, so it holds the value as it is at this point of the run).
fn snapshot(value: &NDArray) -> Result<NDArray> {
    let copy = NDArray::empty(value.shape().clone(), value.dtype(), value.context())?;
    imperative::copy(value, &copy, None)?;
    Ok(copy)
}

/// What monitors report after backward: each differentiated node's input gradients, auxiliary
/// states left out (MXNet's backward nodes have no outputs for them). `describe` gives the
/// shape, dtype and device of a forward input, for the zeros reported where no gradient is
/// computed.
fn monitored_gradients(
    by_node: &[gradient::NodeGradients],
    aux: &AddressSet<usize>,
    describe: &dyn Fn(&Entry) -> Option<(Shape, DType, Context)>,
) -> Vec<MonitoredGradient> {
    let mut monitored = Vec::new();
    for record in by_node {
        let reported: Vec<(&Entry, &Option<Entry>)> =
            record.node.inputs.iter().zip(&record.input_grads).filter(|(input, _)| !aux.contains(&node_key(&input.node))).collect();
        let single = reported.len() == 1;
        for (i, (input, grad)) in reported.into_iter().enumerate() {
            let suffix = if single { String::new() } else { i.to_string() };
            monitored.push(MonitoredGradient {
                name: format!("{}_backward_output{suffix}", record.node.name),
                entry: grad.clone(),
                zeros: describe(input),
            });
        }
    }
    monitored
}

/// Bound arrays by variable node.
fn value_map(arg_nodes: &[Arc<Node>], args: &[NDArray], aux_nodes: &[Arc<Node>], aux: &[NDArray]) -> AddressMap<usize, NDArray> {
    arg_nodes.iter().zip(args).chain(aux_nodes.iter().zip(aux)).map(|(n, a)| (node_key(n), a.clone())).collect()
}

fn plan_backward(
    symbol: &Symbol,
    forward_steps: &[Arc<Node>],
    arg_nodes: &[Arc<Node>],
    reqs: &[GradReq],
    shapes: &infer::Inferred<Shape>,
) -> Result<BackwardPlan> {
    let forward: AddressSet<usize> = forward_steps.iter().map(node_key).collect();
    let gradient = SymbolGradient::new(
        &symbol.outputs,
        arg_nodes,
        |i| reqs.get(i).is_some_and(|r| *r != GradReq::Null),
        (&forward, mirror::enabled()),
        &|e: &Entry| shapes.get(&e.key()).cloned(),
    )?;
    let targets = gradient.targets();
    let SymbolGradient { head_grads, grads, by_node } = gradient;
    let steps = Schedule::new(gradient::backward_schedule(&targets, &forward));
    // Entries the backward run reads: step inputs, gradients handed to the arrays, and the
    // gradients monitors copy.
    let read: AddressSet<usize> = steps
        .nodes()
        .iter()
        .flat_map(|n| n.inputs.iter())
        .chain(grads.iter().flatten())
        .chain(by_node.iter().flat_map(|record| record.input_grads.iter().flatten()))
        .map(|e| node_key(&e.node))
        .collect();
    let head_read = head_grads.iter().map(|h| read.contains(&node_key(h))).collect();
    // A gradient computed by a backward node and wanted by exactly one argument with
    // grad_req='write' is written straight into that argument's gradient array.
    let backward: AddressSet<usize> = steps.nodes().iter().map(node_key).collect();
    let direct = grads
        .iter()
        .zip(reqs)
        .map(|(g, req)| {
            g.as_ref().is_some_and(|g| {
                *req == GradReq::Write
                    && backward.contains(&node_key(&g.node))
                    && grads.iter().flatten().filter(|other| other.key() == g.key()).count() == 1
            })
        })
        .collect();
    Ok(BackwardPlan { head_grads, head_read, grads, steps, direct, by_node })
}
