//! What using pinned memory costs the host: allocating and registering it (directly, and through a
//! `PinnedPool`, warm and cold), enqueueing a small copy, and launching a kernel.

use std::ffi::c_void;
use std::ptr;
use std::time::Instant;

use cuda_pinned::{
    Arg, Context, DeviceBuffer, Event, LaunchConfig, Module, Pinned, PinnedPool, Pinning,
    Registered, Stream, driver_call, sys,
};

use crate::results::{Alloc, Allocation, Enqueue, Extra, LaunchCost, NoContext, size_label};
use crate::timing::{Plan, fill_pattern, median};
use crate::{Bench, Outcome};

/// Size of the per-call allocation figure.
const PER_CALL_BYTES: usize = 1 << 20;
/// Warm pool allocations per timed batch: one clock read per batch, so that the clock's own cost (tens of
/// nanoseconds) is spread over a thousand calls of a fraction of a microsecond.
pub const POOL_WARM_BATCH: usize = 1000;
/// Untimed batches before the timed ones of the warm pool allocation.
const POOL_WARM_WARMUP: usize = 2;
/// Size of the enqueued copy.
const SMALL: usize = 64;
/// Small copies (or kernel launches) per timed batch: few enough that the driver's queue never fills and blocks
/// the enqueue.
const ENQUEUE_BATCH: usize = 500;
/// Untimed rounds of batches before the timed ones of the enqueue figures.
const ENQUEUE_WARMUP: usize = 2;
/// Threads of the one block of the launch figures, and elements of the buffers the kernel reads and writes.
pub const LAUNCH_THREADS: u32 = 32;
/// The factor the launched kernel scales by.
const LAUNCH_SCALE: f32 = 2.0;

/// The kernel of the launch figures, as PTX (the driver compiles it for the device when the module is loaded, so
/// the build needs no CUDA compiler): `scale(const float* x, float* y, float a, unsigned n)` writes
/// `y[i] = a * x[i]` for each thread's index `i = ctaid.x * ntid.x + tid.x` below `n`.
const SCALE_PTX: &str = "\
.version 8.0
.target sm_75
.address_size 64

.visible .entry scale(
    .param .u64 x,
    .param .u64 y,
    .param .f32 a,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<6>;

    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd4, %rd1, %rd3;
    add.u64 %rd5, %rd2, %rd3;
    ld.param.f32 %f1, [a];
    ld.global.f32 %f2, [%rd4];
    mul.rn.f32 %f3, %f1, %f2;
    st.global.f32 [%rd5], %f3;
DONE:
    ret;
}
";

/// The estimated seconds of [`allocation`], for the progress bar.
pub fn estimate_allocation(plan: &Plan) -> f64 {
    let gib = plan.alloc_bytes as f64 / f64::from(1u32 << 30);
    // About 0.4 s per GiB to pin, 0.3 s to touch or fault in, 0.1 s to release; the pool's two cold pins
    // (threads touch or zero the pages) about 0.6 s per GiB each with the release.
    let batches = (POOL_WARM_WARMUP + plan.pool_warm_samples) as f64;
    plan.alloc_samples as f64 * gib * (0.5 + 0.8 + 1.1 + 1.2)
        + plan.per_call_samples as f64 * 0.001
        + 0.01
        + batches * POOL_WARM_BATCH as f64 * 1e-6
}

/// The estimated seconds of [`enqueue`].
pub fn estimate_enqueue(plan: &Plan) -> f64 {
    let calls = |samples: usize| (ENQUEUE_WARMUP + samples) as f64 * ENQUEUE_BATCH as f64;
    // The copies; then loading the kernel's module (the driver compiles its PTX) and the two launch figures.
    0.01 + 3.0 * calls(plan.enqueue_samples) * 4e-6 + 0.05 + 2.0 * calls(plan.launch_samples) * 4e-6
}

