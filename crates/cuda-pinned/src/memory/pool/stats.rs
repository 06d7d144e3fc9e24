//! What a [`PinnedPool`] holds and has done ([`PoolStats`]), and giving up its idle blocks
//! ([`PinnedPool::trim`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{PinnedPool, block};
#[cfg(doc)]
use crate::driver::Context;
use crate::error::Result;
use crate::memory::tracked::Gpu;

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
    /// Gives up every idle block (cached, or given back with its device work completed by now); blocks in use
    /// or with work pending stay. Waits for nothing: the blocks leave the budget at once and are unpinned on
    /// the crate's release thread, which [`Context::synchronize`] waits for; a failed unpin leaks its block and
    /// is kept for [`Context::check_deferred_errors`].
    ///
    /// # Errors
    /// The driver's, from asking whether a block's device work has completed: that block stays pending; the
    /// idle ones are given up all the same.
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
}
