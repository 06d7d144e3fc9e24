//! The crate's compile-time safety claims: each program in `tests/compile_fail/` must fail to compile with the
//! error in its `.stderr` file (the claim's own error: an unsatisfied `PinnedSource`/`PinnedDestination` bound,
//! a borrow error at the offending line, a private seal), and its twin of the same name in
//! `tests/compile_pass/`, the same program with the one fix that makes it legal, must compile, so that each
//! failure has the claimed cause only. The twins compile as modules of `tests/compile_pass.rs`, in the same
//! build as every other test; the failing programs in one `cargo check` of them all, as binaries of a project
//! that depends on this crate by path. The programs are type-checked only: their GPU calls sit in a `run`
//! function that `main` never calls, so no driver is needed.
//!
//! What is compared depends on the toolchain, from the crate's `rust-version` (1.88) up:
//!
//! - On every toolchain: that each program fails, and that its first error has the code and the headline of
//!   the first `error` line of its `.stderr` (``error[E0277]: the trait bound `&[f32]: PinnedSource<_>` is not
//!   satisfied``), which is what stays the same across compiler versions: rustc 1.88 and 1.95 give every
//!   program here the same code and the same headline, word for word. The test builds the project itself
//!   (in `CARGO_TARGET_TMPDIR`, with the cargo running the test, offline, with the workspace's `Cargo.lock`)
//!   and reads the first error of each program from cargo's JSON messages.
//! - On Rust [`WRITTEN_BY`], the toolchain that wrote the `.stderr` files (CI's): their full text, verbatim, with
//!   `trybuild`, which covers the code and headline too. The notes, spans and suggestions below the headline
//!   change between compiler versions, so elsewhere the test says that this comparison was skipped.
//!
//! After a toolchain update, regenerate the files with
//! `TRYBUILD=overwrite cargo test -p cuda-pinned --test compile_fail` on the new toolchain, read the diff (each
//! file must still show the error its first line's claim is about), change [`WRITTEN_BY`], and run the test
//! on the `rust-version` too (`cargo +1.88 test -p cuda-pinned --test compile_fail`): a headline that changed
//! with the new compiler fails there, and then needs normalizing in [`headline`] (say which, and why, here).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `major.minor` of the rustc that wrote the `.stderr` files.
const WRITTEN_BY: &str = "1.95";

/// The `major.minor` of the rustc on the path, which cargo's toolchain selection (`cargo +1.88 test`) also
/// chooses for the programs compiled here; `None` where it cannot be asked.
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
    let version = rustc_version();
    if version.as_deref() == Some(WRITTEN_BY) {
        trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
        return;
    }
    let version = version.as_deref().unwrap_or("of an unknown version");
    let checked = codes_and_headlines_match();
    // Past the test harness's capture of `eprintln!`, so that a passing run shows it too.
    let _ = writeln!(
        std::io::stderr(),
        "compile_fail: on rustc {version}, each of the {checked} programs of tests/compile_fail/ fails with the \
         error code and headline of its .stderr; the full text was written by rustc {WRITTEN_BY}, and its \
         comparison is skipped here: run them on {WRITTEN_BY} for it"
    );
}

/// The error a program fails with, as rustc's first line of it says: `error[E0277]: the trait bound ...`.
#[derive(Debug, PartialEq, Eq)]
struct Headline {
    /// The error code (`E0277`), where the error has one.
    code: Option<String>,
    /// What follows the `error[...]: ` of the line.
    message: String,
}

impl std::fmt::Display for Headline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(code) => write!(f, "error[{code}]: {}", self.message),
            None => write!(f, "error: {}", self.message),
        }
    }
}

/// The headline of an error line (`error[E0277]: ...` or `error: ...`); `None` for any other line.
///
/// The place to normalize a headline that a newer compiler words differently (see the file's doc): none is
/// needed from 1.88 to 1.95.
fn headline(line: &str) -> Option<Headline> {
    let rest = line.strip_prefix("error")?;
    let (code, message) = match rest.strip_prefix('[') {
        Some(rest) => {
            let (code, message) = rest.split_once("]: ")?;
            (Some(code.to_owned()), message)
        }
        None => (None, rest.strip_prefix(": ")?),
    };
    Some(Headline {
        code,
        message: message.trim_end().to_owned(),
    })
}

/// The headline of the first error in a `.stderr` file's text.
fn expected_headline(stderr: &str) -> Option<Headline> {
    stderr.lines().find_map(headline)
}

