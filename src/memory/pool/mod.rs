//! `PinnedPool`: a caching allocator of page-locked host memory for staging buffers and batches.
//!
//! Pinning is slow (a fraction of a second per GiB) and takes memory from the operating system, so pinned
//! memory is worth keeping: the pool hands out [`Pinned`] buffers, takes them back when they are dropped, and
//! reuses a block only once every piece of device work recorded on it has completed. Its decisions (size
//! classes, the budget, reuse, eviction) are the pure state machine in `state.rs`; this file pins and unpins.

pub(crate) mod state;
#[cfg(test)]
mod tests;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytemuck::Pod;

use self::state::{Config, Lease, PoolState, Take};
use super::host::HostRegion;
use super::release::release_host;
use super::{Bytes, Gpu, GpuTracker, Mark, Pinned, PinnedBuilder, byte_len};
use crate::context::Context;
use crate::driver_call;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// The page size the pool's classes are multiples of.
const PAGE: usize = 4096;

/// What [`PinnedPool::alloc`] does when the budget leaves no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Return [`Error::PoolExhausted`] at once.
    Fail,
    /// Wait until buffers come back (and their device work completes).
    Wait,
}

/// How the pool pins a new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pinning {
    /// Whichever of the two below is faster on this machine, measured once per process on first use.
    Auto,
    /// `cuMemHostAlloc`, then the memory zeroed on several threads.
    HostAlloc,
    /// Ordinary page-aligned memory, its pages touched (zeroed) on several threads, then `cuMemHostRegister`.
    Register,
}

/// A caching allocator of pinned memory with a hard byte budget. Cheap to clone (clones share the pool);
/// thread-safe.
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
pub struct PinnedPool(Arc<Shared>);

struct Shared {
    context: Context,
    when_full: WhenFull,
    pinning: Pinning,
    state: Mutex<PoolState<Block, Stream, Mark>>,
    /// Signalled whenever a buffer comes back, for `WhenFull::Wait`.
    returned: Condvar,
    pin_nanos: AtomicU64,
}

/// How to make a [`PinnedPool`]: `PinnedPool::builder(&context, budget).when_full(WhenFull::Wait).build()`.
#[derive(Clone, Debug)]
#[must_use]
pub struct PoolBuilder {
    context: Context,
    budget: usize,
    when_full: WhenFull,
    pinning: Pinning,
}

impl PoolBuilder {
    /// What `alloc` does when the budget is reached (default [`WhenFull::Fail`]).
    pub fn when_full(mut self, when_full: WhenFull) -> PoolBuilder {
        self.when_full = when_full;
        self
    }

    /// How new blocks are pinned (default [`Pinning::Auto`]).
    pub fn pinning(mut self, pinning: Pinning) -> PoolBuilder {
        self.pinning = pinning;
        self
    }

    /// The pool. Pins nothing yet.
    pub fn build(self) -> PinnedPool {
        let state = PoolState::new(Config {
            budget: self.budget,
            page: PAGE,
        });
        PinnedPool(Arc::new(Shared {
            context: self.context,
            when_full: self.when_full,
            pinning: self.pinning,
            state: Mutex::new(state),
            returned: Condvar::new(),
            pin_nanos: AtomicU64::new(0),
        }))
    }
}

