use super::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

fn cells(n: usize) -> (Vec<Arc<AtomicI64>>, Vec<Arc<Var>>) {
    ((0..n).map(|i| Arc::new(AtomicI64::new(i as i64))).collect(), (0..n).map(|_| Var::new()).collect())
}

/// Push `cells[w] = g(cells[reads...], cells[w])`, done as a racy load-then-store that only gives
/// the sequential answer if the engine orders conflicting ops correctly.
fn push_update(cells: &[Arc<AtomicI64>], vars: &[Arc<Var>], reads: &[usize], w: usize, salt: i64, spin: bool) {
    let rc: Vec<Arc<AtomicI64>> = reads.iter().map(|&r| cells[r].clone()).collect();
    let wc = cells[w].clone();
    let rv: Vec<Arc<Var>> = reads.iter().map(|&r| vars[r].clone()).collect();
    push(
        Box::new(move || {
            let mut acc = wc.load(Ordering::Relaxed).wrapping_mul(31).wrapping_add(salt);
            for c in &rc {
                acc = acc.wrapping_mul(17).wrapping_add(c.load(Ordering::Relaxed));
            }
            if spin {
                std::thread::sleep(Duration::from_micros(50));
            }
            wc.store(acc % 1_000_003, Ordering::Relaxed);
            Ok(())
        }),
        &rv,
        &[vars[w].clone()],
        PushProps::default(),
        Box::new("update"),
    );
}

/// Tests share the global engine, so they wait on their own vars, never on wait_all's error list.
fn wait_vars(vars: &[Arc<Var>]) {
    for v in vars {
        wait_for_var(v, true).unwrap();
    }
}

fn sequential(n: usize, ops: &[(Vec<usize>, usize, i64)]) -> Vec<i64> {
    let mut v: Vec<i64> = (0..n as i64).collect();
    for (reads, w, salt) in ops {
        let mut acc = v[*w].wrapping_mul(31).wrapping_add(*salt);
        for &r in reads {
            acc = acc.wrapping_mul(17).wrapping_add(v[r]);
        }
        v[*w] = acc % 1_000_003;
    }
    v
}

#[test]
fn read_after_write_and_write_after_read_are_ordered() {
    let (c, v) = cells(3);
    // c1 = f(c0, c1); c0 = f(c0) must not overtake the read of c0; c2 = f(c1, c2) must see new c1.
    let ops = vec![(vec![0], 1, 5), (vec![], 0, 7), (vec![1], 2, 9), (vec![0, 2], 1, 3)];
    for (r, w, s) in &ops {
        push_update(&c, &v, r, *w, *s, true);
    }
    wait_vars(&v);
    let got: Vec<i64> = c.iter().map(|x| x.load(Ordering::Relaxed)).collect();
    assert_eq!(got, sequential(3, &ops));
}

/// A xorshift generator: the random tests draw the same ops on every run.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed.max(1);
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[test]
fn randomized_stress_matches_sequential_reference() {
    let n = 12;
    let (c, v) = cells(n);
    let mut next = xorshift(0x9E3779B97F4A7C15);
    let mut ops = Vec::new();
    for i in 0..3000 {
        let w = (next() % n as u64) as usize;
        let nr = (next() % 4) as usize;
        let reads: Vec<usize> = (0..nr).map(|_| (next() % n as u64) as usize).collect();
        ops.push((reads, w, i as i64));
    }
    for (r, w, s) in &ops {
        push_update(&c, &v, r, *w, *s, false);
    }
    wait_vars(&v);
    let got: Vec<i64> = c.iter().map(|x| x.load(Ordering::Relaxed)).collect();
    assert_eq!(got, sequential(n, &ops));
}

