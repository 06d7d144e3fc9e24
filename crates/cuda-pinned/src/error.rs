//! The crate's one error type.
//!
//! Every runtime failure, from a missing driver to a failed copy, is an [`Error`] whose message says what went
//! wrong in CUDA's own words and what the crate was doing at the time, so that a user can act on it without a
//! debugger: `CUDA_ERROR_OUT_OF_MEMORY (2): out of memory, while allocating 4.0 GiB on device 0 (cuMemAlloc_v2)`.

use std::fmt;

use crate::sys::{self, CUresult, cudaError_t};
use crate::units::Bytes;

/// `Result<T, cuda_pinned::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use crate::sys::{Library, LoadAttempt};

/// An error from `cuda-pinned`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call returned something other than `CUDA_SUCCESS`.
    #[non_exhaustive]
    Driver {
        /// The code the driver returned; a newer driver's code unknown to these bindings is kept as it is.
        code: CUresult,
        /// Its name from `cuGetErrorName`, such as `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// Its description from `cuGetErrorString`, such as `out of memory`.
        description: String,
        /// The driver function that failed.
        function: &'static str,
        /// What the crate was doing, such as `allocating 4.0 GiB on device 0`.
        context: Option<String>,
    },
    /// A CUDA runtime call or a kernel launch returned something other than `cudaSuccess`.
    #[non_exhaustive]
    Runtime {
        /// The code the runtime returned.
        code: cudaError_t,
        /// Its name from `cudaGetErrorName`, such as `cudaErrorMemoryAllocation`.
        name: String,
        /// Its description from `cudaGetErrorString`.
        description: String,
        /// The runtime function or kernel launcher that failed.
        function: &'static str,
        /// What the crate was doing.
        context: Option<String>,
    },
    /// No usable library was found: every place tried, with the loader's message for each.
    #[non_exhaustive]
    Load {
        /// Which library.
        library: Library,
        /// Every name or path tried, in order.
        attempts: Vec<LoadAttempt>,
        /// How to run on the simulated driver (cuda-pinned-sim) instead, where the program is a test binary
        /// or a build of the simulator is beside it; a last line of the message. `None` elsewhere.
        hint: Option<String>,
    },
    /// The loaded library lacks a function the crate needs: it is older than the function.
    #[non_exhaustive]
    MissingFunction {
        /// Which library.
        library: Library,
        /// Where it was loaded from.
        path: String,
        /// The missing symbol.
        function: &'static str,
    },
    /// An argument the operation cannot take, such as buffers of different lengths for a copy; nothing was
    /// enqueued.
    #[non_exhaustive]
    InvalidArgument {
        /// What was wrong, such as `copying 10 elements into a buffer of 8`.
        message: String,
    },
    /// A [`crate::PinnedPool`] has no room for a request within its budget: at once, or after waiting for room
    /// as long as `waited` says.
    #[non_exhaustive]
    PoolExhausted {
        /// The bytes requested.
        requested: usize,
        /// The pool's budget.
        budget: usize,
        /// The bytes the pool holds now: in use, cached and pending.
        reserved: usize,
        /// How long the request waited for room before giving up: zero when it failed at once; up to the
        /// pool's [`max_wait`](crate::PoolBuilder::max_wait) for a pool that waits when full.
        waited: std::time::Duration,
    },
    /// A worker of a [`crate::prefetch::Prefetcher`] could not build a batch: the fill closure returned an
    /// error of its own (the crate's own errors reach the consumer unchanged), or a worker panicked.
    #[non_exhaustive]
    Worker {
        /// The batch index (as given to the fill closure).
        index: usize,
        /// The closure's error message, or the panic's.
        message: String,
        /// Whether the worker panicked (caught: the process goes on).
        panicked: bool,
        /// The closure's error, for downcasting; `None` for a panic.
        cause: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// Several errors met where they could not be returned (in destructors, on the crate's release thread),
    /// reported together by [`crate::Context::check_deferred_errors`].
    #[non_exhaustive]
    Deferred {
        /// Every error, oldest first.
        errors: Vec<Error>,
    },
    /// A file could not be read as a load needs it (see [`crate::load`]): a read failed, the file is shorter
    /// than it says or than when it was opened, or its header is not what its format allows. Nothing of the
    /// load is reported as done; device memory it was loading into may have been written in part.
    #[non_exhaustive]
    File {
        /// The file, as the caller named it.
        path: std::path::PathBuf,
        /// The byte of the file the failure is at (the start of the read that failed, the first byte that is
        /// missing, or the start of the part of the header that is wrong).
        offset: u64,
        /// What is wrong, such as `the file ends at byte 4096, before the 8192 bytes its header describes`.
        message: String,
    },
    /// The driver supports an older CUDA version than the bindings were generated from.
    #[non_exhaustive]
    DriverTooOld {
        /// Where the driver was loaded from.
        path: String,
        /// What `cuDriverGetVersion` reported, as `1000 * major + 10 * minor`.
        driver_version: i32,
        /// The `CUDA_VERSION` of the headers the bindings were generated from.
        bindings_version: i32,
    },
}

