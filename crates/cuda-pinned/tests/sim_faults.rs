//! Fault injection on the simulated driver: for each public function that calls the driver, every driver call
//! it makes fails in turn, and each time an `Err` must come back (from the function, or from
//! `Context::check_deferred_errors` where the call was in a destructor), nothing may panic, the simulator must
//! find no memory freed under queued work, and nothing may leak, except where the crate leaks on purpose:
//! memory whose release, or the wait before it, failed (the rule "Release after completion"), which it reports.
//!
//! Every public-API call, and each run of a case as a whole, is bounded (`common::bounded`): a call that hangs
//! (the rule "No hangs": every wait ends) aborts the test process with its name instead of stalling the suite.
//!
//! Only without feature `gpu`: a real driver cannot be made to fail on demand.
#![cfg(not(feature = "gpu"))]

#[macro_use]
mod common;

use common::faults::{Fixture, each_call_fails};
use common::{Serial, bounded, serial, sim};
use cuda_pinned::prefetch::GatherBatch;
use cuda_pinned::sys::CUdevice_attribute;
use cuda_pinned::{
    Arg, Context, Device, DeviceBuffer, Event, GatherEngine, GatherOptions, Gatherer, Graph,
    LaunchConfig, Ledger, Pinned, PinnedPool, Pinning, Prefetcher, ReadOrder, Registered, Result,
    RowTable, Stream, Use, WhenFull,
};

/// [`serial`], with the simulator installed with two devices, which reach each other, first (the copies
/// between devices need them).
fn setup() -> Serial {
    cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().devices(2))
        .unwrap_or_else(|e| panic!("{e}"));
    serial()
}

