//! Device memory, page-locked host memory, and the tracking they share.
//!
//! Every buffer holds a [`Tracker`] of the device work in flight on it (see `track.rs`); the copies and
//! kernel launchers consult it before enqueueing work, host accessors before touching pinned memory, and
//! destructors before releasing anything.

mod device;
mod host;
mod pinned;
mod pool;
mod registered;
mod release;
mod tracked;
mod view;

pub use device::DeviceBuffer;
pub use pinned::{Pinned, PinnedBuilder};
pub use pool::{PinnedPool, Pinning, PoolBuilder, PoolStats, WhenFull};
pub use registered::Registered;
pub use tracked::Track;
pub(crate) use tracked::{Gpu, GpuTracker, Work, lock};
pub use view::{DeviceView, DeviceViewMut, PinnedView, PinnedViewMut};
// The pure parts the fuzz targets reach through `crate::fuzzing`.
#[cfg(any(test, fuzzing))]
pub(crate) use {pool::state as pool_state, view::bounds as view_bounds};

use crate::error::{Error, Result};

/// The size in bytes of `len` elements of `T`, or an error naming `what` if it overflows.
pub(crate) fn byte_len<T>(len: usize, what: &str) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or_else(|| {
        Error::invalid(format_args!(
            "{what}: {len} elements of {} bytes overflow usize",
            size_of::<T>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_lengths_are_errors() {
        assert_eq!(byte_len::<u32>(10, "x").unwrap(), 40);
        let e = byte_len::<u64>(usize::MAX / 4, "allocating").unwrap_err();
        assert!(e.to_string().starts_with("allocating: "), "{e}");
    }
}
