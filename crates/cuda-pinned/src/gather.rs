//! Gathering rows on the device: rows of a table in page-locked host memory copied into device memory by index,
//! read by the device itself, so the host only says which rows.
//!
//! A training step that samples rows (embeddings, records of a dataset) would otherwise gather them on the CPU
//! into pinned memory and upload that: every byte then crosses host memory twice, and the host's memory
//! bandwidth bounds the feed. Here the table is page-locked once, in place ([`Registered`](crate::Registered)
//! or [`Pinned`](crate::Pinned): both are mapped into the device's address space), and a kernel of the crate
//! reads the rows it is given straight over the bus. Host writes to the table wait for gathers that read it,
//! and the table is unpinned only after them, as for any copy.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use crate::copy::{DeviceDestination, PinnedSource, sealed};
use crate::driver::{Category, Context, Stream, calls};
use crate::error::{Error, Result};
use crate::launch::{Arg, Kernel, LaunchConfig, Module};
use crate::memory::{DeviceBuffer, Pinned, PinnedPool, WhenFull, Work};
use crate::prefetch::{Batch, DeviceParts};
use crate::track::Access;

/// The gather kernels (`cuda/gather.cu`, compiled to PTX by `scripts/gather-ptx.sh`): the driver compiles them
/// for the device when [`Gatherer::new`] loads them, so building the crate needs no CUDA compiler.
const GATHER_PTX: &str = include_str!("gather.ptx");

/// The access widths of the kernels, widest first: `cuda_pinned_gather_{width}` moves `width` bytes per access.
const WIDTHS: [usize; 5] = [16, 8, 4, 2, 1];

/// Threads per block of the gather kernel.
const BLOCK: u32 = 256;

/// Bytes of host memory the kernel reads at once, one access per thread: what a grid of `IN_FLIGHT / width /
/// BLOCK` blocks keeps in flight, striding over the rest of the batch. Reads over the bus need this much in
/// flight to fill the link (bandwidth x latency), and no more: a grid that covers the whole batch kept every
/// SM waiting on the bus and the compute sharing the GPU starved. On an H100, 32 blocks of 16-byte reads (128
/// KiB) gathered 16 KiB rows at 48.8 GB/s, faster than 4096 blocks (45.6), and a training loop's axpy beside
/// them took 17.9 ms instead of 209.8 (`pinbench gather`, `pinbench train-loop`).
const IN_FLIGHT: usize = 128 << 10;

/// Bytes of page-locked memory a [`Gatherer`] keeps for staging indices, by default: room for 4 Mi rows in
/// flight, sorted (indices and positions).
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
    /// or later; an older one makes the gather an `Err`). Each row costs the host about a microsecond and a
    /// half to list and enqueue (H100 host), so it pays only for large rows, which the engines move at the
    /// link's speed without taking the device's threads.
    Copies,
}

/// How a gather is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatherOptions {
    /// What moves the rows (default [`GatherEngine::Auto`]).
    pub engine: GatherEngine,
    /// (Kernel only.) Read the rows grouped by the 2 MiB region of the table they lie in (the output keeps the
    /// batch's order). Reads of host memory that are near each other are faster over the bus than scattered
    /// ones (on an H100, 256-byte rows 20 GB/s against 11), for a counting sort of the indices on the host
    /// (linear in the batch: about 3 ms for 256 Ki indices there).
    pub sort: bool,
}

impl GatherOptions {
    /// [`GatherOptions::engine`].
    #[must_use]
    pub fn engine(mut self, engine: GatherEngine) -> GatherOptions {
        self.engine = engine;
        self
    }

    /// [`GatherOptions::sort`].
    #[must_use]
    pub fn sort(mut self, sort: bool) -> GatherOptions {
        self.sort = sort;
        self
    }
}

/// The crate's gather kernels, loaded into one context, and the page-locked memory that hands them the
/// indices. Make one per context, before the work it feeds starts (loading a module can wait for work already
/// running on the device), and use it from any thread.
pub struct Gatherer {
    kernels: Vec<Kernel>,
    /// Page-locked blocks the indices (and positions) of gathers in flight are staged in; each goes back
    /// once its gather has run.
    staging: PinnedPool,
    context: Context,
}

impl Gatherer {
    /// Rows of at least this many bytes are moved by the copy engines under [`GatherEngine::Auto`], smaller
    /// ones by the kernel: where the copies overtook the kernel in every run on an H100 (`pinbench gather`:
    /// 256 KiB rows 49.3 and 52.6 GB/s by copies against 47.1 and 47.5 by the kernel; at 64 KiB the kernel
    /// won one run, 47.4 against 42.5, and the copies the other, 49.5 against 48.2).
    pub const COPIES_FROM: usize = 256 << 10;

    /// Loads the gather kernels into `context`.
    ///
    /// # Errors
    /// The driver's, from loading the module (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION` from a driver older than
    /// the PTX, which CUDA 13 (driver 580) writes).
    pub fn new(context: &Context) -> Result<Gatherer> {
        Gatherer::with_staging(context, STAGING_BYTES)
    }

