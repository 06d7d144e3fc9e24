//! `pinbench gather`: rows gathered by random index from a large page-locked table into device memory, by the
//! crate's gather kernel (rows read in place over the bus, in the batch's order and sorted on the device), by the
//! copy engines (one copy per row, enqueued by one `cuMemcpyBatchAsync`) and by the CPU (all cores gather into
//! pinned memory, then one upload), against a contiguous pinned upload of the same bytes in the same run; and
//! the host time of enqueueing 64 small copies one call each against one batched call.

use std::fmt::Write as _;
use std::time::Instant;

use std::ffi::c_void;

use cuda_pinned::sys::{CUmemcpyAttributes, CUmemcpySrcAccessOrder};
use cuda_pinned::{
    Context, DeviceBuffer, GatherEngine, GatherOptions, Gatherer, Pinned, PinnedBuilder,
    PinnedSource, ReadOrder, Registered, Stream, driver_call,
};
use serde::Serialize;

use crate::Outcome;
use crate::timing::{Stopwatch, median};

/// Row sizes measured, bytes.
pub const ROWS: [usize; 7] = [64, 256, 1024, 4096, 16384, 65536, 262_144];

/// Bytes of rows per batch (on a GPU).
pub const BATCH_BYTES: usize = 64 << 20;

/// Gathers enqueued one after another per timed sample, after an untimed lead gather: the device time runs from
/// the lead's end, so the host's work on each (staging its indices, enqueueing) overlaps the device's on the one
/// before, as when a loop feeds batches, and the figure is the device's rate, not the host's first call.
const BACK_TO_BACK: usize = 4;

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Bytes of the table.
    pub table_bytes: usize,
    /// Bytes of rows per batch.
    pub batch_bytes: usize,
    /// Timed repetitions of each figure.
    pub samples: usize,
    /// Threads of the CPU gather.
    pub threads: usize,
}

impl Settings {
    /// A 4 GiB table (1 GiB with `quick`), batches of [`BATCH_BYTES`], 7 repetitions (3), the CPU's cores (at
    /// most 16). On the simulated driver, whose kernels run on the host one row at a time, a 64 MiB table,
    /// batches of 1 MiB and 2 repetitions: enough to run every figure and check every batch.
    #[must_use]
    pub fn new(quick: bool, simulated: bool) -> Settings {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get().min(16));
        let (table_bytes, batch_bytes, samples) = match (simulated, quick) {
            (true, _) => (64 << 20, 1 << 20, 2),
            (false, true) => (1 << 30, BATCH_BYTES, 3),
            (false, false) => (4 << 30, BATCH_BYTES, 7),
        };
        Settings {
            table_bytes,
            batch_bytes,
            samples,
            threads: cores,
        }
    }
}

/// The figures of one row size, GB/s of gathered bytes (decimal), medians.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub row_bytes: usize,
    pub rows_per_batch: usize,
    /// The gather kernel, rows in the batch's (random) order: device time of gathers enqueued back to back.
    pub kernel_gbps: f64,
    /// The gather kernel, rows read sorted (the indices sorted on the device first, inside the timed device
    /// time), back to back.
    pub kernel_sorted_gbps: f64,
    /// Host time of one sorted gather call (staging the indices, enqueueing the sort and the gather), seconds.
    pub kernel_sorted_host_seconds: f64,
    /// The copy engines, one copy per row enqueued by one batched call: device time (gathers back to back).
    pub copies_gbps: f64,
    /// Host time of one such gather call (building the copies' list, enqueueing), seconds.
    pub copies_host_seconds: f64,
    pub copies_ratio_to_upload: f64,
    /// The CPU gathering into pinned memory on `threads` threads, then one upload: host wall time.
    pub cpu_gather_upload_gbps: f64,
    /// `kernel_gbps` / the pinned upload of the same run.
    pub kernel_ratio_to_upload: f64,
    pub kernel_sorted_ratio_to_upload: f64,
    pub cpu_gather_upload_ratio_to_upload: f64,
    /// `kernel_gbps` / `cpu_gather_upload_gbps`.
    pub kernel_ratio_to_cpu: f64,
    /// Every gathered batch matched the table's rows (checked once per figure).
    pub verified: bool,
}

