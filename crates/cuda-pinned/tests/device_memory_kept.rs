//! Freed device memory that the crate's memory pool keeps for its next allocations
//! (`Context::set_device_memory_kept`): kept across synchronizations as set, returned to the driver by
//! `Context::trim_device_memory`, and returned first by an allocation that finds the device full. A test binary
//! of its own: on the simulated driver the device has 64 MiB, and the pool's reserve is read whole.

mod common;

use common::{Serial, serial};
use cuda_pinned::{Context, DEVICE_MEMORY_KEPT, DeviceBuffer, Stream};

const MIB: usize = 1 << 20;

/// Device memory of the simulated driver's device: small enough that a test fills it.
#[cfg(not(feature = "gpu"))]
const DEVICE_MEMORY: usize = 64 * MIB;

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

/// Allocates `count` buffers of `bytes` on `stream` and frees them (each free ordered on `stream`).
fn allocate_and_free(stream: &Stream, count: usize, bytes: usize) {
    let buffers: Vec<DeviceBuffer<u8>> = (0..count)
        .map(|_| DeviceBuffer::uninit(stream, bytes).unwrap())
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
    allocate_and_free(&s, 1, MIB);
    ctx.synchronize().unwrap();
    assert_eq!(ctx.device_memory_kept().unwrap(), DEVICE_MEMORY_KEPT);
    ctx.trim_device_memory(0).unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "nothing is allocated");

    // Kept: a synchronized step's freed memory stays with the pool (the control of the next part).
    ctx.set_device_memory_kept(u64::MAX).unwrap();
    allocate_and_free(&s, 3, 4 * MIB);
    ctx.synchronize().unwrap();
    assert_eq!(
        reserved_mib(&ctx),
        12,
        "the pool keeps what was freed, as set"
    );
    // The next step's allocations reuse it: nothing more is reserved.
    allocate_and_free(&s, 3, 4 * MIB);
    ctx.synchronize().unwrap();
    assert_eq!(
        reserved_mib(&ctx),
        12,
        "the next step reused the kept memory"
    );
    ctx.trim_device_memory(4 * MIB).unwrap();
    assert!(
        reserved_mib(&ctx) <= 4,
        "trimmed to 4 MiB: {} MiB reserved",
        reserved_mib(&ctx)
    );
    ctx.trim_device_memory(0).unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "trimmed to nothing");

    // Not kept: the synchronization returns it.
    ctx.set_device_memory_kept(0).unwrap();
    assert_eq!(ctx.device_memory_kept().unwrap(), 0);
    allocate_and_free(&s, 3, 4 * MIB);
    ctx.synchronize().unwrap();
    assert_eq!(reserved_mib(&ctx), 0, "a threshold of 0 keeps nothing");

    ctx.set_device_memory_kept(DEVICE_MEMORY_KEPT).unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// Kept memory in blocks too small for a larger allocation, with the device otherwise full: the allocation
/// returns the kept memory and succeeds. Beside it, the control: other code's allocation of the same size
/// (`cuMemAlloc`, outside the pool) fails while the memory is kept, and succeeds once it is trimmed.
#[cfg(not(feature = "gpu"))]
#[test]
fn an_allocation_that_finds_the_device_full_returns_the_kept_memory_first() {
    use cuda_pinned::driver_call;

    let _serial = setup();
    let ctx = context();
    let s = Stream::new(&ctx).unwrap();
    ctx.set_device_memory_kept(u64::MAX).unwrap();
    allocate_and_free(&s, 6, 8 * MIB);
    ctx.synchronize().unwrap();
    assert_eq!(reserved_mib(&ctx), 48);

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
        !other_code_allocates(32 * MIB),
        "the kept memory leaves the device too little for 32 MiB (the control)"
    );
    let large = DeviceBuffer::<u8>::uninit(&s, 32 * MIB)
        .unwrap_or_else(|e| panic!("the pool did not give back what it kept: {e}"));
    assert_eq!(
        reserved_mib(&ctx),
        32,
        "the kept blocks went back to the device"
    );
    drop(large);
    ctx.synchronize().unwrap();
    ctx.trim_device_memory(0).unwrap();
    assert!(
        other_code_allocates(32 * MIB),
        "trimmed, the memory is the device's again"
    );
    // SAFETY: the thread's context is no longer needed.
    unsafe { driver_call!(cuCtxSetCurrent(std::ptr::null_mut())) }.unwrap();
    ctx.set_device_memory_kept(DEVICE_MEMORY_KEPT).unwrap();
    ctx.check_deferred_errors().unwrap();
}
