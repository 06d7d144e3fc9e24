//! Futures of device work (`Stream::done`, `Event::done`, `Pinned::readable` / `writable`): a future never
//! completes before its work (checked by the driver's queries and by data), a point is taken when the future is
//! made, dropped and forgotten futures leak at most themselves, and many pending futures are served by the one
//! reactor, on a minimal executor of this file (one thread, parked between wakes) and on tokio. The simulated
//! driver runs two devices here (one test awaits both); on a GPU, that test needs two.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{LIMIT, SplitMix64, device, device_count, hold, on_a_thread, serial_on_two_devices};
use cuda_pinned::{DeviceBuffer, Error, Event, Pinned, PinnedPool, Prefetcher, Stream, WhenFull};

/// Runs `future` to completion on the calling thread, which sleeps (parked) until the future's waker wakes it,
/// and polls again only after a wake: a future that returns `Pending` and is never woken fails the test (after
/// [`LIMIT`]) rather than being rescued by a later poll.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark {
        thread: std::thread::Thread,
        woken: std::sync::atomic::AtomicBool,
    }
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.woken.store(true, std::sync::atomic::Ordering::Release);
            self.thread.unpark();
        }
    }
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        woken: std::sync::atomic::AtomicBool::new(false),
    });
    let waker = Waker::from(unpark.clone());
    let mut cx = TaskContext::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        let polled = as_executor(|| future.as_mut().poll(&mut cx));
        if let Poll::Ready(output) = polled {
            return output;
        }
        let asleep = Instant::now();
        // Parking may end spuriously: only a wake lets the loop poll again.
        while !unpark
            .woken
            .swap(false, std::sync::atomic::Ordering::Acquire)
        {
            assert!(asleep.elapsed() < LIMIT, "a future was never woken");
            std::thread::park_timeout(LIMIT);
        }
    }
}

/// Runs `f` with the calling thread marked, on the simulated driver, as an async executor's: a driver call
/// in it that waits for device work is a violation (`BLOCKED EXECUTOR`), which fails the test.
fn as_executor<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(not(feature = "gpu"))]
    common::sim().unwrap().executor_thread(true);
    let result = f();
    #[cfg(not(feature = "gpu"))]
    common::sim().unwrap().executor_thread(false);
    result
}

/// Polls `future` once, with a waker that does nothing.
fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    as_executor(|| std::pin::Pin::new(future).poll(&mut TaskContext::from_waker(Waker::noop())))
}

#[test]
fn a_stream_point_completes_once_the_work_before_it_has_and_not_before() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    // The control: a point taken before the stream is held completes while it is held.
    let before = stream.done();
    let held = hold(&stream, Duration::from_secs(2));
    let event = Event::without_timing(&ctx).unwrap();
    event.record(&stream).unwrap();
    let mut after = stream.done();
    let mut event_done = event.done();
    block_on(before).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        poll_once(&mut after).is_pending(),
        "completed before the work queued before it"
    );
    assert!(poll_once(&mut event_done).is_pending());
    assert!(!stream.query().unwrap() && !event.query().unwrap());
    drop(held);
    block_on(after).unwrap();
    assert!(
        event.query().unwrap(),
        "the work queued before the point had not completed"
    );
    block_on(event_done).unwrap();
}

#[test]
fn a_completed_future_gives_its_outcome_again_and_spinning_answers_too() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    // Work that ends during the first poll's spin: that poll answers. The control: without the spin, the
    // first poll is pending.
    for spin in [false, true] {
        let held = hold(&stream, Duration::from_millis(300));
        let mut done = stream.done();
        if spin {
            done = done.spin_for(LIMIT);
        }
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(held);
        });
        let first = poll_once(&mut done);
        assert_eq!(first.is_ready(), spin, "spinning: {spin}");
        release.join().unwrap();
        block_on(&mut done).unwrap();
        assert!(matches!(poll_once(&mut done), Poll::Ready(Ok(()))));
    }
    // An event never recorded is complete, as the driver's query says.
    block_on(Event::without_timing(&ctx).unwrap().done()).unwrap();
}

