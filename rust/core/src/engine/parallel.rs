//! Kernels' parallel loops, on the engine's rayon pool (`engine::pool`): an operator running on
//! a pool thread splits its work into tasks that the pool's idle threads steal, and a caller
//! outside the pool (the Python thread running a small operator inline) hands its tasks to the
//! pool and waits.

use rayon::prelude::*;
use std::sync::{Mutex, PoisonError};

/// Threads a loop can use.
pub fn threads() -> usize {
    super::pool::count()
}

/// Work, in floating-point operations, below which a task is not worth handing to another
/// thread. From outside the pool (the Python thread running a graph inline) a split wakes a
/// sleeping pool thread and sleeps until it is done: 10-20 us. Measured on 2 cores: a 1-layer
/// LSTM forward of 2 steps, 16 rows and 32 units (0.3 M flops) took 9 us on one thread and
/// 20 us split in two; small products run at 50-60 GFLOP/s, so 2 M flops is 30-40 us of work.
pub const MIN_TASK_FLOPS: usize = 1 << 21;

/// How many tasks `flops` of work that splits at most `max_tasks` ways is worth: no more than
/// the pool's threads, and none with less than [`MIN_TASK_FLOPS`] (at least one task).
pub fn tasks_for(flops: usize, max_tasks: usize) -> usize {
    (flops / MIN_TASK_FLOPS).min(threads()).min(max_tasks).max(1)
}

/// Run `task(0) .. task(tasks - 1)` on the pool; returns when all ran. Each task is its own
/// stealable unit, so unequal tasks balance. A task's panic reaches the caller.
pub fn run(tasks: usize, task: &(dyn Fn(usize) + Sync)) {
    if tasks <= 1 || threads() <= 1 {
        (0..tasks).for_each(task);
        return;
    }
    super::pool::pool().install(|| (0..tasks).into_par_iter().with_max_len(1).for_each(task));
}

/// `task(0) .. task(tasks - 1)` run as by [`run`], their results in task order.
pub fn map<R: Send>(tasks: usize, task: impl Fn(usize) -> R + Sync) -> Vec<R> {
    map_owned(vec![(); tasks], |i, ()| task(i))
}

/// `task(i, items[i])` for every item, each moved to the thread that runs its task (disjoint
/// `&mut` pieces of one buffer, say), scheduled as by [`run`]; the results in item order.
///
/// The tasks reach the pool through `dyn Fn`s, not as a generic parallel iterator: rayon's
/// splitting and joining is then compiled once, and the rest once per item and result type,
/// not once per call site and element type. Handing each call site's closure to rayon
/// generically made 700 thousand of the crate's 880 thousand monomorphized functions and most
/// of its build time (RESULTS.md, "Build time"); a lock per task costs nothing beside a task
/// worth a thread.
///
/// On one thread the tasks run here, generically, so that a task inlines into its caller (a
/// kernel compiled for the CPU's vectors inside `simd::vectorized` keeps its vectors).
pub fn map_owned<T: Send, R: Send>(items: Vec<T>, task: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 || threads() <= 1 {
        let mut results = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            results.push(task(i, item));
        }
        return results;
    }
    map_owned_on_pool(items, &task)
}

fn map_owned_on_pool<T: Send, R: Send>(items: Vec<T>, task: &(dyn Fn(usize, T) -> R + Sync)) -> Vec<R> {
    let mut results = Vec::with_capacity(items.len());
    // Slot i holds item i until task i takes it, then task i's result. Only task i locks slot
    // i (and the caller, after `run` returned), so the locks are never contended: they make the
    // slots shareable between threads. A task that panics leaves its slot poisoned, but `run`
    // then panics in the caller and the slots are only dropped.
    let mut slots = Vec::with_capacity(items.len());
    for item in items {
        slots.push(Mutex::new(Slot::Item(item)));
    }
    run(slots.len(), &|i| {
        let Some(slot) = slots.get(i) else { return };
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Slot::Item(item) = std::mem::replace(&mut *slot, Slot::Taken) {
            *slot = Slot::Result(task(i, item));
        }
    });
    // Every task ran once (`run` returns only then), so every slot holds its result.
    for slot in slots {
        if let Slot::Result(result) = slot.into_inner().unwrap_or_else(PoisonError::into_inner) {
            results.push(result);
        }
    }
    results
}

/// One task's state in [`map_owned`].
enum Slot<T, R> {
    Item(T),
    Taken,
    Result(R),
}

/// `data`, `items` items of `item_len` elements each, cut into `parts` runs of whole items
/// whose counts differ by at most one: each run's item range and its elements, for
/// [`map_owned`].
pub fn split_runs<T>(data: &mut [T], item_len: usize, items: usize, parts: usize) -> Vec<(std::ops::Range<usize>, &mut [T])> {
    let parts = parts.max(1);
    let mut runs = Vec::with_capacity(parts);
    let mut rest = &mut data[..items * item_len];
    for part in 0..parts {
        let run = part * items / parts..(part + 1) * items / parts;
        let (elements, tail) = std::mem::take(&mut rest).split_at_mut(run.len() * item_len);
        runs.push((run, elements));
        rest = tail;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::catch_unwind;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn every_task_runs_once_and_nested_loops_complete() {
        for round in 0..200 {
            let tasks = round % 7 + 1;
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            run(tasks, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
                let inner = AtomicUsize::new(0);
                run(3, &|_| {
                    inner.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(inner.load(Ordering::Relaxed), 3);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
        assert_eq!(map(5, |i| i * i), vec![0, 1, 4, 9, 16]);
        let mut pieces = vec![0usize; 6];
        let lengths = map_owned(pieces.chunks_mut(2).collect(), |i, piece: &mut [usize]| {
            piece.fill(i + 1);
            piece.len()
        });
        assert_eq!(lengths, vec![2, 2, 2]);
        let mut items = vec![0usize; 7 * 3];
        let runs: Vec<_> = split_runs(&mut items, 3, 7, 3).into_iter().map(|(run, elements)| (run, elements.len())).collect();
        assert_eq!(runs, vec![(0..2, 6), (2..4, 6), (4..7, 9)]);
        assert_eq!(pieces, vec![1, 1, 2, 2, 3, 3]);
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

    /// A loop started inside another loop's task still gets the other threads: its two tasks
    /// meet, which they cannot if one thread runs both.
    #[test]
    fn a_nested_loop_gets_the_other_threads() {
        if threads() < 2 {
            return; // a single thread has nobody to meet
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
        assert!(met.load(Ordering::SeqCst), "the nested loop's tasks never ran at the same time");
    }
}
