//! The pinned pool's waits and releases on the simulated driver: every wait of a full pool ends (at its
//! deadline, or at once where nothing can make room), element types aligned beyond a page are refused, and
//! unpinning happens on the crate's release thread, whose failures come back through the context. The tests
//! that watch a spin on another stream are in `gpu_pool.rs`, which runs here too.
//!
//! Each wait that used to hang runs on a thread of its own, bounded: a regression fails instead of hanging.
//!
//! Only without feature `gpu`: the fault injection and the live counts are the simulator's.
#![cfg(not(feature = "gpu"))]

mod common;

use std::time::Duration;

use common::{on_a_thread, serial, sim};
use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{
    Context, DeviceBuffer, Error, Pinned, PinnedPool, Pinning, Prefetcher, Stream, WhenFull,
};

/// How long a call that must end may take before the test calls it a hang: far more than any of them needs.
const HANG: Duration = Duration::from_secs(20);

fn context() -> Context {
    Context::on(0).unwrap()
}

/// The time a `PoolExhausted` says it waited; panics on any other result.
fn waited<T>(result: cuda_pinned::Result<T>, what: &str) -> Duration {
    match result {
        Err(Error::PoolExhausted { waited, .. }) => waited,
        Err(e) => panic!("{what}: expected PoolExhausted, got {e}"),
        Ok(_) => panic!("{what}: expected PoolExhausted, got a buffer"),
    }
}

#[test]
fn a_forgotten_buffer_ends_a_waiting_alloc_at_the_deadline() {
    let _serial = serial();
    let ctx = context();
    let max_wait = Duration::from_millis(200);
    let pool = PinnedPool::builder(&ctx, 4 << 20)
        .when_full(WhenFull::Wait)
        .max_wait(max_wait)
        .build();
    // Forgotten: its block stays in use for the life of the pool, and nothing can bring it back.
    std::mem::forget(pool.alloc::<u8>(3 << 20).unwrap());
    assert_eq!(
        waited(pool.try_alloc::<u8>(3 << 20), "try_alloc"),
        Duration::ZERO,
        "try_alloc never waits"
    );
    let waiting = pool.clone();
    let (result, took) = on_a_thread("alloc after a forgotten buffer", HANG, move || {
        waiting.alloc::<u8>(3 << 20).map(drop)
    });
    let e = result.as_ref().unwrap_err().clone();
    let waited = waited(result, "alloc");
    assert!(
        waited >= max_wait && took >= waited,
        "gave up after {waited:?} (took {took:?}), before the deadline of {max_wait:?}"
    );
    let message = e.to_string();
    assert!(message.contains("after waiting"), "{message}");
    assert!(message.contains("3.0 MiB held now"), "{message}");
    // Room that is there is still served.
    drop(pool.alloc::<u8>(1 << 20).unwrap());
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.reserved), (3 << 20, 4 << 20));
}

#[test]
fn a_waiting_pool_whose_budget_the_caller_holds_fails_at_the_deadline() {
    let _serial = serial();
    let ctx = context();
    let max_wait = Duration::from_millis(200);
    let pool = PinnedPool::builder(&ctx, 4 << 20)
        .when_full(WhenFull::Wait)
        .max_wait(max_wait)
        .build();
    let held = pool.alloc::<u8>(4 << 20).unwrap();
    let waiting = pool.clone();
    let (result, _) = on_a_thread("alloc while the caller holds the budget", HANG, move || {
        waiting.alloc::<u8>(1).map(drop)
    });
    assert!(waited(result, "alloc") >= max_wait);
    // Once the holder gives its buffer back, the same request is served at once.
    drop(held);
    drop(pool.alloc::<u8>(1).unwrap());
    assert_eq!(
        pool.stats().hits,
        0,
        "another class: the cached block was evicted"
    );
    assert_eq!(pool.stats().evictions, 1);
}

#[test]
fn a_staged_transfer_whose_caller_holds_the_budget_goes_through_the_drivers_path_at_once() {
    let _serial = serial();
    let ctx = context();
    // The pool's own deadline is the default (a minute): the staged transfer must not wait for it.
    let pool = PinnedPool::builder(&ctx, 8 << 20)
        .when_full(WhenFull::Wait)
        .build();
    let held = pool.alloc::<u8>(8 << 20).unwrap();
    let misses = pool.stats().misses;
    let (stream, transfer_pool) = (Stream::new(&ctx).unwrap(), pool.clone());
    let (result, _) = on_a_thread("a staged upload with the pool held", HANG, move || {
        // Staged at any size, so that the pool is asked.
        let options = StagingOptions::default().chunked_from(0);
        let src: Vec<u32> = (0..1 << 20).collect();
        let mut dst = DeviceBuffer::<u32>::zeroed(&stream, src.len()).unwrap();
        stream.upload_staged_with(&transfer_pool, options, &src, &mut dst)?;
        let mut back = vec![0u32; src.len()];
        stream.download_staged_with(&transfer_pool, options, &dst, &mut back)?;
        Ok::<bool, Error>(back == src)
    });
    assert!(
        result.unwrap(),
        "the data made the round trip through the driver's path"
    );
    assert_eq!(pool.stats().misses, misses, "no staging buffer was pinned");
    drop(held);
    assert_eq!(pool.stats().in_use, 0);
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}

