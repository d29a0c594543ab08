//! The dependency engine: MXNet's `push(fn, read_vars, write_vars)` contract.
//!
//! Every piece of mutable state (an NDArray chunk, an RNG) owns a [`Var`]. An operation waits for
//! the earlier writers of what it reads, and for the earlier readers and writers of what it writes;
//! ready operations run on the engine's worker threads (`workers`), so independent work proceeds concurrently while the caller
//! keeps pushing. A failing operation stores its error on the vars it writes; whatever reads them
//! later inherits the error, and the next sync point ([`wait_for_var`], [`wait_all`]) returns it.
//! As in MXNet an error is reported once: raising it at a wait on any array it reached, or at
//! `wait_all`, clears it everywhere, so later waits (and later readers) see no error.

pub mod parallel;
mod pool;
pub use pool::{configure, EngineConfig};
mod var;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

pub use var::Var;

use crate::error::{Error, Result};

/// Work handed to the engine. It returns an error instead of panicking; a panic is caught anyway
/// and turned into an error on the written vars.
pub type OpFn = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// Work that finishes later, on a thread of its own choosing (MXNet's `PushAsync`): it is called
/// once its dependencies are met, with the [`Completion`] that ends it, and returns at once. While
/// the completion is outstanding the op holds its vars. It is called with `Err` instead when what
/// it reads or writes holds an unreported error: it must not run then; the engine has already
/// failed it with that error.
pub type AsyncOpFn = Box<dyn FnOnce(std::result::Result<Completion, Error>) + Send + 'static>;

enum OpBody {
    Sync(OpFn),
    Async(AsyncOpFn),
}

/// One failure, shared by the vars of the op that raised it, the vars of every op that inherited
/// it and the engine's list of unreported errors. Reporting it empties the cell, which is how a
/// single report reaches all of them. Lock order: a cell's lock may be taken while a var's lock
/// or the engine's error list is held, and nothing is locked while a cell's lock is held.
pub(crate) type ErrorCell = Arc<Mutex<Option<Error>>>;

/// How an operation describes itself in error messages and in the profiler's trace: op name,
/// inputs, where it was pushed.
pub trait OpDescription: Send + Sync {
    fn describe(&self) -> String;
    /// The operator's name alone (the profiler's entry name).
    fn name(&self) -> String {
        self.describe()
    }
    /// Its inputs' shapes and dtypes.
    fn inputs(&self) -> String {
        String::new()
    }
    /// Where the host pushed it from, when known.
    fn site(&self) -> Option<String> {
        None
    }
}

impl OpDescription for String {
    fn describe(&self) -> String {
        self.clone()
    }
}

impl OpDescription for &'static str {
    fn describe(&self) -> String {
        (*self).to_string()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// Ops run on the worker threads as soon as their dependencies are met.
    Threaded,
    /// Every op runs synchronously inside `push` (for debugging: errors surface at their call).
    Naive,
}

/// Per-op scheduling hints.
#[derive(Clone, Copy, Debug, Default)]
pub struct PushProps {
    /// The op is so small that handing it to another thread costs more than running it: when its
    /// dependencies are already met it runs on the pushing thread.
    pub inline_if_ready: bool,
}

pub(crate) struct OprBlock {
    /// Dependencies not yet granted, plus one held by `push` until registration finishes. Only the
    /// thread whose `count_down` ends it starts the block: it runs exactly once, and never
    /// before it is on the queues of all its vars.
    wait: oxnet_sync::Countdown,
    /// Taken exactly once, by the thread that executes the block; the lock is never contended and
    /// only makes the block shareable between the vars' queues.
    func: Mutex<Option<OpBody>>,
    reads: Vec<Arc<Var>>,
    writes: Vec<Arc<Var>>,
    description: Box<dyn OpDescription>,
    /// Run on the thread that finds it ready instead of hopping to a worker.
    inline: bool,
    /// A wait marker: signals a waiter, never touches data or stored errors.
    marker: bool,
    /// Set when the profiler records this op.
    profile: Option<crate::profiler::PushTag>,
}

