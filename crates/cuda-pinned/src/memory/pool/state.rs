//! The pure core of the pinned-memory pool: which block serves a request, when a returned block may be reused,
//! what to evict, and the byte accounting that keeps the pool within its budget. No FFI and no unsafe: the rest
//! of the pool (`alloc.rs`, `block.rs`) pins and unpins, this state decides, and it is tested on the CPU against
//! a simulated device through the same [`Timeline`] the buffers use.
//!
//! # Where a block is
//!
//! Every byte the pool has reserved is in exactly one of four places, and their sum, `reserved`, never exceeds
//! [`Config::budget`]:
//! - **reserving**: promised to a pin in progress. [`PoolState::take`] hands out a [`Reservation`], which the
//!   caller turns into a block by pinning and then [`PoolState::pinned`], or returns with
//!   [`PoolState::pin_failed`]. Counting it at once keeps two threads that both miss from pinning past the
//!   budget between `take` and `pinned`.
//! - **in use**: held by a caller, with a [`Lease`] that comes back with the block in [`PoolState::give_back`].
//!   The state holds no handle to it, only its bytes.
//! - **pending**: given back while device work recorded on it may still run; kept with its [`Tracker`] until
//!   [`Tracker::is_idle`] says every entry completed (the rule "Release after completion"), and never handed out or evicted before.
//! - **cached**: idle, reusable at once by a request of its class, or removed (evicted to make room for a pin of
//!   another class, or trimmed) for the caller to unpin.
//!
//! # Size classes
//!
//! A request of up to one page reserves one page. A larger request of `n` bytes is rounded up to a multiple of
//! `g = max(page, n.next_power_of_two() / 16)`: one page while `n <= 16 pages`, else one sixteenth of the
//! power of two above `n`. The class is never more than that power of two (a multiple of `g`), so it has the same
//! power of two above it, and rounding it again changes nothing. The waste `class - n` is less than `g`: up to
//! 16 pages, less than one page, the rounding every pinned allocation has anyway (and under 12.5% of requests of
//! more than 8 pages); above 16 pages, `g = n.next_power_of_two() / 16 < 2n / 16 = n / 8`, so less than 12.5%
//! of the request. Above 16 pages each octave `(2^k, 2^(k+1)]` holds 8 classes, so requests of similar sizes
//! share blocks, and large requests are never rounded to a power of two (up to 100% waste).
//!
//! Only a cached block of the request's exact class serves it. A larger block could serve a smaller request
//! with bounded waste, but then a block's class would no longer follow from the request, the accounting of
//! waste would compound, and a large block held for a small request would starve requests of its own class;
//! the eviction of least-recently-used blocks already turns unused classes into room for new ones.

use std::collections::{BTreeMap, VecDeque};

use crate::track::{Timeline, Tracker};

/// The pool's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config {
    /// The most bytes the pool may have reserved at once: in use, cached, pending and being pinned.
    pub(crate) budget: usize,
    /// The host page size, a power of two (4096 on x86-64 Linux): the smallest class and the granule of
    /// small ones.
    pub(crate) page: usize,
}

/// What [`PoolState::take`] decided for a request.
#[derive(Debug)]
pub(crate) enum Take<B> {
    /// A cached idle block of the request's class, now in use; give it back with `lease`.
    Hit {
        /// The block, with no device work in flight on it.
        block: B,
        /// What the holder owes the pool: pass it back to [`PoolState::give_back`] with the block.
        lease: Lease,
    },
    /// No idle block of the class: unpin every block of `evict` (removed from the cache to make room; their
    /// device work has completed), then pin a new block of [`Reservation::bytes`] and report the outcome with
    /// [`PoolState::pinned`] or [`PoolState::pin_failed`].
    Pin {
        /// Counts the new block against the budget until it is pinned or the pin fails.
        reservation: Reservation,
        /// Cached blocks of other classes, least recently used first, that no longer count against the budget.
        evict: Vec<B>,
    },
    /// The class fits the budget, but not now: blocks in use, pending and being pinned leave too little room
    /// even with the cache emptied. Nothing was evicted. Waiting for pending blocks can help when
    /// [`PoolState::pending_bytes`] is nonzero (see [`PoolState::oldest_pending_marks`]); so can other holders
    /// giving blocks back, and pins in progress that fail.
    Exhausted,
    /// The request's class exceeds the whole budget (or `usize`): no amount of waiting can serve it.
    TooLarge,
}

/// The bytes of a pin in progress, counted against the budget. Not `Clone`: one reservation, one pin. Forgetting
/// one keeps its bytes reserved for the life of the pool (conservative: the budget only shrinks).
#[derive(Debug)]
#[must_use = "a reservation must be passed to `pinned` or `pin_failed`, or its bytes stay reserved"]
pub(crate) struct Reservation {
    class: usize,
    requested: usize,
}

