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

use std::ops::{Deref, DerefMut, Range};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError, mpsc};
use std::thread::{Scope, ScopedJoinHandle};

use bytemuck::Pod;

use crate::copy::{DeviceDestination, DeviceSource, check_lengths};
use crate::driver::calls;
use crate::driver::{Category, Stream};
use crate::error::{Error, Result};
use crate::memory::{Pinned, PinnedPool, Work};
use crate::units::Bytes;

/// The most worker threads one staged transfer starts, whatever [`StagingOptions::threads`] asks. One thread
/// copies about 8 GB/s into pinned memory, so a handful already match a PCIe link (on a 16-core H100 host, 16
/// threads were no faster than 8); the bound keeps a mistaken thread count from starting thousands of threads,
/// each with its stack and two staging buffers.
pub const MAX_THREADS: usize = 64;

/// Chunks per worker that the chunk size is adapted for: as many as a worker has buffers, so that its two
/// buffers alternate (the first chunk crosses the link while the second is staged) and yet a transfer cut this
/// way never waits for its own copies to free a buffer: an upload queued behind other work on its stream
/// returns without waiting for that work. More chunks would start the first copy earlier still, but then every
/// such upload would wait for the stream.
const CHUNKS_PER_WORKER: usize = BUFFERS_PER_WORKER;

/// The smallest chunk a transfer adapts to: copying 256 KiB takes tens of microseconds, against a few per chunk
/// of overhead. A smaller [`StagingOptions::chunk_bytes`] is still honoured.
const MIN_CHUNK: usize = 256 << 10;

/// Staging buffers in circulation per worker: one being filled or drained while the other's chunk is on its way
/// across the link.
const BUFFERS_PER_WORKER: usize = 2;

/// How a staged transfer splits its work: `StagingOptions::default().chunk_bytes(1 << 20).threads(4)`. The
/// fields can be read; they are set through the methods of the same names, so that options added later break
/// no one's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StagingOptions {
    /// The most bytes per chunk (and per staging buffer). Default 4 MiB. A transfer too short to give every
    /// worker two chunks of this size uses smaller ones (a power of two, at least 256 KiB).
    pub chunk_bytes: usize,
    /// Worker threads copying between the user's memory and the staging buffers. Default: one per core, at most
    /// 8. A transfer starts no more than [`MAX_THREADS`], and no more than it has chunks.
    pub threads: usize,
    /// Transfers of at least this many bytes are split into chunks on worker threads; smaller ones go through
    /// one staging buffer of their size on the calling thread, where starting threads would cost more than they
    /// save. Default 16 MiB, measured on an H100 host (PCIe gen 5 x16, 16 cores, pinbench's "chunked" column):
    /// chunked transfers ran at 0.65x the driver's pageable path at 1 MiB and 0.89x-1.05x at 4 MiB, against
    /// 1.78x-2.72x at 16 MiB; other machines may cross over elsewhere: measure with pinbench. 0 chunks every
    /// transfer; `usize::MAX` none.
    pub chunked_from: usize,
}

/// The defaults were measured on an H100 host with 16 cores (pinbench `--staging-sweep`, 256 MiB): 4 MiB chunks
/// with 8 threads gave 3.65x the driver's pageable upload and 2.42x its download; 8 MiB chunks with 4 threads
/// gave 2.38x and 1.56x. The crossover to chunking is where the same kind of host's chunked transfers overtook the
/// driver's pageable path (between 4 and 16 MiB, both directions).
impl Default for StagingOptions {
    fn default() -> StagingOptions {
        // `available_parallelism` reads the process's CPU quota from files (about 10 us, longer than a small
        // pageable copy takes), and `upload_staged` asks for the defaults on every call: count once.
        static CORES: OnceLock<usize> = OnceLock::new();
        let cores = *CORES
            .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
        StagingOptions {
            chunk_bytes: 4 << 20,
            threads: cores.clamp(1, 8),
            chunked_from: 16 << 20,
        }
    }
}

