//! A symbol bound to arrays (MXNet's `Executor`): forward fills the outputs, backward the
//! gradient arrays, both by running graphs through the shared runner.
//!
//! At bind time the gradient graph is built once from the operators' gradient definitions (the
//! same pass autograd uses), and the forward nodes it reads are noted: a training forward keeps
//! exactly those values for backward and releases every other intermediate as soon as its last
//! consumer has been pushed.

use std::sync::Arc;

use super::{run_keeping, Kept, Source};
use crate::autograd::FlagsGuard;
use crate::base::{Context, Shape};
use crate::error::Result;
use crate::graph::{node_key, topo_order, AddressMap, AddressSet, Entry, GradReq, Node};
use crate::imperative;
use crate::ndarray::NDArray;
use crate::op::Attrs;
use crate::pass::{gradient, infer};
use crate::symbol::Symbol;

/// The gradient graph of a bound symbol and what its forward pass must keep for it.
struct BackwardPlan {
    /// One variable per symbol output, standing for that output's head gradient.
    head_grads: Vec<Arc<Node>>,
    /// For each argument: its gradient entry (`None`: no gradient wanted, or zero).
    grads: Vec<Option<Entry>>,
    /// Forward operator nodes whose outputs the gradient graph reads.
    keep: AddressSet<usize>,
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
    plan: Option<BackwardPlan>,
    /// Forward values kept by the last training forward pass, for backward.
    kept: Option<Kept>,
}

impl BoundExecutor {
    /// Bind `symbol` to argument arrays (in `list_arguments` order), their gradient buffers and
    /// requests, and auxiliary state arrays (in `list_auxiliary_states` order).
    pub fn bind(
        symbol: Symbol,
        ctx: Context,
        args: Vec<NDArray>,
        grads: Vec<Option<NDArray>>,
        grad_reqs: Vec<GradReq>,
        aux: Vec<NDArray>,
    ) -> Result<BoundExecutor> {
        let arg_nodes = symbol.argument_nodes();
        let aux_nodes = symbol.auxiliary_nodes();
        let names = |nodes: &[Arc<Node>]| nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>().join(", ");
        if args.len() != arg_nodes.len() {
            crate::bail!(Value, "bind: {} argument array(s) given, the symbol has {} ({})", args.len(), arg_nodes.len(), names(&arg_nodes));
        }
        if aux.len() != aux_nodes.len() {
            crate::bail!(Value, "bind: {} auxiliary array(s) given, the symbol has {} ({})", aux.len(), aux_nodes.len(), names(&aux_nodes));
        }
        if grads.len() != args.len() || grad_reqs.len() != args.len() {
            crate::bail!(Value, "bind: need one gradient array and request per argument ({})", args.len());
        }
        for (node, array) in arg_nodes.iter().chain(&aux_nodes).zip(args.iter().chain(&aux)) {
            if array.context() != ctx {
                crate::bail!(Device, "bind: array for '{}' lives on {}, the executor on {ctx}", node.name, array.context());
            }
        }
        for ((node, grad), req) in arg_nodes.iter().zip(&grads).zip(&grad_reqs) {
            match grad {
                None if *req != GradReq::Null => {
                    crate::bail!(Value, "bind: argument '{}' has grad_req {req:?} but no gradient array", node.name)
                }
                Some(g) if g.shape() != args[arg_index(&arg_nodes, node)].shape() => crate::bail!(
                    Shape,
                    "bind: gradient array for '{}' has shape {}, the argument {}",
                    node.name,
                    g.shape(),
                    args[arg_index(&arg_nodes, node)].shape()
                ),
                _ => {}
            }
        }

        let known = value_map(&arg_nodes, &args, &aux_nodes, &aux);
        let shapes = infer::infer_shapes(&symbol.outputs, &|n: &Node| known.get(&(n as *const Node as usize)).map(|a| a.shape().clone()))?;
        let types = infer::infer_types(&symbol.outputs, &|n: &Node| known.get(&(n as *const Node as usize)).map(NDArray::dtype))?;
        let mut outputs = Vec::with_capacity(symbol.outputs.len());
        for (e, name) in symbol.outputs.iter().zip(symbol.list_outputs()) {
            let (Some(shape), Some(&dtype)) = (shapes.get(&e.key()), types.get(&e.key())) else {
                crate::bail!(Shape, "bind: the shape of output '{name}' cannot be inferred from the arguments' shapes");
            };
            outputs.push(NDArray::from_bytes(shape.clone(), dtype, ctx, &vec![0u8; shape.size() * dtype.size()])?);
        }

        let plan = if grad_reqs.iter().any(|r| *r != GradReq::Null) {
            Some(plan_backward(&symbol, &arg_nodes, &grad_reqs, &shapes)?)
        } else {
            None
        };
        Ok(BoundExecutor { symbol, ctx, arg_nodes, aux_nodes, args, grads, grad_reqs, aux, outputs, plan, kept: None })
    }

    pub fn symbol(&self) -> &Symbol {
        &self.symbol
    }

    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Run the graph; with `is_train` operators such as Dropout and BatchNorm behave as in
    /// training, and the values backward needs are kept.
    pub fn forward(&mut self, is_train: bool) -> Result<()> {
        let _flags = FlagsGuard::set(false, is_train);
        let known = value_map(&self.arg_nodes, &self.args, &self.aux_nodes, &self.aux);
        let empty = AddressSet::default();
        let keep = match (&self.plan, is_train) {
            (Some(plan), true) => &plan.keep,
            _ => &empty,
        };
        let (values, kept) = run_keeping(&self.symbol.outputs, self.ctx, |node| known_or_compute(node, &known), keep)?;
        for (value, output) in values.iter().zip(&self.outputs) {
            imperative::copy(value, output, None)?;
        }
        self.kept = is_train.then_some(kept);
        Ok(())
    }