macro_rules! fault_tests {
    ($($(#[$attr:meta])* $test:ident: |$f:ident| $body:expr;)*) => {
        $(
            #[test]
            $(#[$attr])*
            fn $test() {
                let mut serial = setup();
                let calls = each_call_fails(&mut serial, stringify!($test), |$f: &Fixture| -> Result<()> { $body });
                eprintln!("{}: {calls} driver calls, each failed in turn", stringify!($test));
            }
        )*
    };
}

fault_tests! {
    device_queries: |_f| {
        let device = bounded!(Device::get(0))?;
        bounded!(Device::count())?;
        bounded!(device.name())?;
        bounded!(device.uuid())?;
        bounded!(device.compute_capability())?;
        bounded!(device.total_memory())?;
        bounded!(device.pci_bus_id())?;
        bounded!(device.async_engine_count())?;
        bounded!(device.can_map_host_memory())?;
        bounded!(device.supports_memory_pools())?;
        Ok(())
    };
    device_enumeration: |_f| {
        let devices = bounded!(Device::all())?;
        bounded!(devices[0].free_memory())?;
        bounded!(devices[0].attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT))?;
        Ok(())
    };
    context_on_and_queries: |_f| {
        let ctx = bounded!(Context::on(0))?;
        bounded!(ctx.memory_info())?;
        bounded!(ctx.stream_priority_range())?;
        bounded!(ctx.synchronize())?;
        // Errors of its destructors' calls are kept in it: ask before it goes.
        bounded!(ctx.check_deferred_errors())
    };
    copies_between_devices: |f| {
        // Fresh handles, which know nothing of peer access yet: their calls to enable it run every time.
        let (c0, c1) = (bounded!(Context::on(0))?, bounded!(Context::on(1))?);
        let enabled = bounded!(c0.enable_peer_access(&c1).and(c1.enable_peer_access(&c0)));
        // Errors of putting back the thread's context are kept in the handle that entered it.
        enabled.and(c0.check_deferred_errors()).and(c1.check_deferred_errors())?;
        let host = bounded!(Pinned::from_slice(&f.ctx, &[5u32; 4096]))?;
        let mut d0 = bounded!(DeviceBuffer::<u32>::uninit(&f.a, 4096))?;
        let mut d1 = bounded!(DeviceBuffer::<u32>::uninit(&f.c, 4096))?;
        bounded!(f.a.upload(&host, &mut d0))?;
        bounded!(f.c.copy(&d0, &mut d1))?;
        bounded!(f.b.copy(&d1, &mut d0))?;
        // Both buffers end with uses on two streams, so that the run without faults makes the streams for
        // such frees of both contexts, as the runs with faults may.
        let mut back = bounded!(Pinned::<u32>::zeroed(&f.ctx, 4096))?;
        bounded!(f.a.download(&d0, &mut back))
    };
    graphs: |f| {
        // A capture over two streams with a crossing, launched on each, outliving its buffers.
        let host = bounded!(Pinned::from_slice(&f.ctx, &[7u32; 4096]))?;
        let mut x = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, 4096))?;
        let mut y = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, 4096))?;
        let mut back = bounded!(Pinned::<u32>::zeroed(&f.ctx, 4096))?;
        let mut graph = bounded!(Graph::capture(&[&f.a, &f.b], || {
            f.a.upload(&host, &mut x)?;
            f.b.copy(&x, &mut y)?;
            f.a.download(&y, &mut back)
        }))?;
        bounded!(graph.launch(&f.a))?;
        bounded!(drop((host, x, y)));
        bounded!(graph.launch(&f.b))?;
        let last = bounded!(graph.host_slice(&back).map(|s| s[4095]))?;
        assert_eq!(last, 7, "a launch after a fault computed something else");
        bounded!(drop(graph));
        Ok(())
    };
    streams: |f| {
        let s = bounded!(Stream::with_priority(&f.ctx, -1))?;
        bounded!(s.priority())?;
        bounded!(s.query())?;
        bounded!(s.synchronize())?;
        let t = bounded!(Stream::new(&f.ctx))?;
        bounded!(t.synchronize())
    };
    events: |f| {
        let (start, end) = (bounded!(Event::new(&f.ctx))?, bounded!(Event::new(&f.ctx))?);
        bounded!(start.record(&f.a))?;
        bounded!(end.record(&f.a))?;
        bounded!(f.b.wait(&end))?;
        bounded!(end.synchronize())?;
        bounded!(end.query())?;
        bounded!(end.elapsed_since(&start))?;
        bounded!(Event::without_timing(&f.ctx)?.record(&f.b))
    };
    device_buffers: |f| {
        let zeroed = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, 1000))?;
        let uninit = bounded!(DeviceBuffer::<u64>::uninit(&f.b, 77))?;
        bounded!(drop((zeroed, uninit)));
        Ok(())
    };
    pinned_memory: |f| {
        let p = bounded!(Pinned::<u32>::zeroed(&f.ctx, 1000))?;
        let q = bounded!(Pinned::from_slice(&f.ctx, &[1u8, 2, 3]))?;
        let wc = bounded!(cuda_pinned::PinnedBuilder::new(&f.ctx).portable(true).device_mapped(true).write_combined(true).zeroed::<u16>(50))?;
        bounded!(drop((p, q, wc)));
        Ok(())
    };
    registered_vectors: |f| {
        let r = bounded!(Registered::new(&f.ctx, vec![7u32; 5000]))?;
        let v = bounded!(r.into_vec())?;
        assert_eq!(v[4999], 7);
        Ok(())
    };
    copies_across_streams: |f| {
        let want: Vec<u32> = common::data(4096, 3);
        let src = bounded!(Pinned::from_slice(&f.ctx, &want))?;
        let mut d0 = bounded!(DeviceBuffer::<u32>::uninit(&f.a, want.len()))?;
        let mut d1 = bounded!(DeviceBuffer::<u32>::uninit(&f.a, want.len()))?;
        let mut back = bounded!(Pinned::<u32>::zeroed(&f.ctx, want.len()))?;
        bounded!(f.a.upload(&src, &mut d0))?;
        bounded!(f.b.copy(&d0, &mut d1))?;
        bounded!(f.a.download(&d1, &mut back))?;
        assert_eq!(bounded!(back.as_slice())?, &want[..]);
        bounded!(drop((src, d0, d1, back)));
        Ok(())
    };
    registered_access: |f| {
        let mut r = bounded!(Registered::new(&f.ctx, vec![1u32; 4096]))?;
        let mut d = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, r.len()))?;
        bounded!(f.a.upload(&r, &mut d))?;
        bounded!(r.try_as_mut_slice())?;
        bounded!(r.as_mut_slice().map(|s| s.fill(2)))?;
        bounded!(f.b.download(&d, &mut r))?;
        bounded!(r.try_as_slice())?;
        assert_eq!(bounded!(r.as_slice())?[4095], 1);
        bounded!(drop((r, d)));
        Ok(())
    };
    pageable_copies: |f| {
        let want: Vec<u16> = (0..3000).collect();
        let mut d = bounded!(DeviceBuffer::<u16>::uninit(&f.a, want.len()))?;
        bounded!(f.a.upload_pageable(&want, &mut d))?;
        let mut back = vec![0u16; want.len()];
        bounded!(f.b.download_pageable(&d, &mut back))?;
        assert_eq!(back, want);
        bounded!(drop(d));
        Ok(())
    };
    host_access_waits: |f| {
        let mut p = bounded!(Pinned::<u8>::zeroed(&f.ctx, 100))?;
        let d = bounded!(DeviceBuffer::<u8>::zeroed(&f.a, 100))?;
        bounded!(f.a.download(&d, &mut p))?;
        bounded!(p.try_as_slice())?;
        bounded!(p.as_mut_slice().map(|s| s.fill(1)))?;
        bounded!(drop((p, d)));
        Ok(())
    };
    pool_alloc_and_trim: |f| {
        for pinning in [Pinning::HostAlloc, Pinning::Register] {
            let pool = bounded!(PinnedPool::builder(&f.ctx, 8 << 20).pinning(pinning).when_full(WhenFull::Wait).build());
            let mut p = bounded!(pool.alloc::<u32>(1000))?;
            let d = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, 1000))?;
            bounded!(f.a.download(&d, &mut p))?;
            bounded!(drop(p));
            let q = bounded!(pool.try_alloc::<u32>(1000))?;
            bounded!(drop(q));
            bounded!(f.a.synchronize())?;
            bounded!(pool.trim())?;
            bounded!(drop((d, pool)));
        }
        Ok(())
    };
    pool_eviction: |f| {
        // Room for one block of two pages: a request of another class unpins it to pin its own.
        let pool = bounded!(PinnedPool::builder(&f.ctx, 2 << 12).pinning(Pinning::HostAlloc).build());
        bounded!(pool.alloc::<u8>(2 << 12).map(drop))?;
        bounded!(pool.alloc::<u8>(1 << 12).map(drop))?;
        assert_eq!(bounded!(pool.stats()).evictions, 1, "the second request evicts the first block");
        bounded!(pool.trim())?;
        bounded!(drop(pool));
        Ok(())
    };
    staged_transfers: |f| {
        let pool = bounded!(PinnedPool::new(&f.ctx, 4 << 20));
        let options = cuda_pinned::staging::StagingOptions::default().chunk_bytes(1 << 20).threads(2).chunked_from(0);
        let want = common::data_bytes((3 << 20) + 5, 7);
        let mut d = bounded!(DeviceBuffer::<u8>::uninit(&f.a, want.len()))?;
        bounded!(f.a.upload_staged_with(&pool, options, &want, &mut d))?;
        let mut back = vec![0u8; want.len()];
        bounded!(f.b.download_staged_with(&pool, options, &d, &mut back))?;
        assert!(back == want);
        bounded!(drop((d, pool)));
        Ok(())
    };
    ledger: |f| {
        let ledger = bounded!(Ledger::new());
        let s = bounded!(Stream::with_ledger(&f.ctx, &ledger))?;
        let p = bounded!(Pinned::<u32>::zeroed(&f.ctx, 256))?;
        let mut d = bounded!(DeviceBuffer::<u32>::uninit(&s, 256))?;
        bounded!(s.upload(&p, &mut d))?;
        bounded!(s.synchronize())?;
        bounded!(ledger.report())?;
        bounded!(drop((p, d, s, ledger)));
        Ok(())
    };
    ledger_record_and_profile: |f| {
        let ledger = bounded!(Ledger::new());
        let s = bounded!(Stream::with_ledger(&f.ctx, &ledger))?;
        bounded!(s.record(&Event::without_timing(&f.ctx)?))?;
        let p = bounded!(Pinned::<u8>::zeroed(&f.ctx, 64))?;
        let mut d = bounded!(s.profile("allocate and upload", 64, || {
            let mut d = DeviceBuffer::<u8>::uninit(&s, 64)?;
            s.upload(&p, &mut d)?;
            Ok(d)
        }))?;
        bounded!(s.download(&d, &mut Pinned::<u8>::zeroed(&f.ctx, 64)?))?;
        bounded!(s.copy(&DeviceBuffer::<u8>::zeroed(&s, 64)?, &mut d))?;
        bounded!(ledger.report())?;
        bounded!(ledger.clear());
        bounded!(drop((p, d, s, ledger)));
        Ok(())
    };
    prefetcher_of_several_parts_unordered: |f| {
        let pool = bounded!(PinnedPool::new(&f.ctx, 1 << 20));
        let batches = bounded!(Prefetcher::<(Pinned<u32>, [Pinned<u8>; 2])>::builder(&pool, &f.a, (256, [16, 32]))
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
            }))?;
        let mut scratch = bounded!(DeviceBuffer::<u32>::uninit(&f.a, 256))?;
        let mut batches = batches;
        while let Some(batch) = bounded!(batches.next()) {
            let mut batch = batch?;
            bounded!(f.a.copy(&batch.device().0, &mut scratch))?;
            bounded!(f.a.copy(&scratch, &mut batch.device_mut().0))?;
            bounded!(drop(batch));
        }
        bounded!(drop((batches, scratch, pool)));
        Ok(())
    };
    prefetcher: |f| {
        let pool = bounded!(PinnedPool::new(&f.ctx, 1 << 20));
        let batches = bounded!(Prefetcher::<Pinned<u32>>::builder(&pool, &f.a, 1024)
            .batches(3)
            .workers(1)
            .depth(2)
            .build(|i, host: &mut Pinned<u32>| {
                host.as_mut_slice()?.fill(i as u32);
                Ok(())
            }))?;
        let mut batches = batches;
        while let Some(batch) = bounded!(batches.next()) {
            bounded!(batch.map(drop))?;
        }
        bounded!(drop((batches, pool)));
        Ok(())
    };
    sharded_prefetcher: |f| {
        let pool = bounded!(PinnedPool::new(&f.ctx, 1 << 20));
        let feeds = [(f.a.clone(), 1024), (f.c.clone(), 1024)];
        let prefetchers = bounded!(Prefetcher::<Pinned<u32>>::sharded(&pool, feeds)
            .batches(4)
            .workers(1)
            .depth(2)
            .build(|i, host: &mut Pinned<u32>| {
                host.as_mut_slice()?.fill(i as u32);
                Ok(())
            }))?;
        for mut batches in prefetchers {
            while let Some(batch) = bounded!(batches.next()) {
                bounded!(batch.map(drop))?;
            }
            bounded!(drop(batches));
        }
        bounded!(drop(pool));
        Ok(())
    };
    user_kernel_launches: |f| {
        let module = bounded!(common::test_kernels(&f.ctx))?;
        let scale = bounded!(module.kernel("scale"))?;
        let want: Vec<f32> = common::data(1000, 5).into_iter().map(|v| (v % 100) as f32).collect();
        let host = bounded!(Pinned::from_slice(&f.ctx, &want))?;
        let mut x = bounded!(DeviceBuffer::<f32>::uninit(&f.a, want.len()))?;
        bounded!(f.a.upload(&host, &mut x))?;
        let mut y = bounded!(DeviceBuffer::<f32>::zeroed(&f.b, want.len()))?;
        let n = want.len() as u32;
        let grid = LaunchConfig::for_elements(want.len(), 256)?;
        // SAFETY: scale(const float*, float*, float, unsigned) reads x[..n] and writes y[..n].
        bounded!(unsafe {
            f.b.launch(&scale, grid, &[Arg::read(&x), Arg::write(&mut y), Arg::value(&2.0f32), Arg::value(&n)])
        })?;
        drop((module, scale, x));
        let mut out = bounded!(Pinned::<f32>::zeroed(&f.ctx, want.len()))?;
        bounded!(f.a.download(&y, &mut out))?;
        let got = bounded!(out.as_slice())?;
        assert!(got.iter().zip(&want).all(|(g, w)| *g == 2.0 * w), "wrong data after a launch");
        Ok(())
    };
    gathers_by_both_engines: |f| {
        let gatherer = bounded!(Gatherer::new(&f.ctx))?;
        let row = 64usize;
        let values = common::data(row * 100, 8);
        let table = bounded!(Registered::new(&f.ctx, values.clone()))?;
        let picks = [7u32, 99, 0, 7, 42];
        let mut out = bounded!(DeviceBuffer::<u32>::zeroed(&f.b, row * picks.len()))?;
        let mut got = bounded!(Pinned::<u32>::zeroed(&f.ctx, row * picks.len()))?;
        let want: Vec<u32> = picks.iter().flat_map(|&p| values[p as usize * row..][..row].to_vec()).collect();
        let kernel = GatherOptions::default()
            .engine(GatherEngine::Kernel)
            .order(ReadOrder::Sorted);
        let copies = GatherOptions::default().engine(GatherEngine::Copies);
        for options in [kernel, copies] {
            bounded!(gatherer.gather(&f.b, &table, row, &picks, &mut out, options))?;
            bounded!(f.a.download(&out, &mut got))?;
            assert_eq!(bounded!(got.as_slice())?, &want[..], "wrong rows after a gather");
        }
        bounded!(drop((gatherer, table, out, got)));
        Ok(())
    };
    prefetched_gathers: |f| {
        let row = 16usize;
        let values = common::data(row * 200, 9);
        let table = bounded!(Registered::new(&f.ctx, values.clone()))?;
        let source = RowTable::new(bounded!(Gatherer::new(&f.ctx))?, table, row, GatherOptions::default())?;
        let unused = PinnedPool::new(&f.ctx, 0);
        let batches = bounded!(
            Prefetcher::<GatherBatch<u32, Registered<u32>>>::builder(&unused, &f.b, (source, 8))
                .batches(3)
                .workers(1)
                .build(|i, batch| {
                    batch.indices.clear();
                    batch.indices.extend((0..8u32).map(|k| (i as u32 * 37 + k * 11) % 200));
                    Ok(())
                })
        )?;
        let mut batches = batches;
        let mut got = bounded!(Pinned::<u32>::zeroed(&f.ctx, row * 8))?;
        while let Some(batch) = bounded!(batches.next()) {
            let batch = batch?;
            bounded!(f.b.download(&*batch, &mut got))?;
            let i = batch.index() as u32;
            let want: Vec<u32> = (0..8u32)
                .flat_map(|k| values[((i * 37 + k * 11) % 200) as usize * row..][..row].to_vec())
                .collect();
            assert_eq!(bounded!(got.as_slice())?, &want[..], "wrong rows in a prefetched gather");
        }
        bounded!(drop((batches, unused, got)));
        Ok(())
    };
    foreign_work_and_raw_handover: |f| {
        let mut y = bounded!(DeviceBuffer::<u32>::zeroed(&f.a, 1000))?;
        let yp = y.as_raw();
        // SAFETY: a memset of y[..1000] on the stream given, as declared.
        bounded!(unsafe {
            f.a.enqueue_foreign(&[Use::write(&mut y)], |raw| {
                cuda_pinned::driver_call!(cuMemsetD32Async(yp, 9, 1000, raw))
            })
        })??;
        let (ptr, len) = bounded!(y.into_raw())?;
        // SAFETY: the allocation into_raw gave up, with no work pending, owned by nobody else.
        let y = unsafe { DeviceBuffer::<u32>::from_raw(&f.b, ptr, len) };
        let mut out = bounded!(Pinned::<u32>::zeroed(&f.ctx, len))?;
        bounded!(f.b.download(&y, &mut out))?;
        assert!(bounded!(out.as_slice())?.iter().all(|&v| v == 9));
        let (host, len, flags) = bounded!(out.into_raw())?;
        // SAFETY: the allocation Pinned::into_raw gave up, with its flags.
        let out = unsafe { Pinned::from_raw(&f.ctx, host, len, flags) };
        bounded!(drop((y, out)));
        Ok(())
    };
}

