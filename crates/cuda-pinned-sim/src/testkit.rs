//! The simulator as a test sees it: [`install`] points `cuda-pinned` at it, [`Settings`] choose its seed,
//! devices, memory and faults, and the returned [`Control`] reads what it found and registers kernels'
//! stand-ins, which see each launch as a [`KernelCall`].

use std::ffi::c_void;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cuda_pinned_sys::Library;

use crate::control::{Control, library_path};
use crate::kernel::SimKernelCall;

/// Settings of the simulated driver, chosen in code before its first use (the first CUDA call of the process, or
/// the first query through [`Control`]); each one not chosen is taken from its environment variable, else its
/// default. They hold for the whole process: give every test of a binary the same ones.
///
/// | setting              | variable                 | default |
/// |----------------------|--------------------------|---------|
/// | [`seed`]             | `CUDA_SIM_SEED`          | 1       |
/// | [`max_delay`]        | `CUDA_SIM_MAX_DELAY_US`  | 200 us  |
/// | [`devices`]          | `CUDA_SIM_DEVICES`       | 1       |
/// | [`device_memory`]    | `CUDA_SIM_DEVICE_MEMORY` | 16 GiB  |
/// | [`pinned_limit`]     | `CUDA_SIM_PINNED_LIMIT`  | 8 GiB   |
/// | [`faults`]           | `CUDA_SIM_FAIL`          | none    |
/// | [`peer_access`]      | `CUDA_SIM_PEER_ACCESS`   | yes     |
///
/// [`seed`]: Settings::seed
/// [`max_delay`]: Settings::max_delay
/// [`devices`]: Settings::devices
/// [`device_memory`]: Settings::device_memory
/// [`pinned_limit`]: Settings::pinned_limit
/// [`faults`]: Settings::faults
/// [`peer_access`]: Settings::peer_access
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Settings {
    chosen: Vec<(&'static str, String)>,
}

impl Settings {
    /// No setting chosen: the environment's, else the defaults.
    pub fn new() -> Settings {
        Settings::default()
    }

    fn with(mut self, name: &'static str, value: String) -> Settings {
        self.chosen.retain(|(n, _)| *n != name);
        self.chosen.push((name, value));
        self
    }

    /// The seed of the random delays before queued work runs: the same seed, the same order of work on
    /// different streams, so a failure found with one seed is replayed with it.
    pub fn seed(self, seed: u64) -> Settings {
        self.with("CUDA_SIM_SEED", seed.to_string())
    }

    /// The longest random delay before a queued operation runs (microseconds are kept).
    pub fn max_delay(self, delay: Duration) -> Settings {
        self.with("CUDA_SIM_MAX_DELAY_US", delay.as_micros().to_string())
    }

    /// How many devices there are (at most 64).
    pub fn devices(self, count: u32) -> Settings {
        self.with("CUDA_SIM_DEVICES", count.to_string())
    }

    /// Bytes of memory per device: an allocation past them fails with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn device_memory(self, bytes: u64) -> Settings {
        self.with("CUDA_SIM_DEVICE_MEMORY", bytes.to_string())
    }

    /// Bytes of page-locked host memory the process may allocate or register.
    pub fn pinned_limit(self, bytes: u64) -> Settings {
        self.with("CUDA_SIM_PINNED_LIMIT", bytes.to_string())
    }

    /// Faults to inject from the start, in the syntax of [`Control::fail`]
    /// (`cuMemAlloc_v2:3:CUDA_ERROR_OUT_OF_MEMORY` fails the third call).
    pub fn faults(self, spec: &str) -> Settings {
        self.with("CUDA_SIM_FAIL", spec.to_string())
    }

    /// Whether two different devices can access each other's memory (`cuDeviceCanAccessPeer`), as GPUs joined
    /// by NVLink or on one PCIe switch can; without it, `cuCtxEnablePeerAccess` fails with
    /// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, as on hosts whose GPUs cannot reach each other directly.
    pub fn peer_access(self, yes: bool) -> Settings {
        self.with("CUDA_SIM_PEER_ACCESS", u8::from(yes).to_string())
    }
}

