//! The crate with two devices on the simulated driver: what one device's work must not do to the other's.
//!
//! Unpinning page-locked memory (`cuMemFreeHost`, `cuMemHostUnregister`) waits for the work of every device it
//! is mapped into, and page-locked memory is mapped into all of them (unified addressing). The simulated driver
//! reports such a wait for queued work as a hidden wait, which fails the test that was running.
//!
//! Only without feature `gpu`: the lent GPU machines of one device cannot run it.
#![cfg(not(feature = "gpu"))]

mod common;

use std::time::Duration;

use common::{data, hold, serial_on_two_devices};
use cuda_pinned::{Context, DeviceBuffer, Pinned, Stream};

/// Pinned memory of device 0 dropped while device 1 has work queued is unpinned only once device 1 is idle
/// too. Released once its own device was idle, it waited for device 1's queued work (seen about once in 20
/// runs of user_kernels, where one test's frees on device 1 met another's unpinning).
#[test]
fn pinned_memory_is_unpinned_only_once_every_device_is_idle() {
    let _serial = serial_on_two_devices();
    let (ctx0, ctx1) = (Context::on(0).unwrap(), Context::on(1).unwrap());
    let s1 = Stream::new(&ctx1).unwrap();
    let held = hold(&s1, Duration::from_secs(2));
    // A free queued on device 1 behind the held work.
    drop(DeviceBuffer::<u32>::zeroed(&s1, 1 << 16).unwrap());
    let s0 = Stream::new(&ctx0).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s0, 1 << 16).unwrap();
    for seed in 0..3 {
        let host = Pinned::from_slice(&ctx0, &data(1 << 16, seed)).unwrap();
        s0.upload(&host, &mut device).unwrap();
        s0.synchronize().unwrap();
        drop(host);
        // Rounds of the release thread, each finding device 0 idle and device 1 not.
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    ctx1.synchronize().unwrap();
    ctx0.synchronize().unwrap();
}

/// A buffer of device 1 whose last use is a copy on device 0's stream, dropped with every handle of device
/// 1's context while that copy is still queued: it is freed after the copy, and its context, which the driver
/// would destroy with all its memory once the last handle goes, stays until then. Freed on device 0's stream
/// (its only user's), it left nothing holding device 1's context, and the context's destruction freed the
/// memory under the queued copy.
#[test]
fn memory_last_used_by_another_devices_stream_keeps_its_context_until_that_use_is_done() {
    let _serial = serial_on_two_devices();
    let ctx0 = Context::on(0).unwrap();
    let s0 = Stream::new(&ctx0).unwrap();
    let source = DeviceBuffer::<u32>::zeroed(&s0, 1 << 16).unwrap();
    let held;
    {
        let ctx1 = Context::on(1).unwrap();
        let s1 = Stream::new(&ctx1).unwrap();
        let mut target = DeviceBuffer::<u32>::zeroed(&s1, 1 << 16).unwrap();
        s1.synchronize().unwrap();
        s0.synchronize().unwrap();
        held = hold(&s0, Duration::from_secs(2));
        s0.copy(&source, &mut target).unwrap();
        drop(target);
        drop(s1);
        drop(ctx1);
    }
    std::thread::sleep(Duration::from_millis(50));
    drop(held);
    s0.synchronize().unwrap();
    ctx0.synchronize().unwrap();
}
