//! Under feature `gpu`, compiles `cuda/pipeline.cu` with nvcc into `$OUT_DIR/pipeline.ptx` (PTX for compute
//! capability 8.0, which the driver compiles for the GPU it runs on), which the library embeds. Without it,
//! nothing: the tests run the kernels' stand-ins on the simulated driver.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cuda/pipeline.cu");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    if std::env::var_os("CARGO_FEATURE_GPU").is_none() {
        return;
    }
    let root = std::env::var_os("CUDA_PATH")
        .map_or_else(|| "/usr/local/cuda".into(), std::path::PathBuf::from);
    let nvcc = root.join("bin/nvcc");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let status = std::process::Command::new(&nvcc)
        .args(["--ptx", "-O3", "-arch=compute_80", "-o"])
        .arg(out.join("pipeline.ptx"))
        .arg("cuda/pipeline.cu")
        .status();
    match status {
        Ok(status) if status.success() => {}
        other => {
            eprintln!(
                "error: {} could not compile cuda/pipeline.cu ({other:?}); set CUDA_PATH to a CUDA toolkit",
                nvcc.display()
            );
            std::process::exit(1);
        }
    }
}
