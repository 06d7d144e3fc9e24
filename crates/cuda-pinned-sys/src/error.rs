//! The errors of loading the libraries and of calling them: what the safe crate builds its own error from.

use std::ffi::CStr;
use std::fmt;

use crate::{CUresult, cudaError_t};

/// `Result<T, cuda_pinned_sys::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which shared library a load or lookup error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Library {
    /// The CUDA driver, `libcuda.so.1` (`nvcuda.dll` on Windows). Required.
    Driver,
    /// The CUDA runtime, `libcudart.so.13` or `.12`. Optional: only the functions that wrap runtime calls need it.
    Runtime,
}

impl Library {
    /// How messages name it: `the CUDA driver (libcuda)`.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Library::Driver => "the CUDA driver (libcuda)",
            Library::Runtime => "the CUDA runtime (libcudart)",
        }
    }

    /// The environment variable that names it instead of the search.
    #[must_use]
    pub fn override_var(self) -> &'static str {
        match self {
            Library::Driver => "CUDA_PINNED_LIBCUDA",
            Library::Runtime => "CUDA_PINNED_LIBCUDART",
        }
    }
}

/// One place the loader looked for a library, and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAttempt {
    /// The name or path passed to the system's loader.
    pub path: String,
    /// The loader's message, or why a library that loaded was refused.
    pub reason: String,
}

/// An error from loading or calling the CUDA libraries. New kinds may come; the fields of each kind are
/// stable, so that the safe crate can keep them in its own error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A driver call returned something other than `CUDA_SUCCESS`.
    Driver {
        /// The code the driver returned; a newer driver's code unknown to these bindings is kept as it is.
        code: CUresult,
        /// Its name from `cuGetErrorName`, such as `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// Its description from `cuGetErrorString`, such as `out of memory`.
        description: String,
        /// The driver function that failed.
        function: &'static str,
        /// What was being done, such as `initialising the CUDA driver loaded from libcuda.so.1`.
        context: Option<String>,
    },
    /// A runtime call (or a launcher built on the runtime) returned something other than `cudaSuccess`.
    Runtime {
        /// The code the runtime returned.
        code: cudaError_t,
        /// Its name from `cudaGetErrorName`, such as `cudaErrorMemoryAllocation`.
        name: String,
        /// Its description from `cudaGetErrorString`.
        description: String,
        /// The runtime function or kernel launcher that failed.
        function: &'static str,
        /// What was being done.
        context: Option<String>,
    },
    /// No usable library was found: every place tried, with the loader's message for each.
    Load {
        /// Which library.
        library: Library,
        /// Every name or path tried, in order.
        attempts: Vec<LoadAttempt>,
        /// How to run on the simulated driver (cuda-pinned-sim) instead, where the program is a test binary
        /// or a build of the simulator is beside it; a last line of the message. `None` elsewhere, and where
        /// the program chose the library itself ([`crate::use_library`]).
        hint: Option<String>,
    },
    /// The loaded library lacks a function: it is older than the function.
    MissingFunction {
        /// Which library.
        library: Library,
        /// Where it was loaded from.
        path: String,
        /// The missing symbol.
        function: &'static str,
    },
    /// The driver supports an older CUDA version than the bindings were generated from.
    DriverTooOld {
        /// Where the driver was loaded from.
        path: String,
        /// What `cuDriverGetVersion` reported, as `1000 * major + 10 * minor`.
        driver_version: i32,
        /// The `CUDA_VERSION` of the headers the bindings were generated from.
        bindings_version: i32,
    },
    /// A library was chosen with [`crate::use_library`] after the process had already loaded another one, or
    /// had tried to and failed.
    AlreadyLoaded {
        /// Which library.
        library: Library,
        /// Where it was loaded from; `None` where loading it failed.
        loaded: Option<String>,
        /// The path asked for too late.
        requested: String,
    },
}

impl Error {
    /// A driver error for `code`, returned by `function`, described with the driver's own name and description
    /// for it (`None` where the driver had none, as for a code it does not know).
    ///
    /// This is the conversion every failed driver call goes through; it never panics, whatever the bytes.
    #[cold]
    #[must_use]
    pub fn from_driver_parts(
        code: CUresult,
        name: Option<&CStr>,
        description: Option<&CStr>,
        function: &'static str,
    ) -> Error {
        // A driver that is shut down (the process exiting) or not started describes no code, not even the one
        // that says so: those two are named here.
        let (fallback_name, fallback_description) = match code {
            CUresult::CUDA_ERROR_DEINITIALIZED => (
                "CUDA_ERROR_DEINITIALIZED",
                "the driver is shut down, as it is while the process exits",
            ),
            CUresult::CUDA_ERROR_NOT_INITIALIZED => (
                "CUDA_ERROR_NOT_INITIALIZED",
                "the driver is not initialized",
            ),
            _ => (
                "CUDA_ERROR_UNRECOGNIZED",
                "a result code the driver does not describe",
            ),
        };
        Error::Driver {
            code,
            name: text_or(name, fallback_name),
            description: text_or(description, fallback_description),
            function,
            context: None,
        }
    }

