//! Fault injection on the simulated driver: for each public function that calls the driver, every driver call
//! it makes fails in turn, and each time an `Err` must come back (from the function, or from
//! `Context::check_deferred_errors` where the call was in a destructor), nothing may panic, the simulator must
//! find no memory freed under queued work, and nothing may leak, except where the crate leaks on purpose:
//! memory whose release, or the wait before it, failed (the safety model's rule 4), which it reports.
//!
//! Only without feature `gpu`: a real driver cannot be made to fail on demand.
#![cfg(not(feature = "gpu"))]

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::{serial, sim};
use cuda_pinned::sys::CUdevice_attribute;
use cuda_pinned::{
    Context, Device, DeviceBuffer, Event, Ledger, Pinned, PinnedPool, Pinning, Prefetcher,
    Registered, Result, Stream, WhenFull,
};

/// Calls that release something: when one fails, its object stays.
const RELEASES: &[&str] = &[
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemHostUnregister",
    "cuStreamDestroy_v2",
    "cuEventDestroy_v2",
    "cuDevicePrimaryCtxRelease_v2",
];

/// Calls that order work or find out whether it is done: when one fails before a release, the crate cannot
/// know that the memory is unused and leaks it on purpose (the safety model's rule 4).
const ORDERING: &[&str] = &[
    "cuEventCreate",
    "cuEventRecord",
    "cuStreamWaitEvent",
    "cuEventQuery",
    "cuStreamQuery",
    "cuEventSynchronize",
    "cuStreamSynchronize",
];

/// What must not leak: memory and streams. (Events may outlive a failed operation inside the trackers of
/// memory waiting in the deferred-release list until a later poll; they are not memory anyone relies on.)
fn memory(live: cuda_pinned_sim::Live) -> cuda_pinned_sim::Live {
    cuda_pinned_sim::Live { events: 0, ..live }
}

/// What each case starts from, made before the calls are counted.
struct Fixture {
    ctx: Context,
    a: Stream,
    b: Stream,
}

/// Runs `op` once to trace its driver calls, then once per call with that call failing. Returns how many
/// calls were failed.
fn each_call_fails(name: &str, op: impl Fn(&Fixture) -> Result<()>) -> usize {
    let sim = sim().expect("these tests run on the simulated driver");
    let ctx = Context::on(0).unwrap();
    let fixture = Fixture {
        a: Stream::new(&ctx).unwrap(),
        b: Stream::new(&ctx).unwrap(),
        ctx,
    };
    let settle = |f: &Fixture| {
        sim.clear_faults();
        // Deferred releases run at a context synchronize once their work is done; a second pass catches
        // what the first one's completion queued.
        let _ = f.ctx.synchronize();
        let _ = f.ctx.synchronize();
        f.ctx.check_deferred_errors()
    };
    settle(&fixture).unwrap();
    let baseline = sim.live();

    sim.trace_start();
    op(&fixture).unwrap_or_else(|e| panic!("{name}: fails with no fault injected: {e}"));
    let calls = sim.trace_stop();
    settle(&fixture)
        .unwrap_or_else(|e| panic!("{name}: deferred error with no fault injected: {e}"));
    assert_eq!(sim.live(), baseline, "{name}: leaks with no fault injected");
    assert!(!calls.is_empty(), "{name}: makes no driver call");

    // Each call of the trace, by function and occurrence (a call's global index can shift between runs, as
    // polls depend on timing; the n-th call of one function rarely does).
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    let mut swallowed = Vec::new();
    for function in &calls {
        let nth = {
            let n = seen.entry(function).or_default();
            *n += 1;
            *n
        };
        let what = format!("{name}: {function} #{nth} failing");
        let (violations, injected) = (sim.violations().len(), sim.injected().len());
        // Each case is judged against what was live just before it, not before the first: memory an earlier
        // case leaked on purpose (a failed release, or a failed wait before one) stays leaked for good, and
        // would otherwise count against every case after it.
        let before = sim.live();
        sim.fail(&format!("{function}:{nth}:CUDA_ERROR_UNKNOWN"))
            .unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| op(&fixture)));
        let deferred = settle(&fixture);
        let result = result.unwrap_or_else(|_| panic!("{what}: panicked"));
        let new: Vec<String> = sim.violations().split_off(violations);
        assert!(new.is_empty(), "{what}: the simulator found {new:?}");
        if sim.injected().len() == injected {
            continue; // this run made fewer such calls: nothing failed
        }
        match (&result, &deferred) {
            (Err(e), Ok(())) => {
                assert!(
                    e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                    "{what}: the error lost its cause: {e}"
                );
                // A release the driver refused leaves its object behind: that is the driver's doing.
                if !RELEASES.contains(&function.as_str())
                    && !ORDERING.contains(&function.as_str())
                    && !e.to_string().contains("leaked")
                {
                    assert_eq!(
                        memory(sim.live()),
                        memory(before),
                        "{what}: leaked after returning {e}"
                    );
                }
            }
            (_, Err(e)) => {
                // A destructor's call failed: reported here; the memory concerned may be leaked on purpose.
                assert!(
                    e.to_string().contains("CUDA_ERROR_UNKNOWN"),
                    "{what}: the error lost its cause: {e}"
                );
            }
            // Dropping the last handle of a context cannot report anything; a failed release leaves it retained.
            (Ok(()), Ok(())) if function == "cuDevicePrimaryCtxRelease_v2" => {}
            (Ok(()), Ok(())) => swallowed.push(what),
        }
    }
    assert!(swallowed.is_empty(), "no error came back: {swallowed:#?}");
    // The harness itself leaves nothing behind once its fixture is gone.
    drop(fixture);
    calls.len()
}