    /// Gradients of the outputs, weighted by `head_grads` (ones where `None`), into the gradient
    /// arrays according to each argument's request.
    pub fn backward(&mut self, head_grads: &[Option<NDArray>]) -> Result<()> {
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        let Some(kept) = &self.kept else {
            crate::bail!(Value, "backward needs a preceding forward(is_train=True): the values gradients read were not kept");
        };
        if !head_grads.is_empty() && head_grads.len() != self.outputs.len() {
            crate::bail!(Value, "backward: {} head gradient(s) for {} output(s)", head_grads.len(), self.outputs.len());
        }
        let mut known = value_map(&self.arg_nodes, &self.args, &self.aux_nodes, &self.aux);
        for (i, (node, output)) in plan.head_grads.iter().zip(&self.outputs).enumerate() {
            let grad = match head_grads.get(i).cloned().flatten() {
                Some(g) if g.shape() != output.shape() => {
                    crate::bail!(Shape, "backward: head gradient {i} has shape {}, the output {}", g.shape(), output.shape())
                }
                Some(g) => g,
                None => imperative::invoke("ones_like", &[output.clone()], &Attrs::new(), None, self.ctx, None)?.swap_remove(0),
            };
            known.insert(node_key(node), grad);
        }
        let targets: Vec<Entry> = plan.grads.iter().flatten().cloned().collect();
        let _flags = FlagsGuard::set(false, true);
        let (values, _) = run_keeping(
            &targets,
            self.ctx,
            |node| match kept.get(&node_key(node)) {
                Some(values) => Ok(Source::Known(values.clone())),
                None if node.is_variable() => known_or_compute(node, &known),
                None if plan.keep.contains(&node_key(node)) => {
                    crate::bail!(Runtime, "forward value of node '{}' was not kept for backward", node.name)
                }
                None => Ok(Source::Compute),
            },
            &AddressSet::default(),
        )?;
        let mut values = values.into_iter();
        for ((grad, buffer), req) in plan.grads.iter().zip(&self.grads).zip(&self.grad_reqs) {
            let (Some(buffer), true) = (buffer, *req != GradReq::Null) else { continue };
            match (grad, req) {
                (Some(_), GradReq::Write) => imperative::copy(&values.next().expect("one value per target"), buffer, None)?,
                (Some(_), _) => {
                    let value = values.next().expect("one value per target");
                    imperative::invoke("elemwise_add", &[buffer.clone(), value], &Attrs::new(), Some(vec![buffer.clone()]), self.ctx, None)?;
                }
                (None, GradReq::Write) => {
                    imperative::invoke("zeros_like", &[buffer.clone()], &Attrs::new(), Some(vec![buffer.clone()]), self.ctx, None)?;
                }
                (None, _) => {}
            }
        }
        Ok(())
    }
}

fn arg_index(nodes: &[Arc<Node>], node: &Arc<Node>) -> usize {
    nodes.iter().position(|n| Arc::ptr_eq(n, node)).expect("node is an argument")
}

/// Bound arrays by variable node.
fn value_map(arg_nodes: &[Arc<Node>], args: &[NDArray], aux_nodes: &[Arc<Node>], aux: &[NDArray]) -> AddressMap<usize, NDArray> {
    arg_nodes.iter().zip(args).chain(aux_nodes.iter().zip(aux)).map(|(n, a)| (node_key(n), a.clone())).collect()
}

fn known_or_compute(node: &Arc<Node>, known: &AddressMap<usize, NDArray>) -> Result<Source> {
    match known.get(&node_key(node)) {
        Some(value) => Ok(Source::Known(vec![value.clone()])),
        None if node.is_variable() => crate::bail!(Value, "variable '{}' is not bound to an array", node.name),
        None => Ok(Source::Compute),
    }
}

fn plan_backward(symbol: &Symbol, arg_nodes: &[Arc<Node>], reqs: &[GradReq], shapes: &infer::Inferred<Shape>) -> Result<BackwardPlan> {
    let head_grads: Vec<Arc<Node>> =
        (0..symbol.outputs.len()).map(|i| Node::variable(format!("head_grad{i}"), Attrs::new())).collect();
    let head_entries: Vec<Entry> = head_grads.iter().map(|n| Entry::new(n.clone(), 0)).collect();
    let wanted: Vec<usize> = (0..arg_nodes.len()).filter(|&i| reqs[i] != GradReq::Null).collect();
    let xs: Vec<Entry> = wanted.iter().map(|&i| Entry::new(arg_nodes[i].clone(), 0)).collect();
    let found = gradient::gradient(&symbol.outputs, &head_entries, &xs, &|e: &Entry| shapes.get(&e.key()).cloned())?;
    let mut grads = vec![None; arg_nodes.len()];
    for (&i, g) in wanted.iter().zip(found) {
        grads[i] = g;
    }
    let forward: AddressSet<usize> = symbol.nodes().iter().filter(|n| !n.is_variable()).map(node_key).collect();
    let targets: Vec<Entry> = grads.iter().flatten().cloned().collect();
    let keep = topo_order(&targets, |n| forward.contains(&node_key(n)))
        .iter()
        .map(node_key)
        .filter(|k| forward.contains(k))
        .collect();
    Ok(BackwardPlan { head_grads, grads, keep })
}
