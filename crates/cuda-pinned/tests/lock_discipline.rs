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
    assert!(buffers >= 2 && each == 64 << 10, "{buffers} buffers of {each} bytes");
}

#[test]
fn a_profiled_closure_using_a_buffer_on_another_stream_beside_a_thread_using_it_on_this_one_ends() {
    let _serial = serial();
    let (first, second) = ends("profile on a reading x on b, beside a read of x on a", || {
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
    });
    assert!(first && second, "read on b right: {first}, on a right: {second}");
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
    assert!(right, "an upload made inside a profiled closure read wrong data");
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

/// A waker whose every drop (of any clone) runs `on_drop` once: what an executor's waker may do (a task's
/// last reference, dropped, drops the task and what it holds).
fn dropping_waker(on_drop: Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>) -> Waker {
    type Hook = Mutex<Option<Box<dyn FnOnce() + Send>>>;
    const VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    unsafe fn clone(data: *const ()) -> RawWaker {
        // SAFETY: `data` is an `Arc<Hook>` from `into_raw`, with a count for this waker.
        unsafe { Arc::increment_strong_count(data.cast::<Hook>()) };
        RawWaker::new(data, &VTABLE)
    }
    unsafe fn wake(data: *const ()) {
        // SAFETY: as for `clone`; consumes this waker.
        unsafe { drop_waker(data) }
    }
    unsafe fn wake_by_ref(_: *const ()) {}
    unsafe fn drop_waker(data: *const ()) {
        // SAFETY: as for `clone`; this waker's count is given back here.
        let hook = unsafe { Arc::from_raw(data.cast::<Hook>()) };
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
        let hook: Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>> =
            Arc::new(Mutex::new(Some(Box::new(move || drop(held)))));
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
        let hook: Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>> = Arc::new(Mutex::new(Some(
            Box::new(move || flag.store(true, std::sync::atomic::Ordering::SeqCst)),
        )));
        let mut want = std::pin::pin!(pool.alloc_async::<u8>(1 << 20));
        let first = dropping_waker(hook);
        assert!(want.as_mut().poll(&mut TaskContext::from_waker(&first)).is_pending());
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
    for (what, result) in ["upload_staged_async", "download_staged_async", "Context::done"]
        .iter()
        .zip(again)
    {
        let error = result.expect_err(what).to_string();
        assert!(error.contains("polled after it resolved"), "{what}: {error}");
    }
}

/// The outcome of a poll that must be ready.
fn ready<T>(polled: Poll<T>) -> T {
    match polled {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a future polled after it resolved is pending"),
    }
}
