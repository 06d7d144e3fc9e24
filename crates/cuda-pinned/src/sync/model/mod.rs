//! The model check of the crate's two lock protocols, on loom: the segment lock's hand-over (`reentrant.rs`)
//! and the reactor's lending of flags (`flags.rs`). Each file is compiled here again, over loom's primitives
//! instead of std's, and loom runs every interleaving of a few threads (up to a bound of preemptions) with
//! the orderings the atomics allow, failing on a data race, a deadlock (a lost wake-up) or an assertion.
//!
//! The controls compile the same files over primitives that break one rule the protocols rely on, and check
//! that the model then fails: the check can see what it is there to see.

#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;

use loom::sync::atomic::AtomicBool;

/// loom's primitives, as `primitives.rs` names std's.
mod loom_primitives {
    pub(crate) use loom::cell::Cell;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

    /// As std's: the address of a thread-local, which loom keeps per model thread.
    pub(crate) fn this_thread() -> usize {
        loom::thread_local! {
            static TOKEN: u8 = 0;
        }
        TOKEN.with(|token| std::ptr::from_ref(token) as usize)
    }

    /// The total order of sequentially consistent accesses, which loom's accesses lack (see `primitives.rs`).
    pub(crate) fn seq_cst_order() {
        loom::sync::atomic::fence(Ordering::SeqCst);
    }
}

mod checked;
mod forgetful;
mod relaxed;

/// Runs `f` in every interleaving loom reaches within a bound of preemptions (`LOOM_MAX_PREEMPTIONS`
/// overrides it).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.or(Some(preemptions));
    builder.check(f);
}

/// A value that only the holder of a lock may touch: loom fails on any two accesses not ordered by it.
struct Guarded(loom::cell::UnsafeCell<usize>);

// SAFETY: touched only under the lock of the test, which is what the model checks.
unsafe impl Sync for Guarded {}

/// Three threads take the lock, twice nested, and add to a value under it.
macro_rules! hand_over_scenario {
    ($world:ident) => {{
        use $world::reentrant::Reentrant;
        let lock = Arc::new(Reentrant::default());
        let value = Arc::new(Guarded(loom::cell::UnsafeCell::new(0)));
        let add = {
            let (lock, value) = (lock.clone(), value.clone());
            move || {
                lock.acquire();
                lock.acquire();
                // SAFETY: under the lock (what the model checks).
                value.0.with_mut(|v| unsafe { *v += 1 });
                lock.release();
                // SAFETY: still under the lock, once.
                value.0.with_mut(|v| unsafe { *v += 1 });
                lock.release();
            }
        };
        let others: Vec<_> = (0..2).map(|_| loom::thread::spawn(add.clone())).collect();
        add();
        for other in others {
            other.join().unwrap();
        }
        // SAFETY: every other thread has ended.
        assert_eq!(value.0.with(|v| unsafe { *v }), 6);
    }};
}

#[test]
fn the_segment_locks_hand_over_excludes_other_threads_and_wakes_every_sleeper() {
    model(3, || hand_over_scenario!(checked));
}

#[test]
#[should_panic(expected = "deadlock")]
fn control_a_hand_over_that_misses_its_sleepers_deadlocks_in_the_model() {
    model(3, || hand_over_scenario!(forgetful));
}

/// Two futures, one after the other on one thread, each borrow a word, have "the device" (a thread that
/// performs the queued writes in order) write it, and wait as `Done` does: the word read first, else the
/// signal polled with a waker. The scanner gives words back and lends them again. Checked: a word is never lent
/// while a write to it is pending; a future that sees its point reached sees the device's work before the write
/// (`written`), whether it read the word itself or was told by the scanner; every future is woken.
macro_rules! lending_scenario {
    ($world:ident) => {{
        use $world::flags::{Hub, On, Scanner, Signal, Watch};
        use $world::primitives::AtomicU32;
        const FUTURES: usize = 2;
        let hub = Arc::new(Hub::<()>::new());
        // The device's queue of writes: the word, its value, and the work before it (done when set).
        type Write = (&'static AtomicU32, u32, Arc<AtomicBool>);
        let queue = Arc::new((
            loom::sync::Mutex::new(std::collections::VecDeque::<Write>::new()),
            loom::sync::Condvar::new(),
        ));
        // The words with a write pending, by address.
        let pending = Arc::new(loom::sync::Mutex::new(Vec::<usize>::new()));
        let device = {
            let (queue, pending) = (queue.clone(), pending.clone());
            loom::thread::spawn(move || {
                let mut written = 0;
                while written < FUTURES {
                    let (word, value, work) = {
                        let mut writes = queue.0.lock().unwrap();
                        loop {
                            match writes.pop_front() {
                                Some(write) => break write,
                                None => writes = queue.1.wait(writes).unwrap(),
                            }
                        }
                    };
                    work.store(true, Ordering::Relaxed);
                    pending
                        .lock()
                        .unwrap()
                        .retain(|&w| w != std::ptr::from_ref(word) as usize);
                    word.store(value, Ordering::Release);
                    written += 1;
                }
            })
        };
        let scanner = {
            let hub = hub.clone();
            loom::thread::spawn(move || {
                let mut scanner = Scanner::<()>::default();
                let mut ended = 0;
                while ended < FUTURES {
                    scanner.take(&hub);
                    ended += scanner.pass(true);
                    loom::thread::yield_now();
                }
            })
        };
        let wait = move |hub: &Hub<()>| {
            let flag = hub
                .lend(0, || {
                    // A chunk of one word, so that a second future needs the first one's word back or a new
                    // chunk.
                    Ok(Box::leak(Box::new([AtomicU32::new(0)])) as &'static [AtomicU32])
                })
                .unwrap();
            {
                let mut pending = pending.lock().unwrap();
                let address = std::ptr::from_ref(flag.word) as usize;
                assert!(!pending.contains(&address), "a word was lent with a write pending");
                pending.push(address);
            }
            let work = Arc::new(AtomicBool::new(false));
            queue
                .0
                .lock()
                .unwrap()
                .push_back((flag.word, flag.value, work.clone()));
            queue.1.notify_one();
            let signal = Signal::new();
            let on = On::Flag {
                word: flag.word,
                value: flag.value,
                device: 0,
                keep: (),
            };
            let watch = Watch {
                signal: signal.clone(),
                on,
            };
            hub.add(watch, || Ok(())).unwrap();
            loom::future::block_on(std::future::poll_fn(|cx| {
                if flag.landed() {
                    return Poll::Ready(Ok(()));
                }
                signal.poll(cx.waker()).map_or(Poll::Pending, Poll::Ready)
            }))
            .unwrap();
            signal.drop_future();
            assert!(
                work.load(Ordering::Relaxed),
                "a future saw its point reached before the work before it"
            );
        };
        wait(&hub);
        wait(&hub);
        scanner.join().unwrap();
        device.join().unwrap();
    }};
}

#[test]
fn the_reactors_flags_are_lent_written_taken_back_and_lent_again_without_a_stale_answer() {
    model(2, || lending_scenario!(checked));
}

#[test]
#[should_panic(expected = "before the work before it")]
fn control_flags_read_without_acquire_answer_before_the_work_in_the_model() {
    model(2, || lending_scenario!(relaxed));
}
