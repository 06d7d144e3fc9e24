//! Every public operation, for work on device 1, from a thread whose current context is not device 1's primary
//! context: none, device 0's primary context (PyTorch's current device, a thread that last used device 0), or a
//! context another library made (`cuCtxCreate`) on device 0 or on device 1; and, last, with device 1's own
//! current (the path where the crate only reads it). Each operation must succeed, move the right data, and
//! leave the thread's current context as it found it.
//!
//! The driver takes some calls' context from the calling thread rather than from the stream: a copy of memory
//! from device 1's memory pools on device 1's stream is refused while device 0's context is current, unless the
//! pool is open to device 0 (ARCHITECTURE.md, "The driver's rules about contexts"). The control shows that rule
//! with the driver's own calls (on the simulator, the simulator's model of it). Device 0's context comes first,
//! before anything opens the crate's pools to it (the first copy between the devices does, for the rest of a
//! test).
//!
//! On a GPU (feature `gpu`) it needs two devices and fails with fewer; on the simulated driver it installs two.

mod common;

use std::ptr;

use common::{compare, data, serial_on_two_devices};
use cuda_pinned::sys::{CUcontext, CUresult};
use cuda_pinned::{
    Arg, Context, DeviceBuffer, Event, GatherEngine, GatherOptions, Gatherer, LaunchConfig, Pinned,
    PinnedBuilder, PinnedPool, Prefetcher, Registered, Stream, Use, driver_call,
};

/// What the calling thread has current when it asks for work on device 1.
#[derive(Clone, Copy, Debug)]
enum Current {
    /// Device 0's primary context.
    OtherDevice,
    /// A context another library made on device 0.
    MadeOnOtherDevice,
    /// No context.
    Nothing,
    /// A context another library made on device 1 (not its primary context).
    MadeOnSameDevice,
    /// Device 1's primary context.
    Own,
}

const STATES: [Current; 5] = [
    Current::OtherDevice,
    Current::MadeOnOtherDevice,
    Current::Nothing,
    Current::MadeOnSameDevice,
    Current::Own,
];

/// The primary contexts of devices 0 and 1, and a context made on each, as another library would make them.
struct Devices {
    contexts: [Context; 2],
    made: [CUcontext; 2],
}

impl Devices {
    fn new() -> Devices {
        let count = common::device_count();
        assert!(
            count >= 2,
            "this test needs two devices, the machine has {count}"
        );
        let contexts = [common::device(0), common::device(1)];
        let made = contexts.each_ref().map(|context| {
            let mut made: CUcontext = ptr::null_mut();
            let mut popped: CUcontext = ptr::null_mut();
            // SAFETY: out-pointers to locals; the context is made current by its creation and popped at once,
            // leaving the thread as it was. Destroyed in Drop.
            unsafe {
                driver_call!(cuCtxCreate_v4(
                    &raw mut made,
                    ptr::null_mut(),
                    0,
                    context.device().as_raw()
                ))
                .unwrap();
                driver_call!(cuCtxPopCurrent_v2(&raw mut popped)).unwrap();
            }
            assert_eq!(popped, made);
            made
        });
        assert_eq!(current(), ptr::null_mut(), "the test starts with none");
        Devices { contexts, made }
    }

    fn handle(&self, state: Current) -> CUcontext {
        match state {
            Current::OtherDevice => self.contexts[0].as_raw(),
            Current::MadeOnOtherDevice => self.made[0],
            Current::Nothing => ptr::null_mut(),
            Current::MadeOnSameDevice => self.made[1],
            Current::Own => self.contexts[1].as_raw(),
        }
    }

    /// Runs `op` once in each thread state, with that state's context current; fails the test where it fails
    /// or leaves another context current.
    fn in_each_state(
        &self,
        what: &str,
        mut op: impl FnMut(&[Context; 2], u64) -> Result<(), String>,
    ) {
        for (round, state) in STATES.into_iter().enumerate() {
            let handle = self.handle(state);
            set_current(handle);
            let result = op(&self.contexts, round as u64);
            let after = current();
            set_current(ptr::null_mut());
            if let Err(e) = result {
                panic!("{what}, with {state:?} current: {e}");
            }
            assert_eq!(
                after, handle,
                "{what} left another context current than the thread's ({state:?})"
            );
        }
        for context in &self.contexts {
            context.synchronize().unwrap();
            context.check_deferred_errors().unwrap();
        }
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        for context in &self.contexts {
            let _ = context.synchronize();
        }
        for made in self.made {
            // SAFETY: made by `new`, current on no thread, used by nothing of the crate's.
            let _ = unsafe { driver_call!(cuCtxDestroy_v2(made)) };
        }
    }
}

