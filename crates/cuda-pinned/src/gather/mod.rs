//! Gathering rows on the device: rows of a table in page-locked host memory copied into device memory by index,
//! read by the device itself, so the host only says which rows.
//!
//! A training step that samples rows (embeddings, records of a dataset) would otherwise gather them on the CPU
//! into pinned memory and upload that: every byte then crosses host memory twice, and the host's memory
//! bandwidth bounds the feed. Here the table is page-locked once, in place ([`Registered`](crate::Registered)
//! or [`Pinned`](crate::Pinned): both are mapped into the device's address space), and a kernel of the crate
//! reads the rows it is given straight over the bus. Host writes to the table wait for gathers that read it,
//! and the table is unpinned only after them, as for any copy.
//!
//! Where the table starts matters: the device reads rows over the bus fastest from a table that starts on a
//! 128-byte boundary. A large `Vec` from the system allocator starts 16 bytes past a page (glibc), and gathers
//! from one registered in place were slower on an H100 (64-byte rows read sorted: 23.2 GB/s against 34.5 from a
//! page-aligned table; 1 KiB rows 45.3 against 48.2; 16 KiB rows 47.9 against 49.9). [`Pinned`] memory starts
//! on a page: for a table gathered from often, copy it once into
//! [`PinnedBuilder::device_mapped`](crate::PinnedBuilder::device_mapped) memory.

#![allow(unsafe_code)]

use std::fmt;

use bytemuck::Pod;

use crate::copy::{DeviceDestination, PinnedSource, sealed};
use crate::driver::{Category, Context, Stream, calls};
use crate::error::{Error, Result};
use crate::launch::{Arg, Kernel, LaunchConfig, Module};
use crate::memory::{DeviceBuffer, Pinned, PinnedPool, WhenFull, Work};
use crate::track::Access;

/// The gather kernels (`cuda/gather.cu`, compiled to PTX by `scripts/gather-ptx.sh`): the driver compiles them
/// for the device when [`Gatherer::new`] loads them, so building the crate needs no CUDA compiler.
const GATHER_PTX: &str = include_str!("../gather.ptx");

/// The access widths of the kernels, widest first: `cuda_pinned_gather_{width}` moves `width` bytes per access.
const WIDTHS: [usize; 5] = [16, 8, 4, 2, 1];

/// Threads per block of the gather kernel.
const BLOCK: u32 = 256;

/// Loads each thread of the gather kernel keeps in flight (`UNROLL` of `cuda/gather.cu`).
const UNROLL: usize = 4;

/// Bytes of host memory the kernel reads at once: what a grid of `IN_FLIGHT / (UNROLL * width * BLOCK)` blocks
/// keeps in flight, striding over the rest of the batch. Reads over the bus need this much in flight to fill the
/// link (bandwidth x latency), and no more: more scattered reads at once miss more of the device's translations
/// of host pages, and a grid that covers the whole batch kept every SM waiting on the bus while the compute
/// sharing the GPU starved. On an H100, 32 blocks of four 16-byte reads per thread (512 KiB) gathered random 1
/// KiB rows at 49.0 GB/s, against 45.5 with one read per thread (128 KiB) and 43.7 with 132 blocks of four; with
/// 4096 blocks a training loop's axpy beside the gather took 209.8 ms instead of 17.9.
const IN_FLIGHT: usize = 512 << 10;

/// Threads per block of the sorting kernels, and bins per thread of the scan (`SORT_BLOCK`, `BINS_PER_THREAD`
/// of `cuda/gather.cu`): the bins are scanned in tiles of `TILE`.
const SORT_BLOCK: u32 = 256;
const TILE: usize = 256 * 16;

/// The smallest bucket of the device's sort, as a power of two: 64 KiB of the table. Sorted by 64 KiB
/// buckets, 256-byte rows at random indices gathered as fast as fully sorted ones on an H100 (45.5 GB/s),
/// and by 2 MiB buckets at 32.0.
const MIN_BUCKET_SHIFT: u32 = 16;

