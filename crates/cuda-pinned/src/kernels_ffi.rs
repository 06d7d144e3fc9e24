//! The `extern "C"` launchers of `cuda/kernels.cu` (declared in `cuda/kernels.h`), compiled by build.rs with
//! nvcc under feature `gpu` and linked with the CUDA runtime statically, and the loading of their module into
//! each device's primary context ahead of the first launch (`preload`, `loaded`).
//!
//! Each launcher enqueues its kernel on `stream` and returns at once with the launch error, a `cudaError_t`
//! as `int`; turn it into a `Result` with [`check_launch`]. Errors of the kernel's execution show at the next
//! synchronisation, as with any CUDA launch.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::error::Result;
use crate::sys::{CUstream, Error, cudaError_t};

unsafe extern "C" {
    /// Sets `n` bytes at device address `dst` to `value`.
    pub fn cuda_pinned_fill_u8(dst: *mut u8, value: u8, n: usize, stream: CUstream) -> c_int;
    /// Sets `n` 16-bit elements at device address `dst` to `value`.
    pub fn cuda_pinned_fill_u16(dst: *mut u16, value: u16, n: usize, stream: CUstream) -> c_int;
    /// Sets `n` 32-bit elements at device address `dst` to `value`.
    pub fn cuda_pinned_fill_u32(dst: *mut u32, value: u32, n: usize, stream: CUstream) -> c_int;
    /// Sets `n` 64-bit elements at device address `dst` to `value`.
    pub fn cuda_pinned_fill_u64(dst: *mut u64, value: u64, n: usize, stream: CUstream) -> c_int;
    /// `y[i] = a * x[i] + y[i]` for `i < n`, over device memory (the multiply-add may be fused).
    pub fn cuda_pinned_axpy_f32(
        a: f32,
        x: *const f32,
        y: *mut f32,
        n: usize,
        stream: CUstream,
    ) -> c_int;
    /// Writes to the device location `out` the 64-bit checksum of the `len` device bytes at `data`, as
    /// [`crate::kernels::checksum`] computes it on the host.
    pub fn cuda_pinned_checksum(
        data: *const c_void,
        len: usize,
        out: *mut u64,
        stream: CUstream,
    ) -> c_int;
    /// Keeps `stream` busy for at least `ns` nanoseconds of the GPU's clock.
    pub fn cuda_pinned_spin(ns: u64, stream: CUstream) -> c_int;
    /// Loads the kernels into the calling thread's current context, as their first launch would (which waits
    /// for all work on the device); returns the error.
    pub fn cuda_pinned_preload() -> c_int;
    /// The statically linked runtime's `cudaGetErrorName` (a static string, never null).
    pub fn cuda_pinned_error_name(code: c_int) -> *const c_char;
    /// The statically linked runtime's `cudaGetErrorString` (a static string, never null).
    pub fn cuda_pinned_error_string(code: c_int) -> *const c_char;
}

/// `Ok` if a launcher returned success (0); otherwise the launch error, in the runtime's words.
///
/// # Errors
/// [`Error::Runtime`] naming `launcher` for any other code.
pub fn check_launch(code: c_int, launcher: &'static str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: both functions accept any code and return a pointer to a static NUL-terminated string.
    let (name, description) =
        unsafe { (cuda_pinned_error_name(code), cuda_pinned_error_string(code)) };
    // SAFETY: checked for null; otherwise static strings of the linked runtime, valid for the whole program.
    let text = |ptr: *const c_char| (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) });
    Err(Error::from_runtime_parts(
        cudaError_t(code as u32),
        text(name),
        text(description),
        launcher,
    )
    .into())
}

/// Loads the kernels into the calling thread's current context (the device's primary context, for the crate)
/// as their first launch would: waits for all work on the device.
///
/// # Errors
/// The runtime's.
#[cfg(feature = "gpu")]
pub(crate) fn load_into_current() -> Result<()> {
    // SAFETY: no arguments; the runtime loads the module into whatever context is current.
    check_launch(unsafe { cuda_pinned_preload() }, "cuda_pinned_preload")
}