impl StagingOptions {
    /// The most bytes per chunk (see the field).
    pub const fn chunk_bytes(mut self, bytes: usize) -> StagingOptions {
        self.chunk_bytes = bytes;
        self
    }

    /// Worker threads (see the field).
    pub const fn threads(mut self, threads: usize) -> StagingOptions {
        self.threads = threads;
        self
    }

    /// The size from which transfers are chunked on worker threads (see the field).
    pub const fn chunked_from(mut self, bytes: usize) -> StagingOptions {
        self.chunked_from = bytes;
        self
    }

    fn check(&self) -> Result<()> {
        if self.chunk_bytes == 0 || self.threads == 0 {
            return Err(Error::invalid(format_args!(
                "staging needs a chunk size and a thread count above zero, not {} bytes and {} threads",
                self.chunk_bytes, self.threads
            )));
        }
        Ok(())
    }

    /// How a staged transfer of `total` bytes splits into chunks and workers with these options.
    ///
    /// The chunk size is adapted to the transfer: the size that gives each thread [`CHUNKS_PER_WORKER`] chunks,
    /// rounded up to a power of two, at least [`MIN_CHUNK`], at most `chunk_bytes`. Powers of two, because the
    /// pool reuses a block only for a request of its size class, and pinning a new one costs about 0.5 s/GiB:
    /// transfers of similar sizes then ask for the same few sizes of buffer.
    ///
    /// # Errors
    /// An invalid-argument error for a chunk size or thread count of zero.
    pub(crate) fn plan(&self, total: usize) -> Result<Plan> {
        self.check()?;
        let threads = self.threads.min(MAX_THREADS);
        // `threads * CHUNKS_PER_WORKER` is at most 128; a `total` too large for a power of two above it (only
        // in arithmetic: no slice is that long) keeps `chunk_bytes`.
        let even = total.div_ceil(threads * CHUNKS_PER_WORKER);
        let chunk_bytes = even
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX)
            .max(MIN_CHUNK)
            .min(self.chunk_bytes);
        let chunks = total.div_ceil(chunk_bytes);
        Ok(Plan {
            total,
            chunk_bytes,
            chunks,
            workers: threads.min(chunks),
        })
    }

    /// The staging buffers a staged transfer of `bytes` with these options takes from its pool at most: how many,
    /// and the bytes each one asks the pool for: below [`StagingOptions::chunked_from`], one buffer of `bytes` below
    /// 1 MiB (an upload; a download takes one below 256 KiB) and none from there (the driver's path); `(0, 0)`
    /// for an empty transfer. For sizing a pool's budget, or pinning its buffers ahead of time.
    ///
    /// # Errors
    /// An invalid-argument error for a chunk size or thread count of zero.
    pub fn staging_buffers(&self, bytes: usize) -> Result<(usize, usize)> {
        let plan = self.plan(bytes)?;
        if bytes == 0 {
            return Ok((0, 0));
        }
        if bytes < self.chunked_from {
            return Ok(if bytes < ONE_BUFFER_UPLOAD_BELOW {
                (1, bytes)
            } else {
                (0, 0)
            });
        }
        Ok((plan.buffers(), plan.buffer_bytes()))
    }
}

/// How a staged transfer of `total` bytes is split: chunk `i` is bytes `i * chunk_bytes..` of at most
/// `chunk_bytes` (only the last is shorter), and worker `w` handles chunks `w, w + workers, w + 2 * workers, ..`.
/// Chunks are in bytes, not elements: a chunk size that is not a multiple of the element size splits elements
/// between chunks, which the byte copies do not mind. Pure arithmetic, with no overflow for any `total`
/// (fuzzed by `fuzz/fuzz_targets/ranges.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    total: usize,
    chunk_bytes: usize,
    chunks: usize,
    /// At most `chunks` (so that every worker has a chunk) and [`MAX_THREADS`]; 0 only for an empty transfer.
    workers: usize,
}