    /// [`Gatherer::new`], keeping `bytes` of page-locked memory for staging the indices of gathers in flight
    /// (default 32 MiB: 4 bytes per row, twice that sorted). A gather that finds no room there does not wait
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
        let staging = PinnedPool::builder(context, bytes)
            .when_full(WhenFull::Fail)
            .build();
        Ok(Gatherer {
            kernels,
            staging,
            context: context.clone(),
        })
    }

    /// The context the kernels are loaded in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.context
    }

    /// Enqueues on `stream` a copy of rows of `table` (rows of `row_len` elements, the last partial one not
    /// counted) into `out`: out row `k` is table row `indices[k]`. `table` is page-locked host memory that the
    /// device reads in place ([`Registered`](crate::Registered), [`Pinned`](crate::Pinned), or a view of
    /// one). Returns once the gather is enqueued; it waits on the device for work on `table` and `out` it
    /// conflicts with, and host access to either, like a copy, waits for it.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, for a row length of 0, an `out` whose length is not
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
        self.check(stream, table, row_len, indices, out)?;
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
        // The indices (and positions) go to device memory first: every thread of a row reads its index, and a
        // read over the bus before each row's would double the latency the kernel waits on.
        let staged = self.stage(indices, row_bytes, options)?;
        let mut on_device = DeviceBuffer::<u32>::uninit(stream, staged.len())?;
        stream.upload(&staged, &mut on_device)?;
        let n = indices.len();
        let total = n * (row_bytes / width);
        let max_blocks = IN_FLIGHT / width / BLOCK as usize;
        let blocks = total.div_ceil(BLOCK as usize).clamp(1, max_blocks) as u32;
        let null = 0u64;
        let indices_arg = on_device.slice(..n)?;
        let positions_arg = on_device.slice(n..)?;
        let args = [
            Arg::read_host(table),
            Arg::value(&row_vecs),
            Arg::read(&indices_arg),
            if options.sort {
                Arg::read(&positions_arg)
            } else {
                Arg::value(&null)
            },
            Arg::value(&count),
            Arg::write(out),
        ];
        // SAFETY: cuda_pinned_gather_{width} takes (const V*, unsigned long long, const unsigned*, const
        // unsigned*, unsigned long long, V*), V of `width` bytes: one pointer per buffer and 8-byte values, in
        // that order (a null pointer as an 8-byte zero). It reads rows `indices[k] < rows` of the table
        // (checked), the `count` indices of the device buffer and, sorted, the `count` positions after them (a
        // permutation of 0..count), and writes `count * row_bytes` bytes of `out`, its whole length (checked); it
        // ends by itself.
        unsafe { stream.launch(&self.kernels[slot], LaunchConfig::new(blocks, BLOCK), &args) }
            .map_err(|e| e.context(format_args!("gathering {count} rows of {row_bytes} bytes")))
    }

    /// Checks a gather before anything is enqueued.
    fn check<T: Pod>(
        &self,
        stream: &Stream,
        table: &impl PinnedSource<T>,
        row_len: usize,
        indices: &[u32],
        out: &impl DeviceDestination<T>,
    ) -> Result<()> {
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
        let rows = sealed::PinnedMemory::elements(table) / row_len;
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
        Ok(())
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

    /// The indices in page-locked memory, followed, if `options` sorts, by each one's output position: sorted
    /// by the 2 MiB region of the table their row starts in (a counting sort: two passes over the batch, so
    /// the host's cost stays linear), which is the locality that reads over the bus gain from.
    fn stage(
        &self,
        indices: &[u32],
        row_bytes: usize,
        options: GatherOptions,
    ) -> Result<Pinned<u32>> {
        if !options.sort {
            let mut staged = self.staged(indices.len())?;
            staged.as_mut_slice()?.copy_from_slice(indices);
            return Ok(staged);
        }
        const REGION: u32 = 21;
        let region = |index: u32| ((u64::from(index) * row_bytes as u64) >> REGION) as usize;
        let regions = indices
            .iter()
            .map(|&i| region(i))
            .max()
            .map_or(0, |r| r + 1);
        let mut starts = vec![0u32; regions + 1];
        for &index in indices {
            starts[region(index) + 1] += 1;
        }
        for r in 1..starts.len() {
            starts[r] += starts[r - 1];
        }
        let n = indices.len();
        let mut staged = self.staged(2 * n)?;
        let (sorted, positions) = staged.as_mut_slice()?.split_at_mut(n);
        for (position, &index) in (0u32..).zip(indices) {
            let slot = &mut starts[region(index)];
            sorted[*slot as usize] = index;
            positions[*slot as usize] = position;
            *slot += 1;
        }
        Ok(staged)
    }
}

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
    // Unlike a single copy, the batched call takes its context from the calling thread, not the stream (driver
    // 580 refuses it with CUDA_ERROR_INVALID_VALUE where none is current).
    let _current = stream.context().enter()?;
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

