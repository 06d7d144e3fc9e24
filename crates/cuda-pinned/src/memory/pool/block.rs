//! How the pool pins a block (the faster of two ways on this machine) and hands one it gives up to the release
//! thread.

#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::driver::Context;
use crate::driver::calls;
use crate::error::{Error, Result};
use crate::memory::block::{Block, How, PAGE, node_of};
use crate::memory::numa::{self, Placement};
use crate::memory::release::retire;
use crate::memory::tracked::GpuTracker;
use crate::sys::{
    CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP,
    CU_MEMHOSTREGISTER_PORTABLE,
};
use crate::units::Bytes;

/// How a block is pinned, as `cuMemHostAlloc` flags (a registered block has the same, as
/// `CU_MEMHOSTREGISTER_*`): portable, so that buffers of one pool serve the streams of every device, and mapped,
/// so that kernels can read them in place (the gather reads its indices so).
pub(crate) const POOL_FLAGS: u32 = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
const _: () = assert!(
    POOL_FLAGS == CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
    "a registered block's flags read as a pinned one's"
);

/// How the pool pins a new block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pinning {
    /// Whichever of the two below is faster on this machine, measured once per process on first use.
    Auto,
    /// `cuMemHostAlloc`, then the memory zeroed on several threads.
    HostAlloc,
    /// Ordinary page-aligned memory, its pages touched (zeroed) on several threads, then `cuMemHostRegister`.
    Register,
}

/// Pins a block of `bytes` (a multiple of the page size) the way `how` says, zeroed, placed as `placement` says
/// (see `numa`). `context` is current.
pub(super) fn pin(
    context: &Context,
    bytes: usize,
    how: Pinning,
    placement: Placement,
) -> Result<Block> {
    let node = node_of(placement, context.device())
        .map_err(|e| e.context(format_args!("pinning {} for the pool", Bytes(bytes))))?;
    match how {
        Pinning::Auto => pin(context, bytes, fastest_pinning(context), placement),
        Pinning::HostAlloc => {
            // Freed by `Block::release`. The driver places the pages as it pins them, by the memory policy of the
            // thread that calls it. The address comes back as a number: a raw pointer cannot leave the helper
            // thread that `place` may run the allocation on.
            let ptr = numa::place(placement, context.device(), || {
                let _current = context.enter()?;
                Block::host_alloc(bytes, POOL_FLAGS).map(|block| block.ptr.as_ptr() as usize)
            })
            .and_then(|allocated| allocated)
            .map_err(|e| e.context(format_args!("pinning {} for the pool", Bytes(bytes))))?;
            let ptr = NonNull::new(ptr as *mut u8)
                .ok_or_else(|| Error::invalid("cuMemHostAlloc returned null"))?;
            zero(ptr, bytes);
            Ok(Block {
                ptr,
                bytes,
                flags: POOL_FLAGS,
                how: How::HostAlloc,
                node,
            })
        }
        Pinning::Register => {
            let layout = std::alloc::Layout::from_size_align(bytes, registered_align(bytes))
                .map_err(|_| Error::invalid(format_args!("a pool block of {bytes} bytes")))?;
            // SAFETY: a layout of non-zero size (classes are at least a page). Freed by `Block::release`.
            let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) }).ok_or_else(|| {
                Error::invalid(format_args!(
                    "the system could not allocate {}",
                    Bytes(bytes)
                ))
            })?;
            advise_huge_pages(ptr, bytes);
            // Pages are placed when first touched: bound to the node first, so that the threads touching them
            // may run anywhere.
            if let Err(e) = numa::bind_for(ptr.as_ptr(), bytes, placement, context.device()) {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(e.context(format_args!("pinning {} for the pool", Bytes(bytes))));
            }
            // Touching the pages faults them in on several threads at once, which is what makes this path
            // fast, and initialises them.
            zero(ptr, bytes);
            // SAFETY: `bytes` bytes of a live allocation owned by the block, unregistered by `Block::release`.
            let registered =
                unsafe { calls::mem_host_register(ptr.as_ptr().cast(), bytes, POOL_FLAGS) };
            if let Err(e) = registered {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(e.context(format_args!("pinning {} for the pool", Bytes(bytes))));
            }
            Ok(Block {
                ptr,
                bytes,
                flags: POOL_FLAGS,
                how: How::Registered(layout),
                node,
            })
        }
    }
}

