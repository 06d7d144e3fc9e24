//! A simulated CUDA driver, for testing `cuda-pinned` where there is no GPU.
//!
//! Built as a shared library that exports, with the C ABI and the signatures of `cuda.h`, the driver
//! functions the crate calls (and the runtime's host-memory functions); the crate loads it like the real
//! driver when `CUDA_PINNED_LIBCUDA` names it. Device memory is host memory the simulator tracks; each stream
//! is a thread that runs its queue in order, every operation after a random delay (seeded by
//! `CUDA_SIM_SEED`), so work the crate forgot to order runs in the wrong order and shows as wrong data.
//!
//! It checks what the real driver does not: an operation that runs after the memory it touches was freed or
//! unregistered, or before its stream-ordered allocation; memory freed while queued work still uses it;
//! memory used after its stream-ordered free was queued. Each is a *violation*: a `VIOLATION` line on
//! stderr, a `CUDA_ERROR_ILLEGAL_ADDRESS` from the next driver call, and an entry tests can read through
//! [`Control`].
//!
//! It also reports what is right but costs time (`detect.rs`), as violations that fail no call: a *hidden
//! wait*, a call that synchronizes the whole device (`cuMemFreeHost`, `cuMemHostUnregister`, `cuMemFree_v2`,
//! which wait here for every operation queued on the device, as the driver's do) made on a thread other than
//! the crate's service threads (`cuda-pinned-*`) while unrelated work is queued; and a *false dependency*, a
//! stream made to wait for work that does not touch the memory of the operation the same call then enqueues on
//! it. Both name the crate functions on the caller's stack.
//!
//! Faults on demand: `CUDA_SIM_FAIL=cuMemAlloc_v2:3:CUDA_ERROR_OUT_OF_MEMORY` fails the third call (see
//! `faults.rs`), and `CUDA_SIM_DEVICE_MEMORY` / `CUDA_SIM_PINNED_LIMIT` bound memory (see `config.rs`).
//!
//! It is a test double. It never replaces runs on a real GPU: its timing, its memory model and its errors
//! are only as faithful as this file, and kernels (which run through the CUDA runtime) are not simulated.
//! Calls on the null stream run at once in the caller's thread, after the blocking streams.
//!
//! The exported functions are not `unsafe` to call from Rust only because no Rust code calls them: their
//! module is private, and their contract is cuda.h's.

mod api;
mod attributes;
mod codes;
mod config;
mod control;
mod detect;
mod faults;
mod runtime;
mod sim;
mod stream;

pub use control::{Control, Live, library_path};

/// The types and constants of cuda.h.
use cuda_pinned_sys as sys;
