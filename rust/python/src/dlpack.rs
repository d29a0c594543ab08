//! DLPack exchange: NDArrays out as zero-copy `dltensor` capsules, foreign capsules in (copied).
//!
//! The structs below follow `dlpack.h` (the unversioned ABI, capsule name "dltensor") that
//! MXNet, NumPy's `from_dlpack` and PyTorch exchange.

use std::ffi::{c_void, CStr};

use oxnet::base::{DType, Shape};
use oxnet::ndarray::NDArray;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::IntoPyResult;
use crate::ndarray::{wrap, NDArrayHandle};

const CAPSULE_NAME: &CStr = c"dltensor";
const USED_CAPSULE_NAME: &CStr = c"used_dltensor";

/// `DLDeviceType` codes: host memory, and host memory pinned by CUDA (both readable here).
const DL_CPU: i32 = 1;
const DL_CUDA_HOST: i32 = 3;

/// `DLDataTypeCode` codes.
const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_BOOL: u8 = 6;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    /// Null means compact row-major.
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
pub(crate) struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What an exported capsule owns: the managed tensor handed to the consumer (first, so that a
/// pointer to it is a pointer to this struct), the shape it points into, and the array itself,
/// whose memory the tensor addresses and which stays alive until the deleter runs.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    array: NDArray,
}

fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (DL_FLOAT, 32),
        DType::F64 => (DL_FLOAT, 64),
        DType::F16 => (DL_FLOAT, 16),
        DType::BF16 => (DL_BFLOAT, 16),
        DType::U8 => (DL_UINT, 8),
        DType::I8 => (DL_INT, 8),
        DType::I32 => (DL_INT, 32),
        DType::I64 => (DL_INT, 64),
        DType::Bool => (DL_BOOL, 8),
    };
    DLDataType { code, bits, lanes: 1 }
}

fn dtype_of(dl: DLDataType) -> oxnet::Result<DType> {
    let dtype = match (dl.code, dl.bits, dl.lanes) {
        (DL_FLOAT, 32, 1) => DType::F32,
        (DL_FLOAT, 64, 1) => DType::F64,
        (DL_FLOAT, 16, 1) => DType::F16,
        (DL_BFLOAT, 16, 1) => DType::BF16,
        (DL_UINT, 8, 1) => DType::U8,
        (DL_INT, 8, 1) => DType::I8,
        (DL_INT, 32, 1) => DType::I32,
        (DL_INT, 64, 1) => DType::I64,
        (DL_BOOL, 8, 1) => DType::Bool,
        (code, bits, lanes) => {
            oxnet::bail!(
                Type,
                "from_dlpack: unsupported DLPack dtype (code {code}, {bits} bits, {lanes} lanes); supported: \
                 float16/32/64, bfloat16, uint8, int8/32/64, bool"
            )
        }
    };
    Ok(dtype)
}

/// The deleter handed to consumers: frees what `export` allocated, releasing the array.
unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    // SAFETY: `managed` is the first field of an `Exported` that `export` leaked with
    // `Box::into_raw`; the DLPack contract calls the deleter exactly once.
    drop(unsafe { Box::from_raw(managed as *mut Exported) });
}

/// Capsule destructor: a capsule nobody consumed (still named "dltensor") frees its tensor; a
/// consumer renames it "used_dltensor" and takes over calling the deleter.
unsafe extern "C" fn destroy_capsule(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed; `PyCapsule_IsValid` sets no
    // error, and when it holds, the pointer is the `DLManagedTensor` that `export` stored.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed = pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()) as *mut DLManagedTensor;
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

/// A "dltensor" capsule addressing the array's memory (no copy), after its pending writes (and,
/// with `for_write`, its pending reads) are done. The capsule keeps the array alive until the
/// consumer's deleter call (or the capsule's destruction when nobody consumed it). Writes made
/// through it are not ordered by the engine: the caller must not use the array concurrently.
#[pyfunction]
#[pyo3(signature = (array, for_write=false))]
fn to_dlpack<'py>(py: Python<'py>, array: &NDArrayHandle, for_write: bool) -> PyResult<Bound<'py, PyAny>> {
    let array = array.inner.clone();
    let context = array.context();
    if !context.is_host() {
        return Err(PyValueError::new_err(format!("to_dlpack: only host (cpu) arrays can be exported, this one is on {context}")));
    }
    let waiting = array.clone();
    py.detach(move || if for_write { waiting.wait_to_write() } else { waiting.wait_to_read() }).py()?;
    let data = array.data_ptr().py()?;
    let shape: Vec<i64> = array.shape().dims().iter().map(|&d| d as i64).collect();
    let exported = Box::into_raw(Box::new(Exported {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device: DLDevice { device_type: DL_CPU, device_id: 0 },
                ndim: shape.len() as i32,
                dtype: dl_dtype(array.dtype()),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        shape,
        array,
    }));
    // SAFETY: `exported` was just leaked from a Box and nothing else references it yet; the
    // shape Vec's heap buffer does not move when the Box's contents are addressed in place.
    unsafe {
        (*exported).managed.dl_tensor.shape = (*exported).shape.as_mut_ptr();
        (*exported).managed.manager_ctx = exported as *mut c_void;
    }
    // SAFETY: the name is a static C string (capsules keep the pointer); the destructor handles
    // both the consumed and the unconsumed capsule. On failure the capsule does not exist, so
    // the tensor is freed here instead.
    unsafe {
        let capsule = pyo3::ffi::PyCapsule_New(exported as *mut c_void, CAPSULE_NAME.as_ptr(), Some(destroy_capsule));
        if capsule.is_null() {
            delete_exported(exported as *mut DLManagedTensor);
        }
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}