/// Random rounds of upload and download on two streams, awaited: `readable` gives the downloaded data, and a
/// stream's `done` is never answered before the driver's query says its work is complete.
#[test]
fn awaited_accessors_see_the_work_complete_and_the_data_right() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let (up, down) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut rng = SplitMix64(0xF0_7E5);
    for round in 0..60 {
        let len = 1 + rng.below(1 << 14);
        let data = rng.values(len);
        let mut src = Pinned::from_slice(&ctx, &data).unwrap();
        let mut dev = DeviceBuffer::<u32>::uninit(&up, len).unwrap();
        let mut dst = Pinned::<u32>::zeroed(&ctx, len).unwrap();
        let held = (round % 3 == 0).then(|| hold(&up, Duration::from_millis(300)));
        up.upload(&src, &mut dev).unwrap();
        down.download(&dev, &mut dst).unwrap();
        let downloaded = Event::without_timing(&ctx).unwrap();
        downloaded.record(&down).unwrap();
        let down_done = down.done();
        // Writing the source waits for the upload that reads it.
        let mut writable = src.writable();
        if held.is_some() {
            assert!(poll_once(&mut writable).is_pending(), "round {round}");
        }
        drop(held);
        block_on(writable).unwrap().fill(7);
        block_on(down_done).unwrap();
        // The work before the point is complete, and the buffer's own tracking says so without waiting.
        assert!(
            downloaded.query().unwrap() && dst.try_as_slice().unwrap().is_some(),
            "round {round}: a stream's future completed before its work"
        );
        let got = block_on(dst.readable()).unwrap();
        common::compare(got, &data, &format!("round {round}")).unwrap();
    }
}

#[test]
fn many_tasks_on_tokio_each_awaiting_its_own_work() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let streams: Vec<Stream> = (0..8).map(|_| Stream::new(&ctx).unwrap()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| {
            #[cfg(not(feature = "gpu"))]
            common::sim().unwrap().executor_thread(true);
        })
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..200u64)
        .map(|i| {
            let stream = streams[i as usize % streams.len()].clone();
            let ctx = ctx.clone();
            runtime.spawn(async move {
                let data = SplitMix64(i).values(1000 + i as usize);
                let src = Pinned::from_slice(&ctx, &data)?;
                let mut dev = DeviceBuffer::<u32>::uninit(&stream, data.len())?;
                let mut dst = Pinned::<u32>::zeroed(&ctx, data.len())?;
                stream.upload(&src, &mut dev)?;
                stream.download(&dev, &mut dst)?;
                stream.done().await?;
                let got = dst.readable().await?;
                Ok::<bool, cuda_pinned::Error>(got == data.as_slice())
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let right = runtime.block_on(task).unwrap().unwrap();
        assert!(right, "task {i} read wrong data");
    }
}

/// Ten thousand futures pending at once, all served by the one reactor: a thousand stream points over ten
/// streams held busy (a device takes only so many operations queued behind running kernels before the driver
/// makes the next enqueue wait), and nine thousand futures of a hundred events recorded among them.
#[test]
fn ten_thousand_futures_pending_at_once_all_complete() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let streams: Vec<Stream> = (0..10).map(|_| Stream::new(&ctx).unwrap()).collect();
    let held: Vec<_> = streams
        .iter()
        .map(|s| hold(s, Duration::from_secs(5)))
        .collect();
    let mut pending: Vec<_> = (0..1000)
        .map(|i| streams[i % streams.len()].done())
        .collect();
    let events: Vec<Event> = (0..100)
        .map(|i| {
            let event = Event::without_timing(&ctx).unwrap();
            event.record(&streams[i % streams.len()]).unwrap();
            event
        })
        .collect();
    pending.extend((0..9000).map(|i| events[i % events.len()].done()));
    assert!(pending.iter_mut().all(|d| poll_once(d).is_pending()));
    drop(held);
    for done in pending {
        block_on(done).unwrap();
    }
}

/// Points taken one after another, each awaited, never need more flags than one chunk holds: the reactor takes
/// each word back once its write has landed (the simulator's count of registered ranges stays).
#[cfg(not(feature = "gpu"))]
#[test]
fn the_reactors_words_are_taken_back_and_lent_again() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    block_on(stream.done()).unwrap();
    let registrations = || common::sim().unwrap().live().registrations;
    let before = registrations();
    for _ in 0..20_000 {
        block_on(stream.done()).unwrap();
    }
    assert_eq!(registrations(), before, "the reactor registered more flags");
}

