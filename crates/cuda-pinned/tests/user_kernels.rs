//! Users' kernels and other code's work in the tracking: a kernel of a user's module launched with
//! [`Stream::launch`], and work enqueued through a stream's raw handle declared with
//! [`Stream::enqueue_foreign`], wait for what they conflict with, make later work and host access wait, and
//! keep their buffers alive. Each rule beside a control: the same work left undeclared, which goes wrong.
//!
//! On a GPU (feature `gpu`) the kernels are `cuda/test_kernels.cu`, compiled by build.rs into a fatbin; on the
//! simulated driver (two devices here) Rust stand-ins of the same names run in stream order.

mod common;

use std::time::Duration;

use common::{Serial, data, hold, refused as invalid, serial_on_two_devices, spin};
use cuda_pinned::{
    Arg, Context, DeviceBuffer, Error, Kernel, LaunchConfig, Module, Pinned, PinnedBuilder, Stream,
    Use,
};

const N: usize = 1 << 16;

fn context() -> Context {
    common::device(0)
}

fn module(context: &Context) -> Module {
    common::test_kernels(context).unwrap()
}

fn kernel(context: &Context, name: &str) -> Kernel {
    module(context).kernel(name).unwrap()
}

fn floats(len: usize, seed: u64) -> Vec<f32> {
    data(len, seed)
        .into_iter()
        .map(|x| (x % 1000) as f32)
        .collect()
}

/// Enqueues `scale(x, y, a, n)` on `stream` through the raw handle, as another library would: untracked.
///
/// # Safety
/// `x` and `y` must be `n` floats of live device memory of `stream`'s context.
unsafe fn raw_scale(
    stream: cuda_pinned::sys::CUstream,
    scale: &Kernel,
    x: u64,
    y: u64,
    a: f32,
    n: u32,
) {
    let (mut x, mut y, mut a, mut n) = (x, y, a, n);
    let mut params = [
        (&raw mut x).cast(),
        (&raw mut y).cast(),
        (&raw mut a).cast(),
        (&raw mut n).cast(),
    ];
    let grid = (n as usize).div_ceil(256) as u32;
    // SAFETY: four parameters of scale's types; the memory as the caller guarantees.
    unsafe {
        cuda_pinned::driver_call!(cuLaunchKernel(
            scale.as_raw(),
            grid,
            1,
            1,
            256,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        ))
    }
    .unwrap();
}

/// `y = a * x` by `scale` on `stream`, launched with both buffers declared, or, for a control (`x_declared`
/// false), through the raw handle with only `y` declared: the kernel may then read `x` out of order.
fn launch_scale(
    stream: &Stream,
    scale: &Kernel,
    x: &DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
    a: f32,
    x_declared: bool,
) {
    let n = u32::try_from(x.len()).unwrap();
    if x_declared {
        // SAFETY: scale(const float*, float*, float, unsigned) reads x[..n], writes y[..n].
        unsafe {
            stream.launch(
                scale,
                LaunchConfig::for_elements(x.len(), 256).unwrap(),
                &[Arg::read(x), Arg::write(y), Arg::value(&a), Arg::value(&n)],
            )
        }
        .unwrap();
    } else {
        let (xp, yp) = (x.as_raw(), y.as_raw());
        // SAFETY: as above, with x's read undeclared (the control): live buffers of n floats each.
        unsafe {
            stream.enqueue_foreign(&[Use::write(y)], |raw| {
                raw_scale(raw, scale, xp, yp, a, n);
            })
        }
        .unwrap();
    }
}

