//! The repository's README shows the same examples as the `cuda-pinned` crate's own README (the one packaged
//! with the crate), whose examples `cargo test` compiles as doctests of the crate: each Rust example of the
//! first must be one of the second, so that neither can drift.

const REPOSITORY: &str = include_str!("../../../README.md");
const CRATE: &str = include_str!("../../cuda-pinned/README.md");
const DOWNSTREAM_BUILD: &str = include_str!("../../../examples/downstream/build.rs");

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

#[test]
fn the_repository_readme_shows_the_crates_compiled_examples() {
    let repository = rust_blocks(REPOSITORY);
    let packaged = rust_blocks(CRATE);
    assert_eq!(repository.len(), 7, "the README's examples");
    for block in &repository {
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
}

/// The README's build-script recipe is the one `examples/downstream` builds its kernels with (on a GPU, where its
/// tests run them): each of its lines is a line of that build script.
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
