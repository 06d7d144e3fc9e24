//! Helpers shared by the test files that run on a GPU (`--features gpu`) and, without that feature, on the
//! simulated driver (tests/sim-driver), which `cargo test` builds as a dev-dependency.
#![allow(dead_code, reason = "each test file uses a different subset")]

#[cfg(not(feature = "gpu"))]
use std::sync::Once;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_pinned::Stream;

/// Whether these tests run on the simulated driver (built without feature `gpu`) rather than a GPU.
pub const SIMULATED: bool = cfg!(not(feature = "gpu"));

/// Holds the tests of a binary to one at a time, and on the simulated driver checks, when dropped, that
/// the test caused no violation (memory freed under in-flight work, work on freed memory).
pub struct Serial {
    _lock: MutexGuard<'static, ()>,
    violations_before: usize,
}

/// Runs the tests of a binary one at a time. Several assert that work is still in flight behind a `spin`;
/// another thread's call that synchronises the whole device (`cuMemFreeHost`, `cuMemHostRegister` and their
/// kin do) would block this thread's driver calls until the spin ends and make such an assertion fail.
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

impl Drop for Serial {
    fn drop(&mut self) {
        let Some(sim) = sim() else { return };
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

/// Without feature `gpu`: sets `CUDA_PINNED_LIBCUDA` and `CUDA_PINNED_LIBCUDART` to the simulator, once,
/// before the crate loads a driver.
fn use_simulator() {
    #[cfg(not(feature = "gpu"))]
    static ONCE: Once = Once::new();
    #[cfg(not(feature = "gpu"))]
    ONCE.call_once(|| {
        if std::env::var_os("CUDA_PINNED_LIBCUDA").is_some() {
            return;
        }
        let path = cuda_pinned_sim::library_path()
            .expect("the simulated driver is not beside the test binary: build it with `cargo test` (it is a dev-dependency)");
        // SAFETY: every test of these binaries calls serial() before anything else, and this runs inside
        // its Once, so no other thread of the test reads the environment while it is written; the harness's
        // own threads read it only at start-up.
        unsafe {
            std::env::set_var("CUDA_PINNED_LIBCUDA", &path);
            std::env::set_var("CUDA_PINNED_LIBCUDART", &path);
        }
    });
}

/// The simulated driver's controls, when the tests run on it. (Under feature `gpu` the simulator is not
/// linked at all: its runtime functions would clash with the static CUDA runtime the kernels link.)
#[cfg(not(feature = "gpu"))]
pub fn sim() -> Option<&'static cuda_pinned_sim::Control> {
    static CONTROL: std::sync::OnceLock<Option<cuda_pinned_sim::Control>> =
        std::sync::OnceLock::new();
    CONTROL
        .get_or_init(|| {
            let path = std::env::var_os("CUDA_PINNED_LIBCUDA")?;
            let control = cuda_pinned_sim::Control::open(path.as_ref()).ok()?;
            // A real driver opened here has no cuda_sim_* functions.
            control.is_simulator().then_some(control)
        })
        .as_ref()
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
}

/// Keeps `stream` busy for `ms` milliseconds: work queued behind it waits, so a missing wait shows. On a GPU
/// a kernel spins; on the simulated driver a host function sleeps.
pub fn spin(stream: &Stream, ms: u64) {
    spin_for(stream, std::time::Duration::from_millis(ms));
}

/// [`spin`] for any duration.
pub fn spin_for(stream: &Stream, duration: std::time::Duration) {
    let ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    #[cfg(feature = "gpu")]
    {
        use cuda_pinned::sys::kernels;
        // SAFETY: a live stream; the kernel touches no memory.
        let code = unsafe { kernels::cuda_pinned_spin(ns, stream.as_raw()) };
        kernels::check_launch(code, "cuda_pinned_spin").unwrap();
    }
    #[cfg(not(feature = "gpu"))]
    {
        /// Sleeps for the number of nanoseconds its argument holds (a number, never dereferenced).
        ///
        /// # Safety
        /// None beyond cuLaunchHostFunc's: it makes no CUDA call.
        unsafe extern "C" fn sleep(ns: *mut std::ffi::c_void) {
            std::thread::sleep(std::time::Duration::from_nanos(ns as u64));
        }
        // SAFETY: a live stream; the host function reads nothing through its argument, which is a number.
        unsafe {
            cuda_pinned::driver_call!(cuLaunchHostFunc(
                stream.as_raw(),
                Some(sleep),
                ns as usize as *mut _
            ))
        }
        .unwrap();
    }
}

/// On the simulated driver there are no kernels (they run through the CUDA runtime): `fill` and `spin` stand
/// in for the crate's launchers of those names with work the driver runs in stream order: an upload of a
/// pinned buffer holding the value (tracked as a write of the destination, as the kernel is) and a host
/// function that sleeps.
#[cfg(not(feature = "gpu"))]
pub mod kernels {
    use std::time::Duration;

    use bytemuck::Pod;
    use cuda_pinned::{DeviceBuffer, DeviceDestination, DeviceViewMut, Pinned, Result, Stream};

    /// The element count of a device destination (the crate's own is sealed).
    pub trait Elements {
        fn count(&self) -> usize;
    }

    impl<T: Pod> Elements for DeviceBuffer<T> {
        fn count(&self) -> usize {
            self.len()
        }
    }

    impl<T: Pod> Elements for DeviceViewMut<'_, T> {
        fn count(&self) -> usize {
            self.len()
        }
    }

    pub fn fill<T: Pod>(
        stream: &Stream,
        dst: &mut (impl DeviceDestination<T> + Elements),
        value: T,
    ) -> Result<()> {
        let src = Pinned::from_slice(stream.context(), &vec![value; Elements::count(dst)])?;
        stream.upload(&src, dst)
    }

    pub fn spin(stream: &Stream, duration: Duration) -> Result<()> {
        super::spin_for(stream, duration);
        Ok(())
    }
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