/// `x` uploaded on one stream behind 300 ms of other work, then `scale` launched on another stream reading
/// it: with `declared`, the launch waits for the upload on the device and computes from the uploaded data.
/// Returns what `y` holds and what it should.
fn kernel_after_an_upload_on_another_stream(declared: bool) -> (Vec<f32>, Vec<f32>) {
    let ctx = context();
    let (upload, compute) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let scale = kernel(&ctx, "scale");
    let values = floats(N, 1);
    let host = Pinned::from_slice(&ctx, &values).unwrap();
    let mut x = DeviceBuffer::<f32>::zeroed(&upload, N).unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&compute, N).unwrap();
    upload.synchronize().unwrap();
    compute.synchronize().unwrap();
    spin(&upload, 300);
    upload.upload(&host, &mut x).unwrap();
    launch_scale(&compute, &scale, &x, &mut y, 3.0, declared);
    let mut out = Pinned::<f32>::zeroed(&ctx, N).unwrap();
    compute.download(&y, &mut out).unwrap();
    let got = out.as_slice().unwrap().to_vec();
    upload.synchronize().unwrap();
    (got, values.iter().map(|v| 3.0 * v).collect())
}

#[test]
fn a_kernel_reading_a_buffer_another_stream_uploads_waits_for_the_upload() {
    let _serial = serial_on_two_devices();
    let (got, want) = kernel_after_an_upload_on_another_stream(true);
    assert!(
        got == want,
        "the kernel read `x` before the upload had written it"
    );
}

#[test]
fn control_a_kernel_whose_read_is_undeclared_runs_before_the_upload() {
    let _serial = serial_on_two_devices();
    let (got, want) = kernel_after_an_upload_on_another_stream(false);
    assert!(
        got != want,
        "an undeclared read waited for the upload: this control cannot show the rule"
    );
}

/// Sixteen buffers uploaded on one stream behind 300 ms of other work, then `sum17_u32` launched on another
/// stream reading all of them (the first twice: 17 reads and a write, more buffers and parameters than a launch
/// keeps on the stack). With `declared`, the launch waits for every upload on the device. Returns the sums and
/// what they should be.
fn many_buffers_after_uploads(declared: bool) -> (Vec<u32>, Vec<u32>) {
    const LEN: usize = 1 << 12;
    let ctx = context();
    let (upload, compute) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let sum17 = kernel(&ctx, "sum17_u32");
    let values: Vec<Vec<u32>> = (0..16).map(|seed| data(LEN, 100 + seed)).collect();
    let hosts: Vec<Pinned<u32>> = values
        .iter()
        .map(|v| Pinned::from_slice(&ctx, v).unwrap())
        .collect();
    let mut inputs: Vec<DeviceBuffer<u32>> = (0..16)
        .map(|_| DeviceBuffer::zeroed(&upload, LEN).unwrap())
        .collect();
    let mut out = DeviceBuffer::<u32>::zeroed(&compute, LEN).unwrap();
    upload.synchronize().unwrap();
    compute.synchronize().unwrap();
    spin(&upload, 300);
    for (host, input) in hosts.iter().zip(&mut inputs) {
        upload.upload(host, input).unwrap();
    }
    let n = LEN as u32;
    let config = LaunchConfig::for_elements(LEN, 256).unwrap();
    if declared {
        let mut args: Vec<Arg<'_>> = inputs.iter().map(Arg::read).collect();
        args.push(Arg::read(&inputs[0]));
        args.push(Arg::write(&mut out));
        args.push(Arg::value(&n));
        // SAFETY: sum17_u32 takes 17 `const unsigned*`, an `unsigned*` and an `unsigned`; it reads [..n] of each
        // input (n elements each) and writes out[..n].
        unsafe { compute.launch(&sum17, config, &args) }.unwrap();
    } else {
        let mut addresses: Vec<u64> = inputs.iter().map(DeviceBuffer::as_raw).collect();
        addresses.push(inputs[0].as_raw());
        addresses.push(out.as_raw());
        let mut n = n;
        // SAFETY: as above, launched through the raw handle with only `out` declared (the control).
        unsafe {
            compute.enqueue_foreign(&[Use::write(&mut out)], |raw| {
                let mut params: Vec<*mut std::ffi::c_void> = addresses
                    .iter_mut()
                    .map(|a| (a as *mut u64).cast())
                    .collect();
                params.push((&raw mut n).cast());
                cuda_pinned::driver_call!(cuLaunchKernel(
                    sum17.as_raw(),
                    u32::try_from(LEN.div_ceil(256)).unwrap(),
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    raw,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ))
                .unwrap();
            })
        }
        .unwrap();
    }
    let mut got = Pinned::<u32>::zeroed(&ctx, LEN).unwrap();
    compute.download(&out, &mut got).unwrap();
    let got = got.as_slice().unwrap().to_vec();
    upload.synchronize().unwrap();
    let want = (0..LEN)
        .map(|i| {
            values
                .iter()
                .fold(values[0][i], |sum, v| sum.wrapping_add(v[i]))
        })
        .collect();
    (got, want)
}

