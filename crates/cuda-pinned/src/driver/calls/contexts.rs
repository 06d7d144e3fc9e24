//! Contexts: the primary context, the current context of the thread, and what a context holds.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use crate::driver_call;
use crate::error::Result;
use crate::sys::{
    CUcontext, CUdevice, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps,
    CUmemoryPool,
};

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
