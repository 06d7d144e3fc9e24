//! Thin typed wrappers of the driver calls the safe layer makes: one function per call, named after it (the
//! first line of each function's docs names the exported function it calls, versioned as in
//! [`crate::sys::DriverApi`]).
//!
//! Out-pointers become return values, a query's `CUDA_ERROR_NOT_READY` becomes `Ok(false)`, and a buffer the
//! driver fills is a slice whose length goes with it. Every error is the driver's (or the loader's), unchanged:
//! the callers add what they were doing with [`Error::context`](crate::Error::context).
//!
//! Handles (devices, contexts, streams, events) are passed as the driver's values, and the safe functions here
//! need them live: the crate's types pass only handles they own, or were given by a caller who promised they
//! stay valid ([`crate::Stream::from_raw`]), and only while they hold them. The functions that end a handle's
//! life and those given memory addresses (copies, memsets, frees, registration) are `unsafe`: their `# Safety`
//! sections say what the caller guarantees.

use std::ffi::{c_char, c_int};

use crate::error::Result;
use crate::sys::CUresult;

mod contexts;
mod devices;
mod graphs;
mod memory;
mod modules;
mod streams;

pub(crate) use contexts::*;
pub(crate) use devices::*;
pub(crate) use graphs::*;
pub(crate) use memory::*;
pub(crate) use modules::*;
pub(crate) use streams::*;

/// `Ok(true)` for success, `Ok(false)` for `CUDA_ERROR_NOT_READY`, else the error: a query's answer.
fn ready(queried: Result<()>) -> Result<bool> {
    match queried {
        Ok(()) => Ok(true),
        Err(e) if e.driver_code() == Some(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The length of a buffer the driver fills, as the `int` it takes: a longer buffer is offered only in part.
fn c_len(buf: &[c_char]) -> c_int {
    c_int::try_from(buf.len()).unwrap_or(c_int::MAX)
}
