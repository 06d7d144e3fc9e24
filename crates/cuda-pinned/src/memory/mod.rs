//! Device memory, page-locked host memory, and the tracking they share.
//!
//! Every buffer holds a [`Tracker`](crate::track::Tracker) of the device work in flight on it (see `track/`); the copies and
//! kernel launchers consult it before enqueueing work, host accessors before touching pinned memory, and
//! destructors before releasing anything.

mod block;
mod captured;
mod device;
mod enqueue;
mod host;
mod layout;
mod numa;
mod pinned;
mod pool;
mod registered;
mod release;
mod tracked;
mod view;

pub(crate) use captured::Recording;
pub use device::DeviceBuffer;
pub(crate) use device::Origin;
pub(crate) use enqueue::{INLINE, Launched};
pub(crate) use host::wait_lent;
pub use host::{Readable, Writable};
pub(crate) use layout::byte_len;
pub use numa::Placement;
pub use pinned::{Pinned, PinnedBuilder};
pub use pool::{PinnedPool, Pinning, PoolAlloc, PoolBuilder, PoolStats, WhenFull};
pub use registered::Registered;
pub(crate) use release::release_host;
pub use tracked::Track;
pub(crate) use tracked::{Gpu, Work, lock, release_after_graphs};
pub use view::{DeviceView, DeviceViewMut, PinnedView, PinnedViewMut};
// The pure parts the fuzz targets reach through `crate::fuzzing`.
#[cfg(any(test, fuzzing))]
pub(crate) use {pool::state as pool_state, view::bounds as view_bounds};
