//! NDArray handles, device/dtype helpers, waits, NumPy transfer and `.params` I/O.

use std::cell::Cell;

use oxnet::base::{Context, DType, DeviceType, Shape};
use oxnet::ndarray::NDArray;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::errors::IntoPyResult;

/// An NDArray of the core. The Python `oxnet.nd.NDArray` wraps one.
#[pyclass(module = "oxnet._core", name = "NDArrayHandle", frozen)]
pub struct NDArrayHandle {
    pub inner: NDArray,
}

/// Views are recorded under autograd as the operators that compute them.
fn record_reshape(source: &NDArray, view: NDArray) -> oxnet::Result<NDArray> {
    let dims: Vec<String> = view.shape().dims().iter().map(usize::to_string).collect();
    let attrs = [("shape".to_string(), format!("({})", dims.join(", ")))].into_iter().collect();
    oxnet::autograd::record_view("Reshape", &attrs, source, view)
}

fn record_first_axis_slice(source: &NDArray, view: NDArray, begin: usize, end: usize) -> oxnet::Result<NDArray> {
    let attrs =
        [("axis", "0".to_string()), ("begin", begin.to_string()), ("end", end.to_string())].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    oxnet::autograd::record_view("slice_axis", &attrs, source, view)
}

pub fn wrap(py: Python<'_>, a: NDArray) -> PyResult<Py<NDArrayHandle>> {
    Py::new(py, NDArrayHandle { inner: a })
}

pub fn context_tuple(c: Context) -> (i32, i32) {
    (c.device_type.code(), c.device_id)
}

pub fn context_from(c: (i32, i32)) -> PyResult<Context> {
    Ok(Context { device_type: DeviceType::from_code(c.0).py()?, device_id: c.1 })
}

pub fn dtype_from(name: &str) -> PyResult<DType> {
    DType::from_name(name).py()
}

thread_local! {
    /// The context `with mx.Context(...)` selected on this thread (MXNet keeps it per thread).
    static CURRENT_CONTEXT: Cell<Context> = const { Cell::new(Context::cpu(0)) };
}

pub fn current_context() -> Context {
    CURRENT_CONTEXT.with(Cell::get)
}

#[pymethods]
impl NDArrayHandle {
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape().dims())
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype().name()
    }
    #[getter]
    fn context(&self) -> (i32, i32) {
        context_tuple(self.inner.context())
    }
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape().ndim()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
    fn reshape_view(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<Py<NDArrayHandle>> {
        let view = self.inner.reshape_view(Shape::new(shape.clone())).py()?;
        wrap(py, record_reshape(&self.inner, view).py()?)
    }
    fn slice_view(&self, py: Python<'_>, begin: usize, end: usize) -> PyResult<Py<NDArrayHandle>> {
        let view = self.inner.slice_view(begin, end).py()?;
        wrap(py, record_first_axis_slice(&self.inner, view, begin, end).py()?)
    }
    fn at_view(&self, py: Python<'_>, index: usize) -> PyResult<Py<NDArrayHandle>> {
        let rows = self.inner.slice_view(index, index + 1).py()?;
        let rows = record_first_axis_slice(&self.inner, rows, index, index + 1).py()?;
        let view = rows.at_view(0).py()?;
        wrap(py, record_reshape(&rows, view).py()?)
    }
    fn same_chunk(&self, other: &NDArrayHandle) -> bool {
        self.inner.same_chunk(&other.inner)
    }
    fn wait_to_read(&self, py: Python<'_>) -> PyResult<()> {
        let _api = oxnet::profiler::api_call("MXNDArrayWaitToRead");
        let a = self.inner.clone();
        py.detach(move || a.wait_to_read()).py()
    }
    fn wait_to_write(&self, py: Python<'_>) -> PyResult<()> {
        let _api = oxnet::profiler::api_call("MXNDArrayWaitToWrite");
        let a = self.inner.clone();
        py.detach(move || a.wait_to_write()).py()
    }
    /// Copy the elements into a writable, C-contiguous byte buffer (a uint8 view of a NumPy array).
    fn read_into(&self, py: Python<'_>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let _api = oxnet::profiler::api_call("MXNDArraySyncCopyToCPU");
        let buf = PyBuffer::<u8>::get(dst)?;
        if buf.readonly() || !buf.is_c_contiguous() {
            return Err(pyo3::exceptions::PyValueError::new_err("read_into needs a writable C-contiguous buffer"));
        }
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        let a = self.inner.clone();
        py.detach(move || {
            // SAFETY: the buffer stays exported (and so alive and unmoved) until `buf` drops after
            // this closure; it is writable and exactly `len` bytes long.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            a.read_into(dst)
        })
        .py()
    }
    fn __repr__(&self) -> String {
        format!("<NDArrayHandle {} {} @{}>", self.inner.shape(), self.inner.dtype(), self.inner.context())
    }
}

