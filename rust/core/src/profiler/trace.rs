//! The Chrome trace-event document (chrome://tracing, Perfetto, speedscope).
//!
//! One process (this one) with one lane per thread that recorded something: the engine's workers
//! (`oxnet-cpu-N`) and the host threads that ran small operators inline. Each operator is a
//! complete slice (`X`) on the lane that ran it, carrying its inputs, where Python pushed it from
//! and how long it waited in the engine; a wait of a microsecond or more is also drawn as an
//! asynchronous slice from push to start (`b`/`e`, category "engine wait"). Storage in use is a
//! counter per device.
//!
//! Records are serialized once, when a dump first sees them, and kept as text: a continuous dump
//! appends what is new instead of re-encoding everything.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Lane, MarkerScope, Record, SpanStyle, CUSTOM_OPERATOR};

/// Microseconds (the trace's unit) from the profiler clock's nanoseconds.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Serialized events, each preceded by a separator, and the next id of an asynchronous slice.
#[derive(Default)]
pub(crate) struct EventText {
    text: String,
    next_async_id: u64,
}

impl EventText {
    fn push(&mut self, event: Value) {
        self.text.push_str(",\n");
        self.text.push_str(&event.to_string());
    }

    fn async_id(&mut self) -> String {
        self.next_async_id += 1;
        format!("0x{:x}", self.next_async_id)
    }

    /// Serialize `records` (recorded on the lanes their ids name) after what is there.
    pub fn append(&mut self, records: &[(u32, Record)]) {
        let pid = std::process::id();
        for (tid, record) in records {
            let tid = *tid;
            match record {
                Record::Op(op) => {
                    let (category, name) = match &op.custom {
                        Some(custom) => (CUSTOM_OPERATOR, format!("{custom}::{}", op.op.name())),
                        None => ("operator", op.op.name()),
                    };
                    let waited = op.start.saturating_sub(op.pushed);
                    let mut args = serde_json::Map::new();
                    args.insert("inputs".into(), Value::from(op.op.inputs()));
                    if let Some(site) = op.op.site() {
                        args.insert("pushed from".into(), Value::from(site));
                    }
                    args.insert("waited in engine (us)".into(), json!(micros(waited)));
                    if let Some(scope) = &op.scope {
                        args.insert("scope".into(), Value::from(scope.as_ref()));
                    }
                    self.push(json!({
                        "name": name, "cat": category, "ph": "X", "pid": pid, "tid": tid,
                        "ts": micros(op.start), "dur": micros(op.end.saturating_sub(op.start)), "args": args,
                    }));
                    // Waits under a microsecond (a ready operator run at once) would only clutter.
                    if waited >= 1_000 {
                        let id = self.async_id();
                        self.push(json!({"name": name, "cat": "engine wait", "ph": "b", "id": id, "pid": pid, "tid": tid, "ts": micros(op.pushed)}));
                        self.push(json!({"name": name, "cat": "engine wait", "ph": "e", "id": id, "pid": pid, "tid": tid, "ts": micros(op.start)}));
                    }
                }
                Record::Span { style, category, name, start, end } => match style {
                    SpanStyle::OnThread => self.push(json!({
                        "name": &**name, "cat": &**category, "ph": "X", "pid": pid, "tid": tid,
                        "ts": micros(*start), "dur": micros(end.saturating_sub(*start)),
                    })),
                    SpanStyle::Async => {
                        let id = self.async_id();
                        self.push(json!({"name": &**name, "cat": &**category, "ph": "b", "id": id, "pid": pid, "tid": tid, "ts": micros(*start)}));
                        self.push(json!({"name": &**name, "cat": &**category, "ph": "e", "id": id, "pid": pid, "tid": tid, "ts": micros(*end)}));
                    }
                },
                Record::Counter { category, name, at, value, .. } => self.push(json!({
                    "name": &**name, "cat": &**category, "ph": "C", "pid": pid, "tid": tid, "ts": micros(*at), "args": {&**name: value},
                })),
                Record::Marker { category, name, at, scope } => {
                    let s = match scope {
                        MarkerScope::Global => "g",
                        MarkerScope::Process => "p",
                        MarkerScope::Thread => "t",
                    };
                    self.push(json!({"name": &**name, "cat": &**category, "ph": "i", "s": s, "pid": pid, "tid": tid, "ts": micros(*at)}));
                }
            }
        }
    }

    /// The whole document: the process's and lanes' names, then the events.
    pub fn document(&self, lanes: &[Arc<Lane>]) -> String {
        let pid = std::process::id();
        let mut metadata = vec![json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": format!("oxnet (pid {pid})")}})];
        for lane in lanes {
            metadata.push(json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane.id, "args": {"name": lane.name}}));
            metadata.push(json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": lane.id, "args": {"sort_index": lane.id}}));
        }
        let metadata: Vec<String> = metadata.iter().map(Value::to_string).collect();
        let mut text = String::with_capacity(self.text.len() + 4096);
        text.push_str("{\n\"traceEvents\": [\n");
        text.push_str(&metadata.join(",\n"));
        text.push_str(&self.text);
        text.push_str("\n],\n\"displayTimeUnit\": \"ms\"\n}\n");
        text
    }
}
