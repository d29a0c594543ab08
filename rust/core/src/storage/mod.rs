//! Device memory with a per-device pool.
//!
//! Freed buffers go back to a free list keyed by size class instead of to the OS, so the steady
//! state of a training loop (the same shapes every iteration) allocates nothing and, above all,
//! never pays first-touch page faults again (2 GB/s fresh vs ~25 GB/s reused on the project machine).
//! CPU buffers are 64-byte aligned so that SIMD loads never split a cache line.

use std::alloc::{self as system, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::base::{Context, DeviceType};
use crate::error::Result;

pub const ALIGNMENT: usize = 64;
/// Buffers at least this large ask the kernel for transparent huge pages, which makes first touch
/// several times faster and relieves the TLB on big tensors.
const HUGE_PAGE_THRESHOLD: usize = 2 << 20;

/// Round a request up to its size class: multiples of 64 bytes up to 4 KiB, above that four
/// classes per power of two, so a reused buffer wastes at most a quarter of its size.
pub fn size_class(bytes: usize) -> usize {
    let bytes = bytes.max(ALIGNMENT);
    if bytes <= 4096 {
        return bytes.div_ceil(ALIGNMENT) * ALIGNMENT;
    }
    let pow = usize::BITS - 1 - bytes.leading_zeros();
    let step = 1usize << (pow - 2);
    bytes.div_ceil(step) * step
}

/// Counters of one pool; all are monotonic except the two byte gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes currently handed out to live buffers (by size class).
    pub used_bytes: u64,
    /// Bytes sitting in free lists, ready for reuse.
    pub pooled_bytes: u64,
    /// Allocations served from a free list.
    pub hits: u64,
    /// Allocations that had to ask the system.
    pub misses: u64,
    /// Highest `used_bytes` seen.
    pub peak_used_bytes: u64,
}

/// A pool of 64-byte aligned host buffers.
pub struct CpuPool {
    free: Mutex<HashMap<usize, Vec<NonNull<u8>>>>,
    used: AtomicU64,
    pooled: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    peak: AtomicU64,
}

// SAFETY: the pool only stores pointers to allocations it exclusively owns (no live buffer refers
// to a pointer on a free list), and every access to the free lists goes through the mutex.
unsafe impl Send for CpuPool {}
unsafe impl Sync for CpuPool {}

