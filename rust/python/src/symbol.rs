//! `mx.sym` and `Executor` bindings: symbols and bound executors as opaque handles.

use std::collections::HashMap;

use oxnet::base::PartialShape;
use oxnet::executor::{BoundExecutor, CachedOp, CachedOpFlags};
use oxnet::graph::GradReq;
use oxnet::op;
use oxnet::symbol::{InferResult, Symbol};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::IntoPyResult;
use crate::ndarray::{context_from, current_context, dtype_from, wrap, NDArrayHandle};
use crate::ops::{sort_arguments, CallArguments, NoneKeyword};

#[pyclass(module = "oxnet._core", frozen)]
pub struct SymbolHandle {
    inner: Symbol,
}

fn handle(inner: Symbol) -> SymbolHandle {
    SymbolHandle { inner }
}

impl From<Symbol> for SymbolHandle {
    fn from(inner: Symbol) -> Self {
        handle(inner)
    }
}

type Inferred<'py> = (Vec<Option<Bound<'py, PyTuple>>>, Vec<Option<Bound<'py, PyTuple>>>, Vec<Option<Bound<'py, PyTuple>>>);

/// Inferred shapes as tuples with -1 for an unknown dimension, None for an unknown rank (the
/// Python side converts them to the caller's shape semantics).
fn shapes_to_py<'py>(py: Python<'py>, r: InferResult<PartialShape>) -> PyResult<Inferred<'py>> {
    let convert = |v: Vec<Option<PartialShape>>| -> PyResult<Vec<Option<Bound<'py, PyTuple>>>> {
        v.into_iter().map(|s| s.map(|s| PyTuple::new(py, s.dims().iter().map(|d| d.map_or(-1, |d| d as i64)))).transpose()).collect()
    };
    Ok((convert(r.arguments)?, convert(r.outputs)?, convert(r.auxiliary_states)?))
}

#[pymethods]
impl SymbolHandle {
    #[staticmethod]
    fn variable(name: &str, attrs: HashMap<String, String>) -> SymbolHandle {
        handle(Symbol::variable(name, attrs.into_iter().collect()))
    }

    /// Apply a registered operator: symbols among `args` are inputs in order, other positional
    /// values fill parameters in order; keyword symbols are inputs by name, other keywords are
    /// parameters (or `__annotations__`).
    #[staticmethod]
    fn create(op_name: &str, name: &str, args: &Bound<'_, PyTuple>, kwargs: &Bound<'_, PyDict>) -> PyResult<SymbolHandle> {
        let def = op::lookup(op_name).py()?;
        let symbol = |v: &Bound<'_, PyAny>| Ok(v.cast::<SymbolHandle>().ok().map(|s| s.get().inner.clone()));
        let CallArguments { inputs, keyword_inputs, attrs } = sort_arguments(op_name, def, args, Some(kwargs), NoneKeyword::Absent, symbol)?;
        Symbol::create(op_name, attrs, name, &inputs, &keyword_inputs).py().map(handle)
    }

    /// Apply a control flow operator holding `subgraphs` to `inputs` (`attrs`: its parameters
    /// as strings and any `__annotations__`).
    #[staticmethod]
    fn create_with_subgraphs(
        op_name: &str,
        name: &str,
        subgraphs: Vec<PyRef<'_, SymbolHandle>>,
        inputs: Vec<PyRef<'_, SymbolHandle>>,
        attrs: HashMap<String, String>,
    ) -> PyResult<SymbolHandle> {
        let subgraphs: Vec<Symbol> = subgraphs.iter().map(|s| s.inner.clone()).collect();
        let inputs: Vec<Symbol> = inputs.iter().map(|s| s.inner.clone()).collect();
        Symbol::create_with_subgraphs(op_name, attrs.into_iter().collect(), name, subgraphs, &inputs).py().map(handle)
    }

    /// The part of the graph built in the subgraph scope `scope`, cut from the rest, and per new
    /// variable standing for an outside value: (that variable, the outside value).
    fn cut_subgraph(&self, scope: &str) -> (SymbolHandle, Vec<(SymbolHandle, SymbolHandle)>) {
        let (graph, pairs) = self.inner.cut_subgraph(scope);
        let as_symbol = |e: oxnet::graph::Entry| handle(Symbol { outputs: vec![e] });
        (handle(graph), pairs.into_iter().map(|(var, outside)| (as_symbol(var), as_symbol(outside))).collect())
    }

    /// The identity of each output (node address, output index): equal for the same value.
    fn entry_keys(&self) -> Vec<(usize, usize)> {
        self.inner.outputs.iter().map(|e| e.key()).collect()
    }

    /// The input variables as symbols, in `list_inputs` order.
    fn input_symbols(&self) -> Vec<SymbolHandle> {
        self.inner.input_nodes().into_iter().map(|n| handle(Symbol { outputs: vec![oxnet::graph::Entry::new(n, 0)] })).collect()
    }

    #[staticmethod]
    fn group(symbols: Vec<PyRef<'_, SymbolHandle>>) -> SymbolHandle {
        let inner: Vec<Symbol> = symbols.iter().map(|s| s.inner.clone()).collect();
        handle(Symbol::group(&inner))
    }

    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<SymbolHandle> {
        py.detach(|| Symbol::from_json(text)).py().map(handle)
    }

