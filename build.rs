//! Build script: finds a CUDA toolkit when a feature needs one, regenerates the sys bindings under
//! feature `bindgen`, and compiles `cuda/kernels.cu` with nvcc under feature `gpu`.
//!
//! Without either feature it does nothing: the crate builds from the committed `src/sys/bindings.rs`
//! with no CUDA installed, and loads the driver at run time.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if cfg!(not(any(feature = "gpu", feature = "bindgen"))) {
        return;
    }
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_PINNED_ARCH", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let toolkit = match find_toolkit() {
        Ok(toolkit) => toolkit,
        Err(tried) => {
            eprintln!(
                "error: cuda-pinned's features `gpu` and `bindgen` need a CUDA toolkit (nvcc and cuda.h), \
                 and none was found.\nLooked in:\n{tried}\nInstall one into ./.cuda with \
                 `scripts/install-cuda-toolkit.sh` (CUDA 13.0 from PyPI, no root needed), or set CUDA_PATH \
                 to a toolkit's root."
            );
            std::process::exit(1);
        }
    };
    println!(
        "cargo:rerun-if-changed={}",
        toolkit.join("include/cuda.h").display()
    );
    #[cfg(feature = "bindgen")]
    bindings::generate(&toolkit);
    #[cfg(feature = "gpu")]
    compile_kernels(&toolkit);
}

/// The toolkit root: the first of `CUDA_PATH`, `CUDA_HOME`, `./.cuda/nvidia/cu13` (what the install
/// script makes), `/usr/local/cuda` and the parent of the `bin/` holding an `nvcc` on `PATH` that has both
/// `bin/nvcc` and `include/cuda.h`. On failure, the places tried and why each was refused.
fn find_toolkit() -> Result<PathBuf, String> {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut candidates: Vec<(String, PathBuf)> = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(value) = env::var_os(var).filter(|v| !v.is_empty()) {
            candidates.push((format!("${var}"), PathBuf::from(value)));
        }
    }
    candidates.push(("./.cuda".into(), manifest_dir.join(".cuda/nvidia/cu13")));
    candidates.push(("default".into(), PathBuf::from("/usr/local/cuda")));
    let nvcc = find_on_path(if cfg!(windows) { "nvcc.exe" } else { "nvcc" });
    if let Some(root) = nvcc
        .as_deref()
        .and_then(Path::parent)
        .and_then(Path::parent)
    {
        candidates.push(("nvcc on PATH".into(), root.to_path_buf()));
    }
    let mut tried = String::new();
    for (source, root) in candidates {
        let nvcc = root
            .join("bin")
            .join(if cfg!(windows) { "nvcc.exe" } else { "nvcc" });
        let header = root.join("include/cuda.h");
        if nvcc.is_file() && header.is_file() {
            return Ok(root);
        }
        let missing = if nvcc.is_file() { header } else { nvcc };
        tried.push_str(&format!(
            "  {} ({source}): no {}\n",
            root.display(),
            missing.display()
        ));
    }
    tried.push_str("  nvcc on PATH: not found\n");
    Err(tried)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(feature = "gpu")]