/// A recorded op names itself through its block, which the profiler keeps until it dumps.
impl OpDescription for OprBlock {
    fn describe(&self) -> String {
        self.description.describe()
    }
    fn name(&self) -> String {
        self.description.name()
    }
    fn inputs(&self) -> String {
        self.description.inputs()
    }
    fn site(&self) -> Option<String> {
        self.description.site()
    }
}

/// What `wait_all` sleeps on, counted under one lock so that a release sees every sleeper.
#[derive(Default)]
struct Pending {
    /// Ops pushed and not yet completed.
    ops: usize,
    /// Threads inside `wait_all` waiting for `ops` to reach zero.
    waiters: usize,
}

struct Engine {
    kind: EngineKind,
    /// Ops pushed and not yet completed; `wait_all` sleeps on `idle` until it is zero. It is raised
    /// before an op registers on its vars and lowered after the op released them, so a zero count
    /// means nothing can still run; the lock pairs the count with the condvar.
    pending: Mutex<Pending>,
    idle: Condvar,
    /// Held while one op appends itself to the queues of all its vars (see [`register`]), so that
    /// the ops' order is the same on every var.
    registration: Mutex<()>,
    /// Failures since the last `wait_all` that may still be unreported; `wait_all` raises the
    /// first one still holding its error and empties them all. The lock is held only to edit the
    /// list (it encloses error cells' locks, never a var's lock).
    global_errors: Mutex<Vec<ErrorCell>>,
    /// Held for the whole of each push under the naive engine.
    naive_serial: Mutex<()>,
}

/// Threads for CPU work: `MXNET_CPU_WORKER_NTHREADS`, else `OMP_NUM_THREADS`, else every core.
pub fn configured_threads() -> usize {
    for key in ["OXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_WORKER_NTHREADS", "OMP_NUM_THREADS"] {
        if let Some(n) = std::env::var(key).ok().and_then(|v| v.trim().parse::<usize>().ok()) {
            if n > 0 {
                return n;
            }
        }
    }
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// `OXNET_ENGINE_TYPE` (or MXNet's `MXNET_ENGINE_TYPE`) = `NaiveEngine` selects the synchronous engine.
pub fn configured_kind() -> EngineKind {
    let name = std::env::var("OXNET_ENGINE_TYPE").or_else(|_| std::env::var("MXNET_ENGINE_TYPE")).unwrap_or_default();
    if name.trim() == "NaiveEngine" {
        EngineKind::Naive
    } else {
        EngineKind::Threaded
    }
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine {
        kind: configured_kind(),
        pending: Mutex::new(Pending::default()),
        idle: Condvar::new(),
        registration: Mutex::new(()),
        global_errors: Mutex::new(Vec::new()),
        naive_serial: Mutex::new(()),
    })
}

pub fn kind() -> EngineKind {
    engine().kind
}

/// Number of threads CPU kernels may use.
pub fn num_threads() -> usize {
    pool::count()
}

/// Push an operation that reads `reads` and writes `writes`.
pub fn push(func: OpFn, reads: &[Arc<Var>], writes: &[Arc<Var>], props: PushProps, description: Box<dyn OpDescription>) {
    push_body(OpBody::Sync(func), reads, writes, props, description);
}

/// Push an operation that reads `reads` and writes `writes` and signals its own completion (see
/// [`AsyncOpFn`]). Work that waits on something outside the engine (a peer process, a device) runs
/// this way without holding a worker thread, so it cannot starve the ops it waits for.
pub fn push_async(func: AsyncOpFn, reads: &[Arc<Var>], writes: &[Arc<Var>], props: PushProps, description: Box<dyn OpDescription>) {
    push_body(OpBody::Async(func), reads, writes, props, description);
}

