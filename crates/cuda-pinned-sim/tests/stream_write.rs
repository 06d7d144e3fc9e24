//! `cuStreamWriteValue32_v2` on the simulated driver, through raw driver calls, as a probe on 2 x H200 (driver
//! 580) found the driver: the value lands in stream order, after the work queued before it and not sooner, in
//! page-locked host memory (allocated or registered) or device memory, whatever context the calling thread has
//! current; an unaligned or unknown address, and flags other than 0, are refused at the call with nothing
//! queued; after a sticky fault of the context (a kernel that traps) it never lands, and every query of the
//! context's streams and events fails at once. Each rule beside its control.
//!
//! The simulator runs two devices here; every test holds it for itself (`exclusive`).

#[macro_use]
mod common;

use std::ffi::c_void;
use std::time::Duration;

use cuda_pinned_sim::{Control, Exclusive, Settings};
use cuda_pinned_sys::{CUcontext, CUdeviceptr, CUresult, CUstream};

/// How long a host function keeps a stream busy before a write.
const BUSY: Duration = Duration::from_millis(200);

fn sim() -> &'static Control {
    cuda_pinned_sim::install_with(Settings::new().devices(2)).unwrap_or_else(|e| panic!("{e}"))
}

/// Device `device`'s primary context current on the calling thread, a stream of it, and 4 KiB of page-locked
/// memory (portable, mapped), with the simulator held for the test.
struct Test {
    _sim: Exclusive<'static>,
    context: CUcontext,
    stream: CUstream,
    host: *mut u32,
}

impl Test {
    fn on(device: i32) -> Test {
        let sim = sim().exclusive();
        let (mut context, mut stream, mut host) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut::<c_void>(),
        );
        // SAFETY: out-pointers to locals; what is made is released in `drop`.
        unsafe {
            ok!(cuDevicePrimaryCtxRetain(&mut context, device));
            ok!(cuCtxSetCurrent(context));
            ok!(cuStreamCreate(&mut stream, 1));
            ok!(cuMemHostAlloc(&mut host, 4096, 0x3));
        }
        Test {
            _sim: sim,
            context,
            stream,
            host: host.cast(),
        }
    }

    /// The word at `index` of the page-locked memory, read as the host reads a flag the device writes.
    fn word(&self, index: usize) -> u32 {
        assert!(index < 1024);
        // SAFETY: inside the 4 KiB allocation, which lives until `drop`; a volatile read, as of a flag.
        unsafe { self.host.add(index).read_volatile() }
    }

    fn address(&self, index: usize) -> CUdeviceptr {
        self.host as CUdeviceptr + 4 * index as CUdeviceptr
    }

    fn write(&self, stream: CUstream, address: CUdeviceptr, value: u32, flags: u32) -> CUresult {
        // SAFETY: the simulator checks the stream and the address.
        unsafe { raw!(cuStreamWriteValue32_v2(stream, address, value, flags)) }
    }

    /// Queues a host function that sleeps for [`BUSY`] on the stream.
    fn busy(&self) {
        unsafe extern "C" fn sleep(_: *mut c_void) {
            std::thread::sleep(BUSY);
        }
        // SAFETY: a host function that makes no CUDA call.
        unsafe {
            ok!(cuLaunchHostFunc(
                self.stream,
                Some(sleep),
                std::ptr::null_mut()
            ))
        };
    }

    fn synchronize(&self) {
        // SAFETY: a live stream.
        unsafe { ok!(cuStreamSynchronize(self.stream)) };
    }
}

impl Drop for Test {
    fn drop(&mut self) {
        // SAFETY: what `on` made, with nothing queued any more.
        unsafe {
            ok!(cuStreamSynchronize(self.stream));
            ok!(cuStreamDestroy_v2(self.stream));
            ok!(cuMemFreeHost(self.host.cast()));
            ok!(cuCtxSetCurrent(std::ptr::null_mut()));
            ok!(cuDevicePrimaryCtxRelease_v2(0));
        }
        let _ = self.context;
    }
}

#[test]
fn the_value_lands_after_the_work_queued_before_it() {
    let t = Test::on(0);
    // The control: on an idle stream the write lands at once.
    assert_eq!(
        t.write(t.stream, t.address(0), 7, 0),
        CUresult::CUDA_SUCCESS
    );
    t.synchronize();
    assert_eq!(t.word(0), 7);
    // Behind busy work it does not land before that work is done.
    t.busy();
    assert_eq!(
        t.write(t.stream, t.address(1), 9, 0),
        CUresult::CUDA_SUCCESS
    );
    std::thread::sleep(BUSY / 4);
    assert_eq!(
        t.word(1),
        0,
        "the write landed before the work queued before it ended"
    );
    t.synchronize();
    assert_eq!(t.word(1), 9);
}

#[test]
fn registered_and_device_memory_are_written_too() {
    let t = Test::on(0);
    let mut page = vec![0u32; 2048];
    let base = page.as_mut_ptr().cast::<c_void>();
    let mut device = 0;
    // SAFETY: 4 KiB of the Vec registered (no flags: not mapped), unregistered below before the Vec goes; an
    // out-pointer to a local.
    unsafe {
        ok!(cuMemHostRegister_v2(base, 4096, 0));
        ok!(cuMemAlloc_v2(&mut device, 64));
    }
    assert_eq!(
        t.write(t.stream, base as CUdeviceptr + 8, 11, 0),
        CUresult::CUDA_SUCCESS
    );
    assert_eq!(t.write(t.stream, device + 4, 12, 0), CUresult::CUDA_SUCCESS);
    t.synchronize();
    let mut back = [0u32; 2];
    // SAFETY: 8 bytes of device memory into a local; then the registration made above.
    unsafe {
        ok!(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), device, 8));
        ok!(cuMemFree_v2(device));
        ok!(cuMemHostUnregister(base));
    }
    assert_eq!(page[2], 11);
    assert_eq!(back[1], 12);
}

