//! A training-loop-shaped program: batches gathered by random index from an in-memory dataset, fed to a compute
//! step on the GPU, three ways:
//!
//! 1. **pageable**: the loop gathers each batch into a `Vec` and uploads it with a blocking copy (what a naive
//!    loop, or a data loader without pinned memory, does);
//! 2. **pinned, no overlap**: the batch is gathered (on the same worker threads as below) straight into pinned
//!    memory and uploaded asynchronously, but each step waits for the last before the next gather;
//! 3. **prefetcher**: [`Prefetcher`] workers gather batches into pooled pinned memory ahead of the loop, a copy
//!    stream uploads them, and the loop's stream only waits on the device.
//!
//! The compute step (`kernels::spin`, plus an `axpy` that reads the batch) lasts as long as one batch's upload,
//! measured first. Each way prints samples/s, GB/s fed and the time ledger of its streams; the end compares the
//! prefetcher with the pinned upload bandwidth, the host's gather bandwidth on the same threads and the compute
//! time alone, all measured in the same run.
//!
//! `cargo run --release --features gpu --example train_loop [-- --quick] [--workers N] [--batches N]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_pinned::kernels::{axpy, spin};
use cuda_pinned::{
    Context, DeviceBuffer, Event, Ledger, LedgerReport, Pinned, PinnedPool, Prefetcher, Stream,
};

/// f32 values per sample (16 KiB).
const SAMPLE: usize = 4096;
/// Samples per batch (32 MiB).
const BATCH: usize = 2048;

type Outcome<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Options {
    dataset_bytes: usize,
    batches: usize,
    workers: usize,
}

fn options() -> Outcome<Options> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut o = Options {
        dataset_bytes: 2 << 30,
        batches: 400,
        workers: cores.min(16),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || -> Outcome<usize> {
            Ok(args.next().ok_or(format!("{arg} needs a value"))?.parse()?)
        };
        match arg.as_str() {
            "--quick" => (o.dataset_bytes, o.batches) = (512 << 20, 40),
            "--workers" => o.workers = value()?.max(1),
            "--batches" => o.batches = value()?.max(1),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(o)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("train_loop: {e}");
        std::process::exit(1);
    }
}