/// A var of the multi-threaded stress test and the state the engine guards with it.
struct SharedCell {
    var: Arc<Var>,
    /// Ops inside the cell now: readers count up, a writer sets `WRITER`. Checks the engine's
    /// exclusion directly (AcqRel/Acquire: each op sees the exits of the ops before it).
    occupancy: AtomicUsize,
    /// The content: a hash chain over the writes it received, read and written with Relaxed
    /// load-then-store, so it comes out right only if the engine orders the ops that touch it.
    value: AtomicU64,
    /// Writes received so far: the version an op sees.
    version: AtomicUsize,
    /// The ids of the ops that wrote the cell, in the order they ran.
    writers: Mutex<Vec<usize>>,
}

const WRITER: usize = 1 << 32;

/// One op of the stress test: reads and writes cells of the pool (a cell in both is read and
/// written, as `x += y`); it records what it saw in `seen[id]`.
struct StressOp {
    reads: Vec<usize>,
    writes: Vec<usize>,
}

/// What an op saw of each cell it touched: (cell, version, value), cells in ascending order.
type Seen = Vec<(usize, usize, u64)>;

fn mix(hash: u64, x: u64) -> u64 {
    (hash ^ x).wrapping_mul(0x100000001B3).rotate_left(29)
}

/// The value a write leaves: a function of the cell's old value, the op and everything it saw.
fn written_value(old: u64, id: usize, seen: &Seen) -> u64 {
    seen.iter().fold(mix(old, id as u64), |h, &(cell, _, value)| mix(mix(h, cell as u64), value))
}

fn touched(op: &StressOp) -> Vec<usize> {
    let mut cells: Vec<usize> = op.reads.iter().chain(&op.writes).copied().collect();
    cells.sort_unstable();
    cells.dedup();
    cells
}

fn run_stress_op(pool: &[SharedCell], op: &StressOp, id: usize) -> std::result::Result<Seen, String> {
    let cells = touched(op);
    let is_written = |c: &usize| op.writes.contains(c);
    for c in &cells {
        let occupancy = &pool[*c].occupancy;
        let clash = if is_written(c) {
            occupancy.compare_exchange(0, WRITER, Ordering::AcqRel, Ordering::Acquire).err()
        } else {
            Some(occupancy.fetch_add(1, Ordering::AcqRel)).filter(|before| before & WRITER != 0)
        };
        if let Some(before) = clash {
            return Err(format!("op {id} entered cell {c} while it held {before:#x} (readers, or WRITER)"));
        }
    }
    let seen: Seen = cells.iter().map(|&c| (c, pool[c].version.load(Ordering::Relaxed), pool[c].value.load(Ordering::Relaxed))).collect();
    if id.is_multiple_of(16) {
        std::thread::yield_now(); // widen the window in which a wrongly granted op would overlap
    }
    for &(c, version, old) in seen.iter().filter(|(c, _, _)| is_written(c)) {
        pool[c].value.store(written_value(old, id, &seen), Ordering::Relaxed);
        pool[c].version.store(version + 1, Ordering::Relaxed);
        pool[c].writers.lock().unwrap().push(id);
    }
    for c in &cells {
        if is_written(c) {
            pool[*c].occupancy.store(0, Ordering::Release);
        } else {
            pool[*c].occupancy.fetch_sub(1, Ordering::Release);
        }
    }
    Ok(seen)
}

