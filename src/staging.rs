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

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, mpsc};

use bytemuck::Pod;

use crate::copy::{DeviceDestination, DeviceSource, Work};
use crate::driver_call;
use crate::error::{Error, Result};
use crate::memory::{Bytes, Pinned, PinnedPool};
use crate::profile::Category;
use crate::stream::Stream;

/// How a staged transfer splits its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingOptions {
    /// Bytes per chunk (and per staging buffer). Default 4 MiB.
    pub chunk_bytes: usize,
    /// Worker threads copying between the user's memory and the staging buffers. Default: one per core, at most 8.
    pub threads: usize,
}

/// The defaults were measured on an H100 host with 16 cores (pinbench `--staging-sweep`, 256 MiB): 4 MiB chunks
/// with 8 threads gave 3.65x the driver's pageable upload and 2.42x its download; 8 MiB chunks with 4 threads
/// gave 2.38x and 1.56x.
impl Default for StagingOptions {
    fn default() -> StagingOptions {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        StagingOptions {
            chunk_bytes: 4 << 20,
            threads: cores.clamp(1, 8),
        }
    }
}

impl StagingOptions {
    fn check(&self) -> Result<()> {
        if self.chunk_bytes == 0 || self.threads == 0 {
            return Err(Error::invalid(format_args!(
                "staging needs a chunk size and a thread count above zero, not {} bytes and {} threads",
                self.chunk_bytes, self.threads
            )));
        }
        Ok(())
    }

    /// How a transfer of `total` bytes splits into chunks and workers with these options.
    ///
    /// # Errors
    /// An invalid-argument error for a chunk size or thread count of zero.
    pub(crate) fn plan(&self, total: usize) -> Result<Plan> {
        self.check()?;
        let chunks = total.div_ceil(self.chunk_bytes);
        Ok(Plan {
            total,
            chunk_bytes: self.chunk_bytes,
            chunks,
            workers: self.threads.min(chunks),
        })
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
    /// At most `chunks`, so that every worker has a chunk; 0 only for an empty transfer.
    workers: usize,
}

impl Plan {
    /// The bytes of the transfer.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The most bytes of a chunk, and the size of each staging buffer.
    pub(crate) fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// The number of chunks: `total / chunk_bytes`, rounded up.
    pub(crate) fn chunks(&self) -> usize {
        self.chunks
    }

