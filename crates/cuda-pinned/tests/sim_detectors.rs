//! The simulated driver's detectors, shown the bad patterns directly through raw driver calls, each beside its
//! control (the right pattern, which it must not report):
//!
//! - a *hidden wait*: a call that synchronizes the whole device (`cuMemFreeHost`, `cuMemHostUnregister`,
//!   `cuMemFree_v2`), made on any thread while work that does not touch the memory it releases is queued (the
//!   driver holds back every other thread's calls while it waits, so the crate's own threads are no
//!   exception). The simulator's calls wait as the driver's do, and report it. Explicit waits
//!   (`cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`) are never reported.
//! - a *false dependency*: a stream made to wait for an event whose last work does not touch the memory the
//!   stream's next operation uses (an event recorded late, after unrelated work), while the crate's right
//!   patterns pass: two views of one allocation read on two streams, a stream-ordered free after waits for
//!   every use, a wait followed by a copy of that buffer, a wait followed by a host function or an allocation.
//! - an event of one context recorded on another context's stream, which the driver refuses (a wait across
//!   devices it allows).
//!
//! These tests use raw driver calls and no crate memory, so they report the simulator's behaviour alone. The
//! simulator runs two devices here (`CUDA_SIM_DEVICES=2`, set before it starts). Only without feature `gpu`.
#![cfg(not(feature = "gpu"))]

mod common;

use std::ffi::c_void;
use std::sync::Once;
use std::time::{Duration, Instant};

use common::Serial;
use cuda_pinned::sys::{CUdeviceptr, CUevent, CUresult, CUstream};
use cuda_pinned::{Context, Result, driver_call};

/// How long the work a call must not wait for keeps a stream busy.
const BUSY: Duration = Duration::from_millis(200);

/// [`common::serial`], with the simulator set to two devices before anything loads it.
fn serial() -> Serial {
    static DEVICES: Once = Once::new();
    DEVICES.call_once(|| {
        // SAFETY: every test of this binary calls this function first, and this runs inside its Once, so no
        // other thread of the test reads the environment while it is written; the harness's own threads read
        // it only at start-up.
        unsafe { std::env::set_var("CUDA_SIM_DEVICES", "2") };
    });
    common::serial()
}

/// Raw driver objects of one device's primary context, made current on the test thread while it lives. Its
/// `finish` waits for the device, then releases what is left, so that the tests' own clean-up waits for
/// nothing.
struct Raw {
    context: Context,
    streams: Vec<CUstream>,
    events: Vec<CUevent>,
    pinned: Vec<*mut c_void>,
    device: Vec<CUdeviceptr>,
}

impl Raw {
    fn on(ordinal: usize) -> Raw {
        let context = Context::on(ordinal).unwrap();
        // SAFETY: a context the Context keeps retained; popped in `finish`.
        unsafe { driver_call!(cuCtxPushCurrent_v2(context.as_raw())) }.unwrap();
        Raw {
            context,
            streams: Vec::new(),
            events: Vec::new(),
            pinned: Vec::new(),
            device: Vec::new(),
        }
    }

    fn stream(&mut self) -> CUstream {
        let mut stream = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the context is current.
        unsafe { driver_call!(cuStreamCreate(&mut stream, 0)) }.unwrap();
        self.streams.push(stream);
        stream
    }

    fn event(&mut self) -> CUevent {
        let mut event = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the context is current.
        unsafe { driver_call!(cuEventCreate(&mut event, 0)) }.unwrap();
        self.events.push(event);
        event
    }

    /// Pinned host memory, released by `finish` unless the test releases it (and says so with `forget`).
    fn pinned(&mut self, bytes: usize) -> *mut c_void {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the context is current.
        unsafe { driver_call!(cuMemHostAlloc(&mut p, bytes, 0)) }.unwrap();
        self.pinned.push(p);
        p
    }

