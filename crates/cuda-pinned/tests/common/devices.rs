//! Checks of copies between two devices, shared by the test files that run them with peer access and without.

use std::time::Duration;

use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream, Use};

use super::{data, hold};

/// Element counts of the peer copies: one element, odd sizes around a page and a staging chunk (4 MiB), and
/// several chunks.
pub const PEER_LENGTHS: [usize; 6] = [1, 3, 1025, (1 << 20) - 1, (1 << 20) + 7, 5 << 20];

/// Copies random data of `len` `u32`s from device `from` to device `to` on a stream of the device
/// `on_source` names, behind work still queued on the source's stream that writes the source (held for a
/// while, so that a copy that does not wait for it reads what was there before), and checks every element
/// that arrives.
pub fn peer_copy(contexts: &[Context; 2], from: usize, to: usize, len: usize, on_source: bool) {
    let (src_ctx, dst_ctx) = (&contexts[from], &contexts[to]);
    let (s_src, s_dst) = (Stream::new(src_ctx).unwrap(), Stream::new(dst_ctx).unwrap());
    let want = data(len, (len * 7 + from) as u64);
    let host = Pinned::from_slice(src_ctx, &want).unwrap();
    let mut src = DeviceBuffer::<u32>::zeroed(&s_src, len).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(&s_dst, len).unwrap();
    s_src.synchronize().unwrap();
    s_dst.synchronize().unwrap();
    let held = hold(&s_src, Duration::from_millis(500));
    s_src.upload(&host, &mut src).unwrap();
    let copying = if on_source { &s_src } else { &s_dst };
    copying.copy(&src, &mut dst).unwrap();
    drop(held);
    // The copy is in the copying stream's order: once that stream is done, so is the copy, and a read around
    // the tracking (which waits for nothing) sees all of it.
    copying.synchronize().unwrap();
    let mut out = Pinned::<u32>::zeroed(dst_ctx, len).unwrap();
    let (host_ptr, device_ptr) = (out.as_ptr().cast_mut(), dst.as_raw());
    // SAFETY: a download of `len` u32s on the stream it is given, into `out` (declared written); it reads `dst`
    // undeclared, which is the point: after the synchronize above no work of the crate may still write it.
    unsafe {
        s_dst.enqueue_foreign(&[Use::write_host(&mut out)], |stream| {
            cuda_pinned::driver_call!(cuMemcpyDtoHAsync_v2(
                host_ptr.cast(),
                device_ptr,
                len * 4,
                stream
            ))
        })
    }
    .unwrap()
    .unwrap();
    let got = out.as_slice().unwrap();
    if let Err(e) = super::compare(got, &want, "the copy's destination") {
        panic!(
            "{len} elements from device {from} to device {to} on the {} stream: {e}",
            if on_source {
                "source's"
            } else {
                "destination's"
            }
        );
    }
}

/// Copies between the two devices both ways (on the destination's stream, then on the source's) while an
/// unrelated stream of each device is held: each copy must complete on the device meanwhile (an event recorded
/// after it is seen complete), so it neither waits for those streams nor makes them wait. The copies' first
/// use of the pair (enabling peer access, making the staging buffers and streams) is done before, untimed.
pub fn copy_beside_held_streams(contexts: &[Context; 2]) {
    const LEN: usize = (4 << 20) / 4 + 3; // two staging chunks
    let streams: Vec<Stream> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let mut buffers: Vec<DeviceBuffer<u32>> = streams
        .iter()
        .map(|s| DeviceBuffer::zeroed(s, LEN).unwrap())
        .collect();
    let (first, second) = buffers.split_at_mut(1);
    streams[1].copy(&first[0], &mut second[0]).unwrap();
    for stream in &streams {
        stream.synchronize().unwrap();
    }
    let unrelated: Vec<Stream> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let held: Vec<_> = unrelated
        .iter()
        .map(|s| hold(s, Duration::from_secs(2)))
        .collect();
    for (from, to, on) in [(0, 1, 1), (1, 0, 1)] {
        let (src, dst) = if from == 0 {
            let (a, b) = buffers.split_at_mut(1);
            (&a[0], &mut b[0])
        } else {
            let (a, b) = buffers.split_at_mut(1);
            (&b[0], &mut a[0])
        };
        streams[on].copy(src, dst).unwrap();
        let done = cuda_pinned::Event::new(&contexts[on]).unwrap();
        streams[on].record(&done).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_millis(1500);
        while !done.query().unwrap() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            done.query().unwrap(),
            "the copy from device {from} to device {to} waited for an unrelated stream"
        );
    }
    drop(held);
    for context in contexts {
        context.synchronize().unwrap();
    }
}
