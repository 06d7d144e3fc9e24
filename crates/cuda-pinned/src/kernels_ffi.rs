//! The `extern "C"` launchers of `cuda/kernels.cu` (declared in `cuda/kernels.h`), compiled by build.rs with
//! nvcc under feature `gpu` and linked with the CUDA runtime statically.
//!
//! Each launcher enqueues its kernel on `stream` and returns at once with the launch error, a `cudaError_t`
//! as `int`; turn it into a `Result` with [`check_launch`]. Errors of the kernel's execution show at the next
//! synchronisation, as with any CUDA launch.

use std::ffi::{CStr, c_char, c_int, c_void};

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
