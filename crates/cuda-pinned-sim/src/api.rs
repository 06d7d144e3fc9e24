//! The driver functions, with the C ABI and the signatures of cuda.h (checked against the crate's bindings
//! in `signatures`). Each counts the call for fault injection, returns a pending violation as an error,
//! checks its arguments as the real driver does and leaves the work to `sim.rs` and `stream.rs`.

#![allow(non_snake_case, reason = "the C names")]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uchar, c_uint, c_ushort, c_void};
use std::sync::{Arc, MutexGuard};

use crate::attributes::{MAX_BLOCK, MAX_GRID, MAX_SHARED, MAX_THREADS_PER_BLOCK};
use crate::codes;
use crate::detect::{self, DeviceSync};
use crate::kernel::{self, Launch};
use crate::sim::{
    Allocation, EventData, FunctionData, HostCall, Kind, Loc, ModuleData, Op, PoolData, Primary,
    SIM, State, Storage,
};
use crate::stream;
use crate::sys::*;

type Outcome<T = ()> = Result<T, CUresult>;

/// The prologue of every driver function: count the call (it may be made to fail), refuse it before
/// `cuInit`, and report a violation found since the last call. Then `body`, with the state locked. A panic
/// in the simulator is a `CUDA_ERROR_UNKNOWN` and a log line, never an unwind into C.
pub(crate) fn entry(
    function: &'static str,
    body: impl FnOnce(MutexGuard<'static, State>) -> Outcome,
) -> CUresult {
    let run = || -> Outcome {
        let mut state = SIM.lock();
        if let Some(code) = state.faults.on_call(function) {
            return Err(code);
        }
        let before_init = matches!(
            function,
            "cuInit" | "cuDriverGetVersion" | "cuGetErrorName" | "cuGetErrorString"
        );
        if !state.initialized && !before_init && !function.starts_with("cuda") {
            return Err(CUresult::CUDA_ERROR_NOT_INITIALIZED);
        }
        if let Some(code) = state.take_unreported() {
            return Err(code);
        }
        body(state)
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(CUresult::CUDA_ERROR_NOT_READY)) => CUresult::CUDA_ERROR_NOT_READY,
        Ok(Err(code)) => {
            let name = crate::codes::describe(code).map_or_else(
                || format!("{code:?}"),
                |(name, _)| name.to_string_lossy().into(),
            );
            SIM.lock().api_errors.push(format!("{function}: {name}"));
            code
        }
        Err(_) => {
            eprintln!("cuda-pinned-sim: BUG: {function} panicked in the simulator");
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes `value` through an out-pointer, or fails as the driver does for a null one.
pub(crate) fn put<T>(out: *mut T, value: T) -> Outcome {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passed `out` as a valid place for a T, as the function's C contract demands;
    // a null pointer was refused above.
    unsafe { out.write(value) };
    Ok(())
}

fn check_device(dev: CUdevice) -> Outcome<usize> {
    (0..SIM.config.devices)
        .contains(&dev)
        .then_some(dev as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

// ---- contexts: each device has its primary context, and contexts made with `cuCtxCreate` (other libraries'
// contexts, as the crate meets them on a user's thread); a stack of current contexts per thread.

const CONTEXT_BASE: usize = 0xC7C0;

fn context_handle(device: usize) -> CUcontext {
    (CONTEXT_BASE + device * 0x10) as CUcontext
}

fn context_device(ctx: CUcontext) -> Option<usize> {
    let offset = (ctx as usize).checked_sub(CONTEXT_BASE)?;
    let device = offset / 0x10;
    (offset % 0x10 == 0 && device < SIM.config.devices as usize).then_some(device)
}

thread_local! {
    /// The thread's stack of current contexts, by handle.
    static CURRENT: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The device of the calling thread's current context, which must be alive.
pub(crate) fn current(state: &State) -> Outcome<usize> {
    let ctx = CURRENT
        .with_borrow(|stack| stack.last().copied())
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    let device = live_context(state, ctx as CUcontext)?;
    state.sticky(device as i32)?;
    Ok(device)
}

/// The device of the calling thread's current context, `None` where it has none.
fn current_if_any(state: &State) -> Outcome<Option<usize>> {
    if CURRENT.with_borrow(Vec::is_empty) {
        return Ok(None);
    }
    current(state).map(Some)
}

/// The device of `ctx`: a primary context that is retained, or a made one not yet destroyed.
fn live_context(state: &State, ctx: CUcontext) -> Outcome<usize> {
    if let Some(device) = context_device(ctx) {
        if state.primaries[device].retained == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        return Ok(device);
    }
    state
        .made_contexts
        .get(&(ctx as usize))
        .map(|&device| device as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

// ---- streams and events

/// The null stream (0) and the named legacy / per-thread default streams (1, 2).
fn is_default_stream(stream: CUstream) -> bool {
    (stream as usize) <= 2
}

/// A live stream's handle and device; its context's sticky error, if it has one.
pub(crate) fn live_stream(state: &State, stream: CUstream) -> Outcome<(usize, usize)> {
    let (handle, device) = stream_handle(state, stream)?;
    state.sticky(device as i32)?;
    Ok((handle, device))
}

/// A live stream's handle and device, whatever state its context is in (to destroy it).
fn stream_handle(state: &State, stream: CUstream) -> Outcome<(usize, usize)> {
    let handle = stream as usize;
    match state.streams.get(&handle) {
        Some(s) if !s.destroyed => Ok((handle, s.device as usize)),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// A live event's handle; its context's sticky error, if it has one.
fn live_event(state: &State, event: CUevent) -> Outcome<usize> {
    let handle = event_handle(state, event)?;
    state.sticky(state.events[&handle].device)?;
    Ok(handle)
}

/// A live event's handle, whatever state its context is in (to destroy it).
fn event_handle(state: &State, event: CUevent) -> Outcome<usize> {
    let handle = event as usize;
    match state.events.get(&handle) {
        Some(e) if !e.destroyed => Ok(handle),
        _ => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
    }
}

/// Submits `op` to `stream`: queued on a stream (waiting for it to run if `sync`), or run now on the default
/// stream, after the blocking streams of the current context, as the legacy default stream does.
fn submit(state: MutexGuard<'static, State>, stream: CUstream, op: Op, sync: bool) -> Outcome {
    if is_default_stream(stream) {
        let device = current(&state)? as i32;
        let state = SIM.wait_until(state, |s| s.idle(device, true));
        drop(stream::run_now(state, op, 0));
    } else {
        let (handle, device) = live_stream(&state, stream)?;
        if crate::graph::link(&state, handle).is_some() {
            let mut state = state;
            return crate::graph::add(&mut state, handle, op, sync);
        }
        let state = stream::submit(state, handle, op, sync);
        // A fault while it waited dropped the work.
        state.sticky(device as i32)?;
    }
    Ok(())
}

// ---- memory

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

fn is_pageable(loc: Loc) -> bool {
    matches!(loc, Loc::Pageable(_))
}

/// Queues an asynchronous copy: it runs in stream order, except that pageable host memory makes it return
/// only once done (as the driver's staged pageable copies do, at the latest). So does memory registered in
/// another device's context without `CU_MEMHOSTREGISTER_PORTABLE`: under unified addressing the driver
/// documents memory of `cuMemHostAlloc` as page-locked for every context whatever its flags, but says no
/// such thing of registered memory. Device memory of another device is refused unless the stream's context
/// was given peer access to it (`cuMemcpyPeerAsync` is the copy between devices that needs none).
fn copy_async(
    state: MutexGuard<'static, State>,
    dst: Loc,
    src: Loc,
    bytes: usize,
    stream: CUstream,
) -> Outcome {
    seen_from_current(&state, [dst, src])?;
    let device = stream_device(&state, stream)? as i32;
    let mut sync = is_pageable(dst) || is_pageable(src);
    for loc in [dst, src] {
        let Loc::Alloc { id, .. } = loc else { continue };
        let allocation = &state.allocations[&id];
        if allocation.device == device {
            continue;
        }
        if allocation.kind.is_device() {
            if !state.accessible(device, id) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
        } else if allocation.kind == Kind::Registered
            && allocation.flags & crate::sys::CU_MEMHOSTREGISTER_PORTABLE == 0
        {
            sync = true;
        }
    }
    submit(state, stream, Op::Copy { dst, src, bytes }, sync)
}

/// That the calling thread's current context lets a copy (one of `cuMemcpy*` but `cuMemcpyPeerAsync`, on any
/// stream) use the device memory of `locs`: the driver looks that memory up from the current context, not the
/// stream's, and refuses memory of a memory pool (made or default) with `CUDA_ERROR_INVALID_VALUE` while
/// another device's context is current, unless the pool is open to that device. Memory of `cuMemAlloc` and
/// host memory pass in every state, as does everything with no context current or one of the memory's device.
/// (Two H200s, driver 580: ARCHITECTURE.md, "The driver's rules about contexts".)
fn seen_from_current(state: &State, locs: [Loc; 2]) -> Outcome {
    let Some(current) = current_if_any(state)? else {
        return Ok(());
    };
    let current = current as i32;
    for loc in locs {
        let Loc::Alloc { id, .. } = loc else { continue };
        let allocation = &state.allocations[&id];
        if allocation.kind == Kind::DeviceAsync
            && allocation.device != current
            && !state.pools[&allocation.pool].access.contains(&current)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// The device of `stream`'s context: the current context's for the null stream.
fn stream_device(state: &State, stream: CUstream) -> Outcome<usize> {
    if is_default_stream(stream) {
        current(state)
    } else {
        live_stream(state, stream).map(|(_, device)| device)
    }
}

/// A synchronous copy: after the blocking streams of the current context, in the caller's thread.
fn copy_sync(state: MutexGuard<'static, State>, dst: Loc, src: Loc, bytes: usize) -> Outcome {
    current(&state)?;
    seen_from_current(&state, [dst, src])?;
    submit(
        state,
        std::ptr::null_mut(),
        Op::Copy { dst, src, bytes },
        true,
    )
}

/// Releases an allocation as the driver's `cuMemFreeHost`, `cuMemHostUnregister` and `cuMemFree_v2` do: once
/// every operation queued on the device when the call is made has finished (on every device, for host memory:
/// the simulator does not track which contexts map it). Memory that queued work uses is a violation at the
/// call, although that work then runs before the release; waiting for work that does not touch the memory, on
/// any thread, is a hidden wait (see `detect.rs`).
fn free_now<'a>(
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
fn device_wait<'a>(
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

fn device_alloc(
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

/// Copies `text` (truncated) and a NUL into `buffer` of `len` bytes.
fn put_str(buffer: *mut c_char, len: c_int, text: &str) -> Outcome {
    if buffer.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller gave `len` writable bytes at `buffer`; n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
        buffer.add(n).write(0);
    }
    Ok(())
}

// ---- the exported functions

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", |_| match codes::describe(error) {
        Some((_, description)) => put(pStr, description.as_ptr()),
        None => put(pStr, std::ptr::null()).and(Err(CUresult::CUDA_ERROR_INVALID_VALUE)),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", |_| match codes::describe(error) {
        Some((name, _)) => put(pStr, name.as_ptr()),
        None => put(pStr, std::ptr::null()).and(Err(CUresult::CUDA_ERROR_INVALID_VALUE)),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    entry("cuInit", |mut state| {
        if Flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(error) = &state.bad_fail_spec {
            eprintln!("cuda-pinned-sim: CUDA_SIM_FAIL: {error}");
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !state.initialized {
            state.primaries = (0..SIM.config.devices)
                .map(|_| Primary::default())
                .collect();
            for device in 0..SIM.config.devices {
                let pool = pool_handle(&state);
                state.pools.insert(pool, PoolData::new(device));
                state.default_pools.push(pool);
            }
            state.initialized = true;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    entry("cuDriverGetVersion", |_| put(driverVersion, 13000))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", |_| {
        put(device, check_device(ordinal)? as CUdevice)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", |_| put(count, SIM.config.devices))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", |_| {
        let device = check_device(dev)?;
        put_str(name, len, &format!("cuda-pinned simulated device {device}"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", |_| {
        let device = check_device(dev)?;
        let mut bytes = *b"cuda-pinned-sim\0";
        bytes[15] = device as u8;
        put(
            uuid,
            CUuuid {
                bytes: bytes.map(|b| b as c_char),
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", |_| {
        check_device(dev)?;
        put(bytes, SIM.config.device_memory)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", |_| {
        let device = check_device(dev)?;
        if attrib.0 == 0 || attrib.0 >= CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pi, crate::attributes::value(attrib, device))
    })
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

/// Where pool handles start: apart from the other handles, whose values seed each stream's delays, so that
/// making a pool changes no stream's delays.
const POOL_BASE: usize = 0x7000_0000;

/// A fresh pool handle (pools are never forgotten, so their count numbers them).
fn pool_handle(state: &State) -> usize {
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
pub extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", |mut state| {
        let device = check_device(dev)?;
        put(pctx, context_handle(device))?;
        state.primaries[device].retained += 1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", |mut state| {
        let device = check_device(dev)?;
        let primary = &mut state.primaries[device];
        if primary.retained == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        primary.retained -= 1;
        if primary.retained == 0 {
            // The real driver destroys the context as cuCtxDestroy does: it waits for the work queued in it,
            // then frees what it holds (memory the crate leaked on purpose goes here).
            state = SIM.wait_until(state, |s| s.idle(dev, false));
            let owned: Vec<u64> = state
                .allocations
                .iter()
                .filter(|(_, a)| {
                    a.kind.is_device() && a.device == dev && state.primaries[device].retained == 0
                })
                .map(|(&id, _)| id)
                .collect();
            for id in owned {
                state.unmap(id);
            }
            // And the modules loaded into it, and the peer access to and from it.
            state.primaries[device].peers.clear();
            for primary in &mut state.primaries {
                primary.peers.retain(|&peer| peer != dev);
            }
            state.modules.retain(|_, m| m.device != dev);
            state.functions.retain(|_, f| f.device != dev);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    entry("cuDevicePrimaryCtxSetFlags_v2", |mut state| {
        state.primaries[check_device(dev)?].flags = flags;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry("cuDevicePrimaryCtxGetState", |state| {
        let primary = &state.primaries[check_device(dev)?];
        put(flags, primary.flags)?;
        put(active, c_int::from(primary.retained > 0))
    })
}

/// Made contexts are numbered apart from the primary ones.
const MADE_CONTEXT_BASE: usize = 0xC7C0_0000;

/// `cuCtxCreate_v4`: a context of its own on `dev` (as another library may make), current on the calling
/// thread from now on. Its device's rules are its primary context's; the crate makes none itself.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    _ctxCreateParams: *mut CUctxCreateParams,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry("cuCtxCreate_v4", |mut state| {
        let device = check_device(dev)?;
        // Numbered apart from the other handles, whose values seed each stream's delays.
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let handle =
            MADE_CONTEXT_BASE + MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 0x10;
        put(pctx, handle as CUcontext)?;
        state.made_contexts.insert(handle, device as i32);
        CURRENT.with_borrow_mut(|stack| stack.push(handle));
        Ok(())
    })
}

/// `cuCtxDestroy_v2` of a context made with `cuCtxCreate_v4` (popped if current on the calling thread; another
/// thread that still has it current gets `CUDA_ERROR_INVALID_CONTEXT` from then on).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxDestroy_v2", |mut state| {
        let handle = ctx as usize;
        state
            .made_contexts
            .remove(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        CURRENT.with_borrow_mut(|stack| {
            if stack.last() == Some(&handle) {
                stack.pop();
            }
        });
        // The driver waits for the work queued in the context; the simulator counts every stream as its
        // device's, so a made context has none of its own to wait for.
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxPushCurrent_v2", |state| {
        live_context(&state, ctx)?;
        CURRENT.with_borrow_mut(|stack| stack.push(ctx as usize));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxPopCurrent_v2", |_| {
        let ctx = CURRENT
            .with_borrow_mut(Vec::pop)
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        if !pctx.is_null() {
            put(pctx, ctx as CUcontext)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry("cuCtxSetCurrent", |state| {
        if !ctx.is_null() {
            live_context(&state, ctx)?;
        }
        CURRENT.with_borrow_mut(|stack| {
            stack.pop();
            if !ctx.is_null() {
                stack.push(ctx as usize);
            }
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxGetCurrent", |_| {
        let top = CURRENT.with_borrow(|stack| stack.last().copied());
        put(pctx, top.unwrap_or(0) as CUcontext)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    entry("cuCtxGetDevice", |state| {
        put(device, current(&state)? as CUdevice)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", |mut state| {
        let device = current(&state)? as i32;
        crate::graph::refuse_context_sync(&mut state, device)?;
        let mut state = SIM.wait_until(state, |s| s.idle(device, false));
        state.sticky(device)?;
        state.release_above_thresholds(device);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetStreamPriorityRange(
    leastPriority: *mut c_int,
    greatestPriority: *mut c_int,
) -> CUresult {
    entry("cuCtxGetStreamPriorityRange", |state| {
        current(&state)?;
        if !leastPriority.is_null() {
            put(leastPriority, 0)?;
        }
        if !greatestPriority.is_null() {
            put(greatestPriority, -5)?;
        }
        Ok(())
    })
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
pub extern "C" fn cuDeviceGetPCIBusId(
    pciBusId: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetPCIBusId", |_| {
        let device = check_device(dev)?;
        put_str(pciBusId, len, &format!("0000:{:02x}:00.0", device + 1))
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

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoD_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
) -> CUresult {
    entry("cuMemcpyHtoD_v2", |mut state| {
        let dst = device_loc(&mut state, dstDevice, ByteCount, "cuMemcpyHtoD_v2")?;
        let src = host_loc(&state, srcHost, ByteCount)?;
        copy_sync(state, dst, src, ByteCount)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoH_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    entry("cuMemcpyDtoH_v2", |mut state| {
        let src = device_loc(&mut state, srcDevice, ByteCount, "cuMemcpyDtoH_v2")?;
        let dst = host_loc(&state, dstHost, ByteCount)?;
        copy_sync(state, dst, src, ByteCount)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
) -> CUresult {
    entry("cuMemcpyDtoD_v2", |mut state| {
        let dst = device_loc(&mut state, dstDevice, ByteCount, "cuMemcpyDtoD_v2")?;
        let src = device_loc(&mut state, srcDevice, ByteCount, "cuMemcpyDtoD_v2")?;
        copy_sync(state, dst, src, ByteCount)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyAsync", |mut state| {
        let to = any_loc(&mut state, dst, ByteCount, "cuMemcpyAsync")?;
        let from = any_loc(&mut state, src, ByteCount, "cuMemcpyAsync")?;
        copy_async(state, to, from, ByteCount, hStream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcHost: *const c_void,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyHtoDAsync_v2", |mut state| {
        let dst = device_loc(&mut state, dstDevice, ByteCount, "cuMemcpyHtoDAsync_v2")?;
        let src = host_loc(&state, srcHost, ByteCount)?;
        copy_async(state, dst, src, ByteCount, hStream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dstHost: *mut c_void,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoHAsync_v2", |mut state| {
        let src = device_loc(&mut state, srcDevice, ByteCount, "cuMemcpyDtoHAsync_v2")?;
        let dst = host_loc(&state, dstHost, ByteCount)?;
        copy_async(state, dst, src, ByteCount, hStream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dstDevice: CUdeviceptr,
    srcDevice: CUdeviceptr,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2", |mut state| {
        let dst = device_loc(&mut state, dstDevice, ByteCount, "cuMemcpyDtoDAsync_v2")?;
        let src = device_loc(&mut state, srcDevice, ByteCount, "cuMemcpyDtoDAsync_v2")?;
        copy_async(state, dst, src, ByteCount, hStream)
    })
}

/// `cuMemcpyPeerAsync`: a copy between device memory of two contexts, one of them the stream's, with or
/// without access from the stream's device to the other memory. Without, the driver stages it through host
/// memory, and such a copy was reported to hold back copies queued later on other streams: the simulator
/// reports it as a hidden wait (and runs it).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyPeerAsync(
    dstDevice: CUdeviceptr,
    dstContext: CUcontext,
    srcDevice: CUdeviceptr,
    srcContext: CUcontext,
    ByteCount: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyPeerAsync", |mut state| {
        let (dst_device, src_device) = (
            live_context(&state, dstContext)?,
            live_context(&state, srcContext)?,
        );
        let dst = device_loc(&mut state, dstDevice, ByteCount, "cuMemcpyPeerAsync")?;
        let src = device_loc(&mut state, srcDevice, ByteCount, "cuMemcpyPeerAsync")?;
        let device = stream_device(&state, hStream)?;
        if device != dst_device && device != src_device {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for (loc, owner) in [(dst, dst_device), (src, src_device)] {
            let Loc::Alloc { id, .. } = loc else { continue };
            let allocation = &state.allocations[&id];
            if !allocation.kind.is_device() || allocation.device != owner as i32 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            if !state.accessible(device as i32, id) {
                let message = format!(
                    "HIDDEN WAIT: cuMemcpyPeerAsync of {ByteCount} bytes between devices {src_device} and \
                     {dst_device} on a stream of device {device}, which has no access to device {owner}'s \
                     memory: the driver stages it through host memory, holding back copies of other streams"
                );
                state.violation(message);
            }
        }
        submit(
            state,
            hStream,
            Op::Copy {
                dst,
                src,
                bytes: ByteCount,
            },
            false,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceCanAccessPeer(
    canAccessPeer: *mut c_int,
    dev: CUdevice,
    peerDev: CUdevice,
) -> CUresult {
    entry("cuDeviceCanAccessPeer", |_| {
        let (device, peer) = (check_device(dev)?, check_device(peerDev)?);
        put(
            canAccessPeer,
            c_int::from(device != peer && SIM.config.peer_access),
        )
    })
}

/// `cuCtxEnablePeerAccess`: the current context may use `peerContext`'s device memory from now on.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peerContext: CUcontext, Flags: c_uint) -> CUresult {
    entry("cuCtxEnablePeerAccess", |mut state| {
        let device = current(&state)?;
        let peer = live_context(&state, peerContext)?;
        if Flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if peer == device {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        if !SIM.config.peer_access {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        }
        let peers = &mut state.primaries[device].peers;
        if peers.contains(&(peer as i32)) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        peers.push(peer as i32);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peerContext: CUcontext) -> CUresult {
    entry("cuCtxDisablePeerAccess", |mut state| {
        let device = current(&state)?;
        let peer = live_context(&state, peerContext)? as i32;
        let peers = &mut state.primaries[device].peers;
        let before = peers.len();
        peers.retain(|&p| p != peer);
        if peers.len() == before {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13.0; 12.8's `cuMemcpyBatchAsync` has another signature): `count` copies by
/// unified address, queued on the stream as `cuMemcpyAsync` would queue them. The driver runs the copies of a
/// batch in no particular order (dependent copies in one batch are undefined): the simulator queues them last
/// to first, so that a batch relying on its order goes wrong here too. Unlike a single copy, it needs a current
/// context on the calling thread (driver 580 returns `CUDA_ERROR_INVALID_VALUE` without one). Every copy is
/// checked before any is queued (the driver fails the whole call), and each attribute must ask for the source
/// to be read in stream order (`CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`): the other orders let the driver read it
/// before earlier work on the stream, which the simulator does not model, so it refuses them rather than run
/// them in stream order and hide the difference. Pageable operands and the per-thread default stream, which
/// the driver accepts, are refused too (the crate uses neither).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyBatchAsync_v2(
    dsts: *mut CUdeviceptr,
    srcs: *mut CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    attrs: *mut CUmemcpyAttributes,
    attrsIdxs: *mut usize,
    numAttrs: usize,
    hStream: CUstream,
) -> CUresult {
    entry("cuMemcpyBatchAsync_v2", |mut state| {
        current(&state).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if count == 0
            || dsts.is_null()
            || srcs.is_null()
            || sizes.is_null()
            || numAttrs == 0
            || numAttrs > count
            || attrs.is_null()
            || attrsIdxs.is_null()
            || is_default_stream(hStream)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` addresses and sizes and `numAttrs` attributes and indices.
        let (dsts, srcs, sizes, attrs, firsts) = unsafe {
            (
                std::slice::from_raw_parts(dsts, count),
                std::slice::from_raw_parts(srcs, count),
                std::slice::from_raw_parts(sizes, count),
                std::slice::from_raw_parts(attrs, numAttrs),
                std::slice::from_raw_parts(attrsIdxs, numAttrs),
            )
        };
        // The attributes apply from their index to the next one's; the first must start at copy 0.
        if firsts[0] != 0
            || firsts.windows(2).any(|w| w[0] >= w[1])
            || firsts[numAttrs - 1] >= count
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        use CUmemcpySrcAccessOrder_enum as Order;
        if attrs
            .iter()
            .any(|a| a.srcAccessOrder != Order::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let (handle, _) = live_stream(&state, hStream)?;
        let mut copies = Vec::with_capacity(count);
        for k in 0..count {
            let to = any_loc(&mut state, dsts[k], sizes[k], "cuMemcpyBatchAsync_v2")?;
            let from = any_loc(&mut state, srcs[k], sizes[k], "cuMemcpyBatchAsync_v2")?;
            if is_pageable(to) || is_pageable(from) {
                // The batch's asynchronous copies need memory the device can reach without staging.
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            copies.push(Op::Copy {
                dst: to,
                src: from,
                bytes: sizes[k],
            });
        }
        for op in copies.into_iter().rev() {
            state = stream::submit(state, handle, op, false);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy2DAsync_v2(_pCopy: *const CUDA_MEMCPY2D, _hStream: CUstream) -> CUresult {
    entry("cuMemcpy2DAsync_v2", |_| {
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy3DAsync_v2(_pCopy: *const CUDA_MEMCPY3D, _hStream: CUstream) -> CUresult {
    entry("cuMemcpy3DAsync_v2", |_| {
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}

fn memset(
    function: &'static str,
    dst: CUdeviceptr,
    value: u32,
    size: usize,
    count: usize,
    stream: CUstream,
) -> CUresult {
    entry(function, |mut state| {
        if !dst.is_multiple_of(size as u64) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = count
            .checked_mul(size)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let dst = device_loc(&mut state, dst, bytes, function)?;
        submit(
            state,
            stream,
            Op::Set {
                dst,
                value,
                size,
                count,
            },
            false,
        )
    })
}

/// `cuStreamWriteValue32_v2`: writes `value` to the 4 bytes at `addr`, in stream order, once the work before it
/// has completed: a memset of one 32-bit element. As a probe on 2 x H200 (driver 580) showed: the address may
/// be device memory or page-locked host memory (allocated or registered, mapped or not) by its address under
/// unified addressing; an address that is not 4-byte aligned or in such memory, and flags other than 0
/// (`CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` included), are `CUDA_ERROR_INVALID_VALUE` at the call, with
/// nothing queued; no context needs to be current for a stream of the crate's.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWriteValue32_v2(
    stream: CUstream,
    addr: CUdeviceptr,
    value: cuuint32_t,
    flags: c_uint,
) -> CUresult {
    if flags != 0 {
        return entry("cuStreamWriteValue32_v2", |_| {
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        });
    }
    memset("cuStreamWriteValue32_v2", addr, value, 4, 1, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(
    dstDevice: CUdeviceptr,
    uc: c_uchar,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset("cuMemsetD8Async", dstDevice, uc.into(), 1, N, hStream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16Async(
    dstDevice: CUdeviceptr,
    us: c_ushort,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset("cuMemsetD16Async", dstDevice, us.into(), 2, N, hStream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(
    dstDevice: CUdeviceptr,
    ui: c_uint,
    N: usize,
    hStream: CUstream,
) -> CUresult {
    memset("cuMemsetD32Async", dstDevice, ui, 4, N, hStream)
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

fn stream_create(
    function: &'static str,
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry(function, |mut state| {
        let device = current(&state)?;
        if ph.is_null() || flags & !CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = stream::create(&mut state, device as i32, flags, priority.clamp(-5, 0))?;
        put(ph, handle as CUstream)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCreate(phStream: *mut CUstream, Flags: c_uint) -> CUresult {
    stream_create("cuStreamCreate", phStream, Flags, 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamCreateWithPriority(
    phStream: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    stream_create("cuStreamCreateWithPriority", phStream, flags, priority)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetPriority(hStream: CUstream, priority: *mut c_int) -> CUresult {
    entry("cuStreamGetPriority", |state| {
        let (handle, _) = live_stream(&state, hStream)?;
        put(priority, state.streams[&handle].priority)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamGetFlags(hStream: CUstream, flags: *mut c_uint) -> CUresult {
    entry("cuStreamGetFlags", |state| {
        let (handle, _) = live_stream(&state, hStream)?;
        put(flags, state.streams[&handle].flags)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(hStream: CUstream, hEvent: CUevent, Flags: c_uint) -> CUresult {
    entry("cuStreamWaitEvent", |mut state| {
        if Flags & !1 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let event = live_event(&state, hEvent)?;
        let generation = state.events[&event].recorded;
        // The event may be of another context or device (the driver allows it): no check of that here.
        if !is_default_stream(hStream) {
            let (handle, _) = live_stream(&state, hStream)?;
            if crate::graph::wait(&mut state, handle, event)? {
                return Ok(());
            }
            if let Some(dependency) = detect::awaited(&state, handle, event, generation) {
                let stream = state.streams.get_mut(&handle).expect("checked live");
                stream.depends.push(dependency);
            }
        }
        submit(state, hStream, Op::Wait { event, generation }, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(hStream: CUstream) -> CUresult {
    entry("cuStreamQuery", |mut state| {
        let idle = if is_default_stream(hStream) {
            state.idle(current(&state)? as i32, true)
        } else {
            let (handle, _) = live_stream(&state, hStream)?;
            crate::graph::refuse_sync_of(&mut state, handle)?;
            crate::graph::prohibited(&mut state)?;
            state.streams[&handle].queue.is_empty()
        };
        if idle {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(hStream: CUstream) -> CUresult {
    entry("cuStreamSynchronize", |mut state| {
        if !is_default_stream(hStream) {
            let (handle, _) = live_stream(&state, hStream)?;
            crate::graph::refuse_sync_of(&mut state, handle)?;
        }
        crate::graph::prohibited(&mut state)?;
        let (mut state, device) = if is_default_stream(hStream) {
            let device = current(&state)? as i32;
            (SIM.wait_until(state, |s| s.idle(device, true)), device)
        } else {
            let (handle, device) = live_stream(&state, hStream)?;
            let state = SIM.wait_until(state, |s| {
                s.streams.get(&handle).is_none_or(|s| s.queue.is_empty())
            });
            (state, device as i32)
        };
        state.sticky(device)?;
        state.release_above_thresholds(device);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(hStream: CUstream) -> CUresult {
    entry("cuStreamDestroy_v2", |mut state| {
        let (handle, _) = stream_handle(&state, hStream)?;
        state
            .streams
            .get_mut(&handle)
            .expect("checked live")
            .destroyed = true;
        SIM.changed.notify_all();
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventCreate(phEvent: *mut CUevent, Flags: c_uint) -> CUresult {
    entry("cuEventCreate", |mut state| {
        let device = current(&state)? as i32;
        let disable_timing = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        let interprocess = CUevent_flags::CU_EVENT_INTERPROCESS.0;
        if phEvent.is_null()
            || Flags & !0x7 != 0
            || (Flags & interprocess != 0 && Flags & disable_timing == 0)
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = state.handle();
        let data = EventData {
            device,
            timing: Flags & disable_timing == 0,
            recorded: 0,
            pending: Default::default(),
            time: None,
            destroyed: false,
            refs: 0,
            captured: None,
        };
        state.events.insert(handle, data);
        put(phEvent, handle as CUevent)
    })
}

fn record(function: &'static str, hEvent: CUevent, hStream: CUstream, flags: c_uint) -> CUresult {
    entry(function, |mut state| {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let event = live_event(&state, hEvent)?;
        let device = if is_default_stream(hStream) {
            current(&state)?
        } else {
            live_stream(&state, hStream)?.1
        };
        // As the driver: the event and the stream must be of one context.
        if state.events[&event].device != device as i32 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        if !is_default_stream(hStream) && crate::graph::link(&state, hStream as usize).is_some() {
            return crate::graph::record(&mut state, event, hStream as usize);
        }
        let e = state.events.get_mut(&event).expect("checked live");
        e.captured = None;
        e.recorded += 1;
        let generation = e.recorded;
        e.pending.insert(generation);
        submit(state, hStream, Op::Record { event, generation }, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(hEvent: CUevent, hStream: CUstream) -> CUresult {
    record("cuEventRecord", hEvent, hStream, 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(
    hEvent: CUevent,
    hStream: CUstream,
    flags: c_uint,
) -> CUresult {
    record("cuEventRecordWithFlags", hEvent, hStream, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(hEvent: CUevent) -> CUresult {
    entry("cuEventQuery", |mut state| {
        let event = live_event(&state, hEvent)?;
        crate::graph::refuse_captured_event(&mut state, event)?;
        crate::graph::prohibited(&mut state)?;
        let e = &state.events[&event];
        if !e.pending.contains(&e.recorded) {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(hEvent: CUevent) -> CUresult {
    entry("cuEventSynchronize", |mut state| {
        let event = live_event(&state, hEvent)?;
        crate::graph::refuse_captured_event(&mut state, event)?;
        crate::graph::prohibited(&mut state)?;
        let (target, device) = (state.events[&event].recorded, state.events[&event].device);
        let mut state = SIM.wait_until(state, |s| {
            s.faulted.contains_key(&device)
                || s.events
                    .get(&event)
                    .is_none_or(|e| !e.pending.contains(&target))
        });
        state.sticky(device)?;
        state.release_above_thresholds(device);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(hEvent: CUevent) -> CUresult {
    entry("cuEventDestroy_v2", |mut state| {
        let event = event_handle(&state, hEvent)?;
        let e = state.events.get_mut(&event).expect("checked live");
        e.destroyed = true;
        if e.refs == 0 {
            state.events.remove(&event);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventElapsedTime_v2(
    pMilliseconds: *mut f32,
    hStart: CUevent,
    hEnd: CUevent,
) -> CUresult {
    entry("cuEventElapsedTime_v2", |state| {
        let (start, end) = (
            &state.events[&live_event(&state, hStart)?],
            &state.events[&live_event(&state, hEnd)?],
        );
        if !start.timing || !end.timing || start.recorded == 0 || end.recorded == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let (Some(t0), Some(t1)) = (start.time, end.time) else {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        };
        if start.pending.contains(&start.recorded) || end.pending.contains(&end.recorded) {
            return Err(CUresult::CUDA_ERROR_NOT_READY);
        }
        let ms = if t1 >= t0 {
            (t1 - t0).as_secs_f64() * 1e3
        } else {
            -((t0 - t1).as_secs_f64() * 1e3)
        };
        put(pMilliseconds, ms as f32)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc(
    hStream: CUstream,
    fn_: CUhostFn,
    userData: *mut c_void,
) -> CUresult {
    entry("cuLaunchHostFunc", |state| {
        let f = fn_.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        submit(
            state,
            hStream,
            Op::Host(HostCall {
                f,
                data: userData as usize,
            }),
            false,
        )
    })
}

// ---- modules and kernels: any image loads, and its kernels are the stand-ins registered by name (see
// `kernel.rs`).

/// Loads a module. Loading waits for all work on the device, whoever queued it, and loads every function of the
/// module (probed on an H100, driver 580: PTX, a cubin and a fatbin alike, with `CUDA_MODULE_LOADING` unset,
/// `LAZY` or `EAGER`; each function was loaded before its first launch, which then waited for nothing).
fn module_load(
    state: MutexGuard<'static, State>,
    module: *mut CUmodule,
    image: *const c_void,
    function: &str,
) -> Outcome {
    let device = current(&state)?;
    if module.is_null() || image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut state = device_wait(state, Some(device as i32), |_| false, function);
    let handle = state.handle();
    state.modules.insert(
        handle,
        ModuleData {
            device: device as i32,
            functions: HashMap::new(),
        },
    );
    put(module, handle as CUmodule)
}

/// A live function's handle.
fn live_function(state: &State, f: CUfunction) -> Outcome<usize> {
    let handle = f as usize;
    if state.functions.contains_key(&handle) {
        Ok(handle)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
}

impl Launch {
    /// A launch of `f` with the parameters `kernelParams` points to, copied now, as `cuLaunchKernel` and a
    /// kernel node's parameters take them: `CUDA_ERROR_INVALID_VALUE` for a null function or parameter, or
    /// dimensions out of range; `extra` is not modelled.
    pub(crate) fn build(
        state: &State,
        f: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared: c_uint,
        kernelParams: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Outcome<Launch> {
        if f.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let function = live_function(state, f)?;
        let threads: u64 = block.iter().map(|&d| u64::from(d)).product();
        let fits =
            |dims: [u32; 3], most: [u32; 3]| (0..3).all(|i| (1..=most[i]).contains(&dims[i]));
        if !fits(grid, MAX_GRID)
            || !fits(block, MAX_BLOCK)
            || threads > u64::from(MAX_THREADS_PER_BLOCK)
            || shared > MAX_SHARED
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !extra.is_null() {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let FunctionData {
            module,
            device,
            ref kernel,
        } = state.functions[&function];
        let kernel = Arc::clone(kernel);
        let count = kernel.sizes.len();
        if count > 0 && kernelParams.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut params = vec![0u8; kernel.params_len()];
        for (index, (&offset, &size)) in kernel.offsets.iter().zip(&kernel.sizes).enumerate() {
            // SAFETY: cuda.h's contract: `kernelParams` holds one pointer per parameter of the kernel (checked
            // non-null above where there are any).
            let param = unsafe { kernelParams.add(index).read() };
            if param.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: cuda.h's contract: each pointer is to a value of its parameter's size, readable during
            // the call; `params` has room for every parameter at its offset.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    param.cast::<u8>(),
                    params.as_mut_ptr().add(offset),
                    size,
                );
            }
        }
        let allocations = Launch::pointed_to(state, &kernel, &params);
        Ok(Launch {
            kernel,
            function,
            module,
            device,
            grid,
            block,
            shared,
            params,
            allocations,
        })
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", |state| {
        module_load(state, module, image, "cuModuleLoadData")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
) -> CUresult {
    entry("cuModuleLoadDataEx", |state| {
        module_load(state, module, image, "cuModuleLoadDataEx")
    })
}

/// Unloads a module: its functions are invalid from now. It waits for the whole device as the calls that
/// release memory do (`free_now`); waiting for work other than the module's own launches is a hidden wait.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    entry("cuModuleUnload", |mut state| {
        let handle = hmod as usize;
        let module = state
            .modules
            .remove(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        state.functions.retain(|_, f| f.module != handle);
        let own_launch = |op: &Op| matches!(op, Op::Kernel(launch) if launch.module == handle);
        drop(device_wait(
            state,
            Some(module.device),
            own_launch,
            "cuModuleUnload",
        ));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", |mut state| {
        let handle = hmod as usize;
        let module = state
            .modules
            .get(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if hfunc.is_null() || name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated name, checked non-null.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        if let Some(&function) = module.functions.get(name) {
            return put(hfunc, function as CUfunction);
        }
        let kernel = kernel::stand_in(name).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        let device = module.device;
        let function = state.handle();
        state.functions.insert(
            function,
            FunctionData {
                module: handle,
                device,
                kernel,
            },
        );
        state
            .modules
            .get_mut(&handle)
            .expect("checked live")
            .functions
            .insert(name.to_vec(), function);
        put(hfunc, function as CUfunction)
    })
}

/// Loads a function's code: already loaded with its module (see `module_load`), so nothing to do.
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(function: CUfunction) -> CUresult {
    entry("cuFuncLoad", |state| {
        live_function(&state, function).map(drop)
    })
}

/// Every function is loaded with its module (see `module_load`).
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncIsLoaded(
    state_out: *mut CUfunctionLoadingState,
    function: CUfunction,
) -> CUresult {
    entry("cuFuncIsLoaded", |state| {
        live_function(&state, function)?;
        put(
            state_out,
            CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetParamInfo(
    func: CUfunction,
    paramIndex: usize,
    paramOffset: *mut usize,
    paramSize: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", |state| {
        let kernel = &state.functions[&live_function(&state, func)?].kernel;
        if paramIndex >= kernel.sizes.len() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(paramOffset, kernel.offsets[paramIndex])?;
        if !paramSize.is_null() {
            put(paramSize, kernel.sizes[paramIndex])?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    hfunc: CUfunction,
) -> CUresult {
    entry("cuFuncGetAttribute", |state| {
        use CUfunction_attribute as F;
        live_function(&state, hfunc)?;
        let value = match attrib {
            F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => MAX_THREADS_PER_BLOCK as c_int,
            F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => MAX_SHARED as c_int,
            F::CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
            F::CU_FUNC_ATTRIBUTE_PTX_VERSION | F::CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
            // No preference: the driver's default carveout.
            F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            a if a.0 >= F::CU_FUNC_ATTRIBUTE_MAX.0 => {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // Static shared, constant and local memory, cluster requirements: none.
            _ => 0,
        };
        put(pi, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetName(name: *mut *const c_char, hfunc: CUfunction) -> CUresult {
    entry("cuFuncGetName", |state| {
        let function = live_function(&state, hfunc)?;
        // The name lives as long as the stand-in, which the function holds.
        put(name, state.functions[&function].kernel.name.as_ptr())
    })
}

/// Queues a launch of `f`: its stand-in runs when the stream reaches it, with a copy of the parameters taken
/// now.
#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", |mut state| {
        let launch = Launch::build(
            &state,
            f,
            [gridDimX, gridDimY, gridDimZ],
            [blockDimX, blockDimY, blockDimZ],
            sharedMemBytes,
            kernelParams,
            extra,
        )?;
        let stream_device = if is_default_stream(hStream) {
            current(&state)?
        } else {
            live_stream(&state, hStream)?.1
        };
        // The function and the stream must be of one context.
        if stream_device != launch.device as usize {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        for &id in &launch.allocations {
            let allocation = &state.allocations[&id];
            if allocation.free_queued {
                let message = format!(
                    "kernel `{}` launched with device memory {:#x} after a stream-ordered free of it was queued",
                    launch.kernel.name(),
                    allocation.base
                );
                state.violation(message);
            }
        }
        submit(state, hStream, Op::Kernel(Arc::new(launch)), false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetProcAddress_v2(
    _symbol: *const c_char,
    _pfn: *mut *mut c_void,
    _cudaVersion: c_int,
    _flags: cuuint64_t,
    _symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    entry("cuGetProcAddress_v2", |_| {
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}

/// Each exported function has exactly the type of its field in the crate's generated `DriverApi`: this
/// does not compile otherwise.
#[allow(dead_code, reason = "a compile-time check")]
fn signatures(api: &DriverApi) {
    fn same<T>(_: &Result<T, libloading::Error>, _: T) {}
    macro_rules! check {
        ($($f:ident),* $(,)?) => { $(same(&api.$f, $f);)* };
    }
    check!(
        cuGetErrorString,
        cuGetErrorName,
        cuInit,
        cuDriverGetVersion,
        cuDeviceGet,
        cuDeviceGetCount,
        cuDeviceGetName,
        cuDeviceGetUuid_v2,
        cuDeviceTotalMem_v2,
        cuDeviceGetAttribute,
        cuDeviceGetMemPool,
        cuDeviceGetDefaultMemPool,
        cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxSetFlags_v2,
        cuDevicePrimaryCtxGetState,
        cuCtxCreate_v4,
        cuCtxDestroy_v2,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuCtxSetCurrent,
        cuCtxGetCurrent,
        cuCtxGetDevice,
        cuCtxSynchronize,
        cuCtxGetStreamPriorityRange,
        cuMemGetInfo_v2,
        cuMemAlloc_v2,
        cuMemFree_v2,
        cuMemFreeHost,
        cuMemHostAlloc,
        cuMemHostGetDevicePointer_v2,
        cuMemHostGetFlags,
        cuDeviceGetPCIBusId,
        cuMemHostRegister_v2,
        cuMemHostUnregister,
        cuMemcpyHtoD_v2,
        cuMemcpyDtoH_v2,
        cuMemcpyDtoD_v2,
        cuMemcpyAsync,
        cuMemcpyHtoDAsync_v2,
        cuMemcpyDtoHAsync_v2,
        cuMemcpyDtoDAsync_v2,
        cuMemcpyPeerAsync,
        cuDeviceCanAccessPeer,
        cuCtxEnablePeerAccess,
        cuCtxDisablePeerAccess,
        cuMemcpyBatchAsync_v2,
        cuMemcpy2DAsync_v2,
        cuMemcpy3DAsync_v2,
        cuMemsetD8Async,
        cuMemsetD16Async,
        cuMemsetD32Async,
        cuStreamWriteValue32_v2,
        cuMemFreeAsync,
        cuMemAllocAsync,
        cuMemAllocFromPoolAsync,
        cuMemPoolCreate,
        cuMemPoolDestroy,
        cuMemPoolTrimTo,
        cuMemPoolSetAttribute,
        cuMemPoolGetAttribute,
        cuMemPoolSetAccess,
        cuMemPoolGetAccess,
        cuPointerGetAttribute,
        cuPointerGetAttributes,
        cuStreamCreate,
        cuStreamCreateWithPriority,
        cuStreamGetPriority,
        cuStreamGetFlags,
        cuStreamWaitEvent,
        cuStreamQuery,
        cuStreamSynchronize,
        cuStreamDestroy_v2,
        cuEventCreate,
        cuEventRecord,
        cuEventRecordWithFlags,
        cuEventQuery,
        cuEventSynchronize,
        cuEventDestroy_v2,
        cuEventElapsedTime_v2,
        cuLaunchHostFunc,
        cuModuleLoadData,
        cuModuleLoadDataEx,
        cuModuleUnload,
        cuModuleGetFunction,
        cuFuncLoad,
        cuFuncIsLoaded,
        cuFuncGetParamInfo,
        cuFuncGetAttribute,
        cuFuncGetName,
        cuLaunchKernel,
        cuGetProcAddress_v2,
    );
    use crate::graph::*;
    check!(
        cuStreamBeginCapture_v2,
        cuStreamEndCapture,
        cuStreamIsCapturing,
        cuStreamGetCaptureInfo_v3,
        cuStreamUpdateCaptureDependencies_v2,
        cuGraphInstantiateWithFlags,
        cuGraphUpload,
        cuGraphLaunch,
        cuGraphExecDestroy,
        cuGraphDestroy,
    );
    use crate::nodes::*;
    check!(
        cuGraphGetNodes,
        cuGraphNodeGetType,
        cuGraphKernelNodeGetParams_v2,
        cuGraphKernelNodeSetParams_v2,
        cuGraphExecKernelNodeSetParams_v2,
        cuGraphMemcpyNodeGetParams,
        cuGraphMemcpyNodeSetParams,
        cuGraphExecMemcpyNodeSetParams,
        cuGraphMemsetNodeGetParams,
        cuGraphMemsetNodeSetParams,
        cuGraphExecMemsetNodeSetParams,
    );
}
