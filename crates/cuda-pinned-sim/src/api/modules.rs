//! Modules and kernels: any image loads, and its kernels are the stand-ins registered by name (see
//! `kernel.rs`). A launch copies its parameters at the call and runs its stand-in in stream order.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, MutexGuard};

use super::context::current;
use super::memory::device_wait;
use super::streams::{is_default_stream, live_stream, submit};
use super::{Outcome, entry, put};
use crate::attributes::{MAX_BLOCK, MAX_GRID, MAX_SHARED, MAX_THREADS_PER_BLOCK};
use crate::kernel::{self, Launch};
use crate::sim::{FunctionData, ModuleData, Op, State};
use crate::sys::*;

/// Loads a module. Loading waits for all work on the device, whoever queued it, and loads every function of the
/// module (probed on an H100, driver 580: PTX, a cubin and a fatbin alike, with `CUDA_MODULE_LOADING` unset,
/// `LAZY` or `EAGER`; each function was loaded before its first launch, which then waited for nothing).
fn module_load(
    state: MutexGuard<'static, State>,
    module: *mut CUmodule,
    image: *const c_void,
    function: &str,
) -> Outcome {
    let device = current(&state)?;
    if module.is_null() || image.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut state = device_wait(state, Some(device as i32), |_| false, function);
    let handle = state.handle();
    state.modules.insert(
        handle,
        ModuleData {
            device: device as i32,
            functions: HashMap::new(),
        },
    );
    put(module, handle as CUmodule)
}

/// A live function's handle.
fn live_function(state: &State, f: CUfunction) -> Outcome<usize> {
    let handle = f as usize;
    if state.functions.contains_key(&handle) {
        Ok(handle)
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }
}

