//! Interop with [cudarc](https://docs.rs/cudarc) (feature `cudarc`), which candle, cubecl and much other Rust
//! GPU code use: a cudarc stream of a device's primary context is one of the crate's [`Stream`]s, and device
//! memory changes hands both ways.
//!
//! cudarc needs its CUDA version chosen when it builds: a crate that uses cudarc has one of its `cuda-XXXXX`
//! features on already (`cudarc = { version = "0.19", features = ["cuda-13000"] }`); otherwise set
//! `CUDARC_CUDA_VERSION` (e.g. `13000`) for the build.
//!
//! Work cudarc enqueues on a shared stream is invisible to the crate's tracking, as any other code's is:
//! enqueue it inside [`Stream::enqueue_foreign`], declaring the crate's buffers it reads and writes, and the
//! crate orders its own work around it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cuda_pinned::{DeviceBuffer, Pinned, Stream, Use};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cuda = cudarc::driver::CudaContext::new(0)?;
//! let theirs: Arc<cudarc::driver::CudaStream> = cuda.new_stream()?;
//! // SAFETY: `theirs` is never captured into a graph.
//! let ours = unsafe { Stream::from_cudarc(&theirs) }?; // the same stream, tracked
//! let slice = theirs.clone_htod(&[1u32, 2, 3])?;
//! // SAFETY: as above.
//! let buffer = unsafe { DeviceBuffer::from_cudarc(slice, &ours) }?; // ready once cudarc's work on it is
//! let mut host = Pinned::<u32>::zeroed(ours.context(), 3)?;
//! ours.download(&buffer, &mut host)?;
//! assert_eq!(host.as_slice()?, [1, 2, 3]);
//! # Ok(()) }
//! ```

#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::driver::{Context, Stream};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, Origin, Work};
use crate::track::Access;

