//! The staging buffers of one blocking transfer, passed among its threads: who takes which buffer, who
//! waits for one, and how a stop or an error reaches every thread.

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ScopedJoinHandle;

use crate::error::{Error, Result};

/// Takes out of `given` the last buffer `idle` says is idle, if any; the first error of `idle`, which ends the
/// transfer (the buffers stay in `given`).
fn find_idle<B>(given: &mut Vec<B>, idle: fn(&mut B) -> Result<bool>) -> Result<Option<B>> {
    for at in (0..given.len()).rev() {
        if idle(&mut given[at])? {
            return Ok(Some(given.swap_remove(at)));
        }
    }
    Ok(None)
}

/// The shared state of one staged transfer's threads: its staging buffers (of type `B`), at most `limit` of
/// them, and whether the transfer has stopped, with the first error.
///
/// Every wait here ends: [`Circulation::take`] waits only while a buffer is lent to another thread of the
/// transfer, which gives it back ([`Circulation::give_back`]) or drops it (which wakes the waiters, see
/// [`Lent`]), and [`Circulation::stop`] wakes every waiter.
pub(crate) struct Circulation<B> {
    shelf: Mutex<Shelf<B>>,
    /// Signalled when a buffer is given back or dropped, and when the transfer stops.
    changed: Condvar,
    limit: usize,
    /// Whether a buffer given back can be written without waiting, where that is worth asking (see
    /// [`Circulation::preferring_idle`]).
    idle: Option<fn(&mut B) -> Result<bool>>,
}

struct Shelf<B> {
    /// Buffers given back, ready for the next chunk.
    free: Vec<B>,
    /// The transfer's buffers: on the shelf, lent to a thread (or in a message between threads), or being
    /// allocated.
    owned: usize,
    /// Whether the pool had no room for another buffer: the transfer then goes on with those it has.
    pool_full: bool,
    stopped: bool,
    /// The first error of any thread, which the transfer returns.
    error: Option<Error>,
}

impl<B> Circulation<B> {
    /// A circulation of at most `limit` buffers, starting with `first`.
    pub(crate) fn new(first: B, limit: usize) -> Circulation<B> {
        Circulation {
            shelf: Mutex::new(Shelf {
                free: vec![first],
                owned: 1,
                pool_full: false,
                stopped: false,
                error: None,
            }),
            changed: Condvar::new(),
            limit,
            idle: None,
        }
    }

