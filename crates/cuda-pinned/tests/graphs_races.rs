//! Captures against other threads and failing calls: two threads capturing one stream, a future of a stream
//! racing captures of it, two captures racing for one host buffer, captured work whose place in the graph could
//! not be read, and a capture that never began. Each race runs for a few seconds; its rule is that whatever
//! order the threads meet in, every result is right and nothing is left marked, held or pending.

mod common;

use std::future::Future;
use std::sync::{Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

#[cfg(not(feature = "gpu"))]
use common::hold;
use common::{data, serial_on_two_devices};
use cuda_pinned::{DeviceBuffer, Graph, Pinned, Stream};

const N: usize = 1024;
/// How long each race runs.
const RACE: Duration = Duration::from_secs(3);

/// Polls `future` on this thread until it is ready or `limit` has passed.
fn wait_for<F: Future>(future: F, limit: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    let deadline = Instant::now() + limit;
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Two threads capture stream `a` at once. One captures; the other is refused (the mark is checked under the
/// stream's segment lock), and its eager download on `a` is refused while the capture goes on (it would land in
/// the other thread's graph), and runs once the capture has ended.
#[test]
fn of_two_threads_capturing_one_stream_the_other_is_refused_and_its_work_runs() {
    let _serial = serial_on_two_devices();
    let ctx = common::device(0);
    let (a, c) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let want = data(N, 1);
    let host = Pinned::from_slice(&ctx, &want).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(&c, N).unwrap();
    c.upload(&host, &mut dev).unwrap();
    c.synchronize().unwrap();
    let started = Instant::now();
    let (mut rounds, mut refused) = (0, 0);
    while started.elapsed() < RACE {
        rounds += 1;
        let (barrier, ended) = (Barrier::new(2), Barrier::new(2));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        // A thread that panics before the second barrier would leave the other waiting there: bounded.
        let results: Vec<(bool, Option<Vec<u32>>)> =
            common::bounded("a round of two captures", common::LIMIT, || {
                std::thread::scope(|s| {
                    let handles: Vec<_> = (0..2)
                        .map(|_| {
                            let tx = tx.clone();
                            let (a, ctx, barrier, ended, rx, dev) =
                                (&a, &ctx, &barrier, &ended, &rx, &dev);
                            s.spawn(move || {
                                let mut won = false;
                                barrier.wait();
                                let captured = Graph::capture(&[a], || {
                                    won = true;
                                    // Until the other thread is done (it cannot capture `a` meanwhile).
                                    let _ =
                                        rx.lock().unwrap().recv_timeout(Duration::from_millis(300));
                                    Ok(())
                                });
                                if won {
                                    // The other thread's download may reach the driver just as the capture begins
                                    // (its waits for other streams are queued before it finds the mark): the driver
                                    // then ends the capture, which fails with its error (ARCHITECTURE.md, "Graphs").
                                    if let Err(e) = captured {
                                        assert!(
                                            e.to_string().contains("CAPTURE_INVALIDATED"),
                                            "{e}"
                                        );
                                    }
                                    ended.wait();
                                    return (true, None);
                                }
                                assert!(captured.is_err(), "two captures of one stream both began");
                                let mut out = Pinned::<u32>::zeroed(ctx, N).unwrap();
                                // While the other thread captures `a`, this thread's work there is refused, not recorded
                                // into that thread's graph.
                                let during = a.download(dev, &mut out);
                                let _ = tx.send(());
                                ended.wait();
                                let refused = match during {
                                    Ok(()) => None,
                                    Err(e) => Some(e.to_string()),
                                };
                                if refused.is_some() {
                                    a.download(dev, &mut out).unwrap();
                                }
                                let got = out.as_slice().unwrap().to_vec();
                                assert!(
                                    refused
                                        .as_ref()
                                        .is_none_or(|e| e.contains("capturing a graph")),
                                    "{refused:?}"
                                );
                                (false, Some(got))
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                })
            });
        for (won, got) in results {
            if let (false, Some(got)) = (won, got) {
                refused += 1;
                assert_eq!(
                    got, want,
                    "round {rounds}: the refused thread's eager download did not run"
                );
            }
        }
    }
    assert!(refused > 0, "no round raced");
    // Nothing left marked: the stream captures again.
    Graph::capture(&[&a], || Ok(())).expect("the stream was left marked as capturing");
}

/// A thread awaits futures of stream `a` while another captures it again and again: each future completes or
/// is refused (its flag is checked under the segment lock, which a capture takes to begin), never pending for
/// good.
#[test]
fn futures_of_a_stream_that_other_threads_capture_always_end() {
    let _serial = serial_on_two_devices();
    let ctx = common::device(0);
    let a = Stream::new(&ctx).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let mut futures = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(Graph::capture(&[&a], || Ok(())));
            }
        });
        while started.elapsed() < RACE {
            futures += 1;
            let ended = wait_for(a.done(), Duration::from_secs(2));
            if ended.is_none() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("future {futures} of Stream::done still pending after 2 s");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

/// Two threads capture an upload of one host buffer at once: at most one graph holds it (the check and the
/// hold are one step), so the host buffer is lent by one graph only.
#[test]
fn of_two_captures_racing_for_one_host_buffer_one_holds_it() {
    let _serial = serial_on_two_devices();
    let ctx = common::device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let host = Pinned::from_slice(&ctx, &data(N, 2)).unwrap();
    let mut da = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let mut db = DeviceBuffer::<u32>::zeroed(&b, N).unwrap();
    ctx.synchronize().unwrap();
    let started = Instant::now();
    while started.elapsed() < RACE {
        let barrier = Barrier::new(2);
        let (ga, gb) = std::thread::scope(|s| {
            let (host, barrier) = (&host, &barrier);
            let (a, b, da, db) = (&a, &b, &mut da, &mut db);
            let ta = s.spawn(move || {
                barrier.wait();
                Graph::capture(&[a], || a.upload(host, da))
            });
            let tb = s.spawn(move || {
                barrier.wait();
                Graph::capture(&[b], || b.upload(host, db))
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert!(
            !(ga.is_ok() && gb.is_ok()),
            "two graphs hold one host buffer"
        );
        assert!(ga.is_ok() || gb.is_ok(), "neither capture held the buffer");
    }
    // Once the graphs are gone, the buffer is its owner's again.
    assert_eq!(host.as_slice().unwrap(), &data(N, 2)[..]);
}

/// Captured work whose place in the graph cannot be read (a failed `cuStreamGetCaptureInfo_v3`) may be in the
/// graph with nothing to order it after: the whole capture fails, and its buffers are their owners' again.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_capture_whose_work_lost_its_place_fails() {
    let _serial = serial_on_two_devices();
    let sim = common::sim().unwrap();
    let ctx = common::device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut input = Pinned::from_slice(&ctx, &data(N, 3)).unwrap();
    let mut x = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let mut output = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    ctx.synchronize().unwrap();
    sim.fail("cuStreamGetCaptureInfo_v3:1:CUDA_ERROR_UNKNOWN")
        .unwrap();
    let mut upload = None;
    let captured = Graph::capture(&[&a, &b], || {
        // The closure ignores the upload's error and goes on: the capture fails all the same.
        upload = Some(a.upload(&input, &mut x));
        b.download(&x, &mut output)
    });
    sim.clear_faults();
    assert!(
        upload.is_some_and(|u| u.is_err()),
        "the upload's lost place was not reported"
    );
    let e = captured.expect_err("a capture with work out of the tracking made a graph");
    assert!(e.to_string().contains("cuStreamGetCaptureInfo_v3"), "{e}");
    // Eager, the same step computes the input.
    input.as_mut_slice().unwrap().copy_from_slice(&data(N, 4));
    a.upload(&input, &mut x).unwrap();
    b.download(&x, &mut output).unwrap();
    assert_eq!(output.as_slice().unwrap(), &data(N, 4)[..]);
}

/// A capture whose begin fails, with the check of the stream's state failing too, leaves its streams
/// unmarked: eager work on them is tracked, and the device synchronizes.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_capture_that_never_began_leaves_its_streams_usable() {
    let _serial = serial_on_two_devices();
    let sim = common::sim().unwrap();
    let ctx = common::device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let want = data(N, 5);
    let host = Pinned::from_slice(&ctx, &want).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(&b, N).unwrap();
    let mut out = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    ctx.synchronize().unwrap();
    sim.fail(
        "cuStreamBeginCapture_v2:1:CUDA_ERROR_UNKNOWN,cuStreamIsCapturing:1:CUDA_ERROR_UNKNOWN",
    )
    .unwrap();
    let captured = Graph::capture(&[&a], || Ok(()));
    sim.clear_faults();
    assert!(captured.is_err());
    {
        let _held = hold(&a, Duration::from_millis(300));
        // `dev` written on `a` behind the hold, then read on `b`: tracked, the read waits for the write.
        a.upload(&host, &mut dev).unwrap();
        b.download(&dev, &mut out).unwrap();
    }
    assert_eq!(out.as_slice().unwrap(), &want[..]);
    drop(a);
    ctx.synchronize().unwrap();
}

/// A capture whose end fails once, while a look at the stream's state fails too, still ends: the end is tried
/// again until the driver says the stream is out of a capture, so the stream is usable and the buffers are their
/// owners' again.
#[cfg(not(feature = "gpu"))]
#[test]
fn a_capture_whose_end_fails_leaves_its_stream_and_buffers_free() {
    let _serial = serial_on_two_devices();
    let sim = common::sim().unwrap();
    let ctx = common::device(0);
    let a = Stream::new(&ctx).unwrap();
    let want = data(N, 7);
    let host = Pinned::from_slice(&ctx, &want).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    ctx.synchronize().unwrap();
    sim.fail("cuStreamEndCapture:1:CUDA_ERROR_UNKNOWN,cuStreamIsCapturing:1:CUDA_ERROR_UNKNOWN")
        .unwrap();
    let captured = Graph::capture(&[&a], || a.upload(&host, &mut dev));
    sim.clear_faults();
    assert!(captured.is_err());
    a.synchronize()
        .expect("the stream was left marked as capturing");
    assert_eq!(
        host.as_slice().expect("the host buffer was left held"),
        &want[..]
    );
    let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    a.upload(&host, &mut dev).unwrap();
    a.download(&dev, &mut back).unwrap();
    assert_eq!(back.as_slice().unwrap(), &want[..]);
}

/// `Context::synchronize` looks at every stream of the context for a capture while another thread drops its
/// streams: a stream whose last other handle goes while it is looked at is dropped by the look, which must not
/// hold the list of streams then (the stream's drop takes it to leave: it deadlocked, found by fuzzing). Five
/// seconds of synchronizations beside a thread that makes and drops streams, with a watchdog.
#[test]
fn a_synchronization_beside_streams_being_dropped_never_deadlocks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = serial_on_two_devices();
    let ctx = common::device(0);
    let (done, finished) = std::sync::mpsc::channel();
    let looking = ctx.clone();
    std::thread::spawn(move || {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, churned) = (stop.clone(), looking.clone());
        let churn = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                drop(Stream::new(&churned).unwrap());
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            looking.synchronize().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("Context::synchronize deadlocked beside a stream's drop");
}

/// One thread launches a graph that adds 1 to `x` (through `y`), synchronizing its stream every few launches
/// (so the next launch, finding its buffers as the last one left them, moves the graph's point to a new
/// segment without touching their trackers), while another thread downloads `x` on its own stream. Every
/// download sees whole launches (`x` plus one number for every element) and never fewer than the one before.
#[test]
fn downloads_beside_launches_and_synchronizations_see_whole_launches() {
    use cuda_pinned::{Arg, LaunchConfig};
    let _serial = serial_on_two_devices();
    let ctx = common::device(0);
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let kernel = common::test_kernels(&ctx)
        .unwrap()
        .kernel("add_u32")
        .unwrap();
    let add = |x: &DeviceBuffer<u32>, y: &mut DeviceBuffer<u32>, n: u32| {
        let len = u32::try_from(N).unwrap();
        // SAFETY: add_u32(const unsigned*, unsigned*, unsigned, unsigned) reads x[..len] and writes y[..len].
        unsafe {
            a.launch(
                &kernel,
                LaunchConfig::for_elements(N, 256).unwrap(),
                &[
                    Arg::read(x),
                    Arg::write(y),
                    Arg::value(&n),
                    Arg::value(&len),
                ],
            )
        }
    };
    let values = data(N, 12);
    let host = Pinned::from_slice(&ctx, &values).unwrap();
    let mut x = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    let mut y = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    a.upload(&host, &mut x).unwrap();
    let mut graph = Graph::capture(&[&a], || {
        add(&x, &mut y, 1)?;
        add(&y, &mut x, 0)
    })
    .unwrap();
    let (mut launches, mut downloads) = (0u32, 0);
    common::bounded("launches beside downloads", common::LIMIT, || {
        std::thread::scope(|s| {
            let launcher = s.spawn(|| {
                let started = Instant::now();
                while started.elapsed() < RACE {
                    graph.launch(&a).unwrap();
                    launches += 1;
                    match launches % 4 {
                        0 => a.synchronize().unwrap(),
                        2 => ctx.synchronize().unwrap(),
                        _ => {}
                    }
                }
            });
            let mut got = Pinned::<u32>::zeroed(&ctx, N).unwrap();
            let mut seen = 0;
            while !launcher.is_finished() {
                b.download(&x, &mut got).unwrap();
                let got = got.as_slice().unwrap();
                let k = got[0].wrapping_sub(values[0]);
                assert!(
                    got.iter()
                        .zip(&values)
                        .all(|(g, v)| g.wrapping_sub(*v) == k),
                    "a download saw part of a launch"
                );
                assert!(
                    k >= seen,
                    "a download saw {k} launches after one saw {seen}"
                );
                seen = k;
                downloads += 1;
            }
            launcher.join().unwrap();
        });
    });
    assert!(
        launches > 10 && downloads > 10,
        "{launches} launches, {downloads} downloads"
    );
}

/// A `Stream::profile` closure on `a` holds no lock of the crate (ARCHITECTURE.md, "Locks"): a launch of
/// another thread on `a` goes through while it runs. The closure then writes `p`, a buffer the graph writes,
/// eagerly on `a` behind a hold: work of the crate on that stream replaces the graph's entries, and the
/// graph's read of `p` must wait for that write (queued after the launch) and read it. Had the profiled
/// closure still held `a`'s segment lock, the launch would wait for it, and the closure for the launch.
#[test]
fn a_launch_beside_a_profiled_closure_goes_through_and_work_after_it_is_waited_for() {
    use std::sync::mpsc;
    let _serial = serial_on_two_devices();
    let (got, _) = common::on_a_thread("a launch beside a profiled closure", common::LIMIT, || {
        let ctx = common::device(0);
        let a = Stream::new(&ctx).unwrap();
        let (launched, eager) = (data(N, 1), data(N, 2));
        // Kept to the end: a release of page-locked memory meanwhile would hold the launch back elsewhere.
        let hosts = [&launched, &eager].map(|values| Pinned::from_slice(&ctx, values).unwrap());
        let [x, y] = hosts.each_ref().map(|host| {
            let mut buffer = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
            a.upload(host, &mut buffer).unwrap();
            buffer
        });
        let mut p = Pinned::<u32>::zeroed(&ctx, N).unwrap();
        let mut graph = Graph::capture(&[&a], || a.download(&x, &mut p)).unwrap();
        graph.launch(&a).unwrap();
        a.synchronize().unwrap();
        let (go, wait) = mpsc::channel::<()>();
        let (done, returned) = mpsc::channel::<()>();
        let (went_through, held) = std::thread::scope(|s| {
            let (a, graph) = (&a, &mut graph);
            s.spawn(move || {
                wait.recv().unwrap();
                graph.launch(a).unwrap();
                done.send(()).unwrap();
            });
            a.profile("user work", 0, || {
                go.send(()).unwrap();
                let went_through = returned.recv_timeout(Duration::from_secs(10)).is_ok();
                a.download(&y, &mut p)?;
                Ok((went_through, common::hold(a, Duration::from_secs(1))))
            })
            .unwrap()
        });
        // The hold ends on another thread a while later: the read must wait for the eager write behind it.
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let read = graph.host_slice(&p).unwrap().to_vec();
        release.join().unwrap();
        (went_through, read == eager, read == launched)
    });
    assert!(
        got.0,
        "the launch waited for the profiled closure to return"
    );
    assert!(
        got.1,
        "the graph lent `p` before the eager write queued after its launch had completed (the launch's \
         values read: {})",
        got.2
    );
}

/// Two streams `a` and `b` of device 0, and a graph on `a` that uploads `values` (data of `seed`, returned too)
/// into `x`: the graph's host buffer, `x` and the graph.
struct Upload {
    ctx: cuda_pinned::Context,
    a: Stream,
    b: Stream,
    values: Vec<u32>,
    _host: Pinned<u32>,
    x: DeviceBuffer<u32>,
    graph: Graph,
}

impl Upload {
    fn new(seed: u64) -> Upload {
        let ctx = common::device(0);
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let values = data(N, seed);
        let host = Pinned::from_slice(&ctx, &values).unwrap();
        let mut x = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
        let graph = Graph::capture(&[&a], || a.upload(&host, &mut x)).unwrap();
        Upload {
            ctx,
            a,
            b,
            values,
            _host: host,
            x,
            graph,
        }
    }
}

/// A launch on the short path holds no lock while it waits for its stream's segment lock: a `Stream::profile`
/// closure on that stream (holding the lock) may read the graph's buffers on another stream, whose trackers'
/// entries it resolves through the graph's point. It deadlocked when the launch took the point's lock first.
#[test]
fn a_launch_beside_a_profiled_closure_reading_its_buffers_never_deadlocks() {
    use std::sync::mpsc;
    let _serial = serial_on_two_devices();
    let (got, _) = common::on_a_thread("a launch beside a profiled read", common::LIMIT, || {
        let Upload {
            ctx,
            a,
            b,
            values: want,
            x,
            mut graph,
            ..
        } = Upload::new(3);
        graph.launch(&a).unwrap();
        let mut got = Pinned::<u32>::zeroed(&ctx, N).unwrap();
        let (go, wait) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let (a, graph) = (&a, &mut graph);
            s.spawn(move || {
                wait.recv().unwrap();
                graph.launch(a).unwrap();
            });
            a.profile("user work", 0, || {
                go.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                b.download(&x, &mut got)
            })
            .unwrap();
        });
        got.as_slice().unwrap().to_vec() == want
    });
    assert!(
        got,
        "the download on another stream read `x` before a launch wrote it"
    );
}

/// Other code's work declared on a graph's buffer by another thread (`Stream::enqueue_foreign`), its closure
/// still running when the graph is launched: the launch (which uses the buffer without borrowing it) is
/// refused, since that work's place on its stream is known only once the closure returns; launched after, it
/// waits on the device for that work, and the buffer's tracker keeps it. A launch let through queued without
/// waiting for the foreign work, whose use, recorded when its closure returned, then replaced the launch's.
#[test]
fn a_launch_beside_a_declared_closure_on_its_buffer_is_refused_until_it_returns() {
    use cuda_pinned::Use;
    use std::sync::mpsc;
    let _serial = serial_on_two_devices();
    let (got, _) = common::on_a_thread("a launch beside declared work", common::LIMIT, || {
        let Upload {
            ctx,
            a,
            b,
            values,
            mut x,
            mut graph,
            ..
        } = Upload::new(21);
        graph.launch(&a).unwrap();
        a.synchronize().unwrap();
        let address = x.as_raw();
        let (go, wait) = mpsc::channel::<()>();
        let refusal = std::thread::scope(|s| {
            let (b, x) = (&b, &mut x);
            s.spawn(move || {
                // SAFETY: a memset of the N elements of `x`, declared written, on the stream given.
                unsafe {
                    b.enqueue_foreign(&[Use::write(x)], |raw| {
                        go.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                        cuda_pinned::driver_call!(cuMemsetD32Async(address, 7, N, raw)).unwrap();
                    })
                }
                .unwrap();
            });
            wait.recv().unwrap();
            graph.launch(&a).err().map(|e| e.to_string())
        });
        // The closure has returned: the launch waits for the memset on the device, and the read for the launch,
        // held back a while.
        let held = common::hold(&a, Duration::from_secs(1));
        graph.launch(&a).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let mut got = Pinned::<u32>::zeroed(&ctx, N).unwrap();
        b.download(&x, &mut got).unwrap();
        let got = got.as_slice().unwrap().to_vec();
        release.join().unwrap();
        (refusal, got == values)
    });
    let refusal = got
        .0
        .expect("the launch beside the running declared closure was let through");
    assert!(refusal.contains("enqueue_foreign"), "{refusal}");
    assert!(
        got.1,
        "a read after the launch did not get what the launch wrote"
    );
}

/// A declared closure that launches a graph using one of its declared buffers is refused at once (its own
/// use is recorded only once it returns), rather than left waiting for itself.
#[test]
fn a_declared_closure_launching_a_graph_on_its_buffer_is_refused() {
    use cuda_pinned::Use;
    let _serial = serial_on_two_devices();
    let (refusal, _) = common::on_a_thread("a launch inside declared work", common::LIMIT, || {
        let Upload {
            a, b, x, mut graph, ..
        } = Upload::new(22);
        // SAFETY: the closure enqueues nothing.
        unsafe { b.enqueue_foreign(&[Use::read(&x)], |_| graph.launch(&a)) }.unwrap()
    });
    let refusal = refusal.expect_err("a launch inside a declared closure on its buffer");
    assert!(refusal.to_string().contains("enqueue_foreign"), "{refusal}");
}
