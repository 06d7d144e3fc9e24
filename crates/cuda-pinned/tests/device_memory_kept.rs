//! Freed device memory that the crate's memory pool keeps for its next allocations
//! (`Context::set_device_memory_kept`): kept across synchronizations as set, reused by allocations of any size,
//! and returned to the driver by `Context::trim_device_memory` for other code that needs it. A test binary of
//! its own: on the simulated driver the device has 256 MiB, and the pool's reserve is read whole.

mod common;

use common::{Serial, serial};
use cuda_pinned::{Context, DEVICE_MEMORY_KEPT, DeviceBuffer, Stream};

const MIB: usize = 1 << 20;

/// Device memory of the simulated driver's device: small enough that a test fills it.
#[cfg(not(feature = "gpu"))]
const DEVICE_MEMORY: usize = 256 * MIB;

/// The tests of this binary one at a time, the simulated driver's device memory chosen first.
fn setup() -> Serial {
    #[cfg(not(feature = "gpu"))]
    cuda_pinned_sim::install_with(
        cuda_pinned_sim::Settings::new().device_memory(DEVICE_MEMORY as u64),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    serial()
}

fn context() -> Context {
    common::device(0)
}

/// Allocates buffers of `sizes` (in MiB) on `stream` and frees them (each free ordered on `stream`).
fn allocate_and_free(stream: &Stream, sizes: &[usize]) {
    let buffers: Vec<DeviceBuffer<u8>> = sizes
        .iter()
        .map(|&mib| DeviceBuffer::uninit(stream, mib * MIB).unwrap())
        .collect();
    drop(buffers);
}

fn reserved_mib(ctx: &Context) -> usize {
    ctx.device_memory_reserved().unwrap() as usize / MIB
}

#[test]
fn freed_device_memory_is_kept_as_set_and_returned_on_request() {
    let _serial = setup();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    // The pool is made by the first allocation, with the default.
    allocate_and_free(&s, &[32]);
    ctx.synchronize().unwrap();
    assert_eq!(ctx.device_memory_kept().unwrap(), DEVICE_MEMORY_KEPT);
    ctx.trim_device_memory(0).unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "nothing is allocated");

    // Kept: a synchronized step's freed memory stays with the pool (the control of the last part).
    ctx.set_device_memory_kept(u64::MAX).unwrap();
    allocate_and_free(&s, &[32, 32, 32]);
    ctx.synchronize().unwrap();
    assert_eq!(reserved_mib(&ctx), 96, "the pool keeps what was freed");
    // The next step's allocations, of other sizes, reuse it: nothing more is reserved.
    allocate_and_free(&s, &[64, 32]);
    ctx.synchronize().unwrap();
    assert_eq!(
        reserved_mib(&ctx),
        96,
        "the next step reused the kept memory"
    );
    ctx.trim_device_memory(0).unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "trimmed to nothing");

    // Not kept: the synchronization returns it.
    ctx.set_device_memory_kept(0).unwrap();
    assert_eq!(ctx.device_memory_kept().unwrap(), 0);
    allocate_and_free(&s, &[32, 32, 32]);
    ctx.synchronize().unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "a threshold of 0 keeps nothing");

    ctx.set_device_memory_kept(DEVICE_MEMORY_KEPT).unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// The setting is the device's: a context made after the last handle went (which destroys the crate's pool)
/// has it, and the pool made anew keeps what it says.
#[test]
fn the_setting_outlives_the_devices_last_context_handle() {
    let _serial = setup();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    allocate_and_free(&s, &[32]);
    ctx.set_device_memory_kept(0).unwrap();
    ctx.synchronize().unwrap();
    drop((s, ctx));
    let ctx = context();
    assert_eq!(
        ctx.device_memory_reserved().unwrap(),
        0,
        "no pool yet, or an empty one"
    );
    assert_eq!(ctx.device_memory_kept().unwrap(), 0);
    let s = Stream::new(&ctx).unwrap();
    allocate_and_free(&s, &[32, 32]);
    ctx.synchronize().unwrap();
    assert_eq!(
        reserved_mib(&ctx),
        0,
        "the pool made anew keeps nothing, as set"
    );
    ctx.set_device_memory_kept(DEVICE_MEMORY_KEPT).unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// Memory the pool keeps is the pool's: another library's allocation (`cuMemAlloc`, outside the pool) that
/// needs it fails until `trim_device_memory` gives it back, while the pool's own allocations, larger than any
/// it freed, are served from it.
#[cfg(not(feature = "gpu"))]
#[test]
fn kept_memory_serves_the_pool_and_is_given_back_to_other_code_on_request() {
    use cuda_pinned::driver_call;

    let _serial = setup();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    ctx.set_device_memory_kept(u64::MAX).unwrap();
    allocate_and_free(&s, &[32; 6]);
    ctx.synchronize().unwrap();
    assert_eq!(reserved_mib(&ctx), 192);
    // 224 MiB of the device's 256: the kept 192 and 32 more.
    allocate_and_free(&s, &[224]);
    ctx.synchronize().unwrap();
    assert_eq!(
        reserved_mib(&ctx),
        224,
        "the pool's allocation was served from its kept memory"
    );

    let other_code_allocates = |bytes: usize| {
        let mut ptr = 0;
        // SAFETY: an out-pointer to a local; the context is current (made so below).
        let allocated = unsafe { driver_call!(cuMemAlloc_v2(&mut ptr, bytes)) };
        if allocated.is_ok() {
            // SAFETY: the allocation just made, unused.
            unsafe { driver_call!(cuMemFree_v2(ptr)) }.unwrap();
        }
        allocated.is_ok()
    };
    // SAFETY: a live context, current on this test's thread only.
    unsafe { driver_call!(cuCtxSetCurrent(ctx.as_raw())) }.unwrap();
    assert!(
        !other_code_allocates(128 * MIB),
        "other code finds the kept memory taken"
    );
    ctx.trim_device_memory(0).unwrap();
    assert!(
        other_code_allocates(128 * MIB),
        "trimmed, the memory is the device's again"
    );
    // SAFETY: the thread's context is no longer needed.
    unsafe { driver_call!(cuCtxSetCurrent(std::ptr::null_mut())) }.unwrap();
    ctx.set_device_memory_kept(DEVICE_MEMORY_KEPT).unwrap();
    ctx.check_deferred_errors().unwrap();
}
