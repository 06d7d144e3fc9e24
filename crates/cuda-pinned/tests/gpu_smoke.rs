//! Smoke tests of the foundation on a real GPU: the driver loads through the sys layer, device 0 answers,
//! and each kernel of `cuda/kernels.cu` runs once with its result checked on the host.
//!
//! Under feature `gpu` a CUDA machine is the premise: these tests fail, never skip, where there is none.
#![cfg(feature = "gpu")]

mod common;

use std::ffi::{CStr, c_void};

use common::serial;
use std::sync::OnceLock;

use cuda_pinned::driver_call;
use cuda_pinned::kernels::raw as kernels;
use cuda_pinned::sys::{self, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUstream};

/// Device 0's primary context, made current on the calling thread (each test runs on a thread of its own).
fn context() {
    static PRIMARY: OnceLock<usize> = OnceLock::new();
    let ctx = *PRIMARY.get_or_init(|| {
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the primary context is retained for the rest of the test process.
        unsafe {
            driver_call!(cuDeviceGet(&mut dev, 0)).expect("device 0");
            driver_call!(cuDevicePrimaryCtxRetain(&mut ctx, dev))
                .expect("retaining device 0's primary context");
        }
        ctx as usize
    });
    // SAFETY: a context retained above and never released.
    unsafe { driver_call!(cuCtxSetCurrent(ctx as CUcontext)) }
        .expect("making the primary context current");
}

/// A device allocation freed on drop, for these tests only.
struct DeviceMem {
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceMem {
    fn new(bytes: usize) -> DeviceMem {
        let mut ptr = 0;
        // SAFETY: an out-pointer to a local; the allocation is freed in Drop.
        unsafe { driver_call!(cuMemAlloc_v2(&mut ptr, bytes)) }.expect("allocating device memory");
        DeviceMem { ptr, bytes }
    }

    fn upload<T: Copy>(&self, data: &[T]) {
        let bytes = std::mem::size_of_val(data);
        assert!(bytes <= self.bytes);
        // SAFETY: `data` is `bytes` readable bytes; the device range is inside this allocation; the copy is
        // synchronous for pageable memory.
        unsafe { driver_call!(cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), bytes)) }
            .expect("upload");
    }

    fn download<T: Copy>(&self, out: &mut [T]) {
        let bytes = std::mem::size_of_val(out);
        assert!(bytes <= self.bytes);
        // SAFETY: `out` is `bytes` writable bytes of a plain-data type; the device range is inside this
        // allocation; the copy returns when complete.
        unsafe { driver_call!(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, bytes)) }
            .expect("download");
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; every test synchronises its stream before dropping.
        unsafe { driver_call!(cuMemFree_v2(self.ptr)) }.expect("freeing device memory");
    }
}

/// A non-blocking stream destroyed on drop.
struct Stream(CUstream);

