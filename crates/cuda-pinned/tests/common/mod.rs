//! Helpers shared by the test files that run on a GPU (`--features gpu`) and, without that feature, on the
//! simulated driver (the cuda-pinned-sim crate), which `cargo test` builds as a dev-dependency.
#![allow(dead_code, reason = "each test file uses a different subset")]

#[cfg(not(feature = "gpu"))]
use std::sync::Once;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cuda_pinned::Stream;

pub mod devices;

/// Whether these tests run on the simulated driver (built without feature `gpu`) rather than a GPU.
pub const SIMULATED: bool = cfg!(not(feature = "gpu"));

/// The primary context of device `ordinal`. Fails the test with the error's own words (on a machine without a
/// GPU, every place the loader looked for a driver) rather than its `Debug` form.
pub fn device(ordinal: usize) -> cuda_pinned::Context {
    cuda_pinned::Context::on(ordinal).unwrap_or_else(|e| panic!("device {ordinal}: {e}"))
}

/// How many devices the driver sees, failing the test with the error's own words where it cannot tell.
pub fn device_count() -> usize {
    cuda_pinned::Device::count().unwrap_or_else(|e| panic!("counting the devices: {e}"))
}

/// Holds the tests of a binary to one at a time, and on the simulated driver checks, when dropped, that
/// the test caused no violation (memory freed under in-flight work, work on freed memory, a hidden wait, a
/// false dependency) other than those it took with [`Serial::take_violations`].
pub struct Serial {
    _lock: MutexGuard<'static, ()>,
    violations_before: usize,
}

/// Runs the tests of a binary one at a time. Several assert that work is still in flight behind a `spin`;
/// another thread's call that synchronises the whole device (`cuMemFreeHost`, `cuMemHostUnregister`,
/// `cuMemFree` and module loading do) would block this thread's driver calls until the spin ends and make
/// such an assertion fail.
///
/// Without feature `gpu`, the first call points the crate at the simulated driver (unless
/// `CUDA_PINNED_LIBCUDA` already names a driver).
pub fn serial() -> Serial {
    static SERIAL: Mutex<()> = Mutex::new(());
    use_simulator();
    let lock = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let violations_before = sim().map_or(0, |s| s.violations().len());
    Serial {
        _lock: lock,
        violations_before,
    }
}

/// [`serial`], with the simulated driver installed with two devices first (on a GPU, the machine's own).
pub fn serial_on_two_devices() -> Serial {
    #[cfg(not(feature = "gpu"))]
    cuda_pinned_sim::install_with(cuda_pinned_sim::Settings::new().devices(2))
        .unwrap_or_else(|e| panic!("{e}"));
    serial()
}

impl Serial {
    /// Says that this test provokes violations on purpose and checks each one it takes with
    /// [`Serial::take_violations`]: until `self` drops, the simulated driver records them without printing them,
    /// so that a passing run prints nothing that looks like a problem. One not taken still fails the test,
    /// listed. Nothing on a GPU.
    pub fn expect_violations(&mut self) {
        if let Some(sim) = sim() {
            sim.print_violations(false);
        }
    }

    /// The violations the simulated driver found since the test began (or since the last call), which the
    /// test thereby expects: they no longer fail it when `self` drops. Empty on a GPU.
    pub fn take_violations(&mut self) -> Vec<String> {
        let Some(sim) = sim() else { return Vec::new() };
        let new = sim.violations().split_off(self.violations_before);
        self.violations_before += new.len();
        new
    }
}

impl Drop for Serial {
    fn drop(&mut self) {
        let Some(sim) = sim() else { return };
        sim.print_violations(true);
        let new = sim.violations().split_off(self.violations_before);
        if !new.is_empty() && !std::thread::panicking() {
            panic!(
                "the simulated driver found {} violation(s):\n{}",
                new.len(),
                new.join("\n")
            );
        }
    }
}

/// How long one call may take in the fault and stress tests before [`bounded`] takes it for hung: far more
/// than any of them takes on a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` on the calling thread and returns what it returns; if it has not returned within `limit`, prints
/// `what` (with the other calls being watched) and aborts the process. A hung driver call cannot be
/// interrupted, and a test that hangs stalls CI until its job times out, saying nothing: this fails it loudly.
pub fn bounded<R>(what: &str, limit: Duration, f: impl FnOnce() -> R) -> R {
    let _watch = watchdog::Watch::start(what, limit);
    f()
}