    /// The number of worker threads: the thread count asked for, but no more than there are chunks.
    pub(crate) fn workers(&self) -> usize {
        self.workers
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

/// Where staging buffers come from: a pinned buffer of at least the requested bytes. The flag says whether the
/// source may wait for room: only for a transfer's first buffer, since the others it could wait for are its own.
type Buffers<'a> = &'a (dyn Fn(usize, bool) -> Result<Pinned<u8>> + Sync);

/// A chunk handed between a worker and the enqueueing thread, with the staging buffer that holds it.
struct Staged {
    chunk: usize,
    buffer: Pinned<u8>,
}

/// Staging buffers in circulation per worker: one being filled or drained while the other's chunk is on its way
/// across the link.
const BUFFERS_PER_WORKER: usize = 2;

/// Uploads `src` into `dst` on `stream`, staged through buffers from `buffers`. Returns once `src` is no longer
/// read; the device copies run on `stream`.
fn upload<T: Pod>(
    stream: &Stream,
    buffers: Buffers<'_>,
    options: StagingOptions,
    src: &[T],
    dst: &mut impl DeviceDestination<T>,
) -> Result<()> {
    let plan = options.plan(size_of_val(src))?;
    stream.check_context(dst)?;
    check_lengths("staged upload", src.len(), dst.elements())?;
    let bytes: &[u8] = bytemuck::cast_slice(src);
    if bytes.is_empty() {
        return Ok(());
    }
    let (chunk_bytes, workers) = (plan.chunk_bytes(), plan.workers());
    let (base, track) = (dst.device_ptr(), dst.track());
    let enqueue = |offset: usize, buffer: &Pinned<u8>, len: usize| {
        stream.tracked_as(
            Work::Timed(Category::Upload, "staged", len),
            Some(buffer.track()),
            Some(track),
            || {
                // SAFETY: `len` bytes of the staging buffer (at least `chunk_bytes` long) and of the destination from
                // `offset` (within it: the lengths were checked); both trackers order the copy and keep both buffers
                // alive until it has run.
                unsafe {
                    driver_call!(cuMemcpyHtoDAsync_v2(
                        base + offset as u64,
                        buffer.host_ptr(),
                        len,
                        stream.as_raw()
                    ))
                }
            },
        )
    };
    if plan.chunks() == 1 {
        // One chunk: no threads to start, no overlap to gain.
        let mut buffer = buffers(chunk_bytes, true)?;
        buffer.as_mut_slice()?[..bytes.len()].copy_from_slice(bytes);
        return enqueue(0, &buffer, bytes.len()).map_err(|e| {
            e.context(format_args!(
                "uploading {} staged through pinned memory",
                Bytes(bytes.len())
            ))
        });
    }
    let (back_tx, back_rx) = mpsc::channel::<Pinned<u8>>();
    let circulation = Circulation::new(back_rx, BUFFERS_PER_WORKER * workers, buffers, chunk_bytes);
    let result = std::thread::scope(|scope| -> Result<()> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<Staged>>();
        for worker in 0..workers {
            let (ready, circulation) = (ready_tx.clone(), &circulation);
            scope.spawn(move || {
                for chunk in plan.chunks_of(worker) {
                    let part = &bytes[plan.chunk(chunk)];
                    let staged = circulation.take().and_then(|mut buffer| {
                        // Waits for the buffer's previous upload to have read it.
                        buffer.as_mut_slice()?[..part.len()].copy_from_slice(part);
                        Ok(Staged { chunk, buffer })
                    });
                    let failed = staged.is_err();
                    if ready.send(staged).is_err() || failed {
                        return;
                    }
                }
            });
        }
        drop(ready_tx);
        // Enqueue each staged chunk as it arrives (in any order: the chunks' device ranges are disjoint) and put
        // its buffer back in circulation. An error returns at once, which closes the channels and stops the
        // workers.
        for staged in ready_rx {
            let Staged { chunk, buffer } = staged?;
            let range = plan.chunk(chunk);
            enqueue(range.start, &buffer, range.len())?;
            // After the last chunk no one takes it: it goes back to its pool, with its tracker, when dropped.
            let _ = back_tx.send(buffer);
        }
        Ok(())
    });
    drop(back_tx);
    result.map_err(|e| {
        e.context(format_args!(
            "uploading {} staged through pinned memory",
            Bytes(bytes.len())
        ))
    })
}

/// Downloads `src` into `dst` on `stream`, staged through buffers from `buffers`. Returns once every byte of
/// `dst` has been written.
fn download<T: Pod>(
    stream: &Stream,
    buffers: Buffers<'_>,
    options: StagingOptions,
    src: &impl DeviceSource<T>,
    dst: &mut [T],
) -> Result<()> {
    let plan = options.plan(size_of_val(dst))?;
    stream.check_context(src)?;
    check_lengths("staged download", dst.len(), src.elements())?;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
    let total = bytes.len();
    if total == 0 {
        return Ok(());
    }
    let (chunk_bytes, workers) = (plan.chunk_bytes(), plan.workers());
    let (base, track) = (src.device_ptr(), src.track());
    let enqueue = |offset: usize, buffer: &Pinned<u8>, len: usize| {
        let dst = buffer.host_ptr();
        stream.tracked_as(
            Work::Timed(Category::Download, "staged", len),
            Some(track),
            Some(buffer.track()),
            || {
                // SAFETY: `len` bytes of the source from `offset` (within it: lengths checked) and of the staging
                // buffer; both trackers order the copy, and the buffer is read only through `as_slice`, which waits.
                unsafe {
                    driver_call!(cuMemcpyDtoHAsync_v2(
                        dst,
                        base + offset as u64,
                        len,
                        stream.as_raw()
                    ))
                }
            },
        )
    };
    if plan.chunks() == 1 {
        // One chunk: no threads to start, no overlap to gain.
        let buffer = buffers(chunk_bytes, true)?;
        return enqueue(0, &buffer, total)
            .and_then(|()| {
                buffer
                    .as_slice()
                    .map(|data| bytes.copy_from_slice(&data[..total]))
            })
            .map_err(|e| {
                e.context(format_args!(
                    "downloading {} staged through pinned memory",
                    Bytes(total)
                ))
            });
    }
    // Each worker copies out its chunks, in order. `chunks_mut` cuts the same chunks as `plan.chunk`.
    let mut parts: Vec<Vec<&mut [u8]>> = (0..workers).map(|_| Vec::new()).collect();
    for (chunk, part) in bytes.chunks_mut(chunk_bytes).enumerate() {
        parts[plan.worker_of(chunk)].push(part);
    }
    let (back_tx, back_rx) = mpsc::channel::<Pinned<u8>>();
    let circulation = Circulation::new(back_rx, BUFFERS_PER_WORKER * workers, buffers, chunk_bytes);
    let result = std::thread::scope(|scope| -> Result<()> {
        let mut to_workers = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for mine in parts {
            let (tx, rx) = mpsc::channel::<Staged>();
            to_workers.push(tx);
            let back = back_tx.clone();
            handles.push(scope.spawn(move || -> Result<()> {
                // After an error, buffers still go back, so that the enqueueing thread never waits for one in
                // vain; the first error is returned at the end.
                let mut outcome = Ok(());
                for (part, Staged { buffer, .. }) in mine.into_iter().zip(rx) {
                    if outcome.is_ok() {
                        // Waits for the buffer's download to have completed.
                        outcome = buffer
                            .as_slice()
                            .map(|data| part.copy_from_slice(&data[..part.len()]));
                    }
                    let _ = back.send(buffer);
                }
                outcome
            }));
        }
        drop(back_tx);
        let mut enqueued: Result<()> = Ok(());
        for chunk in 0..plan.chunks() {
            let range = plan.chunk(chunk);
            let step = circulation.take().and_then(|buffer| {
                enqueue(range.start, &buffer, range.len())?;
                Ok(Staged { chunk, buffer })
            });
            match step {
                Ok(staged) => {
                    if to_workers[plan.worker_of(chunk)].send(staged).is_err() {
                        // The worker has stopped: its error is collected below.
                        break;
                    }
                }
                Err(e) => {
                    enqueued = Err(e);
                    break;
                }
            }
        }
        drop(to_workers);
        for handle in handles {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        enqueued
    });
    result.map_err(|e| {
        e.context(format_args!(
            "downloading {} staged through pinned memory",
            Bytes(total)
        ))
    })
}

/// That the host and device sides of a transfer have the same number of elements.
///
/// # Errors
/// An invalid-argument error naming both lengths where they differ.
pub(crate) fn check_lengths(what: &str, host: usize, device: usize) -> Result<()> {
    if host == device {
        Ok(())
    } else {
        Err(Error::invalid(format_args!(
            "{what}: the host memory has {host} elements and the device memory {device}; nothing was enqueued"
        )))
    }
}

/// The staging buffers of one transfer: at most `limit` in circulation, passed back through `back` and shared
/// by every thread that needs one.
struct Circulation<'a> {
    back: Mutex<mpsc::Receiver<Pinned<u8>>>,
    owned: AtomicUsize,
    limit: usize,
    buffers: Buffers<'a>,
    bytes: usize,
}

impl<'a> Circulation<'a> {
    fn new(
        back: mpsc::Receiver<Pinned<u8>>,
        limit: usize,
        buffers: Buffers<'a>,
        bytes: usize,
    ) -> Circulation<'a> {
        Circulation {
            back: Mutex::new(back),
            owned: AtomicUsize::new(0),
            limit,
            buffers,
            bytes,
        }
    }

