//! Device memory with a per-device pool.
//!
//! Freed buffers go back to a free list keyed by size class instead of to the OS, so the steady
//! state of a training loop (the same shapes every iteration) allocates nothing and, above all,
//! never pays first-touch page faults again (2 GB/s fresh vs ~25 GB/s reused on the project machine).
//! Blocks up to [`UNPOOLED_MAX_BYTES`] are the exception: the global allocator's per-thread caches
//! reuse those at a lower cost than the free lists.
//! CPU buffers are 64-byte aligned so that SIMD loads never split a cache line.
//!
//! The pool gives memory back, so that a server or a notebook shrinks after a large computation:
//! - a block nobody reused for `OXNET_CPU_MEM_POOL_IDLE_MS` (default 2000 ms; 0 keeps blocks
//!   forever) is returned by a background thread of the host pool, which sleeps while the pool is
//!   empty;
//! - past `OXNET_CPU_MEM_POOL_LIMIT_MB` of free blocks (default: no limit) the oldest go back at
//!   once; 0 (or MXNet's `MXNET_CPU_MEM_POOL_TYPE=Unpooled`) pools nothing;
//! - `MXNET_CPU_MEM_POOL_RESERVE` keeps MXNet's meaning: the percentage of the machine's memory
//!   (default 5) kept for everything else; when a new block could only be had by eating into it,
//!   every free block is returned first;
//! - `CpuPool::release_all` (`mx.cpu().empty_cache()`) returns every free block now.
//!
//! Blocks of at least [`MAPPED_BLOCK_BYTES`] are mapped from the kernel directly rather than taken
//! from the global allocator (mimalloc in the Python module), so returning one unmaps it and the
//! process's resident memory drops at once: an allocator would keep freed memory in its own
//! caches, or purge it only when the thread that allocated it next calls into it.

use std::alloc::{self as system, Layout};
use std::collections::{HashMap, VecDeque};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::base::{Context, DeviceType};
use crate::error::Result;

pub const ALIGNMENT: usize = 64;
/// Buffers at least this large ask the kernel for transparent huge pages, which makes first touch
/// several times faster and relieves the TLB on big tensors.
const HUGE_PAGE_THRESHOLD: usize = 2 << 20;
/// Size classes from here on are whole pages mapped from the kernel (see the module notes); below,
/// the global allocator packs small blocks far better than whole pages would.
pub const MAPPED_BLOCK_BYTES: usize = 256 << 10;
/// Blocks of at most this size class bypass the free lists: the global allocator's own
/// per-thread caches reuse them as well, and its round trip costs a fraction of the free lists'
/// lock and timestamp (a 2x2 add spent 5% of its time in them). They never page-fault after the
/// first use either way.
pub const UNPOOLED_MAX_BYTES: usize = 1024;
/// The host pool's name in the profiler (MXNet's counter name for host memory).
const HOST_MEMORY: &str = "Memory: cpu/0";

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
    /// Bytes the live buffers asked for: `used_bytes` less the size classes' rounding, which
    /// costs no physical memory for mapped blocks (their tail pages are never touched).
    pub requested_bytes: u64,
    /// Bytes sitting in free lists, ready for reuse.
    pub pooled_bytes: u64,
    /// Allocations served from a free list.
    pub hits: u64,
    /// Allocations that had to ask the system.
    pub misses: u64,
    /// Highest `used_bytes` seen.
    pub peak_used_bytes: u64,
}

/// When a pool gives its free blocks back to the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolPolicy {
    /// A free block unused this long is returned (None: kept until `release_all`).
    pub idle: Option<Duration>,
    /// The most bytes kept in free lists; past it the oldest blocks are returned.
    pub max_pooled_bytes: u64,
    /// Percentage of physical memory a new system allocation must leave available, or the pool
    /// first returns every free block (MXNet's `MXNET_CPU_MEM_POOL_RESERVE`).
    pub reserve_percent: u64,
}

