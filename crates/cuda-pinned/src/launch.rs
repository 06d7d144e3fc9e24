//! Users' kernels: modules loaded from PTX, cubin or fatbin images, their kernels, and launches that join the
//! tracking as copies do.
//!
//! ```no_run
//! use cuda_pinned::{Arg, Context, DeviceBuffer, LaunchConfig, Module, Stream};
//!
//! /// `ptx`: what a build script compiled with `nvcc --ptx` from
//! /// `extern "C" __global__ void scale(const float* x, float* y, float a, unsigned n)`,
//! /// e.g. `include_bytes!(concat!(env!("OUT_DIR"), "/scale.ptx"))`.
//! fn run(ptx: &[u8]) -> cuda_pinned::Result<()> {
//!     let context = Context::on(0)?;
//!     let stream = Stream::new(&context)?;
//!     let scale = Module::load(&context, ptx)?.kernel("scale")?;
//!     let x = DeviceBuffer::<f32>::zeroed(&stream, 1 << 20)?;
//!     let mut y = DeviceBuffer::<f32>::uninit(&stream, x.len())?;
//!     let n = x.len() as u32;
//!     // SAFETY: `scale` takes (const float*, float*, float, unsigned), reads x[..n] and writes y[..n].
//!     unsafe {
//!         stream.launch(
//!             &scale,
//!             LaunchConfig::for_elements(x.len(), 256)?,
//!             &[Arg::read(&x), Arg::write(&mut y), Arg::value(&2.0f32), Arg::value(&n)],
//!         )
//!     }
//! }
//! ```
//!
//! Each buffer argument says how the kernel uses it ([`Arg::read`], [`Arg::write`], and for page-locked host
//! memory mapped into the device's address space [`Arg::read_host`], [`Arg::write_host`]), so the launch
//! waits on the device for conflicting work of other streams, host accessors wait for it, and a buffer dropped
//! meanwhile is freed only once it has completed. What Rust cannot check is the `unsafe` part of
//! [`Stream::launch`]: that the kernel's parameters have the types of the arguments and that it touches only
//! the buffers passed, within their bounds, as declared. The rest is checked before anything is enqueued.

use std::ffi::{CString, c_void};
use std::fmt;
use std::sync::Arc;

use bytemuck::Pod;
use smallvec::SmallVec;

use crate::copy::{DeviceDestination, DeviceSource, PinnedDestination, PinnedSource, sealed};
use crate::driver::{Category, Context, Stream, calls};
use crate::error::{Error, Result};
use crate::memory::{INLINE, Track, Work, release_after_graphs, release_host};
use crate::sys::{
    CUdevice_attribute, CUdeviceptr, CUfunction, CUfunction_attribute, CUmodule, CUresult, CUstream,
};
use crate::track::Access;

/// A module loaded into a context: the kernels of a PTX, cubin or fatbin image.
///
/// Cheap to clone; each [`Kernel`] keeps its module loaded. The module is unloaded once the last handle is
/// gone and every launch from it has completed, on the crate's release thread (`cuModuleUnload` waits for the
/// whole device, which a user's thread must not).
#[derive(Clone)]
pub struct Module(Arc<ModuleInner>);

struct ModuleInner {
    raw: CUmodule,
    context: Context,
    /// The PTX text it was loaded from, where it was: its kernels' parameter lists are read there.
    ptx: Option<Box<str>>,
    /// Every launch of one of its kernels reads the module: it is unloaded only after them.
    track: Track,
}

// SAFETY: a CUmodule is a driver handle usable from any thread; the driver synchronizes its use.
unsafe impl Send for ModuleInner {}
// SAFETY: as above; the module is only read after loading.
unsafe impl Sync for ModuleInner {}