/// Why the simulator could not be installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Makes `cuda-pinned` use the simulated driver, with the settings of the environment (or those an earlier
/// [`install_with`] chose): the same as [`install_with`]`(Settings::new())`. Call it at the start of every test
/// that needs it (it is cheap once done); add `cuda-pinned-sim` as a dev-dependency, which makes `cargo test`
/// build the simulator beside the test binaries. A test that injects faults, reads violations or counts what
/// is alive holds the simulator for itself with [`Control::exclusive`]: that state is the whole process's.
///
/// ```no_run
/// #[test]
/// fn uploads_arrive() -> Result<(), Box<dyn std::error::Error>> {
///     let sim = cuda_pinned_sim::install()?.exclusive();
///     // ... use cuda-pinned as on a GPU ...
///     assert!(sim.new_violations().is_empty());
///     Ok(())
/// }
/// ```
///
/// # Errors
/// As [`install_with`].
pub fn install() -> Result<&'static Control, Error> {
    install_with(Settings::new())
}

/// Makes `cuda-pinned` (every crate of the process that uses `cuda-pinned-sys`) load the simulated driver
/// and runtime instead of libcuda and libcudart, with `settings`, and returns its controls: the faults to
/// inject, the calls made, the violations found and what is still alive.
///
/// It must come before the first CUDA call of the process (the first `Context::on`, say); calling it again
/// later is `Ok` where it chooses nothing new (the same settings, or none), and an error where it would
/// change a setting of the simulator once started.
///
/// # Errors
/// Where no build of the simulator of this version is found (see [`crate::library_path`]); where another
/// driver was loaded first; where a setting is changed after the simulator has started.
///
/// A crate whose tests link the CUDA runtime statically (as `cuda-pinned`'s feature `gpu` does) cannot have
/// this crate in the same test binary: its library also exports the runtime's host-memory functions
/// (`cudaHostAlloc`, ...), and the link fails with duplicate symbols. Test such a crate on the simulator
/// without its GPU feature.
pub fn install_with(settings: Settings) -> Result<&'static Control, Error> {
    static CONTROL: OnceLock<Result<(Control, PathBuf), Error>> = OnceLock::new();
    let (control, path) = CONTROL.get_or_init(open).as_ref().map_err(Clone::clone)?;
    // The settings chosen so far: choosing one again with the same value changes nothing, so it is no error
    // once the simulator has started.
    static CHOSEN: Mutex<Vec<(&str, String)>> = Mutex::new(Vec::new());
    let mut chosen = CHOSEN.lock().unwrap_or_else(PoisonError::into_inner);
    for (name, value) in &settings.chosen {
        if chosen.iter().any(|(n, v)| n == name && v == value) {
            continue;
        }
        control.configure(name, value).map_err(Error)?;
        chosen.retain(|(n, _)| n != name);
        chosen.push((name, value.clone()));
    }
    for library in [Library::Driver, Library::Runtime] {
        cuda_pinned_sys::use_library(library, path).map_err(|e| Error(e.to_string()))?;
    }
    Ok(control)
}

fn open() -> Result<(Control, PathBuf), Error> {
    let path = library_path().ok_or_else(|| {
        Error(format!(
            "no build of the simulated driver of cuda-pinned-sim {} was found for {}: cargo builds it beside the \
             test binaries of a crate that has cuda-pinned-sim in [dev-dependencies]; for a program run from \
             elsewhere (a doctest, a copied binary), set CUDA_PINNED_LIBCUDA to it",
            env!("CARGO_PKG_VERSION"),
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ))
    })?;
    // SAFETY: a library that `library_path` has opened already and found to be the simulator.
    let control = unsafe { Control::open(&path) }.map_err(Error)?;
    Ok((control, path))
}

/// A kernel launch as its stand-in sees it (see [`Control::register_kernel`]): the launch's shape, its
/// arguments, and the memory it reads and writes by device address: device memory, and pinned or registered
/// host memory at its host address (unified addressing). An access outside every live allocation (freed
/// memory, past an allocation's end, stream-ordered memory not allocated yet) reads zeros and writes
/// nothing, and is reported as a violation of the launch, as a panic of the stand-in is.
pub struct KernelCall<'a> {
    raw: &'a SimKernelCall,
}