    /// Device memory (`cuMemAlloc_v2`), released by `finish` unless the test releases it (and says so with
    /// `forget_device`).
    fn device(&mut self, bytes: usize) -> CUdeviceptr {
        let mut d = 0;
        // SAFETY: an out-pointer to a local; the context is current.
        unsafe { driver_call!(cuMemAlloc_v2(&mut d, bytes)) }.unwrap();
        self.device.push(d);
        d
    }

    fn forget(&mut self, p: *mut c_void) {
        self.pinned.retain(|&q| q != p);
    }

    fn forget_device(&mut self, d: CUdeviceptr) {
        self.device.retain(|&e| e != d);
    }

    /// Waits for the device, then releases everything left.
    fn finish(self) {
        // SAFETY: every handle below was made by this Raw and is released once; the device is idle first, so
        // nothing queued uses them.
        unsafe {
            driver_call!(cuCtxSynchronize()).unwrap();
            for p in self.pinned {
                driver_call!(cuMemFreeHost(p)).unwrap();
            }
            for d in self.device {
                driver_call!(cuMemFree_v2(d)).unwrap();
            }
            for e in self.events {
                driver_call!(cuEventDestroy_v2(e)).unwrap();
            }
            for s in self.streams {
                driver_call!(cuStreamDestroy_v2(s)).unwrap();
            }
            driver_call!(cuCtxPopCurrent_v2(std::ptr::null_mut())).unwrap();
        }
        drop(self.context);
    }
}

/// Queues on `stream` a host function that sleeps for `duration`: work that touches no memory.
fn sleep_on(stream: CUstream, duration: Duration) {
    /// # Safety
    /// The argument is a number of microseconds, never dereferenced.
    unsafe extern "C" fn sleep(us: *mut c_void) {
        std::thread::sleep(Duration::from_micros(us as u64));
    }
    let us = duration.as_micros() as usize;
    // SAFETY: a live stream; the host function makes no CUDA call and reads nothing through its argument.
    unsafe { driver_call!(cuLaunchHostFunc(stream, Some(sleep), us as *mut c_void)) }.unwrap();
}

/// Queues on `stream` a host function that does nothing.
fn nothing_on(stream: CUstream) {
    /// # Safety
    /// None: it does nothing.
    unsafe extern "C" fn nothing(_: *mut c_void) {}
    // SAFETY: a live stream; the host function makes no CUDA call.
    unsafe {
        driver_call!(cuLaunchHostFunc(
            stream,
            Some(nothing),
            std::ptr::null_mut()
        ))
    }
    .unwrap();
}

/// Queues a copy of `bytes` from pinned `src` to device `dst` on `stream`.
fn upload(dst: CUdeviceptr, src: *mut c_void, bytes: usize, stream: CUstream) {
    // SAFETY: both hold `bytes` (the tests allocate at least that) and stay allocated until the stream has run
    // the copy (the tests release them only after a synchronize, or report the release as a violation).
    unsafe { driver_call!(cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)) }.unwrap();
}

/// Queues a copy of `bytes` from device `src` to pinned `dst` on `stream`.
fn download(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream) {
    // SAFETY: as for `upload`.
    unsafe { driver_call!(cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)) }.unwrap();
}

fn record(event: CUevent, stream: CUstream) -> Result<()> {
    // SAFETY: a live event and stream.
    unsafe { driver_call!(cuEventRecord(event, stream)) }
}

fn wait(stream: CUstream, event: CUevent) -> Result<()> {
    // SAFETY: a live stream and event.
    unsafe { driver_call!(cuStreamWaitEvent(stream, event, 0)) }
}

fn free_host(p: *mut c_void) {
    // SAFETY: pinned memory of the test's, released once (the test forgets it in its Raw).
    unsafe { driver_call!(cuMemFreeHost(p)) }.unwrap();
}

/// Runs `f` and returns how long it took.
fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// Panics unless `violations` is one message starting with `start` and containing each of `parts`.
fn one(violations: &[String], start: &str, parts: &[&str]) {
    assert_eq!(
        violations.len(),
        1,
        "one violation expected: {violations:#?}"
    );
    let v = &violations[0];
    assert!(v.starts_with(start), "{v}");
    for part in parts {
        assert!(v.contains(part), "{v:?} does not say {part:?}");
    }
}

