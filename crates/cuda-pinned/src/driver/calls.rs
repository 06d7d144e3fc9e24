//! Thin typed wrappers of the driver calls the safe layer makes: one function per call, named after it (the
//! first line of each function's docs names the exported function it calls, versioned as in
//! [`crate::sys::DriverApi`]).
//!
//! Out-pointers become return values, a query's `CUDA_ERROR_NOT_READY` becomes `Ok(false)`, and a buffer the
//! driver fills is a slice whose length goes with it. Every error is the driver's (or the loader's), unchanged:
//! the callers add what they were doing with [`Error::context`](crate::Error::context).
//!
//! Handles (devices, contexts, streams, events) are passed as the driver's values, and the safe functions here
//! need them live: the crate's types pass only handles they own, or were given by a caller who promised they
//! stay valid ([`crate::Stream::from_raw`]), and only while they hold them. The functions that end a handle's
//! life and those given memory addresses (copies, memsets, frees, registration) are `unsafe`: their `# Safety`
//! sections say what the caller guarantees.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::driver_call;
use crate::error::Result;
use crate::sys::{
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS, CUcontext, CUdevice,
    CUdevice_attribute, CUdeviceptr, CUevent, CUfunction, CUfunction_attribute, CUgraph,
    CUgraphExec, CUgraphNode, CUgraphNodeType, CUmemAccess_flags, CUmemAccessDesc,
    CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation, CUmemLocationType,
    CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUmodule, CUresult, CUstream, CUuuid,
};

/// `Ok(true)` for success, `Ok(false)` for `CUDA_ERROR_NOT_READY`, else the error: a query's answer.
fn ready(queried: Result<()>) -> Result<bool> {
    match queried {
        Ok(()) => Ok(true),
        Err(e) if e.driver_code() == Some(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The length of a buffer the driver fills, as the `int` it takes: a longer buffer is offered only in part.
fn c_len(buf: &[c_char]) -> c_int {
    c_int::try_from(buf.len()).unwrap_or(c_int::MAX)
}

// ---- devices

/// `cuDeviceGetCount`: how many devices the driver sees.
pub(crate) fn device_count() -> Result<c_int> {
    let mut count = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetCount(&mut count)) }?;
    Ok(count)
}

/// `cuDeviceGet`: the device with this ordinal (the driver checks it).
pub(crate) fn device_get(ordinal: c_int) -> Result<CUdevice> {
    let mut device = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGet(&mut device, ordinal)) }?;
    Ok(device)
}

/// `cuDeviceGetName`: the device's name, NUL-terminated within `name`.
pub(crate) fn device_name(name: &mut [c_char], device: CUdevice) -> Result<()> {
    // SAFETY: the buffer's pointer with (at most) its length; the driver writes within it.
    unsafe { driver_call!(cuDeviceGetName(name.as_mut_ptr(), c_len(name), device)) }
}

/// `cuDeviceGetUuid_v2`: the device's UUID.
pub(crate) fn device_uuid(device: CUdevice) -> Result<CUuuid> {
    let mut uuid = CUuuid::default();
    // SAFETY: an out-pointer to a local of the type the driver writes.
    unsafe { driver_call!(cuDeviceGetUuid_v2(&mut uuid, device)) }?;
    Ok(uuid)
}

/// `cuDeviceTotalMem_v2`: the device's memory in bytes.
pub(crate) fn device_total_mem(device: CUdevice) -> Result<usize> {
    let mut bytes = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceTotalMem_v2(&mut bytes, device)) }?;
    Ok(bytes)
}

/// `cuDeviceGetPCIBusId`: the device's PCI address, NUL-terminated within `id`.
pub(crate) fn device_pci_bus_id(id: &mut [c_char], device: CUdevice) -> Result<()> {
    // SAFETY: the buffer's pointer with (at most) its length; the driver writes within it.
    unsafe { driver_call!(cuDeviceGetPCIBusId(id.as_mut_ptr(), c_len(id), device)) }
}

/// `cuDeviceGetAttribute`: an integer attribute of the device (the driver checks the attribute).
pub(crate) fn device_attribute(attribute: CUdevice_attribute, device: CUdevice) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetAttribute(&mut value, attribute, device)) }?;
    Ok(value)
}