impl Plan {
    /// The bytes of the transfer (for the fuzz target's checks).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The most bytes of a chunk: the adapted chunk size, at most the options' `chunk_bytes`.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The number of chunks: `total / chunk_bytes`, rounded up.
    pub(crate) fn chunks(&self) -> usize {
        self.chunks
    }

    /// The number of worker threads: the thread count asked for, but no more than [`MAX_THREADS`] and than there
    /// are chunks.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// The most staging buffers in circulation: two per worker, and no more than there are chunks.
    pub(crate) fn buffers(&self) -> usize {
        (BUFFERS_PER_WORKER * self.workers).min(self.chunks)
    }

    /// The bytes of each staging buffer: a chunk, or the whole transfer where it is shorter (a 16 KiB transfer
    /// takes a 16 KiB buffer).
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.chunk_bytes.min(self.total)
    }

    /// The bytes of chunk `index`; empty, at `total`, for an index past the last chunk.
    pub(crate) fn chunk(&self, index: usize) -> Range<usize> {
        // `start <= total`, so neither the subtraction nor the sum can overflow.
        let start = index.saturating_mul(self.chunk_bytes).min(self.total);
        start..start + self.chunk_bytes.min(self.total - start)
    }

    /// The worker that handles chunk `index` (below [`Plan::chunks`]).
    pub(crate) fn worker_of(&self, index: usize) -> usize {
        // `max(1)`: an empty transfer has no workers, and no chunk to ask about.
        index % self.workers.max(1)
    }

    /// The chunks worker `worker` handles, in order; none for a worker past the last.
    pub(crate) fn chunks_of(&self, worker: usize) -> impl Iterator<Item = usize> + use<> {
        let end = if worker < self.workers {
            self.chunks
        } else {
            0
        };
        (worker..end).step_by(self.workers.max(1))
    }
}

/// A chunk handed between a worker and the enqueueing thread, with the staging buffer that holds it.
struct Staged<'c> {
    chunk: usize,
    buffer: Lent<'c, Pinned<u8>>,
}