/// Set in the environment of the child process that `a_hung_call_aborts_the_process_naming_it` starts.
const HANG_CHILD: &str = "CUDA_PINNED_TEST_HANG_CHILD";

/// Run as a child process by the test below; does nothing otherwise.
#[test]
fn hung_call_child() {
    if std::env::var_os(HANG_CHILD).is_none() {
        return;
    }
    bounded(
        "a call that never returns",
        std::time::Duration::from_millis(200),
        || loop {
            std::thread::park();
        },
    );
}

/// What `bounded` does with a call that hangs: the process aborts, naming it, instead of stalling the suite.
#[test]
fn a_hung_call_aborts_the_process_naming_it() {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hung_call_child", "--nocapture"])
        .env(HANG_CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(!child.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "HUNG: `a call that never returns` on thread hung_call_child did not return within 200ms"
        ),
        "{stderr}"
    );
}

/// Dropping a stream (or a context's last handle, with its stream for frees) while work is still queued on it
/// keeps that work in the release thread's sight with no driver call that could fail then: the retain it is
/// kept with is taken when the stream is made. A retain taken at the drop could fail, and unpinning would then
/// wait for that work unseen (a hidden wait).
#[test]
fn dropping_a_busy_stream_makes_no_call_that_could_lose_its_work() {
    let _serial = setup();
    let sim = sim().expect("these tests run on the simulator");
    let context = Context::on(0).unwrap();
    let stream = Stream::new(&context).unwrap();
    common::spin(&stream, 50);
    sim.trace_start();
    drop(stream);
    let calls = sim.trace_stop();
    assert!(
        calls.iter().any(|c| c == "cuStreamQuery"),
        "the drop looked at the stream's work: {calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("cuDevicePrimaryCtxRetain")),
        "a retain at the drop, which could fail: {calls:?}"
    );
    context.synchronize().unwrap();
}