// ---- contexts

/// `cuDeviceCanAccessPeer`: whether `device` can access the memory of `peer` directly.
pub(crate) fn device_can_access_peer(device: CUdevice, peer: CUdevice) -> Result<bool> {
    let mut can = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceCanAccessPeer(&mut can, device, peer)) }?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess`: lets the current context access `peer`'s device memory.
pub(crate) fn ctx_enable_peer_access(peer: CUcontext) -> Result<()> {
    // SAFETY: a context handle; the driver checks it and the current context.
    unsafe { driver_call!(cuCtxEnablePeerAccess(peer, 0)) }
}

/// `cuMemPoolCreate`: a memory pool of the memory of the device with ordinal `device`, with the driver's
/// default attributes; destroy it with [`mem_pool_destroy`].
pub(crate) fn mem_pool_create(device: c_int) -> Result<CUmemoryPool> {
    let props = CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        ..CUmemPoolProps::default()
    };
    let mut pool = std::ptr::null_mut();
    // SAFETY: the properties are read during the call; an out-pointer to a local.
    unsafe { driver_call!(cuMemPoolCreate(&mut pool, &props)) }?;
    Ok(pool)
}

/// `cuMemPoolDestroy`: ends the crate's use of `pool`. Its memory still allocated stays valid: the driver
/// releases the pool once the last of it is freed.
pub(crate) fn mem_pool_destroy(pool: CUmemoryPool) -> Result<()> {
    // SAFETY: a pool handle; the driver checks it.
    unsafe { driver_call!(cuMemPoolDestroy(pool)) }
}

/// `cuMemPoolSetAttribute` of `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`: whether an allocation may
/// reuse memory whose free is still pending on another stream, by making its own stream wait for that one.
pub(crate) fn mem_pool_set_internal_dependencies(pool: CUmemoryPool, allow: bool) -> Result<()> {
    let mut value = c_int::from(allow);
    // SAFETY: this attribute's value is an int, read during the call.
    unsafe {
        driver_call!(cuMemPoolSetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            (&raw mut value).cast::<c_void>()
        ))
    }
}

/// `cuMemPoolSetAttribute` of `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: how many bytes of freed memory the pool
/// keeps reserved at a synchronization instead of returning them to the device.
pub(crate) fn mem_pool_set_release_threshold(pool: CUmemoryPool, bytes: u64) -> Result<()> {
    let mut value = bytes;
    // SAFETY: this attribute's value is a cuuint64_t, read during the call.
    unsafe {
        driver_call!(cuMemPoolSetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut value).cast::<c_void>()
        ))
    }
}

/// `cuMemPoolGetAttribute` of an attribute whose value is a `cuuint64_t`.
pub(crate) fn mem_pool_attribute_u64(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
) -> Result<u64> {
    let mut value = 0u64;
    // SAFETY: an out-pointer to a local of the attribute's type.
    unsafe {
        driver_call!(cuMemPoolGetAttribute(
            pool,
            attribute,
            (&raw mut value).cast::<c_void>()
        ))
    }?;
    Ok(value)
}

/// `cuMemPoolTrimTo`: returns the freed memory the pool keeps beyond `keep` bytes to the device.
pub(crate) fn mem_pool_trim_to(pool: CUmemoryPool, keep: usize) -> Result<()> {
    // SAFETY: a pool handle; the driver checks it.
    unsafe { driver_call!(cuMemPoolTrimTo(pool, keep)) }
}

/// `cuMemPoolGetAccess`: whether `device` may read and write the memory of `pool` directly.
pub(crate) fn mem_pool_can_access(pool: CUmemoryPool, device: c_int) -> Result<bool> {
    let mut location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
    // SAFETY: an out-pointer to a local, and a location read during the call; the driver checks the pool.
    unsafe { driver_call!(cuMemPoolGetAccess(&mut flags, pool, &mut location)) }?;
    Ok(flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
}

/// `cuMemPoolSetAccess`: lets `device` read and write the memory of `pool` (of another device) directly.
pub(crate) fn mem_pool_grant_access(pool: CUmemoryPool, device: c_int) -> Result<()> {
    let desc = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one descriptor, read during the call; the driver checks the pool and the device.
    unsafe { driver_call!(cuMemPoolSetAccess(pool, &desc, 1)) }
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context, retained (created if no one holds it); balance it
/// with [`primary_ctx_release`].
pub(crate) fn primary_ctx_retain(device: CUdevice) -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDevicePrimaryCtxRetain(&mut context, device)) }?;
    Ok(context)
}

