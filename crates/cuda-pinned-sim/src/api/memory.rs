//! Device memory: where a pointer points (device memory, page-locked or pageable host memory), allocation
//! and release of device memory, and the device-wide wait with which the driver's calls release memory. Also
//! the attributes of a pointer (`cuPointerGetAttribute`).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::MutexGuard;

use super::context::{context_handle, current};
use super::{Outcome, entry, put};
use crate::detect::{self, DeviceSync};
use crate::sim::{Allocation, Kind, Loc, Op, SIM, State, Storage};
use crate::sys::*;

/// Where a device pointer points: device memory, or (mapped) pinned host memory, `bytes` of it.
pub(crate) fn device_loc(
    state: &mut State,
    address: CUdeviceptr,
    bytes: usize,
    what: &str,
) -> Outcome<Loc> {
    let (id, offset) = state
        .find(address, bytes, true)
        .or_else(|| state.find(address, bytes, false))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let allocation = &state.allocations[&id];
    if allocation.free_queued {
        let message = format!(
            "{what} of {bytes} bytes at device address {address:#x} queued after a stream-ordered free of it"
        );
        state.violation(message);
    }
    Ok(Loc::Alloc { id, offset })
}

/// Where a host pointer points: inside a pinned or registered range, or ordinary pageable memory.
pub(crate) fn host_loc(state: &State, address: *const c_void, bytes: usize) -> Outcome<Loc> {
    if address.is_null() && bytes > 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(match state.find(address as u64, bytes, false) {
        Some((id, offset)) => Loc::Alloc { id, offset },
        None => Loc::Pageable(address as usize),
    })
}

/// Either pointer of a unified-addressing copy.
pub(crate) fn any_loc(state: &mut State, address: u64, bytes: usize, what: &str) -> Outcome<Loc> {
    if state.find(address, bytes, true).is_some() {
        return device_loc(state, address, bytes, what);
    }
    host_loc(state, address as *const c_void, bytes)
}

/// Releases an allocation as the driver's `cuMemFreeHost`, `cuMemHostUnregister` and `cuMemFree_v2` do: once
/// every operation queued on the device when the call is made has finished (on every device, for host memory:
/// the simulator does not track which contexts map it). Memory that queued work uses is a violation at the
/// call, although that work then runs before the release; waiting for work that does not touch the memory, on
/// any thread, is a hidden wait (see `detect.rs`).
pub(super) fn free_now<'a>(
    mut state: MutexGuard<'a, State>,
    id: u64,
    function: &str,
) -> MutexGuard<'a, State> {
    let allocation = &state.allocations[&id];
    let device = allocation.kind.is_device().then_some(allocation.device);
    if allocation.pending > 0 {
        let message = format!(
            "{function} freed {} at {:#x} ({} bytes) while queued work still uses it: {}",
            allocation.kind.describe(),
            allocation.base,
            allocation.bytes,
            state.users(id)
        );
        state.violation(message);
    }
    let state = device_wait(state, device, |op| op.footprint().contains(&id), function);
    let mut state = SIM.wait_until(state, |s| {
        s.allocations.get(&id).is_none_or(|a| a.executing == 0)
    });
    state.unmap(id);
    SIM.changed.notify_all();
    state
}

/// Waits, as a call that synchronizes the device does, for every operation queued on `device` (every device
/// where `None`) when it is called; reports a hidden wait where that includes work unrelated to the call (see
/// `detect.rs`): work for which `related` is false.
pub(super) fn device_wait<'a>(
    mut state: MutexGuard<'a, State>,
    device: Option<i32>,
    related: impl Fn(&Op) -> bool,
    function: &str,
) -> MutexGuard<'a, State> {
    let sync = DeviceSync::now(&state, device, related);
    if let Some(report) = sync.hidden_wait(function) {
        // Naming the caller reads debug information: not under the lock, which every stream needs.
        drop(state);
        let callers = detect::caller_frames();
        state = SIM.lock();
        if !detect::documented_wait(&callers) {
            state.finding(format!("{report}; {}", detect::describe_callers(&callers)));
        }
    }
    SIM.wait_until(state, |s| sync.done(s))
}

