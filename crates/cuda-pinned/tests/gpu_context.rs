//! Devices, the primary context, streams and events on a real GPU: every public function, and the errors a user
//! meets (a bad device ordinal, timing an event made without timing).

mod common;

use std::time::Duration;

use common::{serial, spin};
use cuda_pinned::sys::{self, CUresult};
use cuda_pinned::{Context, Device, Event, Stream, driver_call};

fn current_raw() -> sys::CUcontext {
    let mut current = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuCtxGetCurrent(&mut current)) }.unwrap();
    current
}

#[test]
fn devices_report_their_properties() {
    let _serial = serial();
    let count = Device::count().unwrap();
    assert!(count >= 1);
    let all = Device::all().unwrap();
    assert_eq!(all.len(), count);
    let d = Device::get(0).unwrap();
    assert_eq!(d, all[0]);
    assert_eq!(d.ordinal(), 0);
    let name = d.name().unwrap();
    let (major, minor) = d.compute_capability().unwrap();
    let total = d.total_memory().unwrap();
    let free = d.free_memory().unwrap();
    let bus = d.pci_bus_id().unwrap();
    let uuid = d.uuid().unwrap();
    println!(
        "{name}: cc {major}.{minor}, {total} bytes ({free} free), PCI {bus}, {} copy engines, maps host memory: {}, \
         memory pools: {}",
        d.async_engine_count().unwrap(),
        d.can_map_host_memory().unwrap(),
        d.supports_memory_pools().unwrap()
    );
    assert!(!name.is_empty());
    assert!(major >= 7);
    assert!(total > 1 << 30 && free <= total && free > 0);
    // domain:bus:device.function, hexadecimal
    let parts: Vec<&str> = bus.split([':', '.']).collect();
    assert_eq!(parts.len(), 4, "{bus}");
    assert!(
        parts.iter().all(|p| u32::from_str_radix(p, 16).is_ok()),
        "{bus}"
    );
    assert_ne!(uuid, [0; 16]);
    assert!(d.async_engine_count().unwrap() >= 1);
    let raw = d
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .unwrap();
    assert_eq!(raw, major);
    assert_eq!(format!("{d:?}"), "Device(0)");
}

#[test]
fn a_bad_ordinal_is_an_error_saying_how_many_devices_there_are() {
    let _serial = serial();
    let count = Device::count().unwrap();
    let e = Device::get(count + 1000).unwrap_err();
    assert_eq!(
        e.driver_code(),
        Some(CUresult::CUDA_ERROR_INVALID_DEVICE),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "getting device {} (the machine has {count} CUDA devices)",
            count + 1000
        )),
        "{text}"
    );
    assert!(Context::on(count + 1000).is_err());
    // An unknown attribute is an error too, not a garbage value.
    assert!(
        Device::get(0)
            .unwrap()
            .attribute(sys::CUdevice_attribute(1_000_000))
            .is_err()
    );
}

#[test]
fn the_primary_context_is_shared_and_the_threads_context_is_put_back() {
    let _serial = serial();
    let a = Context::on(0).unwrap();
    let b = Context::new(Device::get(0).unwrap()).unwrap();
    assert_eq!(a, b, "both are the device's primary context");
    assert_eq!(a.device(), Device::get(0).unwrap());
    // A thread with no current context keeps none after the crate's calls.
    std::thread::spawn(move || {
        assert!(current_raw().is_null());
        a.synchronize().unwrap();
        let (free, total) = a.memory_info().unwrap();
        assert!(free <= total);
        let (least, greatest) = a.stream_priority_range().unwrap();
        assert!(greatest <= least);
        let s = Stream::new(&a).unwrap();
        s.synchronize().unwrap();
        assert!(
            current_raw().is_null(),
            "the crate left its context current"
        );
        // A thread whose current context is this one keeps it.
        // SAFETY: a context retained by `a`, which lives to the end of the closure.
        unsafe { driver_call!(cuCtxSetCurrent(a.as_raw())) }.unwrap();
        a.synchronize().unwrap();
        assert_eq!(current_raw(), a.as_raw());
        // SAFETY: unbinding the thread's context.
        unsafe { driver_call!(cuCtxSetCurrent(std::ptr::null_mut())) }.unwrap();
        a.check_deferred_errors().unwrap();
    })
    .join()
    .unwrap();
    b.synchronize().unwrap();
}

