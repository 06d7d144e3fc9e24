//! What tests ask the simulator, beyond the driver API: faults to inject, the calls made, the violations
//! found, what is still allocated, and what kernels do (their stand-ins). Exported with the C ABI
//! (`cuda_sim_*`) so that a test reaches the very library the crate loaded; [`Control`] wraps them for Rust.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::kernel::StandInFn;
use crate::sim::{Kind, SIM};
use crate::sys::CUresult;
use crate::testkit::{KernelCall, trampoline};

/// What is alive in the simulator.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Device allocations (`cuMemAlloc_v2`, `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`) not yet freed.
    pub device_allocations: u64,
    /// Their bytes.
    pub device_bytes: u64,
    /// Page-locked host allocations (`cuMemHostAlloc`, `cudaHostAlloc`) not yet freed.
    pub pinned_allocations: u64,
    /// Their bytes.
    pub pinned_bytes: u64,
    /// Host ranges registered (`cuMemHostRegister_v2`) and not yet unregistered.
    pub registrations: u64,
    /// Their bytes. With `pinned_bytes`, what counts against the page-locked limit
    /// ([`crate::Settings::pinned_limit`]).
    pub registered_bytes: u64,
    /// Streams created and not yet destroyed.
    pub streams: u64,
    /// Events created and not yet destroyed.
    pub events: u64,
    /// Retains of primary contexts not yet released, over all devices.
    pub context_retains: u64,
    /// Operations queued on streams and not yet finished.
    pub queued: u64,
    /// Modules loaded (`cuModuleLoadData`) and not yet unloaded.
    pub modules: u64,
    /// Graphs (`cuStreamEndCapture`) and executable graphs (`cuGraphInstantiateWithFlags`) not yet destroyed.
    pub graphs: u64,
}

/// Adds faults (the syntax of `CUDA_SIM_FAIL`, counted from now); `CUDA_ERROR_INVALID_VALUE` and a log line
/// if `spec` is not valid, and then none is added.
///
/// # Safety
/// `spec` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_fail(spec: *const c_char) -> CUresult {
    // SAFETY: the caller passes a NUL-terminated string.
    let spec = unsafe { CStr::from_ptr(spec) }.to_string_lossy();
    match SIM.lock().faults.add(&spec) {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(error) => {
            eprintln!("cuda-pinned-sim: cuda_sim_fail: {error}");
            CUresult::CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// Chooses setting `name` (a `CUDA_SIM_*` variable of `config.rs`) to be `value`, over the environment's,
/// before the simulator starts: `CUDA_ERROR_INVALID_VALUE` for a name it does not have,
/// `CUDA_ERROR_NOT_PERMITTED` once it has started (its first driver call); a log line says which.
///
/// # Safety
/// `name` and `value` are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_configure(name: *const c_char, value: *const c_char) -> CUresult {
    // SAFETY: the caller passes NUL-terminated strings.
    let (name, value) = unsafe { (CStr::from_ptr(name), CStr::from_ptr(value)) };
    let (name, value) = (name.to_string_lossy(), value.to_string_lossy());
    match crate::config::choose(&name, &value) {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(error) => {
            eprintln!("cuda-pinned-sim: cuda_sim_configure: {error}");
            if crate::config::VARIABLES.contains(&&*name) {
                CUresult::CUDA_ERROR_NOT_PERMITTED
            } else {
                CUresult::CUDA_ERROR_INVALID_VALUE
            }
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_clear_faults() {
    SIM.lock().faults.clear();
}

/// Marks the calling thread as an async executor's (`on` non-zero) or not (see
/// [`Control::executor_thread`]).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_executor_thread(on: c_int) {
    crate::detect::set_executor_thread(on != 0);
}

/// Gives device `device`'s context a sticky `CUDA_ERROR_LAUNCH_FAILED`, as a kernel that traps does (see
/// [`Control::fault_device`]).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_fault_device(device: c_int) {
    SIM.lock().fault(device, CUresult::CUDA_ERROR_LAUNCH_FAILED);
    SIM.changed.notify_all();
}

/// Whether device allocations from now on lie end to end (see [`Control::lay_device_allocations_end_to_end`]).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_end_to_end(on: c_int) {
    SIM.lock().device_gap = if on != 0 { 0 } else { crate::sim::DEVICE_GAP };
}

/// Ends device `device`'s sticky error (see [`Control::recover_device`]).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_recover_device(device: c_int) {
    SIM.lock().recover(device);
    SIM.changed.notify_all();
}

