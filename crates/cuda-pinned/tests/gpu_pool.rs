//! The pinned pool on a real GPU: hits and misses, reuse only after the device work on a block completes, the
//! budget (failing or waiting), trim, both ways of pinning, many threads sharing one pool, and what the pool
//! never waits for: a thread waiting for room does not hold up another's hit, and evicting or trimming idle
//! blocks does not wait for work on other streams.

mod common;

use std::time::Duration;

use common::{data, serial, spin};

use cuda_pinned::{Context, DeviceBuffer, Error, Event, PinnedPool, Pinning, Stream, WhenFull};

fn context() -> Context {
    common::device(0)
}

/// A buffer of a zero-sized type has the length asked for, from a pool as from `Pinned::zeroed`, and takes no
/// memory. (The pool returned 0 elements for every length.)
#[test]
fn zero_sized_elements_have_the_length_asked_for() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::new(&ctx, 1 << 20);
    for len in [0, 1, 5, 1 << 40] {
        let pooled = pool.alloc::<()>(len).unwrap();
        assert_eq!((pooled.len(), pooled.as_slice().unwrap().len()), (len, len));
        let own = cuda_pinned::Pinned::<()>::zeroed(&ctx, len).unwrap();
        assert_eq!((own.len(), own.as_slice().unwrap().len()), (len, len));
    }
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses, stats.reserved), (0, 0, 0));
}

#[test]
fn hits_misses_and_size_classes() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let a = pool.alloc::<u8>(1 << 20).unwrap();
    assert_eq!(a.len(), 1 << 20);
    let first = a.as_ptr();
    drop(a);
    let b = pool.alloc::<u8>(1 << 20).unwrap();
    assert_eq!(
        b.as_ptr(),
        first,
        "an idle block of the same class is reused"
    );
    let c = pool.alloc::<u32>(300_001).unwrap(); // 1,200,004 bytes: a class of its own, under 12.5% over
    let stats = pool.stats();
    assert_eq!((stats.hits, stats.misses), (1, 2));
    assert_eq!(stats.requested_in_use, (1 << 20) + 1_200_004);
    assert!(stats.in_use >= stats.requested_in_use && stats.in_use - (1 << 20) < 1_200_004 * 9 / 8);
    assert!(stats.pin_time > Duration::ZERO);
    drop((b, c));
    assert_eq!(pool.stats().in_use, 0);
    // A zero-length buffer needs no block.
    assert!(pool.alloc::<u64>(0).unwrap().is_empty());
}

/// A block given back while an upload still reads it must not be handed out again until the upload is done.
#[test]
fn a_block_is_reused_only_after_its_copy_completes() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::new(&ctx, 64 << 20);
    let len = 1 << 20;
    let want = data(len, 1);
    let mut device = DeviceBuffer::<u32>::zeroed(&stream, len).unwrap();
    let mut src = pool.alloc::<u32>(len).unwrap();
    src.as_mut_slice().unwrap().copy_from_slice(&want);
    let block = src.as_ptr();
    spin(&stream, 100);
    stream.upload(&src, &mut device).unwrap();
    drop(src); // back to the pool, pending
    let mut other = pool.alloc::<u32>(len).unwrap(); // must not be the pending block
    assert_ne!(
        other.as_ptr(),
        block,
        "a block was reused while an upload still read it"
    );
    other.as_mut_slice().unwrap().fill(0xdead_beef);
    let mut back = vec![0u32; len];
    stream.download_pageable(&device, &mut back).unwrap();
    assert_eq!(back, want);
    drop(other);
    // Now both are idle: the next request of the class is a hit.
    let hits = pool.stats().hits;
    let _again = pool.alloc::<u32>(len).unwrap();
    assert_eq!(pool.stats().hits, hits + 1);
}

