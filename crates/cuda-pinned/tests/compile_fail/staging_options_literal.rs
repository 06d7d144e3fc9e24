//! Claim: `StagingOptions` cannot be written as a struct literal outside the crate (E0639), so an option added
//! later breaks no one's code; it is built with its methods.
use cuda_pinned::staging::StagingOptions;

fn options() -> StagingOptions {
    StagingOptions {
        chunk_bytes: 1 << 20,
        threads: 4,
        chunked_from: 0,
    }
}

fn main() {
    let _ = options;
}