/// The crate's context for a cudarc context: the same primary context, or an error.
fn primary_context(cuda: &cudarc::driver::CudaContext, what: &str) -> Result<Context> {
    let context = Context::on(cuda.ordinal())?;
    // The same driver object seen through two crates' bindings.
    if context.as_raw().cast::<()>() == cuda.cu_ctx().cast::<()>() {
        Ok(context)
    } else {
        Err(Error::invalid(format_args!(
            "{what}: the cudarc context of device {} is not the device's primary context (made with \
             CudaContext::new_non_primary?); the crate's tracking works in the primary context: use \
             CudaContext::new",
            cuda.ordinal()
        )))
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
impl Stream {
    /// The cudarc stream `stream` as one of the crate's streams: the same driver stream, which this handle
    /// keeps alive. Work the crate enqueues on it is tracked; work cudarc enqueues on it is ordered with the
    /// crate's through [`Stream::enqueue_foreign`].
    ///
    /// # Errors
    /// An invalid-argument error for cudarc's default (null) stream, or a stream of a context that is not the
    /// device's primary context; the driver's, from retaining the primary context.
    ///
    /// When the last of the crate's handles drops, so does its reference to cudarc's stream; where that was the
    /// last reference, cudarc destroys the stream and makes its context current on the dropping thread.
    ///
    /// # Safety
    /// The stream must not be captured into a graph (cudarc's `begin_capture`) while the returned handle, a
    /// clone of it, or a buffer with work recorded on it lives: captured work leaves the stream, and the crate
    /// would take it for done. (cudarc's capture methods are safe; the crate's tracking cannot see them.)
    pub unsafe fn from_cudarc(stream: &Arc<CudaStream>) -> Result<Stream> {
        let context = primary_context(stream.context(), "Stream::from_cudarc")?;
        // SAFETY: a non-blocking stream of `context` (cudarc makes its streams with CU_STREAM_NON_BLOCKING and
        // the null stream is refused by from_raw_keeping), kept alive by the Arc the handle holds.
        unsafe {
            Stream::from_raw_keeping(
                &context,
                stream.cu_stream().cast(),
                Some(Box::new(Arc::clone(stream))),
            )
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
impl<T: bytemuck::Pod> DeviceBuffer<T> {
    /// Takes a cudarc slice's memory into the crate's tracking, after the work cudarc recorded on it: the
    /// buffer's first use on any stream waits, on the device, for what was enqueued on the slice's stream
    /// before this call. Returns at once. The memory is freed by the crate (`cuMemFree`, once its uses have
    /// completed).
    ///
    /// # Errors
    /// An invalid-argument error for a slice of a context other than `stream`'s; the driver's.
    ///
    /// # Safety
    /// The slice's stream must not be being captured into a graph during this call (the crate records an event
    /// on it, which a capture would take off the stream).
    pub unsafe fn from_cudarc(slice: CudaSlice<T>, stream: &Stream) -> Result<DeviceBuffer<T>> {
        // The slice's stream as one of the crate's: `stream` itself where it is the same driver stream.
        let home = if stream.as_raw().cast::<()>() == slice.stream().cu_stream().cast::<()>() {
            stream.clone()
        } else {
            // SAFETY: the handle is used for this call only (the tracker keeps it, for a mark closed below with
            // an event recorded outside any capture, as the caller guarantees).
            unsafe { Stream::from_cudarc(slice.stream()) }?
        };
        if home.context() != stream.context() {
            return Err(Error::invalid(format_args!(
                "DeviceBuffer::from_cudarc: a slice of device {} for a stream of device {}",
                home.context().device().ordinal(),
                stream.context().device().ordinal()
            )));
        }
        let len = slice.len();
        // cudarc makes the slice's stream wait for the slice's own pending reads and writes, and makes its
        // context current to do so (`cuCtxSetCurrent`): with it pushed here, that replaces only this push, and
        // the thread's own context is current again after.
        let ptr = {
            let _current = stream.context().enter()?;
            slice.leak()
        };
        // SAFETY: a whole allocation of `len` Ts of the context (of a memory pool or cuMemAlloc: from_raw asks
        // the driver which, to free it the same way), owned by nobody else now; work still pending on it is on
        // `home`, recorded just below as a write before the buffer is used.
        let buffer = unsafe { DeviceBuffer::from_raw(stream, ptr, len) };
        home.tracked_uses(
            Work::Untimed,
            &mut [(buffer.track(), Access::Write)],
            || Ok(()),
        )?;
        // What cudarc enqueues on `home` from now on must not delay the buffer's users.
        home.close_segment()?;
        Ok(buffer)
    }

    /// Gives the buffer's memory to cudarc as a slice of `stream`, once every piece of device work the crate
    /// recorded on it has completed (blocks until then). cudarc frees it when the slice drops.
    ///
    /// # Errors
    /// An invalid-argument error for a stream of another context than the buffer's; the driver's, from
    /// waiting for the work (the buffer is dropped then, as usual).
    pub fn into_cudarc(self, stream: &Arc<CudaStream>) -> Result<CudaSlice<T>> {
        let context = primary_context(stream.context(), "DeviceBuffer::into_cudarc")?;
        if &context != self.context() {
            return Err(Error::invalid(format_args!(
                "DeviceBuffer::into_cudarc: a buffer of device {} for a stream of device {}",
                self.context().device().ordinal(),
                context.device().ordinal()
            )));
        }
        if self.is_empty() {
            return Err(Error::invalid(
                "DeviceBuffer::into_cudarc: an empty buffer has no allocation to give (make an empty slice with \
                 cudarc)",
            ));
        }
        // cudarc frees with cuMemFreeAsync on devices with memory pools, else cuMemFree.
        if (self.origin() == Origin::Plain) == context.has_memory_pools() {
            return Err(Error::invalid(
                "DeviceBuffer::into_cudarc: memory from cuMemAlloc on a device with memory pools, which cudarc \
                 would free with cuMemFreeAsync; copy it into a buffer the crate allocated",
            ));
        }
        let (ptr, len) = self.into_raw()?;
        // cudarc makes its context current (`cuCtxSetCurrent`) for the slice's events: pushed here, as in
        // `from_cudarc`, so that the thread's own is current again after.
        let _current = context.enter()?;
        // SAFETY: a whole allocation of `len` valid Ts in the stream's context, with no work pending, owned by
        // nobody else; cudarc frees it as its own allocations, which matches how it was allocated (checked).
        Ok(unsafe { stream.upgrade_device_ptr(ptr, len) })
    }
}
