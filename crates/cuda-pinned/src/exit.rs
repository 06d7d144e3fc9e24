//! The process's exit: a hook that stops the crate's threads from calling the driver while the CUDA libraries
//! are torn down.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Set when the process exits: the release thread makes no driver call after it.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Held by the release thread while it makes driver calls (a round of releases), and taken by the exit hook to
/// wait for such a round to end.
static DRIVER_CALLS: Mutex<()> = Mutex::new(());

/// Makes the process's exit wait for a round of releases in progress (and, with feature `gpu`, for the loading
/// of the crate's kernels) and stop the release thread before the CUDA libraries are torn down: a driver call
/// running on such a thread while the statically linked CUDA runtime tears itself down at exit made the process
/// crash (seen on an H100: a `Gatherer` dropped as `main` returned ended in a segmentation fault). Exit hooks
/// run in the reverse order of their registration, so this is registered when the first of those threads
/// starts and again once the runtime has started (by the kernels' loading), after the runtime's own hook.
pub(crate) fn guard_exit() {
    unsafe extern "C" {
        fn atexit(hook: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn stop_releasing() {
        EXITING.store(true, Ordering::Release);
        // A round in progress ends (its calls return) before the libraries go; none starts after. Its calls
        // may wait for device work (unpinning waits for the whole device), so the exit waits, but not for
        // ever: after PATIENCE it goes on, as it did without this hook.
        const PATIENCE: Duration = Duration::from_secs(10);
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline {
            match DRIVER_CALLS.try_lock() {
                Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => break,
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // A loading of the crate's kernels into the runtime that another thread is doing must not be cut off
        // by the runtime's teardown either.
        if let Some(wait) = ALSO_WAIT.get() {
            wait(deadline);
        }
    }
    // SAFETY: `atexit` is the C library's; the hook is a plain function that only touches statics, and
    // registering it more than once is harmless (it is idempotent).
    unsafe { atexit(stop_releasing) };
}

/// Whether the process is exiting: no driver call may start.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

/// The lock the release thread holds around a round of driver calls, which the exit hook waits for.
pub(crate) fn driver_calls() -> MutexGuard<'static, ()> {
    DRIVER_CALLS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the exit hook waits for as well, until the deadline it is given: set once (by the loading of the
/// crate's kernels, which the runtime's teardown must not cut off).
static ALSO_WAIT: OnceLock<fn(Instant)> = OnceLock::new();

/// Makes the exit hook also wait for `wait` (until the deadline it passes), and registers the hook.
#[cfg(feature = "gpu")]
pub(crate) fn guard_exit_waiting_for(wait: fn(Instant)) {
    let _ = ALSO_WAIT.set(wait);
    guard_exit();
}
