//! `mx.operator.register`: Python operator types behind the core's `Custom` operator.
//!
//! The Python side hands over an adapter object per operator type (`oxnet.operator._TypeAdapter`)
//! whose methods take and return plain values (names, shape tuples, dtype names, array handles);
//! this file only converts them and turns Python exceptions into core errors.

use std::sync::Arc;

use oxnet::base::{Context, DType, Shape};
use oxnet::ndarray::NDArray;
use oxnet::op::custom::{self, CustomOpKernel, CustomOpType, Signature, WriteReq};
use oxnet::op::Attrs;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::ndarray::{context_tuple, wrap};

/// A Python exception as a core error: its type, message and the user's traceback, so that the
/// failure names the line in the custom operator.
fn host_error(py: Python<'_>, what: &str, e: PyErr) -> oxnet::Error {
    let traceback = e.traceback(py).and_then(|tb| tb.format().ok()).unwrap_or_default();
    oxnet::err!(Runtime, "{what} raised {}\n{traceback}", e.value(py).repr().map(|r| r.to_string()).unwrap_or_default())
}

fn call<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    object: &Py<PyAny>,
    method: &str,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>>,
) -> oxnet::Result<T> {
    Python::attach(|py| {
        let result = args(py).and_then(|a| object.bind(py).call_method1(method, a)).and_then(|r| r.extract::<T>().map_err(Into::into));
        result.map_err(|e| host_error(py, method, e))
    })
}

fn handles<'py>(py: Python<'py>, arrays: &[NDArray]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, arrays.iter().map(|a| wrap(py, a.clone())).collect::<PyResult<Vec<_>>>()?)
}

fn reqs(req: &[WriteReq]) -> Vec<&'static str> {
    req.iter().map(|r| r.as_str()).collect()
}

fn shapes(dims: Vec<Vec<usize>>) -> Vec<Shape> {
    dims.into_iter().map(Shape::from).collect()
}

fn dtypes(names: Vec<String>) -> oxnet::Result<Vec<DType>> {
    names.iter().map(|n| DType::from_name(n)).collect()
}

struct PythonOpType(Py<PyAny>);

impl CustomOpType for PythonOpType {
    fn arguments(&self) -> oxnet::Result<Vec<String>> {
        call(&self.0, "arguments", |py| Ok(pyo3::types::PyTuple::empty(py)))
    }
    fn outputs(&self) -> oxnet::Result<Vec<String>> {
        call(&self.0, "outputs", |py| Ok(pyo3::types::PyTuple::empty(py)))
    }
    fn auxiliary_states(&self) -> oxnet::Result<Vec<String>> {
        call(&self.0, "auxiliary_states", |py| Ok(pyo3::types::PyTuple::empty(py)))
    }
    fn infer_shape(&self, inputs: &[Option<Shape>]) -> oxnet::Result<Signature<Shape>> {
        let given: Vec<Option<Vec<usize>>> = inputs.iter().map(|s| s.as_ref().map(|s| s.dims().to_vec())).collect();
        let (arguments, outputs, auxiliary_states): (Vec<Vec<usize>>, Vec<Vec<usize>>, Vec<Vec<usize>>) =
            call(&self.0, "infer_shape", |py| pyo3::types::PyTuple::new(py, [given.into_pyobject(py)?]))?;
        Ok(Signature { arguments: shapes(arguments), outputs: shapes(outputs), auxiliary_states: shapes(auxiliary_states) })
    }
    fn infer_type(&self, inputs: &[Option<DType>]) -> oxnet::Result<Signature<DType>> {
        let given: Vec<Option<String>> = inputs.iter().map(|d| d.map(|d| d.to_string())).collect();
        let (arguments, outputs, auxiliary_states): (Vec<String>, Vec<String>, Vec<String>) =
            call(&self.0, "infer_type", |py| pyo3::types::PyTuple::new(py, [given.into_pyobject(py)?]))?;
        Ok(Signature { arguments: dtypes(arguments)?, outputs: dtypes(outputs)?, auxiliary_states: dtypes(auxiliary_states)? })
    }
    fn create_operator(&self, ctx: Context, in_shapes: &[Shape], in_types: &[DType]) -> oxnet::Result<Arc<dyn CustomOpKernel>> {
        let dims: Vec<Vec<usize>> = in_shapes.iter().map(|s| s.dims().to_vec()).collect();
        let names: Vec<String> = in_types.iter().map(|d| d.to_string()).collect();
        let kernel: Py<PyAny> = call(&self.0, "create_operator", |py| {
            pyo3::types::PyTuple::new(py, [context_tuple(ctx).into_pyobject(py)?.into_any(), dims.into_pyobject(py)?, names.into_pyobject(py)?])
        })?;
        Ok(Arc::new(PythonKernel(kernel)))
    }
}

struct PythonKernel(Py<PyAny>);

impl CustomOpKernel for PythonKernel {
    fn forward(&self, is_train: bool, req: &[WriteReq], in_data: &[NDArray], out_data: &[NDArray], aux: &[NDArray]) -> oxnet::Result<()> {
        call::<Py<PyAny>>(&self.0, "forward", |py| {
            pyo3::types::PyTuple::new(
                py,
                [
                    is_train.into_pyobject(py)?.to_owned().into_any(),
                    reqs(req).into_pyobject(py)?,
                    handles(py, in_data)?.into_any(),
                    handles(py, out_data)?.into_any(),
                    handles(py, aux)?.into_any(),
                ],
            )
        })
        .map(drop)
    }
    fn backward(
        &self,
        req: &[WriteReq],
        out_grad: &[NDArray],
        in_data: &[NDArray],
        out_data: &[NDArray],
        in_grad: &[NDArray],
        aux: &[NDArray],
    ) -> oxnet::Result<()> {
        call::<Py<PyAny>>(&self.0, "backward", |py| {
            pyo3::types::PyTuple::new(
                py,
                [
                    reqs(req).into_pyobject(py)?,
                    handles(py, out_grad)?.into_any(),
                    handles(py, in_data)?.into_any(),
                    handles(py, out_data)?.into_any(),
                    handles(py, in_grad)?.into_any(),
                    handles(py, aux)?.into_any(),
                ],
            )
        })
        .map(drop)
    }
}

/// Register `op_type`: `factory(params)` (params: dict of the call's string parameters) returns
/// the operator type's adapter.
#[pyfunction]
fn register_custom_op(op_type: &str, factory: Py<PyAny>) {
    let factory = Arc::new(move |params: &Attrs| -> oxnet::Result<Arc<dyn CustomOpType>> {
        Python::attach(|py| {
            let adapter = params
                .clone()
                .into_pyobject(py)
                .and_then(|p| factory.bind(py).call1((p,)))
                .map_err(|e| host_error(py, "the operator's constructor", e))?;
            Ok(Arc::new(PythonOpType(adapter.unbind())) as Arc<dyn CustomOpType>)
        })
    });
    custom::register_custom_op(op_type, factory);
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(register_custom_op, m)?)?;
    Ok(())
}
