//! Staged transfers as futures, for async code: ordinary (pageable) memory moved through two pinned buffers of
//! a pool, chunk by chunk, with every wait awaited (a buffer's previous copy, a chunk's download, device work on
//! blocks given back to the pool), so that no executor thread blocks. The copies between the user's memory and
//! the staging buffers run on the polling thread, one chunk per step, and only inside a poll: the future
//! borrows the user's memory, and a forgotten future never touches it again. As the blocking forms, a transfer
//! never waits for buffers that others hold: it takes its buffers waiting only for device work on blocks given
//! back, and goes on with one where the pool has room for only one. The transfers across the link are the
//! tracked copies of the blocking forms (`copies.rs`).

use bytemuck::Pod;

use super::StagingOptions;
use super::copies::{check_host_device, enqueue_download, enqueue_upload, stream_copy};
use crate::copy::{DeviceDestination, DeviceSource};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::future::Resolved;
use crate::memory::{Pinned, PinnedPool};
use crate::units::Bytes;

/// The chunk of a transfer through `pool`: the default chunk size, or a quarter of the pool's budget where that
/// is smaller (two buffers fit, with the size classes' rounding), in whole pages.
fn chunk_for(pool: &PinnedPool) -> usize {
    const PAGE: usize = 4096;
    let quarter = pool.stats().budget / 4 / PAGE * PAGE;
    StagingOptions::default().chunk_bytes.min(quarter.max(PAGE))
}

/// The staging buffers of one transfer: up to two, taken from the pool as the transfer needs them.
struct Buffers<'p> {
    pool: &'p PinnedPool,
    chunk: usize,
    held: Vec<Pinned<u8>>,
}

impl Buffers<'_> {
    /// Makes sure a buffer for chunk `index` is held: a new one while fewer than two are held and the pool has
    /// room (waiting only for device work on blocks given back), else one held (the one the transfer used two
    /// chunks ago, or the only one). Returns where it is in `held`.
    async fn take(&mut self, index: usize) -> Result<usize> {
        if self.held.len() < 2 && self.held.len() <= index {
            match self.pool.alloc_async_after_pending::<u8>(self.chunk).await {
                Ok(buffer) => self.held.push(buffer),
                Err(Error::PoolExhausted { .. }) if !self.held.is_empty() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(index % self.held.len())
    }
}

impl Stream {
    /// [`Stream::upload_staged`] as a future, for async code: resolves once `src` is no longer read (every chunk
    /// copied into a staging buffer and its upload enqueued on this stream). Two buffers of `pool` (one where it
    /// has room for one only) carry the chunks (4 MiB, the default of [`StagingOptions`], or a quarter of the
    /// pool's budget where that is smaller); each chunk's copy into a buffer runs on the polling thread, once
    /// that buffer's previous upload has completed (awaited), so the copy of one chunk overlaps the upload of
    /// the other. Dropping the future stops the transfer between chunks: part of `dst` may have been written.
    ///
    /// # Errors
    /// An invalid-argument error if the lengths differ or the stream and `dst` are of different contexts, with
    /// nothing enqueued; [`Error::PoolExhausted`] if the pool has no room for one buffer even once device work
    /// on the blocks given back to it completes; the driver's; an invalid-argument error for a poll after it
    /// resolved.
    pub fn upload_staged_async<T: Pod, D: DeviceDestination<T>>(
        &self,
        pool: &PinnedPool,
        src: &[T],
        dst: &mut D,
    ) -> impl std::future::Future<Output = Result<()>> {
        Resolved::new("Stream::upload_staged_async", async move {
            self.refuse_in_capture("Stream::upload_staged_async")?;
            self.check_context(&*dst)?;
            check_host_device("staged upload", src.len(), dst.elements())?;
            let bytes: &[u8] = bytemuck::cast_slice(src);
            let context = |e: Error| {
                e.context(format_args!(
                    "uploading {} staged through pinned memory",
                    Bytes(bytes.len())
                ))
            };
            let chunk = chunk_for(pool);
            let mut buffers = Buffers {
                pool,
                chunk,
                held: Vec::with_capacity(2),
            };
            for (index, part) in bytes.chunks(chunk).enumerate() {
                let at = buffers.take(index).await.map_err(context)?;
                let buffer = &mut buffers.held[at];
                let staged = buffer.writable().await.map_err(context)?;
                stream_copy(&mut staged[..part.len()], part);
                enqueue_upload(self, &*dst, index * chunk, buffer, part.len()).map_err(context)?;
            }
            Ok(())
        })
    }

    /// [`Stream::download_staged`] as a future, for async code: resolves once every byte of `dst` has been
    /// written. Two buffers of `pool` (one where it has room for one only) carry the chunks: while one chunk's
    /// download is awaited, the next one's is enqueued; each is copied out into `dst` on the polling thread once
    /// its download has completed. Dropping the future stops the transfer between chunks: part of `dst` may have
    /// been written.
    ///
    /// # Errors
    /// As [`Stream::upload_staged_async`].
    pub fn download_staged_async<T: Pod, S: DeviceSource<T>>(
        &self,
        pool: &PinnedPool,
        src: &S,
        dst: &mut [T],
    ) -> impl std::future::Future<Output = Result<()>> {
        Resolved::new("Stream::download_staged_async", async move {
            self.refuse_in_capture("Stream::download_staged_async")?;
            self.check_context(src)?;
            check_host_device("staged download", dst.len(), src.elements())?;
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
            let total = bytes.len();
            let context = |e: Error| {
                e.context(format_args!(
                    "downloading {} staged through pinned memory",
                    Bytes(total)
                ))
            };
            let chunk = chunk_for(pool);
            let chunks = total.div_ceil(chunk);
            let mut buffers = Buffers {
                pool,
                chunk,
                held: Vec::with_capacity(2),
            };
            let range = |index: usize| index * chunk..((index + 1) * chunk).min(total);
            // Chunk `next` is enqueued once its buffer is free (its copy-out done), chunk `out` copied out once its
            // download is: with two buffers, one chunk ahead.
            let (mut next, mut out) = (0, 0);
            while out < chunks {
                while next < chunks && next < out + 2 {
                    let at = buffers.take(next).await.map_err(context)?;
                    if next > out && at == out % buffers.held.len() {
                        // One buffer only: it holds chunk `out`, not yet copied out.
                        break;
                    }
                    let buffer = &mut buffers.held[at];
                    buffer.writable().await.map_err(context)?;
                    let part = range(next);
                    enqueue_download(self, src, part.start, buffer, part.len()).map_err(context)?;
                    next += 1;
                }
                let buffer = &buffers.held[out % buffers.held.len()];
                let data = buffer.readable().await.map_err(context)?;
                let part = range(out);
                stream_copy(&mut bytes[part.clone()], &data[..part.len()]);
                out += 1;
            }
            Ok(())
        })
    }
}