/// [`bounded`] with [`LIMIT`], naming the call by its source text: `bounded!(stream.synchronize())?`.
#[allow(unused_macros, reason = "each test file uses a different subset")]
macro_rules! bounded {
    ($call:expr) => {
        $crate::common::bounded(stringify!($call), $crate::common::LIMIT, || $call)
    };
}

/// Runs `f` on a thread of its own and returns what it returned, with how long it took; panics if it has
/// not returned within `limit` (the thread is left behind, hung) or if it panicked. For a test that must see
/// a call end, where [`bounded`]'s abort would take the other tests of the process with it.
pub fn on_a_thread<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(what.to_owned())
        .spawn(move || {
            let started = std::time::Instant::now();
            let out = f();
            let _ = tx.send((out, started.elapsed()));
        })
        .expect("a thread for the call");
    match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: hung (no return within {limit:?})")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// One thread that watches every [`bounded`] call of the process, so that a call costs a lock and a notify
/// rather than a thread.
mod watchdog {
    use std::collections::BTreeMap;
    use std::sync::{Condvar, Mutex, MutexGuard, Once, PoisonError};
    use std::time::{Duration, Instant};

    struct Watched {
        deadline: Instant,
        limit: Duration,
        what: String,
        thread: String,
    }

    #[derive(Default)]
    struct Calls {
        next: u64,
        running: BTreeMap<u64, Watched>,
    }

    static CALLS: Mutex<Calls> = Mutex::new(Calls {
        next: 0,
        running: BTreeMap::new(),
    });
    static CHANGED: Condvar = Condvar::new();
    static START: Once = Once::new();

    fn calls() -> MutexGuard<'static, Calls> {
        CALLS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A call being watched; dropping it (the call returned, or unwound) ends the watch.
    pub(super) struct Watch(u64);

    impl Watch {
        pub(super) fn start(what: &str, limit: Duration) -> Watch {
            START.call_once(|| {
                std::thread::Builder::new()
                    .name("bounded-watchdog".into())
                    .spawn(watch)
                    .expect("starting the watchdog thread of `bounded`");
            });
            let thread = std::thread::current();
            let watched = Watched {
                deadline: Instant::now() + limit,
                limit,
                what: what.to_owned(),
                thread: thread.name().unwrap_or("an unnamed thread").to_owned(),
            };
            let mut calls = calls();
            let id = calls.next;
            calls.next += 1;
            calls.running.insert(id, watched);
            CHANGED.notify_one();
            Watch(id)
        }
    }

    impl Drop for Watch {
        fn drop(&mut self) {
            calls().running.remove(&self.0);
        }
    }

