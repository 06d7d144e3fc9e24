//! Under feature `gpu`, compiles `cuda/pipeline.cu` with nvcc into `$OUT_DIR/pipeline.ptx` (PTX for compute
//! capability 8.0, which the driver compiles for the GPU it runs on), which the library embeds. Without it,
//! nothing: the tests run the kernels' stand-ins on the simulated driver. The crate docs and the `cuda-pinned`
//! crate's README show this recipe (and `crates/pinbench/tests/readme.rs` checks that they stay the same).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_GPU").is_none() {
        return;
    }
    // The recipe: nvcc itself, with --ptx (`cc`'s CUDA support compiles objects for the CUDA runtime).
    println!("cargo:rerun-if-changed=cuda/pipeline.cu");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    let cuda = std::env::var_os("CUDA_PATH").unwrap_or_else(|| "/usr/local/cuda".into());
    let nvcc = std::path::Path::new(&cuda).join("bin/nvcc");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let status = std::process::Command::new(&nvcc)
        .args(["--ptx", "-O3", "-arch=compute_80", "-o"])
        .arg(out.join("pipeline.ptx"))
        .arg("cuda/pipeline.cu")
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "running {}: {e} (set CUDA_PATH to a CUDA toolkit)",
                nvcc.display()
            )
        });
    assert!(
        status.success(),
        "{} could not compile cuda/pipeline.cu",
        nvcc.display()
    );
}
