//! Modules and kernels: loading, functions and their parameters, launches.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};

use crate::driver_call;
use crate::error::Result;
use crate::sys::{CUdeviceptr, CUfunction, CUfunction_attribute, CUmemoryPool, CUmodule, CUstream};

/// `cuModuleLoadData`: loads a PTX, cubin or fatbin image into the current context.
///
/// # Safety
/// `image` must point to a whole image: a cubin or fatbin (whose headers give its length), or NUL-terminated
/// PTX text. The driver reads it during the call only.
pub(crate) unsafe fn module_load_data(image: *const c_void) -> Result<CUmodule> {
    let mut module = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, and an image as the caller guarantees.
    unsafe { driver_call!(cuModuleLoadData(&mut module, image)) }?;
    Ok(module)
}

/// `cuModuleUnload`: unloads a module; it waits for the whole device.
///
/// # Safety
/// `module` must be live, no work launched from it may still be queued or running, and its functions must
/// not be used again.
pub(crate) unsafe fn module_unload(module: CUmodule) -> Result<()> {
    // SAFETY: as the caller guarantees.
    unsafe { driver_call!(cuModuleUnload(module)) }
}

/// `cuModuleGetFunction`: the kernel named `name` in `module`.
pub(crate) fn module_get_function(module: CUmodule, name: &CStr) -> Result<CUfunction> {
    let mut function = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, a live module (see the module docs) and a NUL-terminated name.
    unsafe { driver_call!(cuModuleGetFunction(&mut function, module, name.as_ptr())) }?;
    Ok(function)
}

/// `cuFuncGetParamInfo`: the offset and size in bytes of the kernel's parameter `index`;
/// `CUDA_ERROR_INVALID_VALUE` past the last one.
pub(crate) fn func_get_param_info(function: CUfunction, index: usize) -> Result<(usize, usize)> {
    let (mut offset, mut size) = (0, 0);
    // SAFETY: out-pointers to locals and a live function.
    unsafe { driver_call!(cuFuncGetParamInfo(function, index, &mut offset, &mut size)) }?;
    Ok((offset, size))
}

/// `cuFuncGetAttribute`: an integer attribute of the kernel.
pub(crate) fn func_get_attribute(
    attribute: CUfunction_attribute,
    function: CUfunction,
) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: an out-pointer to a local and a live function.
    unsafe { driver_call!(cuFuncGetAttribute(&mut value, attribute, function)) }?;
    Ok(value)
}

/// `cuLaunchKernel`: enqueues `function` on `stream` with a grid of `grid` blocks of `block` threads and
/// `shared` bytes of dynamic shared memory. Returns at once.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, each to a value of that parameter's size and type,
/// readable during the call; the memory the kernel touches must stay allocated and be ordered for it until it
/// has completed; `function` and `stream` must be of one live context.
pub(crate) unsafe fn launch_kernel(
    function: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    let params = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    // SAFETY: as the caller guarantees; `extra` is null.
    unsafe {
        driver_call!(cuLaunchKernel(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            stream,
            params,
            std::ptr::null_mut(),
        ))
    }
}

/// `cuMemcpyBatchAsync_v2` (CUDA 13.0 and later; 12.8's `cuMemcpyBatchAsync` has another signature): copies `sizes[k]` bytes from `srcs[k]` to `dsts[k]` for every
/// `k`, by unified address, each source read in stream order, on `stream` (in no particular order among
/// themselves). Returns at once.
///
/// # Safety
/// The three slices have one length; every range is live memory the device can reach (device memory,
/// page-locked host memory) until the copies have completed and ordered for them; no destination overlaps
/// another copy's source or destination.
pub(crate) unsafe fn memcpy_batch_async(
    dsts: &mut [CUdeviceptr],
    srcs: &mut [CUdeviceptr],
    sizes: &mut [usize],
    stream: CUstream,
) -> Result<()> {
    let mut attributes = crate::sys::CUmemcpyAttributes {
        srcAccessOrder: crate::sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        ..Default::default()
    };
    let mut first = 0usize;
    // SAFETY: as the caller guarantees; one attribute for every copy, from copy 0.
    unsafe {
        driver_call!(cuMemcpyBatchAsync_v2(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            &mut attributes,
            &mut first,
            1,
            stream,
        ))
    }
}

/// `cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`: the memory pool device memory at `ptr`
/// came from (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`: it is freed stream-ordered), null for memory of no
/// pool (`cuMemAlloc`).
pub(crate) fn pointer_mem_pool(ptr: CUdeviceptr) -> Result<CUmemoryPool> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local of the attribute's type; the driver only looks the address up.
    unsafe {
        driver_call!(cuPointerGetAttribute(
            (&raw mut pool).cast(),
            crate::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr
        ))
    }?;
    Ok(pool)
}
