//! The safe kernel launchers and the buffer views on a real GPU: results checked on the host, the tracking of
//! kernels across streams, and the errors for bad ranges, lengths and element sizes.
#![cfg(feature = "gpu")]

mod common;

use std::time::Duration;

use common::{data, serial};
use cuda_pinned::kernels::{self, axpy, device_checksum, fill, spin};
use cuda_pinned::{Context, DeviceBuffer, Error, Pinned, Stream};

fn context() -> Context {
    common::device(0)
}

fn download<T: bytemuck::Pod + Default>(stream: &Stream, buffer: &DeviceBuffer<T>) -> Vec<T> {
    let mut out = vec![T::default(); buffer.len()];
    stream.download_pageable(buffer, &mut out).unwrap();
    out
}

#[test]
fn fill_writes_the_view_and_nothing_else_for_every_width() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let len = 100_003;
    let (start, end) = (17, 90_001);

    let mut bytes = DeviceBuffer::<u8>::zeroed(&stream, len).unwrap();
    fill(&stream, &mut bytes.slice_mut(start..end).unwrap(), 0xa5u8).unwrap();
    let got = download(&stream, &bytes);
    assert!(
        got[..start].iter().chain(&got[end..]).all(|&b| b == 0),
        "u8: fill wrote outside its view"
    );
    assert!(
        got[start..end].iter().all(|&b| b == 0xa5),
        "u8: fill missed elements"
    );

    let mut halves = DeviceBuffer::<u16>::zeroed(&stream, len).unwrap();
    fill(&stream, &mut halves, 0xbeefu16).unwrap();
    assert!(download(&stream, &halves).iter().all(|&x| x == 0xbeef));

    let mut floats = DeviceBuffer::<f32>::zeroed(&stream, len).unwrap();
    fill(&stream, &mut floats.slice_mut(start..).unwrap(), -2.5f32).unwrap();
    let got = download(&stream, &floats);
    assert!(got[..start].iter().all(|&x| x == 0.0) && got[start..].iter().all(|&x| x == -2.5));

    let mut wide = DeviceBuffer::<u64>::zeroed(&stream, len).unwrap();
    fill(
        &stream,
        &mut wide.slice_mut(..end).unwrap(),
        0x0123_4567_89ab_cdefu64,
    )
    .unwrap();
    let got = download(&stream, &wide);
    assert!(
        got[..end].iter().all(|&x| x == 0x0123_4567_89ab_cdef)
            && got[end..].iter().all(|&x| x == 0)
    );

    // Elements of other sizes are refused, with nothing enqueued.
    let mut odd = DeviceBuffer::<[u8; 3]>::zeroed(&stream, 10).unwrap();
    let e = fill(&stream, &mut odd, [1, 2, 3]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("3 bytes"),
        "{e}"
    );
    assert!(download(&stream, &odd).iter().all(|&x| x == [0; 3]));
}

#[test]
fn axpy_and_the_device_checksum_match_the_host() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let n = 1_000_003;
    let to_f32 = |v: Vec<u32>| -> Vec<f32> {
        v.into_iter()
            .map(|u| (u >> 8) as f32 / 4096.0 - 2048.0)
            .collect()
    };
    let (x, y) = (to_f32(data(n, 1)), to_f32(data(n, 2)));
    let mut dx = DeviceBuffer::<f32>::uninit(&stream, n).unwrap();
    let mut dy = DeviceBuffer::<f32>::uninit(&stream, n).unwrap();
    stream.upload_pageable(&x, &mut dx).unwrap();
    stream.upload_pageable(&y, &mut dy).unwrap();
    axpy(&stream, 0.5, &dx, &mut dy).unwrap();
    let got = download(&stream, &dy);
    for i in 0..n {
        let want = 0.5f32.mul_add(x[i], y[i]);
        assert!(
            (got[i] - want).abs() <= f32::EPSILON * want.abs().max(1.0) * 2.0,
            "axpy element {i}"
        );
    }
    let short = DeviceBuffer::<f32>::zeroed(&stream, n - 1).unwrap();
    assert!(matches!(
        axpy(&stream, 1.0, &short, &mut dy),
        Err(Error::InvalidArgument { .. })
    ));

    let bytes = data(n, 3);
    let mut device = DeviceBuffer::<u32>::uninit(&stream, n).unwrap();
    stream.upload_pageable(&bytes, &mut device).unwrap();
    let mut out = DeviceBuffer::<u64>::zeroed(&stream, 1).unwrap();
    for (start, end) in [(0, n), (1, n), (5, 6), (3, 3), (100, 90_001)] {
        device_checksum(&stream, &device.slice(start..end).unwrap(), &mut out).unwrap();
        let host = kernels::checksum(bytemuck::cast_slice(&bytes[start..end]));
        assert_eq!(
            download(&stream, &out)[0],
            host,
            "checksum of elements {start}..{end}"
        );
    }
    let mut two = DeviceBuffer::<u64>::zeroed(&stream, 2).unwrap();
    assert!(device_checksum(&stream, &device, &mut two).is_err());
}

