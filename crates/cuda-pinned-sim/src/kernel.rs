//! Kernels: what a launch does is a *stand-in*, a function a test registers under the kernel's name with the
//! sizes of its parameters (`cuda_sim_register_kernel`, wrapped by [`crate::Control::register_kernel`]). Any
//! image loads as a module (`cuModuleLoadData`); `cuModuleGetFunction` finds the stand-in of the name asked
//! for, and `cuLaunchKernel` queues an [`Op::Kernel`](crate::sim::Op) holding a [`Launch`]: the stand-in and a
//! copy of the parameters' bytes, taken at the call.
//!
//! When the stream reaches the launch, [`run`] calls the stand-in with a [`SimKernelCall`]: the launch's shape
//! and parameters, and callbacks that read and write memory by device address (device memory, and pinned or
//! registered host memory at its host address, as unified addressing maps it). An access outside every live
//! allocation (freed, never allocated, past an allocation's end, or stream-ordered memory not yet allocated)
//! reads zeros and writes nothing, and the launch reports it as a violation; so does a stand-in that panics.
//!
//! The stand-in lives in the test's copy of this crate and the launch runs in the loaded library's, so
//! everything between them crosses the C ABI: the stand-in is a C function with an opaque context, and the
//! memory is reached through C callbacks.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use crate::sim::{Kind, SIM, State};
use crate::sys::CUresult;

/// The most bytes of parameters a kernel takes (CUDA 12.1 and later, Volta and later).
pub(crate) const MAX_PARAM_BYTES: usize = 32764;

/// What a stand-in is called with: the launch, and the callbacks through which it reaches memory. Built by
/// the library for each launch, valid during the call only; the testkit wraps it as a
/// [`crate::KernelCall`].
#[repr(C)]
pub(crate) struct SimKernelCall {
    /// The kernel's name, UTF-8, `name_len` bytes (and a NUL after them).
    pub(crate) name: *const c_char,
    pub(crate) name_len: usize,
    /// Blocks in the grid, x, y, z.
    pub(crate) grid: [u32; 3],
    /// Threads in a block, x, y, z.
    pub(crate) block: [u32; 3],
    /// Bytes of dynamic shared memory asked for.
    pub(crate) shared: u32,
    /// The parameters' bytes, `params_len` of them, each parameter at its offset.
    pub(crate) params: *const u8,
    pub(crate) params_len: usize,
    /// The offset and the size of each of the `count` parameters.
    pub(crate) offsets: *const usize,
    pub(crate) sizes: *const usize,
    pub(crate) count: usize,
    /// The opaque argument of the callbacks.
    pub(crate) memory: *const c_void,
    /// Copies `len` bytes at device address `address` to `out`; 0, or 1 (and zeros) where they are not all
    /// inside one live allocation.
    pub(crate) read: unsafe extern "C" fn(
        memory: *const c_void,
        address: u64,
        out: *mut u8,
        len: usize,
    ) -> c_int,
    /// Copies `len` bytes from `data` to device address `address`; 0, or 1 (and nothing written) where they
    /// are not all inside one live allocation.
    pub(crate) write: unsafe extern "C" fn(
        memory: *const c_void,
        address: u64,
        data: *const u8,
        len: usize,
    ) -> c_int,
    /// Reports that the stand-in panicked, with the panic's message (UTF-8, `len` bytes).
    pub(crate) panicked:
        unsafe extern "C" fn(memory: *const c_void, message: *const u8, len: usize),
}

/// A stand-in as the testkit registers it: called with its context and the launch.
pub(crate) type StandInFn = unsafe extern "C" fn(ctx: *const c_void, call: *const SimKernelCall);

/// A registered stand-in.
#[derive(Debug)]
pub(crate) struct StandIn {
    /// The kernel's name (what `cuFuncGetName` gives).
    pub(crate) name: CString,
    /// The size of each parameter, in bytes.
    pub(crate) sizes: Vec<usize>,
    /// The offset of each parameter (see [`layout`]).
    pub(crate) offsets: Vec<usize>,
    call: StandInFn,
    /// The registrant's context, passed back to `call`.
    ctx: usize,
}

