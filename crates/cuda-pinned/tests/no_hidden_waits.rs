//! No hidden waits: every public operation of the crate, run while unrelated long work is queued on another
//! stream, neither blocks the calling thread for that work nor makes later work on any other stream wait for
//! it. Checked with event queries, not timings, on a GPU (`--features gpu`) and on the simulated driver.
//!
//! Each case makes its own streams: the busy stream `x`, the streams the operation uses, and a fresh stream
//! that nothing in the case touches. It prepares its buffers first, including uses on `x` that complete
//! before the busy work starts (followed by [`Context::synchronize`]), so that an event recorded for such a
//! use only later, behind the busy work, would show. Then it queues the busy work on `x` (the `spin` kernel
//! on a GPU; on the simulated driver its stand-in, a host function that sleeps), records the event `busy`
//! right after it, and runs the operation. Then [`Case::check`] asserts:
//! - the operation did not wait on the host: right after it returns, `busy` has not completed;
//! - it made no other stream wait: after a one-element copy and an event on every other stream the case
//!   involves and on the fresh stream, waiting for each of those events returns while `busy` still has not
//!   completed. Had any of those streams been ordered after the busy work, the wait would have returned only
//!   after it.
//!
//! [`BUSY`] is long enough for everything else a case does; where the two could race on a slow machine, the
//! busy work is made longer rather than the check weaker. Left out: [`Context::synchronize`], which waits for
//! everything by definition, and `Registered::into_vec`, documented to wait for the device because the
//! driver's unpinning (`cuMemHostUnregister`) synchronizes it.
//!
//! Some things happen once per process: the first launch of each kernel (loading it) and the measurement
//! behind [`Pinning::Auto`]. `first_uses_in_a_process_do_not_wait` runs each in a fresh process of this test
//! binary, so it means the same whichever tests ran before it; every other case pins with an explicit
//! [`Pinning`] and launches a kernel (other than the busy `spin`) only after a warm-up launch.

mod common;

use std::cell::RefCell;
use std::process::Command;
use std::thread;
use std::time::Duration;

use bytemuck::Pod;
#[cfg(not(feature = "gpu"))]
use common::kernels::{device_checksum, fill, spin};
use common::{data, hold, serial};
#[cfg(feature = "gpu")]
use cuda_pinned::kernels::{axpy, device_checksum, fill, spin};
use cuda_pinned::staging::StagingOptions;
use cuda_pinned::{
    Context, Device, DeviceBuffer, Error, Event, Ledger, Pinned, PinnedBuilder, PinnedDestination,
    PinnedPool, Pinning, Prefetcher, Registered, Stream, WhenFull, driver_call,
};

/// How long the unrelated work on the busy stream runs: 500 ms of the `spin` kernel on a GPU; a second on the
/// simulated driver, whose stream threads and host functions share a CI machine's few cores with everything
/// else.
const BUSY: Duration = if common::SIMULATED {
    Duration::from_millis(1000)
} else {
    Duration::from_millis(500)
};

/// How long a test gives another thread to reach its wait before checking that the wait holds nothing up.
/// Too short a time could only make a check pass that should fail, never the other way round.
const WAITER_START: Duration = Duration::from_millis(100);

/// Elements of the buffers the operations work on: 1 MiB of `u32`.
const N: usize = 1 << 18;

const MIB: usize = 1 << 20;

/// One case: a context, the stream `x` that runs the unrelated busy work, and a fresh stream that nothing in
/// the case touches, checked after every operation with the streams the operation uses.
struct Case {
    name: &'static str,
    ctx: Context,
    x: Stream,
    fresh: RefCell<Probe>,
}

impl Case {
    fn new(name: &'static str) -> Case {
        let ctx = common::device(0);
        let x = Stream::new(&ctx).unwrap();
        let fresh = Probe::new("a fresh stream", &Stream::new(&ctx).unwrap());
        Case {
            name,
            ctx,
            x,
            fresh: RefCell::new(fresh),
        }
    }

    fn stream(&self) -> Stream {
        Stream::new(&self.ctx).unwrap()
    }

    fn probe(&self, label: &'static str, stream: &Stream) -> Probe {
        Probe::new(label, stream)
    }

    /// Lets everything enqueued so far complete: the uses prepared on `x` are done before its busy work. On the
    /// simulated driver, busy work already queued ends at once (the checks that needed it are made).
    fn settle(&self) {
        common::release_spins();
        self.ctx.synchronize().unwrap();
    }

    /// Queues the unrelated long work on `x` and returns the event recorded right after it.
    fn start_busy(&self) -> Event {
        busy_after(&self.x, |x| spin(x, BUSY).unwrap())
    }

    /// Runs `op`, then asserts that it did not wait on the host for the work before `busy`, and that later work
    /// on the streams of `probes` and on the case's fresh stream does not wait for it either.
    fn check<R>(
        &self,
        what: &str,
        busy: &Event,
        probes: &mut [Probe],
        op: impl FnOnce() -> R,
    ) -> R {
        let result = op();
        let name = self.name;
        assert!(
            !busy.query().unwrap(),
            "{name}: {what} waited on the host for unrelated work on another stream (it returned only once \
             that work had completed)"
        );
        let mut fresh = self.fresh.borrow_mut();
        for probe in probes.iter_mut().chain([&mut *fresh]) {
            probe.enqueue();
        }
        for probe in probes.iter().chain([&*fresh]) {
            probe.event.synchronize().unwrap();
            assert!(
                !busy.query().unwrap(),
                "{name}: after {what}, later work on {} waited for unrelated work on another stream",
                probe.label
            );
        }
        result
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        // Every case ends with the device idle (also when it failed), so that no busy work outlives it; on the
        // simulated driver the busy work ends at once, its checks made.
        common::release_spins();
        let synchronized = self.ctx.synchronize();
        if !thread::panicking() {
            synchronized.unwrap();
            self.ctx.check_deferred_errors().unwrap();
        }
    }
}

/// Later work on one stream: a one-element upload between buffers of its own, then an event after it.
struct Probe {
    label: &'static str,
    stream: Stream,
    host: Pinned<u32>,
    device: DeviceBuffer<u32>,
    event: Event,
}

impl Probe {
    /// Allocates what the probe needs: do it before the busy work starts.
    fn new(label: &'static str, stream: &Stream) -> Probe {
        Probe::with_host(label, stream, Pinned::zeroed(stream.context(), 1).unwrap())
    }

    /// A probe of a stream made while the busy work runs, with pinned memory allocated before.
    fn with_host(label: &'static str, stream: &Stream, host: Pinned<u32>) -> Probe {
        Probe {
            label,
            stream: stream.clone(),
            host,
            device: DeviceBuffer::uninit(stream, 1).unwrap(),
            event: Event::without_timing(stream.context()).unwrap(),
        }
    }

    fn enqueue(&mut self) {
        self.stream.upload(&self.host, &mut self.device).unwrap();
        self.event.record(&self.stream).unwrap();
    }
}

/// Queues busy work on `x` with `start` and returns an event recorded right after it.
fn busy_after(x: &Stream, start: impl FnOnce(&Stream)) -> Event {
    let busy = Event::new(x.context()).unwrap();
    start(x);
    busy.record(x).unwrap();
    busy
}

