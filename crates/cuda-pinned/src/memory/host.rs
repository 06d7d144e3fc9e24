//! Page-locked host memory as the host reaches it: elements lent out only after the tracker's waits. Shared by
//! [`super::Pinned`] and [`super::Registered`], which own the memory and differ only in how they got and
//! release it.

#![allow(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context as TaskContext, Poll};

use super::tracked::{Gpu, Track, lock, peek};
use crate::error::Result;
use crate::future::Done;
use crate::track::Access;
use crate::track::Timeline;

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
            track: Track::for_host(),
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

    /// Waits for in-flight writes, then lends the elements for reading.
    pub(crate) fn read(&self) -> Result<&[T]> {
        refuse_if_graphs_use(&self.track)?;
        wait_unlocked(&self.track, Access::Read)?;
        // SAFETY: the elements are valid (`new`); no device work writes them now, and none can be enqueued while
        // the returned borrow of `self` lives (device writes need the owner by `&mut`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// Waits for all in-flight work, then lends the elements for writing.
    pub(crate) fn write(&mut self) -> Result<&mut [T]> {
        refuse_if_graphs_use(&self.track)?;
        wait_unlocked(&self.track, Access::Write)?;
        // SAFETY: as in `read`, and no device work uses the elements at all now.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// [`HostRegion::read`] without blocking: `None` while device work still writes.
    pub(crate) fn try_read(&self) -> Result<Option<&[T]>> {
        refuse_if_graphs_use(&self.track)?;
        let ready = lock(&self.track).try_host(&Gpu, Access::Read)?;
        // SAFETY: as in `read`, once the query says the writes are done.
        Ok(ready.then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }))
    }

    /// [`HostRegion::write`] without blocking: `None` while device work still uses the elements.
    pub(crate) fn try_write(&mut self) -> Result<Option<&mut [T]>> {
        refuse_if_graphs_use(&self.track)?;
        let ready = lock(&self.track).try_host(&Gpu, Access::Write)?;
        // SAFETY: as in `write`, once the query says all uses are done.
        Ok(ready.then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }))
    }
}

/// Fails where a graph uses the buffer: a launch borrows only the graph, so a slice lent here could be in use
/// while a launch reads or writes the memory. The graph lends it instead ([`crate::Graph::host_slice`]), borrowed
/// from the graph as a launch is.
///
/// # Errors
/// An invalid-argument error.
fn refuse_if_graphs_use(track: &Track) -> Result<()> {
    if track.is_held() {
        return Err(crate::Error::invalid(
            "a graph uses this buffer, and a launch of it could use the memory while the host does: reach it \
             through the graph (Graph::host_slice, Graph::host_slice_mut), or drop the graph first; nothing was \
             enqueued",
        ));
    }
    Ok(())
}

/// Blocks until no device work conflicts with a host `access` to the buffer of `track`, waiting for one
/// conflicting entry at a time without the tracker's lock held (others, an executor's poll of the same buffer
/// among them, are not held up meanwhile), then asking the tracker again: the entries seen complete are
/// forgotten, as [`Tracker::host_wait`](crate::track::Tracker::host_wait) does under the lock, and with the same
/// driver calls (the entry waited for is then known complete, and forgetting it asks the driver nothing).
pub(crate) fn wait_unlocked(track: &Track, access: Access) -> Result<()> {
    loop {
        let Some((stream, mark)) = lock(track).first_conflict(access) else {
            return Ok(());
        };
        Gpu.synchronize(&stream, &mark)?;
        if lock(track).try_host(&Gpu, access)? {
            return Ok(());
        }
    }
}

/// Blocks until no device work conflicts with a host `access` to the buffer of `track`, which a graph holds and
/// lends to the host (`Graph::host_slice`), changing nothing in its tracker: the entries are waited for and
/// stay recorded, and the tracker's version stays, so the graph's next launch may still find the trackers as
/// its last one left them (`Stream::tracked_launch`). One look is enough: the lender's borrows keep every work
/// that would conflict from being queued meanwhile (a write needs the buffer by `&mut`, and a launch of the
/// graph needs the graph by `&mut`), and work queued before records its use under the lock the look takes.
pub(crate) fn wait_lent(track: &Track, access: Access) -> Result<()> {
    let conflicts = peek(track).conflicts(access);
    for (stream, point) in conflicts {
        Gpu.synchronize(&stream, &point)?;
    }
    Ok(())
}

