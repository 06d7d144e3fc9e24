//! [`PinnedPool::alloc_async`]: a request as a future, awaiting room where the blocking form would wait.

use std::time::{Duration, Instant};

use bytemuck::Pod;

#[cfg(doc)]
use super::WhenFull;
use super::state::Take;
use super::{ALLOCATING, PinnedPool, Waits};
use crate::error::{Error, Result};
use crate::future::Done;
use crate::memory::block::PAGE;
use crate::memory::layout::{byte_len, check_alignment};
use crate::memory::pinned::{Pinned, PinnedBuilder};
use crate::memory::tracked::Gpu;

impl PinnedPool {
    /// [`PinnedPool::alloc`] as a future, for async code: where `alloc` would wait for room, the task awaits it
    /// instead (device work on blocks given back through the reactor, buffers given back through the giver's
    /// wake, the deadline of a [`WhenFull::Wait`] pool through the reactor), so no executor thread blocks.
    /// Pinning a new block, when there is room for one, still happens on the polling thread, as in `alloc` (a
    /// host call, not a wait for the device). Dropping the future before it resolves takes nothing.
    ///
    /// # Errors
    /// As [`PinnedPool::alloc`]; an invalid-argument error if polled again after it resolved.
    pub fn alloc_async<T: Pod>(&self, len: usize) -> PoolAlloc<'_, T> {
        self.alloc_async_waiting(len, self.waits)
    }

    /// [`PinnedPool::alloc_async`] that waits only for device work on blocks given back, whatever the pool's
    /// [`WhenFull`], as `alloc_after_pending` does: for a staged transfer, which may hold buffers of the pool.
    pub(crate) fn alloc_async_after_pending<T: Pod>(&self, len: usize) -> PoolAlloc<'_, T> {
        self.alloc_async_waiting(len, Waits::ForDevice)
    }

    fn alloc_async_waiting<T: Pod>(&self, len: usize, waits: Waits) -> PoolAlloc<'_, T> {
        PoolAlloc {
            pool: self,
            len,
            waits,
            started: Instant::now(),
            waited: false,
            device: None,
            deadline: None,
            room: None,
            over: false,
            _element: std::marker::PhantomData,
        }
    }
}

/// A future of a buffer of a [`PinnedPool`] ([`PinnedPool::alloc_async`]).
#[must_use = "a future does nothing unless awaited"]
pub struct PoolAlloc<'a, T> {
    pool: &'a PinnedPool,
    len: usize,
    waits: Waits,
    started: Instant,
    /// Whether it has waited (for its error's figure).
    waited: bool,
    /// Device work on a block given back, awaited.
    device: Option<Done>,
    /// The pool's deadline, once it had to wait for room.
    deadline: Option<Done>,
    /// The waker it left with the pool for room, to take back when it goes.
    room: Option<std::task::Waker>,
    /// Resolved: a later poll is an error.
    over: bool,
    _element: std::marker::PhantomData<fn() -> T>,
}

impl<T: Pod> std::future::Future for PoolAlloc<'_, T> {
    type Output = Result<Pinned<T>>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Pinned<T>>> {
        let this = &mut *self;
        if this.over {
            return std::task::Poll::Ready(Err(Error::invalid(
                "a PinnedPool::alloc_async future polled after it resolved",
            )));
        }
        let polled = this.step(cx);
        this.over = polled.is_ready();
        polled
    }
}

impl<T: Pod> PoolAlloc<'_, T> {
    /// One poll: a buffer if the pool has one or room to pin one; else every cause that may make room
    /// registered to wake the task (device work on the oldest block given back, a buffer given back, the
    /// deadline), or the pool's error.
    fn step(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<Pinned<T>>> {
        use std::future::Future;
        use std::task::Poll;
        check_alignment::<T>(PAGE, ALLOCATING)?;
        let bytes = byte_len::<T>(self.len, ALLOCATING)?;
        let pool = self.pool;
        let shared = &*pool.shared;
        if bytes == 0 {
            return Poll::Ready(PinnedBuilder::new(&shared.context).zeroed(self.len));
        }
        let deadline = match self.waits {
            Waits::ForRoom => self.started.checked_add(shared.max_wait),
            _ => None,
        };
        loop {
            // Device work on a block given back: polled every time (it registers the task with the reactor).
            if let Some(device) = &mut self.device
                && let Poll::Ready(outcome) = std::pin::Pin::new(device).poll(cx)
            {
                self.device = None;
                outcome?;
            }
            let waited = if self.waited {
                self.started.elapsed()
            } else {
                Duration::ZERO
            };
            let mut state = shared.lock();
            match state.take(&Gpu, bytes)? {
                Take::Hit { block, lease } => {
                    return Poll::Ready(Ok(pool.loan(block, lease, self.len)));
                }
                Take::Pin { reservation, evict } => {
                    return Poll::Ready(pool.pin(state, reservation, evict, self.len));
                }
                Take::TooLarge => return Poll::Ready(Err(shared.exhausted(&state, bytes, waited))),
                Take::Exhausted => {}
            }
            if self.waits == Waits::Nothing || deadline.is_some_and(|d| Instant::now() >= d) {
                return Poll::Ready(Err(shared.exhausted(&state, bytes, waited)));
            }
            if self.device.is_none() {
                if let Some(marks) = state.oldest_pending_marks() {
                    // `take` found no block given back idle: await the oldest one's work (polled above).
                    drop(state);
                    self.waited = true;
                    let (stream, mark) = marks
                        .into_iter()
                        .next()
                        .expect("a pending block has work recorded");
                    self.device = Some(Done::mark(&stream, mark.segment().into_owned()));
                    continue;
                }
                if self.waits == Waits::ForDevice {
                    return Poll::Ready(Err(shared.exhausted(&state, bytes, waited)));
                }
            }
            if self.waits == Waits::ForRoom {
                // Room held by holders: woken when a buffer comes back (the waker kept under the pool's lock, so
                // that no give-back falls between the look and the keeping), or at the deadline.
                self.waited = true;
                let replaced = self.keep_room_waker(cx);
                drop(state);
                // Dropped without the lock: a waker's drop is others' code, and may give a buffer back here.
                drop(replaced);
                if let Some(deadline) = deadline {
                    let timer = self.deadline.get_or_insert_with(|| Done::at(deadline));
                    if std::pin::Pin::new(timer).poll(cx).is_ready() {
                        self.deadline = None;
                        continue;
                    }
                }
            }
            return Poll::Pending;
        }
    }

    /// Leaves the task's waker with the pool, to be woken when room is made (call it under the pool's lock).
    /// Returns the waker it kept before, for the caller to drop once it holds no lock.
    #[must_use = "the replaced waker is dropped outside the pool's lock"]
    fn keep_room_waker(&mut self, cx: &std::task::Context<'_>) -> Option<std::task::Waker> {
        let mut wakers = self.pool.shared.room_wakers();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        self.room.replace(cx.waker().clone())
    }
}

impl<T> Drop for PoolAlloc<'_, T> {
    /// Takes its waker back from the pool, so that futures dropped while waiting leave nothing behind.
    fn drop(&mut self) {
        let Some(mine) = self.room.take() else { return };
        let stale = {
            let mut wakers = self.pool.shared.room_wakers();
            let (stale, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *wakers)
                .into_iter()
                .partition(|w| w.will_wake(&mine));
            *wakers = kept;
            stale
        };
        // Dropped without the lock: a waker's drop is others' code.
        drop((stale, mine));
    }
}
