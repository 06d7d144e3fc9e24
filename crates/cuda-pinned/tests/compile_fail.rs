//! The crate's compile-time safety claims, checked with `trybuild`: each program in `tests/compile_fail/` must
//! fail to compile with exactly the error in its `.stderr` file (the claim's own error: an unsatisfied
//! `PinnedSource`/`PinnedDestination` bound, a borrow error at the offending line, a private seal), and its twin
//! of the same name in `tests/compile_pass/`, the same program with the one fix that makes it legal, must
//! compile, so that each failure has the claimed cause only. The twins compile as modules of
//! `tests/compile_pass.rs`, in the same build as every other test; the failing programs in one `cargo check` of
//! them all. The programs are type-checked only: their GPU calls sit in a `run` function that `main` never
//! calls, so no driver is needed.
//!
//! The `.stderr` files hold rustc's diagnostics verbatim, which change between compiler versions: they were
//! written by Rust [`WRITTEN_BY`], and are compared only on that toolchain (CI's); on any other the twins are
//! still compiled, and the test says that the comparison was skipped. After a toolchain update, regenerate them
//! with `TRYBUILD=overwrite cargo test -p cuda-pinned --test compile_fail`, read the diff (each file must still
//! show the error its first line's claim is about), and change [`WRITTEN_BY`].

use std::io::Write;
use std::process::Command;

/// The `major.minor` of the rustc that wrote the `.stderr` files.
const WRITTEN_BY: &str = "1.95";

/// The `major.minor` of the rustc on the path, which cargo's toolchain selection (`cargo +1.88 test`) also
/// chooses for the programs trybuild compiles; `None` where it cannot be asked.
fn rustc_version() -> Option<String> {
    let out = Command::new("rustc").arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    Some(format!("{}.{}", parts.next()?, parts.next()?))
}

#[test]
fn safety_claims_are_compile_errors() {
    match rustc_version() {
        Some(version) if version == WRITTEN_BY => {
            trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
        }
        version => {
            // Past the test harness's capture of `eprintln!`, so that a passing run shows it too.
            let _ = writeln!(
                std::io::stderr(),
                "compile_fail: the expected errors of tests/compile_fail/ were written by rustc {WRITTEN_BY}, and \
                 this is rustc {}: their comparison is skipped (the compile_pass twins were still compiled); run \
                 them on {WRITTEN_BY}",
                version.as_deref().unwrap_or("of an unknown version")
            );
        }
    }
}

/// The names (without `.rs`) of the programs in `tests/{folder}/`.
fn programs(folder: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(folder);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[test]
fn every_failing_program_has_a_twin_that_compiles() {
    let twins = include_str!("compile_pass.rs");
    let failing = programs("compile_fail");
    assert!(!failing.is_empty(), "no programs in tests/compile_fail/");
    assert_eq!(
        failing,
        programs("compile_pass"),
        "tests/compile_fail/ and tests/compile_pass/ differ"
    );
    for name in &failing {
        let module = format!("#[path = \"compile_pass/{name}.rs\"]\nmod {name};");
        assert!(
            twins.contains(&module),
            "tests/compile_pass.rs does not compile the twin {name}: add `{module}`"
        );
    }
}
