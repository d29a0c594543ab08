//! Device backends: the CPU's micro-kernels (`cpu`) and the CUDA backend (`cuda`). Operators
//! (in `op`) define what is computed and dispatch to these; this module also answers what GPUs
//! exist and produces the error for work sent to a device that is absent.

use crate::base::Context;
use crate::error::Error;

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// A build without the CUDA backend has no GPU: this type has no values, so host code that
/// hands work to a GPU compiles in both builds and is unreachable in this one.
#[cfg(not(feature = "cuda"))]
pub enum Gpu {}

#[cfg(not(feature = "cuda"))]
impl Gpu {
    /// # Safety
    /// Never callable: no `Gpu` exists in this build.
    pub unsafe fn copy_from_host(&self, _dst: *mut u8, _bytes: &[u8]) -> Result<(), Error> {
        match *self {}
    }
    /// # Safety
    /// Never callable: no `Gpu` exists in this build.
    pub unsafe fn copy_to_host(&self, _dst: &mut [u8], _src: *const u8) -> Result<(), Error> {
        match *self {}
    }
    pub fn synchronize(&self) -> Result<(), Error> {
        match *self {}
    }
}

/// Number of usable CUDA devices; 0 when the driver library is absent or reports none.
pub fn num_gpus() -> usize {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The error for work placed on a GPU this build or machine cannot reach.
pub fn gpu_unavailable(ctx: Context) -> Error {
    let n = num_gpus();
    if n == 0 {
        crate::err!(Device, "{ctx} is not available: no GPU was found (the CUDA driver library could not be loaded or reports no device)")
    } else {
        crate::err!(Device, "{ctx}: GPU kernels are not available in this build yet ({n} GPU(s) found)")
    }
}

/// The GPU of `ctx`, or the error for a GPU this build or machine cannot reach.
#[cfg(feature = "cuda")]
fn device(ctx: Context) -> Result<&'static cuda::Gpu, Error> {
    cuda::gpu(ctx)
}

#[cfg(not(feature = "cuda"))]
fn device(ctx: Context) -> Result<std::convert::Infallible, Error> {
    Err(gpu_unavailable(ctx))
}

/// Ok when work can be placed on `ctx`: host memory always, a GPU when it exists and opens.
pub fn check_device(ctx: Context) -> Result<(), Error> {
    if ctx.is_host() {
        return Ok(());
    }
    device(ctx).map(|_| ())
}

/// Statistics of a GPU's memory pool (bytes held by live arrays, cached, hits, misses, peak).
pub fn gpu_pool_stats(ctx: Context) -> Result<crate::storage::PoolStats, Error> {
    #[cfg(feature = "cuda")]
    return Ok(device(ctx)?.pool().stats());
    #[cfg(not(feature = "cuda"))]
    match device(ctx)? {}
}

/// Give a GPU's cached blocks back to the device (`mx.gpu(i).empty_cache()`).
pub fn gpu_release_cached(ctx: Context) -> Result<(), Error> {
    #[cfg(feature = "cuda")]
    {
        let gpu = device(ctx)?;
        gpu.synchronize()?;
        gpu.pool().release_all(gpu)
    }
    #[cfg(not(feature = "cuda"))]
    match device(ctx)? {}
}

/// (free, total) bytes of a GPU's memory, as the driver reports them.
pub fn gpu_memory_info(ctx: Context) -> Result<(usize, usize), Error> {
    #[cfg(feature = "cuda")]
    return device(ctx)?.memory_info();
    #[cfg(not(feature = "cuda"))]
    match device(ctx)? {}
}