/// `cuDevicePrimaryCtxRelease_v2`: releases a retain of the device's primary context; the last release
/// destroys the context, with its memory, streams and events.
///
/// # Safety
/// It must balance a [`primary_ctx_retain`] of the caller's, and nothing the caller still uses may depend on
/// that retain (other retains may keep the context alive).
pub(crate) unsafe fn primary_ctx_release(device: CUdevice) -> Result<()> {
    // SAFETY: the caller's retain is the one given back (see above).
    unsafe { driver_call!(cuDevicePrimaryCtxRelease_v2(device)) }
}

/// `cuCtxGetCurrent`: the calling thread's current context (null for none).
pub(crate) fn ctx_get_current() -> Result<CUcontext> {
    let mut context = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuCtxGetCurrent(&mut context)) }?;
    Ok(context)
}

/// `cuCtxPushCurrent_v2`: makes `context` current on the calling thread, above the one it had.
pub(crate) fn ctx_push_current(context: CUcontext) -> Result<()> {
    // SAFETY: a live context (see the module docs).
    unsafe { driver_call!(cuCtxPushCurrent_v2(context)) }
}

/// `cuCtxPopCurrent_v2`: takes the calling thread's current context off its stack; returns it.
pub(crate) fn ctx_pop_current() -> Result<CUcontext> {
    let mut popped = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuCtxPopCurrent_v2(&mut popped)) }?;
    Ok(popped)
}

/// `cuCtxSynchronize`: blocks until all work in the current context has completed.
pub(crate) fn ctx_synchronize() -> Result<()> {
    // SAFETY: no arguments.
    unsafe { driver_call!(cuCtxSynchronize()) }
}

/// `cuCtxGetStreamPriorityRange`: the (least, greatest) stream priorities of the current context's device.
pub(crate) fn ctx_stream_priority_range() -> Result<(c_int, c_int)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: out-pointers to locals.
    unsafe { driver_call!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
    Ok((least, greatest))
}

/// `cuMemGetInfo_v2`: the (free, total) device memory of the current context's device, in bytes.
pub(crate) fn mem_get_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: out-pointers to locals.
    unsafe { driver_call!(cuMemGetInfo_v2(&mut free, &mut total)) }?;
    Ok((free, total))
}

// ---- streams

/// `cuStreamCreate`: a new stream of the current context.
pub(crate) fn stream_create(flags: u32) -> Result<CUstream> {
    let mut stream = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuStreamCreate(&mut stream, flags)) }?;
    Ok(stream)
}

/// `cuStreamCreateWithPriority`: a new stream of the current context with a priority (the driver clamps it).
pub(crate) fn stream_create_with_priority(flags: u32, priority: c_int) -> Result<CUstream> {
    let mut stream = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuStreamCreateWithPriority(&mut stream, flags, priority)) }?;
    Ok(stream)
}

/// `cuStreamDestroy_v2`: destroys a stream; work still queued on it completes first (the driver releases the
/// stream afterwards).
///
/// # Safety
/// Nothing may use `stream` after this call: no handle of it may be left.
pub(crate) unsafe fn stream_destroy(stream: CUstream) -> Result<()> {
    // SAFETY: a live stream that no one uses afterwards (see above).
    unsafe { driver_call!(cuStreamDestroy_v2(stream)) }
}

/// `cuStreamQuery`: whether all work queued on the stream has completed, without blocking.
pub(crate) fn stream_query(stream: CUstream) -> Result<bool> {
    // SAFETY: a live stream (see the module docs).
    ready(unsafe { driver_call!(cuStreamQuery(stream)) })
}

