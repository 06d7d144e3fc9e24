//! Just enough of NVML (libnvidia-ml, shipped with the driver) to read the driver release and the PCIe link,
//! which the CUDA driver API does not report. Optional: the report says "unknown" where it is missing.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use serde::Serialize;

type Init = unsafe extern "C" fn() -> c_int;
type DriverVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
type HandleByBusId = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type LinkQuery = unsafe extern "C" fn(*mut c_void, *mut c_uint) -> c_int;

/// An initialised NVML.
pub struct Nvml {
    lib: libloading::Library,
}

/// A device's PCIe link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Link {
    /// The generation in use now (an idle link drops to a slower one to save power).
    pub generation: u32,
    /// The lanes in use now.
    pub width: u32,
    /// The fastest generation the GPU and its slot support.
    pub max_generation: u32,
    /// The most lanes the GPU supports.
    pub max_width: u32,
}

impl Nvml {
    /// Opens and initialises NVML, or `None` where it is missing or fails to start.
    pub fn open() -> Option<Nvml> {
        let name = if cfg!(windows) {
            "nvml.dll"
        } else {
            "libnvidia-ml.so.1"
        };
        // SAFETY: loading the driver's own NVML library runs only its initialisers.
        let lib = unsafe { libloading::Library::new(name) }.ok()?;
        // SAFETY: nvmlInit_v2 has this signature (nvml.h).
        let init = unsafe { lib.get::<Init>(b"nvmlInit_v2\0") }.ok()?;
        // SAFETY: nvmlInit_v2 takes no arguments and may be called more than once.
        (unsafe { init() } == 0).then_some(Nvml { lib })
    }

    /// The NVIDIA driver release, such as `580.159.04`.
    pub fn driver_release(&self) -> Option<String> {
        // SAFETY: the symbol has this signature in every NVML since 2012.
        let get = unsafe {
            self.lib
                .get::<DriverVersion>(b"nvmlSystemGetDriverVersion\0")
        }
        .ok()?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer's length is passed with it.
        (unsafe { get(buf.as_mut_ptr(), buf.len() as c_uint) } == 0).then(|| c_text(&buf))
    }

    /// The PCIe link of the device at `bus_id` (as `cuDeviceGetPCIBusId` writes it).
    pub fn pcie_link(&self, bus_id: &str) -> Option<Link> {
        let bus_id = CString::new(bus_id).ok()?;
        // SAFETY: these symbols have these signatures (nvml.h).
        let (handle_by_id, generation, width, max_generation, max_width) = unsafe {
            (
                self.lib
                    .get::<HandleByBusId>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                    .ok()?,
                self.lib
                    .get::<LinkQuery>(b"nvmlDeviceGetCurrPcieLinkGeneration\0")
                    .ok()?,
                self.lib
                    .get::<LinkQuery>(b"nvmlDeviceGetCurrPcieLinkWidth\0")
                    .ok()?,
                self.lib
                    .get::<LinkQuery>(b"nvmlDeviceGetMaxPcieLinkGeneration\0")
                    .ok()?,
                self.lib
                    .get::<LinkQuery>(b"nvmlDeviceGetMaxPcieLinkWidth\0")
                    .ok()?,
            )
        };
        let mut device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id and an out-pointer to a local.
        if unsafe { handle_by_id(bus_id.as_ptr(), &mut device) } != 0 {
            return None;
        }
        let query = |f: &LinkQuery| {
            let mut value = 0;
            // SAFETY: a device handle NVML returned and an out-pointer to a local.
            (unsafe { f(device, &mut value) } == 0).then_some(value)
        };
        Some(Link {
            generation: query(&generation)?,
            width: query(&width)?,
            max_generation: query(&max_generation)?,
            max_width: query(&max_width)?,
        })
    }
}

/// The NUL-terminated text at the start of `buf`, which NVML filled.
fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    std::ffi::CStr::from_bytes_until_nul(&bytes).map_or_else(
        |_| String::from_utf8_lossy(&bytes).into_owned(),
        |s| s.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::c_text;

    #[test]
    fn text_ends_at_the_first_nul() {
        let buf = [b'5' as _, b'8' as _, b'0' as _, 0, b'x' as _];
        assert_eq!(c_text(&buf), "580");
        let unterminated = [b'a' as _, b'b' as _];
        assert_eq!(c_text(&unterminated), "ab");
    }
}
