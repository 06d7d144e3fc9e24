//! Helpers shared by the GPU test files.
#![allow(dead_code, reason = "each test file uses a different subset")]

use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_pinned::Stream;
use cuda_pinned::sys::kernels;

/// Runs the tests of a binary one at a time. Several assert that work is still in flight behind a `spin`;
/// another thread's call that synchronises the whole device (`cuMemFreeHost`, `cuMemHostRegister` and their
/// kin do) would block this thread's driver calls until the spin ends and make such an assertion fail.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps `stream` busy for `ms` milliseconds: work queued behind it waits, so a missing wait shows.
pub fn spin(stream: &Stream, ms: u64) {
    // SAFETY: a live stream; the kernel touches no memory.
    let code = unsafe { kernels::cuda_pinned_spin(ms * 1_000_000, stream.as_raw()) };
    kernels::check_launch(code, "cuda_pinned_spin").unwrap();
}

/// Fresh, distinct data for each seed (splitmix64), never zeros.
pub fn data(len: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u32
        })
        .collect()
}
