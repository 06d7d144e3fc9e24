//! [`RowTable`]: a table of rows in page-locked host memory with the [`Gatherer`] that reads it, shared by the
//! workers of a prefetcher of gathered batches.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use super::{GatherOptions, Gatherer};
use crate::copy::{PinnedSource, sealed};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, Pinned};

// The tables a `RowTable` shares between a prefetcher's workers.
const _: () = {
    const fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Pinned<f32>>();
    shared_between_threads::<crate::Registered<f32>>();
};

/// A table of rows in page-locked host memory, with the [`Gatherer`] that reads it and how: the source of a
/// [`Prefetcher`](crate::Prefetcher) of gathered batches ([`GatherBatch`](crate::prefetch::GatherBatch)), shared by its workers.
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
    /// An invalid-argument error for a row length of 0, or one that does not divide the table's length.
    pub fn new(
        gatherer: Gatherer,
        table: M,
        row_len: usize,
        options: GatherOptions,
    ) -> Result<Arc<RowTable<T, M>>> {
        if row_len == 0 {
            return Err(Error::invalid("a table of rows of 0 elements"));
        }
        whole_rows(sealed::PinnedMemory::elements(&table), row_len)?;
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

    /// The number of rows.
    #[must_use]
    pub fn rows(&self) -> usize {
        sealed::PinnedMemory::elements(&self.table) / self.row_len
    }
}

/// How many rows of `row_len` (not 0) elements a table of `elements` holds: an error if a partial row would be
/// left over, which a wrong row length that happens to fit makes (its rows would come out wrong, silently).
pub(super) fn whole_rows(elements: usize, row_len: usize) -> Result<usize> {
    if !elements.is_multiple_of(row_len) {
        return Err(Error::invalid(format_args!(
            "a table of {elements} elements is not made of rows of {row_len} elements ({} left over): check the \
             row length, or pass a view of the whole rows meant; nothing was enqueued",
            elements % row_len
        )));
    }
    Ok(elements / row_len)
}

impl<T: Pod, M> fmt::Debug for RowTable<T, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowTable")
            .field("row_len", &self.row_len)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<T: Pod, M: PinnedSource<T>> RowTable<T, M> {
    /// Gathers the rows at `indices` into `out` on `stream`, as [`Gatherer::gather`] does with the table's
    /// options.
    ///
    /// # Errors
    /// As [`Gatherer::gather`].
    pub(crate) fn gather_into(
        &self,
        stream: &Stream,
        indices: &[u32],
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.gatherer.gather(
            stream,
            &self.table,
            self.row_len,
            indices,
            out,
            self.options,
        )
    }
}
