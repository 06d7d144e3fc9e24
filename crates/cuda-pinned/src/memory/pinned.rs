//! `Pinned<T>`: page-locked host memory allocated by the driver, the fast host side of a copy.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;

use super::block::{Block, How, PAGE, class_of, node_of};
use super::host::{HostRegion, Readable, Writable};
use super::layout::{byte_len, check_alignment};
use super::numa::{self, Placement};
use super::pool::state::Lease;
use super::release::{release_host, retire, reuse};
use super::tracked::{Gpu, GpuTracker, Track, lock, refuse_if_held, release_after_graphs};
use crate::driver::Context;
use crate::error::Result;
use crate::sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_WRITECOMBINED,
};
use crate::units::Bytes;

/// `len` elements of `T` in page-locked host memory (`cuMemHostAlloc`), which the GPU's copy engines read and
/// write directly: copies from and to it run at the full speed of the link and can be asynchronous.
///
/// The host reaches the memory only through [`Pinned::as_slice`] and [`Pinned::as_mut_slice`], which wait for
/// the device work that conflicts with the access, so a copy in flight is never read early or overwritten.
/// Dropping it while a copy still uses it defers the release until that copy has completed.
///
/// The allocation is rounded up to a size class (less than 12.5% more above 32 KiB, as [`crate::PinnedPool`]'s),
/// and memory dropped while some device is busy, whose own work has completed, serves the next `Pinned` of its
/// context and flags that fits in it, with no driver call: the driver's unpinning waits for every device to be
/// idle, so a loop that allocates and drops pinned buffers while its devices never idle would otherwise pin
/// more and more. A pool ([`crate::PinnedPool`]) is still the faster choice for memory allocated again and
/// again: its hits cost no zeroing.
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
    /// The bytes of the allocation behind `host` (its size class, or more), when the buffer owns it; 0 for none.
    block_bytes: usize,
    /// The NUMA node the allocation was placed on (`None`: not bound, or not known).
    node: Option<u32>,
    flags: u32,
    context: Context,
    /// For a buffer over a pool's block: gives the block back to its pool, with the work in flight on it, when
    /// the buffer drops (the pool, a layer above, is known only as this); `None` for memory of its own.
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
        if bytes == 0 {
            // SAFETY: no bytes (`len` elements of a zero-sized type, or none): a dangling pointer is aligned for
            // `T` and valid for them, and nothing is freed on drop.
            let host = unsafe { HostRegion::new(NonNull::dangling(), len) };
            return Ok(self.wrap(host, None));
        }
        let class = class_of(bytes, PAGE).ok_or_else(|| {
            crate::error::Error::invalid(format_args!(
                "allocating {} of pinned memory: too large",
                Bytes(bytes)
            ))
        })?;
        let allocating = |e: crate::Error| {
            e.context(format_args!(
                "allocating {} of pinned host memory",
                Bytes(bytes)
            ))
        };
        let node = node_of(self.placement, self.context.device()).map_err(allocating)?;
        let fits = |b: &Block| {
            b.how == How::HostAlloc && b.node == node && b.ptr.as_ptr().addr().is_multiple_of(PAGE)
        };
        let block = match reuse(&self.context, self.flags, class, usize::MAX, fits) {
            Some(block) => block,
            None => self.pin(class, node).map_err(allocating)?,
        };
        // The driver does not initialise the memory, and reused memory holds what its last buffer left: a `T`
        // made of uninitialised bytes would be undefined.
        // SAFETY: the block has at least `class >= bytes` writable bytes that nothing else uses.
        unsafe { std::ptr::write_bytes(block.ptr.as_ptr(), 0, bytes) };
        // SAFETY: `len` zeroed page-locked elements, page-aligned (checked by `pin`, or when the reused block
        // was pinned) and so aligned for `T` (at most a page, checked above), owned by the new value alone and
        // handed back only by its Drop.
        let host = unsafe { HostRegion::new(block.ptr.cast::<T>(), len) };
        Ok(self.wrap(host, Some(&block)))
    }

    /// Pins a new block of `bytes` with the builder's flags and placement (on `node`), page-aligned.
    fn pin(&self, bytes: usize, node: Option<u32>) -> Result<Block> {
        let (context, flags) = (&self.context, self.flags);
        // The address comes back as a number: a raw pointer cannot leave the helper thread that `place` may run
        // the allocation on.
        let ptr = numa::place(self.placement, context.device(), || {
            let _current = context.enter()?;
            Block::host_alloc(bytes, flags).map(|block| block.ptr.as_ptr() as usize)
        })
        .and_then(|allocated| allocated)?;
        let block = Block {
            ptr: NonNull::new(ptr as *mut u8).expect("host_alloc checks for null"),
            bytes,
            flags,
            how: How::HostAlloc,
            node,
        };
        // The driver returns page-aligned memory; checked rather than assumed, since a misaligned slice of `T`
        // would be undefined behaviour.
        if !block.ptr.as_ptr().addr().is_multiple_of(PAGE) {
            // Released, never lent again: every block lent is page-aligned.
            let bytes = block.bytes;
            release_host(
                context,
                Default::default(),
                Box::new(|| block.release()),
                bytes,
            );
            return Err(crate::error::Error::invalid(format_args!(
                "cuMemHostAlloc returned {ptr:#x}, not aligned to a page"
            )));
        }
        Ok(block)
    }

    fn wrap<T>(self, host: HostRegion<T>, block: Option<&Block>) -> Pinned<T> {
        Pinned {
            host,
            block_bytes: block.map_or(0, |b| b.bytes),
            node: block.and_then(|b| b.node),
            flags: self.flags,
            context: self.context,
            loan: None,
        }
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

/// Where a pooled buffer's block goes back when the buffer drops: its pool (`pool/`, a layer above, known
/// here only as this).
pub(crate) trait Lender: Send + Sync {
    /// Takes `block`, lent under `lease`, back with the device work still in flight on it (`track`).
    fn give_back(&self, block: Block, lease: Lease, track: GpuTracker);
}

/// A pool's block lent to one buffer, given back to its lender when the buffer drops.
pub(crate) struct Loan {
    pub(crate) lender: Arc<dyn Lender>,
    pub(crate) block: Block,
    pub(crate) lease: Lease,
}

impl<T> Pinned<T> {
    /// A buffer over a block lent by a pool, allocated with `flags`; `loan` goes back when it drops.
    pub(crate) fn from_pool(
        host: HostRegion<T>,
        context: Context,
        flags: u32,
        loan: Loan,
    ) -> Pinned<T> {
        Pinned {
            host,
            block_bytes: 0,
            node: None,
            flags,
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

    /// [`Pinned::as_slice`] as a future, for async code: resolves to the same slice once no device work writes
    /// the memory, without blocking the executor's thread (the process's reactor thread watches the work and
    /// wakes the task). Dropping it before then leaves the buffer as it was.
    ///
    /// # Errors
    /// The driver's, from the queries, and the work's (a sticky error of its context).
    #[doc(alias = "as_slice")]
    pub fn readable(&self) -> Readable<'_, T> {
        self.host.readable()
    }

    /// [`Pinned::as_mut_slice`] as a future: resolves to the same slice once no device work reads or writes the
    /// memory. As [`Pinned::readable`].
    ///
    /// # Errors
    /// As [`Pinned::readable`].
    #[doc(alias = "as_mut_slice")]
    pub fn writable(&mut self) -> Writable<'_, T> {
        self.host.writable()
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
        refuse_if_held(self.host.track(), "Pinned::into_raw")?;
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
        self.block_bytes = 0;
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
            block_bytes: len * size_of::<T>(),
            node: None,
            flags,
            context: context.clone(),
            loan: None,
        }
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        if let Some(loan) = self.loan.take() {
            // The pool reuses the block only once the work in flight on it has completed (and the graphs that
            // use it are gone).
            release_after_graphs(self.host.track(), move |track| {
                loan.lender.give_back(loan.block, loan.lease, track);
            });
            return;
        }
        if self.block_bytes == 0 {
            return;
        }
        let block = Block {
            // The region's pointer is the block's start (`zeroed`, `from_raw`), never null for a block.
            ptr: NonNull::new(self.host.ptr().cast::<u8>()).expect("a block's address"),
            bytes: self.block_bytes,
            flags: self.flags,
            how: How::HostAlloc,
            node: self.node,
        };
        // Unpinned once no device work uses it, and lent again meanwhile once its own work has completed.
        let context = self.context.clone();
        release_after_graphs(self.host.track(), move |track| {
            retire(&context, track, block)
        });
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
