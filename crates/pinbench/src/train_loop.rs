//! `pinbench train-loop` (feature `gpu`): a training-loop-shaped program, timed. Batches are gathered by random
//! index from an in-memory dataset and fed to a compute step on the GPU, three ways, then two more:
//!
//! 1. **pageable**: the loop gathers each batch into a `Vec` and uploads it with a blocking copy (what a naive
//!    loop, or a data loader without pinned memory, does);
//! 2. **pinned, no overlap**: the batch is gathered (on the same worker threads as below) straight into pinned
//!    memory and uploaded asynchronously, but each step waits for the last before the next gather;
//! 3. **prefetcher**: [`Prefetcher`] workers gather batches into pooled pinned memory ahead of the loop, a copy
//!    stream uploads them, and the loop's stream only waits on the device;
//! 4. the prefetcher again, with a compute step as long as the slower of gathering and uploading a batch;
//! 5. **gathered on the device**: the dataset copied once into mapped pinned memory, a [`Prefetcher`] of
//!    `GatherBatch` whose one worker writes each batch's indices, the crate's gather kernel reading the rows over
//!    the bus.
//!
//! The compute step (`kernels::spin`, plus an `axpy` that reads the batch) lasts as long as one batch's upload,
//! measured first. Each way reports samples/s, GB/s fed and the time ledger of its streams; the prefetcher is
//! compared with the pinned upload bandwidth, the host's gather bandwidth on the same threads and the compute
//! time alone, all measured in the same run. Last, the prefetcher runs again with a compute step as long as the
//! slower of gathering and uploading a batch: the data is then produced as fast as it is consumed, and only
//! transfer time that fails to hide shows.

use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_pinned::kernels::{axpy, spin};
use cuda_pinned::prefetch::GatherBatch;
use cuda_pinned::profile::Category;
use cuda_pinned::{
    Context, DeviceBuffer, Event, GatherOptions, Gatherer, Ledger, LedgerReport, Pinned,
    PinnedBuilder, PinnedPool, Prefetcher, RowTable, Stream,
};
use serde::{Serialize, Serializer};

use crate::Outcome;
use crate::cli::{BATCH_BYTES, TrainLoopOptions};
use crate::progress::Progress;

/// Bytes per sample without `--sample-bytes` (16 KiB: 4096 f32 values, 2048 to a batch).
const DEFAULT_SAMPLE_BYTES: usize = 16 << 10;

/// The run's size and how the host gathers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Bytes of the dataset, f32 in pageable memory.
    pub dataset_bytes: usize,
    /// Batches fed per way.
    pub batches: usize,
    /// f32 values per sample (4096, 16 KiB, unless `--sample-bytes` says otherwise).
    pub sample_len: usize,
    /// Samples per batch: as many as make [`BATCH_BYTES`] (2048 of 16 KiB).
    pub batch: usize,
    /// Threads gathering batches.
    pub workers: usize,
    /// Whether the gather uses streaming stores (see [`gather`]).
    pub streaming: bool,
}

impl Settings {
    /// The settings `train-loop`'s flags ask for.
    pub fn new(options: &TrainLoopOptions) -> Settings {
        let (dataset_bytes, batches) = if options.quick {
            (512 << 20, 40)
        } else {
            (2 << 30, 400)
        };
        // The command line only lets through sizes that divide a batch; any other leaves the settings
        // inconsistent (an empty sample or batch, or a batch short of 32 MiB), which `check` refuses.
        let sample_bytes = options.sample_bytes.unwrap_or(DEFAULT_SAMPLE_BYTES);
        Settings {
            dataset_bytes,
            batches: options.batches.map_or(batches, |n| n.get()),
            sample_len: sample_bytes / 4,
            batch: BATCH_BYTES.checked_div(sample_bytes).unwrap_or(0),
            workers: options.workers.map_or(cores().min(16), |n| n.get()),
            streaming: cfg!(target_arch = "x86_64") && !options.plain_stores,
        }
    }

