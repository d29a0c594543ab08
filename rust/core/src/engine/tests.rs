use super::*;
use std::sync::atomic::AtomicI64;
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

#[test]
fn randomized_stress_matches_sequential_reference() {
    let n = 12;
    let (c, v) = cells(n);
    let mut state = 0x9E3779B97F4A7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
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
            &[var.clone()],
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
    push(Box::new(|| Err(crate::err!(Runtime, "boom"))), &[], &[a.clone()], PushProps::default(), Box::new("fail_op"));
    push(Box::new(|| Ok(())), &[a.clone()], &[b.clone()], PushProps::default(), Box::new("reader"));
    let e = wait_for_var(&b, false).unwrap_err();
    assert!(e.message.contains("boom") && e.message.contains("fail_op"), "{}", e.message);
    push(Box::new(|| panic!("kernel bug")), &[], &[b.clone()], PushProps::default(), Box::new("panicky"));
    let e = wait_for_var(&b, false).unwrap_err();
    assert!(e.message.contains("panicked") && e.message.contains("kernel bug"), "{}", e.message);
    push(Box::new(|| Ok(())), &[], &[b.clone()], PushProps::default(), Box::new("rewrite"));
    wait_for_var(&b, true).unwrap();
}

/// As in MXNet an error is raised once: reporting it through one array it reached clears it for
/// every other array it reached, and a later reader of those arrays runs normally.
#[test]
fn an_error_is_reported_once_through_any_array_it_reached() {
    let (source, view_reader, later) = (Var::new(), Var::new(), Var::new());
    push(Box::new(|| Err(crate::err!(Runtime, "bad parameter"))), &[], &[source.clone()], PushProps::default(), Box::new("fail_op"));
    push(Box::new(|| Ok(())), &[source.clone()], &[view_reader.clone()], PushProps::default(), Box::new("reader"));
    let e = wait_for_var(&view_reader, false).unwrap_err();
    assert!(e.message.contains("bad parameter"), "{}", e.message);
    wait_for_var(&source, false).unwrap();
    wait_for_var(&view_reader, false).unwrap();
    push(Box::new(|| Ok(())), &[source.clone()], &[later.clone()], PushProps::default(), Box::new("later_reader"));
    wait_for_var(&later, false).unwrap();
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
        &[a.clone()],
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
    push(slot(Duration::from_millis(20), Arc::new(AtomicUsize::new(0))), &[], &[first.clone()], PushProps::default(), Box::new("first"));
    push(slot(Duration::ZERO, released_at.clone()), &[first.clone()], &[released.clone()], PushProps::default(), Box::new("released"));
    // Enough independent ops that the other workers cannot finish them while `first` runs.
    let others: Vec<Arc<Var>> = (0..100 * num_threads()).map(|_| Var::new()).collect();
    for var in &others {
        push(slot(Duration::from_millis(2), Arc::new(AtomicUsize::new(0))), &[], &[var.clone()], PushProps::default(), Box::new("other"));
    }
    wait_vars(&others);
    wait_vars(&[released]);
    assert!(released_at.load(Ordering::SeqCst) < others.len(), "the released op waited behind every older op");
}
