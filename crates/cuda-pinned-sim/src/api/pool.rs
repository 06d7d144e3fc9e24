//! Memory pools (each device's default pool and those of `cuMemPoolCreate`) and the stream-ordered
//! allocations made from them (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`).

use std::ffi::{c_int, c_void};
use std::sync::MutexGuard;

use super::context::current;
use super::device::check_device;
use super::memory::device_alloc;
use super::streams::{is_default_stream, live_stream, submit};
use super::{Outcome, entry, put};
use crate::sim::{Kind, Op, PoolData, SIM, State};
use crate::sys::*;

/// Where pool handles start: apart from the other handles, whose values seed each stream's delays, so that
/// making a pool changes no stream's delays.
const POOL_BASE: usize = 0x7000_0000;

/// A fresh pool handle (pools are never forgotten, so their count numbers them).
pub(super) fn pool_handle(state: &State) -> usize {
    POOL_BASE + state.pools.len() * 0x10
}

/// The pool behind a handle, if it is one not destroyed.
fn live_pool(state: &mut State, pool: CUmemoryPool) -> Outcome<&mut PoolData> {
    state
        .pools
        .get_mut(&(pool as usize))
        .filter(|p| !p.destroyed)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetMemPool", |state| {
        put(
            pool,
            state.default_pools[check_device(dev)?] as CUmemoryPool,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetDefaultMemPool", |state| {
        put(
            pool_out,
            state.default_pools[check_device(dev)?] as CUmemoryPool,
        )
    })
}

/// `cuMemPoolCreate`: a pool of a device's memory, pinned, with no handle types (all the simulator models).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    poolProps: *const CUmemPoolProps,
) -> CUresult {
    entry("cuMemPoolCreate", |mut state| {
        if poolProps.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller passes the properties, as cuMemPoolCreate demands.
        let props = unsafe { poolProps.read() };
        if props.allocType != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if props.handleTypes != CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let device = check_device(props.location.id)? as i32;
        let handle = pool_handle(&state);
        put(pool, handle as CUmemoryPool)?;
        state.pools.insert(handle, PoolData::new(device));
        Ok(())
    })
}