/// Host time of allocating pinned memory, of pinning a `Vec` in place, and of `PinnedPool::alloc` warm (from
/// the bench's pool) and cold (from a fresh pool per sample, each way of pinning). Every call is timed on its
/// own with the host clock, except the warm pool's, timed in batches; each figure is the median.
pub fn allocation(bench: &mut Bench) -> Outcome<Vec<Allocation>> {
    let plan = bench.plan.clone();
    let context = bench.context.clone();
    let large = plan.alloc_bytes;
    let mut rows = Vec::new();
    let mut row = |what: Alloc, bytes: usize, batch: usize, times: Vec<f64>| {
        rows.push(Allocation {
            what,
            bytes,
            samples: times.len(),
            batch,
            seconds: median(times),
        });
    };

    bench
        .progress
        .show(&format!("Pinned::zeroed of {}", size_label(large)));
    let mut times = Vec::new();
    for _ in 0..plan.alloc_samples {
        let begin = Instant::now();
        let pinned = Pinned::<u8>::zeroed(&context, large)?;
        times.push(begin.elapsed().as_secs_f64());
        drop(pinned);
        // Unpinned on the crate's release thread: done before the next sample, not during it.
        context.synchronize()?;
    }
    row(Alloc::PinnedCold, large, 1, times);

    bench.progress.show("Pinned::zeroed of 1 MiB");
    // Kept until all are made, so that no call gets back memory a previous one freed.
    let mut kept = Vec::with_capacity(plan.per_call_samples);
    let mut times = Vec::new();
    for _ in 0..plan.per_call_samples {
        let begin = Instant::now();
        kept.push(Pinned::<u8>::zeroed(&context, PER_CALL_BYTES)?);
        times.push(begin.elapsed().as_secs_f64());
    }
    drop(kept);
    context.synchronize()?;
    row(Alloc::PinnedPerCall, PER_CALL_BYTES, 1, times);

    bench
        .progress
        .show("PinnedPool::alloc + drop of 1 MiB, warm");
    let pool = bench.pool.clone();
    let mut times = Vec::new();
    for batch in 0..POOL_WARM_WARMUP + plan.pool_warm_samples {
        // The first call of the first warm-up batch pins the block every later call reuses.
        let begin = Instant::now();
        for _ in 0..POOL_WARM_BATCH {
            drop(std::hint::black_box(pool.alloc::<u8>(PER_CALL_BYTES)?));
        }
        let took = begin.elapsed().as_secs_f64();
        if batch >= POOL_WARM_WARMUP {
            times.push(took / POOL_WARM_BATCH as f64);
        }
    }
    row(Alloc::PoolWarm, PER_CALL_BYTES, POOL_WARM_BATCH, times);

    for (what, pinning) in [
        (Alloc::PoolColdRegister, Pinning::Register),
        (Alloc::PoolColdHostAlloc, Pinning::HostAlloc),
    ] {
        bench
            .progress
            .show(&format!("{} of {}", what.label(), size_label(large)));
        let mut times = Vec::new();
        for _ in 0..plan.alloc_samples {
            // A fresh pool each time, so that every sample pins: a block's class is at most the power of two
            // above the request.
            let pool = PinnedPool::builder(&context, large.next_power_of_two())
                .pinning(pinning)
                .build();
            let begin = Instant::now();
            let block = pool.alloc::<u8>(large)?;
            times.push(begin.elapsed().as_secs_f64());
            drop(block);
            pool.trim()?;
            drop(pool);
            // The unpinning happens on the crate's release thread: done before the next sample pins.
            context.synchronize()?;
        }
        row(what, large, 1, times);
    }

    for (what, touch) in [
        (Alloc::RegisterTouched, true),
        (Alloc::RegisterUntouched, false),
    ] {
        bench
            .progress
            .show(&format!("{} of {}", what.label(), size_label(large)));
        let mut times = Vec::new();
        for _ in 0..plan.alloc_samples {
            // calloc: fresh pages from the OS, not yet touched, which registering must fault in.
            let mut vec = vec![0u8; large];
            if touch {
                fill_pattern(&mut vec, bench.next_seed());
            }
            let begin = Instant::now();
            let registered = Registered::new(&context, vec)?;
            times.push(begin.elapsed().as_secs_f64());
            drop(registered);
            context.synchronize()?;
        }
        row(what, large, 1, times);
    }
    bench.progress.advance(estimate_allocation(&plan));
    Ok(rows)
}

