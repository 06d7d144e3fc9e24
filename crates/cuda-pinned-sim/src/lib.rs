//! A simulated CUDA driver, for testing `cuda-pinned`, and crates built on it, where there is no GPU.
//!
//! Add it as a dev-dependency and call [`install`] at the start of each test: `cuda-pinned` then loads it in
//! place of the driver, and the test runs as it would on a GPU, with what a GPU does not give:
//!
//! ```toml
//! [dev-dependencies]
//! # No registry has it yet: a checkout of its repository by path (or the repository by `git = "..."`).
//! cuda-pinned-sim = { path = "../cuda-pinned/crates/cuda-pinned-sim" }
//! ```
//! ```ignore
//! // (A test of a crate that depends on cuda-pinned; the repository's examples/downstream runs one like it.)
//! use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};
//!
//! #[test]
//! fn a_round_trip_keeps_every_element() -> Result<(), Box<dyn std::error::Error>> {
//!     let sim = cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().seed(7))?.exclusive();
//!     let context = Context::on(0)?;
//!     let (a, b) = (Stream::new(&context)?, Stream::new(&context)?);
//!     let mut host = Pinned::from_slice(&context, &[1u32, 2, 3])?;
//!     let mut device = DeviceBuffer::<u32>::uninit(&a, 3)?;
//!     a.upload(&host, &mut device)?;
//!     b.download(&device, &mut host)?;
//!     assert_eq!(host.as_slice()?, [1, 2, 3]);
//!     assert!(sim.new_violations().is_empty(), "{:?}", sim.new_violations());
//!     Ok(())
//! }
//! ```
//!
//! It is built as a shared library that exports, with the C ABI and the signatures of `cuda.h`, the driver
//! functions `cuda-pinned` calls (and the runtime's host-memory functions); cargo builds it beside the test
//! binaries of any crate that depends on it, and [`install`] makes `cuda-pinned-sys` load it. (Setting
//! `CUDA_PINNED_LIBCUDA` and `CUDA_PINNED_LIBCUDART` to [`library_path`] does the same from outside.) Faults,
//! violations and what is alive belong to the whole process: a test that uses them holds the simulator with
//! [`Control::exclusive`]. Device
//! memory is host memory the simulator tracks; each stream is a thread that runs its queue in order, every
//! operation after a random delay (seeded: [`Settings::seed`]), so work that was not ordered runs in the wrong
//! order and shows as wrong data.
//!
//! It checks what the real driver does not: an operation that runs after the memory it touches was freed or
//! unregistered, or before its stream-ordered allocation; memory freed while queued work still uses it;
//! memory used after its stream-ordered free was queued. Each is a *violation*: a `VIOLATION` line on
//! stderr, a `CUDA_ERROR_ILLEGAL_ADDRESS` from the next driver call, and an entry of
//! [`Control::violations`]. A test that provokes violations on purpose turns the printing off while it checks
//! them ([`Control::print_violations`]).
//!
//! It also reports what is right but costs time, as violations that fail no call: a *hidden wait*, a call
//! that synchronizes the whole device (`cuMemFreeHost`, `cuMemHostUnregister`, `cuMemFree_v2`, `cuModuleUnload`,
//! which wait here for every operation queued on the device, as the driver's do) made while unrelated work is
//! queued, on any thread (`cuda-pinned`'s own release thread included); and a *false dependency*, a stream made to
//! wait for work that does not touch the memory of the operation the same call then enqueues on it. Both name
//! the `cuda-pinned` functions on the caller's stack.
//!
//! Kernels run as *stand-ins*: Rust functions a test registers by kernel name ([`Control::register_kernel`]);
//! those of `cuda-pinned`'s own gather kernels are built into the library, so that a program that loads it
//! through `CUDA_PINNED_LIBCUDA` runs them as one that calls [`install`] does.
//! Any image loads as a module (`cuModuleLoadData`), its kernels are the stand-ins of their names, and a launch
//! (`cuLaunchKernel`) runs its stand-in in stream order, which reads and writes device memory and mapped host
//! memory by device address ([`KernelCall`]). An access outside every live allocation, and a panic of a
//! stand-in, are violations.
//!
//! Faults on demand: [`Control::fail`] (`cuMemAlloc_v2:3:CUDA_ERROR_OUT_OF_MEMORY` fails the third call from
//! now), [`Settings::faults`], [`Settings::device_memory`] and [`Settings::pinned_limit`]. [`Control::live`]
//! counts what is still allocated, for leak checks; [`Control::trace_start`] records the calls made.
//!
//! It is a test double. It never replaces runs on a real GPU: its timing, its memory model and its errors
//! are only as faithful as its source, and a kernel's stand-in is only as faithful as the test that wrote it
//! (it runs once per launch, on the host, not once per thread).
//! Calls on the null stream run at once in the caller's thread, after the blocking streams.
//!
//! The exported driver functions are not `unsafe` to call from Rust only because no Rust code calls them:
//! their module is private, and their contract is cuda.h's.

mod api;
mod attributes;
mod codes;
mod config;
mod control;
mod detect;
mod faults;
mod graph;
mod kernel;
mod nodes;
mod own_kernels;
mod runtime;
mod sim;
mod stream;
mod testkit;

pub use control::{Control, Exclusive, Live, library_path};
pub use testkit::{Error, KernelCall, Settings, install, install_with};

/// The types and constants of cuda.h.
use cuda_pinned_sys as sys;
