//! Fast transfers from and to ordinary (pageable) memory, staged through pinned buffers.
//!
//! The driver's own pageable path copies through one bounce buffer and blocks the calling thread for the whole
//! transfer, so the host copy and the PCIe transfer never overlap and one CPU thread does all the copying. Here
//! the user's memory is split into chunks; worker threads copy chunks into pinned staging buffers (several at
//! once, so the host copy runs at the speed of several threads) while the DMA engine moves the chunks staged
//! before. Each worker owns whole chunks, round-robin. The buffers (two per worker at most) circulate among all
//! threads of the transfer: a buffer is refilled as soon as its previous copy has completed, which its tracker
//! waits for, and a pool with room for fewer buffers still serves, with less overlap.
//!
//! An upload returns once every chunk has been staged: the user's slice is no longer read, and the copies into
//! the device run on the stream like any upload (the destination's tracker records them). A download returns
//! once every chunk has been copied out into the user's slice.
//!
//! # Which path
//! Starting threads and splitting a transfer costs more than it saves on small transfers, so a transfer below
//! [`StagingOptions::chunked_from`] bytes runs on the calling thread. A small one (an upload below 1 MiB, a
//! download below 256 KiB) goes through one staging buffer of its size: an upload is copied into it and returns
//! at once, the copy across the link running on the stream (the driver's pageable path would return only once
//! it has completed); a download crosses the link at its full speed into it, then is copied out. A larger one
//! takes the driver's pageable path ([`Stream::upload_pageable`], [`Stream::download_pageable`]), which stages
//! through a pinned buffer of its own and already overlaps its host copy with the copy across. A transfer that
//! cannot get even its first staging buffer from the pool (the budget is held by buffers in use, or is smaller
//! than one staging buffer) takes the driver's pageable path too: a staged transfer never waits for buffers
//! that others hold.
//!
//! # Chunks
//! A chunk is at most [`StagingOptions::chunk_bytes`], and smaller where the transfer is too short to give every
//! worker two chunks of that size: then every worker has work, and the first copy across the link starts after a
//! small chunk has been staged rather than a large one. Chunk sizes are powers of two, so that transfers of
//! similar sizes reuse the same staging buffers of the pool.
//!
//! # Errors on any thread
//! The threads of one transfer share its staging buffers and whether it has stopped. A thread that meets an
//! error (a driver call, the pool, a refused thread) records it and stops the transfer; the others see that at
//! their next step and stop too, and the first error is returned. No thread can wait for something that cannot
//! come: a thread waits for a staging buffer only while another thread of the transfer holds one (which it gives
//! back, or drops, waking the waiter), and a stop wakes every waiter; the thread that enqueues waits for staged
//! chunks only while a worker can still send one.

mod awaited;
pub(crate) mod circulation;
mod copies;
mod options;
mod transfer;

use bytemuck::Pod;

pub use self::options::{MAX_THREADS, StagingOptions};
// For the fuzz targets' entry points (`fuzzing.rs`).
#[cfg(any(test, fuzzing))]
pub(crate) use self::{copies::check_host_device, options::Plan};
use crate::copy::{DeviceDestination, DeviceSource};
use crate::driver::Stream;
use crate::error::Result;
use crate::memory::PinnedPool;

impl Stream {
    /// Uploads ordinary (pageable) memory into `dst` through pinned staging buffers from `pool`, with the default
    /// [`StagingOptions`] (the paths by size: [`staging`](crate::staging)). Returns once `src` is no longer read,
    /// the copies into `dst` running on this stream; on the driver's path ([`Stream::upload_pageable`]: mid-sized
    /// transfers, or no room in `pool` for one buffer) once they have completed. Never waits for buffers others
    /// hold; `pool` wants room for [`StagingOptions::staging_buffers`], and with less the transfer uses fewer.
    ///
    /// # Errors
    /// Invalid argument if the lengths differ (nothing enqueued) or a worker thread is refused; the pool's (bar
    /// having no room) or the driver's. An error stops every thread: part of `dst` may have been written.
    pub fn upload_staged<T: Pod>(
        &self,
        pool: &PinnedPool,
        src: &[T],
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        self.upload_staged_with(pool, StagingOptions::default(), src, dst)
    }

    /// [`Stream::upload_staged`] with other chunk size, thread count or crossover to chunking.
    ///
    /// # Errors
    /// As [`Stream::upload_staged`], and for a chunk size or thread count of zero.
    pub fn upload_staged_with<T: Pod>(
        &self,
        pool: &PinnedPool,
        options: StagingOptions,
        src: &[T],
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        // The copies into the staging buffers run on the host, now: a replay would not make them.
        self.refuse_in_capture("Stream::upload_staged")?;
        transfer::upload(self, pool, options, src, dst)
    }

    /// Downloads `src` into ordinary (pageable) memory through pinned staging buffers from `pool`, as
    /// [`Stream::upload_staged`] uploads, with the default [`StagingOptions`] (the paths by size:
    /// [`staging`](crate::staging); the driver's is [`Stream::download_pageable`]). Returns once every byte of
    /// `dst` has been written.
    ///
    /// # Errors
    /// As [`Stream::upload_staged`]; after an error part of `dst` may have been written.
    pub fn download_staged<T: Pod>(
        &self,
        pool: &PinnedPool,
        src: &impl DeviceSource<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.download_staged_with(pool, StagingOptions::default(), src, dst)
    }

    /// [`Stream::download_staged`] with other chunk size, thread count or crossover to chunking.
    ///
    /// # Errors
    /// As [`Stream::upload_staged_with`].
    pub fn download_staged_with<T: Pod>(
        &self,
        pool: &PinnedPool,
        options: StagingOptions,
        src: &impl DeviceSource<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.refuse_in_capture("Stream::download_staged")?;
        transfer::download(self, pool, options, src, dst)
    }
}
