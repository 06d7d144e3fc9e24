//! A context with a sticky error ends every pending future of it with an `Err`, never a hang: a kernel traps
//! on one stream while futures wait on another stream's flags, an event and a buffer's download. A test binary
//! of its own: on a GPU, the trap leaves the context unusable for the rest of the process. On the simulated
//! driver, also the fallback of a device whose streams cannot write the reactor's flags.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use common::{device, hold, serial};
use cuda_pinned::sys::CUresult;
use cuda_pinned::{DeviceBuffer, Event, LaunchConfig, Pinned, Stream};

/// Polls `future` once, with a waker that does nothing, the thread marked on the simulated driver as an async
/// executor's (a driver call in it that waits for device work is a violation, which fails the test).
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    #[cfg(not(feature = "gpu"))]
    common::sim().unwrap().executor_thread(true);
    let polled = Pin::new(future).poll(&mut TaskContext::from_waker(Waker::noop()));
    #[cfg(not(feature = "gpu"))]
    common::sim().unwrap().executor_thread(false);
    polled
}

/// Polls `future` until it is ready, for up to `limit` (once at least).
fn ready_within<F: Future + Unpin>(future: &mut F, limit: Duration) -> Option<F::Output> {
    let start = Instant::now();
    loop {
        if let Poll::Ready(output) = poll_once(future) {
            return Some(output);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_sticky_error_ends_every_pending_future_with_it() {
    let _serial = serial();
    let ctx = device(0);
    let (busy, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let trap = common::test_kernels(&ctx)
        .unwrap()
        .kernel("trap_now")
        .unwrap();
    let held = hold(&busy, Duration::from_secs(2));
    let dev = DeviceBuffer::<u32>::zeroed(&busy, 1 << 12).unwrap();
    let mut dst = Pinned::<u32>::zeroed(&ctx, 1 << 12).unwrap();
    busy.download(&dev, &mut dst).unwrap();
    let event = Event::without_timing(&ctx).unwrap();
    event.record(&busy).unwrap();
    let mut stream_done = busy.done();
    let mut event_done = event.done();
    let mut readable = dst.readable();
    // The control: while the stream is held and nothing has failed, all of them are pending.
    std::thread::sleep(Duration::from_millis(20));
    assert!(poll_once(&mut stream_done).is_pending());
    assert!(poll_once(&mut event_done).is_pending());
    assert!(poll_once(&mut readable).is_pending());

    // SAFETY: trap_now() takes no parameters and touches no memory.
    unsafe { other.launch(&trap, LaunchConfig::new(1, 1), &[]) }.unwrap();
    let mut trapped = other.done();
    let failed = Some(CUresult::CUDA_ERROR_LAUNCH_FAILED);
    let limit = Duration::from_secs(5);
    for (what, outcome) in [
        (
            "the trapping stream's point",
            ready_within(&mut trapped, limit),
        ),
        (
            "the held stream's point",
            ready_within(&mut stream_done, limit),
        ),
        ("the event", ready_within(&mut event_done, limit)),
        (
            "the download's buffer",
            ready_within(&mut readable, limit).map(|r| r.map(|_| ())),
        ),
    ] {
        let outcome = outcome.unwrap_or_else(|| panic!("{what}: still pending after the trap"));
        let error = outcome.expect_err(what);
        assert_eq!(error.driver_code(), failed, "{what}: {error}");
    }
    // A point taken after the error fails at once.
    let late = ready_within(&mut busy.done(), Duration::ZERO).expect("failed at the call");
    assert_eq!(late.unwrap_err().driver_code(), failed);

    drop(held);
    // What the crate leaks because of the error (the buffers it cannot prove idle) stays leaked; on the
    // simulated driver, the device is reset for the end of the test.
    drop(readable);
    drop((dst, dev, event, busy, other, ctx));
    #[cfg(not(feature = "gpu"))]
    common::sim().unwrap().recover_device(0);
}

/// Where the driver refuses the flag's write (a driver without stream memory operations), a point is an event
/// the reactor queries: still pending while its work is, complete after; and the refusal is remembered, so that
/// later points try no write.
#[cfg(not(feature = "gpu"))]
#[test]
fn refused_writes_fall_back_to_events() {
    let _serial = serial();
    let sim = common::sim().unwrap();
    let _held_sim = sim.exclusive();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    sim.fail("cuStreamWriteValue32_v2:1+:CUDA_ERROR_INVALID_VALUE")
        .unwrap();
    for round in 0..3 {
        sim.trace_start();
        let held = hold(&stream, Duration::from_millis(200));
        let mut done = stream.done();
        assert!(poll_once(&mut done).is_pending(), "round {round}");
        let writes = sim
            .trace_stop()
            .iter()
            .filter(|call| call.contains("cuStreamWriteValue32_v2"))
            .count();
        // The first point tries the write, registers the flags again and tries once more; later ones do not.
        assert_eq!(writes, if round == 0 { 2 } else { 0 }, "round {round}");
        drop(held);
        let outcome = ready_within(&mut done, Duration::from_secs(5)).expect("never completed");
        outcome.unwrap();
        assert!(stream.query().unwrap());
    }
    sim.clear_faults();
}
