//! Finding and opening libcuda and libcudart at run time.
//!
//! The driver is required and opened once per process, on first use; the runtime is optional and opened
//! the same way, separately, so that only the functions that need it fail where it is absent.

use std::ffi::{CStr, OsStr, OsString, c_char};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Library, LoadAttempt, Result};
use crate::{CUDA_VERSION, CUresult, DriverApi, RuntimeApi, cudaError_t};

/// Where the driver is looked for, in order, unless `CUDA_PINNED_LIBCUDA` names one.
const DRIVER_NAMES: &[&str] = if cfg!(windows) {
    &["nvcuda.dll"]
} else {
    &[
        "libcuda.so.1",
        "libcuda.so",
        "/usr/lib/wsl/lib/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ]
};

/// Where the runtime is looked for, in order, unless `CUDA_PINNED_LIBCUDART` names one. Its host-memory
/// functions have the same ABI in CUDA 12 and 13.
const RUNTIME_NAMES: &[&str] = if cfg!(windows) {
    &["cudart64_13.dll", "cudart64_12.dll"]
} else {
    &[
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so",
        "/usr/local/cuda/lib64/libcudart.so.13",
        "/usr/local/cuda/lib64/libcudart.so.12",
    ]
};

/// The loaded CUDA driver: its function table, where it came from and the CUDA version it supports.
///
/// Reached through [`driver()`]; lives for the rest of the process.
pub struct Driver {
    api: DriverApi,
    path: String,
    version: i32,
}

/// The loaded CUDA runtime library: its function table and where it came from. Reached through [`runtime()`].
pub struct Runtime {
    api: RuntimeApi,
    path: String,
}

/// The process-wide driver: on first call, finds and opens libcuda, runs `cuInit` and checks that the driver
/// supports the CUDA version the bindings were generated from. Later calls return the same table, or the same
/// error.
///
/// The library tried is, in order of precedence: the one chosen with [`use_library`]; the one the
/// environment variable `CUDA_PINNED_LIBCUDA` names, when it is set (even to an empty value, which fails to
/// load): a driver chosen by name, such as a test double, is never silently replaced by another one; else the
/// first of `libcuda.so.1`, `libcuda.so`, `/usr/lib/wsl/lib/libcuda.so.1` (WSL) and
/// `/usr/local/nvidia/lib64/libcuda.so.1` (containers) that loads; `nvcuda.dll` on Windows.
///
/// # Errors
/// [`Error::Load`] listing every path tried with the loader's message for each, where no library loads that
/// exports `cuInit` (in a test binary, or beside a build of the simulated driver, it also says how to run on
/// that instead); [`Error::Driver`] if `cuInit` fails (as with `CUDA_ERROR_NO_DEVICE` on a machine with a
/// driver but no GPU); [`Error::DriverTooOld`] if the driver supports an older CUDA than the bindings.
#[doc(alias = "cuInit")]
pub fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(|| Driver::load(&candidates(Library::Driver)))
        .as_ref()
        .map_err(Clone::clone)
}

/// The process-wide CUDA runtime library, found like the driver: [`use_library`], else
/// `CUDA_PINNED_LIBCUDART` when set, else `libcudart.so.13`, `libcudart.so.12`, `libcudart.so`, then
/// `/usr/local/cuda/lib64`.
///
/// # Errors
/// [`Error::Load`] listing every path tried, where none loads that exports `cudaHostAlloc`.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(|| Runtime::load(&candidates(Library::Runtime)))
        .as_ref()
        .map_err(Clone::clone)
}

static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
static RUNTIME: OnceLock<Result<Runtime>> = OnceLock::new();
/// The libraries chosen by [`use_library`]: driver, runtime.
static CHOSEN: Mutex<[Option<OsString>; 2]> = Mutex::new([None, None]);

