//! The profiler (MXNet's `mx.profiler`): what every operator did, on which engine thread, when.
//!
//! While it runs, the engine stamps each operator it is handed with the time it was pushed, and
//! the thread that executes it records when it started and ended; the storage pool records the
//! bytes in use after every allocation and release; the host records API calls and its own
//! Task/Frame/Event/Counter/Marker objects. `dump` writes everything as a Chrome trace-event file
//! (chrome://tracing, Perfetto) with one lane per thread, and `aggregate_report` prints MXNet's
//! aggregate statistics table (or its JSON form).
//!
//! Cost: with the profiler off, a push reads one relaxed atomic (`ACTIVE`) and records nothing
//! (likewise an allocation, and an API call from the host). With it on, each thread appends to a
//! buffer of its own (its lock is only ever contended by a dump draining it), and everything that
//! needs text (operator names, call sites) is resolved at dump time, not on the hot path.

mod aggregate;
mod trace;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

pub use aggregate::{ReportFormat, SortBy};

use crate::engine::OpDescription;
use crate::error::Result;

/// What is recorded now, as bits of `ACTIVE`.
const IMPERATIVE_OPS: u8 = 1;
const SYMBOLIC_OPS: u8 = 2;
const MEMORY: u8 = 4;
const API: u8 = 8;
/// The host's own objects (tasks, frames, events, counters, markers): recorded whenever the
/// profiler runs and is not paused.
const OBJECTS: u8 = 16;

/// The recording switches in force: zero unless the profiler runs and is not paused. Written only
/// under the [`control`] lock; read with `Relaxed` on the hot paths, because the bits only decide
/// whether to record: an operator pushed while another thread flips them is recorded or not, and
/// either is right, while nothing else is published through this word.
static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Whether the profiler has ever been started (a dump before that is an error, as in MXNet).
static EVER_RAN: AtomicBool = AtomicBool::new(false);

/// The process-wide kvstore role being profiled (MXNet's `profile_process`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    Worker,
    Server,
}

/// MXNet's `ProfileConfigParam`, with its defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub profile_all: bool,
    pub profile_symbolic: bool,
    pub profile_imperative: bool,
    pub profile_memory: bool,
    pub profile_api: bool,
    pub filename: PathBuf,
    pub continuous_dump: bool,
    pub dump_period: f64,
    pub aggregate_stats: bool,
    pub profile_process: Process,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profile_all: false,
            profile_symbolic: true,
            profile_imperative: true,
            profile_memory: true,
            profile_api: true,
            filename: PathBuf::from("profile.json"),
            continuous_dump: true,
            dump_period: 1.0,
            aggregate_stats: false,
            profile_process: Process::Worker,
        }
    }
}

impl Config {
    /// A configuration from MXNet's `set_config(**kwargs)` pairs, their values as Python's `str`
    /// writes them; keys not given keep their defaults (as in MXNet, each call starts afresh).
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Config> {
        let mut config = Config::default();
        for (key, value) in pairs {
            let flag = || parse_bool(key, value);
            match key.as_str() {
                "profile_all" => config.profile_all = flag()?,
                "profile_symbolic" => config.profile_symbolic = flag()?,
                "profile_imperative" => config.profile_imperative = flag()?,
                "profile_memory" => config.profile_memory = flag()?,
                "profile_api" => config.profile_api = flag()?,
                "continuous_dump" => config.continuous_dump = flag()?,
                "aggregate_stats" => config.aggregate_stats = flag()?,
                "filename" => config.filename = PathBuf::from(value),
                "dump_period" => {
                    config.dump_period = value
                        .trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|p| p.is_finite() && *p > 0.0)
                        .ok_or_else(|| crate::err!(Param, "profiler config: dump_period must be a positive number of seconds, got '{value}'"))?
                }
                "profile_process" => config.profile_process = Process::from_name(value)?,
                _ => crate::bail!(
                    Param,
                    "profiler config: unknown argument '{key}'; the arguments are profile_all, profile_symbolic, profile_imperative, \
                     profile_memory, profile_api, filename, continuous_dump, dump_period, aggregate_stats, profile_process"
                ),
            }
        }
        Ok(config)
    }

    /// The `ACTIVE` bits this configuration records while running.
    fn switches(&self) -> u8 {
        let all = self.profile_all;
        let mut bits = OBJECTS;
        if all || self.profile_imperative {
            bits |= IMPERATIVE_OPS;
        }
        if all || self.profile_symbolic {
            bits |= SYMBOLIC_OPS;
        }
        if all || self.profile_memory {
            bits |= MEMORY;
        }
        if all || self.profile_api {
            bits |= API;
        }
        bits
    }
}