#[test]
fn a_kernel_of_many_buffers_waits_for_each_of_them() {
    let _serial = serial_on_two_devices();
    let (got, want) = many_buffers_after_uploads(true);
    assert!(got == want, "the kernel read inputs before their uploads");
}

#[test]
fn control_a_kernel_of_many_undeclared_buffers_runs_before_the_uploads() {
    let mut serial = serial_on_two_devices();
    serial.expect_violations();
    let (got, want) = many_buffers_after_uploads(false);
    assert!(
        got != want,
        "undeclared reads waited for the uploads: this control cannot show the rule"
    );
    serial.take_violations();
}

/// `scale` on stream `a`, behind 300 ms of other work, reading `x`; then an upload of other values into `x` on
/// stream `b`: with `declared`, the upload waits for the kernel's read on the device. Returns what the kernel
/// computed and what it should have (from the first values).
fn upload_over_a_buffer_a_kernel_reads(declared: bool) -> (Vec<f32>, Vec<f32>) {
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let scale = kernel(&ctx, "scale");
    let (first, second) = (floats(N, 3), floats(N, 4));
    let (host1, host2) = (
        Pinned::from_slice(&ctx, &first).unwrap(),
        Pinned::from_slice(&ctx, &second).unwrap(),
    );
    let mut x = DeviceBuffer::<f32>::uninit(&b, N).unwrap();
    b.upload(&host1, &mut x).unwrap();
    b.synchronize().unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&a, N).unwrap();
    spin(&a, 300);
    launch_scale(&a, &scale, &x, &mut y, 2.0, declared);
    b.upload(&host2, &mut x).unwrap();
    let mut out = Pinned::<f32>::zeroed(&ctx, N).unwrap();
    a.download(&y, &mut out).unwrap();
    let got = out.as_slice().unwrap().to_vec();
    b.synchronize().unwrap();
    (got, first.iter().map(|v| 2.0 * v).collect())
}

#[test]
fn an_upload_into_a_buffer_a_kernel_reads_waits_for_the_kernel() {
    let _serial = serial_on_two_devices();
    let (got, want) = upload_over_a_buffer_a_kernel_reads(true);
    assert!(
        got == want,
        "the upload overwrote `x` before the kernel read it"
    );
}

#[test]
fn control_an_upload_into_a_buffer_an_undeclared_kernel_reads_runs_first() {
    let _serial = serial_on_two_devices();
    let (got, want) = upload_over_a_buffer_a_kernel_reads(false);
    assert!(
        got != want,
        "the upload waited for an undeclared read: this control cannot show the rule"
    );
}

/// `fill_u32` launched behind other work writing mapped pinned memory, declared as a write (`as_write`) or,
/// for the control, as a read: whether a host read found the memory busy meanwhile, and what it held after.
fn host_read_while_a_kernel_writes_mapped_memory(as_write: bool) -> (bool, Vec<u32>) {
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, "fill_u32");
    let mut out = PinnedBuilder::new(&ctx)
        .device_mapped(true)
        .zeroed::<u32>(N)
        .unwrap();
    let n = N as u32;
    let held = hold(&stream, Duration::from_millis(500));
    let used = if as_write {
        Arg::write_host(&mut out)
    } else {
        Arg::read_host(&out)
    };
    // SAFETY: fill_u32(unsigned*, unsigned, unsigned) writes out[..n] (declared as a read in the control).
    unsafe {
        stream
            .launch(
                &fill,
                LaunchConfig::for_elements(N, 256).unwrap(),
                &[used, Arg::value(&7u32), Arg::value(&n)],
            )
            .unwrap();
    }
    let busy = out.try_as_slice().unwrap().is_none();
    drop(held);
    stream.synchronize().unwrap();
    (busy, out.as_slice().unwrap().to_vec())
}