impl StandIn {
    /// The stand-in `stand_in` of kernels named `name`, its parameters of `sizes` bytes each; `Err` with the
    /// reason where the sizes are not valid (see [`layout`]). `stand_in` lives as long as the process: a launch
    /// may run it at any time.
    pub(crate) fn new<F>(name: CString, sizes: Vec<usize>, stand_in: F) -> Result<StandIn, String>
    where
        F: Fn(&mut crate::KernelCall<'_>) + Send + Sync + 'static,
    {
        // The sizes are checked before the stand-in is leaked, so that a refused one is dropped.
        layout(&sizes).map_err(|e| format!("kernel {name:?}: {e}"))?;
        let ctx: *const F = Box::into_raw(Box::new(stand_in));
        StandIn::from_raw(name, sizes, crate::testkit::trampoline::<F>, ctx as usize)
    }

    /// The stand-in `call` (called with `ctx`) of kernels named `name`, its parameters of `sizes` bytes each;
    /// `Err` with the reason where the sizes are not valid (see [`layout`]).
    fn from_raw(
        name: CString,
        sizes: Vec<usize>,
        call: StandInFn,
        ctx: usize,
    ) -> Result<StandIn, String> {
        let offsets = layout(&sizes).map_err(|e| format!("kernel {name:?}: {e}"))?;
        Ok(StandIn {
            name,
            sizes,
            offsets,
            call,
            ctx,
        })
    }

    /// The bytes of all the parameters, laid out.
    pub(crate) fn params_len(&self) -> usize {
        match (self.offsets.last(), self.sizes.last()) {
            (Some(offset), Some(size)) => offset + size,
            _ => 0,
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.name.to_str().unwrap_or("?")
    }
}

/// The stand-ins, by name: first those of `cuda-pinned`'s own kernels ([`crate::own_kernels`]), then those
/// registered. Apart from the simulator's state, so that registering one does not start the simulator (its
/// settings are read when it starts).
static STAND_INS: Mutex<Option<HashMap<Vec<u8>, Arc<StandIn>>>> = Mutex::new(None);

/// Runs `f` on the table of stand-ins, made with the crate's own on first use.
fn with_stand_ins<T>(f: impl FnOnce(&mut HashMap<Vec<u8>, Arc<StandIn>>) -> T) -> T {
    let mut stand_ins = STAND_INS.lock().unwrap_or_else(PoisonError::into_inner);
    f(stand_ins.get_or_insert_with(|| {
        let mut own = crate::own_kernels::Registry::default();
        // The built-in stand-ins' names and sizes are constants that `layout` accepts.
        crate::own_kernels::register(&mut own)
            .unwrap_or_else(|e| panic!("the stand-ins of cuda-pinned's kernels: {e}"));
        own.0
    }))
}

/// The stand-in registered as `name`, if any.
pub(crate) fn stand_in(name: &[u8]) -> Option<Arc<StandIn>> {
    with_stand_ins(|stand_ins| stand_ins.get(name).cloned())
}

/// The offset of each parameter of the sizes given: each aligned to its natural alignment (the largest power
/// of two that divides its size, at most 8), as a kernel's parameters are laid out in the parameter buffer.
/// `Err` with the reason where a size is zero or they do not fit in a kernel's [`MAX_PARAM_BYTES`].
pub(crate) fn layout(sizes: &[usize]) -> Result<Vec<usize>, String> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = 0usize;
    for (index, &size) in sizes.iter().enumerate() {
        if size == 0 {
            return Err(format!("parameter {index} has size 0"));
        }
        let align = (1usize << size.trailing_zeros()).min(8);
        let offset = end.next_multiple_of(align);
        end = offset.saturating_add(size);
        if end > MAX_PARAM_BYTES {
            return Err(format!(
                "the parameters take more than the {MAX_PARAM_BYTES} bytes a kernel may have"
            ));
        }
        offsets.push(offset);
    }
    Ok(offsets)
}

/// Registers a stand-in for kernels named `name`, replacing any registered before (functions already got
/// with `cuModuleGetFunction` keep the stand-in they were got with). `CUDA_ERROR_INVALID_VALUE` and a log
/// line where `name` is null or not UTF-8 or the sizes are not valid (see [`layout`]).
///
/// # Safety
/// `name` is a NUL-terminated string; `sizes` points to `count` sizes (or `count` is 0); `call` may be called
/// from any thread, at any time from now on, with `ctx` and a valid [`SimKernelCall`], and returns normally.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuda_sim_register_kernel(
    name: *const c_char,
    sizes: *const usize,
    count: usize,
    call: StandInFn,
    ctx: *const c_void,
) -> CUresult {
    if name.is_null() || (sizes.is_null() && count > 0) {
        eprintln!("cuda-pinned-sim: cuda_sim_register_kernel: a null name or sizes");
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) };
    if name.to_str().is_err() {
        eprintln!("cuda-pinned-sim: cuda_sim_register_kernel: the name {name:?} is not UTF-8");
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let sizes = if count == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `count` sizes at `sizes`, checked non-null.
        unsafe { std::slice::from_raw_parts(sizes, count) }.to_vec()
    };
    let stand_in = match StandIn::from_raw(name.to_owned(), sizes, call, ctx as usize) {
        Ok(stand_in) => stand_in,
        Err(error) => {
            eprintln!("cuda-pinned-sim: cuda_sim_register_kernel: {error}");
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
    };
    with_stand_ins(|stand_ins| stand_ins.insert(name.to_bytes().to_vec(), Arc::new(stand_in)));
    CUresult::CUDA_SUCCESS
}