    fn watch() {
        let mut calls = calls();
        loop {
            let now = Instant::now();
            let earliest = calls.running.values().map(|w| w.deadline).min();
            match earliest {
                None => {
                    calls = CHANGED.wait(calls).unwrap_or_else(PoisonError::into_inner);
                }
                Some(deadline) if deadline > now => {
                    calls = CHANGED
                        .wait_timeout(calls, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                Some(_) => {
                    let (hung, others): (Vec<&Watched>, Vec<&Watched>) =
                        calls.running.values().partition(|w| w.deadline <= now);
                    for w in hung {
                        eprintln!(
                            "HUNG: `{}` on thread {} did not return within {:?}",
                            w.what, w.thread, w.limit
                        );
                    }
                    for w in others {
                        eprintln!("  still running: `{}` on thread {}", w.what, w.thread);
                    }
                    eprintln!("aborting the test process: a hung call cannot be interrupted");
                    std::process::abort();
                }
            }
        }
    }
}

/// Without feature `gpu`: points the crate at the simulated driver, once, before it loads a driver, unless
/// `CUDA_PINNED_LIBCUDA` names one (so the same binaries can run on a real driver).
fn use_simulator() {
    #[cfg(not(feature = "gpu"))]
    static ONCE: Once = Once::new();
    #[cfg(not(feature = "gpu"))]
    ONCE.call_once(|| {
        if std::env::var_os("CUDA_PINNED_LIBCUDA").is_none() {
            cuda_pinned_sim::install().unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

/// The simulated driver's controls, when the tests run on it. (Under feature `gpu` the simulator is not
/// linked at all: its runtime functions would clash with the static CUDA runtime the kernels link.)
#[cfg(not(feature = "gpu"))]
pub fn sim() -> Option<&'static cuda_pinned_sim::Control> {
    static CONTROL: std::sync::OnceLock<Option<&'static cuda_pinned_sim::Control>> =
        std::sync::OnceLock::new();
    *CONTROL.get_or_init(|| match std::env::var_os("CUDA_PINNED_LIBCUDA") {
        None => cuda_pinned_sim::install().ok(),
        Some(path) => {
            // SAFETY: the library the crate loads as its driver: the simulator or a driver. A real driver is
            // refused (it has no cuda_sim_* functions).
            let control = unsafe { cuda_pinned_sim::Control::open(path.as_ref()) }.ok()?;
            Some(&*Box::leak(Box::new(control)))
        }
    })
}

/// On a GPU there is no simulator to ask.
#[cfg(feature = "gpu")]
pub fn sim() -> Option<&'static NoSimulator> {
    None
}

/// Stands for the simulator's controls under feature `gpu`, where [`sim`] is always `None`.
#[cfg(feature = "gpu")]
pub struct NoSimulator;

#[cfg(feature = "gpu")]
impl NoSimulator {
    pub fn violations(&self) -> Vec<String> {
        Vec::new()
    }

    pub fn print_violations(&self, _: bool) {}
}

/// The tests' user module, `cuda/test_kernels.cu`: on a GPU the fatbin build.rs compiled; on the simulated
/// driver a text image, with Rust stand-ins of its kernels registered (once) under their names.
pub fn test_kernels(context: &cuda_pinned::Context) -> cuda_pinned::Result<cuda_pinned::Module> {
    #[cfg(feature = "gpu")]
    {
        const FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/test_kernels.fatbin"));
        // SAFETY: the whole fatbin nvcc wrote.
        unsafe { cuda_pinned::Module::load_binary(context, FATBIN) }
    }
    #[cfg(not(feature = "gpu"))]
    {
        static STAND_INS: Once = Once::new();
        STAND_INS.call_once(register_stand_ins);
        cuda_pinned::Module::load(context, b"// stand-ins of cuda/test_kernels.cu\n")
    }
}

/// The stand-ins of `cuda/test_kernels.cu`, each touching only elements below its grid's thread count.
#[cfg(not(feature = "gpu"))]
fn register_stand_ins() {
    use cuda_pinned_sim::KernelCall;
    let sim = sim().expect("the simulated driver");
    fn threads(call: &KernelCall<'_>) -> usize {
        (call.grid().iter().chain(&call.block()))
            .map(|&d| d as usize)
            .fold(1usize, usize::saturating_mul)
    }
    sim.register_kernel("scale", &[8, 8, 4, 4], |call| {
        let (x, y, a, n) = (
            call.arg::<u64>(0),
            call.arg::<u64>(1),
            call.arg::<f32>(2),
            call.arg::<u32>(3),
        );
        let n = (n as usize).min(threads(call));
        let scaled: Vec<f32> = call.read::<f32>(x, n).iter().map(|v| a * v).collect();
        call.write(y, &scaled);
    })
    .unwrap();
    sim.register_kernel("fill_u32", &[8, 4, 4], |call| {
        let (out, value, n) = (call.arg::<u64>(0), call.arg::<u32>(1), call.arg::<u32>(2));
        let n = (n as usize).min(threads(call));
        call.write(out, &vec![value; n]);
    })
    .unwrap();
    sim.register_kernel("add_u32", &[8, 8, 4, 4], |call| {
        let (x, y, add, n) = (
            call.arg::<u64>(0),
            call.arg::<u64>(1),
            call.arg::<u32>(2),
            call.arg::<u32>(3),
        );
        let n = (n as usize).min(threads(call));
        let sums: Vec<u32> = call
            .read::<u32>(x, n)
            .iter()
            .map(|v| v.wrapping_add(add))
            .collect();
        call.write(y, &sums);
    })
    .unwrap();
    // The stand-in of a trap faults device 0, where the tests launch it: its context takes the sticky error.
    sim.register_kernel("trap_now", &[], |_| {
        self::sim().expect("the simulated driver").fault_device(0)
    })
    .unwrap();
    let mut sizes = [8; 19];
    sizes[18] = 4;
    sim.register_kernel("sum17_u32", &sizes, |call| {
        let n = (call.arg::<u32>(18) as usize).min(threads(call));
        let mut sums = vec![0u32; n];
        for input in 0..17 {
            let values = call.read::<u32>(call.arg::<u64>(input), n);
            for (sum, v) in sums.iter_mut().zip(values) {
                *sum = sum.wrapping_add(v);
            }
        }
        call.write(call.arg::<u64>(17), &sums);
    })
    .unwrap();
}

/// Keeps `stream` busy for `ms` milliseconds: work queued behind it waits, so a missing wait shows. On a GPU
/// a kernel spins; on the simulated driver a host function sleeps. Enqueued through [`Stream::profile`], as a
/// user's kernel is, so that the crate knows of it (and a ledger times it as a kernel named `spin`).
pub fn spin(stream: &Stream, ms: u64) {
    spin_for(stream, Duration::from_millis(ms));
}

/// [`spin`] for any duration.
pub fn spin_for(stream: &Stream, duration: Duration) {
    stream
        .profile("spin", 0, || enqueue_spin(stream, duration))
        .unwrap();
}

/// Enqueues the stand-in of [`spin`] on `stream` without the crate: the raw kernel on a GPU, a host function
/// that sleeps on the simulated driver.
fn enqueue_spin(stream: &Stream, duration: Duration) -> cuda_pinned::Result<()> {
    let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    #[cfg(feature = "gpu")]
    {
        use cuda_pinned::kernels::raw as kernels;
        // SAFETY: a live stream; the kernel touches no memory.
        let code = unsafe { kernels::cuda_pinned_spin(ns, stream.as_raw()) };
        kernels::check_launch(code, "cuda_pinned_spin")
    }
    #[cfg(not(feature = "gpu"))]
    {
        /// Sleeps for the time its argument says, or until [`release_spins`] is called.
        ///
        /// # Safety
        /// The argument comes from `Box::into_raw` of a [`Spin`], for this one call.
        unsafe extern "C" fn sleep(spin: *mut std::ffi::c_void) {
            // SAFETY: as the function's contract says; the box is dropped here.
            let spin = unsafe { Box::from_raw(spin.cast::<Spin>()) };
            let released = SPINS_RELEASED
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            drop(SPINS_RELEASED.1.wait_timeout_while(
                released,
                Duration::from_nanos(spin.ns),
                |released| *released == spin.enqueued_after,
            ));
        }
        let spin = Box::new(Spin {
            ns,
            enqueued_after: *SPINS_RELEASED
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        });
        let arg = Box::into_raw(spin).cast();
        // SAFETY: a live stream; the host function takes the box `arg` holds and makes no CUDA call.
        let enqueued = unsafe {
            cuda_pinned::driver_call!(cuLaunchHostFunc(stream.as_raw(), Some(sleep), arg))
        };
        if enqueued.is_err() {
            // SAFETY: made by Box::into_raw above, and not enqueued, so nothing else holds it.
            drop(unsafe { Box::from_raw(arg.cast::<Spin>()) });
        }
        enqueued
    }
}

/// A simulated `spin`: how long it sleeps, and the count of [`release_spins`] calls made before it was
/// enqueued.
#[cfg(not(feature = "gpu"))]
struct Spin {
    ns: u64,
    enqueued_after: u64,
}

/// How many times [`release_spins`] was called, and the simulated spins' wake-up.
#[cfg(not(feature = "gpu"))]
static SPINS_RELEASED: (Mutex<u64>, std::sync::Condvar) =
    (Mutex::new(0), std::sync::Condvar::new());

/// Ends, on the simulated driver, every `spin` enqueued so far, at once: for a test that is done with the
/// busy work it queued (its checks made) and would otherwise wait out the rest of it. Nothing on a GPU, where
/// a spin runs its time.
pub fn release_spins() {
    #[cfg(not(feature = "gpu"))]
    {
        *SPINS_RELEASED
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        SPINS_RELEASED.1.notify_all();
    }
}

/// Keeps `stream` busy until the returned value drops, for a test that asserts something while work is
/// still queued behind it. On a GPU a kernel spins for `duration`, and the test must be done with what it
/// holds the stream for before that ends (a timing fact of the GPU); on the simulated driver a host function
/// blocks the stream until the value drops (or 10 s pass, so that a test that waits for the stream while
/// holding it fails rather than hangs), however slow the machine.
#[must_use = "the stream is released when the value drops"]
pub fn hold(stream: &Stream, duration: std::time::Duration) -> Held {
    #[cfg(feature = "gpu")]
    {
        spin_for(stream, duration);
        Held {}
    }
    #[cfg(not(feature = "gpu"))]
    {
        use std::sync::{Arc, Condvar};
        let _ = duration;
        /// Blocks until the gate its argument points to opens, or 10 s pass.
        ///
        /// # Safety
        /// The argument comes from `Arc::into_raw` of a gate, for this one call.
        unsafe extern "C" fn wait(gate: *mut std::ffi::c_void) {
            // SAFETY: as the function's contract says; the reference is dropped here.
            let gate = unsafe { Arc::from_raw(gate.cast::<(Mutex<bool>, Condvar)>()) };
            let open = gate.0.lock().unwrap_or_else(PoisonError::into_inner);
            let timeout = std::time::Duration::from_secs(10);
            drop(gate.1.wait_timeout_while(open, timeout, |open| !*open));
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let arg = Arc::into_raw(gate.clone()).cast_mut().cast();
        // Through the crate's API, so that its marks on the stream stay before the hold.
        stream
            .profile("hold", 0, || {
                // SAFETY: a live stream; the host function takes the reference `arg` holds and makes no CUDA
                // call.
                unsafe {
                    cuda_pinned::driver_call!(cuLaunchHostFunc(stream.as_raw(), Some(wait), arg))
                }
            })
            .unwrap();
        Held { gate }
    }
}

/// What [`hold`] returns: dropping it lets the stream go on.
pub struct Held {
    #[cfg(not(feature = "gpu"))]
    gate: std::sync::Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(not(feature = "gpu"))]
        {
            *self.gate.0.lock().unwrap_or_else(PoisonError::into_inner) = true;
            self.gate.1.notify_all();
        }
    }
}

/// On the simulated driver there are no kernels (they run through the CUDA runtime): `fill`, `spin` and
/// `device_checksum` stand in for the crate's launchers of those names with work the driver runs in stream
/// order, tracked as the kernels are, and timed like them in a stream's ledger (as kernels of the same names):
/// an upload of a pinned buffer holding the value (the upload is timed as well), a host function that sleeps,
/// and a download into pinned memory that a host function sums. The host never waits for any of them.
#[cfg(not(feature = "gpu"))]
pub mod kernels {
    use std::ffi::c_void;
    use std::time::Duration;

    use bytemuck::Pod;
    use cuda_pinned::kernels::checksum;
    use cuda_pinned::sys::CUdeviceptr;
    use cuda_pinned::{
        DeviceBuffer, DeviceDestination, DeviceSource, DeviceView, DeviceViewMut, Pinned, Result,
        Stream, driver_call,
    };

    /// The element count and address of device memory (the crate's own are sealed).
    pub trait Elements {
        fn count(&self) -> usize;
        fn address(&self) -> CUdeviceptr;
    }

    impl<T: Pod> Elements for DeviceBuffer<T> {
        fn count(&self) -> usize {
            self.len()
        }
        fn address(&self) -> CUdeviceptr {
            self.as_raw()
        }
    }

    impl<T: Pod> Elements for DeviceView<'_, T> {
        fn count(&self) -> usize {
            self.len()
        }
        fn address(&self) -> CUdeviceptr {
            self.as_raw()
        }
    }

    impl<T: Pod> Elements for DeviceViewMut<'_, T> {
        fn count(&self) -> usize {
            self.len()
        }
        fn address(&self) -> CUdeviceptr {
            self.as_raw()
        }
    }

    /// Ends a stand-in with work on `stream` that touches `data` and `out` (device addresses; 0 for none), as
    /// the kernel it stands for does last, and moves nothing: a copy of zero bytes. The simulator judges a wait
    /// for an event recorded after a kernel (as the prefetcher's refill waits for the consumer's work) by what
    /// the last work before the event touches, and counts a host function as touching nothing.
    fn touch(stream: &Stream, out: CUdeviceptr, data: CUdeviceptr) -> Result<()> {
        if out == 0 || data == 0 {
            return Ok(());
        }
        // SAFETY: zero bytes: nothing is read or written; both addresses are device memory the caller keeps
        // until the stream has passed this.
        unsafe { driver_call!(cuMemcpyDtoDAsync_v2(out, data, 0, stream.as_raw())) }
    }

    pub fn fill<T: Pod>(
        stream: &Stream,
        dst: &mut (impl DeviceDestination<T> + Elements),
        value: T,
    ) -> Result<()> {
        let n = Elements::count(dst);
        if n == 0 {
            return Ok(());
        }
        let src = Pinned::from_slice(stream.context(), &vec![value; n])?;
        stream.profile("fill", n * size_of::<T>(), || stream.upload(&src, dst))
    }

    pub fn spin(stream: &Stream, duration: Duration) -> Result<()> {
        stream.profile("spin", 0, || super::enqueue_spin(stream, duration))
    }

    /// Writes the checksum of the bytes of `data` into `out[0]` on `stream`, as the crate's launcher does.
    ///
    /// # Panics
    /// Unless `out` has one element (where the crate's returns an invalid-argument error).
    pub fn device_checksum<T: Pod>(
        stream: &Stream,
        data: &(impl DeviceSource<T> + Elements),
        out: &mut (impl DeviceDestination<u64> + Elements),
    ) -> Result<()> {
        assert_eq!(
            out.count(),
            1,
            "device_checksum: `out` must have one element"
        );
        let (ctx, bytes) = (stream.context(), data.count() * size_of::<T>());
        stream.profile("checksum", bytes, || {
            let mut staging = Pinned::<T>::zeroed(ctx, data.count())?;
            stream.download(data, &mut staging)?;
            let sum = Pinned::<u64>::zeroed(ctx, 1)?;
            // SAFETY: both stay allocated until the stream has passed the host function: the upload below
            // reads `sum` after it, and `keep_until_here` makes `staging` wait for a read after it too.
            unsafe { sum_on(stream, staging.as_ptr().cast(), bytes, &sum) }?;
            stream.upload(&sum, out)?;
            keep_until_here(stream, &staging)?;
            touch(stream, out.address(), data.address())
        })
    }

    /// Stands for the raw launcher `cuda_pinned_checksum`: work the crate does not track, ordered by `stream`
    /// alone. Writes the checksum of the `len` bytes at device address `data` to device address `out`.
    ///
    /// # Safety
    /// `data` and `out` (one `u64`) are device memory of `stream`'s context that stay allocated until the stream
    /// has run this work, and other streams' work does not write `data` or touch `out` meanwhile.
    pub unsafe fn raw_checksum(
        stream: &Stream,
        data: CUdeviceptr,
        len: usize,
        out: CUdeviceptr,
    ) -> Result<()> {
        let ctx = stream.context();
        let staging = Pinned::<u8>::zeroed(ctx, len)?;
        let sum = Pinned::<u64>::zeroed(ctx, 1)?;
        let (host, s) = (
            staging.as_ptr().cast_mut().cast::<c_void>(),
            stream.as_raw(),
        );
        if len > 0 {
            // SAFETY: `len` bytes of device memory (the caller's promise) into `len` bytes of pinned memory that
            // nothing else uses and that stays allocated until the stream has passed `keep_until_here` below.
            unsafe { driver_call!(cuMemcpyDtoHAsync_v2(host, data, len, s)) }?;
        }
        // SAFETY: as for the copy: `keep_until_here` keeps both buffers until the stream has passed it.
        unsafe { sum_on(stream, staging.as_ptr(), len, &sum) }?;
        // SAFETY: one u64 of pinned memory, kept as above, to one u64 of device memory (the caller's promise).
        unsafe { driver_call!(cuMemcpyHtoDAsync_v2(out, sum.as_ptr().cast(), 8, s)) }?;
        keep_until_here(stream, &staging)?;
        keep_until_here(stream, &sum)?;
        touch(stream, out, data)
    }

    /// What the host function of `sum_on` reads and writes.
    struct Sum {
        data: *const u8,
        len: usize,
        out: *mut u64,
    }

    /// Enqueues on `stream` a host function that writes the checksum of the `len` bytes at `data` into `sum`.
    ///
    /// # Safety
    /// The bytes and `sum` stay allocated until the stream has passed the host function, and nothing else
    /// touches them meanwhile (the work before it on the stream may write the bytes).
    unsafe fn sum_on(
        stream: &Stream,
        data: *const u8,
        len: usize,
        sum: &Pinned<u64>,
    ) -> Result<()> {
        /// # Safety
        /// The argument comes from `Box::into_raw` in `sum_on`, for this one call, and points to memory
        /// `sum_on`'s caller keeps.
        unsafe extern "C" fn run(job: *mut c_void) {
            // SAFETY: as the function's contract says.
            let job = unsafe { Box::from_raw(job.cast::<Sum>()) };
            // SAFETY: `len` readable bytes (or none) that nothing writes now, and one writable u64.
            unsafe {
                let bytes = std::slice::from_raw_parts(job.data, job.len);
                job.out.write(checksum(bytes));
            }
        }
        let job = Box::into_raw(Box::new(Sum {
            data,
            len,
            out: sum.as_ptr().cast_mut(),
        }));
        // SAFETY: a live stream; the host function makes no CUDA call and owns `job`.
        let launched =
            unsafe { driver_call!(cuLaunchHostFunc(stream.as_raw(), Some(run), job.cast())) };
        if launched.is_err() {
            // SAFETY: not launched, so still ours.
            drop(unsafe { Box::from_raw(job) });
        }
        launched
    }

    /// Keeps `buffer` allocated until `stream` has passed the work enqueued on it so far, which the crate does
    /// not track: a tracked read of it enqueued now, which its release waits for.
    fn keep_until_here<T: Pod>(stream: &Stream, buffer: &Pinned<T>) -> Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        let mut scratch = DeviceBuffer::<T>::uninit(stream, 1)?;
        stream.upload(&buffer.slice(..1)?, &mut scratch)
    }
}