impl Error {
    /// Adds what the crate (or the caller) was doing when the error happened, such as
    /// `"allocating 4.0 GiB on device 0"`: the message of a driver or runtime error then reads
    /// `..., while allocating 4.0 GiB on device 0`, and each further context is added after the ones before
    /// (innermost first), so a note such as "(leaked)" added by an outer caller is never lost. An
    /// invalid-argument or worker error gets it appended to its message; the other kinds (load errors,
    /// missing functions, an exhausted pool, an old driver, deferred errors) say everything already and are
    /// returned unchanged.
    #[must_use]
    pub fn context(mut self, what: impl fmt::Display) -> Error {
        match &mut self {
            Error::Driver { context, .. } | Error::Runtime { context, .. } => match context {
                Some(context) => {
                    use fmt::Write as _;
                    let _ = write!(context, ", while {what}");
                }
                None => *context = Some(what.to_string()),
            },
            Error::InvalidArgument { message }
            | Error::Worker { message, .. }
            | Error::File { message, .. } => {
                use fmt::Write as _;
                let _ = write!(message, ", while {what}");
            }
            _ => {}
        }
        self
    }

    /// An [`Error::InvalidArgument`] saying `message`: for crates built on this one, to report their own
    /// invalid arguments as the crate's errors.
    pub fn invalid(message: impl fmt::Display) -> Error {
        Error::InvalidArgument {
            message: message.to_string(),
        }
    }

    /// An [`Error::File`]: `message` about `path` at byte `offset`.
    pub fn file(path: &std::path::Path, offset: u64, message: impl fmt::Display) -> Error {
        Error::File {
            path: path.to_path_buf(),
            offset,
            message: message.to_string(),
        }
    }

    /// The driver's result code, if this is a failed driver call.
    #[must_use]
    pub fn driver_code(&self) -> Option<CUresult> {
        match self {
            Error::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument { message } => f.write_str(message),
            Error::File {
                path,
                offset,
                message,
            } => write!(f, "{}, at byte {offset}: {message}", path.display()),
            Error::PoolExhausted {
                requested,
                budget,
                reserved,
                waited,
            } => {
                write!(
                    f,
                    "the pinned pool cannot serve {} within its budget of {} ({} held now)",
                    Bytes(*requested),
                    Bytes(*budget),
                    Bytes(*reserved)
                )?;
                if waited.is_zero() {
                    f.write_str(
                        ": give buffers back, trim the pool, or build it with WhenFull::Wait",
                    )
                } else {
                    write!(
                        f,
                        " after waiting {waited:.1?} for room: a buffer held by the waiting thread itself, or \
                         forgotten, never comes back; give buffers back, or raise the budget or the pool's \
                         max_wait"
                    )
                }
            }
            Error::Worker {
                index,
                message,
                panicked: true,
                ..
            } => write!(
                f,
                "a prefetch worker panicked while building batch {index}: {message}"
            ),
            Error::Worker { index, message, .. } => {
                write!(f, "building batch {index} failed: {message}")
            }
            Error::Deferred { errors } => {
                write!(
                    f,
                    "{} errors met where they could not be returned:",
                    errors.len()
                )?;
                for (i, e) in errors.iter().enumerate() {
                    write!(f, "\n  {}. {e}", i + 1)?;
                }
                Ok(())
            }
            Error::Driver { .. }
            | Error::Runtime { .. }
            | Error::Load { .. }
            | Error::MissingFunction { .. }
            // Described as cuda-pinned-sys describes them, which `as_sys` turns each into.
            | Error::DriverTooOld { .. } => match self.as_sys() {
                Some(raw) => raw.fmt(f),
                None => Ok(()),
            },
        }
    }
}

impl Error {
    /// The same error as `cuda-pinned-sys` has it, for the kinds that come from there, which describes them.
    fn as_sys(&self) -> Option<sys::Error> {
        Some(match self.clone() {
            Error::Driver {
                code,
                name,
                description,
                function,
                context,
            } => sys::Error::Driver {
                code,
                name,
                description,
                function,
                context,
            },
            Error::Runtime {
                code,
                name,
                description,
                function,
                context,
            } => sys::Error::Runtime {
                code,
                name,
                description,
                function,
                context,
            },
            Error::Load {
                library,
                attempts,
                hint,
            } => sys::Error::Load {
                library,
                attempts,
                hint,
            },
            Error::MissingFunction {
                library,
                path,
                function,
            } => sys::Error::MissingFunction {
                library,
                path,
                function,
            },
            Error::DriverTooOld {
                path,
                driver_version,
                bindings_version,
            } => sys::Error::DriverTooOld {
                path,
                driver_version,
                bindings_version,
            },
            _ => return None,
        })
    }
}

