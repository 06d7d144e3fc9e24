//! The time ledger on a GPU: its figures against events timed by hand, kernels by name, transfer time hidden
//! under kernels on another stream (and none when they take turns), and nothing recorded when off.
//!
//! Without feature `gpu` the same tests run on the simulated driver, with its stand-ins for the kernels (timed
//! as kernels of the same names), and check what does not depend on a GPU's timing: counts, bytes, names,
//! shares of the wall time, nothing hidden where nothing overlaps, and the ledger's spans inside those timed by
//! hand. How closely the figures agree, and how much of a transfer hides under a kernel, are checked on a GPU
//! only: the simulator's events carry the host's clock when a stream's thread reaches them, after random delays.

mod common;

use std::time::Duration;

#[cfg(not(feature = "gpu"))]
use common::kernels::{fill, spin};
use common::serial;
#[cfg(feature = "gpu")]
use cuda_pinned::kernels::{fill, spin};
use cuda_pinned::profile::Category;
use cuda_pinned::{Context, DeviceBuffer, Event, Ledger, Pinned, Stream};

fn context() -> Context {
    common::device(0)
}

/// Whether `a` and `b` (seconds) agree within 1% or 20 us.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= (0.01 * b).max(20e-6)
}

#[test]
fn the_ledger_agrees_with_events_timed_by_hand() {
    let _serial = serial();
    let ctx = context();
    let ledger = Ledger::new();
    let stream = Stream::with_ledger(&ctx, &ledger).unwrap();
    assert!(stream.ledger().is_some());
    let len = if common::SIMULATED {
        16 << 20
    } else {
        256 << 20
    };
    let host = Pinned::<u8>::zeroed(&ctx, len).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&stream, len).unwrap();
    let mut back = Pinned::<u8>::zeroed(&ctx, len).unwrap();
    let (a, b, c) = (
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
        Event::new(&ctx).unwrap(),
    );
    stream.synchronize().unwrap();
    a.record(&stream).unwrap();
    stream.upload(&host, &mut device).unwrap();
    b.record(&stream).unwrap();
    stream.download(&device, &mut back).unwrap();
    c.record(&stream).unwrap();
    c.synchronize().unwrap();
    let up = b.elapsed_since(&a).unwrap().as_secs_f64();
    let down = c.elapsed_since(&b).unwrap().as_secs_f64();
    let report = ledger.report().unwrap();
    println!("{report}");
    let upload = report.category(Category::Upload).unwrap();
    let download = report.category(Category::Download).unwrap();
    assert_eq!(
        (upload.count, upload.bytes, download.count, download.bytes),
        (1, len, 1, len)
    );
    if common::SIMULATED {
        // Each copy's own events lie between the events recorded by hand around it, on one stream, so its
        // span can only be shorter (by the delays the simulator puts between operations). 1 us for rounding:
        // event times are f32 milliseconds.
        let within = |inner: f64, outer: f64| inner > 0.0 && inner <= outer + 1e-6;
        assert!(
            within(upload.seconds, up),
            "ledger {} s, by hand {up} s",
            upload.seconds
        );
        assert!(
            within(download.seconds, down),
            "ledger {} s, by hand {down} s",
            download.seconds
        );
        assert!(
            within(report.wall.as_secs_f64(), up + down),
            "wall {:?}",
            report.wall
        );
    } else {
        assert!(
            close(upload.seconds, up),
            "ledger {} s, by hand {up} s",
            upload.seconds
        );
        assert!(
            close(download.seconds, down),
            "ledger {} s, by hand {down} s",
            download.seconds
        );
        let gb = upload.gb_per_s().unwrap();
        assert!(
            close(gb, len as f64 / up / 1e9) || (gb - len as f64 / up / 1e9).abs() < 0.5,
            "{gb} GB/s"
        );
        assert!(
            close(report.wall.as_secs_f64(), up + down),
            "wall {:?}",
            report.wall
        );
    }
    assert!(upload.share_of_wall > 0.0 && upload.share_of_wall + download.share_of_wall <= 1.0001);
    assert!(
        report.hidden_transfer.is_zero(),
        "no kernel ran: nothing can be hidden"
    );
}

#[test]
fn kernels_are_counted_by_name_and_transfers_under_them_are_hidden() {
    let _serial = serial();
    let ctx = context();
    let ledger = Ledger::new();
    let (copies, compute) = (
        Stream::with_ledger(&ctx, &ledger).unwrap(),
        Stream::with_ledger(&ctx, &ledger).unwrap(),
    );
    let len = 64 << 20;
    let host = Pinned::<u8>::zeroed(&ctx, len).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&copies, len).unwrap();
    let mut other = DeviceBuffer::<u32>::uninit(&compute, 1 << 20).unwrap();
    ctx.synchronize().unwrap();
    ledger.clear();
    // A 30 ms kernel on one stream, and an upload of about 1.2 ms on another that starts after it: the whole
    // upload runs under the kernel.
    spin(&compute, Duration::from_millis(30)).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    copies.upload(&host, &mut device).unwrap();
    fill(&compute, &mut other, 7u32).unwrap();
    compute
        .profile("my kernel", 0, || spin(&compute, Duration::from_millis(1)))
        .unwrap();
    ctx.synchronize().unwrap();
    let report = ledger.report().unwrap();
    println!("{report}");
    let kernels = report.category(Category::Kernel).unwrap();
    assert_eq!(
        kernels.count, 4,
        "spin, fill, my kernel and the spin inside it"
    );
    assert_eq!(report.named("spin").unwrap().count, 2);
    assert_eq!(report.named("fill").unwrap().count, 1);
    assert_eq!(report.named("my kernel").unwrap().count, 1);
    assert!(report.named("spin").unwrap().seconds >= 0.031 * 0.99);
    let transfer = report.transfer.as_secs_f64();
    let hidden = report.hidden_transfer.as_secs_f64();
    if common::SIMULATED {
        // The upload is not sure to run while the spin's host function sleeps on a loaded machine.
        assert!(
            transfer > 0.0 && hidden <= transfer,
            "hidden {hidden} of {transfer} s"
        );
    } else {
        assert!(
            transfer > 0.0 && close(hidden, transfer),
            "hidden {hidden} of {transfer} s"
        );
    }

    // Taking turns on one stream, nothing is hidden.
    ledger.clear();
    spin(&copies, Duration::from_millis(5)).unwrap();
    copies.upload(&host, &mut device).unwrap();
    copies.synchronize().unwrap();
    let report = ledger.report().unwrap();
    assert!(
        report.hidden_transfer.as_secs_f64() < 10e-6,
        "{:?}",
        report.hidden_transfer
    );
    // 1.2 ms of upload after 5 ms of spin on a GPU; the simulator's copies take what the host's memcpy takes.
    if !common::SIMULATED {
        assert!(report.category(Category::Upload).unwrap().share_of_wall < 0.5);
    }
}

#[test]
fn a_stream_without_a_ledger_records_nothing() {
    let _serial = serial();
    let ctx = context();
    let ledger = Ledger::new();
    let stream = Stream::new(&ctx).unwrap();
    assert!(stream.ledger().is_none());
    let host = Pinned::<u8>::zeroed(&ctx, 1 << 20).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&stream, 1 << 20).unwrap();
    stream.upload(&host, &mut device).unwrap();
    stream
        .profile("ignored", 0, || spin(&stream, Duration::from_micros(10)))
        .unwrap();
    stream.synchronize().unwrap();
    assert!(ledger.report().unwrap().rows.is_empty());
    assert_eq!(format!("{ledger:?}"), "Ledger(0 entries)");
}
