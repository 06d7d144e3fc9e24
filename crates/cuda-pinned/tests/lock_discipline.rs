//! No lock of the crate is held while code it does not control runs (ARCHITECTURE.md, "No lock around user
//! code"): a `Stream::profile` or `Stream::enqueue_foreign` closure, a waker's drop. Each test is a program a
//! user writes by using documented features together, from one thread and from two; each hung before the rule
//! held (a profiled closure held its stream's segment lock, the pool dropped a waker under its lock, a staged
//! future panicked when polled again). Every call runs on a thread of its own with a deadline
//! (`common::on_a_thread`), so a hang fails the test by name instead of stalling the suite.

mod common;

use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context as TaskContext, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::Duration;

use common::{data, serial};
use cuda_pinned::{DeviceBuffer, Pinned, PinnedPool, Result, StagingOptions, Stream, WhenFull};

/// Elements of the buffers: 256 KiB of `u32`.
const N: usize = 64 << 10;

/// How long one scenario may take: far more than any takes, far less than `common::LIMIT`.
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs `f` on a thread of its own, failing the test (named `what`) if it has not returned by [`DEADLINE`].
fn ends<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    common::on_a_thread(what, DEADLINE, f).0
}

/// A device buffer of `N` elements on `stream`, holding `data(N, seed)`, and those values.
fn uploaded(stream: &Stream, seed: u64) -> (DeviceBuffer<u32>, Vec<u32>) {
    let values = data(N, seed);
    let host = Pinned::from_slice(stream.context(), &values).unwrap();
    let mut buffer = DeviceBuffer::<u32>::zeroed(stream, N).unwrap();
    stream.upload(&host, &mut buffer).unwrap();
    (buffer, values)
}

/// Staging options that always take the chunked path with two worker threads.
fn chunked() -> StagingOptions {
    let mut options = StagingOptions::default();
    options.chunk_bytes = 64 << 10;
    options.threads = 2;
    options.chunked_from = 0;
    options
}

#[test]
fn a_profiled_staged_transfer_on_worker_threads_ends() {
    let _serial = serial();
    let (up, down) = ends("a staged transfer inside Stream::profile", || {
        let ctx = common::device(0);
        let a = Stream::new(&ctx).unwrap();
        let pool = PinnedPool::new(&ctx, 16 << 20);
        let values = data(4 * N, 1);
        let mut device = DeviceBuffer::<u32>::zeroed(&a, 4 * N).unwrap();
        a.profile("staged upload", 16 * N, || {
            a.upload_staged_with(&pool, chunked(), &values, &mut device)
        })
        .unwrap();
        let mut back = vec![0u32; 4 * N];
        a.profile("staged download", 16 * N, || {
            a.download_staged_with(&pool, chunked(), &device, &mut back)
        })
        .unwrap();
        let mut check = Pinned::<u32>::zeroed(&ctx, 4 * N).unwrap();
        a.download(&device, &mut check).unwrap();
        (check.as_slice().unwrap() == values, back == values)
    });
    assert!(up && down, "upload right: {up}, download right: {down}");
}

/// The control of the test above: its transfer does take the chunked path, on worker threads (several
/// staging buffers at once, which only the threaded path holds).
#[test]
fn the_staged_transfer_profiled_above_uses_several_staging_buffers() {
    let (buffers, each) = chunked().staging_buffers(16 * N).unwrap();
    assert!(
        buffers >= 2 && each == 64 << 10,
        "{buffers} buffers of {each} bytes"
    );
}

#[test]
fn a_profiled_closure_using_a_buffer_on_another_stream_beside_a_thread_using_it_on_this_one_ends() {
    let _serial = serial();
    let (first, second) = ends(
        "profile on a reading x on b, beside a read of x on a",
        || {
            let ctx = common::device(0);
            let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
            let (x, want) = uploaded(&a, 2);
            let mut on_b = Pinned::<u32>::zeroed(&ctx, N).unwrap();
            let mut on_a = Pinned::<u32>::zeroed(&ctx, N).unwrap();
            let inside = Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    inside.wait();
                    a.download(&x, &mut on_a).unwrap();
                });
                a.profile("user work", 0, || {
                    inside.wait();
                    // The other thread is in its download on `a` by now, holding `x`'s tracker.
                    std::thread::sleep(Duration::from_millis(100));
                    b.download(&x, &mut on_b)
                })
                .unwrap();
            });
            (
                on_b.as_slice().unwrap() == want,
                on_a.as_slice().unwrap() == want,
            )
        },
    );
    assert!(
        first && second,
        "read on b right: {first}, on a right: {second}"
    );
}

