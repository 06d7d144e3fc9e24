//! Serving a request of a [`PinnedPool`] on the calling thread: a hit, a pin, or a wait for room as the
//! pool's [`WhenFull`] allows.

#![allow(unsafe_code)]

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytemuck::Pod;

use super::state::{Lease, PoolState, Reservation, Take};
use super::{ALLOCATING, POOL_FLAGS, PinnedPool, Waits, block};
#[cfg(doc)]
use super::{PoolBuilder, WhenFull};
use crate::driver::Stream;
use crate::driver::marks::Point;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::memory::block::{Block, PAGE, node_of};
use crate::memory::host::HostRegion;
use crate::memory::layout::{byte_len, check_alignment};
use crate::memory::pinned::Loan;
use crate::memory::pinned::{Pinned, PinnedBuilder};
use crate::memory::release::reuse;
use crate::memory::tracked::Gpu;
use crate::track::Timeline;
use crate::units::Bytes;

/// How long a request of a [`WhenFull::Wait`] pool first sleeps between polls of the blocks given back with
/// device work pending; the pause doubles up to [`LONGEST_POLL`] while nothing comes back. A buffer given back,
/// or a pin that fails, wakes it at once.
const FIRST_POLL: Duration = Duration::from_micros(50);
const LONGEST_POLL: Duration = Duration::from_millis(2);

