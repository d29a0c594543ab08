//! Python bindings of the oxnet core: convert arguments, delegate, convert results. Waiting and
//! bulk copies release the GIL.

mod arith;
mod async_op;
mod autograd;
mod c_api;
mod custom;
mod dlpack;
mod errors;
mod ndarray;
mod ops;
mod profiler;
mod symbol;

use pyo3::prelude::*;

/// Small tensors allocate shapes, handles and engine blocks for every op; mimalloc's thread-local
/// free lists make those allocations (and frees on worker threads) several times cheaper.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (linked in with the allocator above).
    fn mi_option_set(option: i32, value: std::ffi::c_long);
}
/// `mi_option_purge_delay` in mimalloc's option enumeration.
const MI_OPTION_PURGE_DELAY: i32 = 15;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // mimalloc hands pages that stayed free for 10 ms back to the OS; a training step frees and
    // reallocates the same memory every few milliseconds, and each return cost a zeroed 2 MB huge
    // page fault on reuse (4% of a LeNet step). One second keeps steady loops fault-free while
    // memory a program is really done with still goes back.
    // SAFETY: setting an option is thread-safe in mimalloc and takes effect on the next purge.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
    m.add("MXNetError", m.py().get_type::<errors::MXNetError>())?;
    m.add_class::<ndarray::NDArrayHandle>()?;
    ndarray::register(m)?;
    ops::register(m)?;
    arith::register(m)?;
    autograd::register(m)?;
    symbol::register(m)?;
    custom::register(m)?;
    dlpack::register(m)?;
    profiler::register(m)?;
    c_api::register(m)?;
    async_op::register(m)?;
    Ok(())
}