    /// A runtime error for `code`, as [`Error::from_driver_parts`] for the runtime library or a kernel launcher.
    #[cold]
    #[must_use]
    pub fn from_runtime_parts(
        code: cudaError_t,
        name: Option<&CStr>,
        description: Option<&CStr>,
        function: &'static str,
    ) -> Error {
        Error::Runtime {
            code,
            name: text_or(name, "cudaErrorUnrecognized"),
            description: text_or(description, "a result code the runtime does not describe"),
            function,
            context: None,
        }
    }

    /// Adds what was being done to a driver or runtime error (after any context it has); other kinds say
    /// everything already and are returned unchanged.
    #[must_use]
    pub fn while_doing(mut self, what: impl fmt::Display) -> Error {
        if let Error::Driver { context, .. } | Error::Runtime { context, .. } = &mut self {
            match context {
                Some(context) => {
                    use fmt::Write as _;
                    let _ = write!(context, ", while {what}");
                }
                None => *context = Some(what.to_string()),
            }
        }
        self
    }
}

fn text_or(text: Option<&CStr>, fallback: &str) -> String {
    match text {
        Some(text) if !text.is_empty() => text.to_string_lossy().into_owned(),
        _ => fallback.to_string(),
    }
}

/// How a failed call reads: `NAME (code): description, while context (function)`, or `..., in function`.
fn write_call(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    code: u32,
    description: &str,
    function: &str,
    context: Option<&str>,
) -> fmt::Result {
    write!(f, "{name} ({code}): {description}")?;
    match context {
        Some(context) => write!(f, ", while {context} ({function})"),
        None => write!(f, ", in {function}"),
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Driver {
                code,
                name,
                description,
                function,
                context,
            } => write_call(f, name, code.0, description, function, context.as_deref()),
            Error::Runtime {
                code,
                name,
                description,
                function,
                context,
            } => write_call(f, name, code.0, description, function, context.as_deref()),
            Error::Load {
                library,
                attempts,
                hint,
            } => {
                write!(f, "could not load {}; tried:", library.describe())?;
                for attempt in attempts {
                    write!(f, "\n  {}: {}", attempt.path, attempt.reason)?;
                }
                if *library == Library::Driver {
                    write!(f, "\nIs the NVIDIA driver installed?")?;
                }
                write!(
                    f,
                    " Set {} to the library's full path if it is elsewhere.",
                    library.override_var()
                )?;
                match hint {
                    Some(hint) => write!(f, "\n{hint}"),
                    None => Ok(()),
                }
            }
            Error::MissingFunction {
                library,
                path,
                function,
            } => write!(
                f,
                "{} loaded from {path} has no function {function}: it is older than this operation needs; \
                 update it",
                library.describe()
            ),
            Error::DriverTooOld {
                path,
                driver_version,
                bindings_version,
            } => write!(
                f,
                "the CUDA driver loaded from {path} supports CUDA {} ({driver_version}), older than CUDA {} \
                 ({bindings_version}) that cuda-pinned's bindings were generated from: install NVIDIA driver \
                 580 or newer",
                cuda_version(*driver_version),
                cuda_version(*bindings_version)
            ),
            Error::AlreadyLoaded {
                library,
                loaded: Some(loaded),
                requested,
            } => write!(
                f,
                "{} was already loaded from {loaded} when {requested} was chosen: choose the library before \
                 the first CUDA call of the process",
                library.describe()
            ),
            Error::AlreadyLoaded {
                library,
                loaded: None,
                requested,
            } => write!(
                f,
                "{} could not be loaded by an earlier CUDA call of the process, which stays its answer: \
                 {requested} was chosen too late; choose the library before the first CUDA call",
                library.describe()
            ),
        }
    }
}

