//! The crate's compile-time safety claims, checked with `trybuild`: each program in `tests/compile_fail/` must
//! fail to compile with exactly the error in its `.stderr` file (the claim's own error: an unsatisfied
//! `PinnedSource`/`PinnedDestination` bound, a borrow error at the offending line, a private seal), and its twin
//! of the same name in `tests/compile_pass/`, the same program with the one fix that makes it legal, must
//! compile, so that each failure has the claimed cause only. The programs are type-checked only: their
//! GPU calls sit in a `run` function that `main` never calls, so no driver is needed.
//!
//! The `.stderr` files hold rustc's diagnostics verbatim, which change between compiler versions: they were
//! written by stable Rust 1.95.0, and these tests are meant for the stable toolchain that CI uses. After a
//! toolchain update, regenerate them with `TRYBUILD=overwrite cargo test -p cuda-pinned --test compile_fail`
//! and read the diff: each file must still show the error its first line's claim is about.

#[test]
fn safety_claims_are_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
    cases.pass("tests/compile_pass/*.rs");
}