/// `cuStreamWriteValue32_v2` (flags 0): queues on `stream` a write of `value` to the 4 bytes at `address`,
/// which lands once the work queued before it has completed, with that work's writes visible before it. No
/// context needs to be current (ARCHITECTURE.md, "A stream can write a word of memory, in order").
///
/// # Safety
/// `address` must be 4-byte aligned in memory the device can write (page-locked host memory by its host address,
/// or device memory) that stays allocated, and that nothing else relies on, until the write has landed.
pub(crate) unsafe fn stream_write_value32(
    stream: CUstream,
    address: CUdeviceptr,
    value: u32,
) -> Result<()> {
    // SAFETY: a live stream (see the module docs) and an address the caller vouches for.
    unsafe { driver_call!(cuStreamWriteValue32_v2(stream, address, value, 0)) }
}

/// `cuStreamSynchronize`: blocks until all work queued on the stream has completed.
pub(crate) fn stream_synchronize(stream: CUstream) -> Result<()> {
    // SAFETY: a live stream (see the module docs).
    unsafe { driver_call!(cuStreamSynchronize(stream)) }
}

/// `cuStreamWaitEvent` (flags `CU_EVENT_WAIT_DEFAULT`): makes work queued on `stream` from now on wait, on the
/// device, for `event` as last recorded (the driver copies the event's state now). Never blocks the host.
pub(crate) fn stream_wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    // SAFETY: a live stream and a live event (see the module docs).
    unsafe { driver_call!(cuStreamWaitEvent(stream, event, 0)) }
}

/// `cuStreamGetPriority`: the stream's priority.
pub(crate) fn stream_priority(stream: CUstream) -> Result<c_int> {
    let mut priority = 0;
    // SAFETY: a live stream (see the module docs) and an out-pointer to a local.
    unsafe { driver_call!(cuStreamGetPriority(stream, &mut priority)) }?;
    Ok(priority)
}

// ---- events

/// `cuEventCreate`: a new event of the current context.
pub(crate) fn event_create(flags: u32) -> Result<CUevent> {
    let mut event = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuEventCreate(&mut event, flags)) }?;
    Ok(event)
}

/// `cuEventDestroy_v2`: destroys an event; the driver defers releasing one whose recorded work is pending.
///
/// # Safety
/// Nothing may use `event` after this call: no handle of it may be left.
pub(crate) unsafe fn event_destroy(event: CUevent) -> Result<()> {
    // SAFETY: a live event that no one uses afterwards (see above).
    unsafe { driver_call!(cuEventDestroy_v2(event)) }
}

/// `cuEventRecord`: records `event` at the current end of `stream`'s work. Never blocks the host.
pub(crate) fn event_record(event: CUevent, stream: CUstream) -> Result<()> {
    // SAFETY: a live event and a live stream (see the module docs).
    unsafe { driver_call!(cuEventRecord(event, stream)) }
}

/// `cuEventQuery`: whether the event has completed, without blocking.
pub(crate) fn event_query(event: CUevent) -> Result<bool> {
    // SAFETY: a live event (see the module docs).
    ready(unsafe { driver_call!(cuEventQuery(event)) })
}

/// `cuEventSynchronize`: blocks until the event has completed.
pub(crate) fn event_synchronize(event: CUevent) -> Result<()> {
    // SAFETY: a live event (see the module docs).
    unsafe { driver_call!(cuEventSynchronize(event)) }
}

/// `cuEventElapsedTime_v2`: the device time from `start` to `end`, in milliseconds.
pub(crate) fn event_elapsed_time(start: CUevent, end: CUevent) -> Result<f32> {
    let mut ms = 0f32;
    // SAFETY: an out-pointer to a local and two live events (see the module docs).
    unsafe { driver_call!(cuEventElapsedTime_v2(&mut ms, start, end)) }?;
    Ok(ms)
}

// ---- memory

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

// ---- modules and kernels

/// `cuModuleLoadData`: loads a PTX, cubin or fatbin image into the current context.
///
/// # Safety
/// `image` must point to a whole image: a cubin or fatbin (whose headers give its length), or NUL-terminated
/// PTX text. The driver reads it during the call only.
pub(crate) unsafe fn module_load_data(image: *const c_void) -> Result<CUmodule> {
    let mut module = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, and an image as the caller guarantees.
    unsafe { driver_call!(cuModuleLoadData(&mut module, image)) }?;
    Ok(module)
}