/// Compiles `cuda/kernels.cu` into a static library with the CUDA runtime linked statically, so the test
/// binaries that use it run on any machine with a driver, with no libcudart to find.
fn compile_kernels(toolkit: &Path) {
    println!("cargo:rerun-if-changed=cuda/kernels.cu");
    println!("cargo:rerun-if-changed=cuda/kernels.h");
    // CUDA 13 dropped the architectures before Turing; compute_90 PTX lets newer GPUs JIT the kernels.
    let arch = env::var("CUDA_PINNED_ARCH").unwrap_or_else(|_| "75,80,90".to_string());
    // cc takes nvcc from the NVCC variable of this process's environment.
    // SAFETY: the build script is single-threaded here; nothing reads the environment concurrently.
    unsafe { env::set_var("NVCC", toolkit.join("bin/nvcc")) };
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("static")
        .include("cuda")
        .file("cuda/kernels.cu")
        // The kernels time and slow down other work in tests: keep them optimised in every profile (a debug
        // build would otherwise pass -G, which makes device code many times slower).
        .debug(false)
        .opt_level(3);
    let sms: Vec<&str> = arch
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for sm in &sms {
        build.flag(format!("-gencode=arch=compute_{sm},code=sm_{sm}"));
    }
    if let Some(newest) = sms.iter().max_by_key(|sm| sm.parse::<u32>().unwrap_or(0)) {
        build.flag(format!(
            "-gencode=arch=compute_{newest},code=compute_{newest}"
        ));
    }
    build.compile("cuda_pinned_kernels");
    // cc looks for the runtime under targets/<arch>-linux/lib; the PyPI wheels and some distributions put
    // it in lib/ or lib64/ of the root.
    for dir in ["lib64", "lib", "lib/x64"] {
        let dir = toolkit.join(dir);
        if dir.is_dir() {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
    }
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        // The static runtime's own dependencies.
        for lib in ["dl", "pthread", "rt"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}

#[cfg(feature = "bindgen")]
mod bindings {
    //! Regenerates the sys bindings. The output goes to `$OUT_DIR/bindings.rs`, which the crate uses under
    //! feature `bindgen`; `scripts/bindings.sh` compares it with (or copies it over) the committed
    //! `src/sys/bindings.rs`.

    use std::path::Path;

    /// The generator's version, as pinned in Cargo.toml: its output is committed, so it is part of the source.
    const BINDGEN_VERSION: &str = "0.73.2";

    /// Driver functions the crate calls, by their exported (versioned) names: cuda.h renames each call to
    /// its newest ABI version with a macro, and bindgen sees the renamed declaration.
    const DRIVER_FUNCTIONS: &[&str] = &[
        // initialisation, version, errors
        "cuInit",
        "cuDriverGetVersion",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuGetProcAddress_v2",
        // devices
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetName",
        "cuDeviceGetUuid_v2",
        "cuDeviceTotalMem_v2",
        "cuDeviceGetAttribute",
        "cuDeviceGetPCIBusId",
        "cuDeviceGetDefaultMemPool",
        "cuDeviceGetMemPool",
        // primary context and the current-context stack
        "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxGetState",
        "cuDevicePrimaryCtxSetFlags_v2",
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuCtxGetDevice",
        "cuCtxSynchronize",
        "cuCtxGetStreamPriorityRange",
        // streams
        "cuStreamCreate",
        "cuStreamCreateWithPriority",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuStreamWaitEvent",
        "cuStreamGetPriority",
        "cuStreamGetFlags",
        "cuLaunchHostFunc",
        // events
        "cuEventCreate",
        "cuEventDestroy_v2",
        "cuEventRecord",
        "cuEventRecordWithFlags",
        "cuEventSynchronize",
        "cuEventQuery",
        "cuEventElapsedTime_v2",
        // device memory, stream-ordered allocation and pools
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuMemGetInfo_v2",
        "cuMemPoolGetAttribute",
        "cuMemPoolSetAttribute",
        "cuMemPoolTrimTo",
        // page-locked host memory
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemHostGetDevicePointer_v2",
        "cuMemHostGetFlags",
        "cuMemHostRegister_v2",
        "cuMemHostUnregister",
        // copies and fills
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoD_v2",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoDAsync_v2",
        "cuMemcpyAsync",
        "cuMemcpy2DAsync_v2",
        "cuMemcpy3DAsync_v2",
        "cuMemsetD8Async",
        "cuMemsetD16Async",
        "cuMemsetD32Async",
        // pointer attributes
        "cuPointerGetAttribute",
        "cuPointerGetAttributes",
    ];

    /// The runtime's host-memory entry points (libcudart), loaded separately because the runtime is optional.
    const RUNTIME_FUNCTIONS: &[&str] = &[
        "cudaHostAlloc",
        "cudaFreeHost",
        "cudaHostRegister",
        "cudaHostUnregister",
        "cudaHostGetDevicePointer",
        "cudaHostGetFlags",
        "cudaGetErrorName",
        "cudaGetErrorString",
    ];

    /// Constants the safe layer passes that are `#define`s in the headers, not enums.
    const VARS: &[&str] = &[
        "CUDA_VERSION",
        "CUDART_VERSION",
        "CU_MEMHOSTALLOC_.*",
        "CU_MEMHOSTREGISTER_.*",
        "cudaHost(Alloc|Register).*",
    ];

    /// Enums the safe layer passes as flags or attributes that no allowlisted function names in its signature.
    const TYPES: &[&str] = &[
        "CUctx_flags",
        "CUstream_flags",
        "CUevent_flags",
        "CUevent_record_flags",
        "CUevent_wait_flags",
        "CUmemorytype",
        // the runtime functions' own types, which the runtime pass does not emit
        "cudaError_t",
        "cudaError",
    ];

    fn builder(toolkit: &Path) -> bindgen::Builder {
        bindgen::Builder::default()
            .header("wrapper.h")
            .clang_arg(format!("-I{}", toolkit.join("include").display()))
            .rust_edition(bindgen::RustEdition::Edition2024)
            .rust_target(bindgen::RustTarget::stable(88, 0).expect("1.88 is a stable Rust version"))
            .formatter(bindgen::Formatter::Prettyplease)
            // Result codes and flags are newtypes over integers: an unknown value from a newer driver is a
            // value, never undefined behaviour as a Rust enum would make it.
            .default_enum_style(bindgen::EnumVariation::NewType {
                is_bitfield: false,
                is_global: false,
            })
            .derive_default(true)
            .derive_eq(true)
            .derive_hash(true)
            .layout_tests(true)
            .wrap_unsafe_ops(true)
            .generate_comments(false)
            .size_t_is_usize(true)
            .dynamic_link_require_all(false)
    }

    pub fn generate(toolkit: &Path) {
        println!("cargo:rerun-if-changed=wrapper.h");
        let out =
            std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        // Pass 1: every type the crate uses, and the driver's functions as a table loaded from libcuda.
        let mut driver = builder(toolkit).dynamic_library_name("DriverApi");
        for f in DRIVER_FUNCTIONS {
            driver = driver.allowlist_function(f);
        }
        for v in VARS {
            driver = driver.allowlist_var(v);
        }
        for t in TYPES {
            driver = driver.allowlist_type(t);
        }
        let driver = driver
            .generate()
            .expect("bindgen failed on the driver API (see the messages above)");
        // Pass 2: the runtime's functions alone, as a second table loaded from libcudart.
        let mut runtime = builder(toolkit)
            .dynamic_library_name("RuntimeApi")
            .allowlist_recursively(false);
        for f in RUNTIME_FUNCTIONS {
            runtime = runtime.allowlist_function(f);
        }
        let runtime = runtime
            .generate()
            .expect("bindgen failed on the runtime API (see the messages above)");
        let text = format!(
            "// Generated by bindgen {BINDGEN_VERSION} from wrapper.h: do not edit.\n\
             // Regenerate with `scripts/bindings.sh update` (feature `bindgen`).\n\n{driver}\n{runtime}"
        );
        std::fs::write(out.join("bindings.rs"), text).expect("writing $OUT_DIR/bindings.rs");
    }
}