/// Whether violations are printed on stderr as they are found (0: not; else: printed, the default).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_print_violations(on: c_int) {
    crate::sim::PRINT_VIOLATIONS.store(on != 0, std::sync::atomic::Ordering::Relaxed);
}

/// The version of this crate the library was built from, NUL-terminated: [`Control::open`] talks only to the
/// simulator of its own version, whose `cuda_sim_*` functions have the types it calls them with.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Driver calls made so far (all but those that describe errors).
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_calls() -> u64 {
    SIM.lock().faults.calls
}

/// Starts (non-zero) or stops recording the names of the calls made.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_trace(on: c_int) {
    let mut state = SIM.lock();
    if on != 0 {
        state.faults.trace.clear();
    }
    state.faults.tracing = on != 0;
}

/// How many calls the trace holds.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_trace_len() -> u64 {
    SIM.lock().faults.trace.len() as u64
}

/// Copies the name of traced call `index` into `buffer`, as [`cuda_sim_violation`] does.
///
/// # Safety
/// `buffer` has `len` writable bytes (or `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_trace_name(index: u64, buffer: *mut c_char, len: usize) -> i64 {
    let state = SIM.lock();
    let name = state.faults.trace.get(index as usize).copied();
    // SAFETY: as the caller promises.
    name.map_or(-1, |name| unsafe { copy_out(name, buffer, len) })
}

/// Copies `text` (truncated, NUL-terminated) into `buffer` of `len` bytes; the full length.
///
/// # Safety
/// `buffer` has `len` writable bytes (or `len` is 0).
unsafe fn copy_out(text: &str, buffer: *mut c_char, len: usize) -> i64 {
    if len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller gives `len` writable bytes; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
            buffer.add(n).write(0);
        }
    }
    text.len() as i64
}

/// How many calls have been made to fail so far.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_injected_len() -> u64 {
    SIM.lock().faults.injected.len() as u64
}

/// Copies the name of the function of injected fault `index` into `buffer`, as [`cuda_sim_violation`] does.
///
/// # Safety
/// `buffer` has `len` writable bytes (or `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_injected_name(
    index: u64,
    buffer: *mut c_char,
    len: usize,
) -> i64 {
    let state = SIM.lock();
    let name = state.faults.injected.get(index as usize).copied();
    // SAFETY: as the caller promises.
    name.map_or(-1, |name| unsafe { copy_out(name, buffer, len) })
}

/// Calls that returned an error other than `CUDA_ERROR_NOT_READY` so far.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_api_errors() -> u64 {
    SIM.lock().api_errors.len() as u64
}

/// Copies API error `index` into `buffer`, as [`cuda_sim_violation`] does.
///
/// # Safety
/// `buffer` has `len` writable bytes (or `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_api_error(index: u64, buffer: *mut c_char, len: usize) -> i64 {
    let state = SIM.lock();
    let error = state.api_errors.get(index as usize);
    // SAFETY: as the caller promises.
    error.map_or(-1, |error| unsafe { copy_out(error, buffer, len) })
}

/// Violations found so far.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_violations() -> u64 {
    SIM.lock().violations.len() as u64
}

/// Copies violation `index` (truncated, NUL-terminated) into `buffer` of `len` bytes; its full length, or
/// -1 if there is no such violation.
///
/// # Safety
/// `buffer` has `len` writable bytes (or `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_violation(index: u64, buffer: *mut c_char, len: usize) -> i64 {
    let state = SIM.lock();
    let message = state.violations.get(index as usize);
    // SAFETY: as the caller promises.
    message.map_or(-1, |message| unsafe { copy_out(message, buffer, len) })
}

/// Bytes of host memory page-locked now, allocated or registered: what counts against the limit. Returns at
/// once, whatever runs.
#[unsafe(no_mangle)]
pub extern "C" fn cuda_sim_page_locked() -> u64 {
    SIM.lock().pinned_used as u64
}