/// A new array holding a copy of a C-contiguous byte buffer.
#[pyfunction]
fn from_buffer(py: Python<'_>, src: &Bound<'_, PyAny>, shape: Vec<usize>, dtype: &str, ctx: (i32, i32)) -> PyResult<Py<NDArrayHandle>> {
    let buf = PyBuffer::<u8>::get(src)?;
    if !buf.is_c_contiguous() {
        return Err(pyo3::exceptions::PyValueError::new_err("from_buffer needs a C-contiguous buffer"));
    }
    let (dtype, ctx) = (dtype_from(dtype)?, context_from(ctx)?);
    // SAFETY: the exported buffer is alive and unmoved while `buf` lives (through this call).
    let bytes = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
    // A copy to a GPU waits for the device's queued work: without the GIL.
    let array = py.detach(|| NDArray::from_bytes(Shape::new(shape), dtype, ctx, bytes)).py()?;
    wrap(py, array)
}

/// An array over the memory of a C-contiguous buffer, without a copy (`mx.nd.from_numpy`): the
/// array keeps the buffer export (and so its owner) alive; writes through it are visible there.
#[pyfunction]
fn share_buffer(py: Python<'_>, src: &Bound<'_, PyAny>, shape: Vec<usize>, dtype: &str) -> PyResult<Py<NDArrayHandle>> {
    let buf = PyBuffer::<u8>::get(src)?;
    if !buf.is_c_contiguous() {
        return Err(pyo3::exceptions::PyValueError::new_err("only C-contiguous arrays can be shared without a copy"));
    }
    let ptr = std::ptr::NonNull::new(buf.buf_ptr() as *mut u8).unwrap_or(std::ptr::NonNull::dangling());
    let bytes = buf.len_bytes();
    // SAFETY: a buffer export keeps the exporter's memory valid and unmoved (NumPy refuses to
    // resize an array with live exports) until it is released, which happens when the boxed
    // PyBuffer is dropped with the array's storage. The NumPy side is made read-only by the
    // caller, so only arrays sharing this storage write it, in the order the engine gives them.
    let buffer = unsafe { oxnet::storage::Buffer::external(ptr, bytes, Box::new(buf)) };
    wrap(py, NDArray::from_buffer(buffer, Shape::new(shape), dtype_from(dtype)?).py()?)
}

/// An uninitialized array (MXNet's `empty`).
#[pyfunction]
fn empty(py: Python<'_>, shape: Vec<usize>, dtype: &str, ctx: (i32, i32)) -> PyResult<Py<NDArrayHandle>> {
    wrap(py, NDArray::empty(Shape::new(shape), dtype_from(dtype)?, context_from(ctx)?).py()?)
}

#[pyfunction]
fn waitall(py: Python<'_>) -> PyResult<()> {
    let _api = oxnet::profiler::api_call("MXNDArrayWaitAll");
    py.detach(oxnet::engine::wait_all).py()
}

#[pyfunction]
fn set_current_context(ctx: (i32, i32)) -> PyResult<(i32, i32)> {
    let new = context_from(ctx)?;
    Ok(context_tuple(CURRENT_CONTEXT.with(|c| c.replace(new))))
}

#[pyfunction]
fn get_current_context() -> (i32, i32) {
    context_tuple(current_context())
}

#[pyfunction]
fn num_gpus() -> usize {
    oxnet::backend::num_gpus()
}

#[pyfunction]
fn seed(value: u64) {
    oxnet::random::seed(value)
}

/// Push a copy (casting if dtypes differ) of `src` into `dst`.
#[pyfunction]
fn copyto(src: &NDArrayHandle, dst: &NDArrayHandle) -> PyResult<()> {
    oxnet::imperative::copy(&src.inner, &dst.inner, crate::ops::push_site()).py()
}

/// Infer a shape from MXNet's reshape codes.
#[pyfunction]
#[pyo3(signature = (src, spec, reverse=false))]
fn infer_reshape(src: Vec<usize>, spec: Vec<i64>, reverse: bool) -> PyResult<Vec<usize>> {
    Ok(oxnet::op::infer_reshape(&Shape::new(src), &spec, reverse).py()?.0.into_vec())
}

