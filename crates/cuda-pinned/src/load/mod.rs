//! From file to device memory at the disk's speed: byte ranges of a file, or the tensors of a safetensors
//! checkpoint (feature `safetensors`), read through a few page-locked slots of a [`PinnedPool`] while the slots
//! read before are uploaded.
//!
//! # How a load runs
//! The wanted byte ranges are cut into requests of at most one slot ([`LoadOptions::slot_bytes`]). Reader
//! threads ([`LoadOptions::readers`] for direct reads, several requests in flight;
//! [`LoadOptions::buffered_readers`] for reads out of the page cache, which are copies on the CPU) each take a slot, read a request into it with
//! one positional read, and hand it to the calling thread, which enqueues the slot's uploads on the stream and
//! puts the slot back in circulation; a reader refills a slot only once its uploads have completed (the slot's
//! tracker waits for them). At most [`LoadOptions::slots`] slots are taken from the pool, fewer where its budget
//! has no room for more: the page-locked memory a load holds is bounded by the slots, whatever the file's size.
//!
//! Reads bypass the page cache (`O_DIRECT`) where the file system allows it and the page cache does not already
//! hold most of the bytes (asked with `mincore`, which reads nothing): a cold file then streams at the disk's
//! speed without being copied through the cache, while a warm one is copied out of the cache by the readers in
//! parallel. A direct read's offset and length are multiples of 4 KiB, so a request reads from the block its
//! first byte is in to the block its last byte is in; only the wanted bytes are uploaded. [`LoadOptions::io`]
//! forces either way, and [`LoadReport`] says which was taken and why.
//!
//! # Errors name the file and the byte
//! A read that fails, a file that ends before its last wanted byte (it shrank while being read), a range past
//! the file's end, and (for safetensors) a header that lies about its length, its tensors' offsets, shapes or
//! dtypes, are each an [`Error::File`] naming the file and the byte offset. An error stops every reader; the
//! load returns the first, never a partial success. Device memory it was writing may then hold part of the
//! file.
//!
//! # GPUDirect Storage
//! Reads into device memory without a host buffer (cuFile) need the `nvidia-fs` kernel module and a file system
//! that supports it. The loader reads through page-locked host memory; where GPUDirect Storage is present, a
//! load still takes that path (see ARCHITECTURE.md, "Loading files").

mod awaited;
mod engine;
mod file;
pub(crate) mod plan;
#[cfg(feature = "safetensors")]
pub(crate) mod safetensors;
#[cfg(feature = "safetensors")]
mod sharded;
// The simulated driver is not linked into the GPU build's tests.
#[cfg(all(test, not(feature = "gpu")))]
mod tests;

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytemuck::Pod;

use self::engine::{Dest, Job};
use self::file::{Opened, ReadAt, resident_fraction};
use self::plan::{DIRECT_ALIGN, Piece, check_pieces, plan};
use crate::copy::DeviceDestination;
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{Pinned, PinnedPool};
use crate::units::Bytes;

pub use self::awaited::Loading;
#[cfg(feature = "safetensors")]
#[cfg_attr(docsrs, doc(cfg(feature = "safetensors")))]
pub use self::safetensors::{Dtype, SafeTensorsFile, TensorInfo, Tensors};
#[cfg(feature = "safetensors")]
#[cfg_attr(docsrs, doc(cfg(feature = "safetensors")))]
pub use self::sharded::{Checkpoint, LoadedCheckpoint};

/// The smallest slot a load shrinks to when its pool has no room for the one asked for.
const MIN_SLOT: usize = 256 << 10;

/// How a load reads the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Io {
    /// Direct reads unless the page cache holds at least half of the pages from the first wanted byte to the
    /// last or the file system refuses them; buffered reads otherwise. The default.
    #[default]
    Auto,
    /// Direct reads (`O_DIRECT`): an error where the file system refuses them.
    Direct,
    /// Reads through the page cache.
    Buffered,
}