    /// The circulation, taking a buffer given back only where `idle` says it can be written without waiting
    /// while it may still take a new one: an upload's buffer comes back with its copy still queued, maybe behind
    /// other work on the stream, and a worker writing it would wait for all that, where a new block from the pool
    /// lets the transfer return before the stream's earlier work has run.
    pub(crate) fn preferring_idle(mut self, idle: fn(&mut B) -> Result<bool>) -> Circulation<B> {
        self.idle = Some(idle);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Shelf<B>> {
        self.shelf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer for the next chunk: one given back (while a new one could still be taken, only an idle one:
    /// see [`Circulation::preferring_idle`]), else a new one from `more` (which must not wait) while fewer than
    /// `limit` are in circulation and the pool has had room, else the next one given back. `None` once the
    /// transfer has stopped; an error of `more` other than a full pool stops it.
    pub(crate) fn take(&self, more: &dyn Fn() -> Result<B>) -> Option<Lent<'_, B>> {
        let mut shelf = self.lock();
        loop {
            if shelf.stopped {
                return None;
            }
            let may_grow = shelf.owned < self.limit && !shelf.pool_full;
            match self.idle {
                Some(idle) if may_grow && !shelf.free.is_empty() => {
                    // Asked off the shelf: whether a buffer's copy has run may take its stream's lock and a driver
                    // call, and the threads giving buffers back must not wait for that.
                    let mut given = std::mem::take(&mut shelf.free);
                    drop(shelf);
                    let found = find_idle(&mut given, idle);
                    shelf = self.lock();
                    shelf.free.append(&mut given);
                    self.changed.notify_all();
                    match found {
                        Err(e) => {
                            self.stop_locked(&mut shelf, Some(e));
                            return None;
                        }
                        Ok(Some(buffer)) if shelf.stopped => {
                            shelf.free.push(buffer);
                            return None;
                        }
                        Ok(Some(buffer)) => return Some(Lent::new(self, buffer)),
                        Ok(None) if shelf.owned < self.limit && !shelf.pool_full => {}
                        // Another thread took the last new buffer meanwhile.
                        Ok(None) => continue,
                    }
                }
                Some(_) if may_grow => {}
                _ => {
                    if let Some(buffer) = shelf.free.pop() {
                        return Some(Lent::new(self, buffer));
                    }
                }
            }
            if shelf.owned < self.limit && !shelf.pool_full {
                shelf.owned += 1;
                // Not under the lock: pinning a new block takes a while, and buffers come back meanwhile.
                drop(shelf);
                let more = more();
                shelf = self.lock();
                match more {
                    Ok(buffer) if shelf.stopped => {
                        // Stopped meanwhile: the buffer stays on the shelf, unused, until the transfer ends.
                        shelf.free.push(buffer);
                        return None;
                    }
                    Ok(buffer) => return Some(Lent::new(self, buffer)),
                    Err(Error::PoolExhausted { .. }) => {
                        shelf.owned -= 1;
                        shelf.pool_full = true;
                    }
                    Err(e) => {
                        shelf.owned -= 1;
                        self.stop_locked(&mut shelf, Some(e));
                        return None;
                    }
                }
                continue;
            }
            if shelf.owned == 0 {
                // No buffer left to come back: the others were dropped, which only a thread that stopped the
                // transfer does, so this is not reached; but no thread may wait in vain.
                let e = Error::invalid("staging: every staging buffer of the transfer was lost");
                self.stop_locked(&mut shelf, Some(e));
                return None;
            }
            shelf = self
                .changed
                .wait(shelf)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Puts `buffer` back on the shelf for the next chunk.
    pub(crate) fn give_back(&self, buffer: B) {
        self.lock().free.push(buffer);
        // One buffer serves one waiter; a stop wakes them all.
        self.changed.notify_one();
    }

    /// Counts a lent buffer that was dropped instead of given back, and wakes the waiters: one may now find that
    /// no buffer can come, and stop rather than wait.
    fn lost(&self) {
        self.lock().owned -= 1;
        self.changed.notify_all();
    }

    /// Stops the transfer: every thread stops at its next step, and waiters wake. `error`, if the first, is what
    /// the transfer returns.
    pub(crate) fn stop(&self, error: Option<Error>) {
        self.stop_locked(&mut self.lock(), error);
    }

    fn stop_locked(&self, shelf: &mut Shelf<B>, error: Option<Error>) {
        if shelf.error.is_none() {
            shelf.error = error;
        }
        shelf.stopped = true;
        self.changed.notify_all();
    }

    pub(crate) fn stopped(&self) -> bool {
        self.lock().stopped
    }

    /// The transfer's outcome: the first error, if any thread met one.
    pub(crate) fn result(&self) -> Result<()> {
        self.lock().error.take().map_or(Ok(()), Err)
    }
}

/// A buffer lent by a [`Circulation`] to one thread: given back with [`Circulation::give_back`] of
/// [`Lent::into_inner`]; dropped instead (the transfer has stopped), it goes back to its pool, and the
/// circulation counts it lost so that no thread waits for it.
pub(crate) struct Lent<'c, B> {
    circulation: &'c Circulation<B>,
    buffer: Option<B>,
}

impl<'c, B> Lent<'c, B> {
    fn new(circulation: &'c Circulation<B>, buffer: B) -> Lent<'c, B> {
        Lent {
            circulation,
            buffer: Some(buffer),
        }
    }

    /// The buffer, to give back: still counted as the transfer's.
    pub(crate) fn into_inner(mut self) -> B {
        self.buffer
            .take()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> Deref for Lent<'_, B> {
    type Target = B;

    fn deref(&self) -> &B {
        self.buffer
            .as_ref()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> DerefMut for Lent<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        self.buffer
            .as_mut()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> Drop for Lent<'_, B> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            drop(buffer);
            self.circulation.lost();
        }
    }
}

/// Stops the transfer if the thread holding it unwinds, so that no other thread waits for it.
pub(crate) struct StopOnPanic<'c, B>(pub(crate) &'c Circulation<B>);

impl<B> Drop for StopOnPanic<'_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop(None);
        }
    }
}