fn push_body(func: OpBody, reads: &[Arc<Var>], writes: &[Arc<Var>], props: PushProps, description: Box<dyn OpDescription>) {
    let eng = engine();
    // The naive engine serializes pushes, so every earlier op has finished when this one
    // registers: it is always ready and runs right here.
    let _serial = (eng.kind == EngineKind::Naive).then(|| eng.naive_serial.lock().unwrap());
    let writes_dedup = unique_vars(writes, &[]);
    // A var that is both read and written is only a write dependency.
    let reads_dedup = unique_vars(reads, &writes_dedup);
    let blk = Arc::new(OprBlock {
        wait: oxnet_sync::Countdown::new(reads_dedup.len() + writes_dedup.len() + 1),
        func: Mutex::new(Some(func)),
        reads: reads_dedup,
        writes: writes_dedup,
        description,
        inline: props.inline_if_ready || eng.kind == EngineKind::Naive,
        marker: false,
        profile: crate::profiler::push_tag(),
    });
    register(blk);
}

/// `vars` without repeats and without those in `exclude`.
fn unique_vars(vars: &[Arc<Var>], exclude: &[Arc<Var>]) -> Vec<Arc<Var>> {
    let exclude: smallvec::SmallVec<[&Arc<Var>; 4]> = exclude.iter().collect();
    unique_refs(vars, &exclude).into_iter().cloned().collect()
}

/// Run `func` on the calling thread now, as an op pushed with these vars and granted at once
/// would run, when none of its vars has an op running or queued (a read may share its var with
/// running reads) and none holds an error; otherwise hand `func` back for the caller to push.
///
/// A small op that finds its inputs ready costs less this way than any queueing: no op block,
/// no boxed closure, and its description is made (by `describe`) only if it fails. The vars are
/// taken under the registration lock, all or none, so the op keeps its place in the one global
/// order (see `register`); its failure is stored on its written vars and reported at the next
/// sync point exactly as a pushed op's. Under the naive engine or while the profiler records
/// operators, it declines (a pushed op is what both of those observe).
pub fn run_if_free<F: FnOnce() -> Result<()>>(
    func: F,
    reads: &[&Arc<Var>],
    writes: &[&Arc<Var>],
    describe: impl FnOnce() -> Box<dyn OpDescription>,
) -> std::result::Result<(), F> {
    let eng = engine();
    if eng.kind == EngineKind::Naive || crate::profiler::records_ops() {
        return Err(func);
    }
    let writes = unique_refs(writes, &[]);
    let reads = unique_refs(reads, &writes);
    {
        let _registering = eng.registration.lock().unwrap();
        let wanted = writes.iter().map(|&v| (v, true)).chain(reads.iter().map(|&v| (v, false)));
        for (taken, (var, write)) in wanted.clone().enumerate() {
            if !var.try_acquire(write) {
                for (earlier, earlier_write) in wanted.take(taken) {
                    earlier.undo_acquire(earlier_write);
                }
                return Err(func);
            }
        }
    }
    // Not counted in `pending`: the op is done when this call returns, so no `wait_all` the
    // pushing thread makes can miss it, and one that another thread makes meanwhile has no order
    // with it to keep (as with an op pushed just after that wait began).
    let failure = match catch_unwind(AssertUnwindSafe(func)) {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(Error::new(crate::ErrorKind::Runtime, format!("{} (in {})", e.message, describe().describe()))),
        Err(panic) => Some(crate::err!(Runtime, "internal error: {} panicked: {}", describe().describe(), panic_message(&panic))),
    };
    for granted in release_vars(&reads, &writes, failure.map(|e| Arc::new(Mutex::new(Some(e))))) {
        on_granted(granted);
    }
    Ok(())
}

