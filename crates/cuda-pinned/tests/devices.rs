//! Two devices: one page-locked buffer shared by both devices' streams, copies between their memory (peer
//! copies, both ways, odd sizes), buffers dropped while the other device still uses them, and the memory each
//! device's streams must refuse.
//!
//! On a GPU (feature `gpu`) it needs two devices and fails with fewer; on the simulated driver it installs two,
//! which can access each other (`tests/sim_staged_peer.rs` runs the copies where they cannot).

mod common;

use std::time::Duration;

use common::devices::{PEER_LENGTHS, peer_copy};
use common::{Serial, data, hold, refused, serial};
use cuda_pinned::{Context, DeviceBuffer, Event, Pinned, PinnedBuilder, Stream, Use};

fn setup() -> Serial {
    #[cfg(not(feature = "gpu"))]
    {
        cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().devices(2))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    serial()
}

/// The primary contexts of devices 0 and 1.
fn two_devices() -> [Context; 2] {
    let count = cuda_pinned::Device::count().unwrap();
    assert!(
        count >= 2,
        "this test needs two devices, the machine has {count}"
    );
    [Context::on(0).unwrap(), Context::on(1).unwrap()]
}

const N: usize = 1 << 20;

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
    }
    s1.download(&d1, &mut out).unwrap();
    drop(held);
    let got = out.as_slice().unwrap().to_vec();
    s1.synchronize().unwrap();
    (got, want)
}

#[test]
fn a_buffer_written_on_one_device_and_read_on_the_other_is_read_after_the_write() {
    let _serial = setup();
    let (got, want) = produce_and_consume(true);
    common::compare(&got, &want, "what device 1 read").unwrap();
}

/// The control: the consumer's read enqueued around the tracking does not wait, and reads the buffer before
/// the producer has written it.
#[test]
fn control_a_read_around_the_tracking_reads_before_the_write() {
    let _serial = setup();
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
    let _serial = setup();
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
    let _serial = setup();
    let contexts = two_devices();
    for len in PEER_LENGTHS {
        for (from, to) in [(0, 1), (1, 0)] {
            for on_source in [false, true] {
                peer_copy(&contexts, from, to, len, on_source);
            }
        }
    }
    assert!(contexts[0].can_access_peer(&contexts[1]).unwrap() || !common::SIMULATED);
}

/// A device buffer of device 0 dropped while device 1's stream still copies out of it, and a page-locked
/// buffer dropped while device 1 still uploads from it, are freed only once the copies have completed: the
/// copies deliver every element (and the simulated driver reports memory freed under queued work).
#[test]
fn buffers_dropped_while_the_other_device_reads_them_are_freed_after() {
    let _serial = setup();
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
    ctx0.synchronize().unwrap();
    ctx1.synchronize().unwrap();
}

/// Memory that a device's streams must not use is refused before anything is enqueued, beside twins that are
/// accepted: page-locked memory of another context that is not portable, and a copy between two buffers of
/// which neither is the stream's.
#[test]
fn memory_of_the_wrong_context_is_refused() {
    let _serial = setup();
    let [ctx0, ctx1] = two_devices();
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let mut d1 = DeviceBuffer::<u32>::zeroed(&s1, 64).unwrap();
    let mut private = PinnedBuilder::new(&ctx0)
        .portable(false)
        .from_slice(&data(64, 1))
        .unwrap();
    assert!(!private.is_portable());
    refused(s1.upload(&private, &mut d1), "not portable");
    refused(s1.download(&d1, &mut private), "not portable");
    refused(
        s1.upload(
            &private.slice(..32).unwrap(),
            &mut d1.slice_mut(..32).unwrap(),
        ),
        "not portable",
    );
    // Its own context's streams take it.
    let mut d0 = DeviceBuffer::<u32>::zeroed(&s0, 64).unwrap();
    s0.upload(&private, &mut d0).unwrap();
    // Portable memory (the default) serves both.
    let portable = Pinned::from_slice(&ctx0, &data(64, 2)).unwrap();
    assert!(portable.is_portable());
    s1.upload(&portable, &mut d1).unwrap();
    // A copy between two buffers of device 0 on device 1's stream.
    let mut other0 = DeviceBuffer::<u32>::zeroed(&s0, 64).unwrap();
    refused(s1.copy(&d0, &mut other0), "use a stream of either");
    // Lengths of two devices' buffers that differ.
    let mut short1 = DeviceBuffer::<u32>::zeroed(&s1, 63).unwrap();
    refused(s1.copy(&d0, &mut short1), "elements");
    s0.copy(&d0, &mut other0).unwrap();
    ctx0.synchronize().unwrap();
    ctx1.synchronize().unwrap();
}