fn current() -> CUcontext {
    let mut current: CUcontext = ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuCtxGetCurrent(&raw mut current)) }.unwrap();
    current
}

fn set_current(context: CUcontext) {
    // SAFETY: a live context (or none), made current on this thread only.
    unsafe { driver_call!(cuCtxSetCurrent(context)) }.unwrap();
}

/// Shorthand: a crate error as the test's.
fn e(error: cuda_pinned::Error) -> String {
    error.to_string()
}

const N: usize = 1 << 18;

/// What came back in `host`, compared with `want`.
fn check(host: &Pinned<u32>, want: &[u32], what: &str) -> Result<(), String> {
    compare(host.as_slice().map_err(e)?, want, what)
}

/// The control: the driver's own copy of memory from device 1's pool on device 1's stream is refused with
/// `CUDA_ERROR_INVALID_VALUE` while device 0's context is current, and taken with device 1's.
#[test]
fn control_the_driver_refuses_a_copy_of_pool_memory_with_another_device_current() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    let [ctx0, ctx1] = &devices.contexts;
    let stream = Stream::new(ctx1).unwrap();
    let host = Pinned::from_slice(ctx1, &data(N, 1)).unwrap();
    let mut memory = 0;
    set_current(ctx1.as_raw());
    // SAFETY: an out-pointer to a local; freed below, after the stream has run everything.
    unsafe { driver_call!(cuMemAllocAsync(&raw mut memory, N * 4, stream.as_raw())) }.unwrap();
    let copy = |context: &Context| {
        set_current(context.as_raw());
        // SAFETY: N u32s of live pinned and device memory; the stream is synchronised before either goes.
        let copied = unsafe {
            driver_call!(cuMemcpyHtoDAsync_v2(
                memory,
                host.as_ptr().cast(),
                N * 4,
                stream.as_raw()
            ))
        };
        set_current(ptr::null_mut());
        copied.map_err(|e| e.driver_code())
    };
    assert_eq!(
        copy(ctx0),
        Err(Some(CUresult::CUDA_ERROR_INVALID_VALUE)),
        "device 0's context current"
    );
    assert_eq!(copy(ctx1), Ok(()), "device 1's context current");
    stream.synchronize().unwrap();
    set_current(ctx1.as_raw());
    // SAFETY: allocated above; nothing is queued on it any more.
    unsafe { driver_call!(cuMemFreeAsync(memory, stream.as_raw())) }.unwrap();
    stream.synchronize().unwrap();
    set_current(ptr::null_mut());
}

#[test]
fn copies_between_host_and_device() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("copies between host and device", |[ctx0, ctx1], round| {
        let stream = Stream::new(ctx1).map_err(e)?;
        let want = data(N, round);
        // Page-locked memory of either device's context, and registered memory.
        let from_one = Pinned::from_slice(ctx1, &want).map_err(e)?;
        let from_zero = Pinned::from_slice(ctx0, &data(N, round + 10)).map_err(e)?;
        let registered = Registered::new(ctx1, data(N, round + 20)).map_err(e)?;
        let mut device = DeviceBuffer::<u32>::uninit(&stream, N).map_err(e)?;
        let mut back = Pinned::<u32>::zeroed(ctx1, N).map_err(e)?;
        for (source, what) in [
            (&from_one, "pinned of device 1"),
            (&from_zero, "pinned of device 0"),
        ] {
            stream.upload(source, &mut device).map_err(e)?;
            stream.download(&device, &mut back).map_err(e)?;
            check(&back, source.as_slice().map_err(e)?, what)?;
        }
        stream.upload(&registered, &mut device).map_err(e)?;
        let mut registered_back = Registered::new(ctx1, vec![0u32; N]).map_err(e)?;
        stream.download(&device, &mut registered_back).map_err(e)?;
        compare(
            registered_back.as_slice().map_err(e)?,
            registered.as_slice().map_err(e)?,
            "registered",
        )?;
        // Pageable memory, through the driver's path, and staged through a pool's pinned memory in chunks (20 MiB:
        // from 16 MiB a staged transfer is chunked on worker threads).
        let pageable = data(N + 3, round + 30);
        let mut odd = DeviceBuffer::<u32>::zeroed(&stream, N + 3).map_err(e)?;
        let mut got = vec![0u32; N + 3];
        stream.upload_pageable(&pageable, &mut odd).map_err(e)?;
        stream.download_pageable(&odd, &mut got).map_err(e)?;
        compare(&got, &pageable, "pageable")?;
        let pool = PinnedPool::new(ctx1, 64 << 20);
        let staged = data(5 << 20, round + 40);
        let mut large = DeviceBuffer::<u32>::uninit(&stream, staged.len()).map_err(e)?;
        let mut staged_back = vec![0u32; staged.len()];
        stream
            .upload_staged(&pool, &staged, &mut large)
            .map_err(e)?;
        stream
            .download_staged(&pool, &large, &mut staged_back)
            .map_err(e)?;
        compare(&staged_back, &staged, "staged")
    });
}