fn run() -> Outcome<()> {
    let o = options()?;
    let context = Context::on(0)?;
    let device = context.device();
    println!(
        "{} ({} cores), dataset {} MiB of f32 in pageable memory, {} batches of {} samples x {} KiB = {} MiB, \
         {} workers, gather with {} stores",
        device.name()?,
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        o.dataset_bytes >> 20,
        o.batches,
        BATCH,
        SAMPLE * 4 / 1024,
        (BATCH * SAMPLE * 4) >> 20,
        o.workers,
        if streaming_stores() {
            "streaming"
        } else {
            "plain"
        },
    );
    let dataset = make_dataset(o.dataset_bytes / 4, o.workers);
    let samples = dataset.len() / SAMPLE;
    let order = shuffled(samples, o.batches * BATCH);
    let batch_bytes = BATCH * SAMPLE * 4;
    let fed = (o.batches * batch_bytes) as f64;

    // References, measured in this run.
    let stream = Stream::new(&context)?;
    let upload_seconds = time_pinned_upload(&context, &stream)?;
    let step = Duration::from_secs_f64(upload_seconds);
    let gather_bw = gather_bandwidth(&dataset, &order, o.workers, o.batches)?;
    let mut scratch = DeviceBuffer::<f32>::zeroed(&stream, BATCH * SAMPLE)?;
    let compute_alone = time_compute(&context, o.batches, step)?;
    println!(
        "references: pinned upload of a batch {:.3} ms ({:.1} GB/s); gather on {} threads {:.1} GB/s; compute alone \
         {:.1} ms for {} steps",
        upload_seconds * 1e3,
        batch_bytes as f64 / upload_seconds / 1e9,
        o.workers,
        gather_bw / 1e9,
        compute_alone * 1e3,
        o.batches
    );

    // 1. Pageable, blocking copies.
    let ledger = Ledger::new();
    let s = Stream::with_ledger(&context, &ledger)?;
    let mut batch = vec![0f32; BATCH * SAMPLE];
    let mut device_batch = DeviceBuffer::<f32>::uninit(&s, BATCH * SAMPLE)?;
    let begin = Instant::now();
    for b in 0..o.batches {
        gather(&dataset, &order[b * BATCH..(b + 1) * BATCH], &mut batch);
        s.upload_pageable(&batch, &mut device_batch)?;
        compute(&s, &device_batch, &mut scratch, step)?;
    }
    s.synchronize()?;
    let pageable = begin.elapsed().as_secs_f64();
    report(
        "1. pageable + blocking copies",
        pageable,
        fed,
        o.batches,
        &ledger.report()?,
    );

    // 2. Pinned, no overlap: parallel gather into pinned memory, async upload, then wait for the step.
    let ledger = Ledger::new();
    let s = Stream::with_ledger(&context, &ledger)?;
    let mut host = Pinned::<f32>::zeroed(&context, BATCH * SAMPLE)?;
    let begin = Instant::now();
    for b in 0..o.batches {
        gather_parallel(
            &dataset,
            &order[b * BATCH..(b + 1) * BATCH],
            host.as_mut_slice()?,
            o.workers,
        );
        s.upload(&host, &mut device_batch)?;
        compute(&s, &device_batch, &mut scratch, step)?;
        s.synchronize()?;
    }
    let pinned = begin.elapsed().as_secs_f64();
    report(
        "2. pinned, no overlap",
        pinned,
        fed,
        o.batches,
        &ledger.report()?,
    );

    // 3. The prefetcher.
    let depth = 2 * o.workers;
    let pool = PinnedPool::new(&context, (depth + 2) * batch_bytes);
    // A loop over several epochs pins once: warm the pool as the first epoch would have.
    drop(
        (0..depth)
            .map(|_| pool.alloc::<f32>(BATCH * SAMPLE))
            .collect::<cuda_pinned::Result<Vec<_>>>()?,
    );
    let (data, idx) = (Arc::new(dataset), Arc::new(order));
    let run = |step: Duration| -> Outcome<(f64, Duration, LedgerReport)> {
        let ledger = Ledger::new();
        let s = Stream::with_ledger(&context, &ledger)?;
        let copies = Stream::with_ledger(&context, &ledger)?;
        let mut scratch = DeviceBuffer::<f32>::zeroed(&s, BATCH * SAMPLE)?;
        s.synchronize()?;
        let (data, idx) = (data.clone(), idx.clone());
        let begin = Instant::now();
        let batches = Prefetcher::<Pinned<f32>>::builder(&pool, &s, BATCH * SAMPLE)
            .batches(o.batches)
            .workers(o.workers)
            .depth(depth)
            .copy_stream(&copies)
            .build(move |b, host: &mut Pinned<f32>| {
                gather(
                    &data,
                    &idx[b * BATCH..(b + 1) * BATCH],
                    host.as_mut_slice()?,
                );
                Ok(())
            })?;
        let mut first = None;
        for batch in batches {
            let batch = batch?;
            first.get_or_insert_with(|| begin.elapsed());
            compute(&s, &batch, &mut scratch, step)?;
        }
        s.synchronize()?;
        Ok((
            begin.elapsed().as_secs_f64(),
            first.unwrap_or_default(),
            ledger.report()?,
        ))
    };
    let (prefetched, first, ledger) = run(step)?;
    report("3. prefetcher", prefetched, fed, o.batches, &ledger);
    println!(
        "first batch after {:.1} ms (one worker gathers it alone); from then on {:.1} ms = {:.3} x compute alone",
        first.as_secs_f64() * 1e3,
        (prefetched - first.as_secs_f64()) * 1e3,
        (prefetched - first.as_secs_f64()) / compute_alone
    );

    let prefetch_bw = fed / prefetched;
    let upload_bw = batch_bytes as f64 / upload_seconds;
    let bound = upload_bw.min(gather_bw);
    println!();
    println!("                                   wall ms   samples/s     GB/s fed   x pageable");
    for (name, t) in [
        ("pageable + blocking", pageable),
        ("pinned, no overlap", pinned),
        ("prefetcher", prefetched),
    ] {
        println!(
            "  {name:<30} {:>9.1} {:>11.0} {:>12.2} {:>11.2}x",
            t * 1e3,
            (o.batches * BATCH) as f64 / t,
            fed / t / 1e9,
            pageable / t
        );
    }
    println!();
    println!(
        "prefetcher: {:.2} GB/s fed = {:.2} x min(pinned upload {:.1} GB/s, gather {:.1} GB/s); total {:.1} ms = \
         {:.3} x compute alone ({:.1} ms); the host's gather alone needs {:.1} ms",
        prefetch_bw / 1e9,
        prefetch_bw / bound,
        upload_bw / 1e9,
        gather_bw / 1e9,
        prefetched * 1e3,
        prefetched / compute_alone,
        compute_alone * 1e3,
        fed / gather_bw * 1e3
    );

    // 4. The same, with a compute step as long as the slower of gathering and uploading a batch: the data is
    // produced as fast as it is consumed, and only transfer time that fails to hide shows.
    let slow_step = Duration::from_secs_f64(upload_seconds.max(batch_bytes as f64 / gather_bw));
    let compute_alone = time_compute(&context, o.batches, slow_step)?;
    let (t, _, ledger) = run(slow_step)?;
    report(
        &format!(
            "4. prefetcher, compute step {:.3} ms (the slower of upload and gather)",
            slow_step.as_secs_f64() * 1e3
        ),
        t,
        fed,
        o.batches,
        &ledger,
    );
    println!(
        "total {:.1} ms = {:.3} x compute alone ({:.1} ms)",
        t * 1e3,
        t / compute_alone,
        compute_alone * 1e3
    );
    Ok(())
}