impl Process {
    /// MXNet's names: `worker` (this process) or `server` (a distributed kvstore's server).
    pub fn from_name(name: &str) -> Result<Process> {
        match name {
            "worker" => Ok(Process::Worker),
            "server" => crate::bail!(
                Value,
                "profiler: profile_process='server' profiles the server of a distributed kvstore (dist_sync, dist_async), \
                 which this process does not run; use 'worker'"
            ),
            _ => crate::bail!(Value, "profiler: profile_process must be 'worker' or 'server', got '{name}'"),
        }
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim() {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => crate::bail!(Param, "profiler config: {key} expects a boolean (True or False), got '{value}'"),
    }
}

/// Configuration and run state; `ACTIVE` is derived from it under this lock.
struct Control {
    config: Config,
    running: bool,
    paused: bool,
}

fn control() -> MutexGuard<'static, Control> {
    static CONTROL: OnceLock<Mutex<Control>> = OnceLock::new();
    // Every critical section leaves the state whole, so a poisoned lock is used as it is.
    CONTROL
        .get_or_init(|| Mutex::new(Control { config: Config::default(), running: false, paused: false }))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

fn publish(control: &Control) {
    let bits = if control.running && !control.paused { control.config.switches() } else { 0 };
    ACTIVE.store(bits, Ordering::Relaxed);
}

/// Configure the profiler. A new configuration starts a new trace (as a new file in MXNet):
/// what was recorded and not dumped is dropped, though its statistics are kept.
pub fn set_config(config: Config) {
    let mut s = store();
    collect(&mut s, false);
    s.events = Default::default();
    s.undumped = false;
    let mut c = control();
    c.config = config;
    publish(&c);
}

pub fn config() -> Config {
    control().config.clone()
}

/// `set_state('run')` / `set_state('stop')`. Starting also resumes a paused profiler.
pub fn set_running(running: bool) {
    let mut c = control();
    c.running = running;
    c.paused = false;
    if running {
        // Relaxed: the flag only gates `dump`, which reads it under no ordering with recording.
        EVER_RAN.store(true, Ordering::Relaxed);
    }
    publish(&c);
}

pub fn is_running() -> bool {
    control().running
}

/// `pause()` / `resume()`: while paused nothing is recorded, but the profiler stays running.
pub fn set_paused(paused: bool) {
    let mut c = control();
    c.paused = paused;
    publish(&c);
}

/// Nanoseconds since the profiler's clock started (the first call): the time base of every record.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Text that is either static or shared, so that recording never copies a string.
#[derive(Clone, Debug)]
pub(crate) enum Label {
    Static(&'static str),
    Shared(Arc<str>),
}

impl std::ops::Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Label::Static(s) => s,
            Label::Shared(s) => s,
        }
    }
}

/// How a span is drawn in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanStyle {
    /// A slice on the lane of the thread that recorded it (spans of one thread nest).
    OnThread,
    /// An asynchronous slice on a track of its own (spans may overlap freely: tasks, frames).
    Async,
}

impl SpanStyle {
    /// `thread` or `async`.
    pub fn from_name(name: &str) -> Result<SpanStyle> {
        match name {
            "thread" => Ok(SpanStyle::OnThread),
            "async" => Ok(SpanStyle::Async),
            _ => crate::bail!(Value, "profiler: span style must be 'thread' or 'async', got '{name}'"),
        }
    }
}

/// Which part of the trace an instant marker spans (MXNet's `Marker.mark(scope)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerScope {
    Global,
    Process,
    Thread,
}

impl MarkerScope {
    /// MXNet's names: `global`, `process`, `thread`, `task` and `marker` (the last two mark the
    /// calling thread, as a task runs on one thread).
    pub fn from_name(name: &str) -> Result<MarkerScope> {
        match name {
            "global" => Ok(MarkerScope::Global),
            "process" => Ok(MarkerScope::Process),
            "thread" | "task" | "marker" => Ok(MarkerScope::Thread),
            _ => crate::bail!(Value, "profiler Marker.mark: scope must be 'global', 'process', 'thread', 'task' or 'marker', got '{name}'"),
        }
    }
}