// ---- hidden waits

#[test]
fn freeing_pinned_memory_on_a_users_thread_while_other_work_is_queued_is_a_hidden_wait() {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let b = raw.stream();
    let p = raw.pinned(4096);
    sleep_on(b, BUSY);
    raw.forget(p);
    let took = timed(|| free_host(p));
    assert!(
        took >= BUSY / 2,
        "cuMemFreeHost returns once the device's queued work has finished, as the driver's does; it took {took:?}"
    );
    one(
        &serial.take_violations(),
        &format!(
            "HIDDEN WAIT: cuMemFreeHost waited for 1 queued operation on stream {b:p} (a host function)"
        ),
        &[
            "; called from sim_detectors::",
            "(tests/sim_detectors.rs:",
            "not through cuda_pinned",
        ],
    );
    raw.finish();
}

#[test]
fn every_device_wide_release_is_a_hidden_wait_on_a_users_thread() {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let b = raw.stream();

    sleep_on(b, BUSY);
    let d = raw.device(4096);
    raw.forget_device(d);
    // SAFETY: device memory of this test's, released once.
    let took = timed(|| unsafe { driver_call!(cuMemFree_v2(d)) }.unwrap());
    assert!(took >= BUSY / 2, "cuMemFree_v2 took {took:?}");
    one(
        &serial.take_violations(),
        "HIDDEN WAIT: cuMemFree_v2 waited for 1 queued operation",
        &["a host function"],
    );

    let mut memory = vec![0u8; 8192];
    let host = memory.as_mut_ptr().cast::<c_void>();
    // SAFETY: `memory` outlives the registration, which is undone below.
    unsafe { driver_call!(cuMemHostRegister_v2(host, memory.len(), 0)) }.unwrap();
    sleep_on(b, BUSY);
    nothing_on(b);
    // SAFETY: registered above; nothing queued uses it.
    let took = timed(|| unsafe { driver_call!(cuMemHostUnregister(host)) }.unwrap());
    assert!(took >= BUSY / 2, "cuMemHostUnregister took {took:?}");
    one(
        &serial.take_violations(),
        "HIDDEN WAIT: cuMemHostUnregister waited for 2 queued operations",
        &["(a host function, a host function)"],
    );
    raw.finish();
}

#[test]
fn the_crates_own_threads_are_no_exception() {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let b = raw.stream();
    let p = raw.pinned(4096) as usize;
    sleep_on(b, BUSY);
    raw.forget(p as *mut c_void);
    let took = std::thread::Builder::new()
        .name("cuda-pinned-release".into())
        .spawn(move || timed(|| free_host(p as *mut c_void)))
        .unwrap()
        .join()
        .unwrap();
    assert!(took >= BUSY / 2, "it waits as the driver does: {took:?}");
    one(
        &serial.take_violations(),
        "HIDDEN WAIT: cuMemFreeHost waited for 1 queued operation",
        &["(a host function)"],
    );
    raw.finish();
}

#[test]
fn a_release_on_an_idle_device_and_explicit_waits_are_no_hidden_waits() {
    let mut serial = serial();
    let mut raw = Raw::on(0);
    let (b, e) = (raw.stream(), raw.event());
    // The control of the tests above: nothing queued.
    let p = raw.pinned(4096);
    raw.forget(p);
    free_host(p);
    // Waits that name what they wait for.
    sleep_on(b, Duration::from_millis(20));
    // SAFETY: a live stream.
    unsafe { driver_call!(cuStreamSynchronize(b)) }.unwrap();
    sleep_on(b, Duration::from_millis(20));
    record(e, b).unwrap();
    // SAFETY: a live event.
    unsafe { driver_call!(cuEventSynchronize(e)) }.unwrap();
    sleep_on(b, Duration::from_millis(20));
    // SAFETY: the context is current.
    unsafe { driver_call!(cuCtxSynchronize()) }.unwrap();
    assert_eq!(serial.take_violations(), Vec::<String>::new());
    raw.finish();
}