/// Keeps `stream` busy for `duration` with a host function that sleeps: busy work that launches no kernel.
#[cfg(feature = "gpu")]
fn sleep_on(stream: &Stream, duration: Duration) {
    use std::ffi::c_void;

    use cuda_pinned::driver_call;

    /// Sleeps for the number of nanoseconds its argument holds (a number, never dereferenced).
    ///
    /// # Safety
    /// None beyond `cuLaunchHostFunc`'s: it makes no CUDA call.
    unsafe extern "C" fn sleep(ns: *mut c_void) {
        thread::sleep(Duration::from_nanos(ns as u64));
    }
    let ns = usize::try_from(duration.as_nanos()).unwrap_or(usize::MAX);
    // SAFETY: a live stream; the host function reads nothing through its argument, which is a number.
    unsafe {
        driver_call!(cuLaunchHostFunc(
            stream.as_raw(),
            Some(sleep),
            ns as *mut c_void
        ))
    }
    .unwrap();
}

/// Leaves on `x` a write and then a read of `buffer`. Once the case settles, both have completed, but the
/// buffer's record may still hold them, with no event yet.
fn used_on<T: Pod>(x: &Stream, buffer: &mut DeviceBuffer<T>) {
    let mut scratch = DeviceBuffer::<T>::zeroed(x, buffer.len()).unwrap();
    x.copy(&scratch, buffer).unwrap();
    x.copy(buffer, &mut scratch).unwrap();
}

/// [`used_on`] for `len` elements of page-locked host memory: a download into it, then an upload from it.
fn host_used_on(x: &Stream, host: &mut impl PinnedDestination<u32>, len: usize) {
    let mut scratch = DeviceBuffer::<u32>::zeroed(x, len).unwrap();
    x.download(&scratch, host).unwrap();
    x.upload(&*host, &mut scratch).unwrap();
}

/// A device buffer allocated on `home` whose write and read on `x` completed before the busy work.
fn used_buffer(case: &Case, home: &Stream) -> DeviceBuffer<u32> {
    let mut buffer = DeviceBuffer::<u32>::zeroed(home, N).unwrap();
    used_on(&case.x, &mut buffer);
    buffer
}

/// Pinned memory holding `data(N, seed)` whose download and upload on `x` completed before the busy work.
fn used_pinned(case: &Case, seed: u64) -> Pinned<u32> {
    let mut pinned = Pinned::from_slice(&case.ctx, &data(N, seed)).unwrap();
    host_used_on(&case.x, &mut pinned, N);
    pinned
}

// ---- Context, Device, Stream, Event -----------------------------------------------------------------------

#[test]
fn context_and_device_queries_do_not_wait() {
    let _serial = serial();
    let case = Case::new("context and device queries");
    let busy = case.start_busy();
    case.check("Context::on, clone and drop", &busy, &mut [], || {
        let again = Context::on(0).unwrap();
        assert_eq!(again, case.ctx);
        let clone = again.clone();
        drop((again, clone));
    });
    case.check("the Device queries", &busy, &mut [], || {
        assert!(Device::count().unwrap() >= 1);
        assert_eq!(Device::get(0).unwrap(), case.ctx.device());
        assert!(!Device::all().unwrap().is_empty());
        let device = case.ctx.device();
        device.name().unwrap();
        device.uuid().unwrap();
        device.compute_capability().unwrap();
        device.total_memory().unwrap();
        device.free_memory().unwrap();
        device.pci_bus_id().unwrap();
        device.async_engine_count().unwrap();
        device.can_map_host_memory().unwrap();
        device.supports_memory_pools().unwrap();
    });
    case.check("the Context queries", &busy, &mut [], || {
        case.ctx.memory_info().unwrap();
        case.ctx.stream_priority_range().unwrap();
        case.ctx.check_deferred_errors().unwrap();
    });
}

#[test]
fn making_streams_does_not_wait() {
    let _serial = serial();
    let case = Case::new("making streams");
    let ledger = Ledger::new();
    let hosts: Vec<Pinned<u32>> = (0..3)
        .map(|_| Pinned::zeroed(&case.ctx, 1).unwrap())
        .collect();
    let busy = case.start_busy();
    let made = case.check(
        "Stream::new, Stream::with_priority and Stream::with_ledger",
        &busy,
        &mut [],
        || {
            let (_, greatest) = case.ctx.stream_priority_range().unwrap();
            [
                Stream::new(&case.ctx).unwrap(),
                Stream::with_priority(&case.ctx, greatest).unwrap(),
                Stream::with_ledger(&case.ctx, &ledger).unwrap(),
            ]
        },
    );
    let labels = [
        "a new stream",
        "a new stream of high priority",
        "a new stream with a ledger",
    ];
    let mut probes: Vec<Probe> = made
        .iter()
        .zip(labels)
        .zip(hosts)
        .map(|((stream, label), host)| Probe::with_host(label, stream, host))
        .collect();
    case.check(
        "the new streams' accessors and clones",
        &busy,
        &mut probes,
        || {
            for stream in &made {
                stream.priority().unwrap();
                drop(stream.clone());
            }
            assert!(made[2].ledger().is_some());
        },
    );
}

#[test]
fn stream_and_event_calls_do_not_wait() {
    let _serial = serial();
    let case = Case::new("stream and event calls");
    let (s, t) = (case.stream(), case.stream());
    let mut probes = [case.probe("stream S", &s), case.probe("stream T", &t)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 1)).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    let busy = case.start_busy();
    let (start, end) = case.check(
        "Event::new and Event::without_timing",
        &busy,
        &mut probes,
        || {
            let _untimed = Event::without_timing(&case.ctx).unwrap();
            (
                Event::new(&case.ctx).unwrap(),
                Event::new(&case.ctx).unwrap(),
            )
        },
    );
    case.check(
        "Event::record and Stream::record around work on another stream",
        &busy,
        &mut probes,
        || {
            start.record(&s).unwrap();
            s.upload(&host, &mut device).unwrap();
            s.record(&end).unwrap();
        },
    );
    case.check("Event::query and Stream::query", &busy, &mut probes, || {
        end.query().unwrap();
        s.query().unwrap();
        assert!(!case.x.query().unwrap(), "the busy stream is idle");
        assert!(end.context() == &case.ctx);
    });
    case.check(
        "Event::synchronize and Stream::synchronize of other streams",
        &busy,
        &mut probes,
        || {
            end.synchronize().unwrap();
            s.synchronize().unwrap();
            t.synchronize().unwrap();
        },
    );
    case.check("Event::elapsed_since", &busy, &mut probes, || {
        end.elapsed_since(&start).unwrap()
    });
    case.check(
        "Stream::wait for an event of another stream",
        &busy,
        &mut probes,
        || t.wait(&end).unwrap(),
    );
    case.check(
        "dropping an event recorded after the busy work",
        &busy,
        &mut probes,
        || {
            let after = Event::without_timing(&case.ctx).unwrap();
            case.x.record(&after).unwrap();
            drop(after);
        },
    );
}

#[test]
fn dropping_streams_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping streams");
    let (s, t) = (case.stream(), case.stream());
    let busy = case.start_busy();
    case.check(
        "dropping a stream with work still queued on it",
        &busy,
        &mut [],
        || {
            let held = hold(&s, Duration::from_millis(100));
            drop(s);
            drop(held);
        },
    );
    case.check(
        "dropping a stream made to wait for the busy work",
        &busy,
        &mut [],
        || {
            t.wait(&busy).unwrap();
            drop(t);
        },
    );
    case.check(
        "dropping a clone of the busy stream",
        &busy,
        &mut [],
        || drop(case.x.clone()),
    );
}

// ---- Device memory --------------------------------------------------------------------------------------

