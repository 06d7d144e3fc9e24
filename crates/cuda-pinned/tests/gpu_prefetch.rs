//! The prefetcher on a GPU and, without feature `gpu`, on the simulated driver (with its stand-ins for the
//! checksum and spin kernels): order kept while workers finish out of order, unordered delivery, early exit,
//! errors and panics in the fill closure (even one whose payload panics when dropped), a consumer that holds every
//! slot, the refill waiting for the
//! consumer's kernels (tracked and raw), the consumer never blocked by an upload, and batches of several
//! buffers.

mod common;

#[cfg(feature = "gpu")]
use std::ffi::c_void;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

#[cfg(not(feature = "gpu"))]
use common::kernels::{device_checksum, spin};
use common::{data, hold, serial};
use cuda_pinned::kernels::checksum;
#[cfg(feature = "gpu")]
use cuda_pinned::kernels::raw;
#[cfg(feature = "gpu")]
use cuda_pinned::kernels::{device_checksum, spin};
use cuda_pinned::prefetch::{Batch, DeviceParts};
use cuda_pinned::{Context, DeviceBuffer, Error, Pinned, PinnedPool, Prefetcher, Stream};

fn context() -> Context {
    common::device(0)
}

/// Batch `i`'s contents: fresh data for each index, never zeros.
fn contents(i: usize, len: usize) -> Vec<u32> {
    data(len, 1000 + i as u64)
}

/// The checksum of batch `i`'s contents, computed on the host.
fn want_sum(i: usize, len: usize) -> u64 {
    checksum(bytemuck::cast_slice(&contents(i, len)))
}

/// A fill time between 0 and 3 ms that varies with the index, so that workers finish out of order.
fn jitter(i: usize) -> Duration {
    let z = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    Duration::from_micros((z >> 40) % 3000)
}

/// Writes the device checksum of `batch` into `sums[k]`, on `stream` (tracked).
fn sum_into(stream: &Stream, batch: &DeviceBuffer<u32>, sums: &mut DeviceBuffer<u64>, k: usize) {
    device_checksum(stream, batch, &mut sums.slice_mut(k..=k).unwrap()).unwrap();
}

/// Writes the device checksum of `batch` into `sums[k]` with the raw launcher: work the crate does not track,
/// ordered only by the stream and by what the prefetcher declared.
fn raw_sum_into(stream: &Stream, batch: &DeviceBuffer<u32>, sums: &DeviceBuffer<u64>, k: usize) {
    let out = sums.as_raw() + (k * size_of::<u64>()) as u64;
    #[cfg(feature = "gpu")]
    {
        // SAFETY: `batch` and `sums[k]` are live device memory of this context, and the test keeps both alive
        // until the stream has run the kernel (it synchronises before dropping them).
        let code = unsafe {
            raw::cuda_pinned_checksum(
                batch.as_raw() as *const c_void,
                batch.byte_len(),
                out as *mut u64,
                stream.as_raw(),
            )
        };
        raw::check_launch(code, "cuda_pinned_checksum").unwrap();
    }
    #[cfg(not(feature = "gpu"))]
    // SAFETY: as for the kernel: live device memory of this context, kept until the stream has run the work.
    unsafe { common::kernels::raw_checksum(stream, batch.as_raw(), batch.byte_len(), out) }
        .unwrap();
}

fn download(stream: &Stream, sums: &DeviceBuffer<u64>) -> Vec<u64> {
    let mut host = vec![0u64; sums.len()];
    stream.download_pageable(sums, &mut host).unwrap();
    host
}

/// The names of this process's threads that are prefetch workers (Linux truncates names to 15 bytes).
fn prefetch_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("cuda-pinned-pre"))
        .count()
}

