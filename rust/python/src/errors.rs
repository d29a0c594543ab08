//! The one place where core errors become Python exceptions.

use oxnet::{Error, ErrorKind};
use pyo3::exceptions::{PyIndexError, PyRuntimeError};
use pyo3::PyErr;

pyo3::create_exception!(oxnet._core, MXNetError, PyRuntimeError, "Default error raised by oxnet functions (MXNet's mx.base.MXNetError).");

/// IndexError keeps Python's protocol (iteration, `in`) working; everything else is MXNetError,
/// as in MXNet.
pub fn to_py(e: Error) -> PyErr {
    match e.kind {
        ErrorKind::Index => PyIndexError::new_err(e.message),
        _ => MXNetError::new_err(e.message),
    }
}

pub trait IntoPyResult<T> {
    fn py(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPyResult<T> for oxnet::Result<T> {
    fn py(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