/// The kernel's gathers from a `Vec` of the same size registered in place, GB/s.
#[derive(Debug, Clone, Serialize)]
pub struct RegisteredFigures {
    /// Bytes from the last 4 KiB boundary to the vector's first byte.
    pub base_offset: usize,
    /// Rows of 64 bytes, read sorted.
    pub sorted_64_gbps: f64,
    /// Rows of 1 KiB, read in the batch's order.
    pub random_1k_gbps: f64,
    /// Rows of 1 KiB, read sorted.
    pub sorted_1k_gbps: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub device: String,
    pub table_bytes: usize,
    pub batch_bytes: usize,
    pub samples: usize,
    pub cpu_threads: usize,
    /// A contiguous upload of `batch_bytes` from pinned memory, GB/s.
    pub pinned_upload_gbps: f64,
    /// The same upload while `cpu_threads` threads gather 1 KiB rows on the CPU (what a CPU-gathering feeder
    /// costs the upload beside it: both go through host memory), GB/s.
    pub pinned_upload_during_cpu_gather_gbps: f64,
    /// That over `pinned_upload_gbps`.
    pub upload_during_cpu_gather_ratio: f64,
    pub rows: Vec<Row>,
    /// Some of the kernel's figures again, from a `Vec` registered in place.
    pub registered: RegisteredFigures,
    /// Host time to enqueue 64 copies of 64 bytes from pinned memory: 64 `cuMemcpyHtoDAsync_v2` calls, seconds
    /// (median of [`ENQUEUE_SAMPLES`]).
    pub enqueue_64_single_seconds: f64,
    /// The same 64 copies by one `cuMemcpyBatchAsync_v2` call.
    pub enqueue_64_batched_seconds: f64,
    /// `enqueue_64_single_seconds / enqueue_64_batched_seconds`.
    pub enqueue_64_speedup: f64,
}

/// Repetitions of the 64-copy enqueue figures.
pub const ENQUEUE_SAMPLES: usize = 200;

