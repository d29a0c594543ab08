//! `mx.profiler`: configuration, state, dumps and the host's profiling objects, delegated to the
//! core's profiler.

use oxnet::profiler::{self, MarkerScope, ReportFormat, SortBy, SpanStyle};
use pyo3::prelude::*;

use crate::errors::IntoPyResult;

/// `set_config(**kwargs)`, the values as `str()` writes them.
#[pyfunction]
fn profiler_set_config(pairs: Vec<(String, String)>) -> PyResult<()> {
    profiler::set_config(profiler::Config::from_pairs(&pairs).py()?);
    Ok(())
}

#[pyfunction]
fn profiler_set_state(running: bool) {
    profiler::set_running(running);
}

#[pyfunction]
fn profiler_set_paused(paused: bool) {
    profiler::set_paused(paused);
}

/// Writes the trace file (resolving the Python call sites of operators, under the GIL held here).
#[pyfunction]
fn profiler_dump(finished: bool) -> PyResult<String> {
    Ok(profiler::dump(finished).py()?.display().to_string())
}

#[pyfunction]
fn profiler_dump_at_exit() -> PyResult<()> {
    profiler::dump_pending_at_exit().py()
}

#[pyfunction]
fn profiler_dumps(reset: bool, format: &str, sort_by: &str, ascending: bool) -> PyResult<String> {
    let format = ReportFormat::from_name(format).py()?;
    let sort_by = SortBy::from_name(sort_by).py()?;
    Ok(profiler::aggregate_report(reset, format, sort_by, ascending))
}

/// The profiler clock, in nanoseconds.
#[pyfunction]
fn profiler_now() -> u64 {
    profiler::now_ns()
}

/// A span of a host object: `style` is "thread" (a slice on the caller's lane) or "async".
#[pyfunction]
fn profiler_record_span(style: &str, category: &str, name: &str, start: u64, end: u64) -> PyResult<()> {
    profiler::record_span(SpanStyle::from_name(style).py()?, category, name, start, end);
    Ok(())
}

#[pyfunction]
fn profiler_record_counter(category: &str, name: &str, value: i64) {
    profiler::record_counter(category, name, value);
}

#[pyfunction]
fn profiler_record_marker(category: &str, name: &str, scope: &str) -> PyResult<()> {
    profiler::record_marker(category, name, MarkerScope::from_name(scope).py()?);
    Ok(())
}

/// Set the calling thread's profiler scope; returns the previous one.
#[pyfunction]
#[pyo3(signature = (scope=None))]
fn profiler_set_scope(scope: Option<String>) -> Option<String> {
    profiler::set_scope(scope.as_deref())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(profiler_set_config, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_set_state, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_set_paused, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_dump, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_dump_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_now, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_record_span, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_record_counter, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_record_marker, m)?)?;
    m.add_function(wrap_pyfunction!(profiler_set_scope, m)?)?;
    Ok(())
}
