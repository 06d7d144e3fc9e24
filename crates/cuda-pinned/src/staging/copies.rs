//! The copies a staged transfer makes, blocking or awaited: each chunk's tracked copy across the link, the
//! host copies between the user's memory and a staging buffer, and the check that both sides match.

#![allow(unsafe_code)]

use bytemuck::Pod;

use crate::copy::{DeviceDestination, DeviceSource, check_lengths};
use crate::driver::calls;
use crate::driver::{Category, Stream};
use crate::error::Result;
use crate::memory::{Pinned, Work};

/// The smallest copy [`stream_copy`] makes with streaming stores.
const STREAMING_FROM: usize = 256 << 10;

/// Enqueues on `stream` the upload of the first `len` bytes of `buffer` into `dst` from byte `offset`, tracked
/// (timed by the stream's ledger as a staged upload). The caller checked that `dst` has them.
pub(super) fn enqueue_upload<T: Pod>(
    stream: &Stream,
    dst: &impl DeviceDestination<T>,
    offset: usize,
    buffer: &Pinned<u8>,
    len: usize,
) -> Result<()> {
    let (base, track) = (dst.device_ptr(), dst.track());
    stream.tracked_as(
        Work::Timed(Category::Upload, "staged", len),
        Some(buffer.track()),
        Some(track),
        || {
            // SAFETY: `len` bytes of the staging buffer (at least a chunk long) and of the destination from
            // `offset` (within it: the lengths were checked); both trackers order the copy and keep both buffers
            // alive until it has run.
            unsafe {
                calls::memcpy_htod_async(
                    base + offset as u64,
                    buffer.host_ptr(),
                    len,
                    stream.as_raw(),
                )
            }
        },
    )
}

/// Enqueues on `stream` the download of `len` bytes of `src` from byte `offset` into `buffer`, tracked (timed
/// as a staged download). The caller checked that `src` has them.
pub(super) fn enqueue_download<T: Pod>(
    stream: &Stream,
    src: &impl DeviceSource<T>,
    offset: usize,
    buffer: &Pinned<u8>,
    len: usize,
) -> Result<()> {
    let (base, track, dst) = (src.device_ptr(), src.track(), buffer.host_ptr());
    stream.tracked_as(
        Work::Timed(Category::Download, "staged", len),
        Some(track),
        Some(buffer.track()),
        || {
            // SAFETY: `len` bytes of the source from `offset` (within it: lengths checked) and of the staging
            // buffer; both trackers order the copy, and the buffer is read only through its accessors, which wait.
            unsafe { calls::memcpy_dtoh_async(dst, base + offset as u64, len, stream.as_raw()) }
        },
    )
}

/// `to.copy_from_slice(from)` with streaming (non-temporal) stores on x86-64, for the chunks of a staged
/// transfer: each byte is written once and next read by the DMA engine (an upload's staging buffer) or by the
/// user later (a download's destination), so there is no point in first reading each destination line into the
/// cache, as ordinary stores do. That read is a third of a plain copy's memory traffic, and the staging
/// threads are bound by memory bandwidth. Ends with a store fence, so the stores are complete (visible to the
/// DMA engine and other threads) when it returns.
pub(super) fn stream_copy(to: &mut [u8], from: &[u8]) {
    assert_eq!(
        to.len(),
        from.len(),
        "staging: copying between unequal chunks"
    );
    // A small copy fits in the cache, where its next reader finds it: plain stores.
    if to.len() < STREAMING_FROM {
        return to.copy_from_slice(from);
    }
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Plain stores up to the first 16-byte boundary of `to`, streaming stores for the whole 16-byte blocks
        // after it, plain stores for the tail.
        let head = to.as_ptr().align_offset(16).min(to.len());
        let (to_head, to_rest) = to.split_at_mut(head);
        let (from_head, from_rest) = from.split_at(head);
        to_head.copy_from_slice(from_head);
        let blocks = to_rest.len() / 16;
        let (d, s) = (
            to_rest.as_mut_ptr().cast::<__m128i>(),
            from_rest.as_ptr().cast::<__m128i>(),
        );
        for b in 0..blocks {
            // SAFETY: b < blocks, so both 16-byte accesses are inside the slices (of equal length); `d` is 16-byte
            // aligned (`head` aligned it), as the streaming store requires; the load takes any alignment. SSE2
            // is part of x86-64.
            unsafe { _mm_stream_si128(d.add(b), _mm_loadu_si128(s.add(b))) };
        }
        to_rest[blocks * 16..].copy_from_slice(&from_rest[blocks * 16..]);
        // SAFETY: a fence has no preconditions; it completes the streaming stores above, which are otherwise
        // weakly ordered, before this thread hands the chunk on.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    to.copy_from_slice(from);
}

/// That the host and device sides of a transfer have the same number of elements ([`check_lengths`]).
///
/// # Errors
/// An invalid-argument error naming both lengths where they differ.
pub(crate) fn check_host_device(what: &str, host: usize, device: usize) -> Result<()> {
    check_lengths(
        what,
        ("the host memory", host),
        ("the device memory", device),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copies_copy_every_byte_whatever_the_alignment() {
        let base = STREAMING_FROM;
        let source: Vec<u8> = (0..base as u32 + 300).map(|i| (i * 7 + 3) as u8).collect();
        for from_offset in 0..17 {
            for to_offset in 0..17 {
                for len in [0, 1, 15, 100, 255]
                    .into_iter()
                    .chain([0, 1, 15, 16, 17, 33, 255].map(|n| base + n))
                {
                    let from = &source[from_offset..from_offset + len];
                    let mut target = vec![0xAAu8; base + 300];
                    stream_copy(&mut target[to_offset..to_offset + len], from);
                    assert_eq!(&target[to_offset..to_offset + len], from);
                    assert!(target[..to_offset].iter().all(|&b| b == 0xAA));
                    assert!(target[to_offset + len..].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }
}