/// [`prefetch_threads`] once the joined workers are gone from `/proc`: a thread that `join` saw end is
/// released by the kernel a moment later (seen once in a full run: one left at the first look). Looks for up
/// to a second.
fn prefetch_threads_left() -> usize {
    let started = Instant::now();
    loop {
        let left = prefetch_threads();
        if left == 0 || started.elapsed() > Duration::from_secs(1) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn ordered_batches_arrive_in_order_while_workers_finish_out_of_order() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let (n, len) = (200, 64 << 10);
    let finished = Arc::new(Mutex::new(Vec::new()));
    let order = finished.clone();
    let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(n)
        .workers(4)
        .build(move |i, batch| {
            std::thread::sleep(jitter(i));
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            order.lock().unwrap().push(i);
            Ok(())
        })
        .unwrap();
    assert_eq!((prefetcher.workers(), prefetcher.depth()), (4, 8));
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, n).unwrap();
    let mut count = 0;
    for (k, batch) in prefetcher.enumerate() {
        let batch = batch.unwrap();
        assert_eq!((batch.position(), batch.index()), (k, k));
        sum_into(&consumer, &batch, &mut sums, k);
        count += 1;
    }
    assert_eq!(count, n);
    let got = download(&consumer, &sums);
    for (i, &sum) in got.iter().enumerate() {
        assert_eq!(sum, want_sum(i, len), "batch {i}");
    }
    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.len(), n);
    assert!(
        finished.windows(2).any(|w| w[0] > w[1]),
        "the workers should have finished out of order"
    );
    assert_eq!(pool.stats().in_use, 0, "every slot went back to the pool");
    assert_eq!(prefetch_threads_left(), 0, "every worker was joined");
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn unordered_delivers_every_index_exactly_once() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let (n, len) = (200, 16 << 10);
    // A shuffled epoch: the indices in a scrambled order (7 is coprime with 200).
    let indices: Vec<usize> = (0..n).map(|k| (k * 7 + 3) % n).collect();
    let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .indices(indices.clone())
        .workers(4)
        .depth(6)
        .ordered(false)
        .build(move |i, batch| {
            std::thread::sleep(jitter(i));
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, n).unwrap();
    let mut seen = Vec::new();
    for batch in prefetcher {
        let batch = batch.unwrap();
        assert_eq!(indices[batch.position()], batch.index());
        sum_into(&consumer, &batch, &mut sums, batch.index());
        seen.push(batch.index());
    }
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "every index exactly once"
    );
    println!(
        "unordered: {} of {n} batches came out of the given order",
        seen.iter().zip(&indices).filter(|(a, b)| a != b).count()
    );
    for (i, &sum) in download(&consumer, &sums).iter().enumerate() {
        assert_eq!(sum, want_sum(i, len), "batch {i}");
    }
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn early_exit_returns_promptly_and_kept_batches_stay_valid() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let len = 256 << 10;
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(1000)
        .workers(4)
        .build(move |i, batch| {
            std::thread::sleep(Duration::from_millis(1));
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let first = prefetcher.next().unwrap().unwrap();
    let second = prefetcher.next().unwrap().unwrap();
    let third = prefetcher.next().unwrap().unwrap();
    drop(second);
    assert!(prefetch_threads() > 0);
    let started = Instant::now();
    drop(prefetcher);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "dropping took {took:?}");
    assert_eq!(prefetch_threads_left(), 0, "every worker was joined");
    // Batches kept past the prefetcher are still whole, and usable on the consumer stream.
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, 3).unwrap();
    sum_into(&consumer, &first, &mut sums, 0);
    sum_into(&consumer, &third, &mut sums, 2);
    drop((first, third));
    let got = download(&consumer, &sums);
    assert_eq!((got[0], got[2]), (want_sum(0, len), want_sum(2, len)));
    consumer.synchronize().unwrap();
    assert_eq!(pool.stats().in_use, 0, "every slot went back to the pool");
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn a_worker_error_is_delivered_in_place_and_ends_the_stream() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let len = 4096;
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(100)
        .workers(4)
        .build(move |i, batch| {
            std::thread::sleep(jitter(i));
            if i == 7 {
                return Err(format!("no data for batch {i}").into());
            }
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    for k in 0..7 {
        assert_eq!(prefetcher.next().unwrap().unwrap().index(), k);
    }
    let e = prefetcher.next().unwrap().unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Worker {
                index: 7,
                panicked: false,
                cause: Some(_),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "building batch 7 failed: no data for batch 7"
    );
    assert!(
        prefetcher.next().is_none(),
        "the stream ends after the error"
    );
    assert!(prefetcher.next().is_none());
    drop(prefetcher);

    // The crate's own errors reach the consumer unchanged.
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(10)
        .build(|i, batch| {
            if i == 2 {
                batch.slice(..batch.len() + 1)?; // out of range
            }
            Ok(())
        })
        .unwrap();
    let results: Vec<_> = prefetcher.by_ref().collect();
    assert_eq!(results.len(), 3);
    assert!(
        matches!(results[2], Err(Error::InvalidArgument { .. })),
        "{:?}",
        results[2]
    );
    drop(results);
    drop(prefetcher);
    assert_eq!(prefetch_threads_left(), 0);
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn a_worker_panic_becomes_an_error_not_a_hang() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let len = 4096;
    let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(100)
        .workers(3)
        .build(move |i, batch| {
            if i == 5 {
                panic!("boom at batch {i}");
            }
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let started = Instant::now();
    let results: Vec<_> = prefetcher.collect();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(results.len(), 6, "batches 0 to 4, then the panic");
    for (k, result) in results[..5].iter().enumerate() {
        assert_eq!(result.as_ref().unwrap().index(), k);
    }
    match &results[5] {
        Err(
            e @ Error::Worker {
                index: 5,
                panicked: true,
                message,
                ..
            },
        ) => {
            assert!(message.contains("boom at batch 5"), "{message}");
            assert!(
                e.to_string()
                    .starts_with("a prefetch worker panicked while building batch 5: ")
            );
        }
        other => panic!("expected the panic of batch 5, got {other:?}"),
    }
    drop(results);
    assert_eq!(prefetch_threads_left(), 0);
    ctx.check_deferred_errors().unwrap();
}

/// A panic payload whose own `Drop` panics.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("the panic payload's drop panicked too");
    }
}

/// A fill closure that panics with a payload whose drop panics again must still end the stream with the
/// panic's error in its place: the worker may not die without completing its batch. The consumer runs on a
/// thread of its own, bounded, so that a regression fails instead of hanging.
#[test]
fn a_panic_whose_payload_panics_when_dropped_still_reaches_the_consumer() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let len = 1024;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
            .batches(20)
            .workers(2)
            .build(move |i, batch| {
                if i == 3 {
                    std::panic::panic_any(PanicsWhenDropped);
                }
                batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
                Ok(())
            })
            .unwrap();
        let outcomes: Vec<_> = prefetcher.map(|r| r.map(|b| b.index())).collect();
        let _ = tx.send(outcomes);
    });
    let outcomes = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the consumer still waits for the batch whose worker panicked");
    assert_eq!(
        outcomes.len(),
        4,
        "batches 0 to 2, then the panic: {outcomes:?}"
    );
    for (k, outcome) in outcomes[..3].iter().enumerate() {
        assert_eq!(*outcome.as_ref().unwrap(), k);
    }
    match &outcomes[3] {
        Err(Error::Worker {
            index: 3,
            panicked: true,
            message,
            ..
        }) => assert!(message.contains("not a string"), "{message}"),
        other => panic!("expected the panic of batch 3, got {other:?}"),
    }
    // The prefetcher dropped on the consumer's thread before it sent: its workers were joined.
    assert_eq!(prefetch_threads_left(), 0);
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn a_consumer_holding_every_slot_gets_an_error_then_continues() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let (n, len) = (12, 32 << 10);
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(n)
        .workers(2)
        .depth(3)
        .build(move |i, batch| {
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, n).unwrap();
    let mut held: Vec<_> = (0..3)
        .map(|_| prefetcher.next().unwrap().unwrap())
        .collect();
    let mut positions: Vec<usize> = held.iter().map(|batch| batch.position()).collect();
    let started = Instant::now();
    let e = prefetcher.next().unwrap().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "an error, not a wait"
    );
    assert!(
        e.to_string().contains(
            "all 3 slots of the prefetcher are held by the consumer; drop a batch or raise the depth"
        ),
        "{e}"
    );
    for batch in &held {
        sum_into(&consumer, batch, &mut sums, batch.index());
    }
    drop(held.remove(0));
    // From now on the consumer keeps two batches at a time, and asks for the next with one slot free.
    for batch in prefetcher.by_ref() {
        let batch = batch.unwrap();
        positions.push(batch.position());
        sum_into(&consumer, &batch, &mut sums, batch.index());
        held.push(batch);
        if held.len() > 2 {
            drop(held.remove(0));
        }
    }
    drop(prefetcher);
    drop(held);
    assert_eq!(positions, (0..n).collect::<Vec<_>>());
    for (i, &sum) in download(&consumer, &sums).iter().enumerate() {
        assert_eq!(sum, want_sum(i, len), "batch {i}");
    }
    ctx.check_deferred_errors().unwrap();
}

