//! Two devices: one page-locked buffer shared by both devices' streams, copies between their memory (peer
//! copies, both ways, odd sizes), buffers dropped while the other device still uses them, and the memory each
//! device's streams must refuse.
//!
//! On a GPU (feature `gpu`) it needs two devices and fails with fewer; on the simulated driver it installs two,
//! which can access each other (`tests/sim_staged_peer.rs` runs the copies where they cannot).

mod common;

use std::time::Duration;

use common::devices::{PEER_LENGTHS, peer_copy};
use common::{data, hold, refused, serial_on_two_devices};
use cuda_pinned::sys::{
    CUmemAccess_flags, CUmemLocation, CUmemLocationType, CUmemoryPool, CUpointer_attribute,
};
use cuda_pinned::{Context, DeviceBuffer, Event, Pinned, PinnedBuilder, Stream, Use, driver_call};

/// The primary contexts of devices 0 and 1.
fn two_devices() -> [Context; 2] {
    let count = common::device_count();
    assert!(
        count >= 2,
        "this test needs two devices, the machine has {count}"
    );
    [common::device(0), common::device(1)]
}

const N: usize = 1 << 20;

/// Waits for the work of both devices, then checks that no free was refused or leaked on the way (the errors
/// a destructor keeps in its context).
fn settle(contexts: &[Context; 2]) {
    for context in contexts {
        context.synchronize().unwrap();
        context.check_deferred_errors().unwrap();
    }
}

/// A device buffer of `stream`'s device holding `values`, uploaded on `stream`.
fn device_copy(stream: &Stream, values: &[u32]) -> DeviceBuffer<u32> {
    let host = Pinned::from_slice(stream.context(), values).unwrap();
    let mut device = DeviceBuffer::uninit(stream, values.len()).unwrap();
    stream.upload(&host, &mut device).unwrap();
    device
}

/// What a consumer on device 1 reads from a page-locked buffer that a producer on device 0 writes: the
/// producer's download into `shared` is held back on its stream, and the consumer's upload out of `shared`
/// is enqueued through the crate (`tracked`) or around it. Returns what reached the consumer.
fn produce_and_consume(tracked: bool) -> (Vec<u32>, Vec<u32>) {
    let [ctx0, ctx1] = two_devices();
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let want = data(N, 11);
    let source = Pinned::from_slice(&ctx0, &want).unwrap();
    let mut d0 = DeviceBuffer::<u32>::zeroed(&s0, N).unwrap();
    // Allocated by device 1's context, written by device 0's streams: portable by default.
    let mut shared = Pinned::<u32>::zeroed(&ctx1, N).unwrap();
    let mut d1 = DeviceBuffer::<u32>::zeroed(&s1, N).unwrap();
    let mut out = Pinned::<u32>::zeroed(&ctx1, N).unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    let held = hold(&s0, Duration::from_secs(1));
    s0.upload(&source, &mut d0).unwrap();
    s0.download(&d0, &mut shared).unwrap();
    if tracked {
        s1.upload(&shared, &mut d1).unwrap();
    } else {
        let (to, from) = (d1.as_raw(), shared.as_ptr());
        // SAFETY: an upload of N u32s on the stream it is given into `d1` (declared written); it reads `shared`
        // undeclared, which is the point of the control (the buffer stays alive until the end of the test).
        unsafe {
            s1.enqueue_foreign(&[Use::write(&mut d1)], |stream| {
                cuda_pinned::driver_call!(cuMemcpyHtoDAsync_v2(to, from.cast(), N * 4, stream))
            })
        }
        .unwrap()
        .unwrap();
        // It waits for nothing: done while the producer is still held (the simulator's streams run after
        // random delays, so without this the producer, released below, could win the race).
        s1.synchronize().unwrap();
    }
    s1.download(&d1, &mut out).unwrap();
    drop(held);
    let got = out.as_slice().unwrap().to_vec();
    s1.synchronize().unwrap();
    (got, want)
}

#[test]
fn a_buffer_written_on_one_device_and_read_on_the_other_is_read_after_the_write() {
    let _serial = serial_on_two_devices();
    let (got, want) = produce_and_consume(true);
    common::compare(&got, &want, "what device 1 read").unwrap();
}

/// The control: the consumer's read enqueued around the tracking does not wait, and reads the buffer before
/// the producer has written it.
#[test]
fn control_a_read_around_the_tracking_reads_before_the_write() {
    let _serial = serial_on_two_devices();
    let (got, want) = produce_and_consume(false);
    assert_ne!(
        got, want,
        "the untracked read waited for the other device's write"
    );
}