/// Waits for every worker to end, then passes on the first panic among them, if any.
pub(crate) fn join_all(workers: Vec<ScopedJoinHandle<'_, ()>>) {
    let mut panic = None;
    for worker in workers {
        if let Err(payload) = worker.join() {
            panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    fn full() -> Result<u32> {
        Err(Error::PoolExhausted {
            requested: 1,
            budget: 1,
            reserved: 1,
            waited: std::time::Duration::ZERO,
        })
    }

    /// Runs `f` on a thread of its own; what it returns, or a failed test if it has not within 10 s.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the thread returned in time")
    }

    /// A thread that waits to take a buffer from `circulation` with a full pool, started now: what it took.
    fn waiter(circulation: &Arc<Circulation<u32>>) -> mpsc::Receiver<Option<u32>> {
        let (tx, rx) = mpsc::channel();
        let circulation = circulation.clone();
        std::thread::spawn(move || {
            let _ = tx.send(circulation.take(&full).map(|buffer| buffer.into_inner()));
        });
        rx
    }

    fn wait(rx: &mpsc::Receiver<Option<u32>>) -> Option<u32> {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter returned in time")
    }

    #[test]
    fn a_busy_buffer_given_back_is_passed_over_for_a_new_one_while_the_limit_allows() {
        // Odd buffers are busy: their uploads are still queued.
        let circulation = Circulation::new(1u32, 3).preferring_idle(|b| Ok(*b % 2 == 0));
        let asked = AtomicUsize::new(0);
        let more = || Ok(10 + 2 * asked.fetch_add(1, Ordering::Relaxed) as u32);
        let first = circulation.take(&more).unwrap();
        assert_eq!(*first, 10, "the busy first buffer stays on the shelf");
        let second = circulation.take(&more).unwrap();
        assert_eq!(*second, 12);
        circulation.give_back(second.into_inner());
        let third = circulation.take(&more).unwrap();
        assert_eq!(*third, 12, "an idle one given back");
        let fourth = circulation.take(&more).unwrap();
        assert_eq!(*fourth, 1, "at the limit, the busy one is taken");
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        drop((first, third, fourth));
    }

    #[test]
    fn buffers_come_from_the_shelf_then_the_pool_up_to_the_limit() {
        let circulation = Circulation::new(0, 3);
        let asked = AtomicUsize::new(0);
        let more = || Ok(10 + asked.fetch_add(1, Ordering::Relaxed) as u32);
        let a = circulation.take(&more).unwrap();
        let b = circulation.take(&more).unwrap();
        let c = circulation.take(&more).unwrap();
        assert_eq!((*a, *b, *c), (0, 10, 11));
        circulation.give_back(b.into_inner());
        assert_eq!(*circulation.take(&more).unwrap(), 10);
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        drop((a, c));
        assert!(circulation.result().is_ok());
    }

    #[test]
    fn a_full_pool_means_waiting_for_a_buffer_given_back() {
        let circulation = Arc::new(Circulation::new(0, 4));
        let held = circulation.take(&full).unwrap().into_inner();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "the waiter waits");
        circulation.give_back(held);
        assert_eq!(wait(&rx), Some(0));
        // The pool said it was full: it is not asked again during the transfer.
        let asked = AtomicUsize::new(0);
        let count = || {
            asked.fetch_add(1, Ordering::Relaxed);
            full()
        };
        circulation.give_back(0);
        let held = circulation.take(&count).unwrap().into_inner();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(20));
        circulation.give_back(held);
        assert_eq!(wait(&rx), Some(0));
        assert_eq!(asked.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stop_wakes_every_waiter() {
        let circulation = Arc::new(Circulation::new(0, 1));
        let held = circulation.take(&full).unwrap();
        let waiters = [waiter(&circulation), waiter(&circulation)];
        std::thread::sleep(Duration::from_millis(50));
        circulation.stop(Some(Error::invalid("first")));
        circulation.stop(Some(Error::invalid("second")));
        for rx in &waiters {
            assert_eq!(wait(rx), None);
        }
        drop(held);
        assert!(circulation.take(&full).is_none(), "stopped for good");
        let e = circulation.result().unwrap_err();
        assert!(e.to_string().contains("first"), "the first error: {e}");
    }

    #[test]
    fn a_buffer_dropped_instead_of_given_back_never_leaves_a_waiter() {
        let circulation = Arc::new(Circulation::new(0, 1));
        let held = circulation.take(&full).unwrap();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert_eq!(wait(&rx), None);
        assert!(circulation.result().is_err());
    }

    #[test]
    fn an_error_from_the_pool_stops_the_transfer() {
        let circulation = Arc::new(Circulation::new(0, 2));
        let held = circulation.take(&full).unwrap();
        let failing = || Err(Error::invalid("the pool failed"));
        assert!(circulation.take(&failing).is_none());
        assert!(circulation.stopped());
        drop(held);
        let taken = bounded({
            let circulation = circulation.clone();
            move || circulation.take(&full).is_some()
        });
        assert!(!taken);
        let e = circulation.result().unwrap_err();
        assert!(e.to_string().contains("the pool failed"), "{e}");
    }
}