/// `12040` as `12.4`, the way NVIDIA writes CUDA versions.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_message_names_code_description_context_and_function() {
        let e = Error::from_driver_parts(
            CUresult::CUDA_ERROR_NO_DEVICE,
            Some(c"CUDA_ERROR_NO_DEVICE"),
            Some(c"no CUDA-capable device is detected"),
            "cuInit",
        );
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected, in cuInit"
        );
        let e = e.while_doing("initialising").while_doing("starting");
        assert!(
            e.to_string()
                .ends_with(", while initialising, while starting (cuInit)"),
            "{e}"
        );
    }

    #[test]
    fn unknown_code_and_missing_strings_still_read_well() {
        let e = Error::from_driver_parts(CUresult(123_456), None, Some(c""), "cuInit");
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_UNRECOGNIZED (123456): a result code the driver does not describe, in cuInit"
        );
        // A driver shut down at exit describes nothing, not even its shutdown.
        let e = Error::from_driver_parts(CUresult(4), None, None, "cuDeviceGet");
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_DEINITIALIZED (4): the driver is shut down, as it is while the process exits, in \
             cuDeviceGet"
        );
        let e =
            Error::from_runtime_parts(cudaError_t(u32::MAX), None, None, "cuda_pinned_fill_u32");
        assert!(
            e.to_string()
                .starts_with("cudaErrorUnrecognized (4294967295)"),
            "{e}"
        );
    }

    #[test]
    fn invalid_utf8_from_the_driver_is_replaced_not_a_panic() {
        let bytes = [0xff, 0xfe, b'x', 0];
        let name = CStr::from_bytes_with_nul(&bytes).unwrap();
        let e = Error::from_driver_parts(CUresult(2), Some(name), Some(name), "cuMemAlloc_v2");
        assert!(e.to_string().starts_with("\u{fffd}\u{fffd}x (2)"), "{e}");
    }

    #[test]
    fn load_error_lists_every_attempt_and_the_override() {
        let e = Error::Load {
            library: Library::Driver,
            attempts: vec![
                LoadAttempt {
                    path: "libcuda.so.1".into(),
                    reason: "not found".into(),
                },
                LoadAttempt {
                    path: "/usr/lib/wsl/lib/libcuda.so.1".into(),
                    reason: "no such file".into(),
                },
            ],
            hint: None,
        };
        let text = e.to_string();
        assert!(text.starts_with(
            "could not load the CUDA driver (libcuda); tried:\n  libcuda.so.1: not found\n"
        ));
        assert!(
            text.contains("\n  /usr/lib/wsl/lib/libcuda.so.1: no such file\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "\nIs the NVIDIA driver installed? Set CUDA_PINNED_LIBCUDA to the library's full path if it is \
                 elsewhere."
            ),
            "{text}"
        );
        // A hint is one line more, the last.
        let Error::Load {
            library, attempts, ..
        } = e
        else {
            unreachable!()
        };
        let hinted = Error::Load {
            library,
            attempts,
            hint: Some("This is a test binary: ...".into()),
        };
        assert_eq!(
            hinted.to_string(),
            format!("{text}\nThis is a test binary: ...")
        );
    }

    #[test]
    fn too_old_driver_names_both_versions() {
        let e = Error::DriverTooOld {
            path: "libcuda.so.1".into(),
            driver_version: 12040,
            bindings_version: 13000,
        };
        let text = e.to_string();
        assert!(text.contains("supports CUDA 12.4 (12040)"), "{text}");
        assert!(text.contains("older than CUDA 13.0 (13000)"), "{text}");
    }

    #[test]
    fn while_doing_leaves_other_errors_alone() {
        let e = Error::MissingFunction {
            library: Library::Runtime,
            path: "x".into(),
            function: "cudaHostAlloc",
        };
        assert_eq!(e.clone().while_doing("anything").to_string(), e.to_string());
    }

    #[test]
    fn a_library_chosen_too_late_says_what_the_process_has() {
        let loaded = Error::AlreadyLoaded {
            library: Library::Driver,
            loaded: Some("/usr/lib/libcuda.so.1".into()),
            requested: "sim.so".into(),
        };
        let text = loaded.to_string();
        assert!(
            text.contains("already loaded from /usr/lib/libcuda.so.1 when sim.so was chosen"),
            "{text}"
        );
        let failed = Error::AlreadyLoaded {
            library: Library::Driver,
            loaded: None,
            requested: "sim.so".into(),
        };
        let text = failed.to_string();
        assert!(
            text.contains("could not be loaded by an earlier CUDA call")
                && !text.contains("loaded from"),
            "{text}"
        );
    }
}
