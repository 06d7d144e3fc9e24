//! Streams and events: creation, queries, synchronization, waits and records.

#![allow(unsafe_code)]

use std::ffi::c_int;

use super::ready;
use crate::driver_call;
use crate::error::Result;
use crate::sys::{CUdeviceptr, CUevent, CUstream};

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

// Events.

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
