//! Modules and kernel launches on the simulated driver, through raw driver calls: any image loads, its kernels
//! are the stand-ins the tests register, and a launch runs its stand-in in stream order on the memory it is
//! given. Each rule beside its control: a bad launch is refused where a good one runs; a stand-in that reads
//! freed memory or panics is a violation where the same launch on live memory is not.
//!
//! The simulator runs two devices here; every test holds it for itself (`exclusive`), since violations and
//! the error they leave for the next driver call are the whole process's.

#[macro_use]
mod common;

use std::ffi::{CStr, c_void};
use std::sync::Once;
use std::time::Duration;

use cuda_pinned_sim::{Control, Exclusive, Settings};
use cuda_pinned_sys::{
    CUcontext, CUdevice_attribute, CUdeviceptr, CUfunction, CUfunction_attribute, CUmodule,
    CUresult, CUstream,
};

/// Any image: the simulator loads whatever it is given.
const IMAGE: &CStr = c".version 8.0\n.target sm_90\n.address_size 64\n";

/// The simulator, two devices, and the stand-ins of the tests, registered once.
fn sim() -> &'static Control {
    let sim = cuda_pinned_sim::install_with(
        Settings::new()
            .devices(2)
            .max_delay(Duration::from_micros(50)),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    static STAND_INS: Once = Once::new();
    STAND_INS.call_once(|| {
        // y[i] = 2 x[i] for the i below both n and the threads launched.
        sim.register_kernel("double", &[8, 8, 4], |call| {
            let (x, y, n) = (call.arg::<u64>(0), call.arg::<u64>(1), call.arg::<u32>(2));
            let threads: u64 = call
                .grid()
                .iter()
                .chain(&call.block())
                .fold(1u64, |threads, &d| threads.saturating_mul(u64::from(d)));
            let n = u64::from(n).min(threads) as usize;
            let doubled: Vec<f32> = call.read::<f32>(x, n).iter().map(|v| 2.0 * v).collect();
            call.write(y, &doubled);
        })
        .unwrap();
        sim.register_kernel("explodes", &[4], |call| {
            let value = call.arg::<u32>(0);
            panic!("boom {value}");
        })
        .unwrap();
        // Reads its 8-byte parameter as 4 bytes: a mistake of the stand-in, reported like a panic.
        sim.register_kernel("wrong_arg", &[8], |call| {
            let _ = call.arg::<u32>(0);
        })
        .unwrap();
        sim.register_kernel("nothing", &[], |_| {}).unwrap();
    });
    sim
}

/// While it lives, panics on threads other than the one that made it print nothing (the default hook is
/// back once it drops): for a test whose stand-ins panic on purpose on the stream's thread.
struct QuietPanics;

impl QuietPanics {
    fn elsewhere() -> QuietPanics {
        let test = std::thread::current().id();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() == test {
                previous(info);
            }
        }));
        QuietPanics
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        drop(std::panic::take_hook());
    }
}

/// The primary context of `device`, current on the calling thread until dropped (released then), with the
/// simulator held for the test.
struct Test {
    sim: Exclusive<'static>,
    device: i32,
}

impl Test {
    fn on(device: i32) -> Test {
        let sim = sim().exclusive();
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the context is popped and released in `drop`.
        unsafe {
            ok!(cuDevicePrimaryCtxRetain(&mut context, device));
            ok!(cuCtxPushCurrent_v2(context));
        }
        Test { sim, device }
    }

    fn stream(&self) -> CUstream {
        let mut stream = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; a context is current.
        unsafe { ok!(cuStreamCreate(&mut stream, 0)) };
        stream
    }

    fn alloc(&self, values: &[f32]) -> CUdeviceptr {
        let mut p = 0;
        let bytes = std::mem::size_of_val(values);
        // SAFETY: an out-pointer to a local, then `bytes` readable bytes copied into the new allocation.
        unsafe {
            ok!(cuMemAlloc_v2(&mut p, bytes));
            ok!(cuMemcpyHtoD_v2(p, values.as_ptr().cast(), bytes));
        }
        p
    }