/// `cuModuleUnload`: unloads a module; it waits for the whole device.
///
/// # Safety
/// `module` must be live, no work launched from it may still be queued or running, and its functions must
/// not be used again.
pub(crate) unsafe fn module_unload(module: CUmodule) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuModuleUnload(module)) }
}

/// `cuModuleGetFunction`: the kernel named `name` in `module`.
pub(crate) fn module_get_function(module: CUmodule, name: &CStr) -> Result<CUfunction> {
    let mut function = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, a live module (see the module docs) and a NUL-terminated name.
    unsafe { driver_call!(cuModuleGetFunction(&mut function, module, name.as_ptr())) }?;
    Ok(function)
}

/// `cuFuncGetParamInfo`: the offset and size in bytes of the kernel's parameter `index`;
/// `CUDA_ERROR_INVALID_VALUE` past the last one.
pub(crate) fn func_get_param_info(function: CUfunction, index: usize) -> Result<(usize, usize)> {
    let (mut offset, mut size) = (0, 0);
    // SAFETY: out-pointers to locals and a live function.
    unsafe { driver_call!(cuFuncGetParamInfo(function, index, &mut offset, &mut size)) }?;
    Ok((offset, size))
}

/// `cuFuncGetAttribute`: an integer attribute of the kernel.
pub(crate) fn func_get_attribute(
    attribute: CUfunction_attribute,
    function: CUfunction,
) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: an out-pointer to a local and a live function.
    unsafe { driver_call!(cuFuncGetAttribute(&mut value, attribute, function)) }?;
    Ok(value)
}

/// `cuLaunchKernel`: enqueues `function` on `stream` with a grid of `grid` blocks of `block` threads and
/// `shared` bytes of dynamic shared memory. Returns at once.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, each to a value of that parameter's size and type,
/// readable during the call; the memory the kernel touches must stay allocated and be ordered for it until it
/// has completed; `function` and `stream` must be of one live context.
pub(crate) unsafe fn launch_kernel(
    function: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let params = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    // SAFETY: as the caller guarantees; `extra` is null.
    unsafe {
        driver_call!(cuLaunchKernel(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            stream,
            params,
            std::ptr::null_mut(),
        ))
    }
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13.0 and later; 12.8's `cuMemcpyBatchAsync` has another signature): copies `sizes[k]` bytes from `srcs[k]` to `dsts[k]` for every
/// `k`, by unified address, each source read in stream order, on `stream` (in no particular order among
/// themselves). Returns at once.
///
/// # Safety
/// The three slices have one length; every range is live memory the device can reach (device memory,
/// page-locked host memory) until the copies have completed and ordered for them; no destination overlaps
/// another copy's source or destination.
pub(crate) unsafe fn memcpy_batch_async(
    dsts: &mut [CUdeviceptr],
    srcs: &mut [CUdeviceptr],
    sizes: &mut [usize],
    stream: CUstream,
) -> Result<()> {
    let mut attributes = crate::sys::CUmemcpyAttributes {
        srcAccessOrder: crate::sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        ..Default::default()
    };
    let mut first = 0usize;
    // SAFETY: as the caller guarantees; one attribute for every copy, from copy 0.
    unsafe {
        driver_call!(cuMemcpyBatchAsync_v2(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            &mut attributes,
            &mut first,
            1,
            stream,
        ))
    }
}

/// `cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`: the memory pool device memory at `ptr`
/// came from (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`: it is freed stream-ordered), null for memory of no
/// pool (`cuMemAlloc`).
pub(crate) fn pointer_mem_pool(ptr: CUdeviceptr) -> Result<CUmemoryPool> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local of the attribute's type; the driver only looks the address up.
    unsafe {
        driver_call!(cuPointerGetAttribute(
            (&raw mut pool).cast(),
            crate::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr
        ))
    }?;
    Ok(pool)
}

// ---- stream capture and graphs