/// How a load reads: `LoadOptions::default().readers(8)`. The fields can be read; they are set through the
/// methods of the same names, so that options added later break no one's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// The most bytes one read moves, and the size of a slot. Default 8 MiB; a load smaller than that takes a
    /// slot of its size, and a pool without room for the slot gives a smaller one (down to 256 KiB).
    pub slot_bytes: usize,
    /// Direct reads in flight at once, each on a thread of its own. Default 4.
    pub readers: usize,
    /// Threads copying out of the page cache, for buffered reads: where the file is cached, a read is a copy
    /// on the CPU, and it takes several threads to copy at the memory's speed. Default one per core, at most 16.
    pub buffered_readers: usize,
    /// The most slots taken from the pool; 0 (the default) for one more than the readers of the reads taken,
    /// so that a slot's uploads run while every reader reads.
    pub slots: usize,
    /// Direct or buffered reads. Default [`Io::Auto`].
    pub io: Io,
}

/// 8 MiB slots, 4 direct readers, one buffered reader per core up to 16: chosen with `pinbench load --sweep`
/// (figures: docs/performance.md, "Where the defaults come from").
impl Default for LoadOptions {
    fn default() -> LoadOptions {
        // Counted once: `available_parallelism` reads the process's CPU quota from files.
        static CORES: OnceLock<usize> = OnceLock::new();
        let cores = *CORES
            .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
        LoadOptions {
            slot_bytes: 8 << 20,
            readers: 4,
            buffered_readers: cores.clamp(1, 16),
            slots: 0,
            io: Io::Auto,
        }
    }
}

impl LoadOptions {
    /// The size of a slot (see the field).
    #[must_use]
    pub fn slot_bytes(mut self, bytes: usize) -> LoadOptions {
        self.slot_bytes = bytes;
        self
    }

    /// Direct reads in flight (see the field).
    #[must_use]
    pub fn readers(mut self, readers: usize) -> LoadOptions {
        self.readers = readers;
        self
    }

    /// Threads of buffered reads (see the field).
    #[must_use]
    pub fn buffered_readers(mut self, readers: usize) -> LoadOptions {
        self.buffered_readers = readers;
        self
    }

    /// The most slots (see the field; 0 for one more than the readers).
    #[must_use]
    pub fn slots(mut self, slots: usize) -> LoadOptions {
        self.slots = slots;
        self
    }

    /// Direct or buffered reads (see [`Io`]).
    #[must_use]
    pub fn io(mut self, io: Io) -> LoadOptions {
        self.io = io;
        self
    }

    /// The readers and the most slots of a load whose reads are direct or not.
    fn threads(&self, direct: bool) -> (usize, usize) {
        let readers = if direct {
            self.readers
        } else {
            self.buffered_readers
        };
        let slots = match self.slots {
            0 => readers.saturating_add(1),
            slots => slots,
        };
        (readers, slots)
    }

    /// The most slots a load with these options holds, its reads direct or buffered: `most_slots() *
    /// slot_bytes` bounds the page-locked memory it holds.
    pub fn most_slots(&self) -> usize {
        self.threads(true).1.max(self.threads(false).1)
    }

    fn check(&self) -> Result<()> {
        if self.slot_bytes < 2 * DIRECT_ALIGN as usize
            || self.readers == 0
            || self.buffered_readers == 0
        {
            return Err(Error::invalid(format_args!(
                "load options: slots of at least 8 KiB and a reader of each kind are needed, not {self:?}"
            )));
        }
        Ok(())
    }
}

/// What a load did: how it read, with how many threads and how much page-locked memory.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LoadReport {
    /// The bytes uploaded to the device.
    pub bytes: u64,
    /// The bytes read from the file: the wanted ones, and for direct reads the rest of their first and last
    /// blocks, and the gaps between ranges close enough to read in one request.
    pub read: u64,
    /// Whether the reads bypassed the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Why they did not, for buffered reads.
    pub why_buffered: Option<String>,
    /// The reader threads.
    pub readers: usize,
    /// The size of a slot.
    pub slot_bytes: usize,
    /// The most slots the load could hold: it holds at most `slots * slot_bytes` of page-locked memory.
    pub slots: usize,
    /// From the call to its return: every byte read, the uploads enqueued.
    pub elapsed: Duration,
}