/// Replays the ops in an order that puts every op after the writes it saw and before the write
/// that followed them on each cell, and after the op its thread pushed before it; checks that
/// such an order exists (the run was serializable), that every op saw what it sees in the
/// replay, and that every cell ends with the replay's value. Per-cell order is all that fixes
/// the result, so any such order gives the same replay.
fn check_against_sequential_replay(ops: &[StressOp], seen: &[Seen], pool: &[SharedCell], per_thread: usize) {
    let writers: Vec<Vec<usize>> = pool.iter().map(|c| c.writers.lock().unwrap().clone()).collect();
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
    for (id, op_seen) in seen.iter().enumerate() {
        if id % per_thread != 0 {
            successors[id - 1].push(id); // its thread pushed `id - 1` first
        }
        for &(cell, version, _) in op_seen {
            let log = &writers[cell];
            assert!(version <= log.len(), "op {id} saw version {version} of cell {cell}, written {} times", log.len());
            if version > 0 {
                successors[log[version - 1]].push(id);
            }
            if !ops[id].writes.contains(&cell) && version < log.len() {
                successors[id].push(log[version]);
            }
            if ops[id].writes.contains(&cell) {
                assert_eq!(log.get(version), Some(&id), "cell {cell}: op {id} wrote version {version} out of turn");
            }
        }
    }
    let mut unmet = vec![0usize; ops.len()];
    for s in successors.iter().flatten() {
        unmet[*s] += 1;
    }
    let mut ready: VecDeque<usize> = (0..ops.len()).filter(|&id| unmet[id] == 0).collect();
    let mut state: Vec<(usize, u64)> = (0..pool.len()).map(|c| (0, c as u64)).collect();
    let mut replayed = 0;
    while let Some(id) = ready.pop_front() {
        let expected: Seen = touched(&ops[id]).into_iter().map(|c| (c, state[c].0, state[c].1)).collect();
        assert_eq!(seen[id], expected, "op {id} saw other data than in the sequential replay");
        for &c in &ops[id].writes {
            state[c] = (state[c].0 + 1, written_value(state[c].1, id, &expected));
        }
        replayed += 1;
        for &s in &successors[id] {
            unmet[s] -= 1;
            if unmet[s] == 0 {
                ready.push_back(s);
            }
        }
    }
    assert_eq!(replayed, ops.len(), "the per-var orders contradict each other: no sequential order explains the run");
    for (c, cell) in pool.iter().enumerate() {
        assert_eq!(cell.value.load(Ordering::Relaxed), state[c].1, "cell {c} ends with another value than the replay");
    }
}

