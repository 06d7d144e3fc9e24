//! Sub-range views of device and pinned buffers. A view borrows its buffer (shared or exclusive, like a slice)
//! and shares its tracker: work on a view counts as work on the whole allocation, which is conservative (two
//! views of one buffer are ordered as if they overlapped) and never unsound.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use super::device::{DeviceBuffer, Origin};
use bytemuck::Pod;

use super::pinned::Pinned;
use super::registered::Registered;
use super::tracked::Track;
use crate::driver::Context;
use crate::error::{Error, Result};
use crate::sys::CUdeviceptr;

/// Elements `start..end` of a buffer of `len`, or an error naming the range. Pure: also fuzzed (`fuzzing.rs`).
pub(crate) fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Ok((start, end)),
        _ => Err(Error::invalid(format_args!(
            "the range {:?}..{:?} is not within a buffer of {len} elements",
            range.start_bound(),
            range.end_bound()
        ))),
    }
}

/// Elements of a [`DeviceBuffer`], borrowed for reading: `buffer.slice(1024..2048)?`.
#[derive(Clone, Copy, Debug)]
pub struct DeviceView<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    buffer: &'a DeviceBuffer<T>,
}

/// Elements of a [`DeviceBuffer`], borrowed exclusively for writing: `buffer.slice_mut(..512)?`.
#[derive(Debug)]
pub struct DeviceViewMut<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    buffer: &'a DeviceBuffer<T>,
    /// Exclusive, as the `&mut DeviceBuffer` it was made from.
    _exclusive: PhantomData<&'a mut DeviceBuffer<T>>,
}

impl<T> DeviceBuffer<T> {
    /// The elements in `range`, for reading.
    ///
    /// # Errors
    /// An invalid-argument error if the range is not within the buffer.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        let (start, end) = bounds(range, self.len())?;
        Ok(DeviceView {
            ptr: self.address_of(start),
            len: end - start,
            buffer: self,
        })
    }

    /// The elements in `range`, for writing.
    ///
    /// # Errors
    /// An invalid-argument error if the range is not within the buffer.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (start, end) = bounds(range, self.len())?;
        Ok(DeviceViewMut {
            ptr: self.address_of(start),
            len: end - start,
            buffer: self,
            _exclusive: PhantomData,
        })
    }

    fn address_of(&self, index: usize) -> CUdeviceptr {
        self.as_raw() + (index * size_of::<T>()) as CUdeviceptr
    }
}

macro_rules! device_view_common {
    ($view:ident) => {
        impl<T> $view<'_, T> {
            /// The length in elements.
            #[must_use]
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view has no elements.
            #[must_use]
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The device address of the first element, for interop (untracked).
            #[must_use]
            pub fn as_raw(&self) -> CUdeviceptr {
                self.ptr
            }

            pub(crate) fn track(&self) -> &Track {
                self.buffer.track()
            }

            pub(crate) fn origin(&self) -> Origin {
                self.buffer.origin()
            }

            /// The context of the buffer.
            #[must_use]
            pub fn context(&self) -> &Context {
                self.buffer.context()
            }
        }
    };
}
device_view_common!(DeviceView);
device_view_common!(DeviceViewMut);

/// Elements of a [`Pinned`] or [`Registered`] buffer, borrowed for reading (as the source of an upload, or
/// a gather's table): `host.slice(..n)?`.
#[derive(Clone, Copy, Debug)]
pub struct PinnedView<'a, T> {
    ptr: *mut T,
    len: usize,
    /// The tracker of the buffer it borrows.
    track: &'a Track,
    _elements: PhantomData<&'a [T]>,
}

/// Elements of a [`Pinned`] or [`Registered`] buffer, borrowed exclusively (as the destination of a download).
#[derive(Debug)]
pub struct PinnedViewMut<'a, T> {
    ptr: *mut T,
    len: usize,
    track: &'a Track,
    /// Exclusive, as the `&mut` borrow of the buffer it was made from.
    _exclusive: PhantomData<&'a mut [T]>,
}