/// A launch, as queued: what runs, with what, and the memory it was given.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) kernel: Arc<StandIn>,
    /// The function launched (its `CUfunction` handle).
    pub(crate) function: usize,
    /// The module of the function launched.
    pub(crate) module: usize,
    /// The device of the function's context.
    pub(crate) device: i32,
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared: u32,
    /// The parameters' bytes, copied at the launch.
    pub(crate) params: Vec<u8>,
    /// The live allocations that contain an 8-byte parameter's value at the launch: the memory it was handed
    /// (by the detectors' reckoning; a kernel may reach memory some other way, which they do not see).
    pub(crate) allocations: Vec<u64>,
}

impl Launch {
    /// The allocations containing the value of an 8-byte parameter (in `params`, laid out as `kernel`'s).
    pub(crate) fn pointed_to(state: &State, kernel: &StandIn, params: &[u8]) -> Vec<u64> {
        let mut found = Vec::new();
        for (&offset, &size) in kernel.offsets.iter().zip(&kernel.sizes) {
            if size != 8 {
                continue;
            }
            let mut value = [0u8; 8];
            value.copy_from_slice(&params[offset..offset + 8]);
            let address = u64::from_le_bytes(value);
            let hit = state
                .find(address, 1, true)
                .or_else(|| state.find(address, 1, false));
            if let Some((id, _)) = hit
                && !found.contains(&id)
            {
                found.push(id);
            }
        }
        found
    }
}

/// What a running launch found wrong, filled by the callbacks.
struct Access<'a> {
    launch: &'a Launch,
    stream: usize,
    /// The first bad access, described, and how many there were.
    bad: Mutex<(Option<String>, usize)>,
    panicked: Mutex<Option<String>>,
}

impl Access<'_> {
    fn bad(&self, what: &str, address: u64, len: usize, why: String) {
        let mut bad = self.bad.lock().unwrap_or_else(PoisonError::into_inner);
        if bad.0.is_none() {
            bad.0 = Some(format!(
                "kernel `{}` queued on stream {:#x} {what} {len} bytes at address {address:#x}, which {why}",
                self.launch.kernel.name(),
                self.stream
            ));
        }
        bad.1 += 1;
    }
}

/// Where `len` bytes at `address` are in the host's memory, or why they are not in one live allocation.
fn resolve(state: &State, address: u64, len: usize) -> Result<*mut u8, String> {
    let found = state
        .find(address, len, true)
        .or_else(|| state.find(address, len, false));
    if let Some((id, offset)) = found {
        let allocation = &state.allocations[&id];
        if allocation.kind == Kind::DeviceAsync && !allocation.ready {
            return Err(format!(
                "is in stream-ordered device memory {:#x} whose allocation was not reached yet",
                allocation.base
            ));
        }
        return Ok(allocation.host_address(offset));
    }
    let start = state
        .find(address, 1, true)
        .or_else(|| state.find(address, 1, false));
    Err(match start {
        Some((id, _)) => {
            let allocation = &state.allocations[&id];
            format!(
                "runs past the end of {} {:#x} ({} bytes)",
                allocation.kind.describe(),
                allocation.base,
                allocation.bytes
            )
        }
        None => "is in no live allocation (freed, or never allocated)".into(),
    })
}