/// Host time per enqueued 64-byte upload from pinned memory: the raw driver call, the safe layer on one stream
/// (the tracker's fast path, which records no event), and the safe layer alternating two streams (each copy
/// then waits on the device for the other stream's previous one). Then host time per launch of a small kernel
/// ([`SCALE_PTX`]: two buffers and two values, one block of [`LAUNCH_THREADS`]) on one stream: the raw
/// `cuLaunchKernel` and `Stream::launch`, their batches in turns; the kernel's output is checked once.
pub fn enqueue(bench: &mut Bench) -> Outcome<Enqueue> {
    bench.progress.show("enqueue overhead of a 64-byte upload");
    let context = bench.context.clone();
    let _current = ThreadContext::make(&context)?;
    let samples = bench.plan.enqueue_samples;
    let stream = &bench.stream;
    let other = Stream::new(&context)?;
    let small = Pinned::from_slice(&context, &[7u8; SMALL])?;
    // One device buffer per way of copying: the crate's calls borrow theirs mutably side by side.
    let device = DeviceBuffer::<u8>::zeroed(stream, SMALL)?;
    let (dst, src) = (device.as_raw(), small.as_ptr().cast::<c_void>());
    let mut raw = |_| {
        // SAFETY: 64 bytes of live pinned and device memory; the context is synchronised after each batch,
        // before either buffer can be touched or dropped.
        unsafe { driver_call!(cuMemcpyHtoDAsync_v2(dst, src, SMALL, stream.as_raw())) }
    };
    let mut device_too = DeviceBuffer::<u8>::zeroed(stream, SMALL)?;
    let mut same_stream = |_| stream.upload(&small, &mut device_too);
    // The driver's part of a crossing, as the tracking does it: an event recorded after the other stream's copy,
    // waited for by this one's (two events reused in turn, as the tracking's pool reuses them).
    let events = [
        Event::without_timing(&context)?,
        Event::without_timing(&context)?,
    ];
    let mut raw_cross_stream = |i: usize| {
        let (this, previous) = if i.is_multiple_of(2) {
            (stream, &other)
        } else {
            (&other, stream)
        };
        let event = &events[i % 2];
        event.record(previous)?;
        // SAFETY: live streams and event; 64 bytes of live pinned and device memory, as for `raw` above.
        unsafe {
            driver_call!(cuStreamWaitEvent(this.as_raw(), event.as_raw(), 0))?;
            driver_call!(cuMemcpyHtoDAsync_v2(dst, src, SMALL, this.as_raw()))
        }
    };
    let mut device_three = DeviceBuffer::<u8>::zeroed(stream, SMALL)?;
    // Also lets the crate's release thread finish unpinning what earlier sections dropped: unpinning holds back
    // every thread's driver calls, the timed ones too.
    context.synchronize()?;
    let mut cross_stream = |i: usize| {
        if i.is_multiple_of(2) { stream } else { &other }.upload(&small, &mut device_three)
    };
    // The same two from a thread with no context current, as a thread of a pipeline that never touched CUDA
    // has it: the crate then pushes the stream's context and pops it around each call.
    let mut device_four = DeviceBuffer::<u8>::zeroed(stream, SMALL)?;
    let mut same_stream_bare = |_| stream.upload(&small, &mut device_four);
    let mut same_stream_bare = no_context(&mut same_stream_bare);
    let mut device_five = DeviceBuffer::<u8>::zeroed(stream, SMALL)?;
    let mut cross_stream_bare = |i: usize| {
        if i.is_multiple_of(2) { stream } else { &other }.upload(&small, &mut device_five)
    };
    let mut cross_stream_bare = no_context(&mut cross_stream_bare);
    // The four take turns batch by batch, so that what drifts over the run (clocks, the driver's queues) falls
    // on all of them alike, and each crate figure is compared with its reference of the same round.
    let rounds = in_turns(
        &context,
        samples,
        &mut [
            &mut raw,
            &mut same_stream,
            &mut raw_cross_stream,
            &mut cross_stream,
            &mut same_stream_bare,
            &mut cross_stream_bare,
        ],
    )?;
    let [
        raw,
        same_stream,
        raw_cross_stream,
        cross_stream,
        same_bare,
        cross_bare,
    ] = [0, 1, 2, 3, 4, 5].map(|i| &rounds[i]);
    let same_stream_extra = Extra::of(same_stream, raw);
    let cross_stream_extra = Extra::of(cross_stream, raw_cross_stream);
    let no_context = NoContext {
        same_stream: median(same_bare.clone()),
        cross_stream: median(cross_bare.clone()),
        same_stream_extra: Extra::of(same_bare, raw),
        cross_stream_extra: Extra::of(cross_bare, raw_cross_stream),
    };
    let [raw, same_stream, raw_cross_stream, cross_stream] =
        [raw, same_stream, raw_cross_stream, cross_stream].map(|times| median(times.clone()));

    bench.progress.show("enqueue overhead of a kernel launch");
    let launch = if bench.simulated {
        Err(NO_STAND_IN.to_owned())
    } else {
        launch(&context, stream, &bench.plan).map_err(|e| format!("not measured: {e}"))
    };
    bench.progress.advance(estimate_enqueue(&bench.plan));
    Ok(Enqueue {
        raw,
        same_stream,
        cross_stream,
        raw_cross_stream,
        same_stream_extra,
        cross_stream_extra,
        no_context,
        bytes: SMALL,
        batch: ENQUEUE_BATCH,
        samples,
        launch,
    })
}