impl PinnedPool {
    /// A pinned buffer of `len` elements, aligned to a page: an idle cached block of its size class (no driver
    /// call), else a newly pinned one, cached blocks of other classes given up for room. It holds what the block
    /// last held (zeroes when new); dropped, it goes back, to be reused once its device work has completed.
    /// Waits only in a [`WhenFull::Wait`] pool with no room: for buffers to come back or device work on those
    /// given back to complete, at most [`PoolBuilder::max_wait`].
    ///
    /// # Errors
    /// Invalid argument if `T` is aligned to more than a page or the size overflows; [`Error::PoolExhausted`]
    /// with no room (at once, or after `max_wait`; at once above the budget); the driver's (pinning, polling work).
    #[doc(alias = "cuMemHostAlloc")]
    #[doc(alias = "cuMemHostRegister")]
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_waiting(len, self.waits)
    }

    /// [`PinnedPool::alloc`] that, when the budget leaves no room, waits only for device work on blocks given
    /// back, whatever the pool's [`WhenFull`]: never for buffers other holders have (the caller may be one of
    /// them), so the wait ends by itself. [`Error::PoolExhausted`] once no block given back is pending. For the
    /// first buffer of a staged transfer, which may follow another transfer's still in flight.
    pub(crate) fn alloc_after_pending<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_waiting(len, Waits::ForDevice)
    }

    /// [`PinnedPool::alloc`] that never waits: [`Error::PoolExhausted`] when the budget leaves no room, whatever
    /// the pool's [`WhenFull`].
    ///
    /// # Errors
    /// As [`PinnedPool::alloc`] with [`WhenFull::Fail`].
    pub fn try_alloc<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_waiting(len, Waits::Nothing)
    }

    /// This pool, for a caller that holds buffers of it while it allocates more (a prefetcher building its
    /// slots): its `alloc` never waits for buffers held, which may be the caller's own, only for device work
    /// on blocks given back, where the pool waits when full at all. A pool that fails when full still fails
    /// at once.
    pub(crate) fn waiting_only_for_device(&self) -> PinnedPool {
        let waits = match self.waits {
            Waits::ForRoom => Waits::ForDevice,
            waits => waits,
        };
        PinnedPool {
            shared: self.shared.clone(),
            waits,
        }
    }

    fn alloc_waiting<T: Pod>(&self, len: usize, waits: Waits) -> Result<Pinned<T>> {
        check_alignment::<T>(PAGE, ALLOCATING)?;
        let bytes = byte_len::<T>(len, ALLOCATING)?;
        let shared = &*self.shared;
        if bytes == 0 {
            // No memory to lend (`len` elements of a zero-sized type, or none).
            return PinnedBuilder::new(&shared.context).zeroed(len);
        }
        let started = Instant::now();
        // `None` when the deadline is past any instant the clock can tell (a `max_wait` of centuries).
        let deadline = started.checked_add(shared.max_wait);
        let mut waited = false;
        let mut pause = FIRST_POLL;
        let mut state = shared.lock();
        loop {
            let waited_for = || {
                if waited {
                    started.elapsed()
                } else {
                    Duration::ZERO
                }
            };
            match state.take(&Gpu, bytes)? {
                Take::Hit { block, lease } => return Ok(self.loan(block, lease, len)),
                Take::Pin { reservation, evict } => {
                    return self.pin(state, reservation, evict, len);
                }
                Take::TooLarge => return Err(shared.exhausted(&state, bytes, waited_for())),
                Take::Exhausted => match waits {
                    Waits::Nothing => return Err(shared.exhausted(&state, bytes, Duration::ZERO)),
                    Waits::ForDevice => {
                        // `take` polled every pending block and found none idle: wait for the oldest one's
                        // work, without the lock, then ask again.
                        let Some(marks) = state.oldest_pending_marks() else {
                            return Err(shared.exhausted(&state, bytes, waited_for()));
                        };
                        drop(state);
                        waited = true;
                        for (stream, mark) in &marks {
                            Gpu.synchronize(stream, mark)?;
                        }
                        state = shared.lock();
                    }
                    Waits::ForRoom => {
                        let now = Instant::now();
                        let left =
                            deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(now));
                        if left.is_zero() {
                            return Err(shared.exhausted(&state, bytes, waited_for()));
                        }
                        // A holder giving a buffer back (or a pin failing) wakes the wait; device work
                        // completing on a pending block does not, so while one is pending the wait is cut
                        // into polls (by `take`, at the top of the loop).
                        let timeout = if state.pending_bytes() > 0 {
                            pause.min(left)
                        } else {
                            left
                        };
                        waited = true;
                        state = shared
                            .room
                            .wait_timeout(state, timeout)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                        pause = (pause * 2).min(LONGEST_POLL);
                    }
                },
            }
        }
    }

    /// Serves a request that `take` decided to pin for (with `state`, the lock, still held): hands the evicted
    /// blocks to the release thread and pins a block of the reservation's class, without the lock.
    pub(super) fn pin<T>(
        &self,
        mut state: MutexGuard<'_, PoolState<Block, Stream, Point>>,
        reservation: Reservation,
        evict: Vec<Block>,
        len: usize,
    ) -> Result<Pinned<T>> {
        let shared = &*self.shared;
        // Only pinning needs the context current: a hit makes no driver call, and unpinning happens on the
        // release thread. It is made current before the lock is let go, so that if it cannot be, the take is
        // undone before anyone sees it: the evicted blocks, which no work uses, go back to the cache.
        let current = match shared.context.enter() {
            Ok(current) => current,
            Err(e) => {
                let evicted = evict.into_iter().map(|block| {
                    let class = block.bytes;
                    (block, class)
                });
                state.unpin_cancelled(reservation, evicted);
                drop(state);
                shared.room_made();
                return Err(e);
            }
        };
        drop(state);
        for block in evict {
            block::give_up(block, &shared.context);
        }
        // A block of the class given up earlier (by this pool or another of the context) whose unpinning still
        // waits for an idle device serves before a new pin: in a loop that never idles, that is what keeps
        // evictions from pinning more and more.
        let class = reservation.bytes();
        let pinned = node_of(shared.placement, shared.context.device())
            .map_err(|e| e.context(format_args!("pinning {} for the pool", Bytes(class))))
            .and_then(|node| {
                let fits = |b: &Block| b.ptr.as_ptr().addr().is_multiple_of(PAGE) && b.node == node;
                match reuse(&shared.context, POOL_FLAGS, class, class, fits) {
                    Some(block) => Ok(block),
                    None => {
                        let started = Instant::now();
                        let pinned =
                            block::pin(&shared.context, class, shared.pinning, shared.placement);
                        let nanos = started.elapsed().as_nanos() as u64;
                        shared.pin_nanos.fetch_add(nanos, Ordering::Relaxed);
                        pinned
                    }
                }
            });
        drop(current);
        let mut state = shared.lock();
        match pinned {
            Ok(block) => {
                let lease = state.pinned(reservation);
                Ok(self.loan(block, lease, len))
            }
            Err(e) => {
                state.pin_failed(reservation);
                drop(state);
                // Its reservation held room that a waiting request may use now.
                shared.room_made();
                Err(e)
            }
        }
    }

    /// A `Pinned<T>` over `len` elements of `block`, which comes back to this pool when it drops.
    pub(super) fn loan<T>(&self, block: Block, lease: Lease, len: usize) -> Pinned<T> {
        // SAFETY: the block holds at least `len * size_of::<T>()` bytes (its class covers the request), all
        // initialised (zeroed when pinned, or written by earlier holders) and any bytes are a valid `T: Pod`;
        // it is page-aligned (enough for `T`: `alloc_waiting` refuses types aligned to more than a page),
        // page-locked, and leased to this one buffer until it comes back.
        let host = unsafe { HostRegion::new(block.ptr.cast::<T>(), len) };
        let loan = Loan {
            lender: self.shared.clone(),
            block,
            lease,
        };
        Pinned::from_pool(host, self.shared.context.clone(), POOL_FLAGS, loan)
    }
}
