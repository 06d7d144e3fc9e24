//! The synchronization primitives that the crate's own lock protocols are written against: the segment lock's
//! hand-over (`reentrant.rs`) and the reactor's lending of flags (`flags.rs`). These are std's; the model check
//! (`model.rs`, a test) compiles those two files again over loom's, so that it checks the code that runs.

pub(crate) use std::cell::Cell;
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// Nothing: std's sequentially consistent accesses are ordered in one total order by themselves. The model's
/// version is a sequentially consistent fence, because loom treats such accesses as acquire-release only (its
/// README, "Unsupported features"): called right after each one whose order a protocol relies on.
#[inline(always)]
pub(crate) fn seq_cst_order() {}

/// A number that tells the calling thread from every other live thread, never 0: the address of a
/// thread-local (cheaper than `std::thread::current().id()`, which clones the thread's handle).
pub(crate) fn this_thread() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|token| std::ptr::from_ref(token) as usize)
}
