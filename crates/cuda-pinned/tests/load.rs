//! Loading byte ranges of files into device memory (`Stream::load_file`): every byte checked, direct and
//! buffered reads, few and small slots, a pool whose budget bounds the slots, errors that name the file and
//! the byte, and the loaded memory ordered against other streams.

mod common;

use std::path::PathBuf;

use common::{data_bytes, serial};
use cuda_pinned::{DeviceBuffer, Error, Io, LoadOptions, PinnedPool, Stream, WhenFull};

/// A file of `len` fresh bytes in the temporary directory, removed when dropped.
struct TempFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl TempFile {
    fn new(name: &str, len: usize, seed: u64) -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "cuda-pinned-load-{}-{name}-{seed}",
            std::process::id()
        ));
        let bytes = data_bytes(len, seed);
        std::fs::write(&path, &bytes).unwrap();
        TempFile { path, bytes }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_back(stream: &Stream, device: &DeviceBuffer<u8>) -> Vec<u8> {
    let mut out = vec![0u8; device.len()];
    stream.download_pageable(device, &mut out).unwrap();
    out
}

fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter().zip(want).position(|(a, b)| a != b)
}

#[test]
fn ranges_of_a_file_arrive_whole_every_way_it_can_be_read() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let file = TempFile::new("ranges", (3 << 20) + 12_345, 1);
    let small = LoadOptions::default()
        .slot_bytes(64 << 10)
        .readers(3)
        .buffered_readers(3);
    let one_slot = LoadOptions::default()
        .slot_bytes(32 << 10)
        .readers(2)
        .slots(1);
    for options in [LoadOptions::default(), small, one_slot] {
        for io in [Io::Auto, Io::Direct, Io::Buffered] {
            for (offset, len) in [
                (0, file.bytes.len()),
                (1, 4095),
                (4095, 4097),
                (12_345, 2 << 20),
                (file.bytes.len() - 7, 7),
                (100, 0),
            ] {
                let what = format!("{options:?} {io:?} bytes {offset}..{}", offset + len);
                let mut device = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
                let report = stream
                    .load_file_with(
                        &pool,
                        options.io(io),
                        &file.path,
                        offset as u64,
                        &mut device,
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = read_back(&stream, &device);
                let want = &file.bytes[offset..offset + len];
                assert_eq!(first_difference(&got, want), None, "{what}");
                assert_eq!(report.bytes, len as u64, "{what}");
                match io {
                    Io::Direct => assert!(report.direct, "{what}: {report:?}"),
                    Io::Buffered => assert!(!report.direct, "{what}: {report:?}"),
                    _ => {}
                }
                assert!(report.read >= report.bytes, "{what}: {report:?}");
            }
        }
    }
    assert!(pool.stats().peak_reserved <= 64 << 20);
}

#[test]
fn a_cold_file_is_read_direct_and_a_warm_one_through_the_cache() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    // Just written: the page cache holds it.
    let file = TempFile::new("warm", 1 << 20, 2);
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, 1 << 20).unwrap();
    let report = stream.load_file(&pool, &file.path, 0, &mut device).unwrap();
    assert!(!report.direct, "{report:?}");
    let why = report.why_buffered.unwrap();
    assert!(why.contains("the page cache holds"), "{why}");
    assert_eq!(
        first_difference(&read_back(&stream, &device), &file.bytes),
        None
    );
    // Dropped from the cache (clean pages go at once), it is read direct.
    drop_from_page_cache(&file.path);
    let report = stream.load_file(&pool, &file.path, 0, &mut device).unwrap();
    assert!(report.direct, "{report:?}");
    assert_eq!(
        first_difference(&read_back(&stream, &device), &file.bytes),
        None
    );
}

/// Writes the file's dirty pages back and drops its pages from the page cache.
fn drop_from_page_cache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: advice on an open file descriptor; it changes no memory of this process.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(advised, 0);
}

#[test]
fn a_pool_too_small_for_the_slots_asked_for_bounds_the_load() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    // Room for two slots of 512 KiB, where 16 MiB slots were asked for.
    let pool = PinnedPool::new(&ctx, 1 << 20);
    let file = TempFile::new("budget", 6 << 20, 3);
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, 6 << 20).unwrap();
    let report = stream.load_file(&pool, &file.path, 0, &mut device).unwrap();
    assert!(report.slot_bytes <= 1 << 20, "{report:?}");
    assert!(pool.stats().peak_reserved <= 1 << 20, "{:?}", pool.stats());
    assert_eq!(
        first_difference(&read_back(&stream, &device), &file.bytes),
        None
    );
    // Control: no room for even the smallest slot is an error, not a wait.
    let tiny = PinnedPool::new(&ctx, 64 << 10);
    let e = stream
        .load_file(&tiny, &file.path, 0, &mut device)
        .unwrap_err();
    assert!(matches!(e, Error::PoolExhausted { .. }), "{e}");
}

