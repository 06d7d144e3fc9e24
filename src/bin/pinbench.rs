//! pinbench: what this machine's host<->GPU link delivers, and how much pinned memory matters.
//!
//! Lists the CUDA devices with their PCIe link, then times a 256 MiB upload to device 0 from page-locked
//! ("pinned") memory and from ordinary pageable memory, each the median of 10 copies after 2 warm-up copies,
//! timed with CUDA events on one stream, and checks that each upload arrived intact.
//!
//! Where no CUDA driver can be loaded, it exits with status 1 and the loader's message.

use std::ffi::{CStr, c_char, c_void};
use std::process::ExitCode;

use cuda_pinned::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUstream,
};
use cuda_pinned::{Result, driver_call};

const SIZE: usize = 256 << 20;
const WARMUP: usize = 2;
const REPEATS: usize = 10;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinbench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// pinbench's own failures (corrupted data) beside the crate's.
type Outcome<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run() -> Outcome<()> {
    let driver = sys::driver()?;
    let nvml = nvml::Nvml::open();
    let version = driver.version();
    print!(
        "CUDA driver: supports CUDA {}.{}",
        version / 1000,
        version % 1000 / 10
    );
    if let Some(release) = nvml.as_ref().and_then(nvml::Nvml::driver_release) {
        print!(", NVIDIA driver {release}");
    }
    println!(" ({})", driver.path());

    let mut count = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetCount(&mut count)) }
        .map_err(|e| e.context("counting CUDA devices"))?;
    let devices = (0..count).map(Device::get).collect::<Result<Vec<_>>>()?;
    for d in &devices {
        println!(
            "device {}: {}, compute capability {}.{}, {:.1} GiB, PCI {}",
            d.ordinal,
            d.name,
            d.cc.0,
            d.cc.1,
            d.memory as f64 / (1u64 << 30) as f64,
            d.bus_id
        );
    }
    let Some(device) = devices.first() else {
        println!("no CUDA device: nothing to time");
        return Ok(());
    };

    let bench = Bench::new(device)?;
    let pinned = bench.time_upload(bench.pinned.ptr.cast_const())?;
    let pageable = bench.time_upload(bench.pageable.as_ptr().cast())?;
    // Read the link after the copies: an idle link may have dropped to a slower generation to save power.
    let link = nvml.as_ref().and_then(|n| n.pcie_link(&device.bus_id));
    match link {
        Some(l) => println!(
            "PCIe link of device 0 under load: gen {} x{} (the GPU supports up to gen {} x{})",
            l.generation, l.width, l.max_generation, l.max_width
        ),
        None => {
            println!("PCIe link of device 0: unknown (NVML, libnvidia-ml.so.1, could not be read)")
        }
    }
    println!();
    println!(
        "upload of {} MiB to device 0, median of {REPEATS} after {WARMUP} warm-up copies:",
        SIZE >> 20
    );
    println!("  {:<30} {:>9} {:>11}", "host memory", "GB/s", "ms");
    for (name, seconds) in [
        ("pinned (cuMemHostAlloc)", pinned),
        ("pageable (Vec<u8>)", pageable),
    ] {
        println!(
            "  {:<30} {:>9.1} {:>11.3}",
            name,
            gb_per_s(seconds),
            seconds * 1e3
        );
    }
    println!("  pinned / pageable: {:.2}x", pageable / pinned);
    Ok(())
}

fn gb_per_s(seconds: f64) -> f64 {
    SIZE as f64 / seconds / 1e9
}

/// What pinbench reports of a device.
struct Device {
    ordinal: i32,
    handle: CUdevice,
    name: String,
    cc: (i32, i32),
    memory: usize,
    bus_id: String,
}

impl Device {
    fn get(ordinal: i32) -> Result<Device> {
        let mut handle = 0;
        let mut name = [0 as c_char; 256];
        let mut bus_id = [0 as c_char; 32];
        let (mut major, mut minor, mut memory) = (0, 0, 0);
        let major_attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
        let minor_attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
        let mut read = || -> Result<()> {
            // SAFETY: out-pointers to locals; each buffer's length is passed with it.
            unsafe {
                driver_call!(cuDeviceGet(&mut handle, ordinal))?;
                driver_call!(cuDeviceGetName(
                    name.as_mut_ptr(),
                    name.len() as i32,
                    handle
                ))?;
                driver_call!(cuDeviceGetAttribute(&mut major, major_attr, handle))?;
                driver_call!(cuDeviceGetAttribute(&mut minor, minor_attr, handle))?;
                driver_call!(cuDeviceTotalMem_v2(&mut memory, handle))?;
                driver_call!(cuDeviceGetPCIBusId(
                    bus_id.as_mut_ptr(),
                    bus_id.len() as i32,
                    handle
                ))
            }
        };
        read()
            .map_err(|e| e.context(format_args!("reading the properties of device {ordinal}")))?;
        Ok(Device {
            ordinal,
            handle,
            name: c_text(&name),
            cc: (major, minor),
            memory,
            bus_id: c_text(&bus_id),
        })
    }
}

