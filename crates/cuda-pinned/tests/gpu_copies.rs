//! Device and pinned memory and the copies between them, on a real GPU: round trips of every host-memory kind
//! at sizes from 0 to 256 MiB, cross-stream ordering made visible by a slow producer, drops right after a slow
//! copy, host access that must wait, and the errors a user meets.

mod common;

use common::{data, serial, spin};
use cuda_pinned::sys::{self, CUresult};
use cuda_pinned::{
    Context, DeviceBuffer, Error, Pinned, PinnedBuilder, PinnedPool, Placement, Registered, Stream,
    driver_call,
};

fn context() -> Context {
    common::device(0)
}

fn assert_same(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    // The comparison of whole slices first (a memcmp even in a debug build); the element, only to say which.
    if got == want {
        return;
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: element {i} of {} is {:#x}, expected {:#x}",
            want.len(),
            got[i],
            want[i]
        );
    }
}

const SIZES: [usize; 6] = [0, 1, 1_000_003, 1024, 256 * 1024, 64 << 20]; // elements of u32: up to 256 MiB

#[test]
fn pinned_round_trips_at_every_size() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let want = data(len, i as u64);
        let src = Pinned::from_slice(&ctx, &want).unwrap();
        let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
        let mut back = Pinned::<u32>::zeroed(&ctx, len).unwrap();
        stream.upload(&src, &mut device).unwrap();
        stream.download(&device, &mut back).unwrap();
        assert_same(
            back.as_slice().unwrap(),
            &want,
            &format!("pinned, {len} elements"),
        );
    }
}

#[test]
fn write_combined_portable_and_mapped_pinned_memory_round_trip() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let want = data(len, 100 + i as u64);
        // Write-combined: the upload-only choice; written by the host, never read back by it.
        let mut wc = PinnedBuilder::new(&ctx)
            .write_combined(true)
            .zeroed::<u32>(len)
            .unwrap();
        assert!(len == 0 || wc.is_write_combined());
        wc.as_mut_slice().unwrap().copy_from_slice(&want);
        let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
        stream.upload(&wc, &mut device).unwrap();
        let mut back = PinnedBuilder::new(&ctx)
            .portable(true)
            .device_mapped(true)
            .zeroed::<u32>(len)
            .unwrap();
        stream.download(&device, &mut back).unwrap();
        assert_same(
            back.as_slice().unwrap(),
            &want,
            &format!("write-combined/portable, {len} elements"),
        );
    }
}

#[test]
fn registered_vectors_round_trip_and_come_back() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let want = data(len, 200 + i as u64);
        let src = Registered::new(&ctx, want.clone()).unwrap();
        let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
        let mut back = Registered::new(&ctx, vec![0u32; len]).unwrap();
        stream.upload(&src, &mut device).unwrap();
        stream.download(&device, &mut back).unwrap();
        assert_same(
            back.as_slice().unwrap(),
            &want,
            &format!("registered, {len} elements"),
        );
        let vec = back.into_vec().unwrap();
        assert_same(&vec, &want, "the Vec handed back");
        assert_same(&src.into_vec().unwrap(), &want, "the source Vec");
    }
}

#[test]
fn pageable_copies_round_trip_and_return_when_done() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let want = data(len, 300 + i as u64);
        let mut device = DeviceBuffer::<u32>::zeroed(&stream, len).unwrap();
        stream.upload_pageable(&want, &mut device).unwrap();
        let mut copy = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
        stream.copy(&device, &mut copy).unwrap();
        let mut back = vec![0u32; len];
        stream.download_pageable(&copy, &mut back).unwrap();
        assert_same(&back, &want, &format!("pageable, {len} elements"));
    }
}

#[test]
fn zeroed_device_memory_is_zero() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let len = 3_000_001;
    let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
    stream.upload_pageable(&data(len, 7), &mut device).unwrap();
    drop(device);
    // Likely the same memory again, now zeroed.
    let device = DeviceBuffer::<u32>::zeroed(&stream, len).unwrap();
    let mut back = data(len, 8);
    stream.download_pageable(&device, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0));
}