#[test]
fn copies_on_the_device_and_between_devices() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("copies on and between devices", |[ctx0, ctx1], round| {
        let (s0, s1) = (Stream::new(ctx0).map_err(e)?, Stream::new(ctx1).map_err(e)?);
        let want = data(N, round + 50);
        let host = Pinned::from_slice(ctx1, &want).map_err(e)?;
        let mut one = DeviceBuffer::<u32>::uninit(&s1, N).map_err(e)?;
        let mut other = DeviceBuffer::<u32>::zeroed(&s1, N).map_err(e)?;
        let mut zero = DeviceBuffer::<u32>::zeroed(&s0, N).map_err(e)?;
        let mut back = Pinned::<u32>::zeroed(ctx1, N).map_err(e)?;
        s1.upload(&host, &mut one).map_err(e)?;
        s1.copy(&one, &mut other).map_err(e)?;
        s1.download(&other, &mut back).map_err(e)?;
        check(&back, &want, "a copy within device 1")?;
        // Device 1 to 0 on device 1's stream, back on device 0's, then 0 to 1 on device 1's.
        s1.copy(&other, &mut zero).map_err(e)?;
        s0.copy(&zero, &mut one).map_err(e)?;
        s1.download(&one, &mut back).map_err(e)?;
        check(&back, &want, "copies between the devices, both streams")?;
        let mut from_zero = DeviceBuffer::<u32>::zeroed(&s1, N).map_err(e)?;
        s1.copy(&zero, &mut from_zero).map_err(e)?;
        s1.download(&from_zero, &mut back).map_err(e)?;
        check(&back, &want, "a copy from device 0 on device 1's stream")
    });
}

#[test]
fn allocations_streams_events_and_host_access() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("allocations, streams and events", |[ctx0, ctx1], round| {
        let stream = Stream::new(ctx1).map_err(e)?;
        let _priority =
            Stream::with_priority(ctx1, ctx1.stream_priority_range().map_err(e)?.1).map_err(e)?;
        let (free, total) = ctx1.memory_info().map_err(e)?;
        if free == 0 || free > total {
            return Err(format!("memory_info: {free} free of {total}"));
        }
        ctx1.device().free_memory().map_err(e)?;
        let want = data(N, round + 60);
        let mapped = PinnedBuilder::new(ctx1)
            .device_mapped(true)
            .from_slice(&want)
            .map_err(e)?;
        let pool = PinnedPool::new(ctx1, 4 << 20);
        let mut pooled = pool.alloc::<u32>(N).map_err(e)?;
        let mut device = DeviceBuffer::<u32>::zeroed(&stream, N).map_err(e)?;
        // A second stream of device 1 reads the buffer too, so that its free goes on the release stream.
        let second = Stream::new(ctx1).map_err(e)?;
        let s0 = Stream::new(ctx0).map_err(e)?;
        let mut scratch = Pinned::<u32>::zeroed(ctx0, N).map_err(e)?;
        stream.download(&device, &mut pooled).map_err(e)?;
        compare(pooled.as_slice().map_err(e)?, &vec![0; N], "zeroed")?;
        stream.upload(&mapped, &mut device).map_err(e)?;
        let done = Event::new(ctx1).map_err(e)?;
        let start = Event::new(ctx1).map_err(e)?;
        start.record(&stream).map_err(e)?;
        stream.download(&device, &mut pooled).map_err(e)?;
        stream.record(&done).map_err(e)?;
        s0.wait(&done).map_err(e)?;
        done.synchronize().map_err(e)?;
        done.elapsed_since(&start).map_err(e)?;
        if !done.query().map_err(e)? || !stream.query().map_err(e)? {
            return Err("the stream is busy after its event completed".into());
        }
        compare(
            pooled.as_slice().map_err(e)?,
            &want,
            "through mapped memory",
        )?;
        pooled.as_mut_slice().map_err(e)?.fill(7);
        if pooled.try_as_slice().map_err(e)?.is_none() {
            return Err("try_as_slice: busy with nothing queued".into());
        }
        let copy = DeviceBuffer::<u32>::uninit(&s0, N).map_err(e)?;
        s0.synchronize().map_err(e)?;
        drop(copy);
        s0.download(&mapped_to_zero(&s0, &mapped)?, &mut scratch)
            .map_err(e)?;
        let mut read_back = DeviceBuffer::<u32>::uninit(&second, N).map_err(e)?;
        second.copy(&device, &mut read_back).map_err(e)?;
        // Used on two streams: freed on the context's release stream, after both.
        drop(device);
        ctx1.synchronize().map_err(e)?;
        ctx0.synchronize().map_err(e)?;
        ctx1.check_deferred_errors().map_err(e)
    });
}

