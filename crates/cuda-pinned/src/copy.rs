//! Copies between host and device, and the traits that decide what memory each copy accepts.
//!
//! Only page-locked memory can be the host side of an asynchronous copy: [`Stream::upload`] and
//! [`Stream::download`] take [`PinnedSource`] / [`PinnedDestination`], sealed traits implemented only for
//! [`Pinned`], [`Registered`] and their views. A slice or `Vec` does not compile there:
//!
//! ```ignore
//! # fn f(stream: &cuda_pinned::Stream, device: &mut cuda_pinned::DeviceBuffer<u8>) -> cuda_pinned::Result<()> {
//! let pageable = vec![0u8; 1024];
//! stream.upload(&pageable, device)?; // error: Vec<u8> is not PinnedSource
//! # Ok(()) }
//! ```
//! ```ignore
//! # fn f(stream: &cuda_pinned::Stream, device: &cuda_pinned::DeviceBuffer<u8>) -> cuda_pinned::Result<()> {
//! let mut pageable = [0u8; 1024];
//! stream.download(device, &mut pageable[..])?; // error: [u8] is not PinnedDestination
//! # Ok(()) }
//! ```
//! (Each claim here, and the others the types make, is a compile-fail test with its expected error in
//! `tests/compile_fail/`.) Pageable memory has its own copies, [`Stream::upload_pageable`] and [`Stream::download_pageable`], which
//! return only once the copy has completed.
//!
//! A host slice borrowed from pinned memory cannot be held across a copy into that memory, since the copy needs
//! the buffer exclusively:
//!
//! ```ignore
//! # fn f(stream: &cuda_pinned::Stream, device: &cuda_pinned::DeviceBuffer<u8>,
//! #      host: &mut cuda_pinned::Pinned<u8>) -> cuda_pinned::Result<()> {
//! let seen = host.as_slice()?;
//! stream.download(device, host)?; // error: `host` is borrowed by `seen`
//! println!("{}", seen[0]);
//! # Ok(()) }
//! ```

#![allow(unsafe_code)]

use std::ffi::c_void;

use bytemuck::Pod;

use crate::driver::Context;
use crate::driver::calls;
use crate::driver::{Category, Stream};
use crate::error::{Error, Result};
use crate::memory::{
    DeviceBuffer, DeviceView, DeviceViewMut, Origin, Pinned, PinnedView, PinnedViewMut, Registered,
    Track, Work,
};
use crate::sys::CUdeviceptr;
use crate::units::Bytes;

pub(crate) mod sealed {
    use super::{CUdeviceptr, Context, Origin, Track, c_void};

    /// Device memory as a copy sees it. Not implementable outside the crate.
    pub trait DeviceMemory {
        /// The device address of the first element.
        fn device_ptr(&self) -> CUdeviceptr;
        /// The length in elements.
        fn elements(&self) -> usize;
        /// The tracker of the allocation the memory belongs to.
        fn track(&self) -> &Track;
        /// The context of the allocation.
        fn owner(&self) -> &Context;
        /// Where the allocation came from.
        fn origin(&self) -> Origin;
    }

    /// Page-locked host memory as a copy sees it. Not implementable outside the crate.
    pub trait PinnedMemory {
        /// The host address of the first element.
        fn host_ptr(&self) -> *mut c_void;
        /// The length in elements.
        fn elements(&self) -> usize;
        /// The tracker of the allocation the memory belongs to.
        fn track(&self) -> &Track;
    }
}

