//! The caching allocator of one GPU.
//!
//! `cuMemAlloc` and `cuMemFree` synchronize the device and cost tens of microseconds, so freed
//! blocks go to free lists keyed by size class (the host pool's classes: at most a quarter
//! wasted) and are handed out again. Reuse is stream-ordered: every kernel and copy of a device
//! runs on that device's one stream, so a block freed once the last operation using it was
//! *enqueued* can be given to an operation enqueued later, which the stream runs after it.
//! When the device runs out of memory the free lists are given back and the allocation retried
//! once; if it still fails the error names the request and what the pool holds.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cudarc::driver::{result, sys};

use super::device::{driver_error, Gpu};
use crate::error::Result;
use crate::storage::{size_class, Buffer, PoolStats};

/// Free device blocks of one GPU by size class.
pub struct GpuPool {
    /// Invariant: every address listed was returned by `cuMemAlloc` on this pool's device with
    /// the list's class, is referenced by no `Buffer`, and `pooled` is the sum of the classes
    /// listed (both change together under this lock).
    free: Mutex<HashMap<usize, Vec<sys::CUdeviceptr>>>,
    // Statistics gauges and counters: nothing is published through them, so Relaxed.
    used: AtomicU64,
    requested: AtomicU64,
    pooled: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    peak: AtomicU64,
}

impl GpuPool {
    pub(super) fn new() -> Self {
        GpuPool {
            free: Mutex::new(HashMap::new()),
            used: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            pooled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The free lists. Every critical section pushes or pops whole entries together with the
    /// `pooled` gauge, so a lock poisoned by a panic elsewhere still guards consistent lists.
    fn lists(&self) -> MutexGuard<'_, HashMap<usize, Vec<sys::CUdeviceptr>>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block of at least `bytes` on `gpu`, from the free lists when one of its class is there.
    pub fn alloc(&'static self, gpu: &'static Gpu, bytes: usize) -> Result<Buffer> {
        let class = size_class(bytes);
        let reused = self.lists().get_mut(&class).and_then(Vec::pop);
        let address = match reused {
            Some(address) => {
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                address
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                self.alloc_from_device(gpu, bytes, class)?
            }
        };
        let used = self.used.fetch_add(class as u64, Ordering::Relaxed) + class as u64;
        self.requested.fetch_add(bytes as u64, Ordering::Relaxed);
        self.peak.fetch_max(used, Ordering::Relaxed);
        let ptr = NonNull::new(address as *mut u8).ok_or_else(|| crate::err!(Device, "cuMemAlloc returned a null address"))?;
        // SAFETY: the block is `class >= bytes` bytes of device memory that only this buffer
        // refers to; dropping the buffer hands it back through `release` with the same class.
        Ok(unsafe { Buffer::device(ptr, bytes, class, self) })
    }

    fn alloc_from_device(&self, gpu: &Gpu, bytes: usize, class: usize) -> Result<sys::CUdeviceptr> {
        gpu.bind()?;
        // SAFETY: the device's context is current on this thread (bind above).
        match unsafe { result::malloc_sync(class) } {
            Ok(address) => return Ok(address),
            Err(e) if e.0 != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => return Err(driver_error(e, "allocating device memory")),
            Err(_) => {}
        }
        // Out of memory: wait for queued work (which may still use freed blocks), give the cached
        // blocks back and try once more.
        gpu.synchronize()?;
        let cached = self.stats().pooled_bytes;
        self.release_all(gpu)?;
        // SAFETY: as above.
        unsafe { result::malloc_sync(class) }.map_err(|_| {
            let (free, total) = gpu.memory_info().unwrap_or((0, 0));
            let stats = self.stats();
            crate::err!(
                Runtime,
                "out of memory on {}: {bytes} bytes requested (size class {class}); oxnet holds {} bytes in live arrays \
                 and had {cached} cached bytes, which were given back before retrying; the device reports {free} of \
                 {total} bytes free",
                gpu.context(),
                stats.used_bytes
            )
        })
    }

    /// Take a block of size class `class`, handed out for `bytes` bytes, back onto its class's
    /// free list.
    pub(crate) fn release(&self, address: NonNull<u8>, class: usize, bytes: usize) {
        self.used.fetch_sub(class as u64, Ordering::Relaxed);
        self.requested.fetch_sub(bytes as u64, Ordering::Relaxed);
        let mut lists = self.lists();
        lists.entry(class).or_default().push(address.as_ptr() as sys::CUdeviceptr);
        self.pooled.fetch_add(class as u64, Ordering::Relaxed);
    }

    /// Give every cached block back to the device (`mx.gpu(i).empty_cache()`).
    pub fn release_all(&self, gpu: &Gpu) -> Result<()> {
        let drained: Vec<(usize, sys::CUdeviceptr)> = {
            let mut lists = self.lists();
            let blocks: Vec<_> = lists.drain().flat_map(|(class, list)| list.into_iter().map(move |a| (class, a))).collect();
            for &(class, _) in &blocks {
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
            }
            blocks
        };
        gpu.bind()?;
        for (_, address) in drained {
            // SAFETY: the block came from cuMemAlloc on this device and was just taken off the
            // free list, so no buffer refers to it; cuMemFree waits for work still using it.
            unsafe { result::free_sync(address) }.map_err(|e| driver_error(e, "freeing device memory"))?;
        }
        Ok(())
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            used_bytes: self.used.load(Ordering::Relaxed),
            requested_bytes: self.requested.load(Ordering::Relaxed),
            pooled_bytes: self.pooled.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            peak_used_bytes: self.peak.load(Ordering::Relaxed),
        }
    }
}