#[test]
fn any_context_may_be_current() {
    let t = Test::on(0);
    let mut other = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the retain is released below.
    unsafe { ok!(cuDevicePrimaryCtxRetain(&mut other, 1)) };
    for (index, current) in [(2, std::ptr::null_mut()), (3, other)] {
        // SAFETY: no context, or device 1's primary context, current on this thread only.
        unsafe { ok!(cuCtxSetCurrent(current)) };
        assert_eq!(
            t.write(t.stream, t.address(index), 20 + index as u32, 0),
            CUresult::CUDA_SUCCESS
        );
        t.synchronize();
        assert_eq!(t.word(index), 20 + index as u32);
    }
    // SAFETY: device 0's context back, as `drop` expects; the retain taken above.
    unsafe {
        ok!(cuCtxSetCurrent(t.context));
        ok!(cuDevicePrimaryCtxRelease_v2(1));
    }
}

#[test]
fn a_bad_address_or_flag_is_refused_at_the_call_with_nothing_queued() {
    let t = Test::on(0);
    let pageable = [0u32; 16];
    for (what, address, flags) in [
        ("2 bytes off alignment", t.address(4) + 2, 0),
        ("address 0", 0, 0),
        (
            "unregistered pageable memory",
            pageable.as_ptr() as CUdeviceptr,
            0,
        ),
        ("flags 1 (no memory barrier)", t.address(4), 1),
        ("flags 0xff", t.address(4), 0xff),
    ] {
        assert_eq!(
            t.write(t.stream, address, 5, flags),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "{what}"
        );
    }
    t.synchronize();
    assert_eq!(t.word(4), 0, "a refused write changed nothing");
    assert!(pageable.iter().all(|&w| w == 0));
    // The stream is unharmed: a good write after them lands.
    assert_eq!(
        t.write(t.stream, t.address(4), 6, 0),
        CUresult::CUDA_SUCCESS
    );
    t.synchronize();
    assert_eq!(t.word(4), 6);
}

#[test]
fn after_a_sticky_fault_the_value_never_lands_and_every_call_on_the_context_fails() {
    let t = Test::on(0);
    let failed = CUresult::CUDA_ERROR_LAUNCH_FAILED;
    let mut event = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; destroyed at the end.
    unsafe { ok!(cuEventCreate(&mut event, 2)) };
    let record = |event| {
        // SAFETY: a live event and stream of one context.
        unsafe { raw!(cuEventRecord(event, t.stream)) }
    };
    // The control: behind busy work, without a fault, the value lands and the event fires.
    t.busy();
    assert_eq!(
        t.write(t.stream, t.address(5), 5, 0),
        CUresult::CUDA_SUCCESS
    );
    assert_eq!(record(event), CUresult::CUDA_SUCCESS);
    t.synchronize();
    assert_eq!(t.word(5), 5);
    // SAFETY: a live event.
    assert_eq!(unsafe { raw!(cuEventQuery(event)) }, CUresult::CUDA_SUCCESS);

    // The same behind a fault: a wait in progress ends with the error, and nothing queued runs.
    t.busy();
    assert_eq!(
        t.write(t.stream, t.address(6), 6, 0),
        CUresult::CUDA_SUCCESS
    );
    assert_eq!(record(event), CUresult::CUDA_SUCCESS);
    let stream = t.stream as usize;
    // SAFETY: a live stream (its handle passed as a number, to cross threads).
    let waiter =
        std::thread::spawn(move || unsafe { raw!(cuStreamSynchronize(stream as CUstream)) });
    std::thread::sleep(BUSY / 4);
    sim().fault_device(0);
    assert_eq!(waiter.join().unwrap(), failed);
    std::thread::sleep(BUSY);
    assert_eq!(t.word(6), 0, "a write queued before the fault landed");
    // SAFETY: live handles; device 0's context is current.
    unsafe {
        assert_eq!(raw!(cuStreamQuery(t.stream)), failed);
        assert_eq!(raw!(cuEventQuery(event)), failed);
        assert_eq!(raw!(cuEventSynchronize(event)), failed);
        assert_eq!(raw!(cuCtxSynchronize()), failed);
    }
    assert_eq!(t.write(t.stream, t.address(7), 7, 0), failed);

    // Another device's context is untouched.
    let (mut other, mut stream) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: out-pointers to locals; device 1's context current for the stream's creation only; all released.
    unsafe {
        ok!(cuDevicePrimaryCtxRetain(&mut other, 1));
        ok!(cuCtxSetCurrent(other));
        ok!(cuStreamCreate(&mut stream, 1));
        ok!(cuCtxSetCurrent(t.context));
    }
    assert_eq!(t.write(stream, t.address(8), 8, 0), CUresult::CUDA_SUCCESS);
    // SAFETY: the stream made above, then its context's retain.
    unsafe {
        ok!(cuStreamSynchronize(stream));
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuDevicePrimaryCtxRelease_v2(1));
    }
    assert_eq!(t.word(8), 8);

    // Recovered (as a reset of the context), the stream takes work again; what was dropped stays undone.
    sim().recover_device(0);
    assert_eq!(
        t.write(t.stream, t.address(9), 9, 0),
        CUresult::CUDA_SUCCESS
    );
    t.synchronize();
    assert_eq!((t.word(6), t.word(9)), (0, 9));
    // SAFETY: made above.
    unsafe { ok!(cuEventDestroy_v2(event)) };
}