/// Bytes of page-locked memory a [`Gatherer`] keeps for staging indices, by default: room for 8 Mi indices in
/// flight.
const STAGING_BYTES: usize = 32 << 20;

/// What moves the rows of a gather.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GatherEngine {
    /// The kernel for rows under [`Gatherer::COPIES_FROM`] bytes, the copy engines from there.
    #[default]
    Auto,
    /// The crate's gather kernel: the device's threads read the rows over the bus. Best for small rows: one
    /// launch for the whole batch, however many rows.
    Kernel,
    /// The copy engines: one copy per row, all enqueued by one `cuMemcpyBatchAsync_v2` (a driver of CUDA 13.0
    /// or later; an older one makes the gather an `Err`). Each row costs the host time to list and enqueue,
    /// so it pays only for large rows, which the engines move at the link's speed without taking the device's
    /// threads (docs/performance.md, "Where the defaults come from").
    Copies,
}

/// In which order the kernel reads a batch's rows. The output is in the batch's order either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadOrder {
    /// [`ReadOrder::Sorted`] for rows under [`Gatherer::SORT_BELOW`] bytes, [`ReadOrder::Batch`] from there.
    #[default]
    Auto,
    /// The batch's order.
    Batch,
    /// Sorted by where the rows lie in the table: the indices are sorted on the device first (a bucket sort, a
    /// few kernels whose cost grows with the batch, on the gatherer's own stream, so that they run beside the
    /// work queued before the gather), and each row is still written where the batch puts it.
    /// Reads of host memory near each other are much faster over the bus than scattered ones
    /// (docs/performance.md, "Where the defaults come from").
    Sorted,
}

/// How a gather is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatherOptions {
    /// What moves the rows (default [`GatherEngine::Auto`]).
    pub engine: GatherEngine,
    /// (Kernel only.) The order the rows are read in (default [`ReadOrder::Auto`]).
    pub order: ReadOrder,
}

impl GatherOptions {
    /// [`GatherOptions::engine`].
    #[must_use]
    pub fn engine(mut self, engine: GatherEngine) -> GatherOptions {
        self.engine = engine;
        self
    }

    /// [`GatherOptions::order`].
    #[must_use]
    pub fn order(mut self, order: ReadOrder) -> GatherOptions {
        self.order = order;
        self
    }
}

/// The crate's gather kernels, loaded into one context, and the page-locked memory that hands them the
/// indices. Make one per context, before the work it feeds starts (loading a module can wait for work already
/// running on the device), and use it from any thread.
pub struct Gatherer {
    /// `cuda_pinned_gather_{width}` for each of [`WIDTHS`].
    kernels: Vec<Kernel>,
    sort: SortKernels,
    /// Page-locked blocks the indices of gathers in flight are staged in; each goes back once its gather has run.
    staging: PinnedPool,
    /// Where the indices of gathers are uploaded and sorted: work that waits for nothing but other such work, so
    /// a gather waits on the device at most for the indices of gathers enqueued before it. (Except where
    /// device memory runs short: the driver's stream-ordered allocator may then make an allocation here wait for
    /// memory another stream frees, as it may for any of the crate's device buffers.)
    indexer: Stream,
    context: Context,
}

impl Gatherer {
    /// Rows of at least this many bytes are moved by the copy engines under [`GatherEngine::Auto`], smaller
    /// ones by the kernel: where the copies overtook the kernel in every run measured (docs/performance.md,
    /// "Where the defaults come from").
    pub const COPIES_FROM: usize = 256 << 10;

    /// Rows under this many bytes are read sorted under [`ReadOrder::Auto`]: below it the locality of sorted
    /// reads gains more than the sort costs.
    pub const SORT_BELOW: usize = 2 << 10;

    /// Loads the gather kernels into `context`.
    ///
    /// # Errors
    /// The driver's, from loading the module (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION` from a driver older than
    /// the PTX, which CUDA 13 (driver 580) writes).
    pub fn new(context: &Context) -> Result<Gatherer> {
        Gatherer::with_staging(context, STAGING_BYTES)
    }