impl Module {
    /// Loads PTX text (as `nvcc --ptx` writes it, NUL-terminated or not) into `context`: the driver
    /// compiles it for the device. For a cubin or fatbin, see [`Module::load_binary`].
    ///
    /// Blocks while the driver loads and compiles the code, and until all work already running on the device
    /// has finished, whoever enqueued it: loading a module waits for the device (seen on an H100, driver 580,
    /// for PTX, cubins and fatbins, `CUDA_MODULE_LOADING` lazy or eager), and loads every kernel in it, so that
    /// no launch of them waits. Load modules before the work that must not be held up, not in a loop. This is
    /// the one place where the crate lets the driver wait for unrelated work on the caller's thread, because the
    /// caller asked for the module and needs it loaded.
    ///
    /// # Errors
    /// An invalid-argument error for an empty image or one that is not text (a binary image goes to
    /// [`Module::load_binary`]); the driver's (`CUDA_ERROR_INVALID_PTX`, `CUDA_ERROR_NO_BINARY_FOR_GPU`, ...).
    #[doc(alias = "cuModuleLoadData")]
    pub fn load(context: &Context, ptx: &[u8]) -> Result<Module> {
        // The driver reads PTX up to its NUL, and takes an image that starts with a binary's magic number for
        // that binary, whose length it reads from headers the crate cannot check: only text that ends at a
        // NUL within the slice is passed.
        let text = ptx.split(|&b| b == 0).next().unwrap_or_default();
        let is_text = |b: &u8| b.is_ascii_graphic() || b" \t\n\r".contains(b);
        if text.is_empty() || !text.iter().all(is_text) {
            return Err(Error::invalid(format_args!(
                "Module::load: {} is not PTX text (a cubin or fatbin loads with the unsafe Module::load_binary)",
                describe_image(ptx)
            )));
        }
        let owned = [text, &[0]].concat();
        // SAFETY: NUL-terminated text within `owned`, which the driver reads up to the NUL.
        let mut module = unsafe { Module::load_image(context, &owned, "PTX", text.len()) }?;
        let ptx = String::from_utf8_lossy(text).into();
        Arc::get_mut(&mut module.0).expect("a module just made").ptx = Some(ptx);
        Ok(module)
    }

