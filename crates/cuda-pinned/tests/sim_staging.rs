//! Staged transfers on the simulated driver, where they can be made to fail: an error on any thread of a
//! transfer must come back as an `Err` and stop the transfer's other threads, never leave one waiting for a
//! staging buffer that can no longer come; a pool too small or too full for even one staging buffer must not
//! stop a transfer (it takes the driver's pageable path); a staged transfer takes from its pool only what it
//! needs; and transfers below `StagingOptions::chunked_from` take the driver's path.
//!
//! Each transfer runs on a thread of its own and is waited for with a deadline, so that a hang fails the test
//! with a message (the hung thread is left behind) rather than stopping the test binary.
//!
//! Only without feature `gpu`: a real driver cannot be made to fail on demand.
#![cfg(not(feature = "gpu"))]

mod common;

use std::time::Duration;

use common::{data_bytes, on_a_thread, serial, sim};
use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{Context, DeviceBuffer, PinnedPool, Result, Stream};

/// How long a transfer may take before the test calls it hung: far more than any of these needs.
const DEADLINE: Duration = Duration::from_secs(30);

const MIB: usize = 1 << 20;

/// Options that stage every transfer (no pageable crossover): `chunk_bytes` per chunk at most, on `threads`.
fn staged(chunk_bytes: usize, threads: usize) -> StagingOptions {
    StagingOptions::default()
        .chunk_bytes(chunk_bytes)
        .threads(threads)
        .chunked_from(0)
}

/// What a test needs: a context, a stream and a pool of `budget` bytes.
struct Rig {
    ctx: Context,
    stream: Stream,
    pool: PinnedPool,
}

fn rig(budget: usize) -> Rig {
    let ctx = Context::on(0).unwrap();
    Rig {
        stream: Stream::new(&ctx).unwrap(),
        pool: PinnedPool::new(&ctx, budget),
        ctx,
    }
}

/// Uploads `want` with `options` on a thread of its own, bounded; the result, and what the device holds
/// afterwards (read back through the driver's path).
fn upload(rig: &Rig, options: StagingOptions, want: &[u8], what: &str) -> (Result<()>, Vec<u8>) {
    let (stream, pool, want) = (rig.stream.clone(), rig.pool.clone(), want.to_vec());
    let mut device = DeviceBuffer::<u8>::zeroed(&rig.stream, want.len()).unwrap();
    let ((result, device), _) = on_a_thread(what, DEADLINE, move || {
        let result = stream.upload_staged_with(&pool, options, &want, &mut device);
        (result, device)
    });
    let mut back = vec![0u8; device.len()];
    rig.stream.download_pageable(&device, &mut back).unwrap();
    (result, back)
}

/// Downloads `device` with `options` on a thread of its own, bounded: the result and the bytes received.
fn download(
    rig: &Rig,
    options: StagingOptions,
    device: DeviceBuffer<u8>,
    what: &str,
) -> (Result<()>, Vec<u8>) {
    let (stream, pool) = (rig.stream.clone(), rig.pool.clone());
    on_a_thread(what, DEADLINE, move || {
        let mut back = vec![0u8; device.len()];
        let result = stream.download_staged_with(&pool, options, &device, &mut back);
        (result, back)
    })
    .0
}

/// A device buffer holding `want`, put there through the driver's path.
fn on_device(rig: &Rig, want: &[u8]) -> DeviceBuffer<u8> {
    let mut device = DeviceBuffer::<u8>::zeroed(&rig.stream, want.len()).unwrap();
    rig.stream.upload_pageable(want, &mut device).unwrap();
    device
}

/// Lets deferred releases run and checks that nothing failed behind the test's back; then empties the pool, so
/// that the next transfer starts from the same state as the one before (no block waiting to be polled).
fn settle(rig: &Rig) {
    sim().unwrap().clear_faults();
    rig.ctx.synchronize().unwrap();
    rig.ctx.synchronize().unwrap();
    rig.ctx.check_deferred_errors().unwrap();
    rig.pool.trim().unwrap();
}