/// `vars` without repeats and without those in `exclude`, on the stack for the usual few (past
/// those, sorting keeps this linear-logarithmic for ops with thousands of inputs, such as a
/// gradient sum).
fn unique_refs<'a, V: std::borrow::Borrow<Arc<Var>>>(vars: &'a [V], exclude: &[&'a Arc<Var>]) -> smallvec::SmallVec<[&'a Arc<Var>; 4]> {
    /// Up to this many vars, pairwise comparison beats sorting.
    const FEW: usize = 8;
    let mut unique: smallvec::SmallVec<[&Arc<Var>; 4]> = smallvec::SmallVec::new();
    if vars.len() <= FEW {
        for v in vars.iter().map(V::borrow) {
            if !unique.iter().chain(exclude).any(|u| Arc::ptr_eq(u, v)) {
                unique.push(v);
            }
        }
        return unique;
    }
    unique.extend(vars.iter().map(V::borrow));
    unique.sort_unstable_by_key(|v| Arc::as_ptr(v) as usize);
    unique.dedup_by(|a, b| Arc::ptr_eq(a, b));
    unique.retain(|v| !exclude.iter().any(|x| Arc::ptr_eq(x, v)));
    unique
}

/// Enqueue `blk` on its vars and start it if every dependency was granted at once.
///
/// Invariant: an op is on the queues of all its vars before any later op appends itself to any
/// queue, so every var orders its ops by one global order (that of registration) and an op only
/// ever waits for ops registered before it; no cycle of waits can form, whatever the number of
/// pushing threads. Without it, `x: read a, write b` and `y: read b, write a` pushed at the same
/// time can each be granted its read and queue its write behind the other's read, and neither
/// ever runs. Appending in a fixed order of vars (by address) would not prevent that (both would
/// meet `a` first, `x` granted and `y` queued, then `y` granted `b` before `x` queues there)
/// unless each var's lock were held until the op is on all of them: one lock per op is cheaper
/// (uncontended, it is not measurable next to a 2x2 add) and simpler to check. Completions need
/// not take the lock: they only pop the front of a queue, which never reorders it.
fn register(blk: Arc<OprBlock>) {
    let eng = engine();
    eng.pending.lock().unwrap().ops += 1;
    let mut granted = 1;
    {
        // Held only for the queue bookkeeping, never while an op runs (a running op may push).
        let _registering = eng.registration.lock().unwrap();
        for v in &blk.reads {
            if v.append_read(&blk) {
                granted += 1;
            }
        }
        for v in &blk.writes {
            if v.append_write(&blk) {
                granted += 1;
            }
        }
    }
    // The thread that ends the count sees every grant made before it (see `Countdown`).
    if blk.wait.count_down(granted) {
        if blk.inline {
            execute(blk);
        } else {
            pool::spawn(Box::new(move || execute(blk)), pool::Order::Last);
        }
    }
}

/// Called when a var grants `blk` one of its dependencies.
fn on_granted(blk: Arc<OprBlock>) {
    // Every grant, and what the ops granting it wrote, happens before the op runs on whichever
    // thread ends the count (see `Countdown`).
    if blk.wait.count_down(1) {
        if blk.marker {
            // A wait marker only wakes its waiter: cheaper to run here than to hop threads.
            execute(blk);
        } else {
            // Ready ops released by another op's completion go to the workers' queue (running them
            // inline would recurse through long chains on the completing thread), ahead of ops
            // that were ready before: a chain runs to its end before the caller's later pushes
            // start, so a loop that pushes many steps ahead holds one step's intermediates, not
            // every step's.
            pool::spawn(Box::new(move || execute(blk)), pool::Order::First);
        }
    }
}