/// A kernel on one stream, delayed by a spin, writes a buffer; a download on another stream must wait for it.
#[test]
fn kernels_are_tracked_across_streams() {
    let _serial = serial();
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let len = 4 << 20;
    let mut device = DeviceBuffer::<u32>::zeroed(&a, len).unwrap();
    let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    for round in 1..=3u32 {
        spin(&a, Duration::from_millis(30)).unwrap();
        fill(&a, &mut device, round).unwrap();
        b.download(&device, &mut host).unwrap();
        assert!(
            host.as_slice().unwrap().iter().all(|&x| x == round),
            "round {round}: read before the kernel wrote"
        );
        // And the other way: a kernel write must wait for a slow read on another stream.
        spin(&b, Duration::from_millis(30)).unwrap();
        b.download(&device, &mut host).unwrap();
        fill(&a, &mut device, 1000 + round).unwrap();
        assert!(
            host.as_slice().unwrap().iter().all(|&x| x == round),
            "round {round}: the kernel overwrote early"
        );
    }
    let mut checksum = DeviceBuffer::<u64>::zeroed(&b, 1).unwrap();
    spin(&a, Duration::from_millis(20)).unwrap();
    fill(&a, &mut device, 7u32).unwrap();
    device_checksum(&b, &device, &mut checksum).unwrap();
    let want = kernels::checksum(bytemuck::cast_slice(&vec![7u32; len]));
    assert_eq!(download(&b, &checksum)[0], want);
}

#[test]
fn views_copy_parts_of_buffers_and_refuse_bad_ranges() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let len = 1 << 20;
    let want = data(len, 9);
    let src = Pinned::from_slice(&ctx, &want).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(&stream, len).unwrap();
    let (lo, hi) = (1000, 500_000);
    // Upload a middle part, then download it into the tail of a pinned buffer.
    stream
        .upload(
            &src.slice(lo..hi).unwrap(),
            &mut device.slice_mut(lo..hi).unwrap(),
        )
        .unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    stream
        .download(
            &device.slice(lo..hi).unwrap(),
            &mut back.slice_mut(len - (hi - lo)..).unwrap(),
        )
        .unwrap();
    let got = back.as_slice().unwrap();
    assert_eq!(&got[len - (hi - lo)..], &want[lo..hi]);
    assert!(got[..len - (hi - lo)].iter().all(|&x| x == 0));
    let whole = download(&stream, &device);
    assert!(
        whole[..lo].iter().chain(&whole[hi..]).all(|&x| x == 0) && whole[lo..hi] == want[lo..hi]
    );
    // Device-to-device between views of two buffers, and an empty view.
    let mut other = DeviceBuffer::<u32>::zeroed(&stream, len).unwrap();
    stream
        .copy(
            &device.slice(lo..hi).unwrap(),
            &mut other.slice_mut(..hi - lo).unwrap(),
        )
        .unwrap();
    assert_eq!(download(&stream, &other)[..hi - lo], want[lo..hi]);
    stream
        .copy(
            &device.slice(5..5).unwrap(),
            &mut other.slice_mut(0..0).unwrap(),
        )
        .unwrap();

    for e in [
        device.slice(0..len + 1).unwrap_err(),
        device.slice_mut(len..len + 1).unwrap_err(),
        src.slice(hi..lo).unwrap_err(),
        back.slice_mut(..=len).unwrap_err(),
    ] {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    // Mismatched view lengths are an error with nothing enqueued.
    let e = stream
        .upload(
            &src.slice(..10).unwrap(),
            &mut device.slice_mut(..11).unwrap(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    ctx.check_deferred_errors().unwrap();
}