pub(super) fn device_alloc(
    state: &mut State,
    device: usize,
    bytes: usize,
    kind: Kind,
    pool: usize,
) -> Outcome<CUdeviceptr> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // What the pool keeps reserved serves first; only the rest is new memory of the device.
    let kept = match state.pools.get(&pool) {
        Some(data) if kind == Kind::DeviceAsync => data.kept.min(bytes),
        _ => 0,
    };
    if bytes - kept
        > SIM
            .config
            .device_memory
            .saturating_sub(state.device_bytes(device as i32))
    {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let storage = Storage::zeroed(bytes, 256).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    if let Some(data) = state.pools.get_mut(&pool).filter(|_| kept > 0) {
        data.kept -= kept;
    }
    let base = state.next_device_address;
    state.next_device_address += (bytes as u64).next_multiple_of(512) + state.device_gap;
    state.add_allocation(Allocation {
        kind,
        base,
        bytes,
        flags: 0,
        device: device as i32,
        storage: Some(storage),
        pending: 0,
        executing: 0,
        ready: kind == Kind::Device,
        free_queued: false,
        free_stream: 0,
        pool,
    });
    Ok(base)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", |state| {
        let used = state.device_bytes(current(&state)? as i32);
        put(free, SIM.config.device_memory.saturating_sub(used))?;
        put(total, SIM.config.device_memory)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    entry("cuMemAlloc_v2", |mut state| {
        let device = current(&state)?;
        crate::graph::prohibited(&mut state)?;
        if dptr.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let address = device_alloc(&mut state, device, bytesize, Kind::Device, 0)?;
        put(dptr, address)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", |mut state| {
        crate::graph::prohibited(&mut state)?;
        let id = state
            .device_map
            .get(&dptr)
            .copied()
            // cuda.h: cuMemFree also frees what cuMemAllocAsync allocated (without waiting for anything).
            .filter(|id| matches!(state.allocations[id].kind, Kind::Device | Kind::DeviceAsync))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let device = state.allocations[&id].device;
        crate::graph::freed(&mut state, Some(device));
        drop(free_now(state, id, "cuMemFree_v2"));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttribute", |state| {
        let (id, _) = state
            .find(ptr, 0, true)
            .or_else(|| state.find(ptr, 0, false))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let allocation = &state.allocations[&id];
        let device = allocation.kind.is_device();
        match attribute {
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                let kind = if device {
                    CUmemorytype::CU_MEMORYTYPE_DEVICE
                } else {
                    CUmemorytype::CU_MEMORYTYPE_HOST
                };
                put(data.cast::<c_uint>(), kind.0)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT => put(
                data.cast::<CUcontext>(),
                context_handle(allocation.device as usize),
            ),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => {
                put(data.cast::<CUdeviceptr>(), ptr)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER if !device => {
                put(data.cast::<*mut c_void>(), ptr as *mut c_void)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                put(data.cast::<c_int>(), allocation.device)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => {
                put(data.cast::<CUdeviceptr>(), allocation.base)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE => {
                put(data.cast::<usize>(), allocation.bytes)
            }
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER => {
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            }
            // The pool of a stream-ordered allocation, null for any other.
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => {
                let pool = if allocation.kind == Kind::DeviceAsync {
                    allocation.pool as CUmemoryPool
                } else {
                    std::ptr::null_mut()
                };
                put(data.cast::<CUmemoryPool>(), pool)
            }
            _ => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuPointerGetAttributes(
    _numAttributes: c_uint,
    _attributes: *mut CUpointer_attribute,
    _data: *mut *mut c_void,
    _ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttributes", |_| {
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}