#[test]
fn a_kernel_writing_mapped_pinned_memory_makes_host_access_wait() {
    let _serial = serial_on_two_devices();
    let (busy, got) = host_read_while_a_kernel_writes_mapped_memory(true);
    assert!(
        busy,
        "a host read did not wait for the kernel writing the memory"
    );
    assert!(
        got.iter().all(|&v| v == 7),
        "the kernel's writes are missing"
    );
}

#[test]
fn control_mapped_memory_declared_as_read_lets_host_reads_through() {
    let _serial = serial_on_two_devices();
    let (busy, _) = host_read_while_a_kernel_writes_mapped_memory(false);
    assert!(
        !busy,
        "a declared read made the host wait: this control cannot show the rule"
    );
}

/// Other code's memset of `y` on one stream behind 300 ms of work, declared (or, for the control, not), then
/// a download of `y` on another stream: what it read.
fn download_after_foreign_work(declared: bool) -> Vec<u32> {
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut y = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    a.synchronize().unwrap();
    spin(&a, 300);
    let yp = y.as_raw();
    let memset = |raw| {
        // SAFETY: N words of live device memory of the stream's context.
        unsafe { cuda_pinned::driver_call!(cuMemsetD32Async(yp, 7, N, raw)) }.unwrap();
    };
    let uses = if declared {
        vec![Use::write(&mut y)]
    } else {
        vec![]
    };
    // SAFETY: the memset touches y alone, on the stream it is given; the control leaves it undeclared.
    unsafe { a.enqueue_foreign(&uses, memset) }.unwrap();
    drop(uses);
    let mut out = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    b.download(&y, &mut out).unwrap();
    let got = out.as_slice().unwrap().to_vec();
    a.synchronize().unwrap();
    got
}

#[test]
fn a_foreign_work_declaration_orders_a_later_download_after_it() {
    let _serial = serial_on_two_devices();
    let got = download_after_foreign_work(true);
    assert!(
        got.iter().all(|&v| v == 7),
        "the download ran before the declared memset"
    );
}

#[test]
fn control_undeclared_foreign_work_is_not_waited_for() {
    let _serial = serial_on_two_devices();
    let got = download_after_foreign_work(false);
    assert!(
        got.iter().any(|&v| v != 7),
        "the download waited for undeclared work: this control cannot show the rule"
    );
}

/// `x` made on stream `b`, read by `scale` on stream `a` behind 300 ms of work, and dropped at once; with
/// `declared`, its memory is freed only after the kernel. Returns `y` and what it should hold, and on a GPU
/// whether a buffer allocated on `b` right after the drop got `x`'s memory (and filled it with other data).
fn drop_while_a_kernel_reads(
    declared: bool,
    serial: &mut Serial,
) -> (Vec<f32>, Vec<f32>, Vec<String>) {
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let scale = kernel(&ctx, "scale");
    let values = floats(N, 2);
    let host = Pinned::from_slice(&ctx, &values).unwrap();
    let mut x = DeviceBuffer::<f32>::uninit(&b, N).unwrap();
    b.upload(&host, &mut x).unwrap();
    b.synchronize().unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&a, N).unwrap();
    spin(&a, 300);
    launch_scale(&a, &scale, &x, &mut y, 2.0, declared);
    drop(x);
    if common::SIMULATED && !declared {
        // The simulated driver reports the early free (and the kernel's read of freed memory) as violations,
        // and fails the next driver call after each with CUDA_ERROR_ILLEGAL_ADDRESS, as a GPU would fail its
        // context: let those calls fail, then take what it found.
        for _ in 0..4 {
            if a.synchronize().is_ok() && b.synchronize().is_ok() {
                break;
            }
        }
        return (Vec::new(), Vec::new(), serial.take_violations());
    }
    // Other data in whatever memory `b` allocates next: where that is x's, a kernel still to read x sees it.
    let other = Pinned::from_slice(&ctx, &vec![-1.0f32; N]).unwrap();
    let mut z = DeviceBuffer::<f32>::uninit(&b, N).unwrap();
    b.upload(&other, &mut z).unwrap();
    b.synchronize().unwrap();
    let mut out = Pinned::<f32>::zeroed(&ctx, N).unwrap();
    a.download(&y, &mut out).unwrap();
    let got = out.as_slice().unwrap().to_vec();
    drop(z);
    ctx.synchronize().unwrap();
    let violations = serial.take_violations();
    (got, values.iter().map(|v| 2.0 * v).collect(), violations)
}