impl Default for PoolPolicy {
    fn default() -> Self {
        PoolPolicy { idle: Some(Duration::from_millis(2000)), max_pooled_bytes: u64::MAX, reserve_percent: 5 }
    }
}

impl PoolPolicy {
    /// The defaults, overridden by the environment (see the module notes). A value that does not
    /// parse keeps the default: memory tuning must never stop a program from starting.
    pub fn from_env() -> Self {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
        let mut policy = PoolPolicy::default();
        if let Some(ms) = number("OXNET_CPU_MEM_POOL_IDLE_MS") {
            policy.idle = (ms > 0).then(|| Duration::from_millis(ms));
        }
        if let Some(mb) = number("OXNET_CPU_MEM_POOL_LIMIT_MB") {
            policy.max_pooled_bytes = mb.saturating_mul(1 << 20);
        }
        if std::env::var("MXNET_CPU_MEM_POOL_TYPE").is_ok_and(|t| t.trim().eq_ignore_ascii_case("unpooled")) {
            policy.max_pooled_bytes = 0;
        }
        if let Some(percent) = number("MXNET_CPU_MEM_POOL_RESERVE") {
            policy.reserve_percent = percent.min(100);
        }
        policy
    }
}

/// A block on a free list and when it was freed.
struct FreeBlock {
    ptr: NonNull<u8>,
    freed_at: Instant,
}

/// Free blocks by size class; within a class the oldest is at the front and the most recently
/// freed (the one most likely still in cache) at the back.
type FreeLists = HashMap<usize, VecDeque<FreeBlock>>;

/// A pool of 64-byte aligned host buffers.
pub struct CpuPool {
    /// Invariant: every block on a list was allocated by `system_memory::alloc` with the list's
    /// class, is referenced by no `Buffer`, and `pooled` equals the sum of the listed classes
    /// (both change together under this lock).
    free: Mutex<FreeLists>,
    policy: PoolPolicy,
    /// Whether a background thread returns idle blocks (the process-wide host pool does; pools
    /// made in tests call `trim_idle` themselves).
    background_trim: bool,
    used: AtomicU64,
    requested: AtomicU64,
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
    pub fn new(policy: PoolPolicy) -> Self {
        CpuPool {
            free: Mutex::new(HashMap::new()),
            policy,
            background_trim: false,
            used: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            pooled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// The free lists. A panic cannot leave them inconsistent (every critical section only
    /// pushes or pops whole entries and adjusts `pooled` with them), so a poisoned lock is used
    /// as it is rather than turned into a panic of every later allocation.
    fn lists(&self) -> MutexGuard<'_, FreeLists> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn alloc(&'static self, bytes: usize) -> Result<Buffer> {
        let class = size_class(bytes);
        // The lock guards only the free-list lookup; it is never held while calling into the OS.
        let reused = if class <= UNPOOLED_MAX_BYTES {
            None
        } else {
            let mut lists = self.lists();
            let block = lists.get_mut(&class).and_then(VecDeque::pop_back);
            if block.is_some() {
                self.pooled.fetch_sub(class as u64, Ordering::SeqCst);
            }
            block
        };
        let ptr = match reused {
            Some(block) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                block.ptr
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                if class >= MAPPED_BLOCK_BYTES && self.pooled.load(Ordering::Relaxed) > 0 && self.would_breach_reserve(class) {
                    self.release_all();
                }
                system_memory::alloc(class)?
            }
        };
        // Statistics counters are independent gauges; Relaxed is enough since nothing is
        // synchronized through them.
        let used = self.used.fetch_add(class as u64, Ordering::Relaxed) + class as u64;
        self.requested.fetch_add(bytes as u64, Ordering::Relaxed);
        self.peak.fetch_max(used, Ordering::Relaxed);
        crate::profiler::memory_in_use(HOST_MEMORY, used);
        Ok(Buffer { ptr, bytes, owner: Owner::Pool { class, pool: self } })
    }