/// The NUL-terminated text at the start of `buf`, which the driver filled.
fn c_text(buf: &[c_char]) -> String {
    // SAFETY: c_char and u8 have the same size and alignment; the slice covers the same bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) };
    CStr::from_bytes_until_nul(bytes).map_or_else(
        |_| String::from_utf8_lossy(bytes).into(),
        |s| s.to_string_lossy().into(),
    )
}

/// Everything one timing run needs on device 0, released in reverse order on drop (also on an early error).
struct Bench {
    pageable: Vec<u8>,
    pinned: PinnedHost,
    device: DeviceAlloc,
    start: Event,
    end: Event,
    stream: Stream,
    _context: PrimaryContext,
}

impl Bench {
    fn new(device: &Device) -> Result<Bench> {
        let context = PrimaryContext::retain(device.handle)?;
        let stream = Stream::new()?;
        let (start, end) = (Event::new()?, Event::new()?);
        let device = DeviceAlloc::new(SIZE)?;
        let pinned = PinnedHost::new(SIZE)?;
        // Distinct, non-zero contents, so that a copy that moved nothing or the wrong bytes shows.
        let mut pageable = vec![0u8; SIZE];
        for (i, chunk) in pageable.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
        }
        // SAFETY: `pinned` holds SIZE bytes, allocated above and not yet shared with the device.
        unsafe { std::slice::from_raw_parts_mut(pinned.ptr.cast::<u8>(), SIZE) }
            .copy_from_slice(&pageable);
        Ok(Bench {
            pageable,
            pinned,
            device,
            start,
            end,
            stream,
            _context: context,
        })
    }

    /// The median time of `REPEATS` uploads of SIZE bytes from `src`, after checking that one arrived intact.
    fn time_upload(&self, src: *const c_void) -> Outcome<f64> {
        let mut times = Vec::with_capacity(REPEATS);
        for i in 0..WARMUP + REPEATS {
            let mut ms = 0f32;
            // SAFETY: `src` is SIZE readable bytes (the pinned or pageable buffer of `self`) and the device
            // allocation holds SIZE bytes; the stream is synchronised (through `end`) before the buffers can
            // be touched or dropped.
            unsafe {
                driver_call!(cuEventRecord(self.start.0, self.stream.0))?;
                driver_call!(cuMemcpyHtoDAsync_v2(
                    self.device.ptr,
                    src,
                    SIZE,
                    self.stream.0
                ))?;
                driver_call!(cuEventRecord(self.end.0, self.stream.0))?;
                driver_call!(cuEventSynchronize(self.end.0))?;
                driver_call!(cuEventElapsedTime_v2(&mut ms, self.start.0, self.end.0))?;
            }
            if i >= WARMUP {
                times.push(f64::from(ms) / 1e3);
            }
        }
        self.verify()?;
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Downloads the device buffer and compares it with what was uploaded.
    fn verify(&self) -> Outcome<()> {
        let mut back = vec![0u8; SIZE];
        // SAFETY: `back` is SIZE writable bytes; the device allocation holds SIZE bytes; the synchronous copy
        // returns when complete.
        unsafe {
            driver_call!(cuMemcpyDtoH_v2(
                back.as_mut_ptr().cast(),
                self.device.ptr,
                SIZE
            ))
        }?;
        match back.iter().zip(&self.pageable).position(|(a, b)| a != b) {
            Some(at) => Err(format!(
                "the data on the device differs from what was uploaded, from byte {at}"
            )
            .into()),
            None => Ok(()),
        }
    }
}

/// Device 0's primary context, current on this thread while it lives.
struct PrimaryContext(CUdevice);

