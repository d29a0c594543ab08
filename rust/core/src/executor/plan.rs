//! A compiled graph run, shared by executors ([`super::BoundExecutor`]) and cached graphs
//! ([`super::CachedOp`], what hybridized Gluon blocks run): the operators in the order they run,
//! completed where their output shapes depend on the graph, and a static memory plan placing
//! every intermediate value in a storage block (in place where an operator allows it, blocks
//! shared by values whose lifetimes do not overlap; MXNet's in-place and co-share).

use std::ops::Range;
use std::sync::Arc;

use crate::base::{Context, DType, Shape};
use crate::error::Result;
use crate::graph::{node_key, AddressMap, AddressSet, Entry, EntryKey, Node};
use crate::imperative;
use crate::ndarray::NDArray;
use crate::op::{Compute, Operator};
use crate::pass::infer::Inferred;
use crate::pass::plan_memory::{inplace_enabled, plan_memory, MemoryPlan, PlanRequest};

/// Sees each step run: the node, its input values and its outputs.
pub type StepObserver<'a> = &'a mut dyn FnMut(&Arc<Node>, &[NDArray], &[NDArray]) -> Result<()>;

/// Operator nodes in the order they run, with their operators completed for the run's shapes.
pub struct Schedule {
    nodes: Vec<Arc<Node>>,
    /// Operators of the nodes whose output shapes have unknown dimensions
    /// (`zeros(shape=(0, 50))`, an RNN cell's begin state), completed from the inferred shapes.
    pub(super) completed: AddressMap<usize, Arc<dyn Operator>>,
    /// Per node (in order), its outputs' shapes and dtypes where [`Schedule::fix_outputs`]
    /// fixed them for every run.
    fixed: Vec<Option<Vec<(Shape, DType)>>>,
}

impl Schedule {
    /// `nodes`: operator nodes, in the order they run. Nodes whose output shapes depend on the
    /// graph need [`Schedule::complete`] before the run.
    pub fn new(nodes: Vec<Arc<Node>>) -> Schedule {
        Schedule { nodes, completed: AddressMap::default(), fixed: Vec::new() }
    }

    /// Fix the output shapes and dtypes of the nodes whose outputs `shapes` and `types` hold,
    /// for a schedule that always runs on inputs of the signature they were inferred from (a
    /// cached graph's compiled run, a bound executor, a compiled recorded graph): those nodes
    /// then push their kernels without inferring and checking again on every call (MXNet's
    /// cached op keeps its inferred shapes the same way). The operators that inference cannot
    /// fix (shapes that depend on input values) keep the checked path.
    pub fn fix_outputs(&mut self, shapes: &Inferred<Shape>, types: &Inferred<DType>) {
        self.fixed = self
            .nodes
            .iter()
            .map(|node| {
                let op = node.op.as_ref()?;
                if op.operator.shape_depends_on_values() {
                    return None;
                }
                (0..node.num_outputs())
                    .map(|i| {
                        let key = (node_key(node), i);
                        Some((shapes.get(&key)?.clone(), *types.get(&key)?))
                    })
                    .collect()
            })
            .collect();
    }

