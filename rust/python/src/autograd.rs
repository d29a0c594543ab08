//! `mx.autograd` bindings: recording flags, variables, backward.

use oxnet::autograd::{self, BackwardOptions, Wrt};
use oxnet::graph::GradReq;
use oxnet::ndarray::NDArray;
use pyo3::prelude::*;

use crate::errors::IntoPyResult;
use crate::ndarray::{wrap, NDArrayHandle};

fn arrays(handles: &[PyRef<'_, NDArrayHandle>]) -> Vec<NDArray> {
    handles.iter().map(|h| h.inner.clone()).collect()
}

#[pyfunction]
fn set_recording(on: bool) -> bool {
    autograd::set_recording(on)
}

#[pyfunction]
fn set_training(on: bool) -> bool {
    autograd::set_training(on)
}

#[pyfunction]
fn is_recording() -> bool {
    autograd::is_recording()
}

#[pyfunction]
fn is_training() -> bool {
    autograd::is_training()
}

/// New handles for `variables`, marked with gradient buffers `grads` and requests `reqs`.
#[pyfunction]
fn mark_variables(
    py: Python<'_>,
    variables: Vec<PyRef<'_, NDArrayHandle>>,
    grads: Vec<PyRef<'_, NDArrayHandle>>,
    reqs: Vec<String>,
) -> PyResult<Vec<Py<NDArrayHandle>>> {
    let reqs = reqs.iter().map(|r| GradReq::parse(r)).collect::<oxnet::Result<Vec<_>>>().py()?;
    let marked = autograd::mark_variables(&arrays(&variables), &arrays(&grads), &reqs).py()?;
    marked.into_iter().map(|a| wrap(py, a)).collect()
}

#[pyfunction]
fn grad_of(py: Python<'_>, array: &NDArrayHandle) -> PyResult<Option<Py<NDArrayHandle>>> {
    autograd::grad_of(&array.inner).map(|g| wrap(py, g)).transpose()
}

/// Whether backward wrote the marked variable's gradient since it was last consumed (False
/// for arrays that are not marked variables), as MXNet's `_fresh_grad`.
#[pyfunction]
fn fresh_grad(array: &NDArrayHandle) -> bool {
    autograd::grad_of(&array.inner).is_some_and(|g| g.fresh_grad())
}

#[pyfunction]
fn set_fresh_grad(array: &NDArrayHandle, fresh: bool) {
    if let Some(g) = autograd::grad_of(&array.inner) {
        g.set_fresh_grad(fresh);
    }
}

#[pyfunction]
fn detach(py: Python<'_>, array: &NDArrayHandle) -> PyResult<Py<NDArrayHandle>> {
    wrap(py, array.inner.detached())
}

#[pyfunction]
fn in_graph(array: &NDArrayHandle) -> bool {
    array.inner.autograd_entry().is_some()
}

/// Gradients of `heads`: into the marked variables' buffers (`variables` None) or returned.
#[pyfunction]
#[pyo3(signature = (heads, head_grads, variables, retain_graph, create_graph, train_mode))]
#[allow(clippy::too_many_arguments)]
fn backward(
    py: Python<'_>,
    heads: Vec<PyRef<'_, NDArrayHandle>>,
    head_grads: Vec<Option<PyRef<'_, NDArrayHandle>>>,
    variables: Option<Vec<PyRef<'_, NDArrayHandle>>>,
    retain_graph: bool,
    create_graph: bool,
    train_mode: bool,
) -> PyResult<Vec<Py<NDArrayHandle>>> {
    let heads = arrays(&heads);
    let head_grads: Vec<Option<NDArray>> = head_grads.iter().map(|g| g.as_ref().map(|h| h.inner.clone())).collect();
    let variables = variables.map(|v| arrays(&v));
    let options = BackwardOptions { retain_graph, create_graph, train_mode };
    let wrt = match &variables {
        Some(v) => Wrt::Arrays(v),
        None => Wrt::MarkedVariables,
    };
    let grads = autograd::backward(&heads, &head_grads, wrt, options).py()?;
    grads.into_iter().map(|a| wrap(py, a)).collect()
}

/// Record an `autograd.Function` call: `function.backward(*out_grads)` computes its gradients.
#[pyfunction]
fn record_function(
    py: Python<'_>,
    function: Py<PyAny>,
    inputs: Vec<PyRef<'_, NDArrayHandle>>,
    outputs: Vec<PyRef<'_, NDArrayHandle>>,
) -> PyResult<Vec<Py<NDArrayHandle>>> {
    let backward: autograd::HostBackward = std::sync::Arc::new(move |out_grads: &[NDArray]| {
        Python::attach(|py| call_backward(py, &function, out_grads)).map_err(|e| oxnet::err!(Runtime, "autograd.Function backward failed: {e}"))
    });
    let recorded = autograd::record_function(&arrays(&inputs), arrays(&outputs), backward);
    recorded.into_iter().map(|a| wrap(py, a)).collect()
}

/// `function.backward(*out_grads)` with NDArrays in and out.
fn call_backward(py: Python<'_>, function: &Py<PyAny>, out_grads: &[NDArray]) -> PyResult<Vec<NDArray>> {
    let grads = out_grads.iter().map(|g| crate::ops::python_ndarray(py, g.clone())).collect::<PyResult<Vec<_>>>()?;
    let result = function.bind(py).call_method1("backward", pyo3::types::PyTuple::new(py, grads)?)?;
    let items: Vec<Bound<'_, PyAny>> = match crate::ops::as_array(&result)? {
        Some(_) => vec![result],
        None => result.try_iter()?.collect::<PyResult<_>>()?,
    };
    items
        .iter()
        .map(|i| crate::ops::as_array(i)?.ok_or_else(|| pyo3::exceptions::PyTypeError::new_err("autograd.Function backward must return NDArrays")))
        .collect()
}