/// The loading of the kernels into one device's primary context: `None` while it runs.
#[derive(Default)]
struct Load {
    outcome: Mutex<Option<Result<()>>>,
    done: Condvar,
}

/// The loads started, by device ordinal.
static LOADS: Mutex<BTreeMap<usize, Arc<Load>>> = Mutex::new(BTreeMap::new());

/// Loads the kernels into the primary context of the device with this ordinal by running `load`, once per
/// device and process, and returns when that loading has ended: a later call for the same device, from any
/// thread, waits for it and drops its own `load`.
///
/// The CUDA runtime loads a module into a context at its first launch there, and loading a module waits
/// until all work on the device has finished (measured on an H100: the first launch took as long as a
/// 300 ms kernel running on another stream), holding back other threads' driver calls meanwhile. Loaded
/// while the device's first context is made, before any work of the crate can be queued on it, the loading
/// waits for no work of the crate, and no work queued afterwards waits for it. (Loaded on a thread of its
/// own instead, it waited for work queued right after `Context::new`, and work that other threads queued
/// meanwhile waited with it.) Should the primary context be destroyed and made again, the runtime loads the
/// module again at the first launch.
#[cfg(feature = "gpu")]
pub(crate) fn preload(ordinal: usize, load: impl FnOnce() -> Result<()>) {
    let entry = {
        let mut loads = LOADS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(started) = loads.get(&ordinal).cloned() {
            drop(loads);
            // Its outcome is kept for the first launch ([`loaded`]).
            let _ = wait(&started);
            return;
        }
        let entry = Arc::new(Load::default());
        loads.insert(ordinal, entry.clone());
        entry
    };
    // Should `load` unwind, the loading still ends, with an error, so that no later call waits for it for ever.
    let unwound = Unwound(&entry);
    static BEFORE_RUNTIME: std::sync::Once = std::sync::Once::new();
    BEFORE_RUNTIME.call_once(|| crate::exit::guard_exit_waiting_for(wait_for_loads));
    let outcome = load();
    // The runtime has started and registered its exit hook: the release thread's goes after it, so that it
    // runs first at exit (see `guard_exit`).
    static AFTER_RUNTIME: std::sync::Once = std::sync::Once::new();
    AFTER_RUNTIME.call_once(crate::exit::guard_exit);
    std::mem::forget(unwound);
    finish(&entry, outcome);
}

/// Ends a loading with an error when dropped: dropped only if the loading unwound.
#[cfg(feature = "gpu")]
struct Unwound<'a>(&'a Load);

#[cfg(feature = "gpu")]
impl Drop for Unwound<'_> {
    fn drop(&mut self) {
        finish(
            self.0,
            Err(crate::error::Error::invalid(
                "loading the crate's kernels panicked",
            )),
        );
    }
}

#[cfg(feature = "gpu")]
fn finish(load: &Load, outcome: Result<()>) {
    *load.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
    load.done.notify_all();
}

/// Waits, until `deadline` at the latest, for every loading of the kernels started so far to end (at the
/// process's exit: see `exit.rs`).
#[cfg(feature = "gpu")]
pub(crate) fn wait_for_loads(deadline: std::time::Instant) {
    let loads: Vec<Arc<Load>> = LOADS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .cloned()
        .collect();
    for load in loads {
        let mut outcome = load.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        while outcome.is_none() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            outcome = load
                .done
                .wait_timeout(outcome, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Waits until the kernels are loaded into the primary context of the device with this ordinal (at once,
/// unless another thread is making the device's first context); the error of the loading, if it failed.
pub(crate) fn loaded(ordinal: usize) -> Result<()> {
    let Some(load) = LOADS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&ordinal)
        .cloned()
    else {
        return Ok(());
    };
    wait(&load)
}

/// Waits until `load` has ended; its outcome.
fn wait(load: &Load) -> Result<()> {
    let mut outcome = load.outcome.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(outcome) = outcome.as_ref() {
            return outcome.clone();
        }
        outcome = load
            .done
            .wait(outcome)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
