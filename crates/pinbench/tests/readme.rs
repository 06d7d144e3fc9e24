//! The repository's README shows only examples that are compiled: its first example is one of the
//! `cuda-pinned` crate's own README (the one packaged with the crate), whose examples `cargo test` compiles as
//! doctests of the crate, and its simulator test is a test file of `examples/downstream`, which that crate's
//! `cargo test` runs. The build script recipe of the crate README, and the nvcc command of the crate docs, are
//! those `examples/downstream` builds its kernels with. So none of them can drift.

const REPOSITORY: &str = include_str!("../../../README.md");
const CRATE: &str = include_str!("../../cuda-pinned/README.md");
const CRATE_DOCS: &str = include_str!("../../cuda-pinned/src/lib.rs");
const DOWNSTREAM_BUILD: &str = include_str!("../../../examples/downstream/build.rs");
const DOWNSTREAM_TEST: &str = include_str!("../../../examples/downstream/tests/round_trip.rs");

/// The Rust code blocks of a Markdown text, fences included.
fn rust_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```rust") {
        let from = &rest[start..];
        let end = from[3..].find("```").map(|e| e + 6).unwrap_or(from.len());
        blocks.push(&from[..end]);
        rest = &from[end..];
    }
    blocks
}

/// A code block's code: the lines between its fences.
fn code(block: &str) -> &str {
    let start = block.find('\n').map_or(block.len(), |n| n + 1);
    block[start..]
        .strip_suffix("```")
        .unwrap_or(&block[start..])
}

#[test]
fn the_repository_readme_shows_only_compiled_examples() {
    let repository = rust_blocks(REPOSITORY);
    let packaged = rust_blocks(CRATE);
    assert_eq!(repository.len(), 2, "the README's examples");
    let (simulator, others): (Vec<&str>, Vec<&str>) = repository
        .into_iter()
        .partition(|block| block.contains("cuda_pinned_sim::install"));
    assert_eq!(simulator.len(), 1, "the README shows one simulator test");
    assert!(
        code(simulator[0]) == DOWNSTREAM_TEST,
        "the README's simulator test is not examples/downstream/tests/round_trip.rs, which that crate's \
         `cargo test` runs:\n{}",
        simulator[0]
    );
    for block in &others {
        assert!(
            packaged.contains(block),
            "this example of README.md is not one of crates/cuda-pinned/README.md's, which are the ones \
             compiled:\n{block}"
        );
    }
}

#[test]
fn a_changed_example_is_found() {
    let changed = REPOSITORY.replacen("Stream::new(&context)?", "Stream::new(&ctx)?", 1);
    assert_ne!(changed, REPOSITORY);
    let packaged = rust_blocks(CRATE);
    assert!(
        rust_blocks(&changed)
            .iter()
            .any(|block| !packaged.contains(block))
    );
    let changed = REPOSITORY.replacen("install()?.exclusive()", "install()?", 1);
    assert_ne!(changed, REPOSITORY);
    assert!(
        rust_blocks(&changed)
            .iter()
            .all(|block| code(block) != DOWNSTREAM_TEST)
    );
}

/// The crate README's build-script recipe is the one `examples/downstream` builds its kernels with (on a GPU,
/// where its tests run them): each of its lines is a line of that build script.
#[test]
fn the_build_script_recipe_is_the_downstream_examples() {
    let recipe = rust_blocks(CRATE)
        .into_iter()
        .find(|block| block.contains("// build.rs"))
        .expect("the README shows a build script");
    let lines: Vec<&str> = DOWNSTREAM_BUILD.lines().map(str::trim).collect();
    for line in recipe.lines().map(str::trim) {
        if line.starts_with("```") || line.starts_with("//") || line.is_empty() {
            continue;
        }
        assert!(
            lines.contains(&line),
            "the README's build script has `{line}`, examples/downstream/build.rs does not"
        );
    }
}

/// The crate docs' nvcc command line has the flags the downstream build script gives nvcc.
#[test]
fn the_crate_docs_nvcc_command_is_the_downstream_examples() {
    let args = DOWNSTREAM_BUILD
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix(".args([")?.strip_suffix("])"))
        .expect("examples/downstream/build.rs gives nvcc its flags in one .args([...])");
    let flags: Vec<&str> = args.split(", ").map(|a| a.trim_matches('"')).collect();
    let command = format!("//! nvcc {} ", flags.join(" "));
    assert!(
        CRATE_DOCS.contains(&command),
        "the crate docs (src/lib.rs) do not show `{command}`, as examples/downstream/build.rs runs it"
    );
}
