//! `Registered<T>`: a `Vec<T>` pinned in place (`cuMemHostRegister`), without a copy.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

use bytemuck::Pod;

use super::block::{Block, How};
use super::host::{HostRegion, Readable, Writable};
use super::release::{retire, reuse};
use super::tracked::{Gpu, Track, lock, refuse_if_held, release_after_graphs};
use crate::driver::Context;
use crate::driver::calls;
use crate::error::Result;
use crate::sys::{CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE};
use crate::units::Bytes;

/// How a `Registered` is pinned: portable, so that it is the host side of copies on every device's streams,
/// and mapped, so that kernels can read it in place (a gather's table, a user's kernel).
const FLAGS: u32 = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;

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
    /// One exception keeps a loop that registers a `Vec` per iteration bounded while its devices never idle
    /// (the driver's unpinning waits for every device to be idle, so the registrations it drops would pile up):
    /// where a `Registered` was dropped whose `Vec` had room for exactly as many elements (of the same size and
    /// alignment) as `vec` holds, its work has completed and its unpinning still waits, the elements are copied
    /// into that memory, which stays registered, and `vec` is freed. [`Registered::into_vec`] then returns that
    /// `Vec`, with the same contents (and no spare capacity).
    ///
    /// # Errors
    /// The driver's, such as `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` when the memory overlaps a registered
    /// range, or `CUDA_ERROR_OUT_OF_MEMORY` when the system cannot lock it; the `Vec` is dropped then.
    #[doc(alias = "cuMemHostRegister")]
    pub fn new(context: &Context, mut vec: Vec<T>) -> Result<Registered<T>> {
        let bytes = size_of_val(vec.as_slice());
        if bytes > 0 {
            if let Some(reused) = Registered::reuse(context, &vec) {
                return Ok(reused);
            }
            let _current = context.enter()?;
            // SAFETY: `bytes` bytes of a live allocation, which the returned value owns and never grows, moves
            // out or frees while it is registered.
            unsafe { calls::mem_host_register(vec.as_mut_ptr().cast(), bytes, FLAGS) }.map_err(
                |e| {
                    e.context(format_args!(
                        "pinning {} of host memory in place",
                        Bytes(bytes)
                    ))
                },
            )?;
        }
        Ok(Registered::wrap(context, vec))
    }

    /// A `Registered` owning `vec`, which is registered (or holds no bytes).
    fn wrap(context: &Context, mut vec: Vec<T>) -> Registered<T> {
        let ptr = NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling());
        // SAFETY: the Vec's initialised elements, aligned for `T` (a Vec's pointer always is, dangling or not),
        // page-locked (or zero bytes), owned by the new value, whose Vec is never touched again until
        // unregistered after all device work.
        let host = unsafe { HostRegion::new(ptr, vec.len()) };
        Registered {
            vec: Some(vec),
            host,
            context: context.clone(),
        }
    }

    /// `vec`'s elements in the memory of a dropped `Registered` of the same type, length and capacity that waits
    /// to be unpinned with its work completed, if there is one; `vec` is freed then.
    fn reuse(context: &Context, vec: &[T]) -> Option<Registered<T>> {
        let bytes = size_of_val(vec);
        let layout = std::alloc::Layout::array::<T>(vec.len()).ok()?;
        let block = reuse(context, FLAGS, bytes, bytes, |b| {
            b.how == How::Registered(layout)
        })?;
        // SAFETY: the block is an allocation of the global allocator with the layout of `vec.len()` elements of
        // `T` (checked by `fits`: a dropped `Registered`'s Vec, or a pool block registered with that layout),
        // so a `Vec<T>` of that length and capacity; it is registered over all those bytes, with no device work
        // using it and no other owner; the elements are initialised (any bytes are a valid `T: Pod`), and
        // overwritten with `vec`'s at once.
        let mut kept =
            unsafe { Vec::from_raw_parts(block.ptr.as_ptr().cast::<T>(), vec.len(), vec.len()) };
        kept.copy_from_slice(vec);
        Some(Registered::wrap(context, kept))
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

    /// [`Registered::as_slice`] as a future, for async code: resolves to the same slice once no device work writes
    /// the memory, without blocking the executor's thread (the process's reactor thread watches the work and
    /// wakes the task). Dropping it before then leaves the buffer as it was.
    ///
    /// # Errors
    /// The driver's, from the queries, and the work's (a sticky error of its context).
    #[doc(alias = "as_slice")]
    pub fn readable(&self) -> Readable<'_, T> {
        self.host.readable()
    }

    /// [`Registered::as_mut_slice`] as a future: resolves to the same slice once no device work reads or writes the
    /// memory. As [`Registered::readable`].
    ///
    /// # Errors
    /// As [`Registered::readable`].
    #[doc(alias = "as_mut_slice")]
    pub fn writable(&mut self) -> Writable<'_, T> {
        self.host.writable()
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
        refuse_if_held(self.host.track(), "Registered::into_vec")?;
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
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let layout = std::alloc::Layout::array::<T>(vec.capacity())
            .expect("the layout of a live Vec's allocation");
        let block = Block {
            ptr: NonNull::new(vec.as_mut_ptr().cast::<u8>()).expect("a Vec of bytes is not null"),
            bytes,
            flags: FLAGS,
            how: How::Registered(layout),
            node: None,
        };
        // Unregistered and freed (as the Vec's allocation: `layout`) once no device work uses it (and the graphs
        // that use it are gone), and lent again meanwhile to a `Registered` of the same shape once its own work
        // has completed.
        let context = self.context.clone();
        release_after_graphs(self.host.track(), move |track| {
            retire(&context, track, block)
        });
    }
}

impl<T: Pod> fmt::Debug for Registered<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("ptr", &self.host.ptr())
            .field("len", &self.host.len())
            .finish()
    }
}