/// What a pool holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The pool's budget in bytes.
    pub budget: usize,
    /// Bytes pinned or being pinned: in use, cached and pending. Never more than `budget`.
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
    /// Cached blocks unpinned to make room for another class.
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
            pinning: Pinning::Auto,
        }
    }

    /// A pinned buffer of `len` elements: a cached block of its size class if one is idle (no driver call),
    /// else a newly pinned one. Its contents are whatever the block last held (zeroes when new): any bytes are a
    /// valid `T`. Dropping it gives the block back; it is reused once its device work has completed.
    ///
    /// # Errors
    /// [`Error::PoolExhausted`] when the budget leaves no room and the pool fails when full (a request larger
    /// than the whole budget fails either way); the driver's, from pinning.
    #[doc(alias = "cuMemHostAlloc")]
    #[doc(alias = "cuMemHostRegister")]
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_when_full(len, self.0.when_full, false)
    }

    /// [`PinnedPool::alloc`] that, when the budget leaves no room, waits for device work on blocks given back
    /// even under [`WhenFull::Fail`]: that wait ends without anyone's help, so it cannot deadlock. For the
    /// first buffer of a staged transfer, which may follow another transfer's still in flight.
    pub(crate) fn alloc_after_pending<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_when_full(len, self.0.when_full, true)
    }

    /// [`PinnedPool::alloc`] that never waits: [`Error::PoolExhausted`] when the budget leaves no room, whatever
    /// the pool's [`WhenFull`].
    ///
    /// # Errors
    /// As [`PinnedPool::alloc`] with [`WhenFull::Fail`].
    pub fn try_alloc<T: Pod>(&self, len: usize) -> Result<Pinned<T>> {
        self.alloc_when_full(len, WhenFull::Fail, false)
    }

    fn alloc_when_full<T: Pod>(
        &self,
        len: usize,
        when_full: WhenFull,
        wait_for_pending: bool,
    ) -> Result<Pinned<T>> {
        let bytes = byte_len::<T>(len, "allocating from the pinned pool")?;
        let shared = &self.0;
        if bytes == 0 {
            return PinnedBuilder::new(&shared.context).zeroed(0);
        }
        let mut state = shared.lock();
        loop {
            match state.take(&Gpu, bytes)? {
                Take::Hit { block, lease } => return Ok(self.loan(block, lease, len)),
                Take::Pin { reservation, evict } => {
                    // Only pinning and unpinning need the context current: a hit makes no driver call. It is
                    // made current before the lock is let go, so that if it cannot be, the take is undone before
                    // anyone sees it: the evicted blocks, which no work uses, go back to the cache, not leaked.
                    let current = match shared.context.enter() {
                        Ok(current) => current,
                        Err(e) => {
                            let evicted = evict.into_iter().map(|block| {
                                let class = block.bytes;
                                (block, class)
                            });
                            state.unpin_cancelled(reservation, evicted);
                            return Err(e);
                        }
                    };
                    drop(state);
                    for block in evict {
                        block.unpin(&shared.context);
                    }
                    let started = Instant::now();
                    let pinned = Block::pin(reservation.bytes(), shared.pinning);
                    let nanos = started.elapsed().as_nanos() as u64;
                    shared.pin_nanos.fetch_add(nanos, Ordering::Relaxed);
                    drop(current);
                    let mut state = shared.lock();
                    return match pinned {
                        Ok(block) => {
                            let lease = state.pinned(reservation);
                            Ok(self.loan(block, lease, len))
                        }
                        Err(e) => {
                            state.pin_failed(reservation);
                            Err(e)
                        }
                    };
                }
                Take::TooLarge => return Err(shared.exhausted(&state, bytes)),
                Take::Exhausted => match when_full {
                    WhenFull::Fail => {
                        if !(wait_for_pending && state.wait_for_any(&Gpu)?) {
                            return Err(shared.exhausted(&state, bytes));
                        }
                    }
                    WhenFull::Wait => {
                        if !state.wait_for_any(&Gpu)? {
                            // Nothing pending: wait for a holder to give a buffer back.
                            state = shared
                                .returned
                                .wait(state)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                },
            }
        }
    }

    /// Unpins every idle block, giving its memory back to the system: cached blocks, and blocks given back
    /// whose device work has completed by now. Blocks in use or with work still pending stay.
    ///
    /// # Errors
    /// The driver's, from querying events or unpinning (a block that fails to unpin is leaked).
    pub fn trim(&self) -> Result<()> {
        let _current = self.0.context.enter()?;
        let blocks = {
            let mut state = self.0.lock();
            state.poll_pending(&Gpu)?;
            state.trim()
        };
        for block in blocks {
            block.unpin(&self.0.context);
        }
        self.0.context.check_deferred_errors()
    }

    /// What the pool holds and has done.
    #[must_use]
    pub fn stats(&self) -> PoolStats {
        let state = self.0.lock();
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
            pin_time: Duration::from_nanos(self.0.pin_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The context the pool pins memory for.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// A `Pinned<T>` over `len` elements of `block`, which comes back to this pool when it drops.
    fn loan<T>(&self, block: Block, lease: Lease, len: usize) -> Pinned<T> {
        // SAFETY: the block holds at least `len * size_of::<T>()` bytes (its class covers the request), all
        // initialised (zeroed when pinned, or written by earlier holders) and any bytes are a valid `T: Pod`;
        // it is page-aligned, page-locked, and leased to this one buffer until it comes back.
        let host = unsafe { HostRegion::new(block.ptr.cast::<T>(), len) };
        Pinned::from_pool(
            host,
            self.0.context.clone(),
            Loan {
                pool: self.0.clone(),
                block: Some(block),
                lease: Some(lease),
            },
        )
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PoolState<Block, Stream, Mark>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn exhausted(&self, state: &PoolState<Block, Stream, Mark>, requested: usize) -> Error {
        let stats = state.stats();
        Error::PoolExhausted {
            requested,
            budget: state.config().budget,
            reserved: stats.reserved,
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every loan holds the pool, so nothing is in use: unpin the idle blocks, and hand the pending ones to
        // the process-wide deferred release, which frees them once their work has completed.
        let drained = self.lock().drain();
        if !drained.idle.is_empty() {
            match self.context.enter() {
                Ok(_current) => {
                    for block in drained.idle {
                        block.unpin(&self.context);
                    }
                }
                Err(e) => {
                    // Unpinning needs the context current; without it the idle blocks can only be leaked, and
                    // a destructor can only report that through the context.
                    let bytes = drained.idle.iter().map(|block| block.bytes).sum();
                    self.context.defer_error(e.context(format_args!(
                        "unpinning {} of the pool as it drops (leaked)",
                        Bytes(bytes)
                    )));
                }
            }
        }
        for pending in drained.pending {
            let block = pending.block;
            let release = Box::new(move || block.release());
            release_host(&self.context, pending.track, release, pending.bytes);
        }
    }
}

/// A pool block lent to a `Pinned`: given back when the `Pinned` drops.
pub(crate) struct Loan {
    pool: Arc<Shared>,
    block: Option<Block>,
    lease: Option<Lease>,
}

impl Loan {
    /// Gives the block back with the device work still in flight on it.
    pub(crate) fn give_back(mut self, track: GpuTracker) {
        if let (Some(block), Some(lease)) = (self.block.take(), self.lease.take()) {
            self.pool.lock().give_back(block, lease, track);
            self.pool.returned.notify_all();
        }
    }
}

/// A block of pinned memory, owned by the pool.
pub(crate) struct Block {
    ptr: NonNull<u8>,
    bytes: usize,
    /// Allocated by the Rust allocator and registered, rather than by `cuMemHostAlloc`.
    registered: bool,
}

// SAFETY: a block is memory the pool owns exclusively (lent to one `Pinned` at a time); its address means the
// same on every thread.
unsafe impl Send for Block {}

impl Block {
    /// Pins `bytes` (a multiple of the page size) the way `how` says, zeroed.
    fn pin(bytes: usize, how: Pinning) -> Result<Block> {
        match how {
            Pinning::Auto => Block::pin(bytes, fastest_pinning()),
            Pinning::HostAlloc => {
                let mut ptr = std::ptr::null_mut();
                // SAFETY: an out-pointer to a local; the caller's context is current. Freed in `release`.
                unsafe { driver_call!(cuMemHostAlloc(&mut ptr, bytes, 0)) }.map_err(|e| {
                    e.context(format_args!("pinning {} for the pool", Bytes(bytes)))
                })?;
                let ptr = NonNull::new(ptr.cast::<u8>())
                    .ok_or_else(|| Error::invalid("cuMemHostAlloc returned null"))?;
                zero(ptr, bytes);
                Ok(Block {
                    ptr,
                    bytes,
                    registered: false,
                })
            }
            Pinning::Register => {
                let layout = std::alloc::Layout::from_size_align(bytes, registered_align(bytes))
                    .map_err(|_| Error::invalid(format_args!("a pool block of {bytes} bytes")))?;
                // SAFETY: a layout of non-zero size (classes are at least a page). Freed in `release`.
                let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(|| {
                    Error::invalid(format_args!(
                        "the system could not allocate {}",
                        Bytes(bytes)
                    ))
                })?;
                advise_huge_pages(ptr, bytes);
                // Touching the pages faults them in on several threads at once, which is what makes this path
                // fast, and initialises them.
                zero(ptr, bytes);
                // SAFETY: `bytes` bytes of a live allocation owned by the block, unregistered in `release`.
                let registered =
                    unsafe { driver_call!(cuMemHostRegister_v2(ptr.as_ptr().cast(), bytes, 0)) };
                if let Err(e) = registered {
                    // SAFETY: allocated above with `layout`, never registered.
                    unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                    return Err(e.context(format_args!("pinning {} for the pool", Bytes(bytes))));
                }
                Ok(Block {
                    ptr,
                    bytes,
                    registered: true,
                })
            }
        }
    }

    /// Unpins and frees the block now, which no device work uses; an error is kept in the context (and the
    /// memory leaked).
    fn unpin(self, context: &Context) {
        let bytes = self.bytes;
        if let Err(e) = self.release() {
            context.defer_error(e.context(format_args!(
                "unpinning {} of the pool (leaked)",
                Bytes(bytes)
            )));
        }
    }

    /// Unpins and frees the block. The pool's context must be current, and no device work may use the block.
    fn release(self) -> Result<()> {
        let ptr = self.ptr.as_ptr();
        if self.registered {
            // SAFETY: registered in `pin`; no device work uses it.
            unsafe { driver_call!(cuMemHostUnregister(ptr.cast())) }?;
            // SAFETY: allocated in `pin` with this size and `registered_align` of it (a valid layout then), and no
            // longer registered.
            unsafe {
                std::alloc::dealloc(
                    ptr,
                    std::alloc::Layout::from_size_align_unchecked(
                        self.bytes,
                        registered_align(self.bytes),
                    ),
                )
            };
            Ok(())
        } else {
            // SAFETY: allocated by cuMemHostAlloc in `pin`; no device work uses it.
            unsafe { driver_call!(cuMemFreeHost(ptr.cast())) }
        }
    }
}

/// The alignment of a block allocated for registration: 2 MiB for blocks of at least that, so that the kernel
/// can back it with transparent huge pages (one page fault and one pinned page per 2 MiB instead of 512).
fn registered_align(bytes: usize) -> usize {
    const HUGE: usize = 2 << 20;
    if bytes >= HUGE { HUGE } else { PAGE }
}

/// Asks Linux to back the range with transparent huge pages where it can. Only advice: where huge pages are
/// off, nothing changes.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: NonNull<u8>, bytes: usize) {
    unsafe extern "C" {
        fn madvise(
            addr: *mut std::ffi::c_void,
            len: usize,
            advice: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    const MADV_HUGEPAGE: std::ffi::c_int = 14;
    // SAFETY: a page-aligned range of an allocation the caller owns; the advice changes no contents, and a failure
    // (huge pages unavailable) is harmless.
    let _ = unsafe { madvise(ptr.as_ptr().cast(), bytes, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: NonNull<u8>, _: usize) {}

/// Writes zeroes over `bytes` at `ptr` on several threads for large blocks: fresh pages are faulted in by the
/// first write, which is the slow part of pinning fresh memory, and spreads over cores.
fn zero(ptr: NonNull<u8>, bytes: usize) {
    const PER_THREAD: usize = 16 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(16);
    let threads = threads.min(bytes.div_ceil(PER_THREAD)).max(1);
    let piece = bytes.div_ceil(threads).next_multiple_of(PAGE);
    let base = ptr.as_ptr() as usize;
    std::thread::scope(|scope| {
        for start in (0..bytes).step_by(piece) {
            let len = piece.min(bytes - start);
            scope.spawn(move || {
                // SAFETY: a disjoint range of the block, which nothing else uses yet.
                unsafe { std::ptr::write_bytes((base + start) as *mut u8, 0, len) };
            });
        }
    });
}

/// The faster of `cuMemHostAlloc` and touch + `cuMemHostRegister` on this machine, measured once per process by
/// pinning 32 MiB each way (the first measured after a warm-up pin of each).
fn fastest_pinning() -> Pinning {
    static FASTEST: OnceLock<Pinning> = OnceLock::new();
    *FASTEST.get_or_init(|| {
        let time = |how| -> Option<Duration> {
            let started = Instant::now();
            let block = Block::pin(32 << 20, how).ok()?;
            let took = started.elapsed();
            block.release().ok()?;
            Some(took)
        };
        let _ = (time(Pinning::HostAlloc), time(Pinning::Register));
        match (time(Pinning::HostAlloc), time(Pinning::Register)) {
            (Some(alloc), Some(register)) if register < alloc => Pinning::Register,
            (Some(_), _) => Pinning::HostAlloc,
            (None, _) => Pinning::Register,
        }
    })
}