    /// Why [`measure`] cannot run these settings, if it cannot: samples of no f32 value, a batch that is not
    /// [`BATCH_BYTES`] of samples, a dataset with fewer samples than a batch, or more indices than a `usize`
    /// counts. ([`shuffled`] draws indices modulo the dataset's samples, so it copes with any number of them
    /// but 0; fewer than a batch would only repeat samples within every batch, and are refused here.)
    pub fn check(&self) -> Result<(), String> {
        let sample_bytes = self.sample_len.saturating_mul(4);
        if self.sample_len == 0 || self.batch.checked_mul(sample_bytes) != Some(BATCH_BYTES) {
            return Err(format!(
                "a batch is {BATCH_BYTES} bytes of samples, not {} samples of {sample_bytes} bytes: a sample \
                 must be a multiple of 4 bytes that divides {BATCH_BYTES}",
                self.batch
            ));
        }
        let samples = self.dataset_bytes / sample_bytes;
        if samples < self.batch {
            return Err(format!(
                "a dataset of {} bytes holds {samples} samples of {sample_bytes} bytes, fewer than the {} of a \
                 batch",
                self.dataset_bytes, self.batch
            ));
        }
        // The shuffled order of every batch's samples is held at once (8 bytes an index).
        const MAX_INDICES: usize = 1 << 29;
        if self
            .batches
            .checked_mul(self.batch)
            .is_none_or(|n| n > MAX_INDICES)
        {
            return Err(format!(
                "{} batches of {} samples are more than {MAX_INDICES} sample indices to hold: fewer batches or \
                 larger samples",
                self.batches, self.batch
            ));
        }
        Ok(())
    }
}

/// The CPU's cores, as the standard library sees them.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Everything a run measured, as the table shows it and `--json` writes it.
#[derive(Debug, Serialize)]
pub struct TrainLoop {
    tool: &'static str,
    version: &'static str,
    mode: &'static str,
    /// The device's name.
    pub device: String,
    /// The CPU's cores.
    pub cores: usize,
    /// Bytes of the dataset.
    pub dataset_bytes: usize,
    /// Batches fed per way.
    pub batches: usize,
    /// Samples per batch.
    pub samples_per_batch: usize,
    /// Bytes per sample.
    pub sample_bytes: usize,
    /// Bytes per batch.
    pub batch_bytes: usize,
    /// Threads gathering batches.
    pub workers: usize,
    /// Whether the gather used streaming stores.
    pub streaming_stores: bool,
    /// What bounds the loop, measured alone.
    pub references: References,
    /// 1. Gathered into a `Vec`, uploaded with a blocking copy.
    pub pageable: Run,
    /// 2. Gathered into pinned memory on the workers, uploaded asynchronously, one step at a time.
    pub pinned: Run,
    /// 3. The prefetcher.
    pub prefetcher: PrefetcherRun,
    /// 4. The prefetcher again, with a compute step as long as the slower of gathering and uploading a batch.
    pub slow_step: SlowStep,
    /// Way 5: the prefetcher gathering on the device (`GatherBatch`) from the dataset in mapped pinned memory, with
    /// one worker writing indices and the compute step as long as a batch's upload (as in way 3).
    pub device_gather: DeviceGatherRun,
}

/// The prefetcher gathering on the device.
#[derive(Debug, Serialize)]
pub struct DeviceGatherRun {
    /// The run.
    #[serde(flatten)]
    pub run: Run,
    /// Threads writing indices (the host's share of the feeding).
    pub workers: usize,
    /// The run's wall time over the compute time alone.
    pub ratio_to_compute: f64,
    /// GB/s fed over the CPU-gathering prefetcher's (3).
    pub ratio_to_prefetcher: f64,
}

/// What bounds the loop, each measured alone.
#[derive(Debug, Serialize)]
pub struct References {
    /// The median device time of a pinned upload of one batch.
    pub pinned_upload_seconds: f64,
    /// One batch over that time.
    pub pinned_upload_gb_per_s: f64,
    /// Wall time of gathering every batch on the workers, each into a buffer of its own.
    pub gather_seconds: f64,
    /// Every batch's bytes over that time.
    pub gather_gb_per_s: f64,
    /// Wall time of the compute steps with no data to wait for.
    pub compute_alone_seconds: f64,
}