#[test]
fn the_budget_is_never_exceeded_failing_or_waiting() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::new(&ctx, 4 << 20);
    let held = pool.alloc::<u8>(3 << 20).unwrap();
    let e = pool.alloc::<u8>(3 << 20).unwrap_err();
    assert!(matches!(e, Error::PoolExhausted { .. }), "{e}");
    assert!(
        e.to_string().contains("within its budget of 4.0 MiB"),
        "{e}"
    );
    assert!(
        matches!(pool.alloc::<u8>(5 << 20), Err(Error::PoolExhausted { .. })),
        "larger than the budget"
    );
    drop(held);
    assert!(pool.stats().peak_reserved <= 4 << 20);

    // Waiting: for a holder on another thread to give its buffer back...
    let waiting = PinnedPool::builder(&ctx, 4 << 20)
        .when_full(WhenFull::Wait)
        .build();
    let held = waiting.alloc::<u8>(3 << 20).unwrap();
    let giver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
    });
    let got = waiting.alloc::<u8>(3 << 20).unwrap();
    giver.join().unwrap();
    // ...and for the device work on a given-back block to complete.
    let stream = Stream::new(&ctx).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&stream, 3 << 20).unwrap();
    spin(&stream, 50);
    stream.upload(&got, &mut device).unwrap();
    drop(got);
    let again = waiting.alloc::<u8>(3 << 20).unwrap();
    assert!(
        stream.query().unwrap(),
        "the block came back only after the upload completed"
    );
    drop(again);
    assert!(waiting.stats().peak_reserved <= 4 << 20);
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn trim_unpins_idle_blocks_and_both_pinnings_work() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    for pinning in [Pinning::HostAlloc, Pinning::Register, Pinning::Auto] {
        let pool = PinnedPool::builder(&ctx, 256 << 20)
            .pinning(pinning)
            .build();
        let len = 10_000_019;
        let want = data(len, 7);
        let mut host = pool.alloc::<u32>(len).unwrap();
        assert!(
            host.as_slice().unwrap().iter().all(|&x| x == 0),
            "{pinning:?}: a new block is zeroed"
        );
        host.as_mut_slice().unwrap().copy_from_slice(&want);
        let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
        stream.upload(&host, &mut device).unwrap();
        let mut back = pool.alloc::<u32>(len).unwrap();
        stream.download(&device, &mut back).unwrap();
        assert_eq!(back.as_slice().unwrap(), &want[..], "{pinning:?}");
        drop((host, back));
        stream.synchronize().unwrap();
        pool.trim().unwrap();
        let stats = pool.stats();
        assert_eq!(
            (stats.cached, stats.reserved),
            (0, 0),
            "{pinning:?}: {stats:?}"
        );
    }
}

/// Eight threads share one pool (waiting when full), each round-tripping data of random sizes through pooled
/// buffers on a stream of its own. Every buffer's data must come back intact: a block handed to two holders at
/// once, or reused under a copy, would mix the threads' patterns.
#[test]
fn many_threads_share_one_pool() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::builder(&ctx, 96 << 20)
        .when_full(WhenFull::Wait)
        .build();
    std::thread::scope(|scope| {
        for thread in 0..8u64 {
            let (pool, ctx) = (pool.clone(), ctx.clone());
            scope.spawn(move || {
                let stream = Stream::new(&ctx).unwrap();
                let mut state = thread + 1;
                for round in 0..60u64 {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let len = 1 + (state >> 33) as usize % (3 << 20);
                    let want = data(len, thread * 1000 + round);
                    let mut src = pool.alloc::<u32>(len).unwrap();
                    src.as_mut_slice().unwrap().copy_from_slice(&want);
                    let mut device = DeviceBuffer::<u32>::uninit(&stream, len).unwrap();
                    stream.upload(&src, &mut device).unwrap();
                    drop(src); // pending while the upload runs
                    let mut back = pool.alloc::<u32>(len).unwrap();
                    stream.download(&device, &mut back).unwrap();
                    assert_eq!(
                        back.as_slice().unwrap(),
                        &want[..],
                        "thread {thread}, round {round}"
                    );
                }
            });
        }
    });
    let stats = pool.stats();
    println!("{stats:?}");
    assert!(stats.peak_reserved <= 96 << 20 && stats.in_use == 0);
    assert!(stats.hits > 0);
    ctx.check_deferred_errors().unwrap();
}