#[test]
fn a_range_past_the_end_names_the_file_and_the_byte() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 16 << 20);
    let file = TempFile::new("short", 10_000, 4);
    let mut device = DeviceBuffer::<u8>::zeroed(&stream, 5000).unwrap();
    let e = stream
        .load_file(&pool, &file.path, 6000, &mut device)
        .unwrap_err();
    let Error::File { path, offset, .. } = &e else {
        panic!("{e:?}");
    };
    assert_eq!((path, *offset), (&file.path, 6000));
    assert!(
        e.to_string()
            .contains("ends past the end of the file (10000 bytes)"),
        "{e}"
    );
    // An offset whose end passes 2^64 is the same error, not an overflow.
    let e = stream
        .load_file(&pool, &file.path, u64::MAX - 5, &mut device)
        .unwrap_err();
    assert!(
        matches!(e, Error::File { offset, .. } if offset == u64::MAX - 5),
        "{e}"
    );
    // Control: the same range from 5000 fits.
    stream
        .load_file(&pool, &file.path, 5000, &mut device)
        .unwrap();
    // A slot is never larger than asked for; options that cannot work are refused.
    let odd = LoadOptions::default().slot_bytes(10_000);
    let report = stream
        .load_file_with(&pool, odd, &file.path, 5000, &mut device)
        .unwrap();
    assert_eq!(report.slot_bytes, 8192, "{report:?}");
    let none = LoadOptions::default().readers(0);
    let e = stream
        .load_file_with(&pool, none, &file.path, 0, &mut device)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let missing = stream
        .load_file(&pool, "/no/such/file", 0, &mut device)
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("/no/such/file, at byte 0: cannot open"),
        "{missing}"
    );
}

#[test]
fn loaded_memory_is_ordered_before_work_of_other_streams() {
    let _serial = serial();
    let ctx = common::device(0);
    let (loading, reading) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let pool = PinnedPool::new(&ctx, 32 << 20);
    for seed in 0..8 {
        let file = TempFile::new("ordered", (1 << 20) + 333, 10 + seed);
        let mut device = DeviceBuffer::<u8>::uninit(&loading, file.bytes.len()).unwrap();
        let options = LoadOptions::default().slot_bytes(128 << 10).readers(3);
        loading
            .load_file_with(&pool, options, &file.path, 0, &mut device)
            .unwrap();
        // Another stream reads at once: it waits on the device for the uploads.
        let got = read_back(&reading, &device);
        assert_eq!(first_difference(&got, &file.bytes), None, "seed {seed}");
    }
}

#[test]
fn loads_on_several_threads_share_a_small_pool_and_all_end() {
    let _serial = serial();
    let ctx = common::device(0);
    // Room for four 512 KiB slots among four loads that each ask for five; a load that finds none waits for one.
    let pool = PinnedPool::builder(&ctx, 2 << 20)
        .when_full(WhenFull::Wait)
        .build();
    let files: Vec<TempFile> = (0..4)
        .map(|i| TempFile::new("threads", (3 << 20) + 1000 * i, 20 + i as u64))
        .collect();
    let loaded_whole = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for file in &files {
            let (ctx, pool, loaded_whole) = (&ctx, &pool, &loaded_whole);
            scope.spawn(move || {
                let stream = Stream::new(ctx).unwrap();
                let options = LoadOptions::default().slot_bytes(512 << 10);
                for round in 0..3 {
                    let mut device = DeviceBuffer::<u8>::uninit(&stream, file.bytes.len()).unwrap();
                    let loaded = common::bounded("a load", common::LIMIT, || {
                        stream.load_file_with(pool, options, &file.path, 0, &mut device)
                    });
                    loaded.unwrap_or_else(|e| panic!("round {round}: {e}"));
                    let got = read_back(&stream, &device);
                    assert_eq!(first_difference(&got, &file.bytes), None, "round {round}");
                    loaded_whole.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    assert!(pool.stats().peak_reserved <= 2 << 20, "{:?}", pool.stats());
    assert_eq!(loaded_whole.into_inner(), 12);
}

#[test]
fn an_awaited_load_allocates_and_fills_its_buffer() {
    let _serial = serial();
    let ctx = common::device(0);
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 32 << 20);
    let file = TempFile::new("awaited", (2 << 20) + 77, 30);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let options = LoadOptions::default().slot_bytes(256 << 10);
    let (device, report) = runtime
        .block_on(stream.load_file_async(&pool, options, &file.path, 5, file.bytes.len() - 5))
        .unwrap();
    assert_eq!(report.bytes, file.bytes.len() as u64 - 5);
    assert_eq!(
        first_difference(&read_back(&stream, &device), &file.bytes[5..]),
        None
    );
    // A file that is not there is the future's error.
    let e = runtime
        .block_on(stream.load_file_async(&pool, options, "/no/such/file", 0, 10))
        .unwrap_err();
    assert!(matches!(e, Error::File { .. }), "{e}");
    stream.synchronize().unwrap();
}