    /// [`Gatherer::new`], keeping `bytes` of page-locked memory for staging the indices of gathers in flight
    /// (default 32 MiB: 4 bytes per row). A gather that finds no room there does not wait
    /// for others to complete: it pins a buffer of its own, which costs it the pinning (about 0.4 s per GiB).
    ///
    /// # Errors
    /// As [`Gatherer::new`].
    pub fn with_staging(context: &Context, bytes: usize) -> Result<Gatherer> {
        let module = Module::load(context, GATHER_PTX.as_bytes())
            .map_err(|e| e.context("loading the crate's gather kernels"))?;
        let kernels = WIDTHS
            .iter()
            .map(|width| module.kernel(&format!("cuda_pinned_gather_{width}")))
            .collect::<Result<Vec<_>>>()?;
        let sort = SortKernels {
            count: module.kernel("cuda_pinned_gather_count")?,
            tiles: module.kernel("cuda_pinned_gather_tiles")?,
            starts: module.kernel("cuda_pinned_gather_starts")?,
            scatter: module.kernel("cuda_pinned_gather_scatter")?,
        };
        let staging = PinnedPool::builder(context, bytes)
            .when_full(WhenFull::Fail)
            .build();
        Ok(Gatherer {
            kernels,
            sort,
            staging,
            indexer: Stream::new(context)?,
            context: context.clone(),
        })
    }

