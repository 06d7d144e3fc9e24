//! `Registered<T>`: a `Vec<T>` pinned in place (`cuMemHostRegister`), without a copy.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

use bytemuck::Pod;

use super::host::HostRegion;
use super::release::release_host;
use super::tracked::{Gpu, Track, lock};
use crate::driver::Context;
use crate::driver::calls;
use crate::error::Result;
use crate::sys::{CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE};
use crate::units::Bytes;

/// A `Vec<T>` page-locked in place, so it can be the host side of asynchronous copies like [`crate::Pinned`],
/// and mapped into the device's address space, so kernels can read and write it in place ([`crate::Arg::read_host`],
/// [`crate::Gatherer`]).
/// (A `Vec<T>` is always aligned for `T`, so any element type is accepted.)
///
/// It owns the `Vec` so that forgetting it leaks the memory rather than letting the program reuse memory that a
/// copy may still write; [`Registered::into_vec`] waits for pending work, unregisters and hands the `Vec` back.
/// Registering memory whose pages are already touched is much cheaper than allocating pinned memory.
pub struct Registered<T: Pod> {
    /// Owns the allocation; never dereferenced while registered (device work may write it): the host goes
    /// through `host` after the tracker's waits. `None` once `into_vec` or `Drop` has taken it.
    vec: Option<Vec<T>>,
    /// The elements, from the Vec's mutable pointer at registration.
    host: HostRegion<T>,
    context: Context,
}

impl<T: Pod> Registered<T> {
    /// Pins the `len` elements of `vec` in place (its spare capacity is not pinned), for every device's
    /// streams (portable) and mapped.
    ///
    /// # Errors
    /// The driver's, such as `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` when the memory overlaps a registered
    /// range, or `CUDA_ERROR_OUT_OF_MEMORY` when the system cannot lock it; the `Vec` is dropped then.
    #[doc(alias = "cuMemHostRegister")]
    pub fn new(context: &Context, mut vec: Vec<T>) -> Result<Registered<T>> {
        let bytes = size_of_val(vec.as_slice());
        let ptr = NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling());
        if bytes > 0 {
            let _current = context.enter()?;
            // SAFETY: `bytes` bytes of a live allocation, which the returned value owns and never grows, moves
            // out or frees while it is registered. Portable, so that it is the host side of copies on every
            // device's streams, and mapped, so that kernels can read it in place (a gather's table, a user's
            // kernel).
            unsafe {
                calls::mem_host_register(
                    ptr.as_ptr().cast(),
                    bytes,
                    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
                )
            }
            .map_err(|e| {
                e.context(format_args!(
                    "pinning {} of host memory in place",
                    Bytes(bytes)
                ))
            })?;
        }
        // SAFETY: the Vec's initialised elements, aligned for `T` (a Vec's pointer always is, dangling or not),
        // now page-locked (or zero bytes), owned by the new value, whose Vec is never touched again until
        // unregistered after all device work.
        let host = unsafe { HostRegion::new(ptr, vec.len()) };
        Ok(Registered {
            vec: Some(vec),
            host,
            context: context.clone(),
        })
    }

    /// The length in elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.host.len()
    }

    /// Whether there are no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.host.len() == 0
    }

    /// The context it was registered in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Waits until no device work writes the memory, then lends it for reading.
    ///
    /// # Errors
    /// The driver's, from the wait.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.host.read()
    }

    /// Waits until no device work uses the memory, then lends it for writing.
    ///
    /// # Errors
    /// The driver's, from the wait.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.host.write()
    }

    /// [`Registered::as_slice`] without blocking: `None` while device work still writes the memory.
    ///
    /// # Errors
    /// The driver's, from the query.
    pub fn try_as_slice(&self) -> Result<Option<&[T]>> {
        self.host.try_read()
    }

    /// [`Registered::as_mut_slice`] without blocking: `None` while device work still uses the memory.
    ///
    /// # Errors
    /// The driver's, from the query.
    pub fn try_as_mut_slice(&mut self) -> Result<Option<&mut [T]>> {
        self.host.try_write()
    }

    /// Unpins the memory and returns the `Vec`.
    ///
    /// Blocks until *all* work in the context has completed, not only the work on this memory: the driver's
    /// `cuMemHostUnregister` waits for the whole device, so this call synchronizes the context first, openly
    /// ([`Context::synchronize`]). To give the memory back without waiting, drop the `Registered` instead: its
    /// unpinning then happens on the crate's release thread (and the `Vec` is freed there).
    ///
    /// # Errors
    /// The driver's, from the waits or `cuMemHostUnregister`. The memory is then released by `Drop` as usual
    /// (once its work completes, or leaked if that cannot be known), and the `Vec` is not returned.
    #[doc(alias = "cuMemHostUnregister")]
    pub fn into_vec(mut self) -> Result<Vec<T>> {
        lock(self.host.track()).synchronize_all(&Gpu)?;
        if self.host.byte_len() > 0 {
            self.context.synchronize()?;
            let _current = self.context.enter()?;
            // SAFETY: registered in `new`; no device work uses it any more.
            unsafe { calls::mem_host_unregister(self.host_ptr()) }
                .map_err(|e| e.context("unpinning host memory"))?;
        }
        Ok(self.vec.take().unwrap_or_default())
    }

    pub(crate) fn host_ptr(&self) -> *mut c_void {
        self.host.ptr().cast()
    }

    pub(crate) fn track(&self) -> &Track {
        self.host.track()
    }
}

impl<T: Pod> Drop for Registered<T> {
    fn drop(&mut self) {
        let bytes = self.host.byte_len();
        let Some(vec) = self.vec.take().filter(|_| bytes > 0) else {
            return;
        };
        let ptr = self.host.ptr() as usize;
        let owned = SendVec { _vec: vec };
        let release = move || {
            // SAFETY: registered in `new`; called once, when no device work uses it.
            let unpinned = unsafe { calls::mem_host_unregister(ptr as *mut c_void) };
            match unpinned {
                Ok(()) => drop(owned),
                // Still registered, as far as anyone can tell: freeing it would hand page-locked memory back
                // to the allocator, where a later registration of it would fail. Leak it, as the pool does.
                Err(_) => std::mem::forget(owned),
            }
            unpinned.map_err(|e| e.context("unpinning a registered Vec (leaked)"))
        };
        release_host(
            &self.context,
            self.host.take_track(),
            Box::new(release),
            bytes,
        );
    }
}

/// A Vec moved into a release closure that may run on another thread.
struct SendVec<T> {
    _vec: Vec<T>,
}

// SAFETY: the closure only unregisters and frees the allocation, never reads or writes a `T`, and the `T`s have
// no destructor to run (a `Registered` is only made of `T: Pod`), so moving it between threads is harmless.
unsafe impl<T> Send for SendVec<T> {}

impl<T: Pod> fmt::Debug for Registered<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("ptr", &self.host.ptr())
            .field("len", &self.host.len())
            .finish()
    }
}
