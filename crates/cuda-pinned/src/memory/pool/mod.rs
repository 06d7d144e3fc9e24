//! `PinnedPool`: a caching allocator of page-locked host memory for staging buffers and batches.
//!
//! Pinning is slow (a fraction of a second per GiB) and takes memory from the operating system, so pinned
//! memory is worth keeping: the pool hands out [`Pinned`] buffers, takes them back when they are dropped, and
//! reuses a block only once every piece of device work recorded on it has completed. Its decisions (size
//! classes, the budget, reuse, eviction) are the pure state machine in `state.rs`; `block.rs` pins blocks and
//! hands them to the release thread to be unpinned; this file serves requests and waits for room.
//!
//! What the pool never does (the crate's rules "No hidden waits" and "No hangs"):
//! - unpin on the caller's thread: `cuMemFreeHost` and `cuMemHostUnregister` wait for *all* work on the
//!   device, so evicted, trimmed and dropped blocks go to the release thread (`release.rs`);
//! - wait while holding its lock: a request that must wait for room waits for device work on a block given
//!   back with the block's marks cloned out of the state, or on a condition variable, so other threads' hits
//!   and pins go on meanwhile;
//! - wait without end: a [`WhenFull::Wait`] pool gives up at its [`PoolBuilder::max_wait`], and the waits the
//!   crate itself asks for (`alloc_after_pending`, a prefetcher's slots) wait only for device work, which
//!   ends by itself, never for buffers that someone holds (perhaps the waiting thread, or nobody: a forgotten
//!   buffer keeps its bytes in use for good).

mod block;
pub(crate) mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytemuck::Pod;

pub(crate) use self::block::POOL_FLAGS;
pub use self::block::Pinning;
use self::state::{Config, Lease, PoolState, Reservation, Take};
use super::block::{Block, PAGE, node_of};
use super::host::HostRegion;
use super::layout::{byte_len, check_alignment};
use super::numa::Placement;
use super::pinned::{Pinned, PinnedBuilder};
use super::release::{retire, reuse};
use super::tracked::{Gpu, GpuTracker};
use crate::driver::Context;
use crate::driver::Stream;
use crate::driver::marks::Point;
use crate::error::{Error, Result};
use crate::future::Done;
use crate::track::Timeline;
use crate::units::Bytes;

/// What a request names in its errors.
const ALLOCATING: &str = "allocating from the pinned pool";

/// How long a request of a [`WhenFull::Wait`] pool first sleeps between polls of the blocks given back with
/// device work pending; the pause doubles up to [`LONGEST_POLL`] while nothing comes back. A buffer given back,
/// or a pin that fails, wakes it at once.
const FIRST_POLL: Duration = Duration::from_micros(50);
const LONGEST_POLL: Duration = Duration::from_millis(2);

/// What [`PinnedPool::alloc`] does when the budget leaves no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Return [`Error::PoolExhausted`] at once.
    Fail,
    /// Wait until buffers come back (and their device work completes), for at most the pool's
    /// [`PoolBuilder::max_wait`] (a minute unless set); then [`Error::PoolExhausted`], saying how long it
    /// waited. A buffer that never comes back (one the waiting thread holds itself, or one forgotten with
    /// `mem::forget`) can only end the wait at that deadline.
    Wait,
}

/// A caching allocator of pinned memory with a hard byte budget. Cheap to clone (clones share the pool);
/// thread-safe.
///
/// Blocks the pool gives up (evicted to make room for another size class, trimmed, or cached when the pool
/// drops) leave its budget at once and are unpinned on the crate's release thread once every device is idle,
/// because the driver's unpinning waits for all work on the device; [`Context::synchronize`] waits until they
/// are. Until then such a block serves the next block of its size class that this pool (or another pool of the
/// context) would pin, with no driver call: while some device is never idle, a pool whose requests cycle through
/// size classes takes back the blocks it gave up instead of pinning more and more.
///
/// ```no_run
/// # fn main() -> cuda_pinned::Result<()> {
/// use cuda_pinned::{Context, PinnedPool};
/// let context = Context::on(0)?;
/// let pool = PinnedPool::new(&context, 1 << 30); // at most 1 GiB pinned
/// let batch = pool.alloc::<f32>(1 << 20)?; // a `Pinned<f32>`: pinned on a miss, reused on a hit
/// drop(batch); // back to the pool, reusable once the device work on it has completed
/// assert_eq!(pool.stats().misses, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PinnedPool {
    shared: Arc<Shared>,
    /// What [`PinnedPool::alloc`] waits for when the budget leaves no room: the pool's [`WhenFull`], or less
    /// through [`PinnedPool::waiting_only_for_device`].
    waits: Waits,
}

/// What a request waits for when the budget leaves no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waits {
    /// Nothing: [`Error::PoolExhausted`] at once.
    Nothing,
    /// Device work on blocks given back, one block at a time, which ends by itself; never for holders to give
    /// buffers back. [`Error::PoolExhausted`] once nothing is pending.
    ForDevice,
    /// Device work on blocks given back and holders giving buffers back, until the pool's `max_wait`.
    ForRoom,
}