    /// The context the kernels are loaded in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Enqueues on `stream` a copy of rows of `table` (rows of `row_len` elements, which must divide its
    /// length) into `out`: out row `k` is table row `indices[k]`. `table` is page-locked host memory that the
    /// device reads in place ([`Registered`](crate::Registered), [`Pinned`](crate::Pinned), or a view of
    /// one). Returns once the gather is enqueued; it waits on the device for work on `table` and `out` it
    /// conflicts with, and host access to either, like a copy, waits for it.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, for a row length of 0 or one that does not divide the
    /// table's length (a table meant as a prefix of whole rows is passed as a view of them), an `out` whose length is not
    /// `indices.len() * row_len`, an index past the table's last row, or a stream, `out` or gatherer of
    /// different contexts; the driver's (host memory that is not mapped into the device's address space).
    pub fn gather<T: Pod>(
        &self,
        stream: &Stream,
        table: &impl PinnedSource<T>,
        row_len: usize,
        indices: &[u32],
        out: &mut impl DeviceDestination<T>,
        options: GatherOptions,
    ) -> Result<()> {
        // The indices are copied to the device through staging memory the host writes now.
        stream.refuse_in_capture("Gatherer::gather")?;
        let rows = self.check(stream, table, row_len, indices, out)?;
        if indices.is_empty() || size_of::<T>() == 0 {
            return Ok(());
        }
        let row_bytes = row_len * size_of::<T>();
        let engine = match options.engine {
            GatherEngine::Auto if row_bytes >= Gatherer::COPIES_FROM => GatherEngine::Copies,
            GatherEngine::Auto => GatherEngine::Kernel,
            chosen => chosen,
        };
        if engine == GatherEngine::Copies {
            return copy_rows(stream, table, row_bytes, indices, out);
        }
        // The widest access that divides the row and both addresses the kernel sees: the table's in the
        // device's address space, looked up here, which also refuses memory that is not mapped into the
        // stream's context before anything is enqueued.
        let table_address = {
            let _current = stream.context().enter()?;
            calls::mem_host_get_device_pointer(sealed::PinnedMemory::host_ptr(table)).map_err(|e| {
                e.context(
                    "gathering from page-locked memory that the stream's device cannot read in place (a \
                     Registered or Pinned table of its context is); nothing was enqueued",
                )
            })?
        };
        let (table_address, out_address) = (
            usize::try_from(table_address),
            usize::try_from(sealed::DeviceMemory::device_ptr(out)),
        );
        let (Ok(table_address), Ok(out_address)) = (table_address, out_address) else {
            return Err(Error::invalid(
                "a device address beyond the host's address width",
            ));
        };
        let slot = WIDTHS
            .iter()
            .position(|&w| (row_bytes | table_address | out_address).is_multiple_of(w))
            .expect("every address is a multiple of 1");
        let width = WIDTHS[slot];
        let row_vecs = (row_bytes / width) as u64;
        let count = indices.len() as u64;
        let buckets = Buckets::new(rows, row_bytes, indices.len());
        let sorted = match options.order {
            // One bucket (a table of 64 KiB or less) leaves nothing to sort.
            ReadOrder::Auto => row_bytes < Gatherer::SORT_BELOW && buckets.count > 1,
            ReadOrder::Batch => false,
            ReadOrder::Sorted => true,
        };
        // The indices go to device memory first: every thread of a row reads its index, and a read over the bus
        // before each row's would double the latency the kernel waits on. They are uploaded (and sorted) on the
        // gatherer's own stream, which the gather then waits for on the device: that work needs nothing of
        // `stream`'s, so it runs beside whatever `stream` still has queued (the gather before, in a loop; between
        // two gathers on one stream, an upload of 8 KiB of indices cost 2% of 32 MiB batches on an H100).
        let n = indices.len();
        let mut staged = self.staged(n)?;
        staged.as_mut_slice()?.copy_from_slice(indices);
        let mut on_device = DeviceBuffer::<u32>::uninit(&self.indexer, n)?;
        self.indexer.upload(&staged, &mut on_device)?;
        let order = if sorted {
            Some(self.sorted(&on_device, row_bytes, buckets)?)
        } else {
            None
        };
        let (indices_arg, positions_arg) = match &order {
            Some(order) => (order.slice(..n)?, Some(order.slice(n..)?)),
            None => (on_device.slice(..)?, None),
        };
        let total = n * (row_bytes / width);
        let max_blocks = IN_FLIGHT / (UNROLL * width * BLOCK as usize);
        let blocks = total.div_ceil(UNROLL * BLOCK as usize).clamp(1, max_blocks) as u32;
        let null = 0u64;
        let args = [
            Arg::read_host(table),
            Arg::value(&row_vecs),
            Arg::read(&indices_arg),
            match &positions_arg {
                Some(positions) => Arg::read(positions),
                None => Arg::value(&null),
            },
            Arg::value(&count),
            Arg::write(out),
        ];
        // SAFETY: cuda_pinned_gather_{width} takes (const V*, unsigned long long, const unsigned*, const
        // unsigned*, unsigned long long, V*), V of `width` bytes: one pointer per buffer and 8-byte values, in
        // that order (a null pointer as an 8-byte zero). It reads rows `indices[k] < rows` of the table
        // (checked; sorted, the same indices in another order), the `count` indices and, sorted, the `count`
        // positions (a permutation of 0..count), and writes `count * row_bytes` bytes of `out`, its whole length
        // (checked); it ends by itself.
        unsafe { stream.launch(&self.kernels[slot], LaunchConfig::new(blocks, BLOCK), &args) }
            .map_err(|e| e.context(format_args!("gathering {count} rows of {row_bytes} bytes")))
    }