    #[pyo3(signature = (np_shape=false))]
    fn tojson(&self, np_shape: bool) -> String {
        self.inner.to_json(np_shape)
    }

    fn to_dot(&self, title: &str) -> String {
        self.inner.to_dot(title)
    }

    fn list_arguments(&self) -> Vec<String> {
        self.inner.list_arguments()
    }
    fn list_outputs(&self) -> Vec<String> {
        self.inner.list_outputs()
    }
    fn list_auxiliary_states(&self) -> Vec<String> {
        self.inner.list_auxiliary_states()
    }
    fn list_inputs(&self) -> Vec<String> {
        self.inner.list_inputs()
    }
    fn num_outputs(&self) -> usize {
        self.inner.outputs.len()
    }
    /// The name of the node behind a single-output symbol.
    fn name(&self) -> Option<String> {
        match self.inner.outputs.as_slice() {
            [one] => Some(one.node.name.clone()),
            _ => None,
        }
    }
    /// The operator of a single-output symbol's node ("null" for a variable).
    fn op_name(&self) -> Option<String> {
        match self.inner.outputs.as_slice() {
            [one] => Some(one.node.op.as_ref().map_or_else(|| "null".to_string(), |o| o.name.clone())),
            _ => None,
        }
    }
    fn output(&self, index: usize) -> PyResult<SymbolHandle> {
        self.inner.output(index).py().map(handle)
    }
    fn internals(&self) -> SymbolHandle {
        handle(self.inner.internals())
    }
    fn children(&self) -> Option<SymbolHandle> {
        self.inner.children().map(handle)
    }
    #[pyo3(signature = (replacements, rename=None))]
    fn substitute(&self, replacements: HashMap<String, PyRef<'_, SymbolHandle>>, rename: Option<&str>) -> PyResult<SymbolHandle> {
        let map = replacements.into_iter().map(|(k, v)| (k, v.inner.clone())).collect();
        self.inner.substitute(&map, rename).py().map(handle)
    }
    fn attr(&self, key: &str) -> Option<String> {
        self.inner.attr(key)
    }
    fn set_attr(&self, key: &str, value: &str) -> PyResult<()> {
        self.inner.set_attr(key, value).py()
    }
    fn attr_dict(&self) -> Vec<(String, HashMap<String, String>)> {
        self.inner.attr_dict().into_iter().map(|(n, a)| (n, a.into_iter().collect())).collect()
    }
    /// (node name, operator or "null", [input node names]) for every node, inputs first.
    fn node_summary(&self) -> Vec<(String, String, Vec<String>)> {
        self.inner
            .nodes()
            .iter()
            .map(|n| {
                let op = n.op.as_ref().map_or_else(|| "null".to_string(), |o| o.name.clone());
                (n.name.clone(), op, n.inputs.iter().map(|e| e.node.name.clone()).collect())
            })
            .collect()
    }
    /// Shapes from the given argument shapes, in which -1 marks an unknown dimension.
    fn infer_shape<'py>(&self, py: Python<'py>, known: HashMap<String, Vec<i64>>) -> PyResult<Inferred<'py>> {
        let known = known.into_iter().map(|(k, v)| (k, PartialShape(v.into_iter().map(|d| usize::try_from(d).ok()).collect()))).collect();
        shapes_to_py(py, self.inner.infer_shape(&known).py()?)
    }
    fn infer_type(&self, known: HashMap<String, String>) -> PyResult<(Vec<Option<String>>, Vec<Option<String>>, Vec<Option<String>>)> {
        let known = known.into_iter().map(|(k, v)| Ok((k, dtype_from(&v)?))).collect::<PyResult<_>>()?;
        let r = self.inner.infer_type(&known).py()?;
        let names = |v: Vec<Option<oxnet::DType>>| v.into_iter().map(|d| d.map(|d| d.name().to_string())).collect();
        Ok((names(r.arguments), names(r.outputs), names(r.auxiliary_states)))
    }
}

#[pyclass(module = "oxnet._core")]
pub struct ExecutorHandle {
    inner: BoundExecutor,
}

fn handles(py: Python<'_>, arrays: &[oxnet::NDArray]) -> PyResult<Vec<Py<NDArrayHandle>>> {
    arrays.iter().map(|a| wrap(py, a.clone())).collect()
}

