use super::*;
use crate::engine::{self, PushProps, Var};
use serde_json::Value;
use std::time::Duration;

/// The profiler is process-wide: its tests take turns (other tests' operators may still be
/// recorded meanwhile, so every check looks only at names of its own).
static TURN: Mutex<()> = Mutex::new(());

fn start(aggregate_stats: bool) -> MutexGuard<'static, ()> {
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    set_config(Config { profile_all: true, aggregate_stats, ..Config::default() });
    let _ = aggregate_report(true, ReportFormat::Table, SortBy::Total, false);
    set_running(true);
    turn
}

fn push_sleeping(name: &str, millis: u64) -> Arc<Var> {
    let var = Var::new();
    engine::push(
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(millis));
            Ok(())
        }),
        &[],
        std::slice::from_ref(&var),
        PushProps::default(),
        Box::new(name.to_string()),
    );
    var
}

fn op_slices<'a>(trace: &'a Value, name: &str) -> Vec<&'a Value> {
    trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == name && e["ph"] == "X").collect()
}

#[test]
fn nothing_is_recorded_while_stopped() {
    let _turn = start(false);
    set_running(false);
    assert!(push_tag().is_none());
    assert!(api_call("MXNDArrayWaitAll").is_none());
    let var = push_sleeping("profiler-test-stopped", 0);
    engine::wait_for_var(&var, true).unwrap();
    let trace: Value = serde_json::from_str(&trace()).unwrap();
    assert!(op_slices(&trace, "profiler-test-stopped").is_empty());
}

/// Two independent long operators pushed back to back run at the same time on two workers, and
/// the trace shows them on two lanes, overlapping.
#[test]
fn independent_operators_overlap_on_two_worker_lanes() {
    if engine::num_threads() < 2 {
        return; // one worker cannot run two operators at once
    }
    let _turn = start(true);
    // Each op waits (up to 5 s) until the other has started, then sleeps: they overlap as soon as
    // the pool has two threads free, even while other tests keep it busy for a while.
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let meeting = |name: &str| {
        let var = Var::new();
        let arrived = arrived.clone();
        engine::push(
            Box::new(move || {
                arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while arrived.load(std::sync::atomic::Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(60));
                Ok(())
            }),
            &[],
            std::slice::from_ref(&var),
            PushProps::default(),
            Box::new(name.to_string()),
        );
        var
    };
    let first = meeting("profiler-test-long-a");
    let second = meeting("profiler-test-long-b");
    engine::wait_for_var(&first, true).unwrap();
    engine::wait_for_var(&second, true).unwrap();
    set_running(false);
    let trace: Value = serde_json::from_str(&trace()).unwrap();
    let a = op_slices(&trace, "profiler-test-long-a");
    let b = op_slices(&trace, "profiler-test-long-b");
    assert_eq!((a.len(), b.len()), (1, 1));
    let span = |e: &Value| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap());
    let ((a_start, a_end), (b_start, b_end)) = (span(a[0]), span(b[0]));
    assert!(a_end - a_start >= 60e3 && b_end - b_start >= 60e3, "an operator is shorter than its sleep");
    assert!(a_start < b_end && b_start < a_end, "the two operators did not overlap: {a:?} {b:?}");
    assert_ne!(a[0]["tid"], b[0]["tid"]);
    let lane_names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name" && (e["tid"] == a[0]["tid"] || e["tid"] == b[0]["tid"]))
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(lane_names.len() == 2 && lane_names.iter().all(|n| n.starts_with("oxnet-cpu-")), "{lane_names:?}");

    let report: Value = serde_json::from_str(&aggregate_report(false, ReportFormat::Json, SortBy::Total, false)).unwrap();
    let entry = &report["Time"]["operator"]["profiler-test-long-a"];
    assert_eq!(entry["Count"], 1);
    assert!(entry["Total"].as_f64().unwrap() >= 60.0, "{entry}");
    assert_eq!(report["Unit"]["Time"], "ms");
}

#[test]
fn table_has_mxnet_layout_and_sorts_within_a_domain() {
    let _turn = start(true);
    record_span(SpanStyle::OnThread, "profiler-test-domain", "short", 0, 1_000_000);
    for _ in 0..3 {
        record_span(SpanStyle::OnThread, "profiler-test-domain", "long", 0, 5_000_000);
    }
    record_counter("profiler-test-domain", "level", 7);
    set_running(false);
    let table = aggregate_report(false, ReportFormat::Table, SortBy::Count, true);
    let block: Vec<&str> = table.lines().skip_while(|l| *l != "profiler-test-domain").take_while(|l| !l.is_empty()).collect();
    assert_eq!(block[1], "=================");
    assert_eq!(block[2], "Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)");
    assert_eq!(block[3], "----                          -----------        ---------    -------------    -------------    -------------");
    // Ascending by count: the counter and the short span once each (ties by name), the long span thrice.
    assert!(block[4].starts_with("level ") && block[5].starts_with("short ") && block[6].starts_with("long "), "{block:#?}");
    assert_eq!(block[6], "long                                    3          15.0000           5.0000           5.0000           5.0000");
}

#[test]
fn config_keeps_mxnet_defaults_and_rejects_unknown_keys() {
    let pairs = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    let config = Config::from_pairs(&pairs(&[("profile_symbolic", "True"), ("filename", "x.json")])).unwrap();
    assert!(config.profile_imperative && config.profile_memory && config.continuous_dump && !config.aggregate_stats);
    assert_eq!(config.filename, PathBuf::from("x.json"));
    let err = Config::from_pairs(&pairs(&[("bogus", "1")])).unwrap_err();
    assert!(err.message.contains("unknown argument 'bogus'"), "{}", err.message);
    assert!(Config::from_pairs(&pairs(&[("profile_api", "maybe")])).is_err());
}
