//! A block of page-locked host memory the crate owns: a whole allocation, how it was pinned and how it is
//! unpinned. [`crate::Pinned`] memory of its own, the pool's blocks and the `Vec` of a dropped
//! [`crate::Registered`] are blocks; once dropped with their work completed, they wait on the release thread to
//! be unpinned, and are reused from there meanwhile (`release.rs`).

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ptr::NonNull;

use super::numa::Placement;
use crate::driver::calls;
use crate::error::Result;

/// The page size: the smallest size class, and the alignment of every block `cuMemHostAlloc` returns.
pub(crate) const PAGE: usize = 4096;

/// The size class of a request of `bytes`: the bytes of a block serving it. One page up to a page; above it a
/// multiple of `g = max(page, bytes.next_power_of_two() / 16)`, so less than 12.5% more than the request above
/// 8 pages (see `pool/state.rs`). `None` only where it would exceed `usize`.
pub(crate) fn class_of(bytes: usize, page: usize) -> Option<usize> {
    if bytes <= page {
        return Some(page);
    }
    let granule = (bytes.checked_next_power_of_two()? / 16).max(page);
    bytes.checked_next_multiple_of(granule)
}

/// A whole allocation of page-locked host memory: `bytes` at `ptr`, pinned with `flags` (`CU_MEMHOSTALLOC_*`;
/// a registered block's `CU_MEMHOSTREGISTER_*` flags read the same for portable and mapped).
pub(crate) struct Block {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) bytes: usize,
    pub(crate) flags: u32,
    pub(crate) how: How,
    /// The NUMA node its pages were placed on, `None` where nothing was bound.
    pub(crate) node: Option<u32>,
}

/// How a block was pinned, which says how it is unpinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// By `cuMemHostAlloc`: freed by `cuMemFreeHost`.
    HostAlloc,
    /// Memory of the Rust allocator with this layout, registered by `cuMemHostRegister` from its start for
    /// `bytes`: unregistered, then deallocated.
    Registered(Layout),
}

// SAFETY: a block is memory its owner holds exclusively (lent to one buffer at a time); its address means the
// same on every thread.
unsafe impl Send for Block {}
// SAFETY: a shared block gives access to nothing but its address and size, so sharing it between threads
// shares no memory; the buffer that borrows it guards the memory itself.
unsafe impl Sync for Block {}

impl Block {
    /// Pins `bytes` (more than zero) with `cuMemHostAlloc` and `flags`; the memory is not initialised. The
    /// block's context is current.
    pub(crate) fn host_alloc(bytes: usize, flags: u32) -> Result<Block> {
        let ptr = calls::mem_host_alloc(bytes, flags)?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| crate::error::Error::invalid("cuMemHostAlloc returned null"))?;
        Ok(Block {
            ptr,
            bytes,
            flags,
            how: How::HostAlloc,
            node: None,
        })
    }

    /// Unpins and frees the block. Its context must be current, and no device work may use it. Where the
    /// driver fails, the memory is leaked: handing still page-locked memory back to the allocator would make
    /// a later registration of it fail.
    pub(crate) fn release(self) -> Result<()> {
        let ptr = self.ptr.as_ptr();
        let released = match self.how {
            // SAFETY: allocated by cuMemHostAlloc, owned by the block alone; no device work uses it.
            How::HostAlloc => unsafe { calls::mem_free_host(ptr.cast()) },
            How::Registered(layout) => {
                // SAFETY: registered from `ptr`; no device work uses it.
                unsafe { calls::mem_host_unregister(ptr.cast()) }?;
                // SAFETY: allocated by the Rust allocator with `layout`, owned by the block, no longer
                // registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Ok(())
            }
        };
        released.map_err(|e| e.context("unpinning page-locked memory (leaked)"))
    }
}

/// The node `placement` puts the memory of `device` on, as the allocation will bind it: `None` where it binds
/// nothing, including where the default placement finds no topology to read (it then allocates as
/// [`Placement::Any`] does).
pub(crate) fn node_of(placement: Placement, device: crate::Device) -> Result<Option<u32>> {
    match placement.node(device) {
        Err(_) if placement == Placement::DeviceNode => Ok(None),
        node => node,
    }
}

#[cfg(test)]
mod tests {
    use super::class_of;

    #[test]
    fn classes_waste_less_than_an_eighth_above_eight_pages() {
        let page = 4096;
        assert_eq!(class_of(1, page), Some(page));
        assert_eq!(class_of(page + 1, page), Some(2 * page));
        for bytes in (9 * page..(64 << 20)).step_by(12_345) {
            let class = class_of(bytes, page).unwrap();
            assert!(
                class >= bytes && (class - bytes) * 8 < bytes,
                "{bytes} -> {class}"
            );
            assert_eq!(
                class_of(class, page),
                Some(class),
                "a class is its own class"
            );
        }
        assert_eq!(class_of(usize::MAX, page), None);
    }
}