impl Reservation {
    /// How many bytes to pin: the request's class.
    pub(crate) fn bytes(&self) -> usize {
        self.class
    }

    /// The bytes the caller asked for (read by the model in `fuzzing.rs`; the pool needs only the class).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn requested(&self) -> usize {
        self.requested
    }
}

/// What a block in use owes the pool: its class and the bytes requested of it. Not `Clone`: one block, one lease.
#[derive(Debug)]
#[must_use = "a lease must come back with its block through `give_back`, or its bytes stay reserved"]
pub(crate) struct Lease {
    class: usize,
    requested: usize,
}

impl Lease {
    /// The size of the block: its class (read by the model in `fuzzing.rs`; the pool needs only the class).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn bytes(&self) -> usize {
        self.class
    }

    /// The bytes the caller asked for (at most [`Lease::bytes`]).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn requested(&self) -> usize {
        self.requested
    }
}

/// A block that was still pending when the pool was drained: to be released only once `track` is idle.
#[derive(Debug)]
pub(crate) struct PendingBlock<B, S, M> {
    /// The block.
    pub(crate) block: B,
    /// Its size (class) in bytes.
    pub(crate) bytes: usize,
    /// The device work that may still use it.
    pub(crate) track: Tracker<S, M>,
}

/// Everything [`PoolState::drain`] removed: idle blocks to unpin now, pending ones to release once idle.
#[derive(Debug)]
pub(crate) struct Drained<B, S, M> {
    /// Cached blocks, idle: unpin them.
    pub(crate) idle: Vec<B>,
    /// Blocks with device work maybe in flight, oldest given back first.
    pub(crate) pending: Vec<PendingBlock<B, S, M>>,
}

/// The pool's counters and byte sums, all exact. `reserved == in_use + cached + pending + reserving`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stats {
    /// The sum of the requested sizes of the blocks in use; `in_use - requested_in_use` is the waste of the
    /// size classes.
    pub(crate) requested_in_use: usize,
    /// Bytes (classes) of the blocks in use.
    pub(crate) in_use: usize,
    /// Bytes of the cached idle blocks.
    pub(crate) cached: usize,
    /// Bytes of the blocks given back with device work that may still be in flight.
    pub(crate) pending: usize,
    /// Bytes of the pins in progress (reservations not yet `pinned` or `pin_failed`).
    pub(crate) reserving: usize,
    /// All of the above but `requested_in_use`: never above the budget.
    pub(crate) reserved: usize,
    /// The highest `reserved` so far.
    pub(crate) peak_reserved: usize,
    /// Requests served by a cached block.
    pub(crate) hits: u64,
    /// Requests that needed a new pin (`Take::Pin`), whether the pin then succeeded or not.
    pub(crate) misses: u64,
    /// Pins that failed (`pin_failed`).
    pub(crate) failed_pins: u64,
    /// Cached blocks removed to make room for a pin.
    pub(crate) evictions: u64,
    /// Cached blocks removed by `trim` or `drain`.
    pub(crate) trimmed: u64,
}

/// The pool's bookkeeping; see the module docs. The caller serializes access (the pool holds it in a `Mutex`).
#[derive(Debug)]
pub(crate) struct PoolState<B, S, M> {
    config: Config,
    /// Cached idle blocks by (class, stamp): the last of a class is its most recently cached, served first.
    cached: BTreeMap<(usize, u64), B>,
    /// The same blocks by stamp, oldest first: the eviction order. Always the same keys as `cached`.
    lru: BTreeMap<u64, usize>,
    /// Blocks given back with device work recorded, oldest first.
    pending: VecDeque<PendingBlock<B, S, M>>,
    /// Increases on every block cached, so stamps order blocks by when they were last given back or found idle.
    next_stamp: u64,
    stats: Stats,
}

impl<B, S: Clone + Eq, M: Clone + Eq> PoolState<B, S, M> {
    /// An empty pool.
    ///
    /// # Panics
    /// If `config.page` is not a power of two (the size classes rely on it; every OS page size is one).
    pub(crate) fn new(config: Config) -> Self {
        assert!(
            config.page.is_power_of_two(),
            "pool page size {} is not a power of two",
            config.page
        );
        PoolState {
            config,
            cached: BTreeMap::new(),
            lru: BTreeMap::new(),
            pending: VecDeque::new(),
            next_stamp: 0,
            stats: Stats::default(),
        }
    }

    /// The pool's limits.
    pub(crate) fn config(&self) -> Config {
        self.config
    }

    /// The size class of a request of `bytes`: the bytes a block serving it has (see the module docs). `None`
    /// only when it would exceed `usize` (requests above `isize::MAX`, which no allocation can have).
    pub(crate) fn class_of(&self, bytes: usize) -> Option<usize> {
        crate::memory::block::class_of(bytes, self.config.page)
    }

