//! Fork-join regions for kernels: a caller splits its work into tasks and runs them together with
//! the engine's idle workers (see `workers`), which join the region while they have no operation
//! of their own to run.
//!
//! One region runs at a time. A region started while another is running (an independent operator
//! on a second engine worker, or a task that itself splits) runs its tasks on the caller's thread:
//! the cores are busy anyway.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a region's caller spins for helpers still inside before it yields its core.
const SPIN: Duration = Duration::from_micros(50);

/// `region` packs the helpers inside the current region (low 16 bits), whether the region is
/// open to new helpers (bit 16) and its generation (high 32 bits).
const ACTIVE_MASK: u64 = 0xFFFF;
const OPEN: u64 = 1 << 16;
const GENERATION_SHIFT: u32 = 32;

type Task<'a> = dyn Fn(usize) + Sync + 'a;

struct Pool {
    /// Most workers inside one region: the others besides the caller's core.
    helpers: usize,
    region: AtomicU64,
    /// Held by the caller that owns the pool's current region.
    busy: AtomicBool,
    /// The region's work: the task function (lifetime erased, see `run`) and its task count.
    job: Mutex<Option<(&'static Task<'static>, usize)>>,
    next_task: AtomicUsize,
    /// A helper's task panicked; the caller re-raises it.
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        helpers: (super::workers::count() - 1).min(ACTIVE_MASK as usize),
        region: AtomicU64::new(0),
        busy: AtomicBool::new(false),
        job: Mutex::new(None),
        next_task: AtomicUsize::new(0),
        panicked: Mutex::new(None),
    })
}

/// Threads a region can use: the caller and the helpers.
pub fn threads() -> usize {
    pool().helpers + 1
}

/// Run `task(0) .. task(tasks - 1)`, spread over the caller and the helpers; returns when all ran.
/// Tasks are claimed in order, one at a time, so unequal tasks balance.
pub fn run(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    let owned = tasks > 1
        && pool.helpers > 0
        && pool.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
    if !owned {
        (0..tasks).for_each(task);
        return;
    }
    // SAFETY: the reference is only reachable through `job` while the region is open or a helper
    // that joined it is still running; `Region::drop` closes the region and waits until no helper
    // is inside before this function returns (or unwinds), so it never outlives `task`.
    let erased: &'static Task<'static> = unsafe { std::mem::transmute::<&Task<'_>, &'static Task<'static>>(task) };
    *pool.job.lock().unwrap() = Some((erased, tasks));
    pool.next_task.store(0, Ordering::Relaxed);
    let region = Region { pool };
    // Release: a helper that joins (Acquire on `region`) sees the job and the reset counter.
    let generation = (pool.region.load(Ordering::Relaxed) >> GENERATION_SHIFT) + 1;
    pool.region.store((generation << GENERATION_SHIFT) | OPEN, Ordering::Release);
    super::workers::wake_sleepers();
    run_claimed(pool, task, tasks);
    region.close();
    let helper_panic = pool.panicked.lock().unwrap().take();
    drop(region);
    if let Some(panic) = helper_panic {
        resume_unwind(panic);
    }
}

/// `task(0) .. task(tasks - 1)` run as by [`run`], their results in task order.
pub fn map<R: Send>(tasks: usize, task: impl Fn(usize) -> R + Sync) -> Vec<R> {
    // Each slot is written by the one task of its index: the locks are never contended.
    let slots: Vec<Mutex<Option<R>>> = (0..tasks).map(|_| Mutex::new(None)).collect();
    run(tasks, &|i| *slots[i].lock().unwrap() = Some(task(i)));
    slots.into_iter().map(|slot| slot.into_inner().unwrap().expect("every task ran")).collect()
}

/// The caller's hold on the pool: closing waits for the helpers inside the region, and dropping
/// (also when the caller's own task unwinds) closes and hands the pool to the next caller.
struct Region {
    pool: &'static Pool,
}

impl Drop for Region {
    fn drop(&mut self) {
        self.close();
        // A helper's panic not collected by `run` (the caller is unwinding with its own) is
        // dropped, so that it is not blamed on the next region.
        self.pool.panicked.lock().unwrap().take();
        // Release: the next owner sees this region fully finished.
        self.pool.busy.store(false, Ordering::Release);
    }
}

impl Region {
    fn close(&self) {
        // No task may start after this: the caller stops waiting only once the helpers inside
        // have finished what they claimed.
        self.pool.next_task.store(usize::MAX / 2, Ordering::Relaxed);
        self.pool.region.fetch_and(!OPEN, Ordering::AcqRel);
        // Acquire: pairs with the helpers' Release when they leave, so their writes are visible.
        // Past a short spin the caller yields its core: a helper still inside may be waiting for
        // a core (the cores are shared with the Python thread and the engine's other worker).
        let waiting_since = Instant::now();
        while self.pool.region.load(Ordering::Acquire) & ACTIVE_MASK != 0 {
            if waiting_since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.pool.job.lock().unwrap() = None;
    }
}

fn run_claimed(pool: &Pool, task: &Task<'_>, tasks: usize) {
    loop {
        // Relaxed: the counter only hands out distinct indices; the task's data was published
        // with the region.
        let i = pool.next_task.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        task(i);
    }
}

/// A worker's side of regions: which region it last joined.
#[derive(Default)]
pub(super) struct Helper {
    seen_generation: u64,
}

impl Helper {
    /// Whether a region this worker has not joined yet is open to another helper.
    pub fn can_join(&self) -> bool {
        let pool = pool();
        self.joinable(pool, pool.region.load(Ordering::Acquire))
    }

    fn joinable(&self, pool: &Pool, state: u64) -> bool {
        state & OPEN != 0 && state >> GENERATION_SHIFT != self.seen_generation && ((state & ACTIVE_MASK) as usize) < pool.helpers
    }

    /// Join the open region, if any (and not joined before), and run tasks until none is left.
    /// Returns whether it joined.
    pub fn help(&mut self) -> bool {
        let pool = pool();
        let state = pool.region.load(Ordering::Acquire);
        if !self.joinable(pool, state) {
            return false;
        }
        // Join only the region that is still open: AcqRel so the job published before the open
        // is visible, and the caller's close cannot miss this helper.
        if pool.region.compare_exchange(state, state + 1, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        self.seen_generation = state >> GENERATION_SHIFT;
        let job = *pool.job.lock().unwrap();
        if let Some((task, tasks)) = job {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run_claimed(pool, task, tasks))) {
                pool.panicked.lock().unwrap().get_or_insert(panic);
            }
        }
        // Release: the caller, seeing no helper inside, sees this helper's writes.
        pool.region.fetch_sub(1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_regions_nest_inline() {
        for round in 0..200 {
            let tasks = round % 7 + 1;
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            run(tasks, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
                // A nested region runs inline on whichever thread runs this task.
                let inner = AtomicUsize::new(0);
                run(3, &|_| {
                    inner.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(inner.load(Ordering::Relaxed), 3);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_recovers() {
        let caught = catch_unwind(|| run(8, &|i| assert!(i != 5, "task five fails")));
        assert!(caught.is_err());
        let sum = AtomicUsize::new(0);
        run(8, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 28);
    }
}
