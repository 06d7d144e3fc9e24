//! Staged pageable transfers on a real GPU: odd sizes, unaligned slices, many chunks and few buffers, the
//! user's memory free for reuse as soon as an upload returns, and ordering against other streams.

mod common;

use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use common::kernels::{fill, spin};
use common::{data, data_bytes, serial};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels::{fill, spin};
use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{Context, DeviceBuffer, Error, Event, PinnedPool, Stream};

fn context() -> Context {
    common::device(0)
}

#[test]
fn odd_sizes_and_unaligned_slices_round_trip() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    // Small chunks, every size staged; the defaults, with small sizes on the driver's path; the defaults staging
    // every size, with chunks adapted to each.
    let small = StagingOptions::default()
        .chunk_bytes(64 << 10)
        .threads(3)
        .chunked_from(0);
    let staged = StagingOptions::default().chunked_from(0);
    for options in [small, StagingOptions::default(), staged] {
        for (i, len) in [
            0,
            1,
            3,
            4095,
            4097,
            65_537,
            1_000_003,
            (8 << 20) + 5,
            3 * (8 << 20) + 12_345,
        ]
        .into_iter()
        .enumerate()
        {
            // Slices that start 3 bytes into their Vec: not aligned to anything.
            let source = data_bytes(len + 3, i as u64);
            let src = &source[3..];
            let mut device = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
            stream
                .upload_staged_with(&pool, options, src, &mut device)
                .unwrap();
            let mut out = vec![0u8; len + 5];
            stream
                .download_staged_with(&pool, options, &device, &mut out[5..])
                .unwrap();
            assert!(
                out[..5].iter().all(|&b| b == 0),
                "{options:?}, {len} bytes: wrote before the slice"
            );
            assert!(out[5..] == *src, "{options:?}, {len} bytes: data differs");
        }
    }
    // Elements wider than a byte, through views.
    let want = data(2_500_001, 99);
    let mut device = DeviceBuffer::<u32>::zeroed(&stream, want.len() + 10).unwrap();
    stream
        .upload_staged_with(&pool, small, &want, &mut device.slice_mut(10..).unwrap())
        .unwrap();
    let mut back = vec![0u32; want.len()];
    stream
        .download_staged(&pool, &device.slice(10..).unwrap(), &mut back)
        .unwrap();
    assert_eq!(back, want);
    ctx.check_deferred_errors().unwrap();
}

/// An upload returns once the user's memory is no longer read: overwriting it at once must not change what
/// reaches the device, even when the device copies are still queued behind a slow kernel.
#[test]
fn the_source_can_be_reused_as_soon_as_an_upload_returns() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 256 << 20);
    let len = 40 << 20;
    let want = data_bytes(len, 5);
    let mut src = want.clone();
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
    // Warm the pool first, so that pinning its buffers takes none of the spin's time below.
    stream.upload_staged(&pool, &src, &mut device).unwrap();
    stream.synchronize().unwrap();
    // Eight workers: as many staging buffers as chunks, so that none needs waiting for.
    let options = StagingOptions::default().threads(8);
    // Held for 100 ms on a GPU; on the simulator until `held` drops (or 10 s pass).
    let held = common::hold(&stream, Duration::from_millis(100));
    let earlier = Event::without_timing(&ctx).unwrap();
    stream.record(&earlier).unwrap();
    stream
        .upload_staged_with(&pool, options, &src, &mut device)
        .unwrap();
    assert!(
        !earlier.query().unwrap(),
        "the upload returned only once the stream's earlier work had run: it waited for it"
    );
    drop(held);
    src.fill(0);
    let mut back = vec![0u8; len];
    stream.download_staged(&pool, &device, &mut back).unwrap();
    assert!(back == want, "the upload read the source after it returned");
}

#[test]
fn a_small_pool_still_stages_and_other_streams_are_ordered() {
    let _serial = serial();
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    // Room for one chunk only: the transfer goes on with that one buffer.
    let options = StagingOptions::default()
        .chunk_bytes(1 << 20)
        .threads(4)
        .chunked_from(0);
    let pool = PinnedPool::new(&ctx, 1 << 20);
    let len = (5 << 20) + 77;
    let want = data_bytes(len, 6);
    let mut device = DeviceBuffer::<u8>::zeroed(&a, len).unwrap();
    b.upload_staged_with(&pool, options, &want, &mut device)
        .unwrap();
    let mut back = vec![0u8; len];
    a.download_staged_with(&pool, options, &device, &mut back)
        .unwrap();
    assert!(back == want);
    // A kernel on stream a, slowed by a spin, writes the buffer; a staged download on stream b must see it.
    spin(&a, Duration::from_millis(50)).unwrap();
    fill(&a, &mut device, 0x5au8).unwrap();
    b.download_staged_with(&pool, options, &device, &mut back)
        .unwrap();
    assert!(
        back.iter().all(|&x| x == 0x5a),
        "the staged download did not wait for the kernel"
    );
    assert_eq!(
        pool.stats().peak_reserved,
        1 << 20,
        "staged, in 1 MiB chunks"
    );

    let e = b.upload_staged(&pool, &want[1..], &mut device).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = b.upload_staged_with(
        &pool,
        StagingOptions::default().chunk_bytes(0).threads(1),
        &want,
        &mut device,
    );
    assert!(matches!(e, Err(Error::InvalidArgument { .. })));
    ctx.check_deferred_errors().unwrap();
}