/// Runs the measurements on device 0.
///
/// # Errors
/// The crate's, from any CUDA call.
pub fn measure(settings: &Settings) -> Outcome<Figures> {
    let context = Context::on(0)?;
    let stream = Stream::new(&context)?;
    let gatherer = Gatherer::new(&context)?;
    let watch = Stopwatch::new(&stream)?;
    let gbps = |seconds: f64| settings.batch_bytes as f64 / seconds / 1e9;

    // The table: bytes that say where they are, in page-locked memory mapped into the device's address space,
    // which starts on a page (a table's alignment matters: see `registered` below).
    eprintln!(
        "pinbench gather: pinning a table of {} MiB",
        settings.table_bytes >> 20
    );
    let mut table = PinnedBuilder::new(&context)
        .device_mapped(true)
        .zeroed::<u8>(settings.table_bytes)?;
    fill_words(table.as_mut_slice()?, settings.threads);

    let contiguous = Pinned::<u8>::zeroed(&context, settings.batch_bytes)?;
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, settings.batch_bytes)?;
    let upload = median(
        (0..settings.samples + 1)
            .map(|_| watch.time(|| Ok(stream.upload(&contiguous, &mut out)?)))
            .collect::<Outcome<Vec<f64>>>()?[1..]
            .to_vec(),
    );
    let upload_gbps = gbps(upload);

    // The same upload while every thread gathers 1 KiB rows on the CPU, into buffers of their own.
    let busy_upload = {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let source = table.as_slice()?;
        let row = 1024;
        let picks: Vec<u32> = (0..(settings.batch_bytes / row) as u64)
            .map(|k| (mix(k) % (settings.table_bytes / row) as u64) as u32)
            .collect();
        std::thread::scope(|scope| -> Outcome<f64> {
            for _ in 0..settings.threads {
                let (stop, picks) = (&stop, &picks);
                scope.spawn(move || {
                    let mut out = vec![0u8; 4 << 20];
                    let per = out.len() / row;
                    let mut k = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let chunk = &picks[k..(k + per).min(picks.len())];
                        gather_on_cpu(source, row, chunk, &mut out[..chunk.len() * row], 1);
                        k = (k + per) % picks.len();
                    }
                });
            }
            let timed = (0..settings.samples + 1)
                .map(|_| watch.time(|| Ok(stream.upload(&contiguous, &mut out)?)))
                .collect::<Outcome<Vec<f64>>>();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(median(timed?[1..].to_vec()))
        })?
    };
    let busy_upload_gbps = gbps(busy_upload);

    let mut staging = Pinned::<u8>::zeroed(&context, settings.batch_bytes)?;
    let mut check = Pinned::<u8>::zeroed(&context, settings.batch_bytes)?;
    let mut rows = Vec::new();
    for row in ROWS {
        eprintln!("pinbench gather: rows of {row} bytes");
        let table_rows = settings.table_bytes / row;
        let count = settings.batch_bytes / row;
        let indices: Vec<u32> = (0..count as u64)
            .map(|k| (mix(k ^ row as u64) % table_rows as u64) as u32)
            .collect();
        let mut verified = true;
        let mut kernel = |options: GatherOptions| -> Outcome<(f64, f64)> {
            let timed = time_gathers(
                &gatherer, &watch, &table, row, &indices, &mut out, options, settings,
            )?;
            stream.download(&out, &mut check)?;
            verified &= matches(check.as_slice()?, &indices, row);
            Ok(timed)
        };
        let on_kernel = GatherOptions::default().engine(GatherEngine::Kernel);
        let (random, _) = kernel(on_kernel.order(ReadOrder::Batch))?;
        let (sorted, sorted_host) = kernel(on_kernel.order(ReadOrder::Sorted))?;
        let (copied, copies_host) = kernel(GatherOptions::default().engine(GatherEngine::Copies))?;

        let mut cpu = Vec::new();
        for _ in 0..settings.samples + 1 {
            let began = Instant::now();
            let source = table.as_slice()?;
            gather_on_cpu(
                source,
                row,
                &indices,
                staging.as_mut_slice()?,
                settings.threads,
            );
            stream.upload(&staging, &mut out)?;
            stream.synchronize()?;
            cpu.push(began.elapsed().as_secs_f64());
        }
        stream.download(&out, &mut check)?;
        verified &= matches(check.as_slice()?, &indices, row);
        let cpu_gbps = gbps(median(cpu[1..].to_vec()));
        let (kernel_gbps, sorted_gbps) = (gbps(random), gbps(sorted));
        rows.push(Row {
            row_bytes: row,
            rows_per_batch: count,
            kernel_gbps,
            kernel_sorted_gbps: sorted_gbps,
            kernel_sorted_host_seconds: sorted_host,
            copies_gbps: gbps(copied),
            copies_host_seconds: copies_host,
            copies_ratio_to_upload: gbps(copied) / upload_gbps,
            cpu_gather_upload_gbps: cpu_gbps,
            kernel_ratio_to_upload: kernel_gbps / upload_gbps,
            kernel_sorted_ratio_to_upload: sorted_gbps / upload_gbps,
            cpu_gather_upload_ratio_to_upload: cpu_gbps / upload_gbps,
            kernel_ratio_to_cpu: kernel_gbps / cpu_gbps,
            verified,
        });
    }
    drop(table);
    let registered = registered(&context, &gatherer, &watch, settings)?;
    // The raw copies below are work the crate cannot see: memory dropped before them is unpinned first, or
    // unpinning would wait for them.
    context.synchronize()?;
    let (single, batched) = enqueue_64(&context, &stream)?;
    Ok(Figures {
        enqueue_64_single_seconds: single,
        enqueue_64_batched_seconds: batched,
        enqueue_64_speedup: single / batched,
        device: context.device().name()?,
        table_bytes: settings.table_bytes,
        batch_bytes: settings.batch_bytes,
        samples: settings.samples,
        cpu_threads: settings.threads,
        pinned_upload_gbps: upload_gbps,
        pinned_upload_during_cpu_gather_gbps: busy_upload_gbps,
        upload_during_cpu_gather_ratio: busy_upload_gbps / upload_gbps,
        rows,
        registered,
    })
}

/// Median device and host time per gather of `indices` from `table` into `out` with `options`, gathers enqueued
/// [`BACK_TO_BACK`] at a time, seconds.
#[allow(clippy::too_many_arguments)]
fn time_gathers(
    gatherer: &Gatherer,
    watch: &Stopwatch,
    table: &impl PinnedSource<u8>,
    row: usize,
    indices: &[u32],
    out: &mut DeviceBuffer<u8>,
    options: GatherOptions,
    settings: &Settings,
) -> Outcome<(f64, f64)> {
    let stream = watch.stream();
    let (mut device, mut host) = (Vec::new(), Vec::new());
    for _ in 0..settings.samples + 1 {
        gatherer.gather(stream, table, row, indices, out, options)?;
        let mut calls = 0.0;
        let took = watch.time(|| {
            for _ in 0..BACK_TO_BACK {
                let began = Instant::now();
                gatherer.gather(stream, table, row, indices, out, options)?;
                calls += began.elapsed().as_secs_f64();
            }
            Ok(())
        })?;
        device.push(took / BACK_TO_BACK as f64);
        host.push(calls / BACK_TO_BACK as f64);
    }
    Ok((median(device[1..].to_vec()), median(host[1..].to_vec())))
}