fn execute(blk: Arc<OprBlock>) {
    let body = blk.func.lock().unwrap().take();
    if blk.marker {
        // Released before its waiter wakes, so that what the waiter does next finds the var
        // free (an op it then runs at once, with `run_if_free`, would otherwise have to queue).
        release(&blk);
        if let Some(OpBody::Sync(f)) = body {
            let _ = f();
        }
        return;
    }
    // As in MXNet, an op does not run when what it reads, or else what it writes, holds an
    // unreported error: it fails with that error (so a later random op fails while an earlier
    // one's error is unreported: they share the generator's var).
    let inherited = blk.reads.iter().chain(&blk.writes).find_map(|v| v.unreported_error());
    match (inherited, body) {
        (Some(cell), body) => {
            if let Some(OpBody::Async(f)) = body {
                // The cell may have been reported (emptied) since it was found; the op still must
                // not run, and says why as well as it can.
                let error = cell
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or_else(|| crate::err!(Runtime, "{} did not run: an input failed earlier", blk.description.describe()));
                f(Err(error));
            }
            finish(&blk, Some(cell));
        }
        (None, Some(OpBody::Sync(f))) => {
            let failure = run_profiled(&blk, f).err().map(|e| Arc::new(Mutex::new(Some(e))));
            finish(&blk, failure);
        }
        (None, Some(OpBody::Async(f))) => {
            let completion = Completion { blk: Some(blk.clone()) };
            // A panic drops the completion (unless the work stored it before panicking), and the
            // completion's drop fails the op: nothing is left holding the vars.
            let _ = catch_unwind(AssertUnwindSafe(move || f(Ok(completion))));
        }
        (None, None) => finish(&blk, None),
    }
}

/// Ends an asynchronous op (see [`push_async`]): exactly once, by [`Completion::done`] or, if the
/// holder drops it without calling that, by the drop, which fails the op.
pub struct Completion {
    /// `Some` until the op is finished; only `done` and `drop` take it.
    blk: Option<Arc<OprBlock>>,
}