/// Eight threads push random ops over a small pool of shared vars (and now and then wait on one,
/// as a reader or a writer): every push finishes, no op overlaps a conflicting one, and the run
/// equals a sequential replay of the ops in each var's push order.
#[test]
fn randomized_stress_from_eight_threads_matches_a_sequential_replay() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 1500;
    const CELLS: usize = 6;
    let pool: Arc<Vec<SharedCell>> = Arc::new(
        (0..CELLS)
            .map(|c| SharedCell {
                var: Var::new(),
                occupancy: AtomicUsize::new(0),
                value: AtomicU64::new(c as u64),
                version: AtomicUsize::new(0),
                writers: Mutex::new(Vec::new()),
            })
            .collect(),
    );
    let mut next = xorshift(0x2545F4914F6CDD1D);
    let ops: Arc<Vec<StressOp>> = Arc::new(
        (0..THREADS * PER_THREAD)
            .map(|_| {
                let mut pick = |most: u64| -> Vec<usize> { (0..next() % (most + 1)).map(|_| (next() % CELLS as u64) as usize).collect() };
                let (mut reads, mut writes) = (pick(3), pick(2));
                if writes.is_empty() && !next().is_multiple_of(4) {
                    writes.push((next() % CELLS as u64) as usize); // mostly writers: readers alone change nothing
                }
                if reads.is_empty() && writes.is_empty() {
                    reads.push((next() % CELLS as u64) as usize);
                }
                writes.sort_unstable();
                writes.dedup();
                StressOp { reads, writes }
            })
            .collect(),
    );
    let seen: Arc<Vec<Mutex<Seen>>> = Arc::new((0..ops.len()).map(|_| Mutex::new(Vec::new())).collect());
    let violations: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done_rx) = mpsc::channel();
    for thread in 0..THREADS {
        let (pool, ops, seen, violations, done) = (pool.clone(), ops.clone(), seen.clone(), violations.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let mut next = xorshift(thread as u64 + 1);
            for id in thread * PER_THREAD..(thread + 1) * PER_THREAD {
                let vars = |cells: &[usize]| -> Vec<Arc<Var>> { cells.iter().map(|&c| pool[c].var.clone()).collect() };
                let (reads, writes) = (vars(&ops[id].reads), vars(&ops[id].writes));
                let run = {
                    let (pool, ops, seen, violations) = (pool.clone(), ops.clone(), seen.clone(), violations.clone());
                    move || match run_stress_op(&pool, &ops[id], id) {
                        Ok(op_seen) => {
                            *seen[id].lock().unwrap() = op_seen;
                            Ok(())
                        }
                        Err(violation) => {
                            violations.lock().unwrap().push(violation.clone());
                            Err(crate::err!(Runtime, "{violation}"))
                        }
                    }
                };
                // A third of the ops run at once when their vars are free, the others are queued
                // (half of them run by the pushing thread when granted at registration).
                let run = match next() % 3 {
                    0 => run_if_free(run, &reads.iter().collect::<Vec<_>>(), &writes.iter().collect::<Vec<_>>(), || Box::new("stress")).err(),
                    _ => Some(run),
                };
                if let Some(run) = run {
                    let inline_if_ready = next().is_multiple_of(2);
                    push(Box::new(run), &reads, &writes, PushProps { inline_if_ready }, Box::new("stress"));
                }
                if next().is_multiple_of(64) {
                    let cell = (next() % CELLS as u64) as usize;
                    if let Err(e) = wait_for_var(&pool[cell].var, next().is_multiple_of(2)) {
                        violations.lock().unwrap().push(e.message);
                    }
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..THREADS {
        done_rx.recv_timeout(Duration::from_secs(20)).expect("the pushing threads are stuck: the engine deadlocked");
    }
    for cell in pool.iter() {
        if let Err(e) = wait_for_var(&cell.var, true) {
            violations.lock().unwrap().push(e.message);
        }
    }
    assert_eq!(*violations.lock().unwrap(), Vec::<String>::new());
    let seen: Vec<Seen> = seen.iter().map(|s| s.lock().unwrap().clone()).collect();
    check_against_sequential_replay(&ops, &seen, &pool, PER_THREAD);
}

/// The case of issue 22: two threads push many ops, each reading the var the other writes. With
/// registration not atomic, each op could hold a grant the other waits for, and both stop.
#[test]
fn two_threads_pushing_ops_with_opposite_reads_and_writes_finish() {
    const OPS_PER_THREAD: usize = 200_000;
    let (a, b) = (Var::new(), Var::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = mpsc::channel();
    for (read, write, inline_if_ready) in [(a.clone(), b.clone(), true), (b.clone(), a.clone(), false)] {
        let (ran, done) = (ran.clone(), done_tx.clone());
        std::thread::spawn(move || {
            for _ in 0..OPS_PER_THREAD {
                let ran = ran.clone();
                push(
                    Box::new(move || {
                        ran.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }),
                    std::slice::from_ref(&read),
                    std::slice::from_ref(&write),
                    PushProps { inline_if_ready },
                    Box::new("opposite_roles"),
                );
            }
            // Every op of this thread writes `write`: waiting for it waits for all of them.
            wait_for_var(&write, true).unwrap();
            done.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        done_rx.recv_timeout(Duration::from_secs(20)).expect("the two pushing threads deadlocked");
    }
    assert_eq!(ran.load(Ordering::Relaxed), 2 * OPS_PER_THREAD);
}

#[test]
fn independent_ops_run_concurrently() {
    if num_threads() < 2 {
        return; // a single worker cannot overlap anything
    }
    let vars: Vec<Arc<Var>> = (0..2).map(|_| Var::new()).collect();
    let running = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    for var in &vars {
        let (running, overlap) = (running.clone(), overlap.clone());
        push(
            Box::new(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                let deadline = std::time::Instant::now() + Duration::from_millis(500);
                while running.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
                    std::thread::yield_now();
                }
                overlap.fetch_max(now.max(running.load(Ordering::SeqCst)), Ordering::SeqCst);
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }),
            &[],
            std::slice::from_ref(var),
            PushProps::default(),
            Box::new("spin"),
        );
    }
    wait_vars(&vars);
    assert_eq!(overlap.load(Ordering::SeqCst), 2, "two independent ops never ran at the same time");
}

#[test]
fn errors_propagate_to_readers_and_clear_on_rewrite() {
    let a = Var::new();
    let b = Var::new();
    push(Box::new(|| Err(crate::err!(Runtime, "boom"))), &[], std::slice::from_ref(&a), PushProps::default(), Box::new("fail_op"));
    push(Box::new(|| Ok(())), std::slice::from_ref(&a), std::slice::from_ref(&b), PushProps::default(), Box::new("reader"));
    let e = wait_for_var(&b, false).unwrap_err();
    assert!(e.message.contains("boom") && e.message.contains("fail_op"), "{}", e.message);
    push(Box::new(|| panic!("kernel bug")), &[], std::slice::from_ref(&b), PushProps::default(), Box::new("panicky"));
    let e = wait_for_var(&b, false).unwrap_err();
    assert!(e.message.contains("panicked") && e.message.contains("kernel bug"), "{}", e.message);
    push(Box::new(|| Ok(())), &[], std::slice::from_ref(&b), PushProps::default(), Box::new("rewrite"));
    wait_for_var(&b, true).unwrap();
}

/// As in MXNet an error is raised once: reporting it through one array it reached clears it for
/// every other array it reached, and a later reader of those arrays runs normally.
#[test]
fn an_error_is_reported_once_through_any_array_it_reached() {
    let (source, view_reader, later) = (Var::new(), Var::new(), Var::new());
    push(Box::new(|| Err(crate::err!(Runtime, "bad parameter"))), &[], std::slice::from_ref(&source), PushProps::default(), Box::new("fail_op"));
    push(Box::new(|| Ok(())), std::slice::from_ref(&source), std::slice::from_ref(&view_reader), PushProps::default(), Box::new("reader"));
    let e = wait_for_var(&view_reader, false).unwrap_err();
    assert!(e.message.contains("bad parameter"), "{}", e.message);
    wait_for_var(&source, false).unwrap();
    wait_for_var(&view_reader, false).unwrap();
    push(Box::new(|| Ok(())), std::slice::from_ref(&source), std::slice::from_ref(&later), PushProps::default(), Box::new("later_reader"));
    wait_for_var(&later, false).unwrap();
}

/// An op that reads and writes a failed var (`x += 1`) reads the failed content: as in MXNet it
/// does not run and fails with the inherited error, which reaches its readers; a pure write
/// (`x[:] = 0`) while the error is unreported fails too, since MXNet checks written vars as well.
/// Once the error has been raised, a pure write gives the var fresh content, and `x += 1` runs.
#[test]
fn a_read_write_of_a_failed_var_inherits_the_error_until_it_is_reported() {
    let (x, reader) = (Var::new(), Var::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = |ran: &Arc<AtomicUsize>| -> OpFn {
        let ran = ran.clone();
        Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    };
    push(Box::new(|| Err(crate::err!(Runtime, "disk on fire"))), &[], std::slice::from_ref(&x), PushProps::default(), Box::new("fail_op"));
    push(counted(&ran), std::slice::from_ref(&x), std::slice::from_ref(&x), PushProps::default(), Box::new("increment"));
    push(counted(&ran), &[], std::slice::from_ref(&x), PushProps::default(), Box::new("overwrite_unreported"));
    push(counted(&ran), std::slice::from_ref(&x), std::slice::from_ref(&reader), PushProps::default(), Box::new("reader"));
    let e = wait_for_var(&reader, false).unwrap_err();
    assert!(e.message.contains("disk on fire") && e.message.contains("fail_op"), "{}", e.message);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "an op ran on the failed var's content");
    // Reported once, through any var it reached.
    wait_for_var(&x, true).unwrap();
    push(counted(&ran), &[], std::slice::from_ref(&x), PushProps::default(), Box::new("fresh_write"));
    push(counted(&ran), std::slice::from_ref(&x), std::slice::from_ref(&x), PushProps::default(), Box::new("increment"));
    wait_for_var(&x, true).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[test]
fn wait_for_write_waits_for_readers() {
    let a = Var::new();
    let flag = Arc::new(AtomicUsize::new(0));
    let f2 = flag.clone();
    push(
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(30));
            f2.store(1, Ordering::SeqCst);
            Ok(())
        }),
        std::slice::from_ref(&a),
        &[],
        PushProps::default(),
        Box::new("slow_reader"),
    );
    wait_for_var(&a, true).unwrap();
    assert_eq!(flag.load(Ordering::SeqCst), 1);
}

/// An op released by another's completion runs before ops pushed earlier that are still queued:
/// a caller pushing many steps ahead does not start every step before finishing the first.
#[test]
fn a_released_op_runs_before_older_queued_ops() {
    let order = Arc::new(AtomicUsize::new(0));
    let slot = |pause: Duration, position: Arc<AtomicUsize>| -> OpFn {
        let order = order.clone();
        Box::new(move || {
            // Numbered when it starts: in order of leaving the queue.
            position.store(order.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
            std::thread::sleep(pause);
            Ok(())
        })
    };
    let (first, released) = (Var::new(), Var::new());
    let released_at = Arc::new(AtomicUsize::new(0));
    push(slot(Duration::from_millis(20), Arc::new(AtomicUsize::new(0))), &[], std::slice::from_ref(&first), PushProps::default(), Box::new("first"));
    push(
        slot(Duration::ZERO, released_at.clone()),
        std::slice::from_ref(&first),
        std::slice::from_ref(&released),
        PushProps::default(),
        Box::new("released"),
    );
    // Enough independent ops that the other workers cannot finish them while `first` runs.
    let others: Vec<Arc<Var>> = (0..100 * num_threads()).map(|_| Var::new()).collect();
    for var in &others {
        push(slot(Duration::from_millis(2), Arc::new(AtomicUsize::new(0))), &[], std::slice::from_ref(var), PushProps::default(), Box::new("other"));
    }
    wait_vars(&others);
    wait_vars(&[released]);
    assert!(released_at.load(Ordering::SeqCst) < others.len(), "the released op waited behind every older op");
}

#[test]
fn async_op_holds_its_var_until_completed_from_another_thread() {
    let (c, v) = cells(1);
    let (started_tx, started_rx) = mpsc::channel::<Completion>();
    push_async(
        Box::new(move |start| started_tx.send(start.expect("no input failed")).unwrap()),
        &[],
        &[v[0].clone()],
        PushProps::default(),
        Box::new("async write"),
    );
    // The next op reads the var: it must wait for the completion, not for the async op's return.
    push_update(&c, &v, &[], 0, 1, false);
    let completion = started_rx.recv_timeout(Duration::from_secs(5)).expect("the async op started");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(c[0].load(Ordering::Relaxed), 0, "an op ran before the async op completed");
    c[0].store(100, Ordering::Relaxed);
    std::thread::spawn(move || completion.done(Ok(()))).join().unwrap();
    wait_vars(&v);
    assert_eq!(c[0].load(Ordering::Relaxed), (100 * 31 + 1));
}

#[test]
fn async_op_failure_and_dropped_completion_reach_the_next_wait() {
    let v = Var::new();
    push_async(
        Box::new(|start| start.unwrap().done(Err(crate::err!(Runtime, "peer went away")))),
        &[],
        std::slice::from_ref(&v),
        PushProps::default(),
        Box::new("allreduce"),
    );
    let error = wait_for_var(&v, false).unwrap_err();
    assert!(error.message.contains("peer went away") && error.message.contains("allreduce"), "{}", error.message);

    push_async(Box::new(drop), &[], std::slice::from_ref(&v), PushProps::default(), Box::new("forgotten op"));
    let error = wait_for_var(&v, false).unwrap_err();
    assert!(error.message.contains("forgotten op ended without signalling"), "{}", error.message);
}

#[test]
fn async_op_reading_a_failed_var_is_told_and_does_not_run() {
    let (input, output) = (Var::new(), Var::new());
    push(Box::new(|| Err(crate::err!(Runtime, "backward failed"))), &[], std::slice::from_ref(&input), PushProps::default(), Box::new("grad"));
    let (tx, rx) = mpsc::channel::<String>();
    push_async(
        Box::new(move |start| {
            tx.send(match start {
                Ok(_) => "ran".to_string(),
                Err(e) => e.message,
            })
            .unwrap()
        }),
        std::slice::from_ref(&input),
        std::slice::from_ref(&output),
        PushProps::default(),
        Box::new("allreduce"),
    );
    let told = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(told.contains("backward failed"), "{told}");
    assert!(wait_for_var(&output, false).unwrap_err().message.contains("backward failed"));
}

/// Push an op that holds its vars until the returned sender is signalled; returns once it runs.
fn push_running_until_released(reads: &[Arc<Var>], writes: &[Arc<Var>]) -> mpsc::Sender<()> {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let run = move || {
        started_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        Ok(())
    };
    push(Box::new(run), reads, writes, PushProps::default(), Box::new("held until released"));
    started_rx.recv().unwrap();
    release_tx
}

/// `run_if_free` runs at once on free vars (a read beside running reads included), declines a
/// var with an op running or queued, or holding an error, and stores its own failure as a pushed
/// op would: on the written var, inherited by readers, reported once at the next wait.
#[test]
fn run_if_free_runs_at_once_only_on_free_vars_and_fails_like_a_pushed_op() {
    let (input, output) = (Var::new(), Var::new());
    let ran = AtomicUsize::new(0);
    let count = || {
        ran.fetch_add(1, Ordering::Relaxed);
        Ok(())
    };
    assert!(run_if_free(count, &[&input], &[&output], || Box::new("free")).is_ok());
    assert_eq!(ran.load(Ordering::Relaxed), 1, "it ran before returning");

    // A running writer of the input makes it decline.
    let release_tx = push_running_until_released(&[], std::slice::from_ref(&input));
    let declined = run_if_free(count, &[&input], &[&output], || Box::new("busy"));
    assert!(declined.is_err(), "the input is being written");
    assert!(run_if_free(count, &[], &[&output], || Box::new("unrelated")).is_ok(), "other vars are free");
    release_tx.send(()).unwrap();
    wait_for_var(&input, true).unwrap();

    // Reads share a var with a running read; a write of it waits for that read.
    let release_tx = push_running_until_released(std::slice::from_ref(&input), &[]);
    assert!(run_if_free(count, &[&input], &[&output], || Box::new("reader")).is_ok());
    assert!(run_if_free(count, &[], &[&input], || Box::new("writer")).is_err());
    release_tx.send(()).unwrap();
    wait_for_var(&input, true).unwrap();
    assert_eq!(ran.load(Ordering::Relaxed), 3);

    // Its failure lands on what it wrote, described only now; a reader inherits it; one report.
    let failed = run_if_free(|| Err(crate::err!(Runtime, "boom")), &[], &[&output], || Box::new("failing op"));
    assert!(failed.is_ok(), "it ran (and failed)");
    assert!(run_if_free(count, &[&output], &[], || Box::new("reader")).is_err(), "a var holding an error declines");
    let e = wait_for_var(&output, false).unwrap_err();
    assert!(e.message.contains("boom") && e.message.contains("failing op"), "{}", e.message);
    wait_for_var(&output, false).unwrap();
    assert!(run_if_free(count, &[], &[&output], || Box::new("rewrite")).is_err(), "an error, even reported, stays until rewritten");
    push(Box::new(|| Ok(())), &[], std::slice::from_ref(&output), PushProps::default(), Box::new("rewrite"));
    wait_for_var(&output, true).unwrap();
    assert!(run_if_free(count, &[&output], &[], || Box::new("reader")).is_ok());
}