impl Launch {
    /// A launch of `f` with the parameters `kernelParams` points to, copied now, as `cuLaunchKernel` and a
    /// kernel node's parameters take them: `CUDA_ERROR_INVALID_VALUE` for a null function or parameter, or
    /// dimensions out of range; `extra` is not modelled.
    pub(crate) fn build(
        state: &State,
        f: CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared: c_uint,
        kernelParams: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Outcome<Launch> {
        if f.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let function = live_function(state, f)?;
        let threads: u64 = block.iter().map(|&d| u64::from(d)).product();
        let fits =
            |dims: [u32; 3], most: [u32; 3]| (0..3).all(|i| (1..=most[i]).contains(&dims[i]));
        if !fits(grid, MAX_GRID)
            || !fits(block, MAX_BLOCK)
            || threads > u64::from(MAX_THREADS_PER_BLOCK)
            || shared > MAX_SHARED
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !extra.is_null() {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let FunctionData {
            module,
            device,
            ref kernel,
        } = state.functions[&function];
        let kernel = Arc::clone(kernel);
        let count = kernel.sizes.len();
        if count > 0 && kernelParams.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut params = vec![0u8; kernel.params_len()];
        for (index, (&offset, &size)) in kernel.offsets.iter().zip(&kernel.sizes).enumerate() {
            // SAFETY: cuda.h's contract: `kernelParams` holds one pointer per parameter of the kernel (checked
            // non-null above where there are any).
            let param = unsafe { kernelParams.add(index).read() };
            if param.is_null() {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: cuda.h's contract: each pointer is to a value of its parameter's size, readable during
            // the call; `params` has room for every parameter at its offset.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    param.cast::<u8>(),
                    params.as_mut_ptr().add(offset),
                    size,
                );
            }
        }
        let allocations = Launch::pointed_to(state, &kernel, &params);
        Ok(Launch {
            kernel,
            function,
            module,
            device,
            grid,
            block,
            shared,
            params,
            allocations,
        })
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", |state| {
        module_load(state, module, image, "cuModuleLoadData")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _numOptions: c_uint,
    _options: *mut CUjit_option,
    _optionValues: *mut *mut c_void,
) -> CUresult {
    entry("cuModuleLoadDataEx", |state| {
        module_load(state, module, image, "cuModuleLoadDataEx")
    })
}

/// Unloads a module: its functions are invalid from now. It waits for the whole device as the calls that
/// release memory do (`free_now`, `memory.rs`); waiting for work other than the module's own launches is a
/// hidden wait.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    entry("cuModuleUnload", |mut state| {
        let handle = hmod as usize;
        let module = state
            .modules
            .remove(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        state.functions.retain(|_, f| f.module != handle);
        let own_launch = |op: &Op| matches!(op, Op::Kernel(launch) if launch.module == handle);
        drop(device_wait(
            state,
            Some(module.device),
            own_launch,
            "cuModuleUnload",
        ));
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", |mut state| {
        let handle = hmod as usize;
        let module = state
            .modules
            .get(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if hfunc.is_null() || name.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a NUL-terminated name, checked non-null.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        if let Some(&function) = module.functions.get(name) {
            return put(hfunc, function as CUfunction);
        }
        let kernel = kernel::stand_in(name).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        let device = module.device;
        let function = state.handle();
        state.functions.insert(
            function,
            FunctionData {
                module: handle,
                device,
                kernel,
            },
        );
        state
            .modules
            .get_mut(&handle)
            .expect("checked live")
            .functions
            .insert(name.to_vec(), function);
        put(hfunc, function as CUfunction)
    })
}

/// Loads a function's code: already loaded with its module (see `module_load`), so nothing to do.
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncLoad(function: CUfunction) -> CUresult {
    entry("cuFuncLoad", |state| {
        live_function(&state, function).map(drop)
    })
}

/// Every function is loaded with its module (see `module_load`).
#[unsafe(no_mangle)]
pub extern "C" fn cuFuncIsLoaded(
    state_out: *mut CUfunctionLoadingState,
    function: CUfunction,
) -> CUresult {
    entry("cuFuncIsLoaded", |state| {
        live_function(&state, function)?;
        put(
            state_out,
            CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED,
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetParamInfo(
    func: CUfunction,
    paramIndex: usize,
    paramOffset: *mut usize,
    paramSize: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", |state| {
        let kernel = &state.functions[&live_function(&state, func)?].kernel;
        if paramIndex >= kernel.sizes.len() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(paramOffset, kernel.offsets[paramIndex])?;
        if !paramSize.is_null() {
            put(paramSize, kernel.sizes[paramIndex])?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    hfunc: CUfunction,
) -> CUresult {
    entry("cuFuncGetAttribute", |state| {
        use CUfunction_attribute as F;
        live_function(&state, hfunc)?;
        let value = match attrib {
            F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => MAX_THREADS_PER_BLOCK as c_int,
            F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => MAX_SHARED as c_int,
            F::CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
            F::CU_FUNC_ATTRIBUTE_PTX_VERSION | F::CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
            // No preference: the driver's default carveout.
            F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
            a if a.0 >= F::CU_FUNC_ATTRIBUTE_MAX.0 => {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            // Static shared, constant and local memory, cluster requirements: none.
            _ => 0,
        };
        put(pi, value)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncGetName(name: *mut *const c_char, hfunc: CUfunction) -> CUresult {
    entry("cuFuncGetName", |state| {
        let function = live_function(&state, hfunc)?;
        // The name lives as long as the stand-in, which the function holds.
        put(name, state.functions[&function].kernel.name.as_ptr())
    })
}

/// Queues a launch of `f`: its stand-in runs when the stream reaches it, with a copy of the parameters taken
/// now.
#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    entry("cuLaunchKernel", |mut state| {
        let launch = Launch::build(
            &state,
            f,
            [gridDimX, gridDimY, gridDimZ],
            [blockDimX, blockDimY, blockDimZ],
            sharedMemBytes,
            kernelParams,
            extra,
        )?;
        let stream_device = if is_default_stream(hStream) {
            current(&state)?
        } else {
            live_stream(&state, hStream)?.1
        };
        // The function and the stream must be of one context.
        if stream_device != launch.device as usize {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        for &id in &launch.allocations {
            let allocation = &state.allocations[&id];
            if allocation.free_queued {
                let message = format!(
                    "kernel `{}` launched with device memory {:#x} after a stream-ordered free of it was queued",
                    launch.kernel.name(),
                    allocation.base
                );
                state.violation(message);
            }
        }
        submit(state, hStream, Op::Kernel(Arc::new(launch)), false)
    })
}