impl Completion {
    /// Finish the op: its vars are released to the ops waiting on them, and a failure is stored
    /// on what it writes, to be raised at the next sync point like any kernel's.
    pub fn done(mut self, result: Result<()>) {
        if let Some(blk) = self.blk.take() {
            let failure = result.err().map(|e| {
                let error = Error::new(crate::ErrorKind::Runtime, format!("{} (in {})", e.message, blk.description.describe()));
                Arc::new(Mutex::new(Some(error)))
            });
            finish(&blk, failure);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(blk) = self.blk.take() {
            let error = crate::err!(Runtime, "internal error: {} ended without signalling its completion", blk.description.describe());
            finish(&blk, Some(Arc::new(Mutex::new(Some(error)))));
        }
    }
}

/// Record how a (non-marker) op ended and release its vars.
fn finish(blk: &Arc<OprBlock>, failure: Option<ErrorCell>) {
    grant_and_count_done(release_vars(&blk.reads, &blk.writes, failure));
}

/// Record how an op ended on the vars it wrote (a successful write replaces the var's content,
/// so any error it held goes; a failure stays until reported) and release its vars: the ops
/// that may run now.
fn release_vars<V: std::borrow::Borrow<Arc<Var>>>(reads: &[V], writes: &[V], failure: Option<ErrorCell>) -> Vec<Arc<OprBlock>> {
    if let Some(cell) = &failure {
        let mut cells = engine().global_errors.lock().unwrap();
        // Cells already reported through a var wait need no place in the list any more.
        cells.retain(|c| c.lock().unwrap().is_some());
        if !cells.iter().any(|c| Arc::ptr_eq(c, cell)) {
            cells.push(cell.clone());
        }
    }
    let mut ready: Vec<Arc<OprBlock>> = Vec::new();
    for v in reads {
        v.borrow().complete_read(&mut ready);
    }
    for v in writes {
        v.borrow().complete_write_storing(failure.clone(), &mut ready);
    }
    ready
}

/// Hand a marker's vars to the ops waiting on them and count it as done.
fn release(blk: &Arc<OprBlock>) {
    let mut ready: Vec<Arc<OprBlock>> = Vec::new();
    for v in &blk.reads {
        v.complete_read(&mut ready);
    }
    for v in &blk.writes {
        v.complete_write(&mut ready);
    }
    grant_and_count_done(ready);
}

fn grant_and_count_done(ready: Vec<Arc<OprBlock>>) {
    for r in ready {
        on_granted(r);
    }
    let eng = engine();
    let mut pending = eng.pending.lock().unwrap();
    pending.ops -= 1;
    // Notifying costs a system call even with nobody waiting, more than a small op itself.
    if pending.ops == 0 && pending.waiters > 0 {
        eng.idle.notify_all();
    }
}

/// [`run_op`], timed for the profiler when it records this op.
fn run_profiled(blk: &Arc<OprBlock>, f: OpFn) -> Result<()> {
    let Some(tag) = &blk.profile else {
        return run_op(blk, f);
    };
    let start = crate::profiler::now_ns();
    let result = run_op(blk, f);
    crate::profiler::record_op(tag, start, crate::profiler::now_ns(), blk.clone());
    result
}

fn run_op(blk: &OprBlock, f: OpFn) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ok(()),
        // Whatever its kind, a failure seen at a later sync point is a runtime error of that op.
        Ok(Err(e)) => Err(Error::new(crate::ErrorKind::Runtime, format!("{} (in {})", e.message, blk.description.describe()))),
        Err(panic) => Err(crate::err!(Runtime, "internal error: {} panicked: {}", blk.description.describe(), panic_message(&panic))),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Block until every pending write of `var` (and, with `for_write`, every pending read too) is
/// done; return the var's unreported error, if any, which this reports (clears) everywhere.
pub fn wait_for_var(var: &Arc<Var>, for_write: bool) -> Result<()> {
    if !var.is_busy(for_write) {
        return var.take_error().map_or(Ok(()), Err);
    }
    // The flag is set once by the marker; the lock orders that write with the waiter's check.
    let signal = Arc::new((Mutex::new(false), Condvar::new()));
    let notify = signal.clone();
    let func = OpBody::Sync(Box::new(move || {
        let (done, cv) = &*notify;
        *done.lock().unwrap() = true;
        cv.notify_all();
        Ok(())
    }));
    // Queued as a reader (or writer) of the var, the marker runs only after everything it must
    // wait for; being a marker it never touches the var's data or error.
    let deps = vec![var.clone()];
    let (reads, writes) = if for_write { (vec![], deps) } else { (deps, vec![]) };
    let marker = Arc::new(OprBlock {
        wait: oxnet_sync::Countdown::new(2),
        func: Mutex::new(Some(func)),
        reads,
        writes,
        description: Box::new("WaitForVar"),
        inline: true,
        marker: true,
        profile: None,
    });
    register(marker);
    let (done, cv) = &*signal;
    let mut finished = done.lock().unwrap();
    while !*finished {
        finished = cv.wait(finished).unwrap();
    }
    drop(finished);
    var.take_error().map_or(Ok(()), Err)
}

/// Block until every pushed op has finished; return the first error not yet reported and clear
/// every unreported error (a wait on an array that failed before this returns no error).
pub fn wait_all() -> Result<()> {
    let eng = engine();
    let mut pending = eng.pending.lock().unwrap();
    while pending.ops > 0 {
        pending.waiters += 1;
        pending = eng.idle.wait(pending).unwrap();
        pending.waiters -= 1;
    }
    drop(pending);
    let cells = std::mem::take(&mut *eng.global_errors.lock().unwrap());
    let mut first = None;
    for cell in cells {
        let error = cell.lock().unwrap().take();
        first = first.or(error);
    }
    if let Some(error) = first {
        return Err(error);
    }
    // GPU ops are done for the engine once enqueued: wait for the devices to run them too.
    #[cfg(feature = "cuda")]
    crate::backend::cuda::synchronize_all()?;
    Ok(())
}

#[cfg(test)]
mod tests;
