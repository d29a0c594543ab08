//! A small C ABI for programs that reach MXNet's library through ctypes (`mx.base._LIB`), with
//! MXNet's conventions: 0 on success, -1 on failure with the message in `MXGetLastError`;
//! an `NDArrayHandle` is an owned array on the heap, turned into a Python `NDArray` by
//! `NDArray(handle=...)` (which takes it over) or released with `MXNDArrayFree`.
//!
//! Only entry points that have a meaning in oxnet are here (DLPack import, the handle's life);
//! everything else in MXNet's C API reached the C++ engine's internals.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use oxnet::ndarray::NDArray;
use pyo3::prelude::*;

use crate::dlpack::{consume_managed, DLManagedTensor};
use crate::ndarray::{wrap, NDArrayHandle};

thread_local! {
    /// The message of this thread's last failed call, as MXNet keeps it (per thread).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Run a C entry point's body: an error or a panic becomes -1 and the thread's last error; no
/// panic unwinds into the C caller.
fn guarded(body: impl FnOnce() -> oxnet::Result<()>) -> c_int {
    let message = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e.message,
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            format!("internal error: {}", what.unwrap_or_else(|| "a panic".into()))
        }
    };
    // Interior NUL bytes cannot be represented in a C string; they never occur in our messages,
    // and replacing them keeps the rest readable if one ever does.
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    -1
}

/// The message of the calling thread's last failed call. The pointer stays valid until that
/// thread's next failing call.
#[no_mangle]
pub extern "C" fn MXGetLastError() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Import a `DLManagedTensor` (host memory) as a new array handle in `*out`. The tensor is
/// consumed: its data is copied and its deleter called before this returns.
///
/// # Safety
/// `dlpack` is a live `DLManagedTensor` the caller hands over (nobody else calls its deleter);
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayFromDLPack(dlpack: *mut c_void, out: *mut *mut c_void) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { MXNDArrayFromDLPackEx(dlpack, false, out) }
}

/// As [`MXNDArrayFromDLPack`]; `transient_handle` (MXNet's hint that the handle is short-lived)
/// changes nothing here, since the data is copied.
///
/// # Safety
/// As [`MXNDArrayFromDLPack`].
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayFromDLPackEx(dlpack: *mut c_void, _transient_handle: bool, out: *mut *mut c_void) -> c_int {
    guarded(|| {
        if dlpack.is_null() || out.is_null() {
            oxnet::bail!(Value, "MXNDArrayFromDLPack: null {} pointer", if dlpack.is_null() { "tensor" } else { "output" });
        }
        // SAFETY: per the contract, `dlpack` is a managed tensor handed over to us.
        let array = unsafe { consume_managed(dlpack as *mut DLManagedTensor) }?;
        // SAFETY: `out` is non-null and writable per the contract; the box is reclaimed by
        // `ndarray_from_c_handle` or `MXNDArrayFree`.
        unsafe { *out = Box::into_raw(Box::new(array)) as *mut c_void };
        Ok(())
    })
}

/// Release a handle made by this library (null is ignored).
///
/// # Safety
/// `handle` came from this library and was neither freed nor taken over by `NDArray(handle=...)`.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayFree(handle: *mut c_void) -> c_int {
    guarded(|| {
        if !handle.is_null() {
            // SAFETY: per the contract, the handle is a live box made by `Box::into_raw`.
            drop(unsafe { Box::from_raw(handle as *mut NDArray) });
        }
        Ok(())
    })
}

/// Take over a C handle (its address) as a Python-side array handle (`NDArray(handle=...)` with
/// a ctypes `NDArrayHandle`). The C handle must not be used or freed afterwards.
#[pyfunction]
fn ndarray_from_c_handle(py: Python<'_>, address: usize) -> PyResult<Py<NDArrayHandle>> {
    if address == 0 {
        return Err(crate::errors::MXNetError::new_err("NDArray: the C handle is null"));
    }
    // SAFETY: the address is a handle made by this library's C entry points (the only source of
    // `NDArrayHandle` values in oxnet), which the caller gives up here.
    let array = unsafe { Box::from_raw(address as *mut NDArray) };
    wrap(py, *array)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ndarray_from_c_handle, m)?)?;
    Ok(())
}
