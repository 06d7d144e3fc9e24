//! `DeviceBuffer<T>`: device memory, allocated stream-ordered where the device supports it.

#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;

use bytemuck::Pod;

use super::layout::{byte_len, check_alignment};
use super::release::release_host;
use super::tracked::{Gpu, Track, lock, refuse_if_held};
use crate::driver::Context;
use crate::driver::Stream;
use crate::driver::calls;
use crate::error::Result;
use crate::sys::{CUdeviceptr, CUresult};
use crate::units::Bytes;

/// The alignment the driver guarantees for device allocations (`cuMemAlloc`, memory pools).
const ALIGNMENT: usize = 256;

/// Where a buffer's memory came from: how it is freed, and which other devices may use it directly.
/// (Public only to the sealed traits of `copy.rs`: not reachable from outside the crate.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `cuMemAlloc` (devices without memory pools): freed with `cuMemFree`; the other devices whose contexts
    /// were given peer access may use it.
    Plain,
    /// The crate's memory pool of the device ([`Context::memory_pool`]): freed stream-ordered; opened to a peer
    /// by [`Context::enable_peer_access`].
    CratePool,
    /// Another memory pool (memory taken over with [`DeviceBuffer::from_raw`]): freed stream-ordered; open to
    /// whichever devices its owner opened it to.
    OtherPool,
}