/// Waits until every stream has finished its queue and destroyed streams have been joined, then fills `out`.
///
/// # Safety
/// `out` points to a writable [`Live`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_live(out: *mut Live) {
    // Destroyed streams are gone once drained, and their workers joined.
    let state = SIM.wait_until(SIM.lock(), |s| {
        s.streams
            .values()
            .all(|s| s.queue.is_empty() && !s.destroyed)
    });
    SIM.join_stopped(&state);
    let mut live = Live::default();
    for allocation in state.allocations.values() {
        match allocation.kind {
            Kind::Device | Kind::DeviceAsync => {
                live.device_allocations += 1;
                live.device_bytes += allocation.bytes as u64;
            }
            Kind::Pinned => {
                live.pinned_allocations += 1;
                live.pinned_bytes += allocation.bytes as u64;
            }
            Kind::Registered => {
                live.registrations += 1;
                live.registered_bytes += allocation.bytes as u64;
            }
        }
    }
    live.streams = state.streams.values().filter(|s| !s.destroyed).count() as u64;
    live.events = state.events.values().filter(|e| !e.destroyed).count() as u64;
    live.context_retains = state.primaries.iter().map(|p| u64::from(p.retained)).sum();
    live.queued = state.streams.values().map(|s| s.queue.len() as u64).sum();
    live.modules = state.modules.len() as u64;
    live.graphs =
        (state.graphs.len() + state.execs.values().filter(|e| !e.destroyed).count()) as u64;
    // SAFETY: the caller passes a writable Live.
    unsafe { out.write(live) };
}

/// The simulator as a test sees it: the library the crate loads, opened a second time (the same instance:
/// the dynamic loader hands back the loaded one), and its `cuda_sim_*` functions.
pub struct Control {
    library: libloading::Library,
}

