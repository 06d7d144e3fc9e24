//! Modules of users' kernels, loaded from PTX, cubin or fatbin images, and their kernels: what a launch checks its
//! arguments against (the parameters' sizes, read from the driver and counted in the PTX).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

use super::config::Limits;
use crate::driver::{Context, calls};
use crate::error::{Error, Result};
use crate::memory::{Track, release_after_graphs, release_host};
use crate::sys::{CUfunction, CUmodule, CUresult};

/// A module loaded into a context: the kernels of a PTX, cubin or fatbin image.
///
/// Cheap to clone; each [`Kernel`] keeps its module loaded. The module is unloaded once the last handle is
/// gone and every launch from it has completed, on the crate's release thread (`cuModuleUnload` waits for the
/// whole device, which a user's thread must not).
#[derive(Clone)]
pub struct Module(pub(super) Arc<ModuleInner>);

pub(super) struct ModuleInner {
    pub(super) raw: CUmodule,
    pub(super) context: Context,
    /// The PTX text it was loaded from, where it was: its kernels' parameter lists are read there.
    pub(super) ptx: Option<Box<str>>,
    /// Every launch of one of its kernels reads the module: it is unloaded only after them.
    pub(super) track: Track,
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
pub(super) fn describe_image(image: &[u8]) -> String {
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
pub(super) fn ptx_param_count(ptx: &str, name: &str) -> Option<usize> {
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
pub(super) fn without_comments(ptx: &str) -> String {
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

/// A kernel of a loaded [`Module`], ready to launch with [`Stream::launch`](crate::Stream::launch). Cheap to clone.
#[derive(Clone)]
pub struct Kernel {
    pub(super) module: Module,
    pub(super) raw: CUfunction,
    pub(super) name: Arc<str>,
    /// The size of each parameter, where the driver tells.
    pub(super) params: Option<Vec<usize>>,
    pub(super) limits: Limits,
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
