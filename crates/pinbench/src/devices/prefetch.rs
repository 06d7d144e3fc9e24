//! The prefetched gathers: [`Prefetcher::sharded`] feeding device 0 alone, then every device at once, each feed
//! a [`GatherBatch`] prefetcher whose one worker writes a batch's row indices and whose gather kernel, on the
//! feed's device, reads those rows over the bus from one table of mapped, portable pinned memory that every
//! device's [`RowTable`] shares (an `Arc<Pinned<u8>>`), as train-loop's fifth way does on one device.
//!
//! The workers of a sharded prefetcher start gathering as soon as it is built, so each one's fill waits at a gate
//! that opens at the common start, once the prefetchers are built and their consumer threads started: building
//! (the slots' device memory, the copy streams, the threads) is not timed, and no batch is gathered before the
//! clock starts. Each consumer thread takes its device's batches and drops them (the consumer does no work, so
//! the gathers run back to back), then synchronizes its consumer stream, which waited on the device for every
//! batch's gather. A round's time is the host's wall time from the gate's opening to the last thread's end.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use cuda_pinned::prefetch::GatherBatch;
use cuda_pinned::{
    Context, GatherOptions, Gatherer, Pinned, PinnedBuilder, PinnedPool, Placement, Prefetched,
    Prefetcher, RowTable, Stream,
};

use super::measure::Seeds;
use super::{Fed, PrefetchedGathers, Settings};
use crate::Outcome;
use crate::results::size_label;
use crate::timing::{fill_pattern, median};

/// Bytes of a row: 16 KiB, train-loop's samples.
pub const ROW_BYTES: usize = 16 << 10;
/// Bytes of a batch: 32 MiB (2048 rows), train-loop's.
pub const BATCH_BYTES: usize = crate::cli::BATCH_BYTES;
/// Bytes of the table of the full run.
pub const FULL_TABLE_BYTES: usize = 4 << 30;
/// Bytes of the table with `--quick`.
pub const QUICK_TABLE_BYTES: usize = 1 << 30;

/// Slots per feed: batches gathered ahead of its consumer.
const DEPTH: usize = 4;
/// Batches per device of the untimed first pass, whose first batch on each device is checked.
const WARMUP_BATCHES: usize = 2;

/// The table, shared by every device's [`RowTable`].
type Table = Arc<Pinned<u8>>;
/// A batch of rows gathered from it.
type Rows = GatherBatch<u8, Table>;

/// One device's feed: the stream its batches are used on, and its gatherer's view of the table.
struct Feed {
    consumer: Stream,
    rows: Arc<RowTable<u8, Table>>,
}

/// Measures the prefetched gathers on every device of `contexts` (device 0 first).
///
/// # Errors
/// The crate's, from pinning and filling the table and from the prefetchers; not from loading the gather kernels
/// on a device, which leaves the figure unmeasured with the driver's words (a driver older than the kernels'
/// PTX, or a simulator without their stand-ins).
pub(super) fn prefetched_gathers(
    contexts: &[Context],
    settings: &Settings,
    seeds: &mut Seeds,
) -> Outcome<PrefetchedGathers> {
    let first = contexts
        .first()
        .ok_or("prefetched gathers: no device to feed")?;
    let figure = |result| -> Outcome<PrefetchedGathers> {
        Ok(PrefetchedGathers {
            devices: contexts.iter().map(|c| c.device().ordinal()).collect(),
            table_bytes: settings.table_bytes,
            // Where the table is pinned: `PinnedBuilder`'s default placement, for device 0.
            table_numa_node: Placement::DeviceNode.node(first.device())?,
            row_bytes: ROW_BYTES,
            bytes_per_batch: BATCH_BYTES,
            batches_per_device: settings.gather_batches,
            result,
        })
    };
    let mut gatherers = Vec::with_capacity(contexts.len());
    for context in contexts {
        match Gatherer::new(context) {
            Ok(gatherer) => gatherers.push(gatherer),
            Err(e) => {
                let why = format!(
                    "device {}'s gather kernels: {e}",
                    context.device().ordinal()
                );
                eprintln!("pinbench devices: prefetched gathers not measured: {why}");
                return figure(Err(why));
            }
        }
    }
    eprintln!(
        "pinbench devices: prefetched gathers: pinning a table of {} (mapped, portable) and filling it",
        size_label(settings.table_bytes)
    );
    let mut table = PinnedBuilder::new(first)
        .device_mapped(true)
        .zeroed::<u8>(settings.table_bytes)?;
    fill_rows(table.as_mut_slice()?, seeds.next());
    let table = Arc::new(table);
    let feeds = gatherers
        .into_iter()
        .map(|gatherer| {
            let consumer = Stream::new(gatherer.context())?;
            let rows = RowTable::new(gatherer, table.clone(), ROW_BYTES, GatherOptions::default())?;
            Ok(Feed { consumer, rows })
        })
        .collect::<Outcome<Vec<Feed>>>()?;

    // Loads what the first gathers load, and checks one batch per device.
    let (_, verified) = pass(&feeds, WARMUP_BATCHES, seeds.next(), Some(&table))?;
    let mut timed = |feeds: &[Feed], what: &str| -> Outcome<f64> {
        eprintln!("pinbench devices: prefetched gathers: {what}");
        let rounds = (0..settings.gather_rounds)
            .map(|_| Ok(pass(feeds, settings.gather_batches, seeds.next(), None)?.0))
            .collect::<Outcome<Vec<f64>>>()?;
        Ok(median(rounds))
    };
    let one = timed(&feeds[..1], "device 0 alone")?;
    let all = if feeds.len() == 1 {
        // All devices are device 0: the same figure, not a second measurement of it.
        one
    } else {
        timed(&feeds, &format!("all {} devices at once", feeds.len()))?
    };
    figure(Ok(Fed {
        one_device_seconds: one,
        all_devices_seconds: all,
        rounds: settings.gather_rounds,
        verified,
    }))
}

