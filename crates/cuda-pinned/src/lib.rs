//! Fast, safe host<->GPU transfers over the CUDA driver API, loaded at run time.
//!
//! Copies between the host and a GPU run at full PCIe speed only from page-locked ("pinned") host memory:
//! on an H100 (PCIe gen 5 x16) a 256 MiB upload moves 55 GB/s from pinned memory and 9 GB/s from an ordinary
//! `Vec`, whose copy also blocks the calling thread. `cuda-pinned` makes the fast path the safe one.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
//!
//! fn main() {
//!     if let Err(e) = run() {
//!         eprintln!("error: {e}"); // says what failed, in CUDA's words, and what the crate was doing
//!         std::process::exit(1);
//!     }
//! }
//!
//! fn run() -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?; // device 0's primary context, shared with other CUDA libraries
//!     let (upload, compute) = (Stream::new(&context)?, Stream::new(&context)?);
//!     let mut host = Pinned::<f32>::zeroed(&context, 1 << 20)?;
//!     host.as_mut_slice()?.fill(1.0);
//!     let mut device = DeviceBuffer::<f32>::uninit(&upload, host.len())?;
//!     upload.upload(&host, &mut device)?; // returns at once
//!     // Work on another stream that reads `device` waits for the upload on the device, not on the host.
//!     compute.download(&device, &mut host)?;
//!     assert!(host.as_slice()?.iter().all(|&x| x == 1.0)); // waits for the download only
//!     Ok(())
//! }
//! ```
//!
//! # The safety model
//! Safe code that compiles cannot read memory that device work is writing, write memory that device work is
//! reading, or free memory that device work still uses, on any stream, even if it calls [`std::mem::forget`].
//! The rules that keep it so have names, the same in `ARCHITECTURE.md` (which gives each in full) and in the
//! code's comments:
//!
//! - **Only pinned memory copies async.** [`Stream::upload`] and [`Stream::download`] take [`PinnedSource`] /
//!   [`PinnedDestination`], sealed traits implemented for [`Pinned`], [`Registered`] and their views. Ordinary
//!   memory has [`Stream::upload_pageable`] and [`Stream::download_pageable`], which return only once the copy
//!   has completed.
//! - **Work is recorded.** Every buffer records the device work in flight on it: the last write and the reads
//!   since, one entry per stream.
//! - **Waits are on the device.** Before work on stream S uses a buffer, S waits *on the device*
//!   (`cuStreamWaitEvent`) for every conflicting entry of another stream: a read waits for the pending write, a
//!   write for the write and all reads. Work that stays on one stream records no event at all: stream order
//!   covers it.
//! - **The host waits to touch.** The host touches pinned memory only through accessors that wait for the
//!   conflicting work: [`Pinned::as_slice`] waits for in-flight writes, [`Pinned::as_mut_slice`] for reads and
//!   writes; the `try_` forms never block. There is no `Deref`. A borrowed slice cannot be held across a copy
//!   into the same buffer: the copy needs the buffer exclusively.
//! - **Release after completion.** Dropping a [`DeviceBuffer`] enqueues a stream-ordered free after every
//!   pending use. Dropping pinned or registered memory hands it to the crate's release thread, which unpins it
//!   once its work has completed; [`Context::synchronize`] waits for that. If a wait fails, the memory is leaked
//!   rather than freed early, and the error is kept for [`Context::check_deferred_errors`].
//! - **Forgetting is safe.** Nothing relies on a destructor running: forgetting a buffer leaks it; a forgotten
//!   [`Registered`] keeps its `Vec` too, so the program cannot reuse memory a copy may still write.
//! - **No hidden waits.** An operation waits only for work it conflicts with: never for work on an unrelated
//!   stream, never for work that has completed, never on a lock while the device runs. The event a stream
//!   waits for completes right after the work it stands for, not behind later work on the same stream;
//!   freeing a buffer used on several streams makes none of them wait; the driver calls that wait for the
//!   whole device (unpinning, the synchronous free, loading the kernels) run on threads of the crate's own.
//!   The exceptions say so: the pageable copies wait for their own stream, [`Registered::into_vec`] and
//!   [`Context::synchronize`] for the context, `into_raw` for the buffer's own work, and [`Module::load`]
//!   for whatever the driver waits for to load code.
//! - **No hangs.** Every wait ends: with the work done, with an `Err`, or at a deadline.
//! - **No lock around user code.** No lock of the crate is held while code it does not control runs (a closure
//!   it is given, a waker, a user value's `Drop`): such code may call the crate back from any thread.
//! - **Open to other GPU code.** A user's kernels ([`Module`], [`Stream::launch`]) and other libraries' work
//!   on the crate's streams ([`Stream::enqueue_foreign`]) declare what they read and write ([`Arg`], [`Use`]),
//!   and are tracked as the crate's copies are. The `unsafe` of those calls is exactly what Rust cannot
//!   check: the kernel's signature, and that the work touches only what it declared.
//! - **Any thread, any context.** Every operation works from a thread whose current context is another
//!   device's, another library's, or none, and leaves that context current: the work the crate enqueues on a
//!   stream is enqueued with the stream's context pushed (the driver takes some copies' context from the
//!   thread, not the stream). One host thread may drive every device.
//! - **Bounded in steady state.** In a loop where some device is never idle, the page-locked memory the crate
//!   holds stays within what the program holds live, plus documented rounding and the pools' budgets.
//! - **Futures are notifications.** Async code awaits the device without blocking its executor's thread (see
//!   [Async](#async)). A future owns nothing the work uses: dropping or forgetting one frees, exposes and
//!   blocks nothing, and a context with a sticky error ends every pending future of it with the error.
//! - **A graph owns what it uses.** [`Graph::capture`] records the crate's work on some streams into a CUDA
//!   graph, and every buffer that work uses lives until the graph is dropped, whoever drops it first (see
//!   [Graphs](#graphs)).
//!
//! Errors are values: every failure, from a missing driver to a length mismatch, is an [`Error`] with CUDA's
//! own words and what the crate was doing, never a panic.
//!
//! # Layers
//! - [`sys`]: the crate's own bindings to the driver API, generated by bindgen and committed, with the
//!   process-wide function tables opened at run time. Nothing links against libcuda: without a driver, calls
//!   return an [`Error`] naming every place the loader looked.
//! - [`Device`], [`Context`], [`Stream`], [`Event`], [`DeviceBuffer`], [`Pinned`], [`Registered`] and the
//!   copies: the safe layer.
//! - [`Module`], [`Kernel`], [`Stream::launch`], [`Stream::enqueue_foreign`]: users' kernels and other code's
//!   work, tracked; `into_raw` / `from_raw` hand buffers to and from other code.
//! - [`kernels`]: the small kernels of `cuda/kernels.cu` (fill, axpy, checksum, spin) with safe launchers
//!   under feature `gpu`, and the host reference of the checksum.
//! - Several devices: page-locked memory is portable (the host side of copies on every device's streams, the
//!   tracking crossing devices), [`Stream::copy`] between two devices' memory (peer access, or staged),
//!   [`Prefetcher::sharded`] feeding one consumer stream per device, and [`Placement`] of pinned memory on the
//!   NUMA node of its device.
//! - [`Gatherer`]: rows of a page-locked host table gathered into device memory by index, by a kernel of the
//!   crate that reads them in place (shipped as PTX, no feature needed) or by the copy engines; with
//!   [`RowTable`] and [`prefetch::GatherBatch`], a [`Prefetcher`] whose host side is only the indices.
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The raw layer: the `cuda-pinned-sys` crate, bindings to the CUDA driver API loaded at run time.
pub use cuda_pinned_sys as sys;

