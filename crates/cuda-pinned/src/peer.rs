//! Copies between the memory of two devices: peer access, enabled once per pair of contexts, and
//! `cuMemcpyPeerAsync` where the devices can reach each other (NVLink, or one PCIe switch); where they cannot,
//! a copy staged through page-locked memory of the crate's own, on a stream of each device.
//!
//! The driver stages a peer copy itself where peer access is off, but that copy was seen to hold back copies
//! enqueued later on other streams (host-staged peer copies on PCIe-only GPUs), a hidden wait; a download on
//! one device and an upload on the other, each an ordinary tracked copy, hold back nothing but themselves.

#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::{Mutex, PoisonError};

use bytemuck::Pod;

use crate::copy::sealed::{DeviceMemory, PinnedMemory};
use crate::copy::{DeviceDestination, DeviceSource, copy_bytes};
use crate::driver::calls;
use crate::driver::{Category, Context, Stream};
use crate::error::{Error, Result};
use crate::memory::{Gpu, Origin, Pinned, Work, lock};
use crate::sys::CUresult;
use crate::track::Access;
use crate::units::Bytes;

/// The most bytes one staging buffer of a copy between devices without peer access holds: two of them let
/// the download of one chunk overlap the upload of the one before.
const STAGING_CHUNK: usize = 4 << 20;

impl Context {
    /// Whether this context's device can access `peer`'s device memory directly (NVLink, or PCIe peer to
    /// peer), as [`Context::enable_peer_access`] would enable it. A device does not count as its own peer.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuDeviceCanAccessPeer")]
    pub fn can_access_peer(&self, peer: &Context) -> Result<bool> {
        let ordinal = peer.device().ordinal();
        if ordinal == self.device().ordinal() {
            return Ok(false);
        }
        if let Some(can) = self.peers().reachable(ordinal) {
            return Ok(can);
        }
        let can = calls::device_can_access_peer(self.device().as_raw(), peer.device().as_raw())
            .map_err(|e| {
                e.context(format_args!(
                    "asking whether device {} can access device {}'s memory",
                    self.device().ordinal(),
                    ordinal
                ))
            })?;
        self.peers().set_reachable(ordinal, can);
        Ok(can)
    }

    /// Lets this context's work access `peer`'s device memory directly, if the hardware allows: returns
    /// whether it does. That is the context's access (`cuCtxEnablePeerAccess`, for memory of `cuMemAlloc`)
    /// and, where `peer`'s device allocates from a memory pool, access to the crate's pool of it
    /// (`cuMemPoolSetAccess`, which peer access does not cover; other pools of the device are left as they
    /// are). Done once per pair of context handles
    /// (later calls return at once); [`Stream::copy`] between two devices does it for both directions on first
    /// use, so calling this is needed only to pay its cost up front: the driver maps each allocation into
    /// the other device's address space then, and, once enabled, maps every later allocation into it too,
    /// which makes allocating slower. The access lasts while a handle of `peer`'s context lives. Where the
    /// driver refuses for lack of hardware support or of room (`CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`,
    /// `CUDA_ERROR_TOO_MANY_PEERS`: a device has at most 8 peers on most systems), returns `Ok(false)`, and
    /// copies between the two go through page-locked memory.
    ///
    /// # Errors
    /// The driver's, other than those.
    #[doc(alias = "cuCtxEnablePeerAccess")]
    #[doc(alias = "cuMemPoolSetAccess")]
    pub fn enable_peer_access(&self, peer: &Context) -> Result<bool> {
        if !self.can_access_peer(peer)? {
            return Ok(false);
        }
        if self.peers().is_enabled(peer) {
            return Ok(true);
        }
        let refused = |e: &Error| {
            [
                CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                CUresult::CUDA_ERROR_TOO_MANY_PEERS,
            ]
            .into_iter()
            .any(|code| e.driver_code() == Some(code))
        };
        let what = || {
            format!(
                "enabling device {}'s access to device {}'s memory",
                self.device().ordinal(),
                peer.device().ordinal()
            )
        };
        let enabled = {
            let _current = self.enter()?;
            calls::ctx_enable_peer_access(peer.as_raw())
        };
        match enabled {
            // Enabled before, by another handle of the context or by other code in the process.
            Err(e) if e.driver_code() == Some(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) => {
            }
            Err(e) if refused(&e) => {
                self.peers().set_reachable(peer.device().ordinal(), false);
                return Ok(false);
            }
            Err(e) => return Err(e.context(what())),
            Ok(()) => {}
        }
        if peer.has_memory_pools() {
            let granted = peer.memory_pool().and_then(|pool| {
                let _current = peer.enter()?;
                calls::mem_pool_grant_access(pool, self.device().ordinal() as c_int)
            });
            match granted {
                Err(e) if refused(&e) => {
                    self.peers().set_reachable(peer.device().ordinal(), false);
                    return Ok(false);
                }
                granted => granted.map_err(|e| e.context(what()))?,
            }
        }
        self.peers().set_enabled(peer);
        Ok(true)
    }
}

