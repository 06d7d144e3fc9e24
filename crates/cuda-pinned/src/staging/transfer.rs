//! The blocking staged transfers: worker threads copy chunks between the user's memory and staging buffers
//! while the calling thread enqueues each chunk's copy across the link.

use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};

use bytemuck::Pod;

use super::circulation::{Circulation, Lent, StopOnPanic, join_all};
use super::copies::{check_host_device, enqueue_download, enqueue_upload, stream_copy};
use super::options::{ONE_BUFFER_DOWNLOAD_BELOW, ONE_BUFFER_UPLOAD_BELOW, StagingOptions};
use crate::copy::{DeviceDestination, DeviceSource};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{Pinned, PinnedPool};
use crate::units::Bytes;

/// A chunk handed between a worker and the enqueueing thread, with the staging buffer that holds it.
struct Staged<'c> {
    chunk: usize,
    buffer: Lent<'c, Pinned<u8>>,
}

/// Uploads `src` into `dst` on `stream`, staged through buffers from `pool` (or through the driver's pageable
/// path: see the `staging` module's docs). Returns once `src` is no longer read; the device copies run on `stream`.
pub(super) fn upload<T: Pod>(
    stream: &Stream,
    pool: &PinnedPool,
    options: StagingOptions,
    src: &[T],
    dst: &mut impl DeviceDestination<T>,
) -> Result<()> {
    let plan = options.plan(size_of_val(src))?;
    stream.check_context(dst)?;
    check_host_device("staged upload", src.len(), dst.elements())?;
    let bytes: &[u8] = bytemuck::cast_slice(src);
    if bytes.is_empty() {
        return Ok(());
    }
    let context = |e: Error| {
        e.context(format_args!(
            "uploading {} staged through pinned memory",
            Bytes(bytes.len())
        ))
    };
    let enqueue = |offset: usize, buffer: &Pinned<u8>, len: usize| {
        enqueue_upload(stream, &*dst, offset, buffer, len)
    };
    if bytes.len() < ONE_BUFFER_UPLOAD_BELOW && bytes.len() < options.chunked_from {
        // One buffer of the transfer's size, if the pool has one (never waiting), copied into on this thread and
        // uploaded from; the call returns as soon as the bytes are copied, where the driver's path would return
        // only once the copy has completed. Else the driver's path.
        return match pool.try_alloc::<u8>(bytes.len()) {
            Ok(mut buffer) => {
                // A block the pool hands out has no device work in flight: this does not wait.
                stream_copy(buffer.as_mut_slice().map_err(context)?, bytes);
                enqueue(0, &buffer, bytes.len()).map_err(context)
            }
            Err(Error::PoolExhausted { .. }) => stream.upload_pageable(src, dst),
            Err(e) => Err(context(e)),
        };
    }
    if bytes.len() < options.chunked_from {
        // The driver's path stages through a pinned buffer of its own, overlapping its copy in with the copy
        // across, where one buffer copied into on one thread is as slow as that copy.
        return stream.upload_pageable(src, dst);
    }
    // May wait for the pool's blocks whose device work is pending (that wait ends by itself), never for buffers
    // others hold: with no room for one staging buffer the transfer takes the driver's path instead.
    let first = match pool.alloc_after_pending::<u8>(plan.buffer_bytes()) {
        Ok(buffer) => buffer,
        Err(Error::PoolExhausted { .. }) => return stream.upload_pageable(src, dst),
        Err(e) => return Err(context(e)),
    };
    let result = if plan.chunks() == 1 {
        // One chunk: no threads to start, no overlap to gain.
        let mut buffer = first;
        buffer
            .as_mut_slice()
            .map(|staging| staging[..bytes.len()].copy_from_slice(bytes))
            .and_then(|()| enqueue(0, &buffer, bytes.len()))
    } else {
        let more = || pool.try_alloc::<u8>(plan.buffer_bytes());
        let circulation = Circulation::new(first, plan.buffers())
            .preferring_idle(|buffer| Ok(buffer.try_as_mut_slice()?.is_some()));
        std::thread::scope(|scope| {
            let _stop = StopOnPanic(&circulation);
            let (ready_tx, ready_rx) = mpsc::channel::<Staged<'_>>();
            let mut workers = Vec::with_capacity(plan.workers());
            for worker in 0..plan.workers() {
                let (ready, circulation, more) = (ready_tx.clone(), &circulation, &more);
                let work = move || {
                    let _stop = StopOnPanic(circulation);
                    for chunk in plan.chunks_of(worker) {
                        let Some(mut buffer) = circulation.take(more) else {
                            return;
                        };
                        let part = &bytes[plan.chunk(chunk)];
                        // Waits for the buffer's previous upload to have read it.
                        match buffer.as_mut_slice() {
                            Ok(staging) => stream_copy(&mut staging[..part.len()], part),
                            Err(e) => return circulation.stop(Some(e)),
                        }
                        if ready.send(Staged { chunk, buffer }).is_err() {
                            return; // the enqueueing thread has stopped the transfer
                        }
                    }
                };
                match spawn_worker(scope, worker, work) {
                    Ok(handle) => workers.push(handle),
                    Err(e) => {
                        circulation.stop(Some(e));
                        break;
                    }
                }
            }
            drop(ready_tx);
            // Enqueue each staged chunk as it arrives (in any order: the chunks' device ranges are disjoint) and
            // put its buffer back in circulation. The loop ends when every worker has ended (each ends after its
            // last chunk, or at its next step once the transfer has stopped) or at a stop.
            for Staged { chunk, buffer } in &ready_rx {
                if circulation.stopped() {
                    break;
                }
                let range = plan.chunk(chunk);
                if let Err(e) = enqueue(range.start, &buffer, range.len()) {
                    circulation.stop(Some(e));
                    break;
                }
                circulation.give_back(buffer.into_inner());
            }
            // Chunks staged and not enqueued: their buffers go back to the pool.
            drop(ready_rx);
            join_all(workers);
        });
        circulation.result()
    };
    result.map_err(context)
}