/// The host's access to a buffer that both devices use waits for the work of both: writing it waits for the
/// other device's read, reading it for the first device's write.
#[test]
fn host_access_waits_for_the_work_of_both_devices() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let mut shared = Pinned::from_slice(&ctx0, &data(N, 3)).unwrap();
    let mut d0 = DeviceBuffer::<u32>::zeroed(&s0, N).unwrap();
    let d1 = device_copy(&s1, &data(N, 5));
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    // Device 0 reads the buffer, held back.
    let held0 = hold(&s0, Duration::from_millis(500));
    s0.upload(&shared, &mut d0).unwrap();
    let read = Event::new(&ctx0).unwrap();
    s0.record(&read).unwrap();
    assert!(
        shared.try_as_mut_slice().unwrap().is_none(),
        "writable while device 0 reads it"
    );
    assert!(
        shared.try_as_slice().unwrap().is_some(),
        "a read waited for a read"
    );
    drop(held0);
    shared.as_mut_slice().unwrap().fill(7);
    assert!(
        read.query().unwrap(),
        "the host wrote before device 0's read had completed"
    );
    // Device 1 writes it, held back.
    let held1 = hold(&s1, Duration::from_millis(500));
    s1.download(&d1, &mut shared).unwrap();
    let written = Event::new(&ctx1).unwrap();
    s1.record(&written).unwrap();
    assert!(
        shared.try_as_slice().unwrap().is_none(),
        "readable while device 1 writes it"
    );
    drop(held1);
    let seen = shared.as_slice().unwrap().to_vec();
    assert!(
        written.query().unwrap(),
        "the host read before device 1's write had completed"
    );
    common::compare(&seen, &data(N, 5), "what device 1 wrote").unwrap();
}

#[test]
fn peer_copies_both_ways_arrive_whole() {
    let _serial = serial_on_two_devices();
    let contexts = two_devices();
    for len in PEER_LENGTHS {
        for (from, to) in [(0, 1), (1, 0)] {
            for on_source in [false, true] {
                peer_copy(&contexts, from, to, len, on_source);
            }
        }
    }
    assert!(contexts[0].can_access_peer(&contexts[1]).unwrap() || !common::SIMULATED);
    settle(&contexts);
}

/// Whether device `device`'s work may use the memory of `pool` directly (`cuMemPoolGetAccess`).
fn pool_open_to(pool: CUmemoryPool, device: &Context) -> bool {
    let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
    let mut location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device.device().as_raw(),
    };
    // SAFETY: an out-pointer to a local and a location read during the call.
    unsafe { driver_call!(cuMemPoolGetAccess(&mut flags, pool, &mut location)) }.unwrap();
    flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
}

/// The memory pool `buffer`'s memory came from.
fn pool_of(buffer: &DeviceBuffer<u32>) -> CUmemoryPool {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local of the attribute's type; the driver only looks the address up.
    unsafe {
        driver_call!(cuPointerGetAttribute(
            (&raw mut pool).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            buffer.as_raw()
        ))
    }
    .unwrap();
    pool
}

/// Peer copies open only the crate's own memory pools to the other device: each device's current pool, which
/// belongs to whoever set it (the default pool here), is left as it was, closed to the other device.
#[test]
fn peer_copies_open_the_crates_pools_and_leave_the_devices_own_as_they_were() {
    let _serial = serial_on_two_devices();
    let contexts = two_devices();
    for (from, to) in [(0, 1), (1, 0)] {
        peer_copy(&contexts, from, to, 1025, true);
    }
    for (owner, other) in [(0, 1), (1, 0)] {
        let stream = Stream::new(&contexts[owner]).unwrap();
        let crates = pool_of(&DeviceBuffer::<u32>::zeroed(&stream, 1).unwrap());
        assert!(
            pool_open_to(crates, &contexts[other]),
            "the crate's pool of device {owner} is closed to device {other} after copies between them"
        );
        let mut current = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        unsafe {
            driver_call!(cuDeviceGetMemPool(
                &mut current,
                contexts[owner].device().as_raw()
            ))
        }
        .unwrap();
        assert!(current != crates, "the crate allocates from its own pool");
        assert!(
            !pool_open_to(current, &contexts[other]),
            "device {owner}'s current memory pool was opened to device {other}"
        );
    }
    settle(&contexts);
}

