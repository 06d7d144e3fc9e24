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
//! # Async
//! Async programs (a server on tokio, a pipeline on any executor) must not block an executor thread waiting for
//! the GPU. [`Stream::done`] and [`Event::done`] are futures that complete once the work before them has, and
//! [`Pinned::readable`] / [`Pinned::writable`] (and [`Registered::readable`] / [`Registered::writable`]) are the
//! awaited forms of `as_slice` / `as_mut_slice`. The other operations that wait have awaited forms too:
//! [`Context::done`] (the crate's streams of the context, where [`Context::synchronize`] waits for the whole
//! context), [`PinnedPool::alloc_async`], [`Prefetcher::next_async`], and staged transfers of ordinary memory
//! ([`Stream::upload_staged_async`] / [`Stream::download_staged_async`]). No runtime is needed: they work on any
//! executor.
//!
//! One thread of the crate's serves every pending future: a stream writes a flag in page-locked memory when its
//! work is done (`cuStreamWriteValue32`), and the thread reads the flags, so a hundred thousand pending futures
//! cost it a pass over memory. [`Done::spin_for`] answers faster, for a task that may keep its thread. Futures are
//! only notifications ("Futures are notifications", above): dropping or forgetting one frees, exposes and blocks
//! nothing, and a context that fails (a kernel that traps) ends every pending future of it with the error.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
//!
//! async fn round_trip(context: &Context, stream: &Stream, data: &[f32]) -> cuda_pinned::Result<f32> {
//!     let host = Pinned::from_slice(context, data)?;
//!     let mut device = DeviceBuffer::<f32>::uninit(stream, data.len())?;
//!     let mut back = Pinned::<f32>::zeroed(context, data.len())?;
//!     stream.upload(&host, &mut device)?;
//!     stream.download(&device, &mut back)?;
//!     let values = back.readable().await?; // the task sleeps; no thread waits
//!     Ok(values.iter().sum())
//! }
//! ```
//!
//! # Graphs
//! A step of hundreds of small launches costs microseconds of host time per launch; captured once into a CUDA
//! graph and replayed, it costs one launch. [`Graph::capture`] records what the crate's work on the given streams
//! would do (copies, its kernels, your kernels, other libraries' declared work), and the crossings between the
//! streams become edges of the graph. [`Graph::launch`] replays it, tracked as one piece of work that reads and
//! writes every buffer the graph uses, which other streams and the host wait for like any other; its host cost
//! does not grow with those buffers (-0.03 to +1.98 us over the raw `cuGraphLaunch` with 64 buffers, in a loop
//! and after a synchronization, on an H100 and on H200s: `docs/performance.md` in the repository).
//!
//! The graph owns what it uses ("A graph owns what it uses", above): a buffer dropped after the capture lives
//! until the graph is dropped, and a host buffer the graph uses is lent to the host by the graph between launches
//! ([`Graph::host_slice`], [`Graph::host_slice_mut`]), borrowed from the graph as a launch is, so that no slice is
//! held while a launch runs. What a capture cannot hold (a synchronization, a pageable copy, an allocation) is
//! refused with an `Err`, and the capture goes on. [`Graph::replace`] moves the launches from one buffer to
//! another of the same length (double buffering) through the graph's nodes, leaving the launches already queued
//! on the old one; where it cannot move every use of the buffer it sees, it changes nothing and returns an `Err`
//! saying why.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, Graph, Pinned, Stream};
//!
//! fn main() -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?;
//!     let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
//!     let mut input = Pinned::<f32>::zeroed(&context, 1 << 20)?;
//!     let mut device = DeviceBuffer::<f32>::uninit(&a, input.len())?;
//!     let mut output = Pinned::<f32>::zeroed(&context, input.len())?;
//!     // Recorded, not run: b's download follows a's upload by an edge of the graph.
//!     let mut step = Graph::capture(&[&a, &b], || {
//!         a.upload(&input, &mut device)?;
//!         b.download(&device, &mut output)
//!     })?;
//!     for i in 0..100 {
//!         step.host_slice_mut(&mut input)?.fill(i as f32); // lent by the graph, between launches
//!         step.launch(&a)?; // one tracked piece of work
//!         assert!(step.host_slice(&output)?.iter().all(|&x| x == i as f32));
//!     }
//!     Ok(())
//! }
//! ```
//!
//! # Gathering rows
//! A batch sampled from a large table (embeddings, dataset records) need not be gathered by the CPU and
//! uploaded: page-lock the table once, in place ([`Registered`]), and the crate's gather kernel ([`Gatherer`])
//! reads the rows by index straight over the bus into device memory. The host only hands over the indices; host
//! writes to the table wait for the gathers that read it, and it is unpinned only after them. The kernel ships as
//! PTX inside the crate (no CUDA compiler needed to build, no feature), which the driver compiles when a
//! [`Gatherer`] is made (driver 580 or later). With [`RowTable`] and [`prefetch::GatherBatch`], a [`Prefetcher`]'s
//! host side is only the indices.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, GatherOptions, Gatherer, Registered, Stream};
//!
//! fn feed(table: Vec<f32>, batch: &[u32]) -> cuda_pinned::Result<()> {
//!     const ROW: usize = 256; // elements per row
//!     let context = Context::on(0)?;
//!     let stream = Stream::new(&context)?;
//!     let gatherer = Gatherer::new(&context)?; // loads the kernels: make it before the work starts
//!     let table = Registered::new(&context, table)?; // page-locked and mapped in place, no copy
//!     let mut rows = DeviceBuffer::<f32>::uninit(&stream, batch.len() * ROW)?;
//!     gatherer.gather(&stream, &table, ROW, batch, &mut rows, GatherOptions::default())?;
//!     Ok(())
//! }
//! ```
//!
//! Rows under 2 KiB are read sorted by where they lie in the table (the indices sorted on the device, each row
//! still written where the batch puts it), and rows of 256 KiB and more are moved by the copy engines instead
//! (one `cuMemcpyBatchAsync` for the batch); [`GatherOptions`] chooses otherwise. Measured on an H100 (PCIe gen 5,
//! `pinbench gather`, 64 MiB batches from a 4 GiB page-aligned table): 64-byte rows at 32 GB/s, 256 B at 45,
//! 1 KiB and larger at 50-51 GB/s (0.94x a contiguous pinned upload; the device's own reads over the bus top out
//! there). A table that starts 128-byte aligned is read fastest: a large `Vec` starts 16 bytes past a page, and
//! gathers from one registered in place were up to 39% slower (64-byte rows, 19.7 GB/s against 32); copy a table
//! read often into mapped [`Pinned`] memory once. A training loop fed this way by one host thread outran a
//! CPU-gathering prefetcher on 16 (1.42x at 1 KiB samples). Figures: `docs/performance.md` in the repository.
//!
//! # Your kernels and other libraries' work
//! The tracking is open to other GPU code ("Open to other GPU code", above). Load your own kernels (PTX with
//! [`Module::load`], a cubin or fatbin with [`Module::load_binary`], e.g. what your build script compiled with
//! nvcc) and launch them with [`Stream::launch`], with arguments ([`Arg`]) that say how each buffer is used; work
//! another library enqueues on one of the crate's streams through its raw handle declares what it reads and
//! writes ([`Stream::enqueue_foreign`], [`Use`]). Both then take part in the tracking exactly as copies do: other
//! streams wait for them on the device, host accessors wait for them, and a buffer dropped meanwhile is freed
//! only after them.
//!
//! ```no_run
//! use cuda_pinned::{Arg, Context, DeviceBuffer, LaunchConfig, Module, Stream, Use};
//!
//! fn run(ptx: &[u8]) -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?;
//!     let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
//!     let scale = Module::load(&context, ptx)?.kernel("scale")?; // extern "C" scale(const float*, float*, float, unsigned)
//!     let x = DeviceBuffer::<f32>::zeroed(&a, 1024)?;
//!     let mut y = DeviceBuffer::<f32>::uninit(&b, 1024)?;
//!     let config = LaunchConfig::for_elements(1024, 256)?;
//!     // SAFETY: the kernel's parameters are these types; it reads x[..1024] and writes y[..1024].
//!     unsafe {
//!         b.launch(&scale, config, &[Arg::read(&x), Arg::write(&mut y), Arg::value(&2.0f32), Arg::value(&1024u32)])?;
//!     }
//!     let y_ptr = y.as_raw();
//!     // SAFETY: the closure enqueues, on the stream it is given, work that writes y alone.
//!     unsafe {
//!         a.enqueue_foreign(&[Use::write(&mut y)], |stream| {
//!             cuda_pinned::driver_call!(cuMemsetD32Async(y_ptr, 0, 1024, stream)) // another library's call
//!         })??;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Argument count and sizes (where the driver tells them), grid and block limits and buffers of another context
//! are `Err`s before anything is enqueued; the `unsafe` is what Rust cannot check. With feature `cudarc`, a cudarc
//! stream is one of the crate's (`Stream::from_cudarc`) and cudarc slices move into and out of the tracking
//! (`DeviceBuffer::from_cudarc`, `DeviceBuffer::into_cudarc`). cudarc needs its CUDA version chosen: a crate that
//! uses cudarc has one of its `cuda-XXXXX` features on already; otherwise add one (`cudarc = { version = "0.19",
//! features = ["cuda-13000"] }`) or set `CUDARC_CUDA_VERSION=13000` for the build. In tests without a GPU,
//! register a Rust stand-in for each of your kernels with the simulator (`cuda_pinned_sim::Control::register_kernel`);
//! it runs in stream order on the simulated memory.
//!
//! To compile your kernels, call nvcc from your build script with `--ptx`: PTX for one compute capability (8.0
//! here) runs on every GPU from it on, compiled by the driver when the module loads, and the crate reads each
//! kernel's parameters from it. The `cc` crate's CUDA support (`Build::cuda(true)`) compiles objects to link
//! against the CUDA runtime; its flags do not make PTX. A build script runs, with the toolkit of `CUDA_PATH`:
//!
//! ```sh
//! nvcc --ptx -O3 -arch=compute_80 -o "$OUT_DIR/pipeline.ptx" cuda/pipeline.cu
//! ```
//!
//! and the library embeds the result with `include_bytes!(concat!(env!("OUT_DIR"), "/pipeline.ptx"))` and
//! loads it with [`Module::load`]. The crate's README shows the whole build script, the one the repository's
//! `examples/downstream` compiles its kernels with.
//!
//! # Loading files
//! A checkpoint or a dataset on disk reaches device memory through [`load`]: reader threads read the file
//! (direct I/O where the page cache does not hold it, several reads in flight) into a few page-locked slots of a
//! [`PinnedPool`] while the slots read before are uploaded on a stream; the pool's budget bounds the page-locked
//! memory whatever the file's size. [`Stream::load_file`] loads a byte range; with feature `safetensors`,
//! `load::SafeTensorsFile` checks a safetensors header against the file and loads all or some of its tensors
//! into one device buffer, and `load::Checkpoint` loads the files of a sharded checkpoint at once, also as a
//! future. Bad input is an [`Error::File`] naming the file and the byte.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, PinnedPool, Stream};
//!
//! fn weights(path: &str) -> cuda_pinned::Result<DeviceBuffer<u8>> {
//!     let context = Context::on(0)?;
//!     let stream = Stream::new(&context)?;
//!     let pool = PinnedPool::new(&context, 256 << 20);
//!     let len = std::fs::metadata(path).map_err(cuda_pinned::Error::invalid)?.len() as usize;
//!     let mut weights = DeviceBuffer::<u8>::uninit(&stream, len)?;
//!     let report = stream.load_file(&pool, path, 0, &mut weights)?; // returns once read; uploads queued
//!     println!("{} bytes, direct I/O: {}", report.bytes, report.direct);
//!     Ok(weights)
//! }
//! ```
//!
//! # Several GPUs
//! The crate is written for any number of devices; its tests of two run on the simulated driver in every
//! `cargo test` of the repository, and on two GPUs with `--features gpu` where a machine has them. Page-locked
//! memory is portable (every context takes it as the host side of its copies), so one [`Pinned`] buffer or one
//! [`PinnedPool`] serves every device's streams, and the tracking crosses devices: a buffer written by device 0's
//! stream and read by device 1's makes device 1 wait on the device, and host access waits for both.
//! [`Stream::copy`] copies between two devices' memory (directly over NVLink or PCIe where the devices reach each
//! other, peer access enabled once per pair; else through page-locked staging buffers, a download on one device
//! and an upload on the other). [`Prefetcher::sharded`] feeds one consumer stream per device from one pool, the
//! batches shared out in turn or by a function of their index. On hosts of several NUMA nodes, pinned memory is
//! placed on the node of the device it is for ([`Placement`], on [`PinnedBuilder`] and [`PoolBuilder`]). One host
//! thread may drive every device, whatever context it has current (another device's, another library's, or
//! none): the work it enqueues on a stream is enqueued with the stream's context pushed, and the thread's is
//! current again after ("Any thread, any context", above). `pinbench devices` measures each device, all at once,
//! one shared buffer to all, and the copy matrix.
//!
//! ```no_run
//! use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
//!
//! fn spread(values: &[f32]) -> cuda_pinned::Result<()> {
//!     let (ctx0, ctx1) = (Context::on(0)?, Context::on(1)?);
//!     let (s0, s1) = (Stream::new(&ctx0)?, Stream::new(&ctx1)?);
//!     let host = Pinned::from_slice(&ctx0, values)?; // portable: the host side for both devices
//!     let mut on0 = DeviceBuffer::<f32>::uninit(&s0, values.len())?;
//!     let mut on1 = DeviceBuffer::<f32>::uninit(&s1, values.len())?;
//!     s0.upload(&host, &mut on0)?;
//!     s1.copy(&on0, &mut on1)?; // device 1's stream waits for device 0's upload, on the device
//!     Ok(())
//! }
//! ```
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
//! - [`load`]: files into device memory through pooled page-locked slots; safetensors checkpoints (feature
//!   `safetensors`).
#![deny(unsafe_op_in_unsafe_fn)]
// Unsafe code is confined to the files that say so with `#![allow(unsafe_code)]`: the FFI, the memory that
// the device shares, and the handles the driver lets threads share.
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// The raw layer: the `cuda-pinned-sys` crate, bindings to the CUDA driver API loaded at run time.
pub use cuda_pinned_sys as sys;

// The modules are layered: ARCHITECTURE.md lists the layers, and `scripts/check-layers.py` fails on an import
// against them. A lower layer that needs something of a higher one defines a hook that the higher one
// implements (`driver::stream::WorkObserver` for the ledger, `driver::context::Queue` for the streams).
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
pub mod load;
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
pub use load::{Io, LoadOptions, LoadReport};
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