/// `cuMemPoolDestroy`: no more allocations from the pool; what was allocated from it stays valid.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    entry("cuMemPoolDestroy", |mut state| {
        if state.default_pools.contains(&(pool as usize)) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let data = live_pool(&mut state, pool)?;
        data.destroyed = true;
        // What it keeps goes back to the device; its live allocations stay valid until freed.
        data.kept = 0;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    entry("cuMemPoolTrimTo", |mut state| {
        live_pool(&mut state, pool)?;
        let live = state.pool_live(pool as usize);
        live_pool(&mut state, pool)?.trim_to(minBytesToKeep as u64, live);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    entry("cuMemPoolSetAttribute", |mut state| {
        let pool = live_pool(&mut state, pool)?;
        if value.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        match attr {
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                // SAFETY: for this attribute the value is a cuuint64_t, as cuda.h documents; checked non-null.
                pool.threshold = unsafe { value.cast::<u64>().read_unaligned() };
            }
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                // SAFETY: for this attribute the value is an int, as cuda.h documents; checked non-null.
                pool.internal_dependencies = unsafe { value.cast::<c_int>().read_unaligned() } != 0;
            }
            _ => return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    entry("cuMemPoolGetAttribute", |mut state| {
        let handle = pool as usize;
        let data = live_pool(&mut state, pool)?;
        match attr {
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
                put(value.cast::<u64>(), data.threshold)
            }
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => put(
                value.cast::<c_int>(),
                c_int::from(data.internal_dependencies),
            ),
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => {
                let kept = data.kept;
                put(value.cast::<u64>(), (state.pool_live(handle) + kept) as u64)
            }
            _ => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
    })
}

/// `cuMemPoolSetAccess`: which devices may use the pool's memory. The pool's own device always may (asking
/// to take that away is an error, as on the driver).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    entry("cuMemPoolSetAccess", |mut state| {
        let pool = live_pool(&mut state, pool)?;
        if map.is_null() && count > 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let descs = if count == 0 {
            &[][..]
        } else {
            // SAFETY: the caller passes `count` descriptors at `map`, as cuMemPoolSetAccess demands.
            unsafe { std::slice::from_raw_parts(map, count) }
        };
        for desc in descs {
            if desc.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let device = check_device(desc.location.id)? as i32;
            let none = desc.flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
            if device == pool.device {
                if none {
                    return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
                }
                continue;
            }
            if !none && !SIM.config.peer_access {
                return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
            }
            pool.access.retain(|&d| d != device);
            if !none {
                pool.access.push(device);
            }
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemPoolGetAccess(
    flags: *mut CUmemAccess_flags,
    memPool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    entry("cuMemPoolGetAccess", |mut state| {
        let pool = live_pool(&mut state, memPool)?;
        if location.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller passes a location, as cuMemPoolGetAccess demands.
        let location = unsafe { location.read() };
        let device = check_device(location.id)? as i32;
        let access = device == pool.device || pool.access.contains(&device);
        put(
            flags,
            if access {
                CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            } else {
                CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemAllocAsync", |state| {
        alloc_from_pool(state, "cuMemAllocAsync", dptr, bytesize, None, hStream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync", |state| {
        alloc_from_pool(
            state,
            "cuMemAllocFromPoolAsync",
            dptr,
            bytesize,
            Some(pool),
            hStream,
        )
    })
}

/// A stream-ordered allocation on `stream` from `pool` (the device's default pool where `None`). Where the
/// pool lets the driver make `stream` wait for a free still pending on another stream (internal dependencies
/// on, the driver's default) and such a free is queued, reports a hidden wait: under memory pressure the
/// driver would reuse that memory and order `stream` after the other stream's work.
fn alloc_from_pool(
    mut state: MutexGuard<'static, State>,
    function: &str,
    dptr: *mut CUdeviceptr,
    bytes: usize,
    pool: Option<CUmemoryPool>,
    stream: CUstream,
) -> Outcome {
    let device = if is_default_stream(stream) {
        current(&state)?
    } else {
        live_stream(&state, stream)?.1
    };
    if !is_default_stream(stream) && crate::graph::link(&state, stream as usize).is_some() {
        // A stream-ordered allocation in a capture (a graph's own memory) is not modelled.
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let pool = match pool {
        Some(pool) => pool as usize,
        None => state.default_pools[device],
    };
    let data = live_pool(&mut state, pool as CUmemoryPool)?;
    if data.device != device as i32 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if dptr.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let internal_dependencies = data.internal_dependencies;
    let pending_elsewhere = state
        .allocations
        .values()
        .filter(|a| a.kind == Kind::DeviceAsync && a.pool == pool && a.free_queued)
        .find(|a| a.free_stream != stream as usize)
        .map(|a| a.free_stream);
    if let (true, Some(other)) = (internal_dependencies, pending_elsewhere) {
        let message = format!(
            "HIDDEN WAIT: {function} of {bytes} bytes on stream {stream:p} from a pool that may reuse memory \
             whose free is still pending on stream {other:#x} by making this stream wait for that one's work \
             (CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES is on), as the driver does under memory pressure"
        );
        state.finding(message);
    }
    let address = device_alloc(&mut state, device, bytes, Kind::DeviceAsync, pool)?;
    put(dptr, address)?;
    let id = state.device_map[&address];
    submit(state, stream, Op::Allocate { id }, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream) -> CUresult {
    entry("cuMemFreeAsync", |mut state| {
        if !is_default_stream(hStream) {
            let (handle, _) = live_stream(&state, hStream)?;
            // Memory allocated outside the capture, freed in it: refused, and a capture in another mode than
            // relaxed ended.
            if let Some(id) = crate::graph::link(&state, handle).map(|l| l.capture) {
                if state.captures[&id].mode != CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED {
                    crate::graph::invalidate(&mut state, id);
                    return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
                }
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        }
        let id = state
            .device_map
            .get(&dptr)
            .copied()
            .filter(|id| state.allocations[id].kind.is_device())
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let allocation = state
            .allocations
            .get_mut(&id)
            .expect("mapped allocations exist");
        allocation.free_stream = hStream as usize;
        let device = allocation.device;
        if std::mem::replace(&mut allocation.free_queued, true) {
            let message = format!("cuMemFreeAsync: device memory {dptr:#x} freed twice");
            state.violation(message);
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        crate::graph::freed(&mut state, Some(device));
        submit(state, hStream, Op::Free { id }, false)
    })
}
