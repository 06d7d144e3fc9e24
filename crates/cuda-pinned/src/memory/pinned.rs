//! `Pinned<T>`: page-locked host memory allocated by the driver, the fast host side of a copy.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

use bytemuck::Pod;

use super::host::HostRegion;
use super::layout::{byte_len, check_alignment};
use super::numa::{self, Placement};
use super::pool::{Loan, POOL_FLAGS};
use super::release::release_host;
use super::tracked::{Gpu, Track, lock};
use crate::driver::Context;
use crate::driver::calls;
use crate::error::Result;
use crate::sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED,
};
use crate::units::Bytes;

/// The alignment the driver guarantees for `cuMemHostAlloc`: a page.
const PAGE: usize = 4096;

/// `len` elements of `T` in page-locked host memory (`cuMemHostAlloc`), which the GPU's copy engines read and
/// write directly: copies from and to it run at the full speed of the link and can be asynchronous.
///
/// The host reaches the memory only through [`Pinned::as_slice`] and [`Pinned::as_mut_slice`], which wait for
/// the device work that conflicts with the access, so a copy in flight is never read early or overwritten.
/// Dropping it while a copy still uses it defers the release until that copy has completed.
///
/// ```
/// # fn main() -> cuda_pinned::Result<()> {
/// # let Ok(context) = cuda_pinned::Context::on(0) else { return Ok(()) };
/// use cuda_pinned::{DeviceBuffer, Pinned, Stream};
/// let stream = Stream::new(&context)?;
/// let mut host = Pinned::<f32>::zeroed(&context, 1 << 20)?;
/// host.as_mut_slice()?.fill(1.5);
/// let mut device = DeviceBuffer::uninit(&stream, host.len())?;
/// stream.upload(&host, &mut device)?; // returns at once
/// stream.download(&device, &mut host)?; // ordered after the upload on the same stream
/// assert!(host.as_slice()?.iter().all(|&x| x == 1.5)); // waits for the download
/// # Ok(()) }
/// ```
pub struct Pinned<T> {
    host: HostRegion<T>,
    flags: u32,
    context: Context,
    /// The pool block this buffer borrows, given back on drop; `None` for memory of its own.
    loan: Option<Loan>,
}

/// How to allocate pinned memory: `PinnedBuilder::new(&context).write_combined(true).zeroed::<u8>(n)`.
#[derive(Clone, Debug)]
#[must_use]
pub struct PinnedBuilder {
    context: Context,
    flags: u32,
    placement: Placement,
}

impl PinnedBuilder {
    /// Pinned memory of `context` with the default flags: portable, not mapped, not write-combined.
    pub fn new(context: &Context) -> PinnedBuilder {
        PinnedBuilder {
            context: context.clone(),
            flags: CU_MEMHOSTALLOC_PORTABLE,
            placement: Placement::default(),
        }
    }

    /// Which NUMA node the memory is placed on (default [`Placement::DeviceNode`]: the node of the context's
    /// device, on hosts of several nodes; nothing is bound on a host of one). The driver places the pages as it
    /// pins them, so a placement on a node runs the allocation on a thread bound to that node.
    pub fn placement(mut self, placement: Placement) -> PinnedBuilder {
        self.placement = placement;
        self
    }

    /// Page-locked for every context in the process, not only the allocating one (`CU_MEMHOSTALLOC_PORTABLE`).
    /// On by default. Under unified addressing, which the driver enables in every 64-bit process, the driver
    /// takes memory of `cuMemHostAlloc` for page-locked in every context whatever this flag says, so either way
    /// the memory is the host side of asynchronous copies on the streams of every device.
    pub fn portable(self, yes: bool) -> PinnedBuilder {
        self.flag(CU_MEMHOSTALLOC_PORTABLE, yes)
    }

    /// Mapped into the device's address space, so kernels can read it directly (`CU_MEMHOSTALLOC_DEVICEMAP`).
    pub fn device_mapped(self, yes: bool) -> PinnedBuilder {
        self.flag(CU_MEMHOSTALLOC_DEVICEMAP, yes)
    }

    /// Write-combined (`CU_MEMHOSTALLOC_WRITECOMBINED`): faster for the GPU to read across PCIe and for the CPU
    /// to write, but very slow for the CPU to read (uncached). The choice for upload-only staging buffers. Off by
    /// default.
    pub fn write_combined(self, yes: bool) -> PinnedBuilder {
        self.flag(CU_MEMHOSTALLOC_WRITECOMBINED, yes)
    }

