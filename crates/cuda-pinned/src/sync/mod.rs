//! The synchronization the crate's lock protocols are built on: `primitives.rs` (std's primitives, under the
//! names the protocols use), then the protocols on the primitives alone: `reentrant.rs` (the segment lock's
//! hand-over between threads) and `flags.rs` (the reactor's lending of page-locked words), model-checked over
//! loom by `model/`.

pub(crate) mod flags;
#[cfg(test)]
mod model;
pub(crate) mod primitives;
pub(crate) mod reentrant;