/// `cuStreamBeginCapture_v2` in the relaxed mode: work queued on `stream` from now on is recorded into a graph
/// rather than run, until `cuStreamEndCapture`. The relaxed mode lets every thread go on making the calls the
/// other modes forbid during a capture (pinning, unpinning, frees): the crate never makes them on memory the
/// capture uses (ARCHITECTURE.md, "Graphs").
pub(crate) fn stream_begin_capture(stream: CUstream) -> Result<()> {
    let mode = crate::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream (see the module docs).
    unsafe { driver_call!(cuStreamBeginCapture_v2(stream, mode)) }
}

/// `cuStreamEndCapture`: ends the capture `stream` began, returning its graph (which the caller destroys with
/// [`graph_destroy`]).
pub(crate) fn stream_end_capture(stream: CUstream) -> Result<CUgraph> {
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; an out-pointer to a local.
    unsafe { driver_call!(cuStreamEndCapture(stream, &mut graph)) }?;
    Ok(graph)
}

/// `cuStreamGetCaptureInfo_v3`: the nodes of the capture that work queued on `stream` next will depend on. An
/// invalid-argument error where the stream is not in an active capture.
pub(crate) fn stream_capture_dependencies(stream: CUstream) -> Result<Vec<CUgraphNode>> {
    let mut status = crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut nodes: *const CUgraphNode = std::ptr::null();
    let mut count = 0;
    // SAFETY: a live stream; out-pointers to locals; the other outputs are optional.
    unsafe {
        driver_call!(cuStreamGetCaptureInfo_v3(
            stream,
            &mut status,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut nodes,
            std::ptr::null_mut(),
            &mut count,
        ))
    }?;
    if status != crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Err(crate::Error::invalid(
            "the stream is not in an active capture (it ended, or other code's call invalidated it)",
        ));
    }
    if nodes.is_null() || count == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: cuda.h: the array holds `count` nodes and stays valid until the next call on the stream.
    Ok(unsafe { std::slice::from_raw_parts(nodes, count) }.to_vec())
}

/// `cuStreamUpdateCaptureDependencies_v2` (add): makes work queued on the capturing `stream` next depend on
/// `nodes` too, which belong to the same capture.
pub(crate) fn stream_add_capture_dependencies(
    stream: CUstream,
    nodes: &[CUgraphNode],
) -> Result<()> {
    let flags =
        crate::sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES.0;
    // SAFETY: a live stream; the driver reads `nodes.len()` nodes (it takes the pointer as mutable but does not
    // write through it).
    unsafe {
        driver_call!(cuStreamUpdateCaptureDependencies_v2(
            stream,
            nodes.as_ptr().cast_mut(),
            std::ptr::null(),
            nodes.len(),
            flags,
        ))
    }
}

/// `cuGraphInstantiateWithFlags` (no flags): an executable graph of `graph`.
pub(crate) fn graph_instantiate(graph: CUgraph) -> Result<CUgraphExec> {
    let mut exec = std::ptr::null_mut();
    // SAFETY: a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphInstantiateWithFlags(&mut exec, graph, 0)) }?;
    Ok(exec)
}

/// `cuGraphUpload`: prepares `exec` for launches on `stream` (a first launch does it otherwise).
pub(crate) fn graph_upload(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: a live executable graph and stream.
    unsafe { driver_call!(cuGraphUpload(exec, stream)) }
}

/// `cuGraphLaunch`: queues a run of `exec` on `stream`, after the stream's earlier work and the graph's earlier
/// launches, whatever streams those were on (ARCHITECTURE.md, "Graphs").
///
/// # Safety
/// Every memory address the graph's nodes use must stay allocated until the launch has completed.
pub(crate) unsafe fn graph_launch(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    // SAFETY: live handles; the memory as the caller guarantees.
    unsafe { driver_call!(cuGraphLaunch(exec, stream)) }
}

/// `cuGraphGetNodes`: the nodes of `graph`.
pub(crate) fn graph_nodes(graph: CUgraph) -> Result<Vec<CUgraphNode>> {
    let mut count = 0;
    // SAFETY: a live graph (see the module docs); a null array asks for the count.
    unsafe { driver_call!(cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) }?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: room for `count` nodes.
    unsafe { driver_call!(cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count)) }?;
    nodes.truncate(count);
    Ok(nodes)
}