/// What the simulated driver has alive that a future could keep: streams, events, context retains, pinned
/// allocations.
#[cfg(not(feature = "gpu"))]
fn alive() -> [u64; 4] {
    let live = common::sim().unwrap().live();
    [
        live.streams,
        live.events,
        live.context_retains,
        live.pinned_allocations,
    ]
}

/// Waits up to `limit` for [`alive`] to read `want`; what it read last.
#[cfg(not(feature = "gpu"))]
fn settle(want: [u64; 4], limit: Duration) -> [u64; 4] {
    let start = Instant::now();
    loop {
        let now = alive();
        if now == want || start.elapsed() > limit {
            return now;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`alive`] once it has not changed for 200 ms (what earlier work let go of, gone).
#[cfg(not(feature = "gpu"))]
fn quiet() -> [u64; 4] {
    let mut last = (alive(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = alive();
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(200) {
            return now;
        }
    }
}

/// Every kind of future, dropped or forgotten while its work is pending, with everything it was made from
/// dropped too: once the work completes, nothing of it is left alive (the forgotten futures themselves leak).
/// The control: a forgotten stream stays.
#[cfg(not(feature = "gpu"))]
#[test]
fn dropped_and_forgotten_futures_leak_at_most_themselves() {
    let _serial = serial_on_two_devices();
    // The reactor's flags exist from the first future on: made before the count.
    block_on(Stream::new(&device(0)).unwrap().done()).unwrap();
    let before = quiet();
    let run = |forget_stream: bool| {
        let ctx = device(0);
        let stream = Stream::new(&ctx).unwrap();
        let held = hold(&stream, Duration::from_secs(2));
        let dev = DeviceBuffer::<u32>::zeroed(&stream, 4096).unwrap();
        let mut dst = Pinned::<u32>::zeroed(&ctx, 4096).unwrap();
        stream.download(&dev, &mut dst).unwrap();
        let event = Event::without_timing(&ctx).unwrap();
        event.record(&stream).unwrap();
        for i in 0..100 {
            let mut done = if i % 3 == 0 {
                event.done()
            } else {
                stream.done()
            };
            assert!(poll_once(&mut done).is_pending());
            if i % 2 == 0 {
                drop(done);
            } else {
                std::mem::forget(done);
            }
        }
        let mut readable = dst.readable();
        assert!(poll_once(&mut readable).is_pending());
        std::mem::forget(readable);
        let mut writable = dst.writable();
        assert!(poll_once(&mut writable).is_pending());
        drop(writable);
        if forget_stream {
            std::mem::forget(stream.clone());
        }
        drop((event, dst, dev, stream, ctx));
        drop(held);
    };
    run(false);
    device(0).synchronize().unwrap();
    // At most what it was: what an earlier test left queued behind its own work may go meanwhile.
    let start = Instant::now();
    let mut left = alive();
    while !left.iter().zip(&before).all(|(l, b)| l <= b) && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
        left = alive();
    }
    assert!(
        left.iter().zip(&before).all(|(l, b)| l <= b),
        "left alive (streams, events, context retains, pinned): {left:?}, against {before:?} before"
    );
    run(true);
    device(0).synchronize().unwrap();
    let after = settle(left, Duration::from_millis(500));
    // The forgotten stream, and its context's stream for frees with it.
    assert!(
        after[0] > left[0],
        "the control: a forgotten stream stays alive"
    );
}

/// A future is a notification: waiting for one on a thread of its own does not stop other threads' work.
#[test]
fn a_pending_future_blocks_nobody() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let (busy, free) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let held = hold(&busy, Duration::from_secs(2));
    let mut waiting = busy.done();
    assert!(poll_once(&mut waiting).is_pending());
    let ((), _) = on_a_thread("another stream's work", Duration::from_secs(1), move || {
        let ctx = device(0);
        let data = vec![5u32; 1 << 12];
        let src = Pinned::from_slice(&ctx, &data).unwrap();
        let mut dev = DeviceBuffer::<u32>::uninit(&free, data.len()).unwrap();
        free.upload(&src, &mut dev).unwrap();
        block_on(free.done()).unwrap();
    });
    // The other stream's work is done and awaited while this one is still pending.
    assert!(poll_once(&mut waiting).is_pending());
    drop(held);
    block_on(waiting).unwrap();
}

/// The control of the executor check: a task that synchronizes a busy stream blocks its thread, and the
/// simulated driver says so.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_blocking_call_in_a_task_is_reported() {
    let mut serial = serial_on_two_devices();
    serial.expect_violations();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    let held = hold(&stream, Duration::from_secs(2));
    let waiting = stream.clone();
    let task = std::thread::spawn(move || {
        block_on(async move { waiting.synchronize() }).unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    drop(held);
    task.join().unwrap();
    let found = serial.take_violations();
    assert!(
        found.len() == 1
            && found[0].contains("BLOCKED EXECUTOR")
            && found[0].contains("synchronize"),
        "{found:?}"
    );
    // Awaiting the same is not reported.
    let held = hold(&stream, Duration::from_secs(2));
    let waiting = stream.clone();
    let task = std::thread::spawn(move || block_on(waiting.done()).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    drop(held);
    task.join().unwrap();
}

/// One host thread, whose current context is another device's, awaits work on every device: each device's
/// stream writes the reactor's flags (page-locked for every context), and each awaited read sees its data.
#[test]
fn one_thread_awaits_work_on_every_device() {
    let _serial = serial_on_two_devices();
    let contexts: Vec<_> = (0..device_count()).map(device).collect();
    assert!(contexts.len() >= 2, "this test needs two devices");
    let streams: Vec<Stream> = contexts.iter().map(|c| Stream::new(c).unwrap()).collect();
    let held: Vec<_> = streams
        .iter()
        .map(|s| hold(s, Duration::from_millis(500)))
        .collect();
    let mut rounds = Vec::new();
    for (n, (ctx, stream)) in contexts.iter().zip(&streams).enumerate() {
        let data = SplitMix64(n as u64).values(1 << 12);
        let src = Pinned::from_slice(ctx, &data).unwrap();
        let mut dev = DeviceBuffer::<u32>::uninit(stream, data.len()).unwrap();
        let mut dst = Pinned::<u32>::zeroed(ctx, data.len()).unwrap();
        stream.upload(&src, &mut dev).unwrap();
        stream.download(&dev, &mut dst).unwrap();
        rounds.push((data, src, dev, dst));
    }
    // Device 1's context current on this thread while it awaits every device (put back at the end).
    let set_current = |context| {
        // SAFETY: a context of the crate's, retained by `contexts` until the end; this thread only.
        unsafe { cuda_pinned::driver_call!(cuCtxSetCurrent(context)) }.unwrap();
    };
    set_current(contexts[1].as_raw());
    let mut points: Vec<_> = streams.iter().map(Stream::done).collect();
    assert!(points.iter_mut().all(|p| poll_once(p).is_pending()));
    drop(held);
    block_on(async {
        for point in points {
            point.await.unwrap();
        }
        for (n, (data, _, _, dst)) in rounds.iter().enumerate() {
            let got = dst.readable().await.unwrap();
            common::compare(got, data, &format!("device {n}")).unwrap();
        }
    });
    set_current(std::ptr::null_mut());
}

/// An executor polling a buffer is not held up by another thread that waits for the same buffer's work: the
/// waiting accessor does not hold the buffer's lock while it waits.
#[test]
fn a_thread_waiting_for_a_buffer_does_not_hold_up_a_task_polling_it() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    let dev = DeviceBuffer::<u32>::zeroed(&stream, 4096).unwrap();
    let mut dst = Pinned::<u32>::zeroed(&ctx, 4096).unwrap();
    let held = hold(&stream, Duration::from_secs(2));
    stream.download(&dev, &mut dst).unwrap();
    let dst = Arc::new(dst);
    let waiter = {
        let dst = dst.clone();
        std::thread::spawn(move || dst.as_slice().map(|s| s[0]).unwrap())
    };
    std::thread::sleep(Duration::from_millis(50));
    let poller = {
        let dst = dst.clone();
        std::thread::spawn(move || poll_once(&mut dst.readable()).is_pending())
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        poller.is_finished() && !waiter.is_finished(),
        "the task's poll waited with the thread"
    );
    assert!(poller.join().unwrap());
    drop(held);
    assert_eq!(waiter.join().unwrap(), 0);
}

/// A point taken between work that another stream then waits for: the other stream waits for that work, not
/// for the point's write (the simulator reports a false dependency otherwise).
#[test]
fn a_point_does_not_delay_other_streams_waits() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let src = Pinned::from_slice(&ctx, &vec![3u32; 4096]).unwrap();
    let mut dev = DeviceBuffer::<u32>::uninit(&a, 4096).unwrap();
    let mut dst = Pinned::<u32>::zeroed(&ctx, 4096).unwrap();
    let held = hold(&a, Duration::from_millis(300));
    a.upload(&src, &mut dev).unwrap();
    let done = a.done();
    b.download(&dev, &mut dst).unwrap();
    drop(held);
    block_on(done).unwrap();
    assert!(block_on(dst.readable()).unwrap().iter().all(|&x| x == 3));
}

/// A stream of other code's, wrapped with `from_raw`: once its handles and futures are gone, its owner may
/// destroy it while the point's write is still queued, and the reactor never uses it again (it watches the
/// context's own stream for errors).
#[cfg(not(feature = "gpu"))]
#[test]
fn a_borrowed_stream_destroyed_by_its_owner_is_not_used_by_the_reactor() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let sim = common::sim().unwrap();
    let mut raw: cuda_pinned::sys::CUstream = std::ptr::null_mut();
    // SAFETY: device 0's context made current for the stream's creation, then popped; an out-pointer to a local.
    unsafe {
        cuda_pinned::driver_call!(cuCtxPushCurrent_v2(ctx.as_raw())).unwrap();
        cuda_pinned::driver_call!(cuStreamCreate(&mut raw, 1)).unwrap();
        let mut popped = std::ptr::null_mut();
        cuda_pinned::driver_call!(cuCtxPopCurrent_v2(&mut popped)).unwrap();
    }
    // SAFETY: a stream of `ctx`, destroyed below only once no handle of it is left.
    let stream = unsafe { Stream::from_raw(&ctx, raw) }.unwrap();
    let held = hold(&stream, Duration::from_millis(300));
    let before = sim.api_errors().len();
    drop(stream.done());
    drop(stream);
    // SAFETY: the stream made above; no handle of it is left.
    unsafe { cuda_pinned::driver_call!(cuStreamDestroy_v2(raw)) }.unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(held);
    let errors = sim.api_errors().split_off(before);
    assert!(errors.is_empty(), "driver calls failed: {errors:?}");
}