#[pyfunction]
fn save(py: Python<'_>, path: std::path::PathBuf, arrays: Vec<PyRef<'_, NDArrayHandle>>, names: Vec<String>) -> PyResult<()> {
    let arrays: Vec<NDArray> = arrays.iter().map(|a| a.inner.clone()).collect();
    py.detach(move || oxnet::io::params::save(&path, &arrays, &names)).py()
}

/// Replace a file's whole contents without ever leaving it half-written (symbol JSON, optimizer
/// states: every save that does not go through `save`).
#[pyfunction]
fn write_file(py: Python<'_>, path: std::path::PathBuf, data: &[u8]) -> PyResult<()> {
    py.detach(move || oxnet::io::file::write_file(&path, data)).py()
}

#[pyfunction]
fn load<'py>(py: Python<'py>, path: std::path::PathBuf) -> PyResult<(Bound<'py, PyList>, Vec<String>)> {
    let (arrays, names) = py.detach(move || oxnet::io::params::load(&path)).py()?;
    let handles = arrays.into_iter().map(|a| wrap(py, a)).collect::<PyResult<Vec<_>>>()?;
    Ok((PyList::new(py, handles)?, names))
}

#[pyfunction]
fn load_frombuffer<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Bound<'py, PyList>, Vec<String>)> {
    let (arrays, names) = oxnet::io::params::from_bytes(data).py()?;
    let handles = arrays.into_iter().map(|a| wrap(py, a)).collect::<PyResult<Vec<_>>>()?;
    Ok((PyList::new(py, handles)?, names))
}

#[pyfunction]
fn save_tobuffer<'py>(py: Python<'py>, arrays: Vec<PyRef<'_, NDArrayHandle>>, names: Vec<String>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let arrays: Vec<NDArray> = arrays.iter().map(|a| a.inner.clone()).collect();
    let bytes = py.detach(move || oxnet::io::params::to_bytes(&arrays, &names)).py()?;
    Ok(pyo3::types::PyBytes::new(py, &bytes))
}

/// Pool statistics of host memory: used (by size class), pooled, hits, misses, peak used,
/// requested (the bytes live arrays asked for).
#[pyfunction]
fn cpu_pool_stats() -> (u64, u64, u64, u64, u64, u64) {
    let s = oxnet::storage::cpu_pool().stats();
    (s.used_bytes, s.pooled_bytes, s.hits, s.misses, s.peak_used_bytes, s.requested_bytes)
}

#[pyfunction]
fn cpu_pool_release_all() {
    oxnet::storage::cpu_pool().release_all()
}

/// Pool statistics of GPU `device_id`, as `cpu_pool_stats`.
#[pyfunction]
fn gpu_pool_stats(device_id: i32) -> PyResult<(u64, u64, u64, u64, u64, u64)> {
    let s = oxnet::backend::gpu_pool_stats(oxnet::base::Context::gpu(device_id)).py()?;
    Ok((s.used_bytes, s.pooled_bytes, s.hits, s.misses, s.peak_used_bytes, s.requested_bytes))
}

#[pyfunction]
fn gpu_pool_release_all(py: Python<'_>, device_id: i32) -> PyResult<()> {
    py.detach(|| oxnet::backend::gpu_release_cached(oxnet::base::Context::gpu(device_id))).py()
}

/// (free, total) bytes of GPU `device_id`'s memory.
#[pyfunction]
fn gpu_memory_info(device_id: i32) -> PyResult<(usize, usize)> {
    oxnet::backend::gpu_memory_info(oxnet::base::Context::gpu(device_id)).py()
}

#[pyfunction]
fn engine_info() -> (String, usize) {
    let kind = match oxnet::engine::kind() {
        oxnet::engine::EngineKind::Naive => "NaiveEngine",
        oxnet::engine::EngineKind::Threaded => "ThreadedEngine",
    };
    (kind.to_string(), oxnet::engine::num_threads())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(from_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(share_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(waitall, m)?)?;
    m.add_function(wrap_pyfunction!(set_current_context, m)?)?;
    m.add_function(wrap_pyfunction!(get_current_context, m)?)?;
    m.add_function(wrap_pyfunction!(num_gpus, m)?)?;
    m.add_function(wrap_pyfunction!(seed, m)?)?;
    m.add_function(wrap_pyfunction!(copyto, m)?)?;
    m.add_function(wrap_pyfunction!(infer_reshape, m)?)?;
    m.add_function(wrap_pyfunction!(save, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(load_frombuffer, m)?)?;
    m.add_function(wrap_pyfunction!(save_tobuffer, m)?)?;
    m.add_function(wrap_pyfunction!(write_file, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_pool_release_all, m)?)?;
    m.add_function(wrap_pyfunction!(engine_info, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_pool_release_all, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_memory_info, m)?)?;
    Ok(())
}