impl Stream {
    fn new() -> Stream {
        let mut stream = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; destroyed in Drop.
        unsafe {
            driver_call!(cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0
            ))
        }
        .expect("creating a stream");
        Stream(stream)
    }

    fn sync(&self) {
        // SAFETY: a live stream.
        unsafe { driver_call!(cuStreamSynchronize(self.0)) }.expect("synchronising the stream");
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`; destroying a stream with pending work is allowed (it completes first).
        unsafe { driver_call!(cuStreamDestroy_v2(self.0)) }.expect("destroying a stream");
    }
}

/// Deterministic, non-trivial test data (splitmix64), so that no test passes on zeros.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn driver_loads_and_supports_the_bindings_version() {
    let _serial = serial();
    let driver = sys::driver().expect("the CUDA driver must load under feature `gpu`");
    assert!(
        driver.version() >= sys::CUDA_VERSION as i32,
        "driver version {}",
        driver.version()
    );
    println!("driver {} loaded from {}", driver.version(), driver.path());
}

#[test]
fn device_zero_has_a_name_and_compute_capability() {
    let _serial = serial();
    let mut count = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { driver_call!(cuDeviceGetCount(&mut count)) }.unwrap();
    assert!(count >= 1, "no CUDA device");
    let mut dev = 0;
    let mut name = [0 as std::ffi::c_char; 256];
    let (mut major, mut minor) = (0, 0);
    // SAFETY: out-pointers to locals; the name buffer's length is passed.
    unsafe {
        driver_call!(cuDeviceGet(&mut dev, 0)).unwrap();
        driver_call!(cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)).unwrap();
        let major_attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
        let minor_attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
        driver_call!(cuDeviceGetAttribute(&mut major, major_attr, dev)).unwrap();
        driver_call!(cuDeviceGetAttribute(&mut minor, minor_attr, dev)).unwrap();
    }
    // SAFETY: cuDeviceGetName writes a NUL-terminated string within the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    println!("device 0: {name}, compute capability {major}.{minor}");
    assert!(!name.is_empty());
    // The kernels are built for sm_75 and newer; an older device could not run them.
    assert!(
        (major, minor) >= (7, 5),
        "compute capability {major}.{minor}"
    );
}

/// Fills `n` elements of a device buffer holding random data with `value`, and checks every element and
/// that the elements past `n` were left alone.
fn check_fill<T: Copy + PartialEq + std::fmt::Debug>(
    value: T,
    launch: unsafe extern "C" fn(*mut T, T, usize, CUstream) -> std::ffi::c_int,
    name: &'static str,
) {
    context();
    let n = 1_000_003;
    let guard = 4099;
    let size = std::mem::size_of::<T>();
    let before = random_bytes((n + guard) * size, size as u64);
    let mem = DeviceMem::new(before.len());
    mem.upload(&before);
    let stream = Stream::new();
    // SAFETY: `mem` holds n + guard elements of T; the stream is live and synchronised before `mem` drops.
    kernels::check_launch(
        unsafe { launch(mem.ptr as *mut T, value, n, stream.0) },
        name,
    )
    .unwrap();
    stream.sync();
    let mut after = vec![0u8; before.len()];
    mem.download(&mut after);
    for (i, chunk) in after[..n * size].chunks_exact(size).enumerate() {
        // SAFETY: `chunk` is `size_of::<T>()` bytes and T is a plain integer type, valid for any bytes.
        let got = unsafe { chunk.as_ptr().cast::<T>().read_unaligned() };
        assert_eq!(got, value, "{name}: element {i}");
    }
    assert_eq!(
        after[n * size..],
        before[n * size..],
        "{name} wrote past its {n} elements"
    );
}

#[test]
fn fill_writes_every_element_and_nothing_more() {
    let _serial = serial();
    check_fill(0xa5u8, kernels::cuda_pinned_fill_u8, "cuda_pinned_fill_u8");
    check_fill(
        0xbeefu16,
        kernels::cuda_pinned_fill_u16,
        "cuda_pinned_fill_u16",
    );
    check_fill(
        0xdead_beefu32,
        kernels::cuda_pinned_fill_u32,
        "cuda_pinned_fill_u32",
    );
    check_fill(
        0x0123_4567_89ab_cdefu64,
        kernels::cuda_pinned_fill_u64,
        "cuda_pinned_fill_u64",
    );
}

#[test]
fn axpy_matches_the_host() {
    let _serial = serial();
    context();
    let n = 3_000_017;
    let to_floats = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| (u32::from_le_bytes(c.try_into().unwrap()) >> 8) as f32 / 65536.0 - 128.0)
            .collect()
    };
    let x = to_floats(random_bytes(n * 4, 11));
    let y = to_floats(random_bytes(n * 4, 12));
    let a = 1.75f32;
    let (dx, dy) = (DeviceMem::new(n * 4), DeviceMem::new(n * 4));
    dx.upload(&x);
    dy.upload(&y);
    let stream = Stream::new();
    // SAFETY: both buffers hold n floats; synchronised before they drop.
    let code = unsafe {
        kernels::cuda_pinned_axpy_f32(a, dx.ptr as *const f32, dy.ptr as *mut f32, n, stream.0)
    };
    kernels::check_launch(code, "cuda_pinned_axpy_f32").unwrap();
    stream.sync();
    let mut out = vec![0f32; n];
    dy.download(&mut out);
    for i in 0..n {
        // The device may fuse the multiply-add: allow for the one rounding that saves.
        let expected = a.mul_add(x[i], y[i]);
        let tolerance = f32::EPSILON * (a * x[i]).abs().max(y[i].abs()).max(1.0) * 2.0;
        assert!(
            (out[i] - expected).abs() <= tolerance,
            "element {i}: {} vs {expected}",
            out[i]
        );
    }
}

#[test]
fn checksum_on_the_device_equals_the_host_reference() {
    let _serial = serial();
    context();
    let len = (64 << 20) + 13;
    let data = random_bytes(len + 8, 21);
    let mem = DeviceMem::new(data.len());
    mem.upload(&data);
    let out = DeviceMem::new(8);
    let stream = Stream::new();
    // Aligned and unaligned starts, odd lengths, and the empty range.
    for (offset, len) in [
        (0, len),
        (3, len),
        (1, 1),
        (5, 7),
        (8, 8),
        (0, 9),
        (7, 1000),
        (2, 0),
    ] {
        let range = &data[offset..offset + len];
        // SAFETY: [ptr + offset, + len) is inside `mem`, `out` holds a u64; synchronised before reading.
        let code = unsafe {
            let start = (mem.ptr + offset as u64) as *const c_void;
            kernels::cuda_pinned_checksum(start, len, out.ptr as *mut u64, stream.0)
        };
        kernels::check_launch(code, "cuda_pinned_checksum").unwrap();
        stream.sync();
        let mut device = [0u64];
        out.download(&mut device);
        assert_eq!(
            device[0],
            cuda_pinned::kernels::checksum(range),
            "offset {offset}, {len} bytes"
        );
    }
}

#[test]
fn spin_keeps_its_stream_busy_for_the_time_asked() {
    let _serial = serial();
    context();
    let stream = Stream::new();
    let (mut start, mut end) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut ms = 0f32;
    let spin_ns = 20_000_000;
    // SAFETY: out-pointers to locals; the events are recorded on a live stream, synchronised before
    // reading, and destroyed at the end.
    unsafe {
        driver_call!(cuEventCreate(&mut start, 0)).unwrap();
        driver_call!(cuEventCreate(&mut end, 0)).unwrap();
        driver_call!(cuEventRecord(start, stream.0)).unwrap();
        kernels::check_launch(
            kernels::cuda_pinned_spin(spin_ns, stream.0),
            "cuda_pinned_spin",
        )
        .unwrap();
        driver_call!(cuEventRecord(end, stream.0)).unwrap();
        // The kernel is still spinning: the stream must not be idle yet.
        let busy = driver_call!(cuStreamQuery(stream.0))
            .expect_err("stream idle right after a 20 ms spin");
        assert_eq!(
            busy.driver_code(),
            Some(sys::CUresult::CUDA_ERROR_NOT_READY),
            "{busy}"
        );
        driver_call!(cuEventSynchronize(end)).unwrap();
        driver_call!(cuEventElapsedTime_v2(&mut ms, start, end)).unwrap();
        driver_call!(cuEventDestroy_v2(start)).unwrap();
        driver_call!(cuEventDestroy_v2(end)).unwrap();
    }
    println!("spin of {} ms took {ms:.3} ms", spin_ns / 1_000_000);
    // A lower bound only: the kernel must wait at least as long as asked (the event clock's resolution is
    // about half a microsecond).
    assert!(ms >= 19.99, "spin of 20 ms took {ms} ms");
}

#[test]
fn launch_errors_read_in_the_runtimes_words() {
    let _serial = serial();
    let e = kernels::check_launch(1, "cuda_pinned_fill_u32").unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("cudaErrorInvalidValue (1): "), "{text}");
    assert!(text.ends_with(", in cuda_pinned_fill_u32"), "{text}");
    kernels::check_launch(0, "cuda_pinned_fill_u32").unwrap();
}
