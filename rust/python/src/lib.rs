//! Python bindings of the oxnet core: convert arguments, delegate, convert results. Waiting and
//! bulk copies release the GIL.

mod autograd;
mod errors;
mod ndarray;
mod ops;
mod symbol;

use pyo3::prelude::*;

/// Small tensors allocate shapes, handles and engine blocks for every op; mimalloc's thread-local
/// free lists make those allocations (and frees on worker threads) several times cheaper.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MXNetError", m.py().get_type::<errors::MXNetError>())?;
    m.add_class::<ndarray::NDArrayHandle>()?;
    ndarray::register(m)?;
    ops::register(m)?;
    autograd::register(m)?;
    symbol::register(m)?;
    Ok(())
}