/// One way of feeding the loop.
#[derive(Debug, Serialize)]
pub struct Run {
    /// Wall time of the whole loop.
    pub wall_seconds: f64,
    /// Samples fed per second.
    pub samples_per_s: f64,
    /// Bytes fed per second, decimal GB/s.
    pub gb_per_s_fed: f64,
    /// How many times faster than the pageable way.
    pub ratio_to_pageable: f64,
    /// Device time of the run's streams per kind of work.
    #[serde(serialize_with = "ledger")]
    pub ledger: LedgerReport,
}

/// The prefetcher's run, and it against the references.
#[derive(Debug, Serialize)]
pub struct PrefetcherRun {
    /// The run.
    #[serde(flatten)]
    pub run: Run,
    /// Until the loop got its first batch (one worker gathers it alone).
    pub first_batch_seconds: f64,
    /// From the first batch to the end.
    pub after_first_seconds: f64,
    /// That over the compute time alone.
    pub after_first_ratio_to_compute: f64,
    /// GB/s fed over the lower of the pinned upload's and the gather's GB/s.
    pub ratio_to_bound: f64,
    /// The whole run over the compute time alone.
    pub ratio_to_compute: f64,
}

/// The prefetcher with a compute step as long as the slower of gathering and uploading a batch.
#[derive(Debug, Serialize)]
pub struct SlowStep {
    /// The compute step.
    pub step_seconds: f64,
    /// Wall time of the compute steps with no data to wait for.
    pub compute_alone_seconds: f64,
    /// The run.
    #[serde(flatten)]
    pub run: Run,
    /// The run's wall time over the compute time alone.
    pub ratio_to_compute: f64,
}

/// A ledger's report as JSON: one row per category and per named kernel, and the wall and transfer times.
fn ledger<S: Serializer>(report: &LedgerReport, serializer: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Row {
        category: &'static str,
        /// `null` for the category as a whole.
        name: Option<&'static str>,
        count: usize,
        bytes: usize,
        seconds: f64,
        gb_per_s: Option<f64>,
        share_of_wall: f64,
    }
    #[derive(Serialize)]
    struct Ledger {
        rows: Vec<Row>,
        wall_seconds: f64,
        transfer_seconds: f64,
        hidden_transfer_seconds: f64,
    }
    let rows = report
        .rows
        .iter()
        .map(|r| Row {
            category: match r.category {
                Category::Upload => "upload",
                Category::Download => "download",
                Category::DeviceCopy => "device_copy",
                Category::Kernel => "kernel",
                _ => "other",
            },
            name: (!r.name.is_empty()).then_some(r.name),
            count: r.count,
            bytes: r.bytes,
            seconds: r.seconds,
            gb_per_s: r.gb_per_s(),
            share_of_wall: r.share_of_wall,
        })
        .collect();
    Ledger {
        rows,
        wall_seconds: report.wall.as_secs_f64(),
        transfer_seconds: report.transfer.as_secs_f64(),
        hidden_transfer_seconds: report.hidden_transfer.as_secs_f64(),
    }
    .serialize(serializer)
}