/// `len` elements of `T` in device memory.
///
/// Allocation is stream-ordered (`cuMemAllocFromPoolAsync`, from a memory pool of the crate's own for the
/// device) on devices with memory pools, else `cuMemAlloc`. Dropping
/// the buffer never frees memory that enqueued work may still use, never blocks the host and never makes a
/// stream wait for anything: the free is enqueued after every pending use, on the stream of those uses when
/// they are all on one, else on a stream of the crate's own that waits for them (on devices without memory
/// pools, the crate's release thread frees it once they have completed).
pub struct DeviceBuffer<T> {
    ptr: CUdeviceptr,
    len: usize,
    /// The stream the allocation was made on; the free goes there if no use is pending.
    stream: Stream,
    origin: Origin,
    track: Track,
    _elements: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements whose contents are unspecified (any bytes are a valid `T`), ordered on `stream`:
    /// the memory is ready for work on `stream` at once, and other streams wait for the allocation.
    ///
    /// Never makes `stream` wait for other streams: memory freed on another stream whose work is still running
    /// is not taken (the driver would make `stream` wait for that work), so under memory pressure this may
    /// fail where the memory would become free later.
    ///
    /// # Errors
    /// `CUDA_ERROR_OUT_OF_MEMORY` naming the size and device (memory freed on other streams may be reused once
    /// the driver sees their work completed; after [`Context::synchronize`] it is); [`crate::Error::InvalidArgument`]
    /// if the size in bytes overflows, or if `T` is aligned to more than the 256 bytes the driver guarantees.
    #[doc(alias = "cuMemAllocFromPoolAsync")]
    #[doc(alias = "cuMemAlloc")]
    pub fn uninit(stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        stream.refuse_in_capture("DeviceBuffer::uninit (allocate buffers before the capture)")?;
        let bytes = byte_len::<T>(len, "allocating device memory")?;
        check_alignment::<T>(ALIGNMENT, "allocating device memory")?;
        let context = stream.context();
        let device = context.device();
        let mut buffer = DeviceBuffer {
            ptr: 0,
            len,
            stream: stream.clone(),
            origin: if context.has_memory_pools() {
                Origin::CratePool
            } else {
                Origin::Plain
            },
            track: Track::default(),
            _elements: PhantomData,
        };
        if bytes == 0 {
            return Ok(buffer);
        }
        let _current = context.enter()?;
        // The context is current. Freed in Drop.
        let allocated = if buffer.origin == Origin::CratePool {
            // The allocation is work on `stream`: another stream must wait for it like for a write.
            let pool = context.memory_pool()?;
            let mut ptr = 0;
            stream
                .tracked(None, Some(&buffer.track), || {
                    ptr = calls::mem_alloc_from_pool_async(bytes, pool, stream.as_raw())?;
                    Ok(())
                })
                .map(|()| ptr)
        } else {
            calls::mem_alloc(bytes)
        };
        buffer.ptr = allocated.map_err(|e| {
            let pending = if buffer.origin == Origin::CratePool
                && e.driver_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            {
                " (memory freed on other streams is not taken while their work may still use it, as \
                 taking it would make this stream wait for theirs: `Context::synchronize` makes it \
                 available)"
            } else {
                ""
            };
            e.context(format_args!(
                "allocating {} on device {}{pending}",
                Bytes(bytes),
                device.ordinal()
            ))
        })?;
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
            let ptr = buffer.ptr;
            // Recorded even if the memset fails: the buffer's later users and its free wait for whatever it
            // enqueued.
            stream
                .tracked(None, Some(&buffer.track), || {
                    // SAFETY: the range is this allocation, which lives until its free is ordered after the memset;
                    // the tracker ordered the write after any pending use.
                    unsafe { calls::memset_d8_async(ptr, 0, bytes, stream.as_raw()) }
                })
                .map_err(|e| {
                    e.context(format_args!("zeroing {} of device memory", Bytes(bytes)))
                })?;
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

    /// Gives the allocation up to the caller, once every piece of device work recorded on it has completed
    /// (blocks until then): returns its device address and length in elements.
    ///
    /// The memory stays allocated until the caller frees it with `cuMemFree`, which frees it whether it came
    /// from a memory pool (the crate's allocations on devices with memory pools) or from `cuMemAlloc`, or
    /// with `cuMemFreeAsync` on a stream after its last use where it came from a memory pool
    /// (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE` tells). It belongs to the device's
    /// primary context, so it stays valid while that context is retained (keep a [`Context`] of the device).
    /// Hand it back with [`DeviceBuffer::from_raw`].
    ///
    /// # Errors
    /// The driver's, from waiting for the work; the buffer is dropped then (its memory freed after that work,
    /// as usual).
    pub fn into_raw(mut self) -> Result<(CUdeviceptr, usize)> {
        refuse_if_held(&self.track, "DeviceBuffer::into_raw")?;
        lock(&self.track)
            .synchronize_all(&Gpu)
            .map_err(|e| e.context("giving up a device buffer: waiting for its work"))?;
        let raw = (self.ptr, self.len);
        // Drop frees nothing for a null address.
        self.ptr = 0;
        Ok(raw)
    }

    /// Where the memory came from.
    pub(crate) fn origin(&self) -> Origin {
        self.origin
    }

    /// Takes ownership of `len` elements of device memory at `ptr`, which from now on are tracked like any
    /// buffer's and freed when the buffer is dropped, once every use has completed: stream-ordered
    /// (`cuMemFreeAsync`) where the memory came from a memory pool (`cuMemAllocAsync`,
    /// `cuMemAllocFromPoolAsync`), else with `cuMemFree` on the crate's release thread, which waits until the
    /// device is idle. Returns at once.
    ///
    /// # Safety
    /// `ptr` must be a whole allocation of at least `len * size_of::<T>()` bytes made by `cuMemAlloc`,
    /// `cuMemAllocAsync` or `cuMemAllocFromPoolAsync` in `stream`'s context, aligned for `T`, holding valid
    /// `T`s, and ready for work on `stream`: no work elsewhere may still use it (an allocation on another
    /// stream must have completed).
    /// Nothing else may use or free it afterwards (a pointer from [`DeviceBuffer::into_raw`] qualifies).
    pub unsafe fn from_raw(stream: &Stream, ptr: CUdeviceptr, len: usize) -> DeviceBuffer<T> {
        // Asked of the driver once, here. Where it cannot tell: `cuMemFree`, which frees either kind, once the
        // device is idle.
        let pool = if ptr == 0 {
            None
        } else {
            calls::pointer_mem_pool(ptr)
                .ok()
                .filter(|pool| !pool.is_null())
        };
        let origin = match pool {
            None => Origin::Plain,
            Some(pool) if stream.context().memory_pool().ok() == Some(pool) => Origin::CratePool,
            Some(_) => Origin::OtherPool,
        };
        DeviceBuffer {
            ptr,
            len,
            stream: stream.clone(),
            origin,
            track: Track::default(),
            _elements: PhantomData,
        }
    }

    /// Frees the memory after every pending use: stream-ordered where the device supports it, else on the
    /// crate's release thread once the uses have completed (the synchronous `cuMemFree` waits for the whole
    /// device). Returns at once.
    fn release(&mut self) -> Result<()> {
        let context = self.stream.context();
        let ptr = self.ptr;
        if self.origin == Origin::Plain {
            let track = std::mem::take(&mut *lock(&self.track));
            let free = move || {
                // SAFETY: allocated by cuMemAlloc; run once, when every use has completed.
                unsafe { calls::mem_free(ptr) }
            };
            release_host(context, track, Box::new(free), self.byte_len());
            return Ok(());
        }
        // While the free (and the waits before it) are queued, the release thread cannot find the device idle.
        let _enqueue = context.enqueue()?;
        let track = lock(&self.track);
        // Where the free goes: after the uses in stream order where they are all on one stream of the memory's
        // own context (no wait, and that stream's later work does not wait for anything), else on the context's
        // release stream, which waits for each of them. Freeing on one of the users' streams behind a wait for
        // another would make that stream's later, unrelated work wait too. A stream of another device will not
        // do: nothing would then keep this context alive until the free, and the driver frees all of a
        // context's memory when it destroys it, with no regard for another device's queued work (the release
        // stream, retired with a retain of the context, keeps it until its frees have run).
        // A stream in a capture will not do either: the free would be captured (the driver refuses it).
        let sole = match track.sole_stream() {
            Some(stream) if stream.context() == context && !stream.is_capturing() => {
                Some(stream.clone())
            }
            Some(_) => None,
            None if track.is_empty() && !self.stream.is_capturing() => Some(self.stream.clone()),
            None => None,
        };
        if let Some(stream) = sole {
            // The free joins the stream's segment if only this buffer's entries hold it, else the segment is
            // closed first, so that nothing waiting for other buffers' work there waits for the free too.
            match stream
                .begin(|current| track.replaced_at(&stream, current, crate::track::Access::Write))
            {
                Ok(segment) => {
                    let freed = free_async(ptr, &stream);
                    // A failure to close the segment after it (in a section) only makes later waits longer.
                    drop(segment);
                    return freed;
                }
                // A capture began on the stream since it was chosen: the release stream frees instead.
                Err(_) if stream.is_capturing() => {}
                Err(e) => return Err(e),
            }
        }
        let release = Stream::borrowed(context, context.release_stream()?);
        // Nothing else enqueues on the release stream but other frees, each after waits of its own, and
        // interleaving those only makes a free wait for more than its own uses.
        let mut track = track;
        track.order_before(&Gpu, &release)?;
        free_async(ptr, &release)
    }
}

/// Enqueues the stream-ordered free of `ptr` on `stream`.
fn free_async(ptr: CUdeviceptr, stream: &Stream) -> Result<()> {
    // SAFETY: allocated from a memory pool, freed once (the buffer is dropping); `stream` is ordered after every
    // pending use of it, and nothing uses it afterwards.
    unsafe { calls::mem_free_async(ptr, stream.as_raw()) }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if self.track.is_held() {
            // A graph uses the memory: it goes once the last such graph has, after its replays (the moved
            // buffer's own drop then frees it as below).
            let moved = DeviceBuffer::<u8> {
                len: self.byte_len(),
                ptr: std::mem::take(&mut self.ptr),
                stream: self.stream.clone(),
                origin: self.origin,
                track: self.track.share(),
                _elements: PhantomData,
            };
            if let Some(now) = self.track.adopt(Box::new(move || drop(moved))) {
                now();
            }
            return;
        }
        if let Err(e) = self.release() {
            // The memory stays allocated, and its context with it: freeing it without knowing that its uses
            // are done could let the driver hand it to other work while ours still runs.
            let leaked = format!(
                "freeing {} of device memory (it was leaked)",
                Bytes(self.byte_len())
            );
            let context = self.stream.context();
            context.keep_for_leaked_memory();
            context.defer_error(e.context(leaked));
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