/// A producer on one stream, slowed by `spin`, writes a buffer; a consumer on another stream reads it. Without
/// the device-side wait the tracker adds, the consumer would read the old contents.
#[test]
fn a_consumer_on_another_stream_waits_for_a_slow_producer() {
    let _serial = serial();
    let ctx = context();
    let (producer, consumer) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let len = 4 << 20;
    let old = data(len, 10);
    let new = data(len, 11);
    let mut device = DeviceBuffer::<u32>::uninit(&producer, len).unwrap();
    producer.upload_pageable(&old, &mut device).unwrap();
    let fresh = Pinned::from_slice(&ctx, &new).unwrap();
    for round in 0..3 {
        spin(&producer, 50);
        producer.upload(&fresh, &mut device).unwrap(); // runs only after the spin
        let mut seen = Pinned::<u32>::zeroed(&ctx, len).unwrap();
        consumer.download(&device, &mut seen).unwrap(); // must wait for the upload
        assert_same(
            seen.as_slice().unwrap(),
            &new,
            &format!("round {round}: read after write across streams"),
        );
        // Write after read: the producer overwrites while the (slowed) consumer still reads.
        spin(&consumer, 50);
        let mut seen_again = Pinned::<u32>::zeroed(&ctx, len).unwrap();
        consumer.download(&device, &mut seen_again).unwrap();
        producer.upload_pageable(&old, &mut device).unwrap(); // must wait for the consumer's read
        assert_same(
            seen_again.as_slice().unwrap(),
            &new,
            &format!("round {round}: write after read"),
        );
        let mut check = vec![0u32; len];
        consumer.download_pageable(&device, &mut check).unwrap();
        assert_same(
            &check,
            &old,
            &format!("round {round}: the overwrite landed"),
        );
    }
}

/// Dropping the source and destination of a slow copy right after enqueueing it must neither free the memory
/// under the copy nor block; the data still arrives.
#[test]
fn dropping_buffers_right_after_a_slow_copy_is_safe() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let len = 8 << 20;
    let want = data(len, 20);
    let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
    {
        let src = Pinned::from_slice(&ctx, &want).unwrap();
        spin(&stream, 100);
        stream.upload(&src, &mut device).unwrap();
        // `src` drops here, while the upload waits behind the spin: its release must be deferred.
    }
    // Fresh pinned memory, likely reusing freed pages were the release not deferred, with other contents.
    let decoy = Pinned::from_slice(&ctx, &data(len, 21)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    other.download(&device, &mut back).unwrap();
    assert_same(
        back.as_slice().unwrap(),
        &want,
        "the upload from a dropped source",
    );
    drop(decoy);

    // A destination dropped while a slow copy into it is queued: freed stream-ordered after the copy.
    {
        let mut dst = DeviceBuffer::<u32>::uninit(&other, len).unwrap();
        spin(&other, 50);
        stream.copy(&device, &mut dst).unwrap();
    }
    // And a pinned download destination dropped before its copy ran.
    {
        let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
        spin(&stream, 50);
        stream.download(&device, &mut host).unwrap();
    }
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn host_access_waits_for_an_in_flight_download() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let len = 1 << 20;
    let want = data(len, 30);
    let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
    stream.upload_pageable(&want, &mut device).unwrap();
    let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    spin(&stream, 100);
    stream.download(&device, &mut host).unwrap();
    assert!(
        host.try_as_slice().unwrap().is_none(),
        "the download is still queued behind the spin"
    );
    assert!(host.try_as_mut_slice().unwrap().is_none());
    assert_same(
        host.as_slice().unwrap(),
        &want,
        "as_slice waited for the download",
    );
    assert!(host.try_as_slice().unwrap().is_some());

    // A pinned upload source may be read by the host while the upload is in flight, but not written.
    let mut src = Pinned::from_slice(&ctx, &want).unwrap();
    spin(&stream, 100);
    stream.upload(&src, &mut device).unwrap();
    assert!(
        src.try_as_slice().unwrap().is_some(),
        "reading does not conflict with an upload"
    );
    assert!(
        src.try_as_mut_slice().unwrap().is_none(),
        "writing must wait for the upload"
    );
    src.as_mut_slice().unwrap().fill(0); // waits, then overwrites
    let mut back = vec![0u32; len];
    stream.download_pageable(&device, &mut back).unwrap();
    assert_same(
        &back,
        &want,
        "the upload read the source before the host overwrote it",
    );

    // The same for registered memory.
    let mut reg = Registered::new(&ctx, vec![0u32; len]).unwrap();
    spin(&stream, 50);
    stream.download(&device, &mut reg).unwrap();
    assert!(reg.try_as_slice().unwrap().is_none());
    assert_same(
        reg.as_slice().unwrap(),
        &want,
        "registered: as_slice waited",
    );
    assert!(reg.try_as_mut_slice().unwrap().is_some());
}

