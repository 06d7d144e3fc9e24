//! Overlap of copies with compute (feature `gpu`, which builds the crate's kernels): a pipeline uploads chunks
//! and after each runs `kernels::spin` for about the chunk's copy time. On one stream the two alternate; with a
//! copy stream and a compute stream, three device buffers deep and ordered by events, chunk i+1's upload runs
//! while chunk i's kernel does, so the pipeline approaches the longer of all copies and all kernels.

use std::time::Duration;

use cuda_pinned::{DeviceBuffer, Event, Pinned, Stream, kernels};

use crate::results::{Overlap, size_label};
use crate::timing::{Plan, Stopwatch, fill_pattern, median};
use crate::{Bench, Outcome};

/// Device buffers the pipeline cycles through.
const SLOTS: usize = 3;
/// The estimated seconds of [`overlap`], for the progress bar.
pub fn estimate(plan: &Plan) -> f64 {
    let total = (plan.overlap_chunks * plan.overlap_chunk_bytes) as f64;
    0.05 + plan.overlap_samples as f64 * 6.0 * total / 45e9
}

/// Times the pipeline of the plan's chunks on one stream and on two.
pub fn overlap(bench: &mut Bench) -> Outcome<Overlap> {
    let plan = bench.plan.clone();
    let (chunks, chunk) = (plan.overlap_chunks, plan.overlap_chunk_bytes);
    bench.progress.show(&format!(
        "overlap: {chunks} x {} uploads and kernels",
        size_label(chunk)
    ));
    let context = bench.context.clone();
    let copy = bench.stream.clone();
    let compute = Stream::new(&context)?;
    let mut host = Pinned::<u8>::zeroed(&context, chunks * chunk)?;
    fill_pattern(host.as_mut_slice()?, bench.next_seed());
    // Three device slots: a copy may run two chunks ahead of the kernels, so that a kernel a little longer than
    // its copy does not stall the copy stream at once.
    let mut slots = Vec::with_capacity(SLOTS);
    let (mut copied, mut computed) = (Vec::with_capacity(SLOTS), Vec::with_capacity(SLOTS));
    for _ in 0..SLOTS {
        slots.push(DeviceBuffer::<u8>::uninit(&copy, chunk)?);
        copied.push(Event::without_timing(&context)?);
        computed.push(Event::without_timing(&context)?);
    }
    let watch = Stopwatch::new(&copy)?;
    let samples = plan.overlap_samples;
    let repeat = |run: &mut dyn FnMut() -> Outcome<()>| -> Outcome<f64> {
        run()?; // warm-up
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            times.push(watch.time(&mut *run)?);
        }
        Ok(median(times))
    };

    let copy_seconds = repeat(&mut || {
        for i in 0..chunks {
            copy.upload(
                &host.slice(i * chunk..(i + 1) * chunk)?,
                &mut slots[i % SLOTS],
            )?;
        }
        Ok(())
    })?;
    let spin = Duration::from_secs_f64(copy_seconds / chunks as f64);
    let kernel_seconds = repeat(&mut || {
        for _ in 0..chunks {
            kernels::spin(&copy, spin)?;
        }
        Ok(())
    })?;
    let one_stream_seconds = repeat(&mut || {
        for i in 0..chunks {
            copy.upload(
                &host.slice(i * chunk..(i + 1) * chunk)?,
                &mut slots[i % SLOTS],
            )?;
            kernels::spin(&copy, spin)?;
        }
        Ok(())
    })?;
    // `spin` reads no buffer, so the tracker orders nothing here: the events stand for what a kernel reading
    // the slot would get from it (the upload waits until the kernel two chunks back is done with the slot).
    let start = Event::without_timing(&context)?;
    let two_streams_seconds = repeat(&mut || {
        start.record(&copy)?;
        compute.wait(&start)?;
        for i in 0..chunks {
            let slot = i % SLOTS;
            if i >= SLOTS {
                copy.wait(&computed[slot])?;
            }
            copy.upload(&host.slice(i * chunk..(i + 1) * chunk)?, &mut slots[slot])?;
            copied[slot].record(&copy)?;
            compute.wait(&copied[slot])?;
            kernels::spin(&compute, spin)?;
            computed[slot].record(&compute)?;
        }
        // The stopwatch's end event is on the copy stream: make it wait for the last kernel.
        if let Some(last) = chunks.checked_sub(1) {
            copy.wait(&computed[last % SLOTS])?;
        }
        Ok(())
    })?;
    bench.progress.advance(estimate(&plan));
    Ok(Overlap {
        chunks,
        chunk_bytes: chunk,
        spin_seconds: spin.as_secs_f64(),
        copy_seconds,
        kernel_seconds,
        one_stream_seconds,
        two_streams_seconds,
        samples,
    })
}