    fn download(&self, p: CUdeviceptr, len: usize) -> Vec<f32> {
        let mut values = vec![0f32; len];
        // SAFETY: `len` floats of writable memory, from `len` floats of device memory.
        unsafe { ok!(cuMemcpyDtoH_v2(values.as_mut_ptr().cast(), p, len * 4)) };
        values
    }

    fn module(&self) -> CUmodule {
        let mut module = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a NUL-terminated image.
        unsafe { ok!(cuModuleLoadData(&mut module, IMAGE.as_ptr().cast())) };
        module
    }

    fn function(&self, module: CUmodule, name: &CStr) -> Result<CUfunction, CUresult> {
        let mut function = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local, a module and a NUL-terminated name.
        match unsafe { raw!(cuModuleGetFunction(&mut function, module, name.as_ptr())) } {
            CUresult::CUDA_SUCCESS => Ok(function),
            code => Err(code),
        }
    }

    /// Launches `double(x, y, n)` with `grid` blocks of `block` threads on `stream`; the launch's code.
    fn double(
        &self,
        function: CUfunction,
        (grid, block): ([u32; 3], [u32; 3]),
        stream: CUstream,
        (x, y, n): (CUdeviceptr, CUdeviceptr, u32),
    ) -> CUresult {
        let mut params = [
            (&raw const x).cast_mut().cast::<c_void>(),
            (&raw const y).cast_mut().cast(),
            (&raw const n).cast_mut().cast(),
        ];
        // SAFETY: one pointer per parameter of `double`, each to a value of its size, read during the call.
        unsafe {
            raw!(cuLaunchKernel(
                function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ))
        }
    }

    /// The error the last violation leaves for the next driver call, which this call takes.
    fn take_error(&self) -> CUresult {
        let mut count = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { raw!(cuDeviceGetCount(&mut count)) }
    }