/// A waker that panics does not stop the reactor: later futures are still served.
#[test]
fn a_panicking_waker_does_not_stop_the_reactor() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    struct Panics;
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics (on purpose, in a test)");
        }
    }
    let waker = Waker::from(Arc::new(Panics));
    let held = hold(&stream, Duration::from_millis(200));
    let mut done = stream.done();
    let first = std::pin::Pin::new(&mut done).poll(&mut TaskContext::from_waker(&waker));
    assert!(first.is_pending());
    drop(held);
    // Let the reactor wake (and catch) it, then serve another stream's point and an event.
    std::thread::sleep(Duration::from_millis(400));
    block_on(Stream::new(&ctx).unwrap().done()).unwrap();
    block_on(Event::without_timing(&ctx).unwrap().done()).unwrap();
    block_on(done).unwrap();
}

/// A prefetcher's next batch, awaited: pending while its worker fills it (the executor's thread is not held),
/// then every batch in order with its data.
#[test]
fn a_prefetchers_batches_are_awaited() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let consumer = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let len = 4096;
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let opened = gate.clone();
    let mut prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
        .batches(8)
        .workers(2)
        .build(move |i, batch| {
            if i == 0 {
                let open = opened.0.lock().unwrap();
                drop(opened.1.wait_while(open, |open| !*open).unwrap());
            }
            batch.as_mut_slice()?.fill(i as u32 + 1);
            Ok(())
        })
        .unwrap();
    let mut first = prefetcher.next_async();
    assert!(
        poll_once(&mut first).is_pending(),
        "the first batch is still being filled"
    );
    drop(first);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    let mut host = Pinned::<u32>::zeroed(&ctx, len).unwrap();
    let delivered = block_on(async {
        let mut k = 0;
        while let Some(batch) = prefetcher.next_async().await {
            let batch = batch.unwrap();
            consumer.download(&*batch, &mut host).unwrap();
            drop(batch);
            let got = host.readable().await.unwrap();
            assert!(got.iter().all(|&x| x == k + 1), "batch {k}");
            k += 1;
        }
        k
    });
    assert_eq!(delivered, 8);
}