#[test]
fn errors_for_out_of_memory_and_mismatched_lengths() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let e = DeviceBuffer::<u8>::uninit(&stream, 1 << 40).unwrap_err();
    assert_eq!(
        e.driver_code(),
        Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("while allocating 1.0 TiB on device 0"),
        "{e}"
    );
    let e = DeviceBuffer::<u64>::uninit(&stream, usize::MAX / 2).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");

    let src = Pinned::from_slice(&ctx, &data(10, 40)).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(&stream, 8).unwrap();
    let e = stream.upload(&src, &mut device).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("10 elements"), "{e}");
    let mut host = vec![0u32; 9];
    assert!(stream.download_pageable(&device, &mut host).is_err());
    assert!(stream.upload_pageable(&host, &mut device).is_err());
    let mut wrong = Pinned::<u32>::zeroed(&ctx, 7).unwrap();
    assert!(stream.download(&device, &mut wrong).is_err());
    // Nothing was enqueued: the device buffer is still zero.
    let mut back = vec![1u32; 8];
    stream.download_pageable(&device, &mut back).unwrap();
    assert_eq!(back, [0; 8]);
    ctx.check_deferred_errors().unwrap();
}

/// Memory from the runtime's `cudaHostAlloc` is pinned as far as the driver is concerned, and a download into
/// it returns before the copy has run, as from the crate's own pinned memory.
#[test]
fn runtime_pinned_memory_is_pinned_to_the_driver() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let runtime = sys::runtime().expect("libcudart under feature `gpu` on the test machine");
    let host_alloc = runtime
        .function(&runtime.api().cudaHostAlloc, "cudaHostAlloc")
        .unwrap();
    let free_host = runtime
        .function(&runtime.api().cudaFreeHost, "cudaFreeHost")
        .unwrap();
    let len = 1 << 20;
    let bytes = len * 4;
    let mut ptr = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; freed below.
    runtime
        .check(unsafe { host_alloc(&mut ptr, bytes, 0) }, "cudaHostAlloc")
        .unwrap();
    let want = data(len, 50);
    let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
    stream.upload_pageable(&want, &mut device).unwrap();
    let mut memory_type = 0u32;
    // SAFETY: an out-pointer of the attribute's type (an unsigned int); `ptr` is a host allocation.
    unsafe {
        driver_call!(cuPointerGetAttribute(
            (&mut memory_type as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as sys::CUdeviceptr
        ))
    }
    .unwrap();
    assert_eq!(
        memory_type,
        sys::CUmemorytype::CU_MEMORYTYPE_HOST.0,
        "the driver knows it as pinned host memory"
    );
    spin(&stream, 100);
    // SAFETY: `ptr` is `bytes` bytes of pinned memory; the stream is synchronised before reading or freeing it.
    unsafe {
        driver_call!(cuMemcpyDtoHAsync_v2(
            ptr,
            device.as_raw(),
            bytes,
            stream.as_raw()
        ))
    }
    .unwrap();
    // Into pageable memory this call would return only after the spin and the copy: it returned at once.
    assert!(
        !stream.query().unwrap(),
        "the download into runtime-pinned memory was asynchronous"
    );
    stream.synchronize().unwrap();
    // SAFETY: `bytes` bytes written by the completed copy.
    let got = unsafe { std::slice::from_raw_parts(ptr.cast::<u32>(), len) };
    assert_same(got, &want, "download into cudaHostAlloc memory");
    // SAFETY: allocated above; no work uses it any more.
    runtime
        .check(unsafe { free_host(ptr) }, "cudaFreeHost")
        .unwrap();
}

#[test]
fn accessors_report_what_was_allocated() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let device = DeviceBuffer::<u64>::zeroed(&stream, 1000).unwrap();
    assert_eq!(
        (device.len(), device.byte_len(), device.is_empty()),
        (1000, 8000, false)
    );
    assert_eq!(device.context(), &ctx);
    assert_ne!(device.as_raw(), 0);
    let empty = DeviceBuffer::<u64>::zeroed(&stream, 0).unwrap();
    assert!(empty.is_empty() && empty.as_raw() == 0);
    let view = device.slice(10..20).unwrap();
    assert_eq!(
        (view.len(), view.is_empty(), view.as_raw()),
        (10, false, device.as_raw() + 80)
    );

    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_WRITECOMBINED;
    let pinned = PinnedBuilder::new(&ctx)
        .portable(true)
        .write_combined(true)
        .zeroed::<u16>(5)
        .unwrap();
    assert_eq!(
        (pinned.len(), pinned.is_empty(), pinned.flags()),
        (5, false, flags)
    );
    assert!(pinned.is_write_combined() && pinned.context() == &ctx);
    assert!(!pinned.as_ptr().is_null());
    let off = PinnedBuilder::new(&ctx)
        .write_combined(true)
        .write_combined(false)
        .zeroed::<u8>(1)
        .unwrap();
    // Portable by default: the host side of copies on every device's streams.
    assert_eq!(off.flags(), sys::CU_MEMHOSTALLOC_PORTABLE);
    assert!(off.is_portable());
    let private = PinnedBuilder::new(&ctx)
        .portable(false)
        .zeroed::<u8>(1)
        .unwrap();
    assert!(!private.is_portable() && private.flags() == 0);
    let views = (pinned.slice(1..3).unwrap(), pinned.slice(5..).unwrap());
    assert_eq!((views.0.len(), views.1.is_empty()), (2, true));

    let registered = Registered::new(&ctx, vec![1u8, 2, 3]).unwrap();
    assert_eq!((registered.len(), registered.is_empty()), (3, false));
    assert_eq!(registered.context(), &ctx);
    assert_eq!(registered.as_slice().unwrap(), [1, 2, 3]);
    let empty = Registered::new(&ctx, Vec::<u8>::new()).unwrap();
    assert!(empty.is_empty());
    assert!(empty.into_vec().unwrap().is_empty());
    let event = cuda_pinned::Event::new(&ctx).unwrap();
    assert!(!event.as_raw().is_null());
}