impl From<sys::Error> for Error {
    fn from(error: sys::Error) -> Error {
        match error {
            sys::Error::Driver {
                code,
                name,
                description,
                function,
                context,
            } => Error::Driver {
                code,
                name,
                description,
                function,
                context,
            },
            sys::Error::Runtime {
                code,
                name,
                description,
                function,
                context,
            } => Error::Runtime {
                code,
                name,
                description,
                function,
                context,
            },
            sys::Error::Load {
                library,
                attempts,
                hint,
            } => Error::Load {
                library,
                attempts,
                hint,
            },
            sys::Error::MissingFunction {
                library,
                path,
                function,
            } => Error::MissingFunction {
                library,
                path,
                function,
            },
            sys::Error::DriverTooOld {
                path,
                driver_version,
                bindings_version,
            } => Error::DriverTooOld {
                path,
                driver_version,
                bindings_version,
            },
            // Choosing a library too late, and any kind a later -sys adds: an argument the call cannot take.
            other => Error::invalid(other),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Worker {
                cause: Some(cause), ..
            } => Some(&**cause as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver_error(code: u32, function: &'static str) -> Error {
        sys::Error::from_driver_parts(
            CUresult(code),
            Some(c"CUDA_ERROR_OUT_OF_MEMORY"),
            Some(c"out of memory"),
            function,
        )
        .into()
    }

    #[test]
    fn driver_message_names_code_description_context_and_function() {
        let e = driver_error(2, "cuMemAlloc_v2").context("allocating 4.0 GiB on device 0");
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory, while allocating 4.0 GiB on device 0 (cuMemAlloc_v2)"
        );
        assert_eq!(e.driver_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    }

    #[test]
    fn every_context_is_kept_innermost_first() {
        let e = driver_error(1, "cuMemcpyHtoDAsync_v2")
            .context("inner")
            .context("outer (leaked)");
        assert!(
            e.to_string()
                .ends_with(", while inner, while outer (leaked) (cuMemcpyHtoDAsync_v2)"),
            "{e}"
        );
        let e = Error::invalid("bad range").context("copying");
        assert_eq!(e.to_string(), "bad range, while copying");
    }

    #[test]
    fn every_error_of_the_raw_layer_reads_as_it_does_there() {
        let raw = [
            sys::Error::from_driver_parts(CUresult(123_456), None, None, "cuInit")
                .while_doing("initialising"),
            sys::Error::from_runtime_parts(cudaError_t(2), None, None, "cudaHostAlloc"),
            sys::Error::Load {
                library: Library::Driver,
                attempts: vec![LoadAttempt {
                    path: "libcuda.so.1".into(),
                    reason: "not found".into(),
                }],
                hint: None,
            },
            sys::Error::Load {
                library: Library::Runtime,
                attempts: Vec::new(),
                hint: Some("This is a test binary: ...".into()),
            },
            sys::Error::MissingFunction {
                library: Library::Runtime,
                path: "x".into(),
                function: "cudaHostAlloc",
            },
            sys::Error::DriverTooOld {
                path: "libcuda.so.1".into(),
                driver_version: 12040,
                bindings_version: 13000,
            },
            sys::Error::AlreadyLoaded {
                library: Library::Driver,
                loaded: Some("a".into()),
                requested: "b".into(),
            },
            sys::Error::AlreadyLoaded {
                library: Library::Driver,
                loaded: None,
                requested: "b".into(),
            },
        ];
        for raw in raw {
            let converted = Error::from(raw.clone());
            assert_eq!(converted.to_string(), raw.to_string());
        }
    }

    #[test]
    fn deferred_errors_are_all_listed() {
        let e = Error::Deferred {
            errors: vec![Error::invalid("first"), Error::invalid("second")],
        };
        assert_eq!(
            e.to_string(),
            "2 errors met where they could not be returned:\n  1. first\n  2. second"
        );
    }

    #[test]
    fn a_workers_error_is_its_source_and_a_panic_says_so() {
        use std::error::Error as _;
        let cause: std::sync::Arc<dyn std::error::Error + Send + Sync> =
            std::sync::Arc::new(std::io::Error::other("disk gone"));
        let e = Error::Worker {
            index: 7,
            message: "disk gone".into(),
            panicked: false,
            cause: Some(cause),
        };
        assert_eq!(e.to_string(), "building batch 7 failed: disk gone");
        assert_eq!(e.source().unwrap().to_string(), "disk gone");
        let p = Error::Worker {
            index: 5,
            message: "boom".into(),
            panicked: true,
            cause: None,
        };
        assert_eq!(
            p.to_string(),
            "a prefetch worker panicked while building batch 5: boom"
        );
        assert!(p.source().is_none());
    }

    #[test]
    fn context_leaves_other_errors_alone() {
        let e = Error::MissingFunction {
            library: Library::Runtime,
            path: "x".into(),
            function: "cudaHostAlloc",
        };
        assert_eq!(e.clone().context("anything").to_string(), e.to_string());
    }
}