    /// Waits for `stream`, whose work makes a violation: the error it leaves fails one driver call, the
    /// synchronization itself where the work ran before it was called, else the next call.
    fn sync_after_violation(&self, stream: CUstream) {
        // SAFETY: a live stream.
        let first = unsafe { raw!(cuStreamSynchronize(stream)) };
        if first == CUresult::CUDA_ERROR_ILLEGAL_ADDRESS {
            // It failed before waiting.
            // SAFETY: a live stream.
            unsafe { ok!(cuStreamSynchronize(stream)) };
        } else {
            assert_eq!(first, CUresult::CUDA_SUCCESS);
            assert_eq!(self.take_error(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        // Once only.
        assert_eq!(self.take_error(), CUresult::CUDA_SUCCESS);
    }
}

impl Drop for Test {
    fn drop(&mut self) {
        // SAFETY: pushed and retained in `on`.
        unsafe {
            let _ = raw!(cuCtxSynchronize());
            let _ = raw!(cuCtxPopCurrent_v2(std::ptr::null_mut()));
            let _ = raw!(cuDevicePrimaryCtxRelease_v2(self.device));
        }
    }
}

fn floats(len: usize) -> Vec<f32> {
    (0..len).map(|i| i as f32 + 0.5).collect()
}

#[test]
fn a_stand_in_doubles_a_buffer_in_stream_order() {
    let test = Test::on(0);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    // The parameters, as the driver describes them: naturally aligned, the size optional.
    let (mut offset, mut size) = (0, 0);
    for (index, expected) in [(0, (0, 8)), (1, (8, 8)), (2, (16, 4))] {
        // SAFETY: out-pointers to locals and a live function.
        unsafe { ok!(cuFuncGetParamInfo(function, index, &mut offset, &mut size)) };
        assert_eq!((offset, size), expected, "parameter {index}");
    }
    // SAFETY: as above, with no size wanted.
    unsafe {
        ok!(cuFuncGetParamInfo(
            function,
            1,
            &mut offset,
            std::ptr::null_mut()
        ))
    };
    assert_eq!(offset, 8);
    // SAFETY: as above.
    let past = unsafe { raw!(cuFuncGetParamInfo(function, 3, &mut offset, &mut size)) };
    assert_eq!(past, CUresult::CUDA_ERROR_INVALID_VALUE);
    let mut name = std::ptr::null();
    let mut threads = 0;
    // SAFETY: out-pointers to locals and a live function; the name lives as long as the function.
    unsafe {
        ok!(cuFuncGetName(&mut name, function));
        assert_eq!(CStr::from_ptr(name), c"double");
        ok!(cuFuncGetAttribute(
            &mut threads,
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            function
        ));
    }
    assert_eq!(threads, 1024);
    // The same name gives the same function.
    assert_eq!(test.function(module, c"double"), Ok(function));

    const N: usize = 4096;
    let input = floats(N);
    let (x, y) = (test.alloc(&input), test.alloc(&vec![0.0; N]));
    let stream = test.stream();
    let shape = ([N as u32 / 256, 1, 1], [256, 1, 1]);
    assert_eq!(
        test.double(function, shape, stream, (x, y, N as u32)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: a live stream.
    unsafe { ok!(cuStreamSynchronize(stream)) };
    let doubled: Vec<f32> = input.iter().map(|v| 2.0 * v).collect();
    assert_eq!(test.download(y, N), doubled);

    // The control: a launch of half the threads leaves the other half of y as it was.
    let z = test.alloc(&vec![0.0; N]);
    let half = ([N as u32 / 512, 1, 1], [256, 1, 1]);
    assert_eq!(
        test.double(function, half, stream, (x, z, N as u32)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: a live stream.
    unsafe { ok!(cuStreamSynchronize(stream)) };
    let out = test.download(z, N);
    assert_eq!(out[..N / 2], doubled[..N / 2]);
    assert!(out[N / 2..].iter().all(|&v| v == 0.0));

    // On the null stream, the launch runs before the call returns.
    let w = test.alloc(&vec![0.0; N]);
    assert_eq!(
        test.double(function, shape, std::ptr::null_mut(), (x, w, N as u32)),
        CUresult::CUDA_SUCCESS
    );
    assert_eq!(test.download(w, N), doubled);

    assert_eq!(test.sim.live().modules, 1);
    // SAFETY: live handles, no work queued on them.
    unsafe {
        ok!(cuStreamDestroy_v2(stream));
        for p in [x, y, z, w] {
            ok!(cuMemFree_v2(p));
        }
        ok!(cuModuleUnload(module));
    }
    assert_eq!(test.sim.live().modules, 0);
    assert!(
        test.sim.new_violations().is_empty(),
        "{:?}",
        test.sim.new_violations()
    );
}

#[test]
fn a_kernel_without_a_stand_in_is_not_found() {
    let test = Test::on(0);
    let module = test.module();
    assert_eq!(
        test.function(module, c"no_such_kernel"),
        Err(CUresult::CUDA_ERROR_NOT_FOUND)
    );
    // The control: a registered name is found.
    assert!(test.function(module, c"double").is_ok());
    // SAFETY: a live module, then the same handle once unloaded, which the driver refuses.
    unsafe {
        ok!(cuModuleUnload(module));
        assert_eq!(
            raw!(cuModuleUnload(module)),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            raw!(cuModuleUnload(std::ptr::null_mut())),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
    }
    assert_eq!(
        test.function(module, c"double"),
        Err(CUresult::CUDA_ERROR_INVALID_HANDLE)
    );
    // A null image is refused; anything else loads.
    let mut other = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, and a null image, which the driver refuses.
    unsafe {
        assert_eq!(
            raw!(cuModuleLoadData(&mut other, std::ptr::null())),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        let fatbin = [0x50u8, 0xED, 0x55, 0xBA, 1, 0, 0, 0];
        ok!(cuModuleLoadDataEx(
            &mut other,
            fatbin.as_ptr().cast(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        ));
        ok!(cuModuleUnload(other));
    }
    // Stand-ins that cannot be: the testkit says why.
    assert!(test.sim.register_kernel("bad\0name", &[8], |_| {}).is_err());
    assert!(
        test.sim
            .register_kernel("zero", &[8, 0], |_| {})
            .unwrap_err()
            .contains("size 0")
    );
    assert!(test.sim.register_kernel("huge", &[40_000], |_| {}).is_err());
    assert!(test.sim.new_violations().is_empty());
}

#[test]
fn launches_outside_the_limits_are_refused() {
    let test = Test::on(0);
    let attribute = |a| {
        let mut value = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { ok!(cuDeviceGetAttribute(&mut value, a, 0)) };
        value
    };
    use CUdevice_attribute as D;
    assert_eq!(
        [
            D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
            D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
            D::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
            D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
            D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
            D::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
            D::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            D::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
        ]
        .map(attribute),
        [2147483647, 65535, 65535, 1024, 1024, 64, 1024, 49152]
    );

    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let (x, y) = (test.alloc(&[1.0; 64]), test.alloc(&[0.0; 64]));
    let stream = test.stream();
    let args = (x, y, 64);
    let refused = [
        ([0, 1, 1], [64, 1, 1]),
        ([1, 1, 1], [0, 1, 1]),
        ([1, 1, 1], [1025, 1, 1]),
        ([1, 1, 1], [32, 32, 2]),
        ([1, 1, 1], [1, 1, 65]),
        ([1, 65536, 1], [64, 1, 1]),
        ([1, 1, 65536], [64, 1, 1]),
        ([1 << 31, 1, 1], [64, 1, 1]),
    ];
    for shape in refused {
        assert_eq!(
            test.double(function, shape, stream, args),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "{shape:?}"
        );
    }
    // The controls: the largest shapes run.
    let largest = [
        ([2147483647, 65535, 65535], [1024, 1, 1]),
        ([1, 1, 1], [1, 1024, 1]),
        ([1, 1, 1], [16, 1, 64]),
    ];
    for shape in largest {
        assert_eq!(
            test.double(function, shape, stream, args),
            CUresult::CUDA_SUCCESS,
            "{shape:?}"
        );
    }
    // SAFETY: a live stream.
    unsafe { ok!(cuStreamSynchronize(stream)) };
    assert_eq!(test.download(y, 64), [2.0; 64]);

    // Arguments the driver refuses: no function, no parameters, `extra`, too much shared memory.
    let mut n = 64u32;
    let mut params = [(&raw mut n).cast::<c_void>()];
    // SAFETY: launches the driver refuses before reading any parameter.
    unsafe {
        assert_eq!(
            raw!(cuLaunchKernel(
                std::ptr::null_mut(),
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            )),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            raw!(cuLaunchKernel(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut()
            )),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            raw!(cuLaunchKernel(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                params.as_mut_ptr()
            )),
            CUresult::CUDA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            raw!(cuLaunchKernel(
                function,
                1,
                1,
                1,
                1,
                1,
                1,
                49153,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            )),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
    // A kernel without parameters needs none.
    let nothing = test.function(module, c"nothing").unwrap();
    // SAFETY: `nothing` takes no parameters.
    unsafe {
        ok!(cuLaunchKernel(
            nothing,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        ));
    }

    // SAFETY: live handles.
    unsafe {
        ok!(cuStreamSynchronize(stream));
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuMemFree_v2(x));
        ok!(cuMemFree_v2(y));
        ok!(cuModuleUnload(module));
    }
    assert!(
        test.sim.new_violations().is_empty(),
        "{:?}",
        test.sim.new_violations()
    );
}

#[test]
fn a_stream_of_another_context_is_refused() {
    let test = Test::on(0);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let (x, y) = (test.alloc(&[1.0; 4]), test.alloc(&[0.0; 4]));
    // A stream of device 1's context.
    let mut other: CUcontext = std::ptr::null_mut();
    let mut stream = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; device 1's context made current for the stream's creation only.
    unsafe {
        ok!(cuDevicePrimaryCtxRetain(&mut other, 1));
        ok!(cuCtxPushCurrent_v2(other));
        ok!(cuStreamCreate(&mut stream, 0));
        ok!(cuCtxPopCurrent_v2(std::ptr::null_mut()));
    }
    let shape = ([1, 1, 1], [4, 1, 1]);
    assert_eq!(
        test.double(function, shape, stream, (x, y, 4)),
        CUresult::CUDA_ERROR_INVALID_HANDLE
    );
    // The control: a stream of the function's own context.
    let own = test.stream();
    assert_eq!(
        test.double(function, shape, own, (x, y, 4)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: live handles.
    unsafe {
        ok!(cuStreamSynchronize(own));
        ok!(cuStreamDestroy_v2(own));
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuDevicePrimaryCtxRelease_v2(1));
        ok!(cuMemFree_v2(x));
        ok!(cuMemFree_v2(y));
        ok!(cuModuleUnload(module));
    }
    assert!(test.sim.new_violations().is_empty());
}

#[test]
fn a_stand_in_reading_freed_memory_is_a_violation() {
    let test = Test::on(0);
    // It provokes violations and checks each one: recorded, not printed.
    test.sim.print_violations(false);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let stream = test.stream();
    let shape = ([1, 1, 1], [64, 1, 1]);

    // The control: the same launch on live memory.
    let (x, y) = (test.alloc(&[3.0; 64]), test.alloc(&[0.0; 64]));
    assert_eq!(
        test.double(function, shape, stream, (x, y, 64)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: a live stream.
    unsafe { ok!(cuStreamSynchronize(stream)) };
    assert_eq!(test.download(y, 64), [6.0; 64]);
    assert!(test.sim.new_violations().is_empty());

    // x freed, then handed to a kernel: its reads are zeros, and a violation.
    // SAFETY: live device memory, no work queued on it.
    unsafe { ok!(cuMemFree_v2(x)) };
    assert_eq!(
        test.double(function, shape, stream, (x, y, 64)),
        CUresult::CUDA_SUCCESS
    );
    // As a kernel's error on a GPU, it fails a driver call, once.
    test.sync_after_violation(stream);
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("kernel `double`")
            && violations[0].contains(&format!("{x:#x}"))
            && violations[0].contains("no live allocation"),
        "{violations:?}"
    );
    assert_eq!(test.download(y, 64), [0.0; 64]);

    // Past the end of a live allocation: nothing of it is read.
    let short = test.alloc(&[1.0; 32]);
    assert_eq!(
        test.double(function, shape, stream, (short, y, 64)),
        CUresult::CUDA_SUCCESS
    );
    test.sync_after_violation(stream);
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(
        violations[1].contains("runs past the end of device memory"),
        "{violations:?}"
    );

    // SAFETY: live handles.
    unsafe {
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuMemFree_v2(y));
        ok!(cuMemFree_v2(short));
        ok!(cuModuleUnload(module));
    }
}

/// Keeps its stream busy for a while, so that work queued behind it is still queued.
extern "C" fn sleep(_: *mut c_void) {
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn memory_freed_under_a_queued_kernel_is_a_violation() {
    let test = Test::on(0);
    // It provokes violations and checks each one: recorded, not printed.
    test.sim.print_violations(false);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let stream = test.stream();
    let (x, y) = (test.alloc(&[1.0; 16]), test.alloc(&[0.0; 16]));
    // SAFETY: a live stream and a host function that ignores its argument.
    unsafe { ok!(cuLaunchHostFunc(stream, Some(sleep), std::ptr::null_mut())) };
    assert_eq!(
        test.double(function, ([1, 1, 1], [16, 1, 1]), stream, (x, y, 16)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: live device memory, which a queued kernel was given.
    unsafe { ok!(cuMemFree_v2(x)) };
    let violations = test.sim.new_violations();
    assert!(
        violations
            .iter()
            .any(|v| v.contains("cuMemFree_v2 freed device memory")
                && v.contains("kernel `double` on stream")),
        "{violations:?}"
    );
    assert_eq!(test.take_error(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    // The control: y, which the kernel was given too, freed once it has run.
    // SAFETY: a live stream and device memory no queued work uses.
    unsafe {
        ok!(cuStreamSynchronize(stream));
        let before = test.sim.new_violations().len();
        ok!(cuMemFree_v2(y));
        assert_eq!(test.sim.new_violations().len(), before);
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuModuleUnload(module));
    }
}

#[test]
fn a_panicking_stand_in_is_a_violation_not_a_crash() {
    let test = Test::on(0);
    // It provokes violations and checks each one: recorded, not printed; so are the stand-ins' panics, on the
    // stream's thread (the test's own still are).
    test.sim.print_violations(false);
    let _quiet = QuietPanics::elsewhere();
    let module = test.module();
    let explodes = test.function(module, c"explodes").unwrap();
    let wrong_arg = test.function(module, c"wrong_arg").unwrap();
    let stream = test.stream();
    let mut value = 7u32;
    let mut params = [(&raw mut value).cast::<c_void>()];
    // SAFETY: one parameter of 4 bytes, read during the call.
    unsafe {
        ok!(cuLaunchKernel(
            explodes,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut()
        ));
    }
    test.sync_after_violation(stream);
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("kernel `explodes`") && violations[0].contains("panicked: boom 7"),
        "{violations:?}"
    );

    // A stand-in that reads an argument as the wrong type panics too.
    let mut pointer = 0u64;
    let mut params = [(&raw mut pointer).cast::<c_void>()];
    // SAFETY: one parameter of 8 bytes, read during the call.
    unsafe {
        ok!(cuLaunchKernel(
            wrong_arg,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut()
        ));
    }
    test.sync_after_violation(stream);
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(
        violations[1].contains("kernel `wrong_arg`") && violations[1].contains("has 8 bytes"),
        "{violations:?}"
    );

    // The control: the stream, and the simulator, go on; a good kernel runs on the same stream.
    let function = test.function(module, c"double").unwrap();
    let (x, y) = (test.alloc(&[1.5; 8]), test.alloc(&[0.0; 8]));
    assert_eq!(
        test.double(function, ([1, 1, 1], [8, 1, 1]), stream, (x, y, 8)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: live handles.
    unsafe { ok!(cuStreamSynchronize(stream)) };
    assert_eq!(test.download(y, 8), [3.0; 8]);
    assert_eq!(test.sim.new_violations().len(), 2);
    // SAFETY: live handles.
    unsafe {
        ok!(cuStreamDestroy_v2(stream));
        ok!(cuMemFree_v2(x));
        ok!(cuMemFree_v2(y));
        ok!(cuModuleUnload(module));
    }
}

#[test]
fn unloading_a_module_waits_for_the_device() {
    let test = Test::on(0);
    // It provokes violations and checks each one: recorded, not printed.
    test.sim.print_violations(false);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let (x, y) = (test.alloc(&[1.0; 16]), test.alloc(&[0.0; 16]));
    let (busy, own) = (test.stream(), test.stream());

    // The control: only the module's own launches are queued; waiting for them is no hidden wait.
    for _ in 0..20 {
        assert_eq!(
            test.double(function, ([1, 1, 1], [16, 1, 1]), own, (x, y, 16)),
            CUresult::CUDA_SUCCESS
        );
    }
    // SAFETY: a live module.
    unsafe { ok!(cuModuleUnload(module)) };
    // SAFETY: a live stream, which the unload waited for.
    assert_eq!(unsafe { raw!(cuStreamQuery(own)) }, CUresult::CUDA_SUCCESS);
    assert!(
        test.sim.new_violations().is_empty(),
        "{:?}",
        test.sim.new_violations()
    );
    assert_eq!(test.download(y, 16), [2.0; 16]);

    // Unrelated work queued on another stream: the unload waits for it, a hidden wait.
    let module = test.module();
    // SAFETY: a live stream and a host function that ignores its argument.
    unsafe { ok!(cuLaunchHostFunc(busy, Some(sleep), std::ptr::null_mut())) };
    // SAFETY: a live module.
    unsafe { ok!(cuModuleUnload(module)) };
    // SAFETY: a live stream, which the unload waited for.
    assert_eq!(unsafe { raw!(cuStreamQuery(busy)) }, CUresult::CUDA_SUCCESS);
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("HIDDEN WAIT: cuModuleUnload waited for 1 queued operation"),
        "{violations:?}"
    );
    // A hidden wait is right, only slow: it fails no call.
    assert_eq!(test.take_error(), CUresult::CUDA_SUCCESS);
    // SAFETY: live handles.
    unsafe {
        ok!(cuStreamDestroy_v2(busy));
        ok!(cuStreamDestroy_v2(own));
        ok!(cuMemFree_v2(x));
        ok!(cuMemFree_v2(y));
    }
}

#[test]
fn registering_a_name_again_replaces_its_stand_in_for_later_functions() {
    let test = Test::on(0);
    let fill = |value: f32| {
        move |call: &mut cuda_pinned_sim::KernelCall<'_>| {
            let out = call.arg::<u64>(0);
            call.write(out, &[value; 4]);
        }
    };
    test.sim.register_kernel("fill", &[8], fill(1.0)).unwrap();
    let module = test.module();
    let first = test.function(module, c"fill").unwrap();
    test.sim.register_kernel("fill", &[8], fill(2.0)).unwrap();
    let later = test.module();
    let second = test.function(later, c"fill").unwrap();
    let out = test.alloc(&[0.0; 4]);
    for (function, expected) in [(first, 1.0), (second, 2.0)] {
        let mut p = out;
        let mut params = [(&raw mut p).cast::<c_void>()];
        // SAFETY: one parameter of 8 bytes, read during the call; the null stream runs it now.
        unsafe {
            ok!(cuLaunchKernel(
                function,
                1,
                1,
                1,
                4,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ));
        }
        assert_eq!(test.download(out, 4), [expected; 4]);
    }
    // SAFETY: live handles.
    unsafe {
        ok!(cuMemFree_v2(out));
        ok!(cuModuleUnload(module));
        ok!(cuModuleUnload(later));
    }
    assert!(test.sim.new_violations().is_empty());
}

#[test]
fn a_kernel_judges_the_waits_before_it_by_the_memory_it_was_given() {
    let test = Test::on(0);
    // It provokes violations and checks each one: recorded, not printed.
    test.sim.print_violations(false);
    let module = test.module();
    let function = test.function(module, c"double").unwrap();
    let (a, b) = (test.stream(), test.stream());
    let (x, y) = (test.alloc(&[1.0; 16]), test.alloc(&[0.0; 16]));
    let (other, out) = (test.alloc(&[1.0; 16]), test.alloc(&[0.0; 16]));
    let shape = ([1, 1, 1], [16, 1, 1]);
    let mut event = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; a context is current.
    unsafe { ok!(cuEventCreate(&mut event, 0)) };
    // On `a`, behind a while of other work: a kernel writing y, then the event.
    let producer = || {
        // SAFETY: live streams and event, and a host function that ignores its argument.
        unsafe { ok!(cuLaunchHostFunc(a, Some(sleep), std::ptr::null_mut())) };
        assert_eq!(
            test.double(function, shape, a, (x, y, 16)),
            CUresult::CUDA_SUCCESS
        );
        // SAFETY: live handles.
        unsafe {
            ok!(cuEventRecord(event, a));
            ok!(cuStreamWaitEvent(b, event, 0));
        }
    };

    // The control: `b` waits for the kernel writing y, then reads y.
    producer();
    assert_eq!(
        test.double(function, shape, b, (y, out, 16)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: a live context.
    unsafe { ok!(cuCtxSynchronize()) };
    assert!(
        test.sim.new_violations().is_empty(),
        "{:?}",
        test.sim.new_violations()
    );
    assert_eq!(test.download(out, 16), [4.0; 16]);

    // `b` waits for the kernel writing y, then touches none of its memory: a false dependency.
    producer();
    assert_eq!(
        test.double(function, shape, b, (other, out, 16)),
        CUresult::CUDA_SUCCESS
    );
    // SAFETY: a live context.
    unsafe { ok!(cuCtxSynchronize()) };
    let violations = test.sim.new_violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].contains("FALSE DEPENDENCY")
            && violations[0].contains("waited for kernel `double`")
            && violations[0].contains("that kernel `double` uses"),
        "{violations:?}"
    );
    // SAFETY: live handles, nothing queued.
    unsafe {
        ok!(cuEventDestroy_v2(event));
        ok!(cuStreamDestroy_v2(a));
        ok!(cuStreamDestroy_v2(b));
        for p in [x, y, other, out] {
            ok!(cuMemFree_v2(p));
        }
        ok!(cuModuleUnload(module));
    }
}
