//! A program that already runs a rayon pool hands it to the engine: operations and kernels' loops
//! then run on the program's threads (one set of threads for both). Its own test binary, because
//! the engine's pool is chosen once per process.

use std::sync::{Arc, Mutex};

use oxnet::engine::{self, EngineConfig, PushProps, Var};

#[test]
fn the_engine_runs_on_the_pool_the_program_hands_it() {
    let pool = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(3).thread_name(|i| format!("embedder-{i}")).build().unwrap());
    engine::configure(EngineConfig { threads: None, pool: Some(pool) }).unwrap();
    assert_eq!(engine::num_threads(), 3);

    let ran_on = Arc::new(Mutex::new(Vec::new()));
    let var = Var::new();
    for _ in 0..8 {
        let ran_on = ran_on.clone();
        let op = move || {
            let name = std::thread::current().name().unwrap_or("").to_string();
            // A kernel's parallel loop inside the op runs on the same pool.
            let loop_threads = engine::parallel::map(4, |_| std::thread::current().name().unwrap_or("").to_string());
            ran_on.lock().unwrap().push((name, loop_threads));
            Ok(())
        };
        engine::push(Box::new(op), &[], std::slice::from_ref(&var), PushProps { inline_if_ready: false }, Box::new("probe".to_string()));
    }
    engine::wait_for_var(&var, true).unwrap();
    let ran_on = ran_on.lock().unwrap();
    assert_eq!(ran_on.len(), 8);
    for (op_thread, loop_threads) in ran_on.iter() {
        assert!(op_thread.starts_with("embedder-"), "an op ran on {op_thread:?}");
        assert!(loop_threads.iter().all(|t| t.starts_with("embedder-")), "a loop task ran on {loop_threads:?}");
    }

    let late = engine::configure(EngineConfig::default()).unwrap_err();
    assert!(late.message.contains("already exists"), "{}", late.message);
}