#[test]
fn a_buffer_dropped_while_a_kernel_reads_it_is_freed_after_the_kernel() {
    let mut serial = serial_on_two_devices();
    let (got, want, violations) = drop_while_a_kernel_reads(true, &mut serial);
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        got == want,
        "the kernel read memory that was freed and reused under it"
    );
}

#[test]
fn control_a_buffer_whose_read_is_undeclared_is_freed_under_the_kernel() {
    let mut serial = serial_on_two_devices();
    serial.expect_violations();
    let (got, want, violations) = drop_while_a_kernel_reads(false, &mut serial);
    if common::SIMULATED {
        assert!(
            violations.iter().any(|v| v.contains("free")),
            "the simulator saw no early free: {violations:#?}"
        );
    } else {
        assert!(
            got != want,
            "the kernel read the data after an undeclared drop: this control cannot show the rule"
        );
    }
}

#[test]
fn bad_launches_are_errors_before_anything_is_enqueued() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let scale = kernel(&ctx, "scale");
    assert_eq!(scale.param_sizes(), Some(&[8, 8, 4, 4][..]));
    let x = DeviceBuffer::<f32>::zeroed(&stream, N).unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&stream, N).unwrap();
    let (a, n, wide) = (1.0f32, N as u32, N as u64);
    let fine = LaunchConfig::for_elements(N, 256).unwrap();
    // SAFETY: every launch below that is accepted passes scale its parameters with their types.
    unsafe {
        invalid(
            stream.launch(
                &scale,
                fine,
                &[Arg::read(&x), Arg::write(&mut y), Arg::value(&a)],
            ),
            "3 arguments for 4 parameters",
        );
        invalid(
            stream.launch(
                &scale,
                fine,
                &[
                    Arg::read(&x),
                    Arg::write(&mut y),
                    Arg::value(&a),
                    Arg::value(&wide),
                ],
            ),
            "argument 3 is 8 bytes and the parameter 4",
        );
        let mut bad = |config: LaunchConfig, says: &str| {
            let args = [
                Arg::read(&x),
                Arg::write(&mut y),
                Arg::value(&a),
                Arg::value(&n),
            ];
            invalid(stream.launch(&scale, config, &args), says);
        };
        bad(LaunchConfig::new(1, 2048), "block");
        bad(LaunchConfig::new(0, 256), "at least 1");
        let mut tall = fine;
        tall.block = [32, 32, 2];
        bad(tall, "threads per block");
        let mut shared = fine;
        shared.shared_memory = 16 << 20;
        bad(shared, "shared memory");
        // The twin: the same launch, right.
        let args = [
            Arg::read(&x),
            Arg::write(&mut y),
            Arg::value(&a),
            Arg::value(&n),
        ];
        stream.launch(&scale, fine, &args).unwrap();
    }
    stream.synchronize().unwrap();

    let missing = module(&ctx).kernel("no_such_kernel").unwrap_err();
    assert_eq!(
        missing.driver_code(),
        Some(cuda_pinned::sys::CUresult::CUDA_ERROR_NOT_FOUND),
        "{missing}"
    );
    assert!(missing.to_string().contains("no_such_kernel"), "{missing}");
    // Only text loads safely: an empty image, and a binary's magic number, are refused before the driver
    // sees them.
    assert!(matches!(
        Module::load(&ctx, b""),
        Err(Error::InvalidArgument { .. })
    ));
    let forged = Module::load(&ctx, b"\x7fELF\x02\x01\x01").unwrap_err();
    assert!(forged.to_string().contains("load_binary"), "{forged}");
    // SAFETY: an empty image is refused before the driver sees it.
    let empty = unsafe { Module::load_binary(&ctx, b"") };
    assert!(matches!(empty, Err(Error::InvalidArgument { .. })));
}