    /// Enqueues on the gatherer's own stream the sort of `indices` (rows of `row_bytes` bytes, all below the
    /// table's rows) into `buckets`, and returns the buffer it writes: the sorted indices, then each one's
    /// position in the batch.
    fn sorted(
        &self,
        indices: &DeviceBuffer<u32>,
        row_bytes: usize,
        buckets: Buckets,
    ) -> Result<DeviceBuffer<u32>> {
        let stream = &self.indexer;
        let n = indices.len();
        let Buckets {
            shift,
            count: buckets,
        } = buckets;
        let tiles = buckets.div_ceil(TILE);
        let per_tile = LaunchConfig::new(
            u32::try_from(tiles).map_err(|_| {
                Error::invalid(format_args!(
                    "sorting {n} indices into {buckets} buckets, more tiles of them than a grid has blocks; \
                     gather with ReadOrder::Batch"
                ))
            })?,
            SORT_BLOCK,
        );
        let mut bins = DeviceBuffer::<u32>::zeroed(stream, tiles * TILE + tiles)?;
        let mut order = DeviceBuffer::<u32>::uninit(stream, 2 * n)?;
        let (count, row_bytes, shift) = (n as u64, row_bytes as u64, u64::from(shift));
        let spread = LaunchConfig::new(
            n.div_ceil(SORT_BLOCK as usize).min(MAX_SORT_BLOCKS) as u32,
            SORT_BLOCK,
        );
        let failed = |e: Error| e.context(format_args!("sorting {n} indices on the device"));
        // The kernels of the sort (`cuda/gather.cu`) take their parameters in the order given, pointers and 8-byte
        // values; each ends by itself.
        // SAFETY: `count` reads the `n` indices and adds one to each one's bin: every index is below the table's
        // rows, so its bucket is below `buckets`, within `bins`.
        unsafe {
            stream.launch(
                &self.sort.count,
                spread,
                &[
                    Arg::read(indices),
                    Arg::value(&count),
                    Arg::value(&row_bytes),
                    Arg::value(&shift),
                    Arg::write(&mut bins),
                ],
            )
        }
        .map_err(failed)?;
        // SAFETY: one block per tile: each reads its tile of `TILE` bins and writes its sum after the `tiles`
        // tiles, within `bins`.
        unsafe { stream.launch(&self.sort.tiles, per_tile, &[Arg::write(&mut bins)]) }
            .map_err(failed)?;
        // SAFETY: one block per tile: each reads the sums of the tiles before it and rewrites its own tile's bins
        // as their first slots, within `bins`.
        unsafe { stream.launch(&self.sort.starts, per_tile, &[Arg::write(&mut bins)]) }
            .map_err(failed)?;
        // SAFETY: `scatter` reads the `n` indices, takes a slot from each one's bin (the bins hold the buckets'
        // first slots, so the `n` slots taken are distinct and below `n`) and writes the index and its position
        // there, within the `2 * n` elements of `order`.
        unsafe {
            stream.launch(
                &self.sort.scatter,
                spread,
                &[
                    Arg::read(indices),
                    Arg::value(&count),
                    Arg::value(&row_bytes),
                    Arg::value(&shift),
                    Arg::write(&mut bins),
                    Arg::write(&mut order),
                ],
            )
        }
        .map_err(failed)?;
        Ok(order)
    }

    /// Checks a gather before anything is enqueued; returns the table's number of whole rows.
    fn check<T: Pod>(
        &self,
        stream: &Stream,
        table: &impl PinnedSource<T>,
        row_len: usize,
        indices: &[u32],
        out: &impl DeviceDestination<T>,
    ) -> Result<usize> {
        if row_len == 0 {
            return Err(Error::invalid(
                "gathering rows of 0 elements; nothing was enqueued",
            ));
        }
        if stream.context() != &self.context || out.context() != &self.context {
            return Err(Error::invalid(format_args!(
                "gathering on a stream of device {} into memory of device {} with kernels loaded on device {}; \
                 nothing was enqueued",
                stream.context().device().ordinal(),
                out.context().device().ordinal(),
                self.context.device().ordinal()
            )));
        }
        if u32::try_from(indices.len()).is_err() {
            return Err(Error::invalid(format_args!(
                "gathering {} rows at once, more than 2^32 - 1; split the batch; nothing was enqueued",
                indices.len()
            )));
        }
        let rows = whole_rows(sealed::PinnedMemory::elements(table), row_len)?;
        let wanted = indices.len().checked_mul(row_len);
        if wanted != Some(out.len()) {
            return Err(Error::invalid(format_args!(
                "gathering {} rows of {row_len} elements into {} elements; nothing was enqueued",
                indices.len(),
                out.len()
            )));
        }
        if let Some((k, &index)) = indices
            .iter()
            .enumerate()
            .find(|&(_, &index)| index as usize >= rows)
        {
            return Err(Error::invalid(format_args!(
                "gathering row {index} (index {k} of the batch) of a table of {rows} rows; nothing was enqueued"
            )));
        }
        Ok(rows)
    }