/// The kernel's gathers from a `Vec` registered in place, whose base the system allocator puts where it does
/// (glibc: 16 bytes past a page for large vectors), against the page-aligned table of the rest of the run.
fn registered(
    context: &Context,
    gatherer: &Gatherer,
    watch: &Stopwatch,
    settings: &Settings,
) -> Outcome<RegisteredFigures> {
    eprintln!("pinbench gather: a Vec registered in place");
    let mut values = vec![0u8; settings.table_bytes];
    fill_words(&mut values, settings.threads);
    let table = Registered::new(context, values)?;
    let base_offset = table.as_slice()?.as_ptr() as usize % 4096;
    let mut out = DeviceBuffer::<u8>::zeroed(watch.stream(), settings.batch_bytes)?;
    let mut gbps = |row: usize, order: ReadOrder| -> Outcome<f64> {
        let indices: Vec<u32> = (0..(settings.batch_bytes / row) as u64)
            .map(|k| (mix(k ^ row as u64) % (settings.table_bytes / row) as u64) as u32)
            .collect();
        let options = GatherOptions::default()
            .engine(GatherEngine::Kernel)
            .order(order);
        let (device, _) = time_gathers(
            gatherer, watch, &table, row, &indices, &mut out, options, settings,
        )?;
        Ok(settings.batch_bytes as f64 / device / 1e9)
    };
    Ok(RegisteredFigures {
        base_offset,
        sorted_64_gbps: gbps(64, ReadOrder::Sorted)?,
        random_1k_gbps: gbps(1024, ReadOrder::Batch)?,
        sorted_1k_gbps: gbps(1024, ReadOrder::Sorted)?,
    })
}

/// Host time to enqueue 64 copies of 64 bytes (pinned to device memory) as 64 calls and as one batched call,
/// medians of [`ENQUEUE_SAMPLES`], the stream synchronized after each sample.
fn enqueue_64(context: &Context, stream: &Stream) -> Outcome<(f64, f64)> {
    const COPIES: usize = 64;
    const BYTES: usize = 64;
    let host = Pinned::<u8>::zeroed(context, COPIES * BYTES)?;
    let device = DeviceBuffer::<u8>::zeroed(stream, COPIES * BYTES)?;
    stream.synchronize()?;
    let (src, dst) = (host.as_ptr() as u64, device.as_raw());
    // The batched call takes its context from the calling thread.
    // SAFETY: a live context's handle.
    unsafe { driver_call!(cuCtxSetCurrent(context.as_raw())) }?;
    let mut srcs: Vec<u64> = (0..COPIES as u64).map(|k| src + k * BYTES as u64).collect();
    let mut dsts: Vec<u64> = (0..COPIES as u64).map(|k| dst + k * BYTES as u64).collect();
    let mut sizes = vec![BYTES; COPIES];
    let (mut single, mut batched) = (Vec::new(), Vec::new());
    for _ in 0..ENQUEUE_SAMPLES {
        let began = Instant::now();
        for (&d, &s) in dsts.iter().zip(&srcs) {
            // SAFETY: 64 bytes of live pinned and device memory each; the stream is synchronized before either
            // buffer is touched again or dropped.
            unsafe {
                driver_call!(cuMemcpyHtoDAsync_v2(
                    d,
                    s as *const c_void,
                    BYTES,
                    stream.as_raw()
                ))
            }?;
        }
        single.push(began.elapsed().as_secs_f64());
        stream.synchronize()?;
        let mut attributes = CUmemcpyAttributes {
            srcAccessOrder: CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            ..Default::default()
        };
        let mut first = 0usize;
        let began = Instant::now();
        // SAFETY: as above: 64 copies of 64 bytes, one attribute for all of them from copy 0.
        unsafe {
            driver_call!(cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                COPIES,
                &mut attributes,
                &mut first,
                1,
                stream.as_raw()
            ))
        }?;
        batched.push(began.elapsed().as_secs_f64());
        stream.synchronize()?;
    }
    Ok((median(single), median(batched)))
}

/// The `SplitMix64` finaliser: the random indices and the table's words.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `bytes` with the little-endian words `mix(i)` for word `i`, on `threads` threads.
fn fill_words(bytes: &mut [u8], threads: usize) {
    let chunk = bytes.len().div_ceil(threads).next_multiple_of(8).max(8);
    std::thread::scope(|scope| {
        for (c, part) in bytes.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                let first = (c * chunk / 8) as u64;
                for (i, word) in part.chunks_mut(8).enumerate() {
                    let value = mix(first + i as u64).to_le_bytes();
                    word.copy_from_slice(&value[..word.len()]);
                }
            });
        }
    });
}