#[test]
fn allocating_device_memory_does_not_wait() {
    let _serial = serial();
    let case = Case::new("allocating device memory");
    let s = case.stream();
    let mut probes = [case.probe("the allocating stream", &s)];
    let busy = case.start_busy();
    let (mut a, b, empty) = case.check(
        "DeviceBuffer::uninit and DeviceBuffer::zeroed",
        &busy,
        &mut probes,
        || {
            (
                DeviceBuffer::<u32>::uninit(&s, N).unwrap(),
                DeviceBuffer::<u32>::zeroed(&s, N).unwrap(),
                DeviceBuffer::<u32>::zeroed(&s, 0).unwrap(),
            )
        },
    );
    case.check("making views", &busy, &mut probes, || {
        assert_eq!(a.slice(..10).unwrap().len(), 10);
        assert_eq!(a.slice_mut(10..).unwrap().len(), N - 10);
        assert_eq!(b.byte_len(), 4 * N);
        assert!(empty.is_empty() && empty.as_raw() == 0);
    });
}

/// Under memory pressure the driver may give an allocation memory whose free is still pending on another
/// stream, and make the allocating stream wait for that stream's work (a memory pool's
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`, on in the device's default pool). The crate allocates
/// from a pool of its own with that off: the allocation fails with `CUDA_ERROR_OUT_OF_MEMORY` instead (or
/// finds other memory), and nothing waits. The control does the same through the default pool with raw
/// driver calls: there the allocating stream waits for the busy work (the simulated driver reports it).
#[test]
fn allocating_under_memory_pressure_does_not_wait_for_frees_on_other_streams() {
    let mut serial = serial();
    serial.expect_violations();
    let case = Case::new("allocating under memory pressure");
    let s = case.stream();
    let mut probes = [case.probe("the allocating stream", &s)];
    // All but 256 MiB of what is free: a second allocation of the size fits only in the first one's memory.
    let (free, _) = case.ctx.memory_info().unwrap();
    let big = free.saturating_sub(256 * MIB) / (2 * MIB) * (2 * MIB);
    assert!(big > 0, "only {free} bytes of device memory are free");

    // The control: the device's default pool, through raw calls.
    let (x, mut held, mut again) = (case.x.as_raw(), 0, 0);
    // SAFETY: an out-pointer to a local; a live stream.
    unsafe { driver_call!(cuMemAllocAsync(&mut held, big, x)) }.unwrap();
    let busy = case.start_busy();
    // SAFETY: allocated above on `x`, unused, freed once.
    unsafe { driver_call!(cuMemFreeAsync(held, x)) }.unwrap();
    // SAFETY: an out-pointer to a local; a live stream.
    let allocated = unsafe { driver_call!(cuMemAllocAsync(&mut again, big, s.as_raw())) };
    probes[0].enqueue();
    probes[0].event.synchronize().unwrap();
    if common::SIMULATED {
        let found = serial.take_violations();
        assert!(
            found.len() == 1 && found[0].starts_with("HIDDEN WAIT: cuMemAllocAsync"),
            "the control: the default pool's allocation was not reported: {found:?}"
        );
    } else {
        assert!(
            allocated.is_ok() && busy.query().unwrap(),
            "the control: the default pool's allocation ({allocated:?}) did not make its stream wait for the \
             busy work on another stream"
        );
    }
    if allocated.is_ok() {
        // SAFETY: allocated above on `s`, unused, freed once.
        unsafe { driver_call!(cuMemFreeAsync(again, s.as_raw())) }.unwrap();
    }
    case.settle();
    let mut pool = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the pool's memory is all free (the context is synchronized).
    unsafe {
        driver_call!(cuDeviceGetDefaultMemPool(
            &mut pool,
            case.ctx.device().as_raw()
        ))
        .unwrap();
        driver_call!(cuMemPoolTrimTo(pool, 0)).unwrap();
    }

    // The crate: its pool takes no memory whose free waits behind the busy work.
    let held = DeviceBuffer::<u8>::uninit(&case.x, big).unwrap();
    let busy = case.start_busy();
    drop(held);
    let allocated = case.check(
        "allocating memory freed behind unrelated work on another stream",
        &busy,
        &mut probes,
        || DeviceBuffer::<u8>::uninit(&s, big),
    );
    if let Err(e) = allocated {
        assert_eq!(
            e.driver_code(),
            Some(cuda_pinned::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            "{e}"
        );
    }
}

#[test]
fn dropping_a_device_buffer_used_on_its_own_stream_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping a device buffer used on its own stream");
    let s = case.stream();
    let mut probes = [case.probe("its stream", &s)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 2)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    let busy = case.start_busy();
    s.upload(&host, &mut device).unwrap();
    s.download(&device, &mut back).unwrap();
    case.check(
        "dropping a device buffer written and read on its own stream",
        &busy,
        &mut probes,
        || drop(device),
    );
}

#[test]
fn dropping_a_device_buffer_used_on_several_streams_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping a device buffer used on several streams");
    let (a, b) = (case.stream(), case.stream());
    let mut probes = [case.probe("stream A", &a), case.probe("stream B", &b)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 3)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&a, N).unwrap();
    let mut scratch = DeviceBuffer::<u32>::uninit(&case.x, N).unwrap();
    a.upload(&host, &mut device).unwrap();
    b.download(&device, &mut back).unwrap();
    // Read on the busy stream too, before its busy work.
    case.x.copy(&device, &mut scratch).unwrap();
    let busy = case.start_busy();
    case.check(
        "dropping a device buffer written on A and read on B and, before its busy work, on the busy stream",
        &busy,
        &mut probes,
        || drop(device),
    );
}

/// Allocated and written on stream A, read on stream B behind a long kernel, dropped: the stream-ordered free
/// must come after the read, but A's later, unrelated work must not wait for B's kernel.
#[test]
fn freeing_a_buffer_read_behind_a_kernel_does_not_hold_back_its_own_stream() {
    let _serial = serial();
    let case = Case::new("freeing a buffer read on another stream behind a kernel");
    let (a, b) = (case.stream(), case.x.clone());
    let mut probes = [case.probe("stream A (it allocated and wrote the buffer)", &a)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 4)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&a, N).unwrap();
    a.upload(&host, &mut device).unwrap();
    let busy = case.start_busy();
    b.download(&device, &mut back).unwrap();
    case.check(
        "dropping a device buffer written on A and read on B behind B's kernel",
        &busy,
        &mut probes,
        || drop(device),
    );
}

#[test]
fn dropping_a_device_buffer_whose_uses_completed_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping a device buffer whose uses completed");
    let (a, b) = (case.stream(), case.stream());
    let mut probes = [case.probe("stream A", &a), case.probe("stream B", &b)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 5)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&a, N).unwrap();
    let mut scratch = DeviceBuffer::<u32>::uninit(&case.x, N).unwrap();
    a.upload(&host, &mut device).unwrap();
    case.x.copy(&device, &mut scratch).unwrap();
    b.download(&device, &mut back).unwrap();
    case.settle();
    let busy = case.start_busy();
    case.check(
        "dropping a device buffer written on A and read on B and on the busy stream, all completed before the \
         busy work",
        &busy,
        &mut probes,
        || drop(device),
    );
}

/// A buffer read on stream B, completed and even context-synchronized, then written on stream A while B runs
/// an unrelated kernel: A must not wait for that kernel.
#[test]
fn a_write_does_not_wait_for_a_read_that_completed() {
    let _serial = serial();
    let case = Case::new("writing a buffer whose read on another stream completed");
    let (a, b) = (case.stream(), case.x.clone());
    let mut probes = [case.probe("stream A (it writes the buffer)", &a)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 6)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&a, N).unwrap();
    a.upload(&host, &mut device).unwrap();
    b.download(&device, &mut back).unwrap();
    case.settle();
    let busy = case.start_busy();
    case.check(
        "Stream::upload on A into a buffer whose read on B completed before B's kernel",
        &busy,
        &mut probes,
        || a.upload(&host, &mut device).unwrap(),
    );
}

// ---- Pinned and registered memory, host access ----------------------------------------------------------

#[test]
fn allocating_pinned_memory_does_not_wait() {
    let _serial = serial();
    let case = Case::new("allocating pinned memory");
    let want = data(N, 7);
    let busy = case.start_busy();
    let _kept = case.check(
        "Pinned::zeroed, Pinned::from_slice and PinnedBuilder",
        &busy,
        &mut [],
        || {
            let zeroed = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
            let copied = Pinned::from_slice(&case.ctx, &want).unwrap();
            let mapped = PinnedBuilder::new(&case.ctx)
                .portable(true)
                .device_mapped(true)
                .zeroed::<u32>(N)
                .unwrap();
            let combined = PinnedBuilder::new(&case.ctx)
                .write_combined(true)
                .from_slice(&want)
                .unwrap();
            let empty = Pinned::<u32>::zeroed(&case.ctx, 0).unwrap();
            (zeroed, copied, mapped, combined, empty)
        },
    );
}

#[test]
fn dropping_idle_pinned_memory_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping idle pinned memory");
    let s = case.stream();
    let mut probes = [case.probe("the stream that used it", &s)];
    let never_used = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut used = Pinned::from_slice(&case.ctx, &data(N, 8)).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    s.upload(&used, &mut device).unwrap();
    s.download(&device, &mut used).unwrap();
    s.synchronize().unwrap();
    let busy = case.start_busy();
    case.check(
        "dropping pinned memory that was never used (cuMemFreeHost)",
        &busy,
        &mut probes,
        || drop(never_used),
    );
    case.check(
        "dropping pinned memory whose copies completed (cuMemFreeHost)",
        &busy,
        &mut probes,
        || drop(used),
    );
}

#[test]
fn dropping_pinned_memory_with_a_copy_in_flight_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping pinned memory with a copy in flight");
    let s = case.stream();
    let mut probes = [case.probe("the stream of the copy", &s)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 9)).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    let busy = case.start_busy();
    let held = hold(&s, Duration::from_millis(100));
    s.upload(&host, &mut device).unwrap();
    case.check(
        "dropping pinned memory while an upload from it is queued on a stream that is not busy",
        &busy,
        &mut probes,
        || {
            drop(host);
            drop(held);
        },
    );
}

/// Pinned memory dropped while a copy used it is released later, by the next pinned allocation or drop once
/// that copy has completed: on the thread of whoever makes that call.
#[test]
fn a_deferred_release_does_not_make_a_later_allocation_wait() {
    let _serial = serial();
    let case = Case::new("a pinned allocation after a deferred release");
    let s = case.stream();
    let mut probes = [case.probe("the stream of the copy", &s)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 10)).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    let held = hold(&s, Duration::from_millis(100));
    s.upload(&host, &mut device).unwrap();
    drop(host);
    drop(held);
    // The copy completes; the release stays deferred (no pinned allocation or drop, no context synchronize).
    s.synchronize().unwrap();
    let busy = case.start_busy();
    let _kept = case.check(
        "Pinned::zeroed, which releases pinned memory dropped during a copy that has completed since",
        &busy,
        &mut probes,
        || Pinned::<u32>::zeroed(&case.ctx, 1).unwrap(),
    );
}

#[test]
fn registering_memory_does_not_wait() {
    let _serial = serial();
    let case = Case::new("registering memory");
    let vec = data(N, 11);
    let busy = case.start_busy();
    let _kept = case.check(
        "Registered::new (cuMemHostRegister)",
        &busy,
        &mut [],
        || Registered::new(&case.ctx, vec).unwrap(),
    );
}

#[test]
fn dropping_idle_registered_memory_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping idle registered memory");
    let s = case.stream();
    let mut probes = [case.probe("the stream that used it", &s)];
    let never_used = Registered::new(&case.ctx, data(N, 12)).unwrap();
    let mut used = Registered::new(&case.ctx, data(N, 13)).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    s.upload(&used, &mut device).unwrap();
    s.download(&device, &mut used).unwrap();
    s.synchronize().unwrap();
    let busy = case.start_busy();
    case.check(
        "dropping registered memory that was never used (cuMemHostUnregister)",
        &busy,
        &mut probes,
        || drop(never_used),
    );
    case.check(
        "dropping registered memory whose copies completed (cuMemHostUnregister)",
        &busy,
        &mut probes,
        || drop(used),
    );
}

#[test]
fn host_access_does_not_wait_for_work_that_completed() {
    let _serial = serial();
    let case = Case::new("host access after work that completed");
    let mut pinned = used_pinned(&case, 14);
    let mut registered = Registered::new(&case.ctx, data(N, 15)).unwrap();
    host_used_on(&case.x, &mut registered, N);
    case.settle();
    let busy = case.start_busy();
    case.check(
        "Pinned::as_slice after a download into it completed",
        &busy,
        &mut [],
        || pinned.as_slice().unwrap().len(),
    );
    case.check(
        "Pinned::as_mut_slice after copies from and to it completed",
        &busy,
        &mut [],
        || pinned.as_mut_slice().unwrap().len(),
    );
    case.check(
        "Registered::as_slice and Registered::as_mut_slice after copies from and to it completed",
        &busy,
        &mut [],
        || {
            registered.as_slice().unwrap();
            registered.as_mut_slice().unwrap().len()
        },
    );
}

/// The `try_` accessors never block; for work that completed before, they must also say so.
#[test]
fn polled_host_access_sees_that_work_completed() {
    let _serial = serial();
    let case = Case::new("polled host access after work that completed");
    let mut pinned = used_pinned(&case, 16);
    let mut registered = Registered::new(&case.ctx, data(N, 17)).unwrap();
    host_used_on(&case.x, &mut registered, N);
    case.settle();
    let busy = case.start_busy();
    let name = case.name;
    case.check(
        "Pinned::try_as_slice and Pinned::try_as_mut_slice",
        &busy,
        &mut [],
        || {
            assert!(
                pinned.try_as_slice().unwrap().is_some(),
                "{name}: Pinned::try_as_slice says a download that completed before the busy work is in flight"
            );
            assert!(
                pinned.try_as_mut_slice().unwrap().is_some(),
                "{name}: Pinned::try_as_mut_slice says copies that completed before the busy work are in flight"
            );
        },
    );
    case.check(
        "Registered::try_as_slice and Registered::try_as_mut_slice",
        &busy,
        &mut [],
        || {
            assert!(
                registered.try_as_slice().unwrap().is_some(),
                "{name}: Registered::try_as_slice says a download that completed before the busy work is in \
                 flight"
            );
            assert!(
                registered.try_as_mut_slice().unwrap().is_some(),
                "{name}: Registered::try_as_mut_slice says copies that completed before the busy work are in \
                 flight"
            );
        },
    );
}

#[test]
fn host_access_waits_only_for_its_own_copies() {
    let _serial = serial();
    let case = Case::new("host access during copies on a stream that is not busy");
    let s = case.stream();
    let mut probes = [case.probe("the stream of the copies", &s)];
    let mut pinned = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut registered = Registered::new(&case.ctx, vec![0u32; N]).unwrap();
    let mut device = DeviceBuffer::<u32>::zeroed(&s, N).unwrap();
    let busy = case.start_busy();
    s.download(&device, &mut pinned).unwrap();
    case.check(
        "Pinned::as_slice waiting for a download into it",
        &busy,
        &mut probes,
        || pinned.as_slice().unwrap().len(),
    );
    s.upload(&pinned, &mut device).unwrap();
    case.check(
        "Pinned::as_mut_slice waiting for an upload from it",
        &busy,
        &mut probes,
        || pinned.as_mut_slice().unwrap().len(),
    );
    s.download(&device, &mut registered).unwrap();
    case.check(
        "Registered::as_slice waiting for a download into it",
        &busy,
        &mut probes,
        || registered.as_slice().unwrap().len(),
    );
    s.upload(&registered, &mut device).unwrap();
    case.check(
        "Registered::as_mut_slice waiting for an upload from it",
        &busy,
        &mut probes,
        || registered.as_mut_slice().unwrap().len(),
    );
}

// ---- Copies ------------------------------------------------------------------------------------------------

#[test]
fn uploads_do_not_wait_for_work_that_completed() {
    let _serial = serial();
    let case = Case::new("uploads of memory whose uses completed");
    let s = case.stream();
    let mut probes = [case.probe("the copying stream", &s)];
    let pinned = [used_pinned(&case, 17), used_pinned(&case, 18)];
    let mut registered = Registered::new(&case.ctx, data(N, 19)).unwrap();
    host_used_on(&case.x, &mut registered, N);
    let mut devices = [0, 1, 2].map(|_| used_buffer(&case, &s));
    case.settle();
    let busy = case.start_busy();
    case.check("Stream::upload from Pinned", &busy, &mut probes, || {
        s.upload(&pinned[0], &mut devices[0]).unwrap()
    });
    case.check("Stream::upload between views", &busy, &mut probes, || {
        let src = pinned[1].slice(..N / 2).unwrap();
        let mut dst = devices[1].slice_mut(N / 2..).unwrap();
        s.upload(&src, &mut dst).unwrap();
    });
    case.check("Stream::upload from Registered", &busy, &mut probes, || {
        s.upload(&registered, &mut devices[2]).unwrap()
    });
}

#[test]
fn downloads_do_not_wait_for_work_that_completed() {
    let _serial = serial();
    let case = Case::new("downloads of memory whose uses completed");
    let s = case.stream();
    let mut probes = [case.probe("the copying stream", &s)];
    let mut pinned = [used_pinned(&case, 20), used_pinned(&case, 21)];
    let mut registered = Registered::new(&case.ctx, data(N, 22)).unwrap();
    host_used_on(&case.x, &mut registered, N);
    let devices = [0, 1, 2].map(|_| used_buffer(&case, &s));
    case.settle();
    let busy = case.start_busy();
    case.check("Stream::download into Pinned", &busy, &mut probes, || {
        s.download(&devices[0], &mut pinned[0]).unwrap()
    });
    case.check("Stream::download between views", &busy, &mut probes, || {
        let src = devices[1].slice(..N / 2).unwrap();
        let mut dst = pinned[1].slice_mut(N / 2..).unwrap();
        s.download(&src, &mut dst).unwrap();
    });
    case.check(
        "Stream::download into Registered",
        &busy,
        &mut probes,
        || s.download(&devices[2], &mut registered).unwrap(),
    );
}

#[test]
fn device_copies_do_not_wait_for_work_that_completed() {
    let _serial = serial();
    let case = Case::new("device copies of memory whose uses completed");
    let s = case.stream();
    let mut probes = [case.probe("the copying stream", &s)];
    let mut devices = [0, 1, 2, 3].map(|_| used_buffer(&case, &s));
    case.settle();
    let busy = case.start_busy();
    let [a, b, c, d] = &mut devices;
    case.check("Stream::copy", &busy, &mut probes, || {
        s.copy(&*a, b).unwrap()
    });
    case.check("Stream::copy between views", &busy, &mut probes, || {
        let src = c.slice(..N / 2).unwrap();
        let mut dst = d.slice_mut(N / 2..).unwrap();
        s.copy(&src, &mut dst).unwrap();
    });
}

#[test]
fn pageable_copies_wait_only_for_their_own_stream() {
    let _serial = serial();
    let case = Case::new("pageable copies");
    let s = case.stream();
    let mut probes = [case.probe("the copying stream", &s)];
    let mut devices = [0, 1].map(|_| used_buffer(&case, &s));
    let src = data(N, 23);
    let mut back = vec![0u32; N];
    case.settle();
    let busy = case.start_busy();
    case.check(
        "Stream::upload_pageable into a buffer whose uses completed",
        &busy,
        &mut probes,
        || s.upload_pageable(&src, &mut devices[0]).unwrap(),
    );
    case.check(
        "Stream::download_pageable from a buffer whose uses completed",
        &busy,
        &mut probes,
        || s.download_pageable(&devices[1], &mut back).unwrap(),
    );
}

// ---- The pinned pool ---------------------------------------------------------------------------------------

fn pool(ctx: &Context, budget: usize, pinning: Pinning) -> PinnedPool {
    PinnedPool::builder(ctx, budget).pinning(pinning).build()
}

#[test]
fn pool_hits_and_give_backs_do_not_wait() {
    let _serial = serial();
    let case = Case::new("pool hits and give-backs");
    let s = case.stream();
    let mut probes = [case.probe("the stream that uses the pool's buffers", &s)];
    let pool = pool(&case.ctx, 64 * MIB, Pinning::HostAlloc);
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    // One block given back with its upload pending, one idle.
    let used = pool.alloc::<u32>(N).unwrap();
    s.upload(&used, &mut device).unwrap();
    drop(used);
    drop(pool.alloc::<u8>(4 * MIB).unwrap());
    s.synchronize().unwrap();
    let busy = case.start_busy();
    let (a, b) = case.check(
        "PinnedPool::alloc and PinnedPool::try_alloc served from the cache",
        &busy,
        &mut probes,
        || {
            (
                pool.alloc::<u32>(N).unwrap(),
                pool.try_alloc::<u8>(4 * MIB).unwrap(),
            )
        },
    );
    let stats = case.check("PinnedPool::stats", &busy, &mut probes, || pool.stats());
    assert_eq!((stats.hits, stats.misses), (2, 2));
    case.check(
        "giving pool buffers back, one with an upload in flight",
        &busy,
        &mut probes,
        || {
            s.upload(&a, &mut device).unwrap();
            drop((a, b));
            drop(pool.clone());
            assert!(pool.context() == &case.ctx);
        },
    );
}

#[test]
fn pool_misses_do_not_wait() {
    let _serial = serial();
    let case = Case::new("pool misses");
    let alloc = pool(&case.ctx, 64 * MIB, Pinning::HostAlloc);
    let register = pool(&case.ctx, 64 * MIB, Pinning::Register);
    let busy = case.start_busy();
    let _kept = case.check(
        "PinnedPool::alloc pinning a new block with cuMemHostAlloc",
        &busy,
        &mut [],
        || alloc.alloc::<u8>(4 * MIB).unwrap(),
    );
    let _kept = case.check(
        "PinnedPool::alloc pinning a new block with cuMemHostRegister",
        &busy,
        &mut [],
        || register.alloc::<u8>(4 * MIB).unwrap(),
    );
}

#[test]
fn a_pool_reuses_blocks_whose_work_completed() {
    let _serial = serial();
    let case = Case::new("reusing a pool block whose work completed");
    let pool = pool(&case.ctx, 64 * MIB, Pinning::HostAlloc);
    let mut block = pool.alloc::<u32>(N).unwrap();
    host_used_on(&case.x, &mut block, N);
    drop(block);
    case.settle();
    let busy = case.start_busy();
    let _kept = case.check(
        "PinnedPool::alloc of the class of a block whose copies completed before the busy work",
        &busy,
        &mut [],
        || pool.alloc::<u32>(N).unwrap(),
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.hits, stats.misses),
        (1, 1),
        "{}: the block was not reused: its copies, which had completed, were taken to end after the busy work",
        case.name
    );
}

#[test]
fn a_pool_miss_that_evicts_an_idle_block_does_not_wait() {
    let _serial = serial();
    let case = Case::new("a pool miss that evicts an idle block");
    let alloc = pool(&case.ctx, 8 * MIB, Pinning::HostAlloc);
    let register = pool(&case.ctx, 8 * MIB, Pinning::Register);
    drop(alloc.alloc::<u8>(4 * MIB).unwrap());
    drop(register.alloc::<u8>(4 * MIB).unwrap());
    let busy = case.start_busy();
    let _kept = case.check(
        "PinnedPool::alloc unpinning an idle block to make room (cuMemFreeHost)",
        &busy,
        &mut [],
        || alloc.alloc::<u8>(8 * MIB).unwrap(),
    );
    let _kept = case.check(
        "PinnedPool::alloc unpinning an idle block to make room (cuMemHostUnregister)",
        &busy,
        &mut [],
        || register.alloc::<u8>(8 * MIB).unwrap(),
    );
    assert_eq!(alloc.stats().evictions + register.stats().evictions, 2);
}

#[test]
fn trimming_a_pool_does_not_wait() {
    let _serial = serial();
    let case = Case::new("trimming a pool");
    let alloc = pool(&case.ctx, 64 * MIB, Pinning::HostAlloc);
    let register = pool(&case.ctx, 64 * MIB, Pinning::Register);
    drop(alloc.alloc::<u8>(4 * MIB).unwrap());
    drop(register.alloc::<u8>(4 * MIB).unwrap());
    let busy = case.start_busy();
    case.check(
        "PinnedPool::trim unpinning an idle block (cuMemFreeHost)",
        &busy,
        &mut [],
        || alloc.trim().unwrap(),
    );
    case.check(
        "PinnedPool::trim unpinning an idle block (cuMemHostUnregister)",
        &busy,
        &mut [],
        || register.trim().unwrap(),
    );
    assert_eq!(alloc.stats().cached + register.stats().cached, 0);
}

#[test]
fn a_full_pool_fails_at_once_while_its_blocks_wait_behind_the_busy_work() {
    let _serial = serial();
    let case = Case::new("a full pool whose blocks wait behind the busy work");
    let failing = pool(&case.ctx, 4 * MIB, Pinning::HostAlloc);
    let waiting = PinnedPool::builder(&case.ctx, 4 * MIB)
        .pinning(Pinning::HostAlloc)
        .when_full(WhenFull::Wait)
        .build();
    let blocks = [failing.alloc::<u8>(4 * MIB), waiting.alloc::<u8>(4 * MIB)].map(Result::unwrap);
    let mut devices = [0, 1].map(|_| DeviceBuffer::<u8>::uninit(&case.x, 4 * MIB).unwrap());
    let busy = case.start_busy();
    for (block, device) in blocks.into_iter().zip(&mut devices) {
        case.x.upload(&block, device).unwrap();
    }
    let exhausted =
        |r: cuda_pinned::Result<Pinned<u8>>| matches!(r, Err(Error::PoolExhausted { .. }));
    case.check(
        "PinnedPool::alloc of a pool that fails when full",
        &busy,
        &mut [],
        || assert!(exhausted(failing.alloc::<u8>(4 * MIB))),
    );
    case.check(
        "PinnedPool::try_alloc of a pool that waits when full",
        &busy,
        &mut [],
        || assert!(exhausted(waiting.try_alloc::<u8>(4 * MIB))),
    );
    case.check(
        "PinnedPool::trim of a pool whose only block is pending",
        &busy,
        &mut [],
        || failing.trim().unwrap(),
    );
}

/// The state of a pool of 64 MiB in which another thread is about to wait: a 4 MiB block cached, a 48 MiB
/// block given back with an upload queued on the busy stream after its busy work, so that a second 48 MiB
/// cannot fit until that upload has run.
struct FullPool {
    pool: PinnedPool,
    busy: Event,
    _device: DeviceBuffer<u8>,
}

fn full_pool(case: &Case, when_full: WhenFull) -> FullPool {
    let pool = PinnedPool::builder(&case.ctx, 64 * MIB)
        .pinning(Pinning::HostAlloc)
        .when_full(when_full)
        .build();
    drop(pool.alloc::<u8>(4 * MIB).unwrap());
    let big = pool.alloc::<u8>(48 * MIB).unwrap();
    let mut device = DeviceBuffer::<u8>::uninit(&case.x, 48 * MIB).unwrap();
    let busy = case.start_busy();
    case.x.upload(&big, &mut device).unwrap();
    drop(big);
    FullPool {
        pool,
        busy,
        _device: device,
    }
}

#[test]
fn a_cached_allocation_does_not_wait_for_a_thread_waiting_for_room() {
    let _serial = serial();
    let case = Case::new("a cached allocation while another thread waits for room");
    let FullPool {
        pool,
        busy,
        _device,
    } = full_pool(&case, WhenFull::Wait);
    thread::scope(|scope| {
        let waiter = scope.spawn(|| pool.alloc::<u8>(48 * MIB).map(|block| block.len()));
        thread::sleep(WAITER_START);
        let _kept = case.check(
            "PinnedPool::alloc of a cached block while another thread waits for room behind the busy work",
            &busy,
            &mut [],
            || pool.alloc::<u8>(4 * MIB).unwrap(),
        );
        case.check(
            "PinnedPool::stats while another thread waits for room behind the busy work",
            &busy,
            &mut [],
            || pool.stats(),
        );
        assert_eq!(waiter.join().unwrap().unwrap(), 48 * MIB);
    });
}

#[test]
fn a_cached_allocation_does_not_wait_for_a_staged_transfer_waiting_for_room() {
    let _serial = serial();
    let case = Case::new("a cached allocation while a staged transfer waits for room");
    let s = case.stream();
    let mut probes = [case.probe("the stream of the staged transfer", &s)];
    let src = vec![7u8; 48 * MIB];
    let mut dst = DeviceBuffer::<u8>::uninit(&s, 48 * MIB).unwrap();
    let FullPool {
        pool,
        busy,
        _device,
    } = full_pool(&case, WhenFull::Fail);
    let one_chunk = StagingOptions::default()
        .chunk_bytes(48 * MIB)
        .threads(1)
        .chunked_from(0);
    thread::scope(|scope| {
        let waiter = scope.spawn(|| s.upload_staged_with(&pool, one_chunk, &src, &mut dst));
        thread::sleep(WAITER_START);
        let _kept = case.check(
            "PinnedPool::alloc of a cached block while a staged upload waits for its first buffer behind the \
             busy work",
            &busy,
            &mut probes,
            || pool.alloc::<u8>(4 * MIB).unwrap(),
        );
        waiter.join().unwrap().unwrap();
    });
}

#[test]
fn dropping_a_pool_does_not_wait() {
    let _serial = serial();
    let case = Case::new("dropping a pool");
    let s = case.stream();
    let mut probes = [case.probe("the stream that uses the pool's buffers", &s)];
    let pool = pool(&case.ctx, 64 * MIB, Pinning::HostAlloc);
    drop(pool.alloc::<u8>(4 * MIB).unwrap());
    let in_flight = pool.alloc::<u32>(N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    let busy = case.start_busy();
    let held = hold(&s, Duration::from_millis(100));
    s.upload(&in_flight, &mut device).unwrap();
    drop(in_flight);
    case.check(
        "dropping the last handle of a pool holding an idle block and a block with an upload in flight",
        &busy,
        &mut probes,
        || {
            drop(pool);
            drop(held);
        },
    );
}

// ---- Staged transfers, the prefetcher, the ledger ----------------------------------------------------------

#[test]
fn staged_transfers_do_not_wait_for_unrelated_work() {
    let _serial = serial();
    let case = Case::new("staged transfers");
    let s = case.stream();
    let mut probes = [case.probe("the stream of the transfers", &s)];
    let pool = pool(&case.ctx, 16 * MIB, Pinning::HostAlloc);
    let chunked = StagingOptions::default()
        .chunk_bytes(64 << 10)
        .threads(2)
        .chunked_from(0);
    let src = data(N, 24);
    let mut back = vec![0u32; N];
    // Warm the pool with every buffer the transfers may take, and run each once: pinning is not what this
    // case is about.
    let chunks: Vec<Pinned<u8>> = (0..4)
        .map(|_| pool.alloc(chunked.chunk_bytes).unwrap())
        .collect();
    drop((chunks, pool.alloc::<u8>(4 * MIB).unwrap()));
    let mut device = DeviceBuffer::<u32>::uninit(&s, N).unwrap();
    for options in [chunked, StagingOptions::default()] {
        s.upload_staged_with(&pool, options, &src, &mut device)
            .unwrap();
        s.download_staged_with(&pool, options, &device, &mut back)
            .unwrap();
    }
    let mut devices = [0, 1, 2, 3].map(|_| used_buffer(&case, &s));
    case.settle();
    let busy = case.start_busy();
    let [a, b, c, d] = &mut devices;
    case.check(
        "Stream::upload_staged_with (many chunks) into a buffer whose uses completed",
        &busy,
        &mut probes,
        || s.upload_staged_with(&pool, chunked, &src, a).unwrap(),
    );
    case.check(
        "Stream::download_staged_with (many chunks) from a buffer whose uses completed",
        &busy,
        &mut probes,
        || {
            s.download_staged_with(&pool, chunked, &*b, &mut back)
                .unwrap()
        },
    );
    case.check(
        "Stream::upload_staged (one chunk) into a buffer whose uses completed",
        &busy,
        &mut probes,
        || s.upload_staged(&pool, &src, c).unwrap(),
    );
    case.check(
        "Stream::download_staged (one chunk) from a buffer whose uses completed",
        &busy,
        &mut probes,
        || s.download_staged(&pool, &*d, &mut back).unwrap(),
    );
}

#[test]
fn prefetching_does_not_wait_for_unrelated_work() {
    let _serial = serial();
    let case = Case::new("prefetching");
    let (consumer, copy) = (case.stream(), case.stream());
    let mut probes = [
        case.probe("the consumer stream", &consumer),
        case.probe("the copy stream", &copy),
    ];
    let pool = pool(&case.ctx, 16 * MIB, Pinning::HostAlloc);
    let len = 1 << 16;
    // Blocks of the batches' class, cached: pinning is not what this case is about.
    drop([pool.alloc::<u32>(len), pool.alloc::<u32>(len)].map(Result::unwrap));
    let mut scratch = DeviceBuffer::<u32>::uninit(&consumer, len).unwrap();
    let busy = case.start_busy();
    let mut batches = case.check("Prefetcher::build", &busy, &mut probes, || {
        Prefetcher::<Pinned<u32>>::builder(&pool, &consumer, len)
            .batches(4)
            .workers(1)
            .depth(2)
            .copy_stream(&copy)
            .build(|i, batch| {
                batch.as_mut_slice()?.fill(i as u32);
                Ok(())
            })
            .unwrap()
    });
    let first = case.check("Prefetcher::next", &busy, &mut probes, || {
        batches.next().unwrap().unwrap()
    });
    consumer.copy(&*first, &mut scratch).unwrap();
    case.check(
        "dropping a Prefetched with the consumer's work on it in flight",
        &busy,
        &mut probes,
        || drop(first),
    );
    let second = case.check("Prefetcher::next", &busy, &mut probes, || {
        batches.next().unwrap().unwrap()
    });
    case.check(
        "dropping the Prefetcher while the consumer holds a batch",
        &busy,
        &mut probes,
        || drop(batches),
    );
    case.check(
        "dropping a Prefetched after its Prefetcher",
        &busy,
        &mut probes,
        || drop(second),
    );
}

#[test]
fn ledger_reports_do_not_wait_for_other_streams() {
    let _serial = serial();
    let case = Case::new("the ledger");
    let ledger = Ledger::new();
    let timed = Stream::with_ledger(&case.ctx, &ledger).unwrap();
    let mut probes = [case.probe("the stream with the ledger", &timed)];
    let host = Pinned::from_slice(&case.ctx, &data(N, 25)).unwrap();
    let mut back = Pinned::<u32>::zeroed(&case.ctx, N).unwrap();
    let mut device = DeviceBuffer::<u32>::uninit(&timed, N).unwrap();
    timed.upload(&host, &mut device).unwrap();
    timed
        .profile("download", 4 * N, || timed.download(&device, &mut back))
        .unwrap();
    let busy = case.start_busy();
    case.check(
        "Ledger::report of entries on a stream that is not busy",
        &busy,
        &mut probes,
        || ledger.report().unwrap(),
    );
    case.check(
        "Stream::profile and a timed copy on a stream with a ledger",
        &busy,
        &mut probes,
        || {
            timed
                .profile("upload", 4 * N, || timed.upload(&host, &mut device))
                .unwrap()
        },
    );
    case.check("Ledger::clear", &busy, &mut probes, || ledger.clear());
}

// ---- Kernels, and what happens once per process ------------------------------------------------------------

/// The kernels' operands, on `stream`: data, a checksum's output, and the two vectors of an axpy.
struct Operands {
    data: DeviceBuffer<u32>,
    sum: DeviceBuffer<u64>,
    #[cfg(feature = "gpu")]
    x: DeviceBuffer<f32>,
    #[cfg(feature = "gpu")]
    y: DeviceBuffer<f32>,
}

impl Operands {
    fn new(stream: &Stream) -> Operands {
        Operands {
            data: DeviceBuffer::zeroed(stream, N).unwrap(),
            sum: DeviceBuffer::zeroed(stream, 1).unwrap(),
            #[cfg(feature = "gpu")]
            x: DeviceBuffer::zeroed(stream, N).unwrap(),
            #[cfg(feature = "gpu")]
            y: DeviceBuffer::zeroed(stream, N).unwrap(),
        }
    }

    /// Leaves on `x` a completed write and read of each (see [`used_on`]).
    fn used_on(&mut self, x: &Stream) {
        used_on(x, &mut self.data);
        used_on(x, &mut self.sum);
        #[cfg(feature = "gpu")]
        {
            used_on(x, &mut self.x);
            used_on(x, &mut self.y);
        }
    }
}

/// Launches each kernel once on `k` and waits for it, with nothing else in flight: the first launch in a
/// process is the subject of `first_uses_in_a_process_do_not_wait`.
fn warm_up(k: &Stream, on: &mut Operands) {
    fill(k, &mut on.data, 1u32).unwrap();
    device_checksum(k, &on.data, &mut on.sum).unwrap();
    #[cfg(feature = "gpu")]
    axpy(k, 1.0, &on.x, &mut on.y).unwrap();
    spin(k, Duration::from_micros(1)).unwrap();
    k.synchronize().unwrap();
}

/// How a check names the launcher `name`: on the simulated driver, what runs is its stand-in in `tests/common`,
/// made of copies, host functions and pinned memory that it allocates and drops.
fn launcher(name: &str) -> String {
    if common::SIMULATED {
        format!("the stand-in for kernels::{name} (copies, host functions, pinned memory)")
    } else {
        format!("kernels::{name}")
    }
}

/// The kernels' launchers, each run on `k` as an operation of `case`.
fn launch_each(case: &Case, busy: &Event, probes: &mut [Probe], k: &Stream, on: &mut Operands) {
    case.check(&launcher("fill"), busy, probes, || {
        fill(k, &mut on.data, 7u32).unwrap()
    });
    case.check(&launcher("device_checksum"), busy, probes, || {
        device_checksum(k, &on.data, &mut on.sum).unwrap()
    });
    #[cfg(feature = "gpu")]
    case.check(&launcher("axpy"), busy, probes, || {
        axpy(k, 2.0, &on.x, &mut on.y).unwrap()
    });
    case.check(&launcher("spin"), busy, probes, || {
        spin(k, Duration::from_millis(1)).unwrap()
    });
}

#[test]
fn kernels_do_not_wait_for_work_that_completed() {
    let _serial = serial();
    let case = Case::new("kernels on buffers whose uses completed");
    let k = case.stream();
    let mut probes = [case.probe("the kernels' stream", &k)];
    let mut operands = Operands::new(&k);
    warm_up(&k, &mut operands);
    operands.used_on(&case.x);
    case.settle();
    let busy = case.start_busy();
    launch_each(&case, &busy, &mut probes, &k, &mut operands);
}

/// Set in a process of this binary started by `first_uses_in_a_process_do_not_wait`: the one first use it runs.
const FIRST_USE: &str = "CUDA_PINNED_TEST_FIRST_USE";

/// What happens once per process: the first allocation of a pool that pins the faster way (it measures both
/// ways), the first device allocation (it makes the crate's memory pool of the device) and, on a GPU, the first
/// launch of each kernel (the CUDA runtime loads it then; the simulated driver's stand-ins have no such thing).
fn first_uses() -> Vec<&'static str> {
    let mut uses = vec!["Pinning::Auto", "DeviceBuffer"];
    if cfg!(feature = "gpu") {
        uses.extend(["Context::new", "spin", "fill", "device_checksum", "axpy"]);
    }
    uses
}

/// Runs each first use in a fresh process of this test binary, so that it is the first in its process whichever
/// tests ran before in this one.
#[test]
fn first_uses_in_a_process_do_not_wait() {
    if let Ok(first_use) = std::env::var(FIRST_USE) {
        first_use_in_this_process(&first_use);
        return;
    }
    let _serial = serial();
    let this = std::env::current_exe().unwrap();
    let mut failed = Vec::new();
    for first_use in first_uses() {
        let output = Command::new(&this)
            .args([
                "first_uses_in_a_process_do_not_wait",
                "--exact",
                "--test-threads=1",
            ])
            .env(FIRST_USE, first_use)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() || !stdout.contains("1 passed") {
            let stderr = String::from_utf8_lossy(&output.stderr);
            failed.push(format!(
                "the first use of {first_use} in a fresh process failed:\n{stdout}{stderr}"
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

fn first_use_in_this_process(first_use: &str) {
    let _serial = serial();
    if first_use == "DeviceBuffer" {
        first_device_allocation();
        return;
    }
    #[cfg(feature = "gpu")]
    if first_use == "Context::new" {
        first_context();
        return;
    }
    let case = Case::new("a first use in a fresh process");
    if first_use == "Pinning::Auto" {
        let pool = PinnedPool::new(&case.ctx, 64 * MIB);
        let busy = case.start_busy();
        let _kept = case.check(
            "the first PinnedPool::alloc with Pinning::Auto in the process (it pins and unpins both ways to \
             measure them)",
            &busy,
            &mut [],
            || pool.alloc::<u8>(MIB).unwrap(),
        );
        return;
    }
    #[cfg(feature = "gpu")]
    first_launch(&case, first_use);
    #[cfg(not(feature = "gpu"))]
    panic!("{FIRST_USE}={first_use:?} names no first use on the simulated driver");
}

/// The first device allocation in this process, which makes the crate's memory pool of the device, on a stream
/// of its own while `x` sleeps (no kernel: the busy work launches none, so that nothing else is a first use).
/// Made before any [`Case`], whose probes allocate device memory. (On a GPU the context loaded the crate's
/// kernels when it was made, before `spin` is first launched: [`first_context`].)
fn first_device_allocation() {
    let ctx = Context::on(0).unwrap();
    let (x, s) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    spin(&x, Duration::from_micros(1)).unwrap();
    x.synchronize().unwrap();
    let host = Pinned::<u32>::zeroed(&ctx, 1).unwrap();
    // On a GPU a host function that sleeps; on the simulated driver `spin`'s stand-in is one.
    #[cfg(feature = "gpu")]
    let busy = busy_after(&x, |x| sleep_on(x, BUSY));
    #[cfg(not(feature = "gpu"))]
    let busy = busy_after(&x, |x| spin(x, BUSY).unwrap());
    let _buffer = DeviceBuffer::<u32>::zeroed(&s, N).unwrap();
    assert!(
        !busy.query().unwrap(),
        "the first device allocation in the process waited on the host for unrelated work on another stream"
    );
    let mut probe = Probe::with_host("the allocating stream", &s, host);
    probe.enqueue();
    probe.event.synchronize().unwrap();
    assert!(
        !busy.query().unwrap(),
        "after the first device allocation in the process, later work on its stream waited for unrelated work"
    );
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// The first context of device 0 in this process, which loads the crate's kernels (the loading waits for all
/// work on the device, and holds back other threads' driver calls meanwhile). Work queued right after it must
/// not wait for that: here a host function sleeping on `x`, then, once a loading started in the background
/// would have reached its wait for the device, an upload on another stream, which must complete while `x`
/// still sleeps. (Loaded on a thread of its own, as the crate once did, the loading waited for the sleep and
/// held the upload's enqueue back with it.)
#[cfg(feature = "gpu")]
fn first_context() {
    let ctx = Context::on(0).unwrap();
    let x = Stream::new(&ctx).unwrap();
    let busy = busy_after(&x, |x| sleep_on(x, BUSY));
    let s = Stream::new(&ctx).unwrap();
    let mut probe = Probe::with_host(
        "a stream of the first context",
        &s,
        Pinned::zeroed(&ctx, 1).unwrap(),
    );
    thread::sleep(WAITER_START);
    probe.enqueue();
    probe.event.synchronize().unwrap();
    assert!(
        !busy.query().unwrap(),
        "work queued right after the first Context::new of the device in the process waited for unrelated \
         work on another stream (the loading of the crate's kernels)"
    );
    ctx.synchronize().unwrap();
    ctx.check_deferred_errors().unwrap();
}

/// The first launch of the kernel `name` in this process, on a stream of its own while `x` is busy.
#[cfg(feature = "gpu")]
fn first_launch(case: &Case, name: &str) {
    let k = case.stream();
    let mut probes = [case.probe("the kernel's stream", &k)];
    let mut on = Operands::new(&k);
    let what = format!("the first launch of kernels::{name} in the process");
    if name == "spin" {
        // Busy work that launches no kernel: the first launch of `spin` itself is the subject.
        let busy = busy_after(&case.x, |x| sleep_on(x, BUSY));
        case.check(&what, &busy, &mut probes, || {
            spin(&k, Duration::from_millis(1)).unwrap()
        });
        return;
    }
    // The busy `spin` is launched with nothing else in flight: whatever its first launch waits for is done.
    let busy = case.start_busy();
    case.check(&what, &busy, &mut probes, || match name {
        "fill" => fill(&k, &mut on.data, 7u32).unwrap(),
        "device_checksum" => device_checksum(&k, &on.data, &mut on.sum).unwrap(),
        "axpy" => axpy(&k, 2.0, &on.x, &mut on.y).unwrap(),
        other => panic!("{FIRST_USE}={other:?} names no first use"),
    });
}