/// One operator executed by the engine.
pub(crate) struct OpRecord {
    pub pushed: u64,
    pub start: u64,
    pub end: u64,
    /// Names the operator, its inputs and where it was pushed from, resolved at dump time.
    pub op: Arc<dyn OpDescription>,
    /// The custom operator whose Python code pushed it (its name prefixes the op's).
    pub custom: Option<Arc<str>>,
    /// The `profiler.scope` it was pushed in.
    pub scope: Option<Arc<str>>,
}

pub(crate) enum Record {
    Op(OpRecord),
    Span { style: SpanStyle, category: Label, name: Label, start: u64, end: u64 },
    Counter { category: Label, name: Label, at: u64, value: i64, memory: bool },
    Marker { category: Label, name: Label, at: u64, scope: MarkerScope },
}

/// Records per chunk of a lane's buffer: a full chunk is left as it is and a new one started, so
/// that a long profile never copies what it recorded (a growing vector would, at each doubling).
const CHUNK: usize = 4096;

/// A thread's buffer of records, drained by dumps.
pub(crate) struct Lane {
    pub id: u32,
    pub name: String,
    /// Locked by the owning thread to append and by a dump to drain: uncontended otherwise.
    records: Mutex<Vec<Vec<Record>>>,
}

fn lanes() -> MutexGuard<'static, Vec<Arc<Lane>>> {
    static LANES: Mutex<Vec<Arc<Lane>>> = Mutex::new(Vec::new());
    // Registration only pushes whole entries: a poisoned lock still holds a consistent list.
    LANES.lock().unwrap_or_else(PoisonError::into_inner)
}

fn register_lane() -> Arc<Lane> {
    let mut all = lanes();
    let id = all.len() as u32;
    let thread = std::thread::current();
    let name = match thread.name() {
        Some(name) if name != "main" => name.to_string(),
        // Threads the engine did not start (the Python interpreter's) run small ready operators
        // inline, so their lanes show those operators too.
        _ => format!("host thread {id}"),
    };
    let lane = Arc::new(Lane { id, name, records: Mutex::new(Vec::new()) });
    all.push(lane.clone());
    lane
}

/// What the calling thread is inside of, as far as recording is concerned.
#[derive(Default)]
struct ThreadContext {
    lane: Option<Arc<Lane>>,
    custom: Option<Arc<str>>,
    scope: Option<Arc<str>>,
    /// Depth of symbolic graph executions running on this thread.
    symbolic: u32,
}

thread_local! {
    static CONTEXT: RefCell<ThreadContext> = RefCell::new(ThreadContext::default());
}

fn record(entry: Record) {
    // A thread that is exiting (its context already destroyed) records nothing.
    let _ = CONTEXT.try_with(|c| {
        let mut c = c.borrow_mut();
        let lane = c.lane.get_or_insert_with(register_lane);
        let mut chunks = lane.records.lock().unwrap_or_else(PoisonError::into_inner);
        match chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(entry),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(entry);
                chunks.push(chunk);
            }
        }
    });
}

/// What the engine keeps with a pushed operator while the profiler runs.
#[derive(Debug)]
pub(crate) struct PushTag {
    pushed: u64,
    custom: Option<Arc<str>>,
    scope: Option<Arc<str>>,
}

/// Called by every push: `None` (after one relaxed load) unless operators are being recorded.
#[inline]
/// Whether pushed operators are being recorded (imperative or symbolic).
pub(crate) fn records_ops() -> bool {
    ACTIVE.load(Ordering::Relaxed) & (IMPERATIVE_OPS | SYMBOLIC_OPS) != 0
}

pub(crate) fn push_tag() -> Option<PushTag> {
    let active = ACTIVE.load(Ordering::Relaxed);
    if active & (IMPERATIVE_OPS | SYMBOLIC_OPS) == 0 {
        return None;
    }
    tag_pushed_op(active)
}

#[cold]
fn tag_pushed_op(active: u8) -> Option<PushTag> {
    CONTEXT
        .try_with(|c| {
            let c = c.borrow();
            let wanted = if c.symbolic > 0 { SYMBOLIC_OPS } else { IMPERATIVE_OPS };
            (active & wanted != 0).then(|| PushTag { pushed: now_ns(), custom: c.custom.clone(), scope: c.scope.clone() })
        })
        .ok()
        .flatten()
}