/// `Context::done`, awaited: pending while any stream of the context has work queued before it, then every
/// stream's work complete and the page-locked memory dropped meanwhile released.
#[test]
fn a_contexts_work_and_its_releases_are_awaited() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    #[cfg(not(feature = "gpu"))]
    let pinned_before = common::sim().unwrap().live().pinned_allocations;
    let held_a = hold(&a, Duration::from_millis(300));
    let held_b = hold(&b, Duration::from_millis(600));
    let dev = DeviceBuffer::<u32>::zeroed(&b, 1 << 12).unwrap();
    let mut dst = Pinned::<u32>::zeroed(&ctx, 1 << 12).unwrap();
    b.download(&dev, &mut dst).unwrap();
    drop(dst);
    let events: Vec<Event> = [&a, &b]
        .iter()
        .map(|s| {
            let event = Event::without_timing(&ctx).unwrap();
            event.record(s).unwrap();
            event
        })
        .collect();
    let mut done = Box::pin(ctx.done());
    assert!(poll_once(&mut done).is_pending());
    drop(held_a);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        poll_once(&mut done).is_pending(),
        "stream b's work is still queued"
    );
    drop(held_b);
    block_on(done).unwrap();
    assert!(
        events.iter().all(|e| e.query().unwrap()),
        "work queued before it had not completed"
    );
    #[cfg(not(feature = "gpu"))]
    assert_eq!(
        common::sim().unwrap().live().pinned_allocations,
        pinned_before,
        "the dropped buffer is released"
    );
}