// The modules in layers, each using only those before it: `units` and `track` (leaves: sizes in messages, the
// tracking state machine); `error`; the FFI (`driver::calls`, the typed driver calls, and `kernels_ffi`);
// `driver` (Device, Context, Event, Stream, marks); `memory` (buffers, their tracking on the device, the pool,
// the release thread); `copy`; then the tools: `kernels`, `staging`, `prefetch`, `profile`. A lower layer that
// needs something of a higher one defines a hook that the higher one implements (`driver::stream::WorkObserver`
// for the ledger, `driver::context::Queue` for the streams).
mod copy;
mod driver;
pub mod error;
mod exit;
// Entry points for the fuzz targets in `fuzz/` (built with `--cfg fuzzing`) and the unit tests; in no other
// build.
mod future;
#[cfg(any(test, fuzzing))]
#[doc(hidden)]
pub mod fuzzing;
mod gather;
mod graph;
#[cfg(feature = "cudarc")]
mod interop;
pub mod kernels;
#[cfg(any(feature = "gpu", docsrs))]
mod kernels_ffi;
mod launch;
mod memory;
mod peer;
pub mod prefetch;
pub mod profile;
pub mod staging;
mod sync;
mod track;
mod units;

/// Element types of buffers: plain old data, so any bytes the device writes are a valid value (re-exported from
/// `bytemuck`, so generic code over buffers needs no dependency of its own).
pub use bytemuck::{Pod, Zeroable};
pub use copy::{DeviceDestination, DeviceSource, PinnedDestination, PinnedSource};
pub use driver::{Context, DEVICE_MEMORY_KEPT, Device, Event, Stream};
pub use error::{Error, Result};
pub use future::Done;
pub use gather::{GatherEngine, GatherOptions, Gatherer, ReadOrder, RowTable};
pub use graph::{Graph, GraphBuffer};
pub use launch::{Arg, Kernel, LaunchConfig, Module, Use};
pub use memory::{
    DeviceBuffer, DeviceView, DeviceViewMut, Pinned, PinnedBuilder, PinnedPool, PinnedView,
    PinnedViewMut, Pinning, Placement, PoolAlloc, PoolBuilder, PoolStats, Readable, Registered,
    WhenFull, Writable,
};
pub use prefetch::{Batch, Prefetched, Prefetcher};
pub use profile::{Ledger, LedgerReport};
pub use staging::StagingOptions;

/// Calls a function of the process-wide driver table, as [`sys::driver_call!`] does, with the crate's
/// [`Error`]: `driver_call!(cuMemAlloc_v2(&mut ptr, bytes))` is a [`Result<()>`]: `Err` if the driver cannot be
/// loaded, lacks the function, or returns anything but `CUDA_SUCCESS`. It expands to the raw call, so it must
/// stand in an `unsafe` block whose `SAFETY` comment covers the arguments; name the function by its exported
/// (versioned) name, as in [`sys::DriverApi`].
///
/// ```no_run
/// # fn main() -> cuda_pinned::Result<()> {
/// let mut count = 0;
/// // SAFETY: cuDeviceGetCount writes one int through a valid pointer.
/// unsafe { cuda_pinned::driver_call!(cuDeviceGetCount(&mut count)) }?;
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! driver_call {
    ($function:ident($($arg:expr),* $(,)?)) => {
        $crate::sys::driver_call!($function($($arg),*)).map_err($crate::Error::from)
    };
}

/// The examples of the crate's README, compiled by `cargo test` (as doctests) so that they cannot drift from
/// the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