    /// Whether taking `class` more bytes from the system would leave less available memory than
    /// the reserve. The available figure is read at most every 50 ms (reading it costs about as
    /// much as a small allocation); in between, what this pool took since is subtracted.
    fn would_breach_reserve(&self, class: usize) -> bool {
        if self.policy.reserve_percent == 0 {
            return false;
        }
        let Some(available) = available_memory::estimate(class as u64) else {
            return false;
        };
        let reserve = physical_memory_bytes().saturating_mul(self.policy.reserve_percent) / 100;
        available.saturating_sub(class as u64) < reserve
    }

    /// Take back `ptr`, a block of size class `class` handed out for `bytes` bytes.
    fn release(&'static self, ptr: NonNull<u8>, class: usize, bytes: usize) {
        let used = self.used.fetch_sub(class as u64, Ordering::Relaxed) - class as u64;
        self.requested.fetch_sub(bytes as u64, Ordering::Relaxed);
        crate::profiler::memory_in_use(HOST_MEMORY, used);
        if class <= UNPOOLED_MAX_BYTES {
            // SAFETY: the buffer being dropped was the block's only owner.
            unsafe { system_memory::free(ptr, class) };
            return;
        }
        let freed_at = Instant::now();
        let mut over_limit = Vec::new();
        {
            let mut lists = self.lists();
            lists.entry(class).or_default().push_back(FreeBlock { ptr, freed_at });
            // SeqCst pairs with the trimmer's park check (see `trimmer`).
            let pooled = self.pooled.fetch_add(class as u64, Ordering::SeqCst) + class as u64;
            if pooled > self.policy.max_pooled_bytes {
                over_limit = self.take_oldest(&mut lists, pooled - self.policy.max_pooled_bytes);
            }
        }
        // SAFETY: the blocks were just taken off the free lists, so nothing else refers to them.
        unsafe { Self::give_back(over_limit) };
        if self.background_trim && self.policy.idle.is_some() {
            trimmer::wake(self);
        }
    }

    /// Remove the oldest free blocks, across classes, until at least `excess` bytes are taken.
    fn take_oldest(&self, lists: &mut FreeLists, excess: u64) -> Vec<(NonNull<u8>, usize)> {
        let mut taken = Vec::new();
        let mut freed = 0u64;
        while freed < excess {
            let oldest = lists.iter().filter_map(|(&class, list)| list.front().map(|b| (b.freed_at, class))).min();
            let Some((_, class)) = oldest else { break };
            if let Some(block) = lists.get_mut(&class).and_then(VecDeque::pop_front) {
                self.pooled.fetch_sub(class as u64, Ordering::SeqCst);
                freed += class as u64;
                taken.push((block.ptr, class));
            }
        }
        lists.retain(|_, list| !list.is_empty());
        taken
    }

    /// Return blocks to the system.
    ///
    /// # Safety
    /// Every block must have come from `system_memory::alloc` with its class and be referenced by
    /// nothing (taken off a free list).
    unsafe fn give_back(blocks: Vec<(NonNull<u8>, usize)>) {
        for (ptr, class) in blocks {
            // SAFETY: guaranteed by this function's contract.
            unsafe { system_memory::free(ptr, class) };
        }
    }

    /// Return every free block that was freed before `now - idle`; the bytes returned.
    pub fn trim_idle(&self, now: Instant) -> u64 {
        let Some(cutoff) = self.policy.idle.and_then(|idle| now.checked_sub(idle)) else {
            return 0;
        };
        let mut idle_blocks = Vec::new();
        {
            let mut lists = self.lists();
            for (&class, list) in lists.iter_mut() {
                while list.front().is_some_and(|b| b.freed_at <= cutoff) {
                    if let Some(block) = list.pop_front() {
                        self.pooled.fetch_sub(class as u64, Ordering::SeqCst);
                        idle_blocks.push((block.ptr, class));
                    }
                }
            }
            lists.retain(|_, list| !list.is_empty());
        }
        let bytes = idle_blocks.iter().map(|&(_, class)| class as u64).sum();
        // SAFETY: the blocks were just taken off the free lists, so nothing else refers to them.
        unsafe { Self::give_back(idle_blocks) };
        bytes
    }