/// Whether `got` holds the rows of the table `fill_words` made at `indices`.
fn matches(got: &[u8], indices: &[u32], row: usize) -> bool {
    indices.iter().enumerate().all(|(k, &index)| {
        let start = index as usize * row;
        got[k * row..][..row]
            .chunks(8)
            .enumerate()
            .all(|(w, word)| {
                let at = start + w * 8;
                debug_assert_eq!(at % 8, 0);
                mix((at / 8) as u64).to_le_bytes()[..word.len()] == *word
            })
    })
}

/// Copies the rows of `table` at `indices` into `out`, one after another, on `threads` threads.
fn gather_on_cpu(table: &[u8], row: usize, indices: &[u32], out: &mut [u8], threads: usize) {
    let per = indices.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (part, picks) in out.chunks_mut(per * row).zip(indices.chunks(per)) {
            scope.spawn(move || {
                for (to, &index) in part.chunks_mut(row).zip(picks) {
                    to.copy_from_slice(&table[index as usize * row..][..row]);
                }
            });
        }
    });
}

/// The figures as a table.
#[must_use]
pub fn table(f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pinbench gather: {}, a table of {} MiB of mapped pinned memory, batches of {} MiB of rows at random \
         indices, GB/s of gathered bytes (median of {}); ratios to a contiguous pinned upload of the same bytes \
         in this run: {:.1} GB/s",
        f.device,
        f.table_bytes >> 20,
        f.batch_bytes >> 20,
        f.samples,
        f.pinned_upload_gbps
    );
    let _ = writeln!(
        out,
        "{:>8} {:>9} {:>18} {:>18} {:>12} {:>18} {:>12} {:>24} {:>9}",
        "row",
        "rows",
        "kernel",
        "kernel, sorted",
        "sorted host",
        "copies (batched)",
        "copies host",
        format!("CPU gather ({}) + upload", f.cpu_threads),
        "kernel/CPU"
    );
    for r in &f.rows {
        let _ = writeln!(
            out,
            "{:>8} {:>9} {:>10.1} ({:.2}) {:>10.1} ({:.2}) {:>9.2} ms {:>10.1} ({:.2}) {:>9.2} ms {:>16.1} ({:.2}) {:>8.2}x{}",
            bytes(r.row_bytes),
            r.rows_per_batch,
            r.kernel_gbps,
            r.kernel_ratio_to_upload,
            r.kernel_sorted_gbps,
            r.kernel_sorted_ratio_to_upload,
            r.kernel_sorted_host_seconds * 1e3,
            r.copies_gbps,
            r.copies_ratio_to_upload,
            r.copies_host_seconds * 1e3,
            r.cpu_gather_upload_gbps,
            r.cpu_gather_upload_ratio_to_upload,
            r.kernel_ratio_to_cpu,
            if r.verified { "" } else { "  ! wrong rows" }
        );
    }
    let _ = writeln!(
        out,
        "the same pinned upload while {} threads gather 1 KiB rows on the CPU: {:.1} GB/s ({:.2}x)",
        f.cpu_threads, f.pinned_upload_during_cpu_gather_gbps, f.upload_during_cpu_gather_ratio
    );
    let r = &f.registered;
    let _ = writeln!(
        out,
        "the kernel from a Vec registered in place, its base {} B past a 4 KiB page: 64 B sorted {:.1} GB/s, \
         1 KiB {:.1}, 1 KiB sorted {:.1}",
        r.base_offset, r.sorted_64_gbps, r.random_1k_gbps, r.sorted_1k_gbps
    );
    let _ = writeln!(
        out,
        "enqueueing 64 copies of 64 B from pinned memory (host time, median of {ENQUEUE_SAMPLES}): 64 calls {:.2} us, \
         one cuMemcpyBatchAsync {:.2} us ({:.2}x faster)",
        f.enqueue_64_single_seconds * 1e6,
        f.enqueue_64_batched_seconds * 1e6,
        f.enqueue_64_speedup
    );
    out
}

fn bytes(n: usize) -> String {
    if n >= 1 << 10 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_gather_and_the_check_agree_with_the_table() {
        let mut table = vec![0u8; 64 * 40];
        fill_words(&mut table, 3);
        let indices = [5u32, 0, 39, 5, 17];
        for row in [8usize, 16, 64] {
            let mut out = vec![0u8; row * indices.len()];
            gather_on_cpu(&table[..row * 40], row, &indices, &mut out, 2);
            assert!(matches(&out, &indices, row), "rows of {row}");
            out[row] ^= 1;
            assert!(
                !matches(&out, &indices, row),
                "a wrong byte passes for rows of {row}"
            );
        }
    }
}