/// `cuGraphNodeGetType`.
pub(crate) fn graph_node_type(node: CUgraphNode) -> Result<CUgraphNodeType> {
    let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: a node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphNodeGetType(node, &mut kind)) }?;
    Ok(kind)
}

/// `cuGraphKernelNodeGetParams_v2`: a kernel node's launch. Its `kernelParams` point into the driver's copy of
/// the values, valid until the node's parameters are set.
pub(crate) fn kernel_node_params(node: CUgraphNode) -> Result<CUDA_KERNEL_NODE_PARAMS> {
    // SAFETY: all zeros is a valid CUDA_KERNEL_NODE_PARAMS (null handles and pointers), which the driver fills.
    let mut params: CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphKernelNodeGetParams_v2(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecKernelNodeSetParams_v2` then `cuGraphKernelNodeSetParams_v2`: sets a kernel node's launch in
/// `exec` (for its launches from now on) and in its template graph. The driver copies the values.
///
/// # Safety
/// `params` must be a launch whose `kernelParams` hold one pointer per parameter of its function, each to a
/// value of that parameter's size, readable during the call; the memory the launches touch must stay
/// allocated and be ordered for them.
pub(crate) unsafe fn set_kernel_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecKernelNodeSetParams_v2(exec, node, params))?;
        driver_call!(cuGraphKernelNodeSetParams_v2(node, params))
    }
}

/// `cuGraphMemcpyNodeGetParams`: a copy node's copy.
pub(crate) fn memcpy_node_params(node: CUgraphNode) -> Result<CUDA_MEMCPY3D> {
    // SAFETY: all zeros is a valid CUDA_MEMCPY3D (null pointers, zero sizes), which the driver fills.
    let mut params: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    // SAFETY: a copy node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphMemcpyNodeGetParams(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecMemcpyNodeSetParams` (in `context`) then `cuGraphMemcpyNodeSetParams`: sets a copy node's copy
/// in `exec` (for its launches from now on) and in its template graph.
///
/// # Safety
/// The memory the copy touches must stay allocated and be ordered for the graph's launches.
pub(crate) unsafe fn set_memcpy_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_MEMCPY3D,
    context: CUcontext,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecMemcpyNodeSetParams(exec, node, params, context))?;
        driver_call!(cuGraphMemcpyNodeSetParams(node, params))
    }
}

/// `cuGraphMemsetNodeGetParams`: a memset node's memset.
pub(crate) fn memset_node_params(node: CUgraphNode) -> Result<CUDA_MEMSET_NODE_PARAMS> {
    let mut params = CUDA_MEMSET_NODE_PARAMS::default();
    // SAFETY: a memset node of a live graph; an out-pointer to a local.
    unsafe { driver_call!(cuGraphMemsetNodeGetParams(node, &mut params)) }?;
    Ok(params)
}

/// `cuGraphExecMemsetNodeSetParams` (in `context`) then `cuGraphMemsetNodeSetParams`: as
/// [`set_memcpy_node_params`], for a memset node.
///
/// # Safety
/// As [`set_memcpy_node_params`].
pub(crate) unsafe fn set_memset_node_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_MEMSET_NODE_PARAMS,
    context: CUcontext,
) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe {
        driver_call!(cuGraphExecMemsetNodeSetParams(exec, node, params, context))?;
        driver_call!(cuGraphMemsetNodeSetParams(node, params))
    }
}

/// `cuGraphExecDestroy`: the driver finishes launches still in flight, then frees it (returns at once).
///
/// # Safety
/// `exec` must be live and not used again.
pub(crate) unsafe fn graph_exec_destroy(exec: CUgraphExec) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuGraphExecDestroy(exec)) }
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` must be live and not used again.
pub(crate) unsafe fn graph_destroy(graph: CUgraph) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuGraphDestroy(graph)) }
}

/// `cuStreamIsCapturing`: whether `stream` is in a capture (active or invalidated).
pub(crate) fn stream_is_capturing(stream: CUstream) -> Result<bool> {
    let mut status = crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; an out-pointer to a local.
    unsafe { driver_call!(cuStreamIsCapturing(stream, &mut status)) }?;
    Ok(status != crate::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
