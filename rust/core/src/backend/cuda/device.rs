//! One GPU as the engine uses it: its context, the stream all of its work runs on, its memory
//! pool, its loaded kernels and its cuBLAS handle.
//!
//! Ordering: every kernel, copy and GEMM of a device is enqueued on that device's one stream, so
//! the stream runs them in the order the engine's dependency tracking releases them. An engine
//! op on a GPU returns once its work is enqueued; the host waits for the device only at sync
//! points (a copy to the host, `wait_to_read`, `waitall`), where errors of kernels that failed
//! while running surface like any operator error.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream, DriverError};

use super::pool::GpuPool;
use super::{kernel_source, nvrtc};
use crate::base::Context;
use crate::error::{Error, Result};

/// A CUDA driver failure as an oxnet error, naming what was being done.
pub(crate) fn driver_error(e: DriverError, doing: &str) -> Error {
    let name = e.error_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    crate::err!(Device, "{doing}: CUDA error {name} ({text})")
}

/// A device kernel ready to launch: a loaded function of a module that is never unloaded.
#[derive(Clone, Copy)]
struct Function(sys::CUfunction);

// SAFETY: a CUfunction handle may be used from any thread whose current context is the one it
// was loaded in (every launch binds that context first); the module behind it lives as long as
// the process (its CudaFunction is kept in the device's table, never removed).
unsafe impl Send for Function {}

pub struct Gpu {
    ordinal: usize,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: GpuPool,
    /// Loaded kernels by name; each entry keeps its module alive (entries are never removed).
    functions: Mutex<HashMap<String, (CudaFunction, Function)>>,
    multiprocessors: u32,
    /// The cuBLAS handle, made on first use; the mutex serialises its use (a handle is not
    /// thread-safe) and holds it across the call that enqueues the GEMM.
    pub(super) blas: OnceLock<std::result::Result<Mutex<super::blas::Blas>, Error>>,
}