impl Stream {
    /// Reads `dst`'s length in bytes from `path` at byte `offset` into `dst`, through slots from `pool`, with the
    /// default [`LoadOptions`] (how: [`load`](crate::load)). Returns once every byte has been read from the file,
    /// the uploads into `dst` running on this stream (tracked like any upload: work on other streams waits for
    /// them).
    ///
    /// # Errors
    /// [`Error::File`] (naming the file and the byte) if the file cannot be opened or read, ends before
    /// `offset + dst`'s length, or shrinks while it is read; the pool's (no room for the smallest slot) or the
    /// driver's. After an error, part of `dst` may have been written.
    pub fn load_file<T: Pod>(
        &self,
        pool: &PinnedPool,
        path: impl AsRef<Path>,
        offset: u64,
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<LoadReport> {
        self.load_file_with(pool, LoadOptions::default(), path, offset, dst)
    }

    /// [`Stream::load_file`] with other slots, readers or reads.
    ///
    /// # Errors
    /// As [`Stream::load_file`], and for options that cannot work (no reader, no slot, slots under 8 KiB).
    pub fn load_file_with<T: Pod>(
        &self,
        pool: &PinnedPool,
        options: LoadOptions,
        path: impl AsRef<Path>,
        offset: u64,
        dst: &mut impl DeviceDestination<T>,
    ) -> Result<LoadReport> {
        self.check_context(dst)?;
        let bytes = (dst.len() * size_of::<T>()) as u64;
        let dests = [Dest {
            ptr: dst.device_ptr(),
            bytes,
            track: dst.track(),
        }];
        let piece = Piece {
            file: offset,
            len: bytes,
            dest: 0,
            at: 0,
        };
        load_pieces(self, pool, options, path.as_ref(), &[piece], &dests, None)
    }
}

/// Loads `pieces` (in file order) of the file at `path` into `dests`: the one way every load runs. `opened` is
/// the file if the caller opened it already (to read a header).
pub(crate) fn load_pieces(
    stream: &Stream,
    pool: &PinnedPool,
    options: LoadOptions,
    path: &Path,
    pieces: &[Piece],
    dests: &[Dest<'_>],
    opened: Option<Opened>,
) -> Result<LoadReport> {
    let started = Instant::now();
    options.check()?;
    let opened = match opened {
        Some(opened) => opened,
        None => Opened::open(path, options.io != Io::Buffered)?,
    };
    load_opened(
        stream,
        pool,
        options,
        &opened,
        &opened.buffered,
        pieces,
        dests,
        started,
    )
}

/// [`load_pieces`] from an opened file, reading buffered ones through `buffered` (the file, or a stand-in of
/// the tests).
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_opened(
    stream: &Stream,
    pool: &PinnedPool,
    options: LoadOptions,
    opened: &Opened,
    buffered: &dyn ReadAt,
    pieces: &[Piece],
    dests: &[Dest<'_>],
    started: Instant,
) -> Result<LoadReport> {
    let path = opened.path.as_path();
    options.check()?;
    stream.refuse_in_capture("a load from a file")?;
    // The pieces first: every sum below stays within the file's length.
    check_pieces(pieces, opened.len).map_err(|e| Error::file(path, e.offset(), e))?;
    let wanted: u64 = pieces.iter().map(|p| p.len).sum();
    let span = pieces.iter().filter(|p| p.len > 0);
    let (first_byte, last_byte) = (
        span.clone().map(|p| p.file).min().unwrap_or(0),
        span.map(|p| p.file + p.len).max().unwrap_or(0),
    );
    // Direct or buffered, and why.
    let why_buffered = match (options.io, &opened.direct) {
        (Io::Buffered, _) => Some("buffered reads were asked for".to_owned()),
        (Io::Direct, Err(why)) => return Err(Error::file(path, 0, why)),
        (Io::Direct, Ok(_)) => None,
        (Io::Auto, Err(why)) => Some(why.clone()),
        (Io::Auto, Ok(_)) => match resident_fraction(&opened.buffered, first_byte, last_byte) {
            Some(held) if held >= 0.5 => Some(format!(
                "the page cache holds {:.0}% of the bytes",
                held * 100.0
            )),
            _ => None,
        },
    };
    // The first slot, whose size the plan is cut to.
    let first = if wanted == 0 {
        None
    } else {
        let fitting = (wanted + 2 * DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN);
        // Whole blocks, never more than asked for.
        let asked = options.slot_bytes - options.slot_bytes % DIRECT_ALIGN as usize;
        Some(first_slot(pool, asked.min(fitting as usize))?)
    };
    // A direct read needs an aligned buffer: pool blocks are whole pages.
    let mut why_buffered = why_buffered;
    if let Some(slot) = &first
        && why_buffered.is_none()
        && !(slot.host_ptr() as usize).is_multiple_of(DIRECT_ALIGN as usize)
    {
        why_buffered = Some("the pool's slot is not aligned for direct reads".to_owned());
    }
    let direct = why_buffered.is_none();
    let align = if direct { DIRECT_ALIGN } else { 1 };
    let slot_bytes = first.as_ref().map_or(options.slot_bytes, Pinned::len);
    // Rounded down to whole blocks (a slot of a pool is whole pages).
    let slot_bytes = slot_bytes - slot_bytes % DIRECT_ALIGN as usize;
    let requests = plan(pieces, opened.len, slot_bytes, align)
        .map_err(|e| Error::file(path, e.offset(), e))?;
    let (readers, slots) = options.threads(direct);
    let report = LoadReport {
        bytes: wanted,
        read: requests
            .iter()
            .map(|r| (r.len as u64).min(opened.len - r.offset))
            .sum(),
        direct,
        why_buffered,
        readers: readers.min(requests.len()).max(1),
        slot_bytes,
        slots,
        elapsed: Duration::ZERO,
    };
    let Some(first) = first else {
        return Ok(LoadReport {
            elapsed: started.elapsed(),
            ..report
        });
    };
    let source: &dyn ReadAt = match &opened.direct {
        Ok(file) if direct => file,
        _ => buffered,
    };
    engine::run(Job {
        stream,
        source,
        path,
        requests: &requests,
        dests,
        first,
        pool,
        slots,
        readers: report.readers,
    })
    .map_err(|e| {
        e.context(format_args!(
            "loading {} from {}",
            Bytes(wanted as usize),
            path.display()
        ))
    })?;
    Ok(LoadReport {
        elapsed: started.elapsed(),
        ..report
    })
}

/// A slot of `bytes` from `pool`, waiting only for its blocks' pending device work; where it has no room, the
/// largest smaller one (halving, down to [`MIN_SLOT`]) it has room for at once; where it has room for none, the
/// smallest as [`PinnedPool::alloc`] gives it: a pool that waits when full ([`crate::WhenFull::Wait`]) waits for
/// room (the load holds no slot yet, so it waits for no one who waits for it), one that fails, fails.
///
/// # Errors
/// The pool's: [`Error::PoolExhausted`] if not even the smallest slot comes.
fn first_slot(pool: &PinnedPool, bytes: usize) -> Result<Pinned<u8>> {
    let align = DIRECT_ALIGN as usize;
    let mut bytes = bytes;
    let mut slot = pool.alloc_after_pending::<u8>(bytes);
    while matches!(slot, Err(Error::PoolExhausted { .. })) && bytes / 2 >= MIN_SLOT {
        bytes = bytes / 2 - bytes / 2 % align;
        slot = pool.try_alloc::<u8>(bytes);
    }
    match slot {
        Err(Error::PoolExhausted { .. }) => pool.alloc::<u8>(bytes),
        slot => slot,
    }
}
