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