/// A buffer taken over from other code (`from_raw`) whose memory is of the device's default pool, which the
/// crate does not open to other devices, is copied to and from the other device whole, through page-locked
/// memory (on the simulated driver a direct copy of it would be reported as a hidden wait: the driver stages
/// such a copy itself, holding back other streams).
#[test]
fn buffers_of_other_pools_are_copied_between_devices() {
    let _serial = serial_on_two_devices();
    let contexts = two_devices();
    let (s0, s1) = (
        Stream::new(&contexts[0]).unwrap(),
        Stream::new(&contexts[1]).unwrap(),
    );
    let want = data(5000, 21);
    let mut ptr = 0;
    // SAFETY: an out-pointer to a local; a live stream.
    unsafe { driver_call!(cuMemAllocAsync(&mut ptr, want.len() * 4, s1.as_raw())) }.unwrap();
    s1.synchronize().unwrap();
    // SAFETY: a whole allocation of 5000 u32s of device 1's context, ready (its stream synchronized), owned
    // by nobody else; its contents are written below before anything reads them.
    let mut adopted = unsafe { DeviceBuffer::<u32>::from_raw(&s1, ptr, want.len()) };
    assert!(!pool_open_to(pool_of(&adopted), &contexts[0]));
    s1.upload_pageable(&want, &mut adopted).unwrap();
    let mut on0 = DeviceBuffer::<u32>::zeroed(&s0, want.len()).unwrap();
    s0.copy(&adopted, &mut on0).unwrap();
    let mut back = vec![0; want.len()];
    s0.download_pageable(&on0, &mut back).unwrap();
    common::compare(&back, &want, "device 1's adopted buffer copied to device 0").unwrap();
    s1.upload_pageable(&vec![0; want.len()], &mut adopted)
        .unwrap();
    s1.copy(&on0, &mut adopted).unwrap();
    s1.download_pageable(&adopted, &mut back).unwrap();
    common::compare(&back, &want, "copied back into the adopted buffer").unwrap();
    settle(&contexts);
}

/// A copy between the devices makes no unrelated stream wait, and waits for none: it completes on the
/// device while another stream of each device is held.
#[test]
fn peer_copies_wait_for_no_unrelated_stream() {
    let _serial = serial_on_two_devices();
    common::devices::copy_beside_held_streams(&two_devices());
}

/// A device buffer of device 0 dropped while device 1's stream still copies out of it, and a page-locked
/// buffer dropped while device 1 still uploads from it, are freed only once the copies have completed: the
/// copies deliver every element (and the simulated driver reports memory freed under queued work).
#[test]
fn buffers_dropped_while_the_other_device_reads_them_are_freed_after() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let want = data(N, 21);
    let d0 = device_copy(&s0, &want);
    let host = Pinned::from_slice(&ctx0, &want).unwrap();
    let mut from_peer = DeviceBuffer::<u32>::zeroed(&s1, N).unwrap();
    let mut from_host = DeviceBuffer::<u32>::zeroed(&s1, N).unwrap();
    let (unrelated, mut scratch) = (
        DeviceBuffer::<u32>::zeroed(&s0, N).unwrap(),
        DeviceBuffer::<u32>::zeroed(&s0, N).unwrap(),
    );
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    let held = hold(&s1, Duration::from_millis(500));
    s1.copy(&d0, &mut from_peer).unwrap();
    s1.upload(&host, &mut from_host).unwrap();
    drop(d0);
    drop(host);
    // Other work on device 0 meanwhile, which the drops must not have waited for either.
    s0.copy(&unrelated, &mut scratch).unwrap();
    drop(held);
    let mut out = Pinned::<u32>::zeroed(&ctx1, N).unwrap();
    for (buffer, what) in [(&from_peer, "the peer copy"), (&from_host, "the upload")] {
        s1.download(buffer, &mut out).unwrap();
        common::compare(out.as_slice().unwrap(), &want, what).unwrap();
    }
    settle(&[ctx0, ctx1]);
}

/// Page-locked memory that is not portable still serves the other device's streams: under unified addressing
/// the driver takes memory of `cuMemHostAlloc` for page-locked in every context, whatever its flags. Copies
/// from and to it on device 1's stream return while that stream is held (a copy taken for pageable memory
/// would return only once done), and deliver every element.
#[test]
fn page_locked_memory_that_is_not_portable_serves_the_other_devices_streams() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    let s1 = Stream::new(&ctx1).unwrap();
    let want = data(N, 1);
    let private = PinnedBuilder::new(&ctx0)
        .portable(false)
        .from_slice(&want)
        .unwrap();
    let mut back = PinnedBuilder::new(&ctx0)
        .portable(false)
        .zeroed::<u32>(N)
        .unwrap();
    assert!(!private.is_portable() && !back.is_portable());
    let mut d1 = DeviceBuffer::<u32>::zeroed(&s1, N).unwrap();
    s1.synchronize().unwrap();
    let held = hold(&s1, Duration::from_millis(500));
    let released = Event::without_timing(&ctx1).unwrap();
    released.record(&s1).unwrap();
    s1.upload(&private, &mut d1).unwrap();
    s1.download(&d1, &mut back).unwrap();
    assert!(
        !released.query().unwrap(),
        "a copy of memory that is not portable on another device's stream waited for that stream"
    );
    drop(held);
    common::compare(
        back.as_slice().unwrap(),
        &want,
        "the round trip on device 1",
    )
    .unwrap();
    settle(&[ctx0, ctx1]);
}

