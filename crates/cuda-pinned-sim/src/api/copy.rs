//! Copies and memsets: synchronous and asynchronous copies by direction or by unified address, copies between
//! devices, batched copies, memsets and `cuStreamWriteValue32_v2`, with the rules about which memory a copy
//! may use from the current context and the stream's.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};
use std::sync::MutexGuard;

use super::context::{current, current_if_any, live_context};
use super::memory::{any_loc, device_loc, host_loc};
use super::streams::{is_default_stream, live_stream, submit};
use super::{Outcome, entry};
use crate::sim::{Kind, Loc, Op, State};
use crate::stream;
use crate::sys::*;

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
