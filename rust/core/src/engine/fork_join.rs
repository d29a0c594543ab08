//! Fork-join regions for kernels: a caller splits its work into tasks and runs them together with
//! the engine's idle workers (see `workers`), which join a region while they have no operation of
//! their own to run.
//!
//! Regions live in a few slots, so that independent operators running side by side each open one
//! and a worker that finishes its own operation helps whichever is still running. (With a single
//! region, a convolution that started while a short element-wise kernel held it ran all its tasks
//! alone while the other core idled: 2.2 instead of 1.3 ms in a ResNet-style block.) A caller that
//! finds every slot taken runs its tasks itself.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a region's caller spins for helpers still inside before it yields its core.
const SPIN: Duration = Duration::from_micros(50);

/// A slot's `region` word packs the helpers inside its current region (low 16 bits), whether the
/// region is open to new helpers (bit 16) and its generation (high 32 bits).
const ACTIVE_MASK: u64 = 0xFFFF;
const OPEN: u64 = 1 << 16;
const GENERATION_SHIFT: u32 = 32;

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// One region's state.
struct Slot {
    region: AtomicU64,
    /// Held by the caller that owns the slot's current region.
    busy: AtomicBool,
    /// The region's work: the task function (lifetime erased, see `run`) and its task count.
    job: Mutex<Option<(&'static Task<'static>, usize)>>,
    /// The next task index to hand out; every index is claimed by exactly one `fetch_add`.
    next_task: AtomicUsize,
    /// A helper's task panicked; the caller re-raises it.
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

struct Pool {
    /// Most workers inside one region: the others besides the caller's core.
    helpers: usize,
    /// One slot per thread that can own a region at a time (every worker and one caller outside
    /// the engine, such as the Python thread running a small operator inline).
    slots: Vec<Slot>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let workers = super::workers::count();
        let slot = || Slot {
            region: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            job: Mutex::new(None),
            next_task: AtomicUsize::new(0),
            panicked: Mutex::new(None),
        };
        Pool { helpers: (workers - 1).min(ACTIVE_MASK as usize), slots: (0..=workers).map(|_| slot()).collect() }
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
    // Acquire: pairs with the Release in `Region::drop`, so the slot's previous region is over.
    let owned = (tasks > 1 && pool.helpers > 0)
        .then(|| pool.slots.iter().find(|s| s.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()))
        .flatten();
    let Some(slot) = owned else {
        (0..tasks).for_each(task);
        return;
    };
    // SAFETY: the reference is only reachable through `job` while the region is open or a helper
    // that joined it is still running; `Region::drop` closes the region and waits until no helper
    // is inside before this function returns (or unwinds), so it never outlives `task`.
    let erased: &'static Task<'static> = unsafe { std::mem::transmute::<&Task<'_>, &'static Task<'static>>(task) };
    *slot.job.lock().unwrap() = Some((erased, tasks));
    slot.next_task.store(0, Ordering::Relaxed);
    let region = Region { slot };
    // Release: a helper that joins (Acquire on `region`) sees the job and the reset counter.
    // Relaxed load: only the slot's owner (holding `busy`) changes the generation bits.
    let generation = (slot.region.load(Ordering::Relaxed) >> GENERATION_SHIFT) + 1;
    slot.region.store((generation << GENERATION_SHIFT) | OPEN, Ordering::Release);
    super::workers::wake_sleepers();
    run_claimed(slot, task, tasks);
    region.close();
    let helper_panic = slot.panicked.lock().unwrap().take();
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

/// The caller's hold on its slot: closing waits for the helpers inside the region, and dropping
/// (also when the caller's own task unwinds) closes and frees the slot.
struct Region {
    slot: &'static Slot,
}

impl Drop for Region {
    fn drop(&mut self) {
        self.close();
        // A helper's panic not collected by `run` (the caller is unwinding with its own) is
        // dropped, so that it is not blamed on the slot's next region.
        self.slot.panicked.lock().unwrap().take();
        // Release: the next owner sees this region fully finished.
        self.slot.busy.store(false, Ordering::Release);
    }
}

impl Region {
    fn close(&self) {
        // No task may start after this: the caller stops waiting only once the helpers inside
        // have finished what they claimed. (Half the range: late `fetch_add`s cannot wrap it.)
        self.slot.next_task.store(usize::MAX / 2, Ordering::Relaxed);
        self.slot.region.fetch_and(!OPEN, Ordering::AcqRel);
        // Acquire: pairs with the helpers' Release when they leave, so their writes are visible.
        // Past a short spin the caller yields its core: a helper still inside may be waiting for
        // a core (the cores are shared with the Python thread).
        let waiting_since = Instant::now();
        while self.slot.region.load(Ordering::Acquire) & ACTIVE_MASK != 0 {
            if waiting_since.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.slot.job.lock().unwrap() = None;
    }
}

fn run_claimed(slot: &Slot, task: &Task<'_>, tasks: usize) {
    loop {
        // Relaxed: the counter only hands out distinct indices; the task's data was published
        // with the region.
        let i = slot.next_task.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        task(i);
    }
}

/// A worker's side of regions: the generation of each slot's region it last joined.
pub(super) struct Helper {
    seen_generation: Vec<u64>,
}

impl Default for Helper {
    fn default() -> Helper {
        Helper { seen_generation: vec![0; pool().slots.len()] }
    }
}

impl Helper {
    /// Whether a region this worker has not joined yet is open to another helper.
    pub fn can_join(&self) -> bool {
        let pool = pool();
        (0..pool.slots.len()).any(|i| self.joinable(pool, i, pool.slots[i].region.load(Ordering::Acquire)))
    }

    fn joinable(&self, pool: &Pool, slot: usize, state: u64) -> bool {
        state & OPEN != 0
            && state >> GENERATION_SHIFT != self.seen_generation[slot]
            && ((state & ACTIVE_MASK) as usize) < pool.helpers
    }

    /// Join an open region not joined before, if any, and run its tasks until none is left.
    /// Returns whether it joined one.
    pub fn help(&mut self) -> bool {
        let pool = pool();
        for (i, slot) in pool.slots.iter().enumerate() {
            let state = slot.region.load(Ordering::Acquire);
            // Join only the region that is still open: AcqRel so the job published before the
            // open is visible, and the caller's close cannot miss this helper.
            if !self.joinable(pool, i, state)
                || slot.region.compare_exchange(state, state + 1, Ordering::AcqRel, Ordering::Relaxed).is_err()
            {
                continue;
            }
            self.seen_generation[i] = state >> GENERATION_SHIFT;
            let job = *slot.job.lock().unwrap();
            if let Some((task, tasks)) = job {
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run_claimed(slot, task, tasks))) {
                    slot.panicked.lock().unwrap().get_or_insert(panic);
                }
            }
            // Release: the caller, seeing no helper inside, sees this helper's writes.
            slot.region.fetch_sub(1, Ordering::Release);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_nested_regions_complete() {
        for round in 0..200 {
            let tasks = round % 7 + 1;
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            run(tasks, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
                // A nested region takes another slot, or runs inline when none is free.
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

    /// A region opened while another holds a slot (here: nested in one of its tasks) is still
    /// helped: its two tasks meet, which they cannot if one thread runs both.
    #[test]
    fn a_region_opened_beside_another_gets_helpers() {
        if threads() < 2 {
            return; // a single core has no helper to give
        }
        let met = AtomicBool::new(false);
        run(2, &|outer| {
            if outer != 0 {
                return;
            }
            let arrived = AtomicUsize::new(0);
            run(2, &|_| {
                arrived.fetch_add(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(2);
                while arrived.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                if arrived.load(Ordering::SeqCst) == 2 {
                    met.store(true, Ordering::SeqCst);
                }
            });
        });
        assert!(met.load(Ordering::SeqCst), "the second region's tasks never ran at the same time");
    }
}