/// Whether `other`'s device may use `memory` directly, once peer access between the two devices is on
/// ([`Context::enable_peer_access`] both ways): memory of `cuMemAlloc` (which the contexts' peer access covers)
/// or of the crate's pools (opened then) always; memory of another pool (a buffer taken over from other code
/// with `from_raw`) only where its owner opened that pool to the device, as the driver is asked. Copies of
/// memory it may not use go through page-locked memory rather than through the driver's own staging.
fn reachable(memory: &impl DeviceMemory, other: &Context) -> Result<bool> {
    if memory.origin() != Origin::OtherPool {
        return Ok(true);
    }
    calls::pointer_mem_pool(memory.device_ptr())
        .and_then(|pool| calls::mem_pool_can_access(pool, other.device().ordinal() as c_int))
        .map_err(|e| e.context("asking whether a memory pool is open to another device"))
}

impl Stream {
    /// [`Stream::copy`] where `src` and `dst` belong to two contexts, one of them this stream's.
    pub(crate) fn copy_between_devices<T: Pod>(
        &self,
        src: &impl DeviceSource<T>,
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        let (from, to) = (src.owner().clone(), dst.owner().clone());
        if *self.context() != from && *self.context() != to {
            return Err(Error::invalid(format_args!(
                "copying from device {} to device {} on a stream of device {}: use a stream of either; \
                 nothing was enqueued",
                from.device().ordinal(),
                to.device().ordinal(),
                self.context().device().ordinal()
            )));
        }
        let sides = (
            ("the source", src.elements()),
            ("the destination", dst.elements()),
        );
        let Some(bytes) = copy_bytes::<T>("copying between devices", sides.0, sides.1)? else {
            return Ok(());
        };
        let direct = from.enable_peer_access(&to)?
            && to.enable_peer_access(&from)?
            && reachable(src, &to)?
            && reachable(dst, &from)?;
        let copied = if direct {
            self.tracked_as(
                Work::Timed(Category::DeviceCopy, "peer", bytes),
                Some(src.track()),
                Some(dst.track()),
                || {
                    // SAFETY: `bytes` bytes of device memory of each context named (lengths checked, each
                    // buffer's context is its owner), ordered by the trackers, which keep both alive until the
                    // copy has completed.
                    unsafe {
                        calls::memcpy_peer_async(
                            dst.device_ptr(),
                            to.as_raw(),
                            src.device_ptr(),
                            from.as_raw(),
                            bytes,
                            self.as_raw(),
                        )
                    }
                },
            )
        } else {
            self.copy_staged_between_devices(src, dst, bytes)
        };
        copied.map_err(|e| {
            e.context(format_args!(
                "copying {} from device {} to device {}",
                Bytes(bytes),
                from.device().ordinal(),
                to.device().ordinal()
            ))
        })
    }