    /// `len` elements of page-locked memory to stage indices in: from the gatherer's pool, or, where it has no
    /// room (gathers in flight hold it), pinned for this gather alone, so that no gather waits for another's
    /// work to complete (which may be queued behind unrelated work on another stream).
    fn staged(&self, len: usize) -> Result<Pinned<u32>> {
        match self.staging.try_alloc::<u32>(len) {
            Err(Error::PoolExhausted { .. }) => Pinned::zeroed(&self.context, len),
            other => other,
        }
        .map_err(|e| e.context("staging a gather's indices"))
    }
}

/// How the device's sort groups a batch's indices: by bucket of the table, `index * row_bytes >> shift`. A bucket
/// is a power of two of bytes, at least 64 KiB and about four times the table's bytes per index of the batch, so
/// there are about as many buckets as indices (fewer for batches denser than one index per 16 KiB), and the
/// sort's time and memory grow with the batch, not the table.
#[derive(Clone, Copy)]
struct Buckets {
    shift: u32,
    count: usize,
}

impl Buckets {
    /// For `n > 0` indices into a table of `rows > 0` rows of `row_bytes` bytes.
    fn new(rows: usize, row_bytes: usize, n: usize) -> Buckets {
        let table_bytes = (rows * row_bytes) as u64;
        let spacing = (table_bytes / n as u64).max(1);
        let shift = (spacing.ilog2() + 2).clamp(MIN_BUCKET_SHIFT, u64::BITS - 1);
        Buckets {
            shift,
            count: ((table_bytes - 1) >> shift) as usize + 1,
        }
    }
}

/// The kernels of the device's sort of a batch's indices (`cuda/gather.cu`).
struct SortKernels {
    count: Kernel,
    tiles: Kernel,
    starts: Kernel,
    scatter: Kernel,
}

/// Blocks of the sort's kernels over the indices at most (they stride over the rest).
const MAX_SORT_BLOCKS: usize = 1024;

/// The copy engine's gather: one copy per row, from the table's page-locked memory (at its host address: unified
/// addressing) into `out`, enqueued by one driver call and tracked as one piece of work that reads the table and
/// writes `out`. The arguments are checked.
fn copy_rows<T: Pod>(
    stream: &Stream,
    table: &impl PinnedSource<T>,
    row_bytes: usize,
    indices: &[u32],
    out: &mut impl DeviceDestination<T>,
) -> Result<()> {
    let table_base = sealed::PinnedMemory::host_ptr(table) as u64;
    let out_base = sealed::DeviceMemory::device_ptr(out);
    let row = row_bytes as u64;
    let mut srcs: Vec<u64> = indices
        .iter()
        .map(|&index| table_base + u64::from(index) * row)
        .collect();
    let mut dsts: Vec<u64> = (0..indices.len() as u64)
        .map(|k| out_base + k * row)
        .collect();
    let mut sizes = vec![row_bytes; indices.len()];
    let mut uses = [
        (sealed::PinnedMemory::track(table), Access::Read),
        (sealed::DeviceMemory::track(out), Access::Write),
    ];
    let bytes = row_bytes * indices.len();
    let work = Work::Timed(Category::Upload, "gather", bytes);
    stream
        .tracked_uses(work, &mut uses, || {
            // SAFETY: every source is a whole row of the table (indices checked against its length), every
            // destination a distinct row of `out` (its length checked), both page-locked or device memory that
            // the trackers keep alive and ordered until the copies have completed.
            unsafe { calls::memcpy_batch_async(&mut dsts, &mut srcs, &mut sizes, stream.as_raw()) }
        })
        .map_err(|e| {
            e.context(format_args!(
                "copying {} rows of {row_bytes} bytes",
                indices.len()
            ))
        })
}

mod table;

pub use table::RowTable;
use table::whole_rows;

impl fmt::Debug for Gatherer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gatherer")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}