/// The failing copy of one chunk, with a pool of one chunk: the worker that staged the next chunk waits for
/// the only buffer, which the enqueueing thread holds when its copy fails. The transfer must return the
/// driver's error, not wait for that buffer.
#[test]
fn a_failed_copy_with_one_buffer_returns_an_error_upload() {
    let _serial = serial();
    let rig = rig(MIB);
    let sim = sim().unwrap();
    let want = data_bytes(5 * MIB + 77, 1);
    for nth in 1..=3 {
        sim.fail(&format!("cuMemcpyHtoDAsync_v2:{nth}:CUDA_ERROR_UNKNOWN"))
            .unwrap();
        let (result, _) = upload(
            &rig,
            staged(MIB, 4),
            &want,
            &format!("upload, copy {nth} failing"),
        );
        let e = result.expect_err("the failed copy's error");
        assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
        settle(&rig);
    }
    // And with no fault, the same transfer goes through.
    let (result, back) = upload(&rig, staged(MIB, 4), &want, "upload, no fault");
    result.unwrap();
    assert!(back == want, "the upload delivered other bytes");
    settle(&rig);
}

/// As above, downloading: the failed copy of one chunk stops the transfer with the driver's error.
#[test]
fn a_failed_copy_with_one_buffer_returns_an_error_download() {
    let _serial = serial();
    let rig = rig(MIB);
    let sim = sim().unwrap();
    let want = data_bytes(5 * MIB + 77, 2);
    for nth in 1..=3 {
        let device = on_device(&rig, &want);
        sim.fail(&format!("cuMemcpyDtoHAsync_v2:{nth}:CUDA_ERROR_UNKNOWN"))
            .unwrap();
        let (result, _) = download(
            &rig,
            staged(MIB, 4),
            device,
            &format!("download, copy {nth} failing"),
        );
        let e = result.expect_err("the failed copy's error");
        assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
        settle(&rig);
    }
    let device = on_device(&rig, &want);
    let (result, back) = download(&rig, staged(MIB, 4), device, "download, no fault");
    result.unwrap();
    assert!(back == want, "the download delivered other bytes");
    settle(&rig);
}

/// The name of the first host wait after the first `copy` of a staged transfer of `want` with `options` (a
/// worker's wait for a buffer's copy), from a traced run of the transfer with no fault.
fn a_workers_wait(rig: &Rig, options: StagingOptions, want: &[u8], copy: &str) -> String {
    let sim = sim().unwrap();
    sim.trace_start();
    let (result, back) = if copy == "cuMemcpyHtoDAsync_v2" {
        upload(rig, options, want, "traced upload")
    } else {
        download(rig, options, on_device(rig, want), "traced download")
    };
    let calls = sim.trace_stop();
    result.unwrap();
    assert!(back == want);
    settle(rig);
    let first_copy = calls.iter().position(|c| c == copy).unwrap();
    calls[first_copy..]
        .iter()
        .find(|c| ["cuEventSynchronize", "cuStreamSynchronize"].contains(&c.as_str()))
        .unwrap_or_else(|| panic!("no host wait after the first copy among {calls:?}"))
        .clone()
}

/// A worker's error in an upload (its wait for a buffer's previous copy, before refilling it, with a pool of
/// one chunk): the transfer returns it, and the other workers, waiting for that buffer, stop.
#[test]
fn a_workers_error_stops_an_upload() {
    let _serial = serial();
    let rig = rig(MIB);
    let sim = sim().unwrap();
    let want = data_bytes(5 * MIB + 77, 8);
    let options = staged(MIB, 4);
    let wait = a_workers_wait(&rig, options, &want, "cuMemcpyHtoDAsync_v2");
    sim.fail(&format!("{wait}:1:CUDA_ERROR_UNKNOWN")).unwrap();
    sim.trace_start();
    let (result, _) = upload(&rig, options, &want, "upload, a worker failing");
    let calls = sim.trace_stop();
    let e = result.expect_err("the worker's error");
    assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
    let failed_at = calls.iter().position(|c| *c == wait).unwrap();
    assert!(
        calls[..failed_at]
            .iter()
            .any(|c| c == "cuMemcpyHtoDAsync_v2"),
        "the wait that failed is a worker's, after a chunk's copy: {calls:?}"
    );
    settle(&rig);
}