/// Buffers and modules of another device's context are refused. Needs two devices: the simulated driver has
/// them here; on a GPU machine with one, this test fails rather than pass unseen.
#[test]
fn buffers_and_kernels_of_another_context_are_refused() {
    let _serial = serial_on_two_devices();
    assert!(common::device_count() >= 2, "this test needs two devices");
    let (ctx0, ctx1) = (Context::on(0).unwrap(), Context::on(1).unwrap());
    let (s0, s1) = (Stream::new(&ctx0).unwrap(), Stream::new(&ctx1).unwrap());
    let scale0 = kernel(&ctx0, "scale");
    let x1 = DeviceBuffer::<f32>::zeroed(&s1, N).unwrap();
    let mut y0 = DeviceBuffer::<f32>::zeroed(&s0, N).unwrap();
    let mut y1 = DeviceBuffer::<f32>::zeroed(&s1, N).unwrap();
    let (a, n) = (1.0f32, N as u32);
    let fine = LaunchConfig::for_elements(N, 256).unwrap();
    // SAFETY: scale's parameter types; every launch but the last is refused before the driver sees it.
    unsafe {
        invalid(
            s0.launch(
                &scale0,
                fine,
                &[
                    Arg::read(&x1),
                    Arg::write(&mut y0),
                    Arg::value(&a),
                    Arg::value(&n),
                ],
            ),
            "a buffer of device 1 used on a stream of device 0",
        );
        invalid(
            s1.launch(
                &scale0,
                fine,
                &[
                    Arg::read(&x1),
                    Arg::write(&mut y1),
                    Arg::value(&a),
                    Arg::value(&n),
                ],
            ),
            "the kernel's module is loaded on device 0",
        );
        let refused = s0.enqueue_foreign::<()>(&[Use::read(&x1)], |_| unreachable!("not run"));
        invalid(refused.map(drop), "a buffer of device 1");
        let x0 = DeviceBuffer::<f32>::zeroed(&s0, N).unwrap();
        s0.launch(
            &scale0,
            fine,
            &[
                Arg::read(&x0),
                Arg::write(&mut y0),
                Arg::value(&a),
                Arg::value(&n),
            ],
        )
        .unwrap();
    }
    s0.synchronize().unwrap();
}

/// A launch and a foreign declaration on one stream record no event (stream order covers them), and a
/// module dropped while its kernel runs is unloaded only after.
#[test]
fn a_module_dropped_while_its_kernel_runs_is_unloaded_after() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let mut y = DeviceBuffer::<u32>::zeroed(&stream, N).unwrap();
    let n = N as u32;
    {
        let fill = kernel(&ctx, "fill_u32");
        spin(&stream, 200);
        // SAFETY: fill_u32(unsigned*, unsigned, unsigned) writes y[..n].
        unsafe {
            stream
                .launch(
                    &fill,
                    LaunchConfig::for_elements(N, 256).unwrap(),
                    &[Arg::write(&mut y), Arg::value(&9u32), Arg::value(&n)],
                )
                .unwrap();
        }
        // The kernel and its module drop here, with the launch still queued.
    }
    let mut out = vec![0u32; N];
    stream.download_pageable(&y, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 9));
    ctx.synchronize().unwrap();
}