impl CpuPool {
    fn new() -> Self {
        CpuPool {
            free: Mutex::new(HashMap::new()),
            used: AtomicU64::new(0),
            pooled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    pub fn alloc(&'static self, bytes: usize) -> Result<Buffer> {
        let class = size_class(bytes);
        // The lock guards only the free-list lookup; it is never held while calling into the OS.
        let reused = self.free.lock().unwrap().get_mut(&class).and_then(Vec::pop);
        let ptr = match reused {
            Some(p) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
                p
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                Self::system_alloc(class)?
            }
        };
        // Statistics counters are independent gauges; Relaxed is enough since nothing is
        // synchronized through them.
        let used = self.used.fetch_add(class as u64, Ordering::Relaxed) + class as u64;
        self.peak.fetch_max(used, Ordering::Relaxed);
        Ok(Buffer { ptr, bytes, owner: Owner::Pool { class, pool: self } })
    }

    fn system_alloc(class: usize) -> Result<NonNull<u8>> {
        // The OS overcommits: a request beyond the machine's memory would "succeed" and the
        // process be killed on first touch, so it is refused here with a clear error instead.
        let physical = physical_memory_bytes();
        if class as u64 > physical {
            crate::bail!(Runtime, "out of host memory: {class} bytes requested, the machine has {physical}");
        }
        let layout = Layout::from_size_align(class, ALIGNMENT)
            .map_err(|_| crate::err!(Value, "cannot allocate {class} bytes"))?;
        // SAFETY: layout has a non-zero size (size_class returns at least ALIGNMENT).
        let raw = unsafe { system::alloc(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| crate::err!(Runtime, "out of host memory allocating {class} bytes"))?;
        if class >= HUGE_PAGE_THRESHOLD {
            advise_huge_pages(ptr, class);
        }
        Ok(ptr)
    }

    fn release(&self, ptr: NonNull<u8>, class: usize) {
        self.used.fetch_sub(class as u64, Ordering::Relaxed);
        self.pooled.fetch_add(class as u64, Ordering::Relaxed);
        self.free.lock().unwrap().entry(class).or_default().push(ptr);
    }

    /// Give every pooled buffer back to the system (MXNet's `ReleaseAll`).
    pub fn release_all(&self) {
        let drained: Vec<(usize, Vec<NonNull<u8>>)> = self.free.lock().unwrap().drain().collect();
        for (class, ptrs) in drained {
            for p in ptrs {
                self.pooled.fetch_sub(class as u64, Ordering::Relaxed);
                // SAFETY: p was allocated by system_alloc with exactly this layout and is no
                // longer referenced by any Buffer (it was on the free list).
                unsafe { system::dealloc(p.as_ptr(), Layout::from_size_align_unchecked(class, ALIGNMENT)) };
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            used_bytes: self.used.load(Ordering::Relaxed),
            pooled_bytes: self.pooled.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            peak_used_bytes: self.peak.load(Ordering::Relaxed),
        }
    }
}

/// Total physical memory, or u64::MAX where it cannot be read.
fn physical_memory_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            extern "C" {
                fn sysconf(name: i32) -> i64;
            }
            // glibc's and musl's _SC_PAGESIZE and _SC_PHYS_PAGES.
            const SC_PAGESIZE: i32 = 30;
            const SC_PHYS_PAGES: i32 = 85;
            // SAFETY: sysconf only reads system configuration.
            let (page, pages) = unsafe { (sysconf(SC_PAGESIZE), sysconf(SC_PHYS_PAGES)) };
            if page > 0 && pages > 0 {
                return (page as u64).saturating_mul(pages as u64);
            }
        }
        u64::MAX
    })
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: NonNull<u8>, bytes: usize) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    // Only whole pages inside the allocation are advised; a failure (THP disabled) is harmless.
    let page = 4096usize;
    let start = (ptr.as_ptr() as usize).div_ceil(page) * page;
    let end = (ptr.as_ptr() as usize + bytes) / page * page;
    if end > start {
        // SAFETY: [start, end) lies inside an allocation we own; madvise does not move memory.
        unsafe { madvise(start as *mut _, end - start, MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: NonNull<u8>, _bytes: usize) {}

/// An owned block of device memory; dropping it returns it to its pool.
pub struct Buffer {
    ptr: NonNull<u8>,
    bytes: usize,
    owner: Owner,
}

/// Who frees a buffer's memory.
enum Owner {
    /// The pool, which takes the block back into its size class.
    Pool { class: usize, pool: &'static CpuPool },
    /// Memory that belongs to someone else (a NumPy array shared without a copy): dropping the
    /// owner releases it.
    External { _keeps_alive: Box<dyn Send + Sync> },
}

// SAFETY: a Buffer is the unique owner of its allocation; concurrent access to the bytes is
// coordinated by the dependency engine (see ndarray::Chunk), not by the buffer.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Memory owned by `owner` used in place, without a copy (`mx.nd.from_numpy(zero_copy=True)`).
    ///
    /// # Safety
    /// `ptr` must address `bytes` bytes that stay valid, and are neither freed nor moved, for as
    /// long as `owner` lives; the caller must ensure nothing writes them except through arrays
    /// that use this buffer (whose accesses the engine orders).
    pub unsafe fn external(ptr: NonNull<u8>, bytes: usize, owner: Box<dyn Send + Sync>) -> Buffer {
        Buffer { ptr, bytes, owner: Owner::External { _keeps_alive: owner } }
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Owner::Pool { class, pool } = self.owner {
            pool.release(self.ptr, class);
        }
        // An external owner is dropped with the buffer, which releases the memory it keeps alive.
    }
}

/// The pool of host memory (plain and pinned host memory share it on machines without CUDA).
pub fn cpu_pool() -> &'static CpuPool {
    static POOL: OnceLock<CpuPool> = OnceLock::new();
    POOL.get_or_init(CpuPool::new)
}

/// Allocate `bytes` on `ctx`.
pub fn alloc(ctx: Context, bytes: usize) -> Result<Buffer> {
    match ctx.device_type {
        DeviceType::Cpu | DeviceType::CpuPinned | DeviceType::CpuShared => cpu_pool().alloc(bytes),
        DeviceType::Gpu => Err(crate::backend::gpu_unavailable(ctx)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_bound_waste() {
        assert_eq!(size_class(0), 64);
        assert_eq!(size_class(65), 128);
        assert_eq!(size_class(4096), 4096);
        for bytes in [4097usize, 10_000, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(bytes);
            assert!(c >= bytes && (c - bytes) * 4 <= c, "{bytes} -> {c}");
        }
    }

    #[test]
    fn pool_reuses_and_aligns() {
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new()));
        let a = pool.alloc(1000).unwrap();
        assert_eq!(a.as_ptr() as usize % ALIGNMENT, 0);
        let first = a.as_ptr();
        drop(a);
        let b = pool.alloc(1000).unwrap();
        assert_eq!(b.as_ptr(), first, "a freed buffer of the same class is reused");
        let s = pool.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
        assert_eq!(s.used_bytes, size_class(1000) as u64);
        let c = pool.alloc(5000).unwrap();
        assert_ne!(c.as_ptr(), b.as_ptr());
        drop(b);
        drop(c);
        let s = pool.stats();
        assert_eq!(s.used_bytes, 0);
        assert_eq!(s.pooled_bytes, (size_class(1000) + size_class(5000)) as u64);
        assert_eq!(s.peak_used_bytes, (size_class(1000) + size_class(5000)) as u64);
        pool.release_all();
        assert_eq!(pool.stats().pooled_bytes, 0);
    }

    #[test]
    fn pool_is_thread_safe() {
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new()));
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || {
                    for i in 0..500 {
                        let b = pool.alloc(64 * (1 + (i + t) % 7)).unwrap();
                        // SAFETY: the buffer is ours and at least 64 bytes long.
                        unsafe { b.as_ptr().write_bytes(t as u8, 64) };
                    }
                });
            }
        });
        assert_eq!(pool.stats().used_bytes, 0);
    }
}
