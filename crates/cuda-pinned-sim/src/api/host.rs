//! Page-locked host memory: allocated by the simulator (`cuMemHostAlloc`) or the caller's memory registered
//! (`cuMemHostRegister_v2`), its flags and device pointer, and its release. The runtime's host-memory
//! functions (`runtime.rs`) share these.

use std::ffi::{c_uint, c_void};
use std::sync::MutexGuard;

use super::context::current;
use super::memory::free_now;
use super::{Outcome, entry, put};
use crate::sim::{Allocation, Kind, SIM, State, Storage};
use crate::sys::*;

/// The device whose context page-locked memory allocated or registered now belongs to: the calling thread's
/// current context's, or the first device's for the runtime's calls made with none (as the runtime would
/// make device 0's current).
pub(crate) fn host_device(state: &State) -> i32 {
    current(state).map_or(0, |device| device as i32)
}

pub(crate) fn host_alloc(state: &mut State, bytes: usize, flags: u32) -> Outcome<*mut c_void> {
    crate::graph::prohibited(state)?;
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if bytes > SIM.config.pinned_limit.saturating_sub(state.pinned_used) {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let storage = Storage::zeroed(bytes, 4096).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    let base = storage.as_ptr() as u64;
    let device = host_device(state);
    state.add_allocation(Allocation {
        kind: Kind::Pinned,
        base,
        bytes,
        flags,
        device,
        storage: Some(storage),
        pending: 0,
        executing: 0,
        ready: true,
        free_queued: false,
        free_stream: 0,
        pool: 0,
    });
    Ok(base as *mut c_void)
}

/// The pinned allocation starting at `p`.
fn pinned_at(state: &State, p: *mut c_void) -> Option<u64> {
    let id = *state.host_map.get(&(p as u64))?;
    (state.allocations[&id].kind == Kind::Pinned).then_some(id)
}

pub(crate) fn free_host(
    mut state: MutexGuard<'static, State>,
    p: *mut c_void,
    function: &str,
) -> Outcome {
    crate::graph::prohibited(&mut state)?;
    let id = pinned_at(&state, p).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    crate::graph::freed(&mut state, None);
    drop(free_now(state, id, function));
    Ok(())
}

pub(crate) fn register(state: &mut State, p: *mut c_void, bytes: usize, flags: u32) -> Outcome {
    crate::graph::prohibited(state)?;
    if p.is_null() || bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let (start, end) = (
        p as u64,
        (p as u64)
            .checked_add(bytes as u64)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?,
    );
    let overlaps = state
        .host_map
        .range(..end)
        .next_back()
        .is_some_and(|(&base, id)| base + state.allocations[id].bytes as u64 > start);
    if overlaps {
        return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    // Registered pages are locked like allocated ones, and count against the same limit of the system.
    if bytes > SIM.config.pinned_limit.saturating_sub(state.pinned_used) {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let device = host_device(state);
    state.add_allocation(Allocation {
        kind: Kind::Registered,
        base: start,
        bytes,
        flags,
        device,
        storage: None,
        pending: 0,
        executing: 0,
        ready: true,
        free_queued: false,
        free_stream: 0,
        pool: 0,
    });
    Ok(())
}

pub(crate) fn unregister(
    mut state: MutexGuard<'static, State>,
    p: *mut c_void,
    function: &str,
) -> Outcome {
    crate::graph::prohibited(&mut state)?;
    crate::graph::freed(&mut state, None);
    let id = state
        .host_map
        .get(&(p as u64))
        .copied()
        .filter(|id| state.allocations[id].kind == Kind::Registered)
        .ok_or(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?;
    drop(free_now(state, id, function));
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", |state| {
        free_host(state, p, "cuMemFreeHost")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint) -> CUresult {
    entry("cuMemHostAlloc", |mut state| {
        current(&state)?;
        if pp.is_null() || Flags & !0xF != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = host_alloc(&mut state, bytesize, Flags)?;
        put(pp, p)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    Flags: c_uint,
) -> CUresult {
    entry("cuMemHostGetDevicePointer_v2", |state| {
        // As the driver: it looks the memory up in the current context (CUDA_ERROR_INVALID_CONTEXT with none).
        current(&state)?;
        if Flags != 0 || state.find(p as u64, 1, false).is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Unified addressing: the device sees mapped host memory at its host address.
        put(pdptr, p as CUdeviceptr)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostGetFlags(pFlags: *mut c_uint, p: *mut c_void) -> CUresult {
    entry("cuMemHostGetFlags", |state| {
        let (id, _) = state
            .find(p as u64, 1, false)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let allocation = &state.allocations[&id];
        if allocation.kind != Kind::Pinned {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pFlags, allocation.flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, Flags: c_uint) -> CUresult {
    entry("cuMemHostRegister_v2", |mut state| {
        current(&state)?;
        register(&mut state, p, bytesize, Flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", |state| {
        unregister(state, p, "cuMemHostUnregister")
    })
}
