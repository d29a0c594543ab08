//! The engine's one set of CPU threads: a rayon thread pool. Ready operations run on it as rayon
//! jobs, and kernels' parallel loops ([`super::parallel`]) run inside the same pool, so busy
//! threads never outnumber its threads and an idle thread sleeps by rayon's own policy (nothing
//! spins once there is no work).
//!
//! The pool is made on first use from [`EngineConfig`]: the thread count of
//! `MXNET_CPU_WORKER_NTHREADS` / `OMP_NUM_THREADS` (every core by default), or a pool the
//! embedding program hands over with [`configure`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use rayon::{ThreadPool, ThreadPoolBuilder};

/// How the engine gets its threads. Give it to [`configure`] before the first operation.
#[derive(Default)]
pub struct EngineConfig {
    /// Threads of the pool the engine makes (default: `MXNET_CPU_WORKER_NTHREADS`, else
    /// `OMP_NUM_THREADS`, else every core). Ignored when `pool` is given.
    pub threads: Option<usize>,
    /// A pool the program already runs (its threads then also run the engine's operations and
    /// kernels, so the program and oxnet share the cores instead of competing for them).
    pub pool: Option<Arc<ThreadPool>>,
}

/// Set by `configure` and consumed by the first use of the pool.
static PENDING_CONFIG: Mutex<Option<EngineConfig>> = Mutex::new(None);
static POOL: OnceLock<Arc<ThreadPool>> = OnceLock::new();

/// Choose the engine's threads. Must come before the engine runs anything: afterwards the pool
/// exists and this returns an error.
pub fn configure(config: EngineConfig) -> crate::Result<()> {
    // The lock orders this against the first use (which takes the config under it).
    let mut pending = PENDING_CONFIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if POOL.get().is_some() {
        crate::bail!(Value, "engine::configure: the engine's thread pool already exists (configure it before the first operation)");
    }
    *pending = Some(config);
    Ok(())
}

pub(super) fn pool() -> &'static ThreadPool {
    POOL.get_or_init(|| {
        let config = PENDING_CONFIG.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take().unwrap_or_default();
        if let Some(pool) = config.pool {
            return pool;
        }
        let threads = config.threads.unwrap_or_else(super::configured_threads).max(1);
        let pool = ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("oxnet-cpu-{i}"))
            .build()
            .expect("the operating system refused to start the engine's threads");
        Arc::new(pool)
    })
}

/// Threads of the pool (the cores kernels may use).
pub fn count() -> usize {
    pool().current_num_threads()
}

/// Where a job goes.
pub enum Order {
    /// Run soon: on a pool thread, the thread's own next job (rayon's LIFO spawn), so a chain of
    /// operations releasing one another runs to its end before older queued work.
    First,
    /// Behind the jobs already queued (FIFO).
    Last,
}

pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// Queue `job` to run on the pool.
pub fn spawn(job: Job, order: Order) {
    // Jobs report their own failures (the engine catches an op's panic and stores it as its
    // error); this only keeps rayon from aborting the process should one escape anyway.
    let job = move || {
        let _ = catch_unwind(AssertUnwindSafe(job));
    };
    match order {
        Order::First => pool().spawn(job),
        Order::Last => pool().spawn_fifo(job),
    }
}