/// The time of `batches` compute steps of `step` with no data to wait for.
fn time_compute(context: &Context, batches: usize, step: Duration) -> Outcome<f64> {
    let stream = Stream::new(context)?;
    let input = DeviceBuffer::<f32>::zeroed(&stream, BATCH * SAMPLE)?;
    let mut scratch = DeviceBuffer::<f32>::zeroed(&stream, BATCH * SAMPLE)?;
    stream.synchronize()?;
    let begin = Instant::now();
    for _ in 0..batches {
        compute(&stream, &input, &mut scratch, step)?;
    }
    stream.synchronize()?;
    Ok(begin.elapsed().as_secs_f64())
}

/// The compute step: an axpy that reads the batch, then a spin that lasts `step`.
fn compute(
    s: &Stream,
    batch: &DeviceBuffer<f32>,
    scratch: &mut DeviceBuffer<f32>,
    step: Duration,
) -> Outcome<()> {
    axpy(s, 1.0, batch, scratch)?;
    spin(s, step)?;
    Ok(())
}

fn report(name: &str, seconds: f64, fed: f64, batches: usize, ledger: &LedgerReport) {
    println!();
    println!(
        "{name}: {:.1} ms, {:.0} samples/s, {:.2} GB/s fed",
        seconds * 1e3,
        (batches * BATCH) as f64 / seconds,
        fed / seconds / 1e9
    );
    println!("{ledger}");
}

/// A dataset of `len` f32 values (never zeros), written on `threads` threads.
fn make_dataset(len: usize, threads: usize) -> Vec<f32> {
    let mut data = vec![0f32; len];
    let piece = len.div_ceil(threads);
    std::thread::scope(|scope| {
        for (t, part) in data.chunks_mut(piece).enumerate() {
            scope.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    *x = ((t * piece + i) % 1021) as f32 + 1.0;
                }
            });
        }
    });
    data
}

/// `n` sample indices in a pseudo-random order (xorshift), wrapping around the dataset.
fn shuffled(samples: usize, n: usize) -> Vec<usize> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % samples as u64) as usize
        })
        .collect()
}

