//! Streams and events: their handles, creation, queries, synchronization and destruction, event records and
//! waits, host functions, and `submit`, which hands an operation to a stream (`stream.rs` runs it) or to a
//! capture (`graph.rs`).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::MutexGuard;

use super::context::current;
use super::{Outcome, entry, put};
use crate::detect;
use crate::sim::{EventData, HostCall, Op, SIM, State};
use crate::stream;
use crate::sys::*;

/// The null stream (0) and the named legacy / per-thread default streams (1, 2).
pub(super) fn is_default_stream(stream: CUstream) -> bool {
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
pub(super) fn submit(
    state: MutexGuard<'static, State>,
    stream: CUstream,
    op: Op,
    sync: bool,
) -> Outcome {
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