    /// Loads a cubin or fatbin image, as nvcc writes them (`nvcc --cubin` / `--fatbin`, e.g.
    /// `include_bytes!` of what a build script compiled), into `context`. Blocks as [`Module::load`] does.
    ///
    /// # Errors
    /// An invalid-argument error for an empty image; the driver's (`CUDA_ERROR_INVALID_IMAGE`,
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU`, ...).
    ///
    /// # Safety
    /// `image` must be a whole, well-formed cubin (ELF) or fatbin as the CUDA toolkit writes them: the driver
    /// takes the image's length and the offsets of its parts from the image's own headers, and reads wherever
    /// they point, so a truncated or forged image makes it read outside the slice.
    #[doc(alias = "cuModuleLoadData")]
    pub unsafe fn load_binary(context: &Context, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(Error::invalid("Module::load_binary: the image is empty"));
        }
        // SAFETY: as the caller guarantees.
        unsafe { Module::load_image(context, image, "a binary image", image.len()) }
    }

    /// # Safety
    /// As [`calls::module_load_data`], for `image`.
    unsafe fn load_image(
        context: &Context,
        image: &[u8],
        kind: &str,
        bytes: usize,
    ) -> Result<Module> {
        let _current = context.enter()?;
        // SAFETY: as the caller guarantees; the image is read during the call only. Unloaded in ModuleInner's
        // Drop.
        let raw = unsafe { calls::module_load_data(image.as_ptr().cast()) }.map_err(|e| {
            e.context(format_args!(
                "loading a module from {kind} of {bytes} bytes"
            ))
        })?;
        Ok(Module(Arc::new(ModuleInner {
            raw,
            context: context.clone(),
            ptx: None,
            track: Track::default(),
        })))
    }

    /// The kernel named `name` (its name in the image: `extern "C"` kernels keep theirs, others are mangled).
    ///
    /// Its parameters' sizes are read from the driver (`cuFuncGetParamInfo`), so that launches are checked
    /// against them. For a module loaded from PTX the count comes from the PTX text, and no call fails. For one
    /// loaded from a binary image the driver has no call that tells the count, so the indices are asked for until
    /// it answers `CUDA_ERROR_INVALID_VALUE`: one failed call per kernel looked up, which compute-sanitizer
    /// reports as an API error (`--report-api-errors no` silences it). No other call of the crate fails in
    /// normal use.
    ///
    /// # Errors
    /// `CUDA_ERROR_NOT_FOUND` naming the kernel if the module has none of that name; an invalid-argument
    /// error for a name with a NUL; the driver's.
    #[doc(alias = "cuModuleGetFunction")]
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let c_name = CString::new(name).map_err(|_| {
            Error::invalid(format_args!(
                "Module::kernel: the name {name:?} contains a NUL"
            ))
        })?;
        let raw = calls::module_get_function(self.0.raw, &c_name).map_err(|e| {
            e.context(format_args!(
                "looking up kernel `{name}` in a module (a C++ kernel's name is mangled unless it is \
                 declared extern \"C\")"
            ))
        })?;
        let limits = Limits::of(self.context(), raw)
            .map_err(|e| e.context(format_args!("reading the attributes of kernel `{name}`")))?;
        let count = self
            .0
            .ptx
            .as_deref()
            .and_then(|ptx| ptx_param_count(ptx, name));
        let params = param_sizes(raw, count)
            .map_err(|e| e.context(format_args!("reading the parameters of kernel `{name}`")))?;
        Ok(Kernel {
            module: self.clone(),
            raw,
            name: name.into(),
            params,
            limits,
        })
    }

    /// The context the module is loaded in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// The driver's handle, valid while any clone of this module (or a kernel of it) lives.
    #[must_use]
    pub fn as_raw(&self) -> CUmodule {
        self.0.raw
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Module({:p})", self.0.raw)
    }
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        let raw = self.raw as usize;
        let unload = move || {
            // SAFETY: loaded in `Module::load`; every launch from it has completed (the release thread waits for
            // the module's tracker) and no handle to it or its kernels is left.
            unsafe { calls::module_unload(raw as CUmodule) }
        };
        let context = self.context.clone();
        // After the launches of its kernels, the captured ones included (a graph holds the module).
        release_after_graphs(&self.track, move |track| {
            release_host(&context, track, Box::new(unload), 0);
        });
    }
}

/// What an image looks like, for messages.
fn describe_image(image: &[u8]) -> String {
    const ELF: &[u8] = b"\x7fELF";
    const FATBIN: [u8; 4] = 0xBA55_ED50_u32.to_le_bytes();
    let kind = if image.starts_with(ELF) {
        "a cubin (ELF) image"
    } else if image.starts_with(&FATBIN) {
        "a fatbin image"
    } else {
        "an image"
    };
    format!("{kind} of {} bytes", image.len())
}

/// The sizes of `function`'s parameters, or `None` where the driver cannot tell (`cuFuncGetParamInfo` is
/// CUDA 12.4+). With `count` known (from the PTX), exactly those are asked for. Without it (a binary image),
/// the indices are tried until the driver answers `CUDA_ERROR_INVALID_VALUE`: the driver has no call that
/// tells the count, and that one failed call is an API error compute-sanitizer reports.
pub(crate) fn param_sizes(
    function: CUfunction,
    count: Option<usize>,
) -> Result<Option<Vec<usize>>> {
    // The parameters of a kernel fit in 32 KiB, so there are fewer than this many.
    const MOST: usize = 32 * 1024;
    let mut sizes = Vec::new();
    for index in 0..count.unwrap_or(MOST) {
        match calls::func_get_param_info(function, index) {
            Ok((_, size)) => sizes.push(size),
            // Past the last parameter: the end of the probe, or a count read wrong from the PTX (the driver
            // knows best).
            Err(e) if e.driver_code() == Some(CUresult::CUDA_ERROR_INVALID_VALUE) => break,
            Err(e)
                if e.driver_code() == Some(CUresult::CUDA_ERROR_NOT_SUPPORTED)
                    || e.driver_code().is_none() =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Some(sizes))
}

/// How many parameters the kernel `name` declares in `ptx` (the `.param` entries of its `.entry` list), or
/// `None` where the text does not say plainly (no such entry).
fn ptx_param_count(ptx: &str, name: &str) -> Option<usize> {
    let text = without_comments(ptx);
    let mut rest = text.as_str();
    loop {
        let at = rest.find(".entry")?;
        rest = &rest[at + ".entry".len()..];
        let Some(after) = rest.trim_start().strip_prefix(name) else {
            continue;
        };
        let after = after.trim_start();
        if let Some(list) = after.strip_prefix('(') {
            let list = &list[..list.find(')')?];
            return Some(list.matches(".param").count());
        }
        if after.starts_with('{') || after.starts_with('.') {
            // No parameter list: its body, or a performance directive (`.maxntid`), comes next.
            return Some(0);
        }
        // A longer name that starts with this one: look further.
    }
}
/// `ptx` with its `//` and `/* */` comments blanked out (PTX has no string literals to mind).
fn without_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    while let Some(start) = rest.find('/') {
        out.push_str(&rest[..start]);
        let from = &rest[start..];
        if from.starts_with("//") {
            rest = from.find('\n').map_or("", |end| &from[end..]);
        } else if let Some(block) = from.strip_prefix("/*") {
            rest = block.find("*/").map_or("", |end| &block[end + 2..]);
            out.push(' ');
        } else {
            out.push('/');
            rest = &from[1..];
        }
    }
    out.push_str(rest);
    out
}

/// What a launch of a kernel may ask for on its device.
#[derive(Clone, Copy, Debug)]
struct Limits {
    grid: [u32; 3],
    block: [u32; 3],
    threads_per_block: u32,
    dynamic_shared: u32,
}