/// One slot, so each batch's device buffer is overwritten by the next batch's upload as soon as the consumer
/// drops it: that upload must wait for the consumer's slowed kernel on the batch.
fn refill_waits_for_the_consumer(raw_kernel: bool) {
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let (n, len) = (6, 1 << 20);
    let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(n)
        .workers(1)
        .depth(1)
        .build(move |i, batch| {
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, n).unwrap();
    for batch in prefetcher {
        let batch = batch.unwrap();
        let k = batch.index();
        // The host side as the fill left it (reading it does not wait: the upload only reads it too).
        let host = checksum(bytemuck::cast_slice(batch.host().as_slice().unwrap()));
        assert_eq!(host, want_sum(k, len), "batch {k} on the host");
        spin(&consumer, Duration::from_millis(30)).unwrap();
        if raw_kernel {
            raw_sum_into(&consumer, &batch, &sums, k);
        } else {
            sum_into(&consumer, &batch, &mut sums, k);
        }
        // Dropped while the spin and the checksum are still queued: the refill starts now.
    }
    for (i, &sum) in download(&consumer, &sums).iter().enumerate() {
        assert_eq!(
            sum,
            want_sum(i, len),
            "batch {i} was overwritten before the consumer's kernel read it (raw: {raw_kernel})"
        );
    }
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn the_refill_waits_for_the_consumers_tracked_kernel() {
    let _serial = serial();
    refill_waits_for_the_consumer(false);
}

#[test]
fn the_refill_waits_for_the_consumers_raw_kernel() {
    let _serial = serial();
    refill_waits_for_the_consumer(true);
}

/// The copy stream is busy when the consumer asks for a batch: the batch comes at once (the host does not
/// wait for the upload), and a raw kernel on the consumer stream still sees the uploaded data.
#[test]
fn delivery_waits_on_the_device_not_on_the_host() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let copy = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let len = 4 << 20;
    // Blocks of the batches' size cached in the pool, so that building pins nothing (pinning can
    // synchronise the device, which would wait for the hold below).
    drop((
        pool.alloc::<u32>(len).unwrap(),
        pool.alloc::<u32>(len).unwrap(),
    ));
    // A 300 ms spin on a GPU; on the simulator the copy stream waits until `held` drops.
    let held = hold(&copy, Duration::from_millis(300));
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(2)
        .workers(1)
        .depth(2)
        .copy_stream(&copy)
        .build(move |i, batch| {
            batch.as_mut_slice()?.copy_from_slice(&contents(i, len));
            Ok(())
        })
        .unwrap();
    let started = Instant::now();
    let first = prefetcher.next().unwrap().unwrap();
    let took = started.elapsed();
    assert!(
        !copy.query().unwrap(),
        "the upload is still queued behind the hold, yet the batch was delivered ({took:?})"
    );
    let mut sums = DeviceBuffer::<u64>::zeroed(&consumer, 2).unwrap();
    raw_sum_into(&consumer, &first, &sums, 0);
    let second = prefetcher.next().unwrap().unwrap();
    sum_into(&consumer, &second, &mut sums, 1);
    assert!(prefetcher.next().is_none());
    // The sums wait for both uploads, which wait for the copy stream: let it go on.
    drop(held);
    let got = download(&consumer, &sums);
    assert_eq!(got, vec![want_sum(0, len), want_sum(1, len)]);
    drop((first, second, prefetcher));
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn tuple_and_array_batches() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let (inputs, targets) = (10_007, 333);
    let prefetcher =
        Prefetcher::<(Pinned<f32>, Pinned<u32>)>::builder(&pool, &consumer, (inputs, targets))
            .batches(20)
            .workers(3)
            .build(|i, (x, y)| {
                for (k, v) in x.as_mut_slice()?.iter_mut().enumerate() {
                    *v = (i * 100_000 + k) as f32;
                }
                let want = contents(i, y.len());
                y.as_mut_slice()?.copy_from_slice(&want);
                Ok(())
            })
            .unwrap();
    let mut count = 0;
    for batch in prefetcher {
        let batch = batch.unwrap();
        let i = batch.index();
        let (mut x, mut y) = (vec![0f32; inputs], vec![0u32; targets]);
        consumer.download_pageable(&batch.0, &mut x).unwrap();
        consumer.download_pageable(&batch.1, &mut y).unwrap();
        assert!(
            x.iter()
                .enumerate()
                .all(|(k, &v)| v == (i * 100_000 + k) as f32),
            "inputs of batch {i}"
        );
        assert_eq!(y, contents(i, targets), "targets of batch {i}");
        count += 1;
    }
    assert_eq!(count, 20);

    let lens = [1, 4096, 100_003];
    let prefetcher = Prefetcher::<[Pinned<u32>; 3]>::builder(&pool, &consumer, lens)
        .batches(9)
        .build(|i, parts| {
            for (j, part) in parts.iter_mut().enumerate() {
                let want = contents(10 * i + j, part.len());
                part.as_mut_slice()?.copy_from_slice(&want);
            }
            Ok(())
        })
        .unwrap();
    for batch in prefetcher {
        let batch = batch.unwrap();
        for (j, part) in batch.iter().enumerate() {
            let mut got = vec![0u32; part.len()];
            consumer.download_pageable(part, &mut got).unwrap();
            assert_eq!(got, contents(10 * batch.index() + j, lens[j]), "part {j}");
        }
    }
    ctx.check_deferred_errors().unwrap();
}

/// A user's struct of buffers, as in the docs of `Batch`.
struct Sample {
    values: Pinned<f64>,
    labels: Pinned<u8>,
}

struct DeviceSample {
    values: DeviceBuffer<f64>,
    labels: DeviceBuffer<u8>,
}

impl Batch for Sample {
    type Layout = usize;
    type Device = DeviceSample;

    fn alloc_host(pool: &PinnedPool, n: &usize) -> cuda_pinned::Result<Sample> {
        Ok(Sample {
            values: pool.alloc(*n)?,
            labels: pool.alloc(*n)?,
        })
    }

    fn alloc_device(stream: &Stream, n: &usize) -> cuda_pinned::Result<DeviceSample> {
        Ok(DeviceSample {
            values: DeviceBuffer::uninit(stream, *n)?,
            labels: DeviceBuffer::uninit(stream, *n)?,
        })
    }

    fn upload(&self, stream: &Stream, device: &mut DeviceSample) -> cuda_pinned::Result<()> {
        stream.upload(&self.values, &mut device.values)?;
        stream.upload(&self.labels, &mut device.labels)
    }

    fn device_parts<'a>(device: &'a DeviceSample, parts: &mut DeviceParts<'a>) {
        parts.add(&device.values).add(&device.labels);
    }
}