/// Why the simulated driver gives no launch figure.
pub const NO_STAND_IN: &str = "not measured on the simulated driver: a kernel runs there only as a Rust \
                               stand-in registered under its name, and pinbench's kernel has none";

/// The launch figures of [`enqueue`]: the raw launch and `Stream::launch` of [`SCALE_PTX`] on `stream`.
fn launch(context: &Context, stream: &Stream, plan: &Plan) -> Outcome<LaunchCost> {
    let kernel = Module::load(context, SCALE_PTX.as_bytes())?.kernel("scale")?;
    let n = LAUNCH_THREADS;
    let elements = n as usize;
    let xs: Vec<f32> = (0..n)
        .map(|i| f32::from(u16::try_from(i).expect("a small index")))
        .collect();
    let mut x = DeviceBuffer::<f32>::zeroed(stream, elements)?;
    stream.upload(&Pinned::from_slice(context, &xs)?, &mut x)?;
    let mut y = DeviceBuffer::<f32>::zeroed(stream, elements)?;
    let a = LAUNCH_SCALE;
    let config = LaunchConfig::new(1, n);
    let (function, x_raw, y_raw) = (kernel.as_raw(), x.as_raw(), y.as_raw());
    context.synchronize()?;
    let mut raw_launch = |_| {
        let mut params = [
            ptr::from_ref(&x_raw).cast_mut().cast::<c_void>(),
            ptr::from_ref(&y_raw).cast_mut().cast(),
            ptr::from_ref(&a).cast_mut().cast(),
            ptr::from_ref(&n).cast_mut().cast(),
        ];
        // SAFETY: `scale` takes (const float*, float*, float, unsigned): one pointer per parameter, each to a
        // live value of its type that outlives the call (the driver copies them before returning). It reads x[..n]
        // and writes y[..n], both buffers of `n` elements, live until the context is synchronised after each
        // batch (these launches are untracked: nothing touches or drops the buffers before that); the kernel's
        // module lives as long as `kernel`, past the last batch.
        unsafe {
            driver_call!(cuLaunchKernel(
                function,
                1,
                1,
                1,
                n,
                1,
                1,
                0,
                stream.as_raw(),
                params.as_mut_ptr(),
                ptr::null_mut()
            ))
        }
    };
    let mut safe_launch = |_| {
        // SAFETY: `scale` takes (const float*, float*, float, unsigned), reads x[..n] and writes y[..n]; both
        // buffers have `n` elements.
        unsafe {
            stream.launch(
                &kernel,
                config,
                &[
                    Arg::read(&x),
                    Arg::write(&mut y),
                    Arg::value(&a),
                    Arg::value(&n),
                ],
            )
        }
    };
    // Its own output, so that the three take turns with no borrow shared.
    let mut y_bare = DeviceBuffer::<f32>::zeroed(stream, elements)?;
    context.synchronize()?;
    let mut bare_launch = |_| {
        // SAFETY: as for `safe_launch`, with `y_bare` for `y`.
        unsafe {
            stream.launch(
                &kernel,
                config,
                &[
                    Arg::read(&x),
                    Arg::write(&mut y_bare),
                    Arg::value(&a),
                    Arg::value(&n),
                ],
            )
        }
    };
    let mut bare_launch = no_context(&mut bare_launch);
    let launch_samples = plan.launch_samples;
    let launches = in_turns(
        context,
        launch_samples,
        &mut [&mut raw_launch, &mut safe_launch, &mut bare_launch],
    )?;
    let extra = Extra::of(&launches[1], &launches[0]);
    let extra_no_context = Extra::of(&launches[2], &launches[0]);
    let launches = launches.into_iter().map(median).collect::<Vec<_>>();
    let mut out = Pinned::<f32>::zeroed(context, elements)?;
    stream.download(&y, &mut out)?;
    let verified = out
        .as_slice()?
        .iter()
        .zip(&xs)
        .all(|(&got, &from)| got == a * from);
    Ok(LaunchCost {
        raw: launches[0],
        crate_launch: launches[1],
        crate_launch_no_context: launches[2],
        samples: launch_samples,
        extra,
        extra_no_context,
        verified,
    })
}

