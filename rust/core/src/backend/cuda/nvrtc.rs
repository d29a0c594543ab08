//! Run-time compilation of kernel sources with NVRTC, each kernel compiled once per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::error::Result;

/// Whether libnvrtc can be loaded, probed once; the error names the library, where it was looked
/// for and how to provide it.
pub fn available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only attempts to dlopen the library under its candidate names.
    if *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }) {
        return Ok(());
    }
    let mut searched = cudarc::get_lib_name_candidates("nvrtc");
    let mut seen = std::collections::HashSet::new();
    searched.retain(|name| seen.insert(name.clone()));
    crate::bail!(
        Device,
        "the CUDA runtime compiler library libnvrtc could not be loaded (tried {}): install it with \
         `pip install nvidia-cuda-nvrtc` (oxnet preloads pip's nvidia libraries on import) or add its folder to LD_LIBRARY_PATH",
        searched.join(", ")
    )
}

/// The PTX of `source`, which defines the kernel `name`; compiled on first request and cached
/// under that name, so a name must always denote the same source (kernel names encode the
/// operator, its dtype and, for fused chains, the expression's hash).
pub fn compile(name: &str, source: &str) -> Result<Arc<Ptx>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Ptx>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // The lock only guards map lookups and inserts (a poisoned map is still consistent: every
    // insert is a single call); compiling happens outside it, so two threads asking for the same
    // new kernel both compile it and one result is kept.
    if let Some(ptx) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
        return Ok(ptx.clone());
    }
    let ptx = Arc::new(compile_uncached(name, source)?);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    Ok(map.entry(name.to_string()).or_insert(ptx).clone())
}

/// Compile without the cache (the test suite compiles whole families of kernels in one program).
pub fn compile_uncached(name: &str, source: &str) -> Result<Ptx> {
    available()?;
    let options = CompileOptions { name: Some(format!("{name}.cu")), ..Default::default() };
    // cudarc panics when a symbol is missing from an older libnvrtc; that must not cross into
    // Python, so it becomes an error like any other.
    let outcome = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(source, options));
    match outcome {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(CompileError::CompileError { log, .. })) => {
            crate::bail!(Device, "NVRTC could not compile kernel {name}:\n{}", log.to_string_lossy())
        }
        Ok(Err(other)) => crate::bail!(Device, "NVRTC failed on kernel {name}: {other:?}"),
        Err(_) => crate::bail!(Device, "NVRTC failed on kernel {name}: libnvrtc lacks a function cudarc needs (too old a CUDA?)"),
    }
}