/// Hands `block`, which no device work uses, to the crate's release thread: returns at once, as unpinning
/// waits for all work on the device. Until it is unpinned, the block can serve a later request of its size
/// (the pool's or another's: see `release.rs`). An error is kept in the context (and the memory leaked).
pub(super) fn give_up(block: Block, context: &Context) {
    retire(context, GpuTracker::default(), block);
}

/// The alignment of a block allocated for registration: 2 MiB for blocks of at least that, so that the kernel
/// can back it with transparent huge pages (one page fault and one pinned page per 2 MiB instead of 512).
fn registered_align(bytes: usize) -> usize {
    const HUGE: usize = 2 << 20;
    if bytes >= HUGE { HUGE } else { PAGE }
}

/// Asks Linux to back the range with transparent huge pages where it can. Only advice: where huge pages are
/// off, nothing changes.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: NonNull<u8>, bytes: usize) {
    unsafe extern "C" {
        fn madvise(
            addr: *mut std::ffi::c_void,
            len: usize,
            advice: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    const MADV_HUGEPAGE: std::ffi::c_int = 14;
    // SAFETY: a page-aligned range of an allocation the caller owns; the advice changes no contents, and a failure
    // (huge pages unavailable) is harmless.
    let _ = unsafe { madvise(ptr.as_ptr().cast(), bytes, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: NonNull<u8>, _: usize) {}

/// Writes zeroes over `bytes` at `ptr` on several threads for large blocks: fresh pages are faulted in by the
/// first write, which is the slow part of pinning fresh memory, and spreads over cores.
fn zero(ptr: NonNull<u8>, bytes: usize) {
    const PER_THREAD: usize = 16 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(16);
    let threads = threads.min(bytes.div_ceil(PER_THREAD)).max(1);
    let piece = bytes.div_ceil(threads).next_multiple_of(PAGE);
    let base = ptr.as_ptr() as usize;
    std::thread::scope(|scope| {
        for start in (0..bytes).step_by(piece) {
            let len = piece.min(bytes - start);
            scope.spawn(move || {
                // SAFETY: a disjoint range of the block, which nothing else uses yet.
                unsafe { std::ptr::write_bytes((base + start) as *mut u8, 0, len) };
            });
        }
    });
}

/// The faster of `cuMemHostAlloc` and touch + `cuMemHostRegister` on this machine, measured once per process by
/// pinning 32 MiB each way (the first measured after a warm-up pin of each) with `context` current. The blocks
/// are kept until every pin is timed, then handed to the release thread: unpinning waits for all work on the
/// device, and would run beside the timed pins.
fn fastest_pinning(context: &Context) -> Pinning {
    static FASTEST: OnceLock<Pinning> = OnceLock::new();
    *FASTEST.get_or_init(|| {
        let mut blocks = Vec::new();
        let mut time = |how| -> Option<Duration> {
            let started = Instant::now();
            let block = pin(context, 32 << 20, how, Placement::Any).ok()?;
            let took = started.elapsed();
            blocks.push(block);
            Some(took)
        };
        let _ = (time(Pinning::HostAlloc), time(Pinning::Register));
        let fastest = match (time(Pinning::HostAlloc), time(Pinning::Register)) {
            (Some(alloc), Some(register)) if register < alloc => Pinning::Register,
            (Some(_), _) => Pinning::HostAlloc,
            (None, _) => Pinning::Register,
        };
        for block in blocks {
            give_up(block, context);
        }
        fastest
    })
}
