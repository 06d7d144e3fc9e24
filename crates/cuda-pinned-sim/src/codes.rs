//! Names and descriptions of the result codes the simulator returns or can be asked to inject.

use std::ffi::CStr;

use crate::sys::CUresult;

macro_rules! codes {
    ($($name:ident => $description:literal,)*) => {
        /// (code, name, description) for each code the simulator knows.
        pub(crate) const CODES: &[(CUresult, &CStr, &CStr)] = &[
            $((CUresult::$name, {
                const NAME: &CStr = match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(name) => name,
                    Err(_) => panic!("a code's name has no NUL"),
                };
                NAME
            }, $description),)*
        ];
    };
}

codes! {
    CUDA_SUCCESS => c"no error",
    CUDA_ERROR_INVALID_VALUE => c"invalid argument",
    CUDA_ERROR_OUT_OF_MEMORY => c"out of memory",
    CUDA_ERROR_NOT_INITIALIZED => c"initialization error",
    CUDA_ERROR_DEINITIALIZED => c"driver shutting down",
    CUDA_ERROR_NO_DEVICE => c"no CUDA-capable device is detected",
    CUDA_ERROR_INVALID_DEVICE => c"invalid device ordinal",
    CUDA_ERROR_INVALID_CONTEXT => c"invalid device context",
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT => c"context already current",
    CUDA_ERROR_MAP_FAILED => c"mapping of buffer object failed",
    CUDA_ERROR_ECC_UNCORRECTABLE => c"uncorrectable ECC error encountered",
    CUDA_ERROR_INVALID_HANDLE => c"invalid resource handle",
    CUDA_ERROR_NOT_FOUND => c"named symbol not found",
    CUDA_ERROR_NOT_READY => c"device not ready",
    CUDA_ERROR_ILLEGAL_ADDRESS => c"an illegal memory access was encountered (the simulated driver found a use of freed, unregistered or not yet allocated memory, or memory freed while in use: see its VIOLATION line on stderr)",
    CUDA_ERROR_LAUNCH_FAILED => c"unspecified launch failure",
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => c"too many resources requested for launch",
    CUDA_ERROR_INVALID_IMAGE => c"device kernel image is invalid",
    CUDA_ERROR_INVALID_PTX => c"a PTX JIT compilation failed",
    CUDA_ERROR_NO_BINARY_FOR_GPU => c"no kernel image is available for execution on the device",
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => c"part or all of the requested memory range is already mapped",
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => c"pointer does not correspond to a registered memory region",
    CUDA_ERROR_CONTEXT_IS_DESTROYED => c"context is destroyed",
    CUDA_ERROR_NOT_PERMITTED => c"operation not permitted",
    CUDA_ERROR_ILLEGAL_STATE => c"the operation cannot be performed in the present state",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => c"operation not permitted when stream is capturing",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => c"operation failed due to a previous error during capture",
    CUDA_ERROR_STREAM_CAPTURE_MERGE => c"operation would result in a merge of separate capture sequences",
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => c"capture was not ended in the same stream as it began",
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED => c"capturing stream has unjoined work",
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION => c"dependency created on uncaptured work in another stream",
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => c"operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_CAPTURED_EVENT => c"operation not permitted on an event last recorded in a capturing stream",
    CUDA_ERROR_NOT_SUPPORTED => c"operation not supported (by the simulated driver)",
    CUDA_ERROR_SYSTEM_NOT_READY => c"system not yet initialized",
    CUDA_ERROR_TIMEOUT => c"timeout expired",
    CUDA_ERROR_UNKNOWN => c"unknown error",
}

/// The name and description of `code`, if the simulator knows it.
pub(crate) fn describe(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|&(_, name, description)| (name, description))
}

/// A code by name (`CUDA_ERROR_OUT_OF_MEMORY`) or number (`2`).
pub(crate) fn parse(text: &str) -> Option<CUresult> {
    if let Ok(number) = text.parse::<u32>() {
        return Some(CUresult(number));
    }
    CODES
        .iter()
        .find(|(_, name, _)| name.to_bytes() == text.as_bytes())
        .map(|&(code, _, _)| code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(
            parse("CUDA_ERROR_OUT_OF_MEMORY"),
            Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!(parse("700"), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert_eq!(parse("CUDA_ERROR_NOPE"), None);
        let (name, _) = describe(CUresult::CUDA_ERROR_NOT_READY).unwrap();
        assert_eq!(name, c"CUDA_ERROR_NOT_READY");
    }
}