/// Device memory that device work may read: [`DeviceBuffer`], [`DeviceView`], [`DeviceViewMut`].
///
/// Generic code reads its length, address and context through the methods here.
pub trait DeviceSource<T>: sealed::DeviceMemory {
    /// The length in elements.
    fn len(&self) -> usize {
        sealed::DeviceMemory::elements(self)
    }
    /// Whether it has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The device address of the first element. Using it directly is not tracked: order it yourself, or
    /// declare the work with [`Stream::enqueue_foreign`].
    fn as_raw(&self) -> CUdeviceptr {
        self.device_ptr()
    }
    /// The context of the allocation.
    fn context(&self) -> &Context {
        self.owner()
    }
}
/// Device memory that device work may write, taken by `&mut`: [`DeviceBuffer`], [`DeviceViewMut`].
pub trait DeviceDestination<T>: DeviceSource<T> {}
/// Page-locked host memory an asynchronous copy may read: [`Pinned`], [`PinnedView`], [`PinnedViewMut`],
/// [`Registered`], and an `Arc` of any of them.
///
/// Generic code reads its length through the methods here.
#[diagnostic::on_unimplemented(
    note = "an asynchronous copy reads only page-locked memory: `Pinned`, `Registered`, a `PinnedPool`'s \
            buffer, or a view of one",
    note = "for ordinary memory (a `Vec`, a slice), use `Stream::upload_pageable` (returns once copied) or \
            `Stream::upload_staged` (through a `PinnedPool`)"
)]
pub trait PinnedSource<T>: sealed::PinnedMemory {
    /// The length in elements.
    fn len(&self) -> usize {
        sealed::PinnedMemory::elements(self)
    }
    /// Whether it has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
/// Page-locked host memory an asynchronous copy may write, taken by `&mut`: [`Pinned`], [`PinnedViewMut`],
/// [`Registered`].
#[diagnostic::on_unimplemented(
    note = "an asynchronous copy writes only page-locked memory it holds exclusively: `Pinned`, `Registered`, \
            a `PinnedPool`'s buffer, or a `PinnedViewMut` (a `PinnedView` is read-only)",
    note = "for ordinary memory (a `Vec`, a slice), use `Stream::download_pageable` (returns once copied) or \
            `Stream::download_staged` (through a `PinnedPool`)"
)]
pub trait PinnedDestination<T>: PinnedSource<T> {}

impl<T> sealed::DeviceMemory for DeviceBuffer<T> {
    fn device_ptr(&self) -> CUdeviceptr {
        self.as_raw()
    }
    fn elements(&self) -> usize {
        self.len()
    }
    fn track(&self) -> &Track {
        DeviceBuffer::track(self)
    }
    fn owner(&self) -> &Context {
        self.context()
    }
    fn origin(&self) -> Origin {
        DeviceBuffer::origin(self)
    }
}
impl<T> DeviceSource<T> for DeviceBuffer<T> {}
impl<T> DeviceDestination<T> for DeviceBuffer<T> {}

macro_rules! device_memory {
    ($($t:ty => $($tr:ident),+;)+) => {$(
        impl<T> sealed::DeviceMemory for $t {
            fn device_ptr(&self) -> CUdeviceptr {
                self.as_raw()
            }
            fn elements(&self) -> usize {
                self.len()
            }
            fn track(&self) -> &Track {
                <$t>::track(self)
            }
            fn owner(&self) -> &Context {
                self.context()
            }
            fn origin(&self) -> Origin {
                <$t>::origin(self)
            }
        }
        $(impl<T> $tr<T> for $t {})+
    )+};
}
device_memory! {
    DeviceView<'_, T> => DeviceSource;
    DeviceViewMut<'_, T> => DeviceSource, DeviceDestination;
}

macro_rules! pinned_view {
    ($($t:ty => $($tr:ident),+;)+) => {$(
        impl<T> sealed::PinnedMemory for $t {
            fn host_ptr(&self) -> *mut c_void {
                <$t>::host_ptr(self)
            }
            fn elements(&self) -> usize {
                self.len()
            }
            fn track(&self) -> &Track {
                <$t>::track(self)
            }
        }
        $(impl<T> $tr<T> for $t {})+
    )+};
}
pinned_view! {
    PinnedView<'_, T> => PinnedSource;
    PinnedViewMut<'_, T> => PinnedSource, PinnedDestination;
}

