//! What a staged transfer is asked to do and how it is cut: [`StagingOptions`], the sizes that pick a
//! transfer's path, and the [`Plan`] of chunks and workers, pure arithmetic.

use std::ops::Range;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The most worker threads one staged transfer starts, whatever [`StagingOptions::threads`] asks: a handful
/// already match a PCIe link, and the bound keeps a mistaken thread count from starting thousands of threads,
/// each with its stack and two staging buffers
/// (figures: docs/performance.md, "Where the defaults come from").
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

/// Uploads below this many bytes (and below [`StagingOptions::chunked_from`]) go through one staging buffer on
/// the calling thread, which returns once it is copied into; larger ones up to the crossover take the driver's
/// pageable path, 1 MiB included, where the two are too close to call
/// (figures: docs/performance.md, "Where the defaults come from").
pub(super) const ONE_BUFFER_UPLOAD_BELOW: usize = 1 << 20;

/// Downloads below this many bytes (and below [`StagingOptions::chunked_from`]) go through one staging buffer
/// on the calling thread; from it up to the crossover, where the copy out on one thread is the bound, through
/// the driver's pageable path, which stages through a pinned buffer of its own and copies out while the next
/// part crosses the link (figures: docs/performance.md, "Where the defaults come from").
pub(super) const ONE_BUFFER_DOWNLOAD_BELOW: usize = 256 << 10;

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
    /// save. 0 chunks every transfer; `usize::MAX` none. Default 16 MiB, where chunked transfers overtook the
    /// driver's pageable path in pinbench's runs; other machines may cross over elsewhere: measure with pinbench
    /// (figures: docs/performance.md, "Where the defaults come from").
    pub chunked_from: usize,
}

/// 4 MiB chunks, one thread per core up to 8, chunking from 16 MiB: chosen with pinbench's `--staging-sweep`
/// and its chunked column (figures: docs/performance.md, "Where the defaults come from").
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

    /// How a staged transfer of `total` bytes splits into chunks and workers with these options. The chunk size
    /// is the one that gives each thread [`CHUNKS_PER_WORKER`] chunks, rounded up to a power of two, at least
    /// [`MIN_CHUNK`], at most `chunk_bytes`: powers of two, because the pool reuses a block only for a request of
    /// its size class and pinning a new one is slow, so transfers of similar sizes ask for the same few sizes.
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

#[cfg(test)]
mod tests {
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
}