    fn flag(mut self, flag: u32, yes: bool) -> PinnedBuilder {
        if yes {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
        self
    }

    /// Allocates `len` zeroed elements.
    ///
    /// # Errors
    /// `CUDA_ERROR_OUT_OF_MEMORY` when the system cannot lock that much memory; an invalid-argument error if
    /// the size in bytes overflows, or if `T` is aligned to more than a page (4096 bytes), which is all the
    /// driver guarantees.
    #[doc(alias = "cuMemHostAlloc")]
    pub fn zeroed<T: Pod>(self, len: usize) -> Result<Pinned<T>> {
        let bytes = byte_len::<T>(len, "allocating pinned memory")?;
        check_alignment::<T>(PAGE, "allocating pinned memory")?;
        let ptr = if bytes == 0 {
            NonNull::dangling()
        } else {
            let (context, flags) = (&self.context, self.flags);
            // Freed in Drop (deferred while in use). The address comes back as a number: a raw pointer cannot
            // leave the helper thread that `place` may run the allocation on.
            let ptr = numa::place(self.placement, context.device(), || {
                let _current = context.enter()?;
                calls::mem_host_alloc(bytes, flags).map(|ptr| ptr as usize)
            })
            .and_then(|allocated| allocated)
            .map_err(|e| {
                e.context(format_args!(
                    "allocating {} of pinned host memory",
                    Bytes(bytes)
                ))
            })? as *mut c_void;
            // The driver does not initialise the memory; a `T` made of uninitialised bytes would be undefined.
            // SAFETY: cuMemHostAlloc succeeded: `bytes` writable bytes that nothing else uses yet.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
            // The driver returns page-aligned memory; checked rather than assumed, since a misaligned slice of `T`
            // would be undefined behaviour.
            NonNull::new(ptr.cast::<T>())
                .filter(|p| p.as_ptr().is_aligned())
                .ok_or_else(|| {
                    // SAFETY: allocated just above by cuMemHostAlloc; nothing uses it.
                    let _ = unsafe { calls::mem_free_host(ptr) };
                    crate::error::Error::invalid(format_args!(
                        "cuMemHostAlloc returned {ptr:p}, not aligned for {}",
                        std::any::type_name::<T>()
                    ))
                })?
        };
        // SAFETY: `len` zeroed page-locked elements, aligned for `T` (checked above; a dangling pointer is too),
        // or none, owned by the new value alone and freed only by its Drop.
        let host = unsafe { HostRegion::new(ptr, len) };
        Ok(Pinned {
            host,
            flags: self.flags,
            context: self.context,
            loan: None,
        })
    }

    /// Allocates a copy of `data`.
    ///
    /// # Errors
    /// As [`PinnedBuilder::zeroed`].
    pub fn from_slice<T: Pod>(self, data: &[T]) -> Result<Pinned<T>> {
        let mut pinned = self.zeroed(data.len())?;
        pinned.as_mut_slice()?.copy_from_slice(data);
        Ok(pinned)
    }
}

impl<T: Pod> Pinned<T> {
    /// Allocates `len` zeroed elements with the default flags (portable, not mapped, not write-combined).
    ///
    /// # Errors
    /// As [`PinnedBuilder::zeroed`].
    pub fn zeroed(context: &Context, len: usize) -> Result<Pinned<T>> {
        PinnedBuilder::new(context).zeroed(len)
    }

    /// Allocates a pinned copy of `data` with the default flags.
    ///
    /// # Errors
    /// As [`PinnedBuilder::zeroed`].
    pub fn from_slice(context: &Context, data: &[T]) -> Result<Pinned<T>> {
        PinnedBuilder::new(context).from_slice(data)
    }
}

impl<T> Pinned<T> {
    /// A buffer over a block lent by a pool.
    pub(crate) fn from_pool(host: HostRegion<T>, context: Context, loan: Loan) -> Pinned<T> {
        Pinned {
            host,
            flags: POOL_FLAGS,
            context,
            loan: Some(loan),
        }
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

    /// Whether the memory is write-combined (see [`PinnedBuilder::write_combined`]).
    #[must_use]
    pub fn is_write_combined(&self) -> bool {
        self.flags & CU_MEMHOSTALLOC_WRITECOMBINED != 0
    }

    /// The flags it was allocated with (`CU_MEMHOSTALLOC_*`).
    #[must_use]
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Whether it was allocated with `CU_MEMHOSTALLOC_PORTABLE` (see [`PinnedBuilder::portable`]: under unified
    /// addressing it serves every device's streams either way).
    #[must_use]
    pub fn is_portable(&self) -> bool {
        self.flags & CU_MEMHOSTALLOC_PORTABLE != 0
    }

    /// The context it was allocated in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Waits until no device work writes the memory, then lends it for reading. Reads in flight (an upload)
    /// do not conflict and are not waited for.
    ///
    /// # Errors
    /// The driver's, from the wait.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.host.read()
    }

    /// Waits until no device work reads or writes the memory, then lends it for writing.
    ///
    /// # Errors
    /// The driver's, from the wait.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.host.write()
    }

