//! The loader as a user meets it: `pinbench` pointed at a driver that is missing
//! or is not libcuda must exit with status 1 and the loader's message, never a panic. These run in plain
//! `cargo test`, on any machine: `CUDA_PINNED_LIBCUDA` names the only library tried.

use std::path::PathBuf;
use std::process::Command;

/// Where cargo built pinbench, or, in test binaries copied to another machine, the
/// `bin/` beside the `tests/` folder holding this test.
fn pinbench() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_pinbench"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(|tests| tests.parent())
        .expect("the bundle's folder")
        .join("bin/pinbench")
}

fn pinbench_with_driver(path: &str) -> (Option<i32>, String) {
    let out = Command::new(pinbench())
        .env("CUDA_PINNED_LIBCUDA", path)
        .output()
        .expect("running pinbench");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_driver_is_a_clear_error_not_a_panic() {
    let path = "/nonexistent/cuda-pinned-test/libcuda.so.1";
    let (code, stderr) = pinbench_with_driver(path);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("pinbench: could not load the CUDA driver (libcuda); tried:\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("\n  {path} (from CUDA_PINNED_LIBCUDA): ")),
        "{stderr}"
    );
    // The last line says how to see it work without a GPU.
    assert!(
        stderr.trim_end().lines().last().is_some_and(|line| line
            .starts_with("No GPU here? Run pinbench on the simulated driver")
            && line.contains("CUDA_PINNED_LIBCUDA=target/release/libcuda_pinned_sim.so")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_library_that_is_not_libcuda_is_a_clear_error_not_a_panic() {
    let (code, stderr) = pinbench_with_driver("libm.so.6");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("\n  libm.so.6 (from CUDA_PINNED_LIBCUDA): loaded, but it is not the CUDA driver: it exports no cuInit"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