macro_rules! fault_tests {
    ($($(#[$attr:meta])* $test:ident: |$f:ident| $body:expr;)*) => {
        $(
            #[test]
            $(#[$attr])*
            fn $test() {
                let _serial = serial();
                let calls = each_call_fails(stringify!($test), |$f: &Fixture| -> Result<()> { $body });
                eprintln!("{}: {calls} driver calls, each failed in turn", stringify!($test));
            }
        )*
    };
}

fault_tests! {
    device_queries: |_f| {
        let device = Device::get(0)?;
        Device::count()?;
        device.name()?;
        device.uuid()?;
        device.compute_capability()?;
        device.total_memory()?;
        device.pci_bus_id()?;
        device.async_engine_count()?;
        device.can_map_host_memory()?;
        device.supports_memory_pools()?;
        Ok(())
    };
    device_enumeration: |_f| {
        let devices = Device::all()?;
        devices[0].free_memory()?;
        devices[0].attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(())
    };
    context_on_and_queries: |_f| {
        let ctx = Context::on(0)?;
        ctx.memory_info()?;
        ctx.stream_priority_range()?;
        ctx.synchronize()?;
        // Errors of its destructors' calls are kept in it: ask before it goes.
        ctx.check_deferred_errors()
    };
    streams: |f| {
        let s = Stream::with_priority(&f.ctx, -1)?;
        s.priority()?;
        s.query()?;
        s.synchronize()?;
        let t = Stream::new(&f.ctx)?;
        t.synchronize()
    };
    events: |f| {
        let (start, end) = (Event::new(&f.ctx)?, Event::new(&f.ctx)?);
        start.record(&f.a)?;
        end.record(&f.a)?;
        f.b.wait(&end)?;
        end.synchronize()?;
        end.query()?;
        end.elapsed_since(&start)?;
        Event::without_timing(&f.ctx)?.record(&f.b)
    };
    device_buffers: |f| {
        let zeroed = DeviceBuffer::<u32>::zeroed(&f.a, 1000)?;
        let uninit = DeviceBuffer::<u64>::uninit(&f.b, 77)?;
        drop((zeroed, uninit));
        Ok(())
    };
    pinned_memory: |f| {
        let p = Pinned::<u32>::zeroed(&f.ctx, 1000)?;
        let q = Pinned::from_slice(&f.ctx, &[1u8, 2, 3])?;
        let wc = cuda_pinned::PinnedBuilder::new(&f.ctx).portable(true).device_mapped(true).write_combined(true).zeroed::<u16>(50)?;
        drop((p, q, wc));
        Ok(())
    };
    registered_vectors: |f| {
        let r = Registered::new(&f.ctx, vec![7u32; 5000])?;
        let v = r.into_vec()?;
        assert_eq!(v[4999], 7);
        Ok(())
    };
    copies_across_streams: |f| {
        let want: Vec<u32> = common::data(4096, 3);
        let src = Pinned::from_slice(&f.ctx, &want)?;
        let mut d0 = DeviceBuffer::<u32>::uninit(&f.a, want.len())?;
        let mut d1 = DeviceBuffer::<u32>::uninit(&f.a, want.len())?;
        let mut back = Pinned::<u32>::zeroed(&f.ctx, want.len())?;
        f.a.upload(&src, &mut d0)?;
        f.b.copy(&d0, &mut d1)?;
        f.a.download(&d1, &mut back)?;
        assert_eq!(back.as_slice()?, &want[..]);
        Ok(())
    };
    registered_access: |f| {
        let mut r = Registered::new(&f.ctx, vec![1u32; 4096])?;
        let mut d = DeviceBuffer::<u32>::zeroed(&f.a, r.len())?;
        f.a.upload(&r, &mut d)?;
        r.try_as_mut_slice()?;
        r.as_mut_slice()?.fill(2);
        f.b.download(&d, &mut r)?;
        r.try_as_slice()?;
        assert_eq!(r.as_slice()?[4095], 1);
        Ok(())
    };
    pageable_copies: |f| {
        let want: Vec<u16> = (0..3000).collect();
        let mut d = DeviceBuffer::<u16>::uninit(&f.a, want.len())?;
        f.a.upload_pageable(&want, &mut d)?;
        let mut back = vec![0u16; want.len()];
        f.b.download_pageable(&d, &mut back)?;
        assert_eq!(back, want);
        Ok(())
    };
    host_access_waits: |f| {
        let mut p = Pinned::<u8>::zeroed(&f.ctx, 100)?;
        let d = DeviceBuffer::<u8>::zeroed(&f.a, 100)?;
        f.a.download(&d, &mut p)?;
        p.try_as_slice()?;
        p.as_mut_slice()?.fill(1);
        Ok(())
    };
    pool_alloc_and_trim: |f| {
        for pinning in [Pinning::HostAlloc, Pinning::Register] {
            let pool = PinnedPool::builder(&f.ctx, 8 << 20).pinning(pinning).when_full(WhenFull::Wait).build();
            let mut p = pool.alloc::<u32>(1000)?;
            let d = DeviceBuffer::<u32>::zeroed(&f.a, 1000)?;
            f.a.download(&d, &mut p)?;
            drop(p);
            let q = pool.try_alloc::<u32>(1000)?;
            drop(q);
            f.a.synchronize()?;
            pool.trim()?;
        }
        Ok(())
    };
    pool_eviction: |f| {
        // Room for one block of two pages: a request of another class unpins it to pin its own.
        let pool = PinnedPool::builder(&f.ctx, 2 << 12).pinning(Pinning::HostAlloc).build();
        drop(pool.alloc::<u8>(2 << 12)?);
        drop(pool.alloc::<u8>(1 << 12)?);
        assert_eq!(pool.stats().evictions, 1, "the second request evicts the first block");
        pool.trim()
    };
    staged_transfers: |f| {
        let pool = PinnedPool::new(&f.ctx, 4 << 20);
        let options = cuda_pinned::staging::StagingOptions { chunk_bytes: 1 << 20, threads: 2, pageable_below: 0 };
        let want: Vec<u8> = (0..(3 << 20) + 5).map(|i| i as u8).collect();
        let mut d = DeviceBuffer::<u8>::uninit(&f.a, want.len())?;
        f.a.upload_staged_with(&pool, options, &want, &mut d)?;
        let mut back = vec![0u8; want.len()];
        f.b.download_staged_with(&pool, options, &d, &mut back)?;
        assert!(back == want);
        Ok(())
    };
    ledger: |f| {
        let ledger = Ledger::new();
        let s = Stream::with_ledger(&f.ctx, &ledger)?;
        let p = Pinned::<u32>::zeroed(&f.ctx, 256)?;
        let mut d = DeviceBuffer::<u32>::uninit(&s, 256)?;
        s.upload(&p, &mut d)?;
        s.synchronize()?;
        ledger.report()?;
        Ok(())
    };
    ledger_record_and_profile: |f| {
        let ledger = Ledger::new();
        let s = Stream::with_ledger(&f.ctx, &ledger)?;
        s.record(&Event::without_timing(&f.ctx)?)?;
        let p = Pinned::<u8>::zeroed(&f.ctx, 64)?;
        let mut d = s.profile("allocate and upload", 64, || {
            let mut d = DeviceBuffer::<u8>::uninit(&s, 64)?;
            s.upload(&p, &mut d)?;
            Ok(d)
        })?;
        s.download(&d, &mut Pinned::<u8>::zeroed(&f.ctx, 64)?)?;
        s.copy(&DeviceBuffer::<u8>::zeroed(&s, 64)?, &mut d)?;
        ledger.report()?;
        ledger.clear();
        Ok(())
    };
    prefetcher_of_several_parts_unordered: |f| {
        let pool = PinnedPool::new(&f.ctx, 1 << 20);
        let batches = Prefetcher::<(Pinned<u32>, [Pinned<u8>; 2])>::builder(&pool, &f.a, (256, [16, 32]))
            .indices([4, 1, 3])
            .workers(2)
            .depth(2)
            .ordered(false)
            .copy_stream(&f.b)
            .build(|i, (x, [y, z]): &mut (Pinned<u32>, [Pinned<u8>; 2])| {
                x.as_mut_slice()?.fill(i as u32);
                y.as_mut_slice()?.fill(i as u8);
                z.as_mut_slice()?.fill(!(i as u8));
                Ok(())
            })?;
        let mut scratch = DeviceBuffer::<u32>::uninit(&f.a, 256)?;
        for batch in batches {
            let mut batch = batch?;
            f.a.copy(&batch.device().0, &mut scratch)?;
            f.a.copy(&scratch, &mut batch.device_mut().0)?;
        }
        Ok(())
    };
    prefetcher: |f| {
        let pool = PinnedPool::new(&f.ctx, 1 << 20);
        let batches = Prefetcher::<Pinned<u32>>::builder(&pool, &f.a, 1024)
            .batches(3)
            .workers(1)
            .depth(2)
            .build(|i, host: &mut Pinned<u32>| {
                host.as_mut_slice()?.fill(i as u32);
                Ok(())
            })?;
        for batch in batches {
            batch?;
        }
        Ok(())
    };
}
