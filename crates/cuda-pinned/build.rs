//! Build script: under feature `gpu`, finds a CUDA toolkit and compiles `cuda/kernels.cu` with nvcc.
//!
//! Without it, it does nothing: the crate builds with no CUDA installed and loads the driver at run time.

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if cfg!(not(feature = "gpu")) {
        return;
    }
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_PINNED_ARCH", "PATH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let toolkit = match find_toolkit() {
        Ok(toolkit) => toolkit,
        Err(tried) => {
            eprintln!(
                "error: cuda-pinned's feature `gpu` needs a CUDA toolkit (nvcc and cuda.h), and none was \
                 found.\nLooked in:\n{tried}\nSet CUDA_PATH to a toolkit's root (in the cuda-pinned repository, \
                 `scripts/install-cuda-toolkit.sh` installs CUDA 13.0 from PyPI into ./.cuda, no root needed)."
            );
            std::process::exit(1);
        }
    };
    println!(
        "cargo:rerun-if-changed={}",
        toolkit.join("include/cuda.h").display()
    );
    #[cfg(feature = "gpu")]
    compile_kernels(&toolkit);
}

/// The toolkit root: the first of `CUDA_PATH`, `CUDA_HOME`, a `.cuda/nvidia/cu13` in this directory or one
/// above (what the install script makes), `/usr/local/cuda` and the parent of the `bin/` holding an `nvcc` on `PATH` that has both
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
    // What scripts/install-cuda-toolkit.sh makes at the workspace root.
    for dir in manifest_dir.ancestors() {
        candidates.push(("./.cuda".into(), dir.join(".cuda/nvidia/cu13")));
    }
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
    compile_test_kernels(toolkit, &sms);
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

#[cfg(feature = "gpu")]
/// Compiles `cuda/test_kernels.cu` into `$OUT_DIR/test_kernels.fatbin` (a cubin per architecture and PTX for
/// newer ones), which the tests load as a user's module: a build script of a crate using cuda-pinned would do
/// the same for its own kernels.
fn compile_test_kernels(toolkit: &Path, sms: &[&str]) {
    println!("cargo:rerun-if-changed=cuda/test_kernels.cu");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut nvcc = std::process::Command::new(toolkit.join("bin/nvcc"));
    nvcc.arg("--fatbin")
        .arg("-O3")
        .arg("-o")
        .arg(out.join("test_kernels.fatbin"))
        .arg("cuda/test_kernels.cu");
    for sm in sms {
        nvcc.arg(format!("-gencode=arch=compute_{sm},code=sm_{sm}"));
    }
    if let Some(newest) = sms.iter().max_by_key(|sm| sm.parse::<u32>().unwrap_or(0)) {
        nvcc.arg(format!(
            "-gencode=arch=compute_{newest},code=compute_{newest}"
        ));
    }
    match nvcc.status() {
        Ok(status) if status.success() => {}
        outcome => {
            eprintln!("error: nvcc failed to compile cuda/test_kernels.cu: {outcome:?}");
            std::process::exit(1);
        }
    }
}