/// Fresh data for each seed (splitmix64).
pub fn data(len: usize, seed: u64) -> Vec<u32> {
    bytemuck::cast_slice(&words(len.div_ceil(2), seed))[..len].to_vec()
}

/// [`data`] as `len` bytes.
pub fn data_bytes(len: usize, seed: u64) -> Vec<u8> {
    bytemuck::cast_slice(&words(len.div_ceil(8), seed))[..len].to_vec()
}

/// `len` splitmix64 values of `seed`: each a call, the fewest a debug build of the tests makes per byte (a
/// buffer of hundreds of MiB is made in a fraction of a second); the rest is a copy.
fn words(len: usize, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678);
    let mut words = vec![0u64; len];
    for word in &mut words {
        *word = rng.next();
    }
    words
}

/// `SplitMix64`: reproducible choices and values for the tests' random programs.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), near enough.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A fresh value, odd so that it is never mistaken for the zeros of a new buffer.
    pub fn value(&mut self) -> u32 {
        (self.next() >> 32) as u32 | 1
    }

    pub fn fill(&mut self, out: &mut [u32]) {
        for x in out {
            *x = self.value();
        }
    }

    pub fn values(&mut self, len: usize) -> Vec<u32> {
        let mut v = vec![0; len];
        self.fill(&mut v);
        v
    }
}

/// Where `got` first differs from `want`, as an error message.
pub fn compare(got: &[u32], want: &[u32], what: &str) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, the model has {}",
            got.len(),
            want.len()
        ));
    }
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .expect("unequal slices of equal length differ somewhere");
    Err(format!(
        "{what}: element {i} of {} is {:#010x}, the model says {:#010x} ({differ} elements differ)",
        want.len(),
        got[i],
        want[i]
    ))
}

/// A number from the environment variable `name`, if set.
pub fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// Asserts that `result` is an invalid-argument error that says `says` and that nothing was enqueued.
pub fn refused(result: cuda_pinned::Result<()>, says: &str) {
    match result {
        Err(e @ cuda_pinned::Error::InvalidArgument { .. }) => {
            let text = e.to_string();
            assert!(text.contains(says), "{text:?} does not say {says:?}");
            assert!(text.contains("nothing was enqueued"), "{text:?}");
        }
        other => panic!("expected an invalid-argument error saying {says:?}, got {other:?}"),
    }
}

// After the `bounded!` macro, which it uses.
#[cfg(not(feature = "gpu"))]
pub mod faults;