/// Copy `count` elements of `elem_size` bytes, laid out with `strides` (in elements) from `src`,
/// into `dst` in row-major order.
fn gather_strided(src: *const u8, shape: &[usize], strides: &[i64], elem_size: usize, dst: &mut [u8]) {
    let mut index = vec![0usize; shape.len()];
    for element in 0..dst.len() / elem_size {
        let offset: i64 = index.iter().zip(strides).map(|(&i, &s)| i as i64 * s).sum();
        // SAFETY: the caller guarantees that every in-shape index maps (by `strides`) into the
        // producer's allocation, as the DLPack contract states for the tensor it describes.
        let source = unsafe { std::slice::from_raw_parts(src.offset(offset as isize * elem_size as isize), elem_size) };
        dst[element * elem_size..(element + 1) * elem_size].copy_from_slice(source);
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// A new cpu array holding a copy of the tensor of a "dltensor" capsule (host memory only). The
/// capsule is consumed, as DLPack requires: renamed "used_dltensor", and its deleter called once
/// the copy is made, so the producer's memory is released right away.
#[pyfunction]
fn from_dlpack(py: Python<'_>, capsule: &Bound<'_, PyAny>) -> PyResult<Py<NDArrayHandle>> {
    let raw = capsule.as_ptr();
    // SAFETY: `raw` is a live object borrowed for this call; `PyCapsule_IsValid` accepts any
    // object and sets no error.
    if unsafe { pyo3::ffi::PyCapsule_IsValid(raw, CAPSULE_NAME.as_ptr()) } != 1 {
        return Err(PyValueError::new_err("from_dlpack expects an unconsumed DLPack capsule named 'dltensor' (a capsule can be consumed only once)"));
    }
    // SAFETY: the capsule is valid under that name, so its pointer is the producer's
    // DLManagedTensor, alive until its deleter is called.
    let managed = unsafe { pyo3::ffi::PyCapsule_GetPointer(raw, CAPSULE_NAME.as_ptr()) } as *mut DLManagedTensor;
    // SAFETY: renaming a valid capsule to a static name; from now on its destructor (the
    // producer's) sees a consumed capsule and leaves the deleter to us.
    unsafe { pyo3::ffi::PyCapsule_SetName(raw, USED_CAPSULE_NAME.as_ptr()) };
    // SAFETY: the capsule was consumed just above, so nothing else calls the deleter.
    let result = unsafe { consume_managed(managed) };
    wrap(py, result.py()?)
}

/// A copy of a producer's tensor; its deleter is then called, so the producer's memory goes back
/// at once.
///
/// # Safety
/// `managed` points to a live `DLManagedTensor` whose deleter nobody else will call.
pub(crate) unsafe fn consume_managed(managed: *mut DLManagedTensor) -> oxnet::Result<NDArray> {
    // SAFETY: live per the contract; the tensor is only read here.
    let result = copy_tensor(unsafe { &(*managed).dl_tensor });
    // SAFETY: per the contract, this is the one call of the deleter.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
    result
}

fn copy_tensor(tensor: &DLTensor) -> oxnet::Result<NDArray> {
    if tensor.device.device_type != DL_CPU && tensor.device.device_type != DL_CUDA_HOST {
        oxnet::bail!(Value, "from_dlpack: only host memory can be imported, the tensor is on DLPack device type {}", tensor.device.device_type);
    }
    let dtype = dtype_of(tensor.dtype)?;
    let ndim = usize::try_from(tensor.ndim).map_err(|_| oxnet::err!(Value, "from_dlpack: negative ndim"))?;
    // SAFETY: DLPack guarantees `shape` (and `strides` when not null) hold `ndim` entries.
    let dims: &[i64] = if ndim == 0 { &[] } else { unsafe { std::slice::from_raw_parts(tensor.shape, ndim) } };
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| oxnet::err!(Value, "from_dlpack: invalid shape {dims:?}")))
        .collect::<oxnet::Result<_>>()?;
    let shape = Shape::new(shape);
    let count = shape.checked_size()?;
    let elem_size = dtype.size();
    let mut bytes = vec![0u8; shape.checked_bytes(elem_size)?];
    if count > 0 {
        // SAFETY: the producer's data pointer plus byte_offset addresses the first element.
        let start = unsafe { (tensor.data as *const u8).add(tensor.byte_offset as usize) };
        let row_major = row_major_strides(shape.dims());
        // SAFETY: as for `shape`; strides are in elements.
        let strides: &[i64] =
            if tensor.strides.is_null() || ndim == 0 { &row_major } else { unsafe { std::slice::from_raw_parts(tensor.strides, ndim) } };
        if strides == row_major.as_slice() {
            // SAFETY: a compact row-major tensor of `count` elements is `count * elem_size`
            // contiguous bytes from `start`.
            let total = bytes.len();
            bytes.copy_from_slice(unsafe { std::slice::from_raw_parts(start, total) });
        } else {
            gather_strided(start, shape.dims(), strides, elem_size, &mut bytes);
        }
    }
    NDArray::from_bytes(shape, dtype, oxnet::base::Context::cpu(0), &bytes)
}

fn row_major_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1] as i64;
    }
    strides
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(to_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    Ok(())
}