/// Copies the samples `indices` of `data` into `out`, one after another.
///
/// On x86-64 the copy uses streaming (non-temporal) stores: a batch is written once and next read by the DMA
/// engine, so there is no point in first reading each destination line into the cache, as ordinary stores do.
/// That read is a third of a plain copy's memory traffic, and the gather is bound by memory bandwidth, which it
/// shares with the uploads reading the pinned batches. `PLAIN_STORES=1` in the environment turns it off.
fn gather(data: &[f32], indices: &[usize], out: &mut [f32]) {
    let streaming = streaming_stores();
    for (k, &i) in indices.iter().enumerate() {
        let (to, from) = (
            &mut out[k * SAMPLE..(k + 1) * SAMPLE],
            &data[i * SAMPLE..(i + 1) * SAMPLE],
        );
        if streaming {
            stream_copy(to, from);
        } else {
            to.copy_from_slice(from);
        }
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence has no preconditions. It orders the streaming stores before whatever this thread does
    // next (handing the batch to the copy stream), as they are otherwise weakly ordered.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// Whether [`gather`] uses streaming stores: on x86-64 unless `PLAIN_STORES` is set.
fn streaming_stores() -> bool {
    static STREAMING: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        cfg!(target_arch = "x86_64") && std::env::var_os("PLAIN_STORES").is_none()
    });
    *STREAMING
}

/// `to.copy_from_slice(from)` with 16-byte non-temporal stores where `to` is 16-byte aligned.
#[cfg(target_arch = "x86_64")]
fn stream_copy(to: &mut [f32], from: &[f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    assert_eq!(to.len(), from.len());
    if !to.as_ptr().addr().is_multiple_of(16) {
        return to.copy_from_slice(from);
    }
    let vectors = to.len() / 4;
    let (d, s) = (
        to.as_mut_ptr().cast::<__m128i>(),
        from.as_ptr().cast::<__m128i>(),
    );
    for v in 0..vectors {
        // SAFETY: v < vectors, so both 16-byte accesses are inside the slices (same length); `d` is 16-byte
        // aligned, as the streaming store requires; the load takes any alignment. SSE2 is part of x86-64.
        unsafe { _mm_stream_si128(d.add(v), _mm_loadu_si128(s.add(v))) };
    }
    to[vectors * 4..].copy_from_slice(&from[vectors * 4..]);
}

#[cfg(not(target_arch = "x86_64"))]
fn stream_copy(to: &mut [f32], from: &[f32]) {
    to.copy_from_slice(from);
}

/// [`gather`] split over `threads` threads.
fn gather_parallel(data: &[f32], indices: &[usize], out: &mut [f32], threads: usize) {
    let per = indices.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (part, idx) in out.chunks_mut(per * SAMPLE).zip(indices.chunks(per)) {
            scope.spawn(move || gather(data, idx, part));
        }
    });
}

/// The host's gather bandwidth with `threads` threads each building whole batches into their own buffer, as
/// the prefetcher's workers do.
fn gather_bandwidth(data: &[f32], order: &[usize], threads: usize, batches: usize) -> Outcome<f64> {
    let begin = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                // Written once before, as the prefetcher's pooled buffers are: no first-touch page faults timed.
                let mut out = vec![1f32; BATCH * SAMPLE];
                std::hint::black_box(&mut out);
                for b in (t..batches).step_by(threads) {
                    gather(data, &order[b * BATCH..(b + 1) * BATCH], &mut out);
                }
                std::hint::black_box(&out);
            });
        }
    });
    Ok((batches * BATCH * SAMPLE * 4) as f64 / begin.elapsed().as_secs_f64())
}

/// The median device time of a pinned upload of one batch, after a warm-up.
fn time_pinned_upload(context: &Context, stream: &Stream) -> Outcome<f64> {
    let host = Pinned::<f32>::zeroed(context, BATCH * SAMPLE)?;
    let mut device = DeviceBuffer::<f32>::uninit(stream, BATCH * SAMPLE)?;
    let (start, end) = (Event::new(context)?, Event::new(context)?);
    let mut times = Vec::new();
    for i in 0..12 {
        start.record(stream)?;
        stream.upload(&host, &mut device)?;
        end.record(stream)?;
        end.synchronize()?;
        if i >= 2 {
            times.push(end.elapsed_since(&start)?.as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