/// A pool's allocation, awaited where it would wait: for a buffer another holder gives back (the giver wakes the
/// task), for device work on a block given back (the reactor wakes it), and until the pool's deadline, which
/// ends it with the pool's error.
#[test]
fn a_pools_allocation_is_awaited_for_room_for_device_work_and_until_its_deadline() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    let budget = 1 << 20;
    // A deadline far off: only the wakes below can end the first two waits (a lost one fails the test).
    let pool = PinnedPool::builder(&ctx, budget)
        .when_full(WhenFull::Wait)
        .max_wait(Duration::from_secs(3600))
        .build();

    // Room held by a holder: pending until it gives the buffer back.
    // The give-back happens while the task sleeps: only its wake can let it see the room.
    let later = |what: Box<dyn Send>| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(what);
        })
    };
    let held = pool.alloc::<u8>(budget).unwrap();
    let mut request = Box::pin(pool.alloc_async::<u8>(budget));
    assert!(poll_once(&mut request).is_pending());
    let giver = later(Box::new(held));
    let buffer = block_on(request).unwrap();
    giver.join().unwrap();

    // Room held by device work on the buffer given back: pending until that work completes.
    let dev = DeviceBuffer::<u8>::zeroed(&stream, budget).unwrap();
    let mut buffer = buffer;
    let busy = hold(&stream, Duration::from_millis(300));
    stream.download(&dev, &mut buffer).unwrap();
    drop(buffer);
    let mut request = Box::pin(pool.alloc_async::<u8>(budget));
    assert!(poll_once(&mut request).is_pending());
    let releaser = later(Box::new(busy));
    let buffer = block_on(request).unwrap();
    releaser.join().unwrap();

    // Nothing comes back: the deadline ends the request with the pool's error.
    let pool = PinnedPool::builder(&ctx, budget)
        .when_full(WhenFull::Wait)
        .max_wait(Duration::from_millis(300))
        .build();
    let held = pool.alloc::<u8>(budget).unwrap();
    let mut request = Box::pin(pool.alloc_async::<u8>(budget));
    assert!(poll_once(&mut request).is_pending());
    let outcome = block_on(request);
    assert!(
        matches!(outcome, Err(Error::PoolExhausted { .. })),
        "{outcome:?}"
    );
    drop((buffer, held));
    // Device work pending on one block, the other held: a give-back ends the wait (not the work), and with
    // neither, the deadline does (not the work).
    let pool = PinnedPool::builder(&ctx, 2 * budget)
        .when_full(WhenFull::Wait)
        .max_wait(Duration::from_millis(300))
        .build();
    let (mut a, b) = (
        pool.alloc::<u8>(budget).unwrap(),
        pool.alloc::<u8>(budget).unwrap(),
    );
    let busy = hold(&stream, Duration::from_secs(2));
    stream.download(&dev, &mut a).unwrap();
    drop(a);
    let mut request = Box::pin(pool.alloc_async::<u8>(budget));
    assert!(poll_once(&mut request).is_pending());
    let giver = later(Box::new(b));
    let b = block_on(request).unwrap();
    giver.join().unwrap();
    let outcome = block_on(pool.alloc_async::<u8>(budget));
    assert!(
        matches!(outcome, Err(Error::PoolExhausted { .. })),
        "{outcome:?}"
    );
    drop((b, busy));
    // A resolved request polled again: an error, not a second buffer.
    let mut request = pool.alloc_async::<u8>(1024);
    let first = block_on(&mut request).unwrap();
    assert!(matches!(
        poll_once(&mut request),
        Poll::Ready(Err(Error::InvalidArgument { .. }))
    ));
    drop(first);
}