/// Fills the table, row by row, each with the pattern of its own seed, so that a gather that brings the wrong row
/// (or nothing) shows. On every core: the table is gigabytes.
fn fill_rows(table: &mut [u8], seed: u64) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows_per_thread = (table.len() / ROW_BYTES).div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (part, chunk) in table.chunks_mut(rows_per_thread * ROW_BYTES).enumerate() {
            scope.spawn(move || {
                for (k, row) in chunk.chunks_mut(ROW_BYTES).enumerate() {
                    let index = (part * rows_per_thread + k) as u64;
                    fill_pattern(row, row_seed(seed, index));
                }
            });
        }
    });
}

/// The pattern's seed of row `index` of the table filled with `seed`.
fn row_seed(seed: u64, index: u64) -> u64 {
    seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Row `k` of batch `batch` of a pass salted with `salt`, of a table of `rows` rows (at most 2^32): a cheap
/// deterministic stand-in for a shuffled sampler (splitmix64).
pub(super) fn row_of(salt: u64, batch: usize, k: usize, rows: usize) -> u32 {
    let key = ((batch as u64) << 32) | k as u64;
    let mut z = salt.wrapping_add(key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    u32::try_from(z % rows.max(1) as u64).expect("a table of at most 2^32 rows")
}

/// Where the workers' fills wait for the common start.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = self
                .opened
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }
}

/// Opens the gate when dropped: on every way out of a pass, so that no worker is left waiting at it (dropping a
/// prefetcher joins its workers).
struct Opener<'a>(&'a Gate);

impl Drop for Opener<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// What one consumer thread brings back: when it was done, and whether its checked batch (if any) was right.
type ThreadResult = Result<(Instant, bool), String>;

/// One pass: `per_device` batches to each of `feeds` through one sharded prefetcher, the rows of each batch
/// picked with `salt`. Returns the wall time from the gate's opening to the last consumer's end, and, with
/// `check` (the table), whether each device's first batch holds the rows it names.
fn pass(
    feeds: &[Feed],
    per_device: usize,
    salt: u64,
    check: Option<&Pinned<u8>>,
) -> Outcome<(f64, bool)> {
    let per_batch = BATCH_BYTES / ROW_BYTES;
    // Gathered batches take no pinned memory of the pool: their host side is the indices.
    let pool = PinnedPool::new(feeds[0].consumer.context(), 0);
    let gate = Arc::new(Gate::default());
    let prefetchers = {
        let gate = gate.clone();
        Prefetcher::<Rows>::sharded(
            &pool,
            feeds
                .iter()
                .map(|f| (f.consumer.clone(), (f.rows.clone(), per_batch))),
        )
        .batches(per_device * feeds.len())
        .workers(1)
        .depth(DEPTH)
        .build(move |index, batch: &mut Rows| {
            gate.wait();
            let rows = batch.table().rows();
            batch.indices.clear();
            batch
                .indices
                .extend((0..per_batch).map(|k| row_of(salt, index, k, rows)));
            Ok(())
        })?
    };
    let (start, results) = std::thread::scope(|scope| {
        let opener = Opener(&gate);
        let threads: Vec<_> = prefetchers
            .into_iter()
            .zip(feeds)
            .map(|(prefetcher, feed)| {
                scope.spawn(move || consume(prefetcher, &feed.consumer, check))
            })
            .collect();
        let start = Instant::now();
        drop(opener);
        let results: Vec<ThreadResult> = threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a consumer thread panicked".to_string()))
            })
            .collect();
        (start, results)
    });
    let mut end = start;
    let mut verified = true;
    for result in results {
        let (done, ok) = result?;
        end = end.max(done);
        verified &= ok;
    }
    Ok((end.duration_since(start).as_secs_f64(), verified))
}

/// A consumer thread: takes every batch of `prefetcher` and drops it, checking the first against `check` (the
/// table) if given, then synchronizes `consumer`.
fn consume(
    prefetcher: Prefetcher<Rows>,
    consumer: &Stream,
    check: Option<&Pinned<u8>>,
) -> ThreadResult {
    let mut verified = true;
    let mut unchecked = check;
    for batch in prefetcher {
        let batch = batch.map_err(|e| e.to_string())?;
        if let Some(table) = unchecked.take() {
            verified = holds_its_rows(&batch, consumer, table).map_err(|e| e.to_string())?;
        }
    }
    consumer.synchronize().map_err(|e| e.to_string())?;
    Ok((Instant::now(), verified))
}

/// Whether `batch`, downloaded on its consumer stream, holds the rows of `table` its indices name, in their order.
fn holds_its_rows(
    batch: &Prefetched<Rows>,
    consumer: &Stream,
    table: &Pinned<u8>,
) -> cuda_pinned::Result<bool> {
    let mut got = vec![0u8; batch.len()];
    consumer.download_pageable(&**batch, &mut got)?;
    let table = table.as_slice()?;
    let indices = &batch.host().indices;
    Ok(got.len() == indices.len() * ROW_BYTES
        && indices
            .iter()
            .zip(got.chunks_exact(ROW_BYTES))
            .all(|(&index, row)| {
                let at = index as usize * ROW_BYTES;
                table.get(at..at + ROW_BYTES) == Some(row)
            }))
}