#[test]
fn a_prefetcher_whose_depth_does_not_fit_fails_at_once_on_a_waiting_pool() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::builder(&ctx, 64 << 20)
        .when_full(WhenFull::Wait)
        .build();
    let consumer = Stream::new(&ctx).unwrap();
    let (builder_pool, builder_consumer) = (pool.clone(), consumer.clone());
    // Eight slots of 32 MiB in 64 MiB: the builder would wait for the two it holds itself.
    let (result, _) = on_a_thread(
        "building a prefetcher too deep for its pool",
        HANG,
        move || {
            Prefetcher::<Pinned<u8>>::builder(&builder_pool, &builder_consumer, 32 << 20)
                .batches(100)
                .workers(4)
                .depth(8)
                .build(|_, _| Ok(()))
                .map(drop)
        },
    );
    assert_eq!(waited(result, "build"), Duration::ZERO);
    assert_eq!(pool.stats().in_use, 0, "the slots allocated went back");
    // Two slots fit: the same pool serves a prefetcher of that depth.
    let batches = Prefetcher::<Pinned<u8>>::builder(&pool, &consumer, 32 << 20)
        .batches(4)
        .workers(2)
        .depth(2)
        .build(|i, batch| {
            batch.as_mut_slice()?.fill(i as u8);
            Ok(())
        })
        .unwrap();
    assert_eq!(batches.map(|b| b.unwrap().index()).sum::<usize>(), 6);
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// An element type aligned to 64 KiB, more than a pool block (aligned to a page) guarantees.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(65536))]
struct Aligned64K([[u8; 4096]; 16]);

/// An element type aligned to exactly a page: what a pool block guarantees.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(4096))]
struct AlignedPage([u8; 4096]);

#[test]
fn element_types_aligned_beyond_a_page_are_refused_before_anything_is_taken() {
    let _serial = serial();
    let ctx = context();
    let pool = PinnedPool::new(&ctx, 1 << 20);
    for len in [1, 0] {
        for result in [
            pool.alloc::<Aligned64K>(len),
            pool.try_alloc::<Aligned64K>(len),
        ] {
            match result {
                Err(Error::InvalidArgument { message, .. }) => {
                    assert!(message.contains("aligned to 65536 bytes"), "{message}");
                    assert!(message.contains("4096 bytes"), "{message}");
                }
                Err(e) => panic!("expected an invalid-argument error, got {e}"),
                Ok(p) => panic!(
                    "an over-aligned buffer of {len} at {:p} ({} bytes off)",
                    p.as_ptr(),
                    p.as_ptr() as usize % 65536
                ),
            }
        }
    }
    let stats = pool.stats();
    assert_eq!((stats.misses, stats.hits, stats.reserved), (0, 0, 0));
    let page = pool.alloc::<AlignedPage>(3).unwrap();
    assert_eq!(page.as_ptr() as usize % 4096, 0);
    assert_eq!(page.len(), 3);
}

#[test]
fn unpinning_runs_on_the_release_thread_and_its_failures_come_through_the_context() {
    let _serial = serial();
    let sim = sim().expect("these tests run on the simulated driver");
    let ctx = context();
    // Whatever earlier tests left to release goes first, so that the fault below hits this pool's unpin.
    ctx.synchronize().unwrap();
    let _ = ctx.check_deferred_errors();
    let before = sim.live().pinned_allocations;
    let pool = PinnedPool::builder(&ctx, 8 << 20)
        .pinning(Pinning::HostAlloc)
        .build();
    drop(pool.alloc::<u8>(4 << 20).unwrap());
    drop(pool.alloc::<u8>(1 << 20).unwrap());
    assert_eq!(sim.live().pinned_allocations, before + 2);

    // The first unpin fails: trim has nothing to report (the unpins happen after it returns); the context does.
    sim.fail("cuMemFreeHost:1:CUDA_ERROR_UNKNOWN").unwrap();
    pool.trim().unwrap();
    let stats = pool.stats();
    assert_eq!(
        (stats.cached, stats.reserved),
        (0, 0),
        "out of the budget at once"
    );
    ctx.synchronize().unwrap();
    sim.clear_faults();
    let e = ctx.check_deferred_errors().unwrap_err();
    let message = e.to_string();
    assert!(message.contains("CUDA_ERROR_UNKNOWN"), "{message}");
    assert!(message.contains("leaked"), "{message}");
    assert_eq!(
        sim.live().pinned_allocations,
        before + 1,
        "one block unpinned, one leaked on purpose"
    );

    // An eviction too: the 4 MiB block makes room for 6 MiB, and is unpinned on the release thread.
    drop(pool.alloc::<u8>(4 << 20).unwrap());
    let big = pool.alloc::<u8>(6 << 20).unwrap();
    assert_eq!(pool.stats().evictions, 1);
    ctx.synchronize().unwrap();
    assert_eq!(
        sim.live().pinned_allocations,
        before + 2,
        "the leaked block and the 6 MiB one"
    );
    drop((big, pool));
    ctx.synchronize().unwrap();
    assert_eq!(
        sim.live().pinned_allocations,
        before + 1,
        "only the leaked block"
    );
    ctx.check_deferred_errors().unwrap();
}