impl<T> sealed::PinnedMemory for Pinned<T> {
    fn host_ptr(&self) -> *mut c_void {
        Pinned::host_ptr(self)
    }
    fn elements(&self) -> usize {
        self.len()
    }
    fn track(&self) -> &Track {
        Pinned::track(self)
    }
}
impl<T> PinnedSource<T> for Pinned<T> {}
impl<T> PinnedDestination<T> for Pinned<T> {}

/// One buffer shared by several owners, as several devices' [`RowTable`](crate::RowTable)s share one table:
/// read only (there is no `&mut` to write it through while it is shared).
impl<M: sealed::PinnedMemory> sealed::PinnedMemory for std::sync::Arc<M> {
    fn host_ptr(&self) -> *mut c_void {
        (**self).host_ptr()
    }
    fn elements(&self) -> usize {
        (**self).elements()
    }
    fn track(&self) -> &Track {
        (**self).track()
    }
}
impl<T, M: PinnedSource<T>> PinnedSource<T> for std::sync::Arc<M> {}

impl<T: Pod> sealed::PinnedMemory for Registered<T> {
    fn host_ptr(&self) -> *mut c_void {
        Registered::host_ptr(self)
    }
    fn elements(&self) -> usize {
        self.len()
    }
    fn track(&self) -> &Track {
        Registered::track(self)
    }
}
impl<T: Pod> PinnedSource<T> for Registered<T> {}
impl<T: Pod> PinnedDestination<T> for Registered<T> {}

impl Stream {
    /// Enqueues a copy of `src` (page-locked host memory) into `dst` on this stream. Returns at once; the copy
    /// runs on the stream, after any pending work on either buffer from other streams (a device-side wait).
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, if the lengths differ or `dst` belongs to another
    /// context; the driver's.
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn upload<T: Pod>(
        &self,
        src: &impl PinnedSource<T>,
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        let Some(bytes) = self.check_copy::<T>("uploading", src.elements(), dst)? else {
            return Ok(());
        };
        self.tracked_holding(
            self.context().enqueue_copy()?,
            Work::Timed(Category::Upload, "", bytes),
            Some(src.track()),
            Some(dst.track()),
            || {
                // SAFETY: `src` is `bytes` bytes of live page-locked memory and `dst` `bytes` bytes of device memory
                // (lengths checked); the trackers ordered the copy after conflicting work and keep both buffers
                // alive (and the host memory untouched by safe code) until it has completed.
                unsafe {
                    calls::memcpy_htod_async(dst.device_ptr(), src.host_ptr(), bytes, self.as_raw())
                }
            },
        )
        .map_err(|e| e.context(format_args!("uploading {}", Bytes(bytes))))
    }

    /// Enqueues a copy of `src` (device memory) into `dst` (page-locked host memory) on this stream. Returns at
    /// once; read the result through [`Pinned::as_slice`], which waits for it.
    ///
    /// # Errors
    /// As [`Stream::upload`].
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn download<T: Pod>(
        &self,
        src: &impl DeviceSource<T>,
        dst: &mut impl PinnedDestination<T>,
    ) -> Result<()> {
        let Some(bytes) = self.check_copy::<T>("downloading", dst.elements(), src)? else {
            return Ok(());
        };
        self.tracked_holding(
            self.context().enqueue_copy()?,
            Work::Timed(Category::Download, "", bytes),
            Some(src.track()),
            Some(dst.track()),
            || {
                // SAFETY: as in `upload`, the other way round.
                unsafe {
                    calls::memcpy_dtoh_async(dst.host_ptr(), src.device_ptr(), bytes, self.as_raw())
                }
            },
        )
        .map_err(|e| e.context(format_args!("downloading {}", Bytes(bytes))))
    }