impl PrimaryContext {
    fn retain(device: CUdevice) -> Result<PrimaryContext> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; released in Drop.
        unsafe { driver_call!(cuDevicePrimaryCtxRetain(&mut ctx, device)) }?;
        let guard = PrimaryContext(device);
        // SAFETY: `ctx` was just retained and stays alive until `guard` drops.
        unsafe { driver_call!(cuCtxSetCurrent(ctx)) }?;
        Ok(guard)
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: retained in `retain`; everything allocated in it was released before (field order of Bench).
        // A failure here leaves the context retained until exit, which is harmless in a benchmark.
        let _ = unsafe { driver_call!(cuDevicePrimaryCtxRelease_v2(self.0)) };
    }
}

struct Stream(CUstream);

impl Stream {
    fn new() -> Result<Stream> {
        let mut stream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // SAFETY: an out-pointer to a local; destroyed in Drop.
        unsafe { driver_call!(cuStreamCreate(&mut stream, flags)) }?;
        Ok(Stream(stream))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`; pending work completes before the driver releases it.
        let _ = unsafe { driver_call!(cuStreamDestroy_v2(self.0)) };
    }
}

struct Event(CUevent);

impl Event {
    fn new() -> Result<Event> {
        let mut event = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; destroyed in Drop.
        unsafe {
            driver_call!(cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DEFAULT.0
            ))
        }?;
        Ok(Event(event))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`.
        let _ = unsafe { driver_call!(cuEventDestroy_v2(self.0)) };
    }
}

struct DeviceAlloc {
    ptr: CUdeviceptr,
}

impl DeviceAlloc {
    fn new(bytes: usize) -> Result<DeviceAlloc> {
        let mut ptr = 0;
        // SAFETY: an out-pointer to a local; freed in Drop.
        unsafe { driver_call!(cuMemAlloc_v2(&mut ptr, bytes)) }
            .map_err(|e| e.context(format_args!("allocating {} MiB on the device", bytes >> 20)))?;
        Ok(DeviceAlloc { ptr })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; every copy using it was synchronised before Bench drops.
        let _ = unsafe { driver_call!(cuMemFree_v2(self.ptr)) };
    }
}

struct PinnedHost {
    ptr: *mut c_void,
}

impl PinnedHost {
    fn new(bytes: usize) -> Result<PinnedHost> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; freed in Drop.
        unsafe { driver_call!(cuMemHostAlloc(&mut ptr, bytes, 0)) }.map_err(|e| {
            e.context(format_args!(
                "allocating {} MiB of pinned host memory",
                bytes >> 20
            ))
        })?;
        Ok(PinnedHost { ptr })
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; every copy reading it was synchronised before Bench drops.
        let _ = unsafe { driver_call!(cuMemFreeHost(self.ptr)) };
    }
}

/// Just enough of NVML (libnvidia-ml, shipped with the driver) to read the driver release and PCIe link,
/// which the CUDA driver API does not report. Optional: pinbench says so where it is missing.
mod nvml {
    use std::ffi::{CString, c_char, c_int, c_uint, c_void};

    type Init = unsafe extern "C" fn() -> c_int;
    type DriverVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
    type HandleByBusId = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
    type LinkQuery = unsafe extern "C" fn(*mut c_void, *mut c_uint) -> c_int;

    pub struct Nvml {
        lib: libloading::Library,
    }

    pub struct Link {
        pub generation: u32,
        pub width: u32,
        pub max_generation: u32,
        pub max_width: u32,
    }

    impl Nvml {
        pub fn open() -> Option<Nvml> {
            let name = if cfg!(windows) {
                "nvml.dll"
            } else {
                "libnvidia-ml.so.1"
            };
            // SAFETY: loading the driver's own NVML library runs only its initialisers.
            let lib = unsafe { libloading::Library::new(name) }.ok()?;
            // SAFETY: nvmlInit_v2 has this signature and takes no arguments.
            let init = unsafe { lib.get::<Init>(b"nvmlInit_v2\0") }.ok()?;
            // SAFETY: as above.
            (unsafe { init() } == 0).then_some(Nvml { lib })
        }

        pub fn driver_release(&self) -> Option<String> {
            // SAFETY: the symbol has this signature in every NVML since 2012.
            let get = unsafe {
                self.lib
                    .get::<DriverVersion>(b"nvmlSystemGetDriverVersion\0")
            }
            .ok()?;
            let mut buf = [0 as c_char; 96];
            // SAFETY: the buffer's length is passed with it.
            (unsafe { get(buf.as_mut_ptr(), buf.len() as c_uint) } == 0)
                .then(|| super::c_text(&buf))
        }

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
}
