//! A training loop fed through pinned memory. Worker threads of a [`Prefetcher`] gather each batch from a
//! dataset in ordinary memory straight into pinned buffers of a [`PinnedPool`], a copy stream uploads them, and
//! the loop's stream computes on each batch as soon as it is on the device: the loop never waits for the host's
//! gathering nor for a copy, only the device does.
//!
//! `cargo run --release --features gpu --example train_loop`
//!
//! To time such a loop against a pageable one and against what the link and the host can do, run
//! `cargo run --release -p pinbench --features gpu -- train-loop`.

use std::sync::Arc;

use cuda_pinned::kernels::axpy;
use cuda_pinned::{Context, DeviceBuffer, Pinned, PinnedPool, Prefetcher, Stream};

/// f32 values per sample.
const SAMPLE: usize = 1024;
/// Samples in the dataset.
const SAMPLES: usize = 4096;
/// Samples per batch (1 MiB).
const BATCH: usize = 256;
/// Batches fed: an epoch over the dataset, twice.
const BATCHES: usize = 2 * SAMPLES / BATCH;

fn main() {
    if let Err(e) = run() {
        eprintln!("train_loop: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_pinned::Result<()> {
    let context = Context::on(0)?;
    let compute = Stream::new(&context)?;
    let copies = Stream::new(&context)?;

    // The "model": parameters uploaded once from pinned memory. The upload returns at once; work queued on
    // `compute` after it sees the parameters in place.
    let initial = Pinned::from_slice(&context, &vec![0.0f32; BATCH * SAMPLE])?;
    let mut params = DeviceBuffer::<f32>::uninit(&compute, BATCH * SAMPLE)?;
    compute.upload(&initial, &mut params)?;

    // The dataset, in ordinary memory, and a fixed shuffle of the samples (shared with the worker threads).
    let dataset: Arc<Vec<f32>> = Arc::new((0..SAMPLES * SAMPLE).map(|i| (i % 7) as f32).collect());
    let order: Arc<Vec<usize>> =
        Arc::new((0..BATCHES * BATCH).map(|i| i * 769 % SAMPLES).collect());

    // Room for the batches in flight; the pool hands the same pinned buffers out again batch after batch.
    let pool = PinnedPool::new(&context, 16 * BATCH * SAMPLE * 4);
    let batches = Prefetcher::<Pinned<f32>>::builder(&pool, &compute, BATCH * SAMPLE)
        .batches(BATCHES)
        .workers(4)
        .copy_stream(&copies)
        .build(move |b, host: &mut Pinned<f32>| {
            // On a worker thread: gather batch `b`'s samples into its pinned buffer.
            let out = host.as_mut_slice()?;
            for (k, &i) in order[b * BATCH..(b + 1) * BATCH].iter().enumerate() {
                out[k * SAMPLE..(k + 1) * SAMPLE]
                    .copy_from_slice(&dataset[i * SAMPLE..(i + 1) * SAMPLE]);
            }
            Ok(())
        })?;

    for batch in batches {
        // The batch is on the device, or will be before any work queued on `compute` from here on runs.
        let batch = batch?;
        // The "training step": params += 0.001 * batch.
        axpy(&compute, 0.001, batch.device(), &mut params)?;
    }

    // Bring the parameters back: `as_slice` waits for the download, and only for it.
    let mut result = Pinned::<f32>::zeroed(&context, BATCH * SAMPLE)?;
    compute.download(&params, &mut result)?;
    let sum: f64 = result.as_slice()?.iter().map(|&x| f64::from(x)).sum();
    let (kib, mean) = (BATCH * SAMPLE * 4 / 1024, sum / (BATCH * SAMPLE) as f64);
    println!("fed {BATCHES} batches of {kib} KiB; mean parameter {mean:.4}");
    Ok(())
}