#[test]
fn streams_query_wait_and_synchronize() {
    let _serial = serial();
    let ctx = Context::on(0).unwrap();
    let (least, greatest) = ctx.stream_priority_range().unwrap();
    let high = Stream::with_priority(&ctx, greatest).unwrap();
    assert_eq!(high.priority().unwrap(), greatest);
    assert_eq!(
        Stream::new(&ctx).unwrap().priority().unwrap(),
        0.clamp(greatest, least)
    );
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    assert_ne!(a, b);
    assert_eq!(a.clone(), a);
    assert_eq!(a.context(), &ctx);
    assert!(a.query().unwrap(), "a new stream is idle");

    let done_a = Event::without_timing(&ctx).unwrap();
    spin(&a, 100);
    a.record(&done_a).unwrap();
    assert!(
        !a.query().unwrap(),
        "a stream running a 100 ms kernel is busy"
    );
    // b waits for a on the device: the host call returns at once, and b is busy until a is done.
    b.wait(&done_a).unwrap();
    let done_b = Event::without_timing(&ctx).unwrap();
    done_b.record(&b).unwrap();
    assert!(
        !done_b.query().unwrap(),
        "b finished before the event it waits for"
    );
    b.synchronize().unwrap();
    assert!(
        done_a.query().unwrap(),
        "b's work completed before a's event"
    );
    a.synchronize().unwrap();
    assert!(a.query().unwrap());
}

#[test]
fn events_time_work_and_refuse_to_time_without_timing() {
    let _serial = serial();
    let ctx = Context::on(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (start, end) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    assert_eq!(start.context(), &ctx);
    start.record(&stream).unwrap();
    spin(&stream, 10);
    end.record(&stream).unwrap();
    assert!(!end.query().unwrap());
    assert_eq!(
        end.elapsed_since(&start).unwrap_err().driver_code(),
        Some(CUresult::CUDA_ERROR_NOT_READY),
        "timing before completion is an error"
    );
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    let took = end.elapsed_since(&start).unwrap();
    println!("10 ms spin timed {took:?}");
    assert!(
        took >= Duration::from_micros(9_990) && took < Duration::from_secs(1),
        "{took:?}"
    );

    let untimed = Event::without_timing(&ctx).unwrap();
    untimed.record(&stream).unwrap();
    untimed.synchronize().unwrap();
    assert!(untimed.elapsed_since(&start).is_err());
}

#[test]
fn a_borrowed_stream_is_not_destroyed() {
    let _serial = serial();
    let ctx = Context::on(0).unwrap();
    let _current = ContextGuard::set(&ctx);
    let mut raw = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; destroyed at the end of this test.
    unsafe { driver_call!(cuStreamCreate(&mut raw, 1)) }.unwrap();
    // SAFETY: `raw` is a stream of `ctx`, destroyed only after the wrapper and its clones are gone.
    let wrapped = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
    assert_eq!(wrapped.as_raw(), raw);
    spin(&wrapped, 1);
    wrapped.synchronize().unwrap();
    drop(wrapped);
    // SAFETY: still a live stream: the wrapper did not destroy it.
    unsafe {
        driver_call!(cuStreamQuery(raw)).unwrap();
        driver_call!(cuStreamDestroy_v2(raw)).unwrap();
    }
}

#[test]
fn the_null_legacy_and_per_thread_streams_are_refused() {
    let _serial = serial();
    let ctx = Context::on(0).unwrap();
    // cuda.h: the null stream, CU_STREAM_LEGACY ((CUstream)0x1) and CU_STREAM_PER_THREAD ((CUstream)0x2).
    for raw in [0usize, 1, 2] {
        // SAFETY: refused before anything uses the handle.
        let e = unsafe { Stream::from_raw(&ctx, raw as cuda_pinned::sys::CUstream) }.unwrap_err();
        assert!(
            e.to_string()
                .contains("CU_STREAM_LEGACY or CU_STREAM_PER_THREAD"),
            "{e}"
        );
    }
}

/// Makes a context current for raw driver calls in a test, unbinding it at the end.
struct ContextGuard;

impl ContextGuard {
    fn set(ctx: &Context) -> ContextGuard {
        // SAFETY: a retained context, which the test holds past the guard.
        unsafe { driver_call!(cuCtxSetCurrent(ctx.as_raw())) }.unwrap();
        ContextGuard
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        // SAFETY: unbinding the thread's context.
        unsafe { driver_call!(cuCtxSetCurrent(std::ptr::null_mut())) }.unwrap();
    }
}
