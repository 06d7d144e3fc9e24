//! Devices: counts, attributes, names, peer access between devices.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

use super::c_len;
use crate::driver_call;
use crate::error::Result;
use crate::sys::{CUdevice, CUdevice_attribute, CUuuid};

/// `cuDeviceGetCount`: how many devices the driver sees.
pub(crate) fn device_count() -> Result<c_int> {
    let mut count = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetCount(&mut count)) }?;
    Ok(count)
}

/// `cuDeviceGet`: the device with this ordinal (the driver checks it).
pub(crate) fn device_get(ordinal: c_int) -> Result<CUdevice> {
    let mut device = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGet(&mut device, ordinal)) }?;
    Ok(device)
}

/// `cuDeviceGetName`: the device's name, NUL-terminated within `name`.
pub(crate) fn device_name(name: &mut [c_char], device: CUdevice) -> Result<()> {
    // SAFETY: the buffer's pointer with (at most) its length; the driver writes within it.
    unsafe { driver_call!(cuDeviceGetName(name.as_mut_ptr(), c_len(name), device)) }
}

/// `cuDeviceGetUuid_v2`: the device's UUID.
pub(crate) fn device_uuid(device: CUdevice) -> Result<CUuuid> {
    let mut uuid = CUuuid::default();
    // SAFETY: an out-pointer to a local of the type the driver writes.
    unsafe { driver_call!(cuDeviceGetUuid_v2(&mut uuid, device)) }?;
    Ok(uuid)
}

/// `cuDeviceTotalMem_v2`: the device's memory in bytes.
pub(crate) fn device_total_mem(device: CUdevice) -> Result<usize> {
    let mut bytes = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceTotalMem_v2(&mut bytes, device)) }?;
    Ok(bytes)
}

/// `cuDeviceGetPCIBusId`: the device's PCI address, NUL-terminated within `id`.
pub(crate) fn device_pci_bus_id(id: &mut [c_char], device: CUdevice) -> Result<()> {
    // SAFETY: the buffer's pointer with (at most) its length; the driver writes within it.
    unsafe { driver_call!(cuDeviceGetPCIBusId(id.as_mut_ptr(), c_len(id), device)) }
}

/// `cuDeviceGetAttribute`: an integer attribute of the device (the driver checks the attribute).
pub(crate) fn device_attribute(attribute: CUdevice_attribute, device: CUdevice) -> Result<c_int> {
    let mut value = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetAttribute(&mut value, attribute, device)) }?;
    Ok(value)
}
