//! A lock that the thread holding it may take again, with the cost of an uncontended take and give-back kept to
//! one compare-and-swap and one swap: only a thread that finds it held sleeps, on a condition variable. It guards
//! no data itself; its user (the segment lock in `marks.rs`) reaches its data only while holding it.
//!
//! Written against `primitives.rs`, so that the model check (`model/`) runs this file over loom's primitives.

#![allow(unsafe_code)]

use super::primitives::{AtomicUsize, Cell, Condvar, Mutex, Ordering, seq_cst_order, this_thread};
use std::sync::PoisonError;

#[derive(Default)]
pub(crate) struct Reentrant {
    /// The holder's [`this_thread`] token; 0 while the lock is free.
    owner: AtomicUsize,
    /// How many times the holder has taken it; touched only by the holder.
    depth: Cell<usize>,
    /// Threads asleep (or about to sleep) in [`Reentrant::acquire`]: a release wakes one only if there is one
    /// (a wake is a system call).
    waiting: AtomicUsize,
    /// What the waiting threads sleep on.
    sleep: Mutex<()>,
    released: Condvar,
}

// SAFETY: `depth` is touched only by the thread that holds the lock (between `acquire` and the matching
// `release`, which its callers keep on one thread); the compare-and-swap that takes the lock (Acquire) and the
// swap that frees it (SeqCst, which includes Release) order one holder's accesses before the next one's.
unsafe impl Sync for Reentrant {}

impl Reentrant {
    /// Takes the lock (again, if this thread holds it), sleeping while another thread holds it. Each call is
    /// ended by one [`Reentrant::release`] on the same thread.
    pub(crate) fn acquire(&self) {
        let me = this_thread();
        // Only this thread stores its own token, so it reads it back exactly.
        if self.owner.load(Ordering::Relaxed) != me {
            while self
                .owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                self.sleep_while_held();
            }
        }
        self.depth.set(self.depth.get() + 1);
    }

    /// Ends one [`Reentrant::acquire`] of this thread; the last one frees the lock and wakes a sleeper.
    pub(crate) fn release(&self) {
        let depth = self.depth.get() - 1;
        self.depth.set(depth);
        if depth == 0 {
            self.owner.swap(0, Ordering::SeqCst);
            seq_cst_order();
            if self.waiting.load(Ordering::SeqCst) > 0 {
                let _sleep = self.sleep.lock().unwrap_or_else(PoisonError::into_inner);
                self.released.notify_one();
            }
        }
    }

    /// Sleeps until the lock has been freed since this call began (or returns at once if it is free). Counting
    /// itself in `waiting` before it reads `owner`, against [`Reentrant::release`], which frees `owner` before
    /// it reads `waiting` (all four sequentially consistent), makes sure that a release either is seen here or
    /// sees this thread waiting and wakes it: it takes `sleep` to notify, which this thread holds until it
    /// waits.
    #[cold]
    fn sleep_while_held(&self) {
        let mut asleep = self.sleep.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        seq_cst_order();
        while self.owner.load(Ordering::SeqCst) != 0 {
            asleep = self
                .released
                .wait(asleep)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}