/// Dropping every handle of a context (here a second `Context` of the same device) while a copy still writes
/// a `Registered` Vec must not free the Vec: the deferred release keeps it until the copy is done.
#[test]
fn dropping_the_context_keeps_memory_a_copy_still_writes() {
    let _serial = serial();
    let (b, a) = (context(), context());
    let (s1, s2) = (Stream::new(&b).unwrap(), Stream::new(&b).unwrap());
    let big_len = 1 << 30;
    let mut big = Pinned::<u8>::zeroed(&b, big_len).unwrap();
    big.as_mut_slice().unwrap().fill(0x55);
    let mut device = DeviceBuffer::<u8>::uninit(&s1, big_len).unwrap();
    let small = 64 << 10;
    let mut registered = Registered::new(&a, vec![0u8; small]).unwrap();
    s1.upload(&big, &mut device).unwrap(); // about 20 ms
    s2.download(&device.slice(..small).unwrap(), &mut registered)
        .unwrap(); // waits for the upload
    drop(registered);
    drop(a);
    // Were the Vec freed now, this would likely get its address and then be overwritten by the download.
    let victim = vec![0xaau8; small];
    b.synchronize().unwrap();
    assert!(
        victim.iter().all(|&x| x == 0xaa),
        "a download wrote into freed memory"
    );
    b.check_deferred_errors().unwrap();
}

#[test]
fn registered_zero_sized_elements_register_nothing_and_come_back() {
    let _serial = serial();
    let ctx = context();
    let units = Registered::new(&ctx, vec![(); 5]).unwrap();
    assert_eq!(units.len(), 5);
    assert_eq!(units.into_vec().unwrap().len(), 5);
    drop(Registered::new(&ctx, vec![(); 3]).unwrap());
    ctx.check_deferred_errors().unwrap();
}

/// Every placement of pinned memory allocates on this host, pooled or not, and the memory is the host side of
/// copies as any; a node that is not online is refused with an error naming it, before anything is pinned.
#[test]
fn pinned_memory_is_placed_as_asked() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let want = data(1 << 16, 9);
    let mut device = DeviceBuffer::<u32>::zeroed(&stream, want.len()).unwrap();
    for placement in [Placement::DeviceNode, Placement::Any, Placement::Node(0)] {
        let host = PinnedBuilder::new(&ctx)
            .placement(placement)
            .from_slice(&want)
            .unwrap();
        let pool = PinnedPool::builder(&ctx, 1 << 20)
            .placement(placement)
            .build();
        let mut back = pool.alloc::<u32>(want.len()).unwrap();
        stream.upload(&host, &mut device).unwrap();
        stream.download(&device, &mut back).unwrap();
        assert_eq!(back.as_slice().unwrap(), want, "{placement:?}");
    }
    let device = ctx.device();
    assert_eq!(Placement::Any.node(device).unwrap(), None);
    assert!(
        Placement::Node(0)
            .node(device)
            .unwrap()
            .is_none_or(|node| node == 0)
    );
    let absent = Placement::Node(4000);
    assert!(absent.node(device).is_err());
    let refused = PinnedBuilder::new(&ctx)
        .placement(absent)
        .zeroed::<u8>(4096);
    let text = refused.unwrap_err().to_string();
    assert!(text.contains("NUMA node 4000 is not online"), "{text}");
    let pool = PinnedPool::builder(&ctx, 1 << 20).placement(absent).build();
    let text = pool.alloc::<u8>(4096).unwrap_err().to_string();
    assert!(text.contains("NUMA node 4000 is not online"), "{text}");
    assert_eq!(pool.stats().reserved, 0);
}
