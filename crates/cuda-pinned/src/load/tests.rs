//! Loads whose file fails under them, on the simulated driver: a read error mid-way and a file that shrinks
//! while it is read, each injected through a stand-in for the file's reads, each with a control that loads.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::engine::Dest;
use super::file::{Opened, ReadAt};
use super::plan::Piece;
use super::{Io, LoadOptions, load_opened};
use crate::driver::{Context, Stream};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, PinnedPool};

/// Reads the file, but does `then` once `after` reads have been made.
struct Failing {
    file: std::fs::File,
    reads: AtomicUsize,
    after: usize,
    then: fn(&std::fs::File) -> io::Result<()>,
}

impl ReadAt for Failing {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.reads.fetch_add(1, Ordering::SeqCst) == self.after {
            (self.then)(&self.file)?;
        }
        self.file.read_at(buf, offset)
    }
}

fn an_io_error(_: &std::fs::File) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(5))
}

fn nothing(_: &std::fs::File) -> io::Result<()> {
    Ok(())
}

struct Fixture {
    path: PathBuf,
    bytes: Vec<u8>,
    stream: Stream,
    pool: PinnedPool,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn fixture(name: &str) -> Fixture {
    cuda_pinned_sim::install().unwrap_or_else(|e| panic!("{e}"));
    let context = Context::on(0).unwrap();
    let path = std::env::temp_dir().join(format!("cuda-pinned-unit-{}-{name}", std::process::id()));
    let bytes: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    Fixture {
        path,
        bytes,
        stream: Stream::new(&context).unwrap(),
        pool: PinnedPool::new(&context, 8 << 20),
    }
}

/// Loads the whole file, buffered in slots of 64 KiB, through `source`.
fn load(f: &Fixture, source: &dyn ReadAt) -> Result<Vec<u8>> {
    let opened = Opened::open(&f.path, false)?;
    let device = DeviceBuffer::<u8>::zeroed(&f.stream, f.bytes.len())?;
    let dests = [Dest {
        ptr: device.as_raw(),
        bytes: f.bytes.len() as u64,
        track: device.track(),
    }];
    let pieces = [Piece {
        file: 0,
        len: f.bytes.len() as u64,
        dest: 0,
        at: 0,
    }];
    let options = LoadOptions::default()
        .slot_bytes(64 << 10)
        .buffered_readers(3)
        .io(Io::Buffered);
    load_opened(
        &f.stream,
        &f.pool,
        options,
        &opened,
        source,
        &pieces,
        &dests,
        Instant::now(),
    )?;
    let mut out = vec![0u8; f.bytes.len()];
    f.stream.download_pageable(&device, &mut out)?;
    Ok(out)
}

#[test]
fn a_read_error_mid_way_is_the_loads_error_naming_the_byte() {
    let f = fixture("read-error");
    let failing = |then| Failing {
        file: std::fs::File::open(&f.path).unwrap(),
        reads: AtomicUsize::new(0),
        after: 5,
        then,
    };
    let e = load(&f, &failing(an_io_error)).unwrap_err();
    let Error::File { offset, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(offset % (64 << 10), 0, "at the start of a request: {e}");
    assert!(e.to_string().contains("Input/output error"), "{e}");
    assert!(e.to_string().contains(&*f.path.to_string_lossy()), "{e}");
    // Control: the same reads without the error load every byte.
    assert!(load(&f, &failing(nothing)).unwrap() == f.bytes);
}

#[test]
fn a_file_that_shrinks_while_it_is_read_is_an_error_not_a_short_load() {
    let f = fixture("shrinks");
    let shrinking = |then| Failing {
        file: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&f.path)
            .unwrap(),
        reads: AtomicUsize::new(0),
        after: 2,
        then,
    };
    let e = load(&f, &shrinking(|file| file.set_len(300_000))).unwrap_err();
    let Error::File {
        offset, message, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    // The first reader to find the end stops the load: the one whose request the new end cuts, or one past it.
    assert!(*offset >= 300_000, "a missing byte: {e}");
    assert!(message.contains("did it shrink while being read?"), "{e}");
    // Control: restored to its length, the same file loads.
    std::fs::write(&f.path, &f.bytes).unwrap();
    assert!(load(&f, &shrinking(nothing)).unwrap() == f.bytes);
}