    /// Serves a request of `bytes`: an idle cached block of its class if there is one; else, after polling every
    /// pending block (so that one slow stream does not hold back the others) and moving the idle ones to the
    /// cache, such a block if one turned up; else a reservation for a new pin, with the least recently used
    /// cached blocks of other classes to unpin first if the budget needs the room; else `Exhausted`, evicting
    /// nothing. `TooLarge` if the class exceeds the whole budget.
    ///
    /// Returns at once: polling queries events without blocking (recording them, for work that has none yet).
    ///
    /// # Errors
    /// The first failed `record` or `is_complete` while polling pending blocks. The block it concerned stays
    /// pending; the others were polled all the same, and those found idle are cached. Nothing is handed out.
    pub(crate) fn take<T>(&mut self, t: &T, bytes: usize) -> Result<Take<B>, T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        let budget = self.config.budget;
        let Some(class) = self.class_of(bytes).filter(|&class| class <= budget) else {
            return Ok(Take::TooLarge);
        };
        if let Some(block) = self.take_cached(class) {
            return Ok(self.hit(block, class, bytes));
        }
        if !self.pending.is_empty() {
            self.poll_pending(t)?;
            if let Some(block) = self.take_cached(class) {
                return Ok(self.hit(block, class, bytes));
            }
        }
        // What eviction cannot free: in use, pending, being pinned. `fixed <= reserved <= budget`: no underflow.
        let fixed = self.reserved() - self.stats.cached;
        if class > budget - fixed {
            return Ok(Take::Exhausted);
        }
        let mut evict = Vec::new();
        while class > budget - self.reserved() {
            let (stamp, victim) = self
                .lru
                .pop_first()
                .expect("pool: the cache covers the shortfall, checked above");
            let block = self
                .cached
                .remove(&(victim, stamp))
                .expect("pool: `lru` and `cached` hold the same blocks");
            self.stats.cached -= victim;
            self.stats.evictions += 1;
            evict.push(block);
        }
        self.stats.reserving += class;
        self.stats.misses += 1;
        self.note_peak();
        Ok(Take::Pin {
            reservation: Reservation {
                class,
                requested: bytes,
            },
            evict,
        })
    }

    /// The pin of `reservation` succeeded: its block is in use, and owes the returned lease.
    pub(crate) fn pinned(&mut self, reservation: Reservation) -> Lease {
        let Reservation { class, requested } = reservation;
        self.stats.reserving -= class;
        self.stats.in_use += class;
        self.stats.requested_in_use += requested;
        Lease { class, requested }
    }

    /// The pin of `reservation` failed: its bytes are free again.
    pub(crate) fn pin_failed(&mut self, reservation: Reservation) {
        self.stats.reserving -= reservation.class;
        self.stats.failed_pins += 1;
    }

    /// Undoes a [`Take::Pin`] whose pin could not even start (the caller could not start pinning):
    /// as [`PoolState::pin_failed`], and the evicted blocks, each given with its class, are cached again, as the
    /// most recently used, rather than leaked. Call it before anyone else uses the state after that `take`: the
    /// budget has room for the evicted blocks again only while no other reservation took it.
    pub(crate) fn unpin_cancelled(
        &mut self,
        reservation: Reservation,
        evicted: impl IntoIterator<Item = (B, usize)>,
    ) {
        self.pin_failed(reservation);
        for (block, class) in evicted {
            self.stats.evictions -= 1;
            self.cache(block, class);
        }
    }

    /// Takes back a block in use, with its lease and the device work recorded on it: cached at once if
    /// `track` is empty, else pending until it is idle. Returns at once, with no device call.
    pub(crate) fn give_back(&mut self, block: B, lease: Lease, track: Tracker<S, M>) {
        let Lease { class, requested } = lease;
        self.stats.in_use -= class;
        self.stats.requested_in_use -= requested;
        if track.is_empty() {
            self.cache(block, class);
        } else {
            self.stats.pending += class;
            self.pending.push_back(PendingBlock {
                block,
                bytes: class,
                track,
            });
        }
    }

    /// What to wait for to see the oldest pending block idle: the stream and mark of every entry of its
    /// tracker, cloned; `None` if nothing is pending. For a caller that must wait for room after `Exhausted`:
    /// it waits for each mark ([`Timeline::synchronize`]) *without* holding the lock the state is behind, so
    /// that other threads' hits and pins go on meanwhile, then takes the lock again and asks again
    /// ([`PoolState::take`] or [`PoolState::poll_pending`] then find the block idle and cache it, if nobody
    /// else did by then). Makes no device call.
    pub(crate) fn oldest_pending_marks(&self) -> Option<Vec<(S, M)>> {
        self.pending.front().map(|oldest| oldest.track.marks())
    }

    /// Removes every cached idle block, for the caller to unpin; pending blocks stay. Reserved bytes drop by
    /// theirs.
    pub(crate) fn trim(&mut self) -> Vec<B> {
        self.lru.clear();
        let blocks: Vec<B> = std::mem::take(&mut self.cached).into_values().collect();
        self.stats.trimmed += blocks.len() as u64;
        self.stats.cached = 0;
        blocks
    }

    /// Removes every block the pool holds (cached and pending), as when the pool is dropped: the idle ones to
    /// unpin now, the pending ones to release once their work completes. Blocks in use and reservations stay
    /// counted until they come back.
    pub(crate) fn drain(&mut self) -> Drained<B, S, M> {
        let idle = self.trim();
        let pending: Vec<_> = self.pending.drain(..).collect();
        self.stats.pending = 0;
        Drained { idle, pending }
    }

    /// The counters and byte sums.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            reserved: self.reserved(),
            ..self.stats
        }
    }

    /// Bytes of the blocks waiting for their device work: if nonzero after `Exhausted`, waiting for their work
    /// (see [`PoolState::oldest_pending_marks`]) can make room.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.stats.pending
    }

    /// Polls every pending block, caching the idle ones; how many it cached. On error, the rest are still
    /// polled, and the first error is returned.
    pub(crate) fn poll_pending<T>(&mut self, t: &T) -> Result<usize, T::Error>
    where
        T: Timeline<Stream = S, Mark = M>,
    {
        let mut first_error = None;
        let mut cached = 0;
        let mut i = 0;
        while i < self.pending.len() {
            match self.pending[i].track.is_idle(t) {
                Ok(true) => {
                    let idle = self
                        .pending
                        .remove(i)
                        .expect("pool: index within pending, checked by the loop");
                    self.stats.pending -= idle.bytes;
                    self.cache(idle.block, idle.bytes);
                    cached += 1;
                }
                Ok(false) => i += 1,
                Err(e) => {
                    // Not known idle: it stays pending ("Release after completion"), and the others are still worth polling.
                    first_error.get_or_insert(e);
                    i += 1;
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(cached),
        }
    }

    /// The most recently cached block of `class`, removed from the cache.
    fn take_cached(&mut self, class: usize) -> Option<B> {
        let (&key, _) = self
            .cached
            .range((class, 0)..=(class, u64::MAX))
            .next_back()?;
        self.lru.remove(&key.1);
        self.stats.cached -= class;
        self.cached.remove(&key)
    }

    /// Hands out `block` of `class` for a request of `requested` bytes.
    fn hit(&mut self, block: B, class: usize, requested: usize) -> Take<B> {
        self.stats.hits += 1;
        self.stats.in_use += class;
        self.stats.requested_in_use += requested;
        Take::Hit {
            block,
            lease: Lease { class, requested },
        }
    }

    /// Adds an idle block to the cache as its most recently used.
    fn cache(&mut self, block: B, class: usize) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.cached.insert((class, stamp), block);
        self.lru.insert(stamp, class);
        self.stats.cached += class;
    }

    fn reserved(&self) -> usize {
        let s = &self.stats;
        s.in_use + s.cached + s.pending + s.reserving
    }

    /// Records a new peak of `reserved`, which only a reservation in `take` makes grow.
    fn note_peak(&mut self) {
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.reserved());
    }

    /// Checks the internal bookkeeping: the two cache indexes agree, and the byte sums match the blocks held.
    /// For the model in `fuzzing.rs` (the tests and the fuzz target); the pool never calls it.
    ///
    /// # Panics
    /// If any of it does not hold.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn assert_consistent(&self) {
        assert_eq!(self.cached.len(), self.lru.len(), "cache indexes differ");
        for &(class, stamp) in self.cached.keys() {
            assert_eq!(self.lru.get(&stamp), Some(&class), "cache indexes differ");
            assert!(stamp < self.next_stamp);
        }
        let cached: usize = self.cached.keys().map(|&(class, _)| class).sum();
        assert_eq!(cached, self.stats.cached, "cached bytes");
        let pending: usize = self.pending.iter().map(|p| p.bytes).sum();
        assert_eq!(pending, self.stats.pending, "pending bytes");
        assert!(self.stats.requested_in_use <= self.stats.in_use);
        assert!(self.reserved() <= self.config.budget, "over budget");
        assert!(self.reserved() <= self.stats.peak_reserved);
    }

    /// The classes of the cached blocks, least recently used first.
    #[cfg(test)]
    pub(super) fn cached_classes(&self) -> Vec<usize> {
        self.lru.values().copied().collect()
    }
}