/// Moves `len` bytes between the stand-in's buffer and memory at `address`, under the simulator's lock (so
/// the memory cannot be freed meanwhile); on a bad address, zeros the buffer when reading and reports it.
///
/// # Safety
/// `memory` is the [`Access`] of a running launch; `buffer` has `len` bytes, writable when `reading`.
unsafe fn access(
    memory: *const c_void,
    address: u64,
    buffer: *mut u8,
    len: usize,
    reading: bool,
) -> c_int {
    // SAFETY: the library passes its Access as `memory` and it outlives the call of the stand-in.
    let access = unsafe { &*memory.cast::<Access<'_>>() };
    if len == 0 {
        return 0;
    }
    let state = SIM.lock();
    match resolve(&state, address, len) {
        Ok(place) => {
            // SAFETY: `place` has `len` bytes inside a live allocation, which cannot be freed while the lock
            // is held; `buffer` has `len` bytes, as the caller promises. `copy` allows overlap (a stand-in
            // may copy from simulated memory to itself).
            unsafe {
                if reading {
                    std::ptr::copy(place, buffer, len);
                } else {
                    std::ptr::copy(buffer, place, len);
                }
            }
            0
        }
        Err(why) => {
            drop(state);
            if reading {
                // SAFETY: `buffer` has `len` writable bytes when reading.
                unsafe { buffer.write_bytes(0, len) };
            }
            access.bad(if reading { "read" } else { "wrote" }, address, len, why);
            1
        }
    }
}

/// [`SimKernelCall::read`].
///
/// # Safety
/// As [`access`], `out` writable.
unsafe extern "C" fn read_memory(
    memory: *const c_void,
    address: u64,
    out: *mut u8,
    len: usize,
) -> c_int {
    // A panic here would be a bug of the simulator; it must not unwind into the caller.
    std::panic::catch_unwind(|| {
        // SAFETY: as the caller promises.
        unsafe { access(memory, address, out, len, true) }
    })
    .unwrap_or(1)
}

/// [`SimKernelCall::write`].
///
/// # Safety
/// As [`access`].
unsafe extern "C" fn write_memory(
    memory: *const c_void,
    address: u64,
    data: *const u8,
    len: usize,
) -> c_int {
    std::panic::catch_unwind(|| {
        // SAFETY: as the caller promises; `access` only reads `data` when writing.
        unsafe { access(memory, address, data.cast_mut(), len, false) }
    })
    .unwrap_or(1)
}

/// [`SimKernelCall::panicked`].
///
/// # Safety
/// `memory` is the [`Access`] of a running launch; `message` has `len` bytes.
unsafe extern "C" fn report_panic(memory: *const c_void, message: *const u8, len: usize) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: as the caller promises.
        let (access, message) = unsafe {
            (
                &*memory.cast::<Access<'_>>(),
                std::slice::from_raw_parts(message, len),
            )
        };
        let mut panicked = access
            .panicked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *panicked = Some(String::from_utf8_lossy(message).into_owned());
    });
}

/// Runs `launch`, queued on `stream`, in the calling thread, without the simulator's lock (the callbacks take
/// it); the violations it found.
pub(crate) fn run(launch: &Launch, stream: usize) -> Vec<String> {
    let kernel = &launch.kernel;
    let access = Access {
        launch,
        stream,
        bad: Mutex::new((None, 0)),
        panicked: Mutex::new(None),
    };
    let call = SimKernelCall {
        name: kernel.name.as_ptr(),
        name_len: kernel.name.as_bytes().len(),
        grid: launch.grid,
        block: launch.block,
        shared: launch.shared,
        params: launch.params.as_ptr(),
        params_len: launch.params.len(),
        offsets: kernel.offsets.as_ptr(),
        sizes: kernel.sizes.as_ptr(),
        count: kernel.sizes.len(),
        memory: (&raw const access).cast(),
        read: read_memory,
        write: write_memory,
        panicked: report_panic,
    };
    // SAFETY: the registrant promised (`cuda_sim_register_kernel`) that `call` may be called with its context
    // and a valid SimKernelCall: its pointers are to `kernel` and `launch`, which outlive the call, and the
    // callbacks' argument is `access`, which does too.
    unsafe { (kernel.call)(kernel.ctx as *const c_void, &call) };
    let mut violations = Vec::new();
    let (first, count) = access
        .bad
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(mut first) = first {
        if count > 1 {
            first.push_str(&format!(
                " (and {} more accesses outside live memory)",
                count - 1
            ));
        }
        violations.push(first);
    }
    let panicked = access
        .panicked
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(message) = panicked {
        violations.push(format!(
            "kernel `{}` queued on stream {stream:#x}: its stand-in panicked: {message}",
            kernel.name()
        ));
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::layout;

    #[test]
    fn parameters_are_naturally_aligned() {
        assert_eq!(layout(&[8, 8, 4, 4]).unwrap(), [0, 8, 16, 20]);
        assert_eq!(layout(&[4, 8]).unwrap(), [0, 8]);
        assert_eq!(layout(&[1, 2, 1, 4]).unwrap(), [0, 2, 4, 8]);
        // A 12-byte struct of floats is 4-aligned; 16-byte ones are placed at 8.
        assert_eq!(layout(&[1, 12, 16]).unwrap(), [0, 4, 16]);
        assert!(layout(&[]).unwrap().is_empty());
        assert!(layout(&[4, 0]).unwrap_err().contains("size 0"));
        assert!(layout(&[MAX_PARAM_BYTES_PLUS]).is_err());
    }

    const MAX_PARAM_BYTES_PLUS: usize = super::MAX_PARAM_BYTES + 1;
}
