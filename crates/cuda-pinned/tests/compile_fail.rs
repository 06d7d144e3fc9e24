//! The crate's compile-time safety claims, checked with `trybuild`: each program in `tests/compile_fail/` must
//! fail to compile with exactly the error in its `.stderr` file (the claim's own error: an unsatisfied
//! `PinnedSource`/`PinnedDestination` bound, a borrow error at the offending line, a private seal), and its twin
//! of the same name in `tests/compile_pass/`, the same program with the one fix that makes it legal, must
//! compile, so that each failure has the claimed cause only. The programs are type-checked only: their
//! GPU calls sit in a `run` function that `main` never calls, so no driver is needed.
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
    let cases = trybuild::TestCases::new();
    cases.pass("tests/compile_pass/*.rs");
    match rustc_version() {
        Some(version) if version == WRITTEN_BY => cases.compile_fail("tests/compile_fail/*.rs"),
        version => {
            // Past the test harness's capture of `eprintln!`, so that a passing run shows it too.
            let _ = writeln!(
                std::io::stderr(),
                "compile_fail: the expected errors of tests/compile_fail/ were written by rustc {WRITTEN_BY}, and \
                 this is rustc {}: their comparison is skipped (the compile_pass twins were still checked); run \
                 them on {WRITTEN_BY}",
                version.as_deref().unwrap_or("of an unknown version")
            );
        }
    }
}
