//! Page-locked host memory as the host reaches it: elements lent out only after the tracker's waits. Shared by
//! [`super::Pinned`] and [`super::Registered`], which own the memory and differ only in how they got and
//! release it.

use std::ptr::NonNull;

use super::tracked::{Gpu, GpuTracker, Track, lock};
use crate::error::Result;
use crate::track::Access;

/// `len` elements at `ptr` that device work may use, with the tracker of that work.
pub(crate) struct HostRegion<T> {
    ptr: NonNull<T>,
    len: usize,
    track: Track,
}

// SAFETY: the region stands for memory its owner holds exclusively; moving it moves the `T`s (`T: Send`).
unsafe impl<T: Send> Send for HostRegion<T> {}
// SAFETY: `&HostRegion` lends only `&[T]`, after the tracker's wait; the tracker is behind a Mutex.
unsafe impl<T: Sync> Sync for HostRegion<T> {}

impl<T> HostRegion<T> {
    /// A region with no work in flight.
    ///
    /// # Safety
    /// `ptr` must be aligned for `T` and point to `len` initialised, page-locked elements that stay allocated,
    /// and that nothing but this region (and device work recorded in its tracker) reads or writes, for as long
    /// as the region lives.
    pub(crate) unsafe fn new(ptr: NonNull<T>, len: usize) -> HostRegion<T> {
        debug_assert!(ptr.as_ptr().is_aligned(), "a misaligned host region");
        HostRegion {
            ptr,
            len,
            track: Track::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    pub(crate) fn ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    pub(crate) fn track(&self) -> &Track {
        &self.track
    }

    /// The work still in flight, taken out for the release of the memory.
    pub(crate) fn take_track(&mut self) -> GpuTracker {
        std::mem::take(&mut *lock(&self.track))
    }

    /// Waits for in-flight writes, then lends the elements for reading.
    pub(crate) fn read(&self) -> Result<&[T]> {
        lock(&self.track).host_wait(&Gpu, Access::Read)?;
        // SAFETY: the elements are valid (`new`); no device work writes them now, and none can be enqueued while
        // the returned borrow of `self` lives (device writes need the owner by `&mut`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// Waits for all in-flight work, then lends the elements for writing.
    pub(crate) fn write(&mut self) -> Result<&mut [T]> {
        lock(&self.track).host_wait(&Gpu, Access::Write)?;
        // SAFETY: as in `read`, and no device work uses the elements at all now.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// [`HostRegion::read`] without blocking: `None` while device work still writes.
    pub(crate) fn try_read(&self) -> Result<Option<&[T]>> {
        let ready = lock(&self.track).try_host(&Gpu, Access::Read)?;
        // SAFETY: as in `read`, once the query says the writes are done.
        Ok(ready.then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }))
    }

    /// [`HostRegion::write`] without blocking: `None` while device work still uses the elements.
    pub(crate) fn try_write(&mut self) -> Result<Option<&mut [T]>> {
        let ready = lock(&self.track).try_host(&Gpu, Access::Write)?;
        // SAFETY: as in `write`, once the query says all uses are done.
        Ok(ready.then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }))
    }
}
