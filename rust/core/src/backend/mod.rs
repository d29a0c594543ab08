//! Device backends. The CPU kernels live with their operators; this module answers what GPUs
//! exist and produces the error for work sent to a device that is absent.

use crate::base::Context;
use crate::error::Error;

#[cfg(feature = "cuda")]
pub mod cuda;

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