    /// Complete the operators whose output shapes have unknown dimensions from the run's
    /// inferred `shapes`.
    pub fn complete(&mut self, shapes: &Inferred<Shape>) -> Result<()> {
        for node in &self.nodes {
            let Some(op) = &node.op else {
                crate::bail!(Value, "variable '{}' has no value", node.name);
            };
            if op.operator.partial_output_shapes().is_none() {
                continue;
            }
            let outputs = (0..node.num_outputs())
                .map(|i| {
                    shapes.get(&(node_key(node), i)).cloned().ok_or_else(|| {
                        crate::err!(Shape, "cannot infer the unknown dimensions of node '{}' ({}): no consumer determines them", node.name, op.name)
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            self.completed.insert(node_key(node), op.operator.with_output_shapes(&outputs)?);
        }
        Ok(())
    }

    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Push every step, reading and extending `values`; a node whose outputs all have planned
    /// `storage` writes into it instead of allocating. Each node runs on the device `context_of`
    /// gives it: an input living on another device is copied there first (MXNet's cross-device
    /// copy). `observe` sees each node right after it is pushed.
    pub fn run(
        &self,
        values: &mut AddressMap<EntryKey, NDArray>,
        storage: &AddressMap<EntryKey, NDArray>,
        context_of: &dyn Fn(&Node) -> Context,
        observe: Option<StepObserver<'_>>,
    ) -> Result<()> {
        let _symbolic = crate::profiler::symbolic_section();
        let mut observe = observe;
        // A recorded run (a backward with create_graph) records every call: the checked path.
        let use_fixed = !crate::autograd::is_recording();
        for (step, node) in self.nodes.iter().enumerate() {
            let op = node.op.as_ref().expect("a scheduled node is an operator node");
            let ctx = context_of(node.as_ref());
            let inputs = node
                .inputs
                .iter()
                .map(|e| {
                    let value = values.get(&e.key()).ok_or_else(|| crate::err!(Runtime, "value of an input of node '{}' is missing", node.name))?;
                    if value.context() == ctx {
                        return Ok(value.clone());
                    }
                    let moved = NDArray::empty(value.shape().clone(), value.dtype(), ctx)?;
                    imperative::copy(value, &moved, None)?;
                    Ok(moved)
                })
                .collect::<Result<Vec<_>>>()?;
            let into: Vec<Option<NDArray>> = (0..node.num_outputs()).map(|i| storage.get(&(node_key(node), i)).cloned()).collect();
            let visible = op.operator.num_visible_outputs();
            let operator = self.completed.get(&node_key(node)).unwrap_or(&op.operator).clone();
            let fixed = self.fixed.get(step).and_then(Option::as_ref).filter(|_| use_fixed);
            let outputs = match operator.compute() {
                Compute::Host | Compute::Graph => operator.compute_arrays(&inputs, &into),
                Compute::Kernel if fixed.is_some() => {
                    let signature = fixed.into_iter().flatten();
                    into.into_iter()
                        .zip(signature)
                        .map(|(planned, (shape, dtype))| planned.map_or_else(|| NDArray::empty(shape.clone(), *dtype, ctx), Ok))
                        .collect::<Result<Vec<_>>>()
                        .and_then(|outputs| imperative::invoke_inferred(&op.name, &operator, &inputs, outputs))
                }
                // Every output planned, or every visible one (hidden outputs may be left to the
                // operator), or some: the others are allocated as the operator infers them.
                Compute::Kernel if into.iter().all(Option::is_some) || into.iter().take(visible).all(Option::is_some) && visible > 0 => {
                    let out = into.into_iter().take_while(Option::is_some).flatten().collect();
                    imperative::invoke_operator(&op.name, operator, &op.attrs, &inputs, Some(out), ctx, None)
                }
                Compute::Kernel if into.iter().any(Option::is_some) => {
                    imperative::invoke_operator_into(&op.name, operator, &op.attrs, &inputs, into, ctx)
                }
                Compute::Kernel => imperative::invoke_operator(&op.name, operator, &op.attrs, &inputs, None, ctx, None),
            }
            .map_err(|e| e.context(format!("node '{}'", node.name)))?;
            if let Some(observe) = observe.as_mut() {
                observe(node, &inputs, &outputs)?;
            }
            for (i, value) in outputs.into_iter().enumerate() {
                values.insert((node_key(node), i), value);
            }
        }
        Ok(())
    }
}

/// Shapes, dtypes and devices of the values a schedule computes, inferred node by node from
/// the `known` values its steps start from. A value whose shape cannot be known before the run
/// (an operator whose output shapes depend on its input values, or an input of unknown shape)
/// is left out, and so unplanned.
pub struct LocalInference {
    pub shapes: Inferred<Shape>,
    pub types: Inferred<DType>,
    /// The device of each node: its operator's, else its first input's, else `default`.
    pub contexts: AddressMap<usize, Context>,
}

impl Schedule {
    /// `LocalInference` for this schedule starting from `known` values.
    pub fn infer_locally(&self, known: &AddressMap<EntryKey, NDArray>, default: Context) -> LocalInference {
        let mut inferred = LocalInference { shapes: AddressMap::default(), types: AddressMap::default(), contexts: AddressMap::default() };
        for node in &self.nodes {
            let Some(op) = &node.op else { continue };
            let operator = self.completed.get(&node_key(node)).unwrap_or(&op.operator);
            let ctx = operator
                .context()
                .or_else(|| {
                    let first = node.inputs.first()?;
                    known.get(&first.key()).map(NDArray::context).or_else(|| inferred.contexts.get(&node_key(&first.node)).copied())
                })
                .unwrap_or(default);
            inferred.contexts.insert(node_key(node), ctx);
            if operator.shape_depends_on_values() {
                continue;
            }
            let input = |e: &Entry| match known.get(&e.key()) {
                Some(a) => Some((a.shape().clone(), a.dtype())),
                None => Some((inferred.shapes.get(&e.key())?.clone(), *inferred.types.get(&e.key())?)),
            };
            let Some((shapes, types)): Option<(Vec<Shape>, Vec<DType>)> =
                node.inputs.iter().map(input).collect::<Option<Vec<_>>>().map(|v| v.into_iter().unzip())
            else {
                continue;
            };
            let (Ok(out_shapes), Ok(out_types)) = (operator.infer_shape(&shapes), operator.infer_type(&types)) else { continue };
            for (i, (shape, dtype)) in out_shapes.into_iter().zip(out_types).enumerate() {
                inferred.shapes.insert((node_key(node), i), shape);
                inferred.types.insert((node_key(node), i), dtype);
            }
        }
        inferred
    }
}

/// What a memory layout is planned over.
pub struct LayoutRequest<'a> {
    /// Every operator node of the run, in order.
    pub steps: &'a [Arc<Node>],
    pub shapes: &'a Inferred<Shape>,
    pub types: &'a Inferred<DType>,
    /// Values that must outlive the run: never freed, never overwritten.
    pub pinned: &'a AddressSet<EntryKey>,
    /// Values the caller provides storage for or that leave the run as fresh arrays: not planned.
    pub external: &'a AddressSet<EntryKey>,
    /// The device each operator node runs on.
    pub context: &'a dyn Fn(&Node) -> Context,
}

/// Hidden outputs that only a gradient reads (RNN's reserve space, see
/// [`Operator::backward_only_outputs`]) and that no step of the run reads and nothing keeps: a run
/// without that gradient (inference) plans them empty, and the operator keeps nothing in them.
fn unread_backward_only_outputs(request: &LayoutRequest<'_>) -> AddressSet<EntryKey> {
    let read: AddressSet<EntryKey> = request.steps.iter().flat_map(|node| node.inputs.iter().map(Entry::key)).collect();
    request
        .steps
        .iter()
        .flat_map(|node| {
            let count = node.num_outputs();
            let backward_only = node.op.as_ref().map_or(0, |op| op.operator.backward_only_outputs()).min(count);
            (count - backward_only..count).map(move |index| (node_key(node), index))
        })
        .filter(|key| !read.contains(key) && !request.pinned.contains(key) && !request.external.contains(key))
        .collect()
}

/// Where every planned value of a run lives: storage blocks and a typed view into one per value.
pub struct Layout {
    memory: MemoryPlan,
    /// Each planned value's block, shape and dtype.
    views: Vec<(EntryKey, usize, Shape, DType)>,
}

impl Layout {
    /// The static plan for a run (in place unless `MXNET_EXEC_ENABLE_INPLACE=0`).
    pub fn plan(request: &LayoutRequest<'_>) -> Layout {
        let emptied = unread_backward_only_outputs(request);
        let shape_of = |key: &EntryKey| if emptied.contains(key) { Shape::new(vec![0]) } else { request.shapes[key].clone() };
        let bytes = |e: &Entry| {
            let size = if emptied.contains(&e.key()) { 0 } else { request.shapes.get(&e.key())?.size() };
            Some(size * request.types.get(&e.key())?.size())
        };
        let memory = plan_memory(&PlanRequest {
            steps: request.steps,
            bytes: &bytes,
            pinned: request.pinned,
            external: request.external,
            inplace: inplace_enabled(),
            context: request.context,
        });
        let mut views: Vec<(EntryKey, usize, Shape, DType)> =
            memory.assignment.iter().map(|(key, &block)| (*key, block, shape_of(key), request.types[key])).collect();
        views.sort_by_key(|view| view.1);
        Layout { memory, views }
    }

    /// Bytes of all the blocks: MXNet's "Total N MB allocated".
    pub fn total_bytes(&self) -> usize {
        self.memory.total_bytes()
    }

    pub fn block_count(&self) -> usize {
        self.memory.blocks.len()
    }

    /// The number of blocks the values of `entries` need: blocks are numbered in the order the
    /// run first uses them, so the blocks of a run's first steps are a prefix of the layout's.
    pub fn blocks_needed_by<'e>(&self, entries: impl IntoIterator<Item = &'e EntryKey>) -> usize {
        entries.into_iter().filter_map(|key| self.memory.assignment.get(key)).map(|&b| b + 1).max().unwrap_or(0)
    }

    /// Whether `other` puts each of `keys` in the same block of the same size as this layout.
    pub fn places_alike(&self, other: &Layout, keys: &[EntryKey]) -> bool {
        let place = |layout: &Layout, key| layout.memory.assignment.get(key).map(|&b| (b, layout.memory.blocks.get(b).copied()));
        keys.iter().all(|key| place(self, key) == place(other, key))
    }

    /// New blocks for the layout's blocks `range`.
    pub fn allocate(&self, range: Range<usize>) -> Result<Vec<NDArray>> {
        range
            .map(|b| match (self.memory.blocks.get(b), self.memory.block_contexts.get(b)) {
                (Some(&size), Some(&ctx)) => NDArray::empty(Shape::new(vec![size]), DType::U8, ctx),
                _ => crate::bail!(Runtime, "internal error: block {b} of a layout of {} blocks", self.memory.blocks.len()),
            })
            .collect()
    }

    /// One block per planned block: a block of `shared` (the same one where it fits, for the
    /// same graph gets the same layout) or a new one (how `Executor.reshape` and bucketing
    /// share memory).
    pub fn allocate_sharing(&self, shared: &[NDArray]) -> Result<Vec<NDArray>> {
        let mut taken = vec![false; shared.len()];
        let memory = &self.memory;
        memory
            .blocks
            .iter()
            .zip(&memory.block_contexts)
            .enumerate()
            .map(|(i, (&size, &ctx))| {
                let fits =
                    |j: &usize| !taken.get(*j).copied().unwrap_or(true) && shared.get(*j).is_some_and(|b| b.nbytes() >= size && b.context() == ctx);
                let reuse = Some(i).filter(fits).or_else(|| (0..shared.len()).filter(fits).min_by_key(|&j| shared.get(j).map_or(0, NDArray::nbytes)));
                match reuse.and_then(|j| Some((taken.get_mut(j)?, shared.get(j)?))) {
                    Some((taken, block)) => {
                        *taken = true;
                        Ok(block.clone())
                    }
                    None => NDArray::empty(Shape::new(vec![size]), DType::U8, ctx),
                }
            })
            .collect()
    }

    /// A view into its block for each planned value whose block is among `blocks` (the first
    /// `blocks.len()` of the layout's).
    pub fn storage(&self, blocks: &[NDArray]) -> Result<AddressMap<EntryKey, NDArray>> {
        self.views
            .iter()
            .take_while(|view| view.1 < blocks.len())
            .map(|(key, block, shape, dtype)| {
                let block =
                    blocks.get(*block).ok_or_else(|| crate::err!(Runtime, "internal error: a planned value's block {block} of {}", blocks.len()))?;
                Ok((*key, block.reinterpret(shape.clone(), *dtype)?))
            })
            .collect()
    }
}