/// A declared foreign enqueue that panics after enqueueing: the work it enqueued is still recorded, so a
/// download on another stream waits for it (and, on the simulated driver, dropping the buffer frees nothing
/// under it). The control declares nothing and reads too early.
fn download_after_a_panicking_enqueue(declared: bool) -> Vec<u32> {
    let ctx = context();
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let mut y = DeviceBuffer::<u32>::zeroed(&a, N).unwrap();
    a.synchronize().unwrap();
    spin(&a, 300);
    let yp = y.as_raw();
    let uses = if declared {
        vec![Use::write(&mut y)]
    } else {
        vec![]
    };
    let memset_then_panic = |raw| {
        // SAFETY: N words of live device memory of the stream's context.
        unsafe { cuda_pinned::driver_call!(cuMemsetD32Async(yp, 5, N, raw)) }.unwrap();
        panic!("other code panics after enqueueing");
    };
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: a memset of y[..N] on the stream given (undeclared in the control), then a panic.
        let _ = unsafe { a.enqueue_foreign(&uses, memset_then_panic) };
    }));
    assert!(panicked.is_err(), "the closure's panic reaches the caller");
    drop(uses);
    let mut out = Pinned::<u32>::zeroed(&ctx, N).unwrap();
    b.download(&y, &mut out).unwrap();
    let got = out.as_slice().unwrap().to_vec();
    if declared {
        // Freed only after the memset, which the tracking knows of.
        drop(y);
        a.synchronize().unwrap();
    } else {
        // The control's memset is unknown to the tracking: keep the buffer until it has run.
        a.synchronize().unwrap();
        drop(y);
    }
    got
}

#[test]
fn work_enqueued_before_a_panic_in_a_declared_enqueue_is_still_waited_for() {
    let _serial = serial_on_two_devices();
    let got = download_after_a_panicking_enqueue(true);
    assert!(
        got.iter().all(|&v| v == 5),
        "the download ran before the memset"
    );
}

#[test]
fn control_undeclared_work_before_a_panic_is_not_waited_for() {
    let _serial = serial_on_two_devices();
    let got = download_after_a_panicking_enqueue(false);
    assert!(
        got.iter().any(|&v| v != 5),
        "the download waited for undeclared work: this control cannot show the rule"
    );
}

/// A declared enqueue's closure may call the crate, on its own stream and from other threads it waits for,
/// with memory waiting to be released meanwhile: nothing hangs (each case bounded by a thread with a limit).
#[test]
fn a_declared_enqueue_may_call_the_crate_and_wait_for_threads_that_do() {
    let _serial = serial_on_two_devices();
    let ((), _) = common::on_a_thread("crate calls inside enqueue_foreign", common::LIMIT, || {
        let ctx = context();
        let (s, s2) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let host = Pinned::from_slice(&ctx, &data(N, 9)).unwrap();
        let mut x = DeviceBuffer::<u32>::zeroed(&s, N).unwrap();
        let mut z = DeviceBuffer::<u32>::zeroed(&s2, N).unwrap();
        let mut w = DeviceBuffer::<u32>::zeroed(&s2, N).unwrap();
        let y = DeviceBuffer::<u32>::zeroed(&s, N).unwrap();
        // Memory for the release thread, which takes the device's gate for writing when it frees it.
        drop(Pinned::<u8>::zeroed(&ctx, 1 << 20).unwrap());
        // SAFETY: the closure enqueues no work of other code: it only calls the crate.
        unsafe {
            s.enqueue_foreign(&[Use::read(&y)], |_| {
                // On this stream, from this thread and from another one this thread waits for.
                s.upload(&host, &mut x).unwrap();
                std::thread::scope(|scope| {
                    scope.spawn(|| s.copy(&y, &mut w).unwrap());
                    scope.spawn(|| s2.copy(&y, &mut z).unwrap());
                });
            })
        }
        .unwrap();
        ctx.synchronize().unwrap();
    });
}