    /// Give every pooled buffer back to the system (MXNet's `ReleaseAll`, `ctx.empty_cache()`).
    pub fn release_all(&self) {
        let drained: Vec<(NonNull<u8>, usize)> = {
            let mut lists = self.lists();
            let blocks: Vec<_> = lists.drain().flat_map(|(class, list)| list.into_iter().map(move |b| (b.ptr, class))).collect();
            for &(_, class) in &blocks {
                self.pooled.fetch_sub(class as u64, Ordering::SeqCst);
            }
            blocks
        };
        // SAFETY: the blocks were just taken off the free lists, so nothing else refers to them.
        unsafe { Self::give_back(drained) };
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

/// The background thread that returns idle blocks of the process-wide host pool.
///
/// It sleeps a quarter of the idle time between passes while the pool holds free blocks and parks
/// while it holds none, so an idle process with an empty pool never wakes up. A release that
/// finds it parked unparks it; the protocol (`oxnet_sync::Parking`, model-checked with loom)
/// loses no wake-up, given that releases add to `pooled` with SeqCst before waking it.
mod trimmer {
    use super::*;
    use oxnet_sync::Parking;
    use std::sync::atomic::AtomicPtr;

    static PARKING: Parking = Parking::new();
    /// The trimmer's thread handle, set by the trimmer itself before it can ever park (so a
    /// parked trimmer implies it is set). Leaked on purpose: the thread runs for the life of the
    /// process. An atomic, not a lock: a forked child must never find it locked by a thread that
    /// did not survive the fork.
    static THREAD: AtomicPtr<std::thread::Thread> = AtomicPtr::new(std::ptr::null_mut());

    pub(super) fn wake(pool: &'static CpuPool) {
        PARKING.wake(
            || {
                let thread = THREAD.load(Ordering::SeqCst);
                // SAFETY: a non-null pointer came from Box::into_raw in `run` and is never freed.
                if let Some(thread) = unsafe { thread.as_ref() } {
                    thread.unpark();
                }
            },
            || {
                forget_after_fork();
                std::thread::Builder::new().name("oxnet-pool-trim".into()).spawn(move || run(pool)).is_ok()
            },
        );
    }

    fn run(pool: &'static CpuPool) {
        THREAD.store(Box::into_raw(Box::new(std::thread::current())), Ordering::SeqCst);
        let Some(idle) = pool.policy.idle else { return };
        let period = (idle / 4).max(Duration::from_millis(10));
        loop {
            if pool.pooled.load(Ordering::SeqCst) == 0 {
                PARKING.park_unless(|| pool.pooled.load(Ordering::SeqCst) != 0, std::thread::park);
                continue;
            }
            std::thread::sleep(period);
            pool.trim_idle(Instant::now());
        }
    }

    /// A child made by `fork` has no trimmer thread (threads do not survive fork): mark it not
    /// running there, so that the child's first release starts its own.
    fn forget_after_fork() {
        #[cfg(unix)]
        {
            extern "C" {
                fn pthread_atfork(prepare: Option<extern "C" fn()>, parent: Option<extern "C" fn()>, child: Option<extern "C" fn()>) -> i32;
            }
            extern "C" fn in_child() {
                PARKING.forget_thread();
                THREAD.store(std::ptr::null_mut(), Ordering::SeqCst);
            }
            static REGISTERED: std::sync::Once = std::sync::Once::new();
            // SAFETY: the handler only stores to atomics, which is async-signal-safe as fork requires.
            REGISTERED.call_once(|| unsafe {
                pthread_atfork(None, None, Some(in_child));
            });
        }
    }
}

/// Memory the kernel reports available (MemAvailable), estimated between readings.
mod available_memory {
    use super::*;

    const REREAD_AFTER: Duration = Duration::from_millis(50);
    /// Nanoseconds since `epoch()` of the last reading (0: never read).
    static READ_AT_NS: AtomicU64 = AtomicU64::new(0);
    static AVAILABLE_AT_READ: AtomicU64 = AtomicU64::new(0);
    static TAKEN_SINCE_READ: AtomicU64 = AtomicU64::new(0);

    fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// The bytes available before taking `about_to_take` more, or None where the kernel does not
    /// say. The atomics are a cache: concurrent callers may each re-read, which is harmless.
    pub(super) fn estimate(about_to_take: u64) -> Option<u64> {
        let now_ns = (epoch().elapsed().as_nanos() as u64).max(1);
        let read_at = READ_AT_NS.load(Ordering::Relaxed);
        let available = if read_at == 0 || now_ns.saturating_sub(read_at) > REREAD_AFTER.as_nanos() as u64 {
            let available = read_mem_available()?;
            AVAILABLE_AT_READ.store(available, Ordering::Relaxed);
            TAKEN_SINCE_READ.store(0, Ordering::Relaxed);
            READ_AT_NS.store(now_ns, Ordering::Relaxed);
            available
        } else {
            AVAILABLE_AT_READ.load(Ordering::Relaxed).saturating_sub(TAKEN_SINCE_READ.load(Ordering::Relaxed))
        };
        TAKEN_SINCE_READ.fetch_add(about_to_take, Ordering::Relaxed);
        Some(available)
    }

    fn read_mem_available() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    }
}

/// Where pool blocks come from: whole pages mapped from the kernel for large classes (Linux), the
/// global allocator otherwise.
mod system_memory {
    use super::*;