/// A table of rows in page-locked host memory, with the [`Gatherer`] that reads it and how: the source of a
/// [`Prefetcher`](crate::Prefetcher) of gathered batches ([`GatherBatch`]), shared by its workers.
pub struct RowTable<T: Pod, M> {
    gatherer: Gatherer,
    table: M,
    row_len: usize,
    options: GatherOptions,
    _rows: PhantomData<fn() -> T>,
}

impl<T: Pod, M: PinnedSource<T>> RowTable<T, M> {
    /// `table` (a [`Registered`](crate::Registered) or [`Pinned`] buffer, say) read as rows of `row_len`
    /// elements by `gatherer`, with `options`.
    ///
    /// # Errors
    /// An invalid-argument error for a row length of 0.
    pub fn new(
        gatherer: Gatherer,
        table: M,
        row_len: usize,
        options: GatherOptions,
    ) -> Result<Arc<RowTable<T, M>>> {
        if row_len == 0 {
            return Err(Error::invalid("a table of rows of 0 elements"));
        }
        Ok(Arc::new(RowTable {
            gatherer,
            table,
            row_len,
            options,
            _rows: PhantomData,
        }))
    }

    /// The table's memory.
    pub fn table(&self) -> &M {
        &self.table
    }

    /// Elements per row.
    #[must_use]
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// The number of whole rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        sealed::PinnedMemory::elements(&self.table) / self.row_len
    }
}

impl<T: Pod, M> fmt::Debug for RowTable<T, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowTable")
            .field("row_len", &self.row_len)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A batch of rows gathered on the device, for a [`Prefetcher`](crate::Prefetcher): the host side is the
/// batch's row indices, which the fill closure writes, and the "upload" is the gather of those rows from the
/// [`RowTable`] into the batch's device buffer (on the prefetcher's copy stream). The host's work per batch is
/// only its indices. Its layout is the table and the number of rows per batch.
///
/// ```no_run
/// use cuda_pinned::prefetch::GatherBatch;
/// use cuda_pinned::{Context, GatherOptions, Gatherer, PinnedPool, Prefetcher, Registered, RowTable, Stream};
///
/// fn feed(dataset: Vec<f32>, row_len: usize) -> cuda_pinned::Result<()> {
///     let context = Context::on(0)?;
///     let compute = Stream::new(&context)?;
///     let table = Registered::new(&context, dataset)?; // page-locked in place
///     let rows = RowTable::new(Gatherer::new(&context)?, table, row_len, GatherOptions::default())?;
///     let unused = PinnedPool::new(&context, 0); // gathered batches take no pinned memory of the pool
///     let batches = Prefetcher::<GatherBatch<f32, Registered<f32>>>::builder(&unused, &compute, (rows, 4096))
///         .batches(100)
///         .build(|i, batch| {
///             let rows = batch.table().rows() as u64;
///             batch.indices.clear();
///             batch.indices.extend((0..4096u64).map(|k| ((i as u64 * 4096 + k) * 7919 % rows) as u32));
///             Ok(())
///         })?;
///     for batch in batches {
///         let _rows = batch?; // 4096 rows, ready on `compute`
///     }
///     Ok(())
/// }
/// ```
pub struct GatherBatch<T: Pod, M> {
    /// The table rows of the batch, in order: `rows` of them (the layout's), each below the table's row count.
    pub indices: Vec<u32>,
    table: Arc<RowTable<T, M>>,
}

impl<T: Pod, M> GatherBatch<T, M> {
    /// The table the batch is gathered from.
    #[must_use]
    pub fn table(&self) -> &RowTable<T, M> {
        &self.table
    }
}

impl<T, M> Batch for GatherBatch<T, M>
where
    T: Pod + Send + Sync,
    M: PinnedSource<T> + Send + Sync + 'static,
{
    /// The table, and the rows per batch.
    type Layout = (Arc<RowTable<T, M>>, usize);
    type Device = DeviceBuffer<T>;

    fn alloc_host(_pool: &PinnedPool, (table, rows): &Self::Layout) -> Result<Self> {
        Ok(GatherBatch {
            indices: Vec::with_capacity(*rows),
            table: table.clone(),
        })
    }

    fn alloc_device(stream: &Stream, (table, rows): &Self::Layout) -> Result<DeviceBuffer<T>> {
        let len = rows.checked_mul(table.row_len).ok_or_else(|| {
            Error::invalid(format_args!(
                "batches of {rows} rows of {} elements",
                table.row_len
            ))
        })?;
        DeviceBuffer::uninit(stream, len)
    }

    fn upload(&self, stream: &Stream, device: &mut DeviceBuffer<T>) -> Result<()> {
        let table = &self.table;
        table.gatherer.gather(
            stream,
            &table.table,
            table.row_len,
            &self.indices,
            device,
            table.options,
        )
    }

    fn device_parts<'a>(device: &'a DeviceBuffer<T>, parts: &mut DeviceParts<'a>) {
        parts.add(device);
    }
}

impl<T: Pod, M> fmt::Debug for GatherBatch<T, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatherBatch")
            .field("indices", &self.indices.len())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Gatherer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gatherer")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}
