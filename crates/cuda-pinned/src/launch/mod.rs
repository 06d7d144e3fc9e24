//! Users' kernels: modules loaded from PTX, cubin or fatbin images, their kernels, and launches that join the
//! tracking as copies do.
//!
//! ```no_run
//! use cuda_pinned::{Arg, Context, DeviceBuffer, LaunchConfig, Module, Stream};
//!
//! /// `ptx`: what a build script compiled with `nvcc --ptx` from
//! /// `extern "C" __global__ void scale(const float* x, float* y, float a, unsigned n)`,
//! /// e.g. `include_bytes!(concat!(env!("OUT_DIR"), "/scale.ptx"))`.
//! fn run(ptx: &[u8]) -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?;
//!     let stream = Stream::new(&context)?;
//!     let scale = Module::load(&context, ptx)?.kernel("scale")?;
//!     let x = DeviceBuffer::<f32>::zeroed(&stream, 1 << 20)?;
//!     let mut y = DeviceBuffer::<f32>::uninit(&stream, x.len())?;
//!     let n = x.len() as u32;
//!     // SAFETY: `scale` takes (const float*, float*, float, unsigned), reads x[..n] and writes y[..n].
//!     unsafe {
//!         stream.launch(
//!             &scale,
//!             LaunchConfig::for_elements(x.len(), 256)?,
//!             &[Arg::read(&x), Arg::write(&mut y), Arg::value(&2.0f32), Arg::value(&n)],
//!         )
//!     }
//! }
//! ```
//!
//! Each buffer argument says how the kernel uses it ([`Arg::read`], [`Arg::write`], and for page-locked host
//! memory mapped into the device's address space [`Arg::read_host`], [`Arg::write_host`]), so the launch
//! waits on the device for conflicting work of other streams, host accessors wait for it, and a buffer dropped
//! meanwhile is freed only once it has completed. What Rust cannot check is the `unsafe` part of
//! [`Stream::launch`]: that the kernel's parameters have the types of the arguments and that it touches only
//! the buffers passed, within their bounds, as declared. The rest is checked before anything is enqueued.

mod args;
mod config;
mod enqueue;
mod module;

pub use args::{Arg, Use};
pub use config::LaunchConfig;
pub(crate) use module::param_sizes;
pub use module::{Kernel, Module};