#[test]
fn a_users_struct_and_a_pool_too_small() {
    let _serial = serial();
    let ctx = context();
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let n = 5000;
    let prefetcher = Prefetcher::<Sample>::builder(&pool, &consumer, n)
        .batches(10)
        .workers(2)
        .build(move |i, sample| {
            for (k, v) in sample.values.as_mut_slice()?.iter_mut().enumerate() {
                *v = (i * n + k) as f64 * 0.5;
            }
            for (k, v) in sample.labels.as_mut_slice()?.iter_mut().enumerate() {
                *v = (i + k) as u8;
            }
            Ok(())
        })
        .unwrap();
    for batch in prefetcher {
        let batch = batch.unwrap();
        let i = batch.index();
        let (mut values, mut labels) = (vec![0f64; n], vec![0u8; n]);
        consumer
            .download_pageable(&batch.values, &mut values)
            .unwrap();
        consumer
            .download_pageable(&batch.labels, &mut labels)
            .unwrap();
        assert!(
            values
                .iter()
                .enumerate()
                .all(|(k, &v)| v == (i * n + k) as f64 * 0.5)
        );
        assert!(labels.iter().enumerate().all(|(k, &v)| v == (i + k) as u8));
    }
    // Eight slots of 32 MiB do not fit a 64 MiB budget: an error at build, not a hang.
    let e = Prefetcher::<Pinned<u8>>::builder(&pool, &consumer, 32 << 20)
        .batches(100)
        .workers(4)
        .build(|_, _| Ok(()))
        .unwrap_err();
    assert!(matches!(e, Error::PoolExhausted { .. }), "{e}");
    assert_eq!(pool.stats().in_use, 0);
    ctx.check_deferred_errors().unwrap();
}