/// A worker's error (here the wait for a chunk's download, before copying it out) stops the enqueueing
/// thread too: it enqueues no more chunks once it has seen the error, rather than going on to the last.
#[test]
fn a_workers_error_stops_the_enqueueing_thread() {
    let _serial = serial();
    let rig = rig(64 * MIB);
    let sim = sim().unwrap();
    let want = data_bytes(32 * MIB, 3);
    // 128 chunks of 256 KiB.
    let options = staged(256 << 10, 2);
    let wait = a_workers_wait(&rig, options, &want, "cuMemcpyDtoHAsync_v2");
    let device = on_device(&rig, &want);
    sim.fail(&format!("{wait}:1:CUDA_ERROR_UNKNOWN")).unwrap();
    sim.trace_start();
    let (result, _) = download(&rig, options, device, "download, a worker failing");
    let calls = sim.trace_stop();
    let e = result.expect_err("the worker's error");
    assert!(e.to_string().contains("CUDA_ERROR_UNKNOWN"), "{e}");
    let failed_at = calls.iter().position(|c| *c == wait).unwrap();
    assert!(
        calls[..failed_at]
            .iter()
            .any(|c| c == "cuMemcpyDtoHAsync_v2"),
        "the wait that failed is a worker's, after a chunk's copy: {calls:?}"
    );
    let after = calls[failed_at..]
        .iter()
        .filter(|c| *c == "cuMemcpyDtoHAsync_v2")
        .count();
    // The enqueueing thread may have one chunk in hand per buffer before it sees the error.
    assert!(
        after <= 4,
        "{after} of 128 chunks enqueued after the worker's error"
    );
    settle(&rig);
}

/// A pool with no room for one chunk: no worker may wait for a staging buffer the pool cannot give (that hang
/// depended on which thread asked first, so the transfers are repeated), and each transfer delivers its data,
/// through the driver's pageable path.
#[test]
fn a_pool_smaller_than_a_chunk_never_hangs() {
    let _serial = serial();
    let rig = rig(200 << 10);
    let want = data_bytes(5 * MIB + 77, 4);
    let options = staged(MIB, 4);
    for run in 0..50 {
        let (result, back) = upload(&rig, options, &want, &format!("upload {run}"));
        result.unwrap_or_else(|e| panic!("upload {run}: {e}"));
        assert!(back == want, "upload {run} delivered other bytes");
        let device = on_device(&rig, &want);
        let (result, back) = download(&rig, options, device, &format!("download {run}"));
        result.unwrap_or_else(|e| panic!("download {run}: {e}"));
        assert!(back == want, "download {run} delivered other bytes");
    }
    settle(&rig);
}

/// The caller holds the pool's whole budget: the transfer cannot get one staging buffer, and must neither
/// wait for the caller's (it never comes back) nor fail; it goes through the driver's path.
#[test]
fn a_caller_holding_the_whole_pool_still_transfers() {
    let _serial = serial();
    let rig = rig(2 * MIB);
    let held = rig.pool.alloc::<u8>(2 * MIB).unwrap();
    let want = data_bytes(3 * MIB + 5, 5);
    for options in [staged(MIB, 2), staged(4 * MIB, 1)] {
        let (result, back) = upload(&rig, options, &want, "upload, pool held");
        result.unwrap();
        assert!(
            back == want,
            "{options:?}: the upload delivered other bytes"
        );
        let device = on_device(&rig, &want);
        let (result, back) = download(&rig, options, device, "download, pool held");
        result.unwrap();
        assert!(
            back == want,
            "{options:?}: the download delivered other bytes"
        );
    }
    assert_eq!(rig.pool.stats().misses, 1, "only the caller's buffer");
    drop(held);
    settle(&rig);
}

/// A transfer smaller than a chunk takes a buffer of its own size from the pool, not a whole chunk.
#[test]
fn a_small_transfer_takes_a_small_buffer() {
    let _serial = serial();
    let rig = rig(64 * MIB);
    let want = data_bytes(16 << 10, 6);
    let (result, back) = upload(&rig, staged(4 * MIB, 8), &want, "upload 16 KiB");
    result.unwrap();
    assert!(back == want);
    let stats = rig.pool.stats();
    assert_eq!(
        (stats.misses, stats.peak_reserved),
        (1, 16 << 10),
        "{stats:?}"
    );
    let device = on_device(&rig, &want);
    let (result, back) = download(&rig, staged(4 * MIB, 8), device, "download 16 KiB");
    result.unwrap();
    assert!(back == want);
    assert_eq!(rig.pool.stats().peak_reserved, 16 << 10);
    settle(&rig);
}

