//! The driver functions, with the C ABI and the signatures of cuda.h (checked against the crate's bindings
//! in `signatures`). Each counts the call for fault injection, returns a pending violation as an error,
//! checks its arguments as the real driver does and leaves the work to `sim.rs` and `stream.rs`.
//!
//! This file holds the prologue every function shares (`entry`) and the out-pointer writer (`put`); the
//! functions themselves are grouped by family of driver calls:
//!
//! - `device.rs`: initialization, error strings, the devices and their properties;
//! - `context.rs`: primary and made contexts, the thread's current context, peer access;
//! - `memory.rs`: device memory (`cuMemAlloc`), where pointers point, the device-wide wait of a release;
//! - `pool.rs`: memory pools and stream-ordered allocation (`cuMemAllocAsync`, `cuMemFreeAsync`);
//! - `host.rs`: page-locked host memory, allocated or registered;
//! - `copy.rs`: copies and memsets, synchronous, asynchronous, between devices and batched;
//! - `streams.rs`: streams, events and host functions, and the submission of work to a stream;
//! - `modules.rs`: modules, functions and kernel launches;
//! - `signatures.rs`: the compile-time check of every signature against the crate's bindings.

#![allow(non_snake_case, reason = "the C names")]

use std::sync::MutexGuard;

use crate::sim::{SIM, State};
use crate::sys::CUresult;

mod context;
mod copy;
mod device;
mod host;
mod memory;
mod modules;
mod pool;
mod signatures;
mod streams;

pub(crate) use context::current;
pub(crate) use host::{free_host, host_alloc, register, unregister};
pub(crate) use memory::{any_loc, device_loc, host_loc};
pub(crate) use streams::live_stream;

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