struct Shared {
    context: Context,
    max_wait: Duration,
    pinning: Pinning,
    placement: Placement,
    state: Mutex<PoolState<Block, Stream, Point>>,
    /// Signalled whenever room may have been made (a buffer given back, a pin that failed), for the requests
    /// waiting for room.
    room: Condvar,
    /// The tasks awaiting room ([`PinnedPool::alloc_async`]), woken with `room`'s signal.
    room_wakers: Mutex<Vec<std::task::Waker>>,
    pin_nanos: AtomicU64,
}

/// How to make a [`PinnedPool`]: `PinnedPool::builder(&context, budget).when_full(WhenFull::Wait).build()`.
#[derive(Clone, Debug)]
#[must_use]
pub struct PoolBuilder {
    context: Context,
    budget: usize,
    when_full: WhenFull,
    max_wait: Duration,
    pinning: Pinning,
    placement: Placement,
}

impl PoolBuilder {
    /// The default of [`PoolBuilder::max_wait`]: a minute.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(60);

    /// What `alloc` does when the budget is reached (default [`WhenFull::Fail`]).
    pub fn when_full(mut self, when_full: WhenFull) -> PoolBuilder {
        self.when_full = when_full;
        self
    }

    /// The longest a request of a [`WhenFull::Wait`] pool waits for room before it returns
    /// [`Error::PoolExhausted`] (default [`PoolBuilder::DEFAULT_MAX_WAIT`], a minute). Long enough for buffers
    /// to come back from other threads and for device work on blocks given back to complete; a wait that
    /// lasts longer usually means that the room is held by something that will not give it back. No effect on
    /// a pool that fails when full.
    pub fn max_wait(mut self, max_wait: Duration) -> PoolBuilder {
        self.max_wait = max_wait;
        self
    }

    /// How new blocks are pinned (default [`Pinning::Auto`]).
    pub fn pinning(mut self, pinning: Pinning) -> PoolBuilder {
        self.pinning = pinning;
        self
    }

    /// Which NUMA node new blocks are placed on (default [`Placement::DeviceNode`]: the node of the context's
    /// device, on hosts of several nodes). The pool's buffers serve every device's streams (they are portable);
    /// on a host of several nodes, a pool per device, each placed on its device's node, keeps every transfer
    /// next to its GPU.
    pub fn placement(mut self, placement: Placement) -> PoolBuilder {
        self.placement = placement;
        self
    }

    /// The pool. Pins nothing yet.
    pub fn build(self) -> PinnedPool {
        let state = PoolState::new(Config {
            budget: self.budget,
            page: PAGE,
        });
        let waits = match self.when_full {
            WhenFull::Fail => Waits::Nothing,
            WhenFull::Wait => Waits::ForRoom,
        };
        PinnedPool {
            shared: Arc::new(Shared {
                context: self.context,
                max_wait: self.max_wait,
                pinning: self.pinning,
                placement: self.placement,
                state: Mutex::new(state),
                room: Condvar::new(),
                room_wakers: Mutex::new(Vec::new()),
                pin_nanos: AtomicU64::new(0),
            }),
            waits,
        }
    }
}

/// What a pool holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The pool's budget in bytes.
    pub budget: usize,
    /// Bytes counted against the budget: in use, cached, pending and being pinned. Never more than `budget`.
    /// (Blocks given up leave it at once, before the release thread has unpinned them.)
    pub reserved: usize,
    /// The most `reserved` has been.
    pub peak_reserved: usize,
    /// Bytes of the blocks handed out and not yet back (their classes).
    pub in_use: usize,
    /// Bytes requested of those blocks: `in_use - requested_in_use` is what the size classes waste.
    pub requested_in_use: usize,
    /// Bytes of idle blocks ready for reuse.
    pub cached: usize,
    /// Bytes of blocks back from their users whose device work has not completed yet.
    pub pending: usize,
    /// Requests served by a cached block.
    pub hits: u64,
    /// Requests that pinned a new block.
    pub misses: u64,
    /// Cached blocks given up to make room for another class (unpinned on the release thread).
    pub evictions: u64,
    /// Time spent pinning new blocks.
    pub pin_time: Duration,
}

impl PinnedPool {
    /// A pool of at most `budget` bytes of pinned memory that fails when full, pinning the faster way.
    pub fn new(context: &Context, budget: usize) -> PinnedPool {
        PinnedPool::builder(context, budget).build()
    }

    /// A builder for a pool with other settings.
    pub fn builder(context: &Context, budget: usize) -> PoolBuilder {
        PoolBuilder {
            context: context.clone(),
            budget,
            when_full: WhenFull::Fail,
            max_wait: PoolBuilder::DEFAULT_MAX_WAIT,
            pinning: Pinning::Auto,
            placement: Placement::default(),
        }
    }