    /// Enqueues a device-to-device copy on this stream. Returns at once, except for the first copy between two
    /// devices (below).
    ///
    /// `src` and `dst` may belong to two devices, one of them this stream's: the copy then goes directly
    /// between them where they can access each other (NVLink, or PCIe peer to peer; peer access is enabled for
    /// both directions on the first copy between two context handles, which takes the driver a while: see
    /// [`Context::enable_peer_access`]), else through two page-locked staging buffers of 4 MiB, each chunk
    /// downloaded on a stream of the source's device and uploaded on one of the destination's. The staging
    /// buffers and that stream are made by the first such copy (pinning takes a few milliseconds) and kept
    /// for the next ones, a few for the life of the process. Either way the copy is in this stream's order
    /// and tracked on both buffers like any copy.
    ///
    /// # Errors
    /// As [`Stream::upload`]; an invalid-argument error if neither buffer belongs to this stream's context;
    /// the driver's, from enabling peer access. A staged copy that fails partway leaves part of `dst` written
    /// (every part enqueued is still tracked).
    #[doc(alias = "cuMemcpyDtoDAsync")]
    #[doc(alias = "cuMemcpyPeerAsync")]
    pub fn copy<T: Pod>(
        &self,
        src: &impl DeviceSource<T>,
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        if src.owner() != self.context() || dst.owner() != self.context() {
            self.refuse_in_capture("Stream::copy between devices")?;
            return self.copy_between_devices(src, dst);
        }
        let sides = (
            ("the source", src.elements()),
            ("the destination", dst.elements()),
        );
        let Some(bytes) = copy_bytes::<T>("copying", sides.0, sides.1)? else {
            return Ok(());
        };
        self.tracked_holding(
            self.context().enqueue_copy()?,
            Work::Timed(Category::DeviceCopy, "", bytes),
            Some(src.track()),
            Some(dst.track()),
            || {
                // SAFETY: two device ranges of `bytes` bytes in live allocations, ordered by the trackers.
                unsafe {
                    calls::memcpy_dtod_async(
                        dst.device_ptr(),
                        src.device_ptr(),
                        bytes,
                        self.as_raw(),
                    )
                }
            },
        )
        .map_err(|e| e.context(format_args!("copying {} on the device", Bytes(bytes))))
    }

    /// Copies ordinary (pageable) host memory into `dst`, ordered on this stream, and returns once the copy has
    /// completed. The driver stages it through pinned memory of its own, so it runs at a fraction of the
    /// speed of [`Stream::upload`] from [`Pinned`] memory and blocks the calling thread throughout.
    ///
    /// # Errors
    /// As [`Stream::upload`].
    #[doc(alias = "cuMemcpyHtoDAsync")]
    pub fn upload_pageable<T: Pod>(
        &self,
        src: &[T],
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        // Captured, the copy would read `src` at every replay, wherever it is by then.
        self.refuse_in_capture("Stream::upload_pageable")?;
        let Some(bytes) = self.check_copy::<T>("uploading", src.len(), dst)? else {
            return Ok(());
        };
        let enqueued = self.tracked_holding(
            self.context().enqueue_copy()?,
            Work::Timed(Category::Upload, "pageable", bytes),
            None,
            Some(dst.track()),
            || {
                // SAFETY: `src` is `bytes` readable bytes borrowed for this call, which returns only after the
                // copy has completed (below); `dst` is ordered by its tracker.
                unsafe {
                    calls::memcpy_htod_async(
                        dst.device_ptr(),
                        src.as_ptr().cast(),
                        bytes,
                        self.as_raw(),
                    )
                }
            },
        );
        // Whatever happened, part of the copy may be queued (an error may come after the enqueue, from the
        // ledger say): return only once none of it is.
        let finished = self.finish();
        enqueued.and(finished).map_err(|e| {
            e.context(format_args!(
                "uploading {} from pageable memory",
                Bytes(bytes)
            ))
        })
    }