impl Limits {
    fn of(context: &Context, function: CUfunction) -> Result<Limits> {
        use CUdevice_attribute as D;
        let device = context.device();
        let attribute = |a| device.attribute(a);
        let function_attribute =
            |a| calls::func_get_attribute(a, function).map(|v| u32::try_from(v).unwrap_or(0));
        Ok(Limits {
            grid: [
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ],
            block: [
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
                attribute(D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
            ],
            threads_per_block: function_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            )?,
            dynamic_shared: function_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )?,
        })
    }
}

/// A kernel of a loaded [`Module`], ready to launch with [`Stream::launch`]. Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    module: Module,
    raw: CUfunction,
    name: Arc<str>,
    /// The size of each parameter, where the driver tells.
    params: Option<Vec<usize>>,
    limits: Limits,
}

// SAFETY: a CUfunction is a driver handle usable from any thread; launching it from several is supported.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// The kernel's name, as looked up.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The size in bytes of each of the kernel's parameters, in order, where the driver tells
    /// (`cuFuncGetParamInfo`, CUDA 12.4 and later): launches are checked against them.
    #[must_use]
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// The most threads a block of this kernel may have (its registers and the device decide).
    #[must_use]
    pub fn max_threads_per_block(&self) -> u32 {
        self.limits.threads_per_block
    }

    /// The module the kernel belongs to.
    #[must_use]
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The driver's handle, valid while this kernel (or a clone) lives.
    #[must_use]
    pub fn as_raw(&self) -> CUfunction {
        self.raw
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

/// The shape of a launch: a grid of blocks of threads, and the dynamic shared memory each block gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in x, y and z.
    pub grid: [u32; 3],
    /// Threads per block in x, y and z.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_memory: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch of `grid` blocks of `block` threads, with no dynamic shared memory.
    #[must_use]
    pub fn new(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_memory: 0,
        }
    }

    /// One thread per element of `elements`, in blocks of `block` threads (the last block may be partial; at
    /// least one block).
    ///
    /// # Errors
    /// An invalid-argument error if `block` is 0 or the grid would need more than `u32::MAX` blocks.
    pub fn for_elements(elements: usize, block: u32) -> Result<LaunchConfig> {
        if block == 0 {
            return Err(Error::invalid(
                "LaunchConfig::for_elements: a block of 0 threads",
            ));
        }
        let blocks = elements.div_ceil(block as usize).max(1);
        let grid = u32::try_from(blocks).map_err(|_| {
            Error::invalid(format_args!(
                "LaunchConfig::for_elements: {elements} elements need {blocks} blocks of {block}, more than a \
                 grid's x dimension holds; use a grid-stride loop"
            ))
        })?;
        Ok(LaunchConfig::new(grid, block))
    }

    /// Checks the launch against the kernel's and device's limits.
    fn check(&self, kernel: &Kernel) -> Result<()> {
        let limits = &kernel.limits;
        let within = |dims: [u32; 3], max: [u32; 3]| {
            dims.iter().zip(max).all(|(&d, m)| (1..=m).contains(&d))
        };
        let threads = self.block.iter().map(|&d| u64::from(d)).product::<u64>();
        if within(self.grid, limits.grid)
            && within(self.block, limits.block)
            && threads <= u64::from(limits.threads_per_block)
            && self.shared_memory <= limits.dynamic_shared
        {
            return Ok(());
        }
        self.refuse(kernel)
    }

    /// What [`LaunchConfig::check`] found over a limit, as an error (or nothing, where a raised shared-memory
    /// limit allows the launch after all).
    #[cold]
    fn refuse(&self, kernel: &Kernel) -> Result<()> {
        let limits = &kernel.limits;
        let name = &kernel.name;
        let fail = |what: String| {
            Err(Error::invalid(format_args!(
                "launching `{name}` with grid {:?} and block {:?}: {what}; nothing was enqueued",
                self.grid, self.block
            )))
        };
        if self.grid.contains(&0) || self.block.contains(&0) {
            return fail("every dimension must be at least 1".into());
        }
        for axis in 0..3 {
            let xyz = ["x", "y", "z"][axis];
            if self.block[axis] > limits.block[axis] {
                return fail(format!(
                    "the block's {xyz} is over the device's {}",
                    limits.block[axis]
                ));
            }
            if self.grid[axis] > limits.grid[axis] {
                return fail(format!(
                    "the grid's {xyz} is over the device's {}",
                    limits.grid[axis]
                ));
            }
        }
        let threads = self.block.iter().map(|&d| u64::from(d)).product::<u64>();
        if threads > u64::from(limits.threads_per_block) {
            return fail(format!(
                "{threads} threads per block, over the kernel's limit of {}",
                limits.threads_per_block
            ));
        }
        // The limit read at lookup may have been raised since (cuFuncSetAttribute on `Kernel::as_raw`): read it
        // again before refusing.
        let over_limit = self.shared_memory > limits.dynamic_shared
            && calls::func_get_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.raw,
            )
            .map_or(true, |now| i64::from(self.shared_memory) > i64::from(now));
        if over_limit {
            return fail(format!(
                "{} bytes of dynamic shared memory, over the kernel's limit of {} (raise it with \
                 cuFuncSetAttribute and CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                self.shared_memory, limits.dynamic_shared
            ));
        }
        Ok(())
    }
}