// SAFETY: a view only hands its pointer to copies, which the tracker orders; it is as sendable as the borrow
// of the buffer it stands for (`&Pinned<T>` / `&mut Pinned<T>`).
unsafe impl<T: Sync> Send for PinnedView<'_, T> {}
// SAFETY: as above; shared use only reads through the tracker.
unsafe impl<T: Sync> Sync for PinnedView<'_, T> {}
// SAFETY: as for `&mut Pinned<T>`, which is Send when T is.
unsafe impl<T: Send> Send for PinnedViewMut<'_, T> {}
// SAFETY: `&PinnedViewMut` allows nothing but reading its length and pointer.
unsafe impl<T: Sync> Sync for PinnedViewMut<'_, T> {}

/// The views of page-locked buffers: `slice` and `slice_mut` over the buffer's elements and tracker.
macro_rules! pinned_views {
    ($buffer:ident, $($bound:tt)*) => {
        impl<T: $($bound)*> $buffer<T> {
            /// The elements in `range`, as the source of an upload (or a gather's table).
            ///
            /// # Errors
            /// An invalid-argument error if the range is not within the buffer.
            pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<PinnedView<'_, T>> {
                let (start, end) = bounds(range, self.len())?;
                // SAFETY: `start <= len`, so the offset stays within (or one past) the allocation.
                let ptr = unsafe { self.host_ptr().cast::<T>().add(start) };
                Ok(PinnedView {
                    ptr,
                    len: end - start,
                    track: self.track(),
                    _elements: PhantomData,
                })
            }

            /// The elements in `range`, as the destination of a download.
            ///
            /// # Errors
            /// An invalid-argument error if the range is not within the buffer.
            pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<PinnedViewMut<'_, T>> {
                let (start, end) = bounds(range, self.len())?;
                // SAFETY: as in `slice`.
                let ptr = unsafe { self.host_ptr().cast::<T>().add(start) };
                Ok(PinnedViewMut {
                    ptr,
                    len: end - start,
                    track: self.track(),
                    _exclusive: PhantomData,
                })
            }
        }
    };
}
pinned_views!(Pinned, Sized);
pinned_views!(Registered, Pod);

macro_rules! pinned_view_common {
    ($view:ident) => {
        impl<T> $view<'_, T> {
            /// The length in elements.
            #[must_use]
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view has no elements.
            #[must_use]
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            pub(crate) fn host_ptr(&self) -> *mut c_void {
                self.ptr.cast()
            }

            pub(crate) fn track(&self) -> &Track {
                self.track
            }
        }
    };
}
pinned_view_common!(PinnedView);
pinned_view_common!(PinnedViewMut);

#[cfg(test)]
mod tests {
    use super::bounds;

    #[test]
    fn ranges_within_the_buffer_are_accepted() {
        assert_eq!(bounds(.., 10).unwrap(), (0, 10));
        assert_eq!(bounds(2..5, 10).unwrap(), (2, 5));
        assert_eq!(bounds(2..=5, 10).unwrap(), (2, 6));
        assert_eq!(bounds(10.., 10).unwrap(), (10, 10));
        assert_eq!(bounds(..0, 0).unwrap(), (0, 0));
    }

    #[test]
    fn ranges_outside_are_errors_not_panics() {
        for (start, end) in [(0, 11), (5, 4), (11, 11)] {
            let e = bounds(start..end, 10).unwrap_err();
            assert!(
                e.to_string().contains("not within a buffer of 10 elements"),
                "{e}"
            );
        }
        assert!(bounds(..=usize::MAX, 10).is_err());
        assert!(
            bounds(
                (
                    std::ops::Bound::Excluded(usize::MAX),
                    std::ops::Bound::Unbounded
                ),
                10
            )
            .is_err()
        );
    }
}
