//! `PinnedPool`: a caching allocator of page-locked host memory for staging buffers and batches.
//!
//! Pinning is slow (a fraction of a second per GiB) and takes memory from the operating system, so pinned
//! memory is worth keeping: the pool hands out [`Pinned`] buffers, takes them back when they are dropped, and
//! reuses a block only once every piece of device work recorded on it has completed. Its decisions (size
//! classes, the budget, reuse, eviction) are the pure state machine in `state.rs`; `block.rs` pins blocks and
//! hands them to the release thread to be unpinned; `alloc.rs` serves requests and waits for room, `awaited.rs`
//! the same as a future; `builder.rs` makes a pool and `stats.rs` reports on it and trims it; this file holds
//! what the clones of a pool share, and takes blocks back.
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

mod alloc;
mod awaited;
mod block;
mod builder;
pub(crate) mod state;
mod stats;
#[cfg(test)]
mod tests;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use self::awaited::PoolAlloc;
pub(crate) use self::block::POOL_FLAGS;
pub use self::block::Pinning;
pub use self::builder::{PoolBuilder, WhenFull};
use self::state::{Lease, PoolState};
pub use self::stats::PoolStats;
use super::block::Block;
use super::numa::Placement;
use super::pinned::Lender;
#[cfg(doc)]
use super::pinned::Pinned;
use super::release::retire;
use super::tracked::GpuTracker;
use crate::driver::marks::Point;
use crate::driver::{Context, Stream};
use crate::error::Error;

/// What a request names in its errors.
const ALLOCATING: &str = "allocating from the pinned pool";

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

impl PinnedPool {
    /// The context the pool pins memory for.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.shared.context
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

impl Lender for Shared {
    fn give_back(&self, block: Block, lease: Lease, track: GpuTracker) {
        self.lock().give_back(block, lease, track);
        self.room_made();
    }
}