/// Record an operator that ran from `start` to `end` on the calling thread.
pub(crate) fn record_op(tag: &PushTag, start: u64, end: u64, op: Arc<dyn OpDescription>) {
    record(Record::Op(OpRecord { pushed: tag.pushed, start, end, op, custom: tag.custom.clone(), scope: tag.scope.clone() }));
}

/// The storage pool's bytes in use on `device` changed to `bytes`.
#[inline]
pub(crate) fn memory_in_use(device: &'static str, bytes: u64) {
    if ACTIVE.load(Ordering::Relaxed) & MEMORY != 0 {
        record(Record::Counter {
            category: Label::Static("Device Storage"),
            name: Label::Static(device),
            at: now_ns(),
            value: bytes as i64,
            memory: true,
        });
    }
}

/// Record a span of the host's (a task, frame or event object) that ran from `start` to `end`.
pub fn record_span(style: SpanStyle, category: &str, name: &str, start: u64, end: u64) {
    if ACTIVE.load(Ordering::Relaxed) & OBJECTS != 0 {
        record(Record::Span { style, category: Label::Shared(category.into()), name: Label::Shared(name.into()), start, end });
    }
}

/// Record the new value of a counter object of the host's.
pub fn record_counter(category: &str, name: &str, value: i64) {
    if ACTIVE.load(Ordering::Relaxed) & OBJECTS != 0 {
        record(Record::Counter { category: Label::Shared(category.into()), name: Label::Shared(name.into()), at: now_ns(), value, memory: false });
    }
}

/// Record an instant marker.
pub fn record_marker(category: &str, name: &str, scope: MarkerScope) {
    if ACTIVE.load(Ordering::Relaxed) & OBJECTS != 0 {
        record(Record::Marker { category: Label::Shared(category.into()), name: Label::Shared(name.into()), at: now_ns(), scope });
    }
}

/// Set the calling thread's profiler scope (MXNet's `profiler.scope`), which operators pushed
/// from it carry in the trace; returns the previous one.
pub fn set_scope(scope: Option<&str>) -> Option<String> {
    CONTEXT.with(|c| std::mem::replace(&mut c.borrow_mut().scope, scope.map(Arc::from))).map(|s| s.to_string())
}

/// An API call of the host in progress (MXNet's `MXNET_C_API` entries); recorded when dropped.
pub struct ApiCall {
    name: &'static str,
    start: u64,
}

/// Start timing the API call `name` if API calls are being recorded.
#[inline]
pub fn api_call(name: &'static str) -> Option<ApiCall> {
    (ACTIVE.load(Ordering::Relaxed) & API != 0).then(|| ApiCall { name, start: now_ns() })
}

impl Drop for ApiCall {
    fn drop(&mut self) {
        let end = now_ns();
        record(Record::Span {
            style: SpanStyle::OnThread,
            category: Label::Static("MXNET_C_API"),
            name: Label::Static(self.name),
            start: self.start,
            end,
        });
    }
}

/// A symbolic graph execution in progress: operators it pushes count as symbolic
/// (`profile_symbolic`) rather than imperative.
pub struct SymbolicSection(());

#[inline]
pub fn symbolic_section() -> Option<SymbolicSection> {
    if ACTIVE.load(Ordering::Relaxed) & (IMPERATIVE_OPS | SYMBOLIC_OPS) == 0 {
        return None;
    }
    CONTEXT.try_with(|c| c.borrow_mut().symbolic += 1).ok().map(|()| SymbolicSection(()))
}

impl Drop for SymbolicSection {
    fn drop(&mut self) {
        let _ = CONTEXT.try_with(|c| c.borrow_mut().symbolic -= 1);
    }
}

/// The host code of a custom operator running on this thread (MXNet's custom-op profiler):
/// recorded as `<name>::pure_python` in the "Custom Operator" domain, and operators it pushes
/// are named `<name>::<op>` there.
pub struct CustomOpSection {
    name: Arc<str>,
    previous: Option<Arc<str>>,
    start: u64,
}

/// Enter custom operator `name()` if operators are being recorded (the name is built only then).
#[inline]
pub fn custom_op_section(name: impl FnOnce() -> String) -> Option<CustomOpSection> {
    if ACTIVE.load(Ordering::Relaxed) & (IMPERATIVE_OPS | SYMBOLIC_OPS) == 0 {
        return None;
    }
    let name: Arc<str> = name().into();
    let previous = CONTEXT.try_with(|c| c.borrow_mut().custom.replace(name.clone())).ok()?;
    Some(CustomOpSection { name, previous, start: now_ns() })
}

