//! `pinbench load` run to its end, as a user runs it: a small file written, loaded every way cold and warm
//! (and in the sweep), every load checked, the file removed or kept and then reused. On the simulated driver,
//! which `cargo test` builds as a dev-dependency; where the simulator is not beside the test (test binaries
//! copied to a GPU machine), on the machine's driver.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Where cargo built pinbench, or, in test binaries copied to another machine, the `bin/` beside the `tests/`
/// folder holding this test.
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

/// A directory of its own in the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("pinbench-load-run-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `pinbench load` with `args` and `--path dir`: its stdout, once it exited with status 0; and whether it ran
/// on the simulator.
fn load(dir: &Path, args: &[&str]) -> (String, bool) {
    let simulator = cuda_pinned_sim::library_path();
    let mut command = Command::new(pinbench());
    command.arg("load").args(args).arg("--path").arg(dir);
    if let Some(simulator) = &simulator {
        command.env("CUDA_PINNED_LIBCUDA", simulator);
    }
    let out = command.output().expect("running pinbench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "{args:?}\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, simulator.is_some())
}

#[test]
fn the_table_shows_every_way_cold_and_warm_and_the_file_goes() {
    let dir = TempDir::new("table");
    let (table, simulated) = load(&dir.0, &["--gib", "0.02"]);
    if simulated {
        assert!(
            table.starts_with("SIMULATED DRIVER (cuda-pinned-sim)"),
            "{table}"
        );
    }
    for needle in [
        "pinbench load: ",
        "bf16 tensors",
        "written by this run",
        "ceiling: reads alone",
        "Stream::load_file",
        "SafeTensorsFile::open + load",
        "pageable: fs::read + upload_pageable",
        "mmap + upload_pageable",
        "cold Stream::load_file: ",
        "warm Stream::load_file: buffered: the page cache holds",
        "references (medians of 5)",
        "goal, cold: Stream::load_file / ceiling = ",
        "goal, warm: Stream::load_file / min(host copy into pinned, pinned upload) = ",
        "checked: ",
        "file removed",
    ] {
        assert!(table.contains(needle), "{needle:?} in\n{table}");
    }
    assert!(!table.contains("wrong data"), "{table}");
    assert!(!table.contains("sweep:"), "{table}");
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "the file is removed"
    );
}

#[test]
fn the_document_has_the_sweep_and_a_kept_file_is_reused() {
    let dir = TempDir::new("json");
    let (text, simulated) = load(&dir.0, &["--gib", "0.02", "--json", "--sweep", "--keep"]);
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    assert_eq!(doc["mode"], "load");
    assert_eq!(
        doc["simulated_driver"].as_bool().unwrap_or(false),
        simulated
    );
    assert_eq!(doc["failures"], serde_json::json!([]));
    assert_eq!(doc["file"]["written"], true);
    assert_eq!(doc["file"]["kept"], true);
    for state in ["cold", "warm"] {
        for way in ["ceiling", "load_file", "safetensors", "pageable", "mmap"] {
            let figure = &doc[state][way];
            assert!(
                figure["gb_per_s"].as_f64().unwrap() > 0.0,
                "{state} {way}: {figure}"
            );
            assert!(
                figure["resident_before"].is_f64(),
                "{state} {way}: {figure}"
            );
            let verified = &figure["verified"];
            if way == "ceiling" {
                assert!(verified.is_null(), "{state} {way}: {figure}");
            } else {
                assert_eq!(verified, true, "{state} {way}: {figure}");
            }
        }
    }
    let loader = &doc["cold"]["load_file"]["loader"];
    assert_eq!(
        loader["pinned_bytes"].as_u64(),
        Some(loader["slots"].as_u64().unwrap() * loader["slot_bytes"].as_u64().unwrap())
    );
    assert_eq!(doc["cold_goal"]["goal"], 0.9);
    assert_eq!(doc["warm_goal"]["goal"], 0.85);
    let sweep = doc["sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), 27, "12 cold, 3 cold buffered, 12 warm");
    assert!(sweep.iter().all(|p| p["verified"] == true), "{sweep:?}");
    let file = PathBuf::from(doc["file"]["path"].as_str().unwrap());
    assert_eq!(file.parent(), Some(dir.0.as_path()));
    assert!(file.exists(), "--keep keeps the file");

    // The same size again reuses the file, and without --keep removes it.
    let (table, _) = load(&dir.0, &["--gib", "0.02"]);
    assert!(table.contains("reused: kept by an earlier run"), "{table}");
    assert!(table.contains("file removed"), "{table}");
    assert!(!file.exists());
}

#[test]
fn a_file_pinbench_did_not_write_is_left_alone() {
    let dir = TempDir::new("foreign");
    let file = dir.0.join("mine.safetensors");
    std::fs::write(&file, b"someone's data").unwrap();
    let out = Command::new(pinbench())
        .args(["load", "--gib", "0.02", "--path"])
        .arg(&file)
        .envs(cuda_pinned_sim::library_path().map(|s| ("CUDA_PINNED_LIBCUDA", s)))
        .output()
        .expect("running pinbench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("exists and is not a file that pinbench load wrote"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"someone's data");
}
