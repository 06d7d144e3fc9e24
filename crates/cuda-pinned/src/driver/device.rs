//! CUDA devices: how many, which, and what they can do.

use std::ffi::{CStr, c_char};
use std::fmt;

use super::calls;
use crate::error::Result;
use crate::sys::{CUdevice, CUdevice_attribute};

/// A CUDA device, by ordinal. Cheap to copy; querying it needs no context.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    ordinal: i32,
    raw: CUdevice,
}

impl Device {
    /// How many CUDA devices the driver sees (`CUDA_VISIBLE_DEVICES` applies).
    ///
    /// # Errors
    /// The loader's error where no driver can be loaded, or the driver's.
    #[doc(alias = "cuDeviceGetCount")]
    pub fn count() -> Result<usize> {
        let count = calls::device_count().map_err(|e| e.context("counting CUDA devices"))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal (0 is the first).
    ///
    /// # Errors
    /// `CUDA_ERROR_INVALID_DEVICE` where there is no such device; the message says how many there are.
    #[doc(alias = "cuDeviceGet")]
    pub fn get(ordinal: usize) -> Result<Device> {
        let ordinal = i32::try_from(ordinal).unwrap_or(i32::MAX);
        let raw = calls::device_get(ordinal).map_err(|e| {
            let count = Device::count()
                .map_or_else(|_| "an unknown number of".to_string(), |n| n.to_string());
            e.context(format_args!(
                "getting device {ordinal} (the machine has {count} CUDA devices)"
            ))
        })?;
        Ok(Device { ordinal, raw })
    }

    /// Every device, in ordinal order.
    ///
    /// # Errors
    /// As [`Device::count`] and [`Device::get`].
    pub fn all() -> Result<Vec<Device>> {
        (0..Device::count()?).map(Device::get).collect()
    }

    /// The ordinal this device was opened with.
    #[must_use]
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// The driver's handle, for interop with other CUDA libraries.
    #[must_use]
    pub fn as_raw(&self) -> CUdevice {
        self.raw
    }

    /// The device's name, such as `NVIDIA H100 80GB HBM3`.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuDeviceGetName")]
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        calls::device_name(&mut buf, self.raw)
            .map_err(|e| e.context(format_args!("reading the name of device {}", self.ordinal)))?;
        Ok(text(&buf))
    }

    /// The device's UUID, the identity that stays the same whatever the ordinal (`nvidia-smi -L` shows it).
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuDeviceGetUuid")]
    pub fn uuid(&self) -> Result<[u8; 16]> {
        let uuid = calls::device_uuid(self.raw)
            .map_err(|e| e.context(format_args!("reading the UUID of device {}", self.ordinal)))?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// The compute capability as (major, minor): (9, 0) for an H100.
    ///
    /// # Errors
    /// The driver's.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        Ok((
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The device's memory in bytes.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuDeviceTotalMem")]
    pub fn total_memory(&self) -> Result<usize> {
        let bytes = calls::device_total_mem(self.raw).map_err(|e| {
            e.context(format_args!(
                "reading the memory size of device {}",
                self.ordinal
            ))
        })?;
        Ok(bytes)
    }

    /// The PCI address, such as `0000:65:00.0`, as `nvidia-smi` and `lspci` show it.
    ///
    /// # Errors
    /// The driver's.
    #[doc(alias = "cuDeviceGetPCIBusId")]
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as c_char; 32];
        calls::device_pci_bus_id(&mut buf, self.raw).map_err(|e| {
            e.context(format_args!(
                "reading the PCI address of device {}",
                self.ordinal
            ))
        })?;
        Ok(text(&buf))
    }

    /// How many copy engines the device has: with two or more, an upload and a download run at the same time.
    ///
    /// # Errors
    /// The driver's.
    pub fn async_engine_count(&self) -> Result<u32> {
        self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)
    }

    /// Whether kernels on the device can read and write mapped pinned host memory directly.
    ///
    /// # Errors
    /// The driver's.
    pub fn can_map_host_memory(&self) -> Result<bool> {
        Ok(self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? != 0)
    }

    /// Whether the device supports stream-ordered allocation (memory pools: `cuMemAllocAsync`,
    /// `cuMemAllocFromPoolAsync`), with which freeing device memory is ordered on a stream instead of waiting.
    ///
    /// # Errors
    /// The driver's.
    pub fn supports_memory_pools(&self) -> Result<bool> {
        Ok(self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0)
    }

    /// Any integer attribute, as the driver reports it.
    ///
    /// # Errors
    /// The driver's, such as `CUDA_ERROR_INVALID_VALUE` for an attribute this driver does not know.
    #[doc(alias = "cuDeviceGetAttribute")]
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<u32> {
        let value = calls::device_attribute(attribute, self.raw).map_err(|e| {
            e.context(format_args!(
                "reading attribute {} of device {}",
                attribute.0, self.ordinal
            ))
        })?;
        Ok(u32::try_from(value).unwrap_or(0))
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.ordinal)
    }
}

/// The NUL-terminated text at the start of a buffer the driver filled.
fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes).map_or_else(
        |_| String::from_utf8_lossy(&bytes).into_owned(),
        |s| s.to_string_lossy().into_owned(),
    )
}
