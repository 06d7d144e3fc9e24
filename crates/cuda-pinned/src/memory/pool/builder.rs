//! Making a [`PinnedPool`]: what it does when full ([`WhenFull`]) and the other settings of its
//! [`PoolBuilder`].

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::block::Pinning;
use super::state::{Config, PoolState};
use super::{PinnedPool, Shared, Waits};
use crate::driver::Context;
#[cfg(doc)]
use crate::error::Error;
use crate::memory::block::PAGE;
use crate::memory::numa::Placement;

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
}