    pub(super) fn alloc(class: usize) -> Result<NonNull<u8>> {
        // The OS overcommits: a request beyond the machine's memory would "succeed" and the
        // process be killed on first touch, so it is refused here with a clear error instead.
        let physical = physical_memory_bytes();
        if class as u64 > physical {
            crate::bail!(Runtime, "out of host memory: {class} bytes requested, the machine has {physical}");
        }
        let ptr = if uses_mapping(class) {
            map(class)?
        } else {
            let layout = Layout::from_size_align(class, ALIGNMENT).map_err(|_| crate::err!(Value, "cannot allocate {class} bytes"))?;
            // SAFETY: layout has a non-zero size (size_class returns at least ALIGNMENT).
            let raw = unsafe { system::alloc(layout) };
            NonNull::new(raw).ok_or_else(|| crate::err!(Runtime, "out of host memory allocating {class} bytes"))?
        };
        if class >= HUGE_PAGE_THRESHOLD {
            advise_huge_pages(ptr, class);
        }
        Ok(ptr)
    }

    /// # Safety
    /// `ptr` must come from `alloc(class)` with the same `class` and be referenced by nothing.
    pub(super) unsafe fn free(ptr: NonNull<u8>, class: usize) {
        if uses_mapping(class) {
            // SAFETY: guaranteed by this function's contract.
            unsafe { unmap(ptr, class) };
        } else {
            // SAFETY: the block was allocated by system::alloc with exactly this layout (contract).
            unsafe { system::dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(class, ALIGNMENT)) };
        }
    }

    fn uses_mapping(class: usize) -> bool {
        cfg!(target_os = "linux") && class >= MAPPED_BLOCK_BYTES
    }

    #[cfg(target_os = "linux")]
    mod linux {
        extern "C" {
            pub fn mmap(addr: *mut std::ffi::c_void, len: usize, prot: i32, flags: i32, fd: i32, offset: i64) -> *mut std::ffi::c_void;
            pub fn munmap(addr: *mut std::ffi::c_void, len: usize) -> i32;
        }
        pub const PROT_READ_WRITE: i32 = 0x1 | 0x2;
        pub const MAP_PRIVATE_ANONYMOUS: i32 = 0x02 | 0x20;
    }

