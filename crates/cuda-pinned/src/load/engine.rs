//! The threads of one load: readers fill slots (page-locked buffers of the pool) with the planned requests,
//! several reads in flight, while the calling thread enqueues each filled slot's uploads on the stream and puts
//! the slot back in circulation. A slot is refilled only once its uploads have completed: its tracker records
//! them, and the reader's write access waits for them.

#![allow(unsafe_code)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use super::file::{ReadAt, read_request};
use super::plan::{Request, Upload};
use crate::driver::calls;
use crate::driver::{Category, Stream};
use crate::error::{Error, Result};
use crate::memory::{Pinned, PinnedPool, Track, Work};
use crate::staging::circulation::{Circulation, StopOnPanic, join_all};
use crate::sys::CUdeviceptr;

/// Device memory a load writes: its address, its length in bytes, and its tracker.
pub(crate) struct Dest<'a> {
    pub(crate) ptr: CUdeviceptr,
    pub(crate) bytes: u64,
    pub(crate) track: &'a Track,
}

/// What the engine is given: the stream and pool, where the bytes come from, and the planned work.
pub(crate) struct Job<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) source: &'a dyn ReadAt,
    pub(crate) path: &'a Path,
    pub(crate) requests: &'a [Request],
    pub(crate) dests: &'a [Dest<'a>],
    /// The slots: the first, taken before planning (its size is the plan's), and how to take more.
    pub(crate) first: Pinned<u8>,
    pub(crate) pool: &'a PinnedPool,
    pub(crate) slots: usize,
    pub(crate) readers: usize,
}

/// Runs `job`: returns once every request has been read and its uploads enqueued on the job's stream (tracked:
/// the destinations' trackers order later work after them), or at the first error of any thread.
///
/// # Errors
/// A read's [`Error::File`], the pool's or the driver's; after an error part of the destinations may have been
/// written.
pub(crate) fn run(job: Job<'_>) -> Result<()> {
    let Job {
        stream,
        source,
        path,
        requests,
        dests,
        first,
        pool,
        slots,
        readers,
    } = job;
    for upload in requests.iter().flat_map(|r| &r.uploads) {
        let fits = dests
            .get(upload.dest)
            .is_some_and(|d| upload.at + upload.len as u64 <= d.bytes);
        if !fits {
            // The callers plan within their destinations: this is a bug of the crate, refused before any work.
            return Err(Error::invalid(format_args!(
                "load: an upload of {} bytes to byte {} of destination {} does not fit it",
                upload.len, upload.at, upload.dest
            )));
        }
    }
    let slot_bytes = first.len();
    let more = || pool.try_alloc::<u8>(slot_bytes);
    let circulation = Circulation::new(first, slots.max(1))
        .preferring_idle(|slot| Ok(slot.try_as_mut_slice()?.is_some()));
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let _stop = StopOnPanic(&circulation);
        let (filled_tx, filled_rx) = mpsc::channel();
        let mut threads = Vec::with_capacity(readers);
        for reader in 0..readers.clamp(1, requests.len().max(1)) {
            let (filled, circulation, more, next) = (filled_tx.clone(), &circulation, &more, &next);
            let work = move || {
                let _stop = StopOnPanic(circulation);
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(index) else {
                        return;
                    };
                    let Some(mut slot) = circulation.take(more) else {
                        return;
                    };
                    // Waits for the slot's previous uploads to have read it.
                    let read = slot
                        .as_mut_slice()
                        .and_then(|bytes| read_request(source, path, bytes, request));
                    if let Err(e) = read {
                        return circulation.stop(Some(e));
                    }
                    if filled.send((request, slot)).is_err() {
                        return; // the enqueueing thread has stopped the load
                    }
                }
            };
            let spawned = std::thread::Builder::new()
                .name(format!("cuda-pinned-load-{reader}"))
                .spawn_scoped(scope, work);
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    circulation.stop(Some(Error::invalid(format_args!(
                        "starting load reader thread {reader}: {e}; ask for fewer readers \
                         (LoadOptions::readers) or raise the process's thread limit"
                    ))));
                    break;
                }
            }
        }
        drop(filled_tx);
        // Each filled slot's uploads, as it arrives (in any order: the uploads' device ranges are disjoint).
        for (request, slot) in &filled_rx {
            if circulation.stopped() {
                break;
            }
            let enqueued = request
                .uploads
                .iter()
                .try_for_each(|upload| enqueue(stream, &dests[upload.dest], &slot, upload));
            if let Err(e) = enqueued {
                circulation.stop(Some(e));
                break;
            }
            circulation.give_back(slot.into_inner());
        }
        drop(filled_rx);
        join_all(threads);
    });
    circulation.result()
}

/// Enqueues on `stream` the upload of `upload.len` bytes of `slot` from its byte `upload.slot_at` into `dest`
/// at its byte `upload.at`, tracked (timed by the stream's ledger as a load).
fn enqueue(stream: &Stream, dest: &Dest<'_>, slot: &Pinned<u8>, upload: &Upload) -> Result<()> {
    assert!(
        upload.slot_at + upload.len <= slot.len(),
        "load: an upload reads past its slot"
    );
    stream.tracked_as(
        Work::Timed(Category::Upload, "load", upload.len),
        Some(slot.track()),
        Some(dest.track),
        || {
            // SAFETY: `upload.len` bytes of the slot from `slot_at` (within it: asserted) and of the destination
            // from `at` (within it: checked by `run`); both trackers order the copy and keep both alive until it
            // has run.
            unsafe {
                calls::memcpy_htod_async(
                    dest.ptr + upload.at,
                    slot.host_ptr().cast::<u8>().add(upload.slot_at).cast(),
                    upload.len,
                    stream.as_raw(),
                )
            }
        },
    )
}
