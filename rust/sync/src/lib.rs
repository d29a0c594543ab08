//! The lock-free protocols the engine and the storage pool rely on, kept here so that loom
//! model-checks them: every interleaving of their atomic operations (and, for `Parking`, of park
//! and unpark) is explored, not only those a stress test happens to hit.
//!
//! They are a crate of their own so that the model checker builds this file and loom alone, in
//! about a minute, rather than the whole of `oxnet` a second time under `--cfg loom`:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p oxnet-sync
//! ```
//!
//! (The rest of `oxnet`'s atomics are statistics counters and a memory estimate, whose races only
//! blur a figure; they need no protocol.)

#[cfg(loom)]
use loom::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// A count of outstanding events (an operation's ungranted dependencies) whose end exactly one
/// party observes: the one that then acts (runs the operation).
pub struct Countdown(AtomicUsize);

impl Countdown {
    pub fn new(count: usize) -> Countdown {
        Countdown(AtomicUsize::new(count))
    }

    /// Take `n` events off the count; true for the one call that ends it. AcqRel: the call that
    /// ends the count happens after every other call, so the one who acts sees everything the
    /// others did before they counted down.
    pub fn count_down(&self, n: usize) -> bool {
        self.0.fetch_sub(n, Ordering::AcqRel) == n
    }
}

const NOT_RUNNING: u8 = 0;
const ACTIVE: u8 = 1;
const PARKED: u8 = 2;

/// The state of a background thread that parks while it has no work, as seen by those who hand
/// it work. No wake-up is lost: the sleeper announces PARKED and then looks for work; a waker
/// publishes work and then reads the state. Both touch the state with read-modify-writes
/// (AcqRel), which read the latest value in its modification order: if the waker's comes first,
/// the sleeper's synchronizes with it and sees the work published before it; otherwise the waker
/// reads PARKED and unparks. An unpark that comes before the park makes the park return at once.
/// (Plain SeqCst loads and stores would also do, by SeqCst's single total order, but loom cannot
/// check that pattern; the waker's read-modify-write costs a few nanoseconds per release.)
pub struct Parking(AtomicU8);

impl Parking {
    #[cfg(not(loom))]
    pub const fn new() -> Parking {
        Parking(AtomicU8::new(NOT_RUNNING))
    }

    #[cfg(loom)]
    pub fn new() -> Parking {
        Parking(AtomicU8::new(NOT_RUNNING))
    }

    /// The waker's side, called after it published its work with a SeqCst write: unparks a
    /// parked thread, or starts one (`start` returns whether it could) when none runs yet.
    pub fn wake(&self, unpark: impl FnOnce(), start: impl FnOnce() -> bool) {
        // A read-modify-write that changes nothing: it reads the latest state (see above).
        match self.0.fetch_or(0, Ordering::AcqRel) {
            ACTIVE => {}
            PARKED => unpark(),
            _ => {
                if self.0.compare_exchange(NOT_RUNNING, ACTIVE, Ordering::AcqRel, Ordering::Acquire).is_ok() && !start() {
                    // No thread to be had: the next waker tries again.
                    self.0.store(NOT_RUNNING, Ordering::Release);
                }
            }
        }
    }

    /// The sleeper's side: park unless `has_work` (a read of what wakers publish before they
    /// call `wake`) sees work once PARKED is announced.
    pub fn park_unless(&self, has_work: impl Fn() -> bool, park: impl FnOnce()) {
        self.0.swap(PARKED, Ordering::AcqRel);
        if !has_work() {
            park();
        }
        self.0.store(ACTIVE, Ordering::Release);
    }

    /// In a child made by `fork`, which has no thread: the next waker starts one.
    pub fn forget_thread(&self) {
        self.0.store(NOT_RUNNING, Ordering::Release);
    }
}

impl Default for Parking {
    fn default() -> Parking {
        Parking::new()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    /// Three parties count a block down (as `register` and two granting vars do); exactly one
    /// acts, and it sees the data the others wrote before counting down.
    #[test]
    fn exactly_one_party_ends_a_countdown_and_sees_the_others_writes() {
        loom::model(|| {
            let count = Arc::new(Countdown::new(4));
            let written: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
            let acted = Arc::new(AtomicUsize::new(0));
            let party = |i: usize, n: usize| {
                let (count, written, acted) = (count.clone(), written.clone(), acted.clone());
                move || {
                    written[i].store(i + 1, Ordering::Relaxed);
                    if count.count_down(n) {
                        acted.fetch_add(1, Ordering::Relaxed);
                        for (j, w) in written.iter().enumerate() {
                            assert_eq!(w.load(Ordering::Relaxed), j + 1, "the acting party missed a write");
                        }
                    }
                }
            };
            let others: Vec<_> = [(1, 1), (2, 1)].into_iter().map(|(i, n)| thread::spawn(party(i, n))).collect();
            party(0, 2)();
            for t in others {
                t.join().unwrap();
            }
            assert_eq!(acted.load(Ordering::Relaxed), 1);
        });
    }

    /// A sleeper that parks whenever it finds no work, and a waker that publishes work and wakes
    /// it: in no interleaving does the sleeper stay parked with the work unseen (loom reports a
    /// deadlock if it does).
    #[test]
    fn a_wake_up_is_never_lost() {
        loom::model(|| {
            let parking = Arc::new(Parking::new());
            let work = Arc::new(AtomicBool::new(false));
            // The sleeper is running (the waker would otherwise start it).
            parking.wake(|| unreachable!("nothing is parked yet"), || true);
            let sleeper = {
                let (parking, work) = (parking.clone(), work.clone());
                thread::spawn(move || {
                    while !work.load(Ordering::SeqCst) {
                        parking.park_unless(|| work.load(Ordering::SeqCst), thread::park);
                    }
                })
            };
            work.store(true, Ordering::SeqCst);
            let handle = sleeper.thread().clone();
            parking.wake(|| handle.unpark(), || unreachable!("the sleeper already runs"));
            sleeper.join().unwrap();
        });
    }

    /// Two wakers find no thread running: exactly one starts it.
    #[test]
    fn only_one_waker_starts_the_thread() {
        loom::model(|| {
            let parking = Arc::new(Parking::new());
            let starts = Arc::new(AtomicUsize::new(0));
            let waker = || {
                let (parking, starts) = (parking.clone(), starts.clone());
                move || {
                    parking.wake(
                        || {},
                        || {
                            starts.fetch_add(1, Ordering::SeqCst);
                            true
                        },
                    )
                }
            };
            let other = thread::spawn(waker());
            waker()();
            other.join().unwrap();
            assert_eq!(starts.load(Ordering::SeqCst), 1);
        });
    }
}