/// Chooses the one library [`driver()`] (or [`runtime()`]) opens, over `CUDA_PINNED_LIBCUDA`
/// (`CUDA_PINNED_LIBCUDART`) and the default search: a test double such as a simulated driver, or a driver
/// outside the loader's path. It takes effect only before the library is first loaded; choosing the path
/// already loaded again is `Ok`.
///
/// # Errors
/// [`Error::AlreadyLoaded`] if the process has already opened another library (or failed to), which stays the
/// one in use.
pub fn use_library(library: Library, path: impl Into<OsString>) -> Result<()> {
    let path = path.into();
    let mut chosen = CHOSEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let loaded = match library {
        Library::Driver => DRIVER.get().map(|d| d.as_ref().map(|d| d.path.clone())),
        Library::Runtime => RUNTIME.get().map(|r| r.as_ref().map(|r| r.path.clone())),
    };
    match loaded {
        None => {
            chosen[library as usize] = Some(path);
            Ok(())
        }
        Some(Ok(loaded)) if OsStr::new(&loaded) == path => Ok(()),
        Some(loaded) => Err(Error::AlreadyLoaded {
            library,
            loaded: loaded.ok(),
            requested: path.to_string_lossy().into_owned(),
        }),
    }
}

/// The names to try for `library`, each with where it was named: the one chosen by [`use_library`], else the
/// override variable's value alone if it is set, else the defaults.
fn candidates(library: Library) -> Vec<(OsString, Option<&'static str>)> {
    let chosen = CHOSEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())[library as usize]
        .clone();
    if let Some(path) = chosen {
        return vec![(path, Some("use_library"))];
    }
    let var = library.override_var();
    if let Some(path) = std::env::var_os(var) {
        return vec![(path, Some(var))];
    }
    let defaults = match library {
        Library::Driver => DRIVER_NAMES,
        Library::Runtime => RUNTIME_NAMES,
    };
    defaults
        .iter()
        .map(|name| (OsString::from(name), None))
        .collect()
}

