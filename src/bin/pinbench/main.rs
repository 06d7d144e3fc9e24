//! pinbench: what this machine's host<->GPU link delivers, and what the crate's safety costs.
//!
//! Lists the CUDA devices with their PCIe link, then on device 0:
//! - times a 256 MiB upload from page-locked ("pinned") memory and from ordinary pageable memory, each the
//!   median of 10 copies after 2 warm-up copies, timed with CUDA events on one stream, and checks that each
//!   upload arrived intact;
//! - measures what enqueueing a small (64-byte) asynchronous copy costs the calling thread: through the raw
//!   driver call, through the safe layer on one stream (the tracker's fast path, which records no event), and
//!   through the safe layer alternating between two streams (each copy then waits on the device for the other
//!   stream's previous one).
//!
//! Where no CUDA driver can be loaded, it exits with status 1 and the loader's message.

use std::ffi::c_void;
use std::process::ExitCode;
use std::time::Instant;

use cuda_pinned::{Context, Device, DeviceBuffer, Event, Pinned, Stream, driver_call, sys};

const SIZE: usize = 256 << 20;
const WARMUP: usize = 2;
const REPEATS: usize = 10;
/// Small copies per timed batch: few enough that the driver's queue never fills and blocks the enqueue.
const BATCH: usize = 500;

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
    let devices = Device::all()?;
    for d in &devices {
        let (major, minor) = d.compute_capability()?;
        println!(
            "device {}: {}, compute capability {major}.{minor}, {:.1} GiB, PCI {}, {} copy engines",
            d.ordinal(),
            d.name()?,
            d.total_memory()? as f64 / (1u64 << 30) as f64,
            d.pci_bus_id()?,
            d.async_engine_count()?
        );
    }
    let Some(&device) = devices.first() else {
        println!("no CUDA device: nothing to time");
        return Ok(());
    };

    let context = Context::new(device)?;
    let stream = Stream::new(&context)?;
    let mut pageable = vec![0u8; SIZE];
    // Distinct, non-zero contents, so that a copy that moved nothing or the wrong bytes shows.
    for (i, chunk) in pageable.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    }
    let pinned = Pinned::from_slice(&context, &pageable)?;
    let mut target = DeviceBuffer::<u8>::uninit(&stream, SIZE)?;
    let pinned_s = time_upload(&stream, &mut target, &pageable, |s, t| s.upload(&pinned, t))?;
    let pageable_s = time_upload(&stream, &mut target, &pageable, |s, t| {
        s.upload_pageable(&pageable, t)
    })?;
    // Read the link after the copies: an idle link may have dropped to a slower generation to save power.
    match nvml
        .as_ref()
        .and_then(|n| n.pcie_link(&device.pci_bus_id().ok()?))
    {
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
        ("pinned (cuMemHostAlloc)", pinned_s),
        ("pageable (Vec<u8>)", pageable_s),
    ] {
        println!(
            "  {:<30} {:>9.1} {:>11.3}",
            name,
            SIZE as f64 / seconds / 1e9,
            seconds * 1e3
        );
    }
    println!("  pinned / pageable: {:.2}x", pageable_s / pinned_s);
    drop(target);

    let enqueue = time_enqueue(&context, &stream)?;
    println!();
    println!(
        "enqueueing a 64-byte upload from pinned memory (host time per call, median of {REPEATS} batches of {BATCH}):"
    );
    println!(
        "  {:<44} {:>8.2} us",
        "raw cuMemcpyHtoDAsync_v2",
        enqueue.raw * 1e6
    );
    println!(
        "  {:<44} {:>8.2} us  ({:.2}x raw)",
        "Stream::upload, one stream (no event)",
        enqueue.same_stream * 1e6,
        enqueue.same_stream / enqueue.raw
    );
    println!(
        "  {:<44} {:>8.2} us  ({:.2}x raw)",
        "Stream::upload, alternating two streams",
        enqueue.cross_stream * 1e6,
        enqueue.cross_stream / enqueue.raw
    );
    Ok(())
}

/// The median device time of `REPEATS` uploads of `SIZE` bytes made by `upload`, after checking that one
/// arrived equal to `expected`.
fn time_upload(
    stream: &Stream,
    target: &mut DeviceBuffer<u8>,
    expected: &[u8],
    mut upload: impl FnMut(&Stream, &mut DeviceBuffer<u8>) -> cuda_pinned::Result<()>,
) -> Outcome<f64> {
    let (start, end) = (Event::new(stream.context())?, Event::new(stream.context())?);
    let mut times = Vec::with_capacity(REPEATS);
    for i in 0..WARMUP + REPEATS {
        start.record(stream)?;
        upload(stream, target)?;
        end.record(stream)?;
        end.synchronize()?;
        if i >= WARMUP {
            times.push(end.elapsed_since(&start)?.as_secs_f64());
        }
    }
    let mut back = vec![0u8; SIZE];
    stream.download_pageable(target, &mut back)?;
    if let Some(at) = back.iter().zip(expected).position(|(a, b)| a != b) {
        return Err(format!(
            "the data on the device differs from what was uploaded, from byte {at}"
        )
        .into());
    }
    Ok(median(times))
}

/// Host seconds per enqueued 64-byte upload.
struct Enqueue {
    raw: f64,
    same_stream: f64,
    cross_stream: f64,
}

fn time_enqueue(context: &Context, stream: &Stream) -> Outcome<Enqueue> {
    let other = Stream::new(context)?;
    let small = Pinned::from_slice(context, &[7u8; 64])?;
    let mut device = DeviceBuffer::<u8>::zeroed(stream, 64)?;
    stream.synchronize()?;
    let batches = |enqueue: &mut dyn FnMut(usize) -> cuda_pinned::Result<()>| -> Outcome<f64> {
        let mut times = Vec::new();
        for batch in 0..WARMUP + REPEATS {
            let begin = Instant::now();
            for i in 0..BATCH {
                enqueue(i)?;
            }
            let took = begin.elapsed();
            context.synchronize()?;
            if batch >= WARMUP {
                times.push(took.as_secs_f64() / BATCH as f64);
            }
        }
        Ok(median(times))
    };
    let (dst, src) = (device.as_raw(), small.as_ptr().cast::<c_void>());
    let raw = batches(&mut |_| {
        // SAFETY: 64 bytes of live pinned and device memory; the context is synchronised after each batch,
        // before either buffer can be touched or dropped.
        unsafe { driver_call!(cuMemcpyHtoDAsync_v2(dst, src, 64, stream.as_raw())) }
    })?;
    let same_stream = batches(&mut |_| stream.upload(&small, &mut device))?;
    let cross_stream =
        batches(&mut |i| if i % 2 == 0 { stream } else { &other }.upload(&small, &mut device))?;
    Ok(Enqueue {
        raw,
        same_stream,
        cross_stream,
    })
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The NUL-terminated text at the start of `buf`, which the driver or NVML filled.
fn c_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    std::ffi::CStr::from_bytes_until_nul(&bytes).map_or_else(
        |_| String::from_utf8_lossy(&bytes).into_owned(),
        |s| s.to_string_lossy().into_owned(),
    )
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