impl Drop for CustomOpSection {
    fn drop(&mut self) {
        let end = now_ns();
        let _ = CONTEXT.try_with(|c| c.borrow_mut().custom = self.previous.take());
        record(Record::Span {
            style: SpanStyle::OnThread,
            category: Label::Static(CUSTOM_OPERATOR),
            name: Label::Shared(format!("{}::pure_python", self.name).into()),
            start: self.start,
            end,
        });
    }
}

/// MXNet's domain of custom operators and what their Python code runs.
const CUSTOM_OPERATOR: &str = "Custom Operator";

/// The trace since the last finishing dump (serialized), and the aggregate statistics.
/// Lock order: the store, then the control, then the list of lanes, then one lane.
struct Store {
    events: trace::EventText,
    /// Events were recorded since the last dump.
    undumped: bool,
    aggregate: aggregate::Aggregate,
}

fn store() -> MutexGuard<'static, Store> {
    static STORE: OnceLock<Mutex<Store>> = OnceLock::new();
    // Each critical section leaves the store whole, so a poisoned lock is used as it is.
    STORE
        .get_or_init(|| Mutex::new(Store { events: Default::default(), undumped: false, aggregate: Default::default() }))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Move every lane's new records into the store's statistics (when they are kept) and, with
/// `keep_trace`, into its trace.
fn collect(store: &mut Store, keep_trace: bool) {
    let aggregate_stats = control().config.aggregate_stats;
    let all: Vec<Arc<Lane>> = lanes().clone();
    let mut drained: Vec<(u32, Record)> = Vec::new();
    for lane in all {
        let chunks = std::mem::take(&mut *lane.records.lock().unwrap_or_else(PoisonError::into_inner));
        drained.extend(chunks.into_iter().flatten().map(|r| (lane.id, r)));
    }
    if aggregate_stats {
        for (_, record) in &drained {
            store.aggregate.add(record);
        }
    }
    if keep_trace && !drained.is_empty() {
        store.events.append(&drained);
        store.undumped = true;
    }
}

/// The trace since the last finishing dump, as Chrome trace-event JSON.
pub fn trace() -> String {
    let mut s = store();
    collect(&mut s, true);
    let lanes: Vec<Arc<Lane>> = lanes().clone();
    s.events.document(&lanes)
}

/// Write the trace since the last finishing dump to the configured file (MXNet's `dump`);
/// `finished` also starts a new trace afterwards. Returns the file written.
pub fn dump(finished: bool) -> Result<PathBuf> {
    let filename = control().config.filename.clone();
    if !EVER_RAN.load(Ordering::Relaxed) {
        crate::bail!(Value, "profiler.dump: the profiler has not run; configure it with set_config and start it with set_state('run') first");
    }
    let mut s = store();
    collect(&mut s, true);
    let lanes: Vec<Arc<Lane>> = lanes().clone();
    let text = s.events.document(&lanes);
    crate::io::file::write_file(&filename, text.as_bytes()).map_err(|e| e.context("profiler.dump"))?;
    s.undumped = false;
    if finished {
        s.events = Default::default();
    }
    Ok(filename)
}

/// Write the trace at exit when events were recorded since the last dump and the configuration
/// asks for continuous dumps (as MXNet's profiler does when the process ends).
pub fn dump_pending_at_exit() -> Result<()> {
    let continuous = control().config.continuous_dump;
    set_running(false);
    let undumped = {
        let mut s = store();
        collect(&mut s, true);
        s.undumped
    };
    if continuous && undumped {
        dump(true)?;
    }
    Ok(())
}

/// MXNet's aggregate statistics (`dumps`): empty unless `aggregate_stats` is configured.
pub fn aggregate_report(reset: bool, format: ReportFormat, sort_by: SortBy, ascending: bool) -> String {
    let mut s = store();
    collect(&mut s, true);
    let report = if control().config.aggregate_stats { s.aggregate.report(format, sort_by, ascending) } else { String::new() };
    if reset {
        s.aggregate = aggregate::Aggregate::default();
    }
    report
}

#[cfg(test)]
mod tests;