/// With the default options an upload below 1 MiB goes through one staging buffer of its size, a download
/// below 256 KiB too (larger ones below 16 MiB: the driver's path), and either takes the driver's pageable path
/// where the pool has no room for the buffer.
#[test]
fn small_transfers_take_one_buffer_or_the_drivers_path() {
    let _serial = serial();
    let rig = rig(8 * MIB);
    for (len, buffers) in [(4 << 10, 2), (MIB - 1, 1), (MIB, 0), (12 * MIB, 0)] {
        let want = data_bytes(len, 7);
        let before = rig.pool.stats();
        let mut device = DeviceBuffer::<u8>::zeroed(&rig.stream, want.len()).unwrap();
        rig.stream
            .upload_staged(&rig.pool, &want, &mut device)
            .unwrap();
        let mut back = vec![0u8; want.len()];
        rig.stream
            .download_staged(&rig.pool, &device, &mut back)
            .unwrap();
        assert!(back == want, "{len} bytes");
        let stats = rig.pool.stats();
        assert_eq!(
            (stats.hits + stats.misses) - (before.hits + before.misses),
            buffers,
            "{len} bytes (a pool of 8 MiB): {stats:?}"
        );
        assert!(stats.peak_reserved <= 8 * MIB);
    }
    settle(&rig);
}

/// A round trip of `len` bytes with `options`: per direction, how many staging buffers the pool served and how
/// many copies the driver was asked for.
fn footprint(rig: &Rig, options: StagingOptions, len: usize) -> [(u64, usize); 2] {
    let sim = sim().unwrap();
    let want = data_bytes(len, len as u64);
    let mut device = DeviceBuffer::<u8>::zeroed(&rig.stream, len).unwrap();
    let served = || {
        let stats = rig.pool.stats();
        stats.hits + stats.misses
    };
    let count = |calls: &[String], function: &str| calls.iter().filter(|c| *c == function).count();

    let before = served();
    sim.trace_start();
    rig.stream
        .upload_staged_with(&rig.pool, options, &want, &mut device)
        .unwrap();
    let calls = sim.trace_stop();
    let up = (served() - before, count(&calls, "cuMemcpyHtoDAsync_v2"));

    let mut back = vec![0u8; len];
    let before = served();
    sim.trace_start();
    rig.stream
        .download_staged_with(&rig.pool, options, &device, &mut back)
        .unwrap();
    let calls = sim.trace_stop();
    let down = (served() - before, count(&calls, "cuMemcpyDtoHAsync_v2"));
    assert!(
        back == want,
        "{options:?}, {len} bytes: other bytes came back"
    );
    [up, down]
}

/// Below `chunked_from` a transfer is one copy (through one staging buffer when small, else the driver's path);
/// from it, chunks through staging buffers. 0 chunks everything, `usize::MAX` nothing.
#[test]
fn the_crossover_picks_the_path() {
    let _serial = serial();
    let rig = rig(64 * MIB);
    let default = StagingOptions::default();
    assert_eq!(default.chunked_from, 16 * MIB);
    assert_eq!(footprint(&rig, default, 16 * MIB - 1), [(0, 1); 2]);
    assert_eq!(footprint(&rig, default, MIB - 1), [(1, 1), (0, 1)]);
    assert_eq!(footprint(&rig, default, MIB), [(0, 1); 2]);
    for (served, copies) in footprint(&rig, default, 16 * MIB) {
        assert!(
            served >= 1 && copies > 1,
            "{served} buffers, {copies} copies"
        );
    }
    let always = default.chunked_from(0);
    assert_eq!(footprint(&rig, always, 4096), [(1, 1); 2]);
    let never = default.chunked_from(usize::MAX);
    assert_eq!(footprint(&rig, never, 32 * MIB), [(0, 1); 2]);
    assert_eq!(footprint(&rig, never, 4096), [(1, 1); 2]);
    settle(&rig);
}
