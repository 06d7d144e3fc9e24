//! Twin of compile_fail/staging_options_literal.rs: the options are built with their methods, and read.
use cuda_pinned::staging::StagingOptions;

fn options() -> StagingOptions {
    let options = StagingOptions::default()
        .chunk_bytes(1 << 20)
        .threads(4)
        .chunked_from(0);
    assert_eq!(options.chunk_bytes, 1 << 20);
    options
}

fn main() {
    let _ = options;
}