    /// Map `class` bytes (a whole number of pages: classes from MAPPED_BLOCK_BYTES on are
    /// multiples of 64 KiB). Blocks of HUGE_PAGE_THRESHOLD and more start on a huge-page boundary,
    /// so that every huge page the kernel can back them with lies inside the block.
    #[cfg(target_os = "linux")]
    fn map(class: usize) -> Result<NonNull<u8>> {
        let align = if class >= HUGE_PAGE_THRESHOLD { HUGE_PAGE_THRESHOLD } else { 4096 };
        let len = class + (align - 4096);
        // SAFETY: an anonymous private mapping at an address of the kernel's choice touches no
        // existing memory.
        let raw = unsafe { linux::mmap(std::ptr::null_mut(), len, linux::PROT_READ_WRITE, linux::MAP_PRIVATE_ANONYMOUS, -1, 0) };
        if raw as isize == -1 || raw.is_null() {
            crate::bail!(Runtime, "out of host memory mapping {class} bytes: {}", std::io::Error::last_os_error());
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(align);
        let (head, tail) = (aligned - start, len - (aligned - start) - class);
        // SAFETY: [start, aligned) and [aligned + class, start + len) lie inside the mapping just
        // made and nothing refers to them.
        unsafe {
            if head > 0 {
                linux::munmap(raw, head);
            }
            if tail > 0 {
                linux::munmap((aligned + class) as *mut _, tail);
            }
        }
        NonNull::new(aligned as *mut u8).ok_or_else(|| crate::err!(Runtime, "the kernel mapped {class} bytes at address 0"))
    }

    /// # Safety
    /// `ptr` must be a mapping of exactly `class` bytes made by `map` and referenced by nothing.
    #[cfg(target_os = "linux")]
    unsafe fn unmap(ptr: NonNull<u8>, class: usize) {
        // SAFETY: guaranteed by this function's contract. munmap fails only for arguments that
        // are not a mapping, which the contract excludes.
        unsafe { linux::munmap(ptr.as_ptr().cast(), class) };
    }

    #[cfg(not(target_os = "linux"))]
    fn map(class: usize) -> Result<NonNull<u8>> {
        crate::bail!(Runtime, "cannot map {class} bytes: pool blocks are mapped directly only on Linux")
    }

    #[cfg(not(target_os = "linux"))]
    unsafe fn unmap(_ptr: NonNull<u8>, _class: usize) {}
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
    /// A block of a GPU's pool; the address is device memory, never dereferenced by the host.
    #[cfg(feature = "cuda")]
    Device { class: usize, pool: &'static crate::backend::cuda::GpuPool },
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
    /// A block of device memory that `pool` takes back when the buffer is dropped.
    ///
    /// # Safety
    /// `ptr` must be a block of at least `bytes` bytes that `pool` handed out with size class
    /// `class` and that nothing else owns.
    #[cfg(feature = "cuda")]
    pub(crate) unsafe fn device(ptr: NonNull<u8>, bytes: usize, class: usize, pool: &'static crate::backend::cuda::GpuPool) -> Buffer {
        Buffer { ptr, bytes, owner: Owner::Device { class, pool } }
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
        match self.owner {
            Owner::Pool { class, pool } => pool.release(self.ptr, class, self.bytes),
            #[cfg(feature = "cuda")]
            Owner::Device { class, pool } => pool.release(self.ptr, class, self.bytes),
            Owner::External { .. } => {}
        }
        // An external owner is dropped with the buffer, which releases the memory it keeps alive.
    }
}

/// The pool of host memory (plain and pinned host memory share it on machines without CUDA).
pub fn cpu_pool() -> &'static CpuPool {
    static POOL: OnceLock<CpuPool> = OnceLock::new();
    POOL.get_or_init(|| CpuPool { background_trim: true, ..CpuPool::new(PoolPolicy::from_env()) })
}

/// Allocate `bytes` on `ctx`.
pub fn alloc(ctx: Context, bytes: usize) -> Result<Buffer> {
    match ctx.device_type {
        DeviceType::Cpu | DeviceType::CpuPinned | DeviceType::CpuShared => cpu_pool().alloc(bytes),
        #[cfg(feature = "cuda")]
        DeviceType::Gpu => {
            let gpu = crate::backend::cuda::gpu(ctx)?;
            gpu.pool().alloc(gpu, bytes)
        }
        #[cfg(not(feature = "cuda"))]
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
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new(PoolPolicy::default())));
        let a = pool.alloc(3000).unwrap();
        assert_eq!(a.as_ptr() as usize % ALIGNMENT, 0);
        let first = a.as_ptr();
        drop(a);
        let b = pool.alloc(3000).unwrap();
        assert_eq!(b.as_ptr(), first, "a freed buffer of the same class is reused");
        let s = pool.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
        assert_eq!(s.used_bytes, size_class(3000) as u64);
        assert_eq!(s.requested_bytes, 3000, "requested bytes leave out the size class's rounding");
        let small = pool.alloc(100).unwrap();
        assert_eq!(small.as_ptr() as usize % ALIGNMENT, 0, "small blocks are aligned too");
        drop(small);
        assert_eq!(pool.stats().pooled_bytes, 0, "small blocks go straight back to the allocator");
        let c = pool.alloc(5000).unwrap();
        assert_ne!(c.as_ptr(), b.as_ptr());
        drop(b);
        drop(c);
        let s = pool.stats();
        assert_eq!((s.used_bytes, s.requested_bytes), (0, 0));
        assert_eq!(s.pooled_bytes, (size_class(3000) + size_class(5000)) as u64);
        assert_eq!(s.peak_used_bytes, (size_class(3000) + size_class(5000)) as u64);
        pool.release_all();
        assert_eq!(pool.stats().pooled_bytes, 0);
    }

    #[test]
    fn pool_is_thread_safe() {
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new(PoolPolicy::default())));
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

    #[test]
    fn idle_blocks_go_back_and_fresh_ones_stay() {
        let policy = PoolPolicy { idle: Some(Duration::from_secs(60)), ..PoolPolicy::default() };
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new(policy)));
        drop(pool.alloc(MAPPED_BLOCK_BYTES).unwrap());
        drop(pool.alloc(3000).unwrap());
        let pooled = pool.stats().pooled_bytes;
        assert_eq!(pool.trim_idle(Instant::now()), 0, "nothing has been idle for a minute yet");
        assert_eq!(pool.trim_idle(Instant::now() + Duration::from_secs(61)), pooled);
        assert_eq!(pool.stats().pooled_bytes, 0);
        // A block taken again after the trim comes from the system, aligned as before.
        let again = pool.alloc(HUGE_PAGE_THRESHOLD).unwrap();
        assert_eq!(again.as_ptr() as usize % HUGE_PAGE_THRESHOLD, 0, "large blocks start on a huge page");
        assert_eq!(pool.stats().misses, 3);
    }

    #[test]
    fn the_limit_returns_the_oldest_blocks() {
        let limit = 3 * MAPPED_BLOCK_BYTES as u64;
        let policy = PoolPolicy { idle: None, max_pooled_bytes: limit, ..PoolPolicy::default() };
        let pool: &'static CpuPool = Box::leak(Box::new(CpuPool::new(policy)));
        let blocks: Vec<Buffer> = (0..5).map(|_| pool.alloc(MAPPED_BLOCK_BYTES).unwrap()).collect();
        let newest = blocks[4].as_ptr();
        drop(blocks);
        assert_eq!(pool.stats().pooled_bytes, limit);
        assert_eq!(pool.alloc(MAPPED_BLOCK_BYTES).unwrap().as_ptr(), newest, "the most recently freed block is kept");
        let unpooled: &'static CpuPool = Box::leak(Box::new(CpuPool::new(PoolPolicy { max_pooled_bytes: 0, ..policy })));
        drop(unpooled.alloc(3000).unwrap());
        assert_eq!(unpooled.stats().pooled_bytes, 0, "a limit of 0 pools nothing");
    }
}
