//! Staged transfers as futures, for async code: ordinary (pageable) memory moved through pinned buffers of a
//! pool, chunk by chunk, with every wait awaited (room in the pool, a chunk's download), so that no executor
//! thread blocks. The copies between the user's memory and the staging buffers run on the polling thread, one
//! chunk per step, and only inside a poll: the future borrows the user's memory, and a forgotten future never
//! touches it again. The transfers across the link are the tracked copies of the blocking forms (`mod.rs`).

use std::collections::VecDeque;

use bytemuck::Pod;

use super::{StagingOptions, check_host_device, enqueue_download, enqueue_upload, stream_copy};
use crate::copy::{DeviceDestination, DeviceSource};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{Pinned, PinnedPool};
use crate::units::Bytes;

impl Stream {
    /// [`Stream::upload_staged`] as a future, for async code: resolves once `src` is no longer read (every chunk
    /// copied into a staging buffer and its upload enqueued on this stream), having waited for room in `pool`
    /// by awaiting it ([`PinnedPool::alloc_async`]), never by blocking. The copy of each chunk (4 MiB, the
    /// default of [`StagingOptions`]) into its staging buffer runs on the polling thread; the next chunk's copy
    /// overlaps the upload of the one before. Dropping the future stops the transfer between chunks: part of
    /// `dst` may have been written.
    ///
    /// # Errors
    /// An invalid-argument error if the lengths differ or the stream and `dst` are of different contexts, with
    /// nothing enqueued; the pool's (a chunk larger than its budget, its deadline) and the driver's.
    pub async fn upload_staged_async<T: Pod, D: DeviceDestination<T>>(
        &self,
        pool: &PinnedPool,
        src: &[T],
        dst: &mut D,
    ) -> Result<()> {
        self.check_context(&*dst)?;
        check_host_device("staged upload", src.len(), dst.elements())?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let context = |e: Error| {
            e.context(format_args!(
                "uploading {} staged through pinned memory",
                Bytes(bytes.len())
            ))
        };
        let chunk = StagingOptions::default().chunk_bytes;
        let mut offset = 0;
        while offset < bytes.len() {
            let len = chunk.min(bytes.len() - offset);
            let mut buffer = pool.alloc_async::<u8>(len).await.map_err(context)?;
            // A block the pool hands out has no device work in flight: this does not wait.
            stream_copy(
                buffer.as_mut_slice().map_err(context)?,
                &bytes[offset..offset + len],
            );
            enqueue_upload(self, &*dst, offset, &buffer, len).map_err(context)?;
            offset += len;
        }
        Ok(())
    }

    /// [`Stream::download_staged`] as a future, for async code: resolves once every byte of `dst` has been
    /// written. Two chunks are in flight at a time where the pool has room for them: while one's download is
    /// awaited, the next is enqueued; each is copied out into `dst` on the polling thread once its download has
    /// completed. Dropping the future stops
    /// the transfer between chunks: part of `dst` may have been written.
    ///
    /// # Errors
    /// As [`Stream::upload_staged_async`].
    pub async fn download_staged_async<T: Pod, S: DeviceSource<T>>(
        &self,
        pool: &PinnedPool,
        src: &S,
        dst: &mut [T],
    ) -> Result<()> {
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
        let chunk = StagingOptions::default().chunk_bytes;
        let mut in_flight: VecDeque<(usize, Pinned<u8>)> = VecDeque::with_capacity(2);
        let mut offset = 0;
        while offset < total || !in_flight.is_empty() {
            if offset < total && in_flight.len() < 2 {
                let len = chunk.min(total - offset);
                // With a chunk in flight, a second only if the pool has room now: the room it would wait
                // for may be the chunk this transfer holds.
                let buffer = if in_flight.is_empty() {
                    Some(pool.alloc_async::<u8>(len).await.map_err(context)?)
                } else {
                    match pool.try_alloc::<u8>(len) {
                        Ok(buffer) => Some(buffer),
                        Err(Error::PoolExhausted { .. }) => None,
                        Err(e) => return Err(context(e)),
                    }
                };
                if let Some(buffer) = buffer {
                    enqueue_download(self, src, offset, &buffer, len).map_err(context)?;
                    in_flight.push_back((offset, buffer));
                    offset += len;
                    continue;
                }
            }
            let (at, buffer) = in_flight.pop_front().expect("a chunk is in flight");
            let data = buffer.readable().await.map_err(context)?;
            stream_copy(&mut bytes[at..at + data.len()], data);
        }
        Ok(())
    }
}
