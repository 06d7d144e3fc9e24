//! Contexts: each device has its primary context, and contexts made with `cuCtxCreate` (other libraries'
//! contexts, as the crate meets them on a user's thread); a stack of current contexts per thread. Also the
//! peer access one context is given to another device's memory.

use std::cell::RefCell;
use std::ffi::{c_int, c_uint};

use super::device::check_device;
use super::{Outcome, entry, put};
use crate::sim::{SIM, State};
use crate::sys::*;

const CONTEXT_BASE: usize = 0xC7C0;

pub(super) fn context_handle(device: usize) -> CUcontext {
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
pub(super) fn current_if_any(state: &State) -> Outcome<Option<usize>> {
    if CURRENT.with_borrow(Vec::is_empty) {
        return Ok(None);
    }
    current(state).map(Some)
}

/// The device of `ctx`: a primary context that is retained, or a made one not yet destroyed.
pub(super) fn live_context(state: &State, ctx: CUcontext) -> Outcome<usize> {
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