#[test]
fn memory_freed_under_queued_work_is_still_reported_at_the_call() {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let b = raw.stream();
    let (p, d) = (raw.pinned(4096), raw.device(4096));
    sleep_on(b, Duration::from_millis(50));
    upload(d, p, 4096, b);
    raw.forget(p);
    free_host(p);
    // The release waited for the device, so the copy ran before it: no use after free, but the call is
    // reported, and the next driver call fails as for every violation of memory.
    // SAFETY: the context is current.
    let next = unsafe { driver_call!(cuCtxSynchronize()) };
    assert_eq!(
        next.unwrap_err().driver_code(),
        Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
    );
    let violations = serial.take_violations();
    assert_eq!(violations.len(), 2, "{violations:#?}");
    assert!(
        violations[0].starts_with(&format!(
            "cuMemFreeHost freed pinned host memory at {p:p} (4096 bytes) while queued work still uses it: a \
             copy of 4096 bytes on stream {b:p}"
        )),
        "{violations:#?}"
    );
    // The copy that uses the memory is not counted as a wait for unrelated work; the sleep before it is.
    assert!(
        violations[1]
            .starts_with("HIDDEN WAIT: cuMemFreeHost waited for 1 queued operation on stream"),
        "{violations:#?}"
    );
    raw.finish();
}

/// What the suite does with a hidden wait nobody expected: `Serial` fails the test that made it.
#[test]
#[should_panic(expected = "HIDDEN WAIT: cuMemFreeHost")]
fn an_unexpected_hidden_wait_fails_the_test() {
    let mut serial = serial();
    // Not printed as it happens: the test's panic (which `should_panic` expects) lists it.
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let b = raw.stream();
    let p = raw.pinned(64);
    sleep_on(b, Duration::from_millis(20));
    raw.forget(p);
    free_host(p);
    raw.finish();
}

// ---- false dependencies

/// Stream `b` copies pinned memory into `x` after a short sleep (so that its work is still queued when `a`
/// waits), then, with `late`, sleeps before recording `e`, else records `e` right after the copy (and sleeps
/// after). Then `a` waits for `e` and copies into `x`. The violations.
fn wait_then_copy_into_the_buffer(late: bool) -> Vec<String> {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let (a, b, e) = (raw.stream(), raw.stream(), raw.event());
    let (p, q, x) = (raw.pinned(4096), raw.pinned(4096), raw.device(4096));
    sleep_on(b, Duration::from_millis(50));
    upload(x, p, 4096, b);
    if late {
        sleep_on(b, BUSY);
        record(e, b).unwrap();
    } else {
        record(e, b).unwrap();
        sleep_on(b, BUSY);
    }
    wait(a, e).unwrap();
    upload(x, q, 4096, a);
    raw.finish();
    serial.take_violations()
}

#[test]
fn an_event_recorded_after_unrelated_work_is_a_false_dependency() {
    let violations = wait_then_copy_into_the_buffer(true);
    one(
        &violations,
        "FALSE DEPENDENCY: stream 0x",
        &[
            "waited for a host function on stream 0x",
            "which touches none of device memory 0xd",
            ", pinned host memory 0x",
            "that a copy of 4096 bytes uses; the wait was called from sim_detectors::wait \
             (tests/sim_detectors.rs:",
            "not through cuda_pinned; the operation was called from sim_detectors::upload",
        ],
    );
}

/// A wait the user asks for through the crate (`Stream::wait`) orders what the user says, whatever follows:
/// not judged. (Through a raw call, as above, the simulator cannot tell who asked, and judges it.)
#[test]
fn a_users_own_wait_through_the_crate_is_not_judged() {
    let mut serial = serial();
    let mut raw = Raw::on(0);
    let (a, b) = (
        cuda_pinned::Stream::new(&raw.context).unwrap(),
        cuda_pinned::Stream::new(&raw.context).unwrap(),
    );
    let event = cuda_pinned::Event::without_timing(&raw.context).unwrap();
    let (p, x, y) = (raw.pinned(4096), raw.device(4096), raw.device(4096));
    upload(x, p, 4096, b.as_raw());
    sleep_on(b.as_raw(), BUSY);
    event.record(&b).unwrap();
    a.wait(&event).unwrap();
    upload(y, p, 4096, a.as_raw());
    raw.finish();
    drop((a, b, event));
    assert_eq!(serial.take_violations(), Vec::<String>::new());
}

