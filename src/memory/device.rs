//! `DeviceBuffer<T>`: device memory, allocated stream-ordered where the device supports it.

use std::fmt;
use std::marker::PhantomData;

use bytemuck::Pod;

use super::{Bytes, Gpu, Track, byte_len, lock};
use crate::context::Context;
use crate::driver_call;
use crate::error::Result;
use crate::stream::Stream;
use crate::sys::CUdeviceptr;
use crate::track::Access;

/// `len` elements of `T` in device memory.
///
/// Allocation is stream-ordered (`cuMemAllocAsync`) on devices with memory pools, else `cuMemAlloc`. Dropping
/// the buffer never frees memory that enqueued work may still use and never blocks the host on such devices:
/// the free is enqueued on a stream after every pending use (on other devices it waits for them first).
pub struct DeviceBuffer<T> {
    ptr: CUdeviceptr,
    len: usize,
    /// The stream the allocation was made on; the free goes there if no use is pending.
    stream: Stream,
    /// Whether the memory came from `cuMemAllocAsync` (and goes back with `cuMemFreeAsync`).
    ordered: bool,
    track: Track,
    _elements: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements whose contents are unspecified (any bytes are a valid `T`), ordered on `stream`:
    /// the memory is ready for work on `stream` at once, and other streams wait for the allocation.
    ///
    /// # Errors
    /// `CUDA_ERROR_OUT_OF_MEMORY` naming the size and device; [`crate::Error::InvalidArgument`] if the size in
    /// bytes overflows.
    #[doc(alias = "cuMemAllocAsync")]
    #[doc(alias = "cuMemAlloc")]
    pub fn uninit(stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = byte_len::<T>(len, "allocating device memory")?;
        let context = stream.context();
        let device = context.device();
        let mut buffer = DeviceBuffer {
            ptr: 0,
            len,
            stream: stream.clone(),
            ordered: context.has_memory_pools(),
            track: Track::default(),
            _elements: PhantomData,
        };
        if bytes == 0 {
            return Ok(buffer);
        }
        let _current = context.enter()?;
        let mut ptr = 0;
        let allocated = if buffer.ordered {
            // SAFETY: an out-pointer to a local and a live stream; the context is current. Freed in Drop.
            unsafe { driver_call!(cuMemAllocAsync(&mut ptr, bytes, stream.as_raw())) }
        } else {
            // SAFETY: an out-pointer to a local; the context is current. Freed in Drop.
            unsafe { driver_call!(cuMemAlloc_v2(&mut ptr, bytes)) }
        };
        allocated.map_err(|e| {
            e.context(format_args!(
                "allocating {} on device {}",
                Bytes(bytes),
                device.ordinal()
            ))
        })?;
        buffer.ptr = ptr;
        if buffer.ordered {
            // The allocation is work on `stream`: another stream must wait for it like for a write.
            lock(&buffer.track).record_use(stream, Access::Write);
        }
        Ok(buffer)
    }

    /// Allocates `len` zeroed elements, ordered on `stream` (the zeroing runs there). Returns at once.
    ///
    /// # Errors
    /// As [`DeviceBuffer::uninit`].
    #[doc(alias = "cuMemsetD8Async")]
    pub fn zeroed(stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        let buffer = DeviceBuffer::uninit(stream, len)?;
        let bytes = buffer.byte_len();
        if bytes > 0 {
            let _current = stream.context().enter()?;
            let mut track = lock(&buffer.track);
            track.prepare(&Gpu, stream, Access::Write)?;
            // SAFETY: the range is this allocation; the tracker ordered the write after any pending use.
            unsafe { driver_call!(cuMemsetD8Async(buffer.ptr, 0, bytes, stream.as_raw())) }
                .map_err(|e| {
                    e.context(format_args!("zeroing {} of device memory", Bytes(bytes)))
                })?;
            track.record_use(stream, Access::Write);
        }
        Ok(buffer)
    }
}

impl<T> DeviceBuffer<T> {
    /// The length in elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The context the memory belongs to.
    #[must_use]
    pub fn context(&self) -> &Context {
        self.stream.context()
    }

    /// The device address (0 for an empty buffer), for interop. Work enqueued through it outside the crate is
    /// not tracked: order it yourself.
    #[must_use]
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    pub(crate) fn track(&self) -> &Track {
        &self.track
    }

    fn release(&mut self) -> Result<()> {
        let _current = self.stream.context().enter()?;
        let mut track = lock(&self.track);
        if self.ordered {
            let stream = track
                .any_stream()
                .cloned()
                .unwrap_or_else(|| self.stream.clone());
            track.order_before(&Gpu, &stream)?;
            // SAFETY: allocated by cuMemAllocAsync; `stream` now waits for every pending use of it, so the
            // free runs after them.
            unsafe { driver_call!(cuMemFreeAsync(self.ptr, stream.as_raw())) }
        } else {
            track.synchronize_all(&Gpu)?;
            // SAFETY: allocated by cuMemAlloc; every use of it has completed.
            unsafe { driver_call!(cuMemFree_v2(self.ptr)) }
        }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if let Err(e) = self.release() {
            // The memory stays allocated: freeing it without knowing that its uses are done could let the
            // driver hand it to other work while ours still runs.
            let leaked = format_args!(
                "freeing {} of device memory (it was leaked)",
                Bytes(self.byte_len())
            );
            self.stream.context().defer_error(e.context(leaked));
        }
    }
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}