    /// A buffer given back already, else a new one while fewer than `limit` are in circulation, else the next
    /// one given back. Only the transfer's first buffer may wait for room in the pool; when the pool has no room
    /// for another, the transfer goes on with the buffers it has.
    fn take(&self) -> Result<Pinned<u8>> {
        if let Ok(buffer) = self.lock().try_recv() {
            return Ok(buffer);
        }
        let before = self.owned.fetch_add(1, Ordering::Relaxed);
        if before < self.limit {
            match (self.buffers)(self.bytes, before == 0) {
                Ok(buffer) => return Ok(buffer),
                Err(Error::PoolExhausted { .. }) if before > 0 => {}
                Err(e) => {
                    self.owned.fetch_sub(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        self.owned.fetch_sub(1, Ordering::Relaxed);
        self.lock()
            .recv()
            .map_err(|_| Error::invalid("staging: the other side of the transfer stopped"))
    }

    fn lock(&self) -> MutexGuard<'_, mpsc::Receiver<Pinned<u8>>> {
        self.back.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Stream {
    /// Uploads ordinary (pageable) memory into `dst` through pinned staging buffers from `pool`: several threads
    /// copy chunks into the buffers while the DMA engine moves the chunks staged before, so the host copy and the
    /// transfer overlap. Returns once `src` is no longer read (every chunk staged); the device copies run on this
    /// stream, ordered like [`Stream::upload`]. Default [`StagingOptions`].
    ///
    /// The pool should have room for `2 x threads x chunk` bytes (64 MiB by default); with less, the transfer
    /// goes on with the buffers it could get.
    ///
    /// # Errors
    /// An invalid-argument error if the lengths differ, with nothing enqueued; the pool's or the driver's.
    pub fn upload_staged<T: Pod>(
        &self,
        pool: &PinnedPool,
        src: &[T],
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<()> {
        self.upload_staged_with(pool, StagingOptions::default(), src, dst)
    }

    /// [`Stream::upload_staged`] with other chunk size or thread count.
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
        upload(
            self,
            &|bytes, may_wait| pool_buffer(pool, bytes, may_wait),
            options,
            src,
            dst,
        )
    }

    /// Downloads `src` into ordinary (pageable) memory through pinned staging buffers from `pool`, with the DMA
    /// of each chunk overlapping the copy-out of the chunks before on several threads. Returns once every byte of
    /// `dst` has been written. Default [`StagingOptions`].
    ///
    /// # Errors
    /// As [`Stream::upload_staged`].
    pub fn download_staged<T: Pod>(
        &self,
        pool: &PinnedPool,
        src: &impl DeviceSource<T>,
        dst: &mut [T],
    ) -> Result<()> {
        self.download_staged_with(pool, StagingOptions::default(), src, dst)
    }

    /// [`Stream::download_staged`] with other chunk size or thread count.
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
        download(
            self,
            &|bytes, may_wait| pool_buffer(pool, bytes, may_wait),
            options,
            src,
            dst,
        )
    }
}

/// A staging buffer from `pool`: waiting for room only where the caller may wait.
fn pool_buffer(pool: &PinnedPool, bytes: usize, may_wait: bool) -> Result<Pinned<u8>> {
    if may_wait {
        pool.alloc_after_pending(bytes)
    } else {
        pool.try_alloc(bytes)
    }
}