/// Runs the references and the four loops on device 0.
pub fn measure(settings: &Settings) -> Outcome<TrainLoop> {
    settings.check()?;
    let Settings {
        dataset_bytes,
        batches,
        sample_len,
        batch: per_batch,
        workers,
        streaming,
    } = *settings;
    // f32 values per batch.
    let batch_len = per_batch * sample_len;
    let context = Context::on(0)?;
    let device = context.device().name()?;
    // One unit per step: the dataset, the references and the four loops.
    let mut progress = Progress::new(false, 7.0);
    progress.show("making the dataset");
    let dataset = make_dataset(dataset_bytes / 4, workers);
    let samples = dataset.len() / sample_len;
    let order = shuffled(samples, batches * per_batch);
    let batch_bytes = batch_len * 4;
    let fed = (batches * batch_bytes) as f64;
    // A loop's figures from its wall time, beside the pageable loop's.
    let run = |seconds: f64, pageable: f64, ledger| Run {
        wall_seconds: seconds,
        samples_per_s: (batches * per_batch) as f64 / seconds,
        gb_per_s_fed: fed / seconds / 1e9,
        ratio_to_pageable: pageable / seconds,
        ledger,
    };

    // References, measured in this run.
    progress.advance(1.0);
    progress.show("references: upload, gather, compute");
    let stream = Stream::new(&context)?;
    let upload_seconds = time_pinned_upload(&context, &stream, batch_len)?;
    let step = Duration::from_secs_f64(upload_seconds);
    let gather_seconds = time_gather(&dataset, &order, settings);
    let gather_bw = fed / gather_seconds;
    let mut scratch = DeviceBuffer::<f32>::zeroed(&stream, batch_len)?;
    let compute_alone = time_compute(&context, batches, batch_len, step)?;

    // 1. Pageable, blocking copies.
    progress.advance(1.0);
    progress.show("1. pageable + blocking copies");
    let ledger = Ledger::new();
    let s = Stream::with_ledger(&context, &ledger)?;
    let mut batch = vec![0f32; batch_len];
    let mut device_batch = DeviceBuffer::<f32>::uninit(&s, batch_len)?;
    let begin = Instant::now();
    for b in 0..batches {
        gather(
            &dataset,
            &order[b * per_batch..(b + 1) * per_batch],
            &mut batch,
            sample_len,
            streaming,
        );
        s.upload_pageable(&batch, &mut device_batch)?;
        compute(&s, &device_batch, &mut scratch, step)?;
    }
    s.synchronize()?;
    let pageable = begin.elapsed().as_secs_f64();
    let pageable_run = run(pageable, pageable, ledger.report()?);

    // 2. Pinned, no overlap: parallel gather into pinned memory, async upload, then wait for the step.
    progress.advance(1.0);
    progress.show("2. pinned, no overlap");
    let ledger = Ledger::new();
    let s = Stream::with_ledger(&context, &ledger)?;
    let mut host = Pinned::<f32>::zeroed(&context, batch_len)?;
    let begin = Instant::now();
    for b in 0..batches {
        gather_parallel(
            &dataset,
            &order[b * per_batch..(b + 1) * per_batch],
            host.as_mut_slice()?,
            sample_len,
            workers,
            streaming,
        );
        s.upload(&host, &mut device_batch)?;
        compute(&s, &device_batch, &mut scratch, step)?;
        s.synchronize()?;
    }
    let pinned = begin.elapsed().as_secs_f64();
    let pinned_run = run(pinned, pageable, ledger.report()?);

    // 3. The prefetcher.
    progress.advance(1.0);
    progress.show("3. prefetcher");
    let depth = 2 * workers;
    let pool = PinnedPool::new(&context, (depth + 2) * batch_bytes);
    // A loop over several epochs pins once: warm the pool as the first epoch would have.
    drop(
        (0..depth)
            .map(|_| pool.alloc::<f32>(batch_len))
            .collect::<cuda_pinned::Result<Vec<_>>>()?,
    );
    let (data, idx) = (Arc::new(dataset), Arc::new(order));
    let prefetch = |step: Duration| -> Outcome<(f64, Duration, LedgerReport)> {
        let ledger = Ledger::new();
        let s = Stream::with_ledger(&context, &ledger)?;
        let copies = Stream::with_ledger(&context, &ledger)?;
        let mut scratch = DeviceBuffer::<f32>::zeroed(&s, batch_len)?;
        s.synchronize()?;
        let (data, idx) = (data.clone(), idx.clone());
        let begin = Instant::now();
        let batches = Prefetcher::<Pinned<f32>>::builder(&pool, &s, batch_len)
            .batches(batches)
            .workers(workers)
            .depth(depth)
            .copy_stream(&copies)
            .build(move |b, host: &mut Pinned<f32>| {
                gather(
                    &data,
                    &idx[b * per_batch..(b + 1) * per_batch],
                    host.as_mut_slice()?,
                    sample_len,
                    streaming,
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
    let (prefetched, first, ledger) = prefetch(step)?;
    let prefetcher_run = run(prefetched, pageable, ledger);
    let upload_bw = batch_bytes as f64 / upload_seconds;
    let bound = upload_bw.min(gather_bw);
    let after_first = prefetched - first.as_secs_f64();

    // 4. The same, with a compute step as long as the slower of gathering and uploading a batch.
    progress.advance(1.0);
    progress.show("4. prefetcher, slower compute step");
    let slow_step = Duration::from_secs_f64(upload_seconds.max(batch_bytes as f64 / gather_bw));
    let slow_compute_alone = time_compute(&context, batches, batch_len, slow_step)?;
    let (t, _, ledger) = prefetch(slow_step)?;

    // 5. The prefetcher gathering on the device, from the dataset copied once into mapped pinned memory, which
    // starts on a page: the device reads rows over the bus fastest from 128-byte aligned addresses, and a large
    // `Vec` registered in place starts 16 bytes past a page (glibc), which made this way's gathers 6% slower.
    progress.advance(1.0);
    progress.show("5. prefetcher, gathered on the device");
    let dataset = Arc::try_unwrap(data).map_err(|_| "the dataset is still shared")?;
    let table = PinnedBuilder::new(&context)
        .device_mapped(true)
        .from_slice(&dataset)?;
    drop(dataset);
    let rows = RowTable::new(
        Gatherer::new(&context)?,
        table,
        sample_len,
        GatherOptions::default(),
    )?;
    let gather_ledger = Ledger::new();
    let s = Stream::with_ledger(&context, &gather_ledger)?;
    let copies = Stream::with_ledger(&context, &gather_ledger)?;
    let mut scratch = DeviceBuffer::<f32>::zeroed(&s, batch_len)?;
    s.synchronize()?;
    let unused = PinnedPool::new(&context, 0);
    const GATHER_WORKERS: usize = 1;
    let begin = Instant::now();
    let gathered =
        Prefetcher::<GatherBatch<f32, Pinned<f32>>>::builder(&unused, &s, (rows, per_batch))
            .batches(batches)
            .workers(GATHER_WORKERS)
            .depth(4)
            .copy_stream(&copies)
            .build(move |b, job| {
                job.indices.clear();
                job.indices.extend(
                    idx[b * per_batch..(b + 1) * per_batch]
                        .iter()
                        .map(|&i| u32::try_from(i).expect("fewer than 2^32 samples")),
                );
                Ok(())
            })?;
    for batch in gathered {
        let batch = batch?;
        compute(&s, &batch, &mut scratch, step)?;
    }
    s.synchronize()?;
    let device_gathered = begin.elapsed().as_secs_f64();
    let device_gather_run = run(device_gathered, pageable, gather_ledger.report()?);
    progress.finish();

    Ok(TrainLoop {
        tool: "pinbench",
        version: env!("CARGO_PKG_VERSION"),
        mode: "train-loop",
        device,
        cores: cores(),
        dataset_bytes,
        batches,
        samples_per_batch: per_batch,
        sample_bytes: sample_len * 4,
        batch_bytes,
        workers,
        streaming_stores: streaming,
        references: References {
            pinned_upload_seconds: upload_seconds,
            pinned_upload_gb_per_s: upload_bw / 1e9,
            gather_seconds,
            gather_gb_per_s: gather_bw / 1e9,
            compute_alone_seconds: compute_alone,
        },
        pageable: pageable_run,
        pinned: pinned_run,
        prefetcher: PrefetcherRun {
            run: prefetcher_run,
            first_batch_seconds: first.as_secs_f64(),
            after_first_seconds: after_first,
            after_first_ratio_to_compute: after_first / compute_alone,
            ratio_to_bound: fed / prefetched / bound,
            ratio_to_compute: prefetched / compute_alone,
        },
        slow_step: SlowStep {
            step_seconds: slow_step.as_secs_f64(),
            compute_alone_seconds: slow_compute_alone,
            run: run(t, pageable, ledger),
            ratio_to_compute: t / slow_compute_alone,
        },
        device_gather: DeviceGatherRun {
            ratio_to_compute: device_gathered / compute_alone,
            ratio_to_prefetcher: prefetched / device_gathered,
            workers: GATHER_WORKERS,
            run: device_gather_run,
        },
    })
}

/// The figures as text: the setting, the references, each way with its ledger, then the comparison.
pub fn table(r: &TrainLoop) -> String {
    let mut out = String::new();
    let refs = &r.references;
    let _ = writeln!(
        out,
        "{} ({} cores), dataset {} MiB of f32 in pageable memory, {} batches of {} samples x {} = {} MiB, \
         {} workers, gather with {} stores",
        r.device,
        r.cores,
        r.dataset_bytes >> 20,
        r.batches,
        r.samples_per_batch,
        size(r.sample_bytes),
        r.batch_bytes >> 20,
        r.workers,
        if r.streaming_stores {
            "streaming"
        } else {
            "plain"
        },
    );
    let _ = writeln!(
        out,
        "references: pinned upload of a batch {:.3} ms ({:.1} GB/s); gather on {} threads {:.1} GB/s; compute \
         alone {:.1} ms for {} steps",
        refs.pinned_upload_seconds * 1e3,
        refs.pinned_upload_gb_per_s,
        r.workers,
        refs.gather_gb_per_s,
        refs.compute_alone_seconds * 1e3,
        r.batches
    );
    let p = &r.prefetcher;
    section(&mut out, "1. pageable + blocking copies", &r.pageable);
    section(&mut out, "2. pinned, no overlap", &r.pinned);
    section(&mut out, "3. prefetcher", &p.run);
    let _ = writeln!(
        out,
        "first batch after {:.1} ms (one worker gathers it alone); from then on {:.1} ms = {:.3} x compute alone",
        p.first_batch_seconds * 1e3,
        p.after_first_seconds * 1e3,
        p.after_first_ratio_to_compute
    );

    out.push('\n');
    out.push_str(
        "                                   wall ms   samples/s     GB/s fed   x pageable\n",
    );
    for (name, run) in [
        ("pageable + blocking", &r.pageable),
        ("pinned, no overlap", &r.pinned),
        ("prefetcher", &p.run),
    ] {
        let _ = writeln!(
            out,
            "  {name:<30} {:>9.1} {:>11.0} {:>12.2} {:>11.2}x",
            run.wall_seconds * 1e3,
            run.samples_per_s,
            run.gb_per_s_fed,
            run.ratio_to_pageable
        );
    }
    let _ = writeln!(
        out,
        "\nprefetcher: {:.2} GB/s fed = {:.2} x min(pinned upload {:.1} GB/s, gather {:.1} GB/s); total {:.1} ms \
         = {:.3} x compute alone ({:.1} ms); the host's gather alone needs {:.1} ms",
        p.run.gb_per_s_fed,
        p.ratio_to_bound,
        refs.pinned_upload_gb_per_s,
        refs.gather_gb_per_s,
        p.run.wall_seconds * 1e3,
        p.ratio_to_compute,
        refs.compute_alone_seconds * 1e3,
        refs.gather_seconds * 1e3
    );

    let slow = &r.slow_step;
    let title = format!(
        "4. prefetcher, compute step {:.3} ms (the slower of upload and gather)",
        slow.step_seconds * 1e3
    );
    section(&mut out, &title, &slow.run);
    let _ = writeln!(
        out,
        "total {:.1} ms = {:.3} x compute alone ({:.1} ms)",
        slow.run.wall_seconds * 1e3,
        slow.ratio_to_compute,
        slow.compute_alone_seconds * 1e3
    );

    let g = &r.device_gather;
    let title = format!(
        "5. prefetcher gathering on the device ({} worker writing indices, the dataset in mapped pinned memory)",
        g.workers
    );
    section(&mut out, &title, &g.run);
    let _ = writeln!(
        out,
        "total {:.1} ms = {:.3} x compute alone ({:.1} ms); {:.2} x the GB/s of 3",
        g.run.wall_seconds * 1e3,
        g.ratio_to_compute,
        refs.compute_alone_seconds * 1e3,
        g.ratio_to_prefetcher
    );
    out
}

/// A size in bytes as the largest of B, KiB and MiB that it is a whole number of: "16 KiB", "512 B".
fn size(bytes: usize) -> String {
    match bytes {
        0 => "0 B".to_owned(),
        b if b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One way's line and its ledger, after a blank line.
fn section(out: &mut String, title: &str, run: &Run) {
    let _ = writeln!(
        out,
        "\n{title}: {:.1} ms, {:.0} samples/s, {:.2} GB/s fed\n{}",
        run.wall_seconds * 1e3,
        run.samples_per_s,
        run.gb_per_s_fed,
        run.ledger
    );
}

/// The time of `batches` compute steps of `step`, on batches of `batch_len` f32 values, with no data to wait for.
fn time_compute(
    context: &Context,
    batches: usize,
    batch_len: usize,
    step: Duration,
) -> Outcome<f64> {
    let stream = Stream::new(context)?;
    let input = DeviceBuffer::<f32>::zeroed(&stream, batch_len)?;
    let mut scratch = DeviceBuffer::<f32>::zeroed(&stream, batch_len)?;
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

/// Copies the samples `indices` of `data` (samples of `sample_len` f32 values) into `out`, one after another.
///
/// With `streaming` (x86-64 only) the copy uses streaming (non-temporal) stores: a batch is written once and next
/// read by the DMA engine, so there is no point in first reading each destination line into the cache, as
/// ordinary stores do. That read is a third of a plain copy's memory traffic, and the gather is bound by memory
/// bandwidth, which it shares with the uploads reading the pinned batches.
fn gather(data: &[f32], indices: &[usize], out: &mut [f32], sample_len: usize, streaming: bool) {
    for (k, &i) in indices.iter().enumerate() {
        let (to, from) = (
            &mut out[k * sample_len..(k + 1) * sample_len],
            &data[i * sample_len..(i + 1) * sample_len],
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

/// Elsewhere there are no streaming stores to use (and [`Settings::new`] never asks for them).
#[cfg(not(target_arch = "x86_64"))]
fn stream_copy(to: &mut [f32], from: &[f32]) {
    to.copy_from_slice(from);
}

/// [`gather`] split over `threads` threads.
fn gather_parallel(
    data: &[f32],
    indices: &[usize],
    out: &mut [f32],
    sample_len: usize,
    threads: usize,
    streaming: bool,
) {
    let per = indices.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (part, idx) in out.chunks_mut(per * sample_len).zip(indices.chunks(per)) {
            scope.spawn(move || gather(data, idx, part, sample_len, streaming));
        }
    });
}

/// The wall time of gathering the settings' batches with their workers, each building whole batches into its own
/// buffer, as the prefetcher's workers do.
fn time_gather(data: &[f32], order: &[usize], settings: &Settings) -> f64 {
    let Settings {
        batches,
        sample_len,
        batch: per_batch,
        workers: threads,
        streaming,
        ..
    } = *settings;
    let begin = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                // Written once before, as the prefetcher's pooled buffers are: no first-touch page faults timed.
                let mut out = vec![1f32; per_batch * sample_len];
                std::hint::black_box(&mut out);
                for b in (t..batches).step_by(threads) {
                    gather(
                        data,
                        &order[b * per_batch..(b + 1) * per_batch],
                        &mut out,
                        sample_len,
                        streaming,
                    );
                }
                std::hint::black_box(&out);
            });
        }
    });
    begin.elapsed().as_secs_f64()
}

/// The median device time of a pinned upload of one batch (`batch_len` f32 values), after a warm-up.
fn time_pinned_upload(context: &Context, stream: &Stream, batch_len: usize) -> Outcome<f64> {
    let host = Pinned::<f32>::zeroed(context, batch_len)?;
    let mut device = DeviceBuffer::<f32>::uninit(stream, batch_len)?;
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

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;

    #[test]
    fn settings_follow_the_flags() {
        let full = Settings::new(&TrainLoopOptions::default());
        assert_eq!((full.dataset_bytes, full.batches), (2 << 30, 400));
        assert_eq!((full.sample_len, full.batch), (4096, 2048));
        assert_eq!(full.workers, cores().min(16));
        assert_eq!(full.streaming, cfg!(target_arch = "x86_64"));
        assert_eq!(full.check(), Ok(()));
        let quick = Settings::new(&TrainLoopOptions {
            quick: true,
            workers: NonZeroUsize::new(3),
            plain_stores: true,
            ..TrainLoopOptions::default()
        });
        assert_eq!((quick.dataset_bytes, quick.batches), (512 << 20, 40));
        assert_eq!((quick.sample_len, quick.batch), (4096, 2048));
        assert_eq!(quick.workers, 3);
        assert!(!quick.streaming);
        assert_eq!(quick.check(), Ok(()));
        let batches = Settings::new(&TrainLoopOptions {
            quick: true,
            batches: NonZeroUsize::new(7),
            ..TrainLoopOptions::default()
        });
        assert_eq!(batches.batches, 7);
    }

    #[test]
    fn a_batch_stays_32_mib_whatever_the_sample_size() {
        for (sample_bytes, sample_len, batch) in [
            (4, 1, 8 << 20),
            (64, 16, 512 << 10),
            (16 << 10, 4096, 2048),
            (1 << 20, 256 << 10, 32),
            (32 << 20, 8 << 20, 1),
        ] {
            for quick in [false, true] {
                let s = Settings::new(&TrainLoopOptions {
                    quick,
                    sample_bytes: Some(sample_bytes),
                    ..TrainLoopOptions::default()
                });
                assert_eq!((s.sample_len, s.batch), (sample_len, batch));
                assert_eq!(s.batch * s.sample_len * 4, BATCH_BYTES);
                // 4-byte samples make more indices than a run holds, unless with few batches.
                if sample_bytes >= 64 || quick {
                    assert_eq!(s.check(), Ok(()), "{sample_bytes}");
                } else {
                    assert!(
                        s.check().unwrap_err().contains("sample indices"),
                        "{sample_bytes}"
                    );
                }
            }
        }
    }

    #[test]
    fn settings_measure_cannot_run_are_refused() {
        // Sizes the command line refuses, were they to get here: no panic, an error.
        for sample_bytes in [0, 2, 6, 12, 4100, 64 << 20] {
            let s = Settings::new(&TrainLoopOptions {
                sample_bytes: Some(sample_bytes),
                ..TrainLoopOptions::default()
            });
            assert!(s.check().is_err(), "{sample_bytes}: {s:?}");
        }
        // A dataset with fewer samples than a batch, and one with just enough.
        let mut s = Settings::new(&TrainLoopOptions {
            sample_bytes: Some(1 << 20),
            ..TrainLoopOptions::default()
        });
        s.dataset_bytes = 31 << 20;
        let e = s.check().unwrap_err();
        assert!(e.contains("31 samples") && e.contains("32 of a"), "{e}");
        s.dataset_bytes = 32 << 20;
        assert_eq!(s.check(), Ok(()));
        // More indices than a usize counts.
        s.batches = usize::MAX / 2;
        assert!(s.check().is_err());
    }

    #[test]
    fn the_order_wraps_around_a_dataset_smaller_than_it() {
        let order = shuffled(3, 100);
        assert_eq!(order.len(), 100);
        assert!(order.iter().all(|&i| i < 3));
        assert_eq!(shuffled(1, 5), [0; 5]);
    }

    #[test]
    fn the_gather_copies_the_indexed_samples_with_either_store() {
        // 1 and 3 f32 values leave the samples unaligned for streaming stores; 4096 is the default sample.
        for sample_len in [1, 3, 4, 16, 4096] {
            let data = make_dataset(8 * sample_len, 3);
            assert!(data.iter().all(|&x| x >= 1.0));
            let order = shuffled(8, 5);
            assert!(order.iter().all(|&i| i < 8));
            for streaming in [false, cfg!(target_arch = "x86_64")] {
                let mut out = vec![0f32; 5 * sample_len];
                gather_parallel(&data, &order, &mut out, sample_len, 2, streaming);
                for (k, &i) in order.iter().enumerate() {
                    assert_eq!(
                        out[k * sample_len..(k + 1) * sample_len],
                        data[i * sample_len..(i + 1) * sample_len],
                        "sample_len {sample_len}, streaming {streaming}"
                    );
                }
            }
        }
    }

    #[test]
    fn sizes_read_in_their_largest_whole_unit() {
        assert_eq!(size(4), "4 B");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(16 << 10), "16 KiB");
        assert_eq!(size(32 << 20), "32 MiB");
    }
}
