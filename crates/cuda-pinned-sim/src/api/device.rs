//! Initialization (`cuInit`), the driver's version, error strings and `cuGetProcAddress_v2` (not supported),
//! and the devices: their count, names, UUIDs, PCI bus ids, memory and attributes.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::pool::pool_handle;
use super::{Outcome, entry, put};
use crate::codes;
use crate::sim::{PoolData, Primary, SIM};
use crate::sys::*;

pub(super) fn check_device(dev: CUdevice) -> Outcome<usize> {
    (0..SIM.config.devices)
        .contains(&dev)
        .then_some(dev as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// Copies `text` (truncated) and a NUL into `buffer` of `len` bytes.
fn put_str(buffer: *mut c_char, len: c_int, text: &str) -> Outcome {
    if buffer.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller gave `len` writable bytes at `buffer`; n + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
        buffer.add(n).write(0);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", |_| match codes::describe(error) {
        Some((_, description)) => put(pStr, description.as_ptr()),
        None => put(pStr, std::ptr::null()).and(Err(CUresult::CUDA_ERROR_INVALID_VALUE)),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", |_| match codes::describe(error) {
        Some((name, _)) => put(pStr, name.as_ptr()),
        None => put(pStr, std::ptr::null()).and(Err(CUresult::CUDA_ERROR_INVALID_VALUE)),
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    entry("cuInit", |mut state| {
        if Flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(error) = &state.bad_fail_spec {
            eprintln!("cuda-pinned-sim: CUDA_SIM_FAIL: {error}");
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !state.initialized {
            state.primaries = (0..SIM.config.devices)
                .map(|_| Primary::default())
                .collect();
            for device in 0..SIM.config.devices {
                let pool = pool_handle(&state);
                state.pools.insert(pool, PoolData::new(device));
                state.default_pools.push(pool);
            }
            state.initialized = true;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    entry("cuDriverGetVersion", |_| put(driverVersion, 13000))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", |_| {
        put(device, check_device(ordinal)? as CUdevice)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", |_| put(count, SIM.config.devices))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", |_| {
        let device = check_device(dev)?;
        put_str(name, len, &format!("cuda-pinned simulated device {device}"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", |_| {
        let device = check_device(dev)?;
        let mut bytes = *b"cuda-pinned-sim\0";
        bytes[15] = device as u8;
        put(
            uuid,
            CUuuid {
                bytes: bytes.map(|b| b as c_char),
            },
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", |_| {
        check_device(dev)?;
        put(bytes, SIM.config.device_memory)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", |_| {
        let device = check_device(dev)?;
        if attrib.0 == 0 || attrib.0 >= CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        put(pi, crate::attributes::value(attrib, device))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGetPCIBusId(
    pciBusId: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetPCIBusId", |_| {
        let device = check_device(dev)?;
        put_str(pciBusId, len, &format!("0000:{:02x}:00.0", device + 1))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGetProcAddress_v2(
    _symbol: *const c_char,
    _pfn: *mut *mut c_void,
    _cudaVersion: c_int,
    _flags: cuuint64_t,
    _symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    entry("cuGetProcAddress_v2", |_| {
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}