/// An event recorded on `stream` now: complete once the work enqueued there so far has run.
fn recorded(ctx: &Context, stream: &Stream) -> Event {
    let event = Event::without_timing(ctx).unwrap();
    event.record(stream).unwrap();
    event
}

/// A thread waiting for room, which only a pending block behind a 1 s spin can make, must not hold up another
/// thread's hit on a cached block of another class: the wait happens without the pool's lock. Whether the hit
/// came back while the spin still ran is read from an event recorded after it, not from a clock.
#[test]
fn a_thread_waiting_for_room_does_not_hold_up_another_threads_hit() {
    let _serial = serial();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let pool = PinnedPool::builder(&ctx, 8 << 20)
        .when_full(WhenFull::Wait)
        .build();
    drop(pool.alloc::<u8>(1 << 20).unwrap()); // cached
    let big = pool.alloc::<u8>(6 << 20).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&stream, 6 << 20).unwrap();
    spin(&stream, 1000);
    stream.upload(&big, &mut device).unwrap();
    let done = recorded(&ctx, &stream);
    drop(big); // pending until the upload, behind the spin, has run
    // 6 MiB pending leave 2 MiB: 4 MiB can only come from the pending block.
    let waiter = {
        let pool = pool.clone();
        std::thread::spawn(move || pool.alloc::<u8>(4 << 20).map(drop))
    };
    // Time for the waiter to start waiting (had it not yet, the hit would only prove less).
    std::thread::sleep(Duration::from_millis(100));
    let hit = pool.alloc::<u8>(1 << 20).unwrap();
    assert!(
        !done.query().unwrap(),
        "the hit came back only after the spin: it waited behind the waiting thread"
    );
    assert_eq!(pool.stats().hits, 1);
    waiter.join().unwrap().unwrap();
    assert!(
        done.query().unwrap(),
        "the waiter got its room before the pending block's upload ran"
    );
    drop((hit, device));
    assert!(pool.stats().peak_reserved <= 8 << 20);
    ctx.check_deferred_errors().unwrap();
}

/// Evicting an idle block to make room, and trimming, unpin on the crate's release thread: they return while a
/// spin runs on another stream (the driver's unpinning waits for all work on the device), and the blocks are
/// unpinned once the context is synchronized.
#[test]
fn eviction_and_trim_do_not_wait_for_work_on_other_streams() {
    let _serial = serial();
    let ctx = context();
    let busy = Stream::new(&ctx).unwrap();
    ctx.synchronize().unwrap();
    #[cfg(not(feature = "gpu"))]
    let before = common::sim().unwrap().live().pinned_allocations;
    let pool = PinnedPool::builder(&ctx, 8 << 20)
        .pinning(Pinning::HostAlloc)
        .build();
    drop(pool.alloc::<u8>(4 << 20).unwrap());
    drop(pool.alloc::<u8>(1 << 20).unwrap());
    spin(&busy, 1000);
    let done = recorded(&ctx, &busy);
    // 5 MiB cached: 6 MiB more evict the least recently used block, the 4 MiB one.
    let big = pool.alloc::<u8>(6 << 20).unwrap();
    assert!(
        !done.query().unwrap(),
        "the eviction waited for the spin on another stream"
    );
    assert_eq!(pool.stats().evictions, 1);
    drop(big);
    pool.trim().unwrap();
    assert!(
        !done.query().unwrap(),
        "trim waited for the spin on another stream"
    );
    let stats = pool.stats();
    assert_eq!((stats.cached, stats.reserved), (0, 0));
    ctx.synchronize().unwrap();
    #[cfg(not(feature = "gpu"))]
    assert_eq!(
        common::sim().unwrap().live().pinned_allocations,
        before,
        "every block of the pool unpinned"
    );
    ctx.check_deferred_errors().unwrap();
}