#[test]
fn an_event_recorded_right_after_the_work_is_no_false_dependency() {
    assert_eq!(wait_then_copy_into_the_buffer(false), Vec::<String>::new());
}

#[test]
fn two_views_of_one_allocation_read_on_two_streams_then_written() {
    let mut serial = serial();
    let mut raw = Raw::on(0);
    let (a, b, c) = (raw.stream(), raw.stream(), raw.stream());
    let (e1, e2) = (raw.event(), raw.event());
    let (p1, p2, p3) = (raw.pinned(2048), raw.pinned(2048), raw.pinned(4096));
    let x = raw.device(4096);
    sleep_on(b, Duration::from_millis(50));
    download(p1, x, 2048, b);
    record(e1, b).unwrap();
    sleep_on(c, Duration::from_millis(50));
    download(p2, x + 2048, 2048, c);
    record(e2, c).unwrap();
    wait(a, e1).unwrap();
    wait(a, e2).unwrap();
    upload(x, p3, 4096, a);
    raw.finish();
    assert_eq!(serial.take_violations(), Vec::<String>::new());
}

#[test]
fn a_stream_ordered_free_after_waits_for_every_use() {
    let mut serial = serial();
    let mut raw = Raw::on(0);
    let (a, b, c) = (raw.stream(), raw.stream(), raw.stream());
    let (e1, e2) = (raw.event(), raw.event());
    let (p1, p2) = (raw.pinned(4096), raw.pinned(4096));
    let mut x: CUdeviceptr = 0;
    // SAFETY: an out-pointer to a local; a live stream.
    unsafe { driver_call!(cuMemAllocAsync(&mut x, 4096, a)) }.unwrap();
    // SAFETY: a live stream.
    unsafe { driver_call!(cuStreamSynchronize(a)) }.unwrap();
    sleep_on(b, Duration::from_millis(50));
    download(p1, x, 4096, b);
    record(e1, b).unwrap();
    sleep_on(c, Duration::from_millis(50));
    download(p2, x, 4096, c);
    record(e2, c).unwrap();
    wait(a, e1).unwrap();
    wait(a, e2).unwrap();
    // SAFETY: `a` waits for both uses of `x` above; freed once.
    unsafe { driver_call!(cuMemFreeAsync(x, a)) }.unwrap();
    raw.finish();
    assert_eq!(serial.take_violations(), Vec::<String>::new());
}

#[test]
fn a_wait_before_a_host_function_or_an_allocation_is_judged_by_the_memory_work_after() {
    let mut serial = serial();
    serial.expect_violations();
    let mut raw = Raw::on(0);
    let (a, b, e) = (raw.stream(), raw.stream(), raw.event());
    let (p, x, y) = (raw.pinned(4096), raw.device(4096), raw.device(4096));

    // A host function may touch anything: the wait before it is forgotten, unjudged.
    sleep_on(b, Duration::from_millis(50));
    upload(x, p, 4096, b);
    record(e, b).unwrap();
    wait(a, e).unwrap();
    nothing_on(a);
    upload(y, p, 4096, a);
    assert_eq!(serial.take_violations(), Vec::<String>::new());

    // An allocation needs no earlier work: the copy after it is what the wait is judged by, here rightly.
    sleep_on(b, Duration::from_millis(50));
    upload(x, p, 4096, b);
    record(e, b).unwrap();
    wait(a, e).unwrap();
    let mut z: CUdeviceptr = 0;
    // SAFETY: an out-pointer to a local; a live stream.
    unsafe { driver_call!(cuMemAllocAsync(&mut z, 4096, a)) }.unwrap();
    download(p, x, 4096, a);
    assert_eq!(serial.take_violations(), Vec::<String>::new());

    // ... and here wrongly: the copy after the allocation does not touch what the awaited copy touches.
    sleep_on(b, Duration::from_millis(50));
    upload(x, p, 4096, b);
    record(e, b).unwrap();
    wait(a, e).unwrap();
    // SAFETY: freed once, on the stream that allocated it, after everything that used it there.
    unsafe { driver_call!(cuMemFreeAsync(z, a)) }.unwrap();
    one(
        &serial.take_violations(),
        "FALSE DEPENDENCY: stream",
        &[
            "waited for a copy of 4096 bytes (device memory 0xd",
            "which touches none of stream-ordered device memory 0xd",
            "that a stream-ordered free uses",
        ],
    );
    raw.finish();
}