/// Downloads `src` into `dst` on `stream`, staged through buffers from `pool` (or through the driver's pageable
/// path: see the `staging` module's docs). Returns once every byte of `dst` has been written.
pub(super) fn download<T: Pod>(
    stream: &Stream,
    pool: &PinnedPool,
    options: StagingOptions,
    src: &impl DeviceSource<T>,
    dst: &mut [T],
) -> Result<()> {
    let total = size_of_val(dst);
    let plan = options.plan(total)?;
    stream.check_context(src)?;
    check_host_device("staged download", dst.len(), src.elements())?;
    if total == 0 {
        return Ok(());
    }
    let context = |e: Error| {
        e.context(format_args!(
            "downloading {} staged through pinned memory",
            Bytes(total)
        ))
    };
    let enqueue = |offset: usize, buffer: &Pinned<u8>, len: usize| {
        enqueue_download(stream, src, offset, buffer, len)
    };
    if total < ONE_BUFFER_DOWNLOAD_BELOW.min(options.chunked_from) {
        // One buffer of the transfer's size, if the pool has one (never waiting): the copy across the link at its
        // full speed, then out on this thread. Else the driver's path.
        return match pool.try_alloc::<u8>(total) {
            Ok(buffer) => enqueue(0, &buffer, total)
                .and_then(|()| buffer.as_slice())
                .map(|data| stream_copy(bytemuck::cast_slice_mut(dst), data))
                .map_err(context),
            Err(Error::PoolExhausted { .. }) => stream.download_pageable(src, dst),
            Err(e) => Err(context(e)),
        };
    }
    if total < options.chunked_from {
        // The driver's path does what one staging buffer would, with the copy out overlapping the copy across.
        return stream.download_pageable(src, dst);
    }
    // As for an upload: no room for one staging buffer means the driver's path.
    let first = match pool.alloc_after_pending::<u8>(plan.buffer_bytes()) {
        Ok(buffer) => buffer,
        Err(Error::PoolExhausted { .. }) => return stream.download_pageable(src, dst),
        Err(e) => return Err(context(e)),
    };
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
    let result = if plan.chunks() == 1 {
        // One chunk: no threads to start, no overlap to gain.
        let buffer = first;
        enqueue(0, &buffer, total).and_then(|()| {
            buffer
                .as_slice()
                .map(|data| bytes.copy_from_slice(&data[..total]))
        })
    } else {
        // Each worker copies out its chunks, in order. `chunks_mut` cuts the same chunks as `plan.chunk`.
        let mut parts: Vec<Vec<&mut [u8]>> = (0..plan.workers()).map(|_| Vec::new()).collect();
        for (chunk, part) in bytes.chunks_mut(plan.chunk_bytes()).enumerate() {
            parts[plan.worker_of(chunk)].push(part);
        }
        let more = || pool.try_alloc::<u8>(plan.buffer_bytes());
        let circulation = Circulation::new(first, plan.buffers());
        std::thread::scope(|scope| {
            let _stop = StopOnPanic(&circulation);
            let mut to_workers = Vec::with_capacity(plan.workers());
            let mut workers = Vec::with_capacity(plan.workers());
            for (worker, mine) in parts.into_iter().enumerate() {
                let (tx, rx) = mpsc::channel::<Staged<'_>>();
                let circulation = &circulation;
                let work = move || {
                    let _stop = StopOnPanic(circulation);
                    // Each chunk comes in order, in the buffer its download was enqueued into. The loop ends after
                    // the last, or when the enqueueing thread stops (and drops its end of the channel).
                    for (part, Staged { buffer, .. }) in mine.into_iter().zip(rx) {
                        if circulation.stopped() {
                            return;
                        }
                        // Waits for the chunk's download to have completed.
                        match buffer.as_slice() {
                            Ok(data) => stream_copy(part, &data[..part.len()]),
                            Err(e) => return circulation.stop(Some(e)),
                        }
                        circulation.give_back(buffer.into_inner());
                    }
                };
                match spawn_worker(scope, worker, work) {
                    Ok(handle) => {
                        workers.push(handle);
                        to_workers.push(tx);
                    }
                    Err(e) => {
                        circulation.stop(Some(e));
                        break;
                    }
                }
            }
            // Enqueue the chunks in order, each into a staging buffer, and hand each to its worker. `take` waits
            // for a buffer only while a worker holds one, and returns `None` once the transfer has stopped.
            for chunk in 0..plan.chunks() {
                let Some(buffer) = circulation.take(&more) else {
                    break;
                };
                let range = plan.chunk(chunk);
                if let Err(e) = enqueue(range.start, &buffer, range.len()) {
                    circulation.stop(Some(e));
                    break;
                }
                let to = to_workers.get(plan.worker_of(chunk));
                if to.is_none_or(|to| to.send(Staged { chunk, buffer }).is_err()) {
                    // The worker has stopped the transfer (or was never started, which stopped it).
                    debug_assert!(circulation.stopped());
                    break;
                }
            }
            // Ends the workers' loops once they have copied out what they were sent.
            drop(to_workers);
            join_all(workers);
        });
        circulation.result()
    };
    result.map_err(context)
}

/// Starts worker thread `worker` of a transfer in `scope`.
///
/// # Errors
/// An invalid-argument error saying what to do when the system refuses the thread.
fn spawn_worker<'scope>(
    scope: &'scope Scope<'scope, '_>,
    worker: usize,
    work: impl FnOnce() + Send + 'scope,
) -> Result<ScopedJoinHandle<'scope, ()>> {
    std::thread::Builder::new()
        .name(format!("cuda-pinned-staging-{worker}"))
        .spawn_scoped(scope, work)
        .map_err(|e| refused_thread(worker, &e))
}

/// The error for a worker thread the system refused to start.
fn refused_thread(worker: usize, error: &std::io::Error) -> Error {
    Error::invalid(format_args!(
        "starting staging worker thread {worker}: {error}; ask for fewer threads \
         (StagingOptions::threads) or raise the process's thread limit"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_thread_says_what_to_do() {
        let e = refused_thread(
            3,
            &std::io::Error::other("Resource temporarily unavailable"),
        );
        let message = e.to_string();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert!(
            message.contains("thread 3")
                && message.contains("Resource temporarily unavailable")
                && message.contains("StagingOptions::threads"),
            "{message}"
        );
    }
}