/// Memory that a device's streams must not use is refused before anything is enqueued, beside twins that are
/// accepted: a copy between two buffers of which neither is the stream's, and lengths that differ.
#[test]
fn memory_of_the_wrong_context_is_refused() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let d0 = DeviceBuffer::<u32>::zeroed(&s0, 64).unwrap();
    let mut other0 = DeviceBuffer::<u32>::zeroed(&s0, 64).unwrap();
    // A copy between two buffers of device 0 on device 1's stream.
    refused(s1.copy(&d0, &mut other0), "use a stream of either");
    // Lengths of two devices' buffers that differ.
    let mut short1 = DeviceBuffer::<u32>::zeroed(&s1, 63).unwrap();
    refused(s1.copy(&d0, &mut short1), "elements");
    // Their twins: the copy on device 0's stream, and one into a buffer of the same length.
    s0.copy(&d0, &mut other0).unwrap();
    let mut whole1 = DeviceBuffer::<u32>::zeroed(&s1, 64).unwrap();
    s1.copy(&d0, &mut whole1).unwrap();
    ctx0.synchronize().unwrap();
    ctx1.synchronize().unwrap();
}

fn batch_values(index: usize, len: usize) -> Vec<u32> {
    data(len, 1000 + index as u64)
}

/// Consumes `prefetcher` on a thread of its own, as a data-parallel loop does: each batch downloaded on the
/// consumer's stream and checked against what its fill wrote. Returns the batch indices in the order they came.
fn consume<B: cuda_pinned::prefetch::Batch<Device = DeviceBuffer<u32>>>(
    prefetcher: cuda_pinned::Prefetcher<B>,
    consumer: Stream,
    expected: impl Fn(usize) -> Vec<u32> + Send + 'static,
) -> std::thread::JoinHandle<Vec<usize>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for batch in prefetcher {
            let batch = batch.unwrap();
            let mut out = Pinned::<u32>::zeroed(consumer.context(), batch.len()).unwrap();
            consumer.download(&*batch, &mut out).unwrap();
            let what = format!(
                "batch {} on device {}",
                batch.index(),
                consumer.context().device().ordinal()
            );
            common::compare(out.as_slice().unwrap(), &expected(batch.index()), &what).unwrap();
            seen.push(batch.index());
        }
        seen
    })
}

/// One prefetcher per device from one pool (one budget), the batches shared out in turn, then by a function:
/// each device gets its share, in order, every element as filled.
#[test]
fn a_sharded_prefetcher_feeds_both_devices() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    const LEN: usize = 1 << 16;
    let pool = cuda_pinned::PinnedPool::new(&ctx0, 16 * LEN * 4);
    for by_parity in [false, true] {
        let consumers = [Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap()];
        let feeds = consumers.iter().map(|s| (s.clone(), LEN));
        let mut builder = cuda_pinned::Prefetcher::<Pinned<u32>>::sharded(&pool, feeds)
            .batches(21)
            .workers(2)
            .depth(4);
        if by_parity {
            // Odd batches on device 0.
            builder = builder.shard_by(|index| 1 - index % 2);
        }
        let prefetchers = builder
            .build(|index, batch| {
                batch
                    .as_mut_slice()?
                    .copy_from_slice(&batch_values(index, LEN));
                Ok(())
            })
            .unwrap();
        assert_eq!(prefetchers.len(), 2);
        let threads: Vec<_> = prefetchers
            .into_iter()
            .zip(consumers)
            .map(|(prefetcher, consumer)| consume(prefetcher, consumer, |i| batch_values(i, LEN)))
            .collect();
        let seen: Vec<Vec<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let evens: Vec<usize> = (0..21).step_by(2).collect();
        let odds: Vec<usize> = (1..21).step_by(2).collect();
        let want = if by_parity {
            [odds, evens]
        } else {
            [evens, odds]
        };
        assert_eq!(seen, want, "shared out by parity: {by_parity}");
        // Both devices' slots (4 each) came from the one pool, reused the second time round.
        assert_eq!(pool.stats().peak_reserved, 8 * LEN * 4);
    }
    // One budget: slots for both devices that do not fit it together are refused, though each would alone.
    let small = cuda_pinned::PinnedPool::new(&ctx0, 7 * LEN * 4);
    let feeds = [
        (Stream::new(&ctx0).unwrap(), LEN),
        (Stream::new(&ctx1).unwrap(), LEN),
    ];
    let refused = cuda_pinned::Prefetcher::<Pinned<u32>>::sharded(&small, feeds)
        .batches(8)
        .depth(4)
        .build(|_, _| Ok(()));
    assert!(
        matches!(refused, Err(cuda_pinned::Error::PoolExhausted { .. })),
        "{:?}",
        refused.map(|p| p.len())
    );
    settle(&[ctx0, ctx1]);
}