#[test]
fn a_wait_for_finished_work_or_on_the_same_stream_costs_nothing() {
    let mut serial = serial();
    let mut raw = Raw::on(0);
    let (a, b, e) = (raw.stream(), raw.stream(), raw.event());
    let (p, x, y) = (raw.pinned(4096), raw.device(4096), raw.device(4096));
    upload(x, p, 4096, b);
    sleep_on(b, Duration::from_millis(20));
    record(e, b).unwrap();
    // SAFETY: a live event.
    unsafe { driver_call!(cuEventSynchronize(e)) }.unwrap();
    wait(a, e).unwrap();
    upload(y, p, 4096, a);
    // On its own stream an event orders nothing new.
    sleep_on(a, Duration::from_millis(20));
    record(e, a).unwrap();
    wait(a, e).unwrap();
    upload(y, p, 4096, a);
    raw.finish();
    assert_eq!(serial.take_violations(), Vec::<String>::new());
}

// ---- contexts

#[test]
fn an_event_of_one_context_is_recorded_only_on_its_streams() {
    let mut serial = serial();
    let mut zero = Raw::on(0);
    let s0 = zero.stream();
    let one_ctx = Context::on(1).unwrap();
    // The event and a stream of device 1, made with its context current.
    // SAFETY: a retained context, popped below.
    unsafe { driver_call!(cuCtxPushCurrent_v2(one_ctx.as_raw())) }.unwrap();
    let (mut e1, mut s1) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: out-pointers to locals; the context is current.
    unsafe { driver_call!(cuEventCreate(&mut e1, 0)) }.unwrap();
    // SAFETY: as above.
    unsafe { driver_call!(cuStreamCreate(&mut s1, 0)) }.unwrap();
    // SAFETY: pushed above.
    unsafe { driver_call!(cuCtxPopCurrent_v2(std::ptr::null_mut())) }.unwrap();

    assert_eq!(
        record(e1, s0).unwrap_err().driver_code(),
        Some(CUresult::CUDA_ERROR_INVALID_HANDLE),
        "an event of device 1 recorded on a stream of device 0"
    );
    // Device 0's context is current: its null stream is not the event's either.
    assert_eq!(
        record(e1, std::ptr::null_mut()).unwrap_err().driver_code(),
        Some(CUresult::CUDA_ERROR_INVALID_HANDLE),
        "an event of device 1 recorded on device 0's null stream"
    );
    record(e1, s1).unwrap();
    // A stream may wait for an event of another device.
    wait(s0, e1).unwrap();

    // The same through the crate.
    let stream0 = cuda_pinned::Stream::new(&zero.context).unwrap();
    let event1 = cuda_pinned::Event::new(&one_ctx).unwrap();
    let refused = event1.record(&stream0).unwrap_err();
    assert_eq!(
        refused.driver_code(),
        Some(CUresult::CUDA_ERROR_INVALID_HANDLE),
        "{refused}"
    );
    stream0.wait(&event1).unwrap();

    // SAFETY: made above, released once.
    unsafe {
        driver_call!(cuEventSynchronize(e1)).unwrap();
        driver_call!(cuEventDestroy_v2(e1)).unwrap();
        driver_call!(cuStreamDestroy_v2(s1)).unwrap();
    }
    drop((stream0, event1, one_ctx));
    zero.finish();
    assert_eq!(serial.take_violations(), Vec::<String>::new());
}