/// The awaited form of `as_slice`: a future of a buffer's elements for reading, from
/// [`Pinned::readable`](crate::Pinned::readable) and [`Registered::readable`](crate::Registered::readable).
///
/// It borrows the buffer as the accessor does, so no device work that writes it can be queued meanwhile. It
/// owns nothing else: dropping it leaves the buffer's tracking as it was (the work it saw complete forgotten,
/// the rest recorded), and forgetting it only leaks it.
#[must_use = "a future does nothing unless awaited"]
pub struct Readable<'a, T> {
    region: &'a HostRegion<T>,
    waiting: Option<Done>,
}

/// The awaited form of `as_mut_slice`: a future of a buffer's elements for writing, from
/// [`Pinned::writable`](crate::Pinned::writable) and [`Registered::writable`](crate::Registered::writable). As
/// [`Readable`], for writing.
#[must_use = "a future does nothing unless awaited"]
pub struct Writable<'a, T> {
    region: Option<&'a mut HostRegion<T>>,
    waiting: Option<Done>,
}

impl<T> HostRegion<T> {
    /// [`HostRegion::read`] as a future.
    pub(crate) fn readable(&self) -> Readable<'_, T> {
        Readable {
            region: self,
            waiting: None,
        }
    }

    /// [`HostRegion::write`] as a future.
    pub(crate) fn writable(&mut self) -> Writable<'_, T> {
        Writable {
            region: Some(self),
            waiting: None,
        }
    }
}

/// Polls until no device work conflicts with a host `access` to the buffer of `track`: each time some does, a
/// future of one conflicting entry (`waiting`), then the tracker asked again.
fn poll_host(
    track: &Track,
    access: Access,
    waiting: &mut Option<Done>,
    cx: &mut TaskContext<'_>,
) -> Poll<Result<()>> {
    refuse_if_graphs_use(track)?;
    loop {
        if let Some(done) = waiting {
            let outcome = std::task::ready!(Pin::new(done).poll(cx));
            *waiting = None;
            outcome?;
        }
        let conflict = {
            let mut tracker = lock(track);
            match tracker.first_conflict(access) {
                // A segment still open on a stream still busy: its stream's point (a flag, written after the
                // segment is closed) is awaited. (On a stream found idle, the tracker sees it complete below.)
                Some((stream, mark)) if mark.segment().is_open() && !stream.query()? => {
                    Some((stream, mark))
                }
                _ => {
                    if tracker.try_host(&Gpu, access)? {
                        return Poll::Ready(Ok(()));
                    }
                    tracker.first_conflict(access)
                }
            }
        };
        let Some((stream, mark)) = conflict else {
            // Seen complete by another thread since: ask again.
            continue;
        };
        *waiting = Some(Done::mark(&stream, mark.segment().into_owned()));
    }
}

impl<'a, T> Future for Readable<'a, T> {
    type Output = Result<&'a [T]>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<&'a [T]>> {
        let this = &mut *self;
        let region = this.region;
        std::task::ready!(poll_host(
            &region.track,
            Access::Read,
            &mut this.waiting,
            cx
        ))?;
        // SAFETY: as in `HostRegion::read`: no device work writes the elements now, and none can be queued
        // while the borrow of the region, which the returned slice keeps, lives.
        Poll::Ready(Ok(unsafe {
            std::slice::from_raw_parts(region.ptr.as_ptr(), region.len)
        }))
    }
}

impl<'a, T> Future for Writable<'a, T> {
    type Output = Result<&'a mut [T]>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<&'a mut [T]>> {
        let this = &mut *self;
        let Some(region) = this.region.as_ref() else {
            return Poll::Ready(Err(crate::Error::invalid(
                "a Writable future polled after it completed",
            )));
        };
        std::task::ready!(poll_host(
            &region.track,
            Access::Write,
            &mut this.waiting,
            cx
        ))?;
        let region = this.region.take().expect("checked above");
        // SAFETY: as in `HostRegion::write`: no device work uses the elements now; the exclusive borrow moves
        // into the returned slice, and the future gives it out once.
        Poll::Ready(Ok(unsafe {
            std::slice::from_raw_parts_mut(region.ptr.as_ptr(), region.len)
        }))
    }
}