/// A buffer of `stream`'s device holding what `host` holds.
fn mapped_to_zero(stream: &Stream, host: &Pinned<u32>) -> Result<DeviceBuffer<u32>, String> {
    let mut device = DeviceBuffer::<u32>::uninit(stream, host.len()).map_err(e)?;
    stream.upload(host, &mut device).map_err(e)?;
    Ok(device)
}

#[test]
fn user_kernels_and_foreign_work() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("user kernels and foreign work", |[_, ctx1], round| {
        let stream = Stream::new(ctx1).map_err(e)?;
        let scale = common::test_kernels(ctx1)
            .and_then(|module| module.kernel("scale"))
            .map_err(e)?;
        let xs: Vec<f32> = data(N, round + 70)
            .iter()
            .map(|&v| (v % 1000) as f32)
            .collect();
        let host = Pinned::from_slice(ctx1, &xs).map_err(e)?;
        let mut x = DeviceBuffer::<f32>::uninit(&stream, N).map_err(e)?;
        let mut y = DeviceBuffer::<f32>::zeroed(&stream, N).map_err(e)?;
        stream.upload(&host, &mut x).map_err(e)?;
        let (a, n) = (3.0f32, N as u32);
        // SAFETY: scale(const float* x, float* y, float a, unsigned n) reads x[..n] and writes y[..n], both of
        // n elements.
        unsafe {
            stream.launch(
                &scale,
                LaunchConfig::for_elements(N, 256).map_err(e)?,
                &[
                    Arg::read(&x),
                    Arg::write(&mut y),
                    Arg::value(&a),
                    Arg::value(&n),
                ],
            )
        }
        .map_err(e)?;
        let mut back = Pinned::<f32>::zeroed(ctx1, N).map_err(e)?;
        stream.download(&y, &mut back).map_err(e)?;
        let want: Vec<f32> = xs.iter().map(|v| a * v).collect();
        if back.as_slice().map_err(e)? != want.as_slice() {
            return Err("the kernel's output differs".into());
        }
        // Another library's copy, through the raw handle: it runs with the stream's context current.
        let (to, from) = (x.as_raw(), host.as_ptr());
        // SAFETY: a copy of N floats on the stream it is given, from `host` (declared read) into `x` (declared
        // written), both alive until the stream has run it.
        let (inside, copied) = unsafe {
            stream.enqueue_foreign(&[Use::read_host(&host), Use::write(&mut x)], |raw| {
                (
                    current(),
                    driver_call!(cuMemcpyHtoDAsync_v2(to, from.cast(), N * 4, raw)),
                )
            })
        }
        .map_err(e)?;
        copied.map_err(e)?;
        if inside != ctx1.as_raw() {
            return Err(
                "enqueue_foreign's closure ran without the stream's context current".into(),
            );
        }
        stream.synchronize().map_err(e)
    });
}

