//! Build script: under feature `bindgen`, regenerates the bindings from the CUDA headers of a toolkit it
//! finds. Without it, it does nothing: the crate builds from the committed `src/bindings.rs` with no CUDA
//! installed.

#[cfg(feature = "bindgen")]
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "bindgen")]
    {
        for var in ["CUDA_PATH", "CUDA_HOME"] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let Some(toolkit) = find_headers() else {
            eprintln!(
                "error: feature `bindgen` needs the CUDA headers (include/cuda.h of a toolkit), and none was \
                 found in $CUDA_PATH, $CUDA_HOME, a .cuda/nvidia/cu13 above this crate or /usr/local/cuda. Set \
                 CUDA_PATH to a toolkit's root (in the cuda-pinned repository, scripts/install-cuda-toolkit.sh \
                 installs one into ./.cuda)."
            );
            std::process::exit(1);
        };
        println!(
            "cargo:rerun-if-changed={}",
            toolkit.join("include/cuda.h").display()
        );
        bindings::generate(&toolkit);
    }
}

/// The first toolkit root with `include/cuda.h`: `CUDA_PATH`, `CUDA_HOME`, a `.cuda/nvidia/cu13` in this
/// directory or one above (what scripts/install-cuda-toolkit.sh makes at the workspace root), `/usr/local/cuda`.
#[cfg(feature = "bindgen")]
fn find_headers() -> Option<PathBuf> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let from_env = ["CUDA_PATH", "CUDA_HOME"].into_iter().filter_map(|var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let local = manifest_dir
        .ancestors()
        .map(|dir| dir.join(".cuda/nvidia/cu13"));
    from_env
        .chain(local)
        .chain([PathBuf::from("/usr/local/cuda")])
        .find(|root| root.join("include/cuda.h").is_file())
}

#[cfg(feature = "bindgen")]
mod bindings {
    //! Regenerates the bindings. The output goes to `$OUT_DIR/bindings.rs`, which the crate uses under
    //! feature `bindgen`; `scripts/bindings.sh` compares it with (or copies it over) the committed
    //! `src/bindings.rs`.

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
        "cuMemAllocFromPoolAsync",
        "cuMemFreeAsync",
        "cuMemGetInfo_v2",
        "cuMemPoolGetAttribute",
        "cuMemPoolSetAttribute",
        "cuMemPoolTrimTo",
        "cuMemPoolCreate",
        "cuMemPoolDestroy",
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
        // modules and libraries: loading PTX, cubin and fatbin images, their kernels and attributes
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuModuleUnload",
        "cuModuleGetFunction",
        "cuModuleGetFunctionCount",
        "cuModuleEnumerateFunctions",
        "cuModuleGetGlobal_v2",
        "cuLibraryLoadData",
        "cuLibraryUnload",
        "cuLibraryGetKernel",
        "cuKernelGetFunction",
        "cuKernelGetParamInfo",
        "cuFuncGetAttribute",
        "cuFuncSetAttribute",
        "cuFuncGetParamInfo",
        "cuFuncGetName",
        "cuFuncLoad",
        "cuFuncIsLoaded",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        // kernel launch
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        // contexts other than the primary one, for interop
        "cuCtxCreate_v4",
        "cuCtxDestroy_v2",
        "cuCtxGetFlags",
        "cuCtxGetId",
        "cuStreamGetCtx",
        "cuStreamGetId",
        // peer access and peer copies
        "cuDeviceCanAccessPeer",
        "cuDeviceGetP2PAttribute",
        "cuCtxEnablePeerAccess",
        "cuCtxDisablePeerAccess",
        "cuMemcpyPeerAsync",
        "cuMemPoolSetAccess",
        "cuMemPoolGetAccess",
        // batched copies
        "cuMemcpyBatchAsync_v2",
        // stream memory operations
        "cuStreamWriteValue32_v2",
        "cuStreamWriteValue64_v2",
        "cuStreamWaitValue32_v2",
        "cuStreamWaitValue64_v2",
        "cuStreamBatchMemOp_v2",
        // graphs captured from streams
        "cuStreamBeginCapture_v2",
        "cuStreamEndCapture",
        "cuStreamIsCapturing",
        "cuStreamGetCaptureInfo_v3",
        "cuStreamUpdateCaptureDependencies_v2",
        "cuThreadExchangeStreamCaptureMode",
        "cuGraphInstantiateWithFlags",
        "cuGraphUpload",
        "cuGraphLaunch",
        "cuGraphDestroy",
        "cuGraphExecDestroy",
        "cuGraphGetNodes",
        "cuGraphNodeGetType",
        "cuGraphKernelNodeGetParams_v2",
        "cuGraphExecKernelNodeSetParams_v2",
        "cuGraphKernelNodeSetParams_v2",
        "cuGraphMemcpyNodeGetParams",
        "cuGraphMemcpyNodeSetParams",
        "cuGraphExecMemcpyNodeSetParams",
        "cuGraphMemsetNodeGetParams",
        "cuGraphMemsetNodeSetParams",
        "cuGraphExecMemsetNodeSetParams",
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
        "CUfunction_attribute",
        "CUfunctionLoadingState",
        "CUjit_option",
        "CUlaunchAttributeID",
        "CUstreamCaptureMode",
        "CUstreamUpdateCaptureDependencies_flags",
        "CUgraphNodeType",
        "CUstreamWaitValue_flags",
        "CUstreamWriteValue_flags",
        "CUmemcpySrcAccessOrder",
        "CUmemcpyFlags",
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
