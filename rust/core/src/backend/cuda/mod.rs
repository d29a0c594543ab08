//! CUDA discovery through cudarc's dynamically loaded driver API: nothing is linked at build time,
//! so a machine without CUDA builds and runs every CPU path.

use std::sync::OnceLock;

pub mod blas;
mod device;
pub mod kernel_source;
pub mod kernels;
pub mod nvrtc;
mod pool;
#[cfg(test)]
mod tests;

pub use device::{gpu, synchronize_all, Gpu};
pub use pool::GpuPool;

/// Devices the driver reports, probed once. cudarc panics when a library is missing, so the
/// library's presence is checked before any call into it.
pub fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        // SAFETY: is_culib_present only attempts to dlopen the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return 0;
        }
        // A driver that loads but fails to initialise (no device, no permission) means no GPU.
        std::panic::catch_unwind(|| cudarc::driver::CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)).unwrap_or(0)
    })
}