/// Staged transfers of ordinary memory, awaited: the data arrives both ways, through a pool whose room forces
/// waits for earlier chunks (awaited), and no executor thread waits in the driver.
#[test]
fn staged_transfers_are_awaited() {
    let _serial = serial_on_two_devices();
    let ctx = device(0);
    let stream = Stream::new(&ctx).unwrap();
    // Room for two 4 MiB chunks: a transfer of 13 MiB reuses them.
    let pool = PinnedPool::builder(&ctx, 8 << 20)
        .when_full(WhenFull::Wait)
        .build();
    let data = SplitMix64(0x57A6ED).values((13 << 20) / 4 + 3);
    let mut dev = DeviceBuffer::<u32>::uninit(&stream, data.len()).unwrap();
    let mut back = vec![0u32; data.len()];
    block_on(async {
        stream
            .upload_staged_async(&pool, &data, &mut dev)
            .await
            .unwrap();
        stream
            .download_staged_async(&pool, &dev, &mut back)
            .await
            .unwrap();
    });
    common::compare(&back, &data, "staged both ways, awaited").unwrap();
    // A pool that fails when full, a transfer of many chunks queued behind busy work: the transfer waits for
    // its own buffers' uploads, never fails for them. And a pool smaller than a chunk: smaller chunks.
    for (budget, busy) in [(4 << 20, true), (1 << 20, false)] {
        let pool = PinnedPool::new(&ctx, budget);
        let held = busy.then(|| hold(&stream, Duration::from_millis(200)));
        let mut transfer = Box::pin(stream.upload_staged_async(&pool, &data, &mut dev));
        if busy {
            assert!(poll_once(&mut transfer).is_pending());
        }
        drop(held);
        block_on(transfer).unwrap();
        let mut back = vec![0u32; data.len()];
        block_on(stream.download_staged_async(&pool, &dev, &mut back)).unwrap();
        common::compare(&back, &data, &format!("through a pool of {budget} bytes")).unwrap();
    }
    // Lengths that differ: refused with nothing enqueued.
    let short = vec![0u32; 10];
    let refused = block_on(stream.upload_staged_async(&pool, &short, &mut dev));
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
}