    /// Copies `bytes` from `src` to `dst`, of two devices that cannot access each other, through two
    /// page-locked staging buffers taken in turn: each chunk downloaded on a stream of `src`'s device, then
    /// uploaded on one of `dst`'s (this stream is one of them, the other a kept one). Every step is
    /// an ordinary tracked copy, so the buffers' trackers order the chunks (a chunk's upload after its
    /// download, the download into a staging buffer after the upload that last read it) and every later use
    /// of `src`, `dst` and the staging buffers; this stream then waits for the last upload, so that the copy
    /// is in its order as any copy on it is.
    fn copy_staged_between_devices(
        &self,
        src: &impl DeviceMemory,
        dst: &mut impl DeviceMemory,
        bytes: usize,
    ) -> Result<()> {
        let (from, to) = (src.owner(), dst.owner());
        let other = staging_stream(if self.context() == from { to } else { from })?;
        let (down, up) = if self.context() == from {
            (self, other.get())
        } else {
            (other.get(), self)
        };
        let chunk = bytes.min(STAGING_CHUNK);
        let staging = staging_buffers(self.context())?;
        for (i, offset) in (0..bytes).step_by(chunk).enumerate() {
            let n = chunk.min(bytes - offset);
            let bounce = &staging.get()[i % 2];
            down.tracked_as(
                Work::Timed(Category::Download, "peer staged", n),
                Some(src.track()),
                Some(PinnedMemory::track(bounce)),
                || {
                    // SAFETY: `n` bytes inside `src` (offset + n <= bytes, its length) and inside the staging
                    // buffer (n <= chunk), ordered by the trackers, which keep both alive until it completes.
                    unsafe {
                        calls::memcpy_dtoh_async(
                            bounce.host_ptr(),
                            src.device_ptr() + offset as u64,
                            n,
                            down.as_raw(),
                        )
                    }
                },
            )?;
            up.tracked_as(
                Work::Timed(Category::Upload, "peer staged", n),
                Some(PinnedMemory::track(bounce)),
                Some(dst.track()),
                || {
                    // SAFETY: as above, into `dst`, after the download into the staging buffer (its tracker).
                    unsafe {
                        calls::memcpy_htod_async(
                            dst.device_ptr() + offset as u64,
                            bounce.host_ptr(),
                            n,
                            up.as_raw(),
                        )
                    }
                },
            )?;
        }
        if !std::ptr::eq(up, self) {
            // The copy wrote `dst` on the other stream: this stream waits for that write, as its own work
            // would have been waited for. Only a wait: no use of `dst` is recorded on this stream, which
            // touches none of it (the crate's earlier work here keeps a mark of its own, closed first).
            self.untracked(|| lock(dst.track()).prepare(&Gpu, self, Access::Read)).map_err(|e| {
                e.context(
                    "making the copying stream wait for the copy, which was enqueued (later work on the \
                     destination still waits for it)",
                )
            })?;
        }
        // The other stream and the staging buffers go back to the spares, the buffers to be written again only
        // after the uploads that read them (their trackers).
        Ok(())
    }
}

/// What the copies between devices without peer access keep for the next such copies: pinning costs about
/// half a second per GiB, and page-locked memory is unpinned only once every device is idle, which a steady
/// load on several devices may never leave it. At most [`MOST_PAIRS`] pairs of staging buffers of
/// [`STAGING_CHUNK`] bytes (portable: they serve copies between any devices) and [`MOST_STREAMS`] streams
/// are kept, for the life of the process, each with a handle of its context.
static KEPT_BUFFERS: Mutex<Vec<[Pinned<u8>; 2]>> = Mutex::new(Vec::new());
static KEPT_STREAMS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());

/// The most pairs of staging buffers kept: as many copies between devices without peer access at a time.
const MOST_PAIRS: usize = 4;
/// The most streams kept: two per device of a host of four.
const MOST_STREAMS: usize = 8;

/// A pair of staging buffers for one copy: a kept one, or one allocated in `context`.
fn staging_buffers(context: &Context) -> Result<Spare<[Pinned<u8>; 2]>> {
    Spare::take(
        &KEPT_BUFFERS,
        MOST_PAIRS,
        |_| true,
        || {
            Ok([
                Pinned::zeroed(context, STAGING_CHUNK)?,
                Pinned::zeroed(context, STAGING_CHUNK)?,
            ])
        },
    )
}

/// A stream of `context` for one copy: a kept one, or a new one.
fn staging_stream(context: &Context) -> Result<Spare<Stream>> {
    let of_context = |stream: &Stream| stream.context() == context;
    Spare::take(&KEPT_STREAMS, MOST_STREAMS, of_context, || {
        Stream::new(context)
    })
}

/// Something taken from a list of kept ones (or made) for one copy, put back when dropped, unless the list
/// holds its most already.
struct Spare<T: 'static> {
    item: Option<T>,
    kept: &'static Mutex<Vec<T>>,
    most: usize,
}

impl<T> Spare<T> {
    /// The first kept item that `fits`, taken out of `kept`, else one `make` makes.
    fn take(
        kept: &'static Mutex<Vec<T>>,
        most: usize,
        fits: impl FnMut(&T) -> bool,
        make: impl FnOnce() -> Result<T>,
    ) -> Result<Spare<T>> {
        let found = {
            let mut list = kept.lock().unwrap_or_else(PoisonError::into_inner);
            let at = list.iter().position(fits);
            at.map(|at| list.swap_remove(at))
        };
        let item = match found {
            Some(item) => item,
            None => make()?,
        };
        Ok(Spare {
            item: Some(item),
            kept,
            most,
        })
    }

    fn get(&self) -> &T {
        self.item
            .as_ref()
            .expect("a spare holds its item until dropped")
    }
}

impl<T> Drop for Spare<T> {
    fn drop(&mut self) {
        let mut list = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(item) = self.item.take()
            && list.len() < self.most
        {
            list.push(item);
        }
    }
}
