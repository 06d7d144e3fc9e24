//! Arbitrary result codes and bytes through `sys::Error::from_driver_parts` / `from_runtime_parts` of
//! cuda-pinned-sys, the conversion into cuda-pinned's `Error`, `Error::context` (every context kept, innermost first) and the error's `Display`, `Debug` and `Clone`:
//! none of it may panic, and the message must always name the error, its code, the failing function and
//! every context it was given.
//!
//! Input layout (every part is optional: a short input reads as zeros / empty):
//!
//! | bytes          | meaning                                                                               |
//! |----------------|---------------------------------------------------------------------------------------|
//! | 0              | flags: bit 0 runtime error (else driver), bit 1 add a context, bit 2 add a second one |
//! | 1..5           | the result code, `u32` little-endian                                                  |
//! | 5              | index into `FUNCTIONS` (modulo its length)                                            |
//! | `n`, `n` bytes | the name: a `CStr` up to its first NUL, `None` if it has no NUL                       |
//! | `n`, `n` bytes | the description, likewise                                                             |
//! | `n`, `n` bytes | the first context, lossily from possibly invalid UTF-8 (read even if unused)          |
//! | the rest       | the second context, likewise                                                          |

#![no_main]

use std::borrow::Cow;
use std::error::Error as _;
use std::ffi::CStr;

use cuda_pinned::Error;
use cuda_pinned::sys::{self, CUresult, cudaError_t};
use cuda_pinned_fuzz::Reader;
use libfuzzer_sys::fuzz_target;

/// The `function` names an error can be built with: real driver, runtime and launcher names, and a few that
/// look like format strings or are empty.
const FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuMemAlloc_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemHostAlloc",
    "cuStreamSynchronize",
    "cudaHostAlloc",
    "cudaLaunchKernel",
    "cuda_pinned_fill_u32",
    "",
    "{} {:?} %s %n \u{fffd}\n",
];

/// What the error's `name` / `description` must be: the driver's text, lossily, or the fallback where there
/// is none or it is empty.
fn expected_text<'a>(text: Option<&'a CStr>, fallback: &'static str) -> Cow<'a, str> {
    match text {
        Some(text) if !text.is_empty() => text.to_string_lossy(),
        _ => Cow::Borrowed(fallback),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Reader::new(data);
    let flags = input.byte();
    let runtime = flags & 1 != 0;
    let code = input.u32_le();
    let function = FUNCTIONS[usize::from(input.byte()) % FUNCTIONS.len()];
    let name = CStr::from_bytes_until_nul(input.field()).ok();
    let description = CStr::from_bytes_until_nul(input.field()).ok();
    let (first, second) = (input.field(), input.rest());
    let first = (flags & 2 != 0).then(|| String::from_utf8_lossy(first));
    let second = (flags & 4 != 0).then(|| String::from_utf8_lossy(second));

    // Without the driver's own words, the two codes of a driver that is not running are named, the rest not.
    let (fallback_name, fallback_description) = match code {
        3 => (
            "CUDA_ERROR_NOT_INITIALIZED",
            "the driver is not initialized",
        ),
        4 => (
            "CUDA_ERROR_DEINITIALIZED",
            "the driver is shut down, as it is while the process exits",
        ),
        _ => (
            "CUDA_ERROR_UNRECOGNIZED",
            "a result code the driver does not describe",
        ),
    };
    let (mut error, expected_name, expected_description) = if runtime {
        (
            Error::from(sys::Error::from_runtime_parts(
                cudaError_t(code),
                name,
                description,
                function,
            )),
            expected_text(name, "cudaErrorUnrecognized"),
            expected_text(description, "a result code the runtime does not describe"),
        )
    } else {
        (
            Error::from(sys::Error::from_driver_parts(
                CUresult(code),
                name,
                description,
                function,
            )),
            expected_text(name, fallback_name),
            expected_text(description, fallback_description),
        )
    };
    if let Some(first) = &first {
        error = error.context(first);
    }
    // A second context is added after the first: the first is the closest to the failure.
    if let Some(second) = &second {
        error = error.context(second);
    }
    // The contexts that must show, innermost first, joined as the message joins them.
    let context = match (first.as_deref(), second.as_deref()) {
        (Some(first), Some(second)) => Some(format!("{first}, while {second}")),
        (one, other) => one.or(other).map(str::to_owned),
    };
    let context = context.as_deref();

    let text = error.to_string();
    let debug = format!("{error:?}");
    let pretty = format!("{error:#?}");

    // The message names the error first, then its code in decimal, then what the driver says of it.
    assert!(
        text.starts_with(&format!("{expected_name} ({code}): ")),
        "message does not start with the name and code: {text:?}"
    );
    assert!(text.contains(&format!("({code})")), "{text:?}");
    assert!(text.contains(&*expected_description), "{text:?}");
    // ... and ends with the context, if any, and the function that failed.
    assert!(text.contains(function), "{text:?}");
    match context {
        Some(context) => assert!(
            text.ends_with(&format!(", while {context} ({function})")),
            "message does not end with the context and function: {text:?}"
        ),
        None => assert!(
            text.ends_with(&format!(", in {function}")),
            "message does not end with the function: {text:?}"
        ),
    }

    // The fields hold what the message was built from.
    match &error {
        Error::Driver {
            code: c,
            name: n,
            description: d,
            function: f,
            context: ctx,
            ..
        } => {
            assert!(!runtime, "a driver error from from_runtime_parts");
            assert_eq!(c.0, code);
            assert_eq!(n, &*expected_name);
            assert_eq!(d, &*expected_description);
            assert_eq!(*f, function);
            assert_eq!(ctx.as_deref(), context);
        }
        Error::Runtime {
            code: c,
            name: n,
            description: d,
            function: f,
            context: ctx,
            ..
        } => {
            assert!(runtime, "a runtime error from from_driver_parts");
            assert_eq!(c.0, code);
            assert_eq!(n, &*expected_name);
            assert_eq!(d, &*expected_description);
            assert_eq!(*f, function);
            assert_eq!(ctx.as_deref(), context);
        }
        other => panic!("from_*_parts built neither a driver nor a runtime error: {other:?}"),
    }

    // driver_code is the code for driver errors only.
    if runtime {
        assert_eq!(error.driver_code(), None);
        assert!(debug.starts_with("Runtime {"), "{debug}");
    } else {
        assert_eq!(error.driver_code(), Some(CUresult(code)));
        assert!(debug.starts_with("Driver {"), "{debug}");
    }
    assert!(debug.contains(&format!("({code})")), "{debug}");
    // `{:#?}` spreads the code over lines, so only check that it names the same variant.
    assert!(
        pretty.starts_with(debug.split(' ').next().unwrap_or_default()),
        "{pretty}"
    );
    assert!(error.source().is_none());

    // A clone is the same error.
    let clone = error.clone();
    assert_eq!(clone.to_string(), text);
    assert_eq!(format!("{clone:?}"), debug);
    assert_eq!(clone.driver_code(), error.driver_code());

    // Every context added later shows too, outermost last, before the function.
    if let Some(context) = context {
        assert!(
            clone
                .context("something else")
                .to_string()
                .ends_with(&format!(
                    ", while {context}, while something else ({function})"
                )),
            "{text:?}"
        );
    }
});