impl<'a> KernelCall<'a> {
    /// Wraps the library's description of a launch.
    ///
    /// # Safety
    /// `raw`'s pointers are valid as [`SimKernelCall`] says, for `'a`.
    unsafe fn new(raw: &'a SimKernelCall) -> KernelCall<'a> {
        KernelCall { raw }
    }

    /// The parameters' offsets and sizes.
    fn layout(&self) -> (&[usize], &[usize]) {
        if self.raw.count == 0 {
            return (&[], &[]);
        }
        // SAFETY: the library passes `count` offsets and sizes, valid during the call (`new`).
        unsafe {
            (
                std::slice::from_raw_parts(self.raw.offsets, self.raw.count),
                std::slice::from_raw_parts(self.raw.sizes, self.raw.count),
            )
        }
    }

    /// The parameters' bytes.
    fn params(&self) -> &[u8] {
        if self.raw.params_len == 0 {
            return &[];
        }
        // SAFETY: the library passes `params_len` bytes, valid during the call (`new`).
        unsafe { std::slice::from_raw_parts(self.raw.params, self.raw.params_len) }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        // SAFETY: the library passes the name's `name_len` bytes, valid during the call (`new`).
        let bytes =
            unsafe { std::slice::from_raw_parts(self.raw.name.cast::<u8>(), self.raw.name_len) };
        // Names are registered from `&str`.
        std::str::from_utf8(bytes).unwrap_or("?")
    }

    /// The grid's dimensions in blocks, x, y, z.
    pub fn grid(&self) -> [u32; 3] {
        self.raw.grid
    }

    /// A block's dimensions in threads, x, y, z.
    pub fn block(&self) -> [u32; 3] {
        self.raw.block
    }

    /// Bytes of dynamic shared memory the launch asked for.
    pub fn shared_bytes(&self) -> u32 {
        self.raw.shared
    }

    /// How many parameters the kernel has.
    pub fn arg_count(&self) -> usize {
        self.raw.count
    }

    /// Argument `index`, as the launch passed it (a device pointer is a `u64`).
    ///
    /// # Panics
    /// Where the kernel has no parameter `index`, or it is not `size_of::<T>()` bytes: the panic is caught
    /// and reported as a violation of the launch.
    pub fn arg<T: bytemuck::Pod>(&self, index: usize) -> T {
        let (offsets, sizes) = self.layout();
        assert!(
            index < sizes.len(),
            "kernel `{}` has {} parameters: there is no parameter {index}",
            self.name(),
            sizes.len()
        );
        let (offset, size) = (offsets[index], sizes[index]);
        assert_eq!(
            size,
            std::mem::size_of::<T>(),
            "kernel `{}`: parameter {index} has {size} bytes, not the {} of {}",
            self.name(),
            std::mem::size_of::<T>(),
            std::any::type_name::<T>()
        );
        bytemuck::pod_read_unaligned(&self.params()[offset..offset + size])
    }

    /// `len` values of `T` at device address `address`; zeros (and a violation) where they are not all inside
    /// one live allocation.
    pub fn read<T: bytemuck::Pod>(&self, address: u64, len: usize) -> Vec<T> {
        let mut values = vec![T::zeroed(); len];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut values);
        // SAFETY: the callback and its argument are the library's, valid during the call (`new`); `bytes` has
        // `bytes.len()` writable bytes.
        unsafe {
            (self.raw.read)(self.raw.memory, address, bytes.as_mut_ptr(), bytes.len());
        }
        values
    }

    /// Writes `data` at device address `address`; nothing (and a violation) where it does not fit inside one
    /// live allocation.
    pub fn write<T: bytemuck::Pod>(&mut self, address: u64, data: &[T]) {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // SAFETY: the callback and its argument are the library's, valid during the call (`new`); `bytes` has
        // `bytes.len()` readable bytes.
        unsafe {
            (self.raw.write)(self.raw.memory, address, bytes.as_ptr(), bytes.len());
        }
    }
}

impl fmt::Debug for KernelCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelCall")
            .field("name", &self.name())
            .field("grid", &self.grid())
            .field("block", &self.block())
            .field("shared_bytes", &self.shared_bytes())
            .field("arg_count", &self.arg_count())
            .finish()
    }
}

/// What the library calls for a launch of a stand-in `F` (registered by [`Control::register_kernel`] with a
/// leaked `F` as `ctx`): runs it, and reports a panic through the launch's callback rather than unwinding
/// into the library.
///
/// # Safety
/// `ctx` is a live `F`; `call` is a valid [`SimKernelCall`] during the call.
pub(crate) unsafe extern "C" fn trampoline<F>(ctx: *const c_void, call: *const SimKernelCall)
where
    F: Fn(&mut KernelCall<'_>) + Send + Sync + 'static,
{
    // SAFETY: as the caller promises.
    let (stand_in, raw) = unsafe { (&*ctx.cast::<F>(), &*call) };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `raw` is valid during this call.
        let mut call = unsafe { KernelCall::new(raw) };
        stand_in(&mut call);
    }));
    if let Err(payload) = ran {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a payload that is not text".into());
        // SAFETY: the library's callback and argument, valid during the call; `message` has `len` bytes.
        unsafe { (raw.panicked)(raw.memory, message.as_ptr(), message.len()) };
        // Dropping the payload may panic in turn, which must not unwind into the library either.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(payload)));
    }
}
