//! The runtime's host-memory functions (`cudaHostAlloc` and its kin), so that `CUDA_PINNED_LIBCUDART` can
//! name the simulator too. They share the driver functions' state: runtime pinned memory is pinned memory.

#![allow(non_snake_case, reason = "the C names")]

use std::ffi::{c_char, c_uint, c_void};

use crate::api::{entry, free_host, host_alloc, register, unregister};
use crate::sys::{CUresult, cudaError_t};

/// The runtime's code for a driver code the simulator returned.
fn runtime_code(code: CUresult) -> cudaError_t {
    match code {
        CUresult::CUDA_SUCCESS => cudaError_t::cudaSuccess,
        CUresult::CUDA_ERROR_INVALID_VALUE => cudaError_t::cudaErrorInvalidValue,
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => cudaError_t::cudaErrorMemoryAllocation,
        CUresult::CUDA_ERROR_NOT_INITIALIZED => cudaError_t::cudaErrorInitializationError,
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => cudaError_t::cudaErrorIllegalAddress,
        CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
            cudaError_t::cudaErrorHostMemoryAlreadyRegistered
        }
        CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => {
            cudaError_t::cudaErrorHostMemoryNotRegistered
        }
        CUresult::CUDA_ERROR_NOT_SUPPORTED => cudaError_t::cudaErrorNotSupported,
        _ => cudaError_t::cudaErrorUnknown,
    }
}

/// Names and descriptions of the codes above.
fn describe(error: cudaError_t) -> (&'static std::ffi::CStr, &'static std::ffi::CStr) {
    match error {
        cudaError_t::cudaSuccess => (c"cudaSuccess", c"no error"),
        cudaError_t::cudaErrorInvalidValue => (c"cudaErrorInvalidValue", c"invalid argument"),
        cudaError_t::cudaErrorMemoryAllocation => (c"cudaErrorMemoryAllocation", c"out of memory"),
        cudaError_t::cudaErrorInitializationError => {
            (c"cudaErrorInitializationError", c"initialization error")
        }
        cudaError_t::cudaErrorIllegalAddress => (
            c"cudaErrorIllegalAddress",
            c"an illegal memory access was encountered",
        ),
        cudaError_t::cudaErrorHostMemoryAlreadyRegistered => (
            c"cudaErrorHostMemoryAlreadyRegistered",
            c"part or all of the requested memory range is already mapped",
        ),
        cudaError_t::cudaErrorHostMemoryNotRegistered => (
            c"cudaErrorHostMemoryNotRegistered",
            c"pointer does not correspond to a registered memory region",
        ),
        cudaError_t::cudaErrorNotSupported => {
            (c"cudaErrorNotSupported", c"operation not supported")
        }
        _ => (c"cudaErrorUnknown", c"unknown error"),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorName(error: cudaError_t) -> *const c_char {
    describe(error).0.as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorString(error: cudaError_t) -> *const c_char {
    describe(error).1.as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaHostAlloc(
    pHost: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> cudaError_t {
    runtime_code(entry("cudaHostAlloc", |mut state| {
        if pHost.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let p = host_alloc(&mut state, size, flags)?;
        // SAFETY: checked non-null; the caller passes a place for one pointer, as cudaHostAlloc demands.
        unsafe { pHost.write(p) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaFreeHost(ptr: *mut c_void) -> cudaError_t {
    runtime_code(entry("cudaFreeHost", |state| {
        free_host(state, ptr, "cudaFreeHost")
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: c_uint) -> cudaError_t {
    runtime_code(entry("cudaHostRegister", |mut state| {
        register(&mut state, ptr, size, flags)
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaHostUnregister(ptr: *mut c_void) -> cudaError_t {
    runtime_code(entry("cudaHostUnregister", |state| {
        unregister(state, ptr, "cudaHostUnregister")
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaHostGetDevicePointer(
    pDevice: *mut *mut c_void,
    pHost: *mut c_void,
    flags: c_uint,
) -> cudaError_t {
    runtime_code(entry("cudaHostGetDevicePointer", |state| {
        if pDevice.is_null() || flags != 0 || state.find(pHost as u64, 1, false).is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller passes a place for one pointer.
        unsafe { pDevice.write(pHost) };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cudaHostGetFlags(pFlags: *mut c_uint, pHost: *mut c_void) -> cudaError_t {
    runtime_code(entry("cudaHostGetFlags", |state| {
        let (id, _) = state
            .find(pHost as u64, 1, false)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if pFlags.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller passes a place for one unsigned int.
        unsafe { pFlags.write(state.allocations[&id].flags) };
        Ok(())
    }))
}

/// Each exported function has exactly the type of its field in the crate's generated `RuntimeApi`.
#[allow(dead_code, reason = "a compile-time check")]
fn signatures(api: &crate::sys::RuntimeApi) {
    fn same<T>(_: &Result<T, libloading::Error>, _: T) {}
    same(&api.cudaGetErrorName, cudaGetErrorName);
    same(&api.cudaGetErrorString, cudaGetErrorString);
    same(&api.cudaHostAlloc, cudaHostAlloc);
    same(&api.cudaFreeHost, cudaFreeHost);
    same(&api.cudaHostRegister, cudaHostRegister);
    same(&api.cudaHostUnregister, cudaHostUnregister);
    same(&api.cudaHostGetDevicePointer, cudaHostGetDevicePointer);
    same(&api.cudaHostGetFlags, cudaHostGetFlags);
}