#[test]
fn the_expected_headline_is_the_first_error_line() {
    let stderr = "warning: unused import\n\
                  error[E0277]: the trait bound `Vec<f32>: PinnedSource<_>` is not satisfied\n \
                  --> tests/compile_fail/vec_upload.rs:9:19\n\
                  error[E0502]: cannot borrow `host` as mutable\n";
    assert_eq!(
        expected_headline(stderr),
        Some(Headline {
            code: Some("E0277".to_owned()),
            message: "the trait bound `Vec<f32>: PinnedSource<_>` is not satisfied".to_owned(),
        })
    );
    assert_eq!(
        headline("error: expected one of `,` or `}`")
            .map(|h| h.to_string())
            .as_deref(),
        Some("error: expected one of `,` or `}`")
    );
    // Lines that are no error's headline.
    assert_eq!(
        expected_headline("warning: x\n  = note: error[E0277]: y\n"),
        None
    );
    assert_eq!(headline("errors: 2"), None);
    assert_eq!(headline("error[E0277] no colon"), None);
    // Every committed file has one.
    for name in programs("compile_fail") {
        let path = programs_dir("compile_fail").join(format!("{name}.stderr"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            expected_headline(&text).is_some_and(|h| h.code.is_some()),
            "{} has no `error[CODE]: ...` line",
            path.display()
        );
    }
}

/// Checks every program of `tests/compile_fail/` in one `cargo check` (a project of them all as binaries, in
/// `CARGO_TARGET_TMPDIR`), and panics with every program whose first error is not the one its `.stderr`
/// begins with; the number of programs checked, where all are.
fn codes_and_headlines_match() -> usize {
    let names = programs("compile_fail");
    assert!(!names.is_empty(), "no programs in tests/compile_fail/");
    let source = programs_dir("compile_fail");
    let mut expected = Vec::new();
    let mut failures = Vec::new();
    for name in &names {
        let path = source.join(format!("{name}.stderr"));
        match std::fs::read_to_string(&path) {
            Ok(text) => match expected_headline(&text) {
                Some(headline) => expected.push((name, headline)),
                None => failures.push(format!("{name}: {} has no error line", path.display())),
            },
            Err(e) => failures.push(format!("{name}: reading {}: {e}", path.display())),
        }
    }
    let (found, cargo_stderr) = first_errors(&names);
    for (name, want) in expected {
        match found.get(name.as_str()) {
            Some(got) if *got == want => {}
            Some(got) => failures.push(format!(
                "{name}: failed with\n    {got}\n  expected\n    {want}"
            )),
            None => failures.push(format!(
                "{name}: compiled, or gave no error; expected\n    {want}"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} programs of tests/compile_fail/ did not fail as their .stderr says:\n  {}{}",
        failures.len(),
        names.len(),
        failures.join("\n  "),
        // Where a program gave no error, cargo may have failed before compiling any.
        if found.len() < names.len() {
            format!("\ncargo's stderr:\n{cargo_stderr}")
        } else {
            String::new()
        }
    );
    names.len()
}

/// `tests/{folder}/` of this crate.
fn programs_dir(folder: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(folder)
}

/// The first error of each of the programs `names` of `tests/compile_fail/`, by name, from one
/// `cargo check --keep-going` of them all; and cargo's stderr, for the failure's message.
fn first_errors(names: &[String]) -> (BTreeMap<String, Headline>, String) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let project = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile_fail");
    std::fs::create_dir_all(&project).expect("creating the project's folder");
    // Paths as TOML literal strings, which take any character but `'`.
    let literal = |path: &Path| format!("'{}'", path.display());
    let mut manifest = format!(
        "[package]\nname = \"cuda-pinned-compile-fail\"\nversion = \"0.0.0\"\nedition = \"{}\"\npublish = false\n\n\
         [dependencies]\ncuda-pinned = {{ path = {} }}\n\n",
        edition(crate_dir),
        literal(crate_dir)
    );
    for name in names {
        manifest.push_str(&format!(
            "[[bin]]\nname = \"{name}\"\npath = {}\n\n",
            literal(&programs_dir("compile_fail").join(format!("{name}.rs")))
        ));
    }
    // A workspace of its own, not a member of one above the target folder.
    manifest.push_str("[workspace]\n");
    std::fs::write(project.join("Cargo.toml"), manifest).expect("writing the project's Cargo.toml");
    // The versions this crate's own build resolved, so that `--offline` finds them all.
    if let Some(lock) = crate_dir
        .ancestors()
        .map(|dir| dir.join("Cargo.lock"))
        .find(|lock| lock.is_file())
    {
        std::fs::copy(&lock, project.join("Cargo.lock")).expect("copying Cargo.lock");
    }
    // The cargo (and so the rustc) that runs this test: `cargo +1.88 test` checks them on 1.88.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", project.join("target"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args([
            "check",
            "--bins",
            "--keep-going",
            "--offline",
            "--quiet",
            "--color=never",
            "--message-format=json",
        ])
        .output()
        .expect("running cargo check");
    let mut first = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-message" || message["message"]["level"] != "error" {
            continue;
        }
        let (Some(target), Some(text)) = (
            message["target"]["name"].as_str(),
            message["message"]["message"].as_str(),
        ) else {
            continue;
        };
        let code = message["message"]["code"]["code"].as_str();
        let line = match code {
            Some(code) => format!("error[{code}]: {text}"),
            None => format!("error: {text}"),
        };
        if let Some(headline) = headline(&line) {
            first.entry(target.to_owned()).or_insert(headline);
        }
    }
    (first, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The crate's edition, for the programs: the first `edition = "..."` of its manifest or, where it inherits
/// it, of the workspace's above.
fn edition(crate_dir: &Path) -> String {
    crate_dir
        .ancestors()
        .filter_map(|dir| std::fs::read_to_string(dir.join("Cargo.toml")).ok())
        .find_map(|manifest| {
            manifest.lines().find_map(|line| {
                line.strip_prefix("edition = \"")
                    .and_then(|rest| rest.strip_suffix('"'))
                    .map(str::to_owned)
            })
        })
        .expect("an `edition = \"...\"` in the crate's Cargo.toml or the workspace's")
}

/// The names (without `.rs`) of the programs in `tests/{folder}/`.
fn programs(folder: &str) -> Vec<String> {
    let dir = programs_dir(folder);
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
