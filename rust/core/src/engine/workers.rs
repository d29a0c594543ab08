//! The engine's CPU threads, one per configured core. A worker runs ready operations; with none
//! queued it helps the fork-join region of a kernel another thread is running; with neither it
//! spins for [`SPIN`], yields its core for up to [`YIELD`], then sleeps until work arrives.
//!
//! Operations and kernels' parallel loops share these threads so that busy threads never
//! outnumber the cores. With separate helper threads for the loops, two operations running side
//! by side plus a helper spinning for a third core made every thread lose its core a few hundred
//! times a second (ResNet-style block training, 2 cores: 7.8 ms a step with two op workers and a
//! helper, 7.0 with the workers alone; but alone they leave a lone convolution on one core).
//!
//! Short idle spins matter because a step of a small network is dozens of kernels of tens to
//! hundreds of microseconds, and on a virtual machine a futex wake-up costs about as much as one
//! of them: a 128x784x256 float32 product split in two ran at 140 GFLOP/s through rayon's join
//! (whose idle threads sleep almost at once) and at 280 with a spinning helper.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::fork_join::Helper;

const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_millis(2);

pub type Job = Box<dyn FnOnce() + Send + 'static>;

struct Workers {
    count: usize,
    /// Ready jobs. The lock is held only to add or take one, never while a job runs.
    queue: Mutex<VecDeque<Job>>,
    /// The queue's length, readable without its lock by idle workers polling for work. It is
    /// changed under the queue's lock, so it never claims a job that is not there.
    queued: AtomicUsize,
    /// Workers asleep, and the condition they sleep on (signalled by `spawn` and by a region
    /// opening). Whoever adds work publishes it first and takes this lock to read the count, and a
    /// worker re-checks for work under the same lock before it waits, so no wake-up is lost.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

fn workers() -> &'static Workers {
    static WORKERS: OnceLock<&'static Workers> = OnceLock::new();
    WORKERS.get_or_init(|| {
        let count = super::configured_threads().max(1);
        let workers: &'static Workers = Box::leak(Box::new(Workers {
            count,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..count {
            std::thread::Builder::new()
                .name(format!("oxnet-cpu-{i}"))
                .spawn(move || worker_loop(workers))
                .expect("the operating system refused to start the engine's worker thread");
        }
        workers
    })
}

/// Worker threads (the cores kernels may use).
pub fn count() -> usize {
    workers().count
}

/// Where a job joins the queue.
pub enum Order {
    /// Ahead of every queued job.
    First,
    /// Behind every queued job.
    Last,
}

/// Queue `job` to run on a worker.
pub fn spawn(job: Job, order: Order) {
    let w = workers();
    {
        let mut queue = w.queue.lock().unwrap();
        match order {
            Order::First => queue.push_front(job),
            Order::Last => queue.push_back(job),
        }
        w.queued.fetch_add(1, Ordering::Release);
    }
    if *w.sleepers.lock().unwrap() > 0 {
        w.wake.notify_one();
    }
}

/// Wake every sleeping worker: a fork-join region has opened (and is already published).
pub(super) fn wake_sleepers() {
    let w = workers();
    if *w.sleepers.lock().unwrap() > 0 {
        w.wake.notify_all();
    }
}

fn pop(w: &Workers) -> Option<Job> {
    // A stale zero only makes this worker look again later (it checks again under `sleepers`
    // before it sleeps); the job itself is handed over under the queue's lock.
    if w.queued.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut queue = w.queue.lock().unwrap();
    let job = queue.pop_front();
    if job.is_some() {
        w.queued.fetch_sub(1, Ordering::Release);
    }
    job
}

fn worker_loop(w: &'static Workers) {
    let mut helper = Helper::default();
    let mut idle_since = Instant::now();
    loop {
        if let Some(job) = pop(w) {
            // Jobs report their own failures (the engine catches an op's panic and stores it as
            // its error); this only keeps the worker alive should one escape anyway.
            let _ = catch_unwind(AssertUnwindSafe(job));
            idle_since = Instant::now();
            continue;
        }
        if helper.help() {
            idle_since = Instant::now();
            continue;
        }
        let idle = idle_since.elapsed();
        if idle < SPIN {
            std::hint::spin_loop();
        } else if idle < SPIN + YIELD {
            std::thread::yield_now();
        } else {
            let mut sleepers = w.sleepers.lock().unwrap();
            *sleepers += 1;
            while w.queued.load(Ordering::Acquire) == 0 && !helper.can_join() {
                sleepers = w.wake.wait(sleepers).unwrap();
            }
            *sleepers -= 1;
            idle_since = Instant::now();
        }
    }
}