impl Control {
    /// Opens the simulator at `path`: `Err` if it does not load, or is not the simulator of this crate's
    /// version (a real driver, say, or another version's build), whose functions it could not call safely.
    ///
    /// # Safety
    /// Loading a library runs its initialisers: `path` must name a library for which that is sound (the
    /// simulator, whose initialisers only set up Rust statics, or the driver).
    pub unsafe fn open(path: &Path) -> Result<Control, String> {
        // SAFETY: as the caller promises.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| {
            format!(
                "cannot open the simulated driver at {}: {e}",
                path.display()
            )
        })?;
        // SAFETY: looked up with the type the simulator defines it with; called only if it is there, and a
        // library that exports it under this name is the simulator (the `cuda_sim_` prefix is its own).
        let version = unsafe {
            library
                .get::<extern "C" fn() -> *const c_char>(b"cuda_sim_version")
                .map(|f| CStr::from_ptr(f()).to_string_lossy().into_owned())
        }
        .map_err(|_| format!("{} is not the simulated driver", path.display()))?;
        if version != env!("CARGO_PKG_VERSION") {
            return Err(format!(
                "{} is the simulated driver of cuda-pinned-sim {version}, not {}",
                path.display(),
                env!("CARGO_PKG_VERSION")
            ));
        }
        Ok(Control { library })
    }

    fn function<T: Copy>(&self, name: &str) -> T {
        // SAFETY: each name below is looked up with the type it is defined with in this file.
        let symbol = unsafe { self.library.get::<T>(name.as_bytes()) };
        *symbol.unwrap_or_else(|e| panic!("the simulated driver lacks {name}: {e}"))
    }

    /// Adds faults; `Err` with the reason if `spec` is not valid.
    pub fn fail(&self, spec: &str) -> Result<(), String> {
        let spec = std::ffi::CString::new(spec).map_err(|e| e.to_string())?;
        let f: unsafe extern "C" fn(*const c_char) -> CUresult = self.function("cuda_sim_fail");
        // SAFETY: a NUL-terminated string.
        match unsafe { f(spec.as_ptr()) } {
            CUresult::CUDA_SUCCESS => Ok(()),
            _ => Err(format!(
                "the simulator refused the fault list {spec:?} (see stderr)"
            )),
        }
    }

    /// Chooses setting `name` (`CUDA_SIM_SEED`, ... : see [`crate::Settings`]) to be `value` before the
    /// simulator starts; `Err` with the reason for an unknown name or once it has started.
    pub(crate) fn configure(&self, name: &str, value: &str) -> Result<(), String> {
        let to_c = |s: &str| std::ffi::CString::new(s).map_err(|e| e.to_string());
        let (c_name, c_value) = (to_c(name)?, to_c(value)?);
        let f: unsafe extern "C" fn(*const c_char, *const c_char) -> CUresult =
            self.function("cuda_sim_configure");
        // SAFETY: two NUL-terminated strings.
        match unsafe { f(c_name.as_ptr(), c_value.as_ptr()) } {
            CUresult::CUDA_SUCCESS => Ok(()),
            CUresult::CUDA_ERROR_NOT_PERMITTED => Err(format!(
                "{name} cannot be chosen now: the simulator has started (choose settings before the first \
                 CUDA call of the process)"
            )),
            _ => Err(format!("{name} is not a setting of the simulator")),
        }
    }

    /// Holds the simulator for the calling test until the guard is dropped: faults, violations and what is
    /// alive belong to the whole process, and the test harness runs a binary's tests on several threads, so a
    /// test that injects faults, reads violations or counts what is alive takes this first (every such test of
    /// the binary, or none). Dropping the guard removes the faults not yet triggered, and prints violations again
    /// if [`Control::print_violations`] stopped it.
    pub fn exclusive(&self) -> Exclusive<'_> {
        static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A test that panicked while holding it leaves nothing half done that the next one relies on.
        let lock = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Exclusive {
            control: self,
            violations_before: self.violations().len(),
            _lock: lock,
        }
    }

    /// Registers `stand_in` as what kernels named `name`, with parameters of `param_sizes` bytes each, do
    /// when launched; registering a name again replaces its stand-in for the functions got from then on
    /// (`cuModuleGetFunction`), while those got before keep theirs. Any image loads as a module, and a kernel
    /// is found in it (`cuModuleGetFunction`) if a stand-in of its name is registered.
    ///
    /// The stand-in runs on the stream's thread when the stream reaches the launch. It reads the arguments
    /// ([`KernelCall::arg`]: a device pointer is a `u64`) and reads and writes memory by device address
    /// ([`KernelCall::read`], [`KernelCall::write`]); an access outside every live allocation reads zeros,
    /// writes nothing and is a violation, as a panic of the stand-in is (both name the kernel, and fail the
    /// next driver call with `CUDA_ERROR_ILLEGAL_ADDRESS`, as the error of a kernel does on a GPU). For the
    /// simulator's detectors, a launch uses the allocations that contain the value of one of its 8-byte
    /// arguments when it is launched.
    ///
    /// The parameters are laid out as a kernel's: each at the next multiple of its natural alignment (the
    /// largest power of two that divides its size, at most 8): give a pointer's size as 8, a `float4`'s as 16
    /// (placed at a multiple of 8), a `float3`'s as 12 (at a multiple of 4).
    ///
    /// # Errors
    /// Where `name` holds a NUL, a size is 0, or the parameters take more than the 32764 bytes a kernel may
    /// have.
    pub fn register_kernel<F>(
        &self,
        name: &str,
        param_sizes: &[usize],
        stand_in: F,
    ) -> Result<(), String>
    where
        F: Fn(&mut KernelCall<'_>) + Send + Sync + 'static,
    {
        let c_name = std::ffi::CString::new(name)
            .map_err(|_| format!("the kernel name {name:?} holds a NUL"))?;
        crate::kernel::layout(param_sizes).map_err(|e| format!("kernel {name:?}: {e}"))?;
        let register: unsafe extern "C" fn(
            *const c_char,
            *const usize,
            usize,
            StandInFn,
            *const c_void,
        ) -> CUresult = self.function("cuda_sim_register_kernel");
        // The stand-in lives as long as the process: a launch may run it at any time from now on.
        let ctx: *const F = Box::into_raw(Box::new(stand_in));
        // SAFETY: a NUL-terminated name, `param_sizes.len()` sizes, and a trampoline that may be called from
        // any thread with `ctx`, a live F (F is Send and Sync, and never freed once registered), and catches
        // the stand-in's panics.
        let code = unsafe {
            register(
                c_name.as_ptr(),
                param_sizes.as_ptr(),
                param_sizes.len(),
                trampoline::<F>,
                ctx.cast(),
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            // SAFETY: made by Box::into_raw above, and refused, so nothing else holds it.
            drop(unsafe { Box::from_raw(ctx.cast_mut()) });
            return Err(format!(
                "the simulator refused the stand-in of kernel {name:?} (see stderr)"
            ));
        }
        Ok(())
    }

    /// Whether each violation is printed on stderr (`cuda-pinned-sim: VIOLATION: ...`) as it is found, as it is
    /// by default. A test that provokes violations on purpose and checks each one ([`Exclusive::new_violations`])
    /// turns it off while it runs, so that a passing run prints nothing that looks like a problem; the
    /// violations are still recorded, and still fail the next driver call. Dropping an [`Exclusive`] turns it
    /// on again.
    pub fn print_violations(&self, on: bool) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_print_violations");
        f(c_int::from(on));
    }

    /// Removes every fault not yet triggered.
    pub fn clear_faults(&self) {
        let f: extern "C" fn() = self.function("cuda_sim_clear_faults");
        f();
    }

    /// Marks the calling thread as a thread of an async executor (`on`), or not any more: from then on, a
    /// driver call made on it that waits for queued device work (a synchronization, a blocking copy, a
    /// device-wide wait) and finds it not done is a violation, `BLOCKED EXECUTOR`, with the crate functions on
    /// the stack. For tests of code that must never block the thread that polls its futures (a runtime's
    /// thread-start hook marks its workers).
    pub fn executor_thread(&self, on: bool) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_executor_thread");
        f(c_int::from(on));
    }

    /// Gives device `device`'s context the sticky error a kernel that traps leaves (`CUDA_ERROR_LAUNCH_FAILED`,
    /// as a probe on 2 x H200 saw it): the work queued on its streams is dropped without running (a
    /// `cuStreamWriteValue32_v2` among it never lands, its event records never fire), and from now on every
    /// call on its streams or events, every wait for them (those in progress too) and every call that needs
    /// its context current fails with that error. Destroying its streams and events still works.
    pub fn fault_device(&self, device: i32) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_fault_device");
        f(device);
    }

    /// Ends device `device`'s sticky error, as resetting its primary context lets a program go on, so that a
    /// test process can go on after [`Control::fault_device`]: the dropped event records count as fired. What
    /// the crate leaked because of the error stays leaked.
    pub fn recover_device(&self, device: i32) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_recover_device");
        f(device);
    }

    /// Whether device allocations from now on lie end to end, as a driver's may (an H200's `cuMemAlloc`s of 16
    /// KiB did), so that the address just past one buffer is the next buffer's; by default a gap of unused
    /// addresses follows each, so that an overrun is not found inside the next allocation.
    pub fn lay_device_allocations_end_to_end(&self, on: bool) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_end_to_end");
        f(c_int::from(on));
    }

    /// The driver calls made so far (all but those that describe errors).
    pub fn calls(&self) -> u64 {
        let f: extern "C" fn() -> u64 = self.function("cuda_sim_calls");
        f()
    }

    /// Starts recording the calls made (forgetting earlier ones).
    pub fn trace_start(&self) {
        let f: extern "C" fn(c_int) = self.function("cuda_sim_trace");
        f(1);
    }

    /// Stops recording; the names of the calls made since [`trace_start`](Self::trace_start).
    pub fn trace_stop(&self) -> Vec<String> {
        let stop: extern "C" fn(c_int) = self.function("cuda_sim_trace");
        stop(0);
        let len: extern "C" fn() -> u64 = self.function("cuda_sim_trace_len");
        let name: unsafe extern "C" fn(u64, *mut c_char, usize) -> i64 =
            self.function("cuda_sim_trace_name");
        (0..len())
            // SAFETY: read_string passes a buffer of `len` writable bytes.
            .map(|i| read_string(|buffer, len| unsafe { name(i, buffer, len) }))
            .collect()
    }

    /// The functions whose calls were made to fail so far, in order.
    pub fn injected(&self) -> Vec<String> {
        let len: extern "C" fn() -> u64 = self.function("cuda_sim_injected_len");
        let name: unsafe extern "C" fn(u64, *mut c_char, usize) -> i64 =
            self.function("cuda_sim_injected_name");
        (0..len())
            // SAFETY: read_string passes a buffer of `len` writable bytes.
            .map(|i| read_string(|buffer, len| unsafe { name(i, buffer, len) }))
            .collect()
    }

    /// Every call so far that returned an error other than `CUDA_ERROR_NOT_READY` (which queries return for
    /// work not done), as `function: CODE`: what compute-sanitizer reports as API errors, injected faults
    /// included.
    pub fn api_errors(&self) -> Vec<String> {
        let count: extern "C" fn() -> u64 = self.function("cuda_sim_api_errors");
        let get: unsafe extern "C" fn(u64, *mut c_char, usize) -> i64 =
            self.function("cuda_sim_api_error");
        (0..count())
            // SAFETY: read_string passes a buffer of `len` writable bytes.
            .map(|i| read_string(|buffer, len| unsafe { get(i, buffer, len) }))
            .collect()
    }

    /// Every violation found so far.
    pub fn violations(&self) -> Vec<String> {
        let count: extern "C" fn() -> u64 = self.function("cuda_sim_violations");
        let get: unsafe extern "C" fn(u64, *mut c_char, usize) -> i64 =
            self.function("cuda_sim_violation");
        (0..count())
            // SAFETY: read_string passes a buffer of `len` writable bytes.
            .map(|i| read_string(|buffer, len| unsafe { get(i, buffer, len) }))
            .collect()
    }

    /// Bytes of host memory page-locked now, allocated (`cuMemHostAlloc`) or registered (`cuMemHostRegister`):
    /// what counts against [`crate::Settings::pinned_limit`]. Unlike [`Control::live`], it returns at once, while
    /// work runs: for a test that watches the page-locked memory of a loop whose devices never idle.
    pub fn page_locked(&self) -> u64 {
        let f: extern "C" fn() -> u64 = self.function("cuda_sim_page_locked");
        f()
    }

    /// What is alive, once every stream has finished its queue and the worker threads of destroyed streams
    /// have exited.
    pub fn live(&self) -> Live {
        let f: unsafe extern "C" fn(*mut Live) = self.function("cuda_sim_live");
        let mut live = Live::default();
        // SAFETY: a writable Live.
        unsafe { f(&mut live) };
        live
    }
}