impl Gpu {
    fn open(ordinal: usize) -> Result<Gpu> {
        let context = CudaContext::new(ordinal).map_err(|e| driver_error(e, &format!("opening gpu({ordinal})")))?;
        let stream = context.new_stream().map_err(|e| driver_error(e, "creating a stream"))?;
        let multiprocessors = context
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| driver_error(e, "reading the multiprocessor count"))?
            .max(1) as u32;
        Ok(Gpu { ordinal, context, stream, pool: GpuPool::new(), functions: Mutex::new(HashMap::new()), multiprocessors, blas: OnceLock::new() })
    }

    pub fn context(&self) -> Context {
        Context::gpu(self.ordinal as i32)
    }

    pub fn pool(&'static self) -> &'static GpuPool {
        &self.pool
    }

    pub(super) fn raw_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Make this device's context current on the calling thread (engine workers switch
    /// between devices); every driver call of this module does this first.
    pub fn bind(&self) -> Result<()> {
        self.context.bind_to_thread().map_err(|e| driver_error(e, "binding the CUDA context"))
    }

    /// Wait for everything enqueued on the device so far; the error of a kernel that failed
    /// while running comes out here.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream.synchronize().map_err(|e| driver_error(e, &format!("running work on {}", self.context())))
    }

    /// (free, total) bytes of device memory.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        self.context.mem_get_info().map_err(|e| driver_error(e, "reading the memory information"))
    }

    /// Threads blocks for a grid-stride kernel over `n` elements: enough to fill every
    /// multiprocessor several times over, no more than the elements need.
    pub fn blocks_for(&self, n: usize, threads: u32) -> u32 {
        let needed = n.div_ceil(threads as usize).max(1);
        needed.min(self.multiprocessors as usize * 32) as u32
    }

    /// The kernel `name` whose CUDA source (after [`kernel_source::PRELUDE`]) is `source`,
    /// compiled and loaded on first use.
    fn function(&self, name: &str, source: impl FnOnce() -> String) -> Result<Function> {
        if let Some((_, f)) = self.functions.lock().unwrap_or_else(PoisonError::into_inner).get(name) {
            return Ok(*f);
        }
        // Compiling and loading run outside the lock (a poisoned table is still consistent:
        // entries are inserted whole); two threads may both load a new kernel, one is kept.
        let ptx = nvrtc::compile(name, &format!("{}\n{}", kernel_source::PRELUDE, source()))?;
        self.bind()?;
        let module = self.context.load_module((*ptx).clone()).map_err(|e| driver_error(e, &format!("loading kernel {name}")))?;
        let loaded = module.load_function(name).map_err(|e| driver_error(e, &format!("finding kernel {name}")))?;
        let raw = Function(loaded.cu_function());
        let mut table = self.functions.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(table.entry(name.to_string()).or_insert((loaded, raw)).1)
    }

    /// Enqueue kernel `name` (compiled from `source` on first use) on the device's stream.
    ///
    /// # Safety
    /// `params` must point to one value per kernel parameter, of the parameter's type and in
    /// order, and every device address among them must stay allocated, and be neither read
    /// nor written by the host, until the stream has run the kernel (the engine's vars and the
    /// stream-ordered pool ensure this for arrays).
    pub unsafe fn launch(&self, name: &str, source: impl FnOnce() -> String, grid: u32, block: u32, params: &mut [*mut c_void]) -> Result<()> {
        let function = self.function(name, source)?;
        self.bind()?;
        // SAFETY: the function was loaded in this (now current) context; the parameters are the
        // caller's contract.
        unsafe { result::launch_kernel(function.0, (grid, 1, 1), (block, 1, 1), 0, self.raw_stream(), params) }
            .map_err(|e| driver_error(e, &format!("launching kernel {name}")))
    }

    /// Copy `bytes` host bytes to device address `dst`, enqueued on the stream. The host bytes
    /// are staged by the driver before this returns (pageable memory), so they may be reused.
    ///
    /// # Safety
    /// `dst` must address at least `bytes.len()` bytes of this device's memory that nothing
    /// else uses until the copy has run.
    pub unsafe fn copy_from_host(&self, dst: *mut u8, bytes: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract; the source slice is valid for its length.
        unsafe { result::memcpy_htod_async(dst as sys::CUdeviceptr, bytes, self.raw_stream()) }.map_err(|e| driver_error(e, "copying to the GPU"))?;
        // Pageable host memory: the driver has staged the bytes once the call returns, but the
        // CUDA documentation only promises that for transfers up to 64 KiB; waiting makes the
        // caller's buffer free to reuse whatever its size.
        self.synchronize()
    }

    /// Copy device bytes at `src` into `dst`, waiting for the stream (a sync point: errors of
    /// earlier kernels come out here).
    ///
    /// # Safety
    /// `src` must address at least `dst.len()` bytes of this device's memory that no pending
    /// work writes.
    pub unsafe fn copy_to_host(&self, dst: &mut [u8], src: *const u8) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract; `dst` is valid for writes of its length.
        unsafe { result::memcpy_dtoh_async(dst, src as sys::CUdeviceptr, self.raw_stream()) }.map_err(|e| driver_error(e, "copying from the GPU"))?;
        self.synchronize()
    }

    /// Copy `bytes` bytes between two addresses of this device, enqueued on the stream.
    ///
    /// # Safety
    /// Both addresses must be this device's memory, valid for `bytes` bytes, and not overlap.
    pub unsafe fn copy_on_device(&self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        unsafe { result::memcpy_dtod_async(dst as sys::CUdeviceptr, src as sys::CUdeviceptr, bytes, self.raw_stream()) }
            .map_err(|e| driver_error(e, "copying on the GPU"))
    }
}

/// One slot per device the driver reports, filled when the device is first used.
fn table() -> &'static [OnceLock<Gpu>] {
    static GPUS: OnceLock<Vec<OnceLock<Gpu>>> = OnceLock::new();
    GPUS.get_or_init(|| (0..super::device_count()).map(|_| OnceLock::new()).collect())
}

/// The GPU `ctx` names, opened on first use.
pub fn gpu(ctx: Context) -> Result<&'static Gpu> {
    let gpus = table();
    let Some(slot) = usize::try_from(ctx.device_id).ok().and_then(|i| gpus.get(i)) else {
        if gpus.is_empty() {
            return Err(crate::backend::gpu_unavailable(ctx));
        }
        crate::bail!(Device, "{ctx} does not exist: this machine has {} GPU(s), gpu(0) to gpu({})", gpus.len(), gpus.len() - 1);
    };
    if let Some(gpu) = slot.get() {
        return Ok(gpu);
    }
    // Opening can fail (and is then retried by the next call); two threads opening at once
    // both succeed and one device object is kept.
    let opened = Gpu::open(ctx.device_id as usize)?;
    Ok(slot.get_or_init(|| opened))
}

/// Wait for the work of every GPU in use (`mx.nd.waitall()`); devices never used have none.
pub fn synchronize_all() -> Result<()> {
    table().iter().filter_map(OnceLock::get).try_for_each(Gpu::synchronize)
}