    /// Copies `src` into ordinary (pageable) host memory, ordered on this stream, and returns once the copy has
    /// completed. Slower than [`Stream::download`] into [`Pinned`] memory, and blocking.
    ///
    /// # Errors
    /// As [`Stream::upload`].
    #[doc(alias = "cuMemcpyDtoHAsync")]
    pub fn download_pageable<T: Pod>(
        &self,
        src: &impl DeviceSource<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.refuse_in_capture("Stream::download_pageable")?;
        let Some(bytes) = self.check_copy::<T>("downloading", dst.len(), src)? else {
            return Ok(());
        };
        let ptr = dst.as_mut_ptr().cast::<c_void>();
        let enqueued = self.tracked_holding(
            self.context().enqueue_copy()?,
            Work::Timed(Category::Download, "pageable", bytes),
            Some(src.track()),
            None,
            || {
                // SAFETY: `dst` is `bytes` writable bytes of a `T: Pod`, borrowed exclusively for this call, which
                // returns only after the copy has completed (below); `src` is ordered by its tracker.
                unsafe { calls::memcpy_dtoh_async(ptr, src.device_ptr(), bytes, self.as_raw()) }
            },
        );
        // Whatever happened, part of the copy may be queued (an error may come after the enqueue, from the
        // ledger say): return only once none of it is.
        let finished = self.finish();
        enqueued.and(finished).map_err(|e| {
            e.context(format_args!(
                "downloading {} into pageable memory",
                Bytes(bytes)
            ))
        })
    }

    /// The size in bytes of a copy of `host_len` elements (or of a device source's) to or from `device`, or `None`
    /// for an empty copy, which enqueues nothing, after checking that the lengths
    /// agree and that `device` belongs to this stream's context.
    fn check_copy<T>(
        &self,
        what: &str,
        host_len: usize,
        device: &impl sealed::DeviceMemory,
    ) -> Result<Option<usize>> {
        self.check_context(device)?;
        copy_bytes::<T>(
            what,
            ("the host memory", host_len),
            ("the device memory", device.elements()),
        )
    }

    pub(crate) fn check_context(&self, device: &impl sealed::DeviceMemory) -> Result<()> {
        if device.owner() == self.context() {
            Ok(())
        } else {
            Err(Error::invalid(format_args!(
                "a buffer of device {} used on a stream of device {}",
                device.owner().device().ordinal(),
                self.context().device().ordinal()
            )))
        }
    }

    /// Blocks until the work enqueued on this stream has completed, for the pageable copies, which must not
    /// return while their copy may still read or write the caller's slice (it may be page-locked memory of the
    /// crate's, lent as a slice). `cuStreamSynchronize` allocates nothing and fails only when the context is
    /// lost; should it fail all the same, the stream is polled until it is idle, so the copy is never left
    /// queued behind an `Err`. Only a failing poll ends that early: the context is then broken, and no queued
    /// work of it runs any more.
    fn finish(&self) -> Result<()> {
        let Err(failed) = calls::stream_synchronize(self.as_raw()) else {
            return Ok(());
        };
        let failed = failed.context("waiting for a pageable copy to complete");
        loop {
            match self.query() {
                Ok(true) => return Err(failed),
                Ok(false) => std::thread::sleep(std::time::Duration::from_micros(50)),
                Err(e) => return Err(failed.context(format_args!("then, {e}"))),
            }
        }
    }
}

/// That the two sides of a transfer, each `(name, elements)`, have the same number of elements.
///
/// # Errors
/// An invalid-argument error naming both where they differ.
pub(crate) fn check_lengths(
    what: &str,
    (one, one_len): (&str, usize),
    (other, other_len): (&str, usize),
) -> Result<()> {
    if one_len == other_len {
        Ok(())
    } else {
        Err(Error::invalid(format_args!(
            "{what}: {one} has {one_len} elements and {other} {other_len}; nothing was enqueued"
        )))
    }
}

/// The size in bytes of a copy between two sides of `(name, elements)`, or `None` for an empty copy, which
/// enqueues nothing, after checking that the lengths agree ([`check_lengths`]).
pub(crate) fn copy_bytes<T>(
    what: &str,
    one: (&str, usize),
    other: (&str, usize),
) -> Result<Option<usize>> {
    check_lengths(what, one, other)?;
    let bytes = crate::memory::byte_len::<T>(one.1, what)?;
    Ok((bytes > 0).then_some(bytes))
}