/// The simulator held by one test: see [`Control::exclusive`]. Derefs to the [`Control`].
pub struct Exclusive<'a> {
    control: &'a Control,
    violations_before: usize,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Exclusive<'_> {
    /// The violations found since the guard was taken: those of this test.
    pub fn new_violations(&self) -> Vec<String> {
        let mut all = self.control.violations();
        all.drain(..self.violations_before.min(all.len()));
        all
    }
}

impl std::ops::Deref for Exclusive<'_> {
    type Target = Control;

    fn deref(&self) -> &Control {
        self.control
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.control.clear_faults();
        self.control.print_violations(true);
    }
}

/// The string a `cuda_sim_*` function copies out through `copy(buffer, len)`.
fn read_string(copy: impl Fn(*mut c_char, usize) -> i64) -> String {
    let mut buffer = vec![0u8; 4096];
    let n = copy(buffer.as_mut_ptr().cast(), buffer.len());
    buffer.truncate((n.max(0) as usize).min(buffer.len() - 1));
    String::from_utf8_lossy(&buffer).into_owned()
}

/// Where the simulator of this version was built, for a program of a crate that has it as a dependency: the
/// newest `libcuda_pinned_sim*.so` that is the simulator of this version (see [`Control::open`]), looked for
/// where cargo puts a dependency's shared library: `deps/` beside a test binary, or the `deps/` above an
/// example's folder (its file name carries a hash when the crate comes from a registry or git). A program
/// elsewhere (a doctest, a copied binary) finds it where `CUDA_PINNED_LIBCUDA` names it.
pub fn library_path() -> Option<PathBuf> {
    candidates().into_iter().find(|path| {
        // SAFETY: a file named as the simulator's build in cargo's output folders, or named by the user as the
        // driver to load: its initialisers are the simulator's or the driver's.
        unsafe { Control::open(path) }.is_ok()
    })
}

/// The files that may be the simulator: the one `CUDA_PINNED_LIBCUDA` names, then those of cargo's output
/// folders near the running program, newest first.
fn candidates() -> Vec<PathBuf> {
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        let (prefix, suffix) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
        let stem = format!("{prefix}cuda_pinned_sim");
        let dirs = exe
            .ancestors()
            .skip(1)
            .take(2)
            .flat_map(|dir| [dir.to_path_buf(), dir.join("deps")]);
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                let Some(rest) = name
                    .strip_prefix(&stem)
                    .and_then(|r| r.strip_suffix(suffix))
                else {
                    continue;
                };
                if rest.is_empty() || rest.starts_with('-') {
                    let modified = entry.metadata().and_then(|m| m.modified());
                    found.push((modified.unwrap_or(std::time::UNIX_EPOCH), entry.path()));
                }
            }
        }
    }
    found.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    let named = std::env::var_os("CUDA_PINNED_LIBCUDA").map(PathBuf::from);
    named
        .into_iter()
        .chain(found.into_iter().map(|(_, path)| path))
        .collect()
}