/// Uploads `src` into `dst` on `stream`, staged through buffers from `pool` (or through the driver's pageable
/// path: see the module docs). Returns once `src` is no longer read; the device copies run on `stream`.
fn upload<T: Pod>(
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
/// path: see the module docs). Returns once every byte of `dst` has been written.
fn download<T: Pod>(
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

/// Waits for every worker to end, then passes on the first panic among them, if any.
fn join_all(workers: Vec<ScopedJoinHandle<'_, ()>>) {
    let mut panic = None;
    for worker in workers {
        if let Err(payload) = worker.join() {
            panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
}

/// Uploads below this many bytes (and below [`StagingOptions::chunked_from`]) go through one staging buffer on
/// the calling thread, which returns once it is copied into; larger ones up to the crossover take the driver's
/// pageable path. Measured on an H100 host (pinbench): one buffer ran at 1.18x-2.05x the driver's path from 4 KiB
/// to 256 KiB and 0.77x-0.95x at 4 MiB, where the copy in on one thread is the bound; at 1 MiB it ran at 0.99x-1.55x
/// in two runs, and in batches taken in turns with the driver's path at 0.88x in one run of three on an H100 and at
/// 0.97x-1.31x on 2 x H200 (pinbench's turns, docs/performance.md): too close to call, so 1 MiB takes the
/// driver's path.
const ONE_BUFFER_UPLOAD_BELOW: usize = 1 << 20;

/// Downloads below this many bytes (and below [`StagingOptions::chunked_from`]) go through one staging buffer
/// on the calling thread; from it up to the crossover, through the driver's pageable path, which stages through
/// a pinned buffer of its own and copies out while the next part crosses the link. Measured on an H100 host
/// (pinbench): one buffer ran at 1.07x-1.35x the driver's path from 4 to 64 KiB, and at 0.79x-0.95x from 256 KiB
/// to 4 MiB, where the copy out on one thread is the bound.
const ONE_BUFFER_DOWNLOAD_BELOW: usize = 256 << 10;

/// The smallest copy [`stream_copy`] makes with streaming stores.
const STREAMING_FROM: usize = 256 << 10;

/// `to.copy_from_slice(from)` with streaming (non-temporal) stores on x86-64, for the chunks of a staged
/// transfer: each byte is written once and next read by the DMA engine (an upload's staging buffer) or by the
/// user later (a download's destination), so there is no point in first reading each destination line into the
/// cache, as ordinary stores do. That read is a third of a plain copy's memory traffic, and the staging
/// threads are bound by memory bandwidth. Ends with a store fence, so the stores are complete (visible to the
/// DMA engine and other threads) when it returns.
/// Enqueues on `stream` the upload of the first `len` bytes of `buffer` into `dst` from byte `offset`, tracked
/// (timed by the stream's ledger as a staged upload). The caller checked that `dst` has them.
fn enqueue_upload<T: Pod>(
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
fn enqueue_download<T: Pod>(
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

fn stream_copy(to: &mut [u8], from: &[u8]) {
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

/// Takes out of `given` the last buffer `idle` says is idle, if any; the first error of `idle`, which ends the
/// transfer (the buffers stay in `given`).
fn find_idle<B>(given: &mut Vec<B>, idle: fn(&mut B) -> Result<bool>) -> Result<Option<B>> {
    for at in (0..given.len()).rev() {
        if idle(&mut given[at])? {
            return Ok(Some(given.swap_remove(at)));
        }
    }
    Ok(None)
}

/// The shared state of one staged transfer's threads: its staging buffers (of type `B`), at most `limit` of
/// them, and whether the transfer has stopped, with the first error.
///
/// Every wait here ends: [`Circulation::take`] waits only while a buffer is lent to another thread of the
/// transfer, which gives it back ([`Circulation::give_back`]) or drops it (which wakes the waiters, see
/// [`Lent`]), and [`Circulation::stop`] wakes every waiter.
struct Circulation<B> {
    shelf: Mutex<Shelf<B>>,
    /// Signalled when a buffer is given back or dropped, and when the transfer stops.
    changed: Condvar,
    limit: usize,
    /// Whether a buffer given back can be written without waiting, where that is worth asking (see
    /// [`Circulation::preferring_idle`]).
    idle: Option<fn(&mut B) -> Result<bool>>,
}

struct Shelf<B> {
    /// Buffers given back, ready for the next chunk.
    free: Vec<B>,
    /// The transfer's buffers: on the shelf, lent to a thread (or in a message between threads), or being
    /// allocated.
    owned: usize,
    /// Whether the pool had no room for another buffer: the transfer then goes on with those it has.
    pool_full: bool,
    stopped: bool,
    /// The first error of any thread, which the transfer returns.
    error: Option<Error>,
}

impl<B> Circulation<B> {
    /// A circulation of at most `limit` buffers, starting with `first`.
    fn new(first: B, limit: usize) -> Circulation<B> {
        Circulation {
            shelf: Mutex::new(Shelf {
                free: vec![first],
                owned: 1,
                pool_full: false,
                stopped: false,
                error: None,
            }),
            changed: Condvar::new(),
            limit,
            idle: None,
        }
    }

    /// The circulation, taking a buffer given back only where `idle` says it can be written without waiting
    /// while it may still take a new one: an upload's buffer comes back with its copy still queued, maybe behind
    /// other work on the stream, and a worker writing it would wait for all that, where a new block from the pool
    /// lets the transfer return before the stream's earlier work has run.
    fn preferring_idle(mut self, idle: fn(&mut B) -> Result<bool>) -> Circulation<B> {
        self.idle = Some(idle);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Shelf<B>> {
        self.shelf.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer for the next chunk: one given back (while a new one could still be taken, only an idle one:
    /// see [`Circulation::preferring_idle`]), else a new one from `more` (which must not wait) while fewer than
    /// `limit` are in circulation and the pool has had room, else the next one given back. `None` once the
    /// transfer has stopped; an error of `more` other than a full pool stops it.
    fn take(&self, more: &dyn Fn() -> Result<B>) -> Option<Lent<'_, B>> {
        let mut shelf = self.lock();
        loop {
            if shelf.stopped {
                return None;
            }
            let may_grow = shelf.owned < self.limit && !shelf.pool_full;
            match self.idle {
                Some(idle) if may_grow && !shelf.free.is_empty() => {
                    // Asked off the shelf: whether a buffer's copy has run may take its stream's lock and a driver
                    // call, and the threads giving buffers back must not wait for that.
                    let mut given = std::mem::take(&mut shelf.free);
                    drop(shelf);
                    let found = find_idle(&mut given, idle);
                    shelf = self.lock();
                    shelf.free.append(&mut given);
                    self.changed.notify_all();
                    match found {
                        Err(e) => {
                            self.stop_locked(&mut shelf, Some(e));
                            return None;
                        }
                        Ok(Some(buffer)) if shelf.stopped => {
                            shelf.free.push(buffer);
                            return None;
                        }
                        Ok(Some(buffer)) => return Some(Lent::new(self, buffer)),
                        Ok(None) if shelf.owned < self.limit && !shelf.pool_full => {}
                        // Another thread took the last new buffer meanwhile.
                        Ok(None) => continue,
                    }
                }
                Some(_) if may_grow => {}
                _ => {
                    if let Some(buffer) = shelf.free.pop() {
                        return Some(Lent::new(self, buffer));
                    }
                }
            }
            if shelf.owned < self.limit && !shelf.pool_full {
                shelf.owned += 1;
                // Not under the lock: pinning a new block takes a while, and buffers come back meanwhile.
                drop(shelf);
                let more = more();
                shelf = self.lock();
                match more {
                    Ok(buffer) if shelf.stopped => {
                        // Stopped meanwhile: the buffer stays on the shelf, unused, until the transfer ends.
                        shelf.free.push(buffer);
                        return None;
                    }
                    Ok(buffer) => return Some(Lent::new(self, buffer)),
                    Err(Error::PoolExhausted { .. }) => {
                        shelf.owned -= 1;
                        shelf.pool_full = true;
                    }
                    Err(e) => {
                        shelf.owned -= 1;
                        self.stop_locked(&mut shelf, Some(e));
                        return None;
                    }
                }
                continue;
            }
            if shelf.owned == 0 {
                // No buffer left to come back: the others were dropped, which only a thread that stopped the
                // transfer does, so this is not reached; but no thread may wait in vain.
                let e = Error::invalid("staging: every staging buffer of the transfer was lost");
                self.stop_locked(&mut shelf, Some(e));
                return None;
            }
            shelf = self
                .changed
                .wait(shelf)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Puts `buffer` back on the shelf for the next chunk.
    fn give_back(&self, buffer: B) {
        self.lock().free.push(buffer);
        // One buffer serves one waiter; a stop wakes them all.
        self.changed.notify_one();
    }

    /// Counts a lent buffer that was dropped instead of given back, and wakes the waiters: one may now find that
    /// no buffer can come, and stop rather than wait.
    fn lost(&self) {
        self.lock().owned -= 1;
        self.changed.notify_all();
    }

    /// Stops the transfer: every thread stops at its next step, and waiters wake. `error`, if the first, is what
    /// the transfer returns.
    fn stop(&self, error: Option<Error>) {
        self.stop_locked(&mut self.lock(), error);
    }

    fn stop_locked(&self, shelf: &mut Shelf<B>, error: Option<Error>) {
        if shelf.error.is_none() {
            shelf.error = error;
        }
        shelf.stopped = true;
        self.changed.notify_all();
    }

    fn stopped(&self) -> bool {
        self.lock().stopped
    }

    /// The transfer's outcome: the first error, if any thread met one.
    fn result(&self) -> Result<()> {
        self.lock().error.take().map_or(Ok(()), Err)
    }
}

/// A buffer lent by a [`Circulation`] to one thread: given back with [`Circulation::give_back`] of
/// [`Lent::into_inner`]; dropped instead (the transfer has stopped), it goes back to its pool, and the
/// circulation counts it lost so that no thread waits for it.
struct Lent<'c, B> {
    circulation: &'c Circulation<B>,
    buffer: Option<B>,
}

impl<'c, B> Lent<'c, B> {
    fn new(circulation: &'c Circulation<B>, buffer: B) -> Lent<'c, B> {
        Lent {
            circulation,
            buffer: Some(buffer),
        }
    }

    /// The buffer, to give back: still counted as the transfer's.
    fn into_inner(mut self) -> B {
        self.buffer
            .take()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> Deref for Lent<'_, B> {
    type Target = B;

    fn deref(&self) -> &B {
        self.buffer
            .as_ref()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> DerefMut for Lent<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        self.buffer
            .as_mut()
            .expect("a lent buffer is there until it is taken out")
    }
}

impl<B> Drop for Lent<'_, B> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            drop(buffer);
            self.circulation.lost();
        }
    }
}

/// Stops the transfer if the thread holding it unwinds, so that no other thread waits for it.
struct StopOnPanic<'c, B>(&'c Circulation<B>);

impl<B> Drop for StopOnPanic<'_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.stop(None);
        }
    }
}

impl Stream {
    /// Uploads ordinary (pageable) memory into `dst` through pinned staging buffers from `pool`: several threads
    /// copy chunks into the buffers while the DMA engine moves the chunks staged before, so the host copy and the
    /// transfer overlap. Returns once `src` is no longer read (every chunk staged); the device copies run on this
    /// stream, ordered like [`Stream::upload`]. Default [`StagingOptions`].
    ///
    /// A transfer below [`StagingOptions::chunked_from`] bytes (16 MiB by default) runs on the calling thread:
    /// below 1 MiB through one staging buffer of its size, copied into and returning at once; from there through the
    /// driver's path, [`Stream::upload_pageable`]. So does a transfer for which `pool` has no room for even one
    /// staging buffer (its budget held by buffers in use, or smaller than one buffer), rather than waiting for
    /// buffers others hold. That path returns once the copy has completed, after the work queued on this stream
    /// before it.
    ///
    /// The pool should have room for `2 x threads x chunk` bytes (64 MiB by default); with less, the transfer
    /// goes on with the buffers it could get. [`StagingOptions::staging_buffers`] says what a transfer takes.
    ///
    /// # Errors
    /// An invalid-argument error if the lengths differ, with nothing enqueued, or if the system refuses a worker
    /// thread; the pool's (other than having no room) or the driver's. An error on any thread of the transfer
    /// stops all of them at once: part of `dst` may have been written.
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
        upload(self, pool, options, src, dst)
    }

    /// Downloads `src` into ordinary (pageable) memory through pinned staging buffers from `pool`, with the DMA
    /// of each chunk overlapping the copy-out of the chunks before on several threads. Returns once every byte of
    /// `dst` has been written. Default [`StagingOptions`].
    ///
    /// Below [`StagingOptions::chunked_from`] bytes it runs on the calling thread: below 256 KiB through one
    /// staging buffer of its size (across the link into it, then out), from there through the driver's path,
    /// [`Stream::download_pageable`], which overlaps its copy out with the copy across. When `pool` has no room
    /// for one staging buffer it takes the driver's path too, as [`Stream::upload_staged`] does.
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
        download(self, pool, options, src, dst)
    }
}

mod awaited;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn options(chunk_bytes: usize, threads: usize) -> StagingOptions {
        StagingOptions {
            chunk_bytes,
            threads,
            chunked_from: 0,
        }
    }

    #[test]
    fn the_thread_count_is_bounded() {
        assert_eq!(
            options(4096, usize::MAX).plan(1 << 30).unwrap().workers(),
            MAX_THREADS
        );
        assert_eq!(options(4096, 3).plan(1 << 30).unwrap().workers(), 3);
        assert_eq!(options(4096, 3).plan(8192).unwrap().workers(), 2);
    }

    #[test]
    fn chunks_adapt_to_the_transfer() {
        let eight = StagingOptions {
            threads: 8,
            ..StagingOptions::default()
        };
        for (total, chunk, chunks) in [
            (16 << 20, 1 << 20, 16),
            (24 << 20, 2 << 20, 12),
            (64 << 20, 4 << 20, 16),
            (256 << 20, 4 << 20, 64),
            (1 << 30, 4 << 20, 256),
            (1 << 20, MIN_CHUNK, 4),
            (16 << 10, MIN_CHUNK, 1),
        ] {
            let plan = eight.plan(total).unwrap();
            assert_eq!(
                (plan.chunk_bytes(), plan.chunks(), plan.workers()),
                (chunk, chunks, chunks.min(8)),
                "{total} bytes"
            );
        }
        // A chunk size asked for is the most a chunk may be, a power of two or not, below the smallest adapted
        // chunk or not.
        assert_eq!(options(4096, 2).plan(1 << 20).unwrap().chunk_bytes(), 4096);
        assert_eq!(
            options(3 << 20, 1).plan(1 << 30).unwrap().chunk_bytes(),
            3 << 20
        );
        for total in [0, 1, usize::MAX] {
            let plan = options(usize::MAX, usize::MAX).plan(total).unwrap();
            assert!(plan.chunk_bytes() > 0 && plan.chunks() <= 2 * MAX_THREADS);
        }
    }

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

    #[test]
    fn the_buffers_a_transfer_takes() {
        let eight = StagingOptions {
            threads: 8,
            ..StagingOptions::default()
        };
        assert_eq!(eight.staging_buffers((16 << 20) - 1).unwrap(), (0, 0));
        assert_eq!(
            eight.staging_buffers((1 << 20) - 1).unwrap(),
            (1, (1 << 20) - 1)
        );
        assert_eq!(eight.staging_buffers(1 << 20).unwrap(), (0, 0));
        assert_eq!(eight.staging_buffers(16 << 20).unwrap(), (16, 1 << 20));
        assert_eq!(eight.staging_buffers(1 << 30).unwrap(), (16, 4 << 20));
        assert_eq!(eight.staging_buffers(4 << 10).unwrap(), (1, 4 << 10));
        let always = StagingOptions {
            chunked_from: 0,
            ..eight
        };
        assert_eq!(always.staging_buffers(0).unwrap(), (0, 0));
        assert_eq!(always.staging_buffers(16 << 10).unwrap(), (1, 16 << 10));
        assert_eq!(always.staging_buffers(1 << 20).unwrap(), (4, MIN_CHUNK));
        let never = StagingOptions {
            chunked_from: usize::MAX,
            ..eight
        };
        assert_eq!(never.staging_buffers(1 << 30).unwrap(), (0, 0));
        let none = StagingOptions {
            threads: 0,
            ..eight
        };
        assert!(matches!(
            none.staging_buffers(1),
            Err(Error::InvalidArgument { .. })
        ));
    }

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

    fn full() -> Result<u32> {
        Err(Error::PoolExhausted {
            requested: 1,
            budget: 1,
            reserved: 1,
            waited: std::time::Duration::ZERO,
        })
    }

    /// Runs `f` on a thread of its own; what it returns, or a failed test if it has not within 10 s.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the thread returned in time")
    }

    /// A thread that waits to take a buffer from `circulation` with a full pool, started now: what it took.
    fn waiter(circulation: &Arc<Circulation<u32>>) -> mpsc::Receiver<Option<u32>> {
        let (tx, rx) = mpsc::channel();
        let circulation = circulation.clone();
        std::thread::spawn(move || {
            let _ = tx.send(circulation.take(&full).map(|buffer| buffer.into_inner()));
        });
        rx
    }

    fn wait(rx: &mpsc::Receiver<Option<u32>>) -> Option<u32> {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter returned in time")
    }

    #[test]
    fn a_busy_buffer_given_back_is_passed_over_for_a_new_one_while_the_limit_allows() {
        // Odd buffers are busy: their uploads are still queued.
        let circulation = Circulation::new(1u32, 3).preferring_idle(|b| Ok(*b % 2 == 0));
        let asked = AtomicUsize::new(0);
        let more = || Ok(10 + 2 * asked.fetch_add(1, Ordering::Relaxed) as u32);
        let first = circulation.take(&more).unwrap();
        assert_eq!(*first, 10, "the busy first buffer stays on the shelf");
        let second = circulation.take(&more).unwrap();
        assert_eq!(*second, 12);
        circulation.give_back(second.into_inner());
        let third = circulation.take(&more).unwrap();
        assert_eq!(*third, 12, "an idle one given back");
        let fourth = circulation.take(&more).unwrap();
        assert_eq!(*fourth, 1, "at the limit, the busy one is taken");
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        drop((first, third, fourth));
    }

    #[test]
    fn buffers_come_from_the_shelf_then_the_pool_up_to_the_limit() {
        let circulation = Circulation::new(0, 3);
        let asked = AtomicUsize::new(0);
        let more = || Ok(10 + asked.fetch_add(1, Ordering::Relaxed) as u32);
        let a = circulation.take(&more).unwrap();
        let b = circulation.take(&more).unwrap();
        let c = circulation.take(&more).unwrap();
        assert_eq!((*a, *b, *c), (0, 10, 11));
        circulation.give_back(b.into_inner());
        assert_eq!(*circulation.take(&more).unwrap(), 10);
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        drop((a, c));
        assert!(circulation.result().is_ok());
    }

    #[test]
    fn a_full_pool_means_waiting_for_a_buffer_given_back() {
        let circulation = Arc::new(Circulation::new(0, 4));
        let held = circulation.take(&full).unwrap().into_inner();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "the waiter waits");
        circulation.give_back(held);
        assert_eq!(wait(&rx), Some(0));
        // The pool said it was full: it is not asked again during the transfer.
        let asked = AtomicUsize::new(0);
        let count = || {
            asked.fetch_add(1, Ordering::Relaxed);
            full()
        };
        circulation.give_back(0);
        let held = circulation.take(&count).unwrap().into_inner();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(20));
        circulation.give_back(held);
        assert_eq!(wait(&rx), Some(0));
        assert_eq!(asked.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_stop_wakes_every_waiter() {
        let circulation = Arc::new(Circulation::new(0, 1));
        let held = circulation.take(&full).unwrap();
        let waiters = [waiter(&circulation), waiter(&circulation)];
        std::thread::sleep(Duration::from_millis(50));
        circulation.stop(Some(Error::invalid("first")));
        circulation.stop(Some(Error::invalid("second")));
        for rx in &waiters {
            assert_eq!(wait(rx), None);
        }
        drop(held);
        assert!(circulation.take(&full).is_none(), "stopped for good");
        let e = circulation.result().unwrap_err();
        assert!(e.to_string().contains("first"), "the first error: {e}");
    }

    #[test]
    fn a_buffer_dropped_instead_of_given_back_never_leaves_a_waiter() {
        let circulation = Arc::new(Circulation::new(0, 1));
        let held = circulation.take(&full).unwrap();
        let rx = waiter(&circulation);
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert_eq!(wait(&rx), None);
        assert!(circulation.result().is_err());
    }

    #[test]
    fn an_error_from_the_pool_stops_the_transfer() {
        let circulation = Arc::new(Circulation::new(0, 2));
        let held = circulation.take(&full).unwrap();
        let failing = || Err(Error::invalid("the pool failed"));
        assert!(circulation.take(&failing).is_none());
        assert!(circulation.stopped());
        drop(held);
        let taken = bounded({
            let circulation = circulation.clone();
            move || circulation.take(&full).is_some()
        });
        assert!(!taken);
        let e = circulation.result().unwrap_err();
        assert!(e.to_string().contains("the pool failed"), "{e}");
    }
}