#[test]
fn two_profiled_closures_each_enqueueing_on_the_others_stream_end() {
    let _serial = serial();
    let right = ends("two profiled closures crossing streams", || {
        let ctx = common::device(0);
        let streams = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
        let inside = Barrier::new(2);
        let got: Vec<bool> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|i| {
                    let (own, other, inside) = (&streams[i], &streams[1 - i], &inside);
                    s.spawn(move || {
                        let values = data(N, 10 + i as u64);
                        let host = Pinned::from_slice(own.context(), &values).unwrap();
                        let mut device = DeviceBuffer::<u32>::zeroed(other, N).unwrap();
                        own.profile("user work", 0, || {
                            inside.wait();
                            other.upload(&host, &mut device)
                        })
                        .unwrap();
                        let mut back = Pinned::<u32>::zeroed(own.context(), N).unwrap();
                        other.download(&device, &mut back).unwrap();
                        back.as_slice().unwrap() == values
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        got.iter().all(|&right| right)
    });
    assert!(
        right,
        "an upload made inside a profiled closure read wrong data"
    );
}

#[test]
fn two_profiled_closures_synchronizing_the_context_end() {
    let _serial = serial();
    ends("Context::synchronize inside two profiled closures", || {
        let ctx = common::device(0);
        let streams = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
        let inside = Barrier::new(2);
        std::thread::scope(|s| {
            for stream in &streams {
                let (ctx, inside) = (&ctx, &inside);
                s.spawn(move || {
                    stream
                        .profile("user work", 0, || {
                            inside.wait();
                            ctx.synchronize()
                        })
                        .unwrap();
                });
            }
        });
    });
}

/// What a [`dropping_waker`] runs at its first drop.
type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// A waker whose every drop (of any clone) runs `on_drop` once: what an executor's waker may do (a task's
/// last reference, dropped, drops the task and what it holds).
fn dropping_waker(on_drop: Hook) -> Waker {
    type Shared = Mutex<Option<Box<dyn FnOnce() + Send>>>;
    const VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    unsafe fn clone(data: *const ()) -> RawWaker {
        // SAFETY: `data` is an `Arc<Hook>` from `into_raw`, with a count for this waker.
        unsafe { Arc::increment_strong_count(data.cast::<Shared>()) };
        RawWaker::new(data, &VTABLE)
    }
    unsafe fn wake(data: *const ()) {
        // SAFETY: as for `clone`; consumes this waker.
        unsafe { drop_waker(data) }
    }
    unsafe fn wake_by_ref(_: *const ()) {}
    unsafe fn drop_waker(data: *const ()) {
        // SAFETY: as for `clone`; this waker's count is given back here.
        let hook = unsafe { Arc::from_raw(data.cast::<Shared>()) };
        let run = hook.lock().unwrap().take();
        if let Some(run) = run {
            run();
        }
    }
    let data = Arc::into_raw(on_drop).cast::<()>();
    // SAFETY: the vtable's functions keep `Arc`'s count, one per waker.
    unsafe { Waker::from_raw(RawWaker::new(data, &VTABLE)) }
}

/// A pool's buffer, dropped by the waker of the task that waits for room: a waker's drop is code the crate
/// does not control, and this one gives a buffer back to the same pool.
#[test]
fn a_waker_whose_drop_gives_a_buffer_back_to_the_pool_never_deadlocks_it() {
    let _serial = serial();
    let got = ends("PinnedPool::alloc_async with a waker that frees", || {
        let ctx = common::device(0);
        let pool = PinnedPool::builder(&ctx, 1 << 20)
            .when_full(WhenFull::Wait)
            .max_wait(Duration::MAX)
            .build();
        let held = pool.alloc::<u8>(1 << 20).unwrap();
        let hook: Hook = Arc::new(Mutex::new(Some(Box::new(move || drop(held)))));
        let mut want = std::pin::pin!(pool.alloc_async::<u8>(1 << 20));
        let first = dropping_waker(hook);
        assert!(
            want.as_mut()
                .poll(&mut TaskContext::from_waker(&first))
                .is_pending(),
            "the pool had room for a second buffer"
        );
        // `first` stays alive: the first clone dropped is the pool's. Another waker: the pool replaces the one it kept, whose drop gives the buffer back.
        let second = Waker::noop();
        let mut cx = TaskContext::from_waker(second);
        for _ in 0..1000 {
            if let Poll::Ready(buffer) = want.as_mut().poll(&mut cx) {
                return buffer.map(|b| b.len());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("the buffer given back was never taken");
    });
    assert_eq!(got.unwrap(), 1 << 20);
}

/// The control of the test above: the waker's drop did run the hook (it gives the buffer back), on the second
/// poll and no later, so the deadlock the test rules out was there to be had.
#[test]
fn the_waker_replaced_above_is_dropped_by_the_second_poll() {
    let _serial = serial();
    ends("a replaced waker is dropped", || {
        let ctx = common::device(0);
        let pool = PinnedPool::builder(&ctx, 1 << 20)
            .when_full(WhenFull::Wait)
            .max_wait(Duration::MAX)
            .build();
        let _held = pool.alloc::<u8>(1 << 20).unwrap();
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let hook: Hook = Arc::new(Mutex::new(Some(Box::new(move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst)
        }))));
        let mut want = std::pin::pin!(pool.alloc_async::<u8>(1 << 20));
        let first = dropping_waker(hook);
        assert!(
            want.as_mut()
                .poll(&mut TaskContext::from_waker(&first))
                .is_pending()
        );
        let before = ran.load(std::sync::atomic::Ordering::SeqCst);
        let mut cx = TaskContext::from_waker(Waker::noop());
        assert!(want.as_mut().poll(&mut cx).is_pending());
        assert!(
            !before && ran.load(std::sync::atomic::Ordering::SeqCst),
            "the hook ran before the second poll ({before}) or not at all"
        );
    });
}

/// Polls `future` with a no-op waker until it resolves (up to 10 s).
fn block_on<F: std::future::Future>(mut future: std::pin::Pin<&mut F>) -> F::Output {
    let mut cx = TaskContext::from_waker(Waker::noop());
    for _ in 0..10_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("a future did not resolve in 10 s");
}

/// A poll after the future resolved is an `Err`, never a panic, as `PoolAlloc`'s and `Done`'s are.
#[test]
fn staged_and_context_futures_polled_again_after_they_resolved_are_an_error() {
    let _serial = serial();
    let again = ends("futures polled again", || {
        let ctx = common::device(0);
        let a = Stream::new(&ctx).unwrap();
        let pool = PinnedPool::new(&ctx, 16 << 20);
        let values = data(N, 4);
        let mut device = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
        let mut back = vec![0u32; N];
        let mut again: Vec<Result<()>> = Vec::new();
        let mut cx = TaskContext::from_waker(Waker::noop());
        {
            let mut up = std::pin::pin!(a.upload_staged_async(&pool, &values, &mut device));
            block_on(up.as_mut()).unwrap();
            again.push(ready(up.as_mut().poll(&mut cx)));
        }
        {
            let mut down = std::pin::pin!(a.download_staged_async(&pool, &device, &mut back));
            block_on(down.as_mut()).unwrap();
            again.push(ready(down.as_mut().poll(&mut cx)));
        }
        let mut done = std::pin::pin!(ctx.done());
        block_on(done.as_mut()).unwrap();
        again.push(ready(done.as_mut().poll(&mut cx)));
        assert_eq!(back, values);
        again
    });
    for (what, result) in [
        "upload_staged_async",
        "download_staged_async",
        "Context::done",
    ]
    .iter()
    .zip(again)
    {
        let error = result.expect_err(what).to_string();
        assert!(
            error.contains("polled after it resolved"),
            "{what}: {error}"
        );
    }
}

/// The outcome of a poll that must be ready.
fn ready<T>(polled: Poll<T>) -> T {
    match polled {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a future polled after it resolved is pending"),
    }
}

// ---- The class: every public call from inside every closure the crate runs, and from a waker's drop ------------

/// What the calls below run on: one context, streams `a` and `b` (a closure runs on `a`), a pool.
struct Env {
    ctx: cuda_pinned::Context,
    a: Stream,
    b: Stream,
    pool: PinnedPool,
}

impl Env {
    fn new() -> Env {
        let ctx = common::device(0);
        Env {
            a: Stream::new(&ctx).unwrap(),
            b: Stream::new(&ctx).unwrap(),
            pool: PinnedPool::new(&ctx, 16 << 20),
            ctx,
        }
    }
}

/// A call a user makes, with what it must give: `Ok`, or an `Err` containing the text where the call is refused
/// inside a closure on `a` (a capture of a stream whose untracked work is still being queued).
struct Call {
    name: &'static str,
    run: fn(&Env) -> Result<()>,
    refused_inside_a: Option<&'static str>,
}

/// A round trip on `stream`: fresh data up and back, checked.
fn round_trip(env: &Env, stream: &Stream, seed: u64) -> Result<()> {
    let values = data(N, seed);
    let host = Pinned::from_slice(&env.ctx, &values)?;
    let mut device = DeviceBuffer::<u32>::zeroed(stream, N)?;
    stream.upload(&host, &mut device)?;
    let mut back = Pinned::<u32>::zeroed(&env.ctx, N)?;
    stream.download(&device, &mut back)?;
    check(back.as_slice()? == values, "a round trip read wrong data")
}

fn check(right: bool, what: &str) -> Result<()> {
    assert!(right, "{what}");
    Ok(())
}

/// Every kind of public call, on `a` (the stream the closure is on), on `b`, and across both.
fn calls() -> Vec<Call> {
    fn ok(name: &'static str, run: fn(&Env) -> Result<()>) -> Call {
        Call {
            name,
            run,
            refused_inside_a: None,
        }
    }
    vec![
        ok("copies on a", |e| round_trip(e, &e.a, 20)),
        ok("copies on b", |e| round_trip(e, &e.b, 21)),
        ok("a crossing: written on a, read on b", |e| {
            let values = data(N, 22);
            let host = Pinned::from_slice(&e.ctx, &values)?;
            let mut device = DeviceBuffer::<u32>::zeroed(&e.a, N)?;
            e.a.upload(&host, &mut device)?;
            let mut back = Pinned::<u32>::zeroed(&e.ctx, N)?;
            e.b.download(&device, &mut back)?;
            check(back.as_slice()? == values, "a crossing read wrong data")
        }),
        ok("pageable copies on a", |e| {
            let values = data(N, 23);
            let mut device = DeviceBuffer::<u32>::zeroed(&e.a, N)?;
            e.a.upload_pageable(&values, &mut device)?;
            let mut back = vec![0u32; N];
            e.a.download_pageable(&device, &mut back)?;
            check(back == values, "pageable copies read wrong data")
        }),
        ok("staged copies on a, on worker threads", |e| {
            let values = data(4 * N, 24);
            let mut device = DeviceBuffer::<u32>::zeroed(&e.a, 4 * N)?;
            e.a.upload_staged_with(&e.pool, chunked(), &values, &mut device)?;
            let mut back = vec![0u32; 4 * N];
            e.b.download_staged_with(&e.pool, chunked(), &device, &mut back)?;
            check(back == values, "staged copies read wrong data")
        }),
        ok("staged futures on b", |e| {
            let values = data(N, 25);
            let mut device = DeviceBuffer::<u32>::zeroed(&e.b, N)?;
            block_on(std::pin::pin!(e.b.upload_staged_async(
                &e.pool,
                &values,
                &mut device
            )))?;
            let mut back = vec![0u32; N];
            block_on(std::pin::pin!(
                e.b.download_staged_async(&e.pool, &device, &mut back)
            ))?;
            check(back == values, "staged futures read wrong data")
        }),
        ok("Stream::synchronize of a", |e| e.a.synchronize()),
        ok("Stream::synchronize of b", |e| e.b.synchronize()),
        ok("Context::synchronize", |e| e.ctx.synchronize()),
        ok("Stream::query of a and b", |e| {
            e.a.query().and(e.b.query()).map(drop)
        }),
        ok("Stream::done of a, awaited", |e| {
            block_on(std::pin::pin!(e.a.done()))
        }),
        ok("Context::done, awaited", |e| {
            block_on(std::pin::pin!(e.ctx.done()))
        }),
        ok("an event recorded on b, waited for on a", |e| {
            let event = cuda_pinned::Event::without_timing(&e.ctx)?;
            e.b.record(&event)?;
            e.a.wait(&event)?;
            event.synchronize()
        }),
        ok("Stream::profile on a, nested", |e| {
            e.a.profile("nested", 0, || round_trip(e, &e.a, 26))
        }),
        ok("Stream::profile on b", |e| {
            e.b.profile("nested", 0, || round_trip(e, &e.a, 27))
        }),
        ok("Stream::enqueue_foreign on b", |e| {
            let mut device = DeviceBuffer::<u32>::zeroed(&e.b, N)?;
            // SAFETY: nothing is enqueued.
            unsafe {
                e.b.enqueue_foreign(&[cuda_pinned::Use::write(&mut device)], |_| ())
            }?;
            let mut back = Pinned::<u32>::zeroed(&e.ctx, N)?;
            e.a.download(&device, &mut back)
        }),
        ok("the pool: alloc, alloc_async, drop", |e| {
            let first = e.pool.alloc::<u8>(1 << 20)?;
            let second = block_on(std::pin::pin!(e.pool.alloc_async::<u8>(1 << 20)))?;
            drop((first, second));
            e.pool.trim()
        }),
        ok("page-locked and device memory made and dropped", |e| {
            let host = Pinned::<u32>::zeroed(&e.ctx, N)?;
            let device = DeviceBuffer::<u32>::zeroed(&e.a, N)?;
            drop((host, device));
            Ok(())
        }),
        ok("a stream made and dropped", |e| {
            let c = Stream::new(&e.ctx)?;
            round_trip(e, &c, 28)
        }),
        ok("a graph captured and launched on b", |e| {
            let host = Pinned::from_slice(&e.ctx, &data(N, 29))?;
            let mut device = DeviceBuffer::<u32>::zeroed(&e.b, N)?;
            let mut graph =
                cuda_pinned::Graph::capture(&[&e.b], || e.b.upload(&host, &mut device))?;
            graph.launch(&e.b)?;
            e.b.synchronize()
        }),
        Call {
            name: "a graph captured on a",
            run: |e| {
                let host = Pinned::from_slice(&e.ctx, &data(N, 30))?;
                let mut device = DeviceBuffer::<u32>::zeroed(&e.a, N)?;
                let mut graph =
                    cuda_pinned::Graph::capture(&[&e.a], || e.a.upload(&host, &mut device))?;
                graph.launch(&e.a)?;
                e.a.synchronize()
            },
            refused_inside_a: Some("inside a Stream::profile"),
        },
    ]
}

/// Where a call runs: inside a closure of the crate's on `a`, or inside a waker's drop.
#[derive(Clone, Copy, Debug)]
enum Inside {
    Profile,
    Foreign,
    WakerDrop,
}

/// Runs every call inside `inside`, on the closure's thread alone and then on two threads at once (the
/// closure's, and another one while the closure runs), each bounded; fails naming each call that hung, gave
/// an error it should not, or was not refused where it must be.
fn every_call_inside(inside: Inside) {
    let mut serial = serial();
    // Two threads on the same streams at once may make a wait longer than it needs (ARCHITECTURE.md, "Locks"):
    // only those FALSE DEPENDENCY reports are expected here, which is about ending, not precision.
    serial.expect_violations();
    let mut wrong = Vec::new();
    for (i, call) in calls().into_iter().enumerate() {
        for threads in [1, 2] {
            let name = format!("{} inside {inside:?}, {threads} thread(s)", call.name);
            let outcomes = common::on_a_thread(&name, DEADLINE, move || {
                let env = Arc::new(Env::new());
                let outcomes = run_inside(&env, inside, threads, calls()[i].run);
                env.ctx.synchronize().unwrap();
                outcomes
            })
            .0;
            for (thread, outcome) in outcomes.into_iter().enumerate() {
                // Only the closure's own thread runs inside the closure on `a`; the other is outside it.
                let refused = match (inside, thread) {
                    (Inside::Profile, _) => call.refused_inside_a,
                    _ => None,
                };
                // A capture refuses another thread's work on its stream, and a second capture of it.
                let beside_a_capture = threads == 2 && call.name.starts_with("a graph");
                match (outcome, refused) {
                    (Ok(()), None) => {}
                    (Err(e), Some(says)) if e.to_string().contains(says) => {}
                    // The other thread's call may come once the closure has returned.
                    (Ok(()), Some(_)) if thread == 1 => {}
                    (Err(e), _)
                        if beside_a_capture && e.to_string().contains("capturing a graph") => {}
                    (outcome, _) => wrong.push(format!("{name}, thread {thread}: {outcome:?}")),
                }
            }
        }
    }
    wrong.extend(
        serial
            .take_violations()
            .into_iter()
            .filter(|v| !v.starts_with("FALSE DEPENDENCY")),
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Runs `call` inside `inside` (and, with two threads, on another thread at the same time); the outcomes,
/// the closure's thread first.
fn run_inside(
    env: &Arc<Env>,
    inside: Inside,
    threads: usize,
    call: fn(&Env) -> Result<()>,
) -> Vec<Result<()>> {
    let both = Arc::new(Barrier::new(threads));
    let other = (threads == 2).then(|| {
        let (env, both) = (env.clone(), both.clone());
        std::thread::spawn(move || {
            both.wait();
            call(&env)
        })
    });
    let inner: Box<dyn FnOnce() -> Result<()> + Send> = {
        let env = env.clone();
        Box::new(move || {
            both.wait();
            call(&env)
        })
    };
    let own = match inside {
        Inside::Profile => env
            .a
            .profile("user work", 0, || Ok(inner()))
            .and_then(|r| r),
        Inside::Foreign => {
            let mut declared = DeviceBuffer::<u32>::zeroed(&env.a, N).unwrap();
            // SAFETY: the closure enqueues nothing on the raw stream itself.
            unsafe {
                env.a
                    .enqueue_foreign(&[cuda_pinned::Use::write(&mut declared)], |_| inner())
            }
            .and_then(|r| r)
        }
        Inside::WakerDrop => in_a_wakers_drop(env, inner),
    };
    let mut outcomes = vec![own];
    outcomes.extend(other.map(|t| t.join().unwrap()));
    outcomes
}

/// Runs `inner` inside the drop of a waker that a future of the crate replaces while it waits: a `Done` of a
/// stream held busy, polled with one waker and then another.
fn in_a_wakers_drop(env: &Env, inner: Box<dyn FnOnce() -> Result<()> + Send>) -> Result<()> {
    let busy = Stream::new(&env.ctx).unwrap();
    let held = common::hold(&busy, Duration::from_secs(1));
    let outcome: Arc<Mutex<Option<Result<()>>>> = Arc::default();
    let slot = outcome.clone();
    let hook: Hook = Arc::new(Mutex::new(Some(Box::new(move || {
        *slot.lock().unwrap() = Some(inner());
    }))));
    let mut done = std::pin::pin!(busy.done());
    let first = dropping_waker(hook);
    assert!(
        done.as_mut()
            .poll(&mut TaskContext::from_waker(&first))
            .is_pending(),
        "the held stream was found idle"
    );
    // The second poll replaces `first` (kept alive here: the crate's clone is the first dropped), whose drop
    // runs the call, inside the poll.
    let _ = done
        .as_mut()
        .poll(&mut TaskContext::from_waker(Waker::noop()));
    let ran = outcome.lock().unwrap().take();
    drop(held);
    block_on(done.as_mut()).unwrap();
    drop(first);
    ran.unwrap_or_else(|| panic!("the replaced waker was not dropped by the second poll"))
}

#[test]
fn every_call_inside_a_profiled_closure_ends() {
    every_call_inside(Inside::Profile);
}

#[test]
fn every_call_inside_a_foreign_closure_ends() {
    every_call_inside(Inside::Foreign);
}

#[test]
fn every_call_inside_a_wakers_drop_ends() {
    every_call_inside(Inside::WakerDrop);
}

// ---- Precise marks without the lock ----------------------------------------------------------------------------

/// Inside a profiled closure on `a`, the crate's upload of `x` on `a` and then untracked work (a hold, through
/// the raw handle) behind it: a read of `x` on `b` must wait only for the upload, not for the hold (on the
/// simulated driver a wait that covers the hold is a FALSE DEPENDENCY, which fails the test). While a section
/// is open, an operation closes its segment right after its work; without that, the segment would stay open
/// and its event would be recorded behind the hold.
#[test]
fn work_of_the_crate_inside_a_profiled_closure_keeps_an_event_before_the_untracked_work_after_it() {
    let _serial = serial();
    let right = ends("a read beside a hold queued in a profiled closure", || {
        let ctx = common::device(0);
        let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let values = data(N, 40);
        let host = Pinned::from_slice(&ctx, &values).unwrap();
        let mut x = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
        let gate = Arc::new(Gate::default());
        a.profile("user work", 0, || {
            a.upload(&host, &mut x)?;
            raw_hold(&a, &gate)
        })
        .unwrap();
        let mut back = Pinned::<u32>::zeroed(&ctx, N).unwrap();
        b.download(&x, &mut back).unwrap();
        // On the device, b's copy waits only for the upload: it completes while `a` is still held.
        let early = common::SIMULATED.then(|| {
            let started = std::time::Instant::now();
            while !b.query().unwrap() && started.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(1));
            }
            b.query().unwrap() && !a.query().unwrap()
        });
        gate.open();
        let right = back.as_slice().unwrap() == values;
        (right, early.unwrap_or(true))
    });
    assert!(right.0, "the read read wrong data");
    assert!(
        right.1,
        "the read on b waited for the hold queued after the upload on a"
    );
}

/// What [`raw_hold`] holds a stream behind until [`Gate::open`] (or 10 s).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// Holds `stream` until `gate` opens, through its raw handle alone (`common::hold` goes through the crate's
/// `Stream::profile`, which closes the segment itself): a host function on the simulated driver, a spin of
/// 200 ms on a GPU.
fn raw_hold(stream: &Stream, gate: &Arc<Gate>) -> Result<()> {
    #[cfg(feature = "gpu")]
    {
        let _ = gate;
        // SAFETY: a live stream; the kernel touches no memory.
        let code =
            unsafe { cuda_pinned::kernels::raw::cuda_pinned_spin(200_000_000, stream.as_raw()) };
        cuda_pinned::kernels::raw::check_launch(code, "cuda_pinned_spin")
    }
    #[cfg(not(feature = "gpu"))]
    {
        /// Waits for the gate its argument points to.
        ///
        /// # Safety
        /// The argument comes from `Arc::into_raw` of a gate, for this one call.
        unsafe extern "C" fn wait(gate: *mut std::ffi::c_void) {
            // SAFETY: as the function's contract says; the reference is dropped here.
            let gate = unsafe { Arc::from_raw(gate.cast::<Gate>()) };
            let open = gate.open.lock().unwrap();
            drop(
                gate.opened
                    .wait_timeout_while(open, Duration::from_secs(10), |open| !*open),
            );
        }
        let arg = Arc::into_raw(gate.clone()).cast_mut().cast();
        // SAFETY: a live stream; the host function takes the reference `arg` holds and makes no CUDA call.
        unsafe { cuda_pinned::driver_call!(cuLaunchHostFunc(stream.as_raw(), Some(wait), arg)) }
    }
}