/// Graphviz DOT text of the graph recorded for `heads`.
#[pyfunction]
fn graph_dot(heads: Vec<PyRef<'_, NDArrayHandle>>, title: &str) -> PyResult<String> {
    let entries = heads
        .iter()
        .map(|h| h.inner.autograd_entry().cloned())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| crate::errors::to_py(oxnet::err!(Value, "to_dot: an array was not recorded (call it inside autograd.record())")))?;
    Ok(oxnet::graph::to_dot(&entries, title))
}

/// The graph recorded for `heads` as a symbol handle.
#[pyfunction]
fn recorded_symbol(heads: Vec<PyRef<'_, NDArrayHandle>>) -> PyResult<crate::symbol::SymbolHandle> {
    let entries = heads
        .iter()
        .map(|h| h.inner.autograd_entry().cloned())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| crate::errors::to_py(oxnet::err!(Value, "get_symbol: an array was not recorded (call it inside autograd.record())")))?;
    Ok(crate::symbol::SymbolHandle::from(oxnet::symbol::Symbol::from_recorded(&entries).map_err(crate::errors::to_py)?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(record_function, m)?)?;
    m.add_function(wrap_pyfunction!(recorded_symbol, m)?)?;
    m.add_function(wrap_pyfunction!(graph_dot, m)?)?;
    m.add_function(wrap_pyfunction!(set_recording, m)?)?;
    m.add_function(wrap_pyfunction!(set_training, m)?)?;
    m.add_function(wrap_pyfunction!(is_recording, m)?)?;
    m.add_function(wrap_pyfunction!(is_training, m)?)?;
    m.add_function(wrap_pyfunction!(mark_variables, m)?)?;
    m.add_function(wrap_pyfunction!(grad_of, m)?)?;
    m.add_function(wrap_pyfunction!(detach, m)?)?;
    m.add_function(wrap_pyfunction!(fresh_grad, m)?)?;
    m.add_function(wrap_pyfunction!(set_fresh_grad, m)?)?;
    m.add_function(wrap_pyfunction!(in_graph, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    Ok(())
}