    /// A pinned buffer of `len` elements: a cached block of its size class if one is idle (no driver call),
    /// else a newly pinned one. Its contents are whatever the block last held (zeroes when new): any bytes are a
    /// valid `T`. Dropping it gives the block back; it is reused once its device work has completed.
    ///
    /// The buffer is aligned to a page (4096 bytes); an element type aligned more strictly is refused.
    ///
    /// When the budget leaves no room even with the cached blocks of other classes given up, a pool that
    /// fails when full returns at once; one that waits ([`WhenFull::Wait`]) waits, without holding up other
    /// threads' requests, until buffers come back or device work on blocks given back completes, for at
    /// most [`PoolBuilder::max_wait`]. Cached blocks given up to make room are unpinned on the crate's release
    /// thread, not on the caller's.
    ///
    /// # Errors
    /// An invalid-argument error, before anything is taken, if `T` is aligned to more than 4096 bytes or the
    /// byte size overflows. [`Error::PoolExhausted`] when the budget leaves no room and the pool fails when
    /// full, or after waiting `max_wait` for room (a request larger than the whole budget fails at once
    /// either way); the driver's, from pinning or from finding out whether device work has completed.
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
    fn pin<T>(
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

    /// Gives up every idle block: cached blocks, and blocks given back whose device work has completed by
    /// now. Blocks in use or with work still pending stay.
    ///
    /// Returns at once: the blocks leave the budget now and are unpinned, their memory given back to the
    /// system, shortly after on the crate's release thread (the driver's unpinning waits for all work on the
    /// device, which the caller does not). [`Context::synchronize`] waits until they are. A block that fails
    /// to unpin is leaked, and the error kept for [`Context::check_deferred_errors`].
    ///
    /// # Errors
    /// The driver's, from finding out whether device work on a block given back has completed: that block
    /// stays pending; the idle blocks are given up all the same.
    pub fn trim(&self) -> Result<()> {
        let (polled, blocks) = {
            let mut state = self.shared.lock();
            let polled = state.poll_pending(&Gpu);
            (polled, state.trim())
        };
        for block in blocks {
            block::give_up(block, &self.shared.context);
        }
        polled.map(drop)
    }

    /// What the pool holds and has done.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        let s = state.stats();
        PoolStats {
            budget: state.config().budget,
            reserved: s.reserved,
            peak_reserved: s.peak_reserved,
            in_use: s.in_use,
            requested_in_use: s.requested_in_use,
            cached: s.cached,
            pending: s.pending,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            pin_time: Duration::from_nanos(self.shared.pin_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The context the pool pins memory for.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.shared.context
    }

    /// A `Pinned<T>` over `len` elements of `block`, which comes back to this pool when it drops.
    fn loan<T>(&self, block: Block, lease: Lease, len: usize) -> Pinned<T> {
        // SAFETY: the block holds at least `len * size_of::<T>()` bytes (its class covers the request), all
        // initialised (zeroed when pinned, or written by earlier holders) and any bytes are a valid `T: Pod`;
        // it is page-aligned (enough for `T`: `alloc_waiting` refuses types aligned to more than a page),
        // page-locked, and leased to this one buffer until it comes back.
        let host = unsafe { HostRegion::new(block.ptr.cast::<T>(), len) };
        let loan = Loan {
            pool: self.shared.clone(),
            block: Some(block),
            lease: Some(lease),
        };
        let give_back = Box::new(move |track| loan.give_back(track));
        Pinned::from_pool(host, self.shared.context.clone(), POOL_FLAGS, give_back)
    }
}

impl Shared {
    /// The wakers of the tasks awaiting room, locked.
    fn room_wakers(&self) -> MutexGuard<'_, Vec<std::task::Waker>> {
        self.room_wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the requests waiting for room, threads and tasks, that some may have been made.
    fn room_made(&self) {
        self.room.notify_all();
        let wakers = std::mem::take(&mut *self.room_wakers());
        for waker in wakers {
            // Others' code: a waker that panics must not take the giver (a buffer's drop) with it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState<Block, Stream, Point>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn exhausted(
        &self,
        state: &PoolState<Block, Stream, Point>,
        requested: usize,
        waited: Duration,
    ) -> Error {
        let stats = state.stats();
        Error::PoolExhausted {
            requested,
            budget: state.config().budget,
            reserved: stats.reserved,
            waited,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every loan holds the pool, so nothing is in use: the idle blocks go to the release thread to be unpinned
        // now, and the pending ones to be released once their work has completed.
        let drained = self.lock().drain();
        for block in drained.idle {
            block::give_up(block, &self.context);
        }
        for pending in drained.pending {
            retire(&self.context, pending.track, pending.block);
        }
    }
}

/// A pool block lent to a `Pinned`: given back when the `Pinned` drops.
struct Loan {
    pool: Arc<Shared>,
    block: Option<Block>,
    lease: Option<Lease>,
}

impl Loan {
    /// Gives the block back with the device work still in flight on it.
    fn give_back(mut self, track: GpuTracker) {
        if let (Some(block), Some(lease)) = (self.block.take(), self.lease.take()) {
            self.pool.lock().give_back(block, lease, track);
            self.pool.room_made();
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