#[test]
fn gathers_and_prefetchers() {
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("gathers and prefetchers", |[_, ctx1], round| {
        let stream = Stream::new(ctx1).map_err(e)?;
        let gatherer = Gatherer::new(ctx1).map_err(e)?;
        // Rows of 64 bytes through the kernel, rows of 256 KiB through the copy engines.
        for (row, rows, engine) in [
            (16, 256, GatherEngine::Kernel),
            (64 << 10, 8, GatherEngine::Copies),
        ] {
            let values = data(row * rows, round + 80);
            let table = PinnedBuilder::new(ctx1)
                .device_mapped(true)
                .from_slice(&values)
                .map_err(e)?;
            let picks: Vec<u32> = (0..rows as u32).rev().step_by(2).collect();
            let mut out = DeviceBuffer::<u32>::zeroed(&stream, row * picks.len()).map_err(e)?;
            gatherer
                .gather(
                    &stream,
                    &table,
                    row,
                    &picks,
                    &mut out,
                    GatherOptions::default().engine(engine),
                )
                .map_err(e)?;
            let mut back = Pinned::<u32>::zeroed(ctx1, out.len()).map_err(e)?;
            stream.download(&out, &mut back).map_err(e)?;
            let want: Vec<u32> = picks
                .iter()
                .flat_map(|&k| values[k as usize * row..][..row].iter().copied())
                .collect();
            check(&back, &want, "gathered rows")?;
        }
        let pool = PinnedPool::new(ctx1, 4 << 20);
        let len = 4096;
        let prefetcher = Prefetcher::<Pinned<u32>>::builder(&pool, &stream, len)
            .batches(3)
            .build(move |i, batch| {
                batch
                    .as_mut_slice()?
                    .copy_from_slice(&data(len, round * 100 + i as u64));
                Ok(())
            })
            .map_err(e)?;
        let mut back = Pinned::<u32>::zeroed(ctx1, len).map_err(e)?;
        for (i, batch) in prefetcher.enumerate() {
            let batch = batch.map_err(e)?;
            stream.download(batch.device(), &mut back).map_err(e)?;
            check(
                &back,
                &data(len, round * 100 + i as u64),
                "a prefetched batch",
            )?;
        }
        stream.synchronize().map_err(e)
    });
}

/// The crate's own kernels, launched through the CUDA runtime (feature `gpu`).
#[cfg(feature = "gpu")]
#[test]
fn the_crates_kernels() {
    use cuda_pinned::kernels;
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    devices.in_each_state("the crate's kernels", |[_, ctx1], round| {
        let stream = Stream::new(ctx1).map_err(e)?;
        let value = round as u32 + 5;
        let mut device = DeviceBuffer::<u32>::uninit(&stream, N).map_err(e)?;
        kernels::fill(&stream, &mut device, value).map_err(e)?;
        let mut back = Pinned::<u32>::zeroed(ctx1, N).map_err(e)?;
        stream.download(&device, &mut back).map_err(e)?;
        check(&back, &vec![value; N], "filled")?;
        kernels::spin(&stream, std::time::Duration::from_millis(1)).map_err(e)?;
        stream.synchronize().map_err(e)
    });
}

/// The control of `the_crates_kernels`: a launch through the CUDA runtime, made with no context current, makes
/// the primary context of the runtime's device (device 0, as nothing here chose another) current and leaves it
/// so, while one made inside a push of device 1's context leaves none after the pop. That is how a test that
/// launched a raw kernel met the first of the driver's rules: the thread had device 0's context current after.
#[cfg(feature = "gpu")]
#[test]
fn control_a_runtime_launch_with_no_context_current_leaves_device_0s_current() {
    use cuda_pinned::kernels::raw;
    let _serial = serial_on_two_devices();
    let devices = Devices::new();
    let [ctx0, ctx1] = &devices.contexts;
    let stream = Stream::new(ctx1).unwrap();
    let launch = || {
        // SAFETY: a live stream; the kernel touches no memory.
        let code = unsafe { raw::cuda_pinned_spin(1000, stream.as_raw()) };
        raw::check_launch(code, "cuda_pinned_spin").unwrap();
    };
    set_current(ptr::null_mut());
    // SAFETY: a live context, popped below.
    unsafe { driver_call!(cuCtxPushCurrent_v2(ctx1.as_raw())) }.unwrap();
    launch();
    let mut popped: CUcontext = ptr::null_mut();
    // SAFETY: an out-pointer to a local; pops the context pushed above.
    unsafe { driver_call!(cuCtxPopCurrent_v2(&raw mut popped)) }.unwrap();
    assert_eq!(
        current(),
        ptr::null_mut(),
        "inside a push: none after the pop"
    );
    launch();
    assert_eq!(
        current(),
        ctx0.as_raw(),
        "a runtime launch with none current left device 0's primary context current"
    );
    set_current(ptr::null_mut());
    stream.synchronize().unwrap();
}