    /// [`Pinned::as_slice`] without blocking: `None` while device work still writes the memory.
    ///
    /// # Errors
    /// The driver's, from the query.
    pub fn try_as_slice(&self) -> Result<Option<&[T]>> {
        self.host.try_read()
    }

    /// [`Pinned::as_mut_slice`] without blocking: `None` while device work still uses the memory.
    ///
    /// # Errors
    /// The driver's, from the query.
    pub fn try_as_mut_slice(&mut self) -> Result<Option<&mut [T]>> {
        self.host.try_write()
    }

    /// The host address, for interop. Work enqueued through it outside the crate is not tracked.
    #[must_use]
    pub fn as_ptr(&self) -> *const T {
        self.host.ptr()
    }

    pub(crate) fn host_ptr(&self) -> *mut c_void {
        self.host.ptr().cast()
    }

    pub(crate) fn track(&self) -> &Track {
        self.host.track()
    }

    /// Gives the allocation up to the caller, once every piece of device work recorded on it has completed
    /// (blocks until then): returns its address, length in elements and `cuMemHostAlloc` flags
    /// ([`Pinned::flags`]).
    ///
    /// The memory stays page-locked until the caller frees it with `cuMemFreeHost` (which waits for the whole
    /// device). It belongs to the device's primary context, so it stays valid while that context is retained
    /// (keep a [`Context`] of the device). Hand it back with [`Pinned::from_raw`].
    ///
    /// # Errors
    /// An invalid-argument error for a buffer of a [`PinnedPool`](crate::PinnedPool), which goes back to its
    /// pool; the driver's, from waiting for the work. The buffer is dropped then, as usual.
    pub fn into_raw(mut self) -> Result<(*mut T, usize, u32)> {
        if self.loan.is_some() {
            return Err(crate::error::Error::invalid(
                "Pinned::into_raw: a pooled buffer belongs to its pool (copy it into a Pinned of its own)",
            ));
        }
        lock(self.host.track())
            .synchronize_all(&Gpu)
            .map_err(|e| e.context("giving up pinned memory: waiting for its work"))?;
        let raw = (self.host.ptr(), self.host.len(), self.flags);
        // SAFETY: an empty region frees nothing on drop; the memory now belongs to the caller.
        self.host = unsafe { HostRegion::new(NonNull::dangling(), 0) };
        Ok(raw)
    }

    /// Takes ownership of `len` elements of page-locked memory at `ptr`, allocated by `cuMemHostAlloc` with
    /// `flags`: from now on tracked like any pinned buffer's and freed with `cuMemFreeHost` (on the crate's
    /// release thread, once every use has completed) when the buffer is dropped.
    ///
    /// # Safety
    /// `ptr` must be a whole allocation of `cuMemHostAlloc` of at least `len * size_of::<T>()` bytes in (or
    /// portable to) `context`, made with `flags`, aligned for `T`, holding valid `T`s, with no device work
    /// still using it, and nothing else may use or free it afterwards (a pointer from [`Pinned::into_raw`]
    /// qualifies). A null `ptr` is allowed only with `len == 0`.
    pub unsafe fn from_raw(context: &Context, ptr: *mut T, len: usize, flags: u32) -> Pinned<T> {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        Pinned {
            // SAFETY: as the caller guarantees: owned page-locked elements, aligned, initialised.
            host: unsafe { HostRegion::new(ptr, len) },
            flags,
            context: context.clone(),
            loan: None,
        }
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        if let Some(loan) = self.loan.take() {
            // The pool reuses the block only once the work in flight on it has completed.
            loan.give_back(self.host.take_track());
            return;
        }
        let bytes = self.host.byte_len();
        if bytes == 0 {
            return;
        }
        let ptr = self.host.ptr() as usize;
        let release = move || {
            // SAFETY: allocated by cuMemHostAlloc in `zeroed`; called once, when no device work uses it, and the
            // buffer (the host's only way to it) is gone.
            unsafe { calls::mem_free_host(ptr as *mut c_void) }
        };
        release_host(
            &self.context,
            self.host.take_track(),
            Box::new(release),
            bytes,
        );
    }
}

impl<T> fmt::Debug for Pinned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pinned")
            .field("ptr", &self.host.ptr())
            .field("len", &self.host.len())
            .field("flags", &self.flags)
            .finish()
    }
}