/// Where a buffer of a [`Use`] lives.
#[derive(Clone, Copy, Debug)]
enum Place<'a> {
    /// Device memory of a context.
    Device(CUdeviceptr, &'a Context),
    /// Page-locked host memory, reached by the device through its mapping.
    Host(*mut c_void),
    /// The code of a loaded module, which work launched from it reads.
    Module(&'a Context),
}

/// A buffer that device work reads or writes, as declared to the tracking: a [`Stream::launch`] argument
/// (through [`Arg`]), or what other code's work uses ([`Stream::enqueue_foreign`]).
///
/// Made from the buffer's borrow, shared for a read and exclusive for a write, so the declaration cannot
/// outlive the buffer nor overlap a host borrow of it.
pub struct Use<'a> {
    place: Place<'a>,
    bytes: usize,
    track: &'a Track,
    access: Access,
}

impl<'a> Use<'a> {
    /// Device memory that the work reads.
    pub fn read<T>(buffer: &'a impl DeviceSource<T>) -> Use<'a> {
        Use::device(buffer, Access::Read, size_of::<T>())
    }

    /// Device memory that the work writes (and may read).
    pub fn write<T: Pod>(buffer: &'a mut impl DeviceDestination<T>) -> Use<'a> {
        Use::device(&*buffer, Access::Write, size_of::<T>())
    }

    /// Page-locked host memory that the work reads through its device mapping (allocated with
    /// [`PinnedBuilder::device_mapped`](crate::PinnedBuilder::device_mapped), or any pinned memory on a
    /// system with unified addressing).
    pub fn read_host<T>(buffer: &'a impl PinnedSource<T>) -> Use<'a> {
        Use::host(buffer, Access::Read, size_of::<T>())
    }

    /// Page-locked host memory that the work writes through its device mapping: host accessors wait for it.
    pub fn write_host<T: Pod>(buffer: &'a mut impl PinnedDestination<T>) -> Use<'a> {
        Use::host(&*buffer, Access::Write, size_of::<T>())
    }

    /// The code of `module`, which a kernel of it launched through its raw handle (inside
    /// [`Stream::enqueue_foreign`]) reads: the module stays loaded until that work has run.
    pub fn module(module: &'a Module) -> Use<'a> {
        Use {
            place: Place::Module(module.context()),
            bytes: 0,
            track: &module.0.track,
            access: Access::Read,
        }
    }

    fn device(buffer: &'a impl sealed::DeviceMemory, access: Access, element: usize) -> Use<'a> {
        Use {
            place: Place::Device(buffer.device_ptr(), buffer.owner()),
            bytes: buffer.elements() * element,
            track: buffer.track(),
            access,
        }
    }

    fn host(buffer: &'a impl sealed::PinnedMemory, access: Access, element: usize) -> Use<'a> {
        Use {
            place: Place::Host(buffer.host_ptr()),
            bytes: buffer.elements() * element,
            track: buffer.track(),
            access,
        }
    }

    /// The device address of device memory; `None` for host memory (whose device address the launch looks
    /// up in the stream's context).
    #[must_use]
    pub fn device_ptr(&self) -> Option<CUdeviceptr> {
        match self.place {
            Place::Device(ptr, _) => Some(ptr),
            Place::Host(_) | Place::Module(_) => None,
        }
    }

    /// The size in bytes of the memory used.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Whether the work writes the memory.
    #[must_use]
    pub fn is_write(&self) -> bool {
        self.access == Access::Write
    }

    /// Checks that device memory belongs to `stream`'s context.
    fn check_context(&self, stream: &Stream, what: impl FnOnce() -> String) -> Result<()> {
        match self.place {
            Place::Device(_, owner) if owner != stream.context() => {
                Err(Error::invalid(format_args!(
                    "{}: a buffer of device {} used on a stream of device {}; nothing was enqueued",
                    what(),
                    owner.device().ordinal(),
                    stream.context().device().ordinal()
                )))
            }
            Place::Module(owner) if owner != stream.context() => Err(Error::invalid(format_args!(
                "{}: a module loaded on device {} declared on a stream of device {}; nothing was enqueued",
                what(),
                owner.device().ordinal(),
                stream.context().device().ordinal()
            ))),
            _ => Ok(()),
        }
    }

    /// The address the device sees, looked up in the current context for host memory.
    fn address(&self, kernel: &str) -> Result<CUdeviceptr> {
        match self.place {
            Place::Device(ptr, _) => Ok(ptr),
            // Nothing to look up, and nothing the kernel may touch: an empty buffer passes a null pointer.
            Place::Host(_) if self.bytes == 0 => Ok(0),
            Place::Module(_) => Ok(0),
            Place::Host(host) => calls::mem_host_get_device_pointer(host).map_err(|e| {
                e.context(format_args!(
                    "passing page-locked host memory to `{kernel}`: it is not mapped into the device's address \
                     space (allocate it with PinnedBuilder::device_mapped(true))"
                ))
            }),
        }
    }
}

impl fmt::Debug for Use<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Use")
            .field("place", &self.place)
            .field("bytes", &self.bytes)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// An argument of a kernel launch: a buffer and how the kernel uses it, or a value passed by copy.
#[derive(Debug)]
pub struct Arg<'a>(ArgKind<'a>);

#[derive(Debug)]
enum ArgKind<'a> {
    Value(&'a [u8]),
    Memory(Use<'a>),
}

impl<'a> Arg<'a> {
    /// A pointer to device memory that the kernel reads (`const T*`).
    pub fn read<T>(buffer: &'a impl DeviceSource<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::read(buffer)))
    }

    /// A pointer to device memory that the kernel writes (`T*`).
    pub fn write<T: Pod>(buffer: &'a mut impl DeviceDestination<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::write(buffer)))
    }

    /// A pointer to mapped page-locked host memory that the kernel reads ([`Use::read_host`]).
    pub fn read_host<T>(buffer: &'a impl PinnedSource<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::read_host(buffer)))
    }

    /// A pointer to mapped page-locked host memory that the kernel writes ([`Use::write_host`]).
    pub fn write_host<T: Pod>(buffer: &'a mut impl PinnedDestination<T>) -> Arg<'a> {
        Arg(ArgKind::Memory(Use::write_host(buffer)))
    }

    /// A value passed by copy (a scalar or a `#[repr(C)]` struct of the parameter's type).
    pub fn value<T: Pod>(value: &'a T) -> Arg<'a> {
        Arg(ArgKind::Value(bytemuck::bytes_of(value)))
    }

    /// The size in bytes the argument takes in the kernel's parameters.
    fn size(&self) -> usize {
        match &self.0 {
            ArgKind::Value(bytes) => bytes.len(),
            ArgKind::Memory(_) => size_of::<CUdeviceptr>(),
        }
    }
}

impl<'a> From<Use<'a>> for Arg<'a> {
    fn from(used: Use<'a>) -> Arg<'a> {
        Arg(ArgKind::Memory(used))
    }
}

impl Stream {
    /// Enqueues `kernel` on this stream with `args`, after any conflicting work on its buffers from other
    /// streams (device-side waits), and records what it reads and writes: later work and host accessors wait
    /// for it, and its buffers are freed only once it has completed. Returns at once.
    ///
    /// # Errors
    /// An invalid-argument error, with nothing enqueued, for a kernel or buffer of another context, a number
    /// or size of arguments that differs from the kernel's parameters (where the driver tells them), or a
    /// grid, block or shared-memory size over the kernel's or device's limits; host memory that is not
    /// mapped; the driver's launch error.
    ///
    /// # Safety
    /// The kernel's parameters must have the types of `args`, in order (a buffer argument is a pointer to its
    /// element type), and the kernel must touch only the memory of its buffer arguments, within their bounds,
    /// writing only those passed with [`Arg::write`] / [`Arg::write_host`], and finish (no waiting on other
    /// work that could wait on it).
    #[doc(alias = "cuLaunchKernel")]
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        config: LaunchConfig,
        args: &[Arg<'_>],
    ) -> Result<()> {
        config.check(kernel)?;
        let context = self.context();
        let sizes = kernel.params.as_deref();
        if sizes.is_some_and(|sizes| sizes.len() != args.len())
            || kernel.module.context() != context
        {
            return Err(self.refuse_launch(kernel, args));
        }
        // One pass checks each argument, collects the buffers' uses and points each parameter at its value (a
        // value argument's bytes, a device buffer's address inside its `Arg`); host buffers' addresses are
        // looked up after. The uses and parameters stay on the stack for up to INLINE of each.
        //
        // The module is unloaded on the release thread, once the device is idle: no kernel of it runs then on a
        // stream the crate made, which the thread sees until its work is done even after its last handle drops.
        // A stream of other code's is seen only while a handle lives, so a launch there records a read of the
        // module, whose tracker then keeps the handle until the kernel has run.
        let mut uses: SmallVec<[(&Track, Access); INLINE]> = SmallVec::new();
        if !self.is_owned() {
            uses.push((&kernel.module.0.track, Access::Read));
        }
        let (mut inline_params, mut heap_params) = ([std::ptr::null_mut(); INLINE], Vec::new());
        let params: &mut [*mut c_void] = if args.len() <= INLINE {
            &mut inline_params[..args.len()]
        } else {
            heap_params.resize(args.len(), std::ptr::null_mut());
            &mut heap_params
        };
        let mut host = 0;
        for (index, (param, arg)) in params.iter_mut().zip(args).enumerate() {
            if sizes.is_some_and(|sizes| sizes[index] != arg.size()) {
                return Err(self.refuse_launch(kernel, args));
            }
            match &arg.0 {
                ArgKind::Value(bytes) => *param = bytes.as_ptr().cast_mut().cast(),
                ArgKind::Memory(used) => {
                    match &used.place {
                        Place::Device(address, owner) if *owner == context => {
                            *param = std::ptr::from_ref(address).cast_mut().cast();
                        }
                        Place::Host(_) => host += 1,
                        Place::Device(..) | Place::Module(_) => {
                            return Err(self.refuse_launch(kernel, args));
                        }
                    }
                    uses.push((used.track, used.access));
                }
            }
        }
        // Host memory's device address is looked up in the stream's context, into a list that does not move
        // once the parameters point into it.
        let mut host_addresses: SmallVec<[CUdeviceptr; 4]> = SmallVec::new();
        if host > 0 {
            let _current = context.enter()?;
            for arg in args {
                if let ArgKind::Memory(
                    used @ Use {
                        place: Place::Host(_),
                        ..
                    },
                ) = &arg.0
                {
                    host_addresses.push(used.address(&kernel.name)?);
                }
            }
            let mut next = host_addresses.iter();
            for (param, arg) in params.iter_mut().zip(args) {
                if let ArgKind::Memory(Use {
                    place: Place::Host(_),
                    ..
                }) = &arg.0
                {
                    let address = next.next().expect("one address per host buffer");
                    *param = std::ptr::from_ref(address).cast_mut().cast();
                }
            }
        }
        let work = Work::Timed(Category::Kernel, "kernel", 0);
        // What each parameter is, for a capture (`Graph::replace` moves only the pointers to the buffer it
        // replaces, and values); read only while the stream captures.
        let capturing = self.is_capturing();
        let kinds: SmallVec<[Option<usize>; INLINE]> = if capturing {
            args.iter()
                .map(|arg| match &arg.0 {
                    ArgKind::Value(_) => None,
                    ArgKind::Memory(used) => Some(used.track.key()),
                })
                .collect()
        } else {
            SmallVec::new()
        };
        let kinds = capturing.then_some(&kinds[..]);
        self.tracked_uses_holding(context.enqueue_launch(), work, &mut uses, kinds, || {
            // SAFETY: one pointer per parameter, each to a value of its size (checked against the driver's
            // parameter info where it has it) that outlives the call; the kernel's types and footprint are the
            // caller's promise; the trackers ordered the launch after conflicting work and keep its buffers
            // (and the module) alive until it completes; kernel and stream are of one context (checked).
            unsafe {
                calls::launch_kernel(
                    kernel.raw,
                    config.grid,
                    config.block,
                    config.shared_memory,
                    self.as_raw(),
                    params,
                )
            }
        })
        .map_err(|e| e.context(format_args!("launching `{}`", kernel.name)))
    }

    /// What [`Stream::launch`] found wrong with its kernel or arguments, as an error.
    #[cold]
    fn refuse_launch(&self, kernel: &Kernel, args: &[Arg<'_>]) -> Error {
        // Built only for a message: the happy path allocates nothing here.
        let what = || format!("launching `{}`", kernel.name);
        if kernel.module.context() != self.context() {
            return Error::invalid(format_args!(
                "{}: the kernel's module is loaded on device {} and the stream is of device {}; load it \
                 into the stream's context; nothing was enqueued",
                what(),
                kernel.module.context().device().ordinal(),
                self.context().device().ordinal()
            ));
        }
        if let Some(params) = &kernel.params {
            if params.len() != args.len() {
                return Error::invalid(format_args!(
                    "{}: {} arguments for {} parameters; nothing was enqueued",
                    what(),
                    args.len(),
                    params.len()
                ));
            }
            for (index, (arg, &size)) in args.iter().zip(params).enumerate() {
                if arg.size() != size {
                    return Error::invalid(format_args!(
                        "{}: argument {index} is {} bytes and the parameter {size}; nothing was enqueued",
                        what(),
                        arg.size()
                    ));
                }
            }
        }
        for (index, arg) in args.iter().enumerate() {
            if let ArgKind::Memory(used) = &arg.0 {
                if let Place::Module(_) = used.place {
                    return Error::invalid(format_args!(
                        "{}: argument {index} is a module, not a buffer (a launch of a kernel declares its module \
                         itself); nothing was enqueued",
                        what()
                    ));
                }
                if let Err(e) = used.check_context(self, what) {
                    return e;
                }
            }
        }
        Error::invalid(format_args!(
            "{}: the arguments do not match the kernel; nothing was enqueued",
            what()
        ))
    }

    /// Runs `enqueue`, which enqueues other code's work (a library call, a kernel launched through another
    /// crate) on this stream through its raw handle, and declares what that work reads and writes: it waits on
    /// the device for conflicting work of other streams first, and later work, host accessors and frees wait
    /// for it, exactly as for the crate's own copies. Returns `enqueue`'s value once it returns (the work
    /// itself runs on the device later).
    ///
    /// `enqueue` runs with the stream's context current on the calling thread (the thread's own, if any, is
    /// current again once this returns), so that calls taking their context from the thread find the stream's,
    /// and with no lock of the crate held: it may call the crate (the declared buffers are borrowed by `uses`,
    /// so only reads of those declared read). The uses are recorded once it returns, or
    /// unwinds: work it enqueued before a panic is waited for all the same. A [`Graph`](crate::Graph) that
    /// uses a declared buffer (without borrowing it) and whose launch would conflict with a declared use is
    /// refused with an `Err` until `enqueue` has returned, on any thread: where that work will stand on the
    /// stream is not known before. The uses are recorded even where
    /// `enqueue` enqueued nothing (it failed before its first call, say): the crate cannot tell, so later work
    /// on those buffers, their frees and host access then wait for this stream's work up to this point, which
    /// may be more than they needed (never less). A stream's ledger ([`Stream::with_ledger`]) does not time
    /// this work; wrap it in [`Stream::profile`] for that.
    ///
    /// # Errors
    /// An invalid-argument error, with `enqueue` not run, for device memory or a module of another context;
    /// the driver's, from ordering the work (`enqueue` is not run then, or, for an error while recording the
    /// order of what came before, nothing of it is lost: the uses are still recorded).
    ///
    /// # Safety
    /// The work `enqueue` enqueues must be on the stream it is given, and on no other stream; it must touch
    /// only the memory declared in `uses`, within its bounds, writing only what is declared written (and only
    /// valid values of the buffer's element type); it must finish on its own (not wait for work that waits for
    /// it, nor for a value or event nobody will write); and `enqueue` must not begin or end a stream capture
    /// (`cuStreamBeginCapture`), which would take the work off the stream while the crate counts on it. A
    /// kernel of a [`Module`] launched through its raw handle is declared with [`Use::module`], so that the
    /// module stays loaded until it has run.
    pub unsafe fn enqueue_foreign<R>(
        &self,
        uses: &[Use<'_>],
        enqueue: impl FnOnce(CUstream) -> R,
    ) -> Result<R> {
        for used in uses {
            used.check_context(self, || "declaring other code's work".into())?;
        }
        let mut tracks: SmallVec<[(&Track, Access); INLINE]> =
            uses.iter().map(|u| (u.track, u.access)).collect();
        self.declared(&mut tracks, || enqueue(self.as_raw()))
            .map_err(|e| e.context("declaring other code's work"))
    }
}

#[cfg(test)]
mod tests {
    use super::ptx_param_count;

    #[test]
    fn a_kernels_parameters_are_counted_in_its_ptx_entry() {
        let ptx = "\
.version 8.0
.target sm_75
// .entry scale(.param .u32 n) was the old signature
/* .entry tuned( .param .u64 x ) */
.visible .entry scale_all(
    .param .u64 x
)
{ ret; }
.visible .entry scale(
    .param .u64 .ptr .global .align 4 x,
    .param .u64 y, // the output (written)
    .param .align 8 .b8 pair[16], /* a struct ) by value */
    .param .u32 n
)
{ ret; }
.entry empty
{ ret; }
.entry tuned .maxntid 256, 1, 1
{ ret; }
";
        assert_eq!(ptx_param_count(ptx, "scale"), Some(4));
        assert_eq!(ptx_param_count(ptx, "scale_all"), Some(1));
        assert_eq!(ptx_param_count(ptx, "empty"), Some(0));
        assert_eq!(ptx_param_count(ptx, "tuned"), Some(0));
        assert_eq!(ptx_param_count(ptx, "absent"), None);
        assert_eq!(ptx_param_count(ptx, "sca"), None);
    }
}
