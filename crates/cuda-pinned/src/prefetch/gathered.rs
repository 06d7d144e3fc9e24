//! [`GatherBatch`]: a batch of a [`Prefetcher`](crate::Prefetcher) whose rows are gathered on the device from a
//! [`RowTable`], so that the host's work per batch is only its indices.

use std::fmt;
use std::sync::Arc;

use bytemuck::Pod;

use super::{Batch, DeviceParts};
use crate::copy::PinnedSource;
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::gather::RowTable;
use crate::memory::{DeviceBuffer, PinnedPool};

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
        let len = rows.checked_mul(table.row_len()).ok_or_else(|| {
            Error::invalid(format_args!(
                "batches of {rows} rows of {} elements",
                table.row_len()
            ))
        })?;
        DeviceBuffer::uninit(stream, len)
    }

    fn upload(&self, stream: &Stream, device: &mut DeviceBuffer<T>) -> Result<()> {
        self.table.gather_into(stream, &self.indices, device)
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