/// Gathered batches on both devices from one table in page-locked memory, shared by each device's
/// [`RowTable`](cuda_pinned::RowTable) (each with a gatherer of its device), the rows read by each device in
/// place.
#[test]
fn a_sharded_prefetcher_gathers_on_both_devices_from_one_table() {
    use cuda_pinned::prefetch::GatherBatch;
    use cuda_pinned::{GatherOptions, Gatherer, RowTable};
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    const ROW: usize = 64;
    const ROWS: usize = 4096;
    const PER_BATCH: usize = 512;
    let values = data(ROW * ROWS, 77);
    let table = std::sync::Arc::new(
        PinnedBuilder::new(&ctx0)
            .device_mapped(true)
            .from_slice(&values)
            .unwrap(),
    );
    let rows_of = |index: usize| -> Vec<u32> {
        (0..PER_BATCH)
            .map(|k| ((index * PER_BATCH + k) * 7919 % ROWS) as u32)
            .collect()
    };
    let consumers = [Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap()];
    let feeds = consumers.iter().map(|stream| {
        let gatherer = Gatherer::new(stream.context()).unwrap();
        let rows = RowTable::new(gatherer, table.clone(), ROW, GatherOptions::default()).unwrap();
        (stream.clone(), (rows, PER_BATCH))
    });
    let unused = cuda_pinned::PinnedPool::new(&ctx0, 0);
    let prefetchers = cuda_pinned::Prefetcher::<GatherBatch<u32, _>>::sharded(&unused, feeds)
        .batches(12)
        .build(move |index, batch| {
            batch.indices.clear();
            batch.indices.extend(rows_of(index));
            Ok(())
        })
        .unwrap();
    let expected = move |index: usize| -> Vec<u32> {
        rows_of(index)
            .iter()
            .flat_map(|&r| values[r as usize * ROW..][..ROW].to_vec())
            .collect()
    };
    let expected = std::sync::Arc::new(expected);
    let threads: Vec<_> = prefetchers
        .into_iter()
        .zip(consumers)
        .map(|(prefetcher, consumer)| {
            let expected = expected.clone();
            consume(prefetcher, consumer, move |i| expected(i))
        })
        .collect();
    let seen: Vec<Vec<usize>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(seen, [vec![0, 2, 4, 6, 8, 10], vec![1, 3, 5, 7, 9, 11]]);
}

/// One file feeding two devices at once: each half loaded by a thread of its own into its device, through
/// slots of one pool (page-locked memory is portable); every byte arrives on its device.
#[test]
fn one_file_loads_into_two_devices_at_once() {
    let _serial = serial_on_two_devices();
    let [ctx0, ctx1] = two_devices();
    let pool = cuda_pinned::PinnedPool::new(&ctx0, 32 << 20);
    let path = std::env::temp_dir().join(format!("cuda-pinned-two-devices-{}", std::process::id()));
    let bytes: Vec<u8> = bytemuck::cast_slice(&data(3 << 20, 41)).to_vec();
    std::fs::write(&path, &bytes).unwrap();
    let half = bytes.len() / 2 + 4097;
    let options = cuda_pinned::LoadOptions::default().slot_bytes(256 << 10);
    std::thread::scope(|scope| {
        for (ctx, range) in [(&ctx0, 0..half), (&ctx1, half..bytes.len())] {
            let (pool, path, bytes) = (&pool, &path, &bytes);
            scope.spawn(move || {
                let stream = Stream::new(ctx).unwrap();
                let mut device = DeviceBuffer::<u8>::uninit(&stream, range.len()).unwrap();
                stream
                    .load_file_with(pool, options, path, range.start as u64, &mut device)
                    .unwrap();
                let mut got = vec![0u8; range.len()];
                stream.download_pageable(&device, &mut got).unwrap();
                assert!(got == bytes[range.clone()], "device {:?}", ctx.device());
            });
        }
    });
    std::fs::remove_file(&path).unwrap();
}