#[pymethods]
impl ExecutorHandle {
    #[new]
    fn bind(
        symbol: &SymbolHandle,
        ctx: (i32, i32),
        args: Vec<PyRef<'_, NDArrayHandle>>,
        grads: Vec<Option<PyRef<'_, NDArrayHandle>>>,
        reqs: Vec<String>,
        aux: Vec<PyRef<'_, NDArrayHandle>>,
        shared: Option<PyRef<'_, ExecutorHandle>>,
        group2ctx: Vec<(String, (i32, i32))>,
    ) -> PyResult<ExecutorHandle> {
        let reqs = reqs.iter().map(|r| GradReq::parse(r)).collect::<oxnet::Result<Vec<_>>>().py()?;
        let group2ctx = group2ctx.into_iter().map(|(group, ctx)| context_from(ctx).map(|c| (group, c))).collect::<PyResult<Vec<_>>>()?;
        let inner = BoundExecutor::bind(
            symbol.inner.clone(),
            context_from(ctx)?,
            args.iter().map(|a| a.inner.clone()).collect(),
            grads.iter().map(|g| g.as_ref().map(|g| g.inner.clone())).collect(),
            reqs,
            aux.iter().map(|a| a.inner.clone()).collect(),
            &group2ctx,
            shared.as_ref().map(|s| &s.inner),
        )
        .py()?;
        Ok(ExecutorHandle { inner })
    }

    fn forward(&mut self, is_train: bool) -> PyResult<()> {
        self.inner.forward(is_train).py()
    }

    fn backward(&mut self, head_grads: Vec<Option<PyRef<'_, NDArrayHandle>>>) -> PyResult<()> {
        let grads: Vec<_> = head_grads.iter().map(|g| g.as_ref().map(|g| g.inner.clone())).collect();
        self.inner.backward(&grads).py()
    }

    /// Backward, returning (name, array) for each input gradient of each differentiated node
    /// (what MXNet's monitor callback sees in the backward pass).
    fn backward_monitored(
        &mut self,
        py: Python<'_>,
        head_grads: Vec<Option<PyRef<'_, NDArrayHandle>>>,
    ) -> PyResult<Vec<(String, Py<NDArrayHandle>)>> {
        let grads: Vec<_> = head_grads.iter().map(|g| g.as_ref().map(|g| g.inner.clone())).collect();
        let report = self.inner.backward_monitored(&grads).py()?;
        report.into_iter().map(|(name, array)| wrap(py, array).map(|a| (name, a))).collect()
    }

    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<Py<NDArrayHandle>>> {
        handles(py, &self.inner.outputs)
    }
    /// The graph the executor runs, after its graph passes.
    fn optimized_symbol(&self) -> SymbolHandle {
        handle(self.inner.symbol().clone())
    }
    /// Bytes of the static memory plan for intermediate values.
    fn planned_bytes(&self) -> usize {
        self.inner.planned_bytes()
    }
    fn arg_arrays(&self, py: Python<'_>) -> PyResult<Vec<Py<NDArrayHandle>>> {
        handles(py, &self.inner.args)
    }
    fn aux_arrays(&self, py: Python<'_>) -> PyResult<Vec<Py<NDArrayHandle>>> {
        handles(py, &self.inner.aux)
    }
    fn grad_arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self.inner.grads.iter().map(|g| g.as_ref().map(|g| wrap(py, g.clone())).transpose()).collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }
}

/// A compiled graph called like an operator (a hybridized block's graph).
#[pyclass(module = "oxnet._core", frozen)]
pub struct CachedOpHandle {
    inner: CachedOp,
}

#[pymethods]
impl CachedOpHandle {
    #[new]
    #[pyo3(signature = (symbol, static_alloc=false, mirror=false))]
    fn new(symbol: &SymbolHandle, static_alloc: bool, mirror: bool) -> PyResult<CachedOpHandle> {
        let flags = CachedOpFlags { static_alloc, mirror };
        Ok(CachedOpHandle { inner: CachedOp::with_flags(symbol.inner.clone(), flags).py()? })
    }

    /// Bytes of the memory plan of the last call (forward and, when recorded, backward).
    fn planned_bytes(&self) -> usize {
        self.inner.planned_bytes()
    }

    /// Outputs for `inputs` given in the symbol's `list_inputs` order.
    fn __call__(&self, py: Python<'_>, inputs: Vec<PyRef<'_, NDArrayHandle>>) -> PyResult<Vec<Py<NDArrayHandle>>> {
        let arrays: Vec<_> = inputs.iter().map(|a| a.inner.clone()).collect();
        let outputs = self.inner.call(&arrays, current_context()).py()?;
        handles(py, &outputs)
    }

    /// A call that also returns (name, operator, array) for each operator output (and input,
    /// with `monitor_all`) as it ran: what Gluon's op hooks see.
    #[allow(clippy::type_complexity)]
    fn call_monitored(
        &self,
        py: Python<'_>,
        inputs: Vec<PyRef<'_, NDArrayHandle>>,
        monitor_all: bool,
    ) -> PyResult<(Vec<Py<NDArrayHandle>>, Vec<(String, String, Py<NDArrayHandle>)>)> {
        let arrays: Vec<_> = inputs.iter().map(|a| a.inner.clone()).collect();
        let (outputs, report) = self.inner.call_monitored(&arrays, current_context(), monitor_all).py()?;
        let report = report.into_iter().map(|m| wrap(py, m.array).map(|a| (m.name, m.op, a))).collect::<PyResult<Vec<_>>>()?;
        Ok((handles(py, &outputs)?, report))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SymbolHandle>()?;
    m.add_class::<CachedOpHandle>()?;
    m.add_class::<ExecutorHandle>()?;
    Ok(())
}