/// Opens the first candidate that loads and passes `is_library`; the attempts made, if none does.
/// Each candidate comes with the variable that named it, if any, for the error message.
fn open_first<T>(
    library: Library,
    candidates: &[(OsString, Option<&'static str>)],
    open: impl Fn(&OsStr) -> std::result::Result<T, libloading::Error>,
    is_library: impl Fn(&T) -> bool,
) -> Result<(T, String)> {
    let mut attempts = Vec::new();
    for (name, var) in candidates {
        let mut path = if name.is_empty() {
            "\"\"".to_string()
        } else {
            name.to_string_lossy().into_owned()
        };
        if let Some(var) = var {
            path.push_str(&format!(" (from {var})"));
        }
        if name.is_empty() {
            attempts.push(LoadAttempt {
                path,
                reason: "an empty name: unset the variable to search the standard places, or name a library"
                    .to_string(),
            });
            continue;
        }
        match open(name) {
            Ok(api) if is_library(&api) => return Ok((api, name.to_string_lossy().into_owned())),
            Ok(_) => {
                let reason = match library {
                    Library::Driver => {
                        "loaded, but it is not the CUDA driver: it exports no cuInit"
                    }
                    Library::Runtime => {
                        "loaded, but it is not the CUDA runtime: it exports no cudaHostAlloc"
                    }
                };
                attempts.push(LoadAttempt {
                    path,
                    reason: reason.to_string(),
                });
            }
            Err(e) => {
                // dlerror() starts its message with the name again: say it once.
                let reason = e.to_string();
                let name = name.to_string_lossy();
                let reason = reason
                    .strip_prefix(&*name)
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(&reason);
                attempts.push(LoadAttempt {
                    path,
                    reason: reason.to_string(),
                });
            }
        }
    }
    // A library chosen with `use_library` (as the simulator's `install` does) was chosen in the program: no hint
    // of how to choose one.
    let chosen = candidates
        .iter()
        .any(|(_, var)| *var == Some("use_library"));
    let hint = if chosen {
        None
    } else {
        crate::sim_hint::simulator_hint_here(library)
    };
    Err(Error::Load {
        library,
        attempts,
        hint,
    })
}

impl Driver {
    /// Opens the first of `candidates` that is a CUDA driver, initialises it and checks its version.
    fn load(candidates: &[(OsString, Option<&'static str>)]) -> Result<Driver> {
        let (api, path) = open_first(
            Library::Driver,
            candidates,
            // SAFETY: opening a library runs its initialisers. Every candidate is named either by the user
            // (CUDA_PINNED_LIBCUDA) or by the fixed list of the driver's standard locations, whose
            // initialisers are the driver's own.
            |name| unsafe { DriverApi::new(name) },
            |api| api.cuInit.is_ok(),
        )?;
        let mut driver = Driver {
            api,
            path,
            version: 0,
        };
        let init = driver.function(&driver.api.cuInit, "cuInit")?;
        // SAFETY: cuInit takes one flags word, which must be 0.
        driver.check(unsafe { init(0) }, "cuInit").map_err(|e| {
            e.while_doing(format!(
                "initialising the CUDA driver loaded from {}",
                driver.path
            ))
        })?;
        let get_version = driver.function(&driver.api.cuDriverGetVersion, "cuDriverGetVersion")?;
        let mut version = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
        driver.check(unsafe { get_version(&mut version) }, "cuDriverGetVersion")?;
        let bindings_version = CUDA_VERSION as i32;
        if version < bindings_version {
            return Err(Error::DriverTooOld {
                path: driver.path,
                driver_version: version,
                bindings_version,
            });
        }
        driver.version = version;
        Ok(driver)
    }

    /// The generated function table. Each field is the function, or an `Err` where the driver lacks it: take
    /// it with [`Driver::function`]. (The generated methods of the same names panic where it is missing.)
    #[must_use]
    pub fn api(&self) -> &DriverApi {
        &self.api
    }

    /// The name or path the driver was loaded from, as given to the system's loader.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The CUDA version the driver supports, from `cuDriverGetVersion`: `1000 * major + 10 * minor`.
    #[doc(alias = "cuDriverGetVersion")]
    #[must_use]
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The function in `field` of [`Driver::api`], named `name` for the error.
    ///
    /// # Errors
    /// [`Error::MissingFunction`] where the loaded driver does not export it (it is older than the function).
    pub fn function<F: Copy>(
        &self,
        field: &std::result::Result<F, libloading::Error>,
        name: &'static str,
    ) -> Result<F> {
        resolve(field, Library::Driver, &self.path, name)
    }

    /// `Ok` for `CUDA_SUCCESS`; otherwise the error for `code`, returned by `function`, with the driver's own
    /// name and description of the code.
    ///
    /// # Errors
    /// [`Error::Driver`] for any code but `CUDA_SUCCESS`.
    #[inline]
    pub fn check(&self, code: CUresult, function: &'static str) -> Result<()> {
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(code, function))
        }
    }

    #[cold]
    fn error(&self, code: CUresult, function: &'static str) -> Error {
        let name = driver_text(&self.api.cuGetErrorName, code);
        let description = driver_text(&self.api.cuGetErrorString, code);
        Error::from_driver_parts(code, name, description, function)
    }
}

/// The function in a table field, or the error saying the library at `path` lacks it.
fn resolve<F: Copy>(
    field: &std::result::Result<F, libloading::Error>,
    library: Library,
    path: &str,
    function: &'static str,
) -> Result<F> {
    field.as_ref().copied().map_err(|_| Error::MissingFunction {
        library,
        path: path.to_string(),
        function,
    })
}

type DriverDescribe = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;
type RuntimeDescribe = unsafe extern "C" fn(cudaError_t) -> *const c_char;

/// What `cuGetErrorName` or `cuGetErrorString` (in `field`) says of `code`; `None` where it has nothing.
fn driver_text(
    field: &std::result::Result<DriverDescribe, libloading::Error>,
    code: CUresult,
) -> Option<&CStr> {
    let describe = field.as_ref().ok()?;
    let mut ptr = std::ptr::null();
    // SAFETY: both functions write one pointer through a valid pointer, for any code.
    if unsafe { describe(code, &mut ptr) } != CUresult::CUDA_SUCCESS || ptr.is_null() {
        return None;
    }
    // SAFETY: on success the pointer is to a NUL-terminated string in the driver's static data, mapped while
    // the library is loaded: at least as long as the table that `field` borrows from.
    Some(unsafe { CStr::from_ptr(ptr) })
}

/// What `cudaGetErrorName` or `cudaGetErrorString` (in `field`) says of `code`.
fn runtime_text(
    field: &std::result::Result<RuntimeDescribe, libloading::Error>,
    code: cudaError_t,
) -> Option<&CStr> {
    let describe = field.as_ref().ok()?;
    // SAFETY: both functions take any code and return null or a pointer to a static NUL-terminated string.
    let ptr = unsafe { describe(code) };
    // SAFETY: non-null, it points into the runtime's static data, mapped as long as the table `field` is in.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) })
}

impl Runtime {
    fn load(candidates: &[(OsString, Option<&'static str>)]) -> Result<Runtime> {
        let (api, path) = open_first(
            Library::Runtime,
            candidates,
            // SAFETY: as for the driver: the candidates are the user's choice or the runtime's standard names.
            |name| unsafe { RuntimeApi::new(name) },
            |api| api.cudaHostAlloc.is_ok(),
        )?;
        Ok(Runtime { api, path })
    }

    /// The generated function table; take a function from it with [`Runtime::function`].
    #[must_use]
    pub fn api(&self) -> &RuntimeApi {
        &self.api
    }

    /// The name or path the runtime was loaded from.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The function in `field` of [`Runtime::api`], named `name` for the error.
    ///
    /// # Errors
    /// [`Error::MissingFunction`] where the loaded runtime does not export it.
    pub fn function<F: Copy>(
        &self,
        field: &std::result::Result<F, libloading::Error>,
        name: &'static str,
    ) -> Result<F> {
        resolve(field, Library::Runtime, &self.path, name)
    }

    /// `Ok` for `cudaSuccess`; otherwise the error for `code`, returned by `function`, in the runtime's words.
    ///
    /// # Errors
    /// [`Error::Runtime`] for any code but `cudaSuccess`.
    #[inline]
    pub fn check(&self, code: cudaError_t, function: &'static str) -> Result<()> {
        if code == cudaError_t::cudaSuccess {
            Ok(())
        } else {
            Err(self.error(code, function))
        }
    }

    #[cold]
    fn error(&self, code: cudaError_t, function: &'static str) -> Error {
        let name = runtime_text(&self.api.cudaGetErrorName, code);
        let description = runtime_text(&self.api.cudaGetErrorString, code);
        Error::from_runtime_parts(code, name, description, function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_hint::{is_test_binary, simulator_hint_here};

    fn named(paths: &[&str]) -> Vec<(OsString, Option<&'static str>)> {
        paths.iter().map(|p| (OsString::from(p), None)).collect()
    }

    fn load_attempts(result: Result<impl Sized>) -> Vec<LoadAttempt> {
        match result {
            Err(Error::Load { attempts, .. }) => attempts,
            Err(other) => panic!("expected a load error, got: {other}"),
            Ok(_) => panic!("expected a load error, but the library loaded"),
        }
    }

    #[test]
    fn missing_path_is_a_load_error_naming_it() {
        let attempts = load_attempts(Driver::load(&named(&[
            "/nonexistent/cuda-pinned-test/libcuda.so.1",
        ])));
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            attempts[0].path,
            "/nonexistent/cuda-pinned-test/libcuda.so.1"
        );
        assert!(!attempts[0].reason.is_empty());
    }

    #[test]
    fn a_file_that_is_no_library_is_a_load_error() {
        let path = std::env::temp_dir().join(format!(
            "cuda-pinned-not-a-library-{}.so",
            std::process::id()
        ));
        std::fs::write(&path, b"this is text, not a shared library\n").unwrap();
        let result = Driver::load(&named(&[path.to_str().unwrap()]));
        std::fs::remove_file(&path).unwrap();
        let attempts = load_attempts(result);
        assert_eq!(attempts.len(), 1);
        assert!(attempts[0].path.ends_with(".so"), "{:?}", attempts[0]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_that_is_not_libcuda_is_refused() {
        let attempts = load_attempts(Driver::load(&named(&["libm.so.6"])));
        assert_eq!(attempts[0].path, "libm.so.6");
        assert!(
            attempts[0]
                .reason
                .contains("not the CUDA driver: it exports no cuInit"),
            "{:?}",
            attempts[0]
        );
        let attempts = load_attempts(Runtime::load(&named(&["libm.so.6"])));
        assert!(
            attempts[0].reason.contains("not the CUDA runtime"),
            "{:?}",
            attempts[0]
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_missing_function_is_an_error_when_called_not_a_panic_at_load() {
        // A library with none of the driver's symbols stands for a driver older than some of them: the table
        // still loads, and each missing function is an error naming it.
        // SAFETY: libm's initialisers are the C library's own.
        let api = unsafe { DriverApi::new("libm.so.6") }
            .expect("libm loads as a table with every entry missing");
        match resolve(
            &api.cuMemAllocAsync,
            Library::Driver,
            "libm.so.6",
            "cuMemAllocAsync",
        ) {
            Err(e @ Error::MissingFunction { .. }) => assert_eq!(
                e.to_string(),
                "the CUDA driver (libcuda) loaded from libm.so.6 has no function cuMemAllocAsync: it is older \
                 than this operation needs; update it"
            ),
            Err(other) => panic!("expected MissingFunction, got {other}"),
            Ok(_) => panic!("libm has no cuMemAllocAsync"),
        }
    }

    #[test]
    fn every_candidate_is_tried_in_order_and_reported() {
        let candidates = vec![
            (
                OsString::from("/nonexistent/a.so"),
                Some("CUDA_PINNED_LIBCUDA"),
            ),
            (OsString::from("/nonexistent/b.so"), None),
        ];
        let attempts = load_attempts(Driver::load(&candidates));
        let paths: Vec<&str> = attempts.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/nonexistent/a.so (from CUDA_PINNED_LIBCUDA)",
                "/nonexistent/b.so"
            ]
        );
    }

    #[test]
    fn an_empty_name_is_an_attempt_that_fails_not_a_fall_back_to_the_search() {
        let attempts = load_attempts(Driver::load(&[(
            OsString::new(),
            Some("CUDA_PINNED_LIBCUDA"),
        )]));
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].path, "\"\" (from CUDA_PINNED_LIBCUDA)");
        assert!(
            attempts[0].reason.contains("an empty name"),
            "{:?}",
            attempts[0]
        );
    }

    #[test]
    fn default_search_order_is_documented_order() {
        if std::env::var_os("CUDA_PINNED_LIBCUDA").is_none() {
            let names: Vec<OsString> = candidates(Library::Driver)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            let expected: Vec<OsString> = DRIVER_NAMES.iter().map(OsString::from).collect();
            assert_eq!(names, expected);
        }
        #[cfg(target_os = "linux")]
        assert_eq!(
            DRIVER_NAMES,
            [
                "libcuda.so.1",
                "libcuda.so",
                "/usr/lib/wsl/lib/libcuda.so.1",
                "/usr/local/nvidia/lib64/libcuda.so.1"
            ]
        );
    }

    #[test]
    fn a_load_error_carries_the_hint_for_where_it_runs() {
        let exe = std::env::current_exe().expect("the test's own path");
        let Err(Error::Load { hint, .. }) =
            Driver::load(&named(&["/nonexistent/cuda-pinned-test/libcuda.so.1"]))
        else {
            panic!("expected a load error");
        };
        assert_eq!(hint, simulator_hint_here(Library::Driver));
        // Run by cargo, this is a test binary, told how to install the simulator.
        if is_test_binary(&exe) {
            assert!(
                hint.as_deref()
                    .is_some_and(|h| h.contains("cuda_pinned_sim::install()")),
                "{hint:?}"
            );
        }
        // A library chosen in the program (as `install` chooses the simulator) gets none.
        let Err(Error::Load { hint, .. }) = Driver::load(&[(
            OsString::from("/nonexistent/cuda-pinned-test/libcuda.so.1"),
            Some("use_library"),
        )]) else {
            panic!("expected a load error");
        };
        assert_eq!(hint, None);
    }
}