/// Device memory given to `from_raw` and dropped while another stream is busy: the bytes freed by the time
/// the buffer's own stream has finished (the crate's pool set to keep no freed memory, so that its stream's
/// synchronization returns it). Simulated driver only (a GPU's pool may keep some for reuse all the same).
#[cfg(not(feature = "gpu"))]
fn freed_while_the_device_is_busy(from_a_pool: bool) -> usize {
    let ctx = context();
    // What the pool kept from earlier tests goes back now, not during the measure.
    ctx.set_device_memory_kept(0).unwrap();
    ctx.synchronize().unwrap();
    let (a, busy) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let bytes = N * size_of::<u32>();
    let ptr = if from_a_pool {
        let (ptr, _) = DeviceBuffer::<u32>::zeroed(&a, N)
            .unwrap()
            .into_raw()
            .unwrap();
        ptr
    } else {
        let mut ptr = 0;
        // SAFETY: the context made current for the allocation, then popped; an out-pointer to a local.
        unsafe {
            cuda_pinned::driver_call!(cuCtxPushCurrent_v2(ctx.as_raw())).unwrap();
            cuda_pinned::driver_call!(cuMemAlloc_v2(&mut ptr, bytes)).unwrap();
            cuda_pinned::driver_call!(cuCtxPopCurrent_v2(&mut std::ptr::null_mut())).unwrap();
        }
        ptr
    };
    // SAFETY: a whole allocation of N words of this context, with no work pending, owned by nobody else.
    let buffer = unsafe { DeviceBuffer::<u32>::from_raw(&a, ptr, N) };
    let held = hold(&busy, Duration::from_secs(10));
    let (before, _) = ctx.memory_info().unwrap();
    drop(buffer);
    a.synchronize().unwrap();
    let (after, _) = ctx.memory_info().unwrap();
    drop(held);
    ctx.synchronize().unwrap();
    ctx.set_device_memory_kept(cuda_pinned::DEVICE_MEMORY_KEPT)
        .unwrap();
    after - before
}

#[cfg(not(feature = "gpu"))]
#[test]
fn pool_memory_from_raw_is_freed_after_its_use_while_the_device_is_busy() {
    let _serial = serial_on_two_devices();
    assert_eq!(freed_while_the_device_is_busy(true), N * size_of::<u32>());
}

#[cfg(not(feature = "gpu"))]
#[test]
fn control_memory_of_cu_mem_alloc_from_raw_waits_for_an_idle_device() {
    let _serial = serial_on_two_devices();
    // cuMemFree waits for the whole device: the crate frees such memory only once the device is idle.
    assert_eq!(freed_while_the_device_is_busy(false), 0);
}

/// An empty mapped host buffer is a null pointer argument, not an error.
#[test]
fn an_empty_host_buffer_argument_is_a_null_pointer() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let stream = Stream::new(&ctx).unwrap();
    let fill = kernel(&ctx, "fill_u32");
    let mut empty = Pinned::<u32>::zeroed(&ctx, 0).unwrap();
    // SAFETY: fill_u32 writes out[..0]: nothing.
    unsafe {
        stream
            .launch(
                &fill,
                LaunchConfig::new(1, 32),
                &[
                    Arg::write_host(&mut empty),
                    Arg::value(&1u32),
                    Arg::value(&0u32),
                ],
            )
            .unwrap();
    }
    stream.synchronize().unwrap();
}

/// Loading a module waits for the work already running on the device, on any stream (as `Module::load` says),
/// and loads its kernels: their first launch waits for nothing. Both as the driver does it (an H100, driver 580).
#[test]
fn loading_a_module_waits_for_running_work_and_a_first_launch_does_not() {
    let _serial = serial_on_two_devices();
    let ctx = context();
    let (busy, stream) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let x = DeviceBuffer::<f32>::zeroed(&stream, N).unwrap();
    let mut y = DeviceBuffer::<f32>::zeroed(&stream, N).unwrap();
    stream.synchronize().unwrap();
    spin(&busy, 300);
    let scale = kernel(&ctx, "scale");
    assert!(
        busy.query().unwrap(),
        "the module loaded while other work still ran"
    );
    let held = hold(&busy, Duration::from_secs(2));
    launch_scale(&stream, &scale, &x, &mut y, 2.0, true);
    assert!(
        !busy.query().unwrap(),
        "the first launch returned only once the unrelated work had run"
    );
    drop(held);
    // Their frees done before the next test measures memory.
    drop((x, y));
    stream.synchronize().unwrap();
    busy.synchronize().unwrap();
}