/// The calling thread's current context made `context` until this drops, which puts back the one before. The
/// enqueue figures are taken on a thread with its device's context current, as a thread that drives the device
/// through the CUDA runtime or another library has it: the crate then only reads which context is current. On a
/// thread with another context current, or none, it pushes the stream's and pops it around each call.
struct ThreadContext(sys::CUcontext);

impl ThreadContext {
    fn make(context: &Context) -> Outcome<ThreadContext> {
        let mut before: sys::CUcontext = ptr::null_mut();
        // SAFETY: an out-pointer to a local; then a live context's handle, current on this thread only.
        unsafe {
            driver_call!(cuCtxGetCurrent(&raw mut before))?;
            driver_call!(cuCtxSetCurrent(context.as_raw()))?;
        }
        Ok(ThreadContext(before))
    }
}

impl Drop for ThreadContext {
    fn drop(&mut self) {
        // SAFETY: the context the thread had current before (or none), retained by whoever made it current.
        let _ = unsafe { driver_call!(cuCtxSetCurrent(self.0)) };
    }
}

/// `enqueue` run with no context current on the thread for each batch of [`in_turns`]: the first call of a
/// batch takes the thread's context away, the last puts it back (two driver calls in a batch of
/// [`ENQUEUE_BATCH`]).
fn no_context<'f>(
    enqueue: &'f mut dyn FnMut(usize) -> cuda_pinned::Result<()>,
) -> impl FnMut(usize) -> cuda_pinned::Result<()> + 'f {
    let mut before: sys::CUcontext = ptr::null_mut();
    move |i| {
        if i == 0 {
            // SAFETY: an out-pointer to a local; then no context, current on this thread only.
            unsafe {
                driver_call!(cuCtxGetCurrent(&raw mut before))?;
                driver_call!(cuCtxSetCurrent(ptr::null_mut()))?;
            }
        }
        let enqueued = enqueue(i);
        if i == ENQUEUE_BATCH - 1 || enqueued.is_err() {
            // SAFETY: the context current before the batch, retained by whoever made it current.
            unsafe { driver_call!(cuCtxSetCurrent(before)) }?;
        }
        enqueued
    }
}

/// Times each of `enqueuers` in batches of [`ENQUEUE_BATCH`] calls (given the call's index in its batch), taking
/// turns batch by batch so that drift over the run falls on all of them alike, and synchronising `context` after
/// every batch. The first [`ENQUEUE_WARMUP`] rounds are not timed; returns, in order, each one's seconds per
/// call in each of `samples` rounds.
fn in_turns(
    context: &Context,
    samples: usize,
    enqueuers: &mut [&mut dyn FnMut(usize) -> cuda_pinned::Result<()>],
) -> Outcome<Vec<Vec<f64>>> {
    let mut times = vec![Vec::with_capacity(samples); enqueuers.len()];
    for round in 0..ENQUEUE_WARMUP + samples {
        for (enqueue, times) in enqueuers.iter_mut().zip(&mut times) {
            let begin = Instant::now();
            let enqueued = (0..ENQUEUE_BATCH).try_for_each(&mut **enqueue);
            let took = begin.elapsed();
            // Even after a failed enqueue: raw work is untracked, so nothing may go before it finishes.
            context.synchronize()?;
            enqueued?;
            if round >= ENQUEUE_WARMUP {
                times.push(took.as_secs_f64() / ENQUEUE_BATCH as f64);
            }
        }
    }
    Ok(times)
}
