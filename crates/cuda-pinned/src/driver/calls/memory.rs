//! Memory: device allocations and pools, page-locked host memory, copies and memsets.

#![allow(unsafe_code)]

use std::ffi::c_void;

use crate::driver_call;
use crate::error::Result;
use crate::sys::{CUcontext, CUdeviceptr, CUmemoryPool, CUstream};

/// `cuMemAlloc_v2`: `bytes` of device memory in the current context; free it with [`mem_free`].
pub(crate) fn mem_alloc(bytes: usize) -> Result<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuMemAlloc_v2(&mut ptr, bytes)) }?;
    Ok(ptr)
}

/// `cuMemAllocFromPoolAsync`: `bytes` of device memory from `pool`, allocated in stream order on `stream`
/// (usable there at once, and by work on other streams ordered after it); free it with [`mem_free_async`].
pub(crate) fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> Result<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: an out-pointer to a local, a pool handle the driver checks, and a live stream (see the module
    // docs).
    unsafe { driver_call!(cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream)) }?;
    Ok(ptr)
}

/// `cuMemFree_v2`: frees device memory of [`mem_alloc`]. Waits for all work on the device first.
///
/// # Safety
/// `ptr` must come from [`mem_alloc`], not be freed already, and no device work or other use of it may follow.
pub(crate) unsafe fn mem_free(ptr: CUdeviceptr) -> Result<()> {
    // SAFETY: memory of cuMemAlloc that nothing uses any more (see above).
    unsafe { driver_call!(cuMemFree_v2(ptr)) }
}

/// `cuMemFreeAsync`: frees device memory in stream order on `stream`: once the work queued there before it has
/// run.
///
/// # Safety
/// `ptr` must come from [`mem_alloc_from_pool_async`] (or [`mem_alloc`], or another pool) and not be freed
/// already; every use of it must be ordered before the free on `stream` (queued there before, or waited for by
/// it), and none may follow.
pub(crate) unsafe fn mem_free_async(ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
    // SAFETY: an allocation whose uses are all ordered before the free (see above), and a live stream.
    unsafe { driver_call!(cuMemFreeAsync(ptr, stream)) }
}

/// `cuMemHostAlloc`: `bytes` of page-locked host memory (not initialised); free it with [`mem_free_host`].
pub(crate) fn mem_host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuMemHostAlloc(&mut ptr, bytes, flags)) }?;
    Ok(ptr)
}

/// `cuMemFreeHost`: frees page-locked memory of [`mem_host_alloc`]. Waits for all work on the device first.
///
/// # Safety
/// `ptr` must come from [`mem_host_alloc`], not be freed already, and nothing (device work, the host) may use
/// the memory any more.
pub(crate) unsafe fn mem_free_host(ptr: *mut c_void) -> Result<()> {
    // SAFETY: memory of cuMemHostAlloc that nothing uses any more (see above).
    unsafe { driver_call!(cuMemFreeHost(ptr)) }
}

/// `cuMemHostRegister_v2`: page-locks `bytes` of host memory at `ptr` in place; undo it with
/// [`mem_host_unregister`].
///
/// # Safety
/// `ptr` must point to `bytes` bytes of a live allocation that stays allocated, and is not moved or freed,
/// until it is unregistered.
pub(crate) unsafe fn mem_host_register(ptr: *mut c_void, bytes: usize, flags: u32) -> Result<()> {
    // SAFETY: a live range that outlives its registration (see above).
    unsafe { driver_call!(cuMemHostRegister_v2(ptr, bytes, flags)) }
}

/// `cuMemHostUnregister`: unpins host memory of [`mem_host_register`]. Waits for all work on the device first.
///
/// # Safety
/// `ptr` must be the start of a range registered with [`mem_host_register`] and not unregistered already, and
/// no device work may use the range any more.
pub(crate) unsafe fn mem_host_unregister(ptr: *mut c_void) -> Result<()> {
    // SAFETY: a registered range that no device work uses any more (see above).
    unsafe { driver_call!(cuMemHostUnregister(ptr)) }
}

/// `cuMemcpyHtoDAsync_v2`: enqueues on `stream` a copy of `bytes` from host memory at `src` to device memory at
/// `dst`. Returns at once, unless `src` is pageable memory (the driver then stages it, and may block).
///
/// # Safety
/// `src` must be `bytes` readable bytes and `dst` `bytes` bytes of device memory of `stream`'s context, both
/// staying allocated, and `src` unwritten and `dst` unused by anything else, until the copy has completed; the
/// copy must be ordered after conflicting work on either range.
pub(crate) unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: two ranges valid until the copy completes, and a live stream (see above).
    unsafe { driver_call!(cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)) }
}

/// `cuMemcpyDtoHAsync_v2`: enqueues on `stream` a copy of `bytes` from device memory at `src` to host memory at
/// `dst`. Returns at once, unless `dst` is pageable memory (the driver then stages it, and may block).
///
/// # Safety
/// `dst` must be `bytes` writable bytes, and any bytes a valid value of what the caller reads there, and `src`
/// `bytes` bytes of device memory of `stream`'s context, both staying allocated, and `dst` untouched by anything
/// else and `src` unwritten, until the copy has completed; the copy must be ordered after conflicting work on
/// either range.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: two ranges valid until the copy completes, and a live stream (see above).
    unsafe { driver_call!(cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)) }
}

/// `cuMemcpyDtoDAsync_v2`: enqueues on `stream` a copy of `bytes` between two ranges of device memory. Returns at
/// once.
///
/// # Safety
/// `src` and `dst` must be `bytes` bytes each of device memory of `stream`'s context, staying allocated until
/// the copy has completed, and the copy ordered after conflicting work on either range.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: two ranges valid until the copy completes, and a live stream (see above).
    unsafe { driver_call!(cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)) }
}

/// `cuMemcpyPeerAsync`: enqueues on `stream` a copy of `bytes` from device memory of `src_context` to device
/// memory of `dst_context` (directly where peer access is enabled, else staged by the driver). Returns at once.
///
/// # Safety
/// `src` must be `bytes` bytes of device memory of `src_context`, `dst` of `dst_context`, both staying
/// allocated until the copy has completed, and the copy ordered after conflicting work on either range.
pub(crate) unsafe fn memcpy_peer_async(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: two ranges valid until the copy completes, of the contexts named, and a live stream (see above).
    unsafe {
        driver_call!(cuMemcpyPeerAsync(
            dst,
            dst_context,
            src,
            src_context,
            bytes,
            stream
        ))
    }
}

/// `cuMemsetD8Async`: enqueues on `stream` the setting of `bytes` bytes of device memory at `dst` to `value`.
/// Returns at once.
///
/// # Safety
/// `dst` must be `bytes` bytes of device memory of `stream`'s context, staying allocated until the memset has
/// completed, and the memset ordered after conflicting work on the range.
pub(crate) unsafe fn memset_d8_async(
    dst: CUdeviceptr,
    value: u8,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    // SAFETY: a range valid until the memset completes, and a live stream (see above).
    unsafe { driver_call!(cuMemsetD8Async(dst, value, bytes, stream)) }
}

/// `cuMemHostGetDevicePointer_v2`: the device address of page-locked host memory mapped into the current
/// context's address space.
pub(crate) fn mem_host_get_device_pointer(host: *mut c_void) -> Result<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: an out-pointer to a local; the driver only looks `host` up among its page-locked ranges.
    unsafe { driver_call!(cuMemHostGetDevicePointer_v2(&mut ptr, host, 0)) }?;
    Ok(ptr)
}
