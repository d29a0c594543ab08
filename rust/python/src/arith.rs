//! `a + b`, `a - b`, `a * b` and `a / b` on two NDArrays as C methods of the Python class.
//!
//! A Python `__add__` runs a frame of its own before it reaches `_core.invoke`, builds an
//! argument tuple and has the operator looked up by name: about a tenth of a 2x2 addition
//! (measured 0.81 us through the Python method against 0.73 us calling `_core.invoke` directly).
//! These methods are method descriptors (what a C extension type's methods are), which Python
//! calls with `(self, other)` directly; they invoke their operator, looked up and instantiated
//! once, when both operands are plain NDArrays and operator calls are not routed elsewhere
//! (AMP's casts), and leave every other case to the Python method they replace.

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use oxnet::op::{self, Attrs, Operator};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::errors::IntoPyResult;
use crate::ndarray::current_context;
use crate::ops::{as_array, catching_panics, push_site, python_ndarray};

/// The operators with a C method; a method's position here is its const parameter.
const OPERATORS: [&CStr; 4] = [c"broadcast_add", c"broadcast_sub", c"broadcast_mul", c"broadcast_div"];

/// What a method needs at each call.
struct Method {
    name: &'static str,
    operator: Arc<dyn Operator>,
    /// The NDArray class: the fast path takes exact instances only (a subclass may keep its
    /// handle its own way).
    class: Py<PyType>,
    /// The Python method replaced, for every other case.
    fallback: Py<PyAny>,
}

static METHODS: [PyOnceLock<Method>; 4] = [PyOnceLock::new(), PyOnceLock::new(), PyOnceLock::new(), PyOnceLock::new()];

/// Set while operator calls are routed through another `invoke` (`ndarray._route_operators`):
/// the methods then take the Python path, which calls it. Only read and written under the GIL;
/// atomic so that the static needs no lock.
static ROUTED: AtomicBool = AtomicBool::new(false);

/// A C method for `class` computing `operator` (one of [`OPERATORS`]) on two NDArrays, calling
/// `fallback(self, other)` otherwise.
#[pyfunction]
fn arith_method(py: Python<'_>, class: Bound<'_, PyType>, operator: &str, fallback: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let Some(position) = OPERATORS.iter().position(|name| name.to_bytes() == operator.as_bytes()) else {
        return Err(pyo3::exceptions::PyValueError::new_err(format!("no C method for operator {operator}")));
    };
    let (name, function): (&'static CStr, ffi::PyCFunction) = match position {
        0 => (c"__add__", binary_method::<0>),
        1 => (c"__sub__", binary_method::<1>),
        2 => (c"__mul__", binary_method::<2>),
        _ => (c"__truediv__", binary_method::<3>),
    };
    let operator_name = OPERATORS[position].to_str().map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let instance = op::lookup(operator_name).and_then(|def| def.instantiate(operator_name, &Attrs::new())).py()?;
    let method = Method { name: operator_name, operator: instance, class: class.clone().unbind(), fallback: fallback.unbind() };
    // A second registration (a reloaded module) keeps the first one's class and fallback.
    let _ = METHODS[position].set(py, method);
    // The descriptor keeps a pointer to its definition for as long as it lives: one leaked
    // definition per registration, a few per process.
    let definition = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: name.as_ptr() as *const c_char,
        ml_meth: ffi::PyMethodDefPointer { PyCFunction: function },
        ml_flags: ffi::METH_O,
        ml_doc: std::ptr::null(),
    }));
    // SAFETY: `class` is a live type object and `definition` a valid, 'static METH_O
    // definition; PyDescr_NewMethod returns a new reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(class.as_type_ptr(), definition)) }.map(Bound::unbind)
}

/// Whether operator calls are routed through another `invoke` (see [`ROUTED`]).
#[pyfunction]
fn route_arith(routed: bool) {
    ROUTED.store(routed, Ordering::Relaxed);
}

/// The C function of the method for `OPERATORS[K]`.
///
/// # Safety
/// Called by Python's method descriptor with the GIL held, `slf` an instance of the class the
/// descriptor was made for and `other` the argument, both borrowed references.
unsafe extern "C" fn binary_method<const K: usize>(slf: *mut ffi::PyObject, other: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: Python calls this with the GIL held (see above).
    let py = unsafe { Python::assume_attached() };
    // SAFETY: both are live borrowed references for the duration of the call.
    let (slf, other) = unsafe { (Bound::from_borrowed_ptr(py, slf), Bound::from_borrowed_ptr(py, other)) };
    let name = OPERATORS[K].to_str().unwrap_or("arithmetic");
    match catching_panics(name, || call(py, K, &slf, &other)) {
        Ok(result) => result.into_ptr(),
        Err(error) => {
            error.restore(py);
            std::ptr::null_mut()
        }
    }
}

fn call<'py>(py: Python<'py>, position: usize, slf: &Bound<'py, PyAny>, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let Some(method) = METHODS.get(position).and_then(|m| m.get(py)) else {
        return Err(pyo3::exceptions::PyRuntimeError::new_err("arithmetic method used before its registration"));
    };
    let class = method.class.bind(py);
    if !ROUTED.load(Ordering::Relaxed) && slf.get_type().is(class) && other.get_type().is(class) {
        if let (Some(lhs), Some(rhs)) = (as_array(slf)?, as_array(other)?) {
            let _api = oxnet::profiler::api_call("MXImperativeInvokeEx");
            let outputs = oxnet::imperative::invoke_operator(
                method.name,
                method.operator.clone(),
                &Attrs::new(),
                &[lhs, rhs],
                None,
                current_context(),
                push_site(),
            )
            .py()?;
            let Some(result) = outputs.into_iter().next() else {
                return Err(crate::errors::to_py(oxnet::err!(Runtime, "operator {} returned no output", method.name)));
            };
            return python_ndarray(py, result);
        }
    }
    method.fallback.bind(py).call1((slf, other))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(arith_method, m)?)?;
    m.add_function(wrap_pyfunction!(route_arith, m)?)?;
    Ok(())
}
